//! `rankguard run`: make this process one contract-compliant rank, then `exec` the command.
//!
//! How existing engines adopt the contract without changing how they start processes:
//! `torchrun --no-python rankguard run --narrow-by LOCAL_RANK -- python train.py`,
//! `srun rankguard run --narrow-by SLURM_LOCALID -- ...`,
//! `mpirun rankguard run --narrow-by OMPI_COMM_WORLD_LOCAL_RANK -- ...`.
//!
//! Rules (docs/cli.md, "run"):
//!   - an external single-entry CVD is authoritative: it is kept as is (with --narrow-by too,
//!     so one recipe works whether or not the engine already narrowed, e.g. Slurm's
//!     `--gpus-per-task=1`); `--device` must agree with it;
//!   - a multi-entry CVD is narrowed to the entry at position `$VAR` (`--narrow-by VAR`) or
//!     to `--device`; without either it is refused, with the fix in the message;
//!   - an unset CVD means "every GPU": `--narrow-by VAR` gives ordinal `$VAR`;
//!   - at most one driver call, in a helper process: resolving an index or UUID-prefix entry
//!     to the full UUID exported as `RANKGUARD_RANK_GPU_UUID` (a full UUID entry needs none).
//!     Whether the rank then sees exactly that GPU is the guard's check at cuInit.

use super::ExitCode;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use super::args::{Lexer, Token};
use super::{env, gpus, lib_path, Error, Result, EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND};
use crate::cvd::{self, CvdEntry, Visibility};
use crate::plan;

const HELP: &str = "\
Usage: rankguard run [--narrow-by VAR | --device ENTRY] [--] CMD [ARGS...]

Make this process one rank: CUDA_VISIBLE_DEVICES with exactly one entry, the guard in
LD_PRELOAD, RANKGUARD_RANK_GPU and RANKGUARD_JOB exported; then exec CMD.

  --narrow-by VAR   pick the entry at position $VAR of a multi-entry CUDA_VISIBLE_DEVICES
                    (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, ...)
  --device ENTRY    pick ENTRY: a position in the visible list, or a GPU-/MIG- UUID
";

const RANK_VARS: &str =
    "LOCAL_RANK (torchrun), SLURM_LOCALID (srun), OMPI_COMM_WORLD_LOCAL_RANK (mpirun)";

/// The rank's single entry, from the parent's CVD and the flags.
pub fn choose(
    raw: Option<&str>,
    narrow: Option<(&str, Option<&str>)>,
    device: Option<&str>,
) -> Result<CvdEntry> {
    let var = cvd::VAR;
    if narrow.is_some() && device.is_some() {
        return Err(Error::usage(
            "rankguard run: give --narrow-by or --device, not both",
        ));
    }
    // The parent's list, with the same malformed-value checks as `launch`.
    let list: Option<Vec<CvdEntry>> = match raw {
        None => None,
        Some(v) => Some(
            plan::host_view(Some(v), Err("not asked"))
                .map_err(|e| Error::usage(format!("rankguard run: {e}")))?
                .devices
                .into_iter()
                .map(|d| d.entry)
                .collect(),
        ),
    };
    let shown = |l: &[CvdEntry]| format!("{var}='{}' ({} visible)", raw.unwrap_or(""), l.len());

    if let Some(text) = device {
        let want = match cvd::parse(Some(text)) {
            Visibility::Entries(e) if e.len() == 1 && !text.contains(',') => e.into_iter().next().unwrap(),
            _ => {
                return Err(Error::usage(format!(
                    "rankguard run: --device '{text}' is not one device entry; give a position (0, 1, ...) or one \
                     GPU-/MIG- UUID")))
            }
        };
        return match (list, want) {
            (None, w) => Ok(w),
            (Some(l), CvdEntry::Index(p)) => l.get(p as usize).cloned().ok_or_else(|| {
                Error::usage(format!(
                    "rankguard run: --device {p} names position {p}, but {} has only positions 0-{}; pick a \
                     visible position", shown(&l), l.len() - 1))
            }),
            (Some(l), w) => {
                if l.iter().any(|e| e.text().eq_ignore_ascii_case(&w.text())) {
                    Ok(w)
                } else if l.len() == 1 {
                    Err(Error::usage(format!(
                        "rankguard run: --device '{w}' conflicts with the external single-entry {var}='{}', which \
                         is authoritative for this rank; drop --device or unset {var}", l[0])))
                } else {
                    Err(Error::usage(format!(
                        "rankguard run: --device '{w}' is not one of the entries of {}; pick one of them",
                        shown(&l))))
                }
            }
        };
    }

    if let Some(l) = &list {
        if l.len() == 1 {
            return Ok(l[0].clone());
        }
    }
    let Some((name, value)) = narrow else {
        let what = match &list {
            None => format!("{var} is unset, so every GPU of the node is visible"),
            Some(l) => format!("{} makes {} GPUs visible", shown(l), l.len()),
        };
        return Err(Error::usage(format!(
            "rankguard run: {what}, but a rank must see exactly one; add --narrow-by VAR to pick the entry at the \
             position the engine gives this rank ({RANK_VARS}), or --device ENTRY")));
    };
    let Some(value) = value else {
        return Err(Error::usage(format!(
            "rankguard run: --narrow-by {name}: {name} is not set in this environment; run under an engine that \
             sets it ({RANK_VARS}) or name the variable it does set")));
    };
    let pos: u32 = value.trim().parse().map_err(|_| {
        Error::usage(format!(
            "rankguard run: --narrow-by {name}: {name}='{value}' is not a position (0, 1, ...)"
        ))
    })?;
    match list {
        None => Ok(CvdEntry::Index(pos)),
        Some(l) => l.get(pos as usize).cloned().ok_or_else(|| {
            Error::usage(format!(
                "rankguard run: --narrow-by {name}: {name}={pos} is past the end of {}; start at most {} ranks \
                 on this node or widen {var}", shown(&l), l.len()))
        }),
    }
}

