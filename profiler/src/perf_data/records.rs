//! The data section: a stream of `perf_event_header`-framed records. Finds each sample's event
//! and hands it to [`super::sample`]; decodes mappings, thread names and lifetimes, and
//! loss/throttle records; counts every record type it does not model.

use std::collections::HashMap;

use super::attr::*;
use super::bytes::{c_string, until_nul, Reader};
use super::error::PerfDataError;
use super::header::CpuMode;
use super::sample::decode_sample;
use super::PerfData;

// Kernel record types (enum perf_event_type).
const PERF_RECORD_MMAP: u32 = 1;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_EXIT: u32 = 4;
const PERF_RECORD_THROTTLE: u32 = 5;
const PERF_RECORD_UNTHROTTLE: u32 = 6;
const PERF_RECORD_FORK: u32 = 7;
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_RECORD_MMAP2: u32 = 10;
const PERF_RECORD_LOST_SAMPLES: u32 = 13;
const PERF_RECORD_KSYMBOL: u32 = 17;
// Record types perf itself writes (tools/lib/perf/include/perf/event.h).
const PERF_RECORD_AUXTRACE: u32 = 71;
const PERF_RECORD_COMPRESSED: u32 = 81;
const PERF_RECORD_COMPRESSED2: u32 = 83;

const HEADER_LEN: usize = 8;

// perf_event_header.misc bits.
/// MMAP/MMAP2: a data (non-executable) mapping. COMM: the name changed because of exec.
const PERF_RECORD_MISC_MMAP_DATA_OR_COMM_EXEC: u16 = 1 << 13;
/// MMAP2: carries a build id instead of device and inode.
pub const PERF_RECORD_MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// PERF_RECORD_MMAP or MMAP2: a file or anonymous region mapped into a process (or the kernel).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mmap {
    pub pid: u32,
    pub tid: u32,
    pub start: u64,
    pub len: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    pub filename: String,
    pub cpumode: CpuMode,
    /// A non-executable (data) mapping, recorded with `perf record -d`.
    pub data: bool,
    /// MMAP2 only.
    pub prot: Option<u32>,
    /// MMAP2 only.
    pub flags: Option<u32>,
    /// MMAP2 without a build id: the file's device and inode.
    pub file_id: Option<FileId>,
    /// MMAP2 with PERF_RECORD_MISC_MMAP_BUILD_ID.
    pub build_id: Option<Vec<u8>>,
    pub time: Option<u64>,
}

/// Whether a mapping holds code: MMAP2 says so in its protection, MMAP by the flag perf sets on
/// data mappings (`perf record -d`).
pub fn maps_code(prot: Option<u32>, data: bool) -> bool {
    prot.map_or(!data, |prot| prot & libc::PROT_EXEC as u32 != 0)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    pub maj: u32,
    pub min: u32,
    pub ino: u64,
    pub ino_generation: u64,
}

/// PERF_RECORD_AUXTRACE: a piece of a hardware tracer's AUX buffer (Arm SPE records, Intel
/// PT packets...), which perf copies into the file after the record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuxTrace {
    /// Where the piece starts in the AUX buffer's byte stream.
    pub offset: u64,
    /// Which AUX buffer (one per CPU or per thread).
    pub idx: u32,
    /// The traced thread, when perf traced per thread.
    pub tid: Option<u32>,
    /// The traced CPU, when perf traced per CPU.
    pub cpu: Option<u32>,
    pub data: Vec<u8>,
}

/// PERF_RECORD_COMM: a thread's name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comm {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The name changed because the thread called exec.
    pub exec: bool,
    pub time: Option<u64>,
}

/// PERF_RECORD_FORK or PERF_RECORD_EXIT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskEvent {
    pub pid: u32,
    pub ppid: u32,
    pub tid: u32,
    pub ptid: u32,
    pub time: u64,
}

/// PERF_RECORD_THROTTLE / UNTHROTTLE: the kernel stopped or resumed sampling an event because
/// its interrupts took too long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle {
    pub throttled: bool,
    pub time: u64,
    pub id: u64,
    pub attr_index: Option<usize>,
}

/// Finds the event (attr) a record belongs to.
struct EventLookup<'a> {
    attrs: &'a [PerfAttr],
    by_id: HashMap<u64, usize>,
    /// Where samples keep their event id, when all events agree on it.
    sample_id_offset: Option<u64>,
    trailer: TrailerLayout,
}

