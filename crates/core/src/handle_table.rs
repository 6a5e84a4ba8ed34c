//! The handle table: the provenance records of exported 64-byte IPC handles (legacy memory
//! handles, interprocess events, fabric handles, a pool allocation's export data), in fixed
//! slots of one shared file of the registry directory ([`FILE_NAME`]), written and read in
//! place (docs/design.md, "The handle table").
//!
//! PyTorch exports a new interprocess event and the segment's memory handle at every share
//! of a CUDA tensor, and its importer opens both, so a record file per handle cost each
//! share a file created, written and renamed (or `lstat`ed again) by the exporter and two
//! opened and read by the importer: on the round trip's critical path, most of the guard's
//! cost in it (docs/benchmarks.md). Here a handle's record is the same text
//! ([`crate::registry::ProvenanceRecord::render`]) stored in a slot found from the hash of
//! its kind and bytes: the exporter claims a slot and fills it with stores, the importer
//! copies it with loads. The file is mapped once per process; a record that finds no slot
//! (the table full around its hash, a text too long, no usable file) is written as a file,
//! as before, and the look-up reads the table first, then the file.
//!
//! The trust is the record file's: the table is a regular file of this user, mode 0600, in
//! the verified registry directory, and a record read from it is parsed and its exporter
//! checked alive exactly as a file's ([`crate::registry::trust_table_text`]). Another
//! process of the same user can write any slot, as it can write any record file.
//!
//! Concurrency: each slot's first word is its state (owner pid, generation, tag). A writer
//! moves it from empty to WRITING by compare-and-swap, fills the slot, then publishes FULL
//! with a new generation (Release); a reader loads the state (Acquire), copies the slot,
//! and keeps the copy only if the state is unchanged after (a sequence lock: a slot removed
//! and filled again in between has another generation). Every access is an atomic load or
//! store of a word, so a torn copy is detected, never undefined. A writer that died
//! between claim and publish leaves WRITING under its pid: a later writer reclaims the
//! slot of an owner that is no longer alive, as it does a FULL slot left by one.
//!
//! Pure logic over a slice of words; the guard maps the file (`registry_io`), the unit
//! tests use a vector.
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// The table's file in the registry directory (not a record name, so the sweeps leave it
/// alone; `rankguard doctor` counts its slots).
pub const FILE_NAME: &str = "handles.table";
/// Slots in the table (handles exported and not yet gone, on the node, of this user).
pub const SLOTS: usize = 4096;
/// Words of a slot: 512 bytes.
pub const SLOT_WORDS: usize = 64;
/// Words of the header (a page: the magic, the layout).
pub const HEADER_WORDS: usize = 512;
/// Words of the whole file.
pub const WORDS: usize = HEADER_WORDS + SLOTS * SLOT_WORDS;
/// The file's size in bytes (4 KiB + 2 MiB; a tmpfs allocates the pages written).
pub const BYTES: usize = WORDS * 8;
/// Slots looked at from a handle's hash.
pub const PROBES: usize = 16;
/// A slot's words: state, the text's length and the handle's kind (bits 32-39), the
/// handle's 8 words, then the text.
const HANDLE_AT: usize = 2;
const TEXT_AT: usize = HANDLE_AT + 8;
/// The longest record text a slot holds (432 bytes; a record is about 290).
pub const TEXT_MAX: usize = (SLOT_WORDS - TEXT_AT) * 8;
/// The header: "rankguard-handle", then version 1 and the layout.
const MAGIC: [u64; 4] = [
    u64::from_le_bytes(*b"rankguar"),
    u64::from_le_bytes(*b"d-handle"),
    1,
    ((SLOTS as u64) << 16) | SLOT_WORDS as u64,
];
/// Attempts at a consistent copy of a slot being written.
const READ_TRIES: usize = 4;

const TAG: u64 = 0b11;
const EMPTY: u64 = 0;
const WRITING: u64 = 1;
const FULL: u64 = 2;
const GEN_ONE: u64 = 1 << 2;
const GEN_MASK: u64 = ((1 << 30) - 1) << 2;

