//! Arm SPE (Statistical Profiling Extension) records: the packets an Arm core writes for each
//! sampled operation (its PC, data addresses, latencies, events, data source, operation type,
//! context and timestamp), decoded into [`SpeRecord`]s and reduced to the [`SampleFields`] every
//! precise sample shares, so Arm's samples fill the same data-line reports and latency
//! histograms as PEBS and IBS.
//!
//! The packet grammar follows the Arm Architecture Reference Manual (chapter "Statistical
//! Profiling Extension") as Linux's perf decodes it (tools/perf/util/arm-spe-decoder); the
//! data-source encodings are the ones perf maps to `perf_mem_data_src` per CPU model.
//! [`Packet`]'s `Display` writes perf's own text for each packet (`perf report -D`), which the
//! tests compare against. Like the rest of [`crate::hw`], nothing here allocates or panics on
//! any input.

use core::fmt;

use super::data_src::{DataSource, LevelNum, MemLevel, MemOp, Snoop, SnoopX, Tlb};
use super::SampleFields;

/// One SPE packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packet {
    /// Padding (header 0x00), or an alignment request (extended header with a zero second
    /// byte) that skips to the next boundary.
    Padding,
    /// The end of a record that carries no timestamp.
    End,
    /// The end of a record, with the generic timer's count when the operation completed.
    Timestamp(u64),
    /// An address: [`AddressKind`] by `index`, the payload still holding its tag bits.
    Address { index: u8, payload: u64 },
    /// A latency in cycles: [`CounterKind`] by `index`.
    Counter { index: u8, value: u64 },
    /// CONTEXTIDR_EL1 (`index` 0) or CONTEXTIDR_EL2 (1): where Linux writes the thread id.
    Context { index: u8, id: u64 },
    /// The operation's class (`class` 0: other, 1: load/store/atomic, 2: branch or exception
    /// return) and the class's subtype bits.
    Operation { class: u8, payload: u64 },
    /// Event bits ([`SpeEvent`]).
    Events(u64),
    /// Where the data came from, in the CPU's own encoding ([`DataSourceEncoding`]).
    DataSource(u64),
}

/// Why bytes did not decode as a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketError {
    /// The buffer ends inside the packet.
    Truncated,
    /// The header byte names no packet.
    Unknown,
}

/// Address packet indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressKind {
    /// The sampled instruction's virtual address.
    Instruction,
    /// A branch's target.
    BranchTarget,
    DataVirtual,
    DataPhysical,
    /// The target of the branch before the sampled one.
    PreviousBranchTarget,
}

impl AddressKind {
    pub const fn from_index(index: u8) -> Option<AddressKind> {
        match index {
            0 => Some(AddressKind::Instruction),
            1 => Some(AddressKind::BranchTarget),
            2 => Some(AddressKind::DataVirtual),
            3 => Some(AddressKind::DataPhysical),
            4 => Some(AddressKind::PreviousBranchTarget),
            _ => None,
        }
    }
}

/// Counter packet indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterKind {
    /// Cycles from dispatch to completion.
    Total,
    /// Cycles from dispatch to issue.
    Issue,
    /// Cycles the address translation took.
    Translation,
}

impl CounterKind {
    pub const fn from_index(index: u8) -> Option<CounterKind> {
        match index {
            0 => Some(CounterKind::Total),
            1 => Some(CounterKind::Issue),
            2 => Some(CounterKind::Translation),
            _ => None,
        }
    }
}

// Header bytes and the masks that select them.
const HEADER_PAD: u8 = 0x00;
const HEADER_END: u8 = 0x01;
const HEADER_TIMESTAMP: u8 = 0x71;
const MASK_EVENTS_SOURCE: u8 = 0b1100_1111;
const HEADER_EVENTS: u8 = 0x42;
const HEADER_SOURCE: u8 = 0x43;
const MASK_CONTEXT_OPERATION: u8 = 0b1111_1100;
const HEADER_CONTEXT: u8 = 0x64;
const HEADER_OPERATION: u8 = 0x48;
const HEADER_EXTENDED: u8 = 0x20;
const MASK_ADDRESS_COUNTER: u8 = 0b1111_1000;
const HEADER_ADDRESS: u8 = 0xb0;
const HEADER_COUNTER: u8 = 0x98;
const HEADER1_ALIGNMENT: u8 = 0x00;

