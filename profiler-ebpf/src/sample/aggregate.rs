//! Counting a sample into the current generation's maps (stacks, instructions, data lines,
//! latency histograms, data sources), and the time-ordered stream of every sample.

use aya_ebpf::{
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::map,
    maps::{PerCpuHashMap, RingBuf},
    programs::PerfEventContext,
};
use profiler_common::{
    capture::{
        access_of_data_source, sample_flags, CaptureConfig, DataLineKey, DataSourceKey, Fill,
        InstructionKey, LatencyKey, LineLatencyKey, LossKind, RawSample, SampleStats, StackKey,
        ACCESS_UNKNOWN, CACHE_LINE_BYTES, CAPTURE_DATA_SOURCES, CAPTURE_INSTRUCTIONS,
        CAPTURE_KERNEL_STACKS, CAPTURE_RAW,
    },
    latency::LatencyBuckets,
    stack::NO_STACK,
};

use super::{
    ibs::{raw_decoding, stream_ibs},
    SampleData,
};
use crate::{
    arch,
    generations::{count_new_keys, Generation},
    maps::{bump, lose, record_latency},
    stacks::{capture_stack, stack_hash, StackLosses},
};

#[map]
static STACK_COUNTS_0: PerCpuHashMap<StackKey, u64> = PerCpuHashMap::with_max_entries(16384, 0);

#[map]
static STACK_COUNTS_1: PerCpuHashMap<StackKey, u64> = PerCpuHashMap::with_max_entries(16384, 0);

#[map]
static INSTRUCTIONS_0: PerCpuHashMap<InstructionKey, SampleStats> =
    PerCpuHashMap::with_max_entries(16384, 0);

#[map]
static INSTRUCTIONS_1: PerCpuHashMap<InstructionKey, SampleStats> =
    PerCpuHashMap::with_max_entries(16384, 0);

#[map]
static DATA_LINES_0: PerCpuHashMap<DataLineKey, SampleStats> =
    PerCpuHashMap::with_max_entries(16384, 0);

#[map]
static DATA_LINES_1: PerCpuHashMap<DataLineKey, SampleStats> =
    PerCpuHashMap::with_max_entries(16384, 0);

#[map]
static LATENCIES_0: PerCpuHashMap<LatencyKey, LatencyBuckets> =
    PerCpuHashMap::with_max_entries(1024, 0);

#[map]
static LATENCIES_1: PerCpuHashMap<LatencyKey, LatencyBuckets> =
    PerCpuHashMap::with_max_entries(1024, 0);

#[map]
static LINE_LATENCIES_0: PerCpuHashMap<LineLatencyKey, LatencyBuckets> =
    PerCpuHashMap::with_max_entries(1024, 0);

#[map]
static LINE_LATENCIES_1: PerCpuHashMap<LineLatencyKey, LatencyBuckets> =
    PerCpuHashMap::with_max_entries(1024, 0);

#[map]
static DATA_SOURCES_0: PerCpuHashMap<DataSourceKey, u64> =
    PerCpuHashMap::with_max_entries(16384, 0);

#[map]
static DATA_SOURCES_1: PerCpuHashMap<DataSourceKey, u64> =
    PerCpuHashMap::with_max_entries(16384, 0);

/// Time-ordered stream of every sample, with `CAPTURE_RAW`.
#[map]
static RAW_SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

