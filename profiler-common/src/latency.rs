//! Log-linear latency buckets, computed in the kernel per sample and merged by the agent into
//! hdrhistogram.
//!
//! Values below `2^SUB_BUCKET_BITS` get a bucket each; above, every power of two is split into
//! `2^SUB_BUCKET_BITS` equal buckets, so a bucket's width is at most 1/8 of its lower bound
//! (12.5% relative precision) over the whole u32 range with 240 buckets.

pub const SUB_BUCKET_BITS: u32 = 3;
const SUB_BUCKETS: u64 = 1 << SUB_BUCKET_BITS;
/// Buckets needed to cover every u32 latency.
pub const LATENCY_BUCKETS: usize =
    ((32 - SUB_BUCKET_BITS) * (1 << SUB_BUCKET_BITS) + (1 << SUB_BUCKET_BITS)) as usize;

/// Per-CPU histogram of one (event, instruction): counts per bucket.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyBuckets {
    pub counts: [u32; LATENCY_BUCKETS],
}

impl Default for LatencyBuckets {
    fn default() -> Self {
        LatencyBuckets {
            counts: [0; LATENCY_BUCKETS],
        }
    }
}

/// Index of the most significant set bit of a non-zero value, without branches: the BPF
/// instruction set has no count-leading-zeros, and each branch of a binary search would double
/// the paths the verifier walks through the code after it (a quarter of the capture program's
/// checked instructions). The bits below the highest are set, then counted.
#[inline(always)]
fn most_significant_bit(v: u64) -> u32 {
    let mut smeared = v;
    smeared |= smeared >> 1;
    smeared |= smeared >> 2;
    smeared |= smeared >> 4;
    smeared |= smeared >> 8;
    smeared |= smeared >> 16;
    smeared |= smeared >> 32;
    let pairs = smeared - ((smeared >> 1) & 0x5555_5555_5555_5555);
    let nibbles = (pairs & 0x3333_3333_3333_3333) + ((pairs >> 2) & 0x3333_3333_3333_3333);
    let bytes = (nibbles + (nibbles >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    let bits = (bytes.wrapping_mul(0x0101_0101_0101_0101) >> 56) as u32;
    bits - 1
}

/// Bucket of a latency; values above u32::MAX share the last bucket.
#[inline(always)]
pub fn bucket_index(latency: u64) -> usize {
    let v = if latency > u32::MAX as u64 {
        u32::MAX as u64
    } else {
        latency
    };
    if v < SUB_BUCKETS {
        return v as usize;
    }
    let shift = most_significant_bit(v) - SUB_BUCKET_BITS;
    (SUB_BUCKETS as usize) * shift as usize + (v >> shift) as usize
}

/// The latencies a bucket holds: `lowest..=highest`.
pub fn bucket_range(index: usize) -> (u64, u64) {
    let sub = SUB_BUCKETS as usize;
    if index < 2 * sub {
        return (index as u64, index as u64);
    }
    let shift = (index / sub - 1) as u32;
    let mantissa = (index % sub + sub) as u64;
    let lowest = mantissa << shift;
    (lowest, lowest + (1u64 << shift) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_u32_contiguously() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(u32::MAX as u64), LATENCY_BUCKETS - 1);
        assert_eq!(bucket_index(u64::MAX), LATENCY_BUCKETS - 1);
        let mut expected_low = 0u64;
        for index in 0..LATENCY_BUCKETS {
            let (low, high) = bucket_range(index);
            assert_eq!(
                low, expected_low,
                "bucket {index} starts where the previous ended"
            );
            assert!(high >= low);
            assert_eq!(bucket_index(low), index);
            assert_eq!(bucket_index(high), index);
            // Relative width bounded by 1/2^SUB_BUCKET_BITS of the lower bound.
            assert!((high - low) * SUB_BUCKETS <= low.max(1));
            expected_low = high + 1;
        }
        assert_eq!(expected_low, 1u64 << 32);
    }

    #[test]
    fn msb_matches_leading_zeros() {
        for v in [
            1u64,
            2,
            3,
            7,
            8,
            255,
            256,
            1 << 31,
            u32::MAX as u64,
            1 << 40,
            u64::MAX,
        ] {
            assert_eq!(most_significant_bit(v), 63 - v.leading_zeros());
        }
        for bit in 0..64 {
            let top = 1u64 << bit;
            for below in [0, 1, top >> 1, top - 1, 0x5555_5555_5555_5555] {
                let v = top | (below & (top - 1));
                assert_eq!(most_significant_bit(v), bit, "{v:#x}");
            }
        }
    }
}
