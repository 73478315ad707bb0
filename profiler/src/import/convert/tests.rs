//! Synthetic perf.data files laid out per the kernel's format (IBS op and fetch RAW payloads,
//! PEBS WEIGHT_STRUCT + DATA_SRC + ADDR samples) imported into profiles, checked against values
//! computed by hand from the bit layouts in shared/specs/hardware-sampling.md.

use profiler_common::hw::ibs::events::{IbsFetchCounters, IbsOpCounters};

use super::*;
use crate::perf_data::parse;
use crate::perf_data::writer::{event_desc, AttrSpec, Bytes, FileBuilder};
use crate::perf_data::{
    PERF_SAMPLE_ADDR, PERF_SAMPLE_CPU, PERF_SAMPLE_DATA_SRC, PERF_SAMPLE_PERIOD,
    PERF_SAMPLE_PHYS_ADDR, PERF_SAMPLE_RAW, PERF_SAMPLE_TID, PERF_SAMPLE_TIME,
    PERF_SAMPLE_WEIGHT_STRUCT,
};
use crate::profile::{DataAccess, LineLatencyHistogram, Stats};
use crate::report::hardware::{render_hardware, HardwareView};

const SAMPLE: u32 = 9;
const MISC_USER: u16 = 2;
const ATTR_SAMPLE_ID_ALL: u64 = 1 << 18;
const ATTR_PRECISE_2: u64 = 2 << 15;
const FEATURE_CPUID: u32 = 9;
const FEATURE_EVENT_DESC: u32 = 12;
const FEATURE_PMU_MAPPINGS: u32 = 16;

const IBS_OP_TYPE: u32 = 11;
const IBS_FETCH_TYPE: u32 = 12;
const PID: u32 = 500;
const OP_RIP: u64 = 0x5555_5555_1234;

fn string(s: &str) -> Vec<u8> {
    let mut b = Bytes::default();
    b.string(s);
    b.take()
}

fn pmu_mappings() -> Vec<u8> {
    let mut b = Bytes::default();
    b.u32(3)
        .u32(IBS_OP_TYPE)
        .string("ibs_op")
        .u32(IBS_FETCH_TYPE)
        .string("ibs_fetch")
        .u32(4)
        .string("cpu");
    b.take()
}

/// A file of one IBS event: its attr, the PMU mappings and a Zen 4 (family 19h model 61h) CPUID,
/// which has none of the IBS errata.
fn ibs_file(event_type: u32, samples: &[(u64, u32, Vec<u8>)]) -> Vec<u8> {
    let sample_type = PERF_SAMPLE_IP
        | PERF_SAMPLE_TID
        | PERF_SAMPLE_TIME
        | PERF_SAMPLE_CPU
        | PERF_SAMPLE_PERIOD
        | PERF_SAMPLE_RAW;
    let mut file = FileBuilder::default().attr(AttrSpec {
        event_type,
        period: 100_000,
        sample_type,
        flags: ATTR_SAMPLE_ID_ALL,
        ids: vec![3],
        ..AttrSpec::default()
    });
    for (time, (ip, cpu, raw)) in samples.iter().enumerate() {
        let mut b = Bytes::default();
        b.u64(*ip)
            .u32(PID)
            .u32(PID + 1)
            .u64(1000 + time as u64)
            .u32(*cpu)
            .u32(0)
            .u64(100_000)
            .raw(raw);
        file = file.record(SAMPLE, MISC_USER, &b.take());
    }
    file.feature(FEATURE_CPUID, string("AuthenticAMD,25,97,2"))
        .feature(FEATURE_PMU_MAPPINGS, pmu_mappings())
        .build()
}

/// A PERF_SAMPLE_RAW field as Linux's IBS driver writes it: u32 size (4 + 8n), u32 caps, the
/// registers.
fn ibs_raw(caps: u32, regs: &[u64]) -> Vec<u8> {
    let mut b = Bytes::default();
    b.u32(4 + 8 * regs.len() as u32).u32(caps);
    for &reg in regs {
        b.u64(reg);
    }
    b.take()
}

// IBS_OP_DATA3 bits.
const LOAD: u64 = 1 << 0;
const STORE: u64 = 1 << 1;
const DC_MISS: u64 = 1 << 7;
const LIN_VALID: u64 = 1 << 17;
const PHYS_VALID: u64 = 1 << 18;
const L2_MISS: u64 = 1 << 20;
/// Avail, fetch sampling, op sampling: no BR_TARGET, no OP_DATA4.
const CAPS: u32 = 0b111;

