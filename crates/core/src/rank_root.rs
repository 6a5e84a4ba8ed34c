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
//! two ranks.
//!
//! The walk (pure here, over a [`ProcView`]; `guard/5_process/rank_root.rs` reads the real `/proc`)
//! stops at a process of another user (nothing another user can write is trusted), at a
//! pid whose start time is later than its child's (the parent exited and the pid was
//! reused: a recycled pid is never taken for an ancestor), at pid 0 and after
//! [`MAX_DEPTH`] steps. A root is named by `(pid, start time)`, which no other process on
//! the node shares, even after the pid is reused.
//!
//! Its cost is bounded by the guarded part of the tree (docs/design.md §1, "The walk's
//! cost"), not by the depth to pid 1:
//! - **a rank record ends the walk**: its writer walked the same tree above itself at its
//!   first `cuInit`, by the same rule, and the record holds that answer (its root), so the
//!   ancestors above it are not read again;
//! - **an unguarded process ends the walk**: one whose initial environment does not preload
//!   the guard and that wrote no record is not a rank, and no rank above it reaches below
//!   it: whoever can start a process without the guard can run any program outside the
//!   contract already, so passing through it (as the walk did before) protected nothing;
//! - of each ancestor it reads only what the decision needs: one `stat`, one registry
//!   look-up by name, and the environment only up to the first definitions of
//!   `CUDA_VISIBLE_DEVICES` and `LD_PRELOAD` ([`EnvScan`]).

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
/// first definition counts, as glibc's `getenv` returns it. The scan ends at an
/// `LD_PRELOAD` without the guard: the CVD of an unguarded process is not read (it is no
/// rank whatever its CVD).
pub fn scan_environ(bytes: &[u8]) -> EnvFacts {
    let mut scan = EnvScan::default();
    scan.feed(bytes, true);
    scan.facts
}

/// [`scan_environ`] over an environment read in pieces, which says when the rest cannot
/// change the facts (both variables seen), so the reader stops reading there.
#[derive(Clone, Debug, Default)]
pub struct EnvScan {
    pub facts: EnvFacts,
    cvd_seen: bool,
    preload_seen: bool,
}

impl EnvScan {
    /// Whether the rest cannot change the decision: both variables were seen, or an
    /// `LD_PRELOAD` that does not name the guard (an unguarded process is no rank, whatever
    /// its CVD).
    pub fn done(&self) -> bool {
        self.preload_seen && (self.cvd_seen || !self.facts.guarded)
    }

    /// Scan the complete entries at the start of `bytes` (or all of it when `last`: the end
    /// of the environment ends its last entry); returns how many bytes were consumed, so
    /// the caller keeps the rest (an entry cut by the read) for the next piece.
    pub fn feed(&mut self, bytes: &[u8], last: bool) -> usize {
        let mut used = 0;
        while used < bytes.len() && !self.done() {
            let rest = &bytes[used..];
            let (entry, next) = match rest.iter().position(|&b| b == 0) {
                Some(n) => (&rest[..n], used + n + 1),
                None if last => (rest, bytes.len()),
                None => break,
            };
            self.entry(entry);
            used = next;
        }
        if self.done() {
            bytes.len()
        } else {
            used
        }
    }

    fn entry(&mut self, entry: &[u8]) {
        if !self.cvd_seen {
            if let Some(v) = entry.strip_prefix(b"CUDA_VISIBLE_DEVICES=") {
                self.cvd_seen = true;
                self.facts.cvd = std::str::from_utf8(v).ok().map(str::to_string);
            }
        }
        if !self.preload_seen {
            if let Some(v) = entry.strip_prefix(b"LD_PRELOAD=") {
                self.preload_seen = true;
                self.facts.guarded = std::str::from_utf8(v).is_ok_and(preloads_guard);
            }
        }
    }
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
pub enum RankGpu {
    /// A full UUID the root's (or an intermediate's) driver reported.
    Uuid(String),
    /// The CVD entry the root was started with (index, UUID or prefix), unresolved.
    Entry(String),
}

impl RankGpu {
    pub fn text(&self) -> &str {
        match self {
            RankGpu::Uuid(s) | RankGpu::Entry(s) => s,
        }
    }
}

/// An ancestor that is a rank root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ancestor {
    pub root: RootId,
    pub gpu: RankGpu,
    /// How it was found: a registry record, or its initial environment.
    pub by_record: bool,
}

