//! Published SPE vectors: google/perf_data_converter's `arm_spe_decoder_test.cc` (records) and
//! Arm's telemetry-solution `spe_parser` unit tests (packets in perf's text), byte for byte.

extern crate std;

use std::string::{String, ToString};
use std::vec::Vec;

use super::*;

fn bytes(hex: &str) -> Vec<u8> {
    let digits: String = hex.split_whitespace().collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

/// perf's text of every packet but padding, in order.
fn packet_texts(hex: &str) -> Vec<String> {
    let buffer = bytes(hex);
    let mut position = 0;
    let mut texts = Vec::new();
    while position < buffer.len() {
        let (packet, len) = packet_at(&buffer, position).unwrap();
        if packet != Packet::Padding {
            texts.push(packet.to_string());
        }
        position += len;
    }
    texts
}

/// perf_data_converter's `CorrectlyParseRecords` trace: two kernel-mode records, each ended by a
/// timestamp, with padding runs of 2 to 16 bytes between packets.
const QUIPPER_TRACE: &str = "
    b0 d0 c2 a1 ed 66 ba ff c0  00 00 00 00 00  65 80 5f 00 00  49 00  52 16 00  99 04 00
    98 0c 00  b2 28 6b 09 03 37 0e ff 00  9a 01 00  00 00 00 00 00 00 00 00 00  43 00  00 00
    71 2e 65 2f 6a 0a 00 00 00
    b0 e0 b0 ef ed 66 ba ff c0  00 00 00 00 00  65 0e 00 00 00  4a 01  52 42 00  99 10 00
    98 11 00  b1 e4 b0 ef ed 66 ba ff c0
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00  71 8d 65 2f 6a 0a 00 00 00";

#[test]
fn perf_data_converter_records_decode_as_published() {
    let trace = bytes(QUIPPER_TRACE);
    let mut records = Records::new(&trace);
    let (load, _) = records.next().unwrap();
    assert_eq!(
        load,
        SpeRecord {
            pc: Some(0xffff_ba66_eda1_c2d0),
            exception_level: 2,
            data_virtual: Some(0xffff_0e37_0309_6b28),
            total_latency: Some(12),
            issue_latency: Some(4),
            translation_latency: Some(1),
            operation: Some(Operation {
                class: 1,
                payload: 0
            }),
            events: SpeEvents((1 << 1) | (1 << 2) | (1 << 4)),
            data_source: Some(0),
            context: Some(0x5f80),
            timestamp: Some(44_731_163_950),
            ..SpeRecord::default()
        }
    );
    assert!(load.events.has(SpeEvent::Retired));
    assert!(load.events.has(SpeEvent::L1dAccess));
    assert!(load.events.has(SpeEvent::TlbAccess));
    assert!(!load.events.has(SpeEvent::L1dRefill));
    let (branch, range) = records.next().unwrap();
    assert_eq!(
        branch,
        SpeRecord {
            pc: Some(0xffff_ba66_edef_b0e0),
            exception_level: 2,
            branch_target: Some(0xffff_ba66_edef_b0e4),
            total_latency: Some(17),
            issue_latency: Some(16),
            operation: Some(Operation {
                class: 2,
                payload: 1
            }),
            events: SpeEvents((1 << 1) | (1 << 6)),
            context: Some(0xe),
            timestamp: Some(44_731_164_045),
            ..SpeRecord::default()
        }
    );
    assert_eq!(range.end, trace.len());
    assert!(records.next().is_none());
    assert_eq!(records.damage, DecodeDamage::default());
}

#[test]
fn perf_data_converter_invalid_data_yields_no_record() {
    let trace = bytes("ab cd ef ff 99 88 77 66 55 44");
    let mut records = Records::new(&trace);
    assert!(records.next().is_none());
    assert!(records.damage.bytes_skipped > 0);
    assert_eq!(packet_at(&trace, 0), Err(PacketError::Unknown));
}

#[test]
fn telemetry_solution_packets_print_as_perf_prints_them() {
    let cases = [
        ("b0 5c 8b 8c 86 c2 c0 ff c0", "PC 0xffc0c2868c8b5c el2 ns=1"),
        (
            "b3 e8 09 8a d8 0b 08 00 80",
            "PA 0x80bd88a09e8 ns=1 ch=0 pat=0",
        ),
        ("b2 c0 26 c2 07 20 fc ff 00", "VA 0xfffc2007c226c0"),
        (
            "b1 e0 89 8c 86 c2 c0 ff c0",
            "TGT 0xffc0c2868c89e0 el2 ns=1",
        ),
        ("99 07 00", "LAT 7 ISSUE"),
        ("98 0b 00", "LAT 11 TOT"),
        ("9a 01 00", "LAT 1 XLAT"),
        ("01", "END"),
        ("71 6c f8 a5 83 00 0c 00 00", "TS 13196348225644"),
        ("49 00", "LD GP-REG"),
        ("4a 01", "B COND"),
        ("49 01", "ST GP-REG"),
        ("4a 02", "B IND"),
        ("49 16", "LD AT AR"),
        ("49 05", "ST SIMD-FP"),
        ("43 00", "DATA-SOURCE 0"),
        ("52 16 00", "EV RETIRED L1D-ACCESS TLB-ACCESS"),
        ("52 02 00", "EV RETIRED"),
        ("52 42 00", "EV RETIRED NOT-TAKEN"),
        (
            "52 1e 03",
            "EV RETIRED L1D-ACCESS L1D-REFILL TLB-ACCESS LLC-ACCESS LLC-REFILL",
        ),
    ];
    for (hex, expected) in cases {
        assert_eq!(packet_texts(hex)[0], expected, "{hex}");
    }
}

#[test]
fn telemetry_solution_frames_decode_packet_by_packet() {
    let frame =
        "71 af f9 04 81 00 0c 00 00 b0 00 b6 a9 e4 aa aa 00 80 49 00 52 16 00 99 04 00 98 08
        00 b2 43 da 5d e6 aa aa 00 00 9a 01 00 b3 43 5a 95 2c 03 08 00 80 43 00";
    assert_eq!(
        packet_texts(frame),
        [
            "TS 13196304120239",
            "PC 0xaaaae4a9b600 el0 ns=1",
            "LD GP-REG",
            "EV RETIRED L1D-ACCESS TLB-ACCESS",
            "LAT 4 ISSUE",
            "LAT 8 TOT",
            "VA 0xaaaae65dda43",
            "LAT 1 XLAT",
            "PA 0x8032c955a43 ns=1 ch=0 pat=0",
            "DATA-SOURCE 0",
        ]
    );
    // Recorded with `ts=0` (ends with END) and `ts=1` (ends with a timestamp).
    let ends_with_end =
        "b0 e0 43 21 bf fd 7f 00 80 00 00 00 00 00 00 00 00 00 00 4a 01 52 02 00 99 27 00
        98 28 00 b1 08 44 21 bf fd 7f 00 80 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
        00 00 00 00 00 00 00 01";
    let ends_with_timestamp = "b0 e0 43 21 bf fd 7f 00 80 00 00 00 00 00 00 00 00 00 00 4a 01 52 02
        00 99 29 00 98 2a 00 b1 08 44 21 bf fd 7f 00 80 00 00 00 00 00 00 00 00 00 00 00 00 00 00
        00 00 71 6b 72 5a 1d 8f 03 00 00";
    let common = |issue: u16, total: u16| {
        [
            "PC 0x7ffdbf2143e0 el0 ns=1".to_string(),
            "B COND".to_string(),
            "EV RETIRED".to_string(),
            std::format!("LAT {issue} ISSUE"),
            std::format!("LAT {total} TOT"),
            "TGT 0x7ffdbf214408 el0 ns=1".to_string(),
        ]
    };
    let mut expected = common(39, 40).to_vec();
    expected.push("END".to_string());
    assert_eq!(packet_texts(ends_with_end), expected);
    let mut expected = common(41, 42).to_vec();
    expected.push("TS 3913207673451".to_string());
    assert_eq!(packet_texts(ends_with_timestamp), expected);

    // The same records as spe_parser's CSV rows: a user-space conditional branch.
    for (hex, issue, total, timestamp) in [
        (ends_with_end, 39, 40, None),
        (ends_with_timestamp, 41, 42, Some(3_913_207_673_451)),
    ] {
        let trace = bytes(hex);
        let records: Vec<_> = Records::new(&trace).map(|(record, _)| record).collect();
        assert_eq!(records.len(), 1);
        let record = records[0];
        assert_eq!(record.pc, Some(0x7ffd_bf21_43e0));
        assert_eq!(record.exception_level, 0);
        assert_eq!(record.branch_target, Some(0x7ffd_bf21_4408));
        assert_eq!(record.issue_latency, Some(issue));
        assert_eq!(record.total_latency, Some(total));
        assert_eq!(record.timestamp, timestamp);
        let fields = record.sample_fields(DataSourceEncoding::Unknown);
        let branch = fields.branch.unwrap();
        assert!(branch.taken && !branch.mispredicted);
        assert_eq!(fields.data_source, None);
    }
}

/// telemetry-solution's `test_payload.py` load with data source 13 on a Neoverse core: a remote
/// access, its events saying it also missed L1D and the LLC.
#[test]
fn common_data_sources_map_as_perf_maps_them() {
    let neoverse_n1 = DataSourceEncoding::for_midr(0x4100_0000 | (0xd0c << 4));
    assert_eq!(neoverse_n1, DataSourceEncoding::Common);
    let load = |source: u64, events: &[SpeEvent]| SpeRecord {
        operation: Some(Operation {
            class: 1,
            payload: 0,
        }),
        data_source: Some(source),
        events: SpeEvents(events.iter().map(|e| 1 << e.bit()).sum()),
        total_latency: Some(1028),
        ..SpeRecord::default()
    };
    let remote = load(
        13,
        &[
            SpeEvent::Retired,
            SpeEvent::L1dAccess,
            SpeEvent::L1dRefill,
            SpeEvent::TlbAccess,
            SpeEvent::LlcAccess,
            SpeEvent::LlcRefill,
            SpeEvent::RemoteAccess,
        ],
    );
    let source = remote.memory_source(neoverse_n1).unwrap();
    assert_eq!(source.mem_op, MemOp::LOAD);
    assert_eq!(source.mem_lvl, MemLevel::REM_CCE1);
    assert_eq!(source.mem_lvl_num, LevelNum::ANY_CACHE);
    assert!(source.mem_remote);
    assert_eq!(source.mem_snoopx, SnoopX::PEER);
    assert_eq!(source.mem_dtlb, Tlb::WK | Tlb::HIT);
    assert_eq!(remote.sample_fields(neoverse_n1).load_latency, Some(1028));

    let l1 = load(0, &[SpeEvent::L1dAccess]).memory_source(neoverse_n1);
    assert_eq!(l1.unwrap().mem_lvl, MemLevel::L1 | MemLevel::HIT);
    let dram = load(14, &[]).memory_source(neoverse_n1).unwrap();
    assert_eq!(dram.mem_lvl_num, LevelNum::RAM);
    // AmpereOne's DDR (7) is the common DRAM.
    let ampere = DataSourceEncoding::for_midr(0xc000_0000 | (0xac4 << 4));
    assert_eq!(load(7, &[]).memory_source(ampere).unwrap(), dram);

    // An unknown CPU: the level comes from the events, as perf falls back.
    let from_events = remote.memory_source(DataSourceEncoding::Unknown).unwrap();
    assert_eq!(
        from_events.mem_lvl,
        MemLevel::L3 | MemLevel::MISS | MemLevel::REM_CCE1
    );
    // Stores have no level on Neoverse; operations that are not loads or stores, no source.
    let mut store = load(0, &[SpeEvent::TlbAccess, SpeEvent::TlbWalk]);
    store.operation = Some(Operation {
        class: 1,
        payload: 1,
    });
    let source = store.memory_source(neoverse_n1).unwrap();
    assert_eq!(
        (source.mem_op, source.mem_lvl, source.mem_dtlb),
        (MemOp::STORE, MemLevel::NA, Tlb::WK | Tlb::MISS)
    );
    assert_eq!(store.sample_fields(neoverse_n1).load_latency, None);
    let mut branch = load(0, &[]);
    branch.operation = Some(Operation {
        class: 2,
        payload: 0,
    });
    assert_eq!(branch.memory_source(neoverse_n1), None);
}

#[test]
fn extended_headers_alignment_and_damage() {
    // A two-byte counter header: index (0b01 << 3) | 0b010 = 10, a two-byte payload.
    assert_eq!(
        packet_at(&bytes("21 9a 05 00"), 0),
        Ok((
            Packet::Counter {
                index: 10,
                value: 5
            },
            4
        ))
    );
    // Alignment to 4 bytes from offset 1 skips 3 bytes.
    assert_eq!(
        packet_at(&bytes("00 21 00 00 00"), 1),
        Ok((Packet::Padding, 3))
    );
    // A record cut off by the buffer's end, and one whose packet does not decode.
    let trace = bytes("b0 00 10 40 00 00 00 00 00 ff 01 b0 00 10 40 00 00 00 00 00 98 05");
    let mut records = Records::new(&trace);
    let (record, _) = records.next().unwrap();
    assert_eq!(record, SpeRecord::default(), "the END after the bad byte");
    assert!(records.next().is_none());
    assert_eq!(
        records.damage,
        DecodeDamage {
            bytes_skipped: 3,
            records_dropped: 2
        }
    );
    // Every prefix of a trace decodes without panicking.
    let trace = bytes(QUIPPER_TRACE);
    for end in 0..trace.len() {
        let _ = Records::new(&trace[..end]).count();
    }
}

#[test]
fn counters_sum_events_and_latencies() {
    let trace = bytes(QUIPPER_TRACE);
    let mut counters = SpeCounters::default();
    for (record, _) in Records::new(&trace) {
        counters.add(&record);
    }
    assert_eq!(counters.samples, 2);
    assert_eq!(
        (counters.loads, counters.stores, counters.branches),
        (1, 0, 1)
    );
    assert_eq!(counters.event(SpeEvent::Retired), 2);
    assert_eq!(counters.event(SpeEvent::NotTaken), 1);
    assert_eq!(counters.average_total_latency(), Some(14.5));
    assert_eq!(counters.average_issue_latency(), Some(10.0));
    assert_eq!(counters.average_translation_latency(), Some(1.0));
    assert_eq!(counters.branch_mispredict_rate(), Some(0.0));
    assert_eq!(counters.l1d_miss_rate(), Some(0.0));
    let mut merged = counters;
    merged.merge(&counters);
    assert_eq!(merged.samples, 4);
    assert_eq!(merged.event(SpeEvent::Retired), 4);
}
