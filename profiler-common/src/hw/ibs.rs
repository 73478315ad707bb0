//! AMD Instruction-Based Sampling as Linux delivers it in PERF_SAMPLE_RAW: the payload layout
//! ([`IbsFetchSample::parse`], [`IbsOpSample::parse`]), every field of the fetch and op registers,
//! the CPU errata that make some fields unreliable ([`IbsErrata`]), and the decoded samples
//! ([`IbsFetch`], [`IbsOp`]) with the common sample fields and the `perf_mem_data_src` the kernel
//! derives from an op sample. The CodeXL-style derived events built on them are in [`events`].

pub mod events;

use crate::hw::data_src::{DataSource, Hops, LevelNum, Lock, MemLevel, MemOp, Snoop, Tlb};
use crate::hw::{bit, field, BranchOutcome, SampleFields};

/// Declares a register newtype with one accessor per flag bit and per multi-bit field.
macro_rules! register {
    (
        $(#[$doc:meta])* $name:ident($repr:ty) {
            bits { $($(#[$bit_doc:meta])* $bit_fn:ident: $bit:literal,)* }
            fields { $($(#[$field_doc:meta])* $field_fn:ident: $ty:ty = $shift:literal, $width:literal;)* }
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name(pub $repr);

        impl $name {
            $(
                $(#[$bit_doc])*
                #[inline(always)]
                pub const fn $bit_fn(self) -> bool {
                    bit(self.0 as u64, $bit)
                }
            )*
            $(
                $(#[$field_doc])*
                #[inline(always)]
                pub const fn $field_fn(self) -> $ty {
                    field(self.0 as u64, $shift, $width) as $ty
                }
            )*
        }
    };
}

register! {
    /// IBS capabilities (CPUID 8000_001B EAX), the `u32` after the raw payload's size word.
    IbsCaps(u32) {
        bits {
            /// 0: IBS is available.
            available: 0,
            /// 1: fetch sampling.
            fetch_sampling: 1,
            /// 2: op sampling.
            op_sampling: 2,
            /// 3: read/write of the op counter.
            rd_wr_op_count: 3,
            /// 4: op counting by dispatched ops (IBS_OP_CTL count control).
            op_count: 4,
            /// 5: BR_TARGET follows the op registers.
            branch_target: 5,
            /// 6: op max count extension (IBS_OP_CTL bits 20-26).
            op_count_ext: 6,
            /// 7: IBS_OP_DATA RIP-invalid bit.
            rip_invalid_check: 7,
            /// 8: fused-branch bit in IBS_OP_DATA.
            op_branch_fuse: 8,
            /// 9: IC_IBS_EXTD_CTL follows the fetch registers.
            fetch_ctl_ext: 9,
            /// 10: IBS_OP_DATA4 follows the op registers.
            op_data4: 10,
            /// 11: Zen 4 extensions (5-bit data source, L3-miss filters).
            zen4: 11,
            /// 12: op load-latency filter.
            op_load_latency_filter: 12,
            /// 19: Zen 5 DTLB page-size layout of IBS_OP_DATA3 (Linux `IBS_CAPS_OPDTLBPGSIZE`,
            /// kernel 6.15): bits 4-5 hold the page size, 6 and 19 are reserved, and the TLB miss
            /// bits are valid only with a valid physical address.
            op_dtlb_page_size: 19,
        }
        fields {}
    }
}

register! {
    /// IBS_FETCH_CTL (MSR C001_1030).
    FetchCtl(u64) {
        bits {
            /// 48.
            enabled: 48,
            /// 49: the sample is valid.
            valid: 49,
            /// 50: the fetch completed.
            completed: 50,
            /// 51: instruction cache miss.
            ic_miss: 51,
            /// 52: the fetch physical address is valid.
            phys_addr_valid: 52,
            /// 55: L1 ITLB miss.
            l1_tlb_miss: 55,
            /// 56: L2 ITLB miss.
            l2_tlb_miss: 56,
            /// 57: randomized sampling period.
            randomized: 57,
            /// 58: L2 cache miss, meaningful only for a completed fetch.
            l2_miss: 58,
            /// 59 (Zen 4): sample only fetches that miss the L3.
            l3_miss_only: 59,
            /// 60 (Zen 4): op-cache miss.
            op_cache_miss: 60,
            /// 61 (Zen 4): L3 miss.
            l3_miss: 61,
        }
        fields {
            /// 0-15: max count, in units of 16 fetches.
            max_count_field: u16 = 0, 16;
            /// 16-31: current count, in units of 16 fetches.
            current_count_field: u16 = 16, 16;
            /// 32-47: fetch latency in cycles.
            latency: u16 = 32, 16;
            /// 53-54: L1 ITLB page size code, valid with a valid physical address.
            l1_tlb_page_size_field: u8 = 53, 2;
        }
    }
}

register! {
    /// IC_IBS_EXTD_CTL (MSR C001_103C).
    FetchExtCtl(u64) {
        bits {}
        fields {
            /// 0-15: ITLB refill latency in cycles.
            itlb_refill_latency: u16 = 0, 16;
        }
    }
}

register! {
    /// IBS_OP_CTL (MSR C001_1033).
    OpCtl(u64) {
        bits {
            /// 16 (Zen 4): sample only ops that miss the L3.
            l3_miss_only: 16,
            /// 17.
            enabled: 17,
            /// 18: the sample is valid.
            valid: 18,
            /// 19: count dispatched ops rather than cycles.
            counts_dispatched_ops: 19,
            /// 63 (Zen 5): load-latency filter enabled.
            load_latency_filter: 63,
        }
        fields {
            /// 0-15: max count bits 4-19.
            max_count_field: u16 = 0, 16;
            /// 20-26: max count extension, bits 20-26 of the count.
            max_count_ext: u8 = 20, 7;
            /// 32-58: current count.
            current_count: u32 = 32, 27;
            /// 59-62 (Zen 5): load-latency threshold code.
            load_latency_threshold_field: u8 = 59, 4;
        }
    }
}

register! {
    /// IBS_OP_DATA (MSR C001_1035).
    OpData(u64) {
        bits {
            /// 34: return op.
            is_return: 34,
            /// 35: taken branch.
            branch_taken: 35,
            /// 36: mispredicted branch.
            branch_mispredicted: 36,
            /// 37: retired branch op.
            is_branch: 37,
            /// 38: the op RIP is invalid (with caps bit 7).
            rip_invalid: 38,
            /// 39: fused branch.
            fused_branch: 39,
            /// 40: microcoded op.
            microcoded: 40,
        }
        fields {
            /// 0-15: completion-to-retire cycles.
            completion_to_retire: u16 = 0, 16;
            /// 16-31: tag-to-retire cycles.
            tag_to_retire: u16 = 16, 16;
        }
    }
}

register! {
    /// IBS_OP_DATA2 (MSR C001_1036): where a load's data came from.
    OpData2(u64) {
        bits {
            /// 4: served by another node.
            remote_node: 4,
            /// 5: cache hit state: set = Owned, clear = Modified.
            cache_hit_owned: 5,
            /// 8: streaming store.
            streaming_store: 8,
            /// 9: served by another socket.
            remote_socket: 9,
        }
        fields {
            /// 0-2: data source, low bits (the whole source before Zen 4).
            data_source_lo: u8 = 0, 3;
            /// 6-7 (Zen 4): data source, high bits.
            data_source_hi: u8 = 6, 2;
        }
    }
}

register! {
    /// IBS_OP_DATA3 (MSR C001_1037): the load/store side of an op.
    OpData3(u64) {
        bits {
            /// 0.
            load: 0,
            /// 1.
            store: 1,
            /// 2: L1 DTLB miss.
            l1_dtlb_miss: 2,
            /// 3: L2 DTLB miss.
            l2_dtlb_miss: 3,
            /// 4: L1 DTLB hit in a 2M page (before Zen 5's page-size layout).
            l1_dtlb_hit_2m: 4,
            /// 5: L1 DTLB hit in a 1G page (before Zen 5's page-size layout).
            l1_dtlb_hit_1g: 5,
            /// 6: L2 DTLB hit in a 2M page (before Zen 5's page-size layout).
            l2_dtlb_hit_2m: 6,
            /// 7: data cache miss.
            dc_miss: 7,
            /// 8: misaligned access.
            misaligned: 8,
            /// 13: write-combining memory.
            write_combining: 13,
            /// 14: uncacheable memory.
            uncacheable: 14,
            /// 15: locked operation.
            locked: 15,
            /// 16: data cache miss with no miss address buffer allocated.
            dc_miss_no_mab: 16,
            /// 17: DC_LINADDR is valid.
            lin_addr_valid: 17,
            /// 18: DC_PHYSADDR is valid.
            phys_addr_valid: 18,
            /// 19: L2 DTLB hit in a 1G page (before Zen 5's page-size layout).
            l2_dtlb_hit_1g: 19,
            /// 20: L2 cache miss.
            l2_miss: 20,
            /// 21: software prefetch.
            software_prefetch: 21,
        }
        fields {
            /// 4-5 (Zen 5 layout, caps bit 19): page size code.
            page_size_field: u8 = 4, 2;
            /// 22-25: access width code.
            access_width_field: u8 = 22, 4;
            /// 26-31: outstanding memory requests when the miss was filled.
            open_mem_requests: u8 = 26, 6;
            /// 32-47: data-cache miss latency in cycles.
            dc_miss_latency: u16 = 32, 16;
            /// 48-63: DTLB refill latency in cycles.
            dtlb_refill_latency: u16 = 48, 16;
        }
    }
}

register! {
    /// IBS_OP_DATA4 (MSR C001_103D).
    OpData4(u64) {
        bits {
            /// 0: load resync.
            load_resync: 0,
        }
        fields {}
    }
}

impl FetchCtl {
    /// The sampling period in fetches.
    #[inline(always)]
    pub const fn max_count(self) -> u64 {
        (self.max_count_field() as u64) << 4
    }

    /// Fetches counted towards the next sample.
    #[inline(always)]
    pub const fn current_count(self) -> u64 {
        (self.current_count_field() as u64) << 4
    }

    /// The L1 ITLB page size, `None` without a valid physical address or for the reserved code.
    /// `erratum_1347` selects the table of family 19h models 00h-0Fh (4K, 16K, 2M, 1G).
    #[inline(always)]
    pub const fn l1_tlb_page_size(self, erratum_1347: bool) -> Option<PageSize> {
        if !self.phys_addr_valid() {
            return None;
        }
        match (self.l1_tlb_page_size_field(), erratum_1347) {
            (0, _) => Some(PageSize::Size4K),
            (1, false) => Some(PageSize::Size2M),
            (2, false) => Some(PageSize::Size1G),
            (1, true) => Some(PageSize::Size16K),
            (2, true) => Some(PageSize::Size2M),
            (3, true) => Some(PageSize::Size1G),
            _ => None,
        }
    }
}

/// What IBS_OP_CTL counts towards the next sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpCountMode {
    Cycles,
    DispatchedOps,
}

impl OpCtl {
    /// The sampling period: `((ext << 16) | max count) << 4`. Without caps bit 6 the extension
    /// bits are reserved and read as zero.
    #[inline(always)]
    pub const fn max_count(self) -> u64 {
        (((self.max_count_ext() as u64) << 16) | self.max_count_field() as u64) << 4
    }

    #[inline(always)]
    pub const fn count_mode(self) -> OpCountMode {
        if self.counts_dispatched_ops() {
            OpCountMode::DispatchedOps
        } else {
            OpCountMode::Cycles
        }
    }

    /// The load-latency filter threshold in cycles: the kernel writes `threshold / 128 - 1`.
    #[inline(always)]
    pub const fn load_latency_threshold(self) -> u32 {
        (self.load_latency_threshold_field() as u32 + 1) << 7
    }
}

/// The state of the cache line that served a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheState {
    Modified,
    Owned,
}

impl OpData2 {
    #[inline(always)]
    pub const fn cache_state(self) -> CacheState {
        if self.cache_hit_owned() {
            CacheState::Owned
        } else {
            CacheState::Modified
        }
    }

    /// The data source number: `hi << 3 | lo` on Zen 4 (caps bit 11), the low bits before.
    #[inline(always)]
    pub const fn data_source_code(self, zen4: bool) -> u8 {
        if zen4 {
            (self.data_source_hi() << 3) | self.data_source_lo()
        } else {
            self.data_source_lo()
        }
    }
}

impl OpData3 {
    /// Bytes accessed: `1 << (w - 1)` for a width code `w > 0`; `None` when not reported.
    #[inline(always)]
    pub const fn access_width_bytes(self) -> Option<u16> {
        match self.access_width_field() {
            0 => None,
            w => Some(1 << (w - 1)),
        }
    }
}

/// A translation's page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    Size4K,
    /// Only in the fetch page-size table of erratum 1347.
    Size16K,
    Size2M,
    Size1G,
}

/// Where an address translation was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlbOutcome {
    L1Hit,
    L1MissL2Hit,
    /// Missed both TLB levels: a page walk.
    L1L2Miss,
}

impl TlbOutcome {
    #[inline(always)]
    const fn from_miss_bits(l1_miss: bool, l2_miss: bool) -> TlbOutcome {
        if !l1_miss {
            TlbOutcome::L1Hit
        } else if !l2_miss {
            TlbOutcome::L1MissL2Hit
        } else {
            TlbOutcome::L1L2Miss
        }
    }
}

/// IBS_OP_DATA2's data source, interpreted for the CPU generation that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IbsDataSource {
    /// Before Zen 4, code 2: a cache on the local node (the L3 or another core's cache).
    LocalCache,
    /// Before Zen 4, code 4: a cache on another node.
    RemoteCache,
    /// Zen 4 code 1: the local L3, or another core's L1/L2 in the same CCX.
    LocalCcx,
    /// Zen 4 code 2: another CCX's cache on the same node.
    NearCcx,
    /// Zen 4 code 5: a CCX's cache on another node.
    FarCcx,
    /// Code 3: DRAM; the remote-node bit says whose.
    Dram,
    /// Zen 4 code 6: a long-latency DIMM (persistent memory).
    LongLatencyDimm,
    /// Code 7: MMIO, configuration space, PCI or APIC.
    Io,
    /// Zen 4 code 8: extension memory (CXL).
    ExtensionMemory,
    /// Zen 4 code 12: memory of a peer agent (another processor type).
    PeerAgentMemory,
    /// A code this generation leaves reserved.
    Reserved(u8),
}

impl IbsDataSource {
    /// `None` for code 0, "no valid status".
    #[inline(always)]
    pub const fn decode(data2: OpData2, zen4: bool) -> Option<IbsDataSource> {
        let code = data2.data_source_code(zen4);
        let source = match (zen4, code) {
            (_, 0) => return None,
            (_, 3) => IbsDataSource::Dram,
            (_, 7) => IbsDataSource::Io,
            (false, 2) => IbsDataSource::LocalCache,
            (false, 4) => IbsDataSource::RemoteCache,
            (true, 1) => IbsDataSource::LocalCcx,
            (true, 2) => IbsDataSource::NearCcx,
            (true, 5) => IbsDataSource::FarCcx,
            (true, 6) => IbsDataSource::LongLatencyDimm,
            (true, 8) => IbsDataSource::ExtensionMemory,
            (true, 12) => IbsDataSource::PeerAgentMemory,
            (_, other) => IbsDataSource::Reserved(other),
        };
        Some(source)
    }

    /// Whether the cache-hit-state bit describes this source (the sources that are caches of
    /// other cores, as Linux and `perf report -D` read it).
    #[inline(always)]
    pub const fn reports_cache_state(self) -> bool {
        matches!(
            self,
            IbsDataSource::LocalCache
                | IbsDataSource::LocalCcx
                | IbsDataSource::NearCcx
                | IbsDataSource::FarCcx
        )
    }
}

/// CPU errata that make IBS fields unreliable, as Linux and `perf` work around them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IbsErrata {
    /// Erratum 1293 (family 19h models 00h-0Fh): OP_DATA2, the L2-miss bit and the open memory
    /// requests are invalid when "DC miss with no MAB allocated" or software prefetch is set.
    pub op_data2_without_mab: bool,
    /// Erratum 1238 (family 19h models 00h-0Fh): the fetch IC-miss bit is unreliable.
    pub fetch_ic_miss: bool,
    /// Erratum 1347 (family 19h models 00h-0Fh): the fetch L1 TLB page size uses another table.
    pub fetch_page_size_table: bool,
    /// The cache-hit-state bit is unreliable on family 19h models 00h-0Fh and 20h-5Fh.
    pub cache_hit_state: bool,
}

impl IbsErrata {
    /// The errata of a CPU by its family and model (from CPUID or /proc/cpuinfo).
    pub const fn for_cpu(family: u32, model: u32) -> IbsErrata {
        let zen3 = family == 0x19 && model <= 0x0f;
        IbsErrata {
            op_data2_without_mab: zen3,
            fetch_ic_miss: zen3,
            fetch_page_size_table: zen3,
            cache_hit_state: zen3 || (family == 0x19 && model >= 0x20 && model <= 0x5f),
        }
    }
}

/// Why an IBS raw payload could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IbsRawError {
    /// Fewer bytes than the capability word and the registers it announces.
    Truncated { needed: usize, available: usize },
    /// The PERF_SAMPLE_RAW size word claims more bytes than follow it.
    SizeBeyondRecord { size: usize, available: usize },
    /// Not a 4-byte capability word followed by whole 8-byte registers.
    Misaligned { len: usize },
}

impl core::fmt::Display for IbsRawError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            IbsRawError::Truncated { needed, available } => write!(
                f,
                "IBS raw sample holds {available} bytes but needs {needed} (the capability word and the \
                 registers it announces): the record was cut short; read the whole PERF_SAMPLE_RAW field"
            ),
            IbsRawError::SizeBeyondRecord { size, available } => write!(
                f,
                "IBS raw field claims {size} bytes but only {available} follow its size word: the \
                 sample record is truncated, or the fields before PERF_SAMPLE_RAW were misparsed"
            ),
            IbsRawError::Misaligned { len } => write!(
                f,
                "IBS raw payload of {len} bytes is not a 4-byte capability word followed by 8-byte \
                 registers: the raw field does not come from an ibs_op or ibs_fetch event"
            ),
        }
    }
}

