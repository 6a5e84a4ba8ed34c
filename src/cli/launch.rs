//! `rankguard launch` and `rankguard plan`: one child per rank, each with exactly one GPU
//! entry in `CUDA_VISIBLE_DEVICES`, the guard in `LD_PRELOAD` and its CPU block; and the same
//! planning printed instead of executed.
//!
//! The decisions live in `crate::plan` (pure); this file gathers its inputs (environment,
//! driver, affinity, topology), prints plans, and supervises the children: output prefixes,
//! signal forwarding, first-failure shutdown with a grace period, `PR_SET_PDEATHSIG`, and a
//! child subreaper plus a reaper helper so that nothing a launch started outlives it.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::args::{number, Lexer, Token};
use super::exit::{emit, Error, ExitCode, Result, EXIT_CANNOT_EXECUTE};
use super::failure::{self, EXIT_REFUSED};
use super::json_out::Value;
use super::rank_env::Launch;
use super::{gpus, job_summary, rank_start, spawn, sys, tree};
use crate::cvd;
use crate::plan::{self, CpuRequest, Nproc, Plan, Request};
use crate::topology::Topology;

/// The test-topology prefix (`fakecuda-smi --sysroot DIR`); `--sysroot` wins over it.
pub const SYSROOT_VAR: &str = "RANKGUARD_SYSROOT";
const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// The hidden subcommand that kills a launch's ranks if the launcher dies ([`reaper_main`]).
pub const REAPER: &str = "__reaper";

const HELP: &str = "\
Usage: rankguard launch [OPTIONS] [--] CMD [ARGS...]
       rankguard plan   [OPTIONS] [--json]

Start one child per rank; each sees exactly one GPU (as cuda:0), runs under the guard and,
with --cpu-ids, inside its own CPU block. `plan` prints the mapping and starts nothing.