fn op_file() -> Vec<u8> {
    let ctl = (1 << 18) | (1 << 17) | 0x1000;
    // A load that missed the data cache and the L2, served by local DRAM in 310 cycles, 8 bytes
    // wide (width code 4); tag-to-retire 25, completion-to-retire 7.
    let load = ibs_raw(
        CAPS,
        &[
            ctl,
            OP_RIP,
            (25 << 16) | 7,
            3,
            LOAD | DC_MISS | L2_MISS | LIN_VALID | PHYS_VALID | (4 << 22) | (310 << 32),
            0x7f00_0000_1048,
            0x1_2345_6048,
        ],
    );
    // A store that hit the data cache, in the same line; tag-to-retire 10, completion 3.
    let store = ibs_raw(
        CAPS,
        &[
            ctl,
            OP_RIP,
            (10 << 16) | 3,
            0,
            STORE | LIN_VALID | PHYS_VALID,
            0x7f00_0000_1050,
            0x1_2345_6050,
        ],
    );
    ibs_file(IBS_OP_TYPE, &[(OP_RIP, 1, load), (OP_RIP, 3, store)])
}

/// `perf_mem_data_src` by hand: op 0-4, lvl 5-18, snoop 19-23, lock 24-25, dtlb 26-32,
/// lvl_num 33-36.
fn data_src(op: u64, lvl: u64, snoop: u64, lock: u64, dtlb: u64, lvl_num: u64) -> u64 {
    op | (lvl << 5) | (snoop << 19) | (lock << 24) | (dtlb << 26) | (lvl_num << 33)
}

/// A crafted CPU number must not size the per-CPU rows (u32::MAX of them: 32 GiB).
#[test]
fn impossible_cpu_numbers_count_without_a_per_cpu_row() {
    let raw = ibs_raw(CAPS, &[(1 << 18) | (1 << 17), OP_RIP, 0, 0, 0, 0, 0]);
    let file = ibs_file(
        IBS_OP_TYPE,
        &[(OP_RIP, u32::MAX, raw.clone()), (OP_RIP, 2, raw)],
    );
    let data = parse(&file).unwrap();
    let (profile, peak) = crate::alloc_meter::peak_bytes(|| profile_from_perf_data(&data));
    let profile = profile.unwrap();
    assert!(peak < 64 << 20, "{peak}");
    assert_eq!(profile.stacks[0].count, 2);
    assert_eq!(profile.stacks[0].per_cpu, vec![0, 0, 1]);
}

