//! Primitives the guard can use where fork or signals bite: stack buffers, one-`write`
//! output to a descriptor that never blocks the program for long, `getenv` without std's
//! environment lock, pid/tid/user id/host name, the time, a file read by system calls alone
//! (`RawFile`), and a scratch mapping that is not taken from the allocator. Nothing here
//! allocates or locks.
//!
//! One `write` on an `O_APPEND` descriptor is one record, so many processes appending to
//! one audit file never interleave a line (the record itself: rankguard-core `record`).
#![allow(unsafe_code)]

use std::ffi::{c_char, CStr};
use std::fmt::{self, Write};

/// A truncating `fmt::Write` into a stack array.
pub struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackBuf<N> {
    pub fn new() -> Self {
        StackBuf {
            buf: [0; N],
            len: 0,
        }
    }
    // `get`, not indexing, here and in `push_bytes` (`len` never passes N): an index keeps a
    // panic location, a relocation the loader applies at every process start
    // (docs/benchmarks.md, "What the loader's added instructions are made of").
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
    pub fn remaining(&self) -> usize {
        N - self.len
    }
    /// Keep the first `len` bytes (all of them when there are fewer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    /// Append as much of `bytes` as fits.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.remaining());
        if let (Some(to), Some(from)) = (self.buf.get_mut(self.len..self.len + n), bytes.get(..n)) {
            to.copy_from_slice(from);
        }
        self.len += n;
    }
}

impl<const N: usize> StackBuf<N> {
    /// End the buffer as one line: exactly one trailing newline, even when the text filled
    /// it (then cut, with ` [...]`, before the newline). Values that can be long are written
    /// through [`Mid`], so what follows them (the rule, the fix) fits (issue 29, item 8).
    pub fn end_line(&mut self) {
        if self.as_bytes().ends_with(b"\n") && self.remaining() > 0 {
            return;
        }
        if self.remaining() == 0 {
            let mut keep = N.saturating_sub(CUT.len() + 1);
            while keep > 0 && (self.buf[keep] & 0xc0) == 0x80 {
                keep -= 1;
            }
            self.truncate(keep);
            self.push_bytes(CUT.as_bytes());
        }
        if !self.as_bytes().ends_with(b"\n") {
            self.push_bytes(b"\n");
        }
    }
}

const CUT: &str = " [...]";

/// A value shown whole when it is at most `max` bytes, else its beginning and its end with
/// ` [...] ` between (cut on character boundaries), escaped as `{:?}` escapes (a newline in
/// a value never starts a line of its own): a 2,000-character variable or a long path
/// never pushes the rest of a line (its rule, its fix) out of the line's buffer.
pub struct Mid<'a>(pub &'a str, pub usize);

impl fmt::Display for Mid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (s, max) = (self.0, self.1.max(16));
        if s.len() <= max {
            return write!(f, "{}", s.escape_debug());
        }
        let mut head = max / 2;
        while !s.is_char_boundary(head) {
            head -= 1;
        }
        let mut tail = s.len() - (max - max / 2);
        while !s.is_char_boundary(tail) {
            tail += 1;
        }
        write!(
            f,
            "{} [...] {}",
            // `get`, not indexing: both are character boundaries (the loops above), and
            // indexing would keep a panic's location, relocated at every process start.
            s.get(..head).unwrap_or("").escape_debug(),
            s.get(tail..).unwrap_or("").escape_debug()
        )
    }
}

/// The longest a value is shown in one of the guard's lines ([`Mid`]).
pub const VALUE_MAX: usize = 200;

impl<const N: usize> Write for StackBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_bytes(s.as_bytes());
        Ok(())
    }
}

/// Write all of `bytes` to `fd` (stderr: the program's descriptor, whose blocking mode is
/// not ours to change), retrying on EINTR and short writes, but never waiting more than
/// [`WRITE_WAIT_MS`] in all for it to become writable: a stderr pipe nobody reads loses the
/// line instead of hanging the program. The bound is a deadline on the monotonic clock
/// (`clock_gettime` is async-signal-safe), so signals arriving faster than the bound (a
/// profiler's timer) cannot renew it: each EINTR polls again for what is left, never for a
/// fresh [`WRITE_WAIT_MS`] (issue 29, item 5).
pub fn write_all(fd: i32, mut bytes: &[u8]) {
    let deadline = monotonic_ms().saturating_add(WRITE_WAIT_MS as u64);
    while !bytes.is_empty() {
        let left = deadline.saturating_sub(monotonic_ms());
        if left == 0 {
            return;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: `p` is one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, left.min(WRITE_WAIT_MS as u64) as i32) };
        if r == 0 {
            return;
        }
        if r < 0 {
            // SAFETY: __errno_location always returns a valid thread-local pointer.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return;
        }
        // SAFETY: `bytes` is a live slice; write(2) reads at most `len` bytes from it.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            // SAFETY: __errno_location always returns a valid thread-local pointer.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        // `get`: write(2) never reports more than it was given; an index would keep a panic
        // location, a relocation in every process (as in `StackBuf`).
        bytes = bytes.get(n as usize..).unwrap_or(&[]);
    }
}

