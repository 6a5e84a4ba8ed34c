//! `rankguard doctor`: what `check` cannot tell from the environment alone. Whether the
//! guard loads and acts in a child here (a tiny child, this binary's `__doctor-probe`, run
//! under the guard in warn mode on whatever driver `libcuda.so.1` is: it makes one planted
//! R2 call, and the guard's line and audit record must appear), whether the audit path can
//! be written, whether the IPC provenance registry is one the guard trusts and how full it
//! is, and which build `rankguard lib` picks and why (issue 32).
//!
//! Each check prints one line; a problem (status 1) is something that makes the guard not
//! work as documented here; a warning is worth knowing but breaks nothing (no driver on a
//! login node, no audit configured). `--json` prints the same checks as one object
//! (docs/schema/doctor.v1.json). docs/cli.md, "doctor".

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::args::{Lexer, Token};
use super::exit::{emit, Error, ExitCode, Result, EXIT_VIOLATION};
use super::job_summary::{self, AUDIT_VAR};
use super::json_out::Value;
use super::{check, env, lib_path, sys};
use rankguard_core::handle_table::{self, HandleTable};
use rankguard_core::registry::{self, DirProblem, Registry, MAX_RECORDS};

/// The hidden subcommand the probe child runs.
pub const PROBE: &str = "__doctor-probe";

/// How long the probe child may take (it loads the driver and makes two calls).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

const HELP: &str = "\
Usage: rankguard doctor [--json]

Checks that the guard works here, beyond what `rankguard check` reads from the environment:
  library    which librankguard.so `rankguard lib` picks (RANKGUARD_LIB, beside the binary,
             ../lib, or carried in it; the glibc 2.28 or 2.34 build) and why
  guard      runs a tiny child under the guard (RANKGUARD_MODE=warn, one GPU visible, its
             own audit file and registry in a temporary directory) that calls
             cuDeviceGet(ordinal 1), a planted R2 violation: the guard must load, say its
             line and write its audit record
  audit      RANKGUARD_AUDIT's directory exists and a file can be created in it
  registry   the IPC provenance registry (RANKGUARD_REGISTRY or the default) is a directory
             the guard trusts (yours, mode 0700, not a symlink), how full it is, and how
             many of its handle table's slots (handles.table) hold a record
  check      the verdict of `rankguard check` for this environment