pub fn main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("run", args);
    let (mut narrow, mut device) = (None, None);
    let mut cmd: Vec<OsString> = Vec::new();
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) => match f.as_str() {
                "-h" | "--help" => {
                    super::emit(HELP);
                    return Ok(ExitCode::SUCCESS);
                }
                "--narrow-by" => narrow = Some(lx.value(&f)?),
                "--device" => device = Some(lx.value(&f)?),
                _ => return Err(lx.unknown(&f)),
            },
            Token::Word(w) => {
                cmd.push(w);
                cmd.extend(lx.rest());
            }
            Token::End => cmd.extend(lx.rest()),
        }
    }
    if cmd.is_empty() {
        return Err(Error::usage(
            "rankguard run: no command given; add `-- CMD ARGS...` (rankguard run --help)",
        ));
    }
    if let Some(n) = &narrow {
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(Error::usage(format!(
                "rankguard run: --narrow-by '{n}' is not an environment variable name"
            )));
        }
    }
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
    let narrow_value = narrow.as_ref().map(|n| (n.as_str(), std::env::var(n).ok()));
    let entry = choose(
        raw.as_deref(),
        narrow_value.as_ref().map(|(n, v)| (*n, v.as_deref())),
        device.as_deref(),
    )?;
    let guard = lib_path::find()?;

    let text = entry.text();
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..])
        .env(cvd::VAR, &text)
        .env(env::JOB, env::job_for_run())
        .env(
            "LD_PRELOAD",
            env::preload_with_guard(&guard, std::env::var_os("LD_PRELOAD").as_deref()),
        );
    // The rank's identity belongs to the outermost assignment: inside a rank (a nested
    // `run`) it is kept, so the guard can tell a re-pointed descendant from the rank's GPU.
    if std::env::var_os(env::RANK_GPU).is_none_or(|v| v.is_empty()) {
        c.env(env::RANK_GPU, &text);
        match resolve_uuid(&entry) {
            Some(u) => c.env(env::RANK_GPU_UUID, u),
            None => c.env_remove(env::RANK_GPU_UUID),
        };
    } else if std::env::var_os(env::RANK_GPU_UUID).is_none_or(|v| v.is_empty()) {
        // An inherited identity without its resolved UUID (set by hand): resolve it once
        // here, since the guard accepts a UUID prefix or index only when it can prove it
        // names the one GPU the process sees (crate::rankgpu).
        let inherited = std::env::var(env::RANK_GPU)
            .ok()
            .map(|v| cvd::parse(Some(v.trim())));
        if let Some(Some([outer])) = inherited.as_ref().map(|v| v.entries()) {
            if let Some(u) = resolve_uuid(outer) {
                c.env(env::RANK_GPU_UUID, u);
            }
        }
    }
    let e = c.exec();
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_EXECUTE
    };
    Err(Error {
        msg: format!(
            "rankguard run: cannot execute '{}': {e}",
            cmd[0].to_string_lossy()
        ),
        code,
    })
}

