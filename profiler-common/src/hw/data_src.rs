//! `union perf_mem_data_src` (PERF_SAMPLE_DATA_SRC): where a sampled memory access was served
//! from, as the kernel reports it for PEBS and IBS samples. Decoded into typed fields named as in
//! the kernel, labelled the way `perf mem` prints them, and encoded back for synthetic records.
//!
//! Field values are kept as the raw bits (newtypes with the kernel's constants), so a value this
//! code does not name still round-trips through [`DataSource::decode`] and [`DataSource::encode`].

use crate::hw::{bit, field};

/// Declares a newtype over one `perf_mem_data_src` field with the kernel's named values.
macro_rules! data_src_field {
    ($(#[$doc:meta])* $name:ident($repr:ty) { $($(#[$value_doc:meta])* $value:ident = $bits:literal;)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub $repr);

        impl $name {
            $($(#[$value_doc])* pub const $value: $name = $name($bits);)*
        }
    };
}

/// Bit-set operations for the fields whose values are flags rather than numbers.
macro_rules! flag_ops {
    ($($name:ident),*) => {$(
        impl $name {
            /// Whether every bit of `flags` is set.
            #[inline(always)]
            pub const fn contains(self, flags: $name) -> bool {
                self.0 & flags.0 == flags.0
            }
        }

        impl core::ops::BitOr for $name {
            type Output = $name;
            #[inline(always)]
            fn bitor(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }
        }
    )*};
}

data_src_field! {
    /// `mem_op` (bits 0-4): the kind of access.
    MemOp(u8) {
        NA = 0x01;
        LOAD = 0x02;
        STORE = 0x04;
        /// Prefetch.
        PFETCH = 0x08;
        /// Code (instruction fetch).
        EXEC = 0x10;
    }
}

data_src_field! {
    /// `mem_lvl` (bits 5-18): the legacy memory-hierarchy level flags plus hit/miss.
    MemLevel(u16) {
        NA = 0x01;
        HIT = 0x02;
        MISS = 0x04;
        L1 = 0x08;
        /// Line fill buffer (Intel) or miss address buffer (AMD).
        LFB = 0x10;
        L2 = 0x20;
        L3 = 0x40;
        /// Local DRAM.
        LOC_RAM = 0x80;
        /// Remote DRAM, one hop.
        REM_RAM1 = 0x100;
        /// Remote DRAM, two hops.
        REM_RAM2 = 0x200;
        /// Remote cache, one hop.
        REM_CCE1 = 0x400;
        /// Remote cache, two hops.
        REM_CCE2 = 0x800;
        IO = 0x1000;
        /// Uncached memory.
        UNC = 0x2000;
    }
}

data_src_field! {
    /// `mem_snoop` (bits 19-23): what the coherence snoop found.
    Snoop(u8) {
        NA = 0x01;
        NONE = 0x02;
        HIT = 0x04;
        MISS = 0x08;
        /// Hit a modified line in another cache.
        HITM = 0x10;
    }
}

data_src_field! {
    /// `mem_lock` (bits 24-25).
    Lock(u8) {
        NA = 0x01;
        LOCKED = 0x02;
    }
}

data_src_field! {
    /// `mem_dtlb` (bits 26-32): the data TLB outcome.
    Tlb(u8) {
        NA = 0x01;
        HIT = 0x02;
        MISS = 0x04;
        L1 = 0x08;
        L2 = 0x10;
        /// Hardware page walker.
        WK = 0x20;
        /// OS fault handler.
        OS = 0x40;
    }
}

data_src_field! {
    /// `mem_lvl_num` (bits 33-36): the level as one number, preferred over `mem_lvl` when set.
    /// Zero means the kernel did not fill it (older kernels fill `mem_lvl` only); 7 is unassigned.
    LevelNum(u8) {
        L1 = 0x01;
        L2 = 0x02;
        L3 = 0x03;
        L4 = 0x04;
        /// L2 miss handling buffer.
        L2_MHB = 0x05;
        /// Memory-side cache.
        MSC = 0x06;
        /// Uncached.
        UNC = 0x08;
        CXL = 0x09;
        IO = 0x0a;
        /// Some cache, level unknown (AMD: the local L3 or another core's cache).
        ANY_CACHE = 0x0b;
        /// Line fill buffer / miss address buffer.
        LFB = 0x0c;
        RAM = 0x0d;
        /// Persistent memory.
        PMEM = 0x0e;
        NA = 0x0f;
    }
}

data_src_field! {
    /// `mem_snoopx` (bits 38-39): snoop outcomes added after `mem_snoop` ran out of bits.
    SnoopX(u8) {
        /// Forwarded from another core.
        FWD = 0x01;
        /// Served by a peer cache.
        PEER = 0x02;
    }
}

data_src_field! {
    /// `mem_blk` (bits 40-42): why the access was blocked.
    Block(u8) {
        NA = 0x01;
        /// Data could not be forwarded.
        DATA = 0x02;
        /// Address conflict.
        ADDR = 0x04;
    }
}

data_src_field! {
    /// `mem_hops` (bits 43-45): how far a remote access went, meaningful with `mem_remote`.
    /// The kernel numbers the hop levels 0-3 but stores them as 1-4; 0 means not reported.
    Hops(u8) {
        /// PERF_MEM_HOPS_0: another core on the same node.
        HOPS_0 = 0x01;
        /// PERF_MEM_HOPS_1: another node on the same socket.
        HOPS_1 = 0x02;
        /// PERF_MEM_HOPS_2: another socket on the same board.
        HOPS_2 = 0x03;
        /// PERF_MEM_HOPS_3: another board.
        HOPS_3 = 0x04;
    }
}

flag_ops!(MemOp, MemLevel, Snoop, Lock, Tlb, SnoopX, Block);

// Field positions (shift, width) of `union perf_mem_data_src`.
const OP: (u32, u32) = (0, 5);
const LVL: (u32, u32) = (5, 14);
const SNOOP: (u32, u32) = (19, 5);
const LOCK: (u32, u32) = (24, 2);
const DTLB: (u32, u32) = (26, 7);
const LVL_NUM: (u32, u32) = (33, 4);
const REMOTE_BIT: u32 = 37;
const SNOOPX: (u32, u32) = (38, 2);
const BLK: (u32, u32) = (40, 3);
const HOPS: (u32, u32) = (43, 3);

/// Bits 0-45: every field; 46-63 are reserved.
pub const DATA_SRC_FIELD_BITS: u64 = (1 << 46) - 1;

#[inline(always)]
const fn place(value: u64, (shift, width): (u32, u32)) -> u64 {
    (value & ((1 << width) - 1)) << shift
}

#[inline(always)]
const fn take(raw: u64, (shift, width): (u32, u32)) -> u64 {
    field(raw, shift, width)
}

/// A decoded `perf_mem_data_src`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DataSource {
    pub mem_op: MemOp,
    pub mem_lvl: MemLevel,
    pub mem_snoop: Snoop,
    pub mem_lock: Lock,
    pub mem_dtlb: Tlb,
    pub mem_lvl_num: LevelNum,
    pub mem_remote: bool,
    pub mem_snoopx: SnoopX,
    pub mem_blk: Block,
    pub mem_hops: Hops,
}

impl DataSource {
    /// The kernel's PERF_MEM_NA: every field "not available".
    pub const NOT_AVAILABLE: DataSource = DataSource {
        mem_op: MemOp::NA,
        mem_lvl: MemLevel::NA,
        mem_snoop: Snoop::NA,
        mem_lock: Lock::NA,
        mem_dtlb: Tlb::NA,
        mem_lvl_num: LevelNum(0),
        mem_remote: false,
        mem_snoopx: SnoopX(0),
        mem_blk: Block(0),
        mem_hops: Hops(0),
    };

    /// Decodes the raw union; reserved bits 46-63 are ignored.
    #[inline(always)]
    pub const fn decode(raw: u64) -> DataSource {
        DataSource {
            mem_op: MemOp(take(raw, OP) as u8),
            mem_lvl: MemLevel(take(raw, LVL) as u16),
            mem_snoop: Snoop(take(raw, SNOOP) as u8),
            mem_lock: Lock(take(raw, LOCK) as u8),
            mem_dtlb: Tlb(take(raw, DTLB) as u8),
            mem_lvl_num: LevelNum(take(raw, LVL_NUM) as u8),
            mem_remote: bit(raw, REMOTE_BIT),
            mem_snoopx: SnoopX(take(raw, SNOOPX) as u8),
            mem_blk: Block(take(raw, BLK) as u8),
            mem_hops: Hops(take(raw, HOPS) as u8),
        }
    }

    /// Encodes the raw union (for synthetic records and tests). A field value wider than its
    /// bit range keeps only the bits that fit.
    #[inline(always)]
    pub const fn encode(&self) -> u64 {
        place(self.mem_op.0 as u64, OP)
            | place(self.mem_lvl.0 as u64, LVL)
            | place(self.mem_snoop.0 as u64, SNOOP)
            | place(self.mem_lock.0 as u64, LOCK)
            | place(self.mem_dtlb.0 as u64, DTLB)
            | place(self.mem_lvl_num.0 as u64, LVL_NUM)
            | ((self.mem_remote as u64) << REMOTE_BIT)
            | place(self.mem_snoopx.0 as u64, SNOOPX)
            | place(self.mem_blk.0 as u64, BLK)
            | place(self.mem_hops.0 as u64, HOPS)
    }

    /// The level that served the access, as `perf mem` resolves it: `mem_lvl_num` when the
    /// kernel set it, otherwise the nearest level flagged in `mem_lvl` (AMD reports such as
    /// "L3 or remote cache" name their nearest level).
    pub const fn level(&self) -> MemoryLevel {
        let remote = self.mem_remote;
        match self.mem_lvl_num {
            LevelNum::L1 => return MemoryLevel::L1,
            LevelNum::L2 => return MemoryLevel::L2,
            LevelNum::L3 => return MemoryLevel::L3,
            LevelNum::L4 => return MemoryLevel::L4,
            LevelNum::L2_MHB => return MemoryLevel::L2MissHandlingBuffer,
            LevelNum::MSC => return MemoryLevel::MemorySideCache,
            LevelNum::UNC => return MemoryLevel::Uncached,
            LevelNum::CXL => return MemoryLevel::Cxl,
            LevelNum::IO => return MemoryLevel::Io,
            LevelNum::ANY_CACHE if remote => return MemoryLevel::RemoteCache,
            LevelNum::ANY_CACHE => return MemoryLevel::AnyCache,
            LevelNum::LFB => return MemoryLevel::Lfb,
            LevelNum::RAM if remote => return MemoryLevel::RemoteRam,
            LevelNum::RAM => return MemoryLevel::LocalRam,
            LevelNum::PMEM => return MemoryLevel::Pmem,
            _ => {}
        }
        let lvl = self.mem_lvl;
        if lvl.contains(MemLevel::L1) {
            MemoryLevel::L1
        } else if lvl.contains(MemLevel::LFB) {
            MemoryLevel::Lfb
        } else if lvl.contains(MemLevel::L2) {
            MemoryLevel::L2
        } else if lvl.contains(MemLevel::L3) {
            MemoryLevel::L3
        } else if lvl.contains(MemLevel::LOC_RAM) {
            MemoryLevel::LocalRam
        } else if lvl.contains(MemLevel::REM_RAM1) {
            MemoryLevel::RemoteRam1Hop
        } else if lvl.contains(MemLevel::REM_RAM2) {
            MemoryLevel::RemoteRam2Hops
        } else if lvl.contains(MemLevel::REM_CCE1) {
            MemoryLevel::RemoteCache1Hop
        } else if lvl.contains(MemLevel::REM_CCE2) {
            MemoryLevel::RemoteCache2Hops
        } else if lvl.contains(MemLevel::IO) {
            MemoryLevel::Io
        } else if lvl.contains(MemLevel::UNC) {
            MemoryLevel::Uncached
        } else {
            MemoryLevel::NotAvailable
        }
    }

    /// Whether the access hit or missed at [`DataSource::level`] (`mem_lvl` HIT / MISS).
    pub const fn level_outcome(&self) -> Option<LevelOutcome> {
        if self.mem_lvl.contains(MemLevel::HIT) {
            Some(LevelOutcome::Hit)
        } else if self.mem_lvl.contains(MemLevel::MISS) {
            Some(LevelOutcome::Miss)
        } else {
            None
        }
    }

    /// `perf mem`'s memory-level column: "L1 hit", "LFB/MAB hit", "Local RAM hit", "I/O", "N/A".
    pub const fn level_label(&self) -> &'static str {
        self.level().label(self.level_outcome())
    }

    /// Where the serving level sat relative to the accessing core (`mem_remote`, `mem_hops`).
    pub const fn locality_label(&self) -> &'static str {
        if !self.mem_remote {
            return "Local";
        }
        match self.mem_hops {
            Hops::HOPS_0 => "Remote core, same node",
            Hops::HOPS_1 => "Remote node, same socket",
            Hops::HOPS_2 => "Remote socket, same board",
            Hops::HOPS_3 => "Remote board",
            _ => "Remote",
        }
    }

    /// `perf mem`'s snoop column. When several outcomes are flagged, the one that matters most
    /// for sharing analysis wins: HitM, then a peer or forwarded line, then Hit, Miss, None.
    pub const fn snoop_label(&self) -> &'static str {
        let snoop = self.mem_snoop;
        if snoop.contains(Snoop::HITM) {
            "HitM"
        } else if self.mem_snoopx.contains(SnoopX::PEER) {
            "Peer"
        } else if self.mem_snoopx.contains(SnoopX::FWD) {
            "Fwd"
        } else if snoop.contains(Snoop::HIT) {
            "Hit"
        } else if snoop.contains(Snoop::MISS) {
            "Miss"
        } else if snoop.contains(Snoop::NONE) {
            "None"
        } else {
            "N/A"
        }
    }

    /// `perf mem`'s TLB column: "L1 or L2 hit", "Walker hit", "OS fault handler", "L2 miss", ...
    pub const fn tlb_label(&self) -> &'static str {
        let tlb = self.mem_dtlb;
        let hit = tlb.contains(Tlb::HIT);
        let miss = tlb.contains(Tlb::MISS);
        let l1 = tlb.contains(Tlb::L1);
        let l2 = tlb.contains(Tlb::L2);
        if tlb.0 == 0 || tlb.contains(Tlb::NA) {
            "N/A"
        } else if tlb.contains(Tlb::OS) {
            "OS fault handler"
        } else if tlb.contains(Tlb::WK) {
            if hit {
                "Walker hit"
            } else if miss {
                "Walker miss"
            } else {
                "Walker"
            }
        } else if hit {
            if l1 && l2 {
                "L1 or L2 hit"
            } else if l1 {
                "L1 hit"
            } else if l2 {
                "L2 hit"
            } else {
                "hit"
            }
        } else if miss {
            if l2 {
                "L2 miss"
            } else if l1 {
                "L1 miss"
            } else {
                "miss"
            }
        } else {
            "N/A"
        }
    }

    /// `perf mem`'s lock column.
    pub const fn lock_label(&self) -> &'static str {
        if self.mem_lock.0 == 0 || self.mem_lock.contains(Lock::NA) {
            "N/A"
        } else if self.mem_lock.contains(Lock::LOCKED) {
            "Yes"
        } else {
            "No"
        }
    }

    /// `perf mem`'s blocked column.
    pub const fn block_label(&self) -> &'static str {
        let data = self.mem_blk.contains(Block::DATA);
        let addr = self.mem_blk.contains(Block::ADDR);
        if self.mem_blk.contains(Block::NA) {
            "N/A"
        } else if data && addr {
            "Data, Addr"
        } else if data {
            "Data"
        } else if addr {
            "Addr"
        } else {
            "N/A"
        }
    }

    /// The access kind: "Load", "Store", "Prefetch", "Exec" or "N/A".
    pub const fn op_label(&self) -> &'static str {
        let op = self.mem_op;
        if op.contains(MemOp::NA) {
            "N/A"
        } else if op.contains(MemOp::LOAD) {
            "Load"
        } else if op.contains(MemOp::STORE) {
            "Store"
        } else if op.contains(MemOp::PFETCH) {
            "Prefetch"
        } else if op.contains(MemOp::EXEC) {
            "Exec"
        } else {
            "N/A"
        }
    }
}

