//! What precise samplers reported beyond the sampled IP (the kernel's `perf_mem_data_src`, AMD
//! IBS op and fetch registers, Arm SPE records), decoded per sample and accumulated per sampled
//! instruction and data line ([`HardwareAccumulator`]) until the instructions are symbolized.
//! The drain fills it from the kernel's rings and maps, a perf.data import from its samples.

use std::collections::BTreeMap;

use profiler_common::hw::data_src::DataSource;
use profiler_common::hw::ibs::events::{IbsFetchCounters, IbsOpCounters};
use profiler_common::hw::ibs::{IbsCaps, IbsFetch, IbsOp};
use profiler_common::hw::spe::{SpeCounters, SpeRecord};

use crate::profile::{EventIndex, FrameId, HardwareSample};

/// Where a hardware sample was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HardwareKey {
    pub pid: u32,
    pub event: EventIndex,
    /// The sampled instruction.
    pub ip: u64,
    /// The 64-byte line of the sample's data address, when it had one.
    pub line: Option<u64>,
}

/// The IBS registers of one sample, decoded.
#[derive(Clone, Copy, Debug)]
pub enum IbsSample {
    Op(IbsOp),
    Fetch(IbsFetch),
}

/// What the hardware reported of one sample beyond its IP.
#[derive(Clone, Copy, Debug, Default)]
pub struct Observation {
    /// The data source the kernel reported (PEBS, or IBS decoded by its driver) or the one
    /// decoded from IBS registers.
    pub data_source: Option<DataSource>,
    /// The raw IBS sample and the capabilities word it came with.
    pub ibs: Option<(IbsCaps, IbsSample)>,
    /// The Arm SPE record.
    pub spe: Option<SpeRecord>,
}

impl Observation {
    /// Whether there is anything to aggregate.
    pub fn is_empty(&self) -> bool {
        self.data_source.is_none() && self.ibs.is_none() && self.spe.is_none()
    }
}

#[derive(Debug, Default)]
struct Accumulated {
    samples: u64,
    data_sources: BTreeMap<u64, u64>,
    ibs_op: Option<IbsOpCounters>,
    ibs_fetch: Option<IbsFetchCounters>,
    spe: Option<SpeCounters>,
}

/// Collects observations per [`HardwareKey`] until the sampled instructions are symbolized.
#[derive(Debug, Default)]
pub struct HardwareAccumulator {
    entries: BTreeMap<HardwareKey, Accumulated>,
    ibs_caps: Option<u32>,
}

impl HardwareAccumulator {
    /// Adds one sample; samples that report nothing beyond their IP are not kept.
    pub fn add(&mut self, key: HardwareKey, observation: &Observation) {
        if observation.is_empty() {
            return;
        }
        let entry = self.entries.entry(key).or_default();
        entry.samples += 1;
        if let Some(source) = observation.data_source {
            *entry.data_sources.entry(source.encode()).or_default() += 1;
        }
        match observation.ibs {
            Some((caps, IbsSample::Op(op))) => {
                self.ibs_caps = Some(caps.0);
                entry.ibs_op.get_or_insert_with(Default::default).add(&op);
            }
            Some((caps, IbsSample::Fetch(fetch))) => {
                self.ibs_caps = Some(caps.0);
                entry
                    .ibs_fetch
                    .get_or_insert_with(Default::default)
                    .add(&fetch);
            }
            None => {}
        }
        if let Some(record) = &observation.spe {
            entry.spe.get_or_insert_with(Default::default).add(record);
        }
    }

    /// Adds `samples` samples with one raw `perf_mem_data_src` value, counted in the kernel's
    /// data-source map (samples without registers to decode, and IBS samples the register ring
    /// had no room for).
    pub fn add_data_source(&mut self, key: HardwareKey, data_src: u64, samples: u64) {
        let entry = self.entries.entry(key).or_default();
        entry.samples += samples;
        *entry.data_sources.entry(data_src).or_default() += samples;
    }

    /// The sampled instructions to symbolize, as (pid, IP).
    pub fn instructions(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.entries.keys().map(|key| (key.pid, key.ip))
    }

