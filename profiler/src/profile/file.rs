//! The profile file that `record -o FILE` writes and `report -i FILE` reads: one self-contained
//! [`Profile`] (samples, stacks, symbols resolved at record time, mappings and build IDs, events,
//! loss counters, host and kernel), readable offline on another machine.
//!
//! Layout, integers little-endian:
//!
//! | offset | size | content                                                          |
//! |--------|------|------------------------------------------------------------------|
//! | 0      | 8    | magic `EBPFPROF`                                                 |
//! | 8      | 4    | format version ([`FORMAT_VERSION`])                              |
//! | 12     | 4    | CRC-32 of everything from offset 16 to the end                   |
//! | 16     | 8    | payload length: bytes after the header                           |
//! | 24     | 8    | decoded length: bytes of the serialized profile                  |
//! | 32     |      | payload: the profile serialized with postcard, compressed with zstd |
//!
//! The serialized profile is the format 1 body (the [`Profile`] model without the fields marked
//! `#[serde(skip)]`), then in format 2 the additions of format 2 (the per-data-line latency
//! histograms), then in format 3 those of format 3 (the sampling counters' own event counts),
//! then in format 4 those of format 4 (the other names of sampled functions), then in format 5
//! the recording machine's architecture, then in format 6 the off-CPU profile (`record
//! --off-cpu`), then in format 7 its blocks by waker (`--wakers`), then in format 8 the Arm SPE
//! counters of hardware samples, serialized the same way.
//! Older files end sooner and read with the later additions empty.
//!
//! Why these encodings: postcard's wire format is specified and stable across its 1.x releases,
//! compact (varints, no field names) and among the fastest serde formats to decode, which is what
//! reading a million-sample profile needs; zstd decompresses several times faster than deflate at
//! a better ratio. postcard is not self-describing, so the serialized shape of the model is fixed
//! per format version: a change to the model that changes its serde shape must raise
//! [`FORMAT_VERSION`] and keep reading older formats, by appending the new parts after the body
//! as format 2 did, or through a frozen copy of the old model (the `format_N_file_still_reads`
//! tests fail when a shape changes).
//!
//! Writing goes through [`crate::output`]: a temporary file in the target's directory, synced,
//! then renamed over the target, so a crash leaves either the old file or the new one, never half
//! a file.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use profiler_common::hw::spe::SpeCounters;

use super::{
    offcpu::{OffCpuProfile, WokenBlocks},
    EventIndex, FrameId, FunctionAliases, LineLatencyHistogram, Profile,
};
use crate::output::Output;

pub const MAGIC: [u8; 8] = *b"EBPFPROF";
/// The format this profiler writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 8;
/// The oldest format it reads.
const OLDEST_FORMAT_VERSION: u32 = 1;

/// What format 2 added after the format 1 body.
type Format2Additions = (Vec<LineLatencyHistogram>,);
/// What format 3 added after format 2's additions: the sampling counters' own counts.
type Format3Additions = (Vec<u64>,);
/// What format 4 added after format 3's: the other names of sampled functions.
type Format4Additions = (Vec<FunctionAliases>,);
/// What format 5 added after format 4's: the recording machine's architecture.
type Format5Additions = (String,);
/// What format 6 added after format 5's: off-CPU time (`record --off-cpu`).
type Format6Additions = (Option<OffCpuProfile>,);
/// What format 7 added after format 6's: the off-CPU blocks by waker (`--wakers`).
type Format7Additions = (Vec<WokenBlocks>,);
/// What format 8 added after format 7's: Arm SPE counters, by index of their hardware sample.
type Format8Additions = (Vec<(u64, SpeCounters)>,);
/// perf.data files start with this.
const PERF_DATA_MAGIC: [u8; 8] = *b"PERFILE2";
const HEADER_LEN: usize = 32;
/// Start of the bytes the checksum covers.
const CHECKED_FROM: usize = 16;
/// zstd's default level: fast enough for large profiles at record time.
const ZSTD_LEVEL: i32 = 3;
/// How many times larger than its compressed payload a serialized profile may be. Profiles
/// compress about 3 to 1; zstd can compress a run of one pattern 30000 to 1, so a small file
/// could otherwise announce gigabytes. This bounds the memory reading a file takes by its size.
const MAX_EXPANSION: u64 = 64;
/// Serialized size always allowed, however small the payload.
const MIN_DECODED_LIMIT: u64 = 1 << 20;

/// An error reading or writing a profile file, naming the file when there is one.
#[derive(Debug)]
pub struct ProfileFileError {
    path: Option<PathBuf>,
    kind: ProfileFileErrorKind,
}

#[derive(Debug)]
pub enum ProfileFileErrorKind {
    Io {
        action: &'static str,
        source: io::Error,
    },
    /// A perf.data file was given where a profile file was expected.
    PerfData,
    /// The file does not start with [`MAGIC`].
    NotAProfile {
        start: Vec<u8>,
    },
    UnsupportedVersion {
        found: u32,
    },
    /// Shorter than the header the format needs.
    TruncatedHeader {
        actual: usize,
    },
    /// Shorter than the payload its header announces.
    Truncated {
        expected: u64,
        actual: u64,
    },
    TrailingBytes {
        extra: u64,
    },
    ChecksumMismatch {
        stored: u32,
        computed: u32,
    },
    Decompress(io::Error),
    DecodedLength {
        expected: u64,
        actual: u64,
    },
    /// The header announces more serialized bytes than [`MAX_EXPANSION`] allows.
    Expansion {
        payload: u64,
        decoded: u64,
    },
    Decode(postcard::Error),
    /// The profile decoded but refers to frames or events it does not hold.
    Inconsistent(String),
    Encode(postcard::Error),
    Compress(io::Error),
}

impl ProfileFileError {
    fn new(kind: ProfileFileErrorKind) -> Self {
        ProfileFileError { path: None, kind }
    }

    fn io(path: &Path, action: &'static str, source: io::Error) -> Self {
        ProfileFileError::new(ProfileFileErrorKind::Io { action, source }).in_file(path)
    }

    pub(crate) fn in_file(mut self, path: &Path) -> Self {
        self.path = Some(path.to_owned());
        self
    }

    pub fn kind(&self) -> &ProfileFileErrorKind {
        &self.kind
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl fmt::Display for ProfileFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        fmt::Display::fmt(&self.kind, f)
    }
}

