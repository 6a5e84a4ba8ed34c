//! Is the one GPU this process sees its rank's GPU? One function, used by the guard at
//! `cuInit` (R1) and by `rankguard check`, so the two can never disagree (issue 14, item 8).
//!
//! A process started by `rankguard launch`/`run` carries `RANKGUARD_RANK_GPU` (the CVD entry
//! the rank was given) and `RANKGUARD_RANK_GPU_UUID` (that entry's full UUID, resolved by the
//! launcher through the driver). Inside the process only what it can prove counts:
//! - a full UUID (the resolved one, else the entry itself) is compared with the driver's UUID
//!   of the device the process sees;
//! - any other entry (an index, a UUID prefix) counts only when it is exactly the process's
//!   own single `CUDA_VISIBLE_DEVICES` entry: the driver then resolved that very text to the
//!   one device this process sees, so it named a single GPU;
//! - everything else names no single GPU as far as the process can tell (`GPU-`, an
//!   ambiguous or unresolved prefix, an empty or non-UTF-8 value, a resolved UUID that is
//!   not a full UUID): the check fails closed.

use crate::cvd::{self, CvdEntry};

/// The outcome, with the reason when it is not the rank's GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankGpu {
    /// The process sees the rank's GPU.
    Same,
    /// The process sees another GPU than the one its rank owns.
    Other,
    /// The rank's GPU is not named in a form the process can verify.
    Unverifiable(&'static str),
}

impl RankGpu {
    pub fn is_same(self) -> bool {
        self == RankGpu::Same
    }
}

/// Whether `s` is a full `GPU-`/`MIG-` UUID (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
pub fn is_full_uuid(s: &str) -> bool {
    let Some(body) = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("MIG-")) else {
        return false;
    };
    let lens = [8, 4, 4, 4, 12];
    let mut n = 0;
    for (i, g) in body.split('-').enumerate() {
        if i >= lens.len() || g.len() != lens[i] || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
        n += 1;
    }
    n == lens.len()
}

/// Decide. `rank_entry`: the raw bytes of `RANKGUARD_RANK_GPU` (set, maybe empty);
/// `rank_uuid`: the raw bytes of `RANKGUARD_RANK_GPU_UUID` when set (a blank value counts
/// as unset);
/// `own_uuid`: the driver's UUID of the one device the process sees ("" when unknown);
/// `own_entries`: the process's parsed `CUDA_VISIBLE_DEVICES` entries.
pub fn decide(
    rank_entry: &[u8],
    rank_uuid: Option<&[u8]>,
    own_uuid: &str,
    own_entries: Option<&[CvdEntry]>,
) -> RankGpu {
    let same = |full: &str| {
        if own_uuid.is_empty() {
            RankGpu::Unverifiable("the driver gave no UUID for the device this process sees")
        } else if full.eq_ignore_ascii_case(own_uuid) {
            RankGpu::Same
        } else {
            RankGpu::Other
        }
    };
    if let Some(u) = rank_uuid.filter(|u| !u.trim_ascii().is_empty()) {
        return match std::str::from_utf8(u).map(str::trim) {
            Ok(u) if is_full_uuid(u) => same(u),
            _ => RankGpu::Unverifiable("RANKGUARD_RANK_GPU_UUID is not a full GPU-/MIG- UUID"),
        };
    }
    let Ok(entry) = std::str::from_utf8(rank_entry) else {
        return RankGpu::Unverifiable("it is not valid UTF-8");
    };
    let entry = entry.trim();
    if entry.is_empty() {
        return RankGpu::Unverifiable("it is empty");
    }
    if is_full_uuid(entry) {
        return same(entry);
    }
    let parsed = cvd::parse(Some(entry));
    let (Some([rank]), Some([mine])) = (parsed.entries(), own_entries) else {
        return RankGpu::Unverifiable("it is not one CUDA_VISIBLE_DEVICES entry");
    };
    if rank == mine {
        return RankGpu::Same;
    }
    match rank {
        CvdEntry::Index(_) => RankGpu::Other,
        CvdEntry::Uuid(_) | CvdEntry::Mig(_) => RankGpu::Unverifiable(
            "it is a UUID prefix other than this process's own entry, and only the driver can tell whether a prefix is unique; set RANKGUARD_RANK_GPU_UUID to the full UUID (rankguard launch/run do)",
        ),
    }
}

