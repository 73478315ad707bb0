//! Building a [`crate::profile::Profile`]: live recordings, agent windows and perf.data imports
//! alike.

pub mod drained;
pub mod offcpu;

/// Sparse `(bucket, count)` pairs of a drained histogram.
pub fn sparse_buckets(buckets: &[u64]) -> Vec<(u16, u64)> {
    buckets
        .iter()
        .enumerate()
        .filter(|(_, count)| **count > 0)
        .map(|(bucket, count)| (bucket as u16, *count))
        .collect()
}