Each line is `ok`, `warning` (worth knowing, breaks nothing) or `PROBLEM` (with its fix).
--json  the same checks as one JSON object (format \"rankguard-doctor\", version 1): ok,
        problems, warnings, summary, and checks.NAME.{status, message} for each check
        above (status ok, warning, problem or info), with library.{path, why},
        audit.{template, directory}, registry.{directory, configured, entries, capacity,
        handle_table_used, handle_table_slots}
Exit 0: no problem; 1: a problem found (each line says the fix); 2: usage error.
";

#[derive(Clone, Copy)]
enum Status {
    Ok,
    Warning,
    Problem,
    Info,
}

/// One check's finding: its line, and for `--json` the facts behind it.
struct Finding {
    what: &'static str,
    status: Status,
    text: String,
    details: Vec<(&'static str, Value)>,
}

struct Findings {
    items: Vec<Finding>,
    problems: usize,
    warnings: usize,
}

impl Findings {
    fn push(&mut self, what: &'static str, status: Status, text: String) {
        match status {
            Status::Warning => self.warnings += 1,
            Status::Problem => self.problems += 1,
            Status::Ok | Status::Info => {}
        }
        self.items.push(Finding {
            what,
            status,
            text,
            details: Vec::new(),
        });
    }
    fn ok(&mut self, what: &'static str, text: String) {
        self.push(what, Status::Ok, text);
    }
    fn warn(&mut self, what: &'static str, text: String) {
        self.push(what, Status::Warning, text);
    }
    fn problem(&mut self, what: &'static str, text: String) {
        self.push(what, Status::Problem, text);
    }
    fn info(&mut self, what: &'static str, text: String) {
        self.push(what, Status::Info, text);
    }
    /// A fact for `--json`, on the finding just pushed.
    fn detail(&mut self, key: &'static str, v: Value) {
        if let Some(last) = self.items.last_mut() {
            last.details.push((key, v));
        }
    }

    fn line(f: &Finding) -> String {
        let what = f.what;
        let text = &f.text;
        match f.status {
            Status::Ok => format!("{what:<10} ok: {text}"),
            Status::Warning => format!("{what:<10} warning: {text}"),
            Status::Problem => format!("{what:<10} PROBLEM: {text}"),
            Status::Info => format!("{what:<10} {text}"),
        }
    }

    /// The last line of the text form (also `summary` in the JSON form).
    fn summary(&self) -> String {
        match (self.problems, self.warnings) {
            (0, 0) => "doctor: ok, the guard works here".to_string(),
            (0, w) => format!(
                "doctor: ok, the guard works here ({} above)",
                if w == 1 {
                    "1 warning".into()
                } else {
                    format!("{w} warnings")
                }
            ),
            (p, _) => format!(
                "doctor: {} found; the guard does not work here as documented",
                if p == 1 {
                    "1 problem".into()
                } else {
                    format!("{p} problems")
                }
            ),
        }
    }

    fn text(&self) -> String {
        let mut out: Vec<String> = self.items.iter().map(Self::line).collect();
        out.push(self.summary());
        out.join("\n") + "\n"
    }

    /// The stable `doctor --json` form (docs/cli.md, "doctor --json";
    /// docs/schema/doctor.v1.json).
    fn json(self) -> Value {
        let summary = self.summary();
        let (problems, warnings) = (self.problems, self.warnings);
        let checks = self
            .items
            .into_iter()
            .map(|f| {
                let status = match f.status {
                    Status::Ok => "ok",
                    Status::Warning => "warning",
                    Status::Problem => "problem",
                    Status::Info => "info",
                };
                let mut members = vec![
                    ("status", Value::str(status)),
                    ("message", Value::Str(f.text)),
                ];
                members.extend(f.details);
                (f.what, Value::Obj(members))
            })
            .collect();
        Value::Obj(vec![
            ("format", Value::str("rankguard-doctor")),
            ("version", Value::Num(1)),
            ("ok", Value::Bool(problems == 0)),
            ("problems", Value::Num(problems as i64)),
            ("warnings", Value::Num(warnings as i64)),
            ("summary", Value::Str(summary)),
            ("checks", Value::Obj(checks)),
        ])
    }
}

pub fn main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("doctor", args);
    let mut json = false;
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) if f == "-h" || f == "--help" => {
                emit(HELP);
                return Ok(ExitCode::SUCCESS);
            }
            Token::Flag(f) if f == "--json" => json = true,
            Token::Flag(f) => return Err(lx.unknown(&f)),
            Token::Word(w) => {
                return Err(Error::usage(format!(
                    "rankguard doctor: this command takes no arguments (got '{}')",
                    w.to_string_lossy()
                )))
            }
            Token::End => {}
        }
    }
    let mut f = Findings {
        items: Vec::new(),
        problems: 0,
        warnings: 0,
    };
    let lib = match lib_path::find_why() {
        Ok((path, why)) => {
            f.ok("library", format!("{} ({why})", path.display()));
            f.detail("path", Value::str(path.display().to_string()));
            f.detail("why", Value::Str(why));
            Some(path)
        }
        Err(e) => {
            f.problem("library", format!("no guard build: {}", e.msg));
            f.detail("path", Value::Null);
            f.detail("why", Value::Null);
            None
        }
    };
    match &lib {
        Some(path) => guard_check(&mut f, path),
        None => f.problem(
            "guard",
            "not run: there is no guard library to load (see library)".into(),
        ),
    }
    audit_check(&mut f);
    registry_check(&mut f);
    f.info("check", check::verdict_here());
    let code = if f.problems == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATION)
    };
    if json {
        emit(&f.json().pretty());
    } else {
        emit(&f.text());
    }
    Ok(code)
}

/// The hidden `__doctor-probe` subcommand: the child the guard must act in. Prints what it
/// saw, one `key value` line each.
pub fn probe_main(_args: Vec<OsString>) -> Result<ExitCode> {
    let loaded = sys::object_loaded(env::GUARD_FILE);
    let mut out = format!("loaded {}\n", if loaded { "yes" } else { "no" });
    match sys::probe_r2() {
        Ok((init, get)) => out.push_str(&format!("init {init}\nget1 {get}\n")),
        Err(e) => out.push_str(&format!("driver {e}\n")),
    }
    emit(&out);
    Ok(ExitCode::SUCCESS)
}

