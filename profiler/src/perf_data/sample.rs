//! PERF_RECORD_SAMPLE: every sample_type field, read in the order the kernel's
//! `perf_output_sample()` writes them, with callchains split at their context markers.

use super::attr::*;
use super::bytes::Reader;
use super::error::PerfDataError;
use super::header::CpuMode;

/// SAMPLE: the IP is the instruction that caused the event.
const PERF_RECORD_MISC_EXACT_IP: u16 = 1 << 14;

// Callchain context markers: entries at or above PERF_CONTEXT_MAX say whose frames follow.
const PERF_CONTEXT_KERNEL: u64 = -128i64 as u64;
const PERF_CONTEXT_USER: u64 = -512i64 as u64;
const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;

/// One PERF_RECORD_SAMPLE. Fields are `Some` exactly when the event's sample_type asked for them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerfSample {
    /// Index into [`super::PerfData::attrs`]: which event overflowed.
    pub attr_index: usize,
    pub cpumode: CpuMode,
    /// The kernel says `ip` is the instruction that caused the event (no skid).
    pub exact_ip: bool,
    pub id: Option<u64>,
    pub ip: Option<u64>,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub time: Option<u64>,
    /// Data address (page faults, PEBS/IBS memory samples).
    pub addr: Option<u64>,
    pub stream_id: Option<u64>,
    pub cpu: Option<u32>,
    pub period: Option<u64>,
    pub read: Option<ReadValues>,
    /// Kernel frames, innermost first (the first one is normally the sampled IP).
    pub callchain_kernel: Vec<u64>,
    /// User frames, innermost first.
    pub callchain_user: Vec<u64>,
    /// Hypervisor and guest frames: kept apart because host symbols do not apply to them.
    pub callchain_other: Vec<u64>,
    /// PERF_SAMPLE_RAW payload (e.g. AMD IBS registers), without its u32 size.
    pub raw: Option<Vec<u8>>,
    pub branch_stack: Option<BranchStack>,
    pub regs_user: Option<Registers>,
    pub stack_user: Option<UserStack>,
    pub weight: Option<Weight>,
    /// `union perf_mem_data_src`.
    pub data_src: Option<u64>,
    pub transaction: Option<u64>,
    pub regs_intr: Option<Registers>,
    pub phys_addr: Option<u64>,
    pub cgroup: Option<u64>,
    pub data_page_size: Option<u64>,
    pub code_page_size: Option<u64>,
    pub aux: Option<Vec<u8>>,
}

/// PERF_SAMPLE_WEIGHT or PERF_SAMPLE_WEIGHT_STRUCT: one u64 either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weight {
    pub raw: u64,
    /// The struct form's parts, present only for PERF_SAMPLE_WEIGHT_STRUCT.
    pub parts: Option<WeightParts>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightParts {
    /// Cache / load latency in cycles.
    pub var1: u32,
    /// Instruction latency.
    pub var2: u16,
    /// Retire latency.
    pub var3: u16,
}

