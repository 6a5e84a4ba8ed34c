//! The lifecycle map: every kind of process-lifetime state the guard keeps, each with its
//! one meaning after `fork` (docs/design.md §2, "Lifecycle"). All of them are atomics in
//! statics: no allocation of their own and no lock a thread can hold across a fork.
//! [`keep_first`], [`Latch`], [`PerProcess`], [`PidValue`] and [`ForkSafeCell::get`] are
//! async-signal-safe (a load or one compare-and-swap). [`ForkSafeOnce::call`] and
//! [`PidLock::lock`] are not: they wait for another thread of this process, so a signal
//! handler that interrupted the holder and called the same one would wait on itself (no
//! handler of the guard calls them), and `get_or_init`'s closure is the caller's to keep
//! allocation-free where that matters.
//!
//! **The one rule after `fork`.** A child inherits what the parent did to its own memory,
//! which stays true in the child (a set-up done, a value kept, a real function found, an
//! `atexit` handler registered), and does again whatever is *about the process itself*
//! (a line said once per process, a registry swept by it, a value only its pid may use, a
//! lock or a set-up another thread was in the middle of: that thread is not in the child).
//! Which of the two a static is follows from its kind:
//!
//! | kind | holds | a fork child |
//! | --- | --- | --- |
//! | [`ForkSafeOnce`] | a one-time set-up: not started, done, or the pid doing it | keeps "done"; takes over one left in progress |
//! | [`ForkSafeCell`] | a value set once, read lock-free | keeps the value; takes over a write left in progress |
//! | [`keep_first`] on an `AtomicPtr` | a value recorded unless one is (a real function) | keeps it |
//! | [`Latch`] | done once per process image (an `atexit` registration) | keeps it: the child inherits what it did |
//! | [`PerProcess`] | said or done once per process: the pid that did it | does it once again (another pid) |
//! | [`PidValue`] | a value only the pid that computed it may use (its start time) | computes its own |
//! | [`PidLock`] | a short critical section's holder | never waits on the parent's holder |
//!
//! Two kinds are kept by their owners, as their data needs: the tally's counters are
//! emptied in the child by its `pthread_atfork` handler (`audit::tally`, the child counts
//! its own violations), and the pool table of `decide::reach` is inherited (a pool the
//! parent created is the child's to use too). The IPC registry's caches (`registry::Known`,
//! `registry::RecentlyAlive`, in the core crate) are keyed by pid like [`PidValue`]: each
//! entry names the record's writer or the process that asked, so a child never uses its
//! parent's. Plain atomics elsewhere are facts the process
//! learned (a mode, a rank handed down, a Python symbol found), inherited as they are.
//! Two short locks are kept by their owners too: `elfsym`'s cache of one object's symbols,
//! taken only with `try_lock`, and the tally's `FLUSH_LOCK`, a bounded spin that its
//! `pthread_atfork` child handler releases.
//!
//! `once_cell`/`std::sync::Once` park a second caller until the first one finishes. In a
//! child forked while another thread of the parent was inside the set-up, that thread does
//! not exist: the child's first call parks forever (issue 14, item 2). Here the state is one
//! atomic word: `0` not started, [`DONE`], or the pid of the process whose thread is doing
//! the set-up. A caller that finds the set-up in progress under *its own* pid waits (another
//! thread of this process will finish it); one that finds another pid was forked in the
//! middle of it, so it takes the set-up over and does it itself.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::guard::sys::signal_safe;

const DONE: u32 = u32::MAX;

/// Wait a little for another thread of this process (yield first, then sleep 50 us).
fn pause(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    } else {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 50_000,
        };
        // SAFETY: `ts` is a valid timespec; a null remainder pointer is allowed.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

/// A one-time set-up (see the module documentation).
pub struct ForkSafeOnce {
    state: AtomicU32,
}

impl ForkSafeOnce {
    pub const fn new() -> Self {
        ForkSafeOnce {
            state: AtomicU32::new(0),
        }
    }

    #[inline]
    pub fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    /// Whether the set-up is done, after waiting while another thread of this process is
    /// doing it. False, without waiting, when it was not started (or was left in progress
    /// by a process this one was forked from), and when `runner()` says the caller is the
    /// thread doing it.
    pub fn settled(&self, runner: impl Fn() -> bool) -> bool {
        let me = signal_safe::pid();
        let mut spins = 0;
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s == DONE {
                return true;
            }
            if s != me || runner() {
                return false;
            }
            pause(&mut spins);
        }
    }

    /// Run `f` unless the set-up is done: exactly one thread of this process runs it, the
    /// others wait for it; a child forked in the middle of a parent's run runs it again.
    pub fn call(&self, f: impl FnOnce()) {
        if self.claim() {
            f();
            self.state.store(DONE, Ordering::Release);
        }
    }

    /// True when the caller must do the set-up; false when it is done.
    fn claim(&self) -> bool {
        let me = signal_safe::pid();
        let mut spins = 0;
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s == DONE {
                return false;
            }
            if s == me {
                // Another thread of this process is doing it.
                pause(&mut spins);
                continue;
            }
            // Not started, or started by a process we were forked from (its thread is not
            // here): take it over.
            if self
                .state
                .compare_exchange(s, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
        }
    }
}