/// Bytes of a payload: bits 5:4 of the header give its size as a power of two.
#[inline(always)]
const fn payload_len(header: u8) -> usize {
    1 << ((header >> 4) & 0b11)
}

/// The little-endian payload of `len` bytes at `at`.
#[inline(always)]
fn payload(bytes: &[u8], at: usize, len: usize) -> Result<u64, PacketError> {
    let Some(slice) = bytes.get(at..at + len) else {
        return Err(PacketError::Truncated);
    };
    let mut value = 0u64;
    let mut i = 0;
    while i < len {
        value |= (slice[i] as u64) << (8 * i);
        i += 1;
    }
    Ok(value)
}

/// Decodes the packet at `position` of a trace buffer; returns it and its length in bytes.
/// `position` is the offset from the buffer's start, which alignment packets are relative to.
pub fn packet_at(buffer: &[u8], position: usize) -> Result<(Packet, usize), PacketError> {
    let bytes = buffer.get(position..).unwrap_or(&[]);
    let Some(&header) = bytes.first() else {
        return Err(PacketError::Truncated);
    };
    let with_payload = |packet: fn(u64) -> Packet, header_len: usize, size_from: u8| {
        let len = payload_len(size_from);
        payload(bytes, header_len, len).map(|value| (packet(value), header_len + len))
    };
    match header {
        HEADER_PAD => return Ok((Packet::Padding, 1)),
        HEADER_END => return Ok((Packet::End, 1)),
        HEADER_TIMESTAMP => return with_payload(Packet::Timestamp, 1, header),
        _ => {}
    }
    match header & MASK_EVENTS_SOURCE {
        HEADER_EVENTS => return with_payload(Packet::Events, 1, header),
        HEADER_SOURCE => return with_payload(Packet::DataSource, 1, header),
        _ => {}
    }
    let low_two = header & 0b11;
    match header & MASK_CONTEXT_OPERATION {
        HEADER_CONTEXT => {
            let value = payload(bytes, 1, payload_len(header))?;
            let packet = Packet::Context {
                index: low_two,
                id: value,
            };
            return Ok((packet, 1 + payload_len(header)));
        }
        HEADER_OPERATION => {
            let value = payload(bytes, 1, payload_len(header))?;
            let packet = Packet::Operation {
                class: low_two,
                payload: value,
            };
            return Ok((packet, 1 + payload_len(header)));
        }
        _ => {}
    }
    // Address and counter packets have a one-byte form (index in bits 2:0) and a two-byte form
    // whose first byte adds index bits 4:3.
    let (header_len, kind_byte, index) = if header & MASK_CONTEXT_OPERATION == HEADER_EXTENDED {
        let Some(&second) = bytes.get(1) else {
            return Err(PacketError::Truncated);
        };
        if second == HEADER1_ALIGNMENT {
            let alignment = 1usize << ((header & 0xf) + 1);
            if bytes.len() < alignment {
                return Err(PacketError::Truncated);
            }
            return Ok((Packet::Padding, alignment - (position & (alignment - 1))));
        }
        (2, second, (low_two << 3) | (second & 0b111))
    } else {
        (1, header, header & 0b111)
    };
    let len = payload_len(kind_byte);
    let value = payload(bytes, header_len, len)?;
    let packet = match kind_byte & MASK_ADDRESS_COUNTER {
        HEADER_ADDRESS => Packet::Address {
            index,
            payload: value,
        },
        HEADER_COUNTER => Packet::Counter { index, value },
        _ => return Err(PacketError::Unknown),
    };
    Ok((packet, header_len + len))
}

/// Address payload bits 55:0: the address without its tag byte.
const ADDRESS_BITS: u64 = (1 << 56) - 1;

/// An instruction or branch-target address packet's exception level (bits 62:61).
#[inline(always)]
const fn exception_level(payload: u64) -> u8 {
    ((payload >> 61) & 0b11) as u8
}

/// An instruction or branch-target address packet's non-secure bit (63).
#[inline(always)]
const fn non_secure(payload: u64) -> bool {
    payload >> 63 == 1
}

