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

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use super::args::{Lexer, Token};
use super::exit::{emit, Error, ExitCode, Result, EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND};
use super::{env, gpus, lib_path};
use crate::cvd::{self, CvdEntry};
use rankguard_core::narrow::{self, Via};

const HELP: &str = "\
Usage: rankguard run [--narrow-by VAR | --device ENTRY] [--] CMD [ARGS...]

Make this process one rank: CUDA_VISIBLE_DEVICES with exactly one entry, the guard in
LD_PRELOAD, RANKGUARD_RANK_GPU and RANKGUARD_JOB exported; then exec CMD.

  --narrow-by VAR   pick the entry at position $VAR of a multi-entry CUDA_VISIBLE_DEVICES
                    (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, ...)
  --device ENTRY    pick ENTRY: a position in the visible list, or a GPU-/MIG- UUID
";

/// The rank's single entry, from the parent's CVD and the flags: the rule the guard also
/// applies with `RANKGUARD_NARROW_BY` (one function, `rankguard_core::narrow::choose`).
pub fn choose(
    raw: Option<&str>,
    narrow: Option<(&str, Option<&str>)>,
    device: Option<&str>,
) -> Result<CvdEntry> {
    narrow::choose(Via::Run, raw, narrow, device).map_err(Error::usage)
}

pub fn main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("run", args);
    let (mut narrow, mut device) = (None, None);
    let mut cmd: Vec<OsString> = Vec::new();
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) => match f.as_str() {
                "-h" | "--help" => {
                    emit(HELP);
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
        narrow::check_var_name(Via::Run, n).map_err(Error::usage)?;
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