impl fmt::Display for ProfileFileErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ProfileFileErrorKind::*;
        match self {
            Io { action, source } => write!(f, "{action}: {source}"),
            PerfData => write!(
                f,
                "looks like a perf.data file, not a profiler profile: \
                 use `profiler report -i perf.data`"
            ),
            NotAProfile { start } => write!(
                f,
                "not a profiler profile: it starts with \"{}\", profile files start with \"{}\"",
                start.escape_ascii(),
                MAGIC.escape_ascii()
            ),
            UnsupportedVersion { found } if *found > FORMAT_VERSION => write!(
                f,
                "written by a newer profiler (format {found}); this one reads format \
                 {FORMAT_VERSION}: read it with a newer profiler"
            ),
            UnsupportedVersion { found } => write!(
                f,
                "corrupt: format {found} is not one any profiler wrote \
                 (this one reads formats {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
            ),
            TruncatedHeader { actual } => write!(
                f,
                "truncated: a profile file starts with a {HEADER_LEN}-byte header, \
                 this one has {actual} bytes in all (incomplete copy?)"
            ),
            Truncated { expected, actual } => write!(
                f,
                "truncated: header says {expected} bytes of payload, file has {actual} \
                 (incomplete copy?)"
            ),
            TrailingBytes { extra } => write!(
                f,
                "corrupt: {extra} bytes follow the payload its header announces"
            ),
            ChecksumMismatch { stored, computed } => write!(
                f,
                "corrupt: checksum mismatch (stored {stored:08x}, computed {computed:08x}): \
                 the file was damaged after it was written"
            ),
            Decompress(e) => write!(f, "corrupt: the payload does not decompress: {e}"),
            DecodedLength { expected, actual } => write!(
                f,
                "corrupt: the payload decompresses to {actual} bytes, its header says {expected}"
            ),
            Expansion { payload, decoded } => write!(
                f,
                "corrupt: its header says the {payload}-byte payload decompresses to {decoded} \
                 bytes, more than {MAX_EXPANSION} times its size (profiles compress about 3 to 1)"
            ),
            Decode(e) => write!(f, "corrupt: the payload does not decode as a profile: {e}"),
            Inconsistent(what) => write!(f, "corrupt: {what}"),
            Encode(e) => write!(f, "cannot serialize the profile: {e}"),
            Compress(e) => write!(f, "cannot compress the profile: {e}"),
        }
    }
}

impl std::error::Error for ProfileFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        use ProfileFileErrorKind::*;
        match &self.kind {
            Io { source, .. } | Decompress(source) | Compress(source) => Some(source),
            Decode(e) | Encode(e) => Some(e),
            _ => None,
        }
    }
}

/// Writes `profile` to `output`, which puts it in place only once it is complete (the file at
/// the path is always either what was there before or the whole new profile).
pub fn write_profile(output: &Output, profile: &Profile) -> anyhow::Result<()> {
    SerializedProfile::of(profile)
        .map_err(|e| e.in_file(output.path()))?
        .write(output)
}

/// Reads the profile file at `path`.
pub fn read_profile(path: impl AsRef<Path>) -> Result<Profile, ProfileFileError> {
    let path = path.as_ref();
    let bytes =
        crate::input::read_input(path).map_err(|e| ProfileFileError::io(path, "cannot read", e))?;
    decode_profile(&bytes).map_err(|e| e.in_file(path))
}

/// The bytes of a profile file holding `profile`.
pub fn encode_profile(profile: &Profile) -> Result<Vec<u8>, ProfileFileError> {
    SerializedProfile::of(profile)?.encode()
}

/// A profile serialized, not yet compressed: compressing, most of the cost of writing a
/// profile file, can then go on on another thread while the profile is used (`record`
/// reports it meanwhile).
pub struct SerializedProfile(Vec<u8>);

impl SerializedProfile {
    pub fn of(profile: &Profile) -> Result<SerializedProfile, ProfileFileError> {
        let encode = |e| ProfileFileError::new(ProfileFileErrorKind::Encode(e));
        let body = postcard::to_allocvec(profile).map_err(encode)?;
        let serialized = postcard::to_extend(&(&profile.line_latency,), body).map_err(encode)?;
        let serialized =
            postcard::to_extend(&(&profile.losses.event_counts,), serialized).map_err(encode)?;
        let serialized =
            postcard::to_extend(&(&profile.function_aliases,), serialized).map_err(encode)?;
        let serialized =
            postcard::to_extend(&(&profile.meta.architecture,), serialized).map_err(encode)?;
        let serialized = postcard::to_extend(&(&profile.off_cpu,), serialized).map_err(encode)?;
        let wakers = profile
            .off_cpu
            .as_ref()
            .map_or(&[][..], |off_cpu| &off_cpu.wakers);
        let serialized = postcard::to_extend(&(wakers,), serialized).map_err(encode)?;
        let spe: Vec<(u64, SpeCounters)> = profile
            .hardware
            .samples
            .iter()
            .enumerate()
            .filter_map(|(index, sample)| Some((index as u64, sample.spe?)))
            .collect();
        let serialized = postcard::to_extend(&(spe,), serialized).map_err(encode)?;
        Ok(SerializedProfile(serialized))
    }

    /// The bytes of the profile file.
    pub fn encode(&self) -> Result<Vec<u8>, ProfileFileError> {
        frame_payload(&self.0)
    }

    /// Writes the profile file to `output` (see [`write_profile`]).
    pub fn write(&self, output: &Output) -> anyhow::Result<()> {
        let bytes = self.encode().map_err(|e| e.in_file(output.path()))?;
        output.write(|out| Ok(out.write_all(&bytes)?))
    }
}

/// Compresses a serialized profile and puts the header in front.
fn frame_payload(serialized: &[u8]) -> Result<Vec<u8>, ProfileFileError> {
    let payload = zstd::bulk::compress(serialized, ZSTD_LEVEL)
        .map_err(|e| ProfileFileError::new(ProfileFileErrorKind::Compress(e)))?;
    let mut file = Vec::with_capacity(HEADER_LEN + payload.len());
    file.extend_from_slice(&MAGIC);
    file.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    file.extend_from_slice(&[0; 4]);
    file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    file.extend_from_slice(&(serialized.len() as u64).to_le_bytes());
    file.extend_from_slice(&payload);
    let crc = crc32fast::hash(&file[CHECKED_FROM..]);
    file[12..16].copy_from_slice(&crc.to_le_bytes());
    Ok(file)
}

