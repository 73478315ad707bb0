//! `record --raw`: every sample, time-ordered, streamed by the capture program through a BPF ring
//! buffer and written as JSON lines, beside the aggregated maps. Drops (ring full) are counted by
//! the program as a loss kind. A write that fails (a full disk, a closed pipe) stops the stream,
//! not the recording: the ring is still emptied and the failure is reported at the end.

use std::io::Write;

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use profiler_common::capture::RawSample;

use super::ring::KernelRing;
use crate::output::{Output, OutputWriter};
use crate::symbolize::kernel_addresses::{kernel_addresses_shown, shown_address};

pub struct RawStream {
    ring: KernelRing,
    /// `None` once a write failed.
    out: Option<OutputWriter>,
    failure: Option<anyhow::Error>,
    written: u64,
    /// Whether kernel addresses may be written (see [`kernel_addresses_shown`]).
    kernel_addresses: bool,
}

/// One sample as a JSON line. Stack ids are left out: they index maps the drain clears; the
/// stacks themselves are in the profile. Unless `kernel_addresses`, kernel instruction and data
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
            written: 0,
            kernel_addresses: kernel_addresses_shown(),
        })
    }

    /// Waits until the ring buffer has samples.
    pub async fn readable(&self) -> std::io::Result<()> {
        self.ring.readable().await
    }

    /// Writes every sample in the ring buffer (empties it, whether the writes succeed or not).
    pub fn write_ready(&mut self) -> Result<()> {
        let (out, failure, written) = (&mut self.out, &mut self.failure, &mut self.written);
        let shown = self.kernel_addresses;
        self.ring.for_each(usize::MAX, |sample: RawSample| {
            let Some(writer) = out else {
                return Ok(());
            };
            match writeln!(writer, "{}", json_line(&sample, shown)) {
                Ok(()) => *written += 1,
                Err(error) => {
                    let error = anyhow::Error::new(error);
                    if !writer.output().reader_went_away(&error) {
                        let describe = writer.output().describe();
                        *failure = Some(error.context(format!(
                            "{describe}: cannot write; stopped streaming samples"
                        )));
                    }
                    // Dropping the writer removes its temporary file.
                    *out = None;
                }
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Writes what is left and puts the file in place. Returns why the stream is incomplete,
    /// if it is: the recording itself is not affected.
    pub fn finish(&mut self) -> Result<Option<anyhow::Error>> {
        self.write_ready()?;
        if let Some(failure) = self.failure.take() {
            return Ok(Some(failure));
        }
        Ok(self.out.take().and_then(|writer| writer.commit().err()))
    }

    pub fn written(&self) -> u64 {
        self.written
    }
}
