//! The export tests' profile with the parts the views read besides call stacks: instruction
//! samples, latency statistics and histograms, data cache lines, captured code, mappings and
//! variables. Every count is chosen so that the views' expected rows follow by hand.
//!
//! Event 0 (cpu-clock, frequency sampling, no periods), pid 100, instruction samples (100):
//! `compute+0x90` 50 (inlined `add_lanes`, src/simd.rs:88), `compute+0xa4` 10 (src/app.rs:39),
//! `compute+0x4` 5 (src/app.rs:40), `helper+0x0` 5, `run+0x20` 15, stripped libblob 15.
//!
//! Event 1 (page-faults, period 10): instruction samples with latency: `compute+0x90` 4
//! (latencies 50, 100, 100, 150), `exc_page_fault` 3 (500, 500, 2000). Data lines: the line of
//! `counter_a`/`counter_b` in app's data (stores by threads 100 and 101, a load), a heap line
//! touched by the worker (thread and access unknown). Each line has the latency histogram of
//! its samples.

use profiler_common::latency::{bucket_index, LATENCY_BUCKETS};

use crate::{profile::test_profile::*, profile::*};

pub const COMPUTE_START: FrameId = 7;
pub const COMPUTE_LATE: FrameId = 8;
pub const HELPER: FrameId = 9;

/// Where app's writable data is mapped, and its variables.
pub const DATA_START: u64 = APP_BASE + 0x4000;
pub const SHARED_LINE: u64 = DATA_START + 0x40;
pub const HEAP_LINE: u64 = 0x5555_6000_0100;

fn app_frame(function: &str, start: u64, offset: u64, location: (&str, u32)) -> Frame {
    Frame {
        address: APP_BASE + start + offset,
        module: APP.into(),
        module_offset: start + offset,
        build_id: Some("a1b2c3d4".into()),
        function: Some(function.into()),
        function_address: Some(APP_BASE + start),
        file: Some(location.0.into()),
        line: Some(location.1),
        ..Frame::default()
    }
}

fn instruction(
    event: EventIndex,
    frame: FrameId,
    latencies: &[u64],
    count: u64,
) -> InstructionSample {
    InstructionSample {
        pid: 100,
        event,
        frame,
        stats: Stats {
            count,
            latency_count: latencies.len() as u64,
            latency_sum: latencies.iter().sum(),
            latency_max: latencies.iter().copied().max().unwrap_or(0),
        },
    }
}

/// Sparse bucket counts of some latencies, as the capture makes them.
pub fn buckets(latencies: &[u64]) -> Vec<(u16, u64)> {
    let mut counts = vec![0u64; LATENCY_BUCKETS];
    for latency in latencies {
        counts[bucket_index(*latency)] += 1;
    }
    crate::assemble::sparse_buckets(&counts)
}

fn histogram(frame: FrameId, latencies: &[u64]) -> LatencyHistogram {
    LatencyHistogram {
        pid: 100,
        event: 1,
        frame,
        buckets: buckets(latencies),
    }
}

pub fn line_histogram(line: u64, latencies: &[u64]) -> LineLatencyHistogram {
    LineLatencyHistogram {
        pid: 100,
        event: 1,
        line,
        buckets: buckets(latencies),
    }
}

fn data_line(
    line: u64,
    frame: FrameId,
    tid: Option<u32>,
    access: DataAccess,
    per_cpu: Vec<u64>,
    latency: u64,
) -> DataLineSample {
    let count = per_cpu.iter().sum();
    DataLineSample {
        pid: 100,
        event: 1,
        line,
        frame,
        stats: Stats {
            count,
            latency_count: count,
            latency_sum: latency * count,
            latency_max: latency,
        },
        per_cpu,
        tid,
        access,
    }
}

