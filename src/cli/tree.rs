//! The launcher's process tree, read from `/proc`, so that nothing a launch started
//! outlives it (issue 14, item 11): descendants that left the ranks' process groups
//! (`setsid`, `setpgid`) are found by parentage, not by group.
//!
//! A process is named by (pid, start time) so a pid reused after it died is never killed
//! in its place.

use std::collections::HashMap;

/// (pid, start time in clock ticks since boot).
pub type Proc = (u32, u64);

/// Fields 4 (ppid) and 22 (starttime) of a `/proc/<pid>/stat` line; the command name
/// (field 2) may hold spaces and parentheses, so fields are counted after the last `)`.
fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let ppid = f.nth(1)?.parse().ok()?;
    let start = f.nth(17)?.parse().ok()?;
    Some((ppid, start))
}

/// Every process: pid -> (ppid, start time).
fn table() -> HashMap<u32, (u32, u64)> {
    let mut t = HashMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return t;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(v) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        {
            t.insert(pid, v);
        }
    }
    t
}

/// The start time of `pid`, if it is alive.
pub fn start_time(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .as_deref()
        .and_then(parse_stat)
        .map(|(_, s)| s)
}

/// The children of `pid`, from `/proc/<pid>/task/*/children` (cost proportional to the
/// tree, not to the node); None where the kernel does not provide those files
/// (CONFIG_PROC_CHILDREN unset). A process that is gone has no children (they were
/// re-parented): an empty list, not None, which would make the caller read every process
/// of the node (a rank that just exited would cost a scan of all of `/proc`).
fn children_of(pid: u32) -> Option<Vec<u32>> {
    static HAVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let have = *HAVE.get_or_init(|| {
        let me = std::process::id();
        std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists()
    });
    if !have {
        return None;
    }
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Some(out);
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_ascii_whitespace()
                    .filter_map(|s| s.parse::<u32>().ok()),
            );
        }
    }
    Some(out)
}

/// Every descendant of the `roots` (not the roots themselves), except `skip` and its
/// descendants.
pub fn descendants(roots: &[u32], skip: u32) -> Vec<Proc> {
    let mut full: Option<HashMap<u32, Vec<u32>>> = None;
    let mut out: Vec<Proc> = Vec::new();
    let mut stack: Vec<u32> = roots.to_vec();
    while let Some(p) = stack.pop() {
        let kids = match children_of(p) {
            Some(k) => k,
            None => {
                let m = full.get_or_insert_with(|| {
                    let mut m: HashMap<u32, Vec<u32>> = HashMap::new();
                    for (pid, (ppid, _)) in table() {
                        m.entry(ppid).or_default().push(pid);
                    }
                    m
                });
                m.get(&p).cloned().unwrap_or_default()
            }
        };
        for c in kids {
            if c == skip || out.iter().any(|&(q, _)| q == c) {
                continue;
            }
            if let Some(s) = start_time(c) {
                out.push((c, s));
                stack.push(c);
            }
        }
    }
    out
}

/// Of `procs`, those still alive as the same process (same start time).
pub fn still_alive(procs: &[Proc]) -> Vec<u32> {
    procs
        .iter()
        .filter(|&&(p, s)| start_time(p) == Some(s))
        .map(|&(p, _)| p)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_odd_command_names() {
        let line =
            "4242 (a) b (c) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some((17, 987654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_process_that_is_gone_has_no_children_without_a_scan_of_proc() {
        // A pid above the kernel's maximum (pid_max <= 2^22) never exists.
        if children_of(std::process::id()).is_some() {
            assert_eq!(children_of(1 << 23), Some(vec![]));
        }
    }

    #[test]
    fn this_process_is_a_descendant_of_its_parent() {
        let me = std::process::id();
        let parent = std::os::unix::process::parent_id();
        let d = descendants(&[parent], 0);
        assert!(d.iter().any(|&(p, s)| p == me && Some(s) == start_time(me)));
        assert_eq!(
            still_alive(&[(me, start_time(me).unwrap()), (me, 1)]),
            vec![me]
        );
    }
}