/// Walk the ancestors of `me` (whose own stat is read through `view` too) for the outermost
/// one that is a rank; None when there is none (then `me` is its own root). The walk ends at
/// the first ancestor with a rank record (its root is the answer) and after the first
/// unguarded one (module doc).
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
            // Its writer's walk covered everything above it: the outermost rank is its root.
            return Some(Ancestor {
                root: rec.root,
                gpu: RankGpu::Uuid(rec.gpu),
                by_record: true,
            });
        }
        match view.environ(ppid) {
            Some(env) if env.guarded => {
                if let Some(entry) = single_entry(env.cvd.as_deref()) {
                    best = Some(Ancestor {
                        root: id,
                        gpu: RankGpu::Entry(entry),
                        by_record: false,
                    });
                }
            }
            // Not guarded and no record: not a rank, and nothing above it is this tree's.
            Some(_) => break,
            // Unreadable (not ours to read, e.g. not dumpable): it cannot be told apart, so
            // the walk passes through it, as it always did.
            None => {}
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

    /// The processes a walk asked about, in order.
    struct Counting<'a> {
        inner: &'a mut Fake,
        environs: Vec<u32>,
        records: Vec<u32>,
    }

    impl ProcView for Counting<'_> {
        fn stat(&mut self, pid: u32) -> Option<Stat> {
            self.inner.stat(pid)
        }
        fn uid(&mut self, pid: u32) -> Option<u32> {
            self.inner.uid(pid)
        }
        fn environ(&mut self, pid: u32) -> Option<EnvFacts> {
            self.environs.push(pid);
            self.inner.environ(pid)
        }
        fn record(&mut self, id: RootId) -> Option<RankRecord> {
            self.records.push(id.pid);
            self.inner.record(id)
        }
    }

    fn counted(f: &mut Fake, me: u32) -> (Option<Ancestor>, Vec<u32>, Vec<u32>) {
        let mut c = Counting {
            inner: f,
            environs: vec![],
            records: vec![],
        };
        let a = find(me, 0, &mut c);
        (a, c.environs, c.records)
    }

    #[test]
    fn the_walk_reads_only_the_guarded_part_of_the_tree() {
        // init <- shell (unguarded) <- 8 guarded processes with no CVD <- the process
        let mut f = node();
        let mut parent = 10;
        for i in 0..8 {
            let pid = 100 + i;
            f.add(pid, parent, 1000 + u64::from(i), Some(("", true)));
            parent = pid;
        }
        f.add(200, parent, 2000, Some(("0", true)));
        // every guarded ancestor's environment once, then the shell's, then nothing above
        let (a, environs, records) = counted(&mut f, 200);
        assert_eq!(a, None);
        let mut want: Vec<u32> = (100..108).rev().collect();
        want.push(10);
        assert_eq!(environs, want);
        assert_eq!(records, want);
        // a record ends the walk: its writer's root, nothing above it read
        let w = RootId {
            pid: 107,
            start: 1007,
        };
        let far = RootId { pid: 5, start: 50 };
        f.records.insert(
            w,
            RankRecord {
                root: far,
                gpu: "GPU-12".into(),
            },
        );
        let (a, environs, records) = counted(&mut f, 200);
        assert_eq!(
            a,
            Some(Ancestor {
                root: far,
                gpu: RankGpu::Uuid("GPU-12".into()),
                by_record: true
            })
        );
        assert_eq!((environs, records), (vec![], vec![107]));
    }

    #[test]
    fn an_environment_read_in_pieces_scans_as_a_whole() {
        let env = b"A=1\0LD_PRELOAD=/x/librankguard.so\0PAD=xxxxxxxx\0CUDA_VISIBLE_DEVICES=3\0CUDA_VISIBLE_DEVICES=4\0Z=9";
        let whole = scan_environ(env);
        assert_eq!(
            whole,
            EnvFacts {
                cvd: Some("3".into()),
                guarded: true
            }
        );
        for piece in 1..env.len() {
            let mut scan = EnvScan::default();
            let mut carry: Vec<u8> = vec![];
            for chunk in env.chunks(piece) {
                carry.extend_from_slice(chunk);
                let used = scan.feed(&carry, false);
                carry.drain(..used);
            }
            scan.feed(&carry, true);
            assert_eq!(scan.facts, whole, "pieces of {piece}");
        }
        // both seen: done, the rest is not looked at
        let mut scan = EnvScan::default();
        let used = scan.feed(
            b"LD_PRELOAD=librankguard.so\0CUDA_VISIBLE_DEVICES=1\0CUDA_VISIB",
            false,
        );
        assert!(scan.done() && used == 60);
        // an LD_PRELOAD without the guard decides it alone: not a rank
        let mut scan = EnvScan::default();
        scan.feed(b"LD_PRELOAD=libx.so\0CUDA_VIS", false);
        assert!(scan.done() && !scan.facts.guarded && scan.facts.cvd.is_none());
        // the guard without a CVD yet: read on
        let mut scan = EnvScan::default();
        scan.feed(b"LD_PRELOAD=librankguard.so\0A=1\0", false);
        assert!(!scan.done());
        // the last entry needs no NUL at the end of the environment
        assert_eq!(
            scan_environ(b"CUDA_VISIBLE_DEVICES=2").cvd.as_deref(),
            Some("2")
        );
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
        assert_eq!(a.gpu, RankGpu::Entry("0".into()));
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
        // an unguarded process with one GPU is outside the contract, and the walk ends
        // there: the guarded learner above it is not this tree's rank (whoever starts a
        // process without the guard is outside the contract already)
        f.add(70, 20, 700, Some(("5", false)))
            .add(71, 70, 710, Some(("5", true)));
        assert_eq!(find(71, 0, &mut f), None);
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
            (w, RankGpu::Uuid("GPU-12".into()), true)
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
        assert_eq!((a.root, a.gpu), (wrap, RankGpu::Uuid("GPU-10".into())));
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
