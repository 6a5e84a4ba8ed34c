//! Where a violating call came from: the Python line of the calling thread, else the first
//! native frame outside the guard and the CUDA libraries (issue 13).
//!
//! Everything here runs on the violation path only, never on an allowed call.
//!
//! - **Python**: `PyGILState_GetThisThreadState()` is the calling thread's thread state even
//!   while the thread does not hold the GIL (cuda.bindings, ctypes and PyTorch release it
//!   around the C call); `_Py_DumpTraceback(fd, tstate)` is what `faulthandler` uses to write
//!   that thread's traceback as text without the GIL, capped at 100 frames by CPython
//!   itself. Both are looked up with the real `dlsym` on `RTLD_DEFAULT` at the first
//!   violation (never at load time) and written into a fresh non-blocking pipe, which is
//!   then parsed. The thread is blocked in our wrapper, so its frames do not move while they
//!   are read. A process without these symbols does nothing Python-related at all.
//! - **Native**: `_Unwind_Backtrace` (the unwinder linked into this library), at most
//!   [`MAX_WALK`] frames, named with `dladdr` and, where the dynamic symbol table has no name
//!   (a program's `main`), the object file's own `.symtab`.
//! - **The cheap key**: [`caller_address`] reads the guarded wrapper's return address from
//!   its frame (frame pointers are on for this library, `.cargo/config.toml`), so a repeated
//!   violation from C is keyed without unwinding (`tally.rs`).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt::Write;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use crate::guard::resolve::real;
use crate::guard::sys::lifecycle::ForkSafeCell;
use crate::guard::sys::signal_safe::StackBuf;

/// Most Python frames kept in a record (`py_stack`), innermost ones, printed outermost first.
pub const PY_FRAMES: usize = 32;
/// Most native frames kept in a record (`native_stack`).
pub const NATIVE_FRAMES: usize = 16;
/// Most frames the native unwinder walks (a 10,000-frame recursion is cut here).
pub const MAX_WALK: usize = 64;
/// Longest site text, in bytes: records and summaries cut it the same way, so the report
/// groups them together.
pub const SITE_MAX: usize = rankguard_core::record::caps::SITE;
/// Longest text of one stack frame in a record.
pub const FRAME_MAX: usize = rankguard_core::record::caps::FRAME;

// ---------------------------------------------------------------------------------------
// The cheap key: the wrapper's return address

/// The return address of the function this is expanded into (the exported wrapper, or its
/// cold half, reached by a jump: the program's call site either way), read from its frame
/// record; 0 when this build has no frame pointers. Must be expanded directly in the
/// wrapper's body (`gate!`), not in a nested function.
///
/// `rbp` is that function's own frame record and needs no plausibility test: the library
/// is built with frame pointers (`rankguard_frame_pointers`, from `.cargo/config.toml`'s
/// `force-frame-pointers`; without it this is 0), so every function's prologue points
/// `rbp` at the saved `rbp` and return address it pushed, and the compiler never uses the
/// register for anything else. A test of it against the stack pointer was six of the
/// repeated violation's instructions (docs/benchmarks.md, "The repeated violation's poll").
#[macro_export]
macro_rules! caller_address {
    () => {{
        #[cfg(all(target_arch = "x86_64", rankguard_frame_pointers))]
        {
            let fp: usize;
            // Expanded inside a wrapper body's own `unsafe {}` block (gate!), where this one
            // is nested: it stays so that the macro's one unsafe operation is documented here.
            #[allow(unused_unsafe)]
            // SAFETY: reads one register, touches no memory and no flags.
            unsafe {
                ::core::arch::asm!("mov {}, rbp", out(reg) fp,
                    options(nomem, nostack, preserves_flags));
            }
            $crate::guard::audit::site::frame_return_address(fp)
        }
        #[cfg(not(all(target_arch = "x86_64", rankguard_frame_pointers)))]
        {
            0usize
        }
    }};
}

/// `[fp + 8]`: the return address in the frame record at `fp`.
///
/// # Safety
/// `fp` is the frame pointer of a function that is running on this thread (its frame
/// record: saved `rbp`, then the return address), as [`caller_address`] reads it.
#[inline(always)]
pub unsafe fn frame_return_address(fp: usize) -> usize {
    // SAFETY: per the contract, `fp + 8` is the return address slot of a live frame on
    // this thread's stack: mapped, and a plain (unaligned-tolerant) load.
    unsafe { ((fp + 8) as *const usize).read_unaligned() }
}