/// The virtual address an address packet holds, its top byte restored as perf restores it:
/// code addresses taken at EL1 or EL2 (the kernel) are upper-half addresses; a data address
/// whose bits 55:52 are all set is a kernel address; any other top byte is a tag.
pub const fn address_of(kind: AddressKind, payload: u64) -> u64 {
    let address = payload & ADDRESS_BITS;
    let upper_half = match kind {
        AddressKind::Instruction
        | AddressKind::BranchTarget
        | AddressKind::PreviousBranchTarget => {
            let el = exception_level(payload);
            non_secure(payload) && (el == 1 || el == 2)
        }
        AddressKind::DataVirtual => (address >> 52) & 0xf == 0xf,
        AddressKind::DataPhysical => false,
    };
    if upper_half {
        address | (0xff << 56)
    } else {
        address
    }
}

/// The events SPE reports, by bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpeEvent {
    ExceptionGenerated,
    Retired,
    L1dAccess,
    L1dRefill,
    TlbAccess,
    TlbWalk,
    NotTaken,
    Mispredicted,
    LlcAccess,
    LlcRefill,
    RemoteAccess,
    Misaligned,
    SvePartialPredicate,
    SveEmptyPredicate,
}

impl SpeEvent {
    pub const ALL: [SpeEvent; 14] = [
        SpeEvent::ExceptionGenerated,
        SpeEvent::Retired,
        SpeEvent::L1dAccess,
        SpeEvent::L1dRefill,
        SpeEvent::TlbAccess,
        SpeEvent::TlbWalk,
        SpeEvent::NotTaken,
        SpeEvent::Mispredicted,
        SpeEvent::LlcAccess,
        SpeEvent::LlcRefill,
        SpeEvent::RemoteAccess,
        SpeEvent::Misaligned,
        SpeEvent::SvePartialPredicate,
        SpeEvent::SveEmptyPredicate,
    ];

    /// The event's bit in the Events packet.
    pub const fn bit(self) -> u32 {
        match self {
            SpeEvent::ExceptionGenerated => 0,
            SpeEvent::Retired => 1,
            SpeEvent::L1dAccess => 2,
            SpeEvent::L1dRefill => 3,
            SpeEvent::TlbAccess => 4,
            SpeEvent::TlbWalk => 5,
            SpeEvent::NotTaken => 6,
            SpeEvent::Mispredicted => 7,
            SpeEvent::LlcAccess => 8,
            SpeEvent::LlcRefill => 9,
            SpeEvent::RemoteAccess => 10,
            SpeEvent::Misaligned => 11,
            SpeEvent::SvePartialPredicate => 17,
            SpeEvent::SveEmptyPredicate => 18,
        }
    }

    /// perf's name for the event.
    pub const fn name(self) -> &'static str {
        match self {
            SpeEvent::ExceptionGenerated => "EXCEPTION-GEN",
            SpeEvent::Retired => "RETIRED",
            SpeEvent::L1dAccess => "L1D-ACCESS",
            SpeEvent::L1dRefill => "L1D-REFILL",
            SpeEvent::TlbAccess => "TLB-ACCESS",
            SpeEvent::TlbWalk => "TLB-REFILL",
            SpeEvent::NotTaken => "NOT-TAKEN",
            SpeEvent::Mispredicted => "MISPRED",
            SpeEvent::LlcAccess => "LLC-ACCESS",
            SpeEvent::LlcRefill => "LLC-REFILL",
            SpeEvent::RemoteAccess => "REMOTE-ACCESS",
            SpeEvent::Misaligned => "ALIGNMENT",
            SpeEvent::SvePartialPredicate => "SVE-PARTIAL-PRED",
            SpeEvent::SveEmptyPredicate => "SVE-EMPTY-PRED",
        }
    }
}

/// An Events packet's bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeEvents(pub u64);

impl SpeEvents {
    pub const fn has(self, event: SpeEvent) -> bool {
        (self.0 >> event.bit()) & 1 == 1
    }
}

// Operation packet classes.
const CLASS_OTHER: u8 = 0;
const CLASS_LOAD_STORE: u8 = 1;
const CLASS_BRANCH: u8 = 2;

/// The sampled operation, from its Operation packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operation {
    pub class: u8,
    pub payload: u8,
}

impl Operation {
    pub const fn is_load_or_store(self) -> bool {
        self.class == CLASS_LOAD_STORE
    }