/// The entry the probe child gets: the first of this environment's CVD (a GPU this user may
/// see), else ordinal 0.
fn probe_entry() -> String {
    std::env::var(crate::cvd::VAR)
        .ok()
        .and_then(|v| v.split(',').next().map(|e| e.trim().to_string()))
        .filter(|e| !e.is_empty() && e != "-1")
        .unwrap_or_else(|| "0".into())
}

fn guard_check(f: &mut Findings, lib: &Path) {
    let dir = match tempdir() {
        Ok(d) => d,
        Err(e) => {
            f.problem(
                "guard",
                format!("not run: cannot make a temporary directory ({e}); set TMPDIR"),
            );
            return;
        }
    };
    let audit = dir.0.join("probe.%p.jsonl");
    // Its own registry, so that the probe's rank record lands in nothing of the user's.
    let registry = dir.0.join("registry");
    {
        use std::os::unix::fs::DirBuilderExt;
        if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&registry) {
            f.problem(
                "guard",
                format!("not run: cannot make a temporary directory ({e}); set TMPDIR"),
            );
            return;
        }
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            f.problem(
                "guard",
                format!("not run: cannot find the rankguard executable ({e})"),
            );
            return;
        }
    };
    let mut cmd = Command::new(exe);
    cmd.arg(PROBE)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env(
            "LD_PRELOAD",
            env::preload_with_guard(lib, std::env::var_os("LD_PRELOAD").as_deref()),
        )
        .env(crate::cvd::VAR, probe_entry())
        .env("RANKGUARD_MODE", "warn")
        .env(AUDIT_VAR, &audit)
        .env("RANKGUARD_REGISTRY", &registry);
    // The probe is its own rank: nothing of a rank this doctor may run in.
    for v in [
        env::RANK_GPU,
        env::RANK_GPU_UUID,
        "RANKGUARD_NARROW_BY",
        "RANKGUARD_LAUNCH_DIR",
        "RANKGUARD_DEBUG_FILE",
    ] {
        cmd.env_remove(v);
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            f.problem(
                "guard",
                format!("not run: cannot start the probe child ({e})"),
            );
            return;
        }
    };
    let (status, out, err) = match wait_bounded(child, PROBE_TIMEOUT) {
        Ok(r) => r,
        Err(e) => {
            f.problem("guard", e);
            return;
        }
    };
    let first_err = err
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string();
    if !status.success() {
        f.problem(
            "guard",
            format!(
                "the probe child under the guard ended with {status}: {first_err}; run `LD_PRELOAD=$(rankguard lib) \
                 rankguard {PROBE}` to see it"
            ),
        );
        return;
    }
    let value = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix(' ')))
            .map(str::to_string)
    };
    if value("loaded").as_deref() != Some("yes") {
        f.problem(
            "guard",
            format!(
                "the guard was in the child's LD_PRELOAD but is not loaded in it{}; check the library \
                 (rankguard lib) and RANKGUARD_LIB_GLIBC",
                if first_err.is_empty() {
                    String::new()
                } else {
                    format!(" (the loader said: {first_err})")
                }
            ),
        );
        return;
    }
    if let Some(why) = value("driver") {
        f.warn(
            "guard",
            format!(
                "the guard loads in a child, but it could not be seen acting: no CUDA driver here ({why}); run \
                 doctor on a GPU node (or with the driver on LD_LIBRARY_PATH)"
            ),
        );
        return;
    }
    let said = err
        .lines()
        .find(|l| l.contains("RANKGUARD") && l.contains("cuDeviceGet") && l.contains("R2"));
    let recorded = std::fs::read_dir(&dir.0)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path() != registry)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .any(|t| {
            t.lines().any(|l| {
                crate::audit::parse_record(l)
                    .is_ok_and(|r| r.rule == "R2" && r.call == "cuDeviceGet")
            })
        });
    let init = value("init").unwrap_or_else(|| "?".into());
    match (said, recorded) {
        (Some(_), true) => f.ok(
            "guard",
            format!(
                "a child under the guard (CUDA_VISIBLE_DEVICES={}, warn mode; cuInit returned {init}) had its \
                 planted cuDeviceGet(ordinal=1) said as R2 and recorded in its audit file",
                probe_entry()
            ),
        ),
        (said, recorded) => f.problem(
            "guard",
            format!(
                "the guard is loaded in a child but did not act on a planted cuDeviceGet(ordinal=1): {}, {} \
                 (cuInit returned {init}); is libcuda.so.1 reached through another path?",
                if said.is_some() { "its line came" } else { "no line" },
                if recorded { "its record was written" } else { "no audit record" }
            ),
        ),
    }
}

