//! Draining the off-CPU maps of a generation: blocked time and block-duration histograms per
//! (thread, stacks, state), merged over CPUs and drains.

use std::collections::HashMap;

use anyhow::Result;
use profiler_common::{
    latency::LATENCY_BUCKETS,
    offcpu::{OffCpuCount, OffCpuKey, OffCpuStats, Waker},
};

use super::{stacks::StackCache, take_all};
use crate::capture::offcpu::OffCpuMaps;

/// Blocked time of one key, with its durations' histogram (counts per bucket).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainedBlocks {
    pub stats: OffCpuStats,
    pub buckets: Vec<u64>,
}

/// Everything the switch programs counted, by key with stack hashes as the stack cache
/// resolves them.
#[derive(Debug, Default)]
pub struct DrainedOffCpu {
    pub blocks: HashMap<OffCpuKey, DrainedBlocks>,
    /// The programs' counters over the window, by `OffCpuCount` index.
    pub counts: [u64; OffCpuCount::COUNT],
    /// How the switches were seen: `None` when off-CPU time was not recorded.
    pub attachment: Option<&'static str>,
    pub min_block_ns: u64,
}

/// One generation's entries, taken out of the kernel, before their stacks are read.
pub struct TakenGeneration {
    stats: Vec<(OffCpuKey, Vec<OffCpuStats>)>,
    histograms: Vec<(OffCpuKey, Vec<profiler_common::latency::LatencyBuckets>)>,
}

impl TakenGeneration {
    /// Reads and clears the maps of a generation no program writes any more.
    pub fn take(maps: &mut OffCpuMaps) -> Result<TakenGeneration> {
        Ok(TakenGeneration {
            stats: take_all(&mut maps.stats)?,
            histograms: take_all(&mut maps.histograms)?,
        })
    }

    /// The stack hashes the entries refer to.
    pub fn stack_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.stats.iter().flat_map(|(key, _)| key.stack_hashes())
    }

    /// Adds the entries, whose stacks are in `cache` now, to `into`.
    pub fn add_to(self, cache: &StackCache, into: &mut DrainedOffCpu) {
        let resolved = |key: OffCpuKey| OffCpuKey {
            user_stack: cache.resolve(key.user_stack),
            kernel_stack: cache.resolve(key.kernel_stack),
            waker: Waker {
                user_stack: cache.resolve(key.waker.user_stack),
                kernel_stack: cache.resolve(key.waker.kernel_stack),
                ..key.waker
            },
            ..key
        };
        fn entry(
            blocks: &mut HashMap<OffCpuKey, DrainedBlocks>,
            key: OffCpuKey,
        ) -> &mut DrainedBlocks {
            blocks.entry(key).or_insert_with(|| DrainedBlocks {
                stats: OffCpuStats::default(),
                buckets: vec![0; LATENCY_BUCKETS],
            })
        }
        for (key, per_cpu) in self.stats {
            let blocks = entry(&mut into.blocks, resolved(key));
            per_cpu.iter().for_each(|cpu| blocks.stats.merge(cpu));
        }
        for (key, per_cpu) in self.histograms {
            let blocks = entry(&mut into.blocks, resolved(key));
            for cpu in &per_cpu {
                for (total, count) in blocks.buckets.iter_mut().zip(cpu.counts.iter()) {
                    *total += u64::from(*count);
                }
            }
        }
    }
}