/// Decodes the bytes of a profile file. Never panics, whatever the bytes.
pub fn decode_profile(bytes: &[u8]) -> Result<Profile, ProfileFileError> {
    use ProfileFileErrorKind::*;
    let fail = |kind| Err(ProfileFileError::new(kind));
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());

    let start = &bytes[..bytes.len().min(MAGIC.len())];
    if start == PERF_DATA_MAGIC {
        return fail(PerfData);
    }
    if !MAGIC.starts_with(start) {
        return fail(NotAProfile {
            start: start.to_vec(),
        });
    }
    // The version comes first: a newer format may have another header.
    if bytes.len() < 12 {
        return fail(TruncatedHeader {
            actual: bytes.len(),
        });
    }
    let version = u32_at(8);
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return fail(UnsupportedVersion { found: version });
    }
    if bytes.len() < HEADER_LEN {
        return fail(TruncatedHeader {
            actual: bytes.len(),
        });
    }
    let stored_crc = u32_at(12);
    let payload_len = u64_at(16);
    let decoded_len = u64_at(24);
    let payload = &bytes[HEADER_LEN..];
    let actual = payload.len() as u64;
    if actual < payload_len {
        return fail(Truncated {
            expected: payload_len,
            actual,
        });
    }
    if actual > payload_len {
        return fail(TrailingBytes {
            extra: actual - payload_len,
        });
    }
    let computed_crc = crc32fast::hash(&bytes[CHECKED_FROM..]);
    if computed_crc != stored_crc {
        return fail(ChecksumMismatch {
            stored: stored_crc,
            computed: computed_crc,
        });
    }

    // Refused before anything is decompressed: a lying header cannot make us inflate without
    // bound. Read at most one byte more than announced, to see a payload that is longer.
    if decoded_len
        > payload_len
            .saturating_mul(MAX_EXPANSION)
            .max(MIN_DECODED_LIMIT)
    {
        return fail(Expansion {
            payload: payload_len,
            decoded: decoded_len,
        });
    }
    // Room for the one byte too many too, so that seeing it does not double the buffer.
    let mut decoded = Vec::with_capacity(decoded_len as usize + 1);
    zstd::stream::read::Decoder::with_buffer(payload)
        .and_then(|decoder| {
            decoder
                .take(decoded_len.saturating_add(1))
                .read_to_end(&mut decoded)
        })
        .map_err(|e| ProfileFileError::new(Decompress(e)))?;
    if decoded.len() as u64 != decoded_len {
        return fail(DecodedLength {
            expected: decoded_len,
            actual: decoded.len() as u64,
        });
    }
    let (mut profile, rest): (Profile, &[u8]) = match postcard::take_from_bytes(&decoded) {
        Ok(decoded) => decoded,
        Err(e) => return fail(Decode(e)),
    };
    // Each format's additions follow the previous format's; older files end sooner.
    let decoded_additions = |rest| {
        let (format_2, rest) = additions::<Format2Additions>(version, 2, rest)?;
        let (format_3, rest) = additions::<Format3Additions>(version, 3, rest)?;
        let (format_4, rest) = additions::<Format4Additions>(version, 4, rest)?;
        let (format_5, rest) = additions::<Format5Additions>(version, 5, rest)?;
        let (format_6, rest) = additions::<Format6Additions>(version, 6, rest)?;
        let (format_7, rest) = additions::<Format7Additions>(version, 7, rest)?;
        let (format_8, rest) = additions::<Format8Additions>(version, 8, rest)?;
        let formats = (
            format_2, format_3, format_4, format_5, format_6, format_7, format_8,
        );
        Ok::<_, postcard::Error>((formats, rest))
    };
    let ((format_2, format_3, format_4, format_5, format_6, format_7, format_8), rest) =
        match decoded_additions(rest) {
            Ok(decoded) => decoded,
            Err(e) => return fail(Decode(e)),
        };
    if let Some((line_latency,)) = format_2 {
        profile.line_latency = line_latency;
    }
    if let Some((event_counts,)) = format_3 {
        profile.losses.event_counts = event_counts;
    }
    if let Some((function_aliases,)) = format_4 {
        profile.function_aliases = function_aliases;
    }
    if let Some((architecture,)) = format_5 {
        profile.meta.architecture = architecture;
    }
    if let Some((off_cpu,)) = format_6 {
        profile.off_cpu = off_cpu;
    }
    if let (Some((wakers,)), Some(off_cpu)) = (format_7, &mut profile.off_cpu) {
        off_cpu.wakers = wakers;
    }
    for (index, counters) in format_8.map(|(spe,)| spe).unwrap_or_default() {
        let samples = profile.hardware.samples.len();
        let Some(sample) = usize::try_from(index)
            .ok()
            .and_then(|index| profile.hardware.samples.get_mut(index))
        else {
            return fail(Inconsistent(format!(
                "SPE counters refer to hardware sample {index} of {samples}"
            )));
        };
        sample.spe = Some(counters);
    }
    if !rest.is_empty() {
        return fail(Inconsistent(format!(
            "{} bytes follow the serialized profile",
            rest.len()
        )));
    }
    check_references(&profile).map_err(|what| ProfileFileError::new(Inconsistent(what)))?;
    Ok(profile)
}

/// The additions of format `since` when a file of format `version` has them, and the bytes
/// after them.
fn additions<'a, T: serde::Deserialize<'a>>(
    version: u32,
    since: u32,
    bytes: &'a [u8],
) -> postcard::Result<(Option<T>, &'a [u8])> {
    if version < since {
        return Ok((None, bytes));
    }
    let (additions, rest) = postcard::take_from_bytes(bytes)?;
    Ok((Some(additions), rest))
}

