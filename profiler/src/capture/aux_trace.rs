//! Hardware trace through the perf AUX area: Arm SPE writes its records into a buffer mapped
//! beside an event's perf ring, not through samples (it raises no interrupt per record, so no
//! program runs on them). Per CPU, one event owns the two mappings and the events of the other
//! tasks on that CPU write into them (PERF_EVENT_IOC_SET_OUTPUT), as the side-band's do.
//!
//! A read takes each ring's records in order: an AUX record names the bytes just written to the
//! AUX area (flagged when the kernel had to drop some) and, in its sample id, the thread a
//! per-task event wrote them for; a switch record (system-wide) says which thread runs from when;
//! a lost record counts ring records the kernel could not write. The AUX bytes are copied out
//! before the tail moves past them.

use std::{os::fd::AsRawFd, ptr::NonNull, sync::atomic};

use anyhow::{anyhow, Context, Result};
use perf_event::{events::Software, Builder, Counter, SampleFlag};
use perf_event_open_sys::bindings::perf_event_mmap_page;

use super::counters::{online_cpus, per_cpu_placements, place, redirect_output, Target};
use super::perf_ring::{map_event, page_size, wrapped, PerfRing};
use crate::events::{open_error, EventSpec, OpenAs, Scope, SystemFacts};

/// The data ring of each CPU: AUX, switch and lost records, a few dozen bytes each.
const RING_BYTES: usize = 64 << 10;
/// The AUX area of each CPU: what SPE writes between two reads (100 ms apart) at the default
/// period is a few hundred KiB; four times the kernel's watermark (half the area) leaves room
/// for periods 16 times shorter before the kernel truncates (counted as a loss).
const AUX_BYTES: usize = 4 << 20;

// Record types and flags of the perf ABI (include/uapi/linux/perf_event.h).
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_AUX: u32 = 11;
const PERF_RECORD_SWITCH_CPU_WIDE: u32 = 15;
const PERF_RECORD_MISC_SWITCH_OUT: u16 = 1 << 13;
/// The AUX data was cut short: the area was full.
pub const PERF_AUX_FLAG_TRUNCATED: u64 = 0x01;
/// The AUX data collided with data not yet read (overwrite mode; counted like truncation).
pub const PERF_AUX_FLAG_COLLISION: u64 = 0x08;
/// `cap_user_time_zero` and `cap_user_time_short` in the mmap page's capabilities.
const CAP_USER_TIME_ZERO: u64 = 1 << 4;
const CAP_USER_TIME_SHORT: u64 = 1 << 5;

/// The sample id every record ends with: the events are opened with TID, TIME and CPU.
const SAMPLE_ID_BYTES: usize = 24;

/// Who wrote a record and when (PERF_SAMPLE_TID, TIME, CPU of `sample_id_all`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleId {
    pub pid: u32,
    pub tid: u32,
    /// perf clock nanoseconds.
    pub time: u64,
    pub cpu: u32,
}

/// One record of a trace event's ring, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceRecord {
    /// `size` new bytes at `offset` of the AUX byte stream, written while `id`'s thread ran.
    Aux {
        offset: u64,
        size: u64,
        flags: u64,
        id: SampleId,
    },
    /// A context switch on `id.cpu` at `id.time`: `id`'s thread leaves (`out`, then `other` is
    /// the next thread) or arrives (`other` is the previous one). (pid, tid) pairs.
    Switch {
        out: bool,
        other: (u32, u32),
        id: SampleId,
    },
    /// The kernel had no room for `lost` records in the ring.
    Lost { lost: u64 },
    /// A record type a trace event does not ask for.
    Other,
}

/// Decodes one ring record (header included); `None` when it is too short for its type.
pub fn parse_record(bytes: &[u8]) -> Option<TraceRecord> {
    let u32_at = |at: usize| Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
    let kind = u32_at(0)?;
    let misc = u16::from_ne_bytes(bytes.get(4..6)?.try_into().ok()?);
    let id = || {
        let at = bytes.len().checked_sub(SAMPLE_ID_BYTES)?;
        Some(SampleId {
            pid: u32_at(at)?,
            tid: u32_at(at + 4)?,
            time: u64_at(at + 8)?,
            cpu: u32_at(at + 16)?,
        })
    };
    Some(match kind {
        PERF_RECORD_AUX if bytes.len() >= 32 + SAMPLE_ID_BYTES => TraceRecord::Aux {
            offset: u64_at(8)?,
            size: u64_at(16)?,
            flags: u64_at(24)?,
            id: id()?,
        },
        PERF_RECORD_SWITCH_CPU_WIDE if bytes.len() >= 16 + SAMPLE_ID_BYTES => TraceRecord::Switch {
            out: misc & PERF_RECORD_MISC_SWITCH_OUT != 0,
            other: (u32_at(8)?, u32_at(12)?),
            id: id()?,
        },
        PERF_RECORD_LOST => TraceRecord::Lost { lost: u64_at(16)? },
        PERF_RECORD_AUX | PERF_RECORD_SWITCH_CPU_WIDE => return None,
        _ => TraceRecord::Other,
    })
}

