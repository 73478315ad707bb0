//! How big the capture program's maps and ring buffers are: every default, every limit the
//! command line enforces, and the one resolution from the events, their rate, the drain
//! interval and the user's overrides ([`resolve`]) into the loader's [`MapSizes`], with what
//! `--stats` projects to on a large host.

use std::time::Duration;

use anyhow::Result;
use profiler_common::{
    capture::SampleStats, stack::StackFrames, unwind::UnwindRow, unwind_maps::MAX_UNWIND_FILES,
};

use crate::{
    capture::{
        hardware::records_data_addresses,
        maps::MapSizes,
        stats::{MapMemory, HOST_CPUS},
    },
    events::{EventSpec, Sampling},
};

/// How much larger than `--ring-buffer-kib` the stack-copy ring is.
const STACK_COPY_RING_FACTOR: u32 = 8;

/// `--stack-copy-kib` when not given.
pub const DEFAULT_STACK_COPY_KIB: u32 = 16;

/// Largest `--stack-copy-kib`: what the program's copy holds above the stack pointer's page.
pub const MAX_STACK_COPY_KIB: u32 = 32;

/// `--ring-buffer-kib` when not given.
pub const DEFAULT_RING_BUFFER_KIB: u32 = 4096;

/// Largest `--ring-buffer-kib`: 1 GiB, whose bytes (a power of two) still fit the u32 size the
/// kernel takes.
pub const MAX_RING_BUFFER_KIB: u32 = 1 << 20;

/// Largest map size asked for: the kernel's own limit for BPF hash maps is about this, and
/// larger values only fail later with less clear errors.
pub const MAX_MAP_ENTRIES: u32 = 1 << 28;

/// `--latency-map-entries` when not given.
pub const DEFAULT_LATENCY_MAP_ENTRIES: u32 = 1024;

/// `--unwind-table-mib` when not given.
pub const DEFAULT_UNWIND_TABLE_MIB: u32 = 64;

/// Processes whose executable mappings `--unwind dwarf` can hold at once; others are walked by
/// frame pointers, counted in `--stats`.
const UNWIND_PROCESSES: u32 = 1024;

/// The most entries the stack-frames map's default takes: the memory the two generations'
/// 16,384-entry stack-trace maps took before stacks were content-addressed.
const DEFAULT_STACKS: u32 = 32768;

/// What one entry of the stack-frames map locks: its frames and hash key, the kernel's element
/// header (48 bytes) and its share of the buckets (16 bytes), as the map's fdinfo reports it.
const STACK_FRAMES_ENTRY_BYTES: u64 = size_of::<StackFrames>() as u64 + 8 + 48 + 16;

/// Default entries of the stack-frames map: twice the sample maps' (a sample stores up to two
/// new stacks, its kernel and its user stack), from 2,048 to [`DEFAULT_STACKS`]. The map is
/// emptied from a quarter full like the sample maps, and it is preallocated: at a fixed 32,768
/// entries it locked 35 MB and took a tenth of a recording's start-up where a 997 Hz recording
/// on two CPUs needs 8,192 and the agent at 99 Hz 2,048.
fn default_stack_entries(sample_entries: u32) -> u32 {
    sample_entries
        .saturating_mul(2)
        .clamp(2 * MIN_DEFAULT_MAP_ENTRIES, DEFAULT_STACKS)
}