/// Hit or miss at the reported level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LevelOutcome {
    Hit,
    Miss,
}

/// Declares [`MemoryLevel`] with its name and its "<name> hit" / "<name> miss" labels.
macro_rules! memory_levels {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// The level that served an access, one per `perf mem` memory-level name.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum MemoryLevel {
            $($(#[$doc])* $variant,)*
            NotAvailable,
        }

        impl MemoryLevel {
            pub const fn name(self) -> &'static str {
                match self {
                    $(MemoryLevel::$variant => $name,)*
                    MemoryLevel::NotAvailable => "N/A",
                }
            }

            /// The name followed by the outcome, as one static label.
            pub const fn label(self, outcome: Option<LevelOutcome>) -> &'static str {
                match (self, outcome) {
                    $(
                        (MemoryLevel::$variant, Some(LevelOutcome::Hit)) => concat!($name, " hit"),
                        (MemoryLevel::$variant, Some(LevelOutcome::Miss)) => concat!($name, " miss"),
                        (MemoryLevel::$variant, None) => $name,
                    )*
                    (MemoryLevel::NotAvailable, _) => "N/A",
                }
            }
        }
    };
}

memory_levels! {
    L1 => "L1",
    /// Line fill buffer (Intel) or miss address buffer (AMD): the line was already on its way.
    Lfb => "LFB/MAB",
    L2 => "L2",
    L3 => "L3",
    L4 => "L4",
    L2MissHandlingBuffer => "L2 MHB",
    MemorySideCache => "Memory-side cache",
    /// A cache whose level the hardware does not say, on the local node.
    AnyCache => "Any cache",
    /// A cache elsewhere; [`DataSource::locality_label`] says how far.
    RemoteCache => "Remote cache",
    LocalRam => "Local RAM",
    /// DRAM elsewhere; [`DataSource::locality_label`] says how far.
    RemoteRam => "Remote RAM",
    RemoteRam1Hop => "Remote RAM (1 hop)",
    RemoteRam2Hops => "Remote RAM (2 hops)",
    RemoteCache1Hop => "Remote Cache (1 hop)",
    RemoteCache2Hops => "Remote Cache (2 hops)",
    Pmem => "PMEM",
    Cxl => "CXL",
    Io => "I/O",
    Uncached => "Uncached",
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random u64s (xorshift64*), enough to sweep every bit pattern class.
    fn pseudo_random(count: usize) -> impl Iterator<Item = u64> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        (0..count).map(move |_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        })
    }

    #[test]
    fn each_field_reads_exactly_its_bits() {
        // (shift, width, reader) per the spec's bit ranges.
        type Reader = fn(&DataSource) -> u64;
        let fields: [(u32, u32, Reader); 10] = [
            (0, 5, |d| d.mem_op.0 as u64),
            (5, 14, |d| d.mem_lvl.0 as u64),
            (19, 5, |d| d.mem_snoop.0 as u64),
            (24, 2, |d| d.mem_lock.0 as u64),
            (26, 7, |d| d.mem_dtlb.0 as u64),
            (33, 4, |d| d.mem_lvl_num.0 as u64),
            (37, 1, |d| d.mem_remote as u64),
            (38, 2, |d| d.mem_snoopx.0 as u64),
            (40, 3, |d| d.mem_blk.0 as u64),
            (43, 3, |d| d.mem_hops.0 as u64),
        ];
        for (shift, width, read) in fields {
            let ones = (1u64 << width) - 1;
            let decoded = DataSource::decode(ones << shift);
            assert_eq!(read(&decoded), ones, "field at bit {shift}");
            // Exactly this field is non-zero.
            for (other_shift, _, other_read) in fields {
                if other_shift != shift {
                    assert_eq!(
                        other_read(&decoded),
                        0,
                        "field at {other_shift} set by bits of {shift}"
                    );
                }
            }
            // The bits just outside the range belong to someone else.
            let outside = if shift == 0 {
                1u64 << width
            } else {
                (1u64 << (shift - 1)) | (1u64 << (shift + width))
            };
            assert_eq!(
                read(&DataSource::decode(outside)),
                0,
                "field at bit {shift}"
            );
        }
        // Reserved bits 46-63 decode to nothing.
        assert_eq!(
            DataSource::decode(!DATA_SRC_FIELD_BITS),
            DataSource::default()
        );
    }

    #[test]
    fn named_values_sit_at_the_spec_positions() {
        assert_eq!(DataSource::decode(2).mem_op, MemOp::LOAD);
        assert_eq!(DataSource::decode(16).mem_op, MemOp::EXEC);
        assert_eq!(DataSource::decode(8192 << 5).mem_lvl, MemLevel::UNC);
        assert_eq!(DataSource::decode(1024 << 5).mem_lvl, MemLevel::REM_CCE1);
        assert_eq!(DataSource::decode(16 << 19).mem_snoop, Snoop::HITM);
        assert_eq!(DataSource::decode(2 << 24).mem_lock, Lock::LOCKED);
        assert_eq!(DataSource::decode(64 << 26).mem_dtlb, Tlb::OS);
        assert_eq!(DataSource::decode(13 << 33).mem_lvl_num, LevelNum::RAM);
        assert_eq!(DataSource::decode(15 << 33).mem_lvl_num, LevelNum::NA);
        assert!(DataSource::decode(1 << 37).mem_remote);
        assert_eq!(DataSource::decode(2 << 38).mem_snoopx, SnoopX::PEER);
        assert_eq!(DataSource::decode(4 << 40).mem_blk, Block::ADDR);
        assert_eq!(DataSource::decode(4 << 43).mem_hops, Hops::HOPS_3);
    }

    #[test]
    fn encode_decode_round_trip() {
        for raw in pseudo_random(20_000).chain([0, u64::MAX, DATA_SRC_FIELD_BITS]) {
            let decoded = DataSource::decode(raw);
            assert_eq!(decoded.encode(), raw & DATA_SRC_FIELD_BITS, "raw {raw:#x}");
            assert_eq!(DataSource::decode(decoded.encode()), decoded);
        }
        assert_eq!(
            DataSource::NOT_AVAILABLE.encode(),
            1 | (1 << 5) | (1 << 19) | (1 << 24) | (1 << 26)
        );
        // Out-of-range values keep only the bits that fit.
        let wide = DataSource {
            mem_op: MemOp(0xff),
            ..DataSource::default()
        };
        assert_eq!(wide.encode(), 0x1f);
    }

    fn source(build: impl FnOnce(&mut DataSource)) -> DataSource {
        let mut ds = DataSource::default();
        build(&mut ds);
        DataSource::decode(ds.encode())
    }

    #[test]
    fn level_labels_follow_perf_mem() {
        let hit = |lvl: MemLevel| source(|d| d.mem_lvl = lvl | MemLevel::HIT);
        assert_eq!(hit(MemLevel::L1).level_label(), "L1 hit");
        assert_eq!(hit(MemLevel::LFB).level_label(), "LFB/MAB hit");
        assert_eq!(hit(MemLevel::L2).level_label(), "L2 hit");
        assert_eq!(hit(MemLevel::L3).level_label(), "L3 hit");
        assert_eq!(hit(MemLevel::LOC_RAM).level_label(), "Local RAM hit");
        assert_eq!(
            hit(MemLevel::REM_RAM1).level_label(),
            "Remote RAM (1 hop) hit"
        );
        assert_eq!(
            hit(MemLevel::REM_RAM2).level_label(),
            "Remote RAM (2 hops) hit"
        );
        assert_eq!(
            hit(MemLevel::REM_CCE1).level_label(),
            "Remote Cache (1 hop) hit"
        );
        assert_eq!(
            hit(MemLevel::REM_CCE2).level_label(),
            "Remote Cache (2 hops) hit"
        );
        // AMD pre-Zen4 "L3 or remote cache" names its nearest level.
        assert_eq!(
            hit(MemLevel::L3 | MemLevel::REM_CCE1).level_label(),
            "L3 hit"
        );
        assert_eq!(source(|d| d.mem_lvl = MemLevel::IO).level_label(), "I/O");
        assert_eq!(hit(MemLevel::UNC).level_label(), "Uncached hit");
        assert_eq!(
            source(|d| d.mem_lvl = MemLevel::L3 | MemLevel::MISS).level_label(),
            "L3 miss"
        );
        assert_eq!(source(|d| d.mem_lvl = MemLevel::NA).level_label(), "N/A");
        assert_eq!(DataSource::NOT_AVAILABLE.level_label(), "N/A");

        // mem_lvl_num wins over mem_lvl, with mem_remote distinguishing local from remote.
        let ram = |remote| {
            source(|d| {
                d.mem_lvl = MemLevel::REM_RAM1 | MemLevel::HIT;
                d.mem_lvl_num = LevelNum::RAM;
                d.mem_remote = remote;
                d.mem_hops = Hops::HOPS_1;
            })
        };
        assert_eq!(ram(true).level_label(), "Remote RAM hit");
        assert_eq!(ram(true).locality_label(), "Remote node, same socket");
        assert_eq!(ram(false).level_label(), "Local RAM hit");
        assert_eq!(ram(false).locality_label(), "Local");
        let any_cache = source(|d| {
            d.mem_lvl_num = LevelNum::ANY_CACHE;
            d.mem_remote = true;
            d.mem_hops = Hops::HOPS_0;
        });
        assert_eq!(any_cache.level_label(), "Remote cache");
        assert_eq!(any_cache.locality_label(), "Remote core, same node");
        assert_eq!(
            source(|d| d.mem_lvl_num = LevelNum::PMEM).level_label(),
            "PMEM"
        );
        assert_eq!(
            source(|d| d.mem_lvl_num = LevelNum::CXL).level_label(),
            "CXL"
        );
        assert_eq!(
            source(|d| d.mem_lvl_num = LevelNum::L2_MHB).level(),
            MemoryLevel::L2MissHandlingBuffer
        );
        // NA and the unassigned 7 fall back to mem_lvl.
        let fallback = source(|d| {
            d.mem_lvl_num = LevelNum::NA;
            d.mem_lvl = MemLevel::L2 | MemLevel::HIT;
        });
        assert_eq!(fallback.level_label(), "L2 hit");
        assert_eq!(
            source(|d| d.mem_lvl_num = LevelNum(7)).level(),
            MemoryLevel::NotAvailable
        );
    }

    #[test]
    fn snoop_tlb_lock_block_hops_and_op_labels() {
        assert_eq!(source(|d| d.mem_snoop = Snoop::NONE).snoop_label(), "None");
        assert_eq!(source(|d| d.mem_snoop = Snoop::HIT).snoop_label(), "Hit");
        assert_eq!(source(|d| d.mem_snoop = Snoop::MISS).snoop_label(), "Miss");
        assert_eq!(
            source(|d| d.mem_snoop = Snoop::HIT | Snoop::HITM).snoop_label(),
            "HitM"
        );
        assert_eq!(source(|d| d.mem_snoopx = SnoopX::FWD).snoop_label(), "Fwd");
        assert_eq!(
            source(|d| d.mem_snoopx = SnoopX::PEER).snoop_label(),
            "Peer"
        );
        assert_eq!(source(|d| d.mem_snoop = Snoop::NA).snoop_label(), "N/A");

        assert_eq!(
            source(|d| d.mem_dtlb = Tlb::HIT | Tlb::L1 | Tlb::L2).tlb_label(),
            "L1 or L2 hit"
        );
        assert_eq!(
            source(|d| d.mem_dtlb = Tlb::HIT | Tlb::L1).tlb_label(),
            "L1 hit"
        );
        assert_eq!(
            source(|d| d.mem_dtlb = Tlb::HIT | Tlb::L2).tlb_label(),
            "L2 hit"
        );
        assert_eq!(
            source(|d| d.mem_dtlb = Tlb::MISS | Tlb::L2).tlb_label(),
            "L2 miss"
        );
        assert_eq!(source(|d| d.mem_dtlb = Tlb::MISS).tlb_label(), "miss");
        assert_eq!(
            source(|d| d.mem_dtlb = Tlb::HIT | Tlb::WK).tlb_label(),
            "Walker hit"
        );
        assert_eq!(
            source(|d| d.mem_dtlb = Tlb::OS).tlb_label(),
            "OS fault handler"
        );
        assert_eq!(source(|d| d.mem_dtlb = Tlb::NA).tlb_label(), "N/A");

        assert_eq!(source(|d| d.mem_lock = Lock::LOCKED).lock_label(), "Yes");
        assert_eq!(source(|d| d.mem_lock = Lock::NA).lock_label(), "N/A");
        assert_eq!(source(|d| d.mem_lock = Lock(0)).lock_label(), "N/A");

        assert_eq!(source(|d| d.mem_blk = Block::DATA).block_label(), "Data");
        assert_eq!(
            source(|d| d.mem_blk = Block::DATA | Block::ADDR).block_label(),
            "Data, Addr"
        );
        assert_eq!(source(|d| d.mem_blk = Block::NA).block_label(), "N/A");

        let remote = |hops| {
            source(|d| {
                d.mem_remote = true;
                d.mem_hops = hops;
            })
        };
        assert_eq!(
            remote(Hops::HOPS_2).locality_label(),
            "Remote socket, same board"
        );
        assert_eq!(remote(Hops::HOPS_3).locality_label(), "Remote board");
        assert_eq!(remote(Hops(0)).locality_label(), "Remote");

        assert_eq!(source(|d| d.mem_op = MemOp::LOAD).op_label(), "Load");
        assert_eq!(source(|d| d.mem_op = MemOp::STORE).op_label(), "Store");
        assert_eq!(source(|d| d.mem_op = MemOp::PFETCH).op_label(), "Prefetch");
        assert_eq!(source(|d| d.mem_op = MemOp::EXEC).op_label(), "Exec");
        assert_eq!(DataSource::NOT_AVAILABLE.op_label(), "N/A");
    }
}