/// R1's rule for a process's own start (docs/design.md §1, "started with"): a process
/// *started* with a single-entry `CUDA_VISIBLE_DEVICES` (`start_cvd`: the value in its initial
/// environment, `/proc/self/environ`, None when unset) was given that GPU, and must see it at
/// its first `cuInit`, judged by [`decide`] as a launcher's rank GPU is (a full UUID by
/// identity, any other entry only as the process's own current entry). So a script that
/// sets `os.environ["CUDA_VISIBLE_DEVICES"] = "5"` in a process started with `2` is
/// [`RankGpu::Other`]. None when the process was started with no single entry (unset,
/// empty, several entries, nothing CUDA reads): a process that narrows itself from several
/// entries to one (the single-rank case, Ray's worker setting an actor's GPU in-process) is
/// not bound by its start.
pub fn started_with(
    start_cvd: Option<&str>,
    own_uuid: &str,
    own_entries: Option<&[CvdEntry]>,
) -> Option<RankGpu> {
    let start = cvd::parse(start_cvd);
    let [entry] = start.entries()? else {
        return None;
    };
    Some(decide(entry.text().as_bytes(), None, own_uuid, own_entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    const U2: &str = "GPU-12c0ffee-0000-4000-8000-000000000002";
    const U3: &str = "GPU-13c0ffee-0000-4000-8000-000000000003";

    fn own(cvd: &str) -> Vec<CvdEntry> {
        cvd::parse(Some(cvd)).entries().unwrap().to_vec()
    }

    #[test]
    fn full_uuids_decide_by_identity() {
        assert!(is_full_uuid(U2) && is_full_uuid("MIG-1200a11c-0000-4000-8000-000000000200"));
        for bad in [
            "GPU-",
            "GPU-12",
            "GPU-12c0ffee-0000-4000-8000-00000000000",
            "2",
            "",
            "GPU-12c0ffee-0000-4000-8000-000000000002-1",
        ] {
            assert!(!is_full_uuid(bad), "{bad}");
        }
        assert_eq!(
            decide(b"7", Some(U2.as_bytes()), U2, Some(&own("2"))),
            RankGpu::Same
        );
        assert_eq!(
            decide(b"2", Some(U3.as_bytes()), U2, Some(&own("2"))),
            RankGpu::Other
        );
        assert_eq!(
            decide(U2.as_bytes(), None, U2, Some(&own("5"))),
            RankGpu::Same
        );
        assert_eq!(
            decide(U3.as_bytes(), None, U2, Some(&own("2"))),
            RankGpu::Other
        );
    }

    #[test]
    fn entries_count_only_when_they_are_the_process_own() {
        assert_eq!(decide(b"2", None, U2, Some(&own("2"))), RankGpu::Same);
        assert_eq!(decide(b" 2", None, U2, Some(&own("2"))), RankGpu::Same);
        assert_eq!(decide(b"3", None, U2, Some(&own("2"))), RankGpu::Other);
        assert_eq!(
            decide(b"GPU-12", None, U2, Some(&own("GPU-12"))),
            RankGpu::Same
        );
    }

    #[test]
    fn a_process_is_bound_by_the_single_entry_it_was_started_with() {
        // started with 2, re-pointed itself to 5: another GPU
        assert_eq!(
            started_with(Some("2"), U3, Some(&own("5"))),
            Some(RankGpu::Other)
        );
        // kept it (spelled with spaces or a sign, CUDA's parse decides)
        assert_eq!(
            started_with(Some(" 2"), U2, Some(&own("+2"))),
            Some(RankGpu::Same)
        );
        // a full UUID: by identity, whatever the process's CVD now spells
        assert_eq!(
            started_with(Some(U2), U2, Some(&own("5"))),
            Some(RankGpu::Same)
        );
        assert_eq!(
            started_with(Some(U2), U3, Some(&own(U3))),
            Some(RankGpu::Other)
        );
        // several entries, none, empty, nothing CUDA reads: not bound (narrowing itself runs)
        for start in [Some("0,1,2,3"), None, Some(""), Some("-1"), Some("x")] {
            assert_eq!(started_with(start, U2, Some(&own("2"))), None, "{start:?}");
        }
        // started with one entry, now with several: not the one GPU (R1 says it anyway)
        assert!(!started_with(Some("2"), U2, Some(&own("2,3")))
            .unwrap()
            .is_same());
    }

    #[test]
    fn names_of_no_single_gpu_fail_closed() {
        for bad in [&b"GPU-"[..], b"GPU-1", b"", b"  ", b"\xff", b"2,3", b"x"] {
            let d = decide(bad, None, U2, Some(&own("2")));
            assert!(matches!(d, RankGpu::Unverifiable(_)), "{bad:?}: {d:?}");
        }
        // A prefix of the right GPU, but not the process's own entry: cannot be proven unique.
        assert!(matches!(
            decide(b"GPU-12", None, U2, Some(&own("2"))),
            RankGpu::Unverifiable(_)
        ));
        for bad in [&b"GPU-"[..], b"GPU-12", b"\xff"] {
            assert!(matches!(
                decide(b"2", Some(bad), U2, Some(&own("2"))),
                RankGpu::Unverifiable(_)
            ));
        }
        // A blank resolved UUID counts as unset (shells export `VAR=` to clear), for the
        // guard and `check` alike: the entry decides.
        for blank in [&b""[..], b"  "] {
            assert_eq!(
                decide(b"2", Some(blank), U2, Some(&own("2"))),
                RankGpu::Same
            );
            assert!(matches!(
                decide(b"GPU-1", Some(blank), U2, Some(&own("2"))),
                RankGpu::Unverifiable(_)
            ));
        }
        assert!(matches!(
            decide(U2.as_bytes(), None, "", Some(&own("2"))),
            RankGpu::Unverifiable(_)
        ));
    }
}
