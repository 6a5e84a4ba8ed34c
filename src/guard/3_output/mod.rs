//! Output: the files the guard writes (audit file, debug log) and the debug log's lines.

pub mod debug_log;
pub mod line;
pub mod sink;
