//! The interposer: everything that runs inside other people's processes.
//!
//! Layers (docs/design.md §2), all handing out the same wrappers from one table
//! ([`table`]): exported symbols, the `dlsym` override ([`dlsym`]), `cuGetProcAddress`
//! and `cuGetProcAddress_v2`, and `cudaGetDriverEntryPoint(ByVersion)` (routing in
//! [`route`]).
//!
//! Life cycle: nothing runs at load time. The first guarded call reads the configuration
//! ([`state`]); the first `cuInit` that reaches the guard checks R1. The hot path of an
//! allowed call is one atomic load of the real function and the policy's integer compare.
//!
//! `unsafe` is allowed for this module and everything below it (the crate root says so
//! where it declares `mod guard`); each block carries a `SAFETY:` comment.

// `table` first: its macros must be defined before `wrappers` uses them.
#[macro_use]
pub mod table;
pub mod debug_log;
pub mod decision_record;
pub mod dlsym;
pub mod dlvsym;
pub mod driver_query;
pub mod elfsym;
pub mod exec;
pub mod ffi;
pub mod init_check;
pub mod internal;
pub mod ipc;
pub mod layout;
pub mod lazy_libc;
pub mod libcsym;
pub mod majors;
pub mod missing;
pub mod once;
pub mod pyframes;
pub mod rank_root;
pub mod reach;
pub mod real;
pub mod route;
pub mod signal_safe;
pub mod sink;
pub mod site;
pub mod state;
pub mod tally;
pub mod verdict;
pub mod wrappers;
