//! The guard's configuration: every `RANKGUARD_*` variable and the rank identity, read once
//! from the environment through a lookup function so the parsing is testable without it.
//!
//! Variables (the README's "Configuration" table lists the same ones: keep them in step):
//! - `RANKGUARD_MODE`        enforce (default) | warn | abort | off
//! - `RANKGUARD_AUDIT`       path of the JSON-lines audit file (`%h` host, `%p` pid)
//! - `RANKGUARD_DEBUG`       debug log level: WARN | INFO | DEBUG | TRACE (like NCCL_DEBUG)
//! - `RANKGUARD_DEBUG_FILE`  debug log file instead of stderr (`%h`, `%p`)
//! - `RANKGUARD_IPC`         default | strict (deny IPC imports of unknown provenance)
//! - `RANKGUARD_JOB`         job id (set by `rankguard launch`/`run`; see `jobid.rs`)
//! - `RANKGUARD_RANK_GPU`    the CUDA_VISIBLE_DEVICES entry the rank was given
//! - `RANKGUARD_RANK_GPU_UUID` that entry's full GPU/MIG UUID, resolved by the launcher
//! - `RANKGUARD_REGISTRY`    directory of the IPC provenance registry

use std::fmt;

use crate::strtab::StrTable;

/// What the guard does with a violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Deny the call with a CUDA error code; terminate a process whose visibility breaks R1.
    Enforce,
    /// Record and report, then let the call through.
    Warn,
    /// Terminate the process (SIGABRT, for a core dump) at the first violation.
    Abort,
    /// No checks at all.
    Off,
}

/// What [`Mode::parse`] accepts, and what an invalid `RANKGUARD_MODE` falls back to.
pub const MODE_EXPECTED: &str = "enforce, warn, abort or off (using enforce)";

impl Mode {
    /// A `RANKGUARD_MODE` value (case and surrounding blanks ignored); None when it names
    /// no mode, which the guard treats as enforce (it fails closed).
    pub fn parse(value: &str) -> Option<Mode> {
        match value.trim().to_ascii_lowercase().as_str() {
            "enforce" => Some(Mode::Enforce),
            "warn" => Some(Mode::Warn),
            "abort" => Some(Mode::Abort),
            "off" => Some(Mode::Off),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        // By index into one joined string, not a `match` of literals: that is a table of
        // string pointers, relocated by the loader at every start of the guard (strtab).
        const NAMES: StrTable<4> = crate::str_table!("enforce", "warn", "abort", "off");
        NAMES.get(self as usize)
    }
}

/// Debug log verbosity, named like NCCL_DEBUG's levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Warn,
    Info,
    Debug,
    Trace,
}

/// How IPC imports of unknown provenance are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpcPolicy {
    Default,
    Strict,
}

/// A configuration value that could not be understood: the variable, the value and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is not valid: expected {}",
            self.var, self.value, self.expected
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub mode: Mode,
    pub audit: Option<String>,
    pub debug: Option<Level>,
    pub debug_file: Option<String>,
    pub ipc: IpcPolicy,
    pub job: Option<String>,
    /// Global rank, from the first of RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK.
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub rank_gpu: Option<String>,
    pub rank_gpu_uuid: Option<String>,
    pub registry: Option<String>,
    /// Values that were invalid; the guard reports each once and uses the safe default
    /// (an invalid mode means enforce: the guard fails closed).
    pub errors: Vec<ConfigError>,
    /// A sentence the guard says once about the job id it could not use (torchrun's
    /// shared run id `none`, [`crate::jobid::shared_run_id`]); None when there is nothing to say.
    pub job_notice: Option<&'static str>,
}

const RANK_VARS: [&str; 4] = ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"];
const LOCAL_RANK_VARS: [&str; 4] = [
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
];

