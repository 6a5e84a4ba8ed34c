//! The lineage note, guard side (docs/design.md §1, "The lineage note";
//! [`crate::lineage`] has the format and why it can be trusted).
//!
//! Written by the `exec` hooks (`hooks::exec`) and the `posix_spawn` hooks, for the
//! program they start: its parent's facts (pid, start time, whether its initial environment
//! preloads the guard, its initial `CUDA_VISIBLE_DEVICES`), then the note that parent was
//! started with, when it is the parent's own. Everything is on the caller's stack: the
//! hook may run in a `vfork` child (Python's `subprocess`), which shares its parent's
//! memory, so nothing is allocated or locked here, and the only store is of facts true of
//! that parent ([`OWNER_START`]); `errno` is left as it was.
//!
//! Whose facts the start block holds: the process image's, the process that `exec`ed this
//! program ([`IMAGE_PID`], taken at load). A hook in that process itself (`exec` without a
//! fork, `posix_spawn`) or in a child it forked and that has not `exec`ed yet (the usual
//! `fork` + `exec`) knows them; in a grandchild forked twice without an `exec` it does
//! not, and writes no note (the program's walk then reads `/proc`, as without one). The one
//! file read, the owner's stat, is read once per image where the hook shares the owner's
//! memory ([`OWNER_START`]).
//!
//! Read by the rank root's walk (`root_walk`), from this process's own start block.
#![allow(unsafe_code)]

use std::ffi::c_char;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::guard::sys::signal_safe::{self, RawFile};
use crate::guard::sys::start_block;
use crate::lineage::{self, Member, Note, Out, StartDefs};
use crate::rank_root;

/// The pid of the process that `exec`ed this image (set at load; a forked child keeps its
/// parent's value: the image is the same).
static IMAGE_PID: AtomicU32 = AtomicU32::new(0);

/// At load (`decide::narrow`'s constructor): remember whose image this is. One `getpid`,
/// by the instruction (no C library symbol to bind at every start); x86-64 only, where the
/// hooks that read it are.
pub fn at_load() {
    #[cfg(target_arch = "x86_64")]
    IMAGE_PID.store(signal_safe::pid(), Ordering::Relaxed);
}

/// Bytes of the note's entry on the stack (`RANKGUARD_LINEAGE=` and the value).
pub const NOTE_BUF: usize = lineage::MAX_VALUE + 32;
/// Entries of the new environment array on the stack: an environment with more entries
/// gets no note.
pub const ENVP_MAX: usize = 1024;

/// Who the new program's parent is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// `exec*`: this process's image is replaced, its pid and parent kept.
    Exec,
    /// `posix_spawn*`: the new program is a child of this process.
    Spawn,
}

/// The environment array to hand the real `exec`/`posix_spawn`: `envp` without any
/// `RANKGUARD_LINEAGE` entry, with this process's note for the new program; None when no
/// note can be written (the caller passes `envp` as it was).
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings, unchanged while
/// this runs; the array returned points into `entry` and `envp`'s strings.
pub unsafe fn envp_with_note(
    envp: *const *const c_char,
    start: Start,
    entry: &mut [u8; NOTE_BUF],
    array: &mut [MaybeUninit<*const c_char>; ENVP_MAX],
) -> Option<*const *const c_char> {
    // SAFETY: `envp` is null or NULL-terminated (the caller's contract).
    if envp.is_null() || !unsafe { may_walk(envp) } {
        return None;
    }
    // SAFETY: __errno_location always returns this thread's errno, restored below.
    let saved = unsafe { *libc::__errno_location() };
    let note = write_note(start, entry);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
    let note = note?;
    let mut n = 0;
    let mut p = envp;
    loop {
        // SAFETY: `envp` is NULL-terminated (the caller's contract); we stop at its NULL.
        let s = unsafe { *p };
        if s.is_null() {
            break;
        }
        // SAFETY: `s` is a NUL-terminated string; the compare stops at its NUL.
        if !unsafe { is_note(s) } {
            array.get_mut(n)?.write(s);
            n += 1;
        }
        // SAFETY: `s` was not the terminating NULL, so the next element exists.
        p = unsafe { p.add(1) };
    }
    array.get_mut(n)?.write(note.as_ptr().cast());
    array.get_mut(n + 1)?.write(std::ptr::null());
    // The first n + 2 entries are written: the array the real call reads ends at the NULL.
    Some(array.as_ptr().cast())
}

