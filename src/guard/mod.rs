//! The interposer: everything that runs inside other people's processes.
//!
//! Eight layers, one numbered folder each (`1_sys` .. `8_hooks`; the order and what each
//! holds: docs/design.md §2), imports running only downward
//! (python-tests/test_architecture.py). The entry points all hand out the same wrappers
//! from one table ([`table`]): exported symbols, the `dlsym` override ([`hooks::dlsym`]),
//! `cuGetProcAddress` and `cuGetProcAddress_v2`, and `cudaGetDriverEntryPoint(ByVersion)`
//! (routing in [`hooks::route`]).
//!
//! Life cycle: at load time only [`decide::narrow`] looks at `envp` (and acts only when
//! `RANKGUARD_NARROW_BY` is set). The first guarded call reads the configuration
//! ([`process::state`]); the first `cuInit` that reaches the guard checks R1. The hot path of an
//! allowed call is one atomic load of the real function and the policy's integer compare.
//!
//! `unsafe` is denied for the crate (`src/lib.rs`); each file that needs it (FFI,
//! interposition, lock-free cells) says `#![allow(unsafe_code)]` at its top, and each block
//! carries a `SAFETY:` comment.

// The layers, lowest first: each folder's number is its place; a module imports only from
// its own layer or a lower one (python-tests/test_architecture.py).
#[path = "6_audit/mod.rs"]
pub mod audit;
#[path = "7_decide/mod.rs"]
pub mod decide;
#[path = "8_hooks/mod.rs"]
pub mod hooks;
#[path = "3_output/mod.rs"]
pub mod output;
#[path = "5_process/mod.rs"]
pub mod process;
#[path = "4_resolve/mod.rs"]
pub mod resolve;
#[path = "1_sys/mod.rs"]
pub mod sys;
#[path = "2_table/mod.rs"]
pub mod table;