/// Every frame and event a profile refers to must be in it: reports index them directly.
fn check_references(profile: &Profile) -> Result<(), String> {
    let frames = profile.frames.len();
    let events = profile.events.len();
    let check = |what: &str, index: usize, event: EventIndex, frame_ids: &[FrameId]| {
        if event as usize >= events {
            return Err(format!(
                "{what} {index} is for event {event}, but the profile has {events} event(s)"
            ));
        }
        match frame_ids.iter().find(|&&id| id as usize >= frames) {
            Some(id) => Err(format!(
                "{what} {index} refers to frame {id}, but the profile has {frames} frame(s)"
            )),
            None => Ok(()),
        }
    };
    for (i, s) in profile.stacks.iter().enumerate() {
        check("stack sample", i, s.event, &s.frames)?;
    }
    for (i, s) in profile.instructions.iter().enumerate() {
        check("instruction sample", i, s.event, &[s.frame])?;
    }
    for (i, s) in profile.data_lines.iter().enumerate() {
        check("data cache-line sample", i, s.event, &[s.frame])?;
    }
    for (i, h) in profile.latency.iter().enumerate() {
        check("latency histogram", i, h.event, &[h.frame])?;
    }
    for (i, h) in profile.line_latency.iter().enumerate() {
        check("data-line latency histogram", i, h.event, &[])?;
    }
    let wakers = profile.off_cpu.iter().flat_map(|off_cpu| &off_cpu.wakers);
    for (i, woken) in wakers.enumerate() {
        let referenced = woken.frames.iter().chain(&woken.waker_frames);
        if let Some(id) = referenced.clone().find(|&&id| id as usize >= frames) {
            return Err(format!(
                "off-CPU wakers {i} refer to frame {id}, but the profile has {frames} frame(s)"
            ));
        }
    }
    let off_cpu = profile.off_cpu.iter().flat_map(|off_cpu| &off_cpu.blocks);
    for (i, blocks) in off_cpu.enumerate() {
        if let Some(id) = blocks.frames.iter().find(|&&id| id as usize >= frames) {
            return Err(format!(
                "off-CPU blocks {i} refer to frame {id}, but the profile has {frames} frame(s)"
            ));
        }
        if let Some((bucket, _)) = blocks
            .buckets
            .iter()
            .find(|(bucket, _)| usize::from(*bucket) >= profiler_common::latency::LATENCY_BUCKETS)
        {
            return Err(format!(
                "off-CPU blocks {i} count in histogram bucket {bucket}, which does not exist"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;

    use proptest::prelude::*;

    use super::*;
    use crate::profile::test_profile;
    use crate::profile::*;

    /// The export tests' profile plus every other part a profile carries.
    fn full_profile() -> Profile {
        let mut profile = test_profile::profile();
        let frame = test_profile::COMPUTE_INLINED;
        let stats = Stats {
            count: 60,
            latency_count: 3,
            latency_sum: 900,
            latency_max: 500,
        };
        profile.instructions = vec![InstructionSample {
            pid: 100,
            event: 0,
            frame,
            stats,
        }];
        profile.data_lines = vec![DataLineSample {
            pid: 100,
            event: 1,
            line: 0x7fff_0000_1040,
            frame,
            stats,
            per_cpu: vec![3, 1],
            tid: Some(101),
            access: DataAccess::Store,
        }];
        profile.latency = vec![LatencyHistogram {
            pid: 100,
            event: 1,
            frame,
            buckets: vec![(3, 2), (17, 2)],
        }];
        profile.line_latency = vec![LineLatencyHistogram {
            pid: 100,
            event: 1,
            line: 0x7fff_0000_1040,
            buckets: vec![(3, 1), (17, 2)],
        }];
        profile.losses = Losses {
            samples_fired: vec![102, 7],
            counters: BTreeMap::from([("user stacks lost: stack-map hash collision".into(), 2)]),
            period_sums: vec![0, 70],
            event_counts: Vec::new(),
        };
        profile.stacks[0].per_cpu = vec![40, 5];
        profile.stacks[0].cgroup = 1234;
        profile
    }

    fn error(bytes: &[u8]) -> ProfileFileError {
        decode_profile(bytes).expect_err("the bytes are not a valid profile file")
    }

    fn output(path: &Path) -> Output {
        use crate::output::Checker;

        Checker::default().check("-o", path).unwrap()
    }

    fn file_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn profile_round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.prof");
        let profile = full_profile();
        write_profile(&output(&path), &profile).unwrap();
        assert_eq!(read_profile(&path).unwrap(), profile);
        assert_eq!(file_names(dir.path()), ["run.prof"]);
    }

    #[test]
    fn rewriting_replaces_the_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.prof");
        write_profile(&output(&path), &full_profile()).unwrap();
        let smaller = test_profile::profile();
        write_profile(&output(&path), &smaller).unwrap();
        assert_eq!(read_profile(&path).unwrap(), smaller);
        assert_eq!(file_names(dir.path()), ["run.prof"]);
    }

    #[test]
    fn truncation_at_every_length_is_an_error() {
        let bytes = encode_profile(&test_profile::profile()).unwrap();
        let payload = bytes.len() - HEADER_LEN;
        for len in 0..bytes.len() {
            let message = error(&bytes[..len]).to_string();
            if len < HEADER_LEN {
                assert_eq!(
                    message,
                    format!(
                        "truncated: a profile file starts with a 32-byte header, this one has \
                         {len} bytes in all (incomplete copy?)"
                    )
                );
            } else {
                assert_eq!(
                    message,
                    format!(
                        "truncated: header says {payload} bytes of payload, file has {} \
                         (incomplete copy?)",
                        len - HEADER_LEN
                    )
                );
            }
        }
    }

    #[test]
    fn any_flipped_byte_after_the_version_is_detected() {
        let bytes = encode_profile(&test_profile::profile()).unwrap();
        for at in 12..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            let err = error(&damaged);
            match err.kind() {
                ProfileFileErrorKind::ChecksumMismatch { .. } => {
                    assert!(err.to_string().starts_with("corrupt: checksum mismatch"))
                }
                // The payload length itself was hit.
                ProfileFileErrorKind::Truncated { .. }
                | ProfileFileErrorKind::TrailingBytes { .. } => assert!((16..24).contains(&at)),
                other => panic!("byte {at} flipped gave {other:?}"),
            }
        }
    }

    #[test]
    fn other_files_are_named_for_what_they_are() {
        assert_eq!(
            error(b"PERFILE2\x68\x00\x00\x00\x00\x00\x00\x00").to_string(),
            "looks like a perf.data file, not a profiler profile: \
             use `profiler report -i perf.data`"
        );
        assert_eq!(
            error(b"#!/bin/sh\necho").to_string(),
            r##"not a profiler profile: it starts with "#!/bin/s", profile files start with "EBPFPROF""##
        );
        assert_eq!(
            error(b"EBPFPRO!").to_string(),
            r#"not a profiler profile: it starts with "EBPFPRO!", profile files start with "EBPFPROF""#
        );

        let mut newer = encode_profile(&test_profile::profile()).unwrap();
        newer[8..12].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            error(&newer).to_string(),
            "written by a newer profiler (format 9); this one reads format 8: \
             read it with a newer profiler"
        );
        newer[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            error(&newer).to_string(),
            "corrupt: format 0 is not one any profiler wrote (this one reads formats 1 to 8)"
        );
    }

    #[test]
    fn read_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("perf.data");
        let err = read_profile(&path).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("{}: cannot read: ", path.display())),
            "{err}"
        );
        fs::write(&path, b"PERFILE2 and the rest").unwrap();
        let err = read_profile(&path).unwrap_err();
        assert_eq!(err.path(), Some(path.as_path()));
        assert!(matches!(err.kind(), ProfileFileErrorKind::PerfData));
    }

    #[test]
    fn dangling_frame_reference_is_corrupt_not_a_later_panic() {
        let mut profile = test_profile::profile();
        profile.stacks[2].frames.push(99);
        let bytes = encode_profile(&profile).unwrap();
        assert_eq!(
            error(&bytes).to_string(),
            "corrupt: stack sample 2 refers to frame 99, but the profile has 7 frame(s)"
        );
        profile = test_profile::profile();
        profile.stacks[0].event = 2;
        let bytes = encode_profile(&profile).unwrap();
        assert_eq!(
            error(&bytes).to_string(),
            "corrupt: stack sample 0 is for event 2, but the profile has 2 event(s)"
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_profile(&bytes);
        }

        #[test]
        fn mutated_files_never_panic(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            keep in any::<prop::sample::Index>(),
        ) {
            let mut bytes = encode_profile(&full_profile()).unwrap();
            for (at, byte) in edits {
                let at = at.index(bytes.len());
                bytes[at] = byte;
            }
            bytes.truncate(keep.index(bytes.len() + 1));
            let _ = decode_profile(&bytes);
        }

        /// Edits inside the serialized profile, framed with a valid checksum, reach the
        /// deserializer and the reference checks: whatever decodes must be safe to index.
        #[test]
        fn mutated_payloads_decode_to_consistent_profiles_or_errors(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let mut serialized = postcard::to_allocvec(&full_profile()).unwrap();
            for (at, byte) in edits {
                let at = at.index(serialized.len());
                serialized[at] = byte;
            }
            if let Ok(profile) = decode_profile(&frame_payload(&serialized).unwrap()) {
                prop_assert!(check_references(&profile).is_ok());
            }
        }
    }
}