// ---------------------------------------------------------------------------------------
// Python

type GetTstate = unsafe extern "C" fn() -> *mut c_void;
type DumpTb = unsafe extern "C" fn(c_int, *mut c_void);
type IsInit = unsafe extern "C" fn() -> c_int;

/// 0 = not looked up, 1 = no Python in this process, 2 = found.
static PY_STATE: AtomicU8 = AtomicU8::new(0);
static PY_TSTATE: AtomicUsize = AtomicUsize::new(0);
static PY_DUMP: AtomicUsize = AtomicUsize::new(0);
static PY_INIT: AtomicUsize = AtomicUsize::new(0);

/// CPython 3.13's frame layout, when `_Py_DumpTraceback` is not exported (`pyframes.rs`).
static PY_OFFSETS: ForkSafeCell<crate::guard::sys::pyframes::Offsets> = ForkSafeCell::new();

#[cold]
fn py_lookup() {
    let get = real::lookup(libc::RTLD_DEFAULT, c"PyGILState_GetThisThreadState");
    let dump = real::lookup(libc::RTLD_DEFAULT, c"_Py_DumpTraceback");
    let init = real::lookup(libc::RTLD_DEFAULT, c"Py_IsInitialized");
    if dump.is_null() && !get.is_null() {
        let runtime = real::lookup(libc::RTLD_DEFAULT, c"_PyRuntime");
        let code_type = real::lookup(libc::RTLD_DEFAULT, c"PyCode_Type") as usize;
        let get_line =
            real::lookup(libc::RTLD_DEFAULT, c"PyUnstable_InterpreterFrame_GetLine") as usize;
        // SAFETY: `runtime` is CPython's exported _PyRuntime (load checks its cookie and
        // version before reading the offsets table it starts with).
        if let Some(o) = unsafe { crate::guard::sys::pyframes::load(runtime, code_type, get_line) }
        {
            PY_OFFSETS.set(o);
        }
    }
    if get.is_null() || init.is_null() || (dump.is_null() && PY_OFFSETS.get().is_none()) {
        PY_STATE.store(1, Ordering::Release);
        return;
    }
    PY_TSTATE.store(get as usize, Ordering::Relaxed);
    PY_DUMP.store(dump as usize, Ordering::Relaxed);
    PY_INIT.store(init as usize, Ordering::Relaxed);
    PY_STATE.store(2, Ordering::Release);
}

/// True once this process is known to have no Python interpreter (looked up at the first
/// violation): the repeated path may then key on the return address alone.
#[inline]
pub fn no_python() -> bool {
    PY_STATE.load(Ordering::Relaxed) == 1
}

/// The calling thread's Python thread state, if this is a Python process with an
/// initialised interpreter and this thread has one. Looked up once per process: an
/// interpreter loaded after the first violation is not seen (README).
#[inline]
pub fn python_thread() -> Option<*mut c_void> {
    let mut st = PY_STATE.load(Ordering::Acquire);
    if st == 0 {
        py_lookup();
        st = PY_STATE.load(Ordering::Acquire);
    }
    if st != 2 {
        return None;
    }
    // SAFETY: the addresses were returned by dlsym for these CPython functions, whose C
    // signatures are as declared; neither needs the GIL (Py_IsInitialized reads a flag,
    // PyGILState_GetThisThreadState reads a thread-specific key).
    unsafe {
        let init: IsInit = std::mem::transmute::<usize, IsInit>(PY_INIT.load(Ordering::Relaxed));
        if init() == 0 {
            return None;
        }
        let get: GetTstate =
            std::mem::transmute::<usize, GetTstate>(PY_TSTATE.load(Ordering::Relaxed));
        let t = get();
        (!t.is_null()).then_some(t)
    }
}