impl core::error::Error for IbsRawError {}

const CAPS_BYTES: usize = 4;
const REG_BYTES: usize = 8;
/// FETCH_CTL, FETCH_LINADDR, FETCH_PHYSADDR.
const FETCH_FIXED_REGS: usize = 3;
/// OP_CTL, OP_RIP, OP_DATA, OP_DATA2, OP_DATA3, DC_LINADDR, DC_PHYSADDR.
const OP_FIXED_REGS: usize = 7;

/// The payload's capability word, once the payload is known to be a capability word followed
/// by whole registers.
#[inline(always)]
fn read_caps(payload: &[u8]) -> Result<IbsCaps, IbsRawError> {
    let len = payload.len();
    let word = match payload.first_chunk::<4>() {
        Some(word) => word,
        None => {
            return Err(IbsRawError::Truncated {
                needed: CAPS_BYTES,
                available: len,
            })
        }
    };
    if !(len - CAPS_BYTES).is_multiple_of(REG_BYTES) {
        return Err(IbsRawError::Misaligned { len });
    }
    Ok(IbsCaps(u32::from_le_bytes(*word)))
}

/// Checks the payload holds `registers` registers after the capability word. Extra trailing
/// registers (a newer kernel) are accepted.
#[inline(always)]
fn check_registers(payload: &[u8], registers: usize) -> Result<(), IbsRawError> {
    let needed = CAPS_BYTES + registers * REG_BYTES;
    if payload.len() < needed {
        return Err(IbsRawError::Truncated {
            needed,
            available: payload.len(),
        });
    }
    Ok(())
}