/// Entries of the sample maps per generation where the sampling rate is unknown, and the most
/// their default takes.
const DEFAULT_MAP_ENTRIES: u32 = 16384;

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
fn default_sample_map_entries(
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
fn sample_entry_bytes_per_cpu(data_addresses: bool) -> u64 {
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

/// Bytes of each ring buffer: `--ring-buffer-kib` rounded up to a power of two (at most
/// [`MAX_RING_BUFFER_KIB`], so it fits).
pub fn ring_buffer_bytes(kib: u32) -> u32 {
    (kib * 1024).next_power_of_two()
}

/// What the user asked of the maps; `None`: the default sizing.
#[derive(Clone, Copy, Debug)]
pub struct MapRequest {
    /// `--map-entries`: the sample maps and the `--off-cpu` map.
    pub map_entries: Option<u32>,
    /// `--stack-map-entries`.
    pub stack_map_entries: Option<u32>,
    /// `--latency-map-entries`.
    pub latency_map_entries: u32,
    /// `--ring-buffer-kib`.
    pub ring_buffer_kib: u32,
    /// `--unwind-table-mib`.
    pub unwind_table_mib: u32,
}

/// The maps' sizes for a capture, and what the default sizing would give the sample maps on a
/// [`HOST_CPUS`]-CPU host (what `--stats` projects to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizing {
    /// What the loader gives the maps.
    pub maps: MapSizes,
    /// Entries the default sizing would give the sample maps on a [`HOST_CPUS`]-CPU host at
    /// the same rate (`None` when `--map-entries` sets them): what `--stats` projects to.
    pub host_sample_entries: Option<u32>,
    /// The same for the stack-frames map (`None` when `--stack-map-entries` sets it).
    pub host_stacks: Option<u32>,
}

/// Resolves the maps' sizes: from the user's `request`, else from the samples `events` fire
/// between two drains (`drain_interval`) on this machine's CPUs; the unwind tables only where
/// the kernel walks them (`unwind_tables`, see [`super::Unwind::walks_tables`]).
pub fn resolve(
    events: &[EventSpec],
    drain_interval: Duration,
    unwind_tables: bool,
    request: &MapRequest,
) -> Result<MapSizing> {
    let possible_cpus = aya::util::nr_cpus()
        .map_err(|(what, e)| anyhow::anyhow!("counting possible CPUs ({what}): {e}"))?
        as u32;
    // Samples a second per CPU, all events together; unknown where one samples by period.
    let rate = events
        .iter()
        .try_fold(0, |sum, event| match event.sampling {
            Sampling::Frequency(hz) => Some(sum + hz),
            Sampling::Period(_) => None,
        });
    let default_entries = |online_cpus: u32, possible_cpus: u32| {
        let data = events.iter().any(records_data_addresses);
        default_sample_map_entries(rate, online_cpus, possible_cpus, drain_interval, data)
    };
    let online_cpus = aya::util::online_cpus().map_or(possible_cpus, |cpus| cpus.len() as u32);
    let sample_entries = request
        .map_entries
        .unwrap_or_else(|| default_entries(online_cpus, possible_cpus));
    let host_sample_entries = match request.map_entries {
        Some(_) => None,
        None => Some(default_entries(HOST_CPUS as u32, HOST_CPUS as u32)),
    };
    let stacks = request
        .stack_map_entries
        .unwrap_or_else(|| default_stack_entries(sample_entries));
    let host_stacks = match request.stack_map_entries {
        Some(_) => None,
        None => Some(default_stack_entries(
            host_sample_entries.unwrap_or(sample_entries),
        )),
    };
    let ring_bytes = ring_buffer_bytes(request.ring_buffer_kib);
    Ok(MapSizing {
        maps: MapSizes {
            stacks,
            stack_counts: sample_entries,
            instructions: sample_entries,
            data_lines: sample_entries,
            latencies: request.latency_map_entries,
            off_cpu_blocks: request.map_entries.unwrap_or(DEFAULT_MAP_ENTRIES),
            off_cpu_histograms: request.latency_map_entries,
            ring_buffer_bytes: ring_bytes,
            ibs_ring_bytes: ring_bytes,
            // A stack copy takes up to 37 KiB where a raw sample takes 80 bytes.
            stack_copy_ring_bytes: ring_bytes
                .saturating_mul(STACK_COPY_RING_FACTOR)
                .min(MAX_RING_BUFFER_KIB * 1024),
            // One scratch record per CPU the program may run on.
            stack_copy_scratch: possible_cpus,
            unwind_rows: match unwind_tables {
                true => request.unwind_table_mib * (1024 * 1024 / UnwindRow::SIZE as u32),
                false => 1,
            },
            // 8 KiB each, preallocated.
            unwind_processes: match unwind_tables {
                true => UNWIND_PROCESSES,
                false => 1,
            },
            // 48 bytes each, preallocated.
            unwind_files: match unwind_tables {
                true => MAX_UNWIND_FILES,
                false => 1,
            },
        },
        host_sample_entries,
        host_stacks,
    })
}

impl MapSizing {
    /// These sizes with the maps a recording cannot fill cut to their smallest, so it locks no
    /// kernel memory for them (a histogram takes 960 bytes per entry and CPU), and the kernel
    /// does not allocate their entries: a per-CPU hash map's preallocation is a per-CPU
    /// allocation for each entry, most of a recording's start-up outside the verifier.
    pub fn fitted(self, needs: MapNeeds) -> MapSizing {
        let entries = |needed: bool, entries: u32| if needed { entries } else { 1 };
        let ring = |needed: bool, bytes: u32| if needed { bytes } else { SMALLEST_RING_BYTES };
        let maps = self.maps;
        MapSizing {
            maps: MapSizes {
                latencies: entries(needs.latencies, maps.latencies),
                instructions: entries(needs.instructions, maps.instructions),
                data_lines: entries(needs.data_addresses, maps.data_lines),
                ring_buffer_bytes: ring(needs.raw, maps.ring_buffer_bytes),
                ibs_ring_bytes: ring(needs.ibs, maps.ibs_ring_bytes),
                stack_copy_ring_bytes: ring(needs.stack_copies, maps.stack_copy_ring_bytes),
                stack_copy_scratch: entries(needs.stack_copies, maps.stack_copy_scratch),
                ..maps
            },
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
            self.maps.stack_counts,
            self.host_sample_entries,
            sample_entry_bytes_per_cpu(data_addresses) * HOST_CPUS,
        );
        let stacks = resized(self.maps.stacks, self.host_stacks, STACK_FRAMES_ENTRY_BYTES);
        memory
            .on_cpus(HOST_CPUS)
            .saturating_add_signed(samples + stacks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::capture::Fill;

    /// The sizes where the rate is unknown.
    fn defaults() -> MapSizing {
        MapSizing {
            maps: MapSizes {
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
                unwind_rows: 1,
                unwind_processes: 1,
                unwind_files: 1,
            },
            host_sample_entries: None,
            host_stacks: None,
        }
    }

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
        let asked = MapSizing {
            maps: MapSizes {
                stack_copy_scratch: 2,
                ..defaults().maps
            },
            ..defaults()
        };
        let clock = asked.fitted(NOTHING);
        // A clock's samples carry no data address: no data-line or data-source entries.
        assert_eq!(clock.maps.entries(Fill::DataLines), 1);
        assert_eq!(clock.maps.entries(Fill::DataSources), 1);
        assert_eq!(clock.maps.entries(Fill::Histograms), 1);
        assert_eq!(clock.maps.ring_buffer_bytes, SMALLEST_RING_BYTES);
        assert_eq!(clock.maps.ibs_ring_bytes, SMALLEST_RING_BYTES);
        assert_eq!(clock.maps.stack_copy_ring_bytes, SMALLEST_RING_BYTES);
        assert_eq!(clock.maps.stack_copy_scratch, 1);
        // Nothing counted per instruction (the agent): those maps at their smallest.
        assert_eq!(clock.maps.entries(Fill::Instructions), 1);
        // What every recording fills keeps its size.
        assert_eq!(
            clock.maps.entries(Fill::StackCounts),
            asked.maps.stack_counts
        );
        assert_eq!(clock.maps.entries(Fill::StackFrames), asked.maps.stacks);

        let everything = asked.fitted(MapNeeds {
            latencies: true,
            data_addresses: true,
            raw: true,
            ibs: true,
            stack_copies: true,
            instructions: true,
        });
        for fill in Fill::ALL {
            assert_eq!(
                everything.maps.entries(fill),
                asked.maps.entries(fill),
                "{fill:?}"
            );
        }
        assert_eq!(
            everything.maps.ring_buffer_bytes,
            asked.maps.ring_buffer_bytes
        );
        assert_eq!(everything.maps.ibs_ring_bytes, asked.maps.ibs_ring_bytes);
        assert_eq!(
            everything.maps.stack_copy_ring_bytes,
            asked.maps.stack_copy_ring_bytes
        );
        assert_eq!(everything.maps.stack_copy_scratch, 2);

        // Page faults record the faulting address: data lines at full size, histograms not.
        let faults = asked.fitted(MapNeeds {
            data_addresses: true,
            ..NOTHING
        });
        assert_eq!(faults.maps.entries(Fill::DataLines), asked.maps.data_lines);
        assert_eq!(faults.maps.entries(Fill::Histograms), 1);
    }

    #[test]
    fn the_host_projection_resizes_default_sample_maps_to_the_hosts_defaults() {
        let here = MapMemory {
            locked: 10 << 20,
            per_cpu: 1 << 20,
            cpus: 2,
        };
        let given = MapSizing {
            maps: MapSizes {
                stack_counts: 4096,
                ..defaults().maps
            },
            ..defaults()
        };
        // Sizes given: the same maps, their per-CPU values on 128 CPUs.
        assert_eq!(given.on_host(&here, false), (8 << 20) + (128 << 20));
        // Defaults: 2,048 more entries there, 80 bytes a CPU each (160 with data addresses).
        let defaults = MapSizing {
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
        let fewer = MapSizing {
            host_sample_entries: Some(1024),
            ..given
        };
        assert_eq!(fewer.on_host(&here, false), (136 << 20) - 3072 * 80 * 128);
        // A default stack-frames map of 8,192 entries here and 12,288 there: 1,096 bytes an
        // entry, not per CPU.
        let frames = MapSizing {
            maps: MapSizes {
                stacks: 8192,
                ..defaults.maps
            },
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
