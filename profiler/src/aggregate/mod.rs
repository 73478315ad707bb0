//! Aggregation of a profile into the rows that reports show.

pub mod functions;