Options:
  --nproc-per-node N|gpu   ranks on this node ('gpu': one per selected GPU)
  --devices LIST           positions in the visible device list (CUDA_VISIBLE_DEVICES, or
                           the driver's GPUs when it is unset), e.g. 0,2 or 0-3
  --cpu-ids BLOCKS|auto    one CPU block per rank (0-7,8-15 or 0-3,8-11/4-7,12-15), or
                           'auto' (NUMA-local blocks of the launcher's affinity)
  --nnodes M --node-rank K --master-addr A --master-port P   multi-node jobs
  --sysroot DIR            read GPU topology under DIR (default $RANKGUARD_SYSROOT or /)
  --prefix-output          prefix every output line with [rank R]
  --grace-period SECS      time ranks get to exit after the first failure (default 10)
                           (after a refusal by the guard: at most 1)
  --json                   (plan) print the stable JSON form (docs/cli.md)
  --env                    (plan --json) also resolve what launch would: the guard library,
                           the job id, MASTER_PORT; print each rank's environment

Exit status: that of the first rank that failed; 78 when the guard refused a process in a
rank's tree (R1): the job is stopped and a failure summary names the rank, pid, rule,
refused process, call site and why (docs/cli.md).
";

/// Validated options of `launch`/`plan`.
struct Options {
    req: Request,
    master_addr: Option<String>,
    master_port: Option<u16>,
    sysroot: PathBuf,
    prefix: bool,
    grace: Duration,
    json: bool,
    /// `plan --json --env`: each rank's environment, as `launch` would set it.
    env: bool,
    cmd: Vec<OsString>,
}

/// Stage 1 (raw flags) then stage 2 (typed, validated). None: help was printed.
fn parse(name: &'static str, args: Vec<OsString>) -> Result<Option<Options>> {
    let mut lx = Lexer::new(name, args);
    let (mut nproc, mut devices, mut cpu_ids, mut nnodes, mut node_rank) =
        (None, None, None, None, None);
    let (mut addr, mut port, mut sysroot, mut grace) = (None, None, None, None);
    let (mut prefix, mut json, mut with_env) = (false, false, false);
    let mut cmd = Vec::new();
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) => match f.as_str() {
                "-h" | "--help" => {
                    emit(HELP);
                    return Ok(None);
                }
                "--nproc-per-node" | "--nproc_per_node" => nproc = Some(lx.value(&f)?),
                "--devices" => devices = Some(lx.value(&f)?),
                "--cpu-ids" => cpu_ids = Some(lx.value(&f)?),
                "--nnodes" => nnodes = Some(lx.value(&f)?),
                "--node-rank" | "--node_rank" => node_rank = Some(lx.value(&f)?),
                "--master-addr" | "--master_addr" => addr = Some(lx.value(&f)?),
                "--master-port" | "--master_port" => port = Some(lx.value(&f)?),
                "--sysroot" => sysroot = Some(lx.value(&f)?),
                "--grace-period" => grace = Some(lx.value(&f)?),
                "--prefix-output" => prefix = true,
                "--json" => json = true,
                "--env" => with_env = true,
                _ => return Err(lx.unknown(&f)),
            },
            Token::Word(w) => {
                cmd.push(w);
                cmd.extend(lx.rest());
            }
            Token::End => cmd.extend(lx.rest()),
        }
    }

    let nproc = match nproc.as_deref() {
        None => Nproc::Unspecified,
        Some("gpu") => Nproc::PerDevice,
        Some(t) => Nproc::Count(number(
            name,
            "--nproc-per-node",
            t,
            "a number of ranks or 'gpu'",
        )?),
    };
    let devices = match devices {
        None => None,
        Some(t) => Some((t.clone(), plan::parse_devices(&t)?)),
    };
    let cpus = match cpu_ids {
        None => CpuRequest::Inherit,
        Some(t) => plan::parse_cpu_ids(&t)?,
    };
    let nnodes: u32 = match nnodes {
        None => 1,
        Some(t) => number(name, "--nnodes", &t, "a number of nodes")?,
    };
    let node_rank: u32 = match node_rank {
        None => 0,
        Some(t) => number(name, "--node-rank", &t, "a node index")?,
    };
    let master_port: Option<u16> = match port {
        None => None,
        Some(t) => match number::<u16>(name, "--master-port", &t, "a TCP port (1-65535)")? {
            0 => {
                return Err(Error::usage(format!(
                    "rankguard {name}: --master-port 0 is not a usable port"
                )))
            }
            p => Some(p),
        },
    };
    if nnodes > 1 && (addr.is_none() || master_port.is_none()) {
        return Err(Error::usage(format!(
            "rankguard {name}: --nnodes {nnodes} needs --master-addr and --master-port (every node must agree on \
             the rendezvous; a free port can only be picked for a single-node job)")));
    }
    let grace = match grace {
        None => DEFAULT_GRACE,
        Some(t) => {
            let s: f64 = number(name, "--grace-period", &t, "a number of seconds")?;
            if !(0.0..=86400.0).contains(&s) {
                return Err(Error::usage(format!(
                    "rankguard {name}: --grace-period {t} is outside 0-86400 seconds"
                )));
            }
            Duration::from_secs_f64(s)
        }
    };
    let sysroot = match sysroot {
        Some(s) => {
            let p = PathBuf::from(&s);
            if !p.is_dir() {
                return Err(Error::usage(format!(
                    "rankguard {name}: --sysroot {s} is not a directory"
                )));
            }
            p
        }
        None => match std::env::var_os(SYSROOT_VAR).filter(|v| !v.is_empty()) {
            Some(v) => {
                let p = PathBuf::from(v);
                if !p.is_dir() {
                    return Err(Error::usage(format!(
                        "{SYSROOT_VAR}={} is not a directory; fix or unset it",
                        p.display()
                    )));
                }
                p
            }
            None => PathBuf::from("/"),
        },
    };
    if name == "launch" {
        if json {
            return Err(Error::usage(
                "rankguard launch: --json belongs to `rankguard plan`",
            ));
        }
        if with_env {
            return Err(Error::usage(
                "rankguard launch: --env belongs to `rankguard plan --json`",
            ));
        }
        if cmd.is_empty() {
            return Err(Error::usage("rankguard launch: no command given; add `-- CMD ARGS...` (rankguard launch --help)"));
        }
    } else if with_env && !json {
        return Err(Error::usage(
            "rankguard plan: --env prints each rank's environment in the JSON form; add --json",
        ));
    }
    Ok(Some(Options {
        req: Request {
            nproc,
            devices,
            cpus,
            nnodes,
            node_rank,
        },
        master_addr: addr,
        master_port,
        sysroot,
        prefix,
        grace,
        json,
        env: with_env,
        cmd,
    }))
}

/// Gather the inputs and plan.
fn make_plan(o: &Options) -> Result<Plan> {
    begin_plan()?.finish(o, gpus::Reap::Now)
}

/// A plan whose driver query is under way (`gpus::start`): `launch` does the rest of its
/// set-up while the helper asks the driver, then [`PlanStart::finish`] plans.
struct PlanStart {
    raw: Option<String>,
    driver: DriverQuery,
}

enum DriverQuery {
    One(gpus::Pending),
    /// CUDA enumerates at most one MIG instance per process (NVIDIA MIG User Guide, "CUDA
    /// Device Enumeration"; the fake's rule D-mig1), so a list of MIG entries is asked
    /// about one entry at a time.
    PerMigEntry(Vec<cvd::CvdEntry>),
}