/// Dump `tstate`'s traceback into a pipe and call `frame` for each frame, innermost first,
/// as `FILE:LINE in FUNCTION`, until it returns false. Returns (frames seen, whether
/// CPython or the pipe cut the stack). No allocation; two descriptors, closed before return.
pub fn python_frames(tstate: *mut c_void, mut frame: impl FnMut(&str) -> bool) -> (usize, bool) {
    let dump = PY_DUMP.load(Ordering::Relaxed);
    if dump == 0 {
        return match PY_OFFSETS.get() {
            // SAFETY: `tstate` is this thread's live thread state (python_thread), of the
            // interpreter whose offsets were loaded; the thread is inside the guard.
            Some(o) => unsafe { crate::guard::sys::pyframes::walk(o, tstate, frame) },
            None => (0, false),
        };
    }
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return (0, false);
    }
    // SAFETY: `dump` is _Py_DumpTraceback (see python_thread); `tstate` is this thread's
    // live thread state; CPython writes with write(2) and ignores errors, so a full pipe
    // (non-blocking: EAGAIN) cuts the outermost frames, never blocks.
    unsafe {
        let f: DumpTb = std::mem::transmute::<usize, DumpTb>(dump);
        f(fds[1], tstate);
        libc::close(fds[1]);
    }
    let mut p = TracebackParser::default();
    let mut chunk = [0u8; 4096];
    loop {
        // SAFETY: reads into a stack buffer we own, at most its length.
        let n = unsafe { libc::read(fds[0], chunk.as_mut_ptr().cast(), chunk.len()) };
        if n <= 0 {
            break;
        }
        if !p.feed(&chunk[..n as usize], &mut frame) {
            break;
        }
    }
    p.finish(&mut frame);
    // SAFETY: closing the read end we opened.
    unsafe { libc::close(fds[0]) };
    (p.frames, p.cut || p.stopped)
}

/// Streaming parser of faulthandler's text: `  File "x.py", line 7 in f` lines (innermost
/// first), `  ...` when CPython cut a deep stack, `<no Python frame>` for none.
pub struct TracebackParser {
    line: StackBuf<1200>,
    pub frames: usize,
    pub cut: bool,
    stopped: bool,
}

impl Default for TracebackParser {
    fn default() -> Self {
        TracebackParser {
            line: StackBuf::new(),
            frames: 0,
            cut: false,
            stopped: false,
        }
    }
}

impl TracebackParser {
    /// Feed bytes; false once `frame` asked to stop.
    pub fn feed(&mut self, mut bytes: &[u8], frame: &mut impl FnMut(&str) -> bool) -> bool {
        while !bytes.is_empty() && !self.stopped {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.line.push_bytes(&bytes[..i]);
                    bytes = &bytes[i + 1..];
                    self.end_line(frame);
                }
                None => {
                    self.line.push_bytes(bytes);
                    bytes = &[];
                }
            }
        }
        !self.stopped
    }

    pub fn finish(&mut self, frame: &mut impl FnMut(&str) -> bool) {
        if !self.stopped && !self.line.as_bytes().is_empty() {
            self.end_line(frame);
        }
    }

    fn end_line(&mut self, frame: &mut impl FnMut(&str) -> bool) {
        // As long as the line: records cap each frame with an explicit "...".
        let mut out = StackBuf::<1200>::new();
        let text = std::str::from_utf8(self.line.as_bytes()).unwrap_or("");
        if text.trim() == "..." {
            self.cut = true;
        } else if parse_frame_line(text, &mut out) {
            self.frames += 1;
            if !frame(std::str::from_utf8(out.as_bytes()).unwrap_or("?")) {
                self.stopped = true;
            }
        }
        self.line = StackBuf::new();
    }
}

/// `  File "x.py", line 7 in f` -> `x.py:7 in f`. False for any other line.
pub fn parse_frame_line<W: Write>(line: &str, out: &mut W) -> bool {
    let Some(rest) = line.trim_start().strip_prefix("File \"") else {
        return false;
    };
    let Some(q) = rest.rfind("\", line ") else {
        return false;
    };
    let file = &rest[..q];
    let tail = &rest[q + "\", line ".len()..];
    let (lineno, func) = match tail.split_once(" in ") {
        Some((l, f)) => (l, f),
        None => (tail, "?"),
    };
    let _ = write!(out, "{file}:{} in {func}", lineno.trim());
    true
}

// ---------------------------------------------------------------------------------------
// Native

#[repr(C)]
struct UnwindContext {
    _private: [u8; 0],
}
type TraceFn = extern "C" fn(*mut UnwindContext, *mut c_void) -> c_int;
extern "C" {
    fn _Unwind_Backtrace(trace: TraceFn, arg: *mut c_void) -> c_int;
    fn _Unwind_GetIP(ctx: *mut UnwindContext) -> usize;
}
const URC_NO_REASON: c_int = 0;
const URC_NORMAL_STOP: c_int = 4;

struct Walk {
    ips: [usize; MAX_WALK],
    n: usize,
}