fn audit_check(f: &mut Findings) {
    let var = std::env::var_os(AUDIT_VAR).filter(|v| !v.is_empty());
    let mut writable = None;
    match &var {
        None => f.warn(
            "audit",
            format!(
                "{AUDIT_VAR} is unset: violations are said on stderr but not kept for `rankguard report`; set \
                 {AUDIT_VAR}=DIR/audit.%h.%p.jsonl"
            ),
        ),
        Some(v) => match v.to_str() {
            None => f.problem(
                "audit",
                format!("{AUDIT_VAR} is not valid UTF-8; fix the variable"),
            ),
            Some(t) => match job_summary::check_template(t, &job_summary::host()) {
                Ok((dir, _)) => {
                    f.ok(
                        "audit",
                        format!("{AUDIT_VAR}={t}: {} is writable", dir.display()),
                    );
                    writable = Some(dir.display().to_string());
                }
                Err(e) => f.problem("audit", e),
            },
        },
    }
    f.detail(
        "template",
        Value::opt_str(var.map(|v| v.to_string_lossy().into_owned())),
    );
    f.detail("directory", Value::opt_str(writable));
}

fn registry_check(f: &mut Findings) {
    let uid = sys::euid();
    let configured = std::env::var_os("RANKGUARD_REGISTRY").filter(|v| !v.is_empty());
    let (dir, name) = match &configured {
        Some(d) => (PathBuf::from(d), "RANKGUARD_REGISTRY"),
        None => (registry::default_dir(uid), "the default registry"),
    };
    let (entries, used) = registry_state(f, &dir, uid, configured.is_some(), name);
    f.detail("directory", Value::str(dir.display().to_string()));
    f.detail("configured", Value::Bool(configured.is_some()));
    f.detail("entries", Value::opt_num(entries.map(|n| n as i64)));
    f.detail("capacity", Value::Num(MAX_RECORDS as i64));
    f.detail("handle_table_used", Value::opt_num(used.map(|n| n as i64)));
    f.detail("handle_table_slots", Value::Num(handle_table::SLOTS as i64));
}

/// The registry's line; its entry count when it is trusted and could be listed, and how
/// many slots of its handle table hold a record (when it has a usable one).
fn registry_state(
    f: &mut Findings,
    dir: &Path,
    uid: u32,
    configured: bool,
    name: &str,
) -> (Option<usize>, Option<usize>) {
    let entries = match Registry::open(dir, uid, false) {
        Ok(r) => return fullness(f, r.dir(), uid, name),
        Err(DirProblem::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            f.ok(
                "registry",
                format!(
                    "{name} {} does not exist yet; the guard creates it (0700) at the first export",
                    dir.display()
                ),
            );
            Some(0)
        }
        Err(problem) if configured => {
            f.problem(
                "registry",
                format!(
                    "{name}={} {problem}: the guard does not trust it, so every IPC import has unknown provenance \
                     (R3 cannot tell one GPU from another); point RANKGUARD_REGISTRY at a directory you own with \
                     mode 0700 (not a symlink), or unset it",
                    dir.display()
                ),
            );
            None
        }
        Err(problem) => {
            let host = job_summary::full_host();
            // The guard's private fallback lives under the user's home (it creates the
            // directories there): usable when the home exists.
            let usable = sys::home_dir(uid)
                .filter(|h| h.is_dir())
                .map(|h| registry::fallback_dir(&h, &host));
            match &usable {
                Some(fb) => f.problem(
                    "registry",
                    format!(
                        "{name} {} {problem}: another user may have created it to switch rule R3 off; the guard \
                         uses the private fallback {} instead (R3 still works). Remove the squatted directory, or \
                         set RANKGUARD_REGISTRY to a directory you own with mode 0700",
                        dir.display(),
                        fb.display()
                    ),
                ),
                None => f.problem(
                    "registry",
                    format!(
                        "{name} {} {problem}, and there is no private fallback (no usable home directory): the \
                         guard refuses every IPC import of unknown provenance. Set RANKGUARD_REGISTRY to a \
                         directory you own with mode 0700",
                        dir.display()
                    ),
                ),
            }
            None
        }
    };
    (entries, None)
}