/// Read `CUDA_VISIBLE_DEVICES` and start asking the driver.
fn begin_plan() -> Result<PlanStart> {
    let raw = match std::env::var_os(cvd::VAR) {
        None => None,
        Some(v) => Some(v.into_string().map_err(|v| {
            Error::usage(format!(
                "{}='{}' is not valid UTF-8; fix the variable",
                cvd::VAR,
                v.to_string_lossy()
            ))
        })?),
    };
    let driver = match cvd::parse(raw.as_deref()) {
        cvd::Visibility::Entries(e) if e.len() > 1 && matches!(e[0], cvd::CvdEntry::Mig(_)) => {
            DriverQuery::PerMigEntry(e)
        }
        _ => DriverQuery::One(gpus::start(None)),
    };
    Ok(PlanStart { raw, driver })
}

impl PlanStart {
    /// The driver's answer, the launcher's affinity and the topology: the plan. `reap`:
    /// whether to wait for the helper's exit (`gpus::Reap`).
    fn finish(self, o: &Options, reap: gpus::Reap<'_>) -> Result<Plan> {
        // The affinity and the topology (a scan of /sys and /proc) are read while the helper
        // still asks the driver, not after its answer: no rank can start before the plan,
        // so whatever is read after the answer adds to every launch (docs/benchmarks.md,
        // figure 4). Errors keep their order: the driver's first.
        let affinity = sys::affinity();
        let topo = Topology::read(&o.sysroot).map_err(|e| e.to_string());
        let driver = match self.driver {
            DriverQuery::One(pending) => pending.finish(reap),
            DriverQuery::PerMigEntry(e) => mig_driver_list(&e),
        };
        let host = plan::host_view(
            self.raw.as_deref(),
            driver.as_deref().map_err(|e| e.as_str()),
        )?;
        let affinity = affinity.map_err(|e| {
            Error::usage(format!(
                "cannot read the launcher's CPU affinity (sched_getaffinity): {e}"
            ))
        })?;
        Ok(plan::plan(
            &o.req,
            &host,
            &affinity,
            topo.as_ref().map_err(|e| e.as_str()),
        )?)
    }
}

/// The driver's answer for each MIG entry, in order; stops at the first entry the driver
/// does not enumerate, so `plan::host_view` names it.
fn mig_driver_list(entries: &[cvd::CvdEntry]) -> std::result::Result<Vec<plan::DriverGpu>, String> {
    let mut out = Vec::new();
    for e in entries {
        match gpus::query(Some(Some(&e.text())))?.into_iter().next() {
            Some(g) => out.push(g),
            None => break,
        }
    }
    Ok(out)
}

pub fn plan_main(args: Vec<OsString>) -> Result<ExitCode> {
    let Some(o) = parse("plan", args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let p = make_plan(&o)?;
    if o.json {
        let launch = if o.env {
            Some(Launch::resolve(o.master_addr.as_deref(), o.master_port)?)
        } else {
            None
        };
        if let Some(bad) = launch.as_ref().filter(|l| l.preload.to_str().is_none()) {
            // JSON carries text: a lossy copy would not be the environment launch sets.
            return Err(Error::usage(format!(
                "rankguard plan --env: LD_PRELOAD '{}' is not valid UTF-8, so it cannot be printed exactly; fix \
                 LD_PRELOAD", bad.preload.to_string_lossy())));
        }
        emit(&plan_json(&p, &o, launch.as_ref()).pretty());
    } else {
        emit(&plan_table(&p, &o));
    }
    Ok(ExitCode::SUCCESS)
}

fn source_name(p: &Plan, o: &Options) -> &'static str {
    match (&p.host.source, o.req.devices.is_some()) {
        (_, true) => "--devices",
        (plan::Source::ParentCvd(_), false) => "CUDA_VISIBLE_DEVICES",
        (plan::Source::Driver, false) => "driver",
    }
}