fn state(pid: u32, gen_of: u64, tag: u64) -> u64 {
    (u64::from(pid) << 32) | (gen_of.wrapping_add(GEN_ONE) & GEN_MASK) | tag
}

fn owner(s: u64) -> u32 {
    (s >> 32) as u32
}

/// Why a file is not a table the guard uses, from its type, owner, mode and size (`me`:
/// this user), or None: a regular file of this user, not writable by group or others, of
/// [`BYTES`] or of none yet (a table being created, which its opener allocates). The guard
/// checks the file it opens with this, and `rankguard doctor` the file it reads.
pub fn file_problem(regular: bool, uid: u32, mode: u32, size: u64, me: u32) -> Option<String> {
    if !regular {
        return Some("not a regular file".to_string());
    }
    if uid != me || mode & 0o022 != 0 {
        return Some(format!(
            "owned by uid {uid} with mode {:04o}",
            mode & 0o7777
        ));
    }
    (size != 0 && size != BYTES as u64).then(|| format!("{size} bytes, not {BYTES}"))
}

/// What a record is keyed by: the handle's 64 bytes and its kind, a tag the caller chooses
/// (a memory handle and an event handle of the same bytes are two handles).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Handle {
    pub kind: u8,
    pub bytes: [u8; 64],
}

/// A slot's second word: the text's length and the handle's kind.
fn len_word(kind: u8, len: usize) -> u64 {
    (u64::from(kind) << 32) | len as u64
}

/// The table over the file's words.
#[derive(Clone, Copy)]
pub struct HandleTable<'a> {
    words: &'a [AtomicU64],
}

/// A record read from the table: where, the state it was read under, and its text.
pub struct Found {
    pub slot: usize,
    state: u64,
    /// The exporter that wrote it (the slot's owner).
    pub owner: u32,
    len: usize,
    text: [u8; TEXT_MAX],
}

impl Found {
    pub fn text(&self) -> &[u8] {
        self.text.get(..self.len).unwrap_or(&[])
    }
}

