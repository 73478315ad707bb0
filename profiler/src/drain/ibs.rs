//! The IBS register stream: the capture program hands every AMD IBS sample's registers to the
//! agent through a ring buffer, and they are decoded here with the same profiler-common decoders
//! the perf.data import uses, then accumulated into the derived counters (CodeXL's events) and
//! data sources per instruction and data cache line. The counters are too large to accumulate
//! on the program's 512-byte stack.

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use profiler_common::{
    capture::{sample_flags, IbsRecord, RawDecoding},
    hw::{
        data_src::DataSource,
        ibs::{IbsFetchSample, IbsOpSample},
    },
};

use super::hardware::{HardwareAccumulator, HardwareKey, IbsSample, Observation};
use crate::capture::ring::KernelRing;

pub struct IbsStream {
    ring: KernelRing,
    decoding: RawDecoding,
    /// Records whose registers did not parse: counted with the program's own unreadable IBS
    /// samples.
    unreadable: u64,
}

impl IbsStream {
    pub fn new(ring: RingBuf<MapData>, decoding: RawDecoding) -> Result<IbsStream> {
        Ok(IbsStream {
            ring: KernelRing::new(ring)?,
            decoding,
            unreadable: 0,
        })
    }

    /// Waits until the program signals that the ring is filling up.
    pub async fn readable(&self) -> std::io::Result<()> {
        self.ring.readable().await
    }

    /// Decodes and accumulates the records in the ring, at most [`RECORDS_PER_READ`] at a time
    /// so that a busy ring cannot keep the agent from its other work; the records read.
    pub fn read_into(&mut self, hardware: &mut HardwareAccumulator) -> Result<usize> {
        let (decoding, unreadable) = (&self.decoding, &mut self.unreadable);
        self.ring.for_each(RECORDS_PER_READ, |record: IbsRecord| {
            if let Some((key, observation)) = observe(&record, decoding) {
                if observation.ibs.is_none() {
                    *unreadable += 1;
                }
                hardware.add(key, &observation);
            }
            Ok(())
        })
    }

    /// Reads the ring to its end, after the counters stopped.
    pub fn finish(&mut self, hardware: &mut HardwareAccumulator) -> Result<()> {
        while self.read_into(hardware)? == RECORDS_PER_READ {}
        Ok(())
    }

    pub fn unreadable(&self) -> u64 {
        self.unreadable
    }
}

/// Records read at most per [`IbsStream::read_into`]: about 2 ms of decoding.
const RECORDS_PER_READ: usize = 1 << 15;

/// Where an IBS sample was taken and what its registers say (`ibs: None` when they do not
/// parse: the data source still counts); `None` for a record of no IBS event.
pub fn observe(record: &IbsRecord, decoding: &RawDecoding) -> Option<(HardwareKey, Observation)> {
    let errata = decoding.errata();
    let ibs = if decoding.is_ibs_op(record.event) {
        IbsOpSample::parse(record.payload())
            .ok()
            .map(|registers| (registers.caps, IbsSample::Op(registers.decode(errata))))
    } else if decoding.is_ibs_fetch(record.event) {
        IbsFetchSample::parse(record.payload())
            .ok()
            .map(|registers| (registers.caps, IbsSample::Fetch(registers.decode(errata))))
    } else {
        return None;
    };
    let valid = |flag: u64| record.sample_flags & flag != 0;
    let key = HardwareKey {
        pid: record.pid,
        event: record.event,
        ip: record.ip,
        line: valid(sample_flags::ADDR).then_some(record.line),
    };
    let observation = Observation {
        data_source: valid(sample_flags::DATA_SRC).then(|| DataSource::decode(record.data_src)),
        ibs,
        spe: None,
    };
    Some((key, observation))
}

#[cfg(test)]
mod tests {
    use profiler_common::{
        capture::{IBS_PAYLOAD_MAX_BYTES, IBS_PAYLOAD_MIN_BYTES},
        hw::ibs::{
            events::{IbsFetchCounters, IbsOpCounters},
            IbsErrata,
        },
    };

    use super::*;
    use crate::profile::FrameId;

    const OP_EVENT: u32 = 0;
    const FETCH_EVENT: u32 = 1;
    const PID: u32 = 77;
    const RIP: u64 = 0x5555_0000_2010;
    /// Avail, fetch sampling, op sampling: no BR_TARGET, no OP_DATA4, no fetch extended control.
    const CAPS: u32 = 0b111;

    fn decoding() -> RawDecoding {
        // Zen 4 (family 19h model 61h) has none of the IBS errata.
        RawDecoding::new([OP_EVENT], [FETCH_EVENT], IbsErrata::for_cpu(0x19, 0x61))
    }

    /// A record as the program writes it: header fields, then the raw payload (caps, registers).
    fn record(event: u32, flags: u64, line: u64, data_src: u64, regs: &[u64]) -> IbsRecord {
        let mut payload = [0u8; IBS_PAYLOAD_MAX_BYTES];
        payload[..4].copy_from_slice(&CAPS.to_le_bytes());
        for (i, reg) in regs.iter().enumerate() {
            payload[4 + 8 * i..12 + 8 * i].copy_from_slice(&reg.to_le_bytes());
        }
        IbsRecord {
            pid: PID,
            event,
            ip: RIP,
            line,
            data_src,
            sample_flags: flags,
            payload_len: (4 + 8 * regs.len()) as u32,
            payload,
        }
    }