/// The stable `plan --json` form (docs/cli.md, "plan --json").
fn plan_json(p: &Plan, o: &Options, launch: Option<&Launch>) -> Value {
    let ranks = p
        .ranks
        .iter()
        .map(|r| {
            let mut fields = vec![
                ("rank", Value::Num(r.rank.into())),
                ("local_rank", Value::Num(r.local_rank.into())),
                ("position", Value::Num(r.position.into())),
                ("cuda_visible_devices", Value::str(r.device.entry.text())),
                ("uuid", Value::opt_str(r.device.uuid.clone())),
                ("bus_id", Value::opt_str(r.device.bus_id.clone())),
                ("numa_node", Value::opt_num(r.numa_node)),
                (
                    "cpus",
                    Value::opt_str(r.cpus.as_ref().map(|c| c.to_string())),
                ),
                (
                    "omp_num_threads",
                    Value::opt_num(r.cpus.as_ref().map(|c| c.len() as i64)),
                ),
                (
                    "cpu_list",
                    r.cpus.as_ref().map_or(Value::Null, |c| {
                        Value::Arr(c.iter().map(|n| Value::Num(n.into())).collect())
                    }),
                ),
            ];
            if let Some(l) = launch {
                let env = l.rank_env(p, r).into_iter();
                let env = env.map(|(k, v)| {
                    (
                        k,
                        v.map_or(Value::Null, |v| Value::str(v.to_string_lossy())),
                    )
                });
                fields.push(("env", Value::Obj(env.collect())));
            }
            Value::Obj(fields)
        })
        .collect();
    let parent = match &p.host.source {
        plan::Source::ParentCvd(v) => Value::str(v.clone()),
        plan::Source::Driver => Value::Null,
    };
    Value::Obj(vec![
        ("format", Value::str("rankguard-plan")),
        ("version", Value::Num(1)),
        ("nnodes", Value::Num(p.nnodes.into())),
        ("node_rank", Value::Num(p.node_rank.into())),
        ("nproc_per_node", Value::Num(p.nproc.into())),
        ("world_size", Value::Num(p.world_size.into())),
        ("master_addr", Value::opt_str(o.master_addr.clone())),
        ("master_port", Value::opt_num(o.master_port)),
        ("device_source", Value::str(source_name(p, o))),
        ("parent_cuda_visible_devices", parent),
        ("visible_devices", Value::Num(p.host.devices.len() as i64)),
        ("launcher_affinity", Value::str(p.affinity.to_string())),
        ("cpu_policy", Value::str(p.cpu_policy.name())),
        ("cpu_note", Value::str(p.cpu_note.clone())),
        ("job", Value::opt_str(launch.map(|l| l.job.clone()))),
        ("ranks", Value::Arr(ranks)),
    ])
}

