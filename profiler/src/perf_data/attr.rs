//! `struct perf_event_attr` as stored in perf.data (attrs section and EVENT_DESC): how each
//! event was sampled, which decides the layout of its sample records.

use super::bytes::Reader;
use super::error::PerfDataError;

// sample_type bits (include/uapi/linux/perf_event.h), in the order fields appear in a sample.
pub const PERF_SAMPLE_IP: u64 = 1 << 0;
pub const PERF_SAMPLE_TID: u64 = 1 << 1;
pub const PERF_SAMPLE_TIME: u64 = 1 << 2;
pub const PERF_SAMPLE_ADDR: u64 = 1 << 3;
pub const PERF_SAMPLE_READ: u64 = 1 << 4;
pub const PERF_SAMPLE_CALLCHAIN: u64 = 1 << 5;
pub const PERF_SAMPLE_ID: u64 = 1 << 6;
pub const PERF_SAMPLE_CPU: u64 = 1 << 7;
pub const PERF_SAMPLE_PERIOD: u64 = 1 << 8;
pub const PERF_SAMPLE_STREAM_ID: u64 = 1 << 9;
pub const PERF_SAMPLE_RAW: u64 = 1 << 10;
pub const PERF_SAMPLE_BRANCH_STACK: u64 = 1 << 11;
pub const PERF_SAMPLE_REGS_USER: u64 = 1 << 12;
pub const PERF_SAMPLE_STACK_USER: u64 = 1 << 13;
pub const PERF_SAMPLE_WEIGHT: u64 = 1 << 14;
pub const PERF_SAMPLE_DATA_SRC: u64 = 1 << 15;
pub const PERF_SAMPLE_IDENTIFIER: u64 = 1 << 16;
pub const PERF_SAMPLE_TRANSACTION: u64 = 1 << 17;
pub const PERF_SAMPLE_REGS_INTR: u64 = 1 << 18;
pub const PERF_SAMPLE_PHYS_ADDR: u64 = 1 << 19;
pub const PERF_SAMPLE_AUX: u64 = 1 << 20;
pub const PERF_SAMPLE_CGROUP: u64 = 1 << 21;
pub const PERF_SAMPLE_DATA_PAGE_SIZE: u64 = 1 << 22;
pub const PERF_SAMPLE_CODE_PAGE_SIZE: u64 = 1 << 23;
pub const PERF_SAMPLE_WEIGHT_STRUCT: u64 = 1 << 24;

// read_format bits.
pub const PERF_FORMAT_TOTAL_TIME_ENABLED: u64 = 1 << 0;
pub const PERF_FORMAT_TOTAL_TIME_RUNNING: u64 = 1 << 1;
pub const PERF_FORMAT_ID: u64 = 1 << 2;
pub const PERF_FORMAT_GROUP: u64 = 1 << 3;
pub const PERF_FORMAT_LOST: u64 = 1 << 4;

// branch_sample_type bits that change the sample layout.
pub const PERF_SAMPLE_BRANCH_HW_INDEX: u64 = 1 << 17;
pub const PERF_SAMPLE_BRANCH_COUNTERS: u64 = 1 << 19;

/// The smallest attr any perf has written (PERF_ATTR_SIZE_VER0).
const ATTR_SIZE_VER0: usize = 64;

/// How the kernel decided when to take a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sampling {
    /// Every Nth event (`-c N`).
    Period(u64),
    /// The kernel adjusts the period to reach this many samples per second (`-F HZ`).
    Frequency(u64),
}

/// One event of the recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfAttr {
    /// PERF_TYPE_* or a dynamic PMU type (see [`super::Features::pmu_mappings`]).
    pub event_type: u32,
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
    pub config3: u64,
    pub sampling: Sampling,
    pub sample_type: u64,
    pub read_format: u64,
    /// 0 = arbitrary skid ... 3 = must be exact.
    pub precise_ip: u8,
    pub exclude_user: bool,
    pub exclude_kernel: bool,
    pub exclude_hv: bool,
    pub exclude_idle: bool,
    pub exclude_host: bool,
    pub exclude_guest: bool,
    pub exclude_callchain_kernel: bool,
    pub exclude_callchain_user: bool,
    /// Non-sample records carry the sample id fields at their end.
    pub sample_id_all: bool,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub sample_regs_intr: u64,
    /// The name perf gave the event (`cycles:pp`, `ibs_op//`), from the EVENT_DESC feature.
    pub name: Option<String>,
    /// Sample ids the kernel assigned to this event (one per CPU or thread it was opened on).
    pub ids: Vec<u64>,
}

