//! Feature sections (the header's `adds_features` bitmap): what machine and perf wrote the file,
//! event names, build ids, PMU numbering and capabilities. Sections this reader does not model
//! are listed in [`Features::skipped`].

use super::bytes::{c_string, slice_at, Reader};
use super::error::PerfDataError;
use super::header::CpuMode;

// Feature bit numbers (tools/perf/util/header.h).
const HEADER_BUILD_ID: u32 = 2;
const HEADER_HOSTNAME: u32 = 3;
const HEADER_OSRELEASE: u32 = 4;
const HEADER_VERSION: u32 = 5;
const HEADER_ARCH: u32 = 6;
const HEADER_NRCPUS: u32 = 7;
const HEADER_CPUDESC: u32 = 8;
const HEADER_CPUID: u32 = 9;
const HEADER_TOTAL_MEM: u32 = 10;
const HEADER_CMDLINE: u32 = 11;
const HEADER_EVENT_DESC: u32 = 12;
const HEADER_PMU_MAPPINGS: u32 = 16;
const HEADER_SAMPLE_TIME: u32 = 21;
const HEADER_CPU_PMU_CAPS: u32 = 28;
/// HYBRID_CPU_PMU_CAPS in perf before 6.0, same layout.
const HEADER_PMU_CAPS: u32 = 31;
pub(super) const HEADER_FEAT_BITS: u32 = 256;

/// build_id_event.header.misc: the build id's length is stored (else it is a 20-byte SHA-1).
const PERF_RECORD_MISC_BUILD_ID_SIZE: u16 = 1 << 15;
const BUILD_ID_SLOT: usize = 20;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// `uname -n` of the recording machine.
    pub hostname: Option<String>,
    /// `uname -r`.
    pub os_release: Option<String>,
    pub perf_version: Option<String>,
    /// `uname -m`.
    pub arch: Option<String>,
    pub nr_cpus: Option<NrCpus>,
    /// CPU model name (x86: /proc/cpuinfo "model name").
    pub cpu_desc: Option<String>,
    /// x86: "vendor,family,model,stepping", e.g. "AuthenticAMD,25,17,1".
    pub cpuid: Option<String>,
    pub total_mem_kib: Option<u64>,
    /// The `perf record` command line, one argument per entry.
    pub cmdline: Vec<String>,
    pub build_ids: Vec<BuildId>,
    /// PMU type number -> PMU name (`ibs_op`, `cpu`), for [`super::PerfAttr::event_type`].
    pub pmu_mappings: Vec<(u32, String)>,
    pub pmu_caps: Vec<PmuCap>,
    /// Times of the first and last sample.
    pub sample_time: Option<(u64, u64)>,
    /// Feature bits present in the file that this reader does not decode.
    pub skipped: Vec<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NrCpus {
    pub available: u32,
    pub online: u32,
}

/// A binary's build id as perf saw it at record time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildId {
    /// -1 for the kernel and its modules.
    pub pid: i32,
    pub cpumode: CpuMode,
    pub build_id: Vec<u8>,
    pub filename: String,
}

/// One sysfs capability of a PMU (`/sys/bus/event_source/devices/PMU/caps/NAME`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PmuCap {
    pub pmu: String,
    pub name: String,
    pub value: String,
}

/// An EVENT_DESC entry: an event's name and sample ids.
pub(super) struct EventDesc {
    pub name: String,
    pub ids: Vec<u64>,
}

/// Decodes the feature sections whose table starts at `table_offset`.
pub(super) fn decode_features(
    file: &[u8],
    table_offset: u64,
    bitmap: &[u64; 4],
) -> Result<(Features, Vec<EventDesc>), PerfDataError> {
    let mut features = Features::default();
    let mut event_desc = Vec::new();
    let present: Vec<u32> = (1..HEADER_FEAT_BITS)
        .filter(|&bit| bitmap[bit as usize / 64] >> (bit % 64) & 1 != 0)
        .collect();
    let table_len = 16 * present.len() as u64;
    let mut table = Reader::new(
        slice_at(file, table_offset, table_len, "feature section table")?,
        table_offset,
    );
    for bit in present {
        let what = format!("feature section table entry for feature {bit}");
        let offset = table.u64(&what)?;
        let size = table.u64(&what)?;
        let context = format!("feature section {bit}");
        let mut r = Reader::new(slice_at(file, offset, size, &context)?, offset);
        let in_feature = |e: PerfDataError| e.within(&context);
        match bit {
            HEADER_HOSTNAME => features.hostname = Some(string(&mut r).map_err(in_feature)?),
            HEADER_OSRELEASE => features.os_release = Some(string(&mut r).map_err(in_feature)?),
            HEADER_VERSION => features.perf_version = Some(string(&mut r).map_err(in_feature)?),
            HEADER_ARCH => features.arch = Some(string(&mut r).map_err(in_feature)?),
            HEADER_CPUDESC => features.cpu_desc = Some(string(&mut r).map_err(in_feature)?),
            HEADER_CPUID => features.cpuid = Some(string(&mut r).map_err(in_feature)?),
            HEADER_NRCPUS => {
                features.nr_cpus = Some(NrCpus {
                    available: r.u32("nr_cpus_avail").map_err(in_feature)?,
                    online: r.u32("nr_cpus_online").map_err(in_feature)?,
                })
            }
            HEADER_TOTAL_MEM => {
                features.total_mem_kib = Some(r.u64("total_mem").map_err(in_feature)?)
            }
            HEADER_CMDLINE => features.cmdline = string_list(&mut r).map_err(in_feature)?,
            HEADER_EVENT_DESC => event_desc = decode_event_desc(&mut r).map_err(in_feature)?,
            HEADER_BUILD_ID => features.build_ids = decode_build_ids(&mut r).map_err(in_feature)?,
            HEADER_PMU_MAPPINGS => {
                features.pmu_mappings = decode_pmu_mappings(&mut r).map_err(in_feature)?
            }
            HEADER_SAMPLE_TIME => {
                let first = r.u64("first sample time").map_err(in_feature)?;
                let last = r.u64("last sample time").map_err(in_feature)?;
                features.sample_time = Some((first, last));
            }
            HEADER_CPU_PMU_CAPS => features
                .pmu_caps
                .extend(decode_caps(&mut r, "cpu").map_err(in_feature)?),
            HEADER_PMU_CAPS => features
                .pmu_caps
                .extend(decode_pmu_caps(&mut r).map_err(in_feature)?),
            _ => features.skipped.push(bit),
        }
    }
    Ok((features, event_desc))
}

