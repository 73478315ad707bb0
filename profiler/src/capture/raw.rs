//! `record --raw`: every sample, streamed by the capture program through a BPF ring buffer and
//! written as JSON lines in timestamp order, beside the aggregated maps. Drops (ring full) are
//! counted by the program as a loss kind.
//!
//! The ring holds samples in the order CPUs reserved room in it, which can run behind their
//! timestamps (each CPU reads the clock before reserving): [`TimeOrder`] holds samples back for
//! [`REORDER_WINDOW_NS`] so that the file is sorted by time.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use profiler_common::capture::RawSample;

use super::ring::KernelRing;

/// How long a sample is held back for samples with earlier timestamps that other CPUs may still
/// reserve: far longer than a capture program runs between reading the clock and reserving.
pub const REORDER_WINDOW_NS: u64 = 100_000_000;

/// Samples in timestamp order: released once a sample [`REORDER_WINDOW_NS`] newer has arrived,
/// or at the end.
#[derive(Default)]
pub struct TimeOrder {
    /// (time, arrival, JSON line): the arrival number keeps equal times in arrival order.
    pending: BinaryHeap<Reverse<(u64, u64, String)>>,
    arrivals: u64,
    newest: u64,
}

impl TimeOrder {
    pub fn push(&mut self, time_ns: u64, line: String) {
        self.pending.push(Reverse((time_ns, self.arrivals, line)));
        self.arrivals += 1;
        self.newest = self.newest.max(time_ns);
    }

    /// The next sample no earlier one can still come before; every pending one when `all`.
    pub fn pop(&mut self, all: bool) -> Option<String> {
        let Reverse((time, _, _)) = self.pending.peek()?;
        if !all && time.saturating_add(REORDER_WINDOW_NS) > self.newest {
            return None;
        }
        self.pending.pop().map(|Reverse((_, _, line))| line)
    }
}

pub struct RawStream {
    ring: KernelRing,
    out: BufWriter<File>,
    order: TimeOrder,
    written: u64,
}

/// One sample as a JSON line. Stack ids are left out: they index maps the drain clears; the
/// stacks themselves are in the profile.
pub fn json_line(sample: &RawSample) -> String {
    format!(
        "{{\"time_ns\":{},\"cpu\":{},\"pid\":{},\"tid\":{},\"event\":{},\"ip\":\"{:#x}\",\
         \"addr\":\"{:#x}\",\"phys_addr\":\"{:#x}\",\"latency\":{},\"data_src\":\"{:#x}\",\
         \"cgroup\":{},\"sample_flags\":\"{:#x}\"}}",
        sample.time_ns,
        sample.cpu,
        sample.pid,
        sample.tid,
        sample.event,
        sample.ip,
        sample.addr,
        sample.phys_addr,
        sample.latency,
        sample.data_src,
        sample.cgroup,
        sample.sample_flags
    )
}

impl RawStream {
    pub fn create(path: &Path, ring: RingBuf<MapData>) -> Result<RawStream> {
        let file = File::create(path)
            .with_context(|| format!("cannot create the raw sample file {}", path.display()))?;
        Ok(RawStream {
            ring: KernelRing::new(ring)?,
            out: BufWriter::new(file),
            order: TimeOrder::default(),
            written: 0,
        })
    }

    /// Waits until the ring buffer has samples.
    pub async fn readable(&self) -> std::io::Result<()> {
        self.ring.readable().await
    }

    /// Takes every sample in the ring buffer and writes those whose turn has come; all of them
    /// when `all`.
    fn write(&mut self, all: bool) -> Result<()> {
        let order = &mut self.order;
        self.ring.for_each(usize::MAX, |sample: RawSample| {
            order.push(sample.time_ns, json_line(&sample));
            Ok(())
        })?;
        while let Some(line) = self.order.pop(all) {
            writeln!(self.out, "{line}")?;
            self.written += 1;
        }
        Ok(())
    }

    /// Writes the samples in the ring buffer whose turn has come.
    pub fn write_ready(&mut self) -> Result<()> {
        self.write(false)
    }

    /// Writes what is left and flushes.
    pub fn finish(&mut self) -> Result<()> {
        self.write(true)?;
        self.out.flush().context("writing the raw sample file")
    }

    pub fn written(&self) -> u64 {
        self.written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_released_in_time_order_after_the_window() {
        let mut order = TimeOrder::default();
        for (time, name) in [(30, "c"), (10, "a"), (30, "d"), (20, "b")] {
            order.push(time, name.to_string());
        }
        assert_eq!(order.pop(false), None, "all within the window");
        order.push(10 + REORDER_WINDOW_NS, "e".into());
        assert_eq!(order.pop(false).as_deref(), Some("a"));
        assert_eq!(order.pop(false), None, "b may still have earlier company");
        let rest: Vec<String> = std::iter::from_fn(|| order.pop(true)).collect();
        assert_eq!(rest, ["b", "c", "d", "e"]);
    }
}
