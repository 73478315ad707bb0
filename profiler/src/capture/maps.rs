//! The in-kernel maps of the capture program and the off-CPU programs: how many entries each
//! gets (and the defaults that size them to the sampling rate and the host), and taking maps
//! and tail-call program arrays out of a loaded object.

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{MapData, ProgramArray},
    programs::ProgramFd,
    Ebpf,
};
use profiler_common::{
    capture::{Fill, SampleStats},
    stack::StackFrames,
};

use super::stats::{MapMemory, HOST_CPUS};

/// Entries of each in-kernel map. Per-CPU maps hold one value per possible CPU for each entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Distinct call stacks the kernel holds until the agent takes them (the stack-frames map,
    /// shared by both generations; 1 KiB each).
    pub stacks: u32,
    /// Distinct (thread, event, stacks) per generation.
    pub stack_counts: u32,
    pub instructions: u32,
    pub data_lines: u32,
    /// Latency histograms, per instruction and (as many again) per data cache line.
    pub latencies: u32,
    /// `--off-cpu` (thread, stacks, state) keys per generation: blocks come at the rate
    /// threads switch, not at the sampling rate.
    pub off_cpu_blocks: u32,
    /// `--off-cpu` block-duration histograms per generation (960 bytes per entry and CPU).
    pub off_cpu_histograms: u32,
    /// Bytes of the raw-sample ring buffer (`record --raw`); a power of two.
    pub ring_buffer_bytes: u32,
    /// Bytes of the IBS register ring buffer; a power of two.
    pub ibs_ring_bytes: u32,
    /// Bytes of the stack-copy ring buffer (`record --unwind copy`); a power of two.
    pub stack_copy_ring_bytes: u32,
    /// Stack-copy scratch records (one per possible CPU with `--unwind copy`, else 1).
    pub stack_copy_scratch: u32,
    /// Entries the default sizing would give the sample maps on a [`HOST_CPUS`]-CPU host at
    /// the same rate (`None` when `--map-entries` sets them): what `--stats` projects to.
    pub host_sample_entries: Option<u32>,
    /// The same for the stack-frames map (`None` when `--stack-map-entries` sets it).
    pub host_stacks: Option<u32>,
    /// Rows of the unwind-table arena (`record --unwind dwarf`).
    pub unwind_rows: u32,
    /// Processes whose mappings the unwinder holds (`record --unwind dwarf`).
    pub unwind_processes: u32,
}

/// The most entries the stack-frames map's default takes: the memory the two generations'
/// 16,384-entry stack-trace maps took before stacks were content-addressed.
pub const DEFAULT_STACKS: u32 = 32768;

/// What one entry of the stack-frames map locks: its frames and hash key, the kernel's element
/// header (48 bytes) and its share of the buckets (16 bytes), as the map's fdinfo reports it.
const STACK_FRAMES_ENTRY_BYTES: u64 = size_of::<StackFrames>() as u64 + 8 + 48 + 16;

/// Default entries of the stack-frames map: twice the sample maps' (a sample stores up to two
/// new stacks, its kernel and its user stack), from 2,048 to [`DEFAULT_STACKS`]. The map is
/// emptied from a quarter full like the sample maps, and it is preallocated: at a fixed 32,768
/// entries it locked 35 MB and took a tenth of a recording's start-up where a 997 Hz recording
/// on two CPUs needs 8,192 and the agent at 99 Hz 2,048.
pub fn default_stack_entries(sample_entries: u32) -> u32 {
    sample_entries
        .saturating_mul(2)
        .clamp(2 * MIN_DEFAULT_MAP_ENTRIES, DEFAULT_STACKS)
}

/// Entries of the sample maps per generation where the sampling rate is unknown, and the most
/// their default takes.
pub const DEFAULT_MAP_ENTRIES: u32 = 16384;

/// The fewest entries the sample maps' default takes: a burst of new stacks fills a small map
/// before the agent is scheduled to drain it.
const MIN_DEFAULT_MAP_ENTRIES: u32 = 1024;

/// The per-CPU values the sample maps' default may lock: per-CPU maps hold a value per
/// possible CPU for every entry, so on a host with many CPUs the maps get fewer entries (and
/// are drained sooner) rather than more memory.
const SAMPLE_MAPS_PER_CPU_BUDGET: u64 = 64 << 20;

