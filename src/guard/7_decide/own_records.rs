//! The provenance records this process wrote for its exports, removed when it ends: at
//! `exit` (an `atexit` handler) and before `exec` (`hooks::exec`), like its rank record
//! (`process::root_walk`). An exported handle opens only while its exporter lives (its
//! memory, events and pools go with its contexts), so after the exporter is gone its
//! records are dead weight until a sweep meets them; a learner that shared a thousand
//! tensors would leave a thousand (docs/design.md, "The provenance registry's bounds").
//!
//! A fixed table of atomics, as `event_records` keeps events: no allocation, no lock, safe
//! in a forked child and under re-entry. A slot holds the exporting pid (a forked child
//! never removes its parent's records, nor a `vfork` child, another pid, the parent's) and
//! the record's name: its kind and its identity, the handle's bytes (hex in the name) or
//! the file identity's text. The registry directory is kept once per process in a static
//! buffer. The removal is async-signal-safe: it reads the slots marked in a bitmap, builds
//! each path in a buffer on the stack and `unlink`s it. A record that finds no free slot
//! among its [`PROBES`] stays until a sweep, as before.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::guard::process::registry_io;
use crate::guard::sys::lifecycle::Latch;
use crate::guard::sys::signal_safe;
use crate::handle_table;
use crate::registry::{Key, Kind};

/// Slots in the table: this process's records (more than the 4,200 live exports of
/// `test_ipc.py`'s caching-allocator case).
pub const SLOTS: usize = 8192;
/// Slots looked at from a name's hash. Linear probing clusters: with 32, a process of
/// 4,200 live exports (half the table) found its 32 slots full for one record in about one
/// run in fifty (random names, simulated; `test_ipc.py`'s 4,200-handle case failed so), and
/// that record stayed after its exit; with 64, none in 2,000 simulated runs.
pub const PROBES: usize = 64;
/// The longest registry directory kept (longer ones: the records stay for the sweeps).
const DIR_MAX: usize = 4096;
/// The most identity bytes a slot holds (a 64-byte handle; a file identity's text is
/// shorter).
const IDENT_MAX: usize = 64;

const FREE: u32 = 0;
const BUSY: u32 = 1;
const USED: u32 = 2;

struct Slot {
    /// FREE, BUSY (being written or taken) or USED (its other words published).
    state: AtomicU32,
    pid: AtomicU32,
    /// The kind's index + 1 (bits 0-7), the identity's length in bytes (8-15), whether it
    /// is hex-decoded bytes (bit 16) or text.
    meta: AtomicU32,
    ident: [AtomicU64; IDENT_MAX / 8],
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    state: AtomicU32::new(FREE),
    pid: AtomicU32::new(0),
    meta: AtomicU32::new(0),
    ident: [const { AtomicU64::new(0) }; IDENT_MAX / 8],
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
/// Which slots are USED (or about to be), so the removal at exit reads only those.
static MARKED: [AtomicU64; SLOTS / 64] = [const { AtomicU64::new(0) }; SLOTS / 64];
/// Which slots of the handle table (`rankguard_core::handle_table`) this process image
/// filled: emptied at exit and before exec, where the slot's owner is still this pid (a
/// fork child inherits the bits and empties none of its parent's).
static TABLE_MARKED: [AtomicU64; handle_table::SLOTS / 64] =
    [const { AtomicU64::new(0) }; handle_table::SLOTS / 64];

/// The registry directory of this process's records: the pid whose directory the buffer
/// holds (0: none; `u32::MAX`: being written), its length.
struct DirBuf(UnsafeCell<[u8; DIR_MAX]>);
// SAFETY: the buffer is written only by the thread that moved DIR_PID to WRITING, and read
// only after an Acquire load saw DIR_PID name the reader's pid (published with Release
// after the write).
unsafe impl Sync for DirBuf {}
static DIR: DirBuf = DirBuf(UnsafeCell::new([0; DIR_MAX]));
static DIR_LEN: AtomicUsize = AtomicUsize::new(0);
static DIR_PID: AtomicU32 = AtomicU32::new(0);
const WRITING: u32 = u32::MAX;
/// The `atexit` handler is registered (once per image: a fork child inherits it). Also
/// what [`drop_all`] asks first: where no record was ever remembered (every exec of a
/// guarded process that exported nothing) it costs that one load.
static EXIT_HOOK: Latch = Latch::new();

/// A record's name as a slot holds it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Packed {
    meta: u32,
    ident: [u8; IDENT_MAX],
}

