//! `record --raw`: every sample, streamed by the capture program through a BPF ring buffer and
//! written as JSON lines in timestamp order, beside the aggregated maps. Drops (ring full) are
//! counted by the program as a loss kind. A write that fails (a full disk, a closed pipe) stops
//! the stream, not the recording: the ring is still emptied and the failure is reported at the
//! end.
//!
//! The ring holds samples in the order CPUs reserved room in it, which can run behind their
//! timestamps (each CPU reads the clock before reserving): [`TimeOrder`] holds samples back for
//! [`REORDER_WINDOW_NS`] so that the file is sorted by time.

use std::{cmp::Reverse, collections::BinaryHeap, io::Write};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use profiler_common::capture::RawSample;

use crate::capture::ring::KernelRing;
use crate::output::{Output, OutputWriter};
use crate::symbolize::kernel_addresses::{kernel_addresses_shown, shown_address};

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
    /// `None` once a write failed.
    out: Option<OutputWriter>,
    failure: Option<anyhow::Error>,
    order: TimeOrder,
    written: u64,
    /// Whether kernel addresses may be written (see [`kernel_addresses_shown`]).
    kernel_addresses: bool,
}

/// One sample as a JSON line. Stack hashes are left out: the profile keeps the stacks
/// themselves, not their hashes. Unless `kernel_addresses`, kernel instruction and data
/// addresses are written as 0, and physical addresses too (the kernel hides page frames from
/// the same users).
pub fn json_line(sample: &RawSample, kernel_addresses: bool) -> String {
    format!(
        "{{\"time_ns\":{},\"cpu\":{},\"pid\":{},\"tid\":{},\"event\":{},\"ip\":\"{:#x}\",\
         \"addr\":\"{:#x}\",\"phys_addr\":\"{:#x}\",\"latency\":{},\"data_src\":\"{:#x}\",\
         \"cgroup\":{},\"sample_flags\":\"{:#x}\"}}",
        sample.time_ns,
        sample.cpu,
        sample.pid,
        sample.tid,
        sample.event,
        shown_address(sample.ip, kernel_addresses),
        shown_address(sample.addr, kernel_addresses),
        if kernel_addresses {
            sample.phys_addr
        } else {
            0
        },
        sample.latency,
        sample.data_src,
        sample.cgroup,
        sample.sample_flags
    )
}

impl RawStream {
    pub fn create(output: &Output, ring: RingBuf<MapData>) -> Result<RawStream> {
        Ok(RawStream {
            ring: KernelRing::new(ring)?,
            out: Some(output.create()?),
            failure: None,
            order: TimeOrder::default(),
            written: 0,
            kernel_addresses: kernel_addresses_shown(),
        })
    }

    /// Waits until the ring buffer has samples.
    pub async fn readable(&self) -> std::io::Result<()> {
        self.ring.readable().await
    }

    /// Takes every sample in the ring buffer (empties it, whether the writes succeed or not)
    /// and writes those whose turn has come; all of them when `all`.
    fn write(&mut self, all: bool) -> Result<()> {
        let (order, shown) = (&mut self.order, self.kernel_addresses);
        self.ring.for_each(usize::MAX, |sample: RawSample| {
            order.push(sample.time_ns, json_line(&sample, shown));
            Ok(())
        })?;
        while let Some(line) = self.order.pop(all) {
            let Some(writer) = &mut self.out else {
                continue;
            };
            match writeln!(writer, "{line}") {
                Ok(()) => self.written += 1,
                Err(error) => {
                    let error = anyhow::Error::new(error);
                    if !writer.output().reader_went_away(&error) {
                        let describe = writer.output().describe();
                        self.failure = Some(error.context(format!(
                            "{describe}: cannot write; stopped streaming samples"
                        )));
                    }
                    // Dropping the writer removes its temporary file.
                    self.out = None;
                }
            }
        }
        Ok(())
    }

    /// Writes the samples in the ring buffer whose turn has come.
    pub fn write_ready(&mut self) -> Result<()> {
        self.write(false)
    }

    /// Writes what is left and puts the file in place. Returns why the stream is incomplete,
    /// if it is: the recording itself is not affected.
    pub fn finish(&mut self) -> Result<Option<anyhow::Error>> {
        self.write(true)?;
        if let Some(failure) = self.failure.take() {
            return Ok(Some(failure));
        }
        Ok(self.out.take().and_then(|writer| writer.commit().err()))
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
