//! `launch`'s failure summary after a refusal (issue 28; docs/design.md, "Ending the
//! rank"). The launcher gives its ranks a private notes directory
//! (`RANKGUARD_LAUNCH_DIR`, 0700, removed at exit); a process the guard refuses for R1
//! (or ends in abort mode) claims its rank there with one file, `<rank pid>.<start>`,
//! created O_EXCL (src/guard/7_decide/end_rank.rs), so a rank is named once however many
//! of its descendants are refused. `supervise` polls the directory: a note stops the job
//! (a short grace) and the launcher exits 78 with the box below, in the shape of
//! torchrun's `ChildFailedError`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The variable naming the notes directory (the guard's `end_rank::LAUNCH_DIR_VAR`).
pub const VAR: &str = "RANKGUARD_LAUNCH_DIR";

/// `launch`'s status after a refusal: the guard's R1 status (EX_CONFIG), as the refused
/// process's own.
pub const EXIT_REFUSED: u8 = 78;

/// How long the launcher lets the refused process end its rank's process itself after it
/// sees the note (docs/cli.md): that process's own status (78 from the guard's signal, or
/// SIGTERM's, then SIGKILL 0.5 s later) is the one the summary reports, not the launcher's
/// SIGTERM. The job is stopped when it ends, or after this.
pub const RANK_END_WAIT: Duration = Duration::from_millis(600);

/// The grace the other ranks get once a refusal is noted, at most.
pub const REFUSAL_GRACE: Duration = Duration::from_secs(1);

/// The notes directory; removed (with its notes) when dropped.
pub struct Notes {
    dir: PathBuf,
}

impl Notes {
    /// A new private directory (`scratch`: under `$TMPDIR` when set, else `/dev/shm` or
    /// /tmp). None, with a warning, when it cannot be made: then refusals end their rank as
    /// under `run`, without the box.
    pub fn create() -> Option<Notes> {
        match super::scratch::private_dir("rankguard-launch") {
            Ok(dir) => Some(Notes { dir }),
            Err((base, e)) => {
                eprintln!(
                    "rankguard launch: warning: cannot create a notes directory under {} ({e}); a \
                     refused rank still ends, but without the failure summary (set TMPDIR to a \
                     writable directory)",
                    base.display()
                );
                None
            }
        }
    }

    /// The (name, value) the ranks get.
    pub fn env(&self) -> (OsString, OsString) {
        (VAR.into(), self.dir.clone().into_os_string())
    }

    /// The notes written so far, oldest first.
    pub fn read(&self) -> Vec<Note> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut notes: Vec<Note> = rd.flatten().filter_map(|e| Note::read(&e.path())).collect();
        notes.sort_by_key(|n| n.time);
        notes
    }
}

impl Drop for Notes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One refused rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    /// The rank's process (the note's name).
    pub rank_pid: u32,
    /// The refused process.
    pub pid: String,
    pub command: String,
    pub rank: String,
    pub local_rank: String,
    pub rule: String,
    pub site: String,
    pub why: String,
    pub time: SystemTime,
}

impl Note {
    fn read(path: &Path) -> Option<Note> {
        let name = path.file_name()?.to_str()?;
        let rank_pid = name.split('.').next()?.parse().ok()?;
        let text = std::fs::read_to_string(path).ok()?;
        let time = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .unwrap_or(UNIX_EPOCH);
        parse(rank_pid, &text, time)
    }
}

/// A note's text: `rankguard-refusal 1`, `key value` lines, `end` (a note still being
/// written, without `end`, is read on the next poll).
pub fn parse(rank_pid: u32, text: &str, time: SystemTime) -> Option<Note> {
    let mut lines = text.lines();
    if lines.next()? != "rankguard-refusal 1" || !text.ends_with("end\n") {
        return None;
    }
    let mut n = Note {
        rank_pid,
        pid: "?".into(),
        command: "?".into(),
        rank: "-".into(),
        local_rank: "-".into(),
        rule: "?".into(),
        site: "?".into(),
        why: "?".into(),
        time,
    };
    for l in lines {
        let (k, v) = l.split_once(' ').unwrap_or((l, ""));
        let slot = match k {
            "pid" => &mut n.pid,
            "command" => &mut n.command,
            "rank" => &mut n.rank,
            "local_rank" => &mut n.local_rank,
            "rule" => &mut n.rule,
            "site" => &mut n.site,
            "why" => &mut n.why,
            _ => continue,
        };
        *slot = v.to_string();
    }
    Some(n)
}

