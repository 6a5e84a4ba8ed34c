//! `rankguard check`: what this environment means for the contract, and whether a rank
//! started in it would violate it (exit 1) or not (exit 0).
//!
//! Problems (exit 1) break R1 for a rank process: `CUDA_VISIBLE_DEVICES` unset, empty
//! or with several entries read (entries CUDA does not read, `0,-1`, are a warning: the
//! guard decides on those it reads, `cvd::unread`); the driver not enumerating exactly one device or not
//! answering; a GPU other than the rank's own (`RANKGUARD_RANK_GPU`, compared by identity).
//! Warnings do not change the status: the guard missing from `LD_PRELOAD` (the contract is
//! then not enforced, though not violated either), a mode other than enforce.

use std::ffi::OsString;
use std::path::PathBuf;

use super::args::{Lexer, Token};
use super::exit::{emit, Error, ExitCode, Result, EXIT_VIOLATION};
use super::json_out::Value;
use super::launch::SYSROOT_VAR;
use super::{env, gpus, lib_path, sys};
use crate::config::{Mode, MODE_EXPECTED};
use crate::cvd::{self, CvdEntry, Visibility};
use crate::plan::DriverGpu;
use crate::rankgpu::{self, RankGpu};
use crate::topology::Topology;
use std::os::unix::ffi::OsStrExt;

const HELP: &str = "\
Usage: rankguard check [--json] [--sysroot DIR]

Explain this environment: CUDA_VISIBLE_DEVICES, the GPU the driver enumerates (UUID, bus
id, NUMA node), the guard in LD_PRELOAD and its mode, the rank's GPU, the CPU affinity.
The last line is the verdict: `ok` (a rank started here keeps the contract and the guard
enforces it), `not enforced` (it keeps it, but the guard is not preloaded or its mode lets
violations through) or `violation`.
Exit 0: a rank started here keeps the contract (enforced or not); 1: it would violate it;
2: usage error. `rankguard doctor` goes further: it runs a child under the guard.
";

pub fn main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("check", args);
    let mut json = false;
    let mut sysroot: Option<String> = None;
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) => match f.as_str() {
                "-h" | "--help" => {
                    emit(HELP);
                    return Ok(ExitCode::SUCCESS);
                }
                "--json" => json = true,
                "--sysroot" => sysroot = Some(lx.value(&f)?),
                _ => return Err(lx.unknown(&f)),
            },
            Token::Word(w) => {
                return Err(Error::usage(format!(
                    "rankguard check: this command takes no command to run (got '{}')",
                    w.to_string_lossy()
                )))
            }
            Token::End => {}
        }
    }
    let sysroot = sysroot
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os(SYSROOT_VAR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/"));
    let report = gather(&sysroot);
    if json {
        emit(&report.json().pretty());
    } else {
        emit(&report.text());
    }
    Ok(if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATION)
    })
}

