//! `launch`'s audit: checked before any rank starts, and read back for the summary that ends
//! every launch (issue 32): how each rank ended, the violations the guard recorded in this
//! job per rule and rank, and where the audit is.
//!
//! - `RANKGUARD_AUDIT` set: its directory must exist and be writable, checked here once,
//!   before any rank starts (otherwise every guarded process of every rank would say, once
//!   each, that it cannot open its file, and the job would run unaudited). The records stay
//!   where the user put them; the summary reads this job's (its `job` id, files written
//!   since the launch began).
//! - unset: the ranks get a private audit directory (0700, removed at exit; where: `scratch`)
//!   so that the summary can still count what the guard recorded; it says that the records
//!   were not kept and how to keep them.
//!
//! Whether denials change the job's status is decided here and documented in docs/cli.md
//! ("The summary"): they do not. In enforce mode a denied call returns a CUDA error to the
//! program, which handles it (a device probe that stops at the first error, a fallback to
//! cuda:0); the job's status stays its ranks' own, as under torchrun. A process the guard
//! stops (R1) ends with 78, which is the rank's status. The summary names every denial, and
//! `rankguard report` exits 1 on any violation, which is the gate for a CI job.
//!
//! After a refusal the failure box (`failure.rs`, branch end-rank) comes first; this
//! summary follows it, so one launch ends with both.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::exit::{Error, Result};
use crate::audit::{self, Aggregate, Aggregator, RankKey};
use crate::config::{audit_name_matches, audit_template_split};

pub const AUDIT_VAR: &str = "RANKGUARD_AUDIT";

/// Where this launch's records go.
pub enum Audit {
    /// The user's `RANKGUARD_AUDIT`: its directory (host expanded) and file-name pattern.
    Kept {
        template: String,
        dir: PathBuf,
        pattern: String,
    },
    /// Launch's own directory, removed when dropped.
    Private(PathBuf),
    /// Neither (no private directory could be made: said once).
    None,
}

