//! Perf's record formats: the reader for perf.data files written by `perf record`, following the
//! kernel's description of the format (tools/perf/Documentation/perf.data-file-format.txt,
//! include/uapi/linux/perf_event.h), and the decoders of the records the live side-band reads
//! from the kernel in the same layouts ([`decode_process_record`]). It owns the file layout
//! (header, attrs, data records, feature sections) and produces a [`PerfData`] model that says
//! nothing about symbols or reports.
//!
//! Written here rather than taken from a crate because the published readers misplace every
//! sample field after PERF_SAMPLE_WEIGHT_STRUCT, which x86 perf always requests for memory
//! events. Any input is safe to parse: every read is bounds-checked and nothing is allocated
//! beyond what the file holds.

mod attr;
mod bytes;
mod error;
mod features;
mod header;
mod records;
mod sample;

#[cfg(test)]
mod perf_record_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod writer;

use std::collections::BTreeMap;
use std::path::Path;

pub use attr::*;
pub use error::PerfDataError;
pub use features::{BuildId, Features, NrCpus, PmuCap};
pub use header::CpuMode;
pub use records::{
    decode_process_record, mapping_or_name_pid, maps_code, AuxTrace, Comm, CommFields, FileId,
    Mmap, MmapFields, ProcessRecord, TaskEvent, Throttle, PERF_RECORD_MISC_MMAP_BUILD_ID,
};
pub use sample::{
    BranchEntry, BranchStack, PerfSample, ReadValue, ReadValues, Registers, UserStack, Weight,
    WeightParts,
};

use bytes::{slice_at, Reader};

/// `struct perf_file_header`: magic, size, attr_size, three sections, 256 feature bits.
const FILE_HEADER_LEN: u64 = 8 + 8 + 8 + 3 * 16 + 32;
/// `struct perf_pipe_file_header`: magic and size only.
const PIPE_HEADER_LEN: u64 = 16;
const FILE_SECTION_LEN: u64 = 16;
/// sample_type bits this reader knows the layout of; a sample with others cannot be decoded.
const KNOWN_SAMPLE_TYPE: u64 = (PERF_SAMPLE_WEIGHT_STRUCT << 1) - 1;

/// Everything a perf.data file recorded, in file order (not sorted by time).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerfData {
    /// The recorded events; samples refer to them by index.
    pub attrs: Vec<PerfAttr>,
    pub samples: Vec<PerfSample>,
    pub mmaps: Vec<Mmap>,
    pub comms: Vec<Comm>,
    pub forks: Vec<TaskEvent>,
    pub exits: Vec<TaskEvent>,
    pub throttles: Vec<Throttle>,
    /// Hardware trace data (PERF_RECORD_AUXTRACE), in file order.
    pub aux_traces: Vec<AuxTrace>,
    /// Records the kernel dropped because perf's ring buffer was full (PERF_RECORD_LOST).
    pub lost: u64,
    /// Samples the kernel dropped (PERF_RECORD_LOST_SAMPLES).
    pub lost_samples: u64,
    /// Samples whose event id matches none of the attrs; they are not in `samples`.
    pub samples_with_unknown_id: u64,
    pub features: Features,
    /// Record type -> count, for records this reader does not model (FINISHED_ROUND,
    /// ID_INDEX, the kernel's SWITCH, KSYMBOL...).
    pub skipped_records: BTreeMap<u32, u64>,
}

/// Reads and parses a perf.data file.
pub fn read_perf_data(path: impl AsRef<Path>) -> Result<PerfData, PerfDataError> {
    let path = path.as_ref();
    let bytes = crate::input::read_input(path).map_err(|source| PerfDataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&bytes)
}

