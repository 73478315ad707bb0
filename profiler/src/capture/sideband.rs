//! The side-band stream: process names, memory mappings, forks and exits, recorded while the
//! processes live so that their samples can be symbolized after they exit (normalize early,
//! symbolize later). Existing processes are read from /proc at start (by the process table,
//! [`crate::process::ProcessTable`]); changes arrive as PERF_RECORD_MMAP2/COMM/FORK/EXIT from a
//! dummy perf event on the same target, read here from its ring buffers and applied to the table.

use std::os::fd::AsRawFd;

use anyhow::{Context, Result};
use perf_event::{events::Software, Builder, Counter, SampleFlag};

use super::counters::{online_cpus, per_cpu_placements, place, redirect_output, Target};
use super::perf_ring::PerfRing;
use crate::events::{open_error, parse_event, OpenAs, PmuRegistry, Scope, SystemFacts};
use crate::fast_hash::HashMap;
use crate::perf_data::PERF_RECORD_MISC_MMAP_BUILD_ID;
use crate::process::{Pending, ProcessTable, RecordBytes};

/// Ring buffer per side-band event.
const SIDEBAND_BUFFER_BYTES: usize = 512 * 1024;

/// Dummy perf events that only deliver side-band records for the target: one ring buffer per
/// CPU, the other events of that CPU (one per thread) redirected into it, as perf does, so a
/// process with many threads does not lock a buffer per thread.
pub struct Sideband {
    /// Each CPU's ring and the event that owns it.
    rings: Vec<(Counter, PerfRing)>,
    redirected: Vec<Counter>,
    /// The records one read found, with their times, and the bytes of those kept as read:
    /// kept across reads, so that their room is allocated once, not grown anew every read.
    batch: Vec<(u64, Pending)>,
    bytes: RecordBytes,
}

impl Sideband {
    /// Opens the side-band of `target`. Mappings of data (files mapped without execute
    /// permission, anonymous memory) are delivered only with `data_mappings`, where an event
    /// records data addresses that they describe, as `perf record` asks for them only with
    /// `-d`: a process maps several times more data than code, and under process churn each
    /// record costs the agent.
    pub fn open(
        target: &Target,
        pmus: &PmuRegistry,
        facts: &SystemFacts,
        data_mappings: bool,
    ) -> Result<Sideband> {
        let dummy = parse_event("dummy", pmus)?;
        let how = OpenAs {
            scope: match target {
                Target::System => Scope::SystemWide,
                _ => Scope::Task,
            },
            sampling: false,
        };
        let placements = per_cpu_placements(target, &online_cpus()?);
        let mut rings: Vec<(Counter, PerfRing)> = Vec::new();
        let mut redirected = Vec::new();
        let mut ring_of_cpu: HashMap<usize, usize> = HashMap::default();
        for (pid, cpu) in placements {
            let mut builder = Builder::new(Software::DUMMY);
            place(&mut builder, target, pid, Some(cpu));
            // No build IDs in the mapping records (`build_id`), though the kernel offers them:
            // it marks a record as carrying one in a header it shares with every other session
            // the mapping is reported to, and never unmarks it, so perf sessions running beside
            // the agent got device and inode numbers flagged as a build ID (perf 6.1 overflows
            // its stack on them). Build IDs are read from the mapped files the agent opens.
            builder
                .mmap(true)
                .mmap2(true)
                .mmap_data(data_mappings)
                .comm(true)
                .comm_exec(true)
                .ksymbol(true)
                .sample_id_all(true)
                .sample(SampleFlag::TIME)
                .task(true)
                .exclude_kernel(false);
            let opened = builder.build();
            let counter = match opened {
                Ok(counter) => counter,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                Err(e) => return Err(open_error(&dummy, &e, how, facts).into()),
            };
            match ring_of_cpu.get(&cpu) {
                Some(&ring) => {
                    redirect_output(&counter, rings[ring].0.as_raw_fd())
                        .context("redirecting a side-band event into its CPU's ring buffer")?;
                    redirected.push(counter);
                }
                None => {
                    ring_of_cpu.insert(cpu, rings.len());
                    let ring = PerfRing::map(counter.as_raw_fd(), SIDEBAND_BUFFER_BYTES)
                        .context("mapping the side-band ring buffer")?;
                    rings.push((counter, ring));
                }
            }
        }
        Ok(Sideband {
            rings,
            redirected,
            batch: Vec::new(),
            bytes: RecordBytes::default(),
        })
    }

    fn counters(&mut self) -> impl Iterator<Item = &mut Counter> {
        self.rings
            .iter_mut()
            .map(|(counter, _)| counter)
            .chain(self.redirected.iter_mut())
    }

    pub fn enable(&mut self) -> Result<()> {
        for counter in self.counters() {
            counter.enable()?;
        }
        Ok(())
    }

    pub fn disable(&mut self) -> Result<()> {
        for counter in self.counters() {
            counter.disable()?;
        }
        Ok(())
    }

    /// Applies every pending record to the table, in time order: a task that moves between
    /// CPUs during exec writes the exec's COMM into one CPU's ring and its new mappings into
    /// another's, and applying the COMM last would erase the mappings.
    pub fn read_into(&mut self, table: &mut ProcessTable) {
        let (batch, bytes) = (&mut self.batch, &mut self.bytes);
        bytes.clear();
        for (_, ring) in &mut self.rings {
            ring.read_records(|record| {
                // With sample_id_all and only PERF_SAMPLE_TIME, every record ends in its time.
                let Some((own, time)) = record.body().split_last_chunk::<8>() else {
                    return;
                };
                // Another session's build-ID mark may have leaked onto the record (see
                // `Sideband::open`): without `build_id` the kernel always writes the file's
                // device and inode.
                let misc = record.misc() & !PERF_RECORD_MISC_MMAP_BUILD_ID;
                if let Some(pending) = bytes.read(record.kind(), misc, own) {
                    batch.push((u64::from_ne_bytes(*time), pending));
                }
            });
        }
        batch.sort_by_key(|(time, _)| *time);
        table.apply_batch(batch, bytes);
    }
}