    pub const fn is_store(self) -> bool {
        self.is_load_or_store() && self.payload & 1 == 1
    }

    pub const fn is_load(self) -> bool {
        self.is_load_or_store() && self.payload & 1 == 0
    }

    pub const fn is_branch(self) -> bool {
        self.class == CLASS_BRANCH
    }
}

/// How a CPU model encodes the Data Source packet (its meaning is implementation defined).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataSourceEncoding {
    /// Neoverse N1, N2, V1, V2 and the Cortex cores that share their encoding.
    Common,
    AmpereOne,
    /// A CPU whose encoding is not known: the level comes from the events instead.
    #[default]
    Unknown,
}

const ARM_LTD: u32 = 0x41;
const AMPERE: u32 = 0xc0;

impl DataSourceEncoding {
    /// The encoding of the CPU with this MIDR_EL1 (implementer in bits 31:24, part number in
    /// bits 15:4), as perf lists them.
    pub const fn for_midr(midr: u64) -> DataSourceEncoding {
        let implementer = ((midr >> 24) & 0xff) as u32;
        let part = ((midr >> 4) & 0xfff) as u32;
        match (implementer, part) {
            // Neoverse N1, V1, N2, V2; Cortex-X1C, X3, A720, X925, A725.
            (ARM_LTD, 0xd0c | 0xd40 | 0xd49 | 0xd4f | 0xd4c | 0xd4e | 0xd81 | 0xd85 | 0xd87) => {
                DataSourceEncoding::Common
            }
            // AmpereOne (1A).
            (AMPERE, 0xac4) => DataSourceEncoding::AmpereOne,
            _ => DataSourceEncoding::Unknown,
        }
    }

    /// The source in the common encoding; `None` for values this encoding does not define.
    const fn common_source(self, raw: u64) -> Option<u64> {
        match self {
            DataSourceEncoding::Common => Some(raw),
            DataSourceEncoding::AmpereOne => match raw {
                0x0 => Some(COMMON_PEER_CORE),
                0x3 => Some(COMMON_SYSTEM_CACHE),
                0x5 => Some(COMMON_REMOTE),
                0x7 => Some(COMMON_DRAM),
                0x8 => Some(COMMON_L1D),
                0x9 => Some(COMMON_L2),
                _ => None,
            },
            DataSourceEncoding::Unknown => None,
        }
    }
}

// The common (Neoverse) data sources.
const COMMON_L1D: u64 = 0x0;
const COMMON_L2: u64 = 0x8;
const COMMON_PEER_CORE: u64 = 0x9;
const COMMON_LOCAL_CLUSTER: u64 = 0xa;
const COMMON_SYSTEM_CACHE: u64 = 0xb;
const COMMON_PEER_CLUSTER: u64 = 0xc;
const COMMON_REMOTE: u64 = 0xd;
const COMMON_DRAM: u64 = 0xe;

/// One sampled operation: what its packets said, up to its End or Timestamp packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeRecord {
    /// The sampled instruction's address (top byte restored) and the exception level it ran at.
    pub pc: Option<u64>,
    pub exception_level: u8,
    pub branch_target: Option<u64>,
    pub previous_branch_target: Option<u64>,
    pub data_virtual: Option<u64>,
    pub data_physical: Option<u64>,
    pub total_latency: Option<u16>,
    pub issue_latency: Option<u16>,
    pub translation_latency: Option<u16>,
    pub operation: Option<Operation>,
    pub events: SpeEvents,
    /// The raw Data Source packet.
    pub data_source: Option<u64>,
    /// The context id (Linux writes the thread id when built with CONFIG_PID_IN_CONTEXTIDR).
    pub context: Option<u64>,
    /// The generic timer's count, when the record ended with a Timestamp packet.
    pub timestamp: Option<u64>,
}