/// Milliseconds on the monotonic clock (async-signal-safe).
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The longest [`write_all`] waits for its descriptor to become writable.
pub const WRITE_WAIT_MS: i32 = 2000;

/// The host name, into a stack buffer (as NCCL prints it: up to the first dot).
pub fn hostname(out: &mut [u8; 64]) -> &str {
    if !nodename(out) {
        return "?";
    }
    let end = out.iter().position(|&b| b == 0 || b == b'.').unwrap_or(63);
    std::str::from_utf8(&out[..end]).unwrap_or("?")
}

/// The kernel's node name (what `gethostname` returns), NUL-terminated into `out`, by the
/// `uname` system call itself ([`raw_syscall`]: no C library function to bind at a first
/// `cuInit`). False, as `gethostname` fails, when it does not fit with its NUL.
pub fn nodename(out: &mut [u8]) -> bool {
    // Not zeroed first (a `memset` call of 390 bytes, one more symbol to bind): the kernel
    // writes every field.
    let mut uts = std::mem::MaybeUninit::<libc::utsname>::uninit();
    // SAFETY: uname writes one whole `utsname` into the memory `uts` provides, reads nothing.
    if unsafe { raw_syscall(libc::SYS_uname, uts.as_mut_ptr() as usize, 0, 0, 0) } != 0 {
        return false;
    }
    // SAFETY: a successful uname wrote every byte of the struct.
    let name = unsafe { uts.assume_init() }.nodename.map(|c| c as u8);
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    // `get`, not indexing: no panic location, no relocation (test_startup_cost.py).
    let (Some(dst), Some(src)) = (out.get_mut(..=len), name.get(..len)) else {
        return false;
    };
    for (d, s) in dst.iter_mut().zip(src.iter().chain(std::iter::once(&0))) {
        *d = *s;
    }
    true
}

/// The effective user id, by the system call itself ([`raw_syscall`]).
pub fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { raw_syscall(libc::SYS_geteuid, 0, 0, 0, 0) as u32 }
}

/// A file opened, read and closed by system calls alone ([`raw_syscall`]: `openat`, `read`,
/// `close`), for the walk's `/proc` reads at a first `cuInit`: std's `File` would bind the C
/// library's `open64`, `read` and `close` there, each a look-up through every object of the
/// process, and map the C library's pages that hold them.
pub struct RawFile(i32);

impl RawFile {
    /// `path` opened read-only, close-on-exec; a path of 127 bytes or more is refused
    /// (ENAMETOOLONG: the `/proc` paths it is for are short).
    pub fn open(path: &str) -> std::io::Result<RawFile> {
        let mut c = [0u8; 128];
        let Some(dst) = c.get_mut(..path.len()).filter(|_| path.len() < 127) else {
            return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
        };
        dst.copy_from_slice(path.as_bytes());
        if path.as_bytes().contains(&0) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: `c` is NUL-terminated (zero-filled past the path) and outlives the call.
        let fd = unsafe {
            raw_syscall(
                libc::SYS_openat,
                libc::AT_FDCWD as usize,
                c.as_ptr() as usize,
                (libc::O_RDONLY | libc::O_CLOEXEC) as usize,
                0,
            )
        };
        match i32::try_from(fd) {
            Ok(fd) if fd >= 0 => Ok(RawFile(fd)),
            _ => Err(std::io::Error::from_raw_os_error(-fd as i32)),
        }
    }

    /// The owner of the open file (`fstat`).
    pub fn owner(&self) -> std::io::Result<u32> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes one whole `stat` into the memory `st` provides, for the
        // descriptor this value owns.
        let rc = unsafe {
            raw_syscall(
                libc::SYS_fstat,
                self.0 as usize,
                st.as_mut_ptr() as usize,
                0,
                0,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::from_raw_os_error(-rc as i32));
        }
        // SAFETY: a successful fstat wrote every field.
        Ok(unsafe { st.assume_init() }.st_uid)
    }
}

