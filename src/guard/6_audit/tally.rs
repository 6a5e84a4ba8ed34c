//! Warn mode at production volume (issue 19): every violation is counted, the first
//! [`FULL_PER_SITE`] per (rule, call, site) in each process are recorded in full, later ones
//! are counted in a fixed lock-free table and written as summary records.
//!
//! - **Key.** A violation from a Python thread is keyed by its innermost Python frame
//!   (`site.rs`: one traceback dump per violation, the cost of a Python site). Otherwise by
//!   the guarded wrapper's return address: when that lies outside the CUDA libraries it *is*
//!   the site, and a repeated violation costs a hash probe and one increment (no syscall,
//!   no allocation, no lock; without the `lock` prefix in the thread that counts the site
//!   first, [`bump`]). A return address inside `libcudart` (the runtime
//!   calling the driver for its caller) is remembered as such, and those violations are
//!   keyed by the first frame outside the CUDA libraries (one bounded unwind each).
//! - **Table.** [`SITES`] slots of atomics, open addressing; a slot is claimed with one
//!   compare-and-swap and never freed. Sites beyond the table are still counted, under one
//!   overflow slot with no site.
//! - **Summaries.** `pending` holds the occurrences not yet written, and `owned` those of
//!   the slot's owner thread ([`bump`]); a writer takes `pending` with `swap(0)` and
//!   `owned`'s growth by compare-and-swap ([`take`]), so a count is written exactly once
//!   whoever writes it. Writers: the process's exit (`atexit`), an `exec*` call
//!   (`exec.rs`), after exit began the violating thread itself, and, every [`INTERVAL_MS`]:
//!   - in a process that has more than one thread at its first counted-only violation
//!     (`num_threads` of `/proc/self/stat`, read without allocating), a flusher thread
//!     started then; a SIGKILL or `_exit` loses at most the last interval;
//!   - in any other process (one thread, or the count unreadable), no thread is ever added
//!     (issue 29, item 9: a thread changes the host, e.g. `unshare(CLONE_NEWUSER)` fails
//!     with EINVAL in a multi-threaded process): a counted violation writes the summaries
//!     itself once an interval has passed ([`late`]; the clock is read at every
//!     [`POLL_EVERY`]-th counted violation, so the summaries are written at most that many
//!     violations after the interval), and a SIGKILL or `_exit` loses what was counted
//!     since the last summary, exit or exec.
//!
//!   The repeated path pays for neither: one load of [`LATE`], as it paid for the exit flag.
//! - **fork.** The child starts with an empty table and no flusher (`pthread_atfork`); the
//!   parent writes what it counted.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use crate::config::Mode;
use crate::guard::audit::decision_record::process_record;
use crate::guard::audit::site::{self, Capture, SITE_MAX};
use crate::guard::output::debug_log;
use crate::guard::process::state;
use crate::guard::sys::signal_safe::{self, StackBuf};
use crate::guard::table::TABLE;
use crate::policy::Rule;
use rankguard_core::record::{Action, AuditRecord, FixedWriter, Summary, FIXED_MAX};
use std::borrow::Cow;

/// Occurrences per (rule, call, site) and process written as full records.
pub const FULL_PER_SITE: u64 = 100;
/// Longest time counted occurrences wait before a summary record.
pub const INTERVAL_MS: u64 = 1000;
/// Distinct sites a process can count separately.
pub const SITES: usize = 512;

const SITE_WORDS: usize = SITE_MAX.div_ceil(8);
const READY: u32 = 1;
/// A return-address slot whose site lies further out: used only to remember that.
const CLASSIFY: u32 = 2;
/// A return-address slot that is the site itself: it counts. Only in processes without
/// Python (a Python thread's site is its Python line, whatever the return address).
const DIRECT: u32 = 4;
/// The slot has had its full records: later occurrences are only counted.
const SATURATED: u32 = 8;

