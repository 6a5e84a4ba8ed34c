//! One rank's `CUDA_VISIBLE_DEVICES` entry, chosen from the parent's list: the rule
//! `rankguard run --narrow-by VAR` / `--device ENTRY` applies, and the one the guard applies
//! itself at load time when `RANKGUARD_NARROW_BY=VAR` is set (docs/design.md, "Narrowing
//! without a wrapper"). One function, so the two routes give the same entry and the same
//! errors; only the name of the knob in the message differs.
//!
//! Rules:
//!   - an external single-entry CVD is authoritative: it is kept as is (with a narrowing
//!     variable too, so one recipe works whether or not the engine already narrowed, e.g.
//!     Slurm's `--gpus-per-task=1`); `--device` must agree with it;
//!   - a multi-entry CVD is narrowed to the entry at position `$VAR` or to `--device`;
//!   - an unset CVD means "every GPU": `$VAR` gives ordinal `$VAR`;
//!   - a malformed CVD (empty, or entries CUDA would ignore) is refused.

use crate::cvd::{self, CvdEntry, Visibility};

/// The variable that asks the guard to narrow at load time.
pub const VAR: &str = "RANKGUARD_NARROW_BY";

/// The rank identity the narrowing exports (read back by the R1 check, crate::rankgpu).
pub const RANK_GPU: &str = "RANKGUARD_RANK_GPU";
pub const RANK_GPU_UUID: &str = "RANKGUARD_RANK_GPU_UUID";

/// The variables the common engines set to the rank's local position.
pub const RANK_VARS: &str =
    "LOCAL_RANK (torchrun), SLURM_LOCALID (srun), OMPI_COMM_WORLD_LOCAL_RANK (mpirun)";

/// Which route asked, for the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `rankguard run --narrow-by VAR` / `--device ENTRY`.
    Run,
    /// `RANKGUARD_NARROW_BY=VAR` read by the guard.
    Env,
}

impl Via {
    fn who(self) -> &'static str {
        match self {
            Via::Run => "rankguard run",
            Via::Env => "rankguard",
        }
    }
    fn knob(self, name: &str) -> String {
        match self {
            Via::Run => format!("--narrow-by {name}"),
            Via::Env => {
                let var = VAR;
                format!("{var}={name}")
            }
        }
    }
}

/// The entries of a set `CUDA_VISIBLE_DEVICES`, refusing a list that makes no GPU visible
/// or that CUDA would read only in part (the same checks as `launch`'s host view).
pub fn visible_list(raw: &str) -> Result<Vec<CvdEntry>, String> {
    let var = cvd::VAR;
    let items: Vec<&str> = raw.split(',').collect();
    let entries = match cvd::parse(Some(raw)) {
        Visibility::Entries(e) => e,
        Visibility::Unset => vec![],
    };
    if entries.is_empty() {
        return Err(format!(
            "{var}='{raw}' makes no GPU visible to this launcher (empty, -1, an invalid first entry, or a repeated \
             entry), so there is nothing to give the ranks; unset {var} to use every GPU, or list the GPUs to use"));
    }
    if entries.len() != items.len() {
        // Joined by hand and `get`, not indexing: `join` and an index keep panic locations,
        // which the guard's copy of this code pays as relocations at every process start.
        let mut shown = String::new();
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                shown.push(',');
            }
            shown.push_str(&e.text());
        }
        let first_unread = items.get(entries.len()).map_or("", |s| s.trim());
        return Err(format!(
            "{var}='{raw}' is malformed: CUDA reads only its first {} of {} entries ({}) and ignores the rest \
             (entry '{}' is invalid or of a different form than the first); fix the variable so it lists \
             exactly the GPUs meant",
            entries.len(), items.len(), shown, first_unread));
    }
    Ok(entries)
}

/// Whether `name` can name an environment variable (`[A-Za-z0-9_]+`).
pub fn check_var_name(via: Via, name: &str) -> Result<(), String> {
    // Locals, not `{VAR}` in the format strings: a named constant there is a promoted
    // static holding a pointer, one more relocation in every process that loads the guard
    // (docs/benchmarks.md, "What the loader's added instructions are made of").
    let (var, rank_vars) = (VAR, RANK_VARS);
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(match via {
            Via::Run => format!("rankguard run: --narrow-by '{name}' is not an environment variable name"),
            Via::Env => format!(
                "rankguard: {var}='{name}' is not an environment variable name; set it to the variable the engine \
                 gives each rank ({rank_vars})"),
        });
    }
    Ok(())
}

