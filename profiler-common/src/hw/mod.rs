//! Decoders for what hardware samplers attach to a sample: AMD IBS registers ([`ibs`]), the
//! kernel's memory data source ([`data_src`]) and sample weight ([`weight`]), and the fields every
//! precise sample reduces to ([`SampleFields`]), so reports treat PEBS and IBS samples alike.
//!
//! The eBPF program compiles this module too: decoders use integers only, never allocate, never
//! panic on any input (byte slices are read with bounds checks), and are small `#[inline(always)]`
//! functions. Bit positions follow `shared/specs/hardware-sampling.md` (LSB = 0).

pub mod data_src;
pub mod ibs;
pub mod spe;
pub mod weight;

use data_src::DataSource;
use weight::SampleWeight;

/// Bits `shift..shift + width` of `value`. Callers pass constant positions with `width < 64`.
#[inline(always)]
pub(crate) const fn field(value: u64, shift: u32, width: u32) -> u64 {
    (value >> shift) & ((1u64 << width) - 1)
}

/// Bit `index` of `value`. Callers pass constant positions below 64.
#[inline(always)]
pub(crate) const fn bit(value: u64, index: u32) -> bool {
    (value >> index) & 1 == 1
}

/// How a sampled branch retired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BranchOutcome {
    pub taken: bool,
    pub mispredicted: bool,
    /// The branch was a return.
    pub is_return: bool,
    /// The branch was fused with the preceding instruction.
    pub fused: bool,
}

/// What one precise sample says about the instruction it hit, whichever hardware measured it.
/// A field is `None` when the hardware or the kernel did not report it for this sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleFields {
    /// Virtual address of the data the instruction accessed.
    pub data_addr: Option<u64>,
    pub phys_addr: Option<u64>,
    /// Cycles a load waited for its data: PEBS load latency (weight var1), IBS data-cache miss
    /// latency of a load that missed the data cache.
    pub load_latency: Option<u64>,
    /// Cycles from dispatch to retirement: PEBS instruction latency (weight var2), IBS
    /// tag-to-retire cycles.
    pub instruction_latency: Option<u16>,
    /// PEBS retire latency (weight var3): cycles since the previous retirement.
    pub retire_latency: Option<u16>,
    /// IBS completion-to-retire cycles: how long the finished op waited to retire.
    pub completion_to_retire: Option<u16>,
    pub data_source: Option<DataSource>,
    pub branch: Option<BranchOutcome>,
}

impl SampleFields {
    /// The 64-byte line of the data address, where the sample has one.
    pub fn data_line(&self) -> Option<u64> {
        self.data_addr
            .map(|addr| addr & !(crate::capture::CACHE_LINE_BYTES - 1))
    }

    /// The access as the data-line map keys it (`capture::ACCESS_*`), from the data source.
    pub fn access(&self) -> u32 {
        self.data_source
            .map_or(crate::capture::ACCESS_UNKNOWN, |source| {
                crate::capture::access_of_data_source(source.encode())
            })
    }

    /// The fields of a sample the kernel decoded itself (PEBS, and IBS or SPE through their
    /// drivers): PERF_SAMPLE_ADDR, PHYS_ADDR, WEIGHT(_STRUCT) and DATA_SRC, each `None` when the
    /// sample lacks it. The kernel leaves weight parts a CPU does not measure at zero, so a zero
    /// latency reads as not reported.
    #[inline(always)]
    pub const fn from_perf_sample(
        addr: Option<u64>,
        phys_addr: Option<u64>,
        weight: Option<SampleWeight>,
        data_src: Option<u64>,
    ) -> SampleFields {
        let (load_latency, instruction_latency, retire_latency) = match weight {
            Some(w) => (
                if w.latency == 0 {
                    None
                } else {
                    Some(w.latency)
                },
                if w.instruction_latency == 0 {
                    None
                } else {
                    Some(w.instruction_latency)
                },
                if w.retire_latency == 0 {
                    None
                } else {
                    Some(w.retire_latency)
                },
            ),
            None => (None, None, None),
        };
        SampleFields {
            data_addr: addr,
            phys_addr,
            load_latency,
            instruction_latency,
            retire_latency,
            completion_to_retire: None,
            data_source: match data_src {
                Some(raw) => Some(DataSource::decode(raw)),
                None => None,
            },
            branch: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::data_src::{MemLevel, MemOp};
    use crate::hw::weight::WeightFormat;

    #[test]
    fn field_and_bit_read_exact_positions() {
        assert_eq!(field(0b1011_0000, 4, 4), 0b1011);
        assert_eq!(field(u64::MAX, 32, 27), (1 << 27) - 1);
        assert!(bit(1 << 63, 63));
        assert!(!bit(1 << 63, 62));
    }

    #[test]
    fn perf_sample_fields_keep_what_the_kernel_reported() {
        // var1 = 250 cycles, var2 = 40, var3 = 0 (not measured by this CPU).
        let weight = SampleWeight::decode(250 | (40 << 32), WeightFormat::Struct);
        let load_l1_hit = 2 | ((8u64 | 2) << 5);
        let fields = SampleFields::from_perf_sample(
            Some(0x7f00_1000),
            None,
            Some(weight),
            Some(load_l1_hit),
        );
        assert_eq!(fields.data_addr, Some(0x7f00_1000));
        assert_eq!(fields.phys_addr, None);
        assert_eq!(fields.load_latency, Some(250));
        assert_eq!(fields.instruction_latency, Some(40));
        assert_eq!(fields.retire_latency, None);
        assert_eq!(fields.completion_to_retire, None);
        let source = fields.data_source.unwrap();
        assert_eq!(source.mem_op, MemOp::LOAD);
        assert_eq!(source.mem_lvl, MemLevel::L1 | MemLevel::HIT);

        let bare = SampleFields::from_perf_sample(None, None, None, None);
        assert_eq!(bare, SampleFields::default());
    }
}