/// Parses the bytes of a whole perf.data file.
pub fn parse(file: &[u8]) -> Result<PerfData, PerfDataError> {
    let mut r = Reader::new(file, 0);
    let magic: [u8; 8] = r.bytes(8, "file magic")?.try_into().expect("8-byte magic");
    match &magic {
        b"PERFILE2" => {}
        b"2ELIFREP" => {
            return Err(PerfDataError::Unsupported(
                "big-endian perf.data is not supported: convert it on a big-endian machine with \
                 `perf script` or record on a little-endian one",
            ))
        }
        b"PERFFILE" => {
            return Err(PerfDataError::Unsupported(
                "perf.data version 1 (perf before Linux 3.1) is not supported: record with a \
                 newer perf",
            ))
        }
        _ => return Err(PerfDataError::NotPerfData { magic }),
    }
    let header_len = r.u64("header size")?;
    if header_len == PIPE_HEADER_LEN {
        return Err(PerfDataError::Unsupported(
            "pipe-mode perf.data (from `perf record -o -`) is not supported: record to a file \
             (`perf record -o perf.data`) or convert it with `perf inject -i IN -o OUT`",
        ));
    }
    if header_len < FILE_HEADER_LEN {
        return Err(PerfDataError::Malformed {
            what: "file header".to_string(),
            offset: 8,
            problem: format!("it says it is {header_len} bytes, less than {FILE_HEADER_LEN}"),
        });
    }
    let attr_entry_len = r.u64("attr size")?;
    let attrs_section = section(&mut r, "attrs section")?;
    let data_section = section(&mut r, "data section")?;
    section(&mut r, "event_types section")?;
    let mut feature_bits = [0u64; 4];
    for word in &mut feature_bits {
        *word = r.u64("feature bits")?;
    }

    let mut attrs = decode_attrs(file, attr_entry_len, attrs_section)?;
    let (data_offset, data_len) = data_section;
    let data = slice_at(file, data_offset, data_len, "data section")?;
    let data_end = data_offset + data_len;
    if data_len == 0 && file.len() as u64 > data_offset && feature_bits == [0; 4] {
        return Err(PerfDataError::Malformed {
            what: "file header".to_string(),
            offset: 0,
            problem: format!(
                "it lists no data and no features, yet {} bytes follow the header: `perf record` \
                 never finished this file (was it killed?); record again and let it stop",
                file.len() as u64 - data_offset
            ),
        });
    }
    let (features, event_desc) = features::decode_features(file, data_end, &feature_bits)?;
    name_events(&mut attrs, event_desc);

    let mut out = PerfData {
        features,
        ..PerfData::default()
    };
    records::decode_data_section(data, data_offset, &attrs, &mut out)?;
    out.attrs = attrs;
    Ok(out)
}

/// A `struct perf_file_section` (offset, size) as a pair.
fn section(r: &mut Reader, what: &str) -> Result<(u64, u64), PerfDataError> {
    Ok((r.u64(what)?, r.u64(what)?))
}

/// The attrs section: `attr_entry_len`-byte entries, each an attr followed by the file section
/// of its sample ids.
fn decode_attrs(
    file: &[u8],
    attr_entry_len: u64,
    (offset, len): (u64, u64),
) -> Result<Vec<PerfAttr>, PerfDataError> {
    let malformed = |problem: String| PerfDataError::Malformed {
        what: "attrs section".to_string(),
        offset,
        problem,
    };
    if attr_entry_len <= FILE_SECTION_LEN || len % attr_entry_len != 0 {
        return Err(malformed(format!(
            "its {len} bytes are not a whole number of {attr_entry_len}-byte attr entries"
        )));
    }
    if len == 0 {
        return Err(malformed("it lists no events".to_string()));
    }
    let entries = slice_at(file, offset, len, "attrs section")?;
    let attr_len = (attr_entry_len - FILE_SECTION_LEN) as usize;
    let mut attrs = Vec::new();
    for (index, entry) in entries.chunks_exact(attr_entry_len as usize).enumerate() {
        let entry_offset = offset + index as u64 * attr_entry_len;
        let mut attr = PerfAttr::decode(&entry[..attr_len], entry_offset)?;
        let unknown = attr.sample_type & !KNOWN_SAMPLE_TYPE;
        if unknown != 0 {
            return Err(PerfDataError::Malformed {
                what: format!("attr of event {index}"),
                offset: entry_offset,
                problem: format!(
                    "sample_type 0x{:x} has bits 0x{unknown:x} whose sample layout this reader \
                     does not know (recorded by a newer kernel?)",
                    attr.sample_type
                ),
            });
        }
        let mut ids_section = Reader::new(&entry[attr_len..], entry_offset + attr_len as u64);
        let (ids_offset, ids_len) = section(&mut ids_section, "attr ids section")?;
        let ids = slice_at(file, ids_offset, ids_len, "attr ids")?;
        attr.ids = Reader::new(ids, ids_offset).u64_array(ids_len / 8, "attr ids")?;
        attrs.push(attr);
    }
    Ok(attrs)
}

/// Gives each attr its name from EVENT_DESC: by sample id, or by position when the file's
/// attrs carry no ids (perf writes both lists in the same order).
fn name_events(attrs: &mut [PerfAttr], descs: Vec<features::EventDesc>) {
    let same_count = descs.len() == attrs.len();
    for (index, desc) in descs.into_iter().enumerate() {
        let by_id = attrs
            .iter()
            .position(|a| a.ids.iter().any(|id| desc.ids.contains(id)));
        let target = by_id.or(same_count.then_some(index));
        if let Some(attr) = target.and_then(|i| attrs.get_mut(i)) {
            attr.name = Some(desc.name);
        }
    }
}