/// Files earlier versions of this profiler wrote, which it must keep reading.
#[cfg(test)]
mod written_formats {
    use std::collections::BTreeMap;

    use profiler_common::hw::ibs::events::{IbsFetchCounters, IbsOpCounters};

    use super::*;
    use crate::profile::*;

    /// A small profile with every type of the model and every optional field set, so any change
    /// to the serialized shape shows.
    pub(super) fn profile() -> Profile {
        let frame = Frame {
            address: 0x401136,
            kernel: false,
            module: "/usr/bin/demo".into(),
            module_offset: 0x1136,
            build_id: Some("0badc0de".into()),
            function: Some("spin".into()),
            function_address: Some(0x401120),
            file: Some("demo.c".into()),
            line: Some(12),
            inlined: vec![InlinedFrame {
                function: "step".into(),
                file: Some("demo.h".into()),
                line: Some(3),
            }],
        };
        let stats = Stats {
            count: 9,
            latency_count: 2,
            latency_sum: 300,
            latency_max: 200,
        };
        Profile {
            meta: ProfileMeta {
                profiler_version: "0.1.0".into(),
                hostname: "h".into(),
                kernel_release: "6.18.0".into(),
                target: "-p 42".into(),
                start_unix_ns: 1_700_000_000_000_000_000,
                duration_ns: 1_000_000_000,
                architecture: String::new(),
            },
            events: vec![EventInfo {
                name: "cycles".into(),
                period: Some(9_999_991),
                frequency: Some(4000),
                unit: "CPU-cycles".into(),
                precise: true,
            }],
            threads: vec![ThreadInfo {
                pid: 42,
                tid: 43,
                comm: "demo".into(),
                container: Some("web.service".into()),
            }],
            frames: vec![frame],
            stacks: vec![StackSample {
                pid: 42,
                tid: 43,
                event: 0,
                cgroup: 7,
                frames: vec![0],
                user_stack_lost: false,
                kernel_stack_lost: true,
                count: 9,
                per_cpu: vec![4, 5],
                weight: None,
            }],
            instructions: vec![InstructionSample {
                pid: 42,
                event: 0,
                frame: 0,
                stats,
            }],
            data_lines: vec![DataLineSample {
                pid: 42,
                event: 0,
                line: 0x7ffd_0000_0040,
                frame: 0,
                stats,
                per_cpu: vec![9],
                tid: Some(43),
                access: DataAccess::Load,
            }],
            latency: vec![LatencyHistogram {
                pid: 42,
                event: 0,
                frame: 0,
                buckets: vec![(5, 1), (9, 1)],
            }],
            losses: Losses {
                samples_fired: vec![10],
                counters: BTreeMap::from([("samples lost: stack-count map full".into(), 1)]),
                period_sums: vec![89_999_919],
                event_counts: Vec::new(),
            },
            code: vec![CodeBytes {
                module: "/usr/bin/demo".into(),
                build_id: Some("0badc0de".into()),
                file_offset: 0x1120,
                address: 0x401120,
                bytes: vec![0x55, 0x48, 0x89, 0xe5, 0xc3],
                lines: vec![CodeLine {
                    offset: 1,
                    file: "demo.c".into(),
                    line: 11,
                }],
            }],
            memory_maps: vec![ProcessMemoryMap {
                pid: 42,
                mappings: vec![MemoryMapping {
                    start: 0x7ffd_0000_0000,
                    end: 0x7ffd_0002_1000,
                    file_offset: 0,
                    path: "[stack]".into(),
                }],
            }],
            data_symbols: vec![DataSymbol {
                pid: 42,
                address: 0x404040,
                size: 8,
                name: "counter".into(),
                module: "/usr/bin/demo".into(),
            }],
            hardware: HardwareProfile {
                cpu: Some(CpuIdentity {
                    vendor: "AuthenticAMD".into(),
                    family: 0x19,
                    model: 0x11,
                }),
                ibs_caps: Some(0x7ff),
                samples: vec![HardwareSample {
                    pid: 42,
                    event: 0,
                    frame: 0,
                    line: Some(0x7ffd_0000_0040),
                    samples: 2,
                    data_sources: vec![(0x6_8100_0142, 2)],
                    ibs_op: Some(IbsOpCounters {
                        all_samples: 2,
                        loads: 2,
                        ..IbsOpCounters::default()
                    }),
                    ibs_fetch: Some(IbsFetchCounters {
                        all_samples: 1,
                        ..IbsFetchCounters::default()
                    }),
                    spe: None,
                }],
                backtracked: vec![BacktrackedAttribution {
                    pid: 42,
                    event: 0,
                    sampled: 0,
                    attributed: 0,
                    samples: 3,
                }],
            },
            line_latency: Vec::new(),
            function_aliases: Vec::new(),
            off_cpu: None,
        }
    }

    /// [`profile`] with what format 2 added.
    pub(super) fn profile_2() -> Profile {
        Profile {
            line_latency: vec![LineLatencyHistogram {
                pid: 42,
                event: 0,
                line: 0x7ffd_0000_0040,
                buckets: vec![(12, 1), (49, 3)],
            }],
            ..profile()
        }
    }

    /// A file this profiler wrote in format 1, from [`profile`].
    const FORMAT_1: [&str; 8] = [
        "4542504650524f4601000000be447cc75c01000000000000ce0100000000000028b52ffd60ce00950a0056d2463d30c5",
        "381d807c55e8b2880c23861ff12f584d1a67e5491d9924ee2d5ca47fba090a31babbb7b6585d2d82805ee6801ec0bf96",
        "e1c08a30d817ff6d7f27193c003300340015a48bb5d1b5c87c0c6f6775ea3d220806cce6bc55821a707c417b612ba790",
        "0430e50211001b261e1c391f2064a4e7da3405909650f1be69206dbb029745b177dfd29d7aca3df296d8bae656ab9ce6",
        "d379f123b1f5db6db6e346dbe59cd418deee237ea30f099b1f81a6f994fab55faf024c1d3f089a1319c98559299aa3f5",
        "5058aec4d942894730c31724430e738ef9b15fb43bc736ab919cb3aaeb1f425114ebae0f94eeaeefbfe9a957ca191fa7",
        "1f589dc0a0e12164bf52bc5e698634a46bb9508cacaa9788b074e9ccf9f5197b90130d07d1c539031400401e60a10502",
        "fc79d29c89da6ab5e88646936010a70aae8f012b96db631647b68529198139d920cdf7663a0a402d83e6ce3d",
    ];