#[test]
fn ibs_op_raw_samples_decode_into_the_profile() {
    let profile = profile_from_perf_data(&parse(&op_file()).unwrap()).unwrap();

    let event = &profile.events[0];
    assert_eq!(event.name, "ibs_op/config=0x0/");
    assert!(event.precise, "IBS tags the instruction itself");
    assert_eq!(event.unit, "CPU-cycles");
    assert_eq!(event.period, Some(100_000));

    let frame = &profile.frames[profile.instructions[0].frame as usize];
    assert_eq!(frame.address, OP_RIP);
    assert_eq!(profile.instructions.len(), 1);
    let expected_stats = Stats {
        count: 2,
        latency_count: 1,
        latency_sum: 310,
        latency_max: 310,
    };
    assert_eq!(profile.instructions[0].stats, expected_stats);
    // Both addresses fall in the line at 0x...1040: one row for the load, one for the store.
    assert_eq!(profile.data_lines.len(), 2);
    let access = |access: DataAccess| {
        let line = profile
            .data_lines
            .iter()
            .find(|line| line.access == access)
            .unwrap_or_else(|| panic!("no {access:?} row"));
        (line.line, line.stats, line.per_cpu.clone())
    };
    let load = Stats {
        count: 1,
        latency_count: 1,
        latency_sum: 310,
        latency_max: 310,
    };
    let store = Stats {
        count: 1,
        ..Stats::default()
    };
    assert_eq!(
        access(DataAccess::Load),
        (0x7f00_0000_1040, load, vec![0, 1])
    );
    assert_eq!(
        access(DataAccess::Store),
        (0x7f00_0000_1040, store, vec![0, 0, 0, 1])
    );
    // 310 = 0b1_0011_0110: msb 8, shift 5, bucket 8 * 5 + (310 >> 5) = 49.
    assert_eq!(profile.latency[0].buckets, vec![(49, 1)]);

    let hardware = &profile.hardware;
    assert_eq!(hardware.ibs_caps, Some(CAPS));
    assert_eq!(
        hardware.cpu,
        Some(CpuIdentity {
            vendor: "AuthenticAMD".into(),
            family: 0x19,
            model: 0x61
        })
    );
    assert_eq!(hardware.samples.len(), 1);
    let sample = &hardware.samples[0];
    assert_eq!(
        (sample.pid, sample.line, sample.samples),
        (PID, Some(0x7f00_0000_1040), 2)
    );
    // Load from local DRAM: LOAD 2; LOC_RAM|HIT 130; snoop NA 1; lock NA 1; L1|HIT 10; RAM 13.
    let dram_load = data_src(2, 130, 1, 1, 10, 13);
    // Store hitting L1: STORE 4; L1|HIT 10; snoop NA; lock NA; L1|HIT 10; L1 1.
    let l1_store = data_src(4, 10, 1, 1, 10, 1);
    let mut expected_sources = vec![(dram_load, 1), (l1_store, 1)];
    expected_sources.sort();
    assert_eq!(sample.data_sources, expected_sources);
    assert_eq!(
        sample.ibs_op,
        Some(IbsOpCounters {
            all_samples: 2,
            tag_to_retire_total: 35,
            completion_to_retire_total: 10,
            load_store: 2,
            loads: 1,
            stores: 1,
            l1_dtlb_hit: 2,
            l1_dtlb_4k: 2,
            dc_miss: 1,
            dc_hit: 1,
            dc_miss_loads: 1,
            dc_miss_latency_total: 310,
            nb_local: 1,
            nb_local_dram: 1,
            nb_local_latency_total: 310,
            ..IbsOpCounters::default()
        })
    );
    assert_eq!(sample.ibs_fetch, None);

    let text = render_hardware(&profile, HardwareView::Instruction);
    for expected in [
        "ibs_op/config=0x0/ (precise): 2 IBS op samples with hardware data, by instruction",
        "never compare them with event-based sample counts",
        "100.00%        2  0x555555551234",
        "memory level  L1 hit 1 (50.0%), Local RAM hit 1 (50.0%)",
        "TLB           L1 hit 2 (100.0%)",
        "IBS load ops 1",
        "DC miss rate 50.00%",
        "average DC miss latency 310.0 cycles",
        "average tag-to-retire 17.5 cycles",
        "not reported by this CPU: IBS MAB hit",
        "not reported by this CPU: IBS load resync: this CPU has no IBS_OP_DATA4",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // Events the CPU lacks are not columns.
    assert!(!text.contains("IBS load resync 0"), "{text}");
    let lines = render_hardware(&profile, HardwareView::DataLine);
    assert!(lines.contains("0x7f0000001040 (pid 500)"), "{lines}");
}

#[test]
fn ibs_fetch_raw_samples_decode_into_fetch_counters() {
    const FETCH: u64 = 0x40_2000;
    // Completed (50), IC miss (51), physical address valid (52), 4K page (53-54 = 0), fetch
    // latency 40 (32-47).
    let ctl = (1 << 50) | (1 << 51) | (1 << 52) | (40 << 32) | 0x100;
    let raw = ibs_raw(0b11, &[ctl, FETCH, 0x9_2000]);
    let profile =
        profile_from_perf_data(&parse(&ibs_file(IBS_FETCH_TYPE, &[(FETCH, 0, raw)])).unwrap())
            .unwrap();
    assert_eq!(profile.events[0].unit, "fetches");
    assert!(
        profile.data_lines.is_empty(),
        "fetches have no data address"
    );
    assert!(
        profile.latency.is_empty(),
        "fetch latency is not a load latency"
    );
    let sample = &profile.hardware.samples[0];
    assert_eq!(
        (sample.line, sample.data_sources.as_slice()),
        (None, &[][..])
    );
    assert_eq!(
        sample.ibs_fetch,
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
    let text = render_hardware(&profile, HardwareView::Function);
    assert!(text.contains("1 IBS fetch samples"), "{text}");
    assert!(text.contains("IC miss rate 100.00%"), "{text}");
    assert!(text.contains("average fetch latency 40.0 cycles"), "{text}");
    assert!(
        text.contains("not reported by this CPU: IBS ITLB refill latency"),
        "{text}"
    );
}

#[test]
fn truncated_ibs_payloads_are_counted_not_fatal() {
    let raw = ibs_raw(CAPS, &[0, OP_RIP, 0]);
    let profile =
        profile_from_perf_data(&parse(&ibs_file(IBS_OP_TYPE, &[(OP_RIP, 0, raw)])).unwrap())
            .unwrap();
    assert_eq!(
        profile.losses.counters["IBS samples with unreadable raw registers"],
        1
    );
    assert_eq!(
        profile.instructions[0].stats.count, 1,
        "the sample still counts"
    );
    assert!(profile.hardware.samples.is_empty());
}

const PEBS_IP: u64 = 0x40_1234;

/// Two PEBS load-latency samples (312 and 40 cycles) of one instruction, in one data line that
/// hit a modified L3 line, with `cpu/mem-loads,ldlat=30/P` in the event description; with
/// `precise` false, the same loads counted by a skidding event (`cpu/mem-loads,ldlat=30/`).
fn pebs_loads_file(precise: bool) -> Vec<u8> {
    let sample_type = PERF_SAMPLE_IP
        | PERF_SAMPLE_TID
        | PERF_SAMPLE_TIME
        | PERF_SAMPLE_ADDR
        | PERF_SAMPLE_CPU
        | PERF_SAMPLE_PERIOD
        | PERF_SAMPLE_WEIGHT_STRUCT
        | PERF_SAMPLE_DATA_SRC
        | PERF_SAMPLE_PHYS_ADDR;
    let l3_hitm = pebs_l3_hitm();
    let mut file = FileBuilder::default().attr(AttrSpec {
        event_type: 4,
        config: 0x1cd,
        config1: 30,
        period: 10007,
        sample_type,
        flags: ATTR_SAMPLE_ID_ALL | if precise { ATTR_PRECISE_2 } else { 0 },
        ids: vec![7],
        ..AttrSpec::default()
    });
    for (addr, var1, var2) in [
        (0x7ffd_0000_1040u64, 312u64, 27u64),
        (0x7ffd_0000_1078, 40, 5),
    ] {
        let mut b = Bytes::default();
        b.u64(PEBS_IP)
            .u32(100)
            .u32(101)
            .u64(5_000_000)
            .u64(addr)
            .u32(1)
            .u32(0)
            .u64(10007)
            .u64(var1 | (var2 << 32) | (9 << 48))
            .u64(l3_hitm)
            .u64(0x1_2345_6040);
        file = file.record(SAMPLE, MISC_USER | (1 << 14), &b.take());
    }
    file.feature(
        FEATURE_EVENT_DESC,
        event_desc(&[(
            if precise {
                "cpu/mem-loads,ldlat=30/P"
            } else {
                "cpu/mem-loads,ldlat=30/"
            },
            &[7],
        )]),
    )
    .build()
}

/// The data source of both loads in [`pebs_loads_file`]: an L3 hit in a line another core had
/// modified (LOAD 2; L3|HIT 66; HITM 16; lock NA 1; L1|L2|HIT 26; L3 3).
fn pebs_l3_hitm() -> u64 {
    data_src(2, 66, 16, 1, 26, 3)
}

#[test]
fn pebs_weight_struct_data_src_and_addr_import() {
    let file = pebs_loads_file(true);
    let l3_hitm = pebs_l3_hitm();
    let profile = profile_from_perf_data(&parse(&file).unwrap()).unwrap();

    assert_eq!(profile.events[0].name, "cpu/mem-loads,ldlat=30/P");
    assert!(profile.events[0].precise);
    let stats = Stats {
        count: 2,
        latency_count: 2,
        latency_sum: 352,
        latency_max: 312,
    };
    assert_eq!(profile.instructions[0].stats, stats);
    assert_eq!(profile.data_lines[0].line, 0x7ffd_0000_1040);
    assert_eq!(profile.data_lines[0].stats, stats);
    assert_eq!(profile.data_lines[0].per_cpu, vec![0, 2]);
    // 40: msb 5, shift 2, 8 * 2 + 10 = 26. 312: msb 8, shift 5, 8 * 5 + 9 = 49.
    assert_eq!(profile.latency[0].buckets, vec![(26, 1), (49, 1)]);
    // Both loads fall in one line: its histogram holds both latencies.
    assert_eq!(
        profile.line_latency,
        vec![LineLatencyHistogram {
            pid: 100,
            event: 0,
            line: 0x7ffd_0000_1040,
            buckets: vec![(26, 1), (49, 1)],
        }]
    );
    let sample = &profile.hardware.samples[0];
    assert_eq!(sample.data_sources, vec![(l3_hitm, 2)]);
    assert_eq!((sample.ibs_op, sample.ibs_fetch), (None, None));
    assert_eq!(profile.stacks[0].count, 2);
    assert_eq!(profile.stacks[0].per_cpu, vec![0, 2]);

    let text = render_hardware(&profile, HardwareView::Function);
    for expected in [
        "cpu/mem-loads,ldlat=30/P (precise): 2 samples with hardware data, by function",
        "memory level  L3 hit 2 (100.0%)",
        "snoop         HitM 2 (100.0%)",
        "TLB           L1 or L2 hit 2 (100.0%)",
        "lock          N/A 2 (100.0%)",
        "locality      Local 2 (100.0%)",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(!text.contains("IBS"), "{text}");
    let json = crate::report::hardware::hardware_json(&profile, HardwareView::DataLine);
    let row = &json["sections"][0]["rows"][0];
    assert_eq!(row["samples"], 2);
    assert_eq!(row["data_source"]["level"][0]["label"], "L3 hit");
    // Exact mean and maximum of 40 and 312; percentiles at the bucket midpoints 41 (40..=43) and
    // 303 (288..=319).
    assert_eq!(
        row["latency"],
        serde_json::json!({"samples": 2, "mean": 176.0, "p50": 41, "p90": 303, "p99": 303, "max": 312})
    );
    let text = render_hardware(&profile, HardwareView::DataLine);
    let expected = "load latency  2 samples: mean 176.0, p50 41, p90 303, p99 303, max 312 cycles";
    assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    assert!(!render_hardware(&profile, HardwareView::Function).contains("load latency"));
}

#[test]
fn side_band_records_apply_in_time_order() {
    let mmap = |pid: u32, start: u64, path: &str, time: u64| Mmap {
        pid,
        tid: pid,
        start,
        len: 0x1000,
        filename: path.to_string(),
        prot: Some(libc::PROT_EXEC as u32 | libc::PROT_READ as u32),
        time: Some(time),
        ..Mmap::default()
    };
    let data = PerfData {
        // File order is not time order.
        mmaps: vec![
            mmap(10, 0x1000, "/after-exec", 30),
            mmap(10, 0x1000, "/before-exec", 10),
            mmap(10, 0x5000, "/inherited", 5),
            mmap(u32::MAX, 0xffff_ffff_8100_0000, "[kernel.kallsyms]_text", 0),
        ],
        comms: vec![Comm {
            pid: 10,
            tid: 10,
            comm: "worker".into(),
            exec: true,
            time: Some(20),
        }],
        forks: vec![TaskEvent {
            pid: 11,
            ppid: 10,
            tid: 11,
            ptid: 10,
            time: 15,
        }],
        exits: vec![TaskEvent {
            pid: 11,
            ppid: 10,
            tid: 11,
            ptid: 10,
            time: 40,
        }],
        lost: 3,
        ..PerfData::default()
    };
    let table = process_table(&data);
    assert_eq!(
        &*table.code_mapping_for(10, 0x1800).unwrap().path,
        "/after-exec"
    );
    // The image before the exec is kept as retired: only samples taken before the exec can
    // fall where no current mapping is, and they ran that image.
    assert_eq!(
        &*table.code_mapping_for(10, 0x5800).unwrap().path,
        "/inherited",
        "exec retired it"
    );
    // The child forked before the exec: it keeps the parent's mappings of that moment.
    assert_eq!(
        &*table.code_mapping_for(11, 0x1800).unwrap().path,
        "/before-exec"
    );
    assert_eq!(
        &*table.code_mapping_for(11, 0x5800).unwrap().path,
        "/inherited"
    );
    assert!(table.processes[&11].exited);
    assert_eq!(table.thread_name(10, 10), "worker");
    assert!(!table.processes.contains_key(&u32::MAX));
    assert_eq!(table.lost_records, 3);
}

#[test]
fn events_without_instruction_pointers_are_refused() {
    let file = FileBuilder::default()
        .attr(AttrSpec {
            event_type: 1,
            period: 1,
            sample_type: PERF_SAMPLE_TID,
            ids: vec![1],
            ..AttrSpec::default()
        })
        .build();
    let err = profile_from_perf_data(&parse(&file).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("neither instruction pointers nor callchains"),
        "{err}"
    );
    assert!(err.contains("record again with -g"), "{err}");
}

/// The profiler binary the command-line tests run: $PROFILER_BIN (set by `cargo xtask test`),
/// else the release build beside this crate.
fn profiler_binary() -> std::path::PathBuf {
    let path = std::env::var_os("PROFILER_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/profiler")
        });
    assert!(
        path.is_file(),
        "profiler binary not found at {}: run the tests with `cargo xtask test`, which builds it",
        path.display()
    );
    path
}

/// `profiler ARGS`, asserting success: (stdout, stderr).
fn run_profiler(args: &[&std::ffi::OsStr]) -> (String, String) {
    let output = std::process::Command::new(profiler_binary())
        .args(args)
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(
        output.status.success(),
        "profiler {args:?}: {}",
        text(&output.stderr)
    );
    (text(&output.stdout), text(&output.stderr))
}

#[test]
fn hardware_views_histograms_and_backtracking_through_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("pebs.data");
    std::fs::write(&input, pebs_loads_file(true)).unwrap();
    let arg = |text: &'static str| std::ffi::OsStr::new(text);
    let input = input.as_os_str();

    let (text, _) = run_profiler(&[
        arg("report"),
        arg("-i"),
        input,
        arg("--hardware"),
        arg("data-line"),
    ]);
    let expected = "load latency  2 samples: mean 176.0, p50 41, p90 303, p99 303, max 312 cycles";
    assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    assert!(text.contains("snoop         HitM 2 (100.0%)"), "{text}");

    let svg = dir.path().join("latency.svg");
    run_profiler(&[
        arg("report"),
        arg("-i"),
        input,
        arg("--histogram"),
        svg.as_os_str(),
    ]);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&svg).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the plot is private, as every output");
    assert!(
        drawn.starts_with("<svg") || drawn.contains("<svg"),
        "{drawn}"
    );
    assert!(drawn.contains("mem-loads"), "the histogram names its event");

    // Precise samples are never backtracked; the skidding event's two are considered, and
    // kept where sampled: the file holds no code to find the access before them in.
    let backtrack = |file: Vec<u8>| {
        let path = dir.path().join("backtrack.data");
        std::fs::write(&path, file).unwrap();
        let (text, stderr) = run_profiler(&[
            arg("report"),
            arg("-i"),
            path.as_os_str(),
            arg("--backtrack"),
            arg("--hardware"),
            arg("instruction"),
        ]);
        assert!(text.contains("401234"), "the sampled instruction:\n{text}");
        stderr
    };
    let precise = backtrack(pebs_loads_file(true));
    assert!(
        precise.contains("0 samples moved") && precise.contains("0 kept"),
        "{precise}"
    );
    let skidding = backtrack(pebs_loads_file(false));
    assert!(
        skidding.contains("0 samples moved") && skidding.contains("2 kept"),
        "{skidding}"
    );
}