/// `compute` as captured: push/mov prologue, 1-byte nops, pop/ret; 0xb0 bytes at link address
/// 0x1200 (its file offset), lines 40 (0x0..0x40), 41 (0x40..0x80), none (0x80..0x90),
/// src/vec.rs:7 (0x90..0xa0), 39 (0xa0..: before 41, out of source order).
pub fn compute_code() -> CodeBytes {
    let mut bytes = vec![0x55, 0x48, 0x89, 0xe5];
    bytes.resize(0xae, 0x90);
    bytes.extend([0x5d, 0xc3]);
    let line = |offset: u32| match offset {
        0x00..0x40 => Some(("src/app.rs", 40)),
        0x40..0x80 => Some(("src/app.rs", 41)),
        0x80..0x90 => None,
        0x90..0xa0 => Some(("src/vec.rs", 7)),
        _ => Some(("src/app.rs", 39)),
    };
    let starts = [0u32, 1].into_iter().chain(4..0xb0);
    CodeBytes {
        module: APP.into(),
        build_id: Some("a1b2c3d4".into()),
        file_offset: 0x1200,
        address: 0x1200,
        lines: starts
            .filter_map(|offset| {
                line(offset).map(|(file, line)| CodeLine {
                    offset,
                    file: file.into(),
                    line,
                })
            })
            .collect(),
        bytes,
    }
}

pub fn profile() -> Profile {
    let mut profile = profile_without_code();
    profile.code = vec![compute_code()];
    profile
}

/// [`profile`] as a recording that could not read app's file.
pub fn profile_without_code() -> Profile {
    let mut profile = crate::profile::test_profile::profile();
    profile.frames.extend([
        app_frame("compute", 0x1200, 0x4, ("src/app.rs", 40)),
        app_frame("compute", 0x1200, 0xa4, ("src/app.rs", 39)),
        app_frame("helper", 0x12b0, 0, ("src/app.rs", 60)),
    ]);
    profile.instructions = vec![
        instruction(0, COMPUTE_INLINED, &[], 50),
        instruction(0, COMPUTE_LATE, &[], 10),
        instruction(0, COMPUTE_START, &[], 5),
        instruction(0, HELPER, &[], 5),
        instruction(0, RUN, &[], 15),
        instruction(0, STRIPPED, &[], 15),
        instruction(1, COMPUTE_INLINED, &[50, 100, 100, 150], 4),
        instruction(1, PAGE_FAULT, &[500, 500, 2000], 3),
    ];
    profile.latency = vec![
        histogram(COMPUTE_INLINED, &[50, 100, 100, 150]),
        histogram(PAGE_FAULT, &[500, 500, 2000]),
    ];
    profile.data_lines = vec![
        data_line(
            SHARED_LINE,
            COMPUTE_INLINED,
            Some(100),
            DataAccess::Store,
            vec![2, 0],
            40,
        ),
        data_line(
            SHARED_LINE,
            COMPUTE_LATE,
            Some(101),
            DataAccess::Store,
            vec![0, 1],
            80,
        ),
        data_line(
            SHARED_LINE,
            COMPUTE_INLINED,
            Some(100),
            DataAccess::Load,
            vec![1, 0],
            10,
        ),
        data_line(
            HEAP_LINE,
            WORKER,
            None,
            DataAccess::Unknown,
            vec![3, 0],
            300,
        ),
    ];
    profile.line_latency = vec![
        line_histogram(SHARED_LINE, &[40, 40, 80, 10]),
        line_histogram(HEAP_LINE, &[300, 300, 300]),
    ];
    let mapping = |start: u64, end: u64, file_offset: u64, path: &str| MemoryMapping {
        start,
        end,
        file_offset,
        path: path.into(),
    };
    profile.memory_maps = vec![ProcessMemoryMap {
        pid: 100,
        mappings: vec![
            mapping(APP_BASE, APP_BASE + 0x2000, 0, APP),
            mapping(DATA_START, DATA_START + 0x1000, 0x4000, APP),
            mapping(0x5555_6000_0000, 0x5555_6002_1000, 0, "[heap]"),
            mapping(0x7f00_1000_0000, 0x7f00_1000_1000, 0, ""),
            mapping(0x7f00_2000_0000, 0x7f00_2010_0000, 0x2000, "/data/table.db"),
            mapping(0x7ffc_0000_0000, 0x7ffc_0002_1000, 0, "[stack]"),
            mapping(0x7ffc_1000_0000, 0x7ffc_1000_2000, 0, "[vdso]"),
        ],
    }];
    let variable = |name: &str, address: u64| DataSymbol {
        pid: 100,
        address,
        size: 8,
        name: name.into(),
        module: APP.into(),
    };
    profile.data_symbols = vec![
        variable("counter_a", SHARED_LINE),
        variable("counter_b", SHARED_LINE + 8),
    ];
    profile
}
