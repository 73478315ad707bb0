//! The embedded eBPF capture program: loading it with its configuration and map sizes, attaching
//! it to perf counters, and the maps the agent reads.

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf, StackTraceMap},
    programs::PerfEvent,
    Ebpf, EbpfLoader,
};
use perf_event::Counter;
use profiler_common::{
    capture::{
        CaptureConfig, DataLineKey, DataSourceKey, InstructionKey, LatencyKey, LineLatencyKey,
        RawDecoding, SampleStats, StackKey,
    },
    latency::LatencyBuckets,
};

/// The capture program, built from `profiler-ebpf/` by build.rs.
static PROGRAM_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler.bpf.o"));
const PROGRAM_NAME: &str = "on_overflow";

/// Entries of each in-kernel map. Per-CPU maps hold one value per possible CPU for each entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Distinct call stacks per generation.
    pub stacks: u32,
    /// Distinct (thread, event, stacks) per generation.
    pub stack_counts: u32,
    pub instructions: u32,
    pub data_lines: u32,
    /// Latency histograms, per instruction and (as many again) per data cache line.
    pub latencies: u32,
    /// Bytes of the raw-sample ring buffer (`record --raw`); a power of two.
    pub ring_buffer_bytes: u32,
    /// Bytes of the IBS register ring buffer; a power of two.
    pub ibs_ring_bytes: u32,
}

/// The smallest ring buffer the kernel takes: one page.
const SMALLEST_RING_BYTES: u32 = 4096;

impl MapSizes {
    /// These sizes with the maps a recording cannot fill cut to their smallest, so it locks no
    /// kernel memory for them (a histogram takes 960 bytes per entry and CPU).
    pub fn fitted(self, latencies: bool, raw: bool, ibs: bool) -> MapSizes {
        MapSizes {
            latencies: if latencies { self.latencies } else { 1 },
            ring_buffer_bytes: if raw {
                self.ring_buffer_bytes
            } else {
                SMALLEST_RING_BYTES
            },
            ibs_ring_bytes: if ibs {
                self.ibs_ring_bytes
            } else {
                SMALLEST_RING_BYTES
            },
            ..self
        }
    }
}

impl Default for MapSizes {
    fn default() -> Self {
        MapSizes {
            stacks: 16384,
            stack_counts: 16384,
            instructions: 16384,
            data_lines: 16384,
            latencies: 1024,
            ring_buffer_bytes: 1 << 22,
            ibs_ring_bytes: 1 << 22,
        }
    }
}

/// The ring buffers the program streams through.
#[derive(Clone, Copy, Debug)]
pub enum Ring {
    /// Every sample, with `record --raw`.
    RawSamples,
    /// The registers of IBS samples.
    IbsSamples,
}

/// The maps of one generation, drained together.
pub struct GenerationMaps {
    pub stacks: StackTraceMap<MapData>,
    pub stack_counts: PerCpuHashMap<MapData, StackKey, u64>,
    pub instructions: PerCpuHashMap<MapData, InstructionKey, SampleStats>,
    pub data_lines: PerCpuHashMap<MapData, DataLineKey, SampleStats>,
    pub latencies: PerCpuHashMap<MapData, LatencyKey, LatencyBuckets>,
    pub line_latencies: PerCpuHashMap<MapData, LineLatencyKey, LatencyBuckets>,
    pub data_sources: PerCpuHashMap<MapData, DataSourceKey, u64>,
}

pub struct CaptureProgram {
    ebpf: Ebpf,
    pub generations: [GenerationMaps; 2],
    pub control: Array<MapData, u32>,
    pub inflight: PerCpuArray<MapData, u64>,
    pub new_keys: PerCpuArray<MapData, u64>,
    pub samples_fired: PerCpuArray<MapData, u64>,
    pub samples_filtered: PerCpuArray<MapData, u64>,
    pub period_sums: PerCpuArray<MapData, u64>,
    pub losses: PerCpuArray<MapData, u64>,
    event_ids: HashMap<MapData, u64, u32>,
    cgroup_filter: HashMap<MapData, u64, u8>,
    raw_samples: Option<RingBuf<MapData>>,
    ibs_samples: Option<RingBuf<MapData>>,
}

fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &str,
) -> Result<T> {
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| anyhow!("the capture program has no map {name}"))?;
    T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))
}

fn take_generation(ebpf: &mut Ebpf, generation: usize) -> Result<GenerationMaps> {
    Ok(GenerationMaps {
        stacks: take(ebpf, &format!("STACKS_{generation}"))?,
        stack_counts: take(ebpf, &format!("STACK_COUNTS_{generation}"))?,
        instructions: take(ebpf, &format!("INSTRUCTIONS_{generation}"))?,
        data_lines: take(ebpf, &format!("DATA_LINES_{generation}"))?,
        latencies: take(ebpf, &format!("LATENCIES_{generation}"))?,
        line_latencies: take(ebpf, &format!("LINE_LATENCIES_{generation}"))?,
        data_sources: take(ebpf, &format!("DATA_SOURCES_{generation}"))?,
    })
}

