//! The hand-built profile the aggregate, report, export and profile-file tests read: two
//! events, kernel and user frames, inlined frames, a stripped frame, a lost user stack.

use super::*;

pub const MAIN: FrameId = 0;
pub const RUN: FrameId = 1;
/// `compute` with `vec_sum` and `add_lanes` inlined at the sampled address.
pub const COMPUTE_INLINED: FrameId = 2;
pub const STRIPPED: FrameId = 3;
pub const SYSCALL: FrameId = 4;
pub const PAGE_FAULT: FrameId = 5;
pub const WORKER: FrameId = 6;

pub const APP: &str = "/opt/app/bin/app";
pub const LIBBLOB: &str = "/usr/lib/libblob.so";
pub const KERNEL: &str = "[kernel.kallsyms]";
/// Where `app` was loaded: address - module_offset.
pub const APP_BASE: u64 = 0x5555_5555_4000;
pub const LIBBLOB_BASE: u64 = 0x7f00_0000_0000;

fn user(function: &str, module_offset: u64, line: u32) -> Frame {
    Frame {
        address: APP_BASE + module_offset,
        kernel: false,
        module: APP.into(),
        module_offset,
        build_id: Some("a1b2c3d4".into()),
        function: Some(function.into()),
        function_address: Some(APP_BASE + (module_offset & !0xff)),
        file: Some("src/app.rs".into()),
        line: Some(line),
        inlined: Vec::new(),
    }
}

fn kernel(function: &str, address: u64) -> Frame {
    Frame {
        address,
        kernel: true,
        module: KERNEL.into(),
        module_offset: address - 0xffff_ffff_8100_0000,
        build_id: None,
        function: Some(function.into()),
        function_address: Some(address & !0xff),
        file: None,
        line: None,
        inlined: Vec::new(),
    }
}

pub fn profile() -> Profile {
    let mut compute_inlined = user("compute", 0x1290, 42);
    compute_inlined.inlined = vec![
        InlinedFrame {
            function: "vec_sum".into(),
            file: Some("src/vec.rs".into()),
            line: Some(7),
        },
        InlinedFrame {
            function: "add_lanes".into(),
            file: Some("src/simd.rs".into()),
            line: Some(88),
        },
    ];
    let frames = vec![
        user("main", 0x1010, 10),
        user("run", 0x1220, 40),
        compute_inlined,
        Frame {
            address: LIBBLOB_BASE + 0x4a10,
            module: LIBBLOB.into(),
            module_offset: 0x4a10,
            build_id: Some("ffee0011".into()),
            ..Frame::default()
        },
        kernel("do_syscall_64", 0xffff_ffff_8100_1234),
        kernel("exc_page_fault", 0xffff_ffff_8100_5678),
        // `[u8; 4]` carries the `;` that folded stacks use as a separator.
        user("<[u8; 4] as app::Worker>::run", 0x1400, 77),
    ];
    let stack = |tid: u32, event: EventIndex, frames: Vec<FrameId>, count: u64| StackSample {
        pid: 100,
        tid,
        event,
        frames,
        count,
        ..StackSample::default()
    };
    Profile {
        meta: ProfileMeta {
            profiler_version: "0.1.0".into(),
            hostname: "testhost".into(),
            kernel_release: "6.18.0".into(),
            target: "-- ./app".into(),
            start_unix_ns: 1_700_000_000_000_000_000,
            duration_ns: 2_000_000_000,
            architecture: String::new(),
        },
        events: vec![
            EventInfo {
                name: "cpu-clock".into(),
                period: None,
                frequency: Some(1000),
                unit: "nanoseconds".into(),
                precise: false,
            },
            EventInfo {
                name: "page-faults".into(),
                period: Some(10),
                frequency: None,
                unit: "events".into(),
                precise: false,
            },
        ],
        threads: vec![
            ThreadInfo {
                pid: 100,
                tid: 100,
                comm: "app".into(),
                container: None,
            },
            ThreadInfo {
                pid: 100,
                tid: 101,
                comm: "app worker".into(),
                container: Some("docker-1234".into()),
            },
            ThreadInfo {
                pid: 100,
                tid: 102,
                comm: "app".into(),
                container: None,
            },
        ],
        frames,
        stacks: vec![
            // cpu-clock: 60 in the inlined loop (from two threads named `app`, which folded
            // stacks merge), 25 in the syscall, 10 in stripped code, 5 with the user stack
            // lost.
            stack(100, 0, vec![COMPUTE_INLINED, RUN, MAIN], 45),
            stack(102, 0, vec![COMPUTE_INLINED, RUN, MAIN], 15),
            stack(100, 0, vec![SYSCALL, RUN, MAIN], 25),
            stack(101, 0, vec![STRIPPED, WORKER], 10),
            StackSample {
                user_stack_lost: true,
                ..stack(100, 0, vec![SYSCALL], 5)
            },
            // page-faults: 7 samples, in user and kernel code.
            stack(100, 1, vec![PAGE_FAULT, COMPUTE_INLINED, RUN, MAIN], 4),
            stack(101, 1, vec![PAGE_FAULT, WORKER], 3),
        ],
        ..Profile::default()
    }
}