/// Whether a program started with the environment `envp` may walk: it preloads the guard
/// (its first `LD_PRELOAD`, as the walk reads a process's: `rank_root::preloads_guard`) and
/// no variable names its rank (`RANKGUARD_RANK_GPU`, or `RANK`, `SLURM_PROCID`,
/// `OMPI_COMM_WORLD_RANK`, `PMI_RANK` with a plain number: explicit variables win, and the
/// guard walks nothing). Otherwise no note is written: an unguarded program ends the walk
/// of its descendants, and one started by a launcher never walks (one of its descendants
/// started without the variables reads `/proc` above the first note-less process).
///
/// # Safety
/// `envp` is a NULL-terminated array of NUL-terminated strings.
unsafe fn may_walk(envp: *const *const c_char) -> bool {
    let mut guarded = None;
    let mut p = envp;
    loop {
        // SAFETY: `envp` is NULL-terminated; we stop at its NULL.
        let s = unsafe { *p };
        if s.is_null() {
            return guarded == Some(true);
        }
        // SAFETY: `s` is a NUL-terminated string.
        let entry = unsafe { std::ffi::CStr::from_ptr(s) }.to_bytes();
        if let Some(v) = entry.strip_prefix(b"LD_PRELOAD=") {
            guarded
                .get_or_insert_with(|| std::str::from_utf8(v).is_ok_and(rank_root::preloads_guard));
        } else if names_a_rank(entry) {
            return false;
        }
        // SAFETY: `s` was not the terminating NULL, so the next element exists.
        p = unsafe { p.add(1) };
    }
}

/// Whether `entry` (`NAME=value`) is a rank variable the guard's configuration takes.
fn names_a_rank(entry: &[u8]) -> bool {
    rank_root::RANK_MARKS.iter().any(|name| {
        let Some(v) = entry
            .strip_prefix(name.as_bytes())
            .and_then(|r| r.strip_prefix(b"="))
        else {
            return false;
        };
        match name {
            "RANKGUARD_JOB" => false,
            "RANKGUARD_RANK_GPU" => true,
            _ => !v.is_empty() && v.len() <= 9 && v.iter().all(u8::is_ascii_digit),
        }
    })
}

/// Whether the NUL-terminated `s` is a `RANKGUARD_LINEAGE=` entry.
///
/// # Safety
/// `s` is a NUL-terminated string.
unsafe fn is_note(s: *const c_char) -> bool {
    for (i, k) in lineage::VAR.bytes().chain([b'=']).enumerate() {
        // SAFETY: bytes 0..i matched, none of them NUL, so byte i is inside the string or
        // is its NUL.
        if unsafe { *s.add(i) } as u8 != k {
            return false;
        }
    }
    true
}

/// The note's entry in `buf`, NUL-terminated, or None.
fn write_note(start: Start, buf: &mut [u8; NOTE_BUF]) -> Option<&[u8]> {
    let me = signal_safe::pid();
    let image = IMAGE_PID.load(Ordering::Relaxed);
    // The new program's parent, when its facts are this image's (None: `exec` in the image
    // owner itself, whose ancestors the program keeps).
    let parent = match start {
        Start::Spawn if me == image => Some(me),
        Start::Exec if me == image => None,
        Start::Exec if signal_safe::ppid() == image => Some(image),
        _ => return None,
    };
    let block = start_block::at_load()?;
    let defs = lineage::start_defs(block.bytes(), signal_safe::first_nul);
    let uid = signal_safe::euid();
    let own = defs.note.and_then(lineage::parse).filter(|n| n.uid == uid);
    let mut out = Out::new(buf, uid);
    match parent {
        None => {
            let ppid = signal_safe::ppid();
            let own = own.filter(|n| n.first().is_some_and(|m| m.pid == ppid))?;
            out.chain(&own);
        }
        Some(pid) => parent_member(&mut out, pid, me, uid, &defs, own)?,
    }
    out.finish()
}

/// The parent's member, then the rest: its own note when it is the parent's, else `^` its
/// parent. None when its stat cannot be read, is another user's, or it is gone.
fn parent_member(
    out: &mut Out<'_>,
    pid: u32,
    me: u32,
    uid: u32,
    defs: &StartDefs<'_>,
    own: Option<Note<'_>>,
) -> Option<()> {
    let (st, owner) = owner_stat(pid)?;
    if owner != uid || (pid != me && signal_safe::ppid() != pid) {
        return None; // another user's, or it ended while its stat was read
    }
    let guarded = defs.guarded();
    out.member(Member::raw(pid, st.start, guarded, defs.cvd));
    if !guarded {
        return Some(()); // the walk ends at it
    }
    match own.filter(|n| n.first().is_some_and(|m| m.pid == st.ppid)) {
        Some(note) => out.tail(&note),
        None if st.ppid > 0 => out.above(st.ppid),
        None => return None,
    }
    Some(())
}