#[inline(always)]
fn add_stats(stats: &mut SampleStats, latency: u64) {
    stats.count += 1;
    if latency != 0 {
        stats.latency_count += 1;
        stats.latency_sum += latency;
        if latency > stats.latency_max {
            stats.latency_max = latency;
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn record(
    ctx: &PerfEventContext,
    config: &CaptureConfig,
    generation: Generation,
    pid: u32,
    tid: u32,
    cgroup: u64,
    event: u32,
    data: &SampleData,
    user_stack: u64,
    copied: bool,
) {
    let ip = arch::sample_ip(ctx);

    // With stack copies the agent unwinds and counts the sample's stacks from its record. A
    // sample in user mode has no kernel stack, and asking the kernel for it costs a third of a
    // microsecond.
    let kernel_stack = if copied || arch::sampled_in_user_mode(ctx) {
        NO_STACK
    } else if config.flags & CAPTURE_KERNEL_STACKS != 0 {
        let losses = StackLosses {
            collision: LossKind::KernelStackHashCollision,
            full: LossKind::KernelStackFramesFull,
            failed: LossKind::KernelStackFailed,
        };
        stack_hash(
            capture_stack(ctx, 0, losses.failed),
            generation.index(),
            &losses,
        )
    } else {
        NO_STACK
    };

    let key = StackKey {
        pid,
        tid,
        event,
        _pad: 0,
        user_stack,
        kernel_stack,
        cgroup,
    };
    if !copied
        && bump(
            generation.pick(&STACK_COUNTS_0, &STACK_COUNTS_1),
            &key,
            &1,
            |count| *count += 1,
            LossKind::StackCountsFull,
        )
    {
        count_new_keys(config, generation.index(), Fill::StackCounts, 1);
    }

    let mut first = SampleStats::default();
    add_stats(&mut first, data.latency);
    if config.flags & CAPTURE_INSTRUCTIONS != 0
        && bump(
            generation.pick(&INSTRUCTIONS_0, &INSTRUCTIONS_1),
            &InstructionKey { pid, event, ip },
            &first,
            |stats| add_stats(stats, data.latency),
            LossKind::InstructionsFull,
        )
    {
        count_new_keys(config, generation.index(), Fill::Instructions, 1);
    }
    if data.flags & sample_flags::ADDR != 0 {
        let access = if data.flags & sample_flags::DATA_SRC != 0 {
            access_of_data_source(data.data_src)
        } else {
            ACCESS_UNKNOWN
        };
        let line = DataLineKey {
            pid,
            tid,
            event,
            access,
            line: data.addr & !(CACHE_LINE_BYTES - 1),
            ip,
        };
        if bump(
            generation.pick(&DATA_LINES_0, &DATA_LINES_1),
            &line,
            &first,
            |stats| add_stats(stats, data.latency),
            LossKind::DataLinesFull,
        ) {
            count_new_keys(config, generation.index(), Fill::DataLines, 1);
        }
    }
    if data.latency != 0 {
        let mut created = record_latency(
            generation.pick(&LATENCIES_0, &LATENCIES_1),
            &LatencyKey { pid, event, ip },
            data.latency,
            LossKind::LatencyFull,
        );
        if data.flags & sample_flags::ADDR != 0 {
            let key = LineLatencyKey {
                pid,
                event,
                line: data.addr & !(CACHE_LINE_BYTES - 1),
            };
            created += record_latency(
                generation.pick(&LINE_LATENCIES_0, &LINE_LATENCIES_1),
                &key,
                data.latency,
                LossKind::LineLatencyFull,
            );
        }
        if created != 0 {
            count_new_keys(config, generation.index(), Fill::Histograms, created);
        }
    }
    let decoding = raw_decoding();
    // IBS samples go to the agent whole, data source included: it aggregates them with the
    // derived counters. `ibs_events` is a load-time constant, so runs without IBS events leave
    // this out of the program.
    let streamed = decoding.ibs_events() != 0
        && data.raw_payload != 0
        && decoding.is_ibs(event)
        && stream_ibs(pid, event, ip, data);
    // A load-time constant: runs without such events leave this out of the program.
    if !streamed
        && config.flags & CAPTURE_DATA_SOURCES != 0
        && data.flags & sample_flags::DATA_SRC != 0
    {
        let line = if data.flags & sample_flags::ADDR != 0 {
            data.addr & !(CACHE_LINE_BYTES - 1)
        } else {
            0
        };
        let key = DataSourceKey {
            pid,
            event,
            ip,
            line,
            data_src: data.data_src,
        };
        if bump(
            generation.pick(&DATA_SOURCES_0, &DATA_SOURCES_1),
            &key,
            &1,
            |count| *count += 1,
            LossKind::DataSourcesFull,
        ) {
            count_new_keys(config, generation.index(), Fill::DataSources, 1);
        }
    }
    if config.flags & CAPTURE_RAW != 0 {
        stream(ip, pid, tid, cgroup, event, user_stack, kernel_stack, data);
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn stream(
    ip: u64,
    pid: u32,
    tid: u32,
    cgroup: u64,
    event: u32,
    user_stack: u64,
    kernel_stack: u64,
    data: &SampleData,
) {
    let Some(mut entry) = RAW_SAMPLES.reserve::<RawSample>(0) else {
        lose(LossKind::RingBufferFull);
        return;
    };
    entry.write(RawSample {
        // SAFETY: helpers without arguments.
        time_ns: unsafe { bpf_ktime_get_ns() },
        ip,
        addr: data.addr,
        phys_addr: data.phys_addr,
        latency: data.latency,
        data_src: data.data_src,
        cgroup,
        pid,
        tid,
        cpu: unsafe { bpf_get_smp_processor_id() },
        event,
        user_stack,
        kernel_stack,
        sample_flags: data.flags,
    });
    entry.submit(0);
}
