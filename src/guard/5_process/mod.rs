//! Per-process state: configuration, the rank root, the driver's facts.

pub mod driver_query;
pub mod rank_root;
pub mod registry_io;
pub mod start_env;
pub mod state;
