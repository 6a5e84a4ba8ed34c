//! How a command ends: the error type, the process's exit statuses, and output to stdout.
//! Every module of the CLI returns [`Result`]; the dispatch (`mod.rs`) prints an [`Error`]
//! as one line and exits with its status. Exit statuses are documented in docs/cli.md.

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
/// Rust, and the CLI's `main` is its own (`sys::start`, `#![no_main]`), which returns one.
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
