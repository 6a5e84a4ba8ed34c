//! Decisions: R1 at `cuInit` (and the narrowing at load it reports, [`narrow`]), R2-R4 on the arguments of guarded calls, the verdict engine.

pub mod end_rank;
pub mod event_records;
pub mod init_check;
pub mod ipc;
pub mod missing;
pub mod narrow;
pub mod own_records;
pub mod reach;
pub mod verdict;
