//! The exported events of this process whose provenance records go when the event is
//! destroyed. PyTorch exports a new interprocess event at every share of a CUDA tensor
//! (`torch.multiprocessing`: the producer's stream event), so a long-lived learner writes a
//! record per share; an event handle can be opened only while its event exists, so the
//! record of a destroyed event is dead weight, and kept, such records would fill the
//! registry (65,536) and turn a long job's later exports into lost records (docs/design.md,
//! "The provenance registry's bounds").
//!
//! A fixed table of atomics, as `reach.rs` keeps pools: no allocation, no lock, safe in a
//! forked child and under re-entry. A slot holds the event (its `CUevent`, which the runtime's
//! `cudaEvent_t` is), the pid of the process that exported it (a forked child's events are
//! its own: it never takes its parent's slots) and the handle's 64 bytes, from which the
//! record's name is derived again. An event that finds no free slot among its
//! [`PROBES`] keeps its record until its exporter exits (the sweeps).
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Slots in the table: events exported and not yet destroyed, per process.
pub const SLOTS: usize = 1024;
/// Slots looked at from an event's hash (a destroy looks at as many).
pub const PROBES: usize = 16;

/// A slot's event word while its writer or taker owns it.
const BUSY: usize = 1;

struct Slot {
    /// 0: free; BUSY: being written or taken; else the event, its other words published.
    event: AtomicUsize,
    pid: AtomicU32,
    handle: [AtomicU64; 8],
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    event: AtomicUsize::new(0),
    pid: AtomicU32::new(0),
    handle: [const { AtomicU64::new(0) }; 8],
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Whether any event was ever remembered (a destroy in a process that exported none looks
/// at nothing).
static ANY: AtomicUsize = AtomicUsize::new(0);

fn start(event: usize) -> usize {
    // Events are heap pointers: mix the bits above the allocation alignment.
    let h = (event >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h >> (usize::BITS - SLOTS.trailing_zeros())
}

/// Remember that process `pid` exported `event` with `handle`. An event already in the
/// table takes the new handle in its slot: exported again, it is the same; at an address
/// reused after its event went without a destroy the guard saw (its context destroyed),
/// it is the new event's. False when the table had no room.
pub fn remember(event: usize, pid: u32, handle: &[u8; 64]) -> bool {
    if event <= BUSY {
        return false;
    }
    let first = start(event);
    for i in 0..PROBES {
        let s = &TABLE[(first + i) % SLOTS];
        if s.event.load(Ordering::Acquire) == event
            && s.pid.load(Ordering::Relaxed) == pid
            && s.event
                .compare_exchange(event, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            fill(s, event, pid, handle);
            return true;
        }
    }
    for i in 0..PROBES {
        let s = &TABLE[(first + i) % SLOTS];
        if s.event
            .compare_exchange(0, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            fill(s, event, pid, handle);
            ANY.store(1, Ordering::Relaxed);
            return true;
        }
    }
    false
}

/// Whether process `pid` remembered `event` with `handle` (exported it before, and has
/// not destroyed it since): its record was written then.
pub fn holds(event: usize, pid: u32, handle: &[u8; 64]) -> bool {
    if event <= BUSY || !any() {
        return false;
    }
    let first = start(event);
    (0..PROBES).any(|i| {
        let s = &TABLE[(first + i) % SLOTS];
        s.event.load(Ordering::Acquire) == event
            && s.pid.load(Ordering::Relaxed) == pid
            && s.handle
                .iter()
                .zip(handle.chunks_exact(8))
                .all(|(w, c)| w.load(Ordering::Relaxed).to_ne_bytes() == c)
    })
}

/// Write a slot this thread holds BUSY, then publish it.
fn fill(s: &Slot, event: usize, pid: u32, handle: &[u8; 64]) {
    s.pid.store(pid, Ordering::Relaxed);
    for (i, w) in s.handle.iter().enumerate() {
        let mut word = [0u8; 8];
        word.copy_from_slice(&handle[i * 8..i * 8 + 8]);
        w.store(u64::from_ne_bytes(word), Ordering::Relaxed);
    }
    s.event.store(event, Ordering::Release);
}

/// Whether this process (or the one it was forked from) ever remembered an event: where
/// not, a destroy costs one load (not even the `getpid` that [`take`] needs).
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed) != 0
}

/// The handle process `pid` exported `event` with, if it is remembered: the slot is
/// freed (an event is destroyed once).
pub fn take(event: usize, pid: u32) -> Option<[u8; 64]> {
    if event <= BUSY || !any() {
        return None;
    }
    let first = start(event);
    for i in 0..PROBES {
        let s = &TABLE[(first + i) % SLOTS];
        if s.event.load(Ordering::Acquire) != event || s.pid.load(Ordering::Relaxed) != pid {
            continue;
        }
        if s.event
            .compare_exchange(event, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let mut out = [0u8; 64];
        for (w, chunk) in s.handle.iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        s.event.store(0, Ordering::Release);
        return Some(out);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(b: u8) -> [u8; 64] {
        let mut h = [0u8; 64];
        h.iter_mut().enumerate().for_each(|(i, x)| *x = b ^ i as u8);
        h
    }

    /// One test: the table is this process's, and tests run at once in threads.
    #[test]
    fn remembered_events_are_taken_once_and_a_full_neighbourhood_refuses() {
        let ev = 0x7f00_dead_0000;
        assert!(!holds(ev, 41, &handle(1)), "not exported yet");
        assert!(remember(ev, 41, &handle(1)));
        assert!(holds(ev, 41, &handle(1)));
        assert!(!holds(ev, 42, &handle(1)), "another process's");
        assert!(!holds(ev, 41, &handle(2)), "another handle at the address");
        assert!(
            remember(ev, 41, &handle(1)),
            "exported again: the same slot"
        );
        assert_eq!(
            take(ev, 42),
            None,
            "another process's (a forked child's) event"
        );
        assert_eq!(take(ev, 41), Some(handle(1)));
        assert!(!holds(ev, 41, &handle(1)), "destroyed");
        assert_eq!(take(ev, 41), None, "destroyed once");
        // An address reused by a new event after one the guard never saw destroyed.
        assert!(remember(ev, 41, &handle(2)));
        assert!(remember(ev, 41, &handle(3)));
        assert_eq!(take(ev, 41), Some(handle(3)), "the newest event's handle");
        assert_eq!(take(ev, 41), None, "one slot for the address");

        // Events that share a start slot: the first PROBES fit, the next does not.
        let base = 0x5500_0000_0000usize;
        let same: Vec<usize> = (1..)
            .map(|k| base + (k << 4))
            .filter(|&e| start(e) == start(base))
            .take(PROBES + 1)
            .collect();
        for &e in &same[..PROBES] {
            assert!(remember(e, 7, &handle(e as u8)));
        }
        assert!(
            !remember(same[PROBES], 7, &handle(9)),
            "no room within PROBES"
        );
        assert_eq!(take(same[3], 7), Some(handle(same[3] as u8)));
        assert!(
            remember(same[PROBES], 7, &handle(9)),
            "a freed slot is reused"
        );
        for &e in same[..PROBES].iter().chain([&same[PROBES]]) {
            let _ = take(e, 7);
        }
    }

    #[test]
    fn null_and_busy_are_never_events() {
        assert!(!remember(0, 1, &handle(0)));
        assert!(!remember(BUSY, 1, &handle(0)));
        assert_eq!(take(0, 1), None);
    }
}
