//! The rank root: which rank a guarded process belongs to when nothing names it (no
//! `RANK`/`SLURM_PROCID`/... and no `RANKGUARD_RANK_GPU`: plain `LD_PRELOAD`, Ray, any
//! engine that sets no rank variables).
//!
//! The contract already says what a rank is: a single-entry `CUDA_VISIBLE_DEVICES` is the
//! rank's boundary, and a rank is a process tree. So a guarded process belongs to the rank
//! of its **outermost ancestor that is a rank**, and is its own rank root when it has none.
//! An ancestor is a rank when
//! - it recorded itself in the per-user registry at its first `cuInit` (a [`RankRecord`]:
//!   the root it found and the rank GPU's UUID; this covers a process that was given its
//!   GPU in-process before user code, as Ray's worker does), or
//! - it is guarded (`LD_PRELOAD` names `librankguard*`) and its *initial* environment
//!   (`/proc/<pid>/environ`: what it was started with, by the user's shell or a supervisor)
//!   holds a single-entry `CUDA_VISIBLE_DEVICES` (this covers a learner whose collectors
//!   start, and initialise CUDA, before it does).
//!
//! A shell or supervisor with no single-entry CVD is not a rank, so
//! `bash -c 'CVD=0 prog & CVD=1 prog'` is two ranks, and two programs started separately are
//! two ranks. An unguarded process is not a rank (it is outside the contract), but the walk
//! passes through it.
//!
//! The walk (pure here, over a [`ProcView`]; `guard/5_process/rank_root.rs` reads the real `/proc`)
//! stops at a process of another user (nothing another user can write is trusted), at a
//! pid whose start time is later than its child's (the parent exited and the pid was
//! reused: a recycled pid is never taken for an ancestor), at pid 0 and after
//! [`MAX_DEPTH`] steps. A root is named by `(pid, start time)`, which no other process on
//! the node shares, even after the pid is reused.

use std::fmt;

use crate::cvd;

/// The most ancestors examined.
pub const MAX_DEPTH: usize = 64;

/// A process, named so that a reused pid never matches: the pid and its start time
/// (`/proc/<pid>/stat` field 22, clock ticks since boot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RootId {
    pub pid: u32,
    pub start: u64,
}

impl fmt::Display for RootId {
    /// `<pid>.<start>`, the registry's form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.pid, self.start)
    }
}

impl RootId {
    /// Parse `<pid>.<start>` (plain decimals, pid 1..2^22).
    pub fn parse(s: &str) -> Option<RootId> {
        let (p, t) = s.split_once('.')?;
        let dec = |x: &str| {
            (!x.is_empty() && x.len() <= 20 && x.bytes().all(|b| b.is_ascii_digit()))
                .then(|| x.parse::<u64>().ok())
                .flatten()
        };
        let pid = u32::try_from(dec(p)?)
            .ok()
            .filter(|p| (1..=1 << 22).contains(p))?;
        Some(RootId {
            pid,
            start: dec(t)?,
        })
    }
}

/// What `/proc/<pid>/stat` says about the walk: the parent and the start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    pub start: u64,
}

/// Fields 4 (ppid) and 22 (starttime) of a `/proc/<pid>/stat` line. The command name
/// (field 2) is in parentheses and may contain spaces and parentheses, so fields are
/// counted after the last `)`.
pub fn parse_stat(stat: &str) -> Option<Stat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    // after ")": field 3 (state), 4 (ppid), ... 22 (starttime) is the 20th.
    let ppid = f.nth(1)?.parse().ok()?;
    let start = f.nth(17)?.parse().ok()?;
    Some(Stat { ppid, start })
}

/// What the initial environment of a process says: its `CUDA_VISIBLE_DEVICES` and whether
/// its `LD_PRELOAD` names the guard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvFacts {
    pub cvd: Option<String>,
    pub guarded: bool,
}