/// One call site's counts (one slot of [`SITE_COUNTS`]). Laid out for the repeated path
/// (`counted_again`): what it reads (`key`, `flags`, `owner`) and the count it bumps come
/// first, in one cache line, and a slot is 512 bytes, so that its index is a shift, not a
/// multiply, on the chain from the return address to the count.
#[repr(C, align(512))]
struct SiteCount {
    key: AtomicU64,
    flags: AtomicU32,
    /// `id << 8 | rule << 1 | deny`.
    meta: AtomicU32,
    /// The thread that counts this slot's repeated violations in [`SiteCount::owned`] (its
    /// thread pointer; 0: none yet). See [`counted_again`].
    owner: AtomicUsize,
    /// Repeated violations counted by `owner` with a plain increment: only that thread
    /// writes it, and it only grows.
    owned: AtomicU64,
    seen: AtomicU64,
    pending: AtomicU64,
    /// How much of `owned` summaries have taken (moved forward by compare-and-swap only).
    owned_taken: AtomicU64,
    /// Time (µs since the epoch) of the last record written for this slot.
    last_us: AtomicU64,
    site_len: AtomicU32,
    site: [AtomicU64; SITE_WORDS],
}

impl SiteCount {
    const fn new() -> SiteCount {
        SiteCount {
            key: AtomicU64::new(0),
            flags: AtomicU32::new(0),
            meta: AtomicU32::new(0),
            seen: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            owner: AtomicUsize::new(0),
            owned: AtomicU64::new(0),
            owned_taken: AtomicU64::new(0),
            last_us: AtomicU64::new(0),
            site_len: AtomicU32::new(0),
            site: [const { AtomicU64::new(0) }; SITE_WORDS],
        }
    }

    fn reset(&self) {
        self.key.store(0, Ordering::Relaxed);
        self.flags.store(0, Ordering::Relaxed);
        self.meta.store(0, Ordering::Relaxed);
        self.seen.store(0, Ordering::Relaxed);
        self.pending.store(0, Ordering::Relaxed);
        self.owner.store(0, Ordering::Relaxed);
        self.owned.store(0, Ordering::Relaxed);
        self.owned_taken.store(0, Ordering::Relaxed);
        self.last_us.store(0, Ordering::Relaxed);
        self.site_len.store(0, Ordering::Relaxed);
    }

