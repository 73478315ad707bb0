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

pub struct RawStream {
    ring: KernelRing,
    out: BufWriter<File>,
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
            written: 0,
        })
    }

    /// Waits until the ring buffer has samples.
    pub async fn readable(&self) -> std::io::Result<()> {
        self.ring.readable().await
    }

    /// Writes every sample in the ring buffer.
    pub fn write_ready(&mut self) -> Result<()> {
        let (out, written) = (&mut self.out, &mut self.written);
        self.ring.for_each(usize::MAX, |sample: RawSample| {
            writeln!(out, "{}", json_line(&sample))?;
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
