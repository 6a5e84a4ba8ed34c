//! `rankguard`: the command line half of the one-rank-one-GPU contract.
//!
//! A thin binary over the pure crate `rankguard-core` (crates/core), which the preload
//! library uses too: the CVD parser, the job id, the rank-GPU identity, the mode, rule
//! names and records are computed there once for both. The binary never links the preload
//! library (a cdylib that exports CUDA and `dlsym` symbols). Unsafe code is denied here and
//! allowed only in `cli/sys.rs`, the FFI module.
#![deny(unsafe_code)]
// Inside an `unsafe fn` every unsafe operation still sits in its own `unsafe {}` block, and
// every block says why it is sound (`// SAFETY:`).
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
// The entry point is `main` below, a C `main`: std's own start-up (`lang_start`) reads
// /proc/self/maps to find the main thread's stack for its stack-overflow guard, ~0.2 ms of
// every launch on the reference VM (docs/benchmarks.md, figure 4). What the CLI needs of
// that start-up, `cli::sys::start` does itself. Test builds keep the harness's main.
#![cfg_attr(not(test), no_main)]

use rankguard_core::{audit, config, cvd, jobid, rankgpu};

mod cli;
// CPU sets, the node's topology and the placement plan: the CLI's own (`launch`, `plan`).
mod cpuset;
mod plan;
mod topology;

/// The process's entry point (`#![no_main]` above): the CLI, which does the start-up it
/// needs itself (`cli::main`).
// `unsafe_code` is allowed for `no_mangle` alone (the symbol is the C `main`); no unsafe
// operation is done here.
#[allow(unsafe_code)]
#[cfg_attr(not(test), no_mangle)]
// In test builds the harness has the entry point; this one stays, so that what it calls is
// still seen as used.
#[cfg_attr(test, allow(dead_code))]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    cli::main()
}