impl Drop for Audit {
    fn drop(&mut self) {
        if let Audit::Private(d) = self {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The host name as the guard writes it in `%h` and in records: up to its first dot, at
/// most 63 bytes (`guard/1_sys/signal_safe.rs`, `hostname`), so that `node7.cluster`'s files
/// are found as `audit.node7.<pid>.jsonl`.
pub fn host() -> String {
    short_host(&full_host())
}

/// The whole host name (the registry's private fallback is named by it).
pub fn full_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

fn short_host(full: &str) -> String {
    let b = full.as_bytes();
    let end = b
        .iter()
        .take(63)
        .position(|&c| c == b'.')
        .unwrap_or(b.len().min(63));
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Why `dir` cannot hold audit files, or None when a file can be created in it (tried: a
/// file created and removed, which also catches read-only file systems, where root's
/// permissions do not help).
pub fn unwritable(dir: &Path) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some("does not exist".into()),
        Err(e) => return Some(format!("cannot be examined ({e})")),
        Ok(m) if !m.is_dir() => return Some("is not a directory".into()),
        Ok(_) => {}
    }
    let probe = dir.join(format!(".rankguard-probe.{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            None
        }
        Err(e) => Some(format!("is not writable ({e})")),
    }
}

/// `RANKGUARD_AUDIT=T`: the problem with it, worded with the fix, or its split.
pub fn check_template(
    template: &str,
    host: &str,
) -> std::result::Result<(PathBuf, String), String> {
    let fix = "or point RANKGUARD_AUDIT at a directory you can write (or unset it)";
    let (dir, pattern) = audit_template_split(template, host)
        .map_err(|why| format!("{AUDIT_VAR}={template} {why}"))?;
    match unwritable(Path::new(&dir)) {
        None => Ok((PathBuf::from(dir), pattern)),
        Some(why) if why == "does not exist" => Err(format!(
            "{AUDIT_VAR}={template}: its directory {dir} does not exist; create it (mkdir -p {dir}) {fix}"
        )),
        Some(why) => Err(format!(
            "{AUDIT_VAR}={template}: its directory {dir} {why}; fix it {fix}"
        )),
    }
}

/// Decide this launch's audit before any rank starts: a bad `RANKGUARD_AUDIT` is refused
/// (status 2, nothing started), said once with the fix.
pub fn prepare() -> Result<Audit> {
    match std::env::var_os(AUDIT_VAR).filter(|v| !v.is_empty()) {
        Some(v) => {
            let template = v.into_string().map_err(|v| {
                Error::usage(format!(
                    "rankguard launch: {AUDIT_VAR}='{}' is not valid UTF-8; fix the variable; no rank was started",
                    v.to_string_lossy()
                ))
            })?;
            let (dir, pattern) = check_template(&template, &host())
                .map_err(|e| Error::usage(format!("rankguard launch: {e}; no rank was started")))?;
            Ok(Audit::Kept {
                template,
                dir,
                pattern,
            })
        }
        None => Ok(private_dir()),
    }
}

fn private_dir() -> Audit {
    match super::scratch::private_dir("rankguard-audit") {
        Ok(dir) => Audit::Private(dir),
        Err((base, e)) => {
            eprintln!(
                "rankguard launch: warning: cannot create a private audit directory under {} \
                 ({e}); the summary will not count violations (set \
                 {AUDIT_VAR}=DIR/audit.%h.%p.jsonl, or TMPDIR to a writable directory)",
                base.display()
            );
            Audit::None
        }
    }
}

impl Audit {
    /// The variable the ranks get (none when the user's is kept: they inherit it).
    pub fn env(&self) -> Option<(OsString, OsString)> {
        match self {
            Audit::Private(d) => Some((
                AUDIT_VAR.into(),
                d.join("audit.%h.%p.jsonl").into_os_string(),
            )),
            _ => None,
        }
    }

    /// This job's records: the files the template writes on this host that changed since
    /// `since`, read keeping only records of `job`.
    fn read(&self, job: &str, since: SystemTime) -> Option<(Aggregate, usize)> {
        let (dir, pattern) = match self {
            Audit::Kept { dir, pattern, .. } => (dir.clone(), pattern.clone()),
            Audit::Private(d) => (d.clone(), "audit.%h.%p.jsonl".to_string()),
            Audit::None => return None,
        };
        let host = host();
        // A second of slack: file times can be coarser than the clock.
        let since = since.checked_sub(Duration::from_secs(1)).unwrap_or(since);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| audit_name_matches(&pattern, &host, n))
            })
            .filter(|e| {
                e.metadata()
                    .is_ok_and(|m| m.is_file() && m.modified().is_ok_and(|t| t >= since))
            })
            .map(|e| e.path())
            .collect();
        files.sort();
        let mut agg = Aggregator::for_job(job);
        let read = super::report::read_into(&files, &mut agg);
        Some((agg.finish(), read.len()))
    }
}

/// How each rank ended, for the summary: (rank, status in the shell's encoding).
pub type Ended = [(u32, u8)];

/// The lines that end a launch (docs/cli.md, "The summary").
pub fn summary(audit: &Audit, job: &str, since: SystemTime, ended: &Ended, status: u8) -> String {
    let read = audit.read(job, since);
    render(audit, read.as_ref().map(|(s, n)| (s, *n)), ended, status)
}