/// The rank's single entry, from the parent's CVD (`raw`), the narrowing variable and its
/// value (`narrow`), or an explicit `device`.
pub fn choose(
    via: Via,
    raw: Option<&str>,
    narrow: Option<(&str, Option<&str>)>,
    device: Option<&str>,
) -> Result<CvdEntry, String> {
    let (var, rank_vars) = (cvd::VAR, RANK_VARS); // locals: see check_var_name
    let who = via.who();
    if narrow.is_some() && device.is_some() {
        return Err(format!("{who}: give --narrow-by or --device, not both"));
    }
    let list: Option<Vec<CvdEntry>> = match raw {
        None => None,
        Some(v) => Some(visible_list(v).map_err(|e| format!("{who}: {e}"))?),
    };
    let shown = |l: &[CvdEntry]| format!("{var}='{}' ({} visible)", raw.unwrap_or(""), l.len());

    if let Some(text) = device {
        let want = match cvd::parse(Some(text)) {
            Visibility::Entries(e) if e.len() == 1 && !text.contains(',') => e.into_iter().next().unwrap(),
            _ => {
                return Err(format!(
                    "{who}: --device '{text}' is not one device entry; give a position (0, 1, ...) or one \
                     GPU-/MIG- UUID"))
            }
        };
        return match (list, want) {
            (None, w) => Ok(w),
            (Some(l), CvdEntry::Index(p)) => l.get(p as usize).cloned().ok_or_else(|| {
                format!(
                    "{who}: --device {p} names position {p}, but {} has only positions 0-{}; pick a \
                     visible position", shown(&l), l.len() - 1)
            }),
            (Some(l), w) => {
                if l.iter().any(|e| e.text().eq_ignore_ascii_case(&w.text())) {
                    Ok(w)
                } else if l.len() == 1 {
                    Err(format!(
                        "{who}: --device '{w}' conflicts with the external single-entry {var}='{}', which \
                         is authoritative for this rank; drop --device or unset {var}", l[0]))
                } else {
                    Err(format!(
                        "{who}: --device '{w}' is not one of the entries of {}; pick one of them",
                        shown(&l)))
                }
            }
        };
    }

    if let Some(l) = &list {
        if l.len() == 1 {
            return Ok(l[0].clone());
        }
    }
    let Some((name, value)) = narrow else {
        let what = match &list {
            None => format!("{var} is unset, so every GPU of the node is visible"),
            Some(l) => format!("{} makes {} GPUs visible", shown(l), l.len()),
        };
        return Err(format!(
            "{who}: {what}, but a rank must see exactly one; add --narrow-by VAR to pick the entry at the \
             position the engine gives this rank ({rank_vars}), or --device ENTRY"));
    };
    let knob = via.knob(name);
    let Some(value) = value else {
        return Err(format!(
            "{who}: {knob}: {name} is not set in this environment; run under an engine that \
             sets it ({rank_vars}) or name the variable it does set"
        ));
    };
    let pos: u32 = value
        .trim()
        .parse()
        .map_err(|_| format!("{who}: {knob}: {name}='{value}' is not a position (0, 1, ...)"))?;
    match list {
        None => Ok(CvdEntry::Index(pos)),
        Some(l) => l.get(pos as usize).cloned().ok_or_else(|| {
            format!(
                "{who}: {knob}: {name}={pos} is past the end of {}; start at most {} ranks \
                 on this node or widen {var}",
                shown(&l),
                l.len()
            )
        }),
    }
}

/// The entry itself when it is already a full `GPU-`/`MIG-` UUID (8-4-4-4-12 hex digits).
pub fn full_uuid(entry: &CvdEntry) -> Option<String> {
    let (CvdEntry::Uuid(s) | CvdEntry::Mig(s)) = entry else {
        return None;
    };
    crate::rankgpu::is_full_uuid(s).then(|| s.clone())
}

/// What the guard does at load time with `RANKGUARD_NARROW_BY` set, from a lookup of the
/// environment: `None` when there is nothing to do (the variable unset or blank, or the
/// process is already inside a rank: `RANKGUARD_RANK_GPU` is set, so a descendant keeps its
/// rank's GPU and is judged by R1, never narrowed again); else the variables to set, or
/// the one-line error.
pub fn at_load(
    get: impl Fn(&str) -> Option<String>,
) -> Option<Result<Vec<(&'static str, String)>, String>> {
    let name = get(VAR)?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    if get(RANK_GPU).is_some_and(|v| !v.is_empty()) {
        return None;
    }
    Some(narrowed_env(name, &get))
}