/// The heap line the page-fault samples touched, and the global variable's.
pub const HEAP_LINE: u64 = 0x5555_5600_0040;
pub const GLOBAL_LINE: u64 = APP_BASE + 0x8000;

/// [`profile`] with data addresses on its page-fault samples: 4 by `compute` on a heap
/// line (loads, with latencies and the line's histogram), 3 by the worker's stripped code
/// on the line of a global variable (stores, no latency).
pub fn profile_with_data() -> Profile {
    let mut profile = profile();
    let stats = |count, latency_sum, latency_max| Stats {
        count,
        latency_count: if latency_sum > 0 { count } else { 0 },
        latency_sum,
        latency_max,
    };
    profile.data_lines = vec![
        DataLineSample {
            pid: 100,
            event: 1,
            line: HEAP_LINE,
            frame: COMPUTE_INLINED,
            stats: stats(4, 400, 250),
            per_cpu: Vec::new(),
            tid: Some(100),
            access: DataAccess::Load,
        },
        DataLineSample {
            pid: 100,
            event: 1,
            line: GLOBAL_LINE,
            frame: STRIPPED,
            stats: stats(3, 0, 0),
            per_cpu: Vec::new(),
            tid: Some(101),
            access: DataAccess::Store,
        },
    ];
    // 3 samples at 5 cycles (a bucket of one value), one far above.
    let bucket = |value: u64| profiler_common::latency::bucket_index(value) as u16;
    profile.line_latency = vec![LineLatencyHistogram {
        pid: 100,
        event: 1,
        line: HEAP_LINE,
        buckets: vec![(bucket(5), 3), (bucket(250), 1)],
    }];
    profile.memory_maps = vec![ProcessMemoryMap {
        pid: 100,
        mappings: vec![
            MemoryMapping {
                start: APP_BASE,
                end: APP_BASE + 0x10000,
                file_offset: 0,
                path: APP.into(),
            },
            MemoryMapping {
                start: 0x5555_5600_0000,
                end: 0x5555_5610_0000,
                file_offset: 0,
                path: "[heap]".into(),
            },
        ],
    }];
    profile.data_symbols = vec![DataSymbol {
        pid: 100,
        address: GLOBAL_LINE,
        size: 16,
        name: "request_count".into(),
        module: APP.into(),
    }];
    profile
}

/// [`profile`] with two off-CPU blocks of its first thread: 5 blocks for 250 ms on the first
/// stack's frames, 2 for 1.5 us on the second's.
pub fn profile_with_off_cpu() -> Profile {
    use super::offcpu::{OffCpuBlocks, OffCpuProfile};
    let mut profile = profile();
    let (pid, tid) = (profile.stacks[0].pid, profile.stacks[0].tid);
    let blocks = |frames: Vec<FrameId>, count: u64, total_ns: u64| OffCpuBlocks {
        pid,
        tid,
        frames,
        count,
        total_ns,
        ..OffCpuBlocks::default()
    };
    profile.off_cpu = Some(OffCpuProfile {
        blocks: vec![
            blocks(profile.stacks[0].frames.clone(), 5, 250_000_000),
            blocks(profile.stacks[1].frames.clone(), 2, 1_500),
        ],
        ..OffCpuProfile::default()
    });
    profile
}
