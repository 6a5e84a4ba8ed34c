//! `RANKGUARD_NARROW_BY=VAR`: the guard narrows `CUDA_VISIBLE_DEVICES` to the rank's entry
//! itself, as `rankguard run --narrow-by VAR` does, so a cluster can inject the guard (Slurm
//! TaskProlog, a CDI spec, a Ray runtime_env) without a wrapper in the job's command
//! (docs/design.md, "Narrowing without a wrapper").
//!
//! When it runs: from the library's one `.init_array` entry, when the loader initialises the
//! preloaded library, before the program's `main` and before any of its constructors that
//! run after ours. That is the only moment early enough: CPython copies `environ` into
//! `os.environ` when its `posix` module starts, torch counts from `os.environ`, and the
//! driver reads the variable at `cuInit`.
//!
//! What it touches, and why that is safe there:
//! - unset (every process that was not asked): one pass over `envp`, the array the loader
//!   hands to every constructor, comparing each entry's first bytes with the name (most
//!   stop at the first byte); no call, no store, no allocation, no saved register (the rest
//!   is out of line, [`when_asked`]). Nothing else runs: ~6 instructions per variable,
//!   with the entry's call and its relocation ~35 more (docs/benchmarks.md, "What the
//!   loader's added instructions are made of").
//! - set: only the environment. It reads a few variables (`getenv`) and sets at most three
//!   (`setenv`: `CUDA_VISIBLE_DEVICES`, `RANKGUARD_RANK_GPU`, `RANKGUARD_RANK_GPU_UUID`),
//!   which allocates. `setenv` is looked up then (the C library's `dlsym`), not imported:
//!   an import is a lazy slot the loader relocates in every process. At the initial load only the loader's thread exists and no code of
//!   the program has run, so nobody can hold the environment or allocator locks or read
//!   `environ` concurrently. The rule is `rankguard_core::narrow::at_load` (the same
//!   function as `run`'s); no driver call, no file, no thread.
//! - skipped: in a secure-execution process (as the rest of the guard), when the guard is
//!   not in `LD_PRELOAD` (loaded with `dlopen` later, where other threads may read the
//!   environment, and the guard is inert anyway), and inside a rank (`RANKGUARD_RANK_GPU`
//!   set): a descendant keeps its rank's GPU and is judged by R1, never narrowed again.
//! - a bad or missing value: nothing is changed, the error is kept, and the first `cuInit`
//!   says it in one line and fails closed ([`report_at_init`]); a process that never
//!   touches CUDA (the launcher, a shell) is not disturbed.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use crate::config::Mode;
use crate::guard::output::line::say;
use crate::guard::resolve::dl;
use crate::guard::sys::lifecycle::ForkSafeCell;
use rankguard_core::narrow;

type Init = extern "C" fn(c_int, *const *const c_char, *const *const c_char);
type SetenvFn = unsafe extern "C" fn(*const c_char, *const c_char, c_int) -> c_int;

/// The library's only load-time code (glibc passes argc, argv and envp to each entry).
#[used]
#[link_section = ".init_array"]
static AT_LOAD: Init = at_load;

/// Why narrowing at load failed, said at the first `cuInit`.
static ERROR: ForkSafeCell<String> = ForkSafeCell::new();

extern "C" fn at_load(_argc: c_int, argv: *const *const c_char, envp: *const *const c_char) {
    // Whose image this is and where its start block lies, for the lineage note of the
    // `exec` hooks and the start environment (one `getpid`, one store).
    crate::guard::process::lineage::at_load();
    crate::guard::sys::start_block::remember_at_load(argv);
    if asked(envp) {
        when_asked();
    }
}

/// Out of line, so that the entry every process runs is the scan of `envp` alone (no frame,
/// no saved registers: what the narrowing needs is set up here, when it is asked).
#[cold]
#[inline(never)]
fn when_asked() {
    // Never unwind into the loader.
    let _ = std::panic::catch_unwind(narrow_now);
}

