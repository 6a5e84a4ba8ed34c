//! `rankguard`: the command line half of the one-rank-one-GPU contract.
//!
//! A thin binary over pure modules shared with the preload library. It declares those
//! modules itself (the library is a cdylib that exports CUDA and `dlsym` symbols, so the CLI
//! must never link it) and never declares the interposition modules (`guard`). Unsafe code is
//! denied here and allowed only in `cli/sys.rs`, the FFI module.
#![deny(unsafe_code)]

// Shared with librankguard.so; the CLI uses only part of its API.
#[allow(dead_code)]
mod cvd;
// Reading audit files back (`rankguard report`).
mod audit;
mod cli;
mod cpuset;
// The job id, derived by the same function as the guard's (`config.rs`).
mod jobid;
mod plan;
// Whether a process sees its rank's GPU: the guard's R1 decision, shared with `check`.
mod rankgpu;
mod topology;

fn main() -> std::process::ExitCode {
    cli::main()
}