fn narrowed_env(
    name: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<(&'static str, String)>, String> {
    check_var_name(Via::Env, name)?;
    let raw = get(cvd::VAR);
    let value = get(name);
    let entry = choose(
        Via::Env,
        raw.as_deref(),
        Some((name, value.as_deref())),
        None,
    )?;
    let text = entry.text();
    let mut out = vec![(cvd::VAR, text.clone()), (RANK_GPU, text)];
    if let Some(u) = full_uuid(&entry) {
        out.push((RANK_GPU_UUID, u));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: Option<&str>, narrow: Option<(&str, Option<&str>)>, device: Option<&str>) -> String {
        choose(Via::Run, raw, narrow, device).unwrap().text()
    }
    fn bad(
        raw: Option<&str>,
        narrow: Option<(&str, Option<&str>)>,
        device: Option<&str>,
    ) -> String {
        choose(Via::Run, raw, narrow, device).unwrap_err()
    }

    #[test]
    fn narrows_by_position() {
        assert_eq!(
            ok(Some("4,5,6,7"), Some(("LOCAL_RANK", Some("2"))), None),
            "6"
        );
        assert_eq!(
            ok(
                Some("GPU-12,GPU-15"),
                Some(("SLURM_LOCALID", Some("1"))),
                None
            ),
            "GPU-15"
        );
        assert_eq!(ok(None, Some(("LOCAL_RANK", Some("3"))), None), "3");
        // Single entry: authoritative, whatever the position.
        assert_eq!(
            ok(Some("GPU-15"), Some(("SLURM_LOCALID", Some("3"))), None),
            "GPU-15"
        );
        assert_eq!(ok(Some("5"), None, None), "5");
    }

    #[test]
    fn refuses_what_breaks_the_contract() {
        let e = bad(Some("0,1"), None, None);
        assert!(
            e.contains("CUDA_VISIBLE_DEVICES='0,1'") && e.contains("--narrow-by"),
            "{e}"
        );
        assert!(bad(None, None, None).contains("unset"));
        let e = bad(Some("0,1"), Some(("LOCAL_RANK", None)), None);
        assert!(e.contains("LOCAL_RANK is not set"), "{e}");
        let e = bad(Some("0,1"), Some(("LOCAL_RANK", Some("2"))), None);
        assert!(e.contains("LOCAL_RANK=2") && e.contains("'0,1'"), "{e}");
        assert!(bad(Some("0,1"), Some(("LOCAL_RANK", Some("x"))), None).contains("not a position"));
        assert!(bad(Some(""), Some(("LOCAL_RANK", Some("0"))), None).contains("no GPU"));
        assert!(bad(Some("0,2,-1"), Some(("LOCAL_RANK", Some("0"))), None).contains("malformed"));
        assert!(bad(Some("0,1"), Some(("A", Some("0"))), Some("1")).contains("not both"));
    }

    #[test]
    fn device_flag() {
        assert_eq!(ok(Some("4,5"), None, Some("1")), "5");
        assert_eq!(ok(None, None, Some("GPU-12")), "GPU-12");
        assert_eq!(ok(Some("GPU-12,GPU-13"), None, Some("GPU-13")), "GPU-13");
        let e = bad(Some("GPU-12"), None, Some("GPU-13"));
        assert!(
            e.contains("--device 'GPU-13'") && e.contains("CUDA_VISIBLE_DEVICES='GPU-12'"),
            "{e}"
        );
        assert!(bad(Some("4,5"), None, Some("2")).contains("position 2"));
        assert!(bad(None, None, Some("0,1")).contains("not one device entry"));
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn at_load_narrows_once_with_runs_rule() {
        assert_eq!(at_load(env(&[("LOCAL_RANK", "3")])), None);
        assert_eq!(at_load(env(&[(VAR, " ")])), None);
        let got = at_load(env(&[
            (VAR, "LOCAL_RANK"),
            ("LOCAL_RANK", "3"),
            (cvd::VAR, "0,1,2,3,4,5,6,7"),
        ]));
        assert_eq!(
            got,
            Some(Ok(vec![
                (cvd::VAR, "3".to_string()),
                (RANK_GPU, "3".to_string())
            ]))
        );
        let full = "GPU-12c0ffee-0000-4000-8000-000000000002";
        let got = at_load(env(&[
            (VAR, "SLURM_LOCALID"),
            ("SLURM_LOCALID", "1"),
            (cvd::VAR, &format!("GPU-1,{full}")),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(got[2], (RANK_GPU_UUID, full.to_string()));
        // Inside a rank: never narrowed again (R1 judges a re-pointed descendant).
        assert_eq!(
            at_load(env(&[
                (VAR, "LOCAL_RANK"),
                ("LOCAL_RANK", "1"),
                (RANK_GPU, "3"),
                (cvd::VAR, "0,1")
            ])),
            None
        );
        let e = at_load(env(&[(VAR, "LOCAL_RANK"), (cvd::VAR, "0,1")]))
            .unwrap()
            .unwrap_err();
        assert!(
            e.contains("RANKGUARD_NARROW_BY=LOCAL_RANK: LOCAL_RANK is not set"),
            "{e}"
        );
        let e = at_load(env(&[(VAR, "LOCAL-RANK")])).unwrap().unwrap_err();
        assert!(
            e.contains("RANKGUARD_NARROW_BY='LOCAL-RANK' is not an environment variable name"),
            "{e}"
        );
    }
}