extern "C" fn walk_frame(ctx: *mut UnwindContext, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` that `native_ips` passed, alive for the whole backtrace;
    // `ctx` is the unwinder's context for this frame.
    let w = unsafe { &mut *arg.cast::<Walk>() };
    // SAFETY: `ctx` is the live context the unwinder passed for this frame.
    let ip = unsafe { _Unwind_GetIP(ctx) };
    if ip == 0 || w.n >= MAX_WALK {
        return URC_NORMAL_STOP;
    }
    w.ips[w.n] = ip;
    w.n += 1;
    if w.n >= MAX_WALK {
        URC_NORMAL_STOP
    } else {
        URC_NO_REASON
    }
}

/// The return addresses of the calling thread's frames, innermost first, at most
/// [`MAX_WALK`], with this library's own frames removed from the top.
pub fn native_ips(out: &mut [usize; MAX_WALK]) -> usize {
    let mut w = Walk {
        ips: [0; MAX_WALK],
        n: 0,
    };
    // SAFETY: the callback only writes into `w`, which outlives the call; the unwinder
    // walks this thread's own stack.
    unsafe { _Unwind_Backtrace(walk_frame, (&mut w as *mut Walk).cast()) };
    let own = own_base();
    let mut k = 0;
    let mut skipping = true;
    for &ip in &w.ips[..w.n] {
        if skipping && object_of(ip).0 == own {
            continue;
        }
        skipping = false;
        out[k] = ip;
        k += 1;
    }
    k
}

/// (load base, file name) of the object holding `ip`; (0, "") when none does.
fn object_of(ip: usize) -> (usize, &'static str) {
    match dladdr(ip) {
        Some(info) => (info.dli_fbase as usize, cstr(info.dli_fname)),
        None => (0, ""),
    }
}

/// What the loader knows of the instruction before return address `ip` (the call).
fn dladdr(ip: usize) -> Option<libc::Dl_info> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and writes `info`.
    (unsafe { libc::dladdr(ip.saturating_sub(1) as *const c_void, &mut info) } != 0).then_some(info)
}

fn cstr(p: *const c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: dladdr's strings are NUL-terminated and live as long as the object is loaded
    // (the guard never unloads the objects it reports on while using the text).
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

fn own_base() -> usize {
    static OWN: AtomicUsize = AtomicUsize::new(0);
    let b = OWN.load(Ordering::Relaxed);
    if b != 0 {
        return b;
    }
    let b = object_of(own_base as *const () as usize + 1).0;
    OWN.store(b, Ordering::Relaxed);
    b
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether a file name is one of the CUDA libraries whose frames are not the user's site.
pub fn is_cuda_library(name: &str) -> bool {
    let b = basename(name);
    b.starts_with("libcuda.") || b.starts_with("libcudart.")
}

/// The index in `ips` of the first frame outside the CUDA libraries and the guard, if any.
pub fn user_frame(ips: &[usize]) -> Option<usize> {
    let own = own_base();
    ips.iter().position(|&ip| {
        let (base, name) = object_of(ip);
        // The guard's own frames further out: a runtime wrapper whose real function called
        // a guarded driver function.
        base != 0 && base != own && !is_cuda_library(name)
    })
}

/// `OBJECT(SYMBOL+0xOFF)` or `OBJECT+0xOFF` for one return address.
pub fn describe_ip<W: Write>(w: &mut W, ip: usize) {
    let Some(info) = dladdr(ip) else {
        let _ = write!(w, "?+{ip:#x}");
        return;
    };
    let base = info.dli_fbase as usize;
    let mut path = cstr(info.dli_fname);
    let mut exe = StackBuf::<512>::new();
    if path.is_empty() {
        path = self_exe(&mut exe);
    }
    let obj = basename(path);
    if !info.dli_sname.is_null() && !info.dli_saddr.is_null() {
        let _ = write!(
            w,
            "{obj}({}+{:#x})",
            cstr(info.dli_sname),
            ip - info.dli_saddr as usize
        );
        return;
    }
    let mut name = StackBuf::<256>::new();
    if let Some(off) =
        crate::guard::sys::elfsym::lookup(path, base, ip.saturating_sub(1), &mut name)
    {
        let _ = write!(
            w,
            "{obj}({}+{:#x})",
            std::str::from_utf8(name.as_bytes()).unwrap_or("?"),
            off + 1
        );
        return;
    }
    let _ = write!(w, "{obj}+{:#x}", ip - base);
}

fn self_exe(buf: &mut StackBuf<512>) -> &str {
    let mut raw = [0u8; 500];
    // SAFETY: readlink writes at most `len` bytes into the buffer we own.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            raw.as_mut_ptr().cast(),
            raw.len(),
        )
    };
    if n > 0 {
        buf.push_bytes(&raw[..n as usize]);
    }
    std::str::from_utf8(buf.as_bytes()).unwrap_or("")
}

// ---------------------------------------------------------------------------------------
// A whole capture, for a full record (cold: may allocate)

/// Everything a full record says about where the call came from.
#[derive(Default, Debug)]
pub struct Capture {
    /// `FILE:LINE in FUNCTION`, `OBJECT(SYMBOL+0xOFF)`, or `OBJECT+0xOFF`; cut at SITE_MAX.
    pub site: Option<String>,
    /// Python frames, outermost first (at most PY_FRAMES, the innermost ones).
    pub py_stack: Vec<String>,
    /// True when Python frames beyond those in `py_stack` were left out.
    pub py_cut: bool,
    /// Native frames, innermost first, from the wrapper's caller outwards.
    pub native_stack: Vec<String>,
    pub native_cut: bool,
    /// The return address naming the native site (0 for a Python site or none).
    pub site_ip: usize,
}

/// Capture the calling thread's site and stacks. `python`: the thread's Python state.
pub fn capture(python: Option<*mut c_void>) -> Capture {
    let mut c = Capture::default();
    if let Some(t) = python {
        let mut inner: Vec<String> = Vec::new();
        let (seen, cut) = python_frames(t, |f| {
            inner.push(f.to_string());
            inner.len() < PY_FRAMES
        });
        c.py_cut = cut || seen > inner.len();
        if let Some(site) = inner.iter().find(|f| !in_package(f)).or(inner.first()) {
            c.site = Some(cut_site(site));
        }
        inner.reverse();
        c.py_stack = inner;
    }
    let mut ips = [0usize; MAX_WALK];
    let n = native_ips(&mut ips);
    let ips = &ips[..n];
    for &ip in ips.iter().take(NATIVE_FRAMES) {
        let mut b = StackBuf::<FRAME_MAX>::new();
        describe_ip(&mut b, ip);
        c.native_stack
            .push(String::from_utf8_lossy(b.as_bytes()).into_owned());
    }
    c.native_cut = n > NATIVE_FRAMES;
    if c.site.is_none() {
        if let Some(i) = user_frame(ips) {
            c.site_ip = ips[i];
            let mut b = StackBuf::<FRAME_MAX>::new();
            describe_ip(&mut b, ips[i]);
            c.site = Some(cut_site(std::str::from_utf8(b.as_bytes()).unwrap_or("?")));
        }
    }
    c
}

/// A site text cut to SITE_MAX bytes on a character boundary.
pub fn cut_site(s: &str) -> String {
    if s.len() <= SITE_MAX {
        return s.to_string();
    }
    let mut end = SITE_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Whether a frame is in an installed package (`site-packages`, `dist-packages`): framework
/// code such as `torch/cuda/__init__.py:NNN in set_device`, not the user's line.
pub fn in_package(frame: &str) -> bool {
    let file = frame.rsplit_once(" in ").map_or(frame, |(f, _)| f);
    file.contains("/site-packages/") || file.contains("/dist-packages/")
}

/// The site of `tstate`'s Python stack into `out` (cut at SITE_MAX): the innermost frame
/// outside installed packages, else the innermost frame; false if there is no frame.
/// The repeated-violation path of a Python thread: no allocation.
pub fn python_site(tstate: *mut c_void, out: &mut StackBuf<SITE_MAX>) -> bool {
    let mut found = false;
    let mut innermost = StackBuf::<SITE_MAX>::new();
    let mut n = 0;
    python_frames(tstate, |f| {
        n += 1;
        let mut end = f.len().min(SITE_MAX);
        while !f.is_char_boundary(end) {
            end -= 1;
        }
        if n == 1 {
            innermost.push_bytes(&f.as_bytes()[..end]);
        }
        if in_package(f) {
            return n < PY_FRAMES;
        }
        out.push_bytes(&f.as_bytes()[..end]);
        found = true;
        false
    });
    if !found && n > 0 {
        out.push_bytes(innermost.as_bytes());
        found = true;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(text: &str, chunk: usize, keep: usize) -> (Vec<String>, usize, bool) {
        let mut p = TracebackParser::default();
        let mut out = Vec::new();
        let mut f = |s: &str| {
            out.push(s.to_string());
            out.len() < keep
        };
        for c in text.as_bytes().chunks(chunk) {
            if !p.feed(c, &mut f) {
                break;
            }
        }
        p.finish(&mut f);
        let (n, cut) = (p.frames, p.cut);
        (out, n, cut)
    }

    #[test]
    fn parses_faulthandler_text_in_any_chunking() {
        let text = "Stack (most recent call first):\n  File \"/a b/legacy_cfg.py\", line 7 in place_learner\n  File \"x.py\", line 12 in <module>\n";
        for chunk in [1, 3, 7, 4096] {
            let (f, n, cut) = frames(text, chunk, 32);
            assert_eq!(
                f,
                [
                    "/a b/legacy_cfg.py:7 in place_learner",
                    "x.py:12 in <module>"
                ],
                "chunk {chunk}"
            );
            assert_eq!((n, cut), (2, false));
        }
        let (f, _, _) = frames(text, 5, 1);
        assert_eq!(f, ["/a b/legacy_cfg.py:7 in place_learner"]);
    }

    #[test]
    fn marks_a_cut_stack_and_ignores_other_lines() {
        let text = "Stack (most recent call first):\n  File \"r.py\", line 3 in r\n  ...\n";
        assert_eq!(
            frames(text, 4096, 32),
            (vec!["r.py:3 in r".to_string()], 1, true)
        );
        assert_eq!(
            frames("  <no Python frame>\n", 4096, 32),
            (vec![], 0, false)
        );
        // A file name with the separator in it: the last one wins.
        let mut b = StackBuf::<128>::new();
        assert!(parse_frame_line(
            "  File \"we\", line 1\", line 9 in f",
            &mut b
        ));
        assert_eq!(b.as_bytes(), b"we\", line 1:9 in f");
        let mut b = StackBuf::<128>::new();
        assert!(parse_frame_line("  File \"x.py\", line ???", &mut b));
        assert_eq!(b.as_bytes(), b"x.py:??? in ?");
    }

    #[test]
    fn frames_of_installed_packages_are_not_the_site() {
        assert!(in_package(
            "/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:399 in set_device"
        ));
        assert!(in_package("/usr/lib/python3/dist-packages/x.py:1 in f"));
        assert!(!in_package("/home/u/train.py:7 in place_learner"));
        assert!(!in_package("/home/u/train.py:7 in site-packages/"));
    }

    #[test]
    fn sites_are_cut_on_char_boundaries() {
        let long = "é".repeat(200);
        let c = cut_site(&long);
        assert!(c.len() <= SITE_MAX && long.starts_with(&c));
        assert_eq!(cut_site("a.py:1 in f"), "a.py:1 in f");
    }

    #[test]
    fn cuda_libraries_are_recognised_by_name() {
        for n in [
            "/usr/lib/libcuda.so.1",
            "libcudart.so.12",
            "/x/libcuda.so.570.1",
        ] {
            assert!(is_cuda_library(n), "{n}");
        }
        for n in ["libcudnn.so.9", "/bin/python3", "libcublas.so.12", ""] {
            assert!(!is_cuda_library(n), "{n}");
        }
    }

    #[test]
    fn frame_return_address_reads_the_slot_above_the_saved_frame_pointer() {
        let slots = [0usize, 0xabcdef];
        let fp = slots.as_ptr() as usize;
        // SAFETY: `fp` points at two readable words laid out as a frame record.
        assert_eq!(unsafe { frame_return_address(fp) }, 0xabcdef);
    }

    /// The address a function reads through its own frame pointer is where it returns to.
    #[cfg(all(target_arch = "x86_64", rankguard_frame_pointers))]
    #[test]
    fn caller_address_is_the_functions_return_address() {
        #[inline(never)]
        fn callee() -> usize {
            // SAFETY: expanded directly in this function's body, as in a wrapper's.
            unsafe { crate::caller_address!() }
        }
        #[inline(never)]
        fn caller() -> (usize, usize) {
            let ra = callee();
            (ra, caller as *const () as usize)
        }
        let (ra, start) = std::hint::black_box(caller());
        // The return address lies in `caller`'s code, just after its call of `callee`.
        assert!(
            ra > start && ra < start + 256,
            "ra {ra:#x}, caller at {start:#x}"
        );
    }
}