/// Register `index` of a payload whose length was checked; a short payload still reads as an
/// error rather than a panic.
#[inline(always)]
fn register(payload: &[u8], index: usize) -> Result<u64, IbsRawError> {
    let start = CAPS_BYTES + index * REG_BYTES;
    match payload
        .get(start..)
        .and_then(|rest| rest.first_chunk::<8>())
    {
        Some(bytes) => Ok(u64::from_le_bytes(*bytes)),
        None => Err(IbsRawError::Truncated {
            needed: start + REG_BYTES,
            available: payload.len(),
        }),
    }
}

/// The payload of a PERF_SAMPLE_RAW field: its `u32` size word, then that many bytes.
#[inline(always)]
fn raw_field_payload(raw_field: &[u8]) -> Result<&[u8], IbsRawError> {
    let size = match raw_field.first_chunk::<4>() {
        Some(word) => u32::from_le_bytes(*word) as usize,
        None => {
            return Err(IbsRawError::Truncated {
                needed: 4,
                available: raw_field.len(),
            })
        }
    };
    let available = raw_field.len() - 4;
    match raw_field.get(4..).and_then(|rest| rest.get(..size)) {
        Some(payload) => Ok(payload),
        None => Err(IbsRawError::SizeBeyondRecord { size, available }),
    }
}

/// The registers of one IBS fetch sample, as read from the raw payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbsFetchSample {
    pub caps: IbsCaps,
    pub ctl: FetchCtl,
    pub lin_addr: u64,
    pub phys_addr: u64,
    /// IC_IBS_EXTD_CTL, present with caps bit 9.
    pub ext_ctl: Option<FetchExtCtl>,
}

impl IbsFetchSample {
    /// Parses the raw payload as the kernel's `perf_raw_record` fragment holds it: `u32 caps`,
    /// then FETCH_CTL, FETCH_LINADDR, FETCH_PHYSADDR and, with caps bit 9, IC_IBS_EXTD_CTL.
    #[inline(always)]
    pub fn parse(payload: &[u8]) -> Result<IbsFetchSample, IbsRawError> {
        let caps = read_caps(payload)?;
        check_registers(payload, FETCH_FIXED_REGS + caps.fetch_ctl_ext() as usize)?;
        Ok(IbsFetchSample {
            caps,
            ctl: FetchCtl(register(payload, 0)?),
            lin_addr: register(payload, 1)?,
            phys_addr: register(payload, 2)?,
            ext_ctl: if caps.fetch_ctl_ext() {
                Some(FetchExtCtl(register(payload, 3)?))
            } else {
                None
            },
        })
    }

    /// Parses a whole PERF_SAMPLE_RAW field as a perf record carries it (`u32 size` first).
    #[inline(always)]
    pub fn parse_raw_field(raw_field: &[u8]) -> Result<IbsFetchSample, IbsRawError> {
        IbsFetchSample::parse(raw_field_payload(raw_field)?)
    }

    /// Interprets the registers, applying `errata`.
    #[inline(always)]
    pub fn decode(&self, errata: IbsErrata) -> IbsFetch {
        let ctl = self.ctl;
        let completed = ctl.completed();
        // CodeXL's rule: a fetch that set none of these was killed before it was attempted.
        let killed = !(completed
            || ctl.ic_miss()
            || ctl.phys_addr_valid()
            || ctl.l1_tlb_miss()
            || ctl.l2_tlb_miss()
            || ctl.l2_miss());
        let zen4 = self.caps.zen4();
        IbsFetch {
            linear_address: self.lin_addr,
            physical_address: if ctl.phys_addr_valid() {
                Some(self.phys_addr)
            } else {
                None
            },
            outcome: if killed {
                FetchOutcome::Killed
            } else if completed {
                FetchOutcome::Completed
            } else {
                FetchOutcome::Aborted
            },
            latency: ctl.latency(),
            ic_miss: if errata.fetch_ic_miss {
                None
            } else {
                Some(ctl.ic_miss())
            },
            // An L1 hit is only known for a fetch that translated (valid physical address).
            itlb: if ctl.l1_tlb_miss() || ctl.phys_addr_valid() {
                Some(TlbOutcome::from_miss_bits(
                    ctl.l1_tlb_miss(),
                    ctl.l2_tlb_miss(),
                ))
            } else {
                None
            },
            page_size: ctl.l1_tlb_page_size(errata.fetch_page_size_table),
            l2_miss: if completed { Some(ctl.l2_miss()) } else { None },
            op_cache_miss: if zen4 {
                Some(ctl.op_cache_miss())
            } else {
                None
            },
            l3_miss: if zen4 { Some(ctl.l3_miss()) } else { None },
            itlb_refill_latency: self.ext_ctl.map(FetchExtCtl::itlb_refill_latency),
        }
    }
}

/// How a sampled fetch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FetchOutcome {
    /// Killed before it was attempted (every event bit clear).
    Killed,
    /// Attempted and aborted.
    Aborted,
    Completed,
}

/// A decoded fetch sample; `None` marks what the CPU did not report for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbsFetch {
    pub linear_address: u64,
    pub physical_address: Option<u64>,
    pub outcome: FetchOutcome,
    /// Fetch latency in cycles.
    pub latency: u16,
    /// `None` under erratum 1238.
    pub ic_miss: Option<bool>,
    pub itlb: Option<TlbOutcome>,
    pub page_size: Option<PageSize>,
    /// Known for completed fetches only.
    pub l2_miss: Option<bool>,
    /// Zen 4 and later.
    pub op_cache_miss: Option<bool>,
    /// Zen 4 and later.
    pub l3_miss: Option<bool>,
    /// With IC_IBS_EXTD_CTL (caps bit 9).
    pub itlb_refill_latency: Option<u16>,
}

/// The registers of one IBS op sample, as read from the raw payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbsOpSample {
    pub caps: IbsCaps,
    pub ctl: OpCtl,
    pub rip: u64,
    pub data: OpData,
    pub data2: OpData2,
    pub data3: OpData3,
    pub dc_lin_addr: u64,
    pub dc_phys_addr: u64,
    /// BR_TARGET, present with caps bit 5.
    pub branch_target: Option<u64>,
    /// IBS_OP_DATA4, present with caps bit 10.
    pub data4: Option<OpData4>,
}

impl IbsOpSample {
    /// Parses the raw payload as the kernel's `perf_raw_record` fragment holds it: `u32 caps`,
    /// then OP_CTL, OP_RIP, OP_DATA, OP_DATA2, OP_DATA3, DC_LINADDR, DC_PHYSADDR, then BR_TARGET
    /// with caps bit 5 and OP_DATA4 with caps bit 10.
    #[inline(always)]
    pub fn parse(payload: &[u8]) -> Result<IbsOpSample, IbsRawError> {
        let caps = read_caps(payload)?;
        check_registers(
            payload,
            OP_FIXED_REGS + caps.branch_target() as usize + caps.op_data4() as usize,
        )?;
        let data4_index = OP_FIXED_REGS + caps.branch_target() as usize;
        Ok(IbsOpSample {
            caps,
            ctl: OpCtl(register(payload, 0)?),
            rip: register(payload, 1)?,
            data: OpData(register(payload, 2)?),
            data2: OpData2(register(payload, 3)?),
            data3: OpData3(register(payload, 4)?),
            dc_lin_addr: register(payload, 5)?,
            dc_phys_addr: register(payload, 6)?,
            branch_target: if caps.branch_target() {
                Some(register(payload, OP_FIXED_REGS)?)
            } else {
                None
            },
            data4: if caps.op_data4() {
                Some(OpData4(register(payload, data4_index)?))
            } else {
                None
            },
        })
    }