/// The perf clock as the kernel describes the CPU's counter in the mmap page
/// (`cap_user_time_zero`): SPE timestamps are counts of the generic timer, and this turns them
/// into the times of the ring's records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfClock {
    pub zero: u64,
    pub mult: u32,
    pub shift: u16,
    /// `cap_user_time_short`: the counter is `mask` wide, counted from `cycles`.
    pub short: Option<(u64, u64)>,
}

impl PerfClock {
    /// The perf clock time of a counter value, as perf_event.h says to compute it.
    pub fn time_of(&self, mut count: u64) -> u64 {
        if let Some((cycles, mask)) = self.short {
            count = cycles.wrapping_add(count.wrapping_sub(cycles) & mask);
        }
        let shift = u32::from(self.shift).min(63);
        let quotient = count >> shift;
        let remainder = count & ((1u64 << shift) - 1);
        let mult = u64::from(self.mult);
        self.zero
            .wrapping_add(quotient.wrapping_mul(mult))
            .wrapping_add(remainder.wrapping_mul(mult) >> shift)
    }
}

/// One record of a ring, with the AUX bytes it names.
pub struct TraceItem {
    pub record: TraceRecord,
    /// The AUX bytes of an [`TraceRecord::Aux`] (at most the area's size); empty otherwise.
    pub aux: Vec<u8>,
}

/// What one read of a CPU's ring found.
pub struct CpuRead {
    pub cpu: u32,
    /// `None` where the kernel publishes no conversion of counter values to perf time.
    pub clock: Option<PerfClock>,
    pub items: Vec<TraceItem>,
}

/// The ring and AUX area of one event, mapped.
struct AuxMapping {
    ring: PerfRing,
    /// The AUX area and its length; `None` for events that write none (tests read a software
    /// event's ring with the same code).
    aux: Option<(NonNull<u8>, usize)>,
}

impl AuxMapping {
    /// Maps `fd`'s ring (`ring_bytes`) and AUX area (`aux_bytes`), each rounded up to a power
    /// of two pages.
    fn map(fd: i32, ring_bytes: usize, aux_bytes: Option<usize>) -> std::io::Result<AuxMapping> {
        let mut mapping = AuxMapping {
            ring: PerfRing::map(fd, ring_bytes)?,
            aux: None,
        };
        if let Some(aux_bytes) = aux_bytes {
            let aux_len = aux_bytes.max(page_size()).next_power_of_two();
            let page = mapping.page();
            let aux_offset = mapping.ring.mapped_len();
            // SAFETY: `page` is the event's mmap page, mapped above; the kernel reads
            // aux_offset and aux_size when the AUX area is mapped next.
            unsafe {
                std::ptr::addr_of_mut!((*page).aux_offset).write_volatile(aux_offset as u64);
                std::ptr::addr_of_mut!((*page).aux_size).write_volatile(aux_len as u64);
            }
            // On failure `mapping` unmaps the ring as it drops.
            mapping.aux = Some((map_event(fd, aux_len, aux_offset)?, aux_len));
        }
        Ok(mapping)
    }

    fn page(&self) -> *mut perf_event_mmap_page {
        self.ring.page()
    }