    // IBS_OP_DATA3 bits, per the spec.
    const LOAD: u64 = 1 << 0;
    const DC_MISS: u64 = 1 << 7;
    const LIN_VALID: u64 = 1 << 17;
    const PHYS_VALID: u64 = 1 << 18;
    const L2_MISS: u64 = 1 << 20;
    const OP_CTL_VALID: u64 = (1 << 18) | (1 << 17);

    /// An 8-byte load that missed the data cache and the L2, served by local DRAM (OP_DATA2
    /// source 3) in 310 cycles, with tag-to-retire 25 and completion-to-retire 7.
    fn missing_load(data_src: u64) -> IbsRecord {
        let flags = sample_flags::ADDR | sample_flags::DATA_SRC | sample_flags::RAW;
        record(
            OP_EVENT,
            flags,
            0x7f00_0000_1040,
            data_src,
            &[
                OP_CTL_VALID,
                RIP,
                (25 << 16) | 7,
                3,
                LOAD | DC_MISS | L2_MISS | LIN_VALID | PHYS_VALID | (4 << 22) | (310 << 32),
                0x7f00_0000_1048,
                0x1_2345_6048,
            ],
        )
    }

    #[test]
    fn op_records_accumulate_derived_counters_per_instruction_and_line() {
        let dram_load = 0x1a_0000_4142; // any perf_mem_data_src: carried through as it came
        let mut hardware = HardwareAccumulator::default();
        for _ in 0..3 {
            let (key, observation) = observe(&missing_load(dram_load), &decoding()).unwrap();
            assert_eq!(
                key,
                HardwareKey {
                    pid: PID,
                    event: OP_EVENT,
                    ip: RIP,
                    line: Some(0x7f00_0000_1040)
                }
            );
            hardware.add(key, &observation);
        }
        assert_eq!(hardware.ibs_caps(), Some(CAPS));
        let samples = hardware.finish(|_, _| 0 as FrameId);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].samples, 3);
        assert_eq!(
            samples[0].data_sources,
            vec![(DataSource::decode(dram_load).encode(), 3)]
        );
        assert_eq!(
            samples[0].ibs_op,
            Some(IbsOpCounters {
                all_samples: 3,
                tag_to_retire_total: 75,
                completion_to_retire_total: 21,
                load_store: 3,
                loads: 3,
                l1_dtlb_hit: 3,
                l1_dtlb_4k: 3,
                dc_miss: 3,
                dc_miss_loads: 3,
                dc_miss_latency_total: 930,
                // OP_DATA2 data source 3: local DRAM.
                nb_local: 3,
                nb_local_dram: 3,
                nb_local_latency_total: 930,
                ..IbsOpCounters::default()
            })
        );
    }

    #[test]
    fn fetch_records_count_fetch_events_without_a_data_line() {
        // FETCH_CTL: valid 49, completed 50, IC miss 51, physical address valid 52, latency 40.
        let ctl = (1 << 49) | (1 << 50) | (1 << 51) | (1 << 52) | (40 << 32);
        let fetch = record(
            FETCH_EVENT,
            sample_flags::RAW,
            0,
            0,
            &[ctl, RIP, 0x1_0000_2010],
        );
        let (key, observation) = observe(&fetch, &decoding()).unwrap();
        assert_eq!(key.line, None);
        assert!(observation.data_source.is_none());
        let mut hardware = HardwareAccumulator::default();
        hardware.add(key, &observation);
        let samples = hardware.finish(|_, _| 0);
        assert_eq!(samples[0].ibs_op, None);
        assert_eq!(
            samples[0].ibs_fetch,
            Some(IbsFetchCounters {
                all_samples: 1,
                attempted: 1,
                completed: 1,
                l1_itlb_hit: 1,
                ic_miss: 1,
                page_4k: 1,
                latency_total: 40,
                ..IbsFetchCounters::default()
            })
        );
    }

    #[test]
    fn short_payloads_keep_their_data_source_and_other_events_are_not_observed() {
        let mut short = missing_load(0x42);
        short.payload_len = IBS_PAYLOAD_MIN_BYTES as u32; // a fetch-sized payload for an op
        let (key, observation) = observe(&short, &decoding()).unwrap();
        assert_eq!(key.line, Some(0x7f00_0000_1040));
        assert!(observation.ibs.is_none());
        assert_eq!(observation.data_source, Some(DataSource::decode(0x42)));
        let mut other = missing_load(0);
        other.event = 5;
        assert!(observe(&other, &decoding()).is_none());
        // A length past the buffer is clamped, not trusted.
        let mut long = missing_load(0);
        long.payload_len = 4096;
        assert_eq!(long.payload().len(), IBS_PAYLOAD_MAX_BYTES);
        assert!(observe(&long, &decoding()).is_some());
    }
}