impl Config {
    /// Build from a lookup (`std::env::var`-like; None = unset). Empty values count as
    /// unset, as shells commonly export `VAR=` to clear.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        let mut errors = Vec::new();
        let mode = match get("RANKGUARD_MODE") {
            None => Mode::Enforce,
            Some(v) => Mode::parse(&v).unwrap_or_else(|| {
                errors.push(ConfigError {
                    var: "RANKGUARD_MODE",
                    value: v,
                    expected: MODE_EXPECTED,
                });
                Mode::Enforce
            }),
        };
        let debug = match get("RANKGUARD_DEBUG") {
            None => None,
            Some(v) => match v.trim().to_ascii_uppercase().as_str() {
                "WARN" => Some(Level::Warn),
                "INFO" => Some(Level::Info),
                "DEBUG" => Some(Level::Debug),
                "TRACE" => Some(Level::Trace),
                _ => {
                    errors.push(ConfigError {
                        var: "RANKGUARD_DEBUG",
                        value: v,
                        expected: "WARN, INFO, DEBUG or TRACE (debug log off)",
                    });
                    None
                }
            },
        };
        let ipc = match get("RANKGUARD_IPC") {
            None => IpcPolicy::Default,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "default" => IpcPolicy::Default,
                "strict" => IpcPolicy::Strict,
                _ => {
                    errors.push(ConfigError {
                        var: "RANKGUARD_IPC",
                        value: v,
                        expected: "default or strict (using strict)",
                    });
                    IpcPolicy::Strict
                }
            },
        };
        // A path read lossily from a value that is not UTF-8 names another file: refused.
        let mut path = |var: &'static str| -> Option<String> {
            let v = get(var)?;
            if v.contains('\u{FFFD}') {
                errors.push(ConfigError {
                    var,
                    value: v,
                    expected: "a path in UTF-8 (ignoring it)",
                });
                return None;
            }
            Some(v)
        };
        let audit = path("RANKGUARD_AUDIT");
        let debug_file = path("RANKGUARD_DEBUG_FILE");
        let registry = path("RANKGUARD_REGISTRY");
        let mut rank_of = |vars: &[&'static str]| -> Option<u32> {
            for var in vars {
                if let Some(v) = get(var) {
                    match v.trim().parse::<u32>() {
                        Ok(r) => return Some(r),
                        Err(_) => errors.push(ConfigError {
                            var,
                            value: v,
                            expected: "a non-negative integer rank",
                        }),
                    }
                }
            }
            None
        };
        let rank = rank_of(&RANK_VARS);
        let local_rank = rank_of(&LOCAL_RANK_VARS);
        Config {
            mode,
            audit,
            debug,
            debug_file,
            ipc,
            job: crate::jobid::from_lookup(get),
            job_notice: crate::jobid::shared_run_id(get)
                .filter(|_| get(crate::jobid::VAR).is_none()),
            rank,
            local_rank,
            rank_gpu: get("RANKGUARD_RANK_GPU").map(|s| s.trim().to_string()),
            rank_gpu_uuid: get("RANKGUARD_RANK_GPU_UUID").map(|s| s.trim().to_string()),
            registry,
            errors,
        }
    }
}