const HEX: u32 = 1 << 16;

fn pack(key: &Key) -> Option<Packed> {
    // A rank record has its own removal (`root_walk`).
    if key.kind() == Kind::Rank {
        return None;
    }
    let kind = u32::from(key.kind().index()) + 1;
    if let Some((bytes, n)) = key.bytes() {
        return Some(Packed {
            meta: kind | ((n as u32) << 8) | HEX,
            ident: bytes,
        });
    }
    let b = key.ident().as_bytes();
    let mut out = [0u8; IDENT_MAX];
    out.get_mut(..b.len())?.copy_from_slice(b);
    Some(Packed {
        meta: kind | ((b.len() as u32) << 8),
        ident: out,
    })
}

fn start(p: &Packed) -> usize {
    // FNV-1a over the name.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in p.meta.to_le_bytes().iter().chain(p.ident.iter()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h >> (64 - SLOTS.trailing_zeros())) as usize
}

fn holds(s: &Slot, pid: u32, p: &Packed) -> bool {
    s.state.load(Ordering::Acquire) == USED
        && s.pid.load(Ordering::Relaxed) == pid
        && s.meta.load(Ordering::Relaxed) == p.meta
        && read_ident(s) == p.ident
}

fn read_ident(s: &Slot) -> [u8; IDENT_MAX] {
    let mut out = [0u8; IDENT_MAX];
    for (w, chunk) in s.ident.iter().zip(out.chunks_exact_mut(8)) {
        chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
    out
}

fn mark(i: usize, on: bool) {
    let bit = 1u64 << (i % 64);
    let word = &MARKED[(i / 64) % MARKED.len()];
    if on {
        word.fetch_or(bit, Ordering::Release);
    } else {
        word.fetch_and(!bit, Ordering::Release);
    }
}

/// Remember that process `pid` wrote the record of `key` in `dir`, so that it goes when the
/// process ends. False when it is not kept (no room, a directory path too long, a rank
/// record): that record stays for the sweeps.
pub fn remember(dir: &std::path::Path, pid: u32, key: &Key) -> bool {
    let Some(p) = pack(key) else {
        return false;
    };
    if !keep_dir(dir, pid) {
        return false;
    }
    let first = start(&p);
    for i in 0..PROBES {
        if holds(&TABLE[(first + i) % SLOTS], pid, &p) {
            return true;
        }
    }
    for i in 0..PROBES {
        let at = (first + i) % SLOTS;
        let s = &TABLE[at];
        if s.state
            .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            s.pid.store(pid, Ordering::Relaxed);
            s.meta.store(p.meta, Ordering::Relaxed);
            for (w, chunk) in s.ident.iter().zip(p.ident.chunks_exact(8)) {
                let mut word = [0u8; 8];
                word.copy_from_slice(chunk);
                w.store(u64::from_ne_bytes(word), Ordering::Relaxed);
            }
            s.state.store(USED, Ordering::Release);
            mark(at, true);
            hook_exit();
            return true;
        }
    }
    false
}

/// Register the removal at exit, once per image.
fn hook_exit() {
    if EXIT_HOOK.first() {
        // SAFETY: `at_exit` is a plain extern "C" function of this library, which stays
        // loaded (it interposes the process's CUDA calls); it calls only atomics, getpid
        // and unlink(2).
        unsafe { libc::atexit(at_exit) };
    }
}

/// Remember that this process filled slot `at` of the handle table, so that the slot is
/// emptied when it ends.
pub fn remember_slot(at: usize) {
    if let Some(w) = TABLE_MARKED.get(at / 64) {
        w.fetch_or(1 << (at % 64), Ordering::Release);
        hook_exit();
    }
}

/// Forget slot `at` of the handle table, emptied by this process (a destroyed event).
pub fn forget_slot(at: usize) {
    if let Some(w) = TABLE_MARKED.get(at / 64) {
        w.fetch_and(!(1 << (at % 64)), Ordering::Release);
    }
}