impl SpeRecord {
    fn apply(&mut self, packet: Packet) {
        match packet {
            Packet::Address { index, payload } => {
                let Some(kind) = AddressKind::from_index(index) else {
                    return;
                };
                let address = Some(address_of(kind, payload));
                match kind {
                    AddressKind::Instruction => {
                        self.pc = address;
                        self.exception_level = exception_level(payload);
                    }
                    AddressKind::BranchTarget => self.branch_target = address,
                    AddressKind::PreviousBranchTarget => self.previous_branch_target = address,
                    AddressKind::DataVirtual => self.data_virtual = address,
                    AddressKind::DataPhysical => self.data_physical = address,
                }
            }
            Packet::Counter { index, value } => {
                // Counters are 12 bits wide (16 with FEAT_SPEv1p2's larger counters).
                let cycles = Some(value as u16);
                match CounterKind::from_index(index) {
                    Some(CounterKind::Total) => self.total_latency = cycles,
                    Some(CounterKind::Issue) => self.issue_latency = cycles,
                    Some(CounterKind::Translation) => self.translation_latency = cycles,
                    None => {}
                }
            }
            Packet::Context { id, .. } => self.context = Some(id),
            Packet::Operation { class, payload } => {
                self.operation = Some(Operation {
                    class,
                    payload: payload as u8,
                })
            }
            Packet::Events(bits) => self.events = SpeEvents(bits),
            Packet::DataSource(raw) => self.data_source = Some(raw),
            Packet::Timestamp(count) => self.timestamp = Some(count),
            Packet::Padding | Packet::End => {}
        }
    }

    /// Where the data of a load or store came from, as `perf_mem_data_src`, the way perf
    /// synthesizes it: from the Data Source packet where the CPU's encoding is known, otherwise
    /// from the cache events; `None` for operations that access no memory.
    pub fn memory_source(&self, encoding: DataSourceEncoding) -> Option<DataSource> {
        let operation = self.operation.filter(|op| op.is_load_or_store())?;
        let mut source = DataSource {
            mem_op: if operation.is_store() {
                MemOp::STORE
            } else {
                MemOp::LOAD
            },
            ..DataSource::default()
        };
        let known = self
            .data_source
            .and_then(|raw| encoding.common_source(raw))
            .is_some_and(|common| {
                set_common_level(&mut source, common, operation.is_store());
                true
            });
        if !known {
            self.set_level_from_events(&mut source);
        }
        let tlb_access = self.events.has(SpeEvent::TlbAccess);
        let tlb_walk = self.events.has(SpeEvent::TlbWalk);
        if tlb_access || tlb_walk {
            source.mem_dtlb = Tlb::WK | if tlb_walk { Tlb::MISS } else { Tlb::HIT };
        }
        Some(source)
    }

    fn set_level_from_events(&self, source: &mut DataSource) {
        let events = self.events;
        let outcome = |missed: bool| {
            if missed {
                MemLevel::MISS
            } else {
                MemLevel::HIT
            }
        };
        if events.has(SpeEvent::LlcAccess) || events.has(SpeEvent::LlcRefill) {
            source.mem_lvl = MemLevel::L3 | outcome(events.has(SpeEvent::LlcRefill));
        } else if events.has(SpeEvent::L1dAccess) || events.has(SpeEvent::L1dRefill) {
            source.mem_lvl = MemLevel::L1 | outcome(events.has(SpeEvent::L1dRefill));
        }
        if events.has(SpeEvent::RemoteAccess) {
            source.mem_lvl = source.mem_lvl | MemLevel::REM_CCE1;
        }
    }

    /// What this record says in the fields every precise sample shares. Latencies are in core
    /// cycles: a load's total latency (dispatch to completion, its data access included) is its
    /// load latency, as perf weighs SPE memory samples.
    pub fn sample_fields(&self, encoding: DataSourceEncoding) -> SampleFields {
        let source = self.memory_source(encoding);
        let is_load = self.operation.is_some_and(|op| op.is_load());
        SampleFields {
            data_addr: self.data_virtual,
            phys_addr: self.data_physical,
            load_latency: self
                .total_latency
                .filter(|_| is_load)
                .map(|cycles| cycles as u64),
            instruction_latency: self.total_latency,
            retire_latency: None,
            completion_to_retire: None,
            data_source: source,
            branch: match self.operation {
                Some(op) if op.is_branch() => Some(super::BranchOutcome {
                    taken: !self.events.has(SpeEvent::NotTaken),
                    mispredicted: self.events.has(SpeEvent::Mispredicted),
                    is_return: false,
                    fused: false,
                }),
                _ => None,
            },
        }
    }
}

