//! The copies of librankguard.so carried inside the `rankguard` binary, for installs that
//! ship the binary alone: `cargo install` installs binaries only, and a wheel's `rankguard`
//! script lands in a `bin/` directory with no room for a library beside it. When no library
//! sits next to the executable (`lib_path.rs`), the copy of the build that fits
//! (`lib_build.rs`: the glibc 2.28 build, or the glibc 2.34 one) is written once to a
//! per-user cache:
//!
//!   `$XDG_CACHE_HOME/rankguard/<version>-<hash>/librankguard.so`
//!   (`$HOME/.cache/...` when XDG_CACHE_HOME is unset or not absolute, per the XDG spec)
//!
//! `<hash>` is that copy's, so the two builds (and two versions) never share a directory.
//!
//! Trust: the `<version>-<hash>` directory is created 0700 and must be a real directory owned
//! by the current user with no group/other access, or we refuse it (someone else could swap
//! the library a rank preloads). The file is written to a temporary name and renamed into
//! place (atomic: concurrent ranks never see half a library), and an existing file is used
//! only when its bytes equal the embedded ones, so a corrupted or foreign file is replaced.
//!
//! build.rs decides what is embedded (release builds: both builds of the library, the glibc
//! 2.34 one where zig can link it; other profiles: nothing, see `HOW`).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::env::GUARD_FILE;
use super::exit::{Error, Result};

use super::lib_build::Build;

static FLOOR: &[u8] = include_bytes!(env!("RANKGUARD_EMBEDDED_LIB"));
/// FNV-1a 64 of `FLOOR`, computed by build.rs: names the cache directory per build.
const FLOOR_HASH: &str = env!("RANKGUARD_EMBEDDED_HASH");
static NATIVE: &[u8] = include_bytes!(env!("RANKGUARD_EMBEDDED_NATIVE_LIB"));
const NATIVE_HASH: &str = env!("RANKGUARD_EMBEDDED_NATIVE_HASH");
/// How the embedded copies were built (or why there are none), for messages.
pub const HOW: &str = env!("RANKGUARD_EMBEDDED_HOW");

fn bytes(build: Build) -> (&'static [u8], &'static str) {
    match build {
        Build::Floor => (FLOOR, FLOOR_HASH),
        Build::Native => (NATIVE, NATIVE_HASH),
    }
}

pub fn available(build: Build) -> bool {
    !bytes(build).0.is_empty()
}

/// The per-user cache directory of one build's library.
fn cache_dir(hash: &str) -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from) {
        Some(p) if p.is_absolute() => p,
        _ => match std::env::var_os("HOME").map(PathBuf::from) {
            Some(h) if h.is_absolute() => h.join(".cache"),
            _ => {
                return Err(Error::usage(format!(
                    "cannot place {GUARD_FILE}: neither XDG_CACHE_HOME nor HOME is an absolute path; set one, \
                     or set RANKGUARD_LIB to a copy of the library"
                )))
            }
        },
    };
    Ok(base
        .join("rankguard")
        .join(format!("{}-{hash}", env!("CARGO_PKG_VERSION"))))
}

/// The effective uid, from /proc (no unsafe code in this module).
fn euid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

fn err(path: &Path, what: &str) -> Error {
    Error::usage(format!(
        "cannot use {} for {GUARD_FILE}: {what}; remove it, or set RANKGUARD_LIB to a copy of the library",
        path.display()
    ))
}

/// Write the embedded copy of `build` to the cache (once) and return its path.
pub fn extract(build: Build) -> Result<PathBuf> {
    let (lib, hash) = bytes(build);
    let dir = cache_dir(hash)?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| err(&dir, &format!("cannot create the directory: {e}")))?;
    let meta = fs::symlink_metadata(&dir).map_err(|e| err(&dir, &e.to_string()))?;
    let me = euid().ok_or_else(|| err(&dir, "cannot tell the current user (/proc/self/status)"))?;
    if !meta.file_type().is_dir() {
        return Err(err(&dir, "not a directory (a symbolic link?)"));
    }
    if meta.uid() != me {
        return Err(err(
            &dir,
            &format!("owned by uid {}, not by you (uid {me})", meta.uid()),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        // Ours: tighten it rather than fail (e.g. created by an older version or by hand).
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| err(&dir, &e.to_string()))?;
    }
    let path = dir.join(GUARD_FILE);
    if is_ours(&path, me, lib) {
        return Ok(path);
    }
    let tmp = dir.join(format!(".{GUARD_FILE}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .open(&tmp)?;
        f.write_all(lib)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(err(&path, &format!("cannot write it: {e}")));
    }
    if !is_ours(&path, me, lib) {
        return Err(err(
            &path,
            "it does not hold the expected bytes after writing it",
        ));
    }
    Ok(path)
}

/// A regular file (not a link) owned by us whose bytes are `lib`.
fn is_ours(path: &Path, me: u32, lib: &[u8]) -> bool {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() && m.uid() == me && m.len() == lib.len() as u64 => {
            fs::read(path).is_ok_and(|b| b == lib)
        }
        _ => false,
    }
}