    /// The IBS capabilities word of the last IBS sample added.
    pub fn ibs_caps(&self) -> Option<u32> {
        self.ibs_caps
    }

    /// The aggregated samples, with `frame` giving the frame of a sampled instruction (from its
    /// pid and IP, as [`HardwareAccumulator::instructions`] gives them).
    pub fn finish(self, frame: impl Fn(u32, u64) -> FrameId) -> Vec<HardwareSample> {
        self.entries
            .into_iter()
            .map(|(key, accumulated)| HardwareSample {
                pid: key.pid,
                event: key.event,
                frame: frame(key.pid, key.ip),
                line: key.line,
                samples: accumulated.samples,
                data_sources: accumulated.data_sources.into_iter().collect(),
                ibs_op: accumulated.ibs_op,
                ibs_fetch: accumulated.ibs_fetch,
                spe: accumulated.spe,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use profiler_common::hw::data_src::{MemLevel, MemOp};
    use profiler_common::hw::ibs::{IbsErrata, IbsOpSample, OpData, OpData3};

    use super::*;

    #[test]
    fn samples_aggregate_per_instruction_and_line() {
        let l1_load = DataSource {
            mem_op: MemOp::LOAD,
            mem_lvl: MemLevel::L1 | MemLevel::HIT,
            ..DataSource::NOT_AVAILABLE
        };
        let key = HardwareKey {
            pid: 7,
            event: 0,
            ip: 0x40_1000,
            line: Some(0x7f00_0040),
        };
        let op = IbsOpSample {
            data: OpData(5 << 16),
            data3: OpData3(1),
            ..IbsOpSample::default()
        }
        .decode(IbsErrata::default());
        let mut accumulator = HardwareAccumulator::default();
        accumulator.add(
            key,
            &Observation {
                data_source: Some(l1_load),
                ibs: Some((IbsCaps(0x7), IbsSample::Op(op))),
                spe: None,
            },
        );
        accumulator.add(
            key,
            &Observation {
                data_source: Some(l1_load),
                ibs: None,
                spe: None,
            },
        );
        accumulator.add(key, &Observation::default());
        accumulator.add(
            HardwareKey { line: None, ..key },
            &Observation {
                data_source: Some(DataSource::NOT_AVAILABLE),
                ibs: None,
                spe: None,
            },
        );
        assert_eq!(accumulator.ibs_caps(), Some(0x7));
        assert_eq!(accumulator.instructions().count(), 2);
        let samples = accumulator.finish(|_, ip| ip as FrameId & 0xff);
        assert_eq!(samples.len(), 2);
        let [without_line, with_line] = &samples[..] else {
            unreachable!()
        };
        assert_eq!(without_line.line, None);
        assert_eq!(without_line.samples, 1);
        assert_eq!(with_line.samples, 2);
        assert_eq!(with_line.frame, 0);
        assert_eq!(with_line.data_sources, vec![(l1_load.encode(), 2)]);
        let counters = with_line.ibs_op.unwrap();
        assert_eq!(
            (
                counters.all_samples,
                counters.loads,
                counters.tag_to_retire_total
            ),
            (1, 1, 5)
        );
        assert_eq!(with_line.ibs_fetch, None);
    }

    #[test]
    fn kernel_counted_data_sources_join_decoded_samples() {
        let key = HardwareKey {
            pid: 7,
            event: 1,
            ip: 0x40_1000,
            line: Some(0x7f00_0040),
        };
        let mut accumulator = HardwareAccumulator::default();
        accumulator.add_data_source(key, 0x42, 5);
        accumulator.add_data_source(key, 0x81, 2);
        accumulator.add_data_source(key, 0x42, 1);
        accumulator.add(
            key,
            &Observation {
                data_source: Some(DataSource::decode(0x81)),
                ibs: None,
                spe: None,
            },
        );
        let samples = accumulator.finish(|_, _| 0);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].samples, 9);
        assert_eq!(
            samples[0].data_sources,
            vec![(0x42, 6), (DataSource::decode(0x81).encode(), 3)]
        );
        assert_eq!(samples[0].ibs_op, None);
    }
}