/// How full a trusted registry is: its entries against [`MAX_RECORDS`], and its handle
/// table's slots in use (none when it has no table yet).
fn fullness(f: &mut Findings, dir: &Path, uid: u32, name: &str) -> (Option<usize>, Option<usize>) {
    let n = match std::fs::read_dir(dir) {
        Ok(rd) => rd.count(),
        Err(e) => {
            f.problem(
                "registry",
                format!("{name} {} cannot be listed ({e})", dir.display()),
            );
            return (None, None);
        }
    };
    let pct = n * 100 / MAX_RECORDS;
    let mut text = format!(
        "{name} {}: yours, mode 0700; {n} of {MAX_RECORDS} entries ({pct}% full)",
        dir.display()
    );
    let mut worry = (pct >= 90).then(|| {
        "nearly full; past the bound provenance is unknown (the guard sweeps stale records on \
         writes; remove records of jobs that are over)"
            .to_string()
    });
    let used = match handle_table_slots(&dir.join(handle_table::FILE_NAME), uid) {
        None => None,
        Some(Ok(used)) => {
            text = format!(
                "{text}; handle table {used} of {} slots",
                handle_table::SLOTS
            );
            if used * 10 >= handle_table::SLOTS * 9 {
                worry.get_or_insert_with(|| {
                    "the handle table is nearly full: a record that finds no slot is written as a \
                     file (slower shares of PyTorch tensors); the slots of ended processes are \
                     taken back as needed"
                        .to_string()
                });
            }
            Some(used)
        }
        Some(Err(why)) => {
            worry.get_or_insert_with(|| {
                format!(
                    "its handle table {} is not used ({why}): every handle's record is written as a \
                     file, several system calls per PyTorch share of a tensor; remove it (the next \
                     exporter creates a new one)",
                    handle_table::FILE_NAME
                )
            });
            None
        }
    };
    match worry {
        Some(w) => f.warn("registry", format!("{text}: {w}")),
        None => f.ok("registry", text),
    }
    (Some(n), used)
}

/// How many slots of the registry's handle table hold a record (`None`: no table yet), or
/// why the guard would not use it: the checks the guard makes before it maps the table
/// (a regular file of this user, not writable by group or others, of the table's size and
/// header: src/guard/5_process/registry_io.rs).
fn handle_table_slots(path: &Path, uid: u32) -> Option<std::result::Result<usize, String>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::sync::atomic::AtomicU64;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("cannot open it: {e}"))),
        Ok(f) => f,
    };
    let checked = (|| {
        let md = file
            .metadata()
            .map_err(|e| format!("cannot stat it: {e}"))?;
        if let Some(why) =
            handle_table::file_problem(md.file_type().is_file(), md.uid(), md.mode(), md.len(), uid)
        {
            return Err(why);
        }
        if md.len() == 0 {
            // Being created: its opener allocates it and writes its header.
            return Ok(0);
        }
        let mut bytes = Vec::with_capacity(handle_table::BYTES);
        (&file)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read it: {e}"))?;
        let words: Vec<AtomicU64> = bytes
            .chunks_exact(8)
            .map(|c| AtomicU64::new(u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))))
            .collect();
        let table = HandleTable::new(&words).ok_or("its header is not this version's")?;
        Ok(table.occupied().count())
    })();
    Some(checked)
}

/// A private temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> std::io::Result<TempDir> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let mut last = None;
    for i in 0..8u32 {
        let d = base.join(format!("rankguard-doctor-{}-{i}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => return Ok(TempDir(d)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no name left")))
}

/// Wait for `child` at most `limit` (then kill it), collecting its output.
fn wait_bounded(
    mut child: std::process::Child,
    limit: Duration,
) -> std::result::Result<(std::process::ExitStatus, String, String), String> {
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = |s: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut s) = s {
                let _ = s.read_to_string(&mut text);
            }
            text
        })
    };
    let out_t = reader(out.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let err_t = reader(err.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let until = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the probe child under the guard did not finish in {} s (killed); a hang at load or at \
                     cuInit: run `LD_PRELOAD=$(rankguard lib) rankguard {PROBE}` to see it",
                    limit.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for the probe child: {e}")),
        }
    };
    Ok((
        status,
        out_t.join().unwrap_or_default(),
        err_t.join().unwrap_or_default(),
    ))
}