/// A spin lock for short critical sections that a forked child can never find held by a
/// thread that does not exist (the word holds the holder's pid; a stale holder is ignored).
pub struct PidLock {
    holder: AtomicU32,
}

pub struct PidGuard<'a>(&'a PidLock);

impl Drop for PidGuard<'_> {
    fn drop(&mut self) {
        self.0.holder.store(0, Ordering::Release);
    }
}

impl PidLock {
    pub const fn new() -> Self {
        PidLock {
            holder: AtomicU32::new(0),
        }
    }

    pub fn lock(&self) -> PidGuard<'_> {
        let me = signal_safe::pid();
        let mut spins = 0;
        loop {
            let s = self.holder.load(Ordering::Acquire);
            if s != me
                && self
                    .holder
                    .compare_exchange(s, me, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                // `s` was 0, or a holder in the process we were forked from.
                return PidGuard(self);
            }
            if s == me {
                pause(&mut spins);
            }
        }
    }
}

/// A value set once, read lock-free afterwards, built on [`ForkSafeOnce`]: the fork-safe
/// replacement of `once_cell::sync::OnceCell` for the guard's per-process state.
pub struct ForkSafeCell<T> {
    once: ForkSafeOnce,
    value: std::cell::UnsafeCell<std::mem::MaybeUninit<T>>,
}

// SAFETY: the value is written only by the one thread that won `once` (or, after a fork
// mid-write, by the child's thread that took it over; the parent's writer does not exist
// in the child), before `once` is published as done with Release ordering; it is read only
// after an Acquire load saw it done, and never written again.
unsafe impl<T: Sync + Send> Sync for ForkSafeCell<T> {}

impl<T> ForkSafeCell<T> {
    pub const fn new() -> Self {
        ForkSafeCell {
            once: ForkSafeOnce::new(),
            value: std::cell::UnsafeCell::new(std::mem::MaybeUninit::uninit()),
        }
    }

    #[inline]
    pub fn get(&self) -> Option<&T> {
        if self.once.is_done() {
            // SAFETY: done means the value was fully written before (see the Sync impl).
            Some(unsafe { (*self.value.get()).assume_init_ref() })
        } else {
            None
        }
    }

    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        // SAFETY: `call` runs the closure in exactly one thread of this process, before
        // the value is published; a half-written value of a parent that forked mid-write
        // is overwritten without being dropped (leaked), never read.
        self.once.call(|| unsafe {
            (*self.value.get()).write(f());
        });
        // SAFETY: `call` returns only after this thread published the value or saw it
        // published (Acquire), so it is fully written.
        unsafe { (*self.value.get()).assume_init_ref() }
    }

    /// Set the value unless it is set already.
    pub fn set(&self, v: T) {
        let _ = self.get_or_init(|| v);
    }
}