/// Scan `/proc/<pid>/environ` (NUL-separated `NAME=value`). For a name defined twice the
/// first definition counts, as glibc's `getenv` returns it.
pub fn scan_environ(bytes: &[u8]) -> EnvFacts {
    let mut out = EnvFacts::default();
    let (mut cvd_seen, mut preload_seen) = (false, false);
    for entry in bytes.split(|&b| b == 0) {
        if !cvd_seen {
            if let Some(v) = entry.strip_prefix(b"CUDA_VISIBLE_DEVICES=") {
                cvd_seen = true;
                out.cvd = std::str::from_utf8(v).ok().map(str::to_string);
            }
        }
        if !preload_seen {
            if let Some(v) = entry.strip_prefix(b"LD_PRELOAD=") {
                preload_seen = true;
                out.guarded = std::str::from_utf8(v).is_ok_and(preloads_guard);
            }
        }
    }
    out
}

/// Whether an `LD_PRELOAD` value names the guard: an entry (separated by `:` or spaces, as
/// ld.so splits them) whose file name starts with `librankguard` (the checkout's
/// `librankguard.so`, or the copy `rankguard lib` writes to its cache).
pub fn preloads_guard(value: &str) -> bool {
    value.split([':', ' ', '\t']).any(|e| {
        e.rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with("librankguard"))
    })
}

/// The single entry of a CVD value, or None (unset, empty, several entries).
pub fn single_entry(cvd_text: Option<&str>) -> Option<String> {
    match cvd::parse(cvd_text).entries() {
        Some([one]) => Some(one.text()),
        _ => None,
    }
}

/// What a guarded ancestor recorded about itself at its first `cuInit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankRecord {
    /// The root it belongs to (itself, or an ancestor of it).
    pub root: RootId,
    /// The rank GPU's full UUID, as its driver reported it.
    pub gpu: String,
}

/// How the guard learns about other processes (the real `/proc` and registry, or a test's).
pub trait ProcView {
    fn stat(&mut self, pid: u32) -> Option<Stat>;
    /// Owner (effective uid) of `/proc/<pid>`.
    fn uid(&mut self, pid: u32) -> Option<u32>;
    /// The initial environment; None when it cannot be read.
    fn environ(&mut self, pid: u32) -> Option<EnvFacts>;
    /// The trusted rank record of the live process `(pid, start)`, if it wrote one.
    fn record(&mut self, id: RootId) -> Option<RankRecord>;
}

/// The rank GPU as the root's evidence names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootGpu {
    /// A full UUID the root's (or an intermediate's) driver reported.
    Uuid(String),
    /// The CVD entry the root was started with (index, UUID or prefix), unresolved.
    Entry(String),
}

impl RootGpu {
    pub fn text(&self) -> &str {
        match self {
            RootGpu::Uuid(s) | RootGpu::Entry(s) => s,
        }
    }
}

/// An ancestor that is a rank root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ancestor {
    pub root: RootId,
    pub gpu: RootGpu,
    /// How it was found: a registry record, or its initial environment.
    pub by_record: bool,
}