/// Whether `envp` holds `RANKGUARD_NARROW_BY=`: the cheap test every process pays.
#[inline(always)]
fn asked(envp: *const *const c_char) -> bool {
    const KEY: &[u8] = b"RANKGUARD_NARROW_BY=";
    if envp.is_null() {
        return false;
    }
    let mut p = envp;
    loop {
        // SAFETY: `envp` is the NULL-terminated array of NUL-terminated strings the loader
        // passes to constructors; we stop at its NULL.
        let s = unsafe { *p };
        if s.is_null() {
            return false;
        }
        if starts_with_key(s, KEY) {
            return true;
        }
        // SAFETY: `s` was not the terminating NULL, so the next element exists.
        p = unsafe { p.add(1) };
    }
}

/// Whether the NUL-terminated `s` starts with `key`, byte by byte (no call: `strlen` would
/// be a libc binding at every process start). A mismatch, the NUL included, stops the loop
/// before any byte past it is read.
#[inline(always)]
fn starts_with_key(s: *const c_char, key: &[u8]) -> bool {
    for (i, k) in key.iter().enumerate() {
        // SAFETY: bytes 0..i matched `key`, which has no NUL, so the string's NUL is not
        // before byte i: byte i is inside the string or is its NUL.
        if unsafe { *s.add(i) } as u8 != *k {
            return false;
        }
    }
    true
}

fn lookup(name: &str) -> Option<String> {
    let key = CString::new(name).ok()?;
    // SAFETY: `key` is NUL-terminated; getenv returns NULL or a pointer into the
    // environment, copied at once (nothing changes it meanwhile: single-threaded load).
    let p = unsafe { libc::getenv(key.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL getenv result is a NUL-terminated string.
    Some(String::from_utf8_lossy(unsafe { CStr::from_ptr(p) }.to_bytes()).into_owned())
}

fn narrow_now() {
    // SAFETY: getauxval has no preconditions.
    if unsafe { libc::getauxval(libc::AT_SECURE) } != 0 {
        return;
    }
    let preloaded = lookup("LD_PRELOAD").is_some_and(|v| {
        v.split([':', ' ', '\t'])
            .any(|i| i.rsplit('/').next() == Some("librankguard.so"))
    });
    if !preloaded {
        return;
    }
    match narrow::at_load(lookup) {
        None => {}
        Some(Err(e)) => ERROR.set(e),
        Some(Ok(vars)) => {
            // Looked up now, not imported: an import is a relocation in every process.
            let p = dl::lookup(libc::RTLD_DEFAULT, c"setenv");
            if p.is_null() {
                let var = narrow::VAR; // a local: `{}` of the constant is a relocation
                ERROR.set(format!(
                    "rankguard: {var} is set but the C library's setenv was not found, so \
                     CUDA_VISIBLE_DEVICES could not be narrowed; narrow it with `rankguard run --narrow-by` instead"
                ));
                return;
            }
            // SAFETY: `p` is the C library's `setenv`, whose C signature is SetenvFn.
            let setenv = unsafe { std::mem::transmute::<*mut c_void, SetenvFn>(p) };
            for (k, v) in vars {
                let (Ok(k), Ok(v)) = (CString::new(k), CString::new(v)) else {
                    continue;
                };
                // SAFETY: both strings are NUL-terminated; single-threaded at load (see the
                // module doc), so no other thread reads the environment meanwhile.
                unsafe { setenv(k.as_ptr(), v.as_ptr(), 1) };
            }
        }
    }
}

/// At the first `cuInit`: a narrowing that failed at load is said in one line and, except
/// in warn mode, the process stops with `status` (R1's, given by the caller, init_check:
/// fail closed, it was never given its rank's GPU).
pub fn report_at_init(mode: Mode, status: i32) {
    let Some(e) = ERROR.get() else { return };
    let stop = mode != Mode::Warn;
    if stop {
        say(
            "WARN",
            format_args!("{e} (terminating, exit status {status})"),
        );
    } else {
        say("WARN", format_args!("{e}"));
    }
    if stop {
        // SAFETY: _exit has no preconditions (init_check says why not exit()).
        unsafe { libc::_exit(status) }
    }
}