impl std::io::Read for RawFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // SAFETY: read writes at most `buf.len()` bytes into `buf`, which is ours to write.
        let n = unsafe {
            raw_syscall(
                libc::SYS_read,
                self.0 as usize,
                buf.as_mut_ptr() as usize,
                buf.len(),
                0,
            )
        };
        usize::try_from(n).map_err(|_| std::io::Error::from_raw_os_error(-n as i32))
    }
}

impl Drop for RawFile {
    fn drop(&mut self) {
        // SAFETY: the descriptor `open` returned, owned by this value and closed once.
        unsafe { raw_syscall(libc::SYS_close, self.0 as usize, 0, 0, 0) };
    }
}

/// A system call by the `syscall` instruction itself (x86-64; elsewhere the C library's
/// `syscall`): the kernel's return value, `-errno` on failure (errno is not set). The C
/// library's `getpid` and `syscall` would be two more symbols the loader binds lazily at a
/// first `cuInit`, each a look-up through every object of the process (docs/benchmarks.md,
/// "The twelfth session's run"); the instruction costs what their bodies cost.
///
/// # Safety
/// As for the system call `nr` with these arguments (pointers valid for what it reads and
/// writes).
#[cfg(target_arch = "x86_64")]
pub unsafe fn raw_syscall(nr: libc::c_long, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: the caller's contract; the kernel clobbers rcx and r11 only and reads or
    // writes memory only as the call's arguments say.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") nr as isize => ret,
            in("rdi") a, in("rsi") b, in("rdx") c, in("r10") d,
            out("rcx") _, out("r11") _, options(nostack, preserves_flags));
    }
    ret
}

/// [`raw_syscall`] where there is no `syscall` instruction to use: the C library's.
///
/// # Safety
/// As for the system call `nr` with these arguments.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn raw_syscall(nr: libc::c_long, a: usize, b: usize, c: usize, d: usize) -> isize {
    // SAFETY: the caller's contract.
    match unsafe { libc::syscall(nr, a, b, c, d) } {
        -1 => {
            -(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL) as isize)
        }
        r => r as isize,
    }
}

pub fn pid() -> u32 {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { raw_syscall(libc::SYS_getpid, 0, 0, 0, 0) as u32 }
}

pub fn tid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { raw_syscall(libc::SYS_gettid, 0, 0, 0, 0) as u32 }
}

/// The index of the first NUL in `s` (None: there is none), sixty-four bytes a step with the
/// SSE2 instructions every x86-64 processor has (elsewhere the core crate's safe scan, eight
/// bytes a step): the byte-wise minimum of four sixteen-byte loads is zero where one of them
/// has a NUL, so a step costs one compare and one branch, and the sixteen bytes with the NUL
/// are then found as before. An environment read whole is mostly long values (docs/design.md
/// §1, "The walk's cost"): the first `cuInit` without rank variables scans its own 64 KiB
/// start block and its parent's 64 KiB environment. No C library call (`memchr` would be one
/// more symbol for the loader to bind at every start). Async-signal-safe: it only reads.
#[cfg(target_arch = "x86_64")]
pub fn first_nul(s: &[u8]) -> Option<usize> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8,
        _mm_setzero_si128,
    };
    let mut at = 0;
    while at + 64 <= s.len() {
        // SAFETY: SSE2 is part of x86-64; bytes [at, at + 64) are inside `s` (the loop's
        // condition), read unaligned.
        let mask = unsafe {
            let p = s.as_ptr().add(at).cast::<__m128i>();
            let low = _mm_min_epu8(_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)));
            let high = _mm_min_epu8(_mm_loadu_si128(p.add(2)), _mm_loadu_si128(p.add(3)));
            _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(low, high), _mm_setzero_si128()))
        };
        if mask != 0 {
            break;
        }
        at += 64;
    }
    while at + 16 <= s.len() {
        // SAFETY: as above, bytes [at, at + 16).
        let mask = unsafe {
            let v = _mm_loadu_si128(s.as_ptr().add(at).cast::<__m128i>());
            _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128()))
        };
        if mask != 0 {
            return Some(at + mask.trailing_zeros() as usize);
        }
        at += 16;
    }
    s.get(at..)?.iter().position(|&b| b == 0).map(|i| at + i)
}