    fn set_site(&self, text: &[u8]) {
        let n = text.len().min(SITE_MAX);
        for (i, w) in self.site.iter().enumerate() {
            let mut b = [0u8; 8];
            for (j, x) in b.iter_mut().enumerate() {
                if let Some(&c) = text[..n].get(i * 8 + j) {
                    *x = c;
                }
            }
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        self.site_len.store(n as u32, Ordering::Relaxed);
    }

    fn site_into(&self, out: &mut StackBuf<SITE_MAX>) {
        let n = self.site_len.load(Ordering::Relaxed) as usize;
        let mut bytes = [0u8; SITE_WORDS * 8];
        for (i, w) in self.site.iter().enumerate() {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        out.push_bytes(&bytes[..n.min(SITE_MAX)]);
    }
}

static SITE_COUNTS: [SiteCount; SITES] = [const { SiteCount::new() }; SITES];
/// Sites that found the table full: counted here, summarised with no site.
static OVERFLOW: SiteCount = SiteCount::new();

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The mode for the repeated path: 1 warn, 2 enforce, 0 anything else (set at activation;
/// the mode never changes in a process).
static FAST_MODE: AtomicU8 = AtomicU8::new(0);
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
/// 0: no flusher in this process; 1: started (or not needed).
static FLUSHER: AtomicU8 = AtomicU8::new(0);
static EXITING: AtomicBool = AtomicBool::new(false);
/// What a counted violation must do after counting, one load on the repeated path:
/// [`LATE_EXIT`] (exit began: write this slot now) and [`LATE_POLL`] (no flusher thread:
/// write the summaries when an interval has passed).
static LATE: AtomicU8 = AtomicU8::new(0);
const LATE_EXIT: u8 = 1;
const LATE_POLL: u8 = 2;
/// When the summaries were last written in a process without a flusher thread
/// ([`signal_safe::coarse_us`]).
static POLLED_US: AtomicU64 = AtomicU64::new(0);
/// Counted violations [`late`] has seen in a process without a flusher thread; the clock
/// is read at every [`POLL_EVERY`]-th.
static POLL_TICK: AtomicU32 = AtomicU32::new(0);
const POLL_EVERY: u32 = 64;
static FLUSH_LOCK: AtomicBool = AtomicBool::new(false);

const TAG_RA: u64 = 1;
const TAG_IP: u64 = 2;
const TAG_PY: u64 = 3;
const TAG_NONE: u64 = 4;

/// What the engine does with one violation.
pub enum Occ {
    /// Counted; a summary record will carry it. Nothing else to do.
    Counted,
    /// Write the full record (and the stderr line when `first`).
    Full { first: bool, cap: Capture },
}

// A rule is kept as its number (the core's `Rule::number`, 1..=4: 7 bits of `meta`).
fn rule_code(r: Rule) -> u32 {
    u32::from(r.number())
}

/// The inverse of [`rule_code`]: both are the core's one numbering (`Rule::ALL`, an array
/// of one-byte values, no pointers: nothing relocated at load, `test_startup_cost.py`). A
/// code is only ever one that `rule_code` wrote.
fn rule_of(code: u32) -> Rule {
    u8::try_from(code)
        .ok()
        .and_then(Rule::from_number)
        .unwrap_or(Rule::R4)
}

/// The key of (meta, tag, value): a bijection of `value` for each (meta, tag) (odd
/// multipliers, xor-shift), a few instructions on the repeated path; never 0 (0 marks an
/// empty slot).
#[inline(always)]
fn key(meta: u32, tag: u64, value: u64) -> u64 {
    let m = value.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut h = m ^ (u64::from(meta) << 3 | tag).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    h ^= h >> 31;
    // The low bits, which index the table, are the product's top bits: they depend on
    // every bit of `value` (a return address), and the index is then one shift of one
    // multiply from it, the shortest chain from the return address to the slot's load on
    // the repeated path. The rest mixes in `meta` and `tag`: two sites alike in the index
    // are told apart by the whole key, and found by probing (`find`).
    let index = m >> (64 - SITES.trailing_zeros());
    // Never 0 (an empty slot's key) by its top bit: one `or`, where a test for 0 took
    // three instructions of the repeated path.
    (h & !(SITES as u64 - 1)) | index | 1 << 63
}

fn hash_bytes(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The slot of `key`, if present.
#[inline]
fn find(key: u64) -> Option<&'static SiteCount> {
    let start = key as usize;
    for i in 0..SITES {
        let s = &SITE_COUNTS[(start.wrapping_add(i)) & (SITES - 1)];
        match s.key.load(Ordering::Acquire) {
            k if k == key => return Some(s),
            0 => return None,
            _ => {}
        }
    }
    None
}

/// The slot of `key`, claiming an empty one; `true` when this call claimed it.
fn find_or_claim(key: u64) -> (&'static SiteCount, bool) {
    let start = key as usize;
    for i in 0..SITES {
        let s = &SITE_COUNTS[(start.wrapping_add(i)) & (SITES - 1)];
        loop {
            match s.key.load(Ordering::Acquire) {
                k if k == key => return (s, false),
                0 => {
                    if s.key
                        .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return (s, true);
                    }
                    // Someone claimed it meanwhile: look at what they put there.
                }
                _ => break,
            }
        }
    }
    (&OVERFLOW, false)
}

fn meta_of(id: usize, rule: Rule, deny: bool) -> u32 {
    (id as u32) << 8 | rule_code(rule) << 1 | u32::from(deny)
}

/// The repeated path of a process without Python: a violation from a return address that
/// is its own site and has had its full records. Counted with one increment ([`bump`]); false
/// when it is not such a violation (the caller then takes [`occurrence`]).
/// (A DIRECT slot exists only in a process without Python, and only once activated; a
/// fork child's table is empty.) Always inlined: `gate!` marks the violation branch cold,
/// and LLVM does not inline a plain `#[inline]` function into a cold block.
#[inline(always)]
pub fn counted_again(id: usize, rule: Rule, ra: usize) -> Option<bool> {
    // The mode of the process, as activation saw it: 1 warn, 2 enforce, else not here.
    let deny = match FAST_MODE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => return None,
    };
    let k = key(meta_of(id, rule, deny), TAG_RA, ra as u64);
    // First probe inline; a collision walks the table out of line.
    let first = &SITE_COUNTS[k as usize & (SITES - 1)];
    let slot = if first.key.load(Ordering::Acquire) == k {
        first
    } else {
        find(k)?
    };
    if slot.flags.load(Ordering::Relaxed) & (DIRECT | SATURATED) != DIRECT | SATURATED {
        return None;
    }
    bump(slot);
    after_bump(slot);
    Some(deny)
}

/// Count one repeated violation. The first thread to count a slot owns it: it counts in
/// `owned` with one increment without the `lock` prefix, which the CPU need not serialise
/// (a `lock add` alone took 6.1 ns on an Intel Xeon, more than the allowed call's 3.7 ns:
/// docs/benchmarks.md, "A repeated violation without a locked increment"). Every other
/// thread counts in `pending` with an atomic increment, as before. Nothing is lost: only
/// the owner writes `owned`, a single instruction that a signal handler on the same thread
/// cannot split, and summaries take its growth by compare-and-swap ([`take`]). A thread is
/// told apart by its thread pointer (`fs:0`), which no two live threads share; a thread
/// that reuses an exited owner's becomes the owner, alone as the exited one was.
#[inline(always)]
fn bump(slot: &SiteCount) {
    #[cfg(target_arch = "x86_64")]
    {
        let tp = thread_pointer();
        let owner = slot.owner.load(Ordering::Relaxed);
        if owner == tp
            || (owner == 0
                && slot
                    .owner
                    .compare_exchange(0, tp, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok())
        {
            // SAFETY: `owned` is a live, aligned u64 (an AtomicU64 of a static slot). Only
            // the owner thread writes it; one aligned 8-byte `add` is seen whole by other
            // threads' atomic loads (x86-64 guarantees it), so this is a relaxed load and
            // store of the atomic done as one instruction.
            unsafe {
                core::arch::asm!(
                    "add qword ptr [{0}], 1",
                    in(reg) slot.owned.as_ptr(),
                    options(nostack)
                );
            }
            return;
        }
    }
    slot.pending.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's thread pointer: glibc's thread control block starts with its own
/// address, at `fs:0`. Never 0.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads one word at fs:0, which glibc maps for every thread (the TCB's self
    // pointer); no memory is written, no flag changed.
    unsafe {
        core::arch::asm!(
            "mov {}, qword ptr fs:[0]",
            out(reg) tp,
            options(nostack, readonly, preserves_flags, pure)
        );
    }
    tp
}

/// What the owner counted that no summary has taken yet, taken: `owned_taken` only moves
/// forward, by compare-and-swap, so each count is taken once whoever takes it.
fn take(slot: &SiteCount) -> u64 {
    let mut taken = slot.owned_taken.load(Ordering::Acquire);
    loop {
        let now = slot.owned.load(Ordering::Acquire);
        if now <= taken {
            return 0;
        }
        match slot
            .owned_taken
            .compare_exchange(taken, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return now - taken,
            Err(t) => taken = t,
        }
    }
}

/// Count one violation of entry `id` and decide whether it gets a full record.
/// `ra`: the wrapper's return address (0: unknown).
pub fn occurrence(id: usize, rule: Rule, deny: bool, ra: usize) -> Occ {
    activate();
    let meta = meta_of(id, rule, deny);
    if let Some(t) = site::python_thread() {
        let mut s = StackBuf::<SITE_MAX>::new();
        if site::python_site(t, &mut s) {
            let key = key(meta, TAG_PY, hash_bytes(s.as_bytes()));
            let (slot, claimed) = find_or_claim(key);
            if claimed {
                publish(slot, meta, s.as_bytes(), 0);
            }
            return count(slot, || site::capture(Some(t)));
        }
        // A thread of a Python process running no Python code: a native site.
    }
    native(meta, ra)
}

fn native(meta: u32, ra: usize) -> Occ {
    let k0 = key(meta, TAG_RA, ra as u64);
    if ra != 0 && site::no_python() {
        if let Some(slot) = find(k0) {
            if slot.flags.load(Ordering::Acquire) & DIRECT != 0 {
                return count(slot, || site::capture(None));
            }
        }
    }
    // First time at this return address, or one inside the CUDA libraries: unwind.
    let mut ips = [0usize; site::MAX_WALK];
    let n = site::native_ips(&mut ips);
    let site_ip = site::user_frame(&ips[..n]).map_or(0, |i| ips[i]);
    // Keyed by return address only without Python: in a Python process the same return
    // address (ctypes, cuda.bindings) serves every Python line.
    let by_ra = ra != 0 && site::no_python();
    let direct = by_ra && site_ip == ra;
    if by_ra {
        let (slot, claimed) = find_or_claim(k0);
        if claimed {
            if direct {
                let mut t = StackBuf::<{ site::FRAME_MAX }>::new();
                site::describe_ip(&mut t, ra);
                publish(slot, meta, cut(t.as_bytes()), DIRECT);
            } else {
                slot.meta.store(meta, Ordering::Relaxed);
                slot.flags.store(READY | CLASSIFY, Ordering::Release);
            }
        }
        if direct {
            return count(slot, || site::capture(None));
        }
    }
    let key = if site_ip != 0 {
        key(meta, TAG_IP, site_ip as u64)
    } else {
        key(meta, TAG_NONE, 0)
    };
    let (slot, claimed) = find_or_claim(key);
    if claimed {
        let mut t = StackBuf::<{ site::FRAME_MAX }>::new();
        if site_ip != 0 {
            site::describe_ip(&mut t, site_ip);
        }
        publish(slot, meta, cut(t.as_bytes()), 0);
    }
    count(slot, || site::capture(None))
}

fn cut(b: &[u8]) -> &[u8] {
    let mut n = b.len().min(SITE_MAX);
    while n > 0 && n < b.len() && (b[n] & 0xc0) == 0x80 {
        n -= 1;
    }
    &b[..n]
}

fn publish(slot: &SiteCount, meta: u32, site_text: &[u8], flags: u32) {
    slot.meta.store(meta, Ordering::Relaxed);
    slot.set_site(site_text);
    slot.flags.store(READY | flags, Ordering::Release);
}

/// The repeated path: one load and one increment once the site has had its full records.
#[inline]
fn count(slot: &'static SiteCount, capture: impl FnOnce() -> Capture) -> Occ {
    if slot.seen.load(Ordering::Relaxed) < FULL_PER_SITE {
        let n = slot.seen.fetch_add(1, Ordering::Relaxed);
        if n < FULL_PER_SITE {
            let mut cap = capture();
            // The slot's text is the site's name for summaries too: records use the same.
            if slot.flags.load(Ordering::Acquire) & READY != 0 && !std::ptr::eq(slot, &OVERFLOW) {
                let mut s = StackBuf::<SITE_MAX>::new();
                slot.site_into(&mut s);
                if !s.as_bytes().is_empty() {
                    cap.site = Some(String::from_utf8_lossy(s.as_bytes()).into_owned());
                }
            }
            if n + 1 == FULL_PER_SITE {
                slot.last_us.store(now_us(), Ordering::Relaxed);
            }
            return Occ::Full { first: n == 0, cap };
        }
    }
    slot.pending.fetch_add(1, Ordering::Relaxed);
    if slot.flags.load(Ordering::Relaxed) & SATURATED == 0 {
        slot.flags.fetch_or(SATURATED, Ordering::Relaxed);
    }
    after_count(slot);
    Occ::Counted
}

#[inline]
fn after_count(slot: &'static SiteCount) {
    if FLUSHER.load(Ordering::Relaxed) == 0 {
        start_flusher();
    }
    after_bump(slot);
    debug_log::log!(
        Trace,
        "violation counted (site already recorded {FULL_PER_SITE} times) pending={}",
        slot.pending.load(Ordering::Relaxed)
    );
}

fn now_us() -> u64 {
    signal_safe::now_us()
}

/// After a counted violation: what [`LATE`] asks. Always inlined, so that a process without
/// a flusher thread (a single-threaded program: `LATE_POLL` alone) pays its tick in line,
/// a load, an add, a store and a test, and calls out of line ([`late`]) only at every
/// [`POLL_EVERY`]-th violation, to read the clock: the call and its frame had been a sixth
/// of the repeated path (docs/benchmarks.md, "The repeated violation's poll").
/// A plain load and store of the tick: in a process without other threads nothing races,
/// and where threads came later a lost tick only delays a summary.
#[inline(always)]
fn after_bump(slot: &'static SiteCount) {
    let asks = LATE.load(Ordering::SeqCst);
    if asks == 0 {
        return;
    }
    if asks == LATE_POLL {
        let tick = POLL_TICK.load(Ordering::Relaxed).wrapping_add(1);
        POLL_TICK.store(tick, Ordering::Relaxed);
        if !tick.is_multiple_of(POLL_EVERY) {
            return;
        }
    }
    late(slot, asks);
}

/// After a counted violation, when [`LATE`] says so ([`after_bump`] counted the poll's
/// tick): once the exit flush ran (another atexit handler or destructor is violating),
/// write this slot now; in a process without a flusher thread, at every
/// [`POLL_EVERY`]-th counted violation, write every pending summary once an interval has
/// passed since the last time.
#[cold]
#[inline(never)]
fn late(slot: &'static SiteCount, asks: u8) {
    if asks & LATE_EXIT != 0 {
        flush_slot(slot);
    } else if asks & LATE_POLL != 0 {
        // The clock (a few dozen instructions through the vDSO) is read here only.
        let now = signal_safe::coarse_us();
        let last = POLLED_US.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= INTERVAL_MS * 1000
            && POLLED_US
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let _ = std::panic::catch_unwind(flush_all);
        }
    }
}

/// First violation in this process image: register the exit and fork handlers.
#[inline]
fn activate() {
    if ACTIVE.load(Ordering::Acquire) {
        return;
    }
    activate_slow();
}

#[cold]
fn activate_slow() {
    if ACTIVE.swap(true, Ordering::AcqRel) {
        return;
    }
    OWNER_PID.store(signal_safe::pid(), Ordering::Relaxed);
    FAST_MODE.store(
        match state::mode() {
            Mode::Warn => 1,
            Mode::Enforce => 2,
            Mode::Abort | Mode::Off => 0,
        },
        Ordering::Relaxed,
    );
    crate::guard::resolve::exec_real::resolve_all();
    // SAFETY: both handlers are plain extern "C" functions of this library, which is never
    // unloaded once a violation happened in it; they only touch atomics and write(2).
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(after_fork_child));
    }
}