    /// A file this profiler wrote in format 2, from [`profile_2`] (`encode_profile` as hex).
    const FORMAT_2: [&str; 8] = [
        "4542504650524f4602000000465f81ef6001000000000000dd0100000000000028b52ffd60dd00b50a006692463a508d",
        "3306d01bbd5390588a9087d20123d35d0d76d50f04faa17bf511119af75852fcd7eb05609e94cb60c9eb29b36f050c3b",
        "accbb75eb26592013b003400340013a4acef2853643e86b9bb3af61e9183026673fe1a41a55c671057e0ca2d9113d31e",
        "0031c920e1d0d8bbc040233dd8761140f7a0e27dbba0bb6101d855b3537a0bedd85bf7c85ceaeb9ae35b79dda7f3e247",
        "eaebb9db70c78db6cb39a931ccdd47fc461f92363f00b4ee53ea197f01b728a68d1f04cd088de442ad14cd117b243057",
        "6a2da1d423a8e90c9221a739c7fcd9b14a3bcf36ab90bdb78adaffa3a26a46a97d16e89a6a51fad3faea95f645c7eb03",
        "561720586808e1af14b3579a210d295b2ed562abec211e2cb474ee7dfb0cbe4709068308e39c01160021bb78052b0079",
        "80851608f0e74973266aabd5a21b1a4d82419c2ab83e06ac586e8f591cd916a66404e6648334df9be92800b50c9a3bf7",
    ];

    /// A file this profiler wrote in format 3, from [`profile_3`] (`encode_profile` as hex).
    const FORMAT_3: [&str; 9] = [
        "4542504650524f4603000000694da4416501000000000000e40100000000000028b52ffd60e400dd0a00d6d2473a508d",
        "3306d0732db120a83a42b606ad62f6ad5b00b92a0f11f351b2fa8808cd7b2c29feebf502304fca65b0f4cd65f6ad8061",
        "8775f9d64bb64c323c0035003700389c2865cd913285e6e5983fcc73ff1939286438e9319314eb3a8bb8025b7e95a89c",
        "f680488ac649c7c6de05069bf9c93a0e21c41d58c0775c88ebb2b5de6798d55eeb2fd5737f1d34f3a9b16f8e39cbed46",
        "a527435363cf5f873f8fd461de519563fe4064480295340a02a876a354cf01180ca3ac93feae9c387e51442336d31bb7",
        "93444bfc91c0dea9b7845397e2a6b3688e9eee3cf36bcf6cf55ce3b446f6deab7aff109bb25a96646778b07e85beb157",
        "ad7fb5b7a0695f7cdc3ea07501828506110e4f3283272ada94f205632df6ea1ee2e1524de9debfd7e083a004160021bb",
        "78052b007980851608f0e74973266aabd5a21b1a4d82419c2ab83e06ac586e8f591cd916a66404e6648334df9be92800",
        "b50c9a3bf7",
    ];

    /// A file this profiler wrote in format 4, from [`profile_4`] (`encode_profile` as hex).
    const FORMAT_4: [&str; 10] = [
        "4542504650524f4604000000bb76c826a701000000000000430200000000000028b52ffd604301ed0c0066165540306d",
        "ab31000921594586410f7fe2b88e58a7b6507f780790e2f300d8be51b757c247432529a9a70d9272c0040cf7594fa8e7",
        "576ce4f89e49cbfee9ed499a4c3247003d0047009b256ad20230e9e6f0f8b51e47bcba6e7742e5e077392843bdba70a0",
        "8072290f91e800b9bed866d8c89f112836f60010273094d890616f049b29aca2ab56682a16e97e554dbda29fa631a7fc",
        "d2233a33972e2121f6de1f93fa3fd00e2acd493d82a8f4392f9919eacfbbf08e1abae5b6464e3747f9ec851afae52ecb",
        "69db3539c6c3ca5ea70f107201041634b0b0de986f37921616f14a2694c2fea00ee181646a947b9f7ae51e4c58607011",
        "61ca53293634fc189311a650fba63193a0ad24586dd45382518378d217870197037e06f427de8cbb19c3c35a26b30e47",
        "cb3242fbdd2fcb0a50ac82ba5a3263541d327bb8da601956d1b1360f1f3815b12f7000f9a3b9853e73fe939e761abb42",
        "871b004025e1cf7b708c71a4a64208f0c26c00f2000b2d10e0cf93e64cd456ab4537349a04833855707d8c5732da1e0b",
        "38b22d4cc908ccc90669be37d35140ed28518ba0b9730f",
    ];

    fn decode_hex(lines: &[&str]) -> Result<Profile, ProfileFileError> {
        let hex = lines.concat();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        decode_profile(&bytes)
    }

    fn assert_reads(lines: &[&str], expected: Profile, format: u32) {
        let decoded = decode_hex(lines).unwrap_or_else(|e| {
            panic!(
                "{e}\nThe serialized shape of the profile model changed: raise FORMAT_VERSION \
                 and keep reading format {format} (see the module documentation)."
            )
        });
        assert_eq!(
            decoded, expected,
            "format {format} decodes to another profile: the serialized shape of the model changed"
        );
    }

    #[test]
    fn format_1_file_still_reads() {
        assert_reads(&FORMAT_1, profile(), 1);
    }

    #[test]
    fn format_2_file_still_reads() {
        assert_reads(&FORMAT_2, profile_2(), 2);
    }

    /// [`profile_2`] with the counters' own counts, which format 3 added.
    fn profile_3() -> Profile {
        let mut profile = profile_2();
        profile.losses.event_counts = vec![91_000_004_471];
        profile
    }

    #[test]
    fn format_3_file_still_reads() {
        assert_reads(&FORMAT_3, profile_3(), 3);
    }

    /// [`profile_3`] with the other names of a sampled function, which format 4 added.
    fn profile_4() -> Profile {
        let mut profile = profile_3();
        profile.function_aliases = vec![FunctionAliases {
            module: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
            names: vec![
                "__memcpy_avx_unaligned_erms".into(),
                "__memmove_avx_unaligned_erms".into(),
            ],
        }];
        profile
    }

    #[test]
    fn format_4_file_still_reads() {
        assert_reads(&FORMAT_4, profile_4(), 4);
    }

    /// [`profile_4`] with the architecture, which format 5 added.
    fn profile_5() -> Profile {
        let mut profile = profile_4();
        profile.meta.architecture = "aarch64".into();
        profile
    }