impl CaptureProgram {
    /// Loads the program with its options; the verifier runs here.
    pub fn load(
        config: &CaptureConfig,
        raw: &RawDecoding,
        sizes: &MapSizes,
    ) -> Result<CaptureProgram> {
        let mut loader = EbpfLoader::new();
        loader
            .override_global("CAPTURE_CONFIG", config, true)
            .override_global("RAW_DECODING", raw, true);
        for generation in ["0", "1"] {
            let size = |name: &str| -> &'static str {
                Box::leak(format!("{name}_{generation}").into_boxed_str())
            };
            loader
                .map_max_entries(size("STACKS"), sizes.stacks)
                .map_max_entries(size("STACK_COUNTS"), sizes.stack_counts)
                .map_max_entries(size("INSTRUCTIONS"), sizes.instructions)
                .map_max_entries(size("DATA_LINES"), sizes.data_lines)
                .map_max_entries(size("LATENCIES"), sizes.latencies)
                .map_max_entries(size("LINE_LATENCIES"), sizes.latencies)
                .map_max_entries(size("DATA_SOURCES"), sizes.data_lines);
        }
        loader
            .map_max_entries("RAW_SAMPLES", sizes.ring_buffer_bytes)
            .map_max_entries("IBS_SAMPLES", sizes.ibs_ring_bytes);
        let mut ebpf = loader.load(PROGRAM_OBJECT).map_err(|e| {
            anyhow!(
                "loading the eBPF capture program failed: {e}\nThe profiler needs root (or \
                 CAP_BPF + CAP_PERFMON) and a kernel with BPF perf_event programs."
            )
        })?;
        let program: &mut PerfEvent = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or_else(|| anyhow!("the capture program has no {PROGRAM_NAME}"))?
            .try_into()?;
        // The verifier log tells what the kernel refused: keep it in the error.
        program
            .load()
            .map_err(|e| anyhow!("the kernel verifier rejected the capture program: {e:?}"))?;
        let generations = [
            take_generation(&mut ebpf, 0)?,
            take_generation(&mut ebpf, 1)?,
        ];
        Ok(CaptureProgram {
            generations,
            control: take(&mut ebpf, "CONTROL")?,
            inflight: take(&mut ebpf, "INFLIGHT")?,
            new_keys: take(&mut ebpf, "NEW_KEYS")?,
            samples_fired: take(&mut ebpf, "SAMPLES_FIRED")?,
            samples_filtered: take(&mut ebpf, "SAMPLES_FILTERED")?,
            period_sums: take(&mut ebpf, "PERIOD_SUMS")?,
            losses: take(&mut ebpf, "LOSSES")?,
            event_ids: take(&mut ebpf, "EVENT_IDS")?,
            cgroup_filter: take(&mut ebpf, "CGROUP_FILTER")?,
            raw_samples: Some(take(&mut ebpf, "RAW_SAMPLES")?),
            ibs_samples: Some(take(&mut ebpf, "IBS_SAMPLES")?),
            ebpf,
        })
    }

    fn program(&self) -> Result<&PerfEvent> {
        Ok(self
            .ebpf
            .program(PROGRAM_NAME)
            .ok_or_else(|| anyhow!("the capture program has no {PROGRAM_NAME}"))?
            .try_into()?)
    }

    /// Runs the program on every overflow of `counter` (PERF_EVENT_IOC_SET_BPF). Inherited
    /// child counters (threads, children) run it too.
    pub fn attach(&self, counter: &mut Counter) -> Result<()> {
        let fd = self.program()?.fd()?.as_fd().as_raw_fd();
        counter
            .set_bpf(fd)
            .context("attaching the capture program to a perf event (PERF_EVENT_IOC_SET_BPF)")
    }

    /// Maps a perf event id to the index of its event, so samples are tagged with their event.
    pub fn register_event(&mut self, perf_event_id: u64, index: u32) -> Result<()> {
        self.event_ids
            .insert(perf_event_id, index, 0)
            .context("registering a perf event id with the capture program")
    }

    /// Keeps only samples of these cgroups (with `CAPTURE_FILTER_CGROUP`).
    pub fn filter_cgroups(&mut self, cgroup_ids: &[u64]) -> Result<()> {
        for id in cgroup_ids {
            self.cgroup_filter
                .insert(id, 1, 0)
                .context("filling the cgroup filter map")?;
        }
        Ok(())
    }

    /// A ring buffer of the program, handed to its reader once.
    pub fn take_ring(&mut self, ring: Ring) -> Result<RingBuf<MapData>> {
        let slot = match ring {
            Ring::RawSamples => &mut self.raw_samples,
            Ring::IbsSamples => &mut self.ibs_samples,
        };
        slot.take()
            .ok_or_else(|| anyhow!("the {ring:?} ring buffer was already taken"))
    }

    /// The kernel's run-time statistics of the program: (runs, total run time). Zero unless
    /// `kernel.bpf_stats_enabled` is 1.
    pub fn run_statistics(&self) -> Result<(u64, std::time::Duration)> {
        let info = self.program()?.info()?;
        Ok((info.run_count(), info.run_time()))
    }
}
