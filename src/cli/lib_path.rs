//! `rankguard lib`: where librankguard.so is, for `LD_PRELOAD=$(rankguard lib) ...` and for
//! the guard `launch` and `run` inject.
//!
//! Search order (first hit wins): `$RANKGUARD_LIB` (must name an existing file: a wrong
//! explicit setting is an error, not a reason to look elsewhere), the executable's own
//! directory (cargo's target/release layout), then `<exe dir>/../lib/` (a prefix install), then
//! the copies carried in the binary (`embedded.rs`: `cargo install`, the wheel). In each
//! place the build that fits the running glibc is taken (`lib_build.rs`): the glibc 2.34
//! build from `glibc-2.34/librankguard.so` where it exists and glibc is 2.34+, else the
//! glibc 2.28 build, `librankguard.so`; `RANKGUARD_LIB_GLIBC` forces one.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::args::{Lexer, Token};
use super::env::GUARD_FILE;
use super::exit::{emit, Error, ExitCode, Result};
use super::lib_build::{self, Build, Choice, GLIBC_VAR, NATIVE_DIR};

pub const LIB_VAR: &str = "RANKGUARD_LIB";

/// The file of `build` in a directory that holds the library.
fn file_in(dir: &Path, build: Build) -> PathBuf {
    match build {
        Build::Floor => dir.join(GUARD_FILE),
        Build::Native => dir.join(NATIVE_DIR).join(GUARD_FILE),
    }
}

/// The builds to accept, best first.
fn acceptable(c: Choice) -> &'static [Build] {
    match (c.build, c.forced) {
        (Build::Native, false) => &[Build::Native, Build::Floor],
        (Build::Native, true) => &[Build::Native],
        (Build::Floor, _) => &[Build::Floor],
    }
}

/// The absolute path of the guard library.
pub fn find() -> Result<PathBuf> {
    find_why().map(|(p, _)| p)
}

/// The guard library and why it is the one (`rankguard doctor`): which place of the search
/// order held it and why that build.
pub fn find_why() -> Result<(PathBuf, String)> {
    if let Some(v) = std::env::var_os(LIB_VAR).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        return match std::fs::canonicalize(&p) {
            Ok(abs) if abs.is_file() => Ok((abs, format!("{LIB_VAR} names it (the search is skipped)"))),
            _ => Err(Error::usage(format!(
                "{LIB_VAR}={} does not name an existing file; point it at librankguard.so or unset it",
                p.display()))),
        };
    }
    let choice = lib_build::choose(
        std::env::var_os(GLIBC_VAR).as_deref(),
        super::sys::glibc_version(),
    )?;
    let builds = acceptable(choice);
    let glibc = super::sys::glibc_version()
        .map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_else(|| "unknown".into());
    let why_build = |b: Build| -> String {
        let wanted = if choice.forced {
            format!("{GLIBC_VAR} asks for {}", choice.build.describe())
        } else {
            format!("this glibc is {glibc}, so {} fits", choice.build.describe())
        };
        if b == choice.build {
            format!("{}: {wanted}", b.describe())
        } else {
            format!(
                "{}: {wanted}, which is not there; this one loads on any glibc from 2.28",
                b.describe()
            )
        }
    };
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| {
            Error::usage(format!(
                "cannot locate the rankguard executable to find {GUARD_FILE}: {e}"
            ))
        })?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let dirs = [
        (dir.clone(), "beside the rankguard executable"),
        (
            dir.join("..").join("lib"),
            "in <the executable's directory>/../lib (a prefix install)",
        ),
    ];
    let mut looked = Vec::new();
    for (d, place) in &dirs {
        for &b in builds {
            let c = file_in(d, b);
            if c.is_file() {
                return std::fs::canonicalize(&c)
                    .map(|p| (p, format!("{}, found {place}", why_build(b))))
                    .map_err(|e| Error::usage(format!("{}: {e}", c.display())));
            }
            looked.push(c.display().to_string());
        }
    }
    // A binary installed alone (cargo install, a wheel) carries the library: see embedded.rs.
    // The first build it carries is the answer; a cache that cannot be used is an error,
    // never a reason to hand out the other build quietly.
    let mut carried = Vec::new();
    for &b in builds {
        if super::embedded::available(b) {
            match super::embedded::extract(b) {
                Ok(p) => {
                    return Ok((
                        p,
                        format!(
                            "{}, carried in the rankguard binary (nothing beside it or in ../lib)",
                            why_build(b)
                        ),
                    ))
                }
                Err(e) => {
                    carried.push(e.msg);
                    break;
                }
            }
        }
        let why = match b {
            Build::Floor => super::embedded::HOW,
            Build::Native => {
                "build.rs makes it for x86_64 release builds, with zig: see its cargo warning"
            }
        };
        carried.push(format!(
            "this binary does not carry {} ({why})",
            b.describe()
        ));
    }
    let forced = if choice.forced {
        format!(" ({GLIBC_VAR} asks for {})", choice.build.describe())
    } else {
        String::new()
    };
    Err(Error::usage(format!(
        "cannot find {GUARD_FILE}{forced}: looked in ${LIB_VAR} (unset), {}; {}; build it \
         (cargo build --release) or set {LIB_VAR} to its path",
        looked.join(", "),
        carried.join("; ")
    )))
}

pub fn main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("lib", args);
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) if f == "-h" || f == "--help" => {
                emit(&format!("Usage: rankguard lib\n\nPrints the absolute path of {GUARD_FILE}:\n  \
                        LD_PRELOAD=$(rankguard lib) python train.py\nSearch order: ${LIB_VAR}, the directory \
                        of the rankguard executable, <that directory>/../lib/, then the copies carried in the \
                        binary (written once to $XDG_CACHE_HOME/rankguard/).\nTwo builds: the glibc 2.28 build \
                        ({GUARD_FILE}, loads on glibc 2.28+) and the glibc 2.34 build ({NATIVE_DIR}/{GUARD_FILE}, \
                        glibc 2.34+, no libdl/libpthread dependency: cheaper process start-up). The one that \
                        fits the running glibc is printed; ${GLIBC_VAR}=2.28|2.34|auto forces one.\n"));
                return Ok(ExitCode::SUCCESS);
            }
            Token::Flag(f) => return Err(lx.unknown(&f)),
            Token::Word(w) => {
                return Err(Error::usage(format!(
                    "rankguard lib: this command takes no arguments (got '{}')",
                    w.to_string_lossy()
                )))
            }
            Token::End => {}
        }
    }
    emit(&format!("{}\n", find()?.display()));
    Ok(ExitCode::SUCCESS)
}
