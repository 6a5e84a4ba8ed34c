//! The real `exec*` functions behind the shims of `hooks::exec`: their names and slots, and
//! their resolution, here so that the tally (which resolves them all at a process's first
//! violation) needs nothing from the entry layer.
//!
//! x86-64 only, as the shims: elsewhere nothing is interposed and nothing is resolved.

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::guard::resolve::real;
    // The interposed functions, by the index each shim passes (generated from guarded.spec's
    // `exec:` line, as the shims are).
    use crate::guard::table::EXEC_NAMES as NAMES;

    static REAL: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

    /// Resolve every real function now (a process's first violation, `tally.rs`), so that a
    /// `vfork` child's exec never has to call `dlsym` (which takes the loader's lock).
    pub fn resolve_all() {
        for which in 0..NAMES.len() {
            get(which);
        }
    }

    /// The real function of shim `which`, resolved on first use; 0 when it cannot be found
    /// (or `which` is out of range).
    pub fn get(which: usize) -> usize {
        let (Some(slot), Some(name)) = (REAL.get(which), NAMES.get(which)) else {
            return 0;
        };
        let mut p = slot.load(Ordering::Acquire);
        if p == 0 {
            p = real::lookup(libc::RTLD_NEXT, name) as usize;
            if p != 0 {
                slot.store(p, Ordering::Release);
            }
        }
        p
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::get;

/// See `x86::resolve_all`; nothing to resolve where nothing is interposed.
pub fn resolve_all() {
    #[cfg(target_arch = "x86_64")]
    x86::resolve_all();
}