    /// A file this profiler wrote in format 5, from [`profile_5`] (`encode_profile` as hex).
    const FORMAT_5: [&str; 10] = [
        "4542504650524f460500000028498f01ae010000000000004b0200000000000028b52ffd604b01250d00e6d65640406d",
        "aa317348dcdcc3fe498acbf27dc3ca48ff0fd5c90e84226a869d35aaf64aa868282465811c2a179b655a3f6140dbd424",
        "02da6a9b197ecbfef96b4b884c3249003f004900b9d3ac508f1600393788c8afed32e1d554bb132efe79777b2cd4ab0d",
        "070a2c30367f4884905c5f6c3bece4ce08141f7b008813184a6cc8b03702cc0456d045332e149b70bfe8855e50fa62d0",
        "abba728b5f3a34a5e512464988bdf788a4fe0f33644a5252879e295dca47d242dd39075e513fa7dcd2c9e706d93c77a0",
        "7e7eb7cb6e55bb2a5e11b10293f3d8153a7c3e40c9051058d040c37662be9c386a50c21b554c0a7b843a840791f4d8ec",
        "7dea17f760c202830da8b23995e243c38ff1186102ab378979fc6c25c156514f0944fde129188cb361add1cd7c9e01ed",
        "8537db6ee6e870cd63a6c9d4ac03b4def5b2acc0c4e8a7a91d3347a51973872b0c9661191a4bebf0814f11fb0207923b",
        "9753a623e52fe7031b004025e1cf7b708c71a4a64208f0c26c00f2000b2d10e0cf93e64cd456ab4537349a0483385570",
        "7d8c5732da1e0b38b22d4cc908ccc90669be37d35140ed28518ba0b9730f",
    ];

    #[test]
    fn format_5_file_still_reads() {
        assert_reads(&FORMAT_5, profile_5(), 5);
    }

    /// [`profile_5`] with off-CPU time, which format 6 added.
    fn profile_6() -> Profile {
        let mut profile = profile_5();
        profile.off_cpu = Some(OffCpuProfile {
            attachment: "tp_btf/sched_switch".into(),
            min_block_ns: 1000,
            bucket_unit_ns: 1000,
            counters: BTreeMap::from([("blocks with stacks".to_string(), 7)]),
            blocks: vec![crate::profile::offcpu::OffCpuBlocks {
                pid: 42,
                tid: 43,
                state: crate::profile::offcpu::OffCpuState::Uninterruptible,
                frames: vec![0],
                user_stack_lost: false,
                kernel_stack_lost: true,
                total_ns: 700_000_000,
                count: 7,
                max_ns: 100_000_000,
                buckets: vec![(200, 7)],
            }],
            wakers: Vec::new(),
        });
        profile
    }

    /// [`profile_6`] written by the format 6 writer.
    const FORMAT_6: [&str; 11] = [
        "4542504650524f4606000000bd0fe651e3010000000000008f0200000000000028b52ffd608f01cd0e00869a6243208d",
        "566340506056db449c70f6356e4200998d6431a44d24021073a433b5ff44f0dda51829524949b518f125c48f74418cff",
        "721f1f7e98afd6ba135ef1559e8895490654004a005300bf1d66bb8dc32aae29b942cc5d642e2f8c49f748c9afc51ef2",
        "668bbb9f8b8be0eda20df58ae3c1028b8cd0a311242acff7b320f6728b0814229b008713164864b8b07782ce34561266",
        "6970acece21db338162605ffbeb2631a3770d26129daeac36e3a4f0a7416bf29df6f04b7acb9c58fb944e7e6988c950f",
        "7b6f9349fd28948462e6a42e4514f3395fe786bae5de78758e9eb9b52ea77b24f4108f390a65e85181ca107f5527d332",
        "0dd0c5e10fc129885d4183ca2d9c67a865ce7fd2532f644f38393d80950728c0c0c186c53abc9e2e3732e4ad1554c236",
        "a11e01429d21a1bd4ffde21b4c5068c0216942a752886078f528bf429cec4a3b94f0b0bfa15eb3a7f167ca1f56fc3801",
        "af2935c5b31a7fb2d65dcfe6ab4373daa807bc937996dcb67a3d22782083e4d5ba1b7ae06f0b4b0de4d93490d18217d4",
        "340334b3c46cd91d00480bda946b284065e6cf7b708c71a4a64208f0c26c00f2000b2d10e0cf93e64cd456ab4537349a",
        "04833855707d8c5732da1e0b38b22d4cc908ccc90669be37d35140ed28518ba0b9730f",
    ];

    #[test]
    fn format_6_file_still_reads() {
        assert_reads(&FORMAT_6, profile_6(), 6);
        // The format 5 file has no off-CPU time.
        assert_eq!(decode_hex(&FORMAT_5).unwrap().off_cpu, None);
    }

    /// [`profile_6`] with the blocks by waker, which format 7 added.
    fn profile_7() -> Profile {
        let mut profile = profile_6();
        let off_cpu = profile.off_cpu.as_mut().unwrap();
        off_cpu.wakers = vec![WokenBlocks {
            pid: 42,
            tid: 43,
            state: crate::profile::offcpu::OffCpuState::Uninterruptible,
            frames: vec![0],
            waker_pid: 7,
            waker_tid: 8,
            waker_frames: vec![0, 0],
            total_ns: 600_000_000,
            count: 6,
        }];
        profile
    }

    /// [`profile_7`] written by the format 7 writer.
    const FORMAT_7: [&str; 11] = [
        "4542504650524f46070000008b291f9bef01000000000000a00200000000000028b52ffd60a0012d0f00261b6544108f",
        "566300a200f0be9da8a84bc2d2350602423662483f8145639780ac46ff3f113f645ba71085a4e4584955a4a22f2ab0ee",
        "b772277d68d1f9581f681ff84d9e8895490656004d00550064967ebdcc7a5c9761be29c144dc619f5c620026dd2325bf",
        "16833e375fdd0d617c0caf2771aa5b1c10185c648c2e9d205179bea005b1975b4cb010d90540acd080a2c386bd157828",
        "d29ab24ba3736997efd9d5b9b229af5a8870f841b0eca0482ea4b4588ed6fab09cced4029d4790ca1724432e6f7ef167",
        "3ed1c979266365c4dedb64563f0a25a19939ab4f12cd7cced7c9a96ef9475e9da56b6eafcbe91e195dc401db01aa5d63",
        "be6c297a58a252c4a0e5d1364d438475184c704a6263f0a0724be71a6a99f39ff4f40bd9144e4e1f60e5020c3478b061",
        "b116efa7cb0dcde7560c9db04daa4b885067c868ef57c7f80715151c704c9b51179ae182853d27c5d4a31c2b71b22b0d",
        "9142c43ea77acd9fc6212a7fd811ec06bca6d494cf6a1cca9b773f9bb10edd6da426708ff6d90fc7d50b1a430439fcdc",
        "cdbba2070639b1dc44206e03216d78c32d1e0039a9906fb529d75080cacc9ff7e018e3484d8510e085d900e401165a20",
        "c09f27cd99a8ad568b6e6834090671aae0fa18af64b43d1670645b98921198930dd27c6fa6a380da51a2164173e71e",
    ];

    #[test]
    fn format_7_file_still_reads() {
        assert_reads(&FORMAT_7, profile_7(), 7);
        // The format 6 file has no wakers.
        assert!(decode_hex(&FORMAT_6)
            .unwrap()
            .off_cpu
            .unwrap()
            .wakers
            .is_empty());
    }