    /// Parses a whole PERF_SAMPLE_RAW field as a perf record carries it (`u32 size` first).
    #[inline(always)]
    pub fn parse_raw_field(raw_field: &[u8]) -> Result<IbsOpSample, IbsRawError> {
        IbsOpSample::parse(raw_field_payload(raw_field)?)
    }

    /// Interprets the registers, applying `errata`.
    #[inline(always)]
    pub fn decode(&self, errata: IbsErrata) -> IbsOp {
        let data = self.data;
        let d3 = self.data3;
        IbsOp {
            rip: if self.caps.rip_invalid_check() && data.rip_invalid() {
                None
            } else {
                Some(self.rip)
            },
            tag_to_retire: data.tag_to_retire(),
            completion_to_retire: data.completion_to_retire(),
            microcoded: data.microcoded(),
            branch: if data.is_branch() {
                Some(BranchOutcome {
                    taken: data.branch_taken(),
                    mispredicted: data.branch_mispredicted(),
                    is_return: data.is_return(),
                    fused: data.fused_branch(),
                })
            } else {
                None
            },
            branch_target: match self.branch_target {
                Some(target) if data.is_branch() => Some(target),
                _ => None,
            },
            load_resync: self.data4.map(OpData4::load_resync),
            memory: if d3.load() || d3.store() {
                Some(self.decode_memory(errata))
            } else {
                None
            },
        }
    }

    #[inline(always)]
    fn decode_memory(&self, errata: IbsErrata) -> IbsMemoryAccess {
        let d3 = self.data3;
        let erratum_1293 =
            errata.op_data2_without_mab && (d3.dc_miss_no_mab() || d3.software_prefetch());
        // OP_DATA2 describes loads only.
        let data2 = if d3.load() && !erratum_1293 {
            Some(self.data2)
        } else {
            None
        };
        let source = match data2 {
            Some(data2) => IbsDataSource::decode(data2, self.caps.zen4()),
            None => None,
        };
        let zen5_tlb_layout = self.caps.op_dtlb_page_size();
        let dtlb = if d3.lin_addr_valid() && (!zen5_tlb_layout || d3.phys_addr_valid()) {
            Some(TlbOutcome::from_miss_bits(
                d3.l1_dtlb_miss(),
                d3.l2_dtlb_miss(),
            ))
        } else {
            None
        };
        IbsMemoryAccess {
            load: d3.load(),
            store: d3.store(),
            linear_address: if d3.lin_addr_valid() {
                Some(self.dc_lin_addr)
            } else {
                None
            },
            physical_address: if d3.phys_addr_valid() {
                Some(self.dc_phys_addr)
            } else {
                None
            },
            dtlb,
            page_size: dtlb_page_size(d3, dtlb, zen5_tlb_layout),
            dc_miss: d3.dc_miss(),
            dc_miss_no_mab: d3.dc_miss_no_mab(),
            l2_miss: if erratum_1293 {
                None
            } else {
                Some(d3.l2_miss())
            },
            misaligned: d3.misaligned(),
            uncacheable: d3.uncacheable(),
            write_combining: d3.write_combining(),
            locked: d3.locked(),
            software_prefetch: d3.software_prefetch(),
            width_bytes: d3.access_width_bytes(),
            open_mem_requests: if erratum_1293 {
                None
            } else {
                Some(d3.open_mem_requests())
            },
            dc_miss_latency: if d3.load() && d3.dc_miss() {
                Some(d3.dc_miss_latency())
            } else {
                None
            },
            dtlb_refill_latency: if d3.l1_dtlb_miss() {
                Some(d3.dtlb_refill_latency())
            } else {
                None
            },
            source,
            remote_node: source.is_some() && self.data2.remote_node(),
            cache_state: match (data2, source) {
                (Some(data2), Some(source))
                    if source.reports_cache_state() && !errata.cache_hit_state =>
                {
                    Some(data2.cache_state())
                }
                _ => None,
            },
        }
    }
}

/// The page size of a DTLB hit. Zen 5's layout reports it for any valid translation; before, one
/// bit pair per level says 2M or 1G, neither means 4K, and both is contradictory.
#[inline(always)]
fn dtlb_page_size(d3: OpData3, dtlb: Option<TlbOutcome>, zen5_layout: bool) -> Option<PageSize> {
    let tlb = dtlb?;
    if zen5_layout {
        return match d3.page_size_field() {
            0 => Some(PageSize::Size4K),
            1 => Some(PageSize::Size2M),
            2 => Some(PageSize::Size1G),
            _ => None,
        };
    }
    let (is_2m, is_1g) = match tlb {
        TlbOutcome::L1Hit => (d3.l1_dtlb_hit_2m(), d3.l1_dtlb_hit_1g()),
        TlbOutcome::L1MissL2Hit => (d3.l2_dtlb_hit_2m(), d3.l2_dtlb_hit_1g()),
        TlbOutcome::L1L2Miss => return None,
    };
    match (is_2m, is_1g) {
        (false, false) => Some(PageSize::Size4K),
        (true, false) => Some(PageSize::Size2M),
        (false, true) => Some(PageSize::Size1G),
        (true, true) => None,
    }
}

/// A decoded op sample; `None` marks what the CPU did not report for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbsOp {
    /// The op's instruction address; `None` when the CPU flags it invalid.
    pub rip: Option<u64>,
    pub tag_to_retire: u16,
    pub completion_to_retire: u16,
    pub microcoded: bool,
    pub branch: Option<BranchOutcome>,
    /// The branch's target, with BR_TARGET (caps bit 5) and a branch op.
    pub branch_target: Option<u64>,
    /// With IBS_OP_DATA4 (caps bit 10).
    pub load_resync: Option<bool>,
    /// The load/store side; `None` for ops that access no memory.
    pub memory: Option<IbsMemoryAccess>,
}

/// The load/store side of an op sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbsMemoryAccess {
    pub load: bool,
    pub store: bool,
    pub linear_address: Option<u64>,
    pub physical_address: Option<u64>,
    /// `None` without a valid linear address (and, in Zen 5's layout, physical address).
    pub dtlb: Option<TlbOutcome>,
    /// The page size of an L1 or L2 DTLB hit.
    pub page_size: Option<PageSize>,
    pub dc_miss: bool,
    pub dc_miss_no_mab: bool,
    /// `None` under erratum 1293.
    pub l2_miss: Option<bool>,
    pub misaligned: bool,
    pub uncacheable: bool,
    pub write_combining: bool,
    pub locked: bool,
    pub software_prefetch: bool,
    pub width_bytes: Option<u16>,
    /// `None` under erratum 1293.
    pub open_mem_requests: Option<u8>,
    /// Data-cache miss latency, for loads that missed.
    pub dc_miss_latency: Option<u16>,
    /// For accesses that missed the L1 DTLB.
    pub dtlb_refill_latency: Option<u16>,
    /// Where a load's data came from; `None` for stores, code 0, or under erratum 1293.
    pub source: Option<IbsDataSource>,
    /// The source was on another node (false when there is no source).
    pub remote_node: bool,
    /// The serving line's state, for cache sources on CPUs where the bit is reliable.
    pub cache_state: Option<CacheState>,
}

/// A resolved `mem_lvl` / `mem_lvl_num` / remote / hops combination.
struct Level {
    lvl: MemLevel,
    num: LevelNum,
    remote: bool,
    hops: Hops,
}

impl Level {
    #[inline(always)]
    const fn hit(lvl: MemLevel, num: LevelNum) -> Level {
        Level {
            lvl: MemLevel(lvl.0 | MemLevel::HIT.0),
            num,
            remote: false,
            hops: Hops(0),
        }
    }

    /// The level reported as remote; IBS gives no socket detail, so like Linux: one node away.
    #[inline(always)]
    const fn remote(self, hops: Hops) -> Level {
        Level {
            remote: true,
            hops,
            ..self
        }
    }

    /// Memory Linux reports by `mem_lvl_num` only, remote when the node bit says so.
    #[inline(always)]
    const fn away(num: LevelNum, remote: bool) -> Level {
        let level = Level {
            lvl: MemLevel(0),
            num,
            remote: false,
            hops: Hops(0),
        };
        if remote {
            level.remote(Hops::HOPS_1)
        } else {
            level
        }
    }
}