impl<'a> HandleTable<'a> {
    /// The table over `words`, its header written if the file is new (all zero) and checked
    /// otherwise; None for a file of another size or layout.
    pub fn new(words: &'a [AtomicU64]) -> Option<HandleTable<'a>> {
        if words.len() != WORDS {
            return None;
        }
        for (w, &m) in words.iter().zip(MAGIC.iter()) {
            // Two processes creating the table race to write the same words.
            match w.compare_exchange(0, m, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {}
                Err(now) if now == m => {}
                Err(_) => return None,
            }
        }
        Some(HandleTable { words })
    }

    /// The table over `words` whose header [`new`](Self::new) wrote or checked before (the
    /// guard's mapping, checked once when it was made): no store to the header, which every
    /// process maps, at each use. None for another length.
    pub fn mapped(words: &'a [AtomicU64]) -> Option<HandleTable<'a>> {
        (words.len() == WORDS).then_some(HandleTable { words })
    }

    /// Slot `i` (modulo [`SLOTS`]); None never happens (`new` checked the length), but an
    /// index that cannot panic keeps a panic location's relocation out of the guard's
    /// loader work (python-tests/test_startup_cost.py).
    fn slot(&self, i: usize) -> Option<&'a [AtomicU64; SLOT_WORDS]> {
        let at = HEADER_WORDS + (i % SLOTS) * SLOT_WORDS;
        self.words
            .get(at..at + SLOT_WORDS)
            .and_then(|s| s.try_into().ok())
    }

    /// The first slot of a handle's probe sequence.
    pub fn start(handle: &Handle) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(handle.kind);
        for c in handle.bytes.chunks_exact(8) {
            let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            h = (h ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
        }
        (h % SLOTS as u64) as usize
    }

    fn same_handle(slot: &[AtomicU64; SLOT_WORDS], handle: &Handle) -> bool {
        (slot[1].load(Ordering::Relaxed) >> 32) as u8 == handle.kind
            && slot[HANDLE_AT..TEXT_AT]
                .iter()
                .zip(handle.bytes.chunks_exact(8))
                .all(|(w, c)| {
                    w.load(Ordering::Relaxed) == u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))
                })
    }

    /// Store `text` as the record of `handle` exported by `pid`; the slot's index, or None
    /// when `text` is too long or the slots from the handle's hash are all taken by live
    /// owners (`alive`; asked only when no slot is empty).
    pub fn insert(
        &self,
        handle: &Handle,
        text: &[u8],
        pid: u32,
        alive: &dyn Fn(u32) -> bool,
    ) -> Option<usize> {
        if text.len() > TEXT_MAX || pid == 0 {
            return None;
        }
        let first = Self::start(handle);
        for reclaim in [false, true] {
            for i in 0..PROBES {
                let at = (first + i) % SLOTS;
                let Some(s) = self.slot(at) else { continue };
                let cur = s[0].load(Ordering::Acquire);
                let free = match cur & TAG {
                    EMPTY => true,
                    _ => reclaim && owner(cur) != pid && !alive(owner(cur)),
                };
                if free
                    && s[0]
                        .compare_exchange(
                            cur,
                            state(pid, cur, WRITING),
                            Ordering::Acquire,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                {
                    self.fill(s, handle, text);
                    let writing = s[0].load(Ordering::Relaxed);
                    s[0].store(state(pid, writing, FULL), Ordering::Release);
                    return Some(at);
                }
            }
        }
        None
    }

    fn fill(&self, s: &[AtomicU64; SLOT_WORDS], handle: &Handle, text: &[u8]) {
        s[1].store(len_word(handle.kind, text.len()), Ordering::Relaxed);
        for (w, c) in s[HANDLE_AT..TEXT_AT]
            .iter()
            .zip(handle.bytes.chunks_exact(8))
        {
            w.store(
                u64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
                Ordering::Relaxed,
            );
        }
        for (w, c) in s[TEXT_AT..].iter().zip(text.chunks(8)) {
            let mut word = [0u8; 8];
            for (b, &x) in word.iter_mut().zip(c) {
                *b = x;
            }
            w.store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
    }

    /// The record of `handle`: a consistent copy of the first FULL slot holding it.
    pub fn find(&self, handle: &Handle) -> Option<Found> {
        let first = Self::start(handle);
        for i in 0..PROBES {
            let at = (first + i) % SLOTS;
            let Some(s) = self.slot(at) else { continue };
            for _ in 0..READ_TRIES {
                let before = s[0].load(Ordering::Acquire);
                if before & TAG != FULL || !Self::same_handle(s, handle) {
                    // Looked at again only if it changed while being compared.
                    if s[0].load(Ordering::Acquire) == before {
                        break;
                    }
                    continue;
                }
                let len = (s[1].load(Ordering::Relaxed) & u64::from(u32::MAX)) as usize;
                let mut text = [0u8; TEXT_MAX];
                for (c, w) in text.chunks_exact_mut(8).zip(&s[TEXT_AT..]) {
                    for (b, x) in c.iter_mut().zip(w.load(Ordering::Relaxed).to_le_bytes()) {
                        *b = x;
                    }
                }
                fence(Ordering::Acquire);
                if s[0].load(Ordering::Relaxed) == before && len <= TEXT_MAX {
                    return Some(Found {
                        slot: at,
                        state: before,
                        owner: owner(before),
                        len,
                        text,
                    });
                }
            }
        }
        None
    }

    /// The slot of `pid`'s own record of `handle`, if any.
    pub fn own(&self, handle: &Handle, pid: u32) -> Option<usize> {
        let first = Self::start(handle);
        (0..PROBES).map(|i| (first + i) % SLOTS).find(|&at| {
            self.slot(at).is_some_and(|s| {
                let cur = s[0].load(Ordering::Acquire);
                cur & TAG == FULL && owner(cur) == pid && Self::same_handle(s, handle)
            })
        })
    }

    /// Empty slot `at` if `pid` owns it and it holds `handle` (an event destroyed: atomics
    /// only, async-signal-safe). True when it was emptied.
    pub fn remove(&self, at: usize, handle: &Handle, pid: u32) -> bool {
        self.empty_owned(at, pid, Some(handle))
    }

    /// Empty slot `at` if `pid` owns a record there (its exporter ending: the slots it
    /// filled, whatever their handles). True when it was emptied.
    pub fn remove_own(&self, at: usize, pid: u32) -> bool {
        self.empty_owned(at, pid, None)
    }

    /// Empty slot `at` if it is a FULL record of `pid` (of `handle`, where given), by a
    /// compare-and-swap from the state those checks read.
    fn empty_owned(&self, at: usize, pid: u32, handle: Option<&Handle>) -> bool {
        let Some(s) = self.slot(at) else {
            return false;
        };
        let cur = s[0].load(Ordering::Acquire);
        cur & TAG == FULL
            && owner(cur) == pid
            && handle.is_none_or(|h| Self::same_handle(s, h))
            && Self::empty_if(s, cur)
    }

    /// Empty slot `s` if its state is still `seen` (a new generation: a reader that copied
    /// it before sees the change). True when it was emptied.
    fn empty_if(s: &[AtomicU64; SLOT_WORDS], seen: u64) -> bool {
        s[0].compare_exchange(
            seen,
            state(0, seen, EMPTY),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    }

    /// Empty the slot a record was found in, unless it changed since (a record not trusted:
    /// its exporter dead or not the process it names).
    pub fn discard(&self, found: &Found) -> bool {
        self.slot(found.slot)
            .is_some_and(|s| Self::empty_if(s, found.state))
    }

    /// Empty every slot whose owner is not alive (`alive`, asked once per run of slots of
    /// one owner), except `me`'s: the records of exporters killed before they could empty
    /// theirs, and the slots of writers that died while writing. A slot that changed since
    /// it was looked at is left. Returns how many were emptied.
    pub fn sweep(&self, me: u32, alive: &dyn Fn(u32) -> bool) -> usize {
        let mut last: Option<(u32, bool)> = None;
        let mut emptied = 0;
        for at in 0..SLOTS {
            let Some(s) = self.slot(at) else { continue };
            let cur = s[0].load(Ordering::Acquire);
            let pid = owner(cur);
            if cur & TAG == EMPTY || pid == me {
                continue;
            }
            let lives = match last {
                Some((p, v)) if p == pid => v,
                _ => {
                    let v = alive(pid);
                    last = Some((pid, v));
                    v
                }
            };
            if !lives && Self::empty_if(s, cur) {
                emptied += 1;
            }
        }
        emptied
    }

    /// The records in the table: (slot, owner) of each FULL slot (reports and tests).
    pub fn occupied(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        (0..SLOTS).filter_map(move |at| {
            let cur = self.slot(at)?[0].load(Ordering::Acquire);
            (cur & TAG == FULL).then_some((at, owner(cur)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words() -> Vec<AtomicU64> {
        (0..WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    fn handle(n: u64) -> Handle {
        let mut bytes = [0u8; 64];
        bytes[..8].copy_from_slice(b"VECF\x2c\x0c\0\0");
        bytes[8..16].copy_from_slice(&n.to_le_bytes());
        Handle { kind: 2, bytes }
    }

    #[test]
    fn a_record_is_found_by_its_handle_and_gone_when_removed() {
        let w = words();
        let t = HandleTable::new(&w).unwrap();
        let text = b"rankguard-ipc-record 1\nkey event-00\nend\n";
        let at = t.insert(&handle(1), text, 42, &|_| true).unwrap();
        let f = t.find(&handle(1)).unwrap();
        assert_eq!((f.slot, f.owner, f.text()), (at, 42, &text[..]));
        assert!(t.find(&handle(2)).is_none());
        assert_eq!(t.own(&handle(1), 42), Some(at));
        assert_eq!(t.own(&handle(1), 43), None);
        assert!(
            !t.remove(at, &handle(1), 43),
            "another pid's record is not removed"
        );
        assert!(!t.remove(at, &handle(2), 42), "nor another handle's");
        assert!(t.remove(at, &handle(1), 42));
        assert!(t.find(&handle(1)).is_none());
        assert_eq!(t.occupied().count(), 0);
        // At its exit an exporter empties the slots it filled, and no other's.
        let a = t.insert(&handle(3), text, 42, &|_| true).unwrap();
        let b = t.insert(&handle(4), text, 43, &|_| true).unwrap();
        assert!(!t.remove_own(b, 42) && t.remove_own(a, 42) && !t.remove_own(a, 42));
        assert_eq!(t.occupied().collect::<Vec<_>>(), vec![(b, 43)]);
    }

    #[test]
    fn a_memory_handle_and_an_event_handle_of_the_same_bytes_are_two_records() {
        let w = words();
        let t = HandleTable::new(&w).unwrap();
        let event = handle(1);
        let mem = Handle { kind: 1, ..event };
        let e = t.insert(&event, b"the event's", 42, &|_| true).unwrap();
        assert!(t.find(&mem).is_none(), "no memory record yet");
        assert_eq!(t.own(&mem, 42), None);
        let m = t.insert(&mem, b"the memory's", 42, &|_| true).unwrap();
        assert_ne!(e, m);
        assert_eq!(t.find(&mem).unwrap().text(), b"the memory's");
        assert_eq!(t.find(&event).unwrap().text(), b"the event's");
        assert!(
            !t.remove(m, &event, 42),
            "the event's removal leaves the memory's record"
        );
        assert!(t.remove(e, &event, 42));
        assert_eq!(t.find(&mem).unwrap().slot, m);
    }

    #[test]
    fn a_sweep_empties_the_slots_of_dead_owners_only() {
        let w = words();
        let t = HandleTable::new(&w).unwrap();
        let dead = t.insert(&handle(1), b"dead's", 50, &|_| true).unwrap();
        let live = t.insert(&handle(2), b"live's", 51, &|_| true).unwrap();
        let mine = t.insert(&handle(3), b"mine", 52, &|_| true).unwrap();
        // A writer that died while writing.
        let torn = t.insert(&handle(4), b"torn", 53, &|_| true).unwrap();
        let s = HEADER_WORDS + torn * SLOT_WORDS;
        let cur = w[s].load(Ordering::Relaxed);
        w[s].store(state(53, cur, WRITING), Ordering::Relaxed);
        let asked = std::cell::RefCell::new(Vec::new());
        let alive = |pid| {
            asked.borrow_mut().push(pid);
            pid == 51
        };
        assert_eq!(t.sweep(52, &alive), 2);
        let mut left: Vec<_> = t.occupied().collect();
        left.sort();
        let mut want = vec![(live, 51), (mine, 52)];
        want.sort();
        assert_eq!(left, want);
        assert!(t.find(&handle(1)).is_none() && dead != live);
        assert!(
            !asked.borrow().contains(&52),
            "its own slots are not asked about"
        );
        assert_eq!(t.sweep(52, &alive), 0);
    }

    #[test]
    fn a_file_is_a_usable_table_only_when_regular_ours_private_and_its_size() {
        let b = BYTES as u64;
        assert_eq!(file_problem(true, 7, 0o100600, b, 7), None);
        assert_eq!(file_problem(true, 7, 0o100644, 0, 7), None, "being created");
        assert_eq!(
            file_problem(false, 7, 0o600, b, 7).as_deref(),
            Some("not a regular file")
        );
        assert_eq!(
            file_problem(true, 8, 0o100600, b, 7).as_deref(),
            Some("owned by uid 8 with mode 0600")
        );
        assert_eq!(
            file_problem(true, 7, 0o100666, b, 7).as_deref(),
            Some("owned by uid 7 with mode 0666")
        );
        assert_eq!(
            file_problem(true, 7, 0o100600, 5, 7),
            Some(format!("5 bytes, not {BYTES}"))
        );
    }

    #[test]
    fn the_header_is_written_once_and_a_foreign_file_is_refused() {
        let w = words();
        assert!(HandleTable::new(&w).is_some());
        assert!(
            HandleTable::new(&w).is_some(),
            "a second opener accepts the same header"
        );
        w[2].store(2, Ordering::Relaxed);
        assert!(HandleTable::new(&w).is_none(), "another version");
        // A mapping checked before is taken as it is, with no store to its header.
        let fresh = words();
        assert!(HandleTable::mapped(&fresh).is_some());
        assert!(fresh[..HEADER_WORDS]
            .iter()
            .all(|x| x.load(Ordering::Relaxed) == 0));
        let short: Vec<AtomicU64> = (0..WORDS - 1).map(|_| AtomicU64::new(0)).collect();
        assert!(HandleTable::new(&short).is_none(), "another size");
    }

    #[test]
    fn a_text_too_long_or_a_full_neighbourhood_goes_to_a_file() {
        let w = words();
        let t = HandleTable::new(&w).unwrap();
        assert!(t
            .insert(&handle(1), &[b'x'; TEXT_MAX + 1], 42, &|_| true)
            .is_none());
        assert!(t
            .insert(&handle(1), &[b'x'; TEXT_MAX], 42, &|_| true)
            .is_some());
        // Fill every slot of one handle's probe sequence with live owners' records.
        let first = HandleTable::start(&handle(7));
        let mut n = 100;
        let mut filled = 0;
        while filled < PROBES {
            n += 1;
            let s = HandleTable::start(&handle(n));
            if (s + SLOTS - first) % SLOTS < PROBES
                && t.insert(&handle(n), b"t", 50, &|_| true).is_some()
            {
                filled = (0..PROBES)
                    .filter(|i| {
                        w[HEADER_WORDS + ((first + i) % SLOTS) * SLOT_WORDS].load(Ordering::Relaxed)
                            & TAG
                            == FULL
                    })
                    .count();
            }
        }
        assert!(
            t.insert(&handle(7), b"t", 42, &|_| true).is_none(),
            "no room among live owners"
        );
        // One of them is a writer that died before it published (WRITING), the rest FULL.
        let w0 = HEADER_WORDS + first * SLOT_WORDS;
        let cur = w[w0].load(Ordering::Relaxed);
        w[w0].store(state(50, cur, WRITING), Ordering::Relaxed);
        // A dead owner's slots are taken back.
        let at = t.insert(&handle(7), b"t", 42, &|pid| pid != 50).unwrap();
        assert_eq!(at, first, "the dead writer's slot first, in probe order");
        assert_eq!(t.find(&handle(7)).unwrap().slot, at);
    }

    #[test]
    fn a_slot_being_written_is_not_read() {
        let w = words();
        let t = HandleTable::new(&w).unwrap();
        let at = t.insert(&handle(1), b"first", 42, &|_| true).unwrap();
        let s = HEADER_WORDS + at * SLOT_WORDS;
        // Another writer holds it (claimed, never published).
        let full = w[s].load(Ordering::Relaxed);
        w[s].store(state(9, full, WRITING), Ordering::Relaxed);
        assert!(
            t.find(&handle(1)).is_none(),
            "a slot being written is no record"
        );
        assert!(t.occupied().next().is_none());
        assert!(
            !t.remove(at, &handle(1), 42),
            "nor removed by the pid that had it"
        );
        w[s].store(full, Ordering::Relaxed);
        assert_eq!(t.find(&handle(1)).unwrap().text(), b"first");
    }

    #[test]
    fn a_record_changed_after_it_was_read_is_not_discarded() {
        let w = words();
        let t = HandleTable::new(&w).unwrap();
        let at = t.insert(&handle(1), b"old", 42, &|_| true).unwrap();
        let f = t.find(&handle(1)).unwrap();
        assert!(t.remove(at, &handle(1), 42));
        let at2 = t.insert(&handle(1), b"new", 43, &|_| true).unwrap();
        assert_eq!(at, at2, "the same slot, a new generation");
        assert!(!t.discard(&f), "the stale copy's state no longer matches");
        assert_eq!(t.find(&handle(1)).unwrap().text(), b"new");
        let f2 = t.find(&handle(1)).unwrap();
        assert!(t.discard(&f2));
        assert!(t.find(&handle(1)).is_none());
    }

    #[test]
    fn generations_wrap_without_touching_the_owner_or_tag() {
        let top = GEN_MASK | FULL | (7u64 << 32);
        let next = state(7, top, FULL);
        assert_eq!((owner(next), next & TAG, next & GEN_MASK), (7, FULL, 0));
    }
}
