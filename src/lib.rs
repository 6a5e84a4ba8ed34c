//! librankguard.so: preloaded into every process of a rank (`LD_PRELOAD`), it enforces the
//! one-rank-one-GPU contract (docs/design.md §1) on every path a program reaches CUDA by.
//!
//! The facts it shares with the CLI (CUDA_VISIBLE_DEVICES, configuration, job identity,
//! policy, records) live in the pure crate `rankguard-core` (crates/core), imported here
//! under their module names; only `guard`, the interposition layer, contains `unsafe`.
//! Nothing runs at load time: a process that never touches CUDA is never affected.
#![deny(unsafe_code)]
// The unsafe wall (docs/design.md §2): inside an `unsafe fn` every unsafe operation still
// sits in its own `unsafe {}` block, and every block says why it is sound (`// SAFETY:`).
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use rankguard_core::{config, cvd, handle_table, lineage, policy, rank_root, rankgpu, registry};

mod guard;