impl IbsMemoryAccess {
    /// The level that served the access, mapped to `perf_mem_data_src` exactly as Linux's IBS
    /// driver does (`perf_ibs_get_mem_lvl`), so IBS and PEBS samples share one vocabulary.
    #[inline(always)]
    fn level(&self) -> Level {
        // Uncacheable accesses carry no valid miss/source bits, except an I/O source. (`source`
        // is read for loads only, so an uncacheable store is always reported uncached.)
        if self.uncacheable && !matches!(self.source, Some(IbsDataSource::Io)) {
            return Level::hit(MemLevel::UNC, LevelNum::UNC);
        }
        if !self.dc_miss {
            return Level::hit(MemLevel::L1, LevelNum::L1);
        }
        if let Some(false) = self.l2_miss {
            return Level::hit(MemLevel::L2, LevelNum::L2);
        }
        let remote = self.remote_node;
        let from_source = match self.source {
            Some(IbsDataSource::LocalCache) => Some(Level {
                hops: Hops::HOPS_0,
                ..Level::hit(MemLevel::L3 | MemLevel::REM_CCE1, LevelNum::ANY_CACHE)
            }),
            Some(IbsDataSource::RemoteCache) | Some(IbsDataSource::FarCcx) => {
                Some(Level::hit(MemLevel::REM_CCE2, LevelNum::ANY_CACHE).remote(Hops::HOPS_1))
            }
            Some(IbsDataSource::LocalCcx) => Some(Level::hit(MemLevel::L3, LevelNum::L3)),
            Some(IbsDataSource::NearCcx) => {
                Some(Level::hit(MemLevel::REM_CCE1, LevelNum::ANY_CACHE).remote(Hops::HOPS_0))
            }
            Some(IbsDataSource::Dram) if remote => {
                Some(Level::hit(MemLevel::REM_RAM1, LevelNum::RAM).remote(Hops::HOPS_1))
            }
            Some(IbsDataSource::Dram) => Some(Level::hit(MemLevel::LOC_RAM, LevelNum::RAM)),
            Some(IbsDataSource::LongLatencyDimm) => Some(Level::away(LevelNum::PMEM, remote)),
            Some(IbsDataSource::ExtensionMemory) => Some(Level::away(LevelNum::CXL, remote)),
            Some(IbsDataSource::Io) => Some(Level::hit(MemLevel::IO, LevelNum::IO)),
            Some(IbsDataSource::PeerAgentMemory) | Some(IbsDataSource::Reserved(_)) | None => None,
        };
        match from_source {
            Some(level) => level,
            // The miss address buffer only counts when no data source was given.
            None if self.dc_miss_no_mab => Level::hit(MemLevel::LFB, LevelNum::LFB),
            None => Level {
                lvl: MemLevel::NA,
                num: LevelNum::NA,
                remote: false,
                hops: Hops(0),
            },
        }
    }

    /// The `perf_mem_data_src` Linux reports for this access.
    #[inline(always)]
    pub fn data_source(&self) -> DataSource {
        let level = self.level();
        let near = level.lvl.contains(MemLevel::L1) || level.lvl.contains(MemLevel::L2);
        DataSource {
            mem_op: if self.load { MemOp::LOAD } else { MemOp::STORE },
            mem_lvl: level.lvl,
            mem_lvl_num: level.num,
            mem_remote: level.remote,
            mem_hops: level.hops,
            // Only a load served by another core's Modified line is reported, as HitM.
            mem_snoop: match self.cache_state {
                Some(CacheState::Modified) if self.load && !near => Snoop::HITM,
                _ => Snoop::NA,
            },
            mem_dtlb: match self.dtlb {
                Some(TlbOutcome::L1Hit) => Tlb::L1 | Tlb::HIT,
                Some(TlbOutcome::L1MissL2Hit) => Tlb::L2 | Tlb::HIT,
                Some(TlbOutcome::L1L2Miss) => Tlb::L2 | Tlb::MISS,
                None => Tlb::NA,
            },
            mem_lock: if self.locked { Lock::LOCKED } else { Lock::NA },
            ..DataSource::NOT_AVAILABLE
        }
    }
}

impl IbsOp {
    /// The `perf_mem_data_src` of the load/store side; `None` for ops without memory access.
    #[inline(always)]
    pub fn data_source(&self) -> Option<DataSource> {
        self.memory.as_ref().map(IbsMemoryAccess::data_source)
    }