fn plan_table(p: &Plan, o: &Options) -> String {
    let mut s = format!(
        "{} rank{} on node {} of {} (world size {}); devices: {}{}\ncpu: {}\n",
        p.nproc,
        if p.nproc == 1 { "" } else { "s" },
        p.node_rank,
        p.nnodes,
        p.world_size,
        p.host.describe(),
        o.req
            .devices
            .as_ref()
            .map(|(t, _)| format!(", selected by --devices {t}"))
            .unwrap_or_default(),
        p.cpu_note
    );
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let mut rows = vec![[
        "RANK",
        "LOCAL_RANK",
        "POSITION",
        "CUDA_VISIBLE_DEVICES",
        "UUID",
        "BUS_ID",
        "NUMA",
        "CPUS",
    ]
    .map(String::from)
    .to_vec()];
    for r in &p.ranks {
        rows.push(vec![
            r.rank.to_string(),
            r.local_rank.to_string(),
            r.position.to_string(),
            r.device.entry.text(),
            dash(r.device.uuid.clone()),
            dash(r.device.bus_id.clone()),
            dash(r.numa_node.map(|n| n.to_string())),
            dash(r.cpus.as_ref().map(|c| c.to_string())),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
}

pub fn launch_main(args: Vec<OsString>) -> Result<ExitCode> {
    let Some(o) = parse("launch", args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    // Before anything starts: a RANKGUARD_AUDIT no rank could write is refused here, once.
    let audit = job_summary::prepare()?;
    let since = std::time::SystemTime::now();
    // Descendants that leave the ranks' process groups (setsid) are re-parented to us when
    // orphaned, so they are still found and killed at the end (issue 14); and so is what the
    // driver query's helper leaves, which can exit before the ranks start: before its fork.
    if let Err(e) = sys::become_subreaper() {
        eprintln!("rankguard launch: warning: cannot become a child subreaper ({e}); processes that ranks \
                   start in a new session may outlive the launcher");
    }
    // The driver query runs in a helper while the launcher resolves the ranks' environment
    // and starts its reaper (on a node with more than one CPU, at the same time).
    let started = begin_plan()?;
    let launch = Launch::resolve(o.master_addr.as_deref(), o.master_port);
    // Block the signals we wait for before any thread exists, so every thread inherits it.
    let signals = match sys::Signals::block() {
        Ok(s) => s,
        Err(e) => {
            let _ = started.finish(&o, gpus::Reap::Now);
            return Err(Error::usage(format!("cannot block signals: {e}")));
        }
    };
    let mut reaper = Reaper::start();
    let mut helper = None;
    let (p, launch) = match (started.finish(&o, gpus::Reap::Later(&mut helper)), launch) {
        (Ok(p), Ok(l)) => (p, l),
        (Err(e), _) | (Ok(_), Err(e)) => {
            reaper.done();
            return Err(e);
        }
    };
    if matches!(
        p.cpu_policy,
        plan::CpuPolicy::Numa | plan::CpuPolicy::Contiguous
    ) {
        eprintln!("rankguard launch: cpu: {}", p.cpu_note);
    }

    let mut ranks: Vec<Rank> = Vec::new();
    let mut readers: Vec<JoinHandle<()>> = Vec::new();
    // Children lead their own process groups; reading a terminal from a background group
    // stops the process, so ranks get no stdin.
    let null = std::fs::File::open("/dev/null").map_err(|e| Error {
        msg: format!("rankguard launch: cannot open /dev/null for the ranks' stdin: {e}"),
        code: EXIT_CANNOT_EXECUTE,
    })?;
    let notes = failure::Notes::create();
    let mut base_env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k != failure::VAR)
        .collect();
    base_env.extend(notes.as_ref().map(failure::Notes::env));
    if let Some((k, v)) = audit.env() {
        base_env.retain(|(name, _)| *name != k);
        base_env.push((k, v));
    }
    let path = std::env::var_os("PATH");
    for r in &p.ranks {
        // Ranks are started without waiting for their exec (`rank_start::spawn`): one that
        // cannot exec says so on its stderr and exits 126/127, seen by `supervise`.
        let started = spawn::prepare(
            r.rank,
            &o.cmd,
            &spawn::merge_env(&base_env, &launch.rank_env(&p, r)),
            path.as_deref(),
        )
        .and_then(|prep| {
            rank_start::spawn(prep, r.cpus.as_ref(), &null, o.prefix).map_err(|e| e.to_string())
        });
        match started {
            Ok(child) => {
                if o.prefix {
                    let tag = format!("[rank {}] ", r.rank);
                    if let Some(out) = child.stdout {
                        readers.push(relay(out, tag.clone(), false));
                    }
                    if let Some(err) = child.stderr {
                        readers.push(relay(err, tag, true));
                    }
                }
                reaper.watch(child.pid);
                ranks.push(Rank {
                    rank: r.rank,
                    pid: child.pid,
                    status: None,
                    memory: Some(child.memory),
                });
            }
            Err(e) => {
                stop_all(&mut ranks, sys::SIGKILL);
                for rk in &mut ranks {
                    if let Ok(Some(st)) = sys::wait_child(rk.pid, true) {
                        rk.reaped(st);
                    }
                }
                reaper.done();
                wait_helper(helper.take());
                kill_leftovers();
                return Err(Error {
                    msg: format!("rankguard launch: cannot start rank {} ('{}'): {e}; no rank was left running",
                                 r.rank, o.cmd[0].to_string_lossy()),
                    code: EXIT_CANNOT_EXECUTE,
                });
            }
        }
    }
    let cmd = o.cmd[0].to_string_lossy().into_owned();
    let code = supervise(&mut ranks, &signals, o.grace, notes.as_ref(), &cmd);
    reaper.done();
    wait_helper(helper.take());
    kill_leftovers();
    // The relays end at EOF, which a descendant still holding a rank's pipe can delay
    // forever; give them a moment to flush, then exit regardless.
    let until = Instant::now() + Duration::from_secs(2);
    while readers.iter().any(|h| !h.is_finished()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    end_summary(&audit, &launch.job, since, &ranks, code);
    Ok(ExitCode::from(code))
}

/// The summary that ends every launch (`job_summary.rs`; docs/cli.md, "The summary"), on
/// stderr after the ranks' own output, and after the failure box when a refusal stopped
/// the job: how each rank ended, what the guard recorded in this job, where the audit is.
fn end_summary(
    audit: &job_summary::Audit,
    job: &str,
    since: std::time::SystemTime,
    ranks: &[Rank],
    code: u8,
) {
    let ended: Vec<(u32, u8)> = ranks
        .iter()
        .map(|r| (r.rank, r.status.as_ref().map_or(1, status_code)))
        .collect();
    eprint!("{}", job_summary::summary(audit, job, since, &ended, code));
}

/// `PR_SET_PDEATHSIG` kills a rank's first process when the launcher dies, but not what
/// that process started. The reaper, a helper in its own process group that outlives the
/// launcher, is told every rank's process group through a pipe; when the pipe closes
/// without `done` (the launcher died, even by SIGKILL), it kills those groups. It is a
/// fork of the launcher running [`reaper_main`] (`forked.rs`: no exec, so it costs the
/// launcher about what one rank's fork does), else an exec of `rankguard __reaper`.
struct Reaper(Option<(ReaperChild, Box<dyn Write>)>);

enum ReaperChild {
    Forked(super::forked::Child),
    Exec(Child),
}

impl Reaper {
    fn start() -> Reaper {
        let launcher = OsString::from(std::process::id().to_string());
        if let Ok((r, w)) = std::io::pipe() {
            let setup = super::forked::Setup {
                stdin: Some(r.into()),
                stdout: None,
                own_group: true,
            };
            // reaper_main reads fd 0 with read(2) itself (no Stdin buffer copied from us).
            let arg = launcher.clone();
            if let Ok(c) = super::forked::spawn(setup, move || match reaper_main(vec![arg]) {
                Ok(_) => 0,
                Err(e) => i32::from(e.code),
            }) {
                return Reaper(Some((ReaperChild::Forked(c), Box::new(w))));
            }
        }
        let spawned = std::env::current_exe().and_then(|exe| {
            use std::os::unix::process::CommandExt;
            Command::new(exe)
                .arg(REAPER)
                .arg(&launcher)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
        });
        match spawned {
            Ok(mut c) => {
                let pipe = c.stdin.take();
                Reaper(pipe.map(|p| (ReaperChild::Exec(c), Box::new(p) as Box<dyn Write>)))
            }
            Err(e) => {
                eprintln!("rankguard launch: warning: no reaper ({e}); if the launcher is killed, processes \
                           started by the ranks may outlive it");
                Reaper(None)
            }
        }
    }

    fn watch(&mut self, pgid: u32) {
        if let Some((_, pipe)) = &mut self.0 {
            // One write(2): the pipe is not buffered.
            let _ = pipe.write_all(format!("{pgid}\n").as_bytes());
        }
    }

    /// Tell the reaper the launch is over and wait for it to exit (it does on reading
    /// `done`; it is already running, so this is one wake-up): it is the launcher's child,
    /// and `kill_leftovers` must not find it among what the launch left behind.
    fn done(&mut self) {
        if let Some((child, mut pipe)) = self.0.take() {
            let _ = writeln!(pipe, "done");
            drop(pipe);
            let _ = match child {
                ReaperChild::Forked(c) => c.wait().map(|_| ()),
                ReaperChild::Exec(mut c) => c.wait().map(|_| ()),
            };
        }
    }
}

/// The hidden `__reaper` subcommand (see [`Reaper`]). Besides the ranks' process groups it
/// remembers, every 100 ms, every descendant of the launcher (by pid and start time): the
/// moment the launcher dies they are re-parented to init and can no longer be told apart,
/// so those that left the groups (`setsid`) are killed from that memory, with whatever
/// they started since. Limits: a process started and detached in the last 100 ms before
/// the launcher's death can be missed; and when the reaper is killed with the launcher,
/// only the ranks themselves die (PR_SET_PDEATHSIG).
pub fn reaper_main(args: Vec<OsString>) -> Result<ExitCode> {
    let me = std::process::id();
    // The launcher's pid, and proof that it is alive: it is our parent. Descendants are
    // only ever looked up while it is (never those of pid 1, or of a reused pid).
    let launcher: Option<u32> = args
        .first()
        .and_then(|a| a.to_str())
        .and_then(|a| a.parse().ok());
    let launcher_alive = || launcher.is_some_and(|l| std::os::unix::process::parent_id() == l);
    let mut groups: Vec<u32> = Vec::new();
    let mut known: Vec<tree::Proc> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    // The descendants are read every 100 ms, not after every line the launcher writes: while
    // the ranks start, a scan per rank would compete with them for the CPUs.
    let period = Duration::from_millis(100);
    let mut next_scan = Instant::now() + period;
    loop {
        let wait = next_scan.saturating_duration_since(Instant::now());
        if sys::wait_readable(0, wait) {
            let mut chunk = [0u8; 512];
            match sys::read_fd(0, &mut chunk) {
                Ok(0) => break,
                Ok(n) => pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            while let Some(i) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                let line = String::from_utf8_lossy(&line[..i]);
                if line.trim() == "done" {
                    return Ok(ExitCode::SUCCESS);
                }
                if let Ok(g) = line.trim().parse() {
                    groups.push(g);
                }
            }
        }
        if Instant::now() < next_scan {
            continue;
        }
        next_scan = Instant::now() + period;
        known.retain(|&(p, s)| tree::start_time(p) == Some(s));
        if let (Some(l), true) = (launcher, launcher_alive()) {
            for p in tree::descendants(&[l], me) {
                if !known.contains(&p) {
                    known.push(p);
                }
            }
        }
    }
    // The launcher is gone without saying done (killed, even by SIGKILL).
    for g in groups {
        let _ = sys::signal_group(g, sys::SIGKILL);
    }
    let alive = tree::still_alive(&known);
    let later = tree::descendants(&alive, me);
    for p in alive.into_iter().chain(later.into_iter().map(|(p, _)| p)) {
        let _ = sys::signal_pid(p, sys::SIGKILL);
    }
    Ok(ExitCode::SUCCESS)
}

/// Wait for the driver query's helper, left exiting when its answer came (`gpus::Reap`):
/// long done by now. Supervision may have reaped it already (then this returns at once).
fn wait_helper(helper: Option<super::forked::Child>) {
    if let Some(h) = helper {
        let _ = h.wait();
    }
}

/// Kill whatever this launch started that is still running once the ranks are done:
/// descendants that left the ranks' process groups (found by parentage; orphans were
/// re-parented to us as subreaper), then reap them.
fn kill_leftovers() {
    let me = std::process::id();
    for _ in 0..20 {
        let left = tree::descendants(&[me], 0);
        if left.is_empty() {
            break;
        }
        for (p, _) in left {
            let _ = sys::signal_pid(p, sys::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
        sys::reap_others(&[]);
    }
}

struct Rank {
    rank: u32,
    /// Also its process group.
    pid: u32,
    status: Option<ExitStatus>,
    /// What its child used before its exec, freed once it is reaped (`rank_start.rs`).
    memory: Option<rank_start::ChildMemory>,
}

impl Rank {
    /// The rank has been reaped with status `st`: its child's memory is no longer used.
    fn reaped(&mut self, st: ExitStatus) {
        self.status = Some(st);
        if let Some(m) = self.memory.take() {
            m.release();
        }
    }
}

/// Copy a child's stream to ours, line by line, each line led by `tag`.
fn relay<R: Read + Send + 'static>(stream: R, tag: String, to_stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rd = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match rd.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if line.last() != Some(&b'\n') {
                        line.push(b'\n');
                    }
                    let mut buf = tag.as_bytes().to_vec();
                    buf.extend_from_slice(&without_guard_tag(&line, tag.as_bytes()));
                    let _ = if to_stderr {
                        std::io::stderr().lock().write_all(&buf)
                    } else {
                        std::io::stdout().lock().write_all(&buf)
                    };
                }
            }
        }
    })
}