enum TrailerLayout {
    /// All events have the same `struct sample_id` layout: this event describes it.
    Uniform(usize),
    /// Layouts differ but all end in PERF_SAMPLE_IDENTIFIER: the last u64 names the event.
    ByIdentifier,
    /// Cannot be told apart: non-sample records are read without their trailer.
    Unknown,
}

impl<'a> EventLookup<'a> {
    fn new(attrs: &'a [PerfAttr]) -> Self {
        let by_id = attrs
            .iter()
            .enumerate()
            .flat_map(|(index, attr)| attr.ids.iter().map(move |&id| (id, index)))
            .collect();
        let first_offset = attrs.first().and_then(PerfAttr::sample_id_offset);
        let sample_id_offset =
            first_offset.filter(|_| attrs.iter().all(|a| a.sample_id_offset() == first_offset));
        let id_bits = PERF_SAMPLE_TID
            | PERF_SAMPLE_TIME
            | PERF_SAMPLE_ID
            | PERF_SAMPLE_STREAM_ID
            | PERF_SAMPLE_CPU
            | PERF_SAMPLE_IDENTIFIER;
        let layout = |a: &PerfAttr| (a.sample_id_all, a.sample_type & id_bits);
        let trailer = if attrs.iter().all(|a| layout(a) == layout(&attrs[0])) {
            TrailerLayout::Uniform(0)
        } else if attrs
            .iter()
            .all(|a| a.sample_id_all && a.samples(PERF_SAMPLE_IDENTIFIER))
        {
            TrailerLayout::ByIdentifier
        } else {
            TrailerLayout::Unknown
        };
        Self {
            attrs,
            by_id,
            sample_id_offset,
            trailer,
        }
    }

    /// The event of a sample, `None` when its id matches no event.
    fn sample_attr(&self, body: &[u8], offset: u64) -> Result<Option<usize>, PerfDataError> {
        if self.attrs.len() == 1 {
            return Ok(Some(0));
        }
        let Some(id_offset) = self.sample_id_offset else {
            return Err(PerfDataError::Malformed {
                what: "event list".to_string(),
                offset,
                problem: "several events are recorded but their samples carry no event id at a \
                          common position (PERF_SAMPLE_IDENTIFIER or PERF_SAMPLE_ID), so samples \
                          cannot be told apart"
                    .to_string(),
            });
        };
        let mut r = Reader::new(body, offset);
        r.bytes(id_offset, "fields before the sample id")?;
        let id = r.u64("sample id")?;
        Ok(self.by_id.get(&id).copied())
    }

    /// Splits a non-sample record body into its own fields and its sample_id trailer.
    fn split_trailer<'b>(
        &self,
        body: &'b [u8],
        offset: u64,
    ) -> Result<(&'b [u8], SampleId), PerfDataError> {
        let attr = match self.trailer {
            TrailerLayout::Uniform(index) => &self.attrs[index],
            TrailerLayout::ByIdentifier => {
                let id = body
                    .len()
                    .checked_sub(8)
                    .map(|at| u64::from_le_bytes(body[at..].try_into().expect("8 bytes")));
                match id.and_then(|id| self.by_id.get(&id)) {
                    Some(&index) => &self.attrs[index],
                    None => return Ok((body, SampleId::default())),
                }
            }
            TrailerLayout::Unknown => return Ok((body, SampleId::default())),
        };
        let trailer_len = attr.sample_id_trailer_len() as usize;
        let Some(own_len) = body.len().checked_sub(trailer_len) else {
            return Err(PerfDataError::Truncated {
                what: "sample_id trailer".to_string(),
                offset,
                needed: trailer_len as u64,
                remaining: body.len() as u64,
            });
        };
        let mut trailer = Reader::new(&body[own_len..], offset + own_len as u64);
        Ok((&body[..own_len], attr.decode_sample_id(&mut trailer)?))
    }
}