/// Empty the handle table's slots this process filled (at exit, before exec): atomics
/// only, on a mapping made before. Returns how many it emptied.
fn drop_table_slots(pid: u32) -> usize {
    if TABLE_MARKED.iter().all(|w| w.load(Ordering::Relaxed) == 0) {
        return 0;
    }
    let Some(table) = registry_io::mapped_handle_table() else {
        return 0;
    };
    let mut emptied = 0;
    for (w, word) in TABLE_MARKED.iter().enumerate() {
        let mut bits = word.swap(0, Ordering::AcqRel);
        while bits != 0 {
            let at = w * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if table.remove_own(at, pid) {
                emptied += 1;
            }
        }
    }
    emptied
}

/// Forget the record of `key` that process `pid` removed itself (a destroyed event).
pub fn forget(pid: u32, key: &Key) {
    let Some(p) = pack(key) else {
        return;
    };
    let first = start(&p);
    for i in 0..PROBES {
        let at = (first + i) % SLOTS;
        let s = &TABLE[at];
        if holds(s, pid, &p)
            && s.state
                .compare_exchange(USED, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            mark(at, false);
            s.state.store(FREE, Ordering::Release);
            return;
        }
    }
}

/// Keep `dir` as process `pid`'s registry directory (once per process; a forked child
/// keeps its own). False when it cannot be kept.
fn keep_dir(dir: &std::path::Path, pid: u32) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if DIR_PID.load(Ordering::Acquire) == pid {
        return true;
    }
    let bytes = dir.as_os_str().as_bytes();
    if bytes.len() + 1 >= DIR_MAX || bytes.contains(&0) {
        return false;
    }
    let now = DIR_PID.load(Ordering::Relaxed);
    if now == WRITING
        || DIR_PID
            .compare_exchange(now, WRITING, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        // Another thread of this process is keeping it: this record stays for the sweeps.
        return DIR_PID.load(Ordering::Acquire) == pid;
    }
    // SAFETY: this thread moved DIR_PID to WRITING, so no reader looks at the buffer (see
    // DirBuf) and no other writer writes it.
    let buf = unsafe { &mut *DIR.0.get() };
    if let Some(to) = buf.get_mut(..bytes.len()) {
        to.copy_from_slice(bytes);
    }
    DIR_LEN.store(bytes.len(), Ordering::Relaxed);
    DIR_PID.store(pid, Ordering::Release);
    true
}

extern "C" fn at_exit() {
    drop_all();
}

