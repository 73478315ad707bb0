//! The sample weight a precise sample carries (PERF_SAMPLE_WEIGHT or PERF_SAMPLE_WEIGHT_STRUCT):
//! one u64 that is either a single latency or three packed latencies.

use crate::capture::sample_flags;
use crate::hw::field;

/// How the kernel lays out the weight word of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// PERF_SAMPLE_WEIGHT: the whole u64 is one latency.
    Full,
    /// PERF_SAMPLE_WEIGHT_STRUCT: `u32 var1` latency, `u16 var2` instruction latency,
    /// `u16 var3` retire latency, little-endian from bit 0.
    Struct,
}

impl WeightFormat {
    /// The format of an event opened with `sample_type` (its `perf_event_attr.sample_type`), or
    /// `None` when it records no weight. Pass the attribute's bits, not
    /// `perf_sample_data.sample_flags`: drivers set both weight bits there whichever was asked for.
    /// The kernel refuses attributes that ask for both.
    #[inline(always)]
    pub const fn from_sample_type(sample_type: u64) -> Option<WeightFormat> {
        if sample_type & sample_flags::WEIGHT_STRUCT != 0 {
            Some(WeightFormat::Struct)
        } else if sample_type & sample_flags::WEIGHT != 0 {
            Some(WeightFormat::Full)
        } else {
            None
        }
    }
}

/// A decoded weight; parts the format or the CPU does not provide are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SampleWeight {
    /// Cache or load latency in cycles (var1, or the whole word in the full format).
    pub latency: u64,
    /// Instruction latency (var2; IBS puts tag-to-retire cycles here).
    pub instruction_latency: u16,
    /// Retire latency (var3).
    pub retire_latency: u16,
}

impl SampleWeight {
    #[inline(always)]
    pub const fn decode(raw: u64, format: WeightFormat) -> SampleWeight {
        match format {
            WeightFormat::Full => SampleWeight {
                latency: raw,
                instruction_latency: 0,
                retire_latency: 0,
            },
            WeightFormat::Struct => SampleWeight {
                latency: field(raw, 0, 32),
                instruction_latency: field(raw, 32, 16) as u16,
                retire_latency: field(raw, 48, 16) as u16,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_follows_the_attribute_bits() {
        assert_eq!(
            WeightFormat::from_sample_type(1 << 14),
            Some(WeightFormat::Full)
        );
        assert_eq!(
            WeightFormat::from_sample_type(1 << 24),
            Some(WeightFormat::Struct)
        );
        assert_eq!(WeightFormat::from_sample_type((1 << 3) | (1 << 15)), None);
    }

    #[test]
    fn full_weight_is_one_latency() {
        let raw = 0xdead_beef_0000_0123;
        assert_eq!(
            SampleWeight::decode(raw, WeightFormat::Full),
            SampleWeight {
                latency: raw,
                instruction_latency: 0,
                retire_latency: 0
            }
        );
    }

    #[test]
    fn struct_weight_splits_var1_var2_var3() {
        let var1 = 0xffff_fffeu64;
        let var2 = 0x1234u64;
        let var3 = 0xabcdu64;
        let weight = SampleWeight::decode(var1 | (var2 << 32) | (var3 << 48), WeightFormat::Struct);
        assert_eq!(
            weight,
            SampleWeight {
                latency: var1,
                instruction_latency: 0x1234,
                retire_latency: 0xabcd
            }
        );
        // Each part alone, at exactly its bits.
        assert_eq!(
            SampleWeight::decode(1 << 31, WeightFormat::Struct).latency,
            1 << 31
        );
        assert_eq!(
            SampleWeight::decode(1 << 32, WeightFormat::Struct).instruction_latency,
            1
        );
        assert_eq!(
            SampleWeight::decode(1 << 32, WeightFormat::Struct).latency,
            0
        );
        assert_eq!(
            SampleWeight::decode(1 << 47, WeightFormat::Struct).instruction_latency,
            1 << 15
        );
        assert_eq!(
            SampleWeight::decode(1 << 48, WeightFormat::Struct).retire_latency,
            1
        );
        assert_eq!(
            SampleWeight::decode(1 << 48, WeightFormat::Struct).instruction_latency,
            0
        );
    }
}