/// A guard line (`host:pid:tid [rank R] RANKGUARD ...`) without its own `[rank R] ` when it
/// is the tag the relay puts in front (`tag`), so that `--prefix-output` never doubles it:
/// `[rank 1] host:pid:tid RANKGUARD DENY ...`. Any other line is left as it is.
fn without_guard_tag<'l>(line: &'l [u8], tag: &[u8]) -> std::borrow::Cow<'l, [u8]> {
    let Some(sp) = line.iter().position(|&b| b == b' ') else {
        return line.into();
    };
    let (head, rest) = (&line[..sp], &line[sp + 1..]);
    let is_head = head.iter().filter(|&&b| b == b':').count() >= 2
        && head
            .rsplit(|&b| b == b':')
            .take(2)
            .all(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit));
    match rest.strip_prefix(tag) {
        Some(after) if is_head && after.starts_with(b"RANKGUARD ") => {
            let mut out = line[..=sp].to_vec();
            out.extend_from_slice(after);
            out.into()
        }
        _ => line.into(),
    }
}

fn stop_all(ranks: &mut [Rank], sig: i32) {
    for r in ranks.iter() {
        if r.status.is_none() {
            let _ = sys::signal_group(r.pid, sig);
        }
    }
}

/// The shell's encoding of a status: the exit code, or 128 + the signal number.
fn status_code(st: &ExitStatus) -> u8 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 1,
    }
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".to_string(),
    }
}