/// Remove every record this process remembered, now (it exits, or execs a new image).
/// Async-signal-safe: atomics, `getpid` and `unlink`, a path built on the stack; nothing
/// allocated or locked, and no panicking path (no index unchecked). Returns how many it
/// removed.
pub fn drop_all() -> usize {
    if !EXIT_HOOK.done() {
        return 0;
    }
    let pid = signal_safe::pid();
    let emptied = drop_table_slots(pid);
    if MARKED.iter().all(|w| w.load(Ordering::Relaxed) == 0)
        || DIR_PID.load(Ordering::Acquire) != pid
    {
        return emptied;
    }
    let mut path = Path {
        buf: [0u8; DIR_MAX + 16 + 2 * IDENT_MAX],
        len: 0,
    };
    // SAFETY: DIR_PID names this process, so the buffer holds its directory, published
    // with that Release store; nothing writes it while it does (see DirBuf).
    let dir = unsafe { &*DIR.0.get() };
    let Some(dir) = dir.get(..DIR_LEN.load(Ordering::Relaxed)) else {
        return emptied;
    };
    if path.push(dir).and_then(|()| path.push(b"/")).is_none() {
        return emptied;
    }
    let dir_len = path.len;
    let mut removed = emptied;
    for (w, word) in MARKED.iter().enumerate() {
        let mut bits = word.load(Ordering::Acquire);
        while bits != 0 {
            let at = (w * 64 + bits.trailing_zeros() as usize) % SLOTS;
            bits &= bits - 1;
            let s = &TABLE[at];
            if s.pid.load(Ordering::Relaxed) != pid
                || s.state
                    .compare_exchange(USED, BUSY, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let meta = s.meta.load(Ordering::Relaxed);
            let ident = read_ident(s);
            mark(at, false);
            s.state.store(FREE, Ordering::Release);
            path.len = dir_len;
            if name_into(&mut path, meta, &ident).is_none() || path.push(&[0]).is_none() {
                continue;
            }
            // SAFETY: `path.buf` holds a NUL-terminated path (the 0 just pushed).
            if unsafe { libc::unlink(path.buf.as_ptr().cast()) } == 0 {
                removed += 1;
            }
        }
    }
    removed
}

/// A path built on the stack, by pushes that fail (None) past its end.
struct Path<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Path<N> {
    fn push(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.len.checked_add(bytes.len())?;
        self.buf.get_mut(self.len..end)?.copy_from_slice(bytes);
        self.len = end;
        Some(())
    }
}

/// Push `<tag>-<ident>` onto `out`; None for a slot that names no kind, or no room.
fn name_into<const N: usize>(out: &mut Path<N>, meta: u32, ident: &[u8; IDENT_MAX]) -> Option<()> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let kind = Kind::from_index(((meta & 0xff) as u8).checked_sub(1)?)?;
    out.push(kind.as_str().as_bytes())?;
    out.push(b"-")?;
    let ident = ident.get(..((meta >> 8) & 0xff) as usize)?;
    if meta & HEX == 0 {
        return out.push(ident);
    }
    for &b in ident {
        out.push(&[DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]])?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::FileIdent;

    fn name_of(key: &Key) -> String {
        let p = pack(key).expect("packs");
        let mut out = Path {
            buf: [0u8; 16 + 2 * IDENT_MAX],
            len: 0,
        };
        name_into(&mut out, p.meta, &p.ident).expect("names");
        String::from_utf8(out.buf[..out.len].to_vec()).unwrap()
    }

    #[test]
    fn a_packed_name_is_the_records_file_name_again() {
        let handle: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
        for kind in [
            Kind::Mem,
            Kind::Event,
            Kind::Fabric,
            Kind::PoolPtr,
            Kind::PoolFabric,
        ] {
            let k = Key::from_bytes(kind, &handle);
            assert_eq!(name_of(&k), k.file_name());
        }
        let f = FileIdent {
            dev: 0x2a,
            ino: 0xdead_beef_1234,
            regular: true,
            fs_magic: 0,
        };
        for kind in [Kind::VmmFd, Kind::PoolFd, Kind::DmaBuf] {
            let k = Key::from_file(kind, f).unwrap();
            assert_eq!(name_of(&k), k.file_name());
        }
        assert_eq!(pack(&Key::rank(7)), None, "a rank record is root_walk's");
    }

    /// One test: the table is this process's, and tests run at once in threads.
    #[test]
    fn remembered_records_are_removed_once_by_their_own_process() {
        let dir = std::env::temp_dir().join(format!("rg-own-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let keys: Vec<Key> = (0..40u8)
            .map(|i| Key::from_bytes(Kind::Mem, &[i; 64]))
            .collect();
        for k in &keys {
            std::fs::write(dir.join(k.file_name()), "x").unwrap();
            assert!(remember(&dir, me, k));
            assert!(remember(&dir, me, k), "remembered again: the same slot");
        }
        // Another process's (a forked child's) record in the same table is not removed.
        let theirs = Key::from_bytes(Kind::Event, &[0xee; 64]);
        std::fs::write(dir.join(theirs.file_name()), "x").unwrap();
        let saved = DIR_PID.load(Ordering::Relaxed);
        DIR_PID.store(me + 1, Ordering::Relaxed);
        assert!(remember(&dir, me + 1, &theirs));
        DIR_PID.store(saved, Ordering::Relaxed);
        assert!(keep_dir(&dir, me));
        // A record this process removed itself is forgotten.
        forget(me, &keys[0]);
        std::fs::remove_file(dir.join(keys[0].file_name())).unwrap();

        assert_eq!(drop_all(), 39);
        assert_eq!(drop_all(), 0, "removed once");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec![theirs.file_name()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