/// PERF_SAMPLE_READ: counter values at sample time (one per group member with GROUP).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadValues {
    pub time_enabled: Option<u64>,
    pub time_running: Option<u64>,
    pub values: Vec<ReadValue>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadValue {
    pub value: u64,
    pub id: Option<u64>,
    pub lost: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BranchStack {
    pub hw_idx: Option<u64>,
    pub entries: Vec<BranchEntry>,
    /// One word per entry with PERF_SAMPLE_BRANCH_COUNTERS, else empty.
    pub counters: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchEntry {
    pub from: u64,
    pub to: u64,
    /// `struct perf_branch_entry` flag bits (mispred, predicted, cycles, type...).
    pub flags: u64,
}

/// Sampled registers: `abi` is PERF_SAMPLE_REGS_ABI_* (0 = none were captured), `regs` one
/// value per bit set in the event's register mask, lowest bit first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registers {
    pub abi: u64,
    pub regs: Vec<u64>,
}

impl Registers {
    /// The value of register `bit` (`PERF_REG_X86_IP`...) when the event's register `mask`
    /// asked for it and the kernel captured the registers.
    pub fn get(&self, mask: u64, bit: u32) -> Option<u64> {
        if bit >= 64 || mask & (1 << bit) == 0 {
            return None;
        }
        let index = (mask & ((1 << bit) - 1)).count_ones() as usize;
        self.regs.get(index).copied()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserStack {
    pub data: Vec<u8>,
    /// How many bytes of `data` the kernel really copied.
    pub dyn_size: u64,
}

/// Reads the sample fields in the order `perf_output_sample()` writes them.
pub(super) fn decode_sample(
    attr: &PerfAttr,
    attr_index: usize,
    misc: u16,
    r: &mut Reader,
) -> Result<PerfSample, PerfDataError> {
    let has = |bit| attr.samples(bit);
    let cpumode = CpuMode::from_misc(misc);
    let mut s = PerfSample {
        attr_index,
        cpumode,
        exact_ip: misc & PERF_RECORD_MISC_EXACT_IP != 0,
        ..PerfSample::default()
    };
    if has(PERF_SAMPLE_IDENTIFIER) {
        s.id = Some(r.u64("identifier")?);
    }
    if has(PERF_SAMPLE_IP) {
        s.ip = Some(r.u64("ip")?);
    }
    if has(PERF_SAMPLE_TID) {
        s.pid = Some(r.u32("pid")?);
        s.tid = Some(r.u32("tid")?);
    }
    if has(PERF_SAMPLE_TIME) {
        s.time = Some(r.u64("time")?);
    }
    if has(PERF_SAMPLE_ADDR) {
        s.addr = Some(r.u64("addr")?);
    }
    if has(PERF_SAMPLE_ID) {
        s.id = Some(r.u64("id")?);
    }
    if has(PERF_SAMPLE_STREAM_ID) {
        s.stream_id = Some(r.u64("stream_id")?);
    }
    if has(PERF_SAMPLE_CPU) {
        s.cpu = Some(r.u32("cpu")?);
        r.u32("cpu reserved")?;
    }
    if has(PERF_SAMPLE_PERIOD) {
        s.period = Some(r.u64("period")?);
    }
    if has(PERF_SAMPLE_READ) {
        s.read = Some(decode_read(attr.read_format, r)?);
    }
    if has(PERF_SAMPLE_CALLCHAIN) {
        let nr = r.u64("callchain nr")?;
        let ips = r.u64_array(nr, "callchain")?;
        split_callchain(&ips, cpumode, &mut s);
    }
    if has(PERF_SAMPLE_RAW) {
        let size = r.u32("raw size")?;
        s.raw = Some(r.bytes(u64::from(size), "raw data")?.to_vec());
    }
    if has(PERF_SAMPLE_BRANCH_STACK) {
        s.branch_stack = Some(decode_branch_stack(attr.branch_sample_type, r)?);
    }
    if has(PERF_SAMPLE_REGS_USER) {
        s.regs_user = Some(decode_registers(attr.sample_regs_user, r, "regs_user")?);
    }
    if has(PERF_SAMPLE_STACK_USER) {
        let size = r.u64("stack_user size")?;
        let data = r.bytes(size, "stack_user data")?.to_vec();
        let dyn_size = if size == 0 {
            0
        } else {
            r.u64("stack_user dyn_size")?
        };
        s.stack_user = Some(UserStack { data, dyn_size });
    }
    if has(PERF_SAMPLE_WEIGHT | PERF_SAMPLE_WEIGHT_STRUCT) {
        let raw = r.u64("weight")?;
        let parts = has(PERF_SAMPLE_WEIGHT_STRUCT).then_some(WeightParts {
            var1: raw as u32,
            var2: (raw >> 32) as u16,
            var3: (raw >> 48) as u16,
        });
        s.weight = Some(Weight { raw, parts });
    }
    if has(PERF_SAMPLE_DATA_SRC) {
        s.data_src = Some(r.u64("data_src")?);
    }
    if has(PERF_SAMPLE_TRANSACTION) {
        s.transaction = Some(r.u64("transaction")?);
    }
    if has(PERF_SAMPLE_REGS_INTR) {
        s.regs_intr = Some(decode_registers(attr.sample_regs_intr, r, "regs_intr")?);
    }
    if has(PERF_SAMPLE_PHYS_ADDR) {
        s.phys_addr = Some(r.u64("phys_addr")?);
    }
    if has(PERF_SAMPLE_CGROUP) {
        s.cgroup = Some(r.u64("cgroup")?);
    }
    if has(PERF_SAMPLE_DATA_PAGE_SIZE) {
        s.data_page_size = Some(r.u64("data_page_size")?);
    }
    if has(PERF_SAMPLE_CODE_PAGE_SIZE) {
        s.code_page_size = Some(r.u64("code_page_size")?);
    }
    if has(PERF_SAMPLE_AUX) {
        let size = r.u64("aux size")?;
        s.aux = Some(r.bytes(size, "aux data")?.to_vec());
    }
    // The kernel never pads samples, so leftover bytes mean the layout was misread.
    if !r.is_empty() {
        return Err(PerfDataError::Malformed {
            what: "sample layout".to_string(),
            offset: r.offset(),
            problem: format!(
                "{} bytes remain after the last field of sample_type 0x{:x}",
                r.remaining(),
                attr.sample_type
            ),
        });
    }
    Ok(s)
}

/// Splits callchain entries at their context markers. Frames before any marker belong to the
/// mode the sample was taken in.
fn split_callchain(ips: &[u64], cpumode: CpuMode, s: &mut PerfSample) {
    let mut context = match cpumode {
        CpuMode::Kernel => PERF_CONTEXT_KERNEL,
        CpuMode::User => PERF_CONTEXT_USER,
        _ => PERF_CONTEXT_MAX,
    };
    for &ip in ips {
        if ip >= PERF_CONTEXT_MAX {
            context = ip;
            continue;
        }
        match context {
            PERF_CONTEXT_KERNEL => s.callchain_kernel.push(ip),
            PERF_CONTEXT_USER => s.callchain_user.push(ip),
            _ => s.callchain_other.push(ip),
        }
    }
}

fn decode_read(read_format: u64, r: &mut Reader) -> Result<ReadValues, PerfDataError> {
    let has = |bit| read_format & bit != 0;
    let value_id_lost = |r: &mut Reader, value: u64| -> Result<ReadValue, PerfDataError> {
        Ok(ReadValue {
            value,
            id: has(PERF_FORMAT_ID).then(|| r.u64("read id")).transpose()?,
            lost: has(PERF_FORMAT_LOST)
                .then(|| r.u64("read lost"))
                .transpose()?,
        })
    };
    let mut out = ReadValues::default();
    // Group: { nr, times, { value, id, lost }[nr] }; single: { value, times, id, lost }.
    let first = r.u64("read nr or value")?;
    if has(PERF_FORMAT_TOTAL_TIME_ENABLED) {
        out.time_enabled = Some(r.u64("read time_enabled")?);
    }
    if has(PERF_FORMAT_TOTAL_TIME_RUNNING) {
        out.time_running = Some(r.u64("read time_running")?);
    }
    if has(PERF_FORMAT_GROUP) {
        // Capacity bounded by what the record can hold, whatever nr claims.
        let capacity = usize::try_from(first).unwrap_or(0).min(r.remaining() / 8);
        out.values = Vec::with_capacity(capacity);
        for _ in 0..first {
            let value = r.u64("read value")?;
            out.values.push(value_id_lost(r, value)?);
        }
    } else {
        out.values.push(value_id_lost(r, first)?);
    }
    Ok(out)
}

fn decode_branch_stack(
    branch_sample_type: u64,
    r: &mut Reader,
) -> Result<BranchStack, PerfDataError> {
    let nr = r.u64("branch_stack nr")?;
    let hw_idx = (branch_sample_type & PERF_SAMPLE_BRANCH_HW_INDEX != 0)
        .then(|| r.u64("branch_stack hw_idx"))
        .transpose()?;
    let words = nr.saturating_mul(3);
    let entries = r
        .u64_array(words, "branch_stack entries")?
        .chunks_exact(3)
        .map(|e| BranchEntry {
            from: e[0],
            to: e[1],
            flags: e[2],
        })
        .collect();
    let counters = if branch_sample_type & PERF_SAMPLE_BRANCH_COUNTERS != 0 {
        r.u64_array(nr, "branch_stack counters")?
    } else {
        Vec::new()
    };
    Ok(BranchStack {
        hw_idx,
        entries,
        counters,
    })
}

fn decode_registers(mask: u64, r: &mut Reader, what: &str) -> Result<Registers, PerfDataError> {
    let abi = r.u64(what)?;
    // PERF_SAMPLE_REGS_ABI_NONE: the kernel wrote no register values.
    let regs = if abi == 0 {
        Vec::new()
    } else {
        r.u64_array(u64::from(mask.count_ones()), what)?
    };
    Ok(Registers { abi, regs })
}

#[cfg(test)]
mod register_tests {
    use super::Registers;

    #[test]
    fn a_register_is_found_by_its_rank_in_the_mask() {
        // Mask bits 1, 6, 7, 8 (BX, BP, SP, IP): values in that order.
        let registers = Registers {
            abi: 2,
            regs: vec![11, 66, 77, 88],
        };
        let mask = (1 << 1) | (1 << 6) | (1 << 7) | (1 << 8);
        assert_eq!(registers.get(mask, 6), Some(66));
        assert_eq!(registers.get(mask, 8), Some(88));
        assert_eq!(registers.get(mask, 0), None, "not in the mask");
        assert_eq!(registers.get(mask, 64), None);
        assert_eq!(
            Registers::default().get(mask, 8),
            None,
            "no registers captured"
        );
    }
}