impl PerfAttr {
    /// Decodes an attr of any size: fields past its end read as zero, as the kernel does for
    /// attrs written by an older ABI.
    pub(super) fn decode(bytes: &[u8], offset: u64) -> Result<Self, PerfDataError> {
        if bytes.len() < ATTR_SIZE_VER0 {
            return Err(PerfDataError::Truncated {
                what: "perf_event_attr".to_string(),
                offset,
                needed: ATTR_SIZE_VER0 as u64,
                remaining: bytes.len() as u64,
            });
        }
        // attr.size can be 0 in files from old perf versions; then the on-disk slot is the size.
        let declared = u32_at(bytes, 4) as usize;
        let bytes = match declared {
            0 => bytes,
            n => &bytes[..n.clamp(ATTR_SIZE_VER0, bytes.len())],
        };
        let flags = u64_at(bytes, 40);
        let flag = |bit: u32| flags & (1 << bit) != 0;
        let period_or_freq = u64_at(bytes, 16);
        Ok(Self {
            event_type: u32_at(bytes, 0),
            config: u64_at(bytes, 8),
            sampling: if flag(10) {
                Sampling::Frequency(period_or_freq)
            } else {
                Sampling::Period(period_or_freq)
            },
            sample_type: u64_at(bytes, 24),
            read_format: u64_at(bytes, 32),
            exclude_user: flag(4),
            exclude_kernel: flag(5),
            exclude_hv: flag(6),
            exclude_idle: flag(7),
            precise_ip: ((flags >> 15) & 3) as u8,
            sample_id_all: flag(18),
            exclude_host: flag(19),
            exclude_guest: flag(20),
            exclude_callchain_kernel: flag(21),
            exclude_callchain_user: flag(22),
            config1: u64_at(bytes, 56),
            config2: u64_at(bytes, 64),
            branch_sample_type: u64_at(bytes, 72),
            sample_regs_user: u64_at(bytes, 80),
            sample_stack_user: u32_at(bytes, 88),
            sample_regs_intr: u64_at(bytes, 96),
            config3: u64_at(bytes, 128),
            name: None,
            ids: Vec::new(),
        })
    }

    /// Whether samples of this event carry the field of `bit` (a PERF_SAMPLE_* constant).
    pub fn samples(&self, bit: u64) -> bool {
        self.sample_type & bit != 0
    }

    /// Bytes of the `struct sample_id` trailer that ends non-sample records of this event.
    pub(super) fn sample_id_trailer_len(&self) -> u64 {
        if !self.sample_id_all {
            return 0;
        }
        let fields = [
            PERF_SAMPLE_TID,
            PERF_SAMPLE_TIME,
            PERF_SAMPLE_ID,
            PERF_SAMPLE_STREAM_ID,
            PERF_SAMPLE_CPU,
            PERF_SAMPLE_IDENTIFIER,
        ];
        8 * fields.iter().filter(|&&bit| self.samples(bit)).count() as u64
    }

    /// Offset of the event id inside a sample record body, when the layout has one.
    pub(super) fn sample_id_offset(&self) -> Option<u64> {
        if self.samples(PERF_SAMPLE_IDENTIFIER) {
            return Some(0);
        }
        if !self.samples(PERF_SAMPLE_ID) {
            return None;
        }
        let before = [
            PERF_SAMPLE_IP,
            PERF_SAMPLE_TID,
            PERF_SAMPLE_TIME,
            PERF_SAMPLE_ADDR,
        ];
        Some(8 * before.iter().filter(|&&bit| self.samples(bit)).count() as u64)
    }

    /// Reads the id fields of a `struct sample_id` trailer (the reader holds exactly the
    /// trailer).
    pub(super) fn decode_sample_id(&self, r: &mut Reader) -> Result<SampleId, PerfDataError> {
        let mut id = SampleId::default();
        if self.samples(PERF_SAMPLE_TID) {
            id.pid = Some(r.u32("sample_id pid")?);
            id.tid = Some(r.u32("sample_id tid")?);
        }
        if self.samples(PERF_SAMPLE_TIME) {
            id.time = Some(r.u64("sample_id time")?);
        }
        if self.samples(PERF_SAMPLE_ID) {
            id.id = Some(r.u64("sample_id id")?);
        }
        if self.samples(PERF_SAMPLE_STREAM_ID) {
            r.u64("sample_id stream_id")?;
        }
        if self.samples(PERF_SAMPLE_CPU) {
            id.cpu = Some(r.u32("sample_id cpu")?);
            r.u32("sample_id reserved")?;
        }
        if self.samples(PERF_SAMPLE_IDENTIFIER) {
            id.id = Some(r.u64("sample_id identifier")?);
        }
        Ok(id)
    }
}

/// Where and when a non-sample record happened, from its `struct sample_id` trailer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SampleId {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub time: Option<u64>,
    pub cpu: Option<u32>,
    pub id: Option<u64>,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}