/// Record `p` in `slot` unless a value is recorded already; returns the recorded one (the
/// compare-and-swap every "found once, kept" pointer uses). A null `p` records nothing.
#[inline]
pub fn keep_first(slot: &AtomicPtr<c_void>, p: *mut c_void) -> *mut c_void {
    if p.is_null() {
        return slot.load(Ordering::Acquire);
    }
    match slot.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

/// Done once per process image, and inherited by a fork child with what was done (an
/// `atexit` registration is inherited too: doing it again would run the handler twice).
pub struct Latch(AtomicBool);

impl Latch {
    pub const fn new() -> Self {
        Latch(AtomicBool::new(false))
    }

    /// True for the first caller in this image. A load first: asking again is no locked write.
    #[inline]
    pub fn first(&self) -> bool {
        !self.0.load(Ordering::Relaxed) && !self.0.swap(true, Ordering::AcqRel)
    }

    /// Whether a caller has been first (one load; claims nothing).
    #[inline]
    pub fn done(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Said (or done) once per process: the word holds the pid of the process that did it, `0`
/// none. A fork child, another pid, does it once again (its line names its own pid). A
/// `vfork` child shares the parent's memory: what it marks, the parent finds marked by
/// another pid, so the parent does it again rather than never.
pub struct PerProcess(AtomicU32);

impl PerProcess {
    pub const fn new() -> Self {
        PerProcess(AtomicU32::new(0))
    }

    /// True for the first caller in this process: it says (or does) the thing.
    #[inline]
    pub fn first(&self) -> bool {
        self.first_in(signal_safe::pid())
    }

    /// [`first`](Self::first) for a caller that has this process's pid at hand. A load
    /// first: asking again costs no locked write.
    #[inline]
    pub fn first_in(&self, pid: u32) -> bool {
        self.0.load(Ordering::Relaxed) != pid && self.0.swap(pid, Ordering::AcqRel) != pid
    }

    /// Whether process `pid` did it already (claims nothing).
    #[inline]
    pub fn done_in(&self, pid: u32) -> bool {
        self.0.load(Ordering::Acquire) == pid
    }

    /// Whether this process did it; asks for the pid (a system call) only when some
    /// process did.
    #[inline]
    pub fn done_here(&self) -> bool {
        let p = self.0.load(Ordering::Acquire);
        p != 0 && p == signal_safe::pid()
    }

    /// Mark it done by process `pid`, publishing what was written before (Release).
    pub fn mark(&self, pid: u32) {
        self.0.store(pid, Ordering::Release);
    }

    /// Mark it not done (by any process).
    pub fn clear(&self) {
        self.0.store(0, Ordering::Release);
    }

    /// Undo it once, if process `pid` did it: true for the one caller that takes it back.
    pub fn take_in(&self, pid: u32) -> bool {
        pid != 0
            && self
                .0
                .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}

/// A value only the process that computed it may use (its own start time): a fork child
/// computes its own.
pub struct PidValue {
    value: AtomicU64,
    pid: AtomicU32,
}

impl PidValue {
    pub const fn new() -> Self {
        PidValue {
            value: AtomicU64::new(0),
            pid: AtomicU32::new(0),
        }
    }

    /// The value, when process `pid` computed it.
    #[inline]
    pub fn get(&self, pid: u32) -> Option<u64> {
        (self.pid.load(Ordering::Acquire) == pid).then(|| self.value.load(Ordering::Relaxed))
    }

    /// Keep `v` as process `pid`'s value (threads of one process compute the same value).
    pub fn set(&self, pid: u32, v: u64) {
        self.value.store(v, Ordering::Relaxed);
        self.pid.store(pid, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setup_left_in_progress_by_another_process_is_taken_over() {
        let once = ForkSafeOnce::new();
        // What a child forked in the middle of its parent's set-up finds.
        once.state
            .store(signal_safe::pid().wrapping_add(1).max(1), Ordering::Relaxed);
        let mut ran = false;
        once.call(|| ran = true);
        assert!(ran && once.is_done());
        once.call(|| panic!("runs once"));
    }

    #[test]
    fn settled_waits_only_for_another_thread_of_this_process() {
        static ONCE: ForkSafeOnce = ForkSafeOnce::new();
        assert!(!ONCE.settled(|| false), "not started: no wait");
        ONCE.state
            .store(signal_safe::pid().wrapping_add(1).max(1), Ordering::Relaxed);
        assert!(
            !ONCE.settled(|| false),
            "a parent's run, left by a fork: no wait"
        );
        ONCE.state.store(signal_safe::pid(), Ordering::Relaxed);
        assert!(!ONCE.settled(|| true), "the runner itself never waits");
        let waiter = std::thread::spawn(|| ONCE.settled(|| false));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !waiter.is_finished(),
            "another thread's run in progress: it waits"
        );
        ONCE.state.store(DONE, Ordering::Release);
        assert!(waiter.join().unwrap());
    }

    #[test]
    fn a_lock_held_by_another_process_is_taken_over() {
        let lock = PidLock::new();
        lock.holder
            .store(signal_safe::pid().wrapping_add(1).max(1), Ordering::Relaxed);
        drop(lock.lock());
        assert_eq!(lock.holder.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn cells_are_set_once_across_threads() {
        static CELL: ForkSafeCell<u32> = ForkSafeCell::new();
        let hs: Vec<_> = (0..8)
            .map(|i| std::thread::spawn(move || *CELL.get_or_init(|| i)))
            .collect();
        let vals: Vec<u32> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(vals.iter().all(|&v| v == vals[0]));
        CELL.set(99);
        assert_eq!(CELL.get(), Some(&vals[0]));
    }

    #[test]
    fn per_process_is_once_per_pid_and_rearms_in_another() {
        let said = PerProcess::new();
        let me = signal_safe::pid();
        assert!(said.first() && !said.first() && !said.first_in(me));
        assert!(said.done_in(me));
        let child = me.wrapping_add(1).max(1);
        assert!(
            said.first_in(child),
            "a fork child (another pid) says it again"
        );
        assert!(!said.first_in(child));
        assert!(!said.take_in(me) && said.take_in(child) && !said.take_in(child));
        said.mark(me);
        assert!(said.done_in(me));
        said.clear();
        assert!(!said.done_in(me));
    }

    #[test]
    fn latches_and_kept_values() {
        let l = Latch::new();
        assert!(l.first() && !l.first());
        let slot = AtomicPtr::new(std::ptr::null_mut());
        let (a, b) = (8usize as *mut c_void, 16usize as *mut c_void);
        assert!(keep_first(&slot, std::ptr::null_mut()).is_null());
        assert_eq!(keep_first(&slot, a), a);
        assert_eq!(keep_first(&slot, b), a, "the first value is kept");
        let v = PidValue::new();
        assert_eq!(v.get(7), None);
        v.set(7, 42);
        assert_eq!((v.get(7), v.get(8)), (Some(42), None));
    }
}
