//! Subcommand dispatch, the error type and the exit statuses of `rankguard`.
//!
//! Every subcommand is one row of [`COMMANDS`] and one module with a
//! `fn main(args) -> Result<ExitCode>`; adding one (e.g. `report`) is a row and a file.
//! `main() -> ExitCode` calls `run() -> Result<ExitCode>`; errors print as one line led by
//! `rankguard: error:` (or the subcommand) and exit with [`EXIT_USAGE`] unless they carry
//! another status. Exit statuses are documented in docs/cli.md.

pub mod args;
mod check;
mod doctor;
mod embedded;
mod env;
mod failure;
mod forked;
mod gpus;
mod inject;
mod job_summary;
mod json;
mod launch;
mod lib_build;
mod lib_path;
mod rank_env;
mod rank_start;
mod report;
mod run;
mod spawn;
#[allow(unsafe_code)]
mod sys;
mod tree;

use std::ffi::OsString;
use std::fmt;

/// `check`: the contract would be violated.
pub const EXIT_VIOLATION: u8 = 1;
/// Bad arguments, a precedence conflict, or an environment rankguard refuses: nothing ran.
pub const EXIT_USAGE: u8 = 2;
/// The command could not be executed (permission, not an executable), as in POSIX shells.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// The command was not found, as in POSIX shells.
pub const EXIT_NOT_FOUND: u8 = 127;

/// The process's exit status. std's `ExitCode` cannot be read back as a number on stable
/// Rust, and the CLI's `main` is its own (`sys::main`, `#![no_main]`), which returns one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitCode(pub u8);

impl ExitCode {
    pub const SUCCESS: ExitCode = ExitCode(0);
}

impl From<u8> for ExitCode {
    fn from(code: u8) -> ExitCode {
        ExitCode(code)
    }
}

/// A user-facing error: a message that leads with context and says what to do.
#[derive(Debug)]
pub struct Error {
    pub msg: String,
    pub code: u8,
}