fn set_common_level(source: &mut DataSource, common: u64, store: bool) {
    // Neoverse cores report no level for stores.
    if store {
        source.mem_lvl = MemLevel::NA;
        source.mem_lvl_num = LevelNum::NA;
        source.mem_snoop = Snoop::NA;
        return;
    }
    let hit = |level: MemLevel| level | MemLevel::HIT;
    let none = Snoop(0);
    let peer = SnoopX::PEER;
    // (level, level number, snoop, cross-core snoop, remote) per source.
    let (level, number, snoop, snoopx, remote) = match common {
        COMMON_L1D => (
            hit(MemLevel::L1),
            LevelNum::L1,
            Snoop::NONE,
            SnoopX(0),
            false,
        ),
        COMMON_L2 => (
            hit(MemLevel::L2),
            LevelNum::L2,
            Snoop::NONE,
            SnoopX(0),
            false,
        ),
        COMMON_PEER_CORE => (hit(MemLevel::L2), LevelNum::L2, none, peer, false),
        // A cache-to-cache transfer from another core of this cluster or another cluster.
        COMMON_LOCAL_CLUSTER | COMMON_PEER_CLUSTER => {
            (hit(MemLevel::L3), LevelNum::L3, none, peer, false)
        }
        // The system cache counts as L3.
        COMMON_SYSTEM_CACHE => (
            hit(MemLevel::L3),
            LevelNum::L3,
            Snoop::HIT,
            SnoopX(0),
            false,
        ),
        // Some cache of the other socket.
        COMMON_REMOTE => (MemLevel::REM_CCE1, LevelNum::ANY_CACHE, none, peer, true),
        COMMON_DRAM => (
            hit(MemLevel::LOC_RAM),
            LevelNum::RAM,
            Snoop::NONE,
            SnoopX(0),
            false,
        ),
        _ => return,
    };
    source.mem_lvl = level;
    source.mem_lvl_num = number;
    source.mem_snoop = snoop;
    source.mem_snoopx = snoopx;
    source.mem_remote = remote;
}

/// SPE samples of one instruction (or data line) summed: how many operations, which events they
/// reported, and their latencies, for the hardware views. Counts are SPE samples, never to be
/// mixed with event-based sample counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct SpeCounters {
    pub samples: u64,
    pub loads: u64,
    pub stores: u64,
    pub branches: u64,
    /// Per [`SpeEvent`], in [`SpeEvent::ALL`]'s order.
    pub events: [u64; SpeEvent::ALL.len()],
    pub total_latency_sum: u64,
    pub total_latency_samples: u64,
    pub issue_latency_sum: u64,
    pub issue_latency_samples: u64,
    pub translation_latency_sum: u64,
    pub translation_latency_samples: u64,
}

impl SpeCounters {
    pub fn add(&mut self, record: &SpeRecord) {
        let tally = |counter: &mut u64, amount: u64| *counter = counter.saturating_add(amount);
        tally(&mut self.samples, 1);
        if let Some(op) = record.operation {
            tally(&mut self.loads, op.is_load() as u64);
            tally(&mut self.stores, op.is_store() as u64);
            tally(&mut self.branches, op.is_branch() as u64);
        }
        for (count, event) in self.events.iter_mut().zip(SpeEvent::ALL) {
            tally(count, record.events.has(event) as u64);
        }
        let latencies = [
            (
                record.total_latency,
                &mut self.total_latency_sum,
                &mut self.total_latency_samples,
            ),
            (
                record.issue_latency,
                &mut self.issue_latency_sum,
                &mut self.issue_latency_samples,
            ),
            (
                record.translation_latency,
                &mut self.translation_latency_sum,
                &mut self.translation_latency_samples,
            ),
        ];
        for (cycles, sum, samples) in latencies {
            if let Some(cycles) = cycles {
                tally(sum, cycles as u64);
                tally(samples, 1);
            }
        }
    }

