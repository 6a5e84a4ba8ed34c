//! librankguard.so: preloaded into every process of a rank (`LD_PRELOAD`), it enforces the
//! one-rank-one-GPU contract (docs/design.md §1) on every path a program reaches CUDA by.
//!
//! Safe, pure modules hold the logic (`cvd`, `config`, `policy`); only `guard`, the
//! interposition layer, contains `unsafe`. Nothing runs at load time: a process that never
//! touches CUDA is never affected.
#![deny(unsafe_code)]

pub mod config;
pub mod cvd;
pub mod jobid;
pub mod policy;
pub mod rank_root;
pub mod rankgpu;
pub mod registry;

#[allow(unsafe_code)]
mod guard;