/// `struct perf_header_string`: u32 length, then that many bytes, NUL-padded.
fn string(r: &mut Reader) -> Result<String, PerfDataError> {
    let len = r.u32("string length")?;
    Ok(c_string(r.bytes(u64::from(len), "string")?))
}

/// `struct perf_header_string_list`: u32 count, then that many strings.
fn string_list(r: &mut Reader) -> Result<Vec<String>, PerfDataError> {
    let nr = r.u32("string count")?;
    // Each string takes at least its 4-byte length, which bounds the allocation.
    let mut out = Vec::with_capacity((nr as usize).min(r.remaining() / 4));
    for _ in 0..nr {
        out.push(string(r)?);
    }
    Ok(out)
}

fn decode_event_desc(r: &mut Reader) -> Result<Vec<EventDesc>, PerfDataError> {
    let nr = r.u32("event count")?;
    let attr_size = r.u32("attr size")?;
    let mut events = Vec::with_capacity((nr as usize).min(r.remaining() / 8));
    for _ in 0..nr {
        r.bytes(u64::from(attr_size), "event attr")?;
        let nr_ids = r.u32("event id count")?;
        let name = string(r)?;
        let ids = r.u64_array(u64::from(nr_ids), "event ids")?;
        events.push(EventDesc { name, ids });
    }
    Ok(events)
}

/// A sequence of `struct build_id_event` filling the section.
fn decode_build_ids(r: &mut Reader) -> Result<Vec<BuildId>, PerfDataError> {
    let mut out = Vec::new();
    while !r.is_empty() {
        let offset = r.offset();
        r.u32("build id record type")?;
        let misc = r.u16("build id record misc")?;
        let size = r.u16("build id record size")?;
        // header (8) + pid (4) + build id slot (24)
        let fixed = 8 + 4 + 24;
        let Some(name_len) = usize::from(size).checked_sub(fixed) else {
            return Err(PerfDataError::Malformed {
                what: "build id record".to_string(),
                offset,
                problem: format!("its size {size} is smaller than the fixed {fixed} bytes"),
            });
        };
        let pid = r.i32("build id pid")?;
        let slot = r.bytes(24, "build id")?;
        let len = if misc & PERF_RECORD_MISC_BUILD_ID_SIZE != 0 {
            usize::from(slot[BUILD_ID_SLOT]).min(BUILD_ID_SLOT)
        } else {
            BUILD_ID_SLOT
        };
        out.push(BuildId {
            pid,
            cpumode: CpuMode::from_misc(misc),
            build_id: slot[..len].to_vec(),
            filename: c_string(r.bytes(name_len as u64, "build id filename")?),
        });
    }
    Ok(out)
}

fn decode_pmu_mappings(r: &mut Reader) -> Result<Vec<(u32, String)>, PerfDataError> {
    let nr = r.u32("pmu count")?;
    let mut out = Vec::with_capacity((nr as usize).min(r.remaining() / 8));
    for _ in 0..nr {
        let pmu_type = r.u32("pmu type")?;
        out.push((pmu_type, string(r)?));
    }
    Ok(out)
}

/// u32 count, then (name, value) string pairs, all of one PMU.
fn decode_caps(r: &mut Reader, pmu: &str) -> Result<Vec<PmuCap>, PerfDataError> {
    let nr = r.u32("capability count")?;
    let mut out = Vec::with_capacity((nr as usize).min(r.remaining() / 8));
    for _ in 0..nr {
        let name = string(r)?;
        let value = string(r)?;
        out.push(PmuCap {
            pmu: pmu.to_string(),
            name,
            value,
        });
    }
    Ok(out)
}

/// u32 PMU count, then per PMU its capabilities followed by its name.
fn decode_pmu_caps(r: &mut Reader) -> Result<Vec<PmuCap>, PerfDataError> {
    let nr_pmus = r.u32("pmu count")?;
    let mut out = Vec::new();
    for _ in 0..nr_pmus {
        let mut caps = decode_caps(r, "")?;
        let pmu = string(r)?;
        for cap in &mut caps {
            cap.pmu.clone_from(&pmu);
        }
        out.extend(caps);
    }
    Ok(out)
}