/// `YYYY-MM-DD_HH:MM:SS` (UTC), torchrun's time field.
pub fn utc(t: SystemTime) -> String {
    let s = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (s / 86400, s % 86400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}_{:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// What the launcher knows of a refused rank besides its note.
pub struct Ended {
    /// The launcher's rank number, when the note's rank process is one of its ranks.
    pub rank: Option<u32>,
    /// Its exit code in the shell's encoding, when reaped.
    pub exitcode: Option<u8>,
}

/// The box, in the shape of torchrun's `ChildFailedError.format_msg`: the first note is
/// the root cause, the others are listed under Failures.
pub fn summary(cmd: &str, host: &str, notes: &[(Note, Ended)]) -> String {
    const W: usize = 72;
    let eq = "=".repeat(W);
    let dash = "-".repeat(W);
    let entry = |i: usize, (n, e): &(Note, Ended)| -> String {
        let rank = e
            .rank
            .map(|r| r.to_string())
            .unwrap_or_else(|| n.rank.clone());
        let code = e
            .exitcode
            .map(|c| c.to_string())
            .unwrap_or_else(|| "?".into());
        format!(
            "[{i}]:\n  time      : {}\n  host      : {host}\n  rank      : {rank} (local_rank: {})\n  \
             exitcode  : {code} (pid: {})\n  rule      : {}\n  refused   : pid {} ('{}')\n  \
             site      : {}\n  error     : {}\n",
            utc(n.time),
            n.local_rank,
            n.rank_pid,
            n.rule,
            n.pid,
            n.command,
            n.site,
            n.why
        )
    };
    let mut s = format!("{eq}\n{cmd} FAILED (rankguard: the guard refused a process; exit status 78)\n{dash}\nFailures:\n");
    if notes.len() <= 1 {
        s.push_str("  <NO_OTHER_FAILURES>\n");
    }
    for (i, n) in notes.iter().enumerate().skip(1) {
        s.push_str(&entry(i, n));
    }
    s.push_str(&format!("{dash}\nRoot Cause (first observed failure):\n"));
    if let Some(first) = notes.first() {
        s.push_str(&entry(0, first));
    }
    s.push_str(&eq);
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTE: &str = "rankguard-refusal 1\npid 42\ncommand collector\nrank 1\nlocal_rank 1\n\
                        rule R1 (one GPU per rank)\nsite x.py:3\nwhy it saw GPU 2\nend\n";

    #[test]
    fn a_note_is_read_once_complete() {
        let n = parse(7, NOTE, UNIX_EPOCH).unwrap();
        assert_eq!(
            (n.rank_pid, n.pid.as_str(), n.site.as_str()),
            (7, "42", "x.py:3")
        );
        assert_eq!(n.rule, "R1 (one GPU per rank)");
        assert!(parse(7, &NOTE[..NOTE.len() - 4], UNIX_EPOCH).is_none());
        assert!(parse(7, "other\nend\n", UNIX_EPOCH).is_none());
    }

    #[test]
    fn utc_formats_civil_time() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01_00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661); // 2000-02-29
        assert_eq!(utc(t), "2000-02-29_01:01:01 UTC");
    }

    #[test]
    fn the_box_has_torchruns_shape() {
        let n = parse(7, NOTE, UNIX_EPOCH).unwrap();
        let e = || Ended {
            rank: Some(1),
            exitcode: Some(143),
        };
        let one = summary("learner.py", "h", &[(n.clone(), e())]);
        let lines: Vec<&str> = one.lines().collect();
        assert!(lines[0].chars().all(|c| c == '=') && lines.last() == lines.first());
        assert!(one.contains("Failures:\n  <NO_OTHER_FAILURES>\n"));
        assert!(one.contains("Root Cause (first observed failure):\n[0]:\n"));
        assert!(one.contains("  rank      : 1 (local_rank: 1)\n  exitcode  : 143 (pid: 7)\n"));
        let two = summary("learner.py", "h", &[(n.clone(), e()), (n, e())]);
        assert!(two.contains("Failures:\n[1]:\n") && !two.contains("<NO_OTHER"));
    }
}
