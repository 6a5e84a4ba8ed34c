//! Subcommand dispatch of `rankguard`.
//!
//! Every subcommand is one row of [`COMMANDS`] and one module with a
//! `fn main(args) -> Result<ExitCode>`; adding one (e.g. `report`) is a row and a file.
//! `main()` calls `run() -> Result<ExitCode>`; errors print as one line led by
//! `rankguard: error:` (or the subcommand) and exit with [`exit::EXIT_USAGE`] unless they
//! carry another status (the error type and the statuses: `exit.rs`; documented in
//! docs/cli.md).
//!
//! ## Layers
//!
//! A module imports only from its own layer or a lower one, and the modules' imports form
//! no circle; this file, the dispatch, stands above them all, and below them all stand the
//! core crate's modules and the binary's own launch planning (`plan`, `cpuset`,
//! `topology`), which never name src/cli (python-tests/test_architecture.py checks it,
//! naming the file, line and name; each layer below names its modules, and only them, in
//! backticks):
//! 1. **base**: `exit` (the error type, the exit statuses, output to stdout), `args` (the
//!    argument lexer), `json` (a JSON writer), `env` (the variables a rank is given),
//!    `lib_build` (which build of the guard fits this C library), `tree` (the process
//!    tree from /proc);
//! 2. **os**: `sys` (the FFI: affinity, signals, the driver query), `forked` (helper
//!    processes without an exec), `spawn` (a rank's exec, prepared), `rank_start` (a
//!    rank's clone and exec);
//! 3. **facts**: `embedded` (the guard's copies carried inside the binary), `lib_path`
//!    (where librankguard.so is), `gpus` (what the driver shows), `rank_env` (the
//!    environment of each rank of a launch);
//! 4. **commands**: `check`, `inject`, `launch`, `report`, `run`: each the entry of one
//!    or more subcommands.

// The layers (above), lowest first.
// 1. base
pub mod args;
mod env;
mod exit;
mod json;
mod lib_build;
mod tree;

// 2. os
mod forked;
mod rank_start;
mod spawn;
#[allow(unsafe_code)]
mod sys;

// 3. facts
mod embedded;
mod gpus;
mod lib_path;
mod rank_env;

// 4. commands
mod check;
mod inject;
mod launch;
mod report;
mod run;

use std::ffi::{c_int, OsString};

use exit::{emit, Error, ExitCode, Result};

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

fn usage() -> String {
    let mut s = String::from(
        "rankguard: one rank owns exactly one GPU, seen as cuda:0\n\nUsage: rankguard <COMMAND> [OPTIONS]\n\nCommands:\n");
    let w = COMMANDS.iter().map(|c| c.name.len()).max().unwrap_or(0) + 2;
    for c in COMMANDS {
        s.push_str(&format!("  {:<w$}{}\n", c.name, c.summary));
    }
    s.push_str("\n`rankguard <COMMAND> --help` describes a command. Reference: docs/cli.md\n");
    s
}

/// The process, from its C `main` (src/main.rs): the start-up std would do that the CLI
/// needs (`sys::start`), then the command.
pub fn main() -> c_int {
    sys::start(dispatch)
}

fn dispatch() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rankguard: error: {}", e.msg);
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
            emit(&usage());
            return Ok(ExitCode::SUCCESS);
        }
        "-V" | "--version" => {
            emit(&format!("rankguard {}\n", env!("CARGO_PKG_VERSION")));
            return Ok(ExitCode::SUCCESS);
        }
        gpus::DRIVER_QUERY => return gpus::helper_main(argv),
        launch::REAPER => return launch::reaper_main(argv),
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
