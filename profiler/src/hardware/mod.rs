//! Hardware sampling results in the profile: aggregating what precise samplers decoded per sample
//! (the kernel's `perf_mem_data_src`, AMD IBS op and fetch registers) into
//! [`HardwareSample`]s ([`HardwareAccumulator`]), rendering them per function, instruction and
//! data cache line ([`render`]), and skid backtracking of non-precise data events
//! ([`backtrack`]).

pub mod backtrack;
pub mod render;

use std::collections::BTreeMap;

use profiler_common::hw::data_src::DataSource;
use profiler_common::hw::ibs::events::{IbsFetchCounters, IbsOpCounters};
use profiler_common::hw::ibs::{IbsCaps, IbsFetch, IbsOp};
use profiler_common::hw::spe::{SpeCounters, SpeRecord};

use crate::profile::{EventIndex, FrameId, HardwareSample, Profile};
use crate::symbolize::CodeAddress;

pub use backtrack::{backtrack_profile, BacktrackSummary};
pub use render::{hardware_json, render_hardware, HardwareView};

/// The report options of this module, for `record` and `report`.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct HardwareArgs {
    /// Attribute samples of non-precise data events (cache and TLB misses) to the memory access
    /// before the sampled instruction, walking back over the skid (x86-64 user code).
    #[arg(long)]
    pub backtrack: bool,
    /// Also show what precise samplers reported (perf mem data sources, IBS counters) by
    /// function, source line, instruction, instruction cache line or data cache line.
    #[arg(long, value_enum, value_name = "VIEW")]
    pub hardware: Option<HardwareView>,
}

impl HardwareArgs {
    /// Applies `--backtrack` to a profile about to be reported.
    pub fn prepare(&self, profile: &mut Profile) -> Option<BacktrackSummary> {
        self.backtrack.then(|| backtrack_profile(profile))
    }
}

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

    /// The instructions to symbolize.
    pub fn code_addresses(&self) -> impl Iterator<Item = CodeAddress> + '_ {
        self.entries
            .keys()
            .map(|key| CodeAddress::sampled(key.pid, key.ip))
    }

    /// The IBS capabilities word of the last IBS sample added.
    pub fn ibs_caps(&self) -> Option<u32> {
        self.ibs_caps
    }

    /// The aggregated samples, with `frame` giving the frame of a sampled instruction (as
    /// [`CodeAddress::sampled`]).
    pub fn finish(self, frame: impl Fn(CodeAddress) -> FrameId) -> Vec<HardwareSample> {
        self.entries
            .into_iter()
            .map(|(key, accumulated)| HardwareSample {
                pid: key.pid,
                event: key.event,
                frame: frame(CodeAddress::sampled(key.pid, key.ip)),
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
        assert_eq!(accumulator.code_addresses().count(), 2);
        let samples = accumulator.finish(|address| address.address as FrameId & 0xff);
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
        let samples = accumulator.finish(|_| 0);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].samples, 9);
        assert_eq!(
            samples[0].data_sources,
            vec![(0x42, 6), (DataSource::decode(0x81).encode(), 3)]
        );
        assert_eq!(samples[0].ibs_op, None);
    }

    #[test]
    fn options_parse_as_flags() {
        use clap::Parser;

        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            hardware: HardwareArgs,
        }
        let parsed = Command::try_parse_from(["report", "--backtrack", "--hardware", "data-line"])
            .unwrap()
            .hardware;
        assert_eq!(
            parsed,
            HardwareArgs {
                backtrack: true,
                hardware: Some(HardwareView::DataLine)
            }
        );
        let none = Command::try_parse_from(["report"]).unwrap().hardware;
        assert_eq!(none, HardwareArgs::default());
        let err = Command::try_parse_from(["report", "--hardware", "cache-line"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("function, line, instruction, icache-line, data-line"),
            "{err}"
        );
        let mut profile = Profile::default();
        assert_eq!(none.prepare(&mut profile), None);
        assert_eq!(
            parsed.prepare(&mut profile),
            Some(BacktrackSummary::default())
        );
    }
}