    /// [`profile_7`] with Arm SPE counters, which format 8 added.
    fn profile_8() -> Profile {
        let mut profile = profile_7();
        let mut events = [0; 14];
        events[3] = 1;
        profile.hardware.samples[0].spe = Some(SpeCounters {
            samples: 3,
            loads: 2,
            events,
            total_latency_sum: 300,
            total_latency_samples: 3,
            ..SpeCounters::default()
        });
        profile
    }

    #[test]
    fn format_8_is_what_this_profiler_writes() {
        let written = encode_profile(&profile_8()).unwrap();
        assert_eq!(written[8..12], 8u32.to_le_bytes());
        assert_eq!(decode_profile(&written).unwrap(), profile_8());
        // The format 7 file has no SPE counters.
        assert!(decode_hex(&FORMAT_7)
            .unwrap()
            .hardware
            .samples
            .iter()
            .all(|sample| sample.spe.is_none()));
    }

    #[test]
    fn off_cpu_blocks_must_refer_to_frames_and_buckets_that_exist() {
        let mut profile = profile_6();
        profile.off_cpu.as_mut().unwrap().blocks[0].frames = vec![99];
        let error = decode_profile(&encode_profile(&profile).unwrap()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("off-CPU blocks 0 refer to frame 99"),
            "{error}"
        );
        let mut profile = profile_6();
        profile.off_cpu.as_mut().unwrap().blocks[0].buckets = vec![(4000, 1)];
        let error = decode_profile(&encode_profile(&profile).unwrap()).unwrap_err();
        assert!(error.to_string().contains("bucket 4000"), "{error}");
        let mut profile = profile_7();
        profile.off_cpu.as_mut().unwrap().wakers[0].waker_frames = vec![0, 98];
        let error = decode_profile(&encode_profile(&profile).unwrap()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("off-CPU wakers 0 refer to frame 98"),
            "{error}"
        );
    }
}

/// Structure-aware fuzzing of the reader: the size and count fields of the header and of the
/// serialized profile (postcard's varint lengths) set far beyond what the file holds, framed
/// with a valid checksum so they reach the decoder. Every input fails or decodes to a
/// consistent profile, never panics, and never holds more than [`MEMORY_BOUND`].
#[cfg(test)]
mod bounded_decoding {
    use proptest::prelude::*;

    use super::*;
    use crate::alloc_meter::peak_bytes;

    /// What a decode of these few-kilobyte inputs may hold at once: the serialized profile
    /// (at most [`MIN_DECODED_LIMIT`] here) and what it decodes to.
    const MEMORY_BOUND: usize = 32 << 20;

    /// Lengths and counts no file of this size holds.
    const HUGE: [u64; 6] = [
        0x7f_ffff,
        1 << 31,
        u32::MAX as u64,
        1 << 40,
        i64::MAX as u64,
        u64::MAX,
    ];

    fn varint(mut value: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        while value >= 0x80 {
            bytes.push(value as u8 | 0x80);
            value >>= 7;
        }
        bytes.push(value as u8);
        bytes
    }

    fn serialized(profile: &Profile) -> Vec<u8> {
        let body = postcard::to_allocvec(profile).unwrap();
        postcard::to_extend(&(&profile.line_latency,), body).unwrap()
    }

    /// Decodes `file` under the meter: an error, or a profile that is safe to index.
    fn decode_within_bound(file: &[u8]) -> Result<(), ProfileFileError> {
        let (decoded, peak) = peak_bytes(|| decode_profile(file));
        assert!(peak < MEMORY_BOUND, "decoding held {peak} bytes");
        let profile = decoded?;
        assert_eq!(check_references(&profile), Ok(()));
        Ok(())
    }

    /// Every byte of the serialized profile in turn replaced by each huge varint: every
    /// length and count prefix the format has is hit.
    #[test]
    fn huge_lengths_and_counts_anywhere_fail_within_the_memory_bound() {
        for profile in [
            super::written_formats::profile_2(),
            crate::profile::test_profile::profile(),
        ] {
            let serialized = serialized(&profile);
            for at in 0..serialized.len() {
                for huge in HUGE {
                    let mut mutated = serialized[..at].to_vec();
                    mutated.extend(varint(huge));
                    mutated.extend_from_slice(&serialized[at + 1..]);
                    let _ = decode_within_bound(&frame_payload(&mutated).unwrap());
                }
            }
        }
    }

    /// A valid checksum over a header that declares more decoded bytes than the payload.
    #[test]
    fn huge_decoded_lengths_in_the_header_fail_within_the_memory_bound() {
        let file = encode_profile(&super::written_formats::profile_2()).unwrap();
        for huge in HUGE {
            let mut lying = file.clone();
            lying[24..32].copy_from_slice(&huge.to_le_bytes());
            let crc = crc32fast::hash(&lying[CHECKED_FROM..]);
            lying[12..16].copy_from_slice(&crc.to_le_bytes());
            assert!(decode_within_bound(&lying).is_err());
        }
    }

    /// Zeros compress about 30000 to 1: 64 MiB of them, announced as such with a valid
    /// checksum, are refused before anything is decompressed (tests/security.rs reproduces the
    /// reported 4 GiB file with hand-made RLE blocks).
    #[test]
    fn a_payload_announcing_far_more_than_it_holds_fails_at_once() {
        let mut file = frame_payload(&vec![0; 64 << 20]).unwrap();
        let payload = (file.len() - HEADER_LEN) as u64;
        let err = decode_within_bound(&file).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "corrupt: its header says the {payload}-byte payload decompresses to 67108864 \
                 bytes, more than 64 times its size (profiles compress about 3 to 1)"
            )
        );
        // Announcing what the limit allows, decompression stops there.
        let allowed = (payload * MAX_EXPANSION).max(MIN_DECODED_LIMIT);
        file[24..32].copy_from_slice(&allowed.to_le_bytes());
        let crc = crc32fast::hash(&file[CHECKED_FROM..]);
        file[12..16].copy_from_slice(&crc.to_le_bytes());
        let (err, peak) = peak_bytes(|| decode_profile(&file).unwrap_err());
        assert!(matches!(
            err.kind(),
            ProfileFileErrorKind::DecodedLength { .. }
        ));
        assert!(peak <= allowed as usize + 1 + (1 << 20), "{peak}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// Random edits, huge varints inserted at random places and random cuts, combined.
        #[test]
        fn mutated_sizes_and_counts_fail_within_the_memory_bound(
            edits in proptest::collection::vec(
                (any::<prop::sample::Index>(), any::<u8>(), 0..HUGE.len() + 1),
                1..6,
            ),
            keep in any::<prop::sample::Index>(),
        ) {
            let mut serialized = serialized(&super::written_formats::profile_2());
            for (at, byte, huge) in edits {
                let at = at.index(serialized.len());
                match HUGE.get(huge) {
                    Some(&huge) => {
                        serialized.splice(at..at + 1, varint(huge));
                    }
                    None => serialized[at] = byte,
                }
            }
            serialized.truncate(keep.index(serialized.len() + 1).max(1));
            let _ = decode_within_bound(&frame_payload(&serialized).unwrap());
        }
    }
}