extern "C" fn at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    LATE.fetch_or(LATE_EXIT, Ordering::SeqCst);
    let _ = std::panic::catch_unwind(flush_all);
}

extern "C" fn after_fork_child() {
    for s in SITE_COUNTS.iter() {
        if s.key.load(Ordering::Relaxed) != 0 {
            s.reset();
        }
    }
    OVERFLOW.reset();
    FLUSHER.store(0, Ordering::Relaxed);
    // The child has one thread and no flusher: it decides again at its first count.
    POLL_TICK.store(0, Ordering::Relaxed);
    LATE.fetch_and(!LATE_POLL, Ordering::SeqCst);
    FLUSH_LOCK.store(false, Ordering::Relaxed);
    OWNER_PID.store(signal_safe::pid(), Ordering::Relaxed);
}

/// Before `exec*` replaces this process image: write what is pending. Not in a `vfork`
/// child (it shares the parent's memory and counts), which has another pid.
#[cfg_attr(test, allow(dead_code))]
pub fn before_exec() {
    if !ACTIVE.load(Ordering::Acquire) || OWNER_PID.load(Ordering::Relaxed) != signal_safe::pid() {
        return;
    }
    let _ = std::panic::catch_unwind(flush_all);
}

/// At the first counted-only violation of this process image: how summaries get written
/// every [`INTERVAL_MS`] (the module's notes). A thread only in a process that has more
/// than one already; otherwise, or when the thread cannot be started, the violating calls
/// write them ([`late`]).
#[cold]
fn start_flusher() {
    if FLUSHER.swap(1, Ordering::AcqRel) != 0 {
        return;
    }
    if state::try_get().is_none() || !state::audit_on() {
        return; // nothing to write summaries to
    }
    let threads = signal_safe::thread_count();
    if threads.is_some_and(|n| n > 1) {
        let spawned = std::thread::Builder::new()
            .name("rankguard-flush".into())
            .spawn(|| loop {
                std::thread::sleep(std::time::Duration::from_millis(INTERVAL_MS));
                if EXITING.load(Ordering::SeqCst) {
                    return;
                }
                let _ = std::panic::catch_unwind(flush_all);
            });
        match spawned {
            Ok(_) => return,
            Err(_) => debug_log::log!(
                Warn,
                "cannot start the summary thread: counted violations are written by the violating calls, once an interval has passed, and at exit"
            ),
        }
    } else {
        debug_log::log!(
            Debug,
            "no summary thread in a process with threads={threads:?}: counted violations are written by the violating calls, once an interval has passed, and at exit"
        );
    }
    POLLED_US.store(signal_safe::coarse_us(), Ordering::Relaxed);
    LATE.fetch_or(LATE_POLL, Ordering::SeqCst);
}