    /// The common sample fields. Unlike Linux, which puts tag-to-retire in the weight only for
    /// loads that missed the data cache, every op reports its tag-to-retire cycles here.
    #[inline(always)]
    pub fn sample_fields(&self) -> SampleFields {
        let memory = self.memory.as_ref();
        SampleFields {
            data_addr: memory.and_then(|memory| memory.linear_address),
            phys_addr: memory.and_then(|memory| memory.physical_address),
            load_latency: memory
                .and_then(|memory| memory.dc_miss_latency)
                .map(u64::from),
            instruction_latency: Some(self.tag_to_retire),
            retire_latency: None,
            completion_to_retire: Some(self.completion_to_retire),
            data_source: self.data_source(),
            branch: self.branch,
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::hw::data_src::MemoryLevel;
    use std::string::ToString;
    use std::vec::Vec;

    type FlagReader<R> = fn(R) -> bool;
    type FieldReader<R> = fn(R) -> u64;

    /// Asserts that each flag accessor is true for exactly its bit among all 64.
    fn assert_flags<R: Copy>(make: fn(u64) -> R, flags: &[(FlagReader<R>, u32)]) {
        for &(read, position) in flags {
            for b in 0..64 {
                assert_eq!(
                    read(make(1 << b)),
                    b == position,
                    "flag at bit {position} read bit {b}"
                );
            }
            assert!(!read(make(0)));
        }
    }

    /// Asserts that each field accessor reads all-ones from exactly its range, and nothing from
    /// the bits around it.
    fn assert_fields<R: Copy>(make: fn(u64) -> R, fields: &[(FieldReader<R>, u32, u32)]) {
        for &(read, shift, width) in fields {
            let ones = (1u64 << width) - 1;
            assert_eq!(read(make(ones << shift)), ones, "field at {shift}");
            assert_eq!(read(make(1 << shift)), 1, "field at {shift}");
            assert_eq!(
                read(make(!(ones << shift))),
                0,
                "field at {shift} reads outside its range"
            );
        }
    }

    #[test]
    fn caps_bits() {
        assert_flags(
            |v| IbsCaps(v as u32),
            &[
                (IbsCaps::available as fn(IbsCaps) -> bool, 0),
                (IbsCaps::fetch_sampling, 1),
                (IbsCaps::op_sampling, 2),
                (IbsCaps::rd_wr_op_count, 3),
                (IbsCaps::op_count, 4),
                (IbsCaps::branch_target, 5),
                (IbsCaps::op_count_ext, 6),
                (IbsCaps::rip_invalid_check, 7),
                (IbsCaps::op_branch_fuse, 8),
                (IbsCaps::fetch_ctl_ext, 9),
                (IbsCaps::op_data4, 10),
                (IbsCaps::zen4, 11),
                (IbsCaps::op_load_latency_filter, 12),
                (IbsCaps::op_dtlb_page_size, 19),
            ],
        );
    }

    #[test]
    fn fetch_ctl_fields() {
        assert_flags(
            FetchCtl,
            &[
                (FetchCtl::enabled as fn(FetchCtl) -> bool, 48),
                (FetchCtl::valid, 49),
                (FetchCtl::completed, 50),
                (FetchCtl::ic_miss, 51),
                (FetchCtl::phys_addr_valid, 52),
                (FetchCtl::l1_tlb_miss, 55),
                (FetchCtl::l2_tlb_miss, 56),
                (FetchCtl::randomized, 57),
                (FetchCtl::l2_miss, 58),
                (FetchCtl::l3_miss_only, 59),
                (FetchCtl::op_cache_miss, 60),
                (FetchCtl::l3_miss, 61),
            ],
        );
        assert_fields(
            FetchCtl,
            &[
                (|r: FetchCtl| r.max_count_field() as u64, 0, 16),
                (|r| r.current_count_field() as u64, 16, 16),
                (|r| r.latency() as u64, 32, 16),
                (|r| r.l1_tlb_page_size_field() as u64, 53, 2),
            ],
        );
        assert_eq!(FetchCtl(0x1234).max_count(), 0x12340);
        assert_eq!(FetchCtl(0x0001_0000).current_count(), 16);
        assert_fields(
            FetchExtCtl,
            &[(|r: FetchExtCtl| r.itlb_refill_latency() as u64, 0, 16)],
        );
    }

    #[test]
    fn fetch_page_size_tables() {
        let ctl =
            |code: u64, phys_valid: bool| FetchCtl((code << 53) | ((phys_valid as u64) << 52));
        assert_eq!(ctl(0, true).l1_tlb_page_size(false), Some(PageSize::Size4K));
        assert_eq!(ctl(1, true).l1_tlb_page_size(false), Some(PageSize::Size2M));
        assert_eq!(ctl(2, true).l1_tlb_page_size(false), Some(PageSize::Size1G));
        assert_eq!(ctl(3, true).l1_tlb_page_size(false), None);
        assert_eq!(ctl(1, false).l1_tlb_page_size(false), None);
        assert_eq!(ctl(0, true).l1_tlb_page_size(true), Some(PageSize::Size4K));
        assert_eq!(ctl(1, true).l1_tlb_page_size(true), Some(PageSize::Size16K));
        assert_eq!(ctl(2, true).l1_tlb_page_size(true), Some(PageSize::Size2M));
        assert_eq!(ctl(3, true).l1_tlb_page_size(true), Some(PageSize::Size1G));
    }

    #[test]
    fn op_ctl_fields() {
        assert_flags(
            OpCtl,
            &[
                (OpCtl::l3_miss_only as fn(OpCtl) -> bool, 16),
                (OpCtl::enabled, 17),
                (OpCtl::valid, 18),
                (OpCtl::counts_dispatched_ops, 19),
                (OpCtl::load_latency_filter, 63),
            ],
        );
        assert_fields(
            OpCtl,
            &[
                (|r: OpCtl| r.max_count_field() as u64, 0, 16),
                (|r| r.max_count_ext() as u64, 20, 7),
                (|r| r.current_count() as u64, 32, 27),
                (|r| r.load_latency_threshold_field() as u64, 59, 4),
            ],
        );
        // max count = ((ext << 16) | maxcnt) << 4.
        assert_eq!(OpCtl((0x7f << 20) | 0xffff).max_count(), 0x7f_ffff << 4);
        assert_eq!(OpCtl((1 << 20) | 0x0002).max_count(), 0x1_0002 << 4);
        assert_eq!(OpCtl(0).count_mode(), OpCountMode::Cycles);
        assert_eq!(OpCtl(1 << 19).count_mode(), OpCountMode::DispatchedOps);
        assert_eq!(OpCtl(0).load_latency_threshold(), 128);
        assert_eq!(OpCtl(0xf << 59).load_latency_threshold(), 2048);
    }

    #[test]
    fn op_data_fields() {
        assert_flags(
            OpData,
            &[
                (OpData::is_return as fn(OpData) -> bool, 34),
                (OpData::branch_taken, 35),
                (OpData::branch_mispredicted, 36),
                (OpData::is_branch, 37),
                (OpData::rip_invalid, 38),
                (OpData::fused_branch, 39),
                (OpData::microcoded, 40),
            ],
        );
        assert_fields(
            OpData,
            &[
                (|r: OpData| r.completion_to_retire() as u64, 0, 16),
                (|r| r.tag_to_retire() as u64, 16, 16),
            ],
        );
    }

    #[test]
    fn op_data2_fields_and_sources() {
        assert_flags(
            OpData2,
            &[
                (OpData2::remote_node as fn(OpData2) -> bool, 4),
                (OpData2::cache_hit_owned, 5),
                (OpData2::streaming_store, 8),
                (OpData2::remote_socket, 9),
            ],
        );
        assert_fields(
            OpData2,
            &[
                (|r: OpData2| r.data_source_lo() as u64, 0, 3),
                (|r| r.data_source_hi() as u64, 6, 2),
            ],
        );
        assert_eq!(OpData2(0).cache_state(), CacheState::Modified);
        assert_eq!(OpData2(1 << 5).cache_state(), CacheState::Owned);

        // Zen 4: source = hi << 3 | lo; before: lo only.
        let code = |hi: u64, lo: u64| OpData2((hi << 6) | lo);
        assert_eq!(code(1, 4).data_source_code(true), 12);
        assert_eq!(code(1, 4).data_source_code(false), 4);
        assert_eq!(code(3, 7).data_source_code(true), 31);

        let zen4 = |c: u64| IbsDataSource::decode(code(c >> 3, c & 7), true);
        assert_eq!(zen4(0), None);
        assert_eq!(zen4(1), Some(IbsDataSource::LocalCcx));
        assert_eq!(zen4(2), Some(IbsDataSource::NearCcx));
        assert_eq!(zen4(3), Some(IbsDataSource::Dram));
        assert_eq!(zen4(4), Some(IbsDataSource::Reserved(4)));
        assert_eq!(zen4(5), Some(IbsDataSource::FarCcx));
        assert_eq!(zen4(6), Some(IbsDataSource::LongLatencyDimm));
        assert_eq!(zen4(7), Some(IbsDataSource::Io));
        assert_eq!(zen4(8), Some(IbsDataSource::ExtensionMemory));
        assert_eq!(zen4(12), Some(IbsDataSource::PeerAgentMemory));
        assert_eq!(zen4(31), Some(IbsDataSource::Reserved(31)));

        let pre = |lo: u64| IbsDataSource::decode(OpData2(lo | (3 << 6)), false);
        assert_eq!(pre(0), None);
        assert_eq!(pre(1), Some(IbsDataSource::Reserved(1)));
        assert_eq!(pre(2), Some(IbsDataSource::LocalCache));
        assert_eq!(pre(3), Some(IbsDataSource::Dram));
        assert_eq!(pre(4), Some(IbsDataSource::RemoteCache));
        assert_eq!(pre(7), Some(IbsDataSource::Io));
    }

    #[test]
    fn op_data3_fields() {
        assert_flags(
            OpData3,
            &[
                (OpData3::load as fn(OpData3) -> bool, 0),
                (OpData3::store, 1),
                (OpData3::l1_dtlb_miss, 2),
                (OpData3::l2_dtlb_miss, 3),
                (OpData3::l1_dtlb_hit_2m, 4),
                (OpData3::l1_dtlb_hit_1g, 5),
                (OpData3::l2_dtlb_hit_2m, 6),
                (OpData3::dc_miss, 7),
                (OpData3::misaligned, 8),
                (OpData3::write_combining, 13),
                (OpData3::uncacheable, 14),
                (OpData3::locked, 15),
                (OpData3::dc_miss_no_mab, 16),
                (OpData3::lin_addr_valid, 17),
                (OpData3::phys_addr_valid, 18),
                (OpData3::l2_dtlb_hit_1g, 19),
                (OpData3::l2_miss, 20),
                (OpData3::software_prefetch, 21),
            ],
        );
        assert_fields(
            OpData3,
            &[
                (|r: OpData3| r.page_size_field() as u64, 4, 2),
                (|r| r.access_width_field() as u64, 22, 4),
                (|r| r.open_mem_requests() as u64, 26, 6),
                (|r| r.dc_miss_latency() as u64, 32, 16),
                (|r| r.dtlb_refill_latency() as u64, 48, 16),
            ],
        );
        let width = |w: u64| OpData3(w << 22).access_width_bytes();
        assert_eq!(width(0), None);
        assert_eq!(width(1), Some(1));
        assert_eq!(width(2), Some(2));
        assert_eq!(width(3), Some(4));
        assert_eq!(width(4), Some(8));
        assert_eq!(width(5), Some(16));
        assert_eq!(width(7), Some(64));
        assert_eq!(width(15), Some(1 << 14));
        assert_flags(OpData4, &[(OpData4::load_resync as fn(OpData4) -> bool, 0)]);
    }

    /// A PERF_SAMPLE_RAW field: `u32 size`, `u32 caps`, registers.
    fn raw_field(caps: u32, regs: &[u64]) -> Vec<u8> {
        let size = (4 + 8 * regs.len()) as u32;
        let mut bytes = size.to_le_bytes().to_vec();
        bytes.extend_from_slice(&caps.to_le_bytes());
        for reg in regs {
            bytes.extend_from_slice(&reg.to_le_bytes());
        }
        bytes
    }

    const OP_REGS: [u64; 7] = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77];

    #[test]
    fn op_payload_without_optional_registers() {
        let field = raw_field(0, &OP_REGS);
        let sample = IbsOpSample::parse_raw_field(&field).unwrap();
        assert_eq!(sample, IbsOpSample::parse(&field[4..]).unwrap());
        assert_eq!(
            sample,
            IbsOpSample {
                caps: IbsCaps(0),
                ctl: OpCtl(0x11),
                rip: 0x22,
                data: OpData(0x33),
                data2: OpData2(0x44),
                data3: OpData3(0x55),
                dc_lin_addr: 0x66,
                dc_phys_addr: 0x77,
                branch_target: None,
                data4: None,
            }
        );
    }

    #[test]
    fn op_payload_optional_registers_follow_caps() {
        let with = |caps: u32, extra: &[u64]| {
            let regs: Vec<u64> = OP_REGS.iter().chain(extra).copied().collect();
            IbsOpSample::parse_raw_field(&raw_field(caps, &regs)).unwrap()
        };
        let target = with(1 << 5, &[0xb7]);
        assert_eq!((target.branch_target, target.data4), (Some(0xb7), None));
        let data4 = with(1 << 10, &[0xd4]);
        assert_eq!(
            (data4.branch_target, data4.data4),
            (None, Some(OpData4(0xd4)))
        );
        let both = with((1 << 5) | (1 << 10), &[0xb7, 0xd4]);
        assert_eq!(
            (both.branch_target, both.data4),
            (Some(0xb7), Some(OpData4(0xd4)))
        );
        assert_eq!(both.dc_phys_addr, 0x77);
        // A newer kernel's extra trailing register is ignored.
        let extra = with(0, &[0xee]);
        assert_eq!(
            (extra.branch_target, extra.data4, extra.dc_phys_addr),
            (None, None, 0x77)
        );
    }

    #[test]
    fn fetch_payload_with_and_without_extended_control() {
        let plain = IbsFetchSample::parse_raw_field(&raw_field(0, &[0xf1, 0xf2, 0xf3])).unwrap();
        assert_eq!(
            plain,
            IbsFetchSample {
                caps: IbsCaps(0),
                ctl: FetchCtl(0xf1),
                lin_addr: 0xf2,
                phys_addr: 0xf3,
                ext_ctl: None
            }
        );
        let extended =
            IbsFetchSample::parse_raw_field(&raw_field(1 << 9, &[0xf1, 0xf2, 0xf3, 0xe4])).unwrap();
        assert_eq!(extended.ext_ctl, Some(FetchExtCtl(0xe4)));
        assert_eq!(
            IbsFetchSample::parse_raw_field(&raw_field(1 << 9, &[0xf1, 0xf2, 0xf3])),
            Err(IbsRawError::Truncated {
                needed: 36,
                available: 28
            })
        );
    }

    #[test]
    fn truncated_and_malformed_payloads_are_errors() {
        let field = raw_field((1 << 5) | (1 << 10), &[0; 9]);
        let payload = &field[4..];
        assert!(IbsOpSample::parse(payload).is_ok());
        // Every shorter prefix fails without panicking.
        for len in 0..payload.len() {
            assert!(
                IbsOpSample::parse(&payload[..len]).is_err(),
                "prefix of {len} bytes"
            );
            assert!(
                IbsFetchSample::parse(&payload[..len.min(27)]).is_err(),
                "prefix of {len} bytes"
            );
        }
        assert_eq!(
            IbsOpSample::parse(&payload[..4 + 8 * 8]),
            Err(IbsRawError::Truncated {
                needed: 76,
                available: 68
            })
        );
        assert_eq!(
            IbsOpSample::parse(&payload[..3]),
            Err(IbsRawError::Truncated {
                needed: 4,
                available: 3
            })
        );
        assert_eq!(
            IbsOpSample::parse(&payload[..13]),
            Err(IbsRawError::Misaligned { len: 13 })
        );
        // The size word promises more than the record holds.
        assert_eq!(
            IbsOpSample::parse_raw_field(&field[..field.len() - 1]),
            Err(IbsRawError::SizeBeyondRecord {
                size: 76,
                available: 75
            })
        );
        assert_eq!(
            IbsOpSample::parse_raw_field(&[1, 0]),
            Err(IbsRawError::Truncated {
                needed: 4,
                available: 2
            })
        );
        let mut huge = field.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            IbsOpSample::parse_raw_field(&huge),
            Err(IbsRawError::SizeBeyondRecord { .. })
        ));
    }

    #[test]
    fn errors_say_what_to_do() {
        let message = IbsRawError::Truncated {
            needed: 76,
            available: 68,
        }
        .to_string();
        assert!(
            message.contains("76") && message.contains("68") && message.contains("PERF_SAMPLE_RAW"),
            "{message}"
        );
        let message = IbsRawError::Misaligned { len: 13 }.to_string();
        assert!(message.contains("ibs_op or ibs_fetch"), "{message}");
    }

    #[test]
    fn errata_by_family_and_model() {
        assert_eq!(
            IbsErrata::for_cpu(0x19, 0x01),
            IbsErrata {
                op_data2_without_mab: true,
                fetch_ic_miss: true,
                fetch_page_size_table: true,
                cache_hit_state: true
            }
        );
        assert_eq!(
            IbsErrata::for_cpu(0x19, 0x21),
            IbsErrata {
                cache_hit_state: true,
                ..IbsErrata::default()
            }
        );
        assert_eq!(IbsErrata::for_cpu(0x19, 0x61), IbsErrata::default());
        assert_eq!(IbsErrata::for_cpu(0x17, 0x01), IbsErrata::default());
        assert_eq!(IbsErrata::for_cpu(0x1a, 0x02), IbsErrata::default());
    }

    fn op(caps: u32, data: u64, data2: u64, data3: u64) -> IbsOpSample {
        IbsOpSample {
            caps: IbsCaps(caps),
            ctl: OpCtl(0),
            rip: 0x40_1000,
            data: OpData(data),
            data2: OpData2(data2),
            data3: OpData3(data3),
            dc_lin_addr: 0x7fff_0040,
            dc_phys_addr: 0x1_2340,
            branch_target: None,
            data4: None,
        }
    }

    const LOAD: u64 = 1 << 0;
    const STORE: u64 = 1 << 1;
    const DC_MISS: u64 = 1 << 7;
    const LIN_VALID: u64 = 1 << 17;
    const PHYS_VALID: u64 = 1 << 18;
    const L2_MISS: u64 = 1 << 20;
    const ZEN4: u32 = 1 << 11;

    #[test]
    fn op_sample_fields_follow_linux() {
        // A load that missed the DC and the L2, served by local DRAM in 310 cycles.
        let data = (25u64 << 16) | 7;
        let sample = op(
            0,
            data,
            3,
            LOAD | DC_MISS | L2_MISS | LIN_VALID | PHYS_VALID | (310 << 32),
        );
        let fields = sample.decode(IbsErrata::default()).sample_fields();
        assert_eq!(fields.data_addr, Some(0x7fff_0040));
        assert_eq!(fields.phys_addr, Some(0x1_2340));
        assert_eq!(fields.load_latency, Some(310));
        assert_eq!(fields.instruction_latency, Some(25));
        assert_eq!(fields.completion_to_retire, Some(7));
        assert_eq!(fields.branch, None);
        let source = fields.data_source.unwrap();
        assert_eq!(source.level_label(), "Local RAM hit");
        assert_eq!(source.op_label(), "Load");
        assert_eq!(source.tlb_label(), "L1 hit");
        assert_eq!(source.lock_label(), "N/A");

        // A store: no load latency even with the miss bit, addresses only when valid.
        let store = op(0, 0, 0, STORE | DC_MISS | (310 << 32))
            .decode(IbsErrata::default())
            .sample_fields();
        assert_eq!(
            (store.data_addr, store.phys_addr, store.load_latency),
            (None, None, None)
        );
        assert_eq!(store.data_source.unwrap().op_label(), "Store");
        assert_eq!(store.data_source.unwrap().tlb_label(), "N/A");

        // A mispredicted taken return, not touching memory.
        let branch = (1u64 << 37) | (1 << 36) | (1 << 35) | (1 << 34);
        let fields = op(0, branch, 0, 0)
            .decode(IbsErrata::default())
            .sample_fields();
        assert_eq!(
            fields.branch,
            Some(BranchOutcome {
                taken: true,
                mispredicted: true,
                is_return: true,
                fused: false
            })
        );
        assert_eq!(fields.data_source, None);
        assert_eq!(fields.data_addr, None);
    }

    #[test]
    fn op_rip_branch_target_and_load_resync() {
        let mut sample = op(1 << 7, 1 << 38, 0, 0);
        assert_eq!(sample.decode(IbsErrata::default()).rip, None);
        sample.caps = IbsCaps(0);
        assert_eq!(
            sample.decode(IbsErrata::default()).rip,
            Some(0x40_1000),
            "bit 38 is reserved without caps bit 7"
        );
        sample.branch_target = Some(0x40_2000);
        assert_eq!(
            sample.decode(IbsErrata::default()).branch_target,
            None,
            "not a branch"
        );
        sample.data = OpData(1 << 37);
        assert_eq!(
            sample.decode(IbsErrata::default()).branch_target,
            Some(0x40_2000)
        );
        assert_eq!(sample.decode(IbsErrata::default()).load_resync, None);
        sample.data4 = Some(OpData4(1));
        assert_eq!(sample.decode(IbsErrata::default()).load_resync, Some(true));
    }

    fn level_of(caps: u32, data2: u64, data3: u64) -> DataSource {
        op(caps, 0, data2, data3)
            .decode(IbsErrata::default())
            .data_source()
            .unwrap()
    }

    #[test]
    fn data_source_levels_match_the_linux_driver() {
        let missed = LOAD | DC_MISS | L2_MISS;
        assert_eq!(level_of(0, 0, LOAD).level(), MemoryLevel::L1);
        assert_eq!(level_of(0, 0, LOAD).mem_lvl, MemLevel::L1 | MemLevel::HIT);
        assert_eq!(level_of(0, 0, LOAD | DC_MISS).level_label(), "L2 hit");
        assert_eq!(
            level_of(0, 0, LOAD | (1 << 14)).level_label(),
            "Uncached hit"
        );
        // An uncacheable access to I/O is reported as I/O.
        assert_eq!(level_of(0, 7, missed | (1 << 14)).level_label(), "I/O hit");

        // Before Zen 4.
        let local_cache = level_of(0, 2, missed);
        assert_eq!(
            local_cache.mem_lvl,
            MemLevel::L3 | MemLevel::REM_CCE1 | MemLevel::HIT
        );
        assert_eq!(
            (
                local_cache.mem_lvl_num,
                local_cache.mem_remote,
                local_cache.mem_hops
            ),
            (LevelNum::ANY_CACHE, false, Hops::HOPS_0)
        );
        let remote_cache = level_of(0, 4, missed);
        assert_eq!(remote_cache.mem_lvl, MemLevel::REM_CCE2 | MemLevel::HIT);
        assert_eq!(
            (remote_cache.mem_remote, remote_cache.mem_hops),
            (true, Hops::HOPS_1)
        );
        let remote_dram = level_of(0, 3 | (1 << 4), missed);
        assert_eq!(remote_dram.mem_lvl, MemLevel::REM_RAM1 | MemLevel::HIT);
        assert_eq!(
            (
                remote_dram.mem_lvl_num,
                remote_dram.mem_remote,
                remote_dram.mem_hops
            ),
            (LevelNum::RAM, true, Hops::HOPS_1)
        );
        assert_eq!(remote_dram.level_label(), "Remote RAM hit");
        assert_eq!(level_of(0, 7, missed).mem_lvl_num, LevelNum::IO);

        // Zen 4.
        assert_eq!(level_of(ZEN4, 1, missed).level_label(), "L3 hit");
        let near = level_of(ZEN4, 2, missed);
        assert_eq!(
            (near.mem_lvl, near.mem_lvl_num),
            (MemLevel::REM_CCE1 | MemLevel::HIT, LevelNum::ANY_CACHE)
        );
        assert_eq!(near.locality_label(), "Remote core, same node");
        let far = level_of(ZEN4, 5, missed);
        assert_eq!(
            (far.mem_lvl, far.mem_hops),
            (MemLevel::REM_CCE2 | MemLevel::HIT, Hops::HOPS_1)
        );
        let pmem = level_of(ZEN4, 6 | (1 << 4), missed);
        assert_eq!(
            (pmem.mem_lvl, pmem.mem_lvl_num, pmem.mem_remote),
            (MemLevel(0), LevelNum::PMEM, true)
        );
        assert_eq!(level_of(ZEN4, 1 << 6, missed).mem_lvl_num, LevelNum::CXL);
        // Peer-agent memory is not in Linux's table: falls to the MAB check, then N/A.
        let peer = level_of(ZEN4, (1 << 6) | 4, missed);
        assert_eq!(
            (peer.mem_lvl, peer.mem_lvl_num),
            (MemLevel::NA, LevelNum::NA)
        );
        assert_eq!(peer.level_label(), "N/A");
        assert_eq!(
            level_of(ZEN4, 0, missed | (1 << 16)).level_label(),
            "LFB/MAB hit"
        );
        // Stores ignore OP_DATA2 and fall to the MAB check.
        assert_eq!(
            level_of(ZEN4, 3, STORE | DC_MISS | L2_MISS).mem_lvl,
            MemLevel::NA
        );
    }

    #[test]
    fn zen3_erratum_1293_ignores_op_data2() {
        let no_mab = LOAD | DC_MISS | (1 << 16) | (5 << 26);
        let sample = op(0, 0, 3 | (1 << 4), no_mab);
        let zen3 = IbsErrata::for_cpu(0x19, 0x01);
        let memory = sample.decode(zen3).memory.unwrap();
        assert_eq!(
            (
                memory.source,
                memory.remote_node,
                memory.l2_miss,
                memory.open_mem_requests
            ),
            (None, false, None, None)
        );
        // With L2 miss unknown and no source, the MAB is what Linux reports.
        assert_eq!(memory.data_source().level_label(), "LFB/MAB hit");

        let unaffected = sample.decode(IbsErrata::default()).memory.unwrap();
        assert_eq!(unaffected.source, Some(IbsDataSource::Dram));
        assert!(unaffected.remote_node);
        assert_eq!(
            (unaffected.l2_miss, unaffected.open_mem_requests),
            (Some(false), Some(5))
        );
        assert_eq!(unaffected.data_source().level_label(), "L2 hit");

        // Software prefetch triggers the same erratum.
        let prefetch = op(0, 0, 3, LOAD | DC_MISS | L2_MISS | (1 << 21))
            .decode(zen3)
            .memory
            .unwrap();
        assert_eq!(prefetch.source, None);
    }

    #[test]
    fn snoop_tlb_and_lock_match_the_linux_driver() {
        let missed = LOAD | DC_MISS | L2_MISS;
        // Modified line in another CCX: HitM; Owned: not reported.
        assert_eq!(level_of(ZEN4, 2, missed).snoop_label(), "HitM");
        assert_eq!(level_of(ZEN4, 2 | (1 << 5), missed).snoop_label(), "N/A");
        assert_eq!(
            level_of(ZEN4, 3, missed).snoop_label(),
            "N/A",
            "DRAM has no cache state"
        );
        assert_eq!(level_of(0, 2, missed).snoop_label(), "HitM");
        let unreliable = op(ZEN4, 0, 2, missed)
            .decode(IbsErrata::for_cpu(0x19, 0x21))
            .memory
            .unwrap();
        assert_eq!(
            (
                unreliable.cache_state,
                unreliable.data_source().snoop_label()
            ),
            (None, "N/A")
        );

        let tlb = |bits: u64| level_of(0, 0, LOAD | LIN_VALID | bits);
        assert_eq!(tlb(0).mem_dtlb, Tlb::L1 | Tlb::HIT);
        assert_eq!(tlb(1 << 2).mem_dtlb, Tlb::L2 | Tlb::HIT);
        assert_eq!(tlb((1 << 2) | (1 << 3)).mem_dtlb, Tlb::L2 | Tlb::MISS);
        assert_eq!(
            level_of(0, 0, LOAD).mem_dtlb,
            Tlb::NA,
            "no valid linear address"
        );
        // Zen 5 layout: the TLB bits also need a valid physical address.
        assert_eq!(level_of(1 << 19, 0, LOAD | LIN_VALID).mem_dtlb, Tlb::NA);
        assert_eq!(
            level_of(1 << 19, 0, LOAD | LIN_VALID | PHYS_VALID).mem_dtlb,
            Tlb::L1 | Tlb::HIT
        );

        assert_eq!(level_of(0, 0, LOAD | (1 << 15)).lock_label(), "Yes");
        assert_eq!(level_of(0, 0, LOAD).mem_lock, Lock::NA);
    }

    #[test]
    fn dtlb_page_sizes_per_layout() {
        let size = |caps: u32, bits: u64| {
            op(caps, 0, 0, LOAD | LIN_VALID | PHYS_VALID | bits)
                .decode(IbsErrata::default())
                .memory
                .unwrap()
                .page_size
        };
        let l1_miss = 1u64 << 2;
        assert_eq!(size(0, 0), Some(PageSize::Size4K));
        assert_eq!(size(0, 1 << 4), Some(PageSize::Size2M));
        assert_eq!(size(0, 1 << 5), Some(PageSize::Size1G));
        assert_eq!(size(0, (1 << 4) | (1 << 5)), None);
        assert_eq!(size(0, l1_miss), Some(PageSize::Size4K));
        assert_eq!(size(0, l1_miss | (1 << 6)), Some(PageSize::Size2M));
        assert_eq!(size(0, l1_miss | (1 << 19)), Some(PageSize::Size1G));
        // The L1 bits say nothing about an L2 hit.
        assert_eq!(size(0, l1_miss | (1 << 4)), Some(PageSize::Size4K));
        assert_eq!(size(0, l1_miss | (1 << 3)), None);
        let zen5 = 1u32 << 19;
        assert_eq!(size(zen5, 0), Some(PageSize::Size4K));
        assert_eq!(size(zen5, 1 << 4), Some(PageSize::Size2M));
        assert_eq!(size(zen5, 2 << 4), Some(PageSize::Size1G));
        assert_eq!(size(zen5, 3 << 4), None);
        assert_eq!(
            size(zen5, l1_miss | (1 << 3) | (1 << 4)),
            Some(PageSize::Size2M)
        );
    }

    #[test]
    fn fetch_decode() {
        let sample = |caps: u32, ctl: u64, ext: Option<u64>| IbsFetchSample {
            caps: IbsCaps(caps),
            ctl: FetchCtl(ctl),
            lin_addr: 0x40_1000,
            phys_addr: 0x9_1000,
            ext_ctl: ext.map(FetchExtCtl),
        };
        let none = IbsErrata::default();
        let killed = sample(0, 17 << 32, None).decode(none);
        assert_eq!(
            (
                killed.outcome,
                killed.itlb,
                killed.physical_address,
                killed.l2_miss
            ),
            (FetchOutcome::Killed, None, None, None)
        );
        assert_eq!(killed.latency, 17);

        let completed = sample(
            ZEN4,
            (1 << 50) | (1 << 52) | (1 << 58) | (1 << 60) | (1 << 53),
            Some(42),
        )
        .decode(none);
        assert_eq!(completed.outcome, FetchOutcome::Completed);
        assert_eq!(completed.physical_address, Some(0x9_1000));
        assert_eq!(completed.itlb, Some(TlbOutcome::L1Hit));
        assert_eq!(completed.page_size, Some(PageSize::Size2M));
        assert_eq!(completed.l2_miss, Some(true));
        assert_eq!(
            (completed.op_cache_miss, completed.l3_miss),
            (Some(true), Some(false))
        );
        assert_eq!(completed.ic_miss, Some(false));
        assert_eq!(completed.itlb_refill_latency, Some(42));

        let aborted = sample(0, (1 << 51) | (1 << 55) | (1 << 56) | (1 << 58), None).decode(none);
        assert_eq!(aborted.outcome, FetchOutcome::Aborted);
        assert_eq!(aborted.itlb, Some(TlbOutcome::L1L2Miss));
        assert_eq!(aborted.l2_miss, None, "L2 miss needs a completed fetch");
        assert_eq!(
            (aborted.op_cache_miss, aborted.l3_miss),
            (None, None),
            "Zen 4 bits without caps bit 11"
        );

        let zen3 = sample(0, (1 << 50) | (1 << 51) | (1 << 52) | (1 << 53), None)
            .decode(IbsErrata::for_cpu(0x19, 0));
        assert_eq!(zen3.ic_miss, None);
        assert_eq!(zen3.page_size, Some(PageSize::Size16K));
    }
}