/// Decodes every record of the data section into `out`; `attrs` are the file's events.
pub(super) fn decode_data_section(
    data: &[u8],
    base: u64,
    attrs: &[PerfAttr],
    out: &mut PerfData,
) -> Result<(), PerfDataError> {
    let events = EventLookup::new(attrs);
    let mut pos = 0usize;
    while pos < data.len() {
        let offset = base + pos as u64;
        let mut header = Reader::new(&data[pos..], offset);
        let record_type = header.u32("record header")?;
        let misc = header.u16("record header")?;
        let size = header.u16("record header")? as usize;
        let name = record_name(record_type);
        if size < HEADER_LEN {
            return Err(PerfDataError::Malformed {
                what: format!("{name} record (type {record_type})"),
                offset,
                problem: format!("its size {size} is smaller than its own 8-byte header"),
            });
        }
        let Some(record) = data.get(pos..pos + size) else {
            return Err(PerfDataError::Truncated {
                what: format!("{name} record (type {record_type})"),
                offset,
                needed: size as u64,
                remaining: (data.len() - pos) as u64,
            });
        };
        let body = &record[HEADER_LEN..];
        let body_offset = offset + HEADER_LEN as u64;
        let trailing_payload = decode_record(record_type, misc, body, body_offset, &events, out)
            .map_err(|e| e.within(&format!("{name} record at 0x{offset:x}")))?;
        pos += size;
        // AUXTRACE records are followed by their payload, which header.size does not count.
        let end = usize::try_from(trailing_payload)
            .ok()
            .and_then(|payload| pos.checked_add(payload))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| PerfDataError::Truncated {
                what: "PERF_RECORD_AUXTRACE payload".to_string(),
                offset: base + pos as u64,
                needed: trailing_payload,
                remaining: (data.len() - pos) as u64,
            })?;
        if trailing_payload > 0 {
            if let Some(trace) = out.aux_traces.last_mut() {
                trace.data = data[pos..end].to_vec();
            }
        }
        pos = end;
    }
    Ok(())
}

/// Decodes one record body; returns the size of a payload that follows the record outside
/// its header.size (AUXTRACE only), else 0.
fn decode_record(
    record_type: u32,
    misc: u16,
    body: &[u8],
    offset: u64,
    events: &EventLookup,
    out: &mut PerfData,
) -> Result<u64, PerfDataError> {
    match record_type {
        PERF_RECORD_SAMPLE => {
            let Some(attr_index) = events.sample_attr(body, offset)? else {
                out.samples_with_unknown_id += 1;
                return Ok(0);
            };
            let mut r = Reader::new(body, offset);
            let sample = decode_sample(&events.attrs[attr_index], attr_index, misc, &mut r)?;
            out.samples.push(sample);
        }
        PERF_RECORD_MMAP | PERF_RECORD_MMAP2 | PERF_RECORD_COMM => {
            let (own, id) = events.split_trailer(body, offset)?;
            match decode_process_record(record_type, misc, own, offset)? {
                Some(ProcessRecord::Mmap(fields)) => out.mmaps.push(fields.to_mmap(id.time)),
                Some(ProcessRecord::Comm(fields)) => out.comms.push(fields.to_comm(id.time)),
                _ => unreachable!("an MMAP or COMM record decodes as one"),
            }
        }
        PERF_RECORD_FORK | PERF_RECORD_EXIT | PERF_RECORD_LOST => {
            match decode_process_record(record_type, misc, body, offset)? {
                Some(ProcessRecord::Fork(task)) => out.forks.push(task),
                Some(ProcessRecord::Exit(task)) => out.exits.push(task),
                Some(ProcessRecord::Lost(lost)) => out.lost = out.lost.saturating_add(lost),
                _ => unreachable!("a FORK, EXIT or LOST record decodes as one"),
            }
        }
        PERF_RECORD_LOST_SAMPLES => {
            let mut r = Reader::new(body, offset);
            out.lost_samples = out.lost_samples.saturating_add(r.u64("lost")?);
        }
        PERF_RECORD_THROTTLE | PERF_RECORD_UNTHROTTLE => {
            let mut r = Reader::new(body, offset);
            let time = r.u64("time")?;
            let id = r.u64("id")?;
            out.throttles.push(Throttle {
                throttled: record_type == PERF_RECORD_THROTTLE,
                time,
                id,
                attr_index: events.by_id.get(&id).copied(),
            });
        }
        PERF_RECORD_COMPRESSED | PERF_RECORD_COMPRESSED2 => {
            return Err(PerfDataError::Unsupported(
                "compressed perf.data (recorded with `perf record -z`) is not supported: \
                 record again without -z",
            ));
        }
        PERF_RECORD_AUXTRACE => {
            let mut r = Reader::new(body, offset);
            let size = r.u64("auxtrace size")?;
            let trace_offset = r.u64("auxtrace offset")?;
            let _reference = r.u64("auxtrace reference")?;
            let idx = r.u32("auxtrace idx")?;
            let tid = r.u32("auxtrace tid")?;
            let cpu = r.u32("auxtrace cpu")?;
            out.aux_traces.push(AuxTrace {
                offset: trace_offset,
                idx,
                tid: (tid != u32::MAX).then_some(tid),
                cpu: (cpu != u32::MAX).then_some(cpu),
                data: Vec::new(),
            });
            return Ok(size);
        }
        other => *out.skipped_records.entry(other).or_default() += 1,
    }
    Ok(0)
}