/// Default entries of the sample maps per generation: twice the samples the events fire on
/// `cpus` CPUs between two drains, at `rate` samples a second per CPU (`None` when an event is
/// sampled by period: its rate is unknown), in whole thousands (1,024 entries), from 1,024 to
/// 16,384, and within [`SAMPLE_MAPS_PER_CPU_BUDGET`] on `possible_cpus`.
pub fn default_sample_map_entries(
    rate: Option<u64>,
    cpus: u32,
    possible_cpus: u32,
    drain_interval: std::time::Duration,
    data_addresses: bool,
) -> u32 {
    const STEP: u64 = MIN_DEFAULT_MAP_ENTRIES as u64;
    let wanted = match rate {
        Some(hz) => {
            let per_drain = hz as f64 * f64::from(cpus) * drain_interval.as_secs_f64();
            ((2.0 * per_drain).ceil() as u64).div_ceil(STEP) * STEP
        }
        None => u64::from(DEFAULT_MAP_ENTRIES),
    };
    let per_entry = sample_entry_bytes_per_cpu(data_addresses) * u64::from(possible_cpus.max(1));
    let affordable = SAMPLE_MAPS_PER_CPU_BUDGET / per_entry / STEP * STEP;
    let entries = wanted
        .min(affordable)
        .clamp(STEP, u64::from(DEFAULT_MAP_ENTRIES));
    entries as u32
}

/// What one entry of every sample map holds on one CPU, in both generations: a stack count and
/// an instruction's statistics, and a data line's statistics and a data source's count where
/// samples carry data addresses.
pub fn sample_entry_bytes_per_cpu(data_addresses: bool) -> u64 {
    let mut per_entry = size_of::<u64>() + size_of::<SampleStats>();
    if data_addresses {
        per_entry += size_of::<SampleStats>() + size_of::<u64>();
    }
    2 * per_entry as u64
}

/// The smallest ring buffer the kernel takes: one page.
const SMALLEST_RING_BYTES: u32 = 4096;

/// What a recording can write, which decides the maps it needs at full size.
#[derive(Clone, Copy, Debug)]
pub struct MapNeeds {
    /// An event measures latencies (the histograms).
    pub latencies: bool,
    /// An event's samples may carry a data address (the data-line and data-source maps).
    pub data_addresses: bool,
    /// `record --raw`.
    pub raw: bool,
    /// IBS events (their register ring).
    pub ibs: bool,
    /// `--unwind copy` or `check` (the stack-copy ring and scratch).
    pub stack_copies: bool,
    /// Samples are counted per instruction (the instructions maps).
    pub instructions: bool,
}

impl MapSizes {
    /// These sizes with the maps a recording cannot fill cut to their smallest, so it locks no
    /// kernel memory for them (a histogram takes 960 bytes per entry and CPU), and the kernel
    /// does not allocate their entries: a per-CPU hash map's preallocation is a per-CPU
    /// allocation for each entry, most of a recording's start-up outside the verifier.
    pub fn fitted(self, needs: MapNeeds) -> MapSizes {
        let entries = |needed: bool, entries: u32| if needed { entries } else { 1 };
        let ring = |needed: bool, bytes: u32| if needed { bytes } else { SMALLEST_RING_BYTES };
        MapSizes {
            latencies: entries(needs.latencies, self.latencies),
            instructions: entries(needs.instructions, self.instructions),
            data_lines: entries(needs.data_addresses, self.data_lines),
            ring_buffer_bytes: ring(needs.raw, self.ring_buffer_bytes),
            ibs_ring_bytes: ring(needs.ibs, self.ibs_ring_bytes),
            stack_copy_ring_bytes: ring(needs.stack_copies, self.stack_copy_ring_bytes),
            stack_copy_scratch: entries(needs.stack_copies, self.stack_copy_scratch),
            ..self
        }
    }

    /// What maps of these sizes, which lock `memory` here, would lock on a [`HOST_CPUS`]-CPU
    /// host: the per-CPU values for its CPUs, and the sample maps at the entries the default
    /// sizing gives them there (`data_addresses`: the data-line maps are among them).
    pub fn on_host(&self, memory: &MapMemory, data_addresses: bool) -> u64 {
        let resized = |here: u32, host: Option<u32>, per_entry: u64| match host {
            Some(host) => (i64::from(host) - i64::from(here)) * per_entry as i64,
            None => 0,
        };
        let samples = resized(
            self.stack_counts,
            self.host_sample_entries,
            sample_entry_bytes_per_cpu(data_addresses) * HOST_CPUS,
        );
        let stacks = resized(self.stacks, self.host_stacks, STACK_FRAMES_ENTRY_BYTES);
        memory
            .on_cpus(HOST_CPUS)
            .saturating_add_signed(samples + stacks)
    }

    /// Entries of the maps (of one generation) whose new keys `fill` counts.
    pub fn entries(&self, fill: Fill) -> u32 {
        match fill {
            Fill::StackCounts => self.stack_counts,
            Fill::Instructions => self.instructions,
            Fill::DataLines | Fill::DataSources => self.data_lines,
            Fill::Histograms => self.latencies,
            Fill::StackFrames => self.stacks,
        }
    }