/// Expand `%h` (host name) and `%p` (pid) in a file name, like NCCL_DEBUG_FILE.
pub fn expand_path(template: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Where the files of an audit template (`RANKGUARD_AUDIT`) go on `host`, split as
/// (directory, file-name pattern): the directory with `%h` expanded, and the file name with
/// its `%h`/`%p` left for [`audit_name_matches`]. The guard creates files, never
/// directories, so a `%p` in the directory part (a directory per process, which nobody
/// creates) is refused with the fix, as is a template that names no file.
pub fn audit_template_split(template: &str, host: &str) -> Result<(String, String), String> {
    let (dir, name) = match template.rfind('/') {
        Some(0) => ("/", &template[1..]),
        Some(i) => (&template[..i], &template[i + 1..]),
        None => (".", template),
    };
    if name.is_empty() {
        return Err(
            "names a directory, not a file; add a file name, e.g. DIR/audit.%h.%p.jsonl".into(),
        );
    }
    if dir.replace("%%", "").contains("%p") {
        return Err(
            "holds %p in its directory part, and the guard creates files, not \
                    directories; put %p in the file name, e.g. DIR/audit.%h.%p.jsonl"
                .into(),
        );
    }
    Ok((expand_path(dir, host, 0), name.to_string()))
}

/// Whether a file name is one the template's file-name pattern (see
/// [`audit_template_split`]) writes on `host`: `%h` is the host, `%p` a pid (digits), `%%`
/// a percent sign.
pub fn audit_name_matches(pattern: &str, host: &str, name: &str) -> bool {
    fn go(p: &[u8], host: &[u8], n: &[u8]) -> bool {
        match p {
            [] => n.is_empty(),
            [b'%', b'h', rest @ ..] => n.starts_with(host) && go(rest, host, &n[host.len()..]),
            [b'%', b'p', rest @ ..] => {
                let digits = n.iter().take_while(|c| c.is_ascii_digit()).count();
                (1..=digits).any(|k| go(rest, host, &n[k..]))
            }
            [b'%', b'%', rest @ ..] => n.first() == Some(&b'%') && go(rest, host, &n[1..]),
            [c, rest @ ..] => n.first() == Some(c) && go(rest, host, &n[1..]),
        }
    }
    go(pattern.as_bytes(), host.as_bytes(), name.as_bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_audit_template_splits_into_its_directory_and_a_name_pattern() {
        use super::{audit_name_matches as m, audit_template_split as split};
        assert_eq!(
            split("/a/%h/audit.%h.%p.jsonl", "n7").unwrap(),
            ("/a/n7".to_string(), "audit.%h.%p.jsonl".to_string())
        );
        assert_eq!(split("audit.jsonl", "n7").unwrap().0, ".");
        assert_eq!(split("/audit.%p", "n7").unwrap().0, "/");
        assert!(split("/a/%p/x.jsonl", "n")
            .unwrap_err()
            .contains("%p in its directory"));
        assert!(split("/a/b/", "n")
            .unwrap_err()
            .contains("names a directory"));
        assert!(split("/a/100%%p/x", "n").is_ok());
        assert!(m("audit.%h.%p.jsonl", "n7", "audit.n7.4242.jsonl"));
        assert!(!m("audit.%h.%p.jsonl", "n7", "audit.n8.4242.jsonl"));
        assert!(!m("audit.%h.%p.jsonl", "n7", "audit.n7..jsonl"));
        assert!(!m("audit.%h.%p.jsonl", "n7", "audit.n7.42x.jsonl"));
        assert!(m("%p%p", "n", "1234"));
        assert!(m("a%%b", "n", "a%b") && !m("a%%b", "n", "a%%b"));
        assert!(m("fixed.jsonl", "n", "fixed.jsonl") && !m("fixed.jsonl", "n", "fixed.jsonl2"));
    }

    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_fail_closed() {
        let c = cfg(&[]);
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.ipc, IpcPolicy::Default);
        assert_eq!(c.rank, None);
        assert!(c.errors.is_empty());
    }

    #[test]
    fn invalid_values_are_reported_and_safe() {
        let c = cfg(&[("RANKGUARD_MODE", "warning"), ("RANKGUARD_IPC", "loose")]);
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.ipc, IpcPolicy::Strict);
        assert_eq!(c.errors.len(), 2);
        assert!(c.errors[0]
            .to_string()
            .contains("RANKGUARD_MODE=\"warning\""));
    }

    #[test]
    fn lossy_values_are_invalid() {
        let c = cfg(&[
            ("RANKGUARD_MODE", "\u{FFFD}"),
            ("RANKGUARD_AUDIT", "/tmp/a\u{FFFD}"),
        ]);
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.audit, None);
        assert_eq!(c.errors.len(), 2);
    }

    #[test]
    fn modes_and_levels_parse() {
        assert_eq!(cfg(&[("RANKGUARD_MODE", " Warn ")]).mode, Mode::Warn);
        assert_eq!(cfg(&[("RANKGUARD_MODE", "abort")]).mode, Mode::Abort);
        assert_eq!(cfg(&[("RANKGUARD_MODE", "off")]).mode, Mode::Off);
        assert_eq!(cfg(&[("RANKGUARD_DEBUG", "info")]).debug, Some(Level::Info));
        assert_eq!(cfg(&[("RANKGUARD_MODE", "")]).mode, Mode::Enforce);
    }

    #[test]
    fn rank_comes_from_the_first_engine_variable() {
        assert_eq!(cfg(&[("SLURM_PROCID", "5")]).rank, Some(5));
        assert_eq!(cfg(&[("RANK", "2"), ("SLURM_PROCID", "5")]).rank, Some(2));
        let bad = cfg(&[("RANK", "x"), ("PMI_RANK", "3")]);
        assert_eq!(bad.rank, Some(3));
        assert_eq!(bad.errors.len(), 1);
    }

    #[test]
    fn job_ids_are_namespaced_by_engine() {
        assert_eq!(cfg(&[("RANKGUARD_JOB", "j1")]).job.as_deref(), Some("j1"));
        assert_eq!(
            cfg(&[("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "0")])
                .job
                .as_deref(),
            Some("slurm:77.0")
        );
        assert_eq!(
            cfg(&[("TORCHELASTIC_RUN_ID", "r")]).job.as_deref(),
            Some("torchelastic:r")
        );
        assert_eq!(cfg(&[]).job, None);
    }

    #[test]
    fn paths_expand_host_and_pid() {
        assert_eq!(
            expand_path("/tmp/a.%h.%p.jsonl", "n1", 42),
            "/tmp/a.n1.42.jsonl"
        );
        assert_eq!(expand_path("100%%-%x%", "n", 1), "100%-%x%");
    }
}