    pub fn merge(&mut self, other: &SpeCounters) {
        let pairs = [
            (&mut self.samples, other.samples),
            (&mut self.loads, other.loads),
            (&mut self.stores, other.stores),
            (&mut self.branches, other.branches),
            (&mut self.total_latency_sum, other.total_latency_sum),
            (&mut self.total_latency_samples, other.total_latency_samples),
            (&mut self.issue_latency_sum, other.issue_latency_sum),
            (&mut self.issue_latency_samples, other.issue_latency_samples),
            (
                &mut self.translation_latency_sum,
                other.translation_latency_sum,
            ),
            (
                &mut self.translation_latency_samples,
                other.translation_latency_samples,
            ),
        ];
        for (counter, amount) in pairs {
            *counter = counter.saturating_add(amount);
        }
        for (counter, amount) in self.events.iter_mut().zip(other.events) {
            *counter = counter.saturating_add(amount);
        }
    }

    pub fn event(&self, event: SpeEvent) -> u64 {
        let index = SpeEvent::ALL.iter().position(|&e| e == event).unwrap_or(0);
        self.events[index]
    }

    /// `part / whole`, when `whole` is not zero.
    fn ratio(part: u64, whole: u64) -> Option<f64> {
        (whole != 0).then(|| part as f64 / whole as f64)
    }

    pub fn average_total_latency(&self) -> Option<f64> {
        Self::ratio(self.total_latency_sum, self.total_latency_samples)
    }

    pub fn average_issue_latency(&self) -> Option<f64> {
        Self::ratio(self.issue_latency_sum, self.issue_latency_samples)
    }

    pub fn average_translation_latency(&self) -> Option<f64> {
        Self::ratio(
            self.translation_latency_sum,
            self.translation_latency_samples,
        )
    }

    /// L1 data refills per L1 data access.
    pub fn l1d_miss_rate(&self) -> Option<f64> {
        Self::ratio(
            self.event(SpeEvent::L1dRefill),
            self.event(SpeEvent::L1dAccess),
        )
    }

    /// Last-level cache refills per last-level cache access.
    pub fn llc_miss_rate(&self) -> Option<f64> {
        Self::ratio(
            self.event(SpeEvent::LlcRefill),
            self.event(SpeEvent::LlcAccess),
        )
    }

    /// Table walks per TLB access.
    pub fn tlb_walk_rate(&self) -> Option<f64> {
        Self::ratio(
            self.event(SpeEvent::TlbWalk),
            self.event(SpeEvent::TlbAccess),
        )
    }

    /// Mispredicted branches per sampled branch.
    pub fn branch_mispredict_rate(&self) -> Option<f64> {
        Self::ratio(self.event(SpeEvent::Mispredicted), self.branches)
    }
}

/// What went wrong in a trace buffer: bytes skipped where no packet decoded, and the records
/// they cut short (dropped, as perf drops them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeDamage {
    pub bytes_skipped: u64,
    pub records_dropped: u64,
}

/// The records of a trace buffer in order, each with the byte range its packets took.
pub struct Records<'a> {
    buffer: &'a [u8],
    position: usize,
    pub damage: DecodeDamage,
}

impl<'a> Records<'a> {
    pub fn new(buffer: &'a [u8]) -> Records<'a> {
        Records {
            buffer,
            position: 0,
            damage: DecodeDamage::default(),
        }
    }
}

impl Iterator for Records<'_> {
    type Item = (SpeRecord, core::ops::Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        let mut record = SpeRecord::default();
        let mut start = None;
        while self.position < self.buffer.len() {
            match packet_at(self.buffer, self.position) {
                Ok((packet, len)) => {
                    let at = self.position;
                    self.position += len;
                    if packet == Packet::Padding {
                        continue;
                    }
                    start.get_or_insert(at);
                    record.apply(packet);
                    if matches!(packet, Packet::End | Packet::Timestamp(_)) {
                        return Some((record, start.unwrap_or(at)..self.position));
                    }
                }
                Err(_) => {
                    // Resynchronize a byte further on, dropping the record it was part of.
                    self.position += 1;
                    self.damage.bytes_skipped += 1;
                    if start.take().is_some() {
                        self.damage.records_dropped += 1;
                    }
                    record = SpeRecord::default();
                }
            }
        }
        // A record the buffer cut off before its end.
        if start.is_some() {
            self.damage.records_dropped += 1;
        }
        None
    }
}