/// Wait for every rank. The first failing rank stops the others (SIGTERM to their process
/// groups, SIGKILL after `grace`); SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to
/// every rank. A refusal noted in `notes` (`failure.rs`) stops the job too, with at most
/// `failure::REFUSAL_GRACE`, and makes the status 78 with the failure summary. Returns the
/// launcher's exit status.
fn supervise(
    ranks: &mut [Rank],
    signals: &sys::Signals,
    grace: Duration,
    notes: Option<&failure::Notes>,
    cmd: &str,
) -> u8 {
    let mut refused: Vec<failure::Note> = Vec::new();
    let mut first_failure: Option<(u32, ExitStatus)> = None;
    let mut interrupted: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let mut newly_failed = false;
    // After a note: when the job is stopped unless the noted rank's process ended first.
    let mut refusal_stop: Option<Instant> = None;
    let rank_pids: Vec<u32> = ranks.iter().map(|r| r.pid).collect();
    loop {
        // Orphans adopted as subreaper that exited: reap them (never a rank: its Child does).
        sys::reap_others(&rank_pids);
        for r in ranks.iter_mut() {
            if r.status.is_some() {
                continue;
            }
            if let Ok(Some(st)) = sys::wait_child(r.pid, false) {
                r.reaped(st);
                if !st.success() && first_failure.is_none() && interrupted.is_none() {
                    first_failure = Some((r.rank, st));
                    eprintln!("rankguard launch: rank {} (pid {}) {}; stopping the other ranks (SIGTERM, SIGKILL \
                               after {:.1}s)", r.rank, r.pid, describe(&st), grace.as_secs_f64());
                    let t = Instant::now() + grace;
                    kill_at = Some(kill_at.map_or(t, |k| k.min(t)));
                    newly_failed = true;
                }
            }
        }
        if let Some(n) = notes {
            let seen = n.read();
            if refused.is_empty() && !seen.is_empty() && interrupted.is_none() {
                let first = &seen[0];
                eprintln!(
                    "rankguard launch: the guard refused process {} ('{}') in the tree of pid {} \
                           ({}); stopping the job (SIGTERM, SIGKILL after {:.1}s)",
                    first.pid,
                    first.command,
                    first.rank_pid,
                    first.rule,
                    failure::REFUSAL_GRACE.as_secs_f64()
                );
                let now = Instant::now();
                let cap = now + failure::RANK_END_WAIT + failure::REFUSAL_GRACE;
                kill_at = Some(kill_at.map_or(cap, |t| t.min(cap)));
                refusal_stop = Some(now + failure::RANK_END_WAIT);
            }
            if seen.len() > refused.len() {
                refused = seen;
            }
        }
        if refusal_stop.is_some_and(|t| Instant::now() >= t) {
            refusal_stop = None;
            newly_failed = true;
        }
        if newly_failed {
            stop_all(ranks, sys::SIGTERM);
            newly_failed = false;
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        let now = Instant::now();
        if let Some(t) = kill_at {
            if now >= t && !killed {
                eprintln!("rankguard launch: grace period over; killing the remaining ranks");
                stop_all(ranks, sys::SIGKILL);
                killed = true;
            }
        }
        let wait = kill_at
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or(Duration::from_millis(200));
        match signals.wait(wait.clamp(Duration::from_millis(1), Duration::from_millis(200))) {
            None | Some(sys::SIGCHLD) => {}
            Some(sig) => {
                if interrupted.is_some() {
                    eprintln!("rankguard launch: second signal {sig}; killing every rank");
                    stop_all(ranks, sys::SIGKILL);
                    killed = true;
                } else {
                    interrupted = Some(sig);
                    stop_all(ranks, sig);
                    if kill_at.is_none() {
                        kill_at = Some(Instant::now() + grace);
                    }
                }
            }
        }
    }
    // Children die with the launcher: whatever a rank left running in its process group
    // (a background helper, a stray worker) goes too, on success as on failure.
    for r in ranks.iter() {
        let _ = sys::signal_group(r.pid, sys::SIGKILL);
    }
    if let Some(n) = notes {
        // A note written after the last poll (the rank's process ended first).
        let seen = n.read();
        if seen.len() > refused.len() {
            refused = seen;
        }
    }
    if !refused.is_empty() && interrupted.is_none() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let ended: Vec<(failure::Note, failure::Ended)> = refused
            .into_iter()
            .map(|n| {
                let r = ranks.iter().find(|r| r.pid == n.rank_pid);
                let e = failure::Ended {
                    rank: r.map(|r| r.rank),
                    exitcode: r.and_then(|r| r.status.as_ref()).map(status_code),
                };
                (n, e)
            })
            .collect();
        eprint!("{}", failure::summary(cmd, host.trim(), &ended));
        return EXIT_REFUSED;
    }
    match (first_failure, interrupted) {
        (Some((_, st)), _) => status_code(&st),
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => 0,
    }
}

#[cfg(test)]
mod relay_tests {
    use super::without_guard_tag;

    #[test]
    fn a_relayed_guard_line_names_its_rank_once() {
        let tag = b"[rank 1] ";
        let line = b"node7:4242:4243 [rank 1] RANKGUARD DENY cuDeviceGet(ordinal=1) denied\n";
        assert_eq!(
            &*without_guard_tag(line, tag),
            b"node7:4242:4243 RANKGUARD DENY cuDeviceGet(ordinal=1) denied\n"
        );
        // another rank's tag, a rank root, the program's own lines: untouched
        for other in [
            &b"node7:4242:4243 [rank 2] RANKGUARD DENY x\n"[..],
            b"node7:4242:4243 [rank root 9] RANKGUARD WARN x\n",
            b"[rank 1] RANKGUARD said\n",
            b"a:b:c [rank 1] RANKGUARD x\n",
            b"plain output\n",
            b"",
        ] {
            assert_eq!(&*without_guard_tag(other, tag), other);
        }
    }
}
