//! A thread's Python frames on CPython 3.13, which no longer exports `_Py_DumpTraceback`:
//! walked through `_PyRuntime.debug_offsets`, the versioned table of structure offsets
//! CPython 3.13 publishes for debuggers and profilers that read a stopped thread's frames
//! (`Include/internal/pycore_runtime.h`, `_Py_DebugOffsets`). Line numbers come from
//! CPython's own exported `PyUnstable_InterpreterFrame_GetLine` (a pure computation over the
//! code object's location table: no allocation, no GIL, no reference count touched).
//!
//! Only the calling thread's own frames are read, while it is blocked in the guard's
//! wrapper: they cannot change underneath. Nothing is written. Accepted only when the
//! table's cookie is `xdebugpy`, its version is 3.13.x and the build is not free-threaded;
//! any other layout (3.14 changed it) is not guessed at, and the site is the native one.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fmt::Write;

use crate::guard::sys::signal_safe::StackBuf;

/// Offsets read from `_Py_DebugOffsets` (byte offsets of 3.13's layout, see `load`).
#[derive(Clone, Copy, Debug)]
pub struct Offsets {
    current_frame: usize,
    previous: usize,
    executable: usize,
    owner: usize,
    filename: usize,
    name: usize,
    ob_type: usize,
    u_state: usize,
    u_length: usize,
    u_ascii_size: usize,
    code_type: usize,
    get_line: usize,
}

/// CPython walks at most this many frames when it dumps a traceback; so do we.
const MAX_FRAMES: usize = 100;
const FRAME_OWNED_BY_CSTACK: u8 = 3;

/// Read the offsets from `_PyRuntime` (the address of the exported symbol), if it is the
/// 3.13 layout. `code_type`: `&PyCode_Type`; `get_line`: `PyUnstable_InterpreterFrame_GetLine`.
///
/// # Safety
/// `runtime` is the address of CPython's `_PyRuntime`, which begins with `_Py_DebugOffsets`
/// in every CPython that exports `PyUnstable_InterpreterFrame_GetLine` (3.12+).
pub unsafe fn load(runtime: *const c_void, code_type: usize, get_line: usize) -> Option<Offsets> {
    if runtime.is_null() || code_type == 0 || get_line == 0 {
        return None;
    }
    let w = |i: usize| -> u64 {
        // SAFETY: the caller guarantees `runtime` points at _Py_DebugOffsets, whose first 71
        // words are read here, only after the cookie and version matched (3.13's layout).
        unsafe { (runtime as *const u64).add(i).read_unaligned() }
    };
    let cookie = w(0).to_le_bytes();
    if &cookie != b"xdebugpy" || (w(1) >> 16) != 0x030d || w(2) != 0 {
        return None;
    }
    let o = Offsets {
        current_frame: w(23) as usize,
        previous: w(29) as usize,
        executable: w(30) as usize,
        owner: w(33) as usize,
        filename: w(35) as usize,
        name: w(36) as usize,
        ob_type: w(45) as usize,
        u_state: w(68) as usize,
        u_length: w(69) as usize,
        u_ascii_size: w(70) as usize,
        code_type,
        get_line,
    };
    // Sanity: the sizes this layout implies (an interpreter frame, an ASCII string header).
    let frame_size = w(28) as usize;
    if !(32..=256).contains(&frame_size)
        || !(24..=64).contains(&o.u_ascii_size)
        || o.owner >= frame_size
    {
        return None;
    }
    Some(o)
}

/// Call `frame` with `FILE:LINE in NAME` for each frame of `tstate`, innermost first,
/// until it returns false; returns (frames seen, whether more were left unread).
///
/// # Safety
/// `tstate` is the calling thread's live `PyThreadState` of the interpreter `o` was read
/// from, and the thread is not running Python code (it is inside the guard).
pub unsafe fn walk(
    o: &Offsets,
    tstate: *mut c_void,
    mut frame: impl FnMut(&str) -> bool,
) -> (usize, bool) {
    type GetLine = unsafe extern "C" fn(*mut c_void) -> i32;
    // SAFETY: `get_line` is PyUnstable_InterpreterFrame_GetLine, whose signature this is.
    let get_line: GetLine = unsafe { std::mem::transmute::<usize, GetLine>(o.get_line) };
    let rd = |p: usize| -> usize {
        // SAFETY: every pointer read here is a field of a live frame, code object or string
        // of this thread's stack, at an offset CPython published for exactly that field.
        unsafe { (p as *const usize).read_unaligned() }
    };
    let mut f = rd(tstate as usize + o.current_frame);
    let mut seen = 0;
    let mut walked = 0;
    while f != 0 {
        if walked == MAX_FRAMES {
            return (seen, true);
        }
        walked += 1;
        // SAFETY: as for `rd`; `owner` is a one-byte field.
        let owner = unsafe { ((f + o.owner) as *const u8).read() };
        let code = rd(f + o.executable);
        if owner != FRAME_OWNED_BY_CSTACK && code != 0 && rd(code + o.ob_type) == o.code_type {
            // SAFETY: `f` is a complete frame of this thread executing a code object.
            let line = unsafe { get_line(f as *mut c_void) };
            let mut text = StackBuf::<1200>::new();
            string(o, rd(code + o.filename), &mut text);
            let _ = write!(text, ":{line} in ");
            string(o, rd(code + o.name), &mut text);
            seen += 1;
            if !frame(std::str::from_utf8(text.as_bytes()).unwrap_or("?")) {
                return (seen, rd(f + o.previous) != 0);
            }
        }
        f = rd(f + o.previous);
    }
    (seen, false)
}

/// A `str` object's text: compact ASCII or Latin-1 (what file and function names are, but
/// for exotic ones: those come out as `?`), at most 500 characters.
fn string<const N: usize>(o: &Offsets, s: usize, out: &mut StackBuf<N>) {
    if s == 0 {
        out.push_bytes(b"?");
        return;
    }
    // SAFETY: `s` is a live str object (a code object's filename or name); the state word
    // and length are fields at the offsets CPython published.
    let (state, len) = unsafe {
        (
            ((s + o.u_state) as *const u32).read_unaligned(),
            ((s + o.u_length) as *const isize).read_unaligned(),
        )
    };
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact || kind != 1 || !(0..=100_000).contains(&len) {
        out.push_bytes(b"?");
        return;
    }
    let n = (len as usize).min(500);
    // ASCII data follows the PyASCIIObject header; Latin-1 follows PyCompactUnicodeObject
    // (the header, then utf8_length and the utf8 pointer: two more words).
    let data = s + o.u_ascii_size + if ascii { 0 } else { 16 };
    // SAFETY: a compact string's `len` characters of one byte each follow its header.
    let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, n) };
    if ascii {
        out.push_bytes(bytes);
    } else {
        for &b in bytes {
            let mut c = [0u8; 4];
            out.push_bytes(char::from(b).encode_utf8(&mut c).as_bytes());
        }
    }
}
