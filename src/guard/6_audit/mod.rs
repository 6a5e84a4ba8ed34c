//! Records: the audit records and lines of decisions, the tally of repeated ones, call sites.

pub mod decision_record;
pub mod map_record;
pub mod site;
pub mod tally;