/// A record about processes, borrowed from its bytes: what both a perf.data import and the
/// live side-band read (the side-band under process churn reads tens of thousands a second,
/// so nothing is copied until the caller keeps it).
pub enum ProcessRecord<'a> {
    Mmap(MmapFields<'a>),
    Comm(CommFields<'a>),
    Fork(TaskEvent),
    Exit(TaskEvent),
    /// Records the kernel dropped.
    Lost(u64),
    /// Kernel code loaded or unloaded: a BPF program or a trampoline.
    KernelSymbol(KernelSymbolFields<'a>),
}

/// The fields of a PERF_RECORD_KSYMBOL, borrowed.
pub struct KernelSymbolFields<'a> {
    pub address: u64,
    pub len: u32,
    /// The code was unloaded (PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER).
    pub unloaded: bool,
    /// Up to its NUL: `bpf_prog_<tag>_<name>`, `bpf_trampoline_<key>`, ...
    pub name: &'a [u8],
}

/// PERF_RECORD_KSYMBOL's flag for code going away.
const PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER: u16 = 1;

/// The fields of a PERF_RECORD_MMAP or MMAP2, borrowed.
pub struct MmapFields<'a> {
    pub pid: u32,
    pub tid: u32,
    pub start: u64,
    pub len: u64,
    pub pgoff: u64,
    pub cpumode: CpuMode,
    pub data: bool,
    pub prot: Option<u32>,
    pub flags: Option<u32>,
    pub file_id: Option<FileId>,
    pub build_id: Option<&'a [u8]>,
    /// Up to its NUL.
    pub filename: &'a [u8],
}

impl MmapFields<'_> {
    fn to_mmap(&self, time: Option<u64>) -> Mmap {
        Mmap {
            pid: self.pid,
            tid: self.tid,
            start: self.start,
            len: self.len,
            pgoff: self.pgoff,
            filename: c_string(self.filename),
            cpumode: self.cpumode,
            data: self.data,
            prot: self.prot,
            flags: self.flags,
            file_id: self.file_id,
            build_id: self.build_id.map(<[u8]>::to_vec),
            time,
        }
    }
}

/// The fields of a PERF_RECORD_COMM, borrowed.
pub struct CommFields<'a> {
    pub pid: u32,
    pub tid: u32,
    /// Up to its NUL.
    pub comm: &'a [u8],
    /// The name changed because the thread called exec.
    pub exec: bool,
}

impl CommFields<'_> {
    fn to_comm(&self, time: Option<u64>) -> Comm {
        Comm {
            pid: self.pid,
            tid: self.tid,
            comm: c_string(self.comm),
            exec: self.exec,
            time,
        }
    }
}

/// The process a mapping or name record (PERF_RECORD_MMAP, MMAP2, COMM) is of, its first
/// field, with the rest left undecoded: `None` for other records, or one too short to hold it.
pub fn mapping_or_name_pid(record_type: u32, own: &[u8]) -> Option<u32> {
    match record_type {
        PERF_RECORD_MMAP | PERF_RECORD_MMAP2 | PERF_RECORD_COMM => {
            Reader::new(own, 0).u32("pid").ok()
        }
        _ => None,
    }
}

