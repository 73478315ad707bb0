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
use tokio::io::{unix::AsyncFd, Interest};

pub struct RawStream {
    ring: AsyncFd<RingBuf<MapData>>,
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
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as long as
        // the AsyncFd owns the ring buffer.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("polling the raw sample ring buffer: {e}"))?;
        Ok(RawStream {
            ring,
            out: BufWriter::new(file),
            written: 0,
        })
    }

    /// Waits until the ring buffer has samples.
    pub async fn readable(&self) -> std::io::Result<()> {
        let mut guard = self.ring.readable().await?;
        // Cleared before reading everything: data arriving meanwhile wakes us again.
        guard.clear_ready();
        Ok(())
    }

    /// Writes every sample in the ring buffer.
    pub fn write_ready(&mut self) -> Result<()> {
        let ring = self.ring.get_mut();
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<RawSample>() {
                continue;
            }
            // SAFETY: the program writes whole RawSample records (checked length above), and
            // RawSample is plain data valid for any bytes; read_unaligned has no alignment needs.
            let sample = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const RawSample) };
            writeln!(self.out, "{}", json_line(&sample))?;
            self.written += 1;
        }
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
