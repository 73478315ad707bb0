//! `record --raw`: every sample, time-ordered, streamed by the capture program through a BPF ring
//! buffer and written as JSON lines, beside the aggregated maps. Drops (ring full) are counted by
//! the program as a loss kind.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use profiler_common::capture::RawSample;

use super::ring::KernelRing;
use crate::symbolize::kernel_addresses::{kernel_addresses_shown, shown_address};

pub struct RawStream {
    ring: KernelRing,
    out: BufWriter<File>,
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
    pub fn create(path: &Path, ring: RingBuf<MapData>) -> Result<RawStream> {
        let file = File::create(path)
            .with_context(|| format!("cannot create the raw sample file {}", path.display()))?;
        Ok(RawStream {
            ring: KernelRing::new(ring)?,
            out: BufWriter::new(file),
            written: 0,
            kernel_addresses: kernel_addresses_shown(),
        })
    }

    /// Waits until the ring buffer has samples.
    pub async fn readable(&self) -> std::io::Result<()> {
        self.ring.readable().await
    }

    /// Writes every sample in the ring buffer.
    pub fn write_ready(&mut self) -> Result<()> {
        let (out, written, shown) = (&mut self.out, &mut self.written, self.kernel_addresses);
        self.ring.for_each(usize::MAX, |sample: RawSample| {
            writeln!(out, "{}", json_line(&sample, shown))?;
            *written += 1;
            Ok(())
        })?;
        Ok(())
    }

    /// Writes what is left and flushes.
    pub fn finish(&mut self) -> Result<()> {
        self.write_ready()?;
        self.out.flush().context("writing the raw sample file")
    }

    pub fn written(&self) -> u64 {
        self.written
    }
}
