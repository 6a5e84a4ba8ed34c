//! Which of the two builds of librankguard.so `rankguard lib` hands out (docs/install.md):
//!
//! - the **glibc 2.28 build** (`librankguard.so`): linked against glibc 2.28 stubs, loads on
//!   glibc 2.28 and newer; the 2.28 ABI makes it name `libdl.so.2` and `libpthread.so.0`,
//!   which a process on glibc 2.34+ otherwise never loads (~0.1 ms per process start);
//! - the **glibc 2.34 build** (`glibc-2.34/librankguard.so` beside it): linked against glibc
//!   2.34 stubs, needs only `libc.so.6`, loads on glibc 2.34 and newer.
//!
//! Both files are named `librankguard.so` (the name `launch`/`run`/`check` recognise a guard
//! in `LD_PRELOAD` by). By default the build that fits the glibc this process runs on is
//! picked; `RANKGUARD_LIB_GLIBC` forces one (for tests, and for ranks that run on another
//! glibc than the CLI, e.g. in a container). Pure logic; the running glibc's version comes
//! from `sys::glibc_version`.

use super::exit::{Error, Result};
use std::ffi::OsStr;

pub const GLIBC_VAR: &str = "RANKGUARD_LIB_GLIBC";
/// The directory, beside the glibc 2.28 build, that holds the glibc 2.34 build.
pub const NATIVE_DIR: &str = "glibc-2.34";
const NATIVE_FLOOR: (u32, u32) = (2, 34);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// Loads on glibc 2.28+.
    Floor,
    /// Loads on glibc 2.34+, without libdl/libpthread.
    Native,
}

impl Build {
    pub fn describe(self) -> &'static str {
        match self {
            Build::Floor => "the glibc 2.28 build",
            Build::Native => "the glibc 2.34 build",
        }
    }
}

/// What to look for: `build`, and whether it was forced (then nothing else will do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub build: Build,
    pub forced: bool,
}

/// `"2.36"` (gnu_get_libc_version) -> (2, 36); None for anything else.
pub fn parse_version(s: &str) -> Option<(u32, u32)> {
    let mut it = s.trim().split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// The build that fits a glibc version (None: unknown, so the one that loads everywhere).
pub fn fits(glibc: Option<(u32, u32)>) -> Build {
    match glibc {
        Some(v) if v >= NATIVE_FLOOR => Build::Native,
        _ => Build::Floor,
    }
}

/// The choice for `RANKGUARD_LIB_GLIBC` (`var`) on a process running `glibc`.
pub fn choose(var: Option<&OsStr>, glibc: Option<(u32, u32)>) -> Result<Choice> {
    let value = var
        .map(|v| v.to_string_lossy().trim().to_string())
        .unwrap_or_default();
    let shown = |g: Option<(u32, u32)>| {
        g.map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|| "unknown".into())
    };
    match value.as_str() {
        "" | "auto" => Ok(Choice { build: fits(glibc), forced: false }),
        "2.28" => Ok(Choice { build: Build::Floor, forced: true }),
        "2.34" if fits(glibc) == Build::Native => Ok(Choice { build: Build::Native, forced: true }),
        "2.34" => Err(Error::usage(format!(
            "{GLIBC_VAR}=2.34 asks for the glibc 2.34 build, which does not load on this glibc ({}); \
             unset {GLIBC_VAR} or set it to 2.28",
            shown(glibc)))),
        other => Err(Error::usage(format!(
            "{GLIBC_VAR}='{other}' is not auto, 2.28 or 2.34; fix or unset it"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_like_gnu_get_libc_version_prints_them() {
        assert_eq!(parse_version("2.36"), Some((2, 36)));
        assert_eq!(parse_version("2.28"), Some((2, 28)));
        assert_eq!(parse_version("2.34.9000"), Some((2, 34)));
        assert_eq!(parse_version("3"), None);
        assert_eq!(parse_version("x.y"), None);
    }

    #[test]
    fn the_native_build_is_picked_from_glibc_2_34_on() {
        assert_eq!(fits(Some((2, 28))), Build::Floor);
        assert_eq!(fits(Some((2, 33))), Build::Floor);
        assert_eq!(fits(Some((2, 34))), Build::Native);
        assert_eq!(fits(Some((2, 39))), Build::Native);
        assert_eq!(fits(Some((3, 0))), Build::Native);
        assert_eq!(fits(None), Build::Floor);
    }

    #[test]
    fn the_variable_forces_a_build_or_fails_clearly() {
        let auto = |g| choose(None, g).unwrap();
        assert_eq!(
            auto(Some((2, 36))),
            Choice {
                build: Build::Native,
                forced: false
            }
        );
        assert_eq!(
            auto(Some((2, 31))),
            Choice {
                build: Build::Floor,
                forced: false
            }
        );
        let v = |s: &str, g| choose(Some(OsStr::new(s)), g);
        assert_eq!(v("auto", Some((2, 36))).unwrap().build, Build::Native);
        assert_eq!(v("", Some((2, 36))).unwrap().build, Build::Native);
        assert_eq!(
            v("2.28", Some((2, 36))).unwrap(),
            Choice {
                build: Build::Floor,
                forced: true
            }
        );
        assert_eq!(
            v("2.34", Some((2, 36))).unwrap(),
            Choice {
                build: Build::Native,
                forced: true
            }
        );
        let e = v("2.34", Some((2, 31))).unwrap_err();
        assert!(
            e.msg.contains("does not load on this glibc (2.31)") && e.msg.contains("2.28"),
            "{}",
            e.msg
        );
        let e = v("native", Some((2, 36))).unwrap_err();
        assert!(e.msg.contains("RANKGUARD_LIB_GLIBC='native'"), "{}", e.msg);
    }
}
