//! Aggregation of a profile into the rows that reports show.

pub mod callgraph;
pub mod code;
pub mod dataspace;
pub mod details;
pub mod filter;
pub mod functions;
pub mod latency;
pub mod location;
pub mod offcpu;
pub mod stack_quality;
pub mod startup;
#[cfg(test)]
pub mod test_samples;
pub mod views;