#[cfg(not(target_arch = "x86_64"))]
pub use crate::rank_root::first_nul;

/// This process's parent.
pub fn ppid() -> u32 {
    // SAFETY: getppid takes no arguments and cannot fail.
    unsafe { raw_syscall(libc::SYS_getppid, 0, 0, 0, 0) as u32 }
}

/// The current value of an environment variable, without allocating or taking std's
/// environment lock (which a forked child may find held).
pub fn getenv(name: &CStr) -> Option<&'static str> {
    // SAFETY: `name` is NUL-terminated; getenv returns NULL or a pointer into the
    // environment block, which lives until the variable is changed. We copy nothing and
    // use it immediately, as every C caller of getenv does.
    let p: *const c_char = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL getenv result is a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// The raw bytes of an environment variable (`name` without NUL), however encoded, without
/// allocating or taking std's environment lock.
pub fn getenv_bytes(name: &str) -> Option<&'static [u8]> {
    let mut key = [0u8; 64];
    if name.len() >= key.len() || name.as_bytes().contains(&0) {
        return None;
    }
    key[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `key` is NUL-terminated (zero-filled past the name); getenv returns NULL or
    // a pointer into the environment block, used at once as by every C caller of getenv.
    let p: *const c_char = unsafe { libc::getenv(key.as_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL getenv result is a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// Bytes as text: UTF-8 as it is, every byte of an invalid sequence as `\xNN` (so a value
/// that is not UTF-8 is shown as it is, not as "unset").
pub fn escape_bytes<W: Write>(w: &mut W, bytes: &[u8]) -> fmt::Result {
    for chunk in bytes.utf8_chunks() {
        w.write_str(chunk.valid())?;
        for b in chunk.invalid() {
            write!(w, "\\x{b:02x}")?;
        }
    }
    Ok(())
}

/// A private anonymous mapping to render one record into: taken from the kernel, not the
/// allocator (a forked child or a signal handler may find the allocator's lock held),
/// unmapped when dropped. The cold path only: two system calls per full record.
pub struct Scratch {
    ptr: *mut u8,
    len: usize,
}

impl Scratch {
    /// `len` zeroed bytes; None when the kernel refuses (the caller has a fallback).
    pub fn new(len: usize) -> Option<Scratch> {
        // SAFETY: an anonymous private mapping at an address of the kernel's choice; no
        // existing memory is touched. The result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then(|| Scratch { ptr: p.cast(), len })
    }
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live read-write mapping of `len` bytes owned by `self`, and
        // the borrow of `self` keeps it exclusive until it ends.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; no slice of it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Microseconds since the epoch.
pub fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// Nanoseconds since boot, suspend included (`CLOCK_BOOTTIME`: the clock of `/proc`'s
/// start times), by the vDSO.
pub fn boot_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Microseconds of `CLOCK_MONOTONIC` (the vDSO: no system call), exact to the
/// microsecond where a tick of the coarse clock is too long (the registry's liveness
/// verdicts are kept 5 ms).
pub fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// Microseconds of `CLOCK_MONOTONIC_COARSE` (the vDSO's tick, a few loads: no system
/// call, no rdtsc), for intervals that need no finer clock.
pub fn coarse_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// How many threads this process has now (`num_threads` of `/proc/self/stat`), read
/// without allocating (open, one read into a stack buffer, close); None when it cannot be
/// read (no `/proc`, no free descriptor).
pub fn thread_count() -> Option<u32> {
    let mut buf = [0u8; 1024];
    // SAFETY: the path is NUL-terminated; read(2) writes at most `buf.len()` bytes into the
    // live buffer; the descriptor is closed before returning.
    let n = unsafe {
        let fd = libc::open(
            c"/proc/self/stat".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    stat_threads(buf.get(..usize::try_from(n).ok()?)?)
}

/// `num_threads` (field 20, proc(5)) of a `/proc/<pid>/stat` text. The command name (field
/// 2) may hold spaces and parentheses: fields are counted after its last `)`.
fn stat_threads(stat: &[u8]) -> Option<u32> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    // `get`: an index keeps a panic location, a relocation (test_startup_cost.py).
    let field = stat
        .get(close + 1..)?
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .nth(20 - 3)?;
    let mut v: u32 = 0;
    for &d in field {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u32::from(d - b'0'))?;
    }
    (!field.is_empty()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walks_system_calls_answer_as_the_c_library_does() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(euid(), unsafe { libc::geteuid() });
        let (mut ours, mut theirs) = ([0u8; 256], [0u8; 256]);
        assert!(nodename(&mut ours));
        // SAFETY: gethostname writes at most 255 bytes into the buffer.
        let rc = unsafe { libc::gethostname(theirs.as_mut_ptr().cast(), 255) };
        assert_eq!(rc, 0);
        let end = |b: &[u8]| b.iter().position(|&c| c == 0).unwrap();
        assert_eq!(&ours[..end(&ours)], &theirs[..end(&theirs)]);
        let mut short = [0xffu8; 64];
        assert_eq!(hostname(&mut short), {
            let full = std::str::from_utf8(&theirs[..end(&theirs)]).unwrap();
            full.split('.').next().unwrap().to_string()
        });
        // No room for the name and its NUL: refused, as gethostname refuses.
        assert!(!nodename(&mut [0u8; 1]));

        use std::io::Read;
        let me = pid();
        let mut f = RawFile::open(&format!("/proc/{me}/stat")).unwrap();
        let mut line = String::new();
        f.read_to_string(&mut line).unwrap();
        assert!(line.starts_with(&format!("{me} (")), "{line}");
        assert_eq!(f.owner().unwrap(), euid());
        let e = |path: &str| RawFile::open(path).err().and_then(|e| e.raw_os_error());
        assert_eq!(e("/proc/self/no-such-file"), Some(libc::ENOENT));
        assert_eq!(e(&"/x".repeat(100)), Some(libc::ENAMETOOLONG));
        assert_eq!(e("/proc/self\0/stat"), Some(libc::EINVAL));
    }

    /// `first_nul` answers exactly as the core crate's safe scan, which
    /// `EnvScan::finding_nul_with` requires: at every length and alignment, with the NUL
    /// at every place a word or a 64-byte step could get wrong, and with none; with a
    /// second NUL later in the same step, the first.
    #[test]
    fn first_nul_is_the_safe_scans_answer() {
        let mut bytes = [b'x'; 160];
        for at in 0..bytes.len() {
            bytes[at] = 0;
            if at + 5 < bytes.len() {
                bytes[at + 5] = 0;
                assert_eq!(first_nul(&bytes[..]), Some(at));
                bytes[at + 5] = b'x';
            }
            for start in 0..5 {
                for end in start..bytes.len() {
                    let s = &bytes[start..end];
                    assert_eq!(
                        first_nul(s),
                        crate::rank_root::first_nul(s),
                        "{start}..{end}, NUL at {at}"
                    );
                }
            }
            bytes[at] = b'x';
        }
        assert_eq!(first_nul(&[]), None);
        assert_eq!(first_nul(&[0x80, 0xff, 0x01, 0]), Some(3));
    }

    #[test]
    fn thread_count_is_field_20_of_stat() {
        let stat =
            b"1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 7 0 98765 1000 10";
        assert_eq!(stat_threads(stat), Some(7));
        assert_eq!(stat_threads(b"1 (x) S 1 2 3"), None);
        assert_eq!(stat_threads(b"no parenthesis"), None);
        // this test binary runs its tests on threads of its own: at least one
        assert!(thread_count().is_some_and(|n| n >= 1));
    }

    #[test]
    fn long_values_keep_their_ends_and_lines_their_newline() {
        let long = "a".repeat(3000) + "END";
        let shown = Mid(&long, VALUE_MAX).to_string();
        assert!(shown.len() < VALUE_MAX + 10 && shown.starts_with('a') && shown.ends_with("END"));
        assert_eq!(Mid("short", VALUE_MAX).to_string(), "short");
        let e = "é".repeat(500);
        assert!(Mid(&e, 101).to_string().contains(" [...] "));
        let mut b = StackBuf::<64>::new();
        let _ = write!(b, "{}", "x".repeat(100));
        b.end_line();
        assert!(b.as_bytes().ends_with(b" [...]\n") && b.as_bytes().len() <= 64);
        let mut b = StackBuf::<64>::new();
        let _ = write!(b, "RANK={}: fix it", Mid(&long, 20));
        b.end_line();
        assert!(b.as_bytes().ends_with(b"END: fix it\n"));
    }

    #[test]
    fn stack_buf_truncates() {
        let mut b = StackBuf::<8>::new();
        write!(b, "0123456789").unwrap();
        assert_eq!(b.as_bytes(), b"01234567");
    }
}
