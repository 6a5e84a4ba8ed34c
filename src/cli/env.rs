//! The environment a rank is given: the guard in `LD_PRELOAD`, the job id, and the names of
//! the variables rankguard sets. Shared by `launch` (one child per rank) and `run` (this
//! process becomes one rank).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// The rank's GPU identity, exported to its whole process tree beside CUDA_VISIBLE_DEVICES;
/// the guard compares it, by identity, with what each descendant sees.
pub const RANK_GPU: &str = "RANKGUARD_RANK_GPU";
/// The full GPU/MIG UUID of `RANK_GPU`, resolved through the driver, so the guard can
/// compare identities whatever spelling (index, prefix, legacy MIG form) a descendant uses.
pub const RANK_GPU_UUID: &str = "RANKGUARD_RANK_GPU_UUID";
/// Unique per launch; kept when already set.
pub const JOB: &str = crate::jobid::VAR;
/// The guard's file name, as `rankguard lib` finds it.
pub const GUARD_FILE: &str = "librankguard.so";

/// ld.so splits LD_PRELOAD on colons and spaces (ld.so(8)).
fn preload_items(v: &OsStr) -> Vec<&[u8]> {
    v.as_bytes()
        .split(|b| *b == b':' || *b == b' ' || *b == b'\t')
        .filter(|s| !s.is_empty())
        .collect()
}

pub fn is_guard(item: &[u8]) -> bool {
    Path::new(OsStr::from_bytes(item)).file_name() == Some(OsStr::new(GUARD_FILE))
}

/// `LD_PRELOAD` with the guard first, every other entry kept in order, the guard not twice.
pub fn preload_with_guard(guard: &Path, existing: Option<&OsStr>) -> OsString {
    let mut out: Vec<u8> = guard.as_os_str().as_bytes().to_vec();
    for item in existing.map(preload_items).unwrap_or_default() {
        if !is_guard(item) {
            out.push(b':');
            out.extend_from_slice(item);
        }
    }
    OsString::from_vec(out)
}

/// `LD_PRELOAD` with every guard entry removed; None when nothing is left.
pub fn preload_without_guard(existing: Option<&OsStr>) -> Option<OsString> {
    let kept: Vec<&[u8]> = existing
        .map(preload_items)
        .unwrap_or_default()
        .into_iter()
        .filter(|i| !is_guard(i))
        .collect();
    if kept.is_empty() {
        return None;
    }
    Some(OsString::from_vec(kept.join(&b':')))
}

/// Whether `LD_PRELOAD` holds the guard; its entry if so.
pub fn preloaded_guard(existing: Option<&OsStr>) -> Option<String> {
    existing
        .map(preload_items)
        .unwrap_or_default()
        .into_iter()
        .find(|i| is_guard(i))
        .map(|i| String::from_utf8_lossy(i).into_owned())
}

/// The entry itself when it is already a full `GPU-`/`MIG-` UUID (8-4-4-4-12 hex digits).
pub fn full_uuid(entry: &crate::cvd::CvdEntry) -> Option<String> {
    rankguard_core::narrow::full_uuid(entry)
}

fn nonempty(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// A fresh job id: host, launcher pid and start time, unique per launch on a node.
fn fresh_job_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{:x}",
        if host.is_empty() { "rankguard" } else { host },
        std::process::id(),
        t
    )
}

/// The job id of a `launch`: the inherited one, else a fresh one.
pub fn job_for_launch() -> String {
    nonempty(JOB).unwrap_or_else(fresh_job_id)
}

/// The job id of a `run`: the inherited one, else the one the guard derives from the engine
/// that started this rank (`crate::jobid`, the same function), so every rank of one
/// torchrun/srun/mpirun job shares it and agrees with a process of the rank preloaded
/// directly; else a fresh one.
pub fn job_for_run() -> String {
    crate::jobid::from_lookup(|k| std::env::var(k).ok()).unwrap_or_else(fresh_job_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_goes_first_once() {
        let g = Path::new("/opt/rg/librankguard.so");
        assert_eq!(preload_with_guard(g, None), "/opt/rg/librankguard.so");
        assert_eq!(
            preload_with_guard(g, Some(OsStr::new("a.so b.so"))),
            "/opt/rg/librankguard.so:a.so:b.so"
        );
        assert_eq!(
            preload_with_guard(g, Some(OsStr::new("a.so:/old/librankguard.so"))),
            "/opt/rg/librankguard.so:a.so"
        );
        assert_eq!(
            preload_without_guard(Some(OsStr::new("/x/librankguard.so:a.so"))).unwrap(),
            "a.so"
        );
        assert_eq!(
            preload_without_guard(Some(OsStr::new("/x/librankguard.so"))),
            None
        );
        assert_eq!(
            preloaded_guard(Some(OsStr::new("a.so /x/librankguard.so"))).unwrap(),
            "/x/librankguard.so"
        );
        assert_eq!(
            preloaded_guard(Some(OsStr::new("librankguard.so.bak"))),
            None
        );
    }

    #[test]
    fn full_uuids_are_recognised() {
        use crate::cvd::CvdEntry;
        let full = "GPU-12c0ffee-0000-4000-8000-000000000002";
        assert_eq!(
            full_uuid(&CvdEntry::Uuid(full.into())).as_deref(),
            Some(full)
        );
        assert!(full_uuid(&CvdEntry::Mig(
            "MIG-1200a11c-0000-4000-8000-000000000200".into()
        ))
        .is_some());
        assert_eq!(full_uuid(&CvdEntry::Uuid("GPU-12".into())), None);
        assert_eq!(
            full_uuid(&CvdEntry::Mig(
                "MIG-GPU-12c0ffee-0000-4000-8000-000000000002/1/0".into()
            )),
            None
        );
        assert_eq!(full_uuid(&CvdEntry::Index(3)), None);
    }
}
