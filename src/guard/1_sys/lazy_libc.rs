//! The C library functions std calls through the GOT, bound on first use.
//!
//! std's precompiled code calls `malloc`, `free`, `memcpy`, `opendir`, `pthread_create`...
//! through GOT entries, which the loader fills by a symbol lookup at every process start,
//! CUDA or not, though a process that never touches CUDA never calls them from the guard
//! (48 lookups: 37,000 of the 52,600 loader instructions the library added to `/bin/true`'s
//! start-up, docs/benchmarks.md, "Binding std's C calls on first use"). build.rs links the library
//! with `--wrap=NAME` for each of them and writes a stub per name, `__wrap_NAME: jmp
//! __real_NAME@PLT`, assembled here: the GOT entries then point into the library (relative
//! relocations, no lookup) and each stub reaches the real function through a lazy PLT slot,
//! bound by the loader on its first call like the library's own calls.
//!
//! The stubs only jump: no stack, no register touched, so arguments, return values and
//! `errno` pass through as they would. Other objects' definitions still win as before
//! (the PLT slot is an ordinary lookup of the same name and version, so a preloaded
//! allocator's `malloc` is the one called). Only the unit-test harness, linked without the
//! `--wrap` arguments, goes without them.
#![allow(unsafe_code)]

// SAFETY: each stub is a single tail jump to the real function's PLT slot, defined hidden
// (nothing outside the library can call it), and referenced only through the linker's
// `--wrap` renaming of the same name, so every caller already calls it with the real
// function's signature and ABI.
#[cfg(all(not(test), rankguard_lazy_libc))]
core::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/lazy_libc.s")));
