//! Where `launch` makes its private directories, one of each per launch and removed when
//! it ends: the refused ranks' notes (`failure`) and, with `RANKGUARD_AUDIT` unset, the
//! audit the summary counts (`job_summary`). Each is created mode 0700 under a name no
//! other process chose first (`mkdir` fails on one that exists, and the next name is
//! tried), in the first of these bases that takes it:
//! - `$TMPDIR` alone when it is set: the user's or the batch system's choice (sites often
//!   point it at a per-job directory), as every tool honours it;
//! - else `/dev/shm`, the node's memory-backed file system (where the guard's registry lives
//!   too), then `/tmp`.
//!
//! Why not `/tmp` first: the two directories hold a few small files for the life of one
//! launch, and where `/tmp` is a journaling disk file system (ext4, xfs: the common node) creating
//! and removing them was a measured share of an 8-rank launch's own time (docs/benchmarks.md,
//! "The launcher's directories"); on tmpfs they cost a few microseconds. What they hold is
//! small: a note is a line per refused rank, and the guard writes at most 100 full records
//! per call site and process into an audit (the rest are counted: `audit::tally`), so they
//! do not compete with NCCL's and PyTorch's shared memory there.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// Names tried per base before the next one.
const TRIES: u32 = 8;

/// The bases, in the order tried, given `$TMPDIR`'s value (module doc).
fn bases(tmpdir: Option<OsString>) -> Vec<PathBuf> {
    match tmpdir.filter(|t| !t.is_empty()) {
        Some(t) => vec![PathBuf::from(t)],
        None => vec![PathBuf::from("/dev/shm"), PathBuf::from("/tmp")],
    }
}

/// A new directory `<base>/<prefix>-<pid>-<8 hex digits>`, mode 0700, under the first base
/// that takes one. Err: the last base tried and why it refused (for the caller's warning,
/// which names the fix: `TMPDIR`).
pub fn private_dir(prefix: &str) -> Result<PathBuf, (PathBuf, io::Error)> {
    private_dir_in(&bases(std::env::var_os("TMPDIR")), prefix)
}

fn private_dir_in(bases: &[PathBuf], prefix: &str) -> Result<PathBuf, (PathBuf, io::Error)> {
    let pid = std::process::id();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut last = None;
    for base in bases {
        for i in 0..TRIES {
            let dir = base.join(format!("{prefix}-{pid}-{:08x}", nanos.wrapping_add(i)));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Ok(dir),
                // Somebody's directory of that name: the next name.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    last = Some((base.clone(), e))
                }
                // This base takes none (missing, read-only, full, not ours): the next base.
                Err(e) => {
                    last = Some((base.clone(), e));
                    break;
                }
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        (
            PathBuf::new(),
            io::Error::new(io::ErrorKind::NotFound, "no base directory to try"),
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tmpdir_alone_when_set_else_dev_shm_then_tmp() {
        assert_eq!(
            bases(Some("/scratch/job7".into())),
            [PathBuf::from("/scratch/job7")]
        );
        let default = [PathBuf::from("/dev/shm"), PathBuf::from("/tmp")];
        assert_eq!(bases(None), default);
        assert_eq!(bases(Some("".into())), default, "an empty TMPDIR is unset");
    }

    #[test]
    fn the_first_base_that_takes_a_directory_gets_it_private() {
        let root = std::env::temp_dir().join(format!("rg-scratch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let missing = root.join("missing");
        let ok = root.join("ok");
        std::fs::create_dir(&ok).unwrap();
        let dir = private_dir_in(&[missing.clone(), ok.clone()], "rankguard-test").unwrap();
        assert_eq!(dir.parent(), Some(ok.as_path()));
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert!(
            name.starts_with(&format!("rankguard-test-{}-", std::process::id())),
            "{name}"
        );
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
        // None takes one: the last base's refusal is said.
        let (base, e) =
            private_dir_in(std::slice::from_ref(&missing), "rankguard-test").unwrap_err();
        assert_eq!((base, e.kind()), (missing, io::ErrorKind::NotFound));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
