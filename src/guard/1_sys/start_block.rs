//! The environment block this process was started with, read from its own memory.
//!
//! At `exec` the kernel writes the argument strings and then the environment strings, one
//! after the other, at the top of the main thread's stack, and the executable's name right
//! after the last environment string (its address is the auxiliary vector's `AT_EXECFN`).
//! `/proc/self/environ` is those environment bytes, `[env_start, env_end)`, read back by the
//! kernel from this process's memory; `setenv` writes new strings elsewhere and never
//! changes them. Reading the same bytes here costs no file: the kernel's way took an `open`,
//! a `read` that pins the stack's pages and a `close`, a quarter of the first `cuInit`'s
//! added time in a process with `RANK` set (docs/benchmarks.md, "The start environment
//! without a file").
//!
//! The block's start is found from the initial stack, which glibc's loader keeps the
//! address of (`__libc_stack_end`: `argc`, then the `argv` array, then `envp`): the
//! environment starts right after the last argument string. Every step is checked against
//! the layout the kernel wrote (each argument string right after the one before, all
//! between the stack's start and `AT_EXECFN`, the block ending in a NUL, and `envp[0]`,
//! where it still points into the block, at its start), and anything else (a program that
//! rewrote its `argv` array, an `unsetenv` that moved `envp[0]`, no `AT_EXECFN`) answers
//! None: the caller then reads `/proc/self/environ` as before. A program that overwrote the
//! strings themselves (`setproctitle`) reads here as the kernel would read it there.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::guard::sys::signal_safe;

/// Most bytes of a start environment read here (`ARG_MAX`-sized environments fit; the
/// `/proc` way's bound too).
pub const MAX: usize = 8 << 20;

/// Most bytes between the initial stack pointer and `AT_EXECFN`: the argument and
/// environment arrays and strings are bounded by the stack's limit at `exec`.
const MAX_SPAN: usize = 1 << 30;

/// Most arguments believed (each a pointer between the stack's start and `AT_EXECFN`).
const MAX_ARGS: usize = 1 << 20;

/// The bytes of this process's start environment, `[at, end)` still to read.
#[derive(Debug)]
pub struct Block {
    at: usize,
    end: usize,
}

impl Block {
    /// The block's bytes still to read, in place: scanned where the kernel wrote them (no
    /// copy into a buffer, which cost more than the scan of a 64 KiB environment).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: [at, end) lies inside the block `find` verified to be the environment
        // strings the kernel wrote on the initial stack: mapped for the life of the process
        // (the main thread's stack is never unmapped) and initialised; the slice lives no
        // longer than `self`, read as bytes as the kernel's read of /proc/self/environ
        // reads them (a program that rewrites them, `setproctitle`, does so before any
        // CUDA call, in the thread that is now in its first `cuInit`, as the copy did).
        unsafe { std::slice::from_raw_parts(self.at as *const u8, self.end - self.at) }
    }

    /// [`Block::bytes`] for the life of the process: the initial stack's strings are never
    /// unmapped, so the slice outlives the `Block` that found it.
    pub fn into_bytes(self) -> &'static [u8] {
        // SAFETY: as in `bytes`; the block lies on the main thread's initial stack, which
        // stays mapped until the process ends (its strings are never freed or moved).
        unsafe { std::slice::from_raw_parts(self.at as *const u8, self.end - self.at) }
    }
}

/// The initial stack between its pointer at the program's entry and `AT_EXECFN`: the
/// argument and environment arrays, then their strings.
struct Stack {
    sp: usize,
    end: usize,
}

impl Stack {
    fn inside(&self, p: usize) -> bool {
        p > self.sp && p < self.end
    }

    /// The word at `p`, if `p` is 8-aligned and on the initial stack.
    fn word(&self, p: usize) -> Option<usize> {
        if !self.inside(p) || !p.is_multiple_of(8) {
            return None;
        }
        // SAFETY: `p` is aligned and lies between the initial stack pointer and
        // `AT_EXECFN`, mapped stack memory; volatile, as the program may rewrite its argv
        // and envp arrays.
        Some(unsafe { std::ptr::read_volatile(p as *const usize) })
    }

    /// The byte at `p`, if `p` is on the initial stack.
    fn byte(&self, p: usize) -> Option<u8> {
        if !self.inside(p) {
            return None;
        }
        // SAFETY: `p` lies between the initial stack pointer and `AT_EXECFN`, mapped stack
        // memory; volatile, as another thread may rewrite these strings.
        Some(unsafe { std::ptr::read_volatile(p as *const u8) })
    }

