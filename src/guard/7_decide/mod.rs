//! Decisions: R1 at `cuInit`, R2-R4 on the arguments of guarded calls, the verdict engine.

pub mod end_rank;
pub mod init_check;
pub mod ipc;
pub mod missing;
pub mod reach;
pub mod verdict;