fn lock() -> bool {
    for _ in 0..2000 {
        if FLUSH_LOCK
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

/// Write a summary for every slot with pending counts. Serialised, so that the exit path
/// waits for a flusher that took counts and has not written them yet.
fn flush_all() {
    let locked = lock();
    for s in SITE_COUNTS.iter() {
        let f = s.flags.load(Ordering::Acquire);
        if f & READY != 0 && f & CLASSIFY == 0 {
            flush_slot(s);
        }
    }
    flush_slot(&OVERFLOW);
    if locked {
        FLUSH_LOCK.store(false, Ordering::Release);
    }
}

fn flush_slot(s: &SiteCount) {
    if s.pending.load(Ordering::Relaxed) == 0
        && s.owned.load(Ordering::Relaxed) == s.owned_taken.load(Ordering::Relaxed)
    {
        return;
    }
    let Some(st) = state::try_get() else { return };
    if !state::audit_on() {
        s.pending.store(0, Ordering::Relaxed);
        take(s);
        return;
    }
    let meta = s.meta.load(Ordering::Relaxed);
    let d = s.pending.swap(0, Ordering::AcqRel) + take(s);
    if d == 0 {
        return;
    }
    let until = now_us();
    let since = s.last_us.swap(until, Ordering::Relaxed);
    let mut site_text = StackBuf::<SITE_MAX>::new();
    s.site_into(&mut site_text);
    let site_text = std::str::from_utf8(site_text.as_bytes())
        .ok()
        .filter(|t| !t.is_empty());
    let id = (meta >> 8) as usize;
    let e = TABLE.get(id);
    let mut host = [0u8; 64];
    let host = signal_safe::hostname(&mut host);
    let action = if meta & 1 != 0 {
        Action::Deny
    } else {
        Action::Warn
    };
    let mode = if st.inert { Mode::Off } else { st.config.mode };
    let rule = rule_of((meta >> 1) & 0x7f);
    // The same process facts as its full records (the rank root: an atomic load).
    let rec = AuditRecord {
        summary: Some(Summary {
            count: d,
            since_us: (since != 0).then_some(since),
        }),
        site: site_text.map(Cow::Borrowed),
        ..process_record(e, action, rule, mode, until, host, &st.config)
    };
    // A summary has no stacks: it always fits FIXED_MAX (every field is capped).
    let mut buf = [0u8; FIXED_MAX];
    let mut j = FixedWriter::new(&mut buf);
    if rec.write_json(&mut j).is_ok() {
        state::write_audit(j.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0 is an empty slot's key: no site may have it, not even the one whose mix is 0
    /// (meta 0, tag 0, value 0).
    #[test]
    fn no_key_is_an_empty_slots() {
        assert_ne!(key(0, 0, 0), 0);
        for (m, t, v) in [(0, 0, 0), (1, TAG_RA, 0x1000), (7, TAG_PY, u64::MAX)] {
            assert_ne!(key(m, t, v), 0);
        }
    }

    /// The index (the key's low bits) spreads return addresses a few bytes apart, as call
    /// sites in one function are, over the table; the key still tells apart what shares
    /// an index (another rule at the same site).
    #[test]
    fn keys_spread_nearby_return_addresses_and_keep_rules_apart() {
        let slots: std::collections::HashSet<u64> = (0..256u64)
            .map(|i| key(1, TAG_RA, 0x40_1000 + 5 * i) & (SITES as u64 - 1))
            .collect();
        assert!(
            slots.len() > 150,
            "{} distinct slots of 256 sites",
            slots.len()
        );
        let (a, b) = (
            key(1 << 1, TAG_RA, 0x40_1000),
            key(2 << 1, TAG_RA, 0x40_1000),
        );
        assert_eq!(a & (SITES as u64 - 1), b & (SITES as u64 - 1));
        assert_ne!(a, b);
    }

    #[test]
    fn a_rule_survives_its_code_in_a_summary_key() {
        for r in Rule::ALL {
            let meta = meta_of(7, r, true);
            assert_eq!(rule_of((meta >> 1) & 0x7f), r);
        }
    }

    #[test]
    fn keys_are_never_zero_and_differ_by_every_part() {
        let a = key(1, TAG_RA, 0x1000);
        assert_ne!(a, key(1, TAG_RA, 0x1001));
        assert_ne!(a, key(3, TAG_RA, 0x1000));
        assert_ne!(a, key(1, TAG_IP, 0x1000));
        let mut seen = std::collections::HashSet::new();
        for v in 0..100_000u64 {
            let k = key(7, TAG_RA, 0x5555_0000_0000 + v * 5);
            assert_ne!(k, 0);
            assert!(seen.insert(k), "collision at {v}");
        }
    }

    #[test]
    fn slots_keep_their_site_text() {
        let s = SiteCount::new();
        s.set_site("legacy_cfg.py:7 in place_learner".as_bytes());
        let mut b = StackBuf::<SITE_MAX>::new();
        s.site_into(&mut b);
        assert_eq!(b.as_bytes(), b"legacy_cfg.py:7 in place_learner");
        let long = vec![b'x'; SITE_MAX + 50];
        s.set_site(&long);
        let mut b = StackBuf::<SITE_MAX>::new();
        s.site_into(&mut b);
        assert_eq!(b.as_bytes().len(), SITE_MAX);
    }

    #[test]
    fn the_first_n_are_full_then_counted_exactly() {
        let (slot, claimed) = find_or_claim(key(999, TAG_NONE, 0));
        assert!(claimed);
        let (again, claimed) = find_or_claim(key(999, TAG_NONE, 0));
        assert!(std::ptr::eq(slot, again) && !claimed);
        let mut full = 0;
        let mut first = 0;
        for _ in 0..(FULL_PER_SITE + 250) {
            match count(slot, Capture::default) {
                Occ::Full { first: f, .. } => {
                    full += 1;
                    first += u64::from(f);
                }
                Occ::Counted => {}
            }
        }
        assert_eq!((full, first), (FULL_PER_SITE, 1));
        assert_eq!(slot.pending.swap(0, Ordering::Relaxed), 250);
    }

    // The owner's path exists on x86_64 only (`bump`); elsewhere every count is atomic.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn owner_and_other_threads_are_counted_exactly_while_summaries_take() {
        // The first thread to count owns the slot (plain increments), the others count
        // atomically; takers running meanwhile take every count once.
        static S: SiteCount = SiteCount::new();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let taker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut got = 0;
                while !stop.load(Ordering::Relaxed) {
                    got += S.pending.swap(0, Ordering::AcqRel) + take(&S);
                }
                got
            })
        };
        bump(&S);
        assert_eq!(S.owner.load(Ordering::Relaxed), thread_pointer());
        let counters: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..100_000 {
                        bump(&S);
                    }
                })
            })
            .collect();
        for _ in 0..100_000 {
            bump(&S);
        }
        for c in counters {
            c.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let taken = taker.join().unwrap();
        let left = S.pending.swap(0, Ordering::AcqRel) + take(&S);
        assert_eq!(taken + left, 500_001);
        assert!(
            S.owned.load(Ordering::Relaxed) >= 100_001,
            "the owner counted elsewhere"
        );
        assert_eq!(take(&S), 0, "a count taken twice");
    }

    #[test]
    fn utf8_cut_stays_on_a_boundary() {
        let t = "é".repeat(SITE_MAX);
        let c = cut(t.as_bytes());
        assert!(std::str::from_utf8(c).is_ok() && c.len() <= SITE_MAX);
    }
}