/// `check`'s verdict line for this environment (`rankguard doctor` shows it).
pub(super) fn verdict_here() -> String {
    let sysroot = std::env::var_os(SYSROOT_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    gather(&sysroot).verdict()
}

struct DeviceReport {
    gpu: DriverGpu,
    numa_node: Option<u32>,
    local_cpus: Option<String>,
}

struct Report {
    cvd: Option<String>,
    mode: &'static str,
    entries: Vec<String>,
    driver: std::result::Result<Vec<DeviceReport>, String>,
    guard_preloaded: Option<String>,
    guard_lib: Option<String>,
    guard_mode: Mode,
    rank_gpu: Option<String>,
    rank_gpu_matches: Option<bool>,
    /// The rank's GPU is named in a form this process cannot verify.
    rank_gpu_unverifiable: bool,
    job: Option<String>,
    affinity: Option<String>,
    omp_num_threads: Option<String>,
    problems: Vec<String>,
    warnings: Vec<String>,
}

fn gather(sysroot: &std::path::Path) -> Report {
    let var = cvd::VAR;
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let raw_os = std::env::var_os(var);
    let raw: Option<String> = raw_os.as_ref().map(|v| v.to_string_lossy().into_owned());
    let vis = match &raw_os {
        None => Visibility::Unset,
        Some(v) => match v.to_str() {
            Some(s) => cvd::parse(Some(s)),
            None => Visibility::Entries(vec![]),
        },
    };
    let entries: Vec<CvdEntry> = vis.entries().map(|e| e.to_vec()).unwrap_or_default();
    let mode = match (&vis, entries.first()) {
        (Visibility::Unset, _) => "unset",
        (_, None) => "none",
        (_, Some(CvdEntry::Index(_))) => "index",
        (_, Some(CvdEntry::Uuid(_))) => "uuid",
        (_, Some(CvdEntry::Mig(_))) => "mig",
    };
    let fix =
        "start the rank with `rankguard launch`, or through `rankguard run --narrow-by LOCAL_RANK`";
    match &raw {
        None => problems.push(format!(
            "{var} is unset: every GPU of the node is visible, a rank must see exactly one; {fix}"
        )),
        Some(v) => {
            // R1 is decided on the entries CUDA reads, as the guard decides it at cuInit
            // (`0,-1` is the single device 0); entries it does not read are a warning, said
            // by the guard in the same words (crate::cvd::unread, one function).
            if let Some(u) = cvd::unread(v) {
                warnings.push(u.describe(v));
            }
            if entries.is_empty() {
                problems.push(format!(
                    "{var}='{v}' makes no GPU visible: right for a helper that must not use CUDA, not for a rank; {fix}"));
            } else if entries.len() > 1 {
                problems.push(format!(
                    "{var}='{v}' makes {} GPUs visible, a rank must see exactly one; {fix}",
                    entries.len()
                ));
            }
        }
    }

    let topo = Topology::read(sysroot).ok();
    let driver = gpus::query(None).map(|list| {
        list.into_iter()
            .map(|g| {
                let info = topo
                    .as_ref()
                    .and_then(|t| t.by_bus_id(&g.bus_id).or_else(|| t.by_uuid(&g.uuid)));
                let numa_node = info.and_then(|i| i.numa_node);
                let local_cpus = info
                    .and_then(|i| topo.as_ref().and_then(|t| t.local_cpus(i)))
                    .map(|c| c.to_string());
                DeviceReport {
                    gpu: g,
                    numa_node,
                    local_cpus,
                }
            })
            .collect::<Vec<_>>()
    });
    match &driver {
        Ok(d) if d.len() == 1 => {}
        Ok(d) => problems.push(format!(
            "the driver enumerates {} devices under this environment; a rank must see exactly one",
            d.len()
        )),
        Err(e) => problems.push(format!("cannot ask the driver which GPU is visible: {e}")),
    }

    // Decided exactly as the guard decides it at cuInit (crate::rankgpu, one function):
    // a value that names no single GPU the process can verify fails closed.
    let rank_gpu_raw = std::env::var_os(env::RANK_GPU);
    let rank_gpu = rank_gpu_raw
        .as_ref()
        .map(|v| v.to_string_lossy().into_owned());
    let mut rank_gpu_matches = None;
    let mut rank_gpu_unverifiable = false;
    if let (Some(rg), Ok(d)) = (&rank_gpu_raw, &driver) {
        if d.len() == 1 {
            let resolved = std::env::var_os(env::RANK_GPU_UUID);
            let decided = rankgpu::decide(
                rg.as_bytes(),
                resolved.as_ref().map(|v| v.as_bytes()),
                &d[0].gpu.uuid,
                vis.entries(),
            );
            let shown = rg.to_string_lossy();
            match decided {
                RankGpu::Same => {}
                RankGpu::Other => problems.push(format!(
                    "this process sees {} ({var}='{}') but its rank owns {}='{shown}': every process of a rank must \
                     see the rank's GPU; stop re-pointing {var} in this process tree",
                    d[0].gpu.uuid, raw.as_deref().unwrap_or(""), env::RANK_GPU)),
                RankGpu::Unverifiable(why) => problems.push(format!(
                    "{}='{shown}' names no single GPU this process can verify: {why}; the guard stops this \
                     process at cuInit (R1)", env::RANK_GPU)),
            }
            rank_gpu_matches = Some(decided.is_same());
            rank_gpu_unverifiable = matches!(decided, RankGpu::Unverifiable(_));
        }
    }

    let guard_preloaded = env::preloaded_guard(std::env::var_os("LD_PRELOAD").as_deref());
    let guard_lib = lib_path::find().ok().map(|p| p.display().to_string());
    if guard_preloaded.is_none() {
        warnings.push(
            "the guard is not in LD_PRELOAD: the contract is not enforced \
                       (LD_PRELOAD=$(rankguard lib), or start through rankguard launch/run)"
                .to_string(),
        );
    }
    // Parsed as the guard parses it (crate::config, one function).
    let guard_mode = match std::env::var("RANKGUARD_MODE")
        .ok()
        .filter(|m| !m.is_empty())
    {
        None => Mode::Enforce,
        Some(m) => Mode::parse(&m).unwrap_or_else(|| {
            warnings.push(format!(
                "RANKGUARD_MODE='{m}' is not valid: expected {MODE_EXPECTED}, as the guard does"
            ));
            Mode::Enforce
        }),
    };
    if matches!(guard_mode, Mode::Warn | Mode::Off) {
        warnings.push(format!(
            "RANKGUARD_MODE={}: violations are not stopped",
            guard_mode.as_str()
        ));
    }
    Report {
        cvd: raw,
        mode,
        entries: entries.iter().map(|e| e.text()).collect(),
        driver,
        guard_preloaded,
        guard_lib,
        guard_mode,
        rank_gpu,
        rank_gpu_matches,
        rank_gpu_unverifiable,
        job: std::env::var(env::JOB).ok(),
        affinity: sys::affinity().ok().map(|a| a.to_string()),
        omp_num_threads: std::env::var("OMP_NUM_THREADS").ok(),
        problems,
        warnings,
    }
}

impl Report {
    /// The stable `check --json` form (docs/cli.md, "check --json").
    fn json(&self) -> Value {
        let (driver_ok, devices, error) = match &self.driver {
            Ok(d) => (
                true,
                d.iter()
                    .enumerate()
                    .map(|(i, d)| {
                        Value::Obj(vec![
                            ("ordinal", Value::Num(i as i64)),
                            ("uuid", Value::str(d.gpu.uuid.clone())),
                            ("bus_id", Value::str(d.gpu.bus_id.clone())),
                            ("numa_node", Value::opt_num(d.numa_node)),
                            ("local_cpus", Value::opt_str(d.local_cpus.clone())),
                        ])
                    })
                    .collect(),
                Value::Null,
            ),
            Err(e) => (false, vec![], Value::str(e.clone())),
        };
        Value::Obj(vec![
            ("format", Value::str("rankguard-check")),
            ("version", Value::Num(1)),
            ("ok", Value::Bool(self.problems.is_empty())),
            ("enforced", Value::Bool(self.enforced())),
            ("cuda_visible_devices", Value::opt_str(self.cvd.clone())),
            ("mode", Value::str(self.mode)),
            (
                "entries",
                Value::Arr(self.entries.iter().map(|e| Value::str(e.clone())).collect()),
            ),
            (
                "driver",
                Value::Obj(vec![
                    ("ok", Value::Bool(driver_ok)),
                    (
                        "count",
                        if driver_ok {
                            Value::Num(devices.len() as i64)
                        } else {
                            Value::Null
                        },
                    ),
                    ("devices", Value::Arr(devices)),
                    ("error", error),
                ]),
            ),
            (
                "guard",
                Value::Obj(vec![
                    ("preloaded", Value::Bool(self.guard_preloaded.is_some())),
                    (
                        "preload_entry",
                        Value::opt_str(self.guard_preloaded.clone()),
                    ),
                    ("library", Value::opt_str(self.guard_lib.clone())),
                    ("mode", Value::str(self.guard_mode.as_str())),
                ]),
            ),
            ("rank_gpu", Value::opt_str(self.rank_gpu.clone())),
            (
                "rank_gpu_matches",
                self.rank_gpu_matches.map_or(Value::Null, Value::Bool),
            ),
            ("job", Value::opt_str(self.job.clone())),
            ("affinity", Value::opt_str(self.affinity.clone())),
            (
                "omp_num_threads",
                Value::opt_str(self.omp_num_threads.clone()),
            ),
            (
                "problems",
                Value::Arr(
                    self.problems
                        .iter()
                        .map(|p| Value::str(p.clone()))
                        .collect(),
                ),
            ),
            (
                "warnings",
                Value::Arr(
                    self.warnings
                        .iter()
                        .map(|p| Value::str(p.clone()))
                        .collect(),
                ),
            ),
        ])
    }

    fn text(&self) -> String {
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
        let mut s = String::new();
        let cvd_line = match &self.cvd {
            None => "(unset)".to_string(),
            Some(v) => format!(
                "'{v}' -> {} entr{} [{}], mode {}",
                self.entries.len(),
                if self.entries.len() == 1 { "y" } else { "ies" },
                self.entries.join(","),
                self.mode
            ),
        };
        s.push_str(&format!("{:<22}{cvd_line}\n", cvd::VAR));
        match &self.driver {
            Ok(d) => {
                s.push_str(&format!(
                    "{:<22}{} device{} visible\n",
                    "driver",
                    d.len(),
                    if d.len() == 1 { "" } else { "s" }
                ));
                for (i, d) in d.iter().enumerate() {
                    s.push_str(&format!(
                        "{:<22}{} bus {} NUMA node {} (CPUs {})\n",
                        format!("  cuda:{i}"),
                        d.gpu.uuid,
                        d.gpu.bus_id,
                        d.numa_node.map_or("-".to_string(), |n| n.to_string()),
                        dash(&d.local_cpus)
                    ));
                }
            }
            Err(e) => s.push_str(&format!("{:<22}not available: {e}\n", "driver")),
        }
        s.push_str(&format!(
            "{:<22}{} (RANKGUARD_MODE={}; library {})\n",
            "guard",
            self.guard_preloaded
                .as_ref()
                .map_or("not in LD_PRELOAD".to_string(), |p| format!(
                    "in LD_PRELOAD ({p})"
                )),
            self.guard_mode.as_str(),
            dash(&self.guard_lib)
        ));
        let matches = match self.rank_gpu_matches {
            Some(false) if self.rank_gpu_unverifiable => {
                " (names no single GPU this process can verify)"
            }
            Some(true) => " (this process sees it)",
            Some(false) => " (this process sees ANOTHER GPU)",
            None => "",
        };
        s.push_str(&format!(
            "{:<22}{}{matches}\n",
            env::RANK_GPU,
            dash(&self.rank_gpu)
        ));
        s.push_str(&format!("{:<22}{}\n", env::JOB, dash(&self.job)));
        s.push_str(&format!(
            "{:<22}{} (OMP_NUM_THREADS={})\n",
            "CPU affinity",
            dash(&self.affinity),
            dash(&self.omp_num_threads)
        ));
        for w in &self.warnings {
            s.push_str(&format!("warning: {w}\n"));
        }
        for p in &self.problems {
            s.push_str(&format!("problem: {p}\n"));
        }
        s.push_str(&self.verdict());
        s.push('\n');
        s
    }

    /// Whether the guard would enforce the contract here: preloaded, in enforce or abort
    /// mode.
    fn enforced(&self) -> bool {
        self.guard_preloaded.is_some() && matches!(self.guard_mode, Mode::Enforce | Mode::Abort)
    }

    /// The last line: never "ok" where the contract is not enforced (issue 32).
    fn verdict(&self) -> String {
        if !self.problems.is_empty() {
            return "violation: a rank started here would break the contract".into();
        }
        if self.enforced() {
            return "ok: a rank started here keeps the contract, and the guard enforces it".into();
        }
        let why = if self.guard_preloaded.is_none() {
            "the guard is not in LD_PRELOAD".to_string()
        } else {
            format!(
                "RANKGUARD_MODE={} lets violations through",
                self.guard_mode.as_str()
            )
        };
        format!(
            "not enforced: this environment keeps the contract, but {why}, so nothing stops a \
             process from breaking it (status 0: nothing is violated)"
        )
    }
}