#[test]
fn stacks_of_another_architecture_are_not_walked_with_this_ones_registers() {
    let (native, foreign) = if cfg!(target_arch = "aarch64") {
        ("aarch64", "x86_64")
    } else {
        ("x86_64", "aarch64")
    };
    let bits = UserRegisterBits::for_recording(Some(native)).unwrap();
    // perf_regs.h: x86-64 ip 8, sp 7, bp 6; arm64 pc 32, sp 31, x29 29, lr 30.
    assert_eq!(
        (bits.ip, bits.sp, bits.fp, bits.link),
        if native == "x86_64" {
            (8, 7, 6, None)
        } else {
            (32, 31, 29, Some(30))
        }
    );
    assert_eq!(UserRegisterBits::for_recording(Some(foreign)), None);
    assert_eq!(UserRegisterBits::for_recording(Some("riscv64")), None);
}

const SPE_TYPE: u32 = 8;

fn hex_bytes(hex: &str) -> Vec<u8> {
    let digits: String = hex.split_whitespace().collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

/// A `perf record -e arm_spe_0//` file from a Neoverse N1: the SPE attr, its PMU mapping, the
/// MIDR as CPUID, COMM records naming the threads' processes, and one AUXTRACE buffer of CPU 2.
/// The buffer holds perf_data_converter's two kernel-mode records (thread 0x5f80, a load that
/// hit L1D in 12 cycles; thread 0xe, a branch) and a user-mode load of thread 0x1234 served by
/// the system cache in 300 cycles.
fn spe_file() -> Vec<u8> {
    let sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU;
    let mut file = FileBuilder::default().attr(AttrSpec {
        event_type: SPE_TYPE,
        period: 1024,
        sample_type,
        flags: ATTR_SAMPLE_ID_ALL,
        ids: vec![3],
        ..AttrSpec::default()
    });
    for (pid, tid, name) in [
        (1, 0x5f80, "kworker"),
        (2, 0xe, "ksoftirqd"),
        (PID, 0x1234, "app"),
    ] {
        let mut comm = Bytes::default();
        comm.u32(pid).u32(tid).c_string(name);
        // sample_id trailer: pid, tid, time, cpu.
        comm.u32(pid).u32(tid).u64(1).u32(0).u32(0);
        file = file.record(3, MISC_USER, &comm.take());
    }
    let trace = hex_bytes(
        "b0 d0 c2 a1 ed 66 ba ff c0  00 00 00 00 00  65 80 5f 00 00  49 00  52 16 00  99 04 00
         98 0c 00  b2 28 6b 09 03 37 0e ff 00  9a 01 00  00 00 00 00 00 00 00 00 00  43 00  00 00
         71 2e 65 2f 6a 0a 00 00 00
         b0 e0 b0 ef ed 66 ba ff c0  00 00 00 00 00  65 0e 00 00 00  4a 01  52 42 00  99 10 00
         98 11 00  b1 e4 b0 ef ed 66 ba ff c0
         00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00  71 8d 65 2f 6a 0a 00 00 00
         b0 00 b6 a9 e4 aa aa 00 80  65 34 12 00 00  49 00  52 1e 01  99 04 00  98 2c 01
         b2 43 da 5d e6 aa aa 00 00  43 0b  01",
    );
    let mut auxtrace = Bytes::default();
    auxtrace
        .u64(trace.len() as u64)
        .u64(0)
        .u64(0)
        .u32(2)
        .u32(u32::MAX)
        .u32(2)
        .u32(0);
    let mut file = file.record(71, 0, &auxtrace.take());
    file.data.extend_from_slice(&trace);
    let mut mappings = Bytes::default();
    mappings.u32(1).u32(SPE_TYPE).string("arm_spe_0");
    file.feature(FEATURE_CPUID, string("0x00000000410fd0c0"))
        .feature(FEATURE_PMU_MAPPINGS, mappings.take())
        .build()
}

#[test]
fn arm_spe_aux_trace_records_become_precise_samples() {
    let profile = profile_from_perf_data(&parse(&spe_file()).unwrap()).unwrap();
    let event = &profile.events[0];
    assert_eq!(event.name, "arm_spe_0/config=0x0/");
    assert!(event.precise, "SPE tags the instruction itself");
    assert_eq!(event.unit, "operations");
    assert_eq!(profile.losses.samples_fired, vec![3]);

    // Threads from the context packets, processes from the COMM records.
    let threads: BTreeSet<(u32, u32)> = profile.threads.iter().map(|t| (t.pid, t.tid)).collect();
    assert_eq!(
        threads,
        BTreeSet::from([(1, 0x5f80), (2, 0xe), (PID, 0x1234)])
    );
    let stats_at = |address: u64| {
        profile
            .instructions
            .iter()
            .find(|i| profile.frames[i.frame as usize].address == address)
            .map(|i| (i.pid, i.stats))
    };
    // Loads carry their total latency as load latency; the branch none.
    assert_eq!(
        stats_at(0xffff_ba66_eda1_c2d0),
        Some((
            1,
            Stats {
                count: 1,
                latency_count: 1,
                latency_sum: 12,
                latency_max: 12
            }
        ))
    );
    assert_eq!(stats_at(0xffff_ba66_edef_b0e0).unwrap().1.latency_count, 0);
    assert_eq!(stats_at(0xaaaa_e4a9_b600).unwrap().1.latency_sum, 300);

    // Data lines: the kernel load's and the user load's.
    let lines: BTreeMap<u64, (u32, Stats)> = profile
        .data_lines
        .iter()
        .map(|line| (line.line, (line.pid, line.stats)))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[&0xffff_0e37_0309_6b00].0, 1);
    assert_eq!(
        lines[&0xaaaa_e65d_da40],
        (PID, stats_at(0xaaaa_e4a9_b600).unwrap().1)
    );
    assert!(profile
        .data_lines
        .iter()
        .all(|l| l.access == DataAccess::Load));
    assert!(profile
        .data_lines
        .iter()
        .all(|l| l.per_cpu == vec![0, 0, 1]));
    // 300 = 0b1_0010_1100: msb 8, shift 5, bucket 8 * 5 + (300 >> 5) = 49.
    let user_latency = profile.latency.iter().find(|h| h.pid == PID).unwrap();
    assert_eq!(user_latency.buckets, vec![(49, 1)]);

    // Data sources in Neoverse's encoding: L1D (0) and the system cache (0xb, an L3 hit).
    let sample_of = |pid: u32| {
        profile
            .hardware
            .samples
            .iter()
            .find(|s| s.pid == pid)
            .unwrap()
    };
    let l1_load = data_src(2, 8 | 2, 2, 0, 0x20 | 2, 1);
    assert_eq!(sample_of(1).data_sources, vec![(l1_load, 1)]);
    let system_cache_load = data_src(2, 0x40 | 2, 4, 0, 0x20 | 2, 3);
    assert_eq!(sample_of(PID).data_sources, vec![(system_cache_load, 1)]);
    let branch = sample_of(2);
    assert!(branch.data_sources.is_empty());
    let spe = branch.spe.unwrap();
    assert_eq!(
        (spe.samples, spe.branches, spe.total_latency_sum),
        (1, 1, 17)
    );
    let user = sample_of(PID).spe.unwrap();
    assert_eq!(user.event(profiler_common::hw::spe::SpeEvent::L1dRefill), 1);
    assert_eq!(user.event(profiler_common::hw::spe::SpeEvent::LlcAccess), 1);

    let text = render_hardware(&profile, HardwareView::Function);
    for expected in [
        "arm_spe_0/config=0x0/ (precise): 3 SPE samples with hardware data, by function",
        "counts are SPE samples",
        "memory level  L1 hit 1 (100.0%)",
        "memory level  L3 hit 1 (100.0%)",
        "TLB           Walker hit 1 (100.0%)",
        "SPE           loads 1, branches 1, RETIRED 2, L1D-ACCESS 1, TLB-ACCESS 1, NOT-TAKEN 1",
        "SPE           loads 1, RETIRED 1, L1D-ACCESS 1, L1D-REFILL 1, TLB-ACCESS 1, LLC-ACCESS 1",
        "average total latency 14.5 cycles, average issue latency 10.0 cycles, \
         average translation latency 1.0 cycles, L1D miss rate 0.00%, TLB walk rate 0.00%, \
         branch mispredict rate 0.00%",
        "average total latency 300.0 cycles, average issue latency 4.0 cycles, \
         L1D miss rate 100.00%, LLC miss rate 0.00%",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert_eq!(loss_counter(&profile, "Arm SPE records lost"), Some(0));
    assert_eq!(
        loss_counter(&profile, "Arm SPE records without a thread"),
        Some(0)
    );
}

/// The profile's loss counter whose name starts with `name`.
fn loss_counter(profile: &Profile, name: &str) -> Option<u64> {
    profile
        .losses
        .counters
        .iter()
        .find(|(counter, _)| counter.starts_with(name))
        .map(|(_, count)| *count)
}

#[test]
fn damaged_spe_data_and_other_tracers_are_counted() {
    let mut bytes = spe_file();
    // Corrupt the first packet header of the AUX payload (the first record's PC).
    let at = bytes
        .windows(9)
        .position(|w| w == hex_bytes("b0 d0 c2 a1 ed 66 ba ff c0"))
        .unwrap();
    bytes[at] = 0xff;
    let profile = profile_from_perf_data(&parse(&bytes).unwrap()).unwrap();
    // The first record lost its PC packet: counted, the other two kept.
    assert_eq!(loss_counter(&profile, "Arm SPE records lost"), Some(1));
    assert_eq!(profile.losses.samples_fired, vec![2]);

    // The same AUX data under a PMU that is not SPE: not read, its bytes counted.
    let mut data = parse(&spe_file()).unwrap();
    data.features.pmu_mappings = vec![(SPE_TYPE, "intel_pt".to_string())];
    let profile = profile_from_perf_data(&data).unwrap();
    assert_eq!(profile.losses.samples_fired, vec![0]);
    assert_eq!(
        loss_counter(&profile, "perf.data: bytes of AUX trace data"),
        Some(data.aux_traces[0].data.len() as u64)
    );
}

#[test]
fn spe_data_lines_and_latencies_through_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("spe.data");
    std::fs::write(&input, spe_file()).unwrap();
    let arg = |text: &'static str| std::ffi::OsStr::new(text);
    let (text, _) = run_profiler(&[
        arg("report"),
        arg("-i"),
        input.as_os_str(),
        arg("--hardware"),
        arg("data-line"),
    ]);
    for expected in [
        "0xaaaae65dda40 (pid 500)",
        "load latency  1 samples: mean 300.0, p50 300, p90 300, p99 300, max 300 cycles",
        "SPE           loads 1, RETIRED 1, L1D-ACCESS 1, L1D-REFILL 1, TLB-ACCESS 1, LLC-ACCESS 1",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn spe_records_without_a_thread_are_counted() {
    let mut bytes = spe_file();
    // The user-mode record's context packet becomes padding; the buffer was traced per CPU.
    let context = hex_bytes("65 34 12 00 00");
    let at = bytes.windows(5).position(|w| w == context).unwrap();
    bytes[at..at + 5].fill(0);
    let profile = profile_from_perf_data(&parse(&bytes).unwrap()).unwrap();
    assert_eq!(
        loss_counter(&profile, "Arm SPE records without a thread"),
        Some(1)
    );
    // Still a sample, of thread 0: counted, not dropped or given another thread.
    assert_eq!(profile.losses.samples_fired, vec![3]);
    assert!(profile.threads.iter().any(|t| (t.pid, t.tid) == (0, 0)));
    assert!(!profile.threads.iter().any(|t| t.tid == 0x1234));
}