/// `ranks 0-2 exited 0, rank 3 exited 78`.
fn statuses(ended: &Ended) -> String {
    let mut by: std::collections::BTreeMap<u8, Vec<RankKey>> = Default::default();
    for &(r, c) in ended {
        by.entry(c).or_default().push(RankKey::Numbered(r.into()));
    }
    by.into_iter()
        .map(|(c, mut ks)| {
            ks.sort();
            format!("{} exited {c}", audit::rank_list(&ks))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Per rule: (rule, counts, ranks, calls with counts), in rule order.
struct RuleLine {
    rule: String,
    count: usize,
    denied: usize,
    warned: usize,
    ranks: Vec<RankKey>,
    calls: Vec<(String, usize)>,
}

fn per_rule(s: &Aggregate) -> Vec<RuleLine> {
    let mut out: Vec<RuleLine> = Vec::new();
    for g in &s.groups {
        if out.last().is_none_or(|l| l.rule != g.rule) {
            out.push(RuleLine {
                rule: g.rule.clone(),
                count: 0,
                denied: 0,
                warned: 0,
                ranks: Vec::new(),
                calls: Vec::new(),
            });
        }
        let l = out.last_mut().expect("pushed above");
        l.count += g.count;
        l.denied += g.denied;
        l.warned += g.warned;
        l.calls.push((g.call.clone(), g.count));
        for r in &g.ranks {
            let k = RankKey::of(r.rank, r.rank_root.as_ref());
            if !l.ranks.contains(&k) {
                l.ranks.push(k);
            }
        }
    }
    for l in &mut out {
        l.ranks.sort();
    }
    out
}

fn counts(denied: usize, warned: usize) -> String {
    match (denied, warned) {
        (d, 0) => format!("{d} denied"),
        (0, w) => format!("{w} warned"),
        (d, w) => format!("{} ({d} denied, {w} warned)", d + w),
    }
}

fn render(audit: &Audit, read: Option<(&Aggregate, usize)>, ended: &Ended, status: u8) -> String {
    let mut o = format!(
        "rankguard launch: summary: {}; status {status}\n",
        statuses(ended)
    );
    match read {
        None => o.push_str("  the guard's records could not be read: violations not counted\n"),
        Some((s, _)) if s.totals.records == 0 => {
            o.push_str("  the guard recorded no violation in this job\n")
        }
        Some((s, _)) => {
            let t = &s.totals;
            o.push_str(&format!(
                "  the guard recorded {} in this job: {}\n",
                plural(t.records, "violation", "violations"),
                counts(t.denied, t.warned)
            ));
            for l in per_rule(s) {
                o.push_str(&format!(
                    "  {} {}: {} in {} ({})\n",
                    l.rule,
                    audit::rule_name(&l.rule),
                    counts(l.denied, l.warned),
                    audit::rank_list(&l.ranks),
                    l.calls
                        .iter()
                        .map(|(c, n)| format!("{c} x{n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                debug_assert_eq!(l.count, l.denied + l.warned);
            }
            if t.denied > 0 && status == 0 {
                o.push_str(
                    "  denials do not change the job's status: each denied call returned a CUDA \
                     error to the program, which went on; `rankguard report` exits 1 on any \
                     violation (the gate for CI)\n",
                );
            }
        }
    }
    if let Some((s, _)) = read {
        if s.totals.problems > 0 {
            o.push_str(&format!(
                "  {} in the audit files could not be used (rankguard report lists them)\n",
                plural(s.totals.problems, "line or file", "lines or files")
            ));
        }
    }
    let recorded = read.is_none_or(|(s, _)| s.totals.records > 0);
    match audit {
        Audit::Kept { template, dir, .. } => o.push_str(&format!(
            "  audit: {template} (rankguard report {d}; rankguard report --map {d})\n",
            d = dir.display()
        )),
        // A clean job without an audit of its own needs no advice (and its output keeps
        // no mention of the guard's variables).
        Audit::Private(_) | Audit::None if recorded => o.push_str(&format!(
            "  audit: not kept ({AUDIT_VAR} is unset; set {AUDIT_VAR}=DIR/audit.%h.%p.jsonl to keep \
             the records for rankguard report)\n"
        )),
        Audit::Private(_) | Audit::None => {}
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary_of(lines: &[&str]) -> Aggregate {
        let mut a = Aggregator::for_job("j");
        for (i, l) in lines.iter().enumerate() {
            a.add_line("f", i + 1, l.as_bytes(), true);
        }
        a.finish()
    }

    fn rec(rank: u32, rule: &str, call: &str, verdict: &str, job: &str) -> String {
        format!(
            r#"{{"ts":1.0,"call":"{call}","verdict":"{verdict}","rule":"{rule}","pid":{},"host":"h","rank":{rank},"job":"{job}"}}"#,
            100 + rank
        )
    }

    #[test]
    fn denials_per_rule_and_rank_and_where_the_audit_is() {
        let mut lines: Vec<String> = (0..8)
            .map(|r| rec(r, "R2", "cuDeviceGet", "deny", "j"))
            .collect();
        lines.push(rec(3, "R1", "cuInit", "deny", "j"));
        lines.push(rec(5, "R2", "cuDeviceGet", "deny", "another job"));
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let s = summary_of(&refs);
        let kept = Audit::Kept {
            template: "/a/audit.%p.jsonl".into(),
            dir: "/a".into(),
            pattern: "audit.%p.jsonl".into(),
        };
        let ended: Vec<(u32, u8)> = (0..8).map(|r| (r, 0)).collect();
        let t = render(&kept, Some((&s, 2)), &ended, 0);
        assert_eq!(
            t,
            "rankguard launch: summary: ranks 0-7 exited 0; status 0\n  \
             the guard recorded 9 violations in this job: 9 denied\n  \
             R1 one GPU per rank: 1 denied in rank 3 (cuInit x1)\n  \
             R2 cuda:0 only: 8 denied in ranks 0-7 (cuDeviceGet x8)\n  \
             denials do not change the job's status: each denied call returned a CUDA error to \
             the program, which went on; `rankguard report` exits 1 on any violation (the gate \
             for CI)\n  \
             audit: /a/audit.%p.jsonl (rankguard report /a; rankguard report --map /a)\n"
        );
        let clean = summary_of(&[]);
        let t = render(&Audit::None, Some((&clean, 0)), &[(0, 0), (1, 78)], 78);
        assert!(t.starts_with(
            "rankguard launch: summary: rank 0 exited 0, rank 1 exited 78; status 78\n  the guard recorded no violation in this job\n"
        ), "{t}");
        assert!(!t.contains("audit:"), "{t}");
        let t = render(&Audit::None, Some((&s, 1)), &[(0, 0)], 0);
        assert!(
            t.contains("audit: not kept (RANKGUARD_AUDIT is unset"),
            "{t}"
        );
    }

    #[test]
    fn the_host_is_named_as_the_guard_names_it_in_file_names() {
        assert_eq!(short_host("node7.cluster.example"), "node7");
        assert_eq!(short_host("vm"), "vm");
        assert_eq!(short_host(&"h".repeat(80)), "h".repeat(63));
    }

    #[test]
    fn a_bad_audit_template_is_said_with_its_fix() {
        let e = check_template("/no/such/dir/a.%p.jsonl", "h").unwrap_err();
        assert!(
            e.contains(
                "its directory /no/such/dir does not exist; create it (mkdir -p /no/such/dir)"
            ),
            "{e}"
        );
        let e = check_template("/proc/self/a.%p.jsonl", "h").unwrap_err();
        assert!(e.contains("is not writable"), "{e}");
        let e = check_template("/etc/hostname/a.jsonl", "h").unwrap_err();
        assert!(e.contains("is not a directory"), "{e}");
        let e = check_template("/tmp/%p/a.jsonl", "h").unwrap_err();
        assert!(e.contains("%p in its directory part"), "{e}");
        let dir = std::env::temp_dir();
        let (d, p) = check_template(&format!("{}/a.%h.%p.jsonl", dir.display()), "h").unwrap();
        assert_eq!((d, p.as_str()), (dir, "a.%h.%p.jsonl"));
    }
}