    /// How many new entries of each map one CPU creates between drain requests. Each CPU counts
    /// its own, so up to `cpus` steps can go unannounced: an eighth of the map at most. The
    /// agent drains from a quarter full, so at least five eighths of the map remain for the
    /// time it takes to be scheduled and drain, however the steps fall.
    pub fn drain_request_steps(&self, cpus: usize) -> [u32; Fill::COUNT] {
        let eighth_per_cpu = |fill: Fill| (self.entries(fill) / (8 * cpus.max(1) as u32)).max(1);
        Fill::ALL.map(eighth_per_cpu)
    }
}

impl Default for MapSizes {
    fn default() -> Self {
        MapSizes {
            stacks: DEFAULT_STACKS,
            stack_counts: DEFAULT_MAP_ENTRIES,
            instructions: DEFAULT_MAP_ENTRIES,
            data_lines: DEFAULT_MAP_ENTRIES,
            latencies: 1024,
            off_cpu_blocks: DEFAULT_MAP_ENTRIES,
            off_cpu_histograms: 1024,
            ring_buffer_bytes: 1 << 22,
            ibs_ring_bytes: 1 << 22,
            stack_copy_ring_bytes: 1 << 22,
            stack_copy_scratch: 1,
            host_sample_entries: None,
            host_stacks: None,
            unwind_rows: 1,
            unwind_processes: 1,
        }
    }
}

pub(super) fn take<T>(ebpf: &mut Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<aya::maps::Map>,
    T::Error: std::error::Error + Send + Sync + 'static,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| anyhow!("the capture program has no map {name}"))?;
    T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))
}

/// A program array a program tail-calls, held open (the kernel empties a program array when its
/// last user-space reference closes) and emptied before it closes.
///
/// Emptied first because of a kernel bug: when the last reference closes, the kernel takes a map
/// reference for the work that empties the array, and a second close while that work is pending
/// (another process opened the map by ID meanwhile) takes another that is never dropped: the map
/// leaks. `bpftool prog show` opens the maps of every loaded program by ID, and an entry keeps
/// its program loaded, and so listed with the array, until that work runs. With the entry gone
/// before the close (and the programs that use the array closed before, see
/// `CaptureProgram`'s fields and `CaptureSession`'s), no program of ours lists the array while
/// the work is pending, unless a lister already holds one open.
pub(super) struct TailCalls(ProgramArray<MapData>);

impl TailCalls {
    /// `program` as the array's only entry.
    pub(super) fn hold(
        mut programs: ProgramArray<MapData>,
        program: &ProgramFd,
    ) -> Result<TailCalls> {
        programs
            .set(0, program, 0)
            .context("putting a program into the program array that tail-calls it")?;
        Ok(TailCalls(programs))
    }
}