    /// The clock conversion the kernel publishes, read under the page's sequence lock.
    fn clock(&self) -> Option<PerfClock> {
        let page = self.page();
        loop {
            // SAFETY: `page` is the mapped mmap page; the kernel updates these fields under
            // `lock`, re-read below to detect a concurrent update.
            let (sequence, capabilities, clock) = unsafe {
                let sequence = std::ptr::addr_of!((*page).lock).read_volatile();
                atomic::fence(atomic::Ordering::Acquire);
                let capabilities =
                    std::ptr::addr_of!((*page).__bindgen_anon_1.capabilities).read_volatile();
                let clock = PerfClock {
                    zero: std::ptr::addr_of!((*page).time_zero).read_volatile(),
                    mult: std::ptr::addr_of!((*page).time_mult).read_volatile(),
                    shift: std::ptr::addr_of!((*page).time_shift).read_volatile(),
                    short: Some((
                        std::ptr::addr_of!((*page).time_cycles).read_volatile(),
                        std::ptr::addr_of!((*page).time_mask).read_volatile(),
                    )),
                };
                atomic::fence(atomic::Ordering::Acquire);
                (sequence, capabilities, clock)
            };
            // SAFETY: as above.
            if unsafe { std::ptr::addr_of!((*page).lock).read_volatile() } != sequence {
                continue;
            }
            return (capabilities & CAP_USER_TIME_ZERO != 0).then_some(PerfClock {
                short: clock
                    .short
                    .filter(|_| capabilities & CAP_USER_TIME_SHORT != 0),
                ..clock
            });
        }
    }

    /// Copies `count` bytes from stream position `at` of the AUX area (nothing where there is
    /// none).
    fn copy_aux(&self, at: u64, count: usize) -> Vec<u8> {
        let Some((aux, len)) = self.aux else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(count.min(len));
        for piece in wrapped(len, at, count) {
            // SAFETY: `wrapped` keeps each piece inside the `len` mapped bytes at `aux`; the
            // bytes between the AUX tail and head are the reader's until the tail moves on.
            let bytes =
                unsafe { std::slice::from_raw_parts(aux.as_ptr().add(piece.start), piece.len()) };
            out.extend_from_slice(bytes);
        }
        out
    }

    /// Takes every record the kernel finished, with the AUX bytes AUX records name, and hands
    /// the ring and the AUX area back up to the end of what was taken.
    fn take(&mut self) -> Vec<TraceItem> {
        let mut items = Vec::new();
        let mut aux_end = None;
        // The AUX bytes stay the reader's until the AUX tail moves: they are copied after the
        // ring's records are read.
        let mut records = Vec::new();
        self.ring
            .read_records(|record| records.push(parse_record(record.bytes)));
        for record in records.into_iter().flatten() {
            let aux_bytes = match record {
                TraceRecord::Aux { offset, size, .. } => {
                    aux_end = Some(offset + size);
                    self.copy_aux(offset, size as usize)
                }
                _ => Vec::new(),
            };
            items.push(TraceItem {
                record,
                aux: aux_bytes,
            });
        }
        if let Some(end) = aux_end {
            let page = self.page();
            atomic::fence(atomic::Ordering::Release);
            // SAFETY: the AUX bytes up to `end` were copied out; writing the tail hands that
            // room back to the kernel.
            unsafe { std::ptr::addr_of_mut!((*page).aux_tail).write_volatile(end) };
        }
        items
    }
}

impl Drop for AuxMapping {
    fn drop(&mut self) {
        if let Some((aux, aux_len)) = self.aux {
            // SAFETY: mapped by `map` with this length and not used after; the ring unmaps
            // itself.
            unsafe { libc::munmap(aux.as_ptr() as *mut libc::c_void, aux_len) };
        }
    }
}

/// The trace event of one CPU, with its mappings.
struct CpuTrace {
    cpu: u32,
    counter: Counter,
    mapping: AuxMapping,
}

/// An AUX-area event (Arm SPE) opened for a target: one mapped event per CPU the PMU covers,
/// the others writing into it.
pub struct AuxTrace {
    cpus: Vec<CpuTrace>,
    redirected: Vec<Counter>,
}