impl Error {
    pub fn usage(msg: impl Into<String>) -> Error {
        Error {
            msg: msg.into(),
            code: EXIT_USAGE,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<crate::plan::PlanError> for Error {
    fn from(e: crate::plan::PlanError) -> Error {
        Error::usage(e.0)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Write user output to stdout. A closed pipe (`rankguard plan | head -1`) is not an error
/// worth a panic, which is what `print!` would do (Rust ignores SIGPIPE).
pub fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

struct Command {
    name: &'static str,
    summary: &'static str,
    main: fn(Vec<OsString>) -> Result<ExitCode>,
}

const COMMANDS: &[Command] = &[
    Command {
        name: "launch",
        summary: "start one child per rank, each with exactly one GPU, the guard and its CPU block",
        main: launch::launch_main,
    },
    Command {
        name: "run",
        summary:
            "make this process one rank (narrow CUDA_VISIBLE_DEVICES, inject the guard) and exec",
        main: run::main,
    },
    Command {
        name: "check",
        summary: "explain this environment and exit non-zero when the contract would be violated",
        main: check::main,
    },
    Command {
        name: "plan",
        summary: "print the rank -> GPU entry -> CPU block mapping of a launch, start nothing",
        main: launch::plan_main,
    },
    Command {
        name: "lib",
        summary: "print the absolute path of librankguard.so (LD_PRELOAD=$(rankguard lib) ...)",
        main: lib_path::main,
    },
    Command {
        name: "report",
        summary:
            "summarise RANKGUARD_AUDIT files: violations by rule, call, site and rank, first occurrence",
        main: report::main,
    },
    Command {
        name: "doctor",
        summary: "beyond check: does the guard load and act in a child here, can the audit be written, \
                  is the registry healthy, which build `lib` picks and why",
        main: doctor::main,
    },
    Command {
        name: "slurm-task-prolog",
        summary: "print a Slurm TaskProlog's export lines: the guard and per-task narrowing",
        main: inject::prolog_main,
    },
    Command {
        name: "cdi",
        summary: "print a CDI spec that injects the guard and per-rank narrowing into containers",
        main: inject::cdi_main,
    },
];

/// The hidden subcommand the CLI runs itself as to ask the driver (see `gpus.rs`).
pub const DRIVER_QUERY: &str = "__driver-query";
/// The hidden subcommand that kills a launch's ranks if the launcher dies (see `launch.rs`).
pub const REAPER: &str = "__reaper";

fn usage() -> String {
    let mut s = String::from(
        "rankguard: one rank owns exactly one GPU, seen as cuda:0\n\nUsage: rankguard <COMMAND> [OPTIONS]\n\nCommands:\n");
    let w = COMMANDS.iter().map(|c| c.name.len()).max().unwrap_or(0) + 2;
    for c in COMMANDS {
        s.push_str(&format!("  {:<w$}{}\n", c.name, c.summary));
    }
    s.push_str(REFERENCE);
    s
}

/// The part of the reference an installed user needs and has no docs/ for: the variables,
/// the exit statuses, where each command's details are. Kept in step with docs/cli.md and
/// README's variable table.
const REFERENCE: &str = "
`rankguard <COMMAND> --help` (or `rankguard help <COMMAND>`) gives a command's options,
output formats and exit statuses.

The guard (librankguard.so in LD_PRELOAD) enforces the contract in every CUDA process:
  R1 one GPU per rank     CUDA_VISIBLE_DEVICES holds one entry, the driver shows one
                          device, and every process of the rank sees the rank's GPU
  R2 cuda:0 only          device-taking calls name ordinal 0
  R3 no cross-device IPC inside a rank     R4 no peer access inside a rank
A process whose visibility breaks R1 is stopped at its first cuInit (status 78); other
denied calls return a CUDA error (101, or 800 NOT_PERMITTED).

Variables (the guard's; launch and run set the rank's own):
  RANKGUARD_MODE         enforce (default), warn (record and let through), abort, off
  RANKGUARD_AUDIT        append JSON records to this file (%h host, %p pid), e.g.
                         /tmp/audit/%h.%p.jsonl; read them with `rankguard report`
  RANKGUARD_DEBUG        WARN, INFO, DEBUG or TRACE (like NCCL_DEBUG); RANKGUARD_DEBUG_FILE
  RANKGUARD_NARROW_BY    narrow CUDA_VISIBLE_DEVICES to the entry at position $VAR
                         (LOCAL_RANK, SLURM_LOCALID) before main
  RANKGUARD_IPC          default, or strict (imports of unknown provenance denied)
  RANKGUARD_JOB          the job id (R3's \"same job\"); RANKGUARD_RANK_GPU(_UUID) the rank's GPU
  RANKGUARD_REGISTRY     the IPC provenance registry (default /dev/shm/rankguard-<uid>)
  RANKGUARD_LIB, RANKGUARD_LIB_GLIBC   which library `rankguard lib` prints

Exit statuses: 0 success; 1 `check`/`doctor`: a problem found, `report`: violations
found; 2 refused (bad arguments, a conflict, an environment rankguard refuses): nothing
was started; 78 a process (or, for launch, a rank) stopped by the guard (R1); 126/127 the
command could not be executed / was not found; launch: otherwise the first failing
rank's status (128+S: killed by signal S).
";

/// `rankguard: error: MSG`, or `rankguard CMD: error: REST` for a message that already
/// names its subcommand (`rankguard run: no command given`), never both prefixes.
fn error_line(msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("rankguard ") {
        if let Some((cmd, text)) = rest.split_once(": ") {
            if !cmd.is_empty() && !cmd.contains(' ') {
                return format!("rankguard {cmd}: error: {text}");
            }
        }
    }
    format!("rankguard: error: {msg}")
}

/// The CLI, from `sys::main` (the process's entry point).
pub fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", error_line(&e.msg));
            ExitCode::from(e.code)
        }
    }
}

fn run() -> Result<ExitCode> {
    let mut argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    if argv.is_empty() {
        eprint!("{}", usage());
        return Err(Error::usage(
            "no command given; pick one of the commands above",
        ));
    }
    let first = argv.remove(0);
    let name = first.to_string_lossy();
    match name.as_ref() {
        "-h" | "--help" | "help" => {
            // `rankguard help launch` is `rankguard launch --help`.
            if let Some(c) = argv
                .first()
                .and_then(|a| COMMANDS.iter().find(|c| c.name == a.to_string_lossy()))
            {
                return (c.main)(vec!["--help".into()]);
            }
            emit(&usage());
            return Ok(ExitCode::SUCCESS);
        }
        "-V" | "--version" => {
            emit(&format!("rankguard {}\n", env!("CARGO_PKG_VERSION")));
            return Ok(ExitCode::SUCCESS);
        }
        DRIVER_QUERY => return gpus::helper_main(argv),
        REAPER => return launch::reaper_main(argv),
        doctor::PROBE => return doctor::probe_main(argv),
        _ => {}
    }
    match COMMANDS.iter().find(|c| c.name == name) {
        Some(c) => (c.main)(argv),
        None => Err(Error::usage(format!(
            "unknown command '{name}'; commands are {} (rankguard --help)",
            COMMANDS
                .iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
