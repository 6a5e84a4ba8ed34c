//! `rankguard lib`: where librankguard.so is, for `LD_PRELOAD=$(rankguard lib) ...` and for
//! the guard `launch` and `run` inject.
//!
//! Search order (first hit wins): `$RANKGUARD_LIB` (must name an existing file: a wrong
//! explicit setting is an error, not a reason to look elsewhere), the executable's own
//! directory (cargo's target/release layout), then `<exe dir>/../lib/` (a prefix install), then
//! the copy carried in the binary (`embedded.rs`: `cargo install`, the wheel).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use super::args::{Lexer, Token};
use super::env::GUARD_FILE;
use super::{Error, Result};

pub const LIB_VAR: &str = "RANKGUARD_LIB";

/// The absolute path of the guard library.
pub fn find() -> Result<PathBuf> {
    if let Some(v) = std::env::var_os(LIB_VAR).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        return match std::fs::canonicalize(&p) {
            Ok(abs) if abs.is_file() => Ok(abs),
            _ => Err(Error::usage(format!(
                "{LIB_VAR}={} does not name an existing file; point it at librankguard.so or unset it",
                p.display()))),
        };
    }
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| Error::usage(format!("cannot locate the rankguard executable to find {GUARD_FILE}: {e}")))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let candidates = [dir.join(GUARD_FILE), dir.join("..").join("lib").join(GUARD_FILE)];
    for c in &candidates {
        if c.is_file() {
            return std::fs::canonicalize(c).map_err(|e| Error::usage(format!("{}: {e}", c.display())));
        }
    }
    // A binary installed alone (cargo install, a wheel) carries the library: see embedded.rs.
    let embedded = if super::embedded::available() {
        match super::embedded::extract() {
            Ok(p) => return Ok(p),
            Err(e) => e.msg,
        }
    } else {
        format!("this binary carries {}", super::embedded::HOW)
    };
    Err(Error::usage(format!(
        "cannot find {GUARD_FILE}: looked in ${LIB_VAR} (unset), {} and {}; {embedded}; build it \
         (cargo build --release) or set {LIB_VAR} to its path",
        candidates[0].display(), candidates[1].display())))
}

pub fn main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("lib", args);
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) if f == "-h" || f == "--help" => {
                super::emit(&format!("Usage: rankguard lib\n\nPrints the absolute path of {GUARD_FILE}:\n  \
                        LD_PRELOAD=$(rankguard lib) python train.py\nSearch order: ${LIB_VAR}, the directory \
                        of the rankguard executable, <that directory>/../lib/, then the copy carried in the \
                        binary (written once to $XDG_CACHE_HOME/rankguard/).\n"));
                return Ok(ExitCode::SUCCESS);
            }
            Token::Flag(f) => return Err(lx.unknown(&f)),
            Token::Word(w) => {
                return Err(Error::usage(format!("rankguard lib takes no arguments (got '{}')", w.to_string_lossy())))
            }
            Token::End => {}
        }
    }
    super::emit(&format!("{}\n", find()?.display()));
    Ok(ExitCode::SUCCESS)
}