impl AuxTrace {
    /// Opens `spec` for `target` on the CPUs its PMU covers, disabled (a launched command
    /// enables it at exec). System-wide, switch records say which thread each CPU ran.
    pub fn open(spec: &EventSpec, target: &Target, facts: &SystemFacts) -> Result<AuxTrace> {
        let online = online_cpus()?;
        let cpus: Vec<usize> = match &spec.cpumask {
            Some(mask) => online
                .into_iter()
                .filter(|cpu| mask.contains(&(*cpu as u32)))
                .collect(),
            None => online,
        };
        let how = OpenAs {
            scope: match target {
                Target::System => Scope::SystemWide,
                _ => Scope::Task,
            },
            sampling: true,
        };
        let mut trace = AuxTrace {
            cpus: Vec::new(),
            redirected: Vec::new(),
        };
        for (pid, cpu) in per_cpu_placements(target, &cpus) {
            let mut builder = Builder::new(Software::DUMMY);
            spec.attr.apply(builder.attrs_mut());
            spec.sampling.apply(builder.attrs_mut());
            place(&mut builder, target, pid, Some(cpu));
            builder
                .sample_id_all(true)
                .sample(SampleFlag::TID | SampleFlag::TIME | SampleFlag::CPU)
                .context_switch(matches!(target, Target::System));
            let counter = match builder.build() {
                Ok(counter) => counter,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) && pid.is_some() => continue,
                Err(e) => return Err(open_error(spec, &e, how, facts).into()),
            };
            match trace.cpus.iter().find(|traced| traced.cpu == cpu as u32) {
                Some(owner) => {
                    redirect_output(&counter, owner.counter.as_raw_fd()).with_context(|| {
                        format!("sending {}'s trace of CPU {cpu} into one buffer", spec.name)
                    })?;
                    trace.redirected.push(counter);
                }
                None => {
                    let mapping = AuxMapping::map(counter.as_raw_fd(), RING_BYTES, Some(AUX_BYTES))
                        .map_err(|e| {
                            anyhow!(
                                "cannot map the AUX area of {} on CPU {cpu} ({} KiB): {e}; \
                                 the kernel limits locked perf buffers per user to \
                                 kernel.perf_event_mlock_kb (raise it, or run as root)",
                                spec.name,
                                AUX_BYTES >> 10
                            )
                        })?;
                    trace.cpus.push(CpuTrace {
                        cpu: cpu as u32,
                        counter,
                        mapping,
                    });
                }
            }
        }
        if trace.cpus.is_empty() {
            return Err(anyhow!(
                "cannot open event '{}': every target thread exited",
                spec.name
            ));
        }
        Ok(trace)
    }

    fn counters(&mut self) -> impl Iterator<Item = &mut Counter> {
        self.cpus
            .iter_mut()
            .map(|traced| &mut traced.counter)
            .chain(self.redirected.iter_mut())
    }

    pub fn enable(&mut self) -> Result<()> {
        for counter in self.counters() {
            counter.enable().context("enabling an AUX trace event")?;
        }
        Ok(())
    }

    /// Stops tracing; the kernel writes an AUX record for what each CPU's area still holds.
    pub fn disable(&mut self) -> Result<()> {
        for counter in self.counters() {
            counter.disable().context("disabling an AUX trace event")?;
        }
        Ok(())
    }

    /// Takes what every CPU's ring and AUX area hold.
    pub fn read(&mut self) -> Vec<CpuRead> {
        self.cpus
            .iter_mut()
            .map(|traced| CpuRead {
                cpu: traced.cpu,
                clock: traced.mapping.clock(),
                items: traced.mapping.take(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_id(pid: u32, tid: u32, time: u64, cpu: u32) -> Vec<u8> {
        let mut bytes = Vec::new();
        for word in [pid, tid] {
            bytes.extend(word.to_ne_bytes());
        }
        bytes.extend(time.to_ne_bytes());
        bytes.extend(cpu.to_ne_bytes());
        bytes.extend(0u32.to_ne_bytes());
        bytes
    }

    fn record(kind: u32, misc: u16, body: &[u8], id: &[u8]) -> Vec<u8> {
        let size = (8 + body.len() + id.len()) as u16;
        let mut bytes = kind.to_ne_bytes().to_vec();
        bytes.extend(misc.to_ne_bytes());
        bytes.extend(size.to_ne_bytes());
        bytes.extend(body);
        bytes.extend(id);
        bytes
    }

    fn words(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn aux_switch_and_lost_records_decode_with_their_sample_ids() {
        let id = sample_id(40, 41, 1_000_000, 3);
        let aux = record(PERF_RECORD_AUX, 0, &words(&[4096, 512, 1]), &id);
        assert_eq!(
            parse_record(&aux),
            Some(TraceRecord::Aux {
                offset: 4096,
                size: 512,
                flags: PERF_AUX_FLAG_TRUNCATED,
                id: SampleId {
                    pid: 40,
                    tid: 41,
                    time: 1_000_000,
                    cpu: 3
                }
            })
        );
        let next: Vec<u8> = [50u32, 51].iter().flat_map(|w| w.to_ne_bytes()).collect();
        let out = record(
            PERF_RECORD_SWITCH_CPU_WIDE,
            PERF_RECORD_MISC_SWITCH_OUT,
            &next,
            &id,
        );
        assert!(matches!(
            parse_record(&out),
            Some(TraceRecord::Switch {
                out: true,
                other: (50, 51),
                ..
            })
        ));
        let into = record(PERF_RECORD_SWITCH_CPU_WIDE, 0, &next, &id);
        assert!(matches!(
            parse_record(&into),
            Some(TraceRecord::Switch { out: false, .. })
        ));
        let lost = record(PERF_RECORD_LOST, 0, &words(&[7, 12]), &id);
        assert_eq!(parse_record(&lost), Some(TraceRecord::Lost { lost: 12 }));
        // Cut short: refused, not read past its end; other types pass by.
        assert_eq!(parse_record(&aux[..aux.len() - 1]), None);
        assert_eq!(
            parse_record(&record(9, 0, &[], &id)),
            Some(TraceRecord::Other)
        );
        assert_eq!(parse_record(&[1, 2, 3]), None);
    }

    /// The ring reader against the real kernel: a software event's switch records on CPU 0,
    /// read through the same mapping code (without an AUX area, which software events lack),
    /// dated by the perf clock the mmap page describes.
    #[test]
    fn switch_records_of_a_real_ring_read_in_order_with_their_sample_ids() {
        let mut builder = Builder::new(Software::DUMMY);
        builder
            .any_pid()
            .one_cpu(0)
            .sample_id_all(true)
            .sample(SampleFlag::TID | SampleFlag::TIME | SampleFlag::CPU)
            .context_switch(true);
        let mut counter = builder
            .build()
            .expect("perf_event_open of a dummy event (root)");
        let mut mapping = AuxMapping::map(counter.as_raw_fd(), 16 << 10, None).unwrap();
        let clock = mapping.clock();
        let now = || {
            let mut time = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes the timespec it is given.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) };
            time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
        };
        let before = now();
        counter.enable().unwrap();
        // Sleeping threads on CPU 0 switch it several times a round; 200 rounds wrap the
        // 16 KiB ring (48-byte records) if the tail is not handed back.
        let mut items = Vec::new();
        for _ in 0..200 {
            let sleeper = std::thread::spawn(|| {
                // SAFETY: a zeroed cpu_set_t with CPU 0 set is a valid affinity mask.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(0, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            });
            sleeper.join().unwrap();
            items.extend(mapping.take());
        }
        counter.disable().unwrap();
        let after = now();
        let switches: Vec<SampleId> = items
            .iter()
            .filter_map(|item| match item.record {
                TraceRecord::Switch { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        assert!(switches.len() >= 400, "{} switches", switches.len());
        assert!(switches.iter().all(|id| id.cpu == 0));
        // Time order, within the run (the perf clock and CLOCK_MONOTONIC both count from boot
        // on x86 and arm64: a second of slack covers their drift).
        assert!(switches.windows(2).all(|pair| pair[0].time <= pair[1].time));
        let slack = 1_000_000_000;
        assert!(
            switches[0].time + slack >= before && switches.last().unwrap().time <= after + slack
        );
        let out = |item: &&TraceItem| matches!(item.record, TraceRecord::Switch { out: true, .. });
        assert!(items.iter().any(|item| out(&item)) && !items.iter().all(|item| out(&item)));
        // Where the kernel publishes the counter's conversion, a reading now is after them.
        if let (Some(clock), true) = (clock, cfg!(target_arch = "x86_64")) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: rdtsc reads the time-stamp counter, which user space may read.
            let count = unsafe { core::arch::x86_64::_rdtsc() };
            #[cfg(not(target_arch = "x86_64"))]
            let count = 0;
            let time = clock.time_of(count);
            let last = switches.last().unwrap().time;
            assert!(time >= last && time < last + slack, "{time} against {last}");
        }
    }

    #[test]
    fn timer_counts_become_perf_clock_time() {
        // A 25 MHz generic timer: 40 ns per count, as mult 40 << 20 and shift 20.
        let clock = PerfClock {
            zero: 1_000,
            mult: 40 << 20,
            shift: 20,
            short: None,
        };
        assert_eq!(clock.time_of(0), 1_000);
        assert_eq!(clock.time_of(25_000_000), 1_000 + 1_000_000_000);
        // A 56-bit counter that wrapped since `cycles`.
        let short = PerfClock {
            short: Some((0x00ff_ffff_ffff_fff0, (1 << 56) - 1)),
            ..clock
        };
        assert_eq!(
            short.time_of(0x10),
            clock.time_of(0x00ff_ffff_ffff_fff0 + 0x20)
        );
    }
}
