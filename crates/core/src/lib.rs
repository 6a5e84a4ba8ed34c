//! rankguard-core: every fact the preload library (`librankguard.so`) and the `rankguard`
//! CLI both need, computed in one place so the two cannot drift (docs/design.md, "Layout").
//!
//! - [`cvd`]: `CUDA_VISIBLE_DEVICES`, parsed as the CUDA runtime reads it;
//! - [`config`]: the `RANKGUARD_*` variables, the guard's mode and the rank identity;
//! - [`jobid`]: the job id both sides derive from the launcher's variables;
//! - [`narrow`]: one rank's CVD entry (`run --narrow-by` and `RANKGUARD_NARROW_BY`);
//! - [`policy`]: the contract's rules (names, fixes) and the verdict of each guarded call;
//! - [`rankgpu`]: whether a process sees its rank's GPU (R1), for the guard and `check`;
//! - [`uuid`]: the text of a GPU or MIG UUID;
//! - [`envbytes`]: an environment block's entries and the guard's `LD_PRELOAD`;
//! - [`rank_root`]: the rank root's identity (the pure part; the guard finds it);
//! - [`registry`]: the IPC provenance registry's records and files;
//! - [`record`]: the one typed audit record, rendered as the stderr line and as JSON;
//! - [`audit`]: reading audit files back and aggregating them (`rankguard report`);
//! - [`strtab`]: strings picked by index without a table of pointers (the loader's work).
//!
//! Pure and safe: no `unsafe`, no exported symbols, nothing that runs at load time.
#![forbid(unsafe_code)]

pub mod audit;
pub mod config;
pub mod cvd;
pub mod envbytes;
pub mod handle_table;
pub mod jobid;
pub mod json;
pub mod lineage;
pub mod narrow;
pub mod policy;
pub mod rank_root;
pub mod rankgpu;
pub mod record;
pub mod registry;
pub mod strtab;
pub mod uuid;