impl Drop for TailCalls {
    fn drop(&mut self) {
        // Nothing to tell anyone when it fails: the kernel empties the array on close anyway.
        let _ = self.0.clear_index(&0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTHING: MapNeeds = MapNeeds {
        latencies: false,
        data_addresses: false,
        raw: false,
        ibs: false,
        stack_copies: false,
        instructions: false,
    };

    #[test]
    fn maps_a_recording_cannot_fill_are_cut_to_their_smallest() {
        let asked = MapSizes {
            stack_copy_scratch: 2,
            ..MapSizes::default()
        };
        let clock = asked.fitted(NOTHING);
        // A clock's samples carry no data address: no data-line or data-source entries.
        assert_eq!(clock.entries(Fill::DataLines), 1);
        assert_eq!(clock.entries(Fill::DataSources), 1);
        assert_eq!(clock.entries(Fill::Histograms), 1);
        assert_eq!(clock.ring_buffer_bytes, SMALLEST_RING_BYTES);
        assert_eq!(clock.ibs_ring_bytes, SMALLEST_RING_BYTES);
        assert_eq!(clock.stack_copy_ring_bytes, SMALLEST_RING_BYTES);
        assert_eq!(clock.stack_copy_scratch, 1);
        // Nothing counted per instruction (the agent): those maps at their smallest.
        assert_eq!(clock.entries(Fill::Instructions), 1);
        // What every recording fills keeps its size.
        assert_eq!(clock.entries(Fill::StackCounts), asked.stack_counts);
        assert_eq!(clock.entries(Fill::StackFrames), asked.stacks);

        let everything = asked.fitted(MapNeeds {
            latencies: true,
            data_addresses: true,
            raw: true,
            ibs: true,
            stack_copies: true,
            instructions: true,
        });
        for fill in Fill::ALL {
            assert_eq!(everything.entries(fill), asked.entries(fill), "{fill:?}");
        }
        assert_eq!(everything.ring_buffer_bytes, asked.ring_buffer_bytes);
        assert_eq!(everything.ibs_ring_bytes, asked.ibs_ring_bytes);
        assert_eq!(
            everything.stack_copy_ring_bytes,
            asked.stack_copy_ring_bytes
        );
        assert_eq!(everything.stack_copy_scratch, 2);

        // Page faults record the faulting address: data lines at full size, histograms not.
        let faults = asked.fitted(MapNeeds {
            data_addresses: true,
            ..NOTHING
        });
        assert_eq!(faults.entries(Fill::DataLines), asked.data_lines);
        assert_eq!(faults.entries(Fill::Histograms), 1);
    }

    #[test]
    fn the_host_projection_resizes_default_sample_maps_to_the_hosts_defaults() {
        let here = MapMemory {
            locked: 10 << 20,
            per_cpu: 1 << 20,
            cpus: 2,
        };
        let given = MapSizes {
            stack_counts: 4096,
            ..MapSizes::default()
        };
        // Sizes given: the same maps, their per-CPU values on 128 CPUs.
        assert_eq!(given.on_host(&here, false), (8 << 20) + (128 << 20));
        // Defaults: 2,048 more entries there, 80 bytes a CPU each (160 with data addresses).
        let defaults = MapSizes {
            host_sample_entries: Some(6144),
            ..given
        };
        assert_eq!(
            defaults.on_host(&here, false),
            (136 << 20) + 2048 * 80 * 128
        );
        assert_eq!(
            defaults.on_host(&here, true),
            (136 << 20) + 2048 * 160 * 128
        );
        // Fewer entries there than here.
        let fewer = MapSizes {
            host_sample_entries: Some(1024),
            ..given
        };
        assert_eq!(fewer.on_host(&here, false), (136 << 20) - 3072 * 80 * 128);
        // A default stack-frames map of 8,192 entries here and 12,288 there: 1,096 bytes an
        // entry, not per CPU.
        let frames = MapSizes {
            stacks: 8192,
            host_stacks: Some(12288),
            ..defaults
        };
        assert_eq!(
            frames.on_host(&here, false),
            (136 << 20) + 2048 * 80 * 128 + 4096 * 1096
        );
    }

    #[test]
    fn the_stack_frames_map_holds_two_stacks_for_each_sample_entry() {
        // 997 Hz on 2 CPUs: 4,096 sample entries.
        assert_eq!(default_stack_entries(4096), 8192);
        // The agent's 99 Hz: the floor; a period's unknown rate: the old fixed size.
        assert_eq!(default_stack_entries(1024), 2048);
        assert_eq!(default_stack_entries(DEFAULT_MAP_ENTRIES), DEFAULT_STACKS);
        assert_eq!(default_stack_entries(1), 2048, "never under the floor");
    }

    #[test]
    fn sample_maps_are_sized_to_the_samples_between_drains_within_a_per_cpu_budget() {
        let second = std::time::Duration::from_secs(1);
        let entries = |rate, cpus, interval, data| {
            default_sample_map_entries(rate, cpus, cpus, interval, data)
        };
        // 997 Hz on 2 CPUs: 1,994 samples a drain, twice over, in thousands of 1,024.
        assert_eq!(entries(Some(997), 2, second, false), 4096);
        // Three events at 997 Hz each.
        assert_eq!(entries(Some(3 * 997), 2, second, false), 12288);
        // Few samples: the floor; many: the ceiling; a period's unknown rate: the ceiling.
        assert_eq!(entries(Some(99), 2, second, false), 1024);
        assert_eq!(entries(Some(50_000), 2, second, false), 16384);
        assert_eq!(entries(None, 2, second, false), 16384);
        // Drained every 100 ms: a tenth.
        assert_eq!(
            entries(
                Some(20_000),
                2,
                std::time::Duration::from_millis(100),
                false
            ),
            8192
        );
        // 99 Hz on 128 CPUs wants 25,344; 64 MiB of per-CPU values hold 6,553 entries of 80
        // bytes on 128 CPUs (40 per generation), half as many with data addresses.
        assert_eq!(entries(Some(99), 128, second, false), 6144);
        assert_eq!(entries(Some(99), 128, second, true), 3072);
        assert_eq!(
            entries(None, 1024, second, true),
            1024,
            "never under the floor"
        );
        // The budget counts the possible CPUs, the rate the online ones.
        assert_eq!(
            default_sample_map_entries(Some(997), 2, 128, second, false),
            4096
        );
        assert_eq!(
            default_sample_map_entries(Some(997), 8, 512, second, false),
            1024
        );
    }
}
