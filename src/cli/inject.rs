//! Cluster-wide injection: the guard turned on for every job without editing its command
//! (README, "Turn it on for a whole cluster"). Both subcommands hand the ecosystem's own
//! injection point the guard's path and `RANKGUARD_NARROW_BY`, so the guard narrows each
//! rank itself at load time (`src/guard/narrow.rs`, by the rule of `run`).
//!
//! - `slurm-task-prolog`: the `export` lines of a Slurm `TaskProlog`;
//! - `cdi`: a Container Device Interface spec (containerd, CRI-O, podman, NVIDIA's toolkit).

use std::ffi::OsString;
use std::path::PathBuf;

use super::args::{Lexer, Token};
use super::exit::{emit, Error, ExitCode, Result};
use super::{env, json_out, lib_path};
use rankguard_core::config::Mode;
use rankguard_core::narrow::{self, Via};

const PROLOG_HELP: &str = "\
Usage: rankguard slurm-task-prolog [--lib PATH] [--narrow-by VAR]

Print the lines a Slurm TaskProlog prints to turn the guard on for every task: the guard
first in LD_PRELOAD (the task's own entries kept) and RANKGUARD_NARROW_BY, so each task is
narrowed to its GPU by the guard itself. In slurm.conf: TaskProlog=<a script that runs this>.

  --lib PATH        the guard on the nodes (default: rankguard lib's answer)
  --narrow-by VAR   the task's position variable (default SLURM_LOCALID)

When the guard cannot be found the task is not left unguarded: it prints a `print` line
saying so, empties CUDA_VISIBLE_DEVICES (the task sees no GPU) and exits 1.
";

const CDI_HELP: &str = "\
Usage: rankguard cdi [--lib PATH] [--mount-at PATH] [--narrow-by VAR] [--mode MODE]
                     [--kind VENDOR/CLASS] [--name NAME]

Print a CDI (Container Device Interface) spec, JSON, for /etc/cdi/rankguard.json: device
VENDOR/CLASS=NAME (default rankguard.dev/guard=rank) bind-mounts the guard read-only at
--mount-at and sets LD_PRELOAD, RANKGUARD_MODE and RANKGUARD_NARROW_BY in the container.

  --lib PATH        the guard on the host (default: rankguard lib's answer)
  --mount-at PATH   where the container sees it (default /opt/rankguard/librankguard.so)
  --narrow-by VAR   the rank's position variable (default LOCAL_RANK)
  --mode MODE       enforce, warn or abort (default enforce)
";

fn guard(lib: Option<String>) -> Result<PathBuf> {
    match lib {
        None => lib_path::find(),
        Some(l) => match std::fs::canonicalize(&l) {
            Ok(p) if p.is_file() => Ok(p),
            _ => Err(Error::usage(format!(
                "--lib {l} does not name an existing file; install librankguard.so there or point --lib at it"
            ))),
        },
    }
}

/// The TaskProlog's output: `export` lines, or the fail-closed lines.
pub fn prolog_lines(
    guard: std::result::Result<PathBuf, String>,
    var: &str,
    preload: Option<&std::ffi::OsStr>,
) -> String {
    match guard {
        Ok(g) => format!(
            "export LD_PRELOAD={}\nexport {}={var}\n",
            env::preload_with_guard(&g, preload).to_string_lossy(),
            narrow::VAR
        ),
        Err(e) => format!(
            "print rankguard: this task is NOT guarded ({e}), so it gets no GPU: CUDA_VISIBLE_DEVICES is emptied; \
             install the guard on this node or fix the TaskProlog\nexport CUDA_VISIBLE_DEVICES=\n"
        ),
    }
}

pub fn prolog_main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("slurm-task-prolog", args);
    let (mut lib, mut var) = (None, "SLURM_LOCALID".to_string());
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) => match f.as_str() {
                "-h" | "--help" => {
                    emit(PROLOG_HELP);
                    return Ok(ExitCode::SUCCESS);
                }
                "--lib" => lib = Some(lx.value(&f)?),
                "--narrow-by" => var = lx.value(&f)?,
                _ => return Err(lx.unknown(&f)),
            },
            Token::Word(w) => {
                return Err(Error::usage(format!(
                    "rankguard slurm-task-prolog: unexpected argument '{}'",
                    w.to_string_lossy()
                )))
            }
            Token::End => break,
        }
    }
    narrow::check_var_name(Via::Run, &var).map_err(Error::usage)?;
    let g = guard(lib).map_err(|e| e.msg);
    let failed = g.is_err();
    emit(&prolog_lines(
        g,
        &var,
        std::env::var_os("LD_PRELOAD").as_deref(),
    ));
    Ok(if failed {
        ExitCode(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The CDI spec (cdiVersion 0.5.0): one device whose edits inject the guard.
pub fn cdi_spec(kind: &str, name: &str, host: &str, at: &str, mode: Mode, var: &str) -> String {
    use json_out::Value::{self, Arr, Obj};
    let env = Arr(vec![
        Value::str(format!("LD_PRELOAD={at}")),
        Value::str(format!("RANKGUARD_MODE={}", mode.as_str())),
        Value::str(format!("{}={var}", narrow::VAR)),
    ]);
    let mount = Obj(vec![
        ("hostPath", Value::str(host)),
        ("containerPath", Value::str(at)),
        ("type", Value::str("bind")),
        (
            "options",
            Arr(["ro", "nosuid", "nodev", "bind"].map(Value::str).into()),
        ),
    ]);
    Obj(vec![
        ("cdiVersion", Value::str("0.5.0")),
        ("kind", Value::str(kind)),
        (
            "devices",
            Arr(vec![Obj(vec![
                ("name", Value::str(name)),
                (
                    "containerEdits",
                    Obj(vec![("env", env), ("mounts", Arr(vec![mount]))]),
                ),
            ])]),
        ),
    ])
    .pretty()
}

pub fn cdi_main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("cdi", args);
    let mut lib = None;
    let mut at = "/opt/rankguard/librankguard.so".to_string();
    let mut var = "LOCAL_RANK".to_string();
    let mut mode = Mode::Enforce;
    let mut kind = "rankguard.dev/guard".to_string();
    let mut name = "rank".to_string();
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) => match f.as_str() {
                "-h" | "--help" => {
                    emit(CDI_HELP);
                    return Ok(ExitCode::SUCCESS);
                }
                "--lib" => lib = Some(lx.value(&f)?),
                "--mount-at" => at = lx.value(&f)?,
                "--narrow-by" => var = lx.value(&f)?,
                "--kind" => kind = lx.value(&f)?,
                "--name" => name = lx.value(&f)?,
                "--mode" => {
                    let v = lx.value(&f)?;
                    mode = match Mode::parse(&v) {
                        Some(m) if m != Mode::Off => m,
                        _ => {
                            return Err(Error::usage(format!(
                                "rankguard cdi: --mode '{v}' is not enforce, warn or abort"
                            )))
                        }
                    };
                }
                _ => return Err(lx.unknown(&f)),
            },
            Token::Word(w) => {
                return Err(Error::usage(format!(
                    "rankguard cdi: unexpected argument '{}'",
                    w.to_string_lossy()
                )))
            }
            Token::End => break,
        }
    }
    narrow::check_var_name(Via::Run, &var).map_err(Error::usage)?;
    if !at.starts_with('/') || !at.ends_with(&format!("/{}", env::GUARD_FILE)) {
        return Err(Error::usage(format!(
            "rankguard cdi: --mount-at '{at}' must be an absolute path ending in /{}",
            env::GUARD_FILE
        )));
    }
    let host = guard(lib)?;
    emit(&cdi_spec(
        &kind,
        &name,
        &host.to_string_lossy(),
        &at,
        mode,
        &var,
    ));
    Ok(ExitCode::SUCCESS)
}
