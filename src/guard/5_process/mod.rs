//! Per-process state: configuration, the rank root, the driver's facts.

pub mod driver_query;
pub mod lineage;
pub mod registry_io;
pub mod root_walk;
pub mod start_env;
pub mod state;
