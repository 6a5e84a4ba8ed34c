//! One-time set-up that a forked child can never wait on forever.
//!
//! `once_cell`/`std::sync::Once` park a second caller until the first one finishes. In a
//! child forked while another thread of the parent was inside the set-up, that thread does
//! not exist: the child's first call parks forever (issue 14, item 2). Here the state is one
//! atomic word: `0` not started, [`DONE`], or the pid of the process whose thread is doing
//! the set-up. A caller that finds the set-up in progress under *its own* pid waits (another
//! thread of this process will finish it); one that finds another pid was forked in the
//! middle of it, so it takes the set-up over and does it itself. No lock, no allocation.
//!
//! The same word serves as a fork-safe spin lock ([`PidLock`]) for the short critical
//! sections of the audit and debug sinks.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering};

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
}