/// The image owner's start time, parent and effective uid, as its stat said when a hook
/// first read it (start 0: not yet). A hook in the owner itself (`posix_spawn`) or in a
/// `vfork` child (which shares the owner's memory: dash and Python's `subprocess` start
/// commands so) keeps them for the owner's next start, which then reads no file; a forked
/// child's copy goes with it. The facts stay true of the owner: its start never changes, a
/// parent kept after it exited only makes the reader's walk stop there (the parent's pid,
/// if reused, started later), and an owner that changed its uid since forks children of the
/// new one, which then match no kept owner and write no note (their programs read `/proc`).
static OWNER_START: AtomicU64 = AtomicU64::new(0);
static OWNER_PPID: AtomicU32 = AtomicU32::new(0);
static OWNER_UID: AtomicU32 = AtomicU32::new(0);

/// [`OWNER_START`]'s facts of the image owner `pid`, read from its stat when not kept.
fn owner_stat(pid: u32) -> Option<(rank_root::Stat, u32)> {
    let start = OWNER_START.load(Ordering::Acquire);
    if start != 0 {
        let st = rank_root::Stat {
            ppid: OWNER_PPID.load(Ordering::Relaxed),
            start,
        };
        return Some((st, OWNER_UID.load(Ordering::Relaxed)));
    }
    let mut line = [0u8; 1024];
    let (n, owner) = read_stat(pid, &mut line)?;
    let st = rank_root::parse_stat(std::str::from_utf8(line.get(..n)?).ok()?)?;
    if st.start != 0 {
        OWNER_PPID.store(st.ppid, Ordering::Relaxed);
        OWNER_UID.store(owner, Ordering::Relaxed);
        OWNER_START.store(st.start, Ordering::Release);
    }
    Some((st, owner))
}

/// `/proc/<pid>/stat` into `line`, and the file's owner (the process's effective uid), by
/// system calls alone (`signal_safe::RawFile`) on a path built on the stack.
pub(crate) fn read_stat(pid: u32, line: &mut [u8; 1024]) -> Option<(usize, u32)> {
    let mut path = [0u8; 32];
    let mut at = 0;
    let mut put = |bytes: &[u8]| -> Option<()> {
        path.get_mut(at..at + bytes.len())?.copy_from_slice(bytes);
        at += bytes.len();
        Some(())
    };
    put(b"/proc/")?;
    let mut digits = [0u8; 10];
    let mut i = digits.len();
    let mut v = pid;
    loop {
        i -= 1;
        *digits.get_mut(i)? = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    put(digits.get(i..)?)?;
    put(b"/stat")?;
    let mut f = RawFile::open(std::str::from_utf8(path.get(..at)?).ok()?).ok()?;
    let uid = f.owner().ok()?;
    let n = std::io::Read::read(&mut f, line)
        .ok()
        .filter(|&n| n > 0 && n < line.len())?;
    Some((n, uid))
}

/// What this process's start environment defines first: its lineage note (the walk
/// parses it: None when it is not of the form), `CUDA_VISIBLE_DEVICES` and `LD_PRELOAD`.
/// None when the start block is not in memory: the walk then reads `/proc` from the start.
pub fn start_facts() -> Option<StartDefs<'static>> {
    let block = start_block::at_load()?;
    let bytes: &'static [u8] = block.into_bytes();
    Some(lineage::start_defs(bytes, signal_safe::first_nul))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn may_walk_with(entries: &[&str]) -> bool {
        let owned: Vec<CString> = entries.iter().map(|e| CString::new(*e).unwrap()).collect();
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        // SAFETY: a NULL-terminated array of NUL-terminated strings, alive for the call.
        unsafe { may_walk(ptrs.as_ptr()) }
    }

    #[test]
    fn only_a_guarded_program_without_rank_variables_gets_a_note() {
        let guard = "LD_PRELOAD=/opt/rg/librankguard.so";
        assert!(may_walk_with(&["A=1", guard, "CUDA_VISIBLE_DEVICES=0"]));
        assert!(!may_walk_with(&["A=1"]));
        assert!(!may_walk_with(&["LD_PRELOAD=libother.so", guard])); // the first one counts
        for rank in [
            "RANK=0",
            "SLURM_PROCID=12",
            "OMPI_COMM_WORLD_RANK=3",
            "PMI_RANK=1",
            "RANKGUARD_RANK_GPU=",
        ] {
            assert!(!may_walk_with(&[guard, rank]), "{rank}");
        }
        // Not a rank the configuration takes: the program walks.
        for other in [
            "RANK=",
            "RANK=x",
            "RANKGUARD_JOB=j",
            "RANK_X=1",
            "LOCAL_RANK=0",
        ] {
            assert!(may_walk_with(&[guard, other]), "{other}");
        }
    }
}