    /// The end (one past the NUL) of the string at `p`, on the initial stack: sixteen bytes
    /// a step (`signal_safe::first_nul`), as a program's arguments can be hundreds of KiB
    /// (a launcher handing every rank's environment on its command line), which a byte at a
    /// time took hundreds of microseconds to pass.
    fn string_end(&self, p: usize) -> Option<usize> {
        if !self.inside(p) {
            return None;
        }
        // SAFETY: [p, end) lies between the initial stack pointer and `AT_EXECFN`, mapped
        // and initialised stack memory, read as bytes for the scan's length (as `Block::bytes`
        // reads the environment's; the strings are the kernel's, rewritten, if ever, by the
        // program before it starts threads: `setproctitle`).
        let rest = unsafe { std::slice::from_raw_parts(p as *const u8, self.end - p) };
        signal_safe::first_nul(rest).map(|n| p + n + 1)
    }
}

/// The start environment block, from `stack_end`, the address of glibc's
/// `__libc_stack_end` (null: not found), when the initial stack is as the kernel wrote it;
/// None otherwise (read `/proc/self/environ` instead).
pub fn find(stack_end: *const usize) -> Option<Block> {
    if stack_end.is_null() || !stack_end.is_aligned() {
        return None;
    }
    // SAFETY: `stack_end` is the address of ld.so's `__libc_stack_end`, a pointer-sized
    // variable set before any constructor ran and never changed after.
    find_at(unsafe { stack_end.read() })
}

/// The initial stack pointer as the library's constructor saw it: the word before `argv`
/// (`argc`'s, where `__libc_stack_end` points), 0 before the constructor ran.
static SP_AT_LOAD: AtomicUsize = AtomicUsize::new(0);

/// At load (`decide::narrow`'s constructor, which the loader hands `argv`): remember where
/// the initial stack starts, so that the start block is found with no symbol look-up (an
/// `exec` hook in a `vfork` child must not take the loader's lock). A store, no call.
pub fn remember_at_load(argv: *const *const std::ffi::c_char) {
    SP_AT_LOAD.store((argv as usize).wrapping_sub(8), Ordering::Relaxed);
}

/// The start block found from the constructor's `argv` ([`remember_at_load`]); None
/// before it ran or when the stack is not as the kernel wrote it (a program run as
/// `ld.so PROGRAM` has its `argv` moved past the loader's own arguments: `find_at` then
/// says so, and the start environment's reader looks `__libc_stack_end` up instead).
pub fn at_load() -> Option<Block> {
    let (at, end) = (
        FOUND_AT.load(Ordering::Acquire),
        FOUND_END.load(Ordering::Relaxed),
    );
    if at != 0 {
        return Some(Block { at, end });
    }
    let block = match SP_AT_LOAD.load(Ordering::Relaxed) {
        0 => None,
        sp => find_at(sp),
    }?;
    FOUND_END.store(block.end, Ordering::Relaxed);
    FOUND_AT.store(block.at, Ordering::Release);
    Some(block)
}

/// The block [`at_load`] found, kept: it lies where the kernel wrote it for the life of
/// the image (a forked child, or a `vfork` child that stores it into its parent's memory,
/// shares the same one). 0: not found yet.
static FOUND_AT: AtomicUsize = AtomicUsize::new(0);
static FOUND_END: AtomicUsize = AtomicUsize::new(0);

/// [`find`] from the initial stack pointer itself.
fn find_at(sp: usize) -> Option<Block> {
    // SAFETY: getauxval has no preconditions.
    let end = unsafe { libc::getauxval(libc::AT_EXECFN) } as usize;
    if sp == 0 || !sp.is_multiple_of(8) || end <= sp || end - sp > MAX_SPAN {
        return None;
    }
    // `argc` is the word at the stack pointer itself, the only read outside (sp, end).
    let st = Stack { sp: sp - 8, end };
    let argc = st.word(sp)?;
    let argv = sp + 8;
    let envp = argv.checked_add(argc.checked_add(1)?.checked_mul(8)?)?;
    if argc == 0 || argc > MAX_ARGS || st.word(envp - 8)? != 0 {
        return None;
    }
    // The argument strings, each right after the one before: the last one's end is the
    // environment's start.
    let mut at = st.word(argv)?;
    for i in 0..argc {
        if st.word(argv + 8 * i)? != at || !st.inside(at) {
            return None;
        }
        at = st.string_end(at)?;
    }
    let start = at;
    // `envp[0]`, where it still points into the block, is its start (an `unsetenv` that
    // moved a later entry there says the array is not the kernel's any more).
    let first = st.word(envp)?;
    if (first >= start && first < end && first != start) || end - start > MAX {
        return None;
    }
    // The block ends with its last string's NUL, right before the executable's name.
    if start < end && st.byte(end - 1)? != 0 {
        return None;
    }
    Some(Block { at: start, end })
}