/// Walk the ancestors of `me` (whose own stat is read through `view` too) for the outermost
/// one that is a rank; None when there is none (then `me` is its own root).
pub fn find(me: u32, uid: u32, view: &mut dyn ProcView) -> Option<Ancestor> {
    // One stat read per process: a parent's stat is the next step's child's.
    let mut child = me;
    let mut st = view.stat(me)?;
    let mut best = None;
    for _ in 0..MAX_DEPTH {
        let ppid = st.ppid;
        if ppid == 0 || ppid == child {
            break;
        }
        let Some(pst) = view.stat(ppid) else { break };
        // A parent starts before its child: a later start means the parent exited and its
        // pid belongs to someone else now.
        if pst.start > st.start {
            break;
        }
        if view.uid(ppid) != Some(uid) {
            break;
        }
        let id = RootId {
            pid: ppid,
            start: pst.start,
        };
        if let Some(rec) = view.record(id) {
            best = Some(Ancestor {
                root: rec.root,
                gpu: RootGpu::Uuid(rec.gpu),
                by_record: true,
            });
        } else if let Some(env) = view.environ(ppid) {
            if env.guarded {
                if let Some(entry) = single_entry(env.cvd.as_deref()) {
                    // A process below already recorded this root with the GPU's UUID (the
                    // root itself never initialised CUDA, e.g. a `timeout` wrapper): keep
                    // the resolved identity.
                    if !best
                        .as_ref()
                        .is_some_and(|b: &Ancestor| b.by_record && b.root == id)
                    {
                        best = Some(Ancestor {
                            root: id,
                            gpu: RootGpu::Entry(entry),
                            by_record: false,
                        });
                    }
                }
            }
        }
        child = ppid;
        st = pst;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Fake {
        procs: HashMap<u32, (Stat, u32, Option<EnvFacts>)>,
        records: HashMap<RootId, RankRecord>,
    }

    impl Fake {
        fn add(&mut self, pid: u32, ppid: u32, start: u64, env: Option<(&str, bool)>) -> &mut Self {
            let env = env.map(|(cvd, guarded)| EnvFacts {
                cvd: (!cvd.is_empty()).then(|| cvd.to_string()),
                guarded,
            });
            self.procs.insert(pid, (Stat { ppid, start }, 0, env));
            self
        }
    }

    impl ProcView for Fake {
        fn stat(&mut self, pid: u32) -> Option<Stat> {
            self.procs.get(&pid).map(|p| p.0)
        }
        fn uid(&mut self, pid: u32) -> Option<u32> {
            self.procs.get(&pid).map(|p| p.1)
        }
        fn environ(&mut self, pid: u32) -> Option<EnvFacts> {
            self.procs.get(&pid).and_then(|p| p.2.clone())
        }
        fn record(&mut self, id: RootId) -> Option<RankRecord> {
            self.records.get(&id).cloned()
        }
    }

    fn node() -> Fake {
        let mut f = Fake::default();
        f.add(1, 0, 1, Some(("", false))) // init
            .add(10, 1, 100, Some(("", false))) // the user's shell
            .add(20, 10, 200, Some(("0", true))); // a learner given GPU 0, guarded
        f
    }

    #[test]
    fn the_outermost_guarded_single_entry_ancestor_is_the_root() {
        let mut f = node();
        f.add(30, 20, 300, Some(("1", true))) // a collector re-pointed to GPU 1
            .add(40, 30, 400, Some(("1", true))); // its child
        let a = find(40, 0, &mut f).unwrap();
        assert_eq!(
            a.root,
            RootId {
                pid: 20,
                start: 200
            }
        );
        assert_eq!(a.gpu, RootGpu::Entry("0".into()));
        assert!(!a.by_record);
        // the learner itself has no rank ancestor: it is its own root
        assert_eq!(find(20, 0, &mut f), None);
    }

    #[test]
    fn shells_supervisors_and_unguarded_processes_are_not_ranks() {
        let mut f = node();
        // a guarded shell with no CVD starting two programs: two ranks
        f.add(50, 10, 500, Some(("", true)))
            .add(51, 50, 510, Some(("0", true)))
            .add(52, 50, 520, Some(("1", true)));
        assert_eq!(find(51, 0, &mut f), None);
        assert_eq!(find(52, 0, &mut f), None);
        // a supervisor with several GPUs starting workers on 3 and 4
        f.add(60, 10, 600, Some(("3,4", true)))
            .add(61, 60, 610, Some(("3", true)));
        assert_eq!(find(61, 0, &mut f), None);
        // an unguarded process with one GPU is outside the contract, but the walk passes it
        f.add(70, 20, 700, Some(("5", false)))
            .add(71, 70, 710, Some(("5", true)));
        assert_eq!(find(71, 0, &mut f).unwrap().root.pid, 20);
        // unreadable environment: not a rank
        f.add(80, 10, 800, None).add(81, 80, 810, Some(("1", true)));
        assert_eq!(find(81, 0, &mut f), None);
    }

    #[test]
    fn a_record_names_a_root_the_environment_cannot_show() {
        // Ray: raylet (no CVD) -> worker (CVD set in-process, recorded at cuInit) -> child
        let mut f = node();
        f.add(90, 10, 900, Some(("", false)))
            .add(91, 90, 910, Some(("", true)))
            .add(92, 91, 920, Some(("5", true)));
        assert_eq!(find(92, 0, &mut f), None);
        let w = RootId {
            pid: 91,
            start: 910,
        };
        f.records.insert(
            w,
            RankRecord {
                root: w,
                gpu: "GPU-12".into(),
            },
        );
        let a = find(92, 0, &mut f).unwrap();
        assert_eq!(
            (a.root, a.gpu, a.by_record),
            (w, RootGpu::Uuid("GPU-12".into()), true)
        );
        // a wrapper root that never initialised CUDA (timeout, numactl): the UUID a process
        // below it recorded for the same root is kept over the wrapper's index entry
        let (wrap, learner) = (
            RootId {
                pid: 20,
                start: 200,
            },
            RootId {
                pid: 30,
                start: 300,
            },
        );
        f.add(30, 20, 300, Some(("0", true)))
            .add(31, 30, 310, Some(("1", true)));
        f.records.insert(
            learner,
            RankRecord {
                root: wrap,
                gpu: "GPU-10".into(),
            },
        );
        let a = find(31, 0, &mut f).unwrap();
        assert_eq!((a.root, a.gpu), (wrap, RootGpu::Uuid("GPU-10".into())));
        // a record naming a root above it (that root exited, the walk cannot reach it)
        let gone = RootId { pid: 5, start: 50 };
        f.records.insert(
            w,
            RankRecord {
                root: gone,
                gpu: "GPU-12".into(),
            },
        );
        assert_eq!(find(92, 0, &mut f).unwrap().root, gone);
    }

    #[test]
    fn a_recycled_pid_another_user_and_loops_stop_the_walk() {
        let mut f = node();
        // 30's parent pid 20 was reused by a process that started after 30: not its parent
        f.add(30, 20, 150, Some(("1", true)));
        assert_eq!(find(30, 0, &mut f), None);
        // another user's process in between: the walk stops there
        let mut f = node();
        f.add(30, 20, 300, Some(("1", true)));
        f.procs.get_mut(&20).unwrap().1 = 1000;
        assert_eq!(find(30, 0, &mut f), None);
        // a process that is its own parent, and a cycle: bounded
        let mut f = Fake::default();
        f.add(7, 7, 1, Some(("0", true)));
        assert_eq!(find(7, 0, &mut f), None);
        let mut f = Fake::default();
        f.add(7, 8, 1, Some(("0", true)))
            .add(8, 7, 1, Some(("0", true)));
        assert!(find(7, 0, &mut f).is_some());
        // a process that vanished: no root
        assert_eq!(find(12345, 0, &mut Fake::default()), None);
    }

    #[test]
    fn stat_environ_and_preload_parsing() {
        let s = "4242 (a b) c)) S 17 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 987654 1 2";
        assert_eq!(
            parse_stat(s),
            Some(Stat {
                ppid: 17,
                start: 987654
            })
        );
        assert_eq!(parse_stat("1 (x) S"), None);
        let env = b"A=1\0LD_PRELOAD=/x/libfoo.so:/opt/rg/librankguard.so\0CUDA_VISIBLE_DEVICES=GPU-12\0CUDA_VISIBLE_DEVICES=3\0";
        assert_eq!(
            scan_environ(env),
            EnvFacts {
                cvd: Some("GPU-12".into()),
                guarded: true
            }
        );
        assert_eq!(
            scan_environ(b"LD_PRELOAD=libfoo.so librankguard-1.so\0"),
            EnvFacts {
                cvd: None,
                guarded: true
            }
        );
        assert!(!preloads_guard("/x/notlibrankguard.so"));
        assert!(!scan_environ(b"XLD_PRELOAD=librankguard.so\0").guarded);
        assert_eq!(single_entry(Some(" 2 ")), Some("2".into()));
        assert_eq!(single_entry(Some("2,3")), None);
        assert_eq!(single_entry(Some("")), None);
        assert_eq!(single_entry(None), None);
        assert_eq!(single_entry(Some("+3")), Some("3".into()));
        assert_eq!(
            RootId::parse("4242.987654"),
            Some(RootId {
                pid: 4242,
                start: 987654
            })
        );
        for bad in ["", "1", "0.5", "x.1", "1.-2", "1.2.3", "99999999.1"] {
            assert_eq!(RootId::parse(bad), None, "{bad}");
        }
        assert_eq!(RootId { pid: 3, start: 9 }.to_string(), "3.9");
    }
}