/// The entry's full UUID: itself when it is one, else the driver's answer under
/// `CUDA_VISIBLE_DEVICES=<entry>` (one helper process). None when the driver cannot say; the
/// guard then compares entries by text, failing closed.
fn resolve_uuid(entry: &CvdEntry) -> Option<String> {
    if let Some(u) = env::full_uuid(entry) {
        return Some(u);
    }
    match gpus::query(Some(Some(&entry.text()))) {
        Ok(list) if list.len() == 1 => Some(list[0].uuid.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: Option<&str>, narrow: Option<(&str, Option<&str>)>, device: Option<&str>) -> String {
        choose(raw, narrow, device).unwrap().text()
    }
    fn bad(
        raw: Option<&str>,
        narrow: Option<(&str, Option<&str>)>,
        device: Option<&str>,
    ) -> String {
        choose(raw, narrow, device).unwrap_err().msg
    }

    #[test]
    fn narrows_by_position() {
        assert_eq!(
            ok(Some("4,5,6,7"), Some(("LOCAL_RANK", Some("2"))), None),
            "6"
        );
        assert_eq!(
            ok(
                Some("GPU-12,GPU-15"),
                Some(("SLURM_LOCALID", Some("1"))),
                None
            ),
            "GPU-15"
        );
        assert_eq!(ok(None, Some(("LOCAL_RANK", Some("3"))), None), "3");
        // Single entry: authoritative, whatever the position.
        assert_eq!(
            ok(Some("GPU-15"), Some(("SLURM_LOCALID", Some("3"))), None),
            "GPU-15"
        );
        assert_eq!(ok(Some("5"), None, None), "5");
    }

    #[test]
    fn refuses_what_breaks_the_contract() {
        let e = bad(Some("0,1"), None, None);
        assert!(
            e.contains("CUDA_VISIBLE_DEVICES='0,1'") && e.contains("--narrow-by"),
            "{e}"
        );
        assert!(bad(None, None, None).contains("unset"));
        let e = bad(Some("0,1"), Some(("LOCAL_RANK", None)), None);
        assert!(e.contains("LOCAL_RANK is not set"), "{e}");
        let e = bad(Some("0,1"), Some(("LOCAL_RANK", Some("2"))), None);
        assert!(e.contains("LOCAL_RANK=2") && e.contains("'0,1'"), "{e}");
        assert!(bad(Some("0,1"), Some(("LOCAL_RANK", Some("x"))), None).contains("not a position"));
        assert!(bad(Some(""), Some(("LOCAL_RANK", Some("0"))), None).contains("no GPU"));
        assert!(bad(Some("0,2,-1"), Some(("LOCAL_RANK", Some("0"))), None).contains("malformed"));
        assert!(bad(Some("0,1"), Some(("A", Some("0"))), Some("1")).contains("not both"));
    }

    #[test]
    fn device_flag() {
        assert_eq!(ok(Some("4,5"), None, Some("1")), "5");
        assert_eq!(ok(None, None, Some("GPU-12")), "GPU-12");
        assert_eq!(ok(Some("GPU-12,GPU-13"), None, Some("GPU-13")), "GPU-13");
        let e = bad(Some("GPU-12"), None, Some("GPU-13"));
        assert!(
            e.contains("--device 'GPU-13'") && e.contains("CUDA_VISIBLE_DEVICES='GPU-12'"),
            "{e}"
        );
        assert!(bad(Some("4,5"), None, Some("2")).contains("position 2"));
        assert!(bad(None, None, Some("0,1")).contains("not one device entry"));
    }
}