/// Decodes a record about processes from `own`, its fields after the header (the sample_id
/// trailer may follow: it is not read); `None` for other record types.
pub fn decode_process_record(
    record_type: u32,
    misc: u16,
    own: &[u8],
    offset: u64,
) -> Result<Option<ProcessRecord<'_>>, PerfDataError> {
    let mut r = Reader::new(own, offset);
    Ok(Some(match record_type {
        PERF_RECORD_MMAP | PERF_RECORD_MMAP2 => {
            ProcessRecord::Mmap(decode_mmap(record_type == PERF_RECORD_MMAP2, misc, &mut r)?)
        }
        PERF_RECORD_COMM => ProcessRecord::Comm(CommFields {
            pid: r.u32("pid")?,
            tid: r.u32("tid")?,
            comm: until_nul(r.rest()),
            exec: misc & PERF_RECORD_MISC_MMAP_DATA_OR_COMM_EXEC != 0,
        }),
        PERF_RECORD_FORK | PERF_RECORD_EXIT => {
            let task = TaskEvent {
                pid: r.u32("pid")?,
                ppid: r.u32("ppid")?,
                tid: r.u32("tid")?,
                ptid: r.u32("ptid")?,
                time: r.u64("time")?,
            };
            match record_type {
                PERF_RECORD_FORK => ProcessRecord::Fork(task),
                _ => ProcessRecord::Exit(task),
            }
        }
        PERF_RECORD_LOST => {
            r.u64("id")?;
            ProcessRecord::Lost(r.u64("lost")?)
        }
        PERF_RECORD_KSYMBOL => {
            let address = r.u64("addr")?;
            let len = r.u32("len")?;
            let _kind = r.u16("ksym_type")?;
            let flags = r.u16("flags")?;
            ProcessRecord::KernelSymbol(KernelSymbolFields {
                address,
                len,
                unloaded: flags & PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER != 0,
                name: until_nul(r.rest()),
            })
        }
        _ => return Ok(None),
    }))
}

fn decode_mmap<'a>(
    is_mmap2: bool,
    misc: u16,
    r: &mut Reader<'a>,
) -> Result<MmapFields<'a>, PerfDataError> {
    let mut mmap = MmapFields {
        pid: r.u32("pid")?,
        tid: r.u32("tid")?,
        start: r.u64("addr")?,
        len: r.u64("len")?,
        pgoff: r.u64("pgoff")?,
        cpumode: CpuMode::from_misc(misc),
        data: misc & PERF_RECORD_MISC_MMAP_DATA_OR_COMM_EXEC != 0,
        prot: None,
        flags: None,
        file_id: None,
        build_id: None,
        filename: &[],
    };
    if is_mmap2 {
        if misc & PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
            let size = r.u8("build_id_size")?;
            r.bytes(3, "reserved")?;
            let build_id = r.bytes(20, "build_id")?;
            mmap.build_id = Some(&build_id[..usize::from(size).min(20)]);
        } else {
            mmap.file_id = Some(FileId {
                maj: r.u32("maj")?,
                min: r.u32("min")?,
                ino: r.u64("ino")?,
                ino_generation: r.u64("ino_generation")?,
            });
        }
        mmap.prot = Some(r.u32("prot")?);
        mmap.flags = Some(r.u32("flags")?);
    }
    mmap.filename = until_nul(r.rest());
    Ok(mmap)
}

fn record_name(record_type: u32) -> &'static str {
    match record_type {
        PERF_RECORD_MMAP => "PERF_RECORD_MMAP",
        PERF_RECORD_LOST => "PERF_RECORD_LOST",
        PERF_RECORD_COMM => "PERF_RECORD_COMM",
        PERF_RECORD_EXIT => "PERF_RECORD_EXIT",
        PERF_RECORD_THROTTLE => "PERF_RECORD_THROTTLE",
        PERF_RECORD_UNTHROTTLE => "PERF_RECORD_UNTHROTTLE",
        PERF_RECORD_FORK => "PERF_RECORD_FORK",
        PERF_RECORD_SAMPLE => "PERF_RECORD_SAMPLE",
        PERF_RECORD_MMAP2 => "PERF_RECORD_MMAP2",
        PERF_RECORD_LOST_SAMPLES => "PERF_RECORD_LOST_SAMPLES",
        PERF_RECORD_AUXTRACE => "PERF_RECORD_AUXTRACE",
        _ => "other",
    }
}
