//! The in-kernel maps of the capture program and the off-CPU programs: how many entries each
//! gets, as the loader takes them (the session decides them: `session::map_sizes`), and taking
//! maps and tail-call program arrays out of a loaded object.

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{MapData, ProgramArray},
    programs::ProgramFd,
    Ebpf,
};
use profiler_common::capture::Fill;

/// Entries of each in-kernel map, as the loader sizes them (the session resolves them: see
/// `session::map_sizes`). Per-CPU maps hold one value per possible CPU for each entry.
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
    /// Rows of the unwind-table arena (`record --unwind dwarf`).
    pub unwind_rows: u32,
    /// Processes whose mappings the unwinder holds (`record --unwind dwarf`).
    pub unwind_processes: u32,
    /// Files whose tables the unwinder finds by the file (`record --unwind dwarf`).
    pub unwind_files: u32,
}

impl MapSizes {
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