impl fmt::Display for Packet {
    /// perf's text for the packet (`perf report -D`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Packet::Padding => f.write_str("PAD"),
            Packet::End => f.write_str("END"),
            Packet::Timestamp(count) => write!(f, "TS {count}"),
            Packet::DataSource(raw) => write!(f, "DATA-SOURCE {raw}"),
            Packet::Context { index, id } => write!(f, "CONTEXT 0x{id:x} el{}", index + 1),
            Packet::Events(bits) => {
                f.write_str("EV")?;
                for event in SpeEvent::ALL {
                    if SpeEvents(bits).has(event) {
                        write!(f, " {}", event.name())?;
                    }
                }
                Ok(())
            }
            Packet::Counter { index, value } => {
                write!(f, "LAT {} ", value as u16)?;
                match CounterKind::from_index(index) {
                    Some(CounterKind::Total) => f.write_str("TOT"),
                    Some(CounterKind::Issue) => f.write_str("ISSUE"),
                    Some(CounterKind::Translation) => f.write_str("XLAT"),
                    None => Ok(()),
                }
            }
            Packet::Address { index, payload } => {
                let address = payload & ADDRESS_BITS;
                let mut code = |name| {
                    write!(
                        f,
                        "{name} 0x{address:x} el{} ns={}",
                        exception_level(payload),
                        non_secure(payload) as u8
                    )
                };
                match AddressKind::from_index(index) {
                    Some(AddressKind::Instruction) => code("PC"),
                    Some(AddressKind::BranchTarget) => code("TGT"),
                    Some(AddressKind::PreviousBranchTarget) => code("PBT"),
                    Some(AddressKind::DataVirtual) => write!(f, "VA 0x{payload:x}"),
                    Some(AddressKind::DataPhysical) => write!(
                        f,
                        "PA 0x{address:x} ns={} ch={} pat={:x}",
                        non_secure(payload) as u8,
                        (payload >> 62) & 1,
                        (payload >> 56) & 0xf
                    ),
                    None => write!(f, "ADDR 0x{payload:x} ({index})"),
                }
            }
            Packet::Operation { class, payload } => describe_operation(f, class, payload),
        }
    }
}

/// perf's text for an Operation packet.
fn describe_operation(f: &mut fmt::Formatter<'_>, class: u8, payload: u64) -> fmt::Result {
    let sve_length = 32 << ((payload >> 4) & 0b111);
    match class {
        CLASS_OTHER => {
            if payload & 0b1000_1001 == 0b1000 {
                write!(f, "SVE-OTHER EVLEN {sve_length}")?;
                if payload & 0b10 != 0 {
                    f.write_str(" FP")?;
                }
                if payload & 0b100 != 0 {
                    f.write_str(" PRED")?;
                }
                Ok(())
            } else if payload & 1 != 0 {
                f.write_str("OTHER COND-SELECT")
            } else {
                f.write_str("OTHER INSN-OTHER")
            }
        }
        CLASS_LOAD_STORE => {
            f.write_str(if payload & 1 != 0 { "ST" } else { "LD" })?;
            // Atomic and exclusive accesses.
            if payload & 0b1110_0010 == 0b10 {
                for (bit, name) in [(2, " AT"), (3, " EXCL"), (4, " AR")] {
                    if payload & (1 << bit) != 0 {
                        f.write_str(name)?;
                    }
                }
            }
            let subclass = match payload & 0b1111_1110 {
                0x04 => " SIMD-FP",
                0x00 => " GP-REG",
                0x10 => " UNSPEC-REG",
                0x30 => " NV-SYSREG",
                0x14 => " MTE-TAG",
                0x20 => " MEMCPY",
                0x24 => " MEMSET",
                _ => "",
            };
            f.write_str(subclass)?;
            if payload & 0b1010 == 0b1000 {
                write!(f, " EVLEN {sve_length}")?;
                if payload & 0b100 != 0 {
                    f.write_str(" PRED")?;
                }
                if payload & 0b1000_0000 != 0 {
                    f.write_str(" SG")?;
                }
            }
            Ok(())
        }
        CLASS_BRANCH => {
            f.write_str("B")?;
            if payload & 1 != 0 {
                f.write_str(" COND")?;
            }
            if payload & 0b1111_1110 == 0b10 {
                f.write_str(" IND")?;
            }
            Ok(())
        }
        _ => write!(f, "OP-TYPE 0x{payload:x} ({class})"),
    }
}

#[cfg(test)]
mod tests;
