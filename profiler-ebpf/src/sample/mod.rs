//! The overflow program: runs on every perf counter overflow, reads what the kernel recorded of
//! the sample, captures its stacks (by frame pointers, by the table walk in [`unwind_user`], or
//! as a copy for the agent to unwind) and counts it in the current generation.

mod aggregate;
mod ibs;
mod read;
mod stack_copy;

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_uid_gid},
    macros::{map, perf_event},
    maps::{PerCpuArray, ProgramArray},
    programs::PerfEventContext,
};
use profiler_common::{
    capture::{
        CaptureConfig, LossKind, CAPTURE_FILTER_CGROUP, CAPTURE_FILTER_UID, CAPTURE_STACK_COPY,
        CAPTURE_UNWIND_DWARF, CAPTURE_USER_STACKS, MAX_EVENTS,
    },
    stack::{LOST_STACK, NO_STACK},
};

use crate::{
    arch,
    generations::{enter_generation, leave_generation, Generation},
    maps::{add, config, lose, CGROUP_FILTER, SAMPLES_FILTERED},
    stacks::{
        capture_stack, mark_frame_pointers_only, stack_hash, user_stack_losses, FramesBuffer,
    },
    unwind::{continue_walk, start_walk, WalkState},
};
use aggregate::record;
use read::{forget_known_values, read_sample_data};
use stack_copy::copy_stacks;

/// Program runs per event index, counted before anything can fail.
#[map]
static SAMPLES_FIRED: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_EVENTS as u32, 0);

/// Sum of the sample periods per event index: the event count that frequency-sampled events
/// (whose period the kernel adjusts) stand for.
#[map]
static PERIOD_SUMS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_EVENTS as u32, 0);

/// What the kernel's `perf_sample_data` told us beyond the registers.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SampleData {
    flags: u64,
    addr: u64,
    phys_addr: u64,
    latency: u64,
    data_src: u64,
    /// The PERF_SAMPLE_RAW payload of an IBS sample (kernel address, 0 when none) and its bytes.
    raw_payload: u64,
    raw_size: u64,
}

#[perf_event]
pub fn on_overflow(ctx: PerfEventContext) -> u32 {
    capture(&ctx);
    0
}

fn capture(ctx: &PerfEventContext) {
    let config = config();
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // SAFETY: a helper without arguments.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };

    if config.flags & CAPTURE_FILTER_UID != 0 && bpf_get_current_uid_gid() as u32 != config.uid {
        add(&SAMPLES_FILTERED, 0, 1);
        return;
    }
    // SAFETY: lookups in a hash map whose values we only test for presence.
    if config.flags & CAPTURE_FILTER_CGROUP != 0 && unsafe { CGROUP_FILTER.get(&cgroup) }.is_none()
    {
        add(&SAMPLES_FILTERED, 0, 1);
        return;
    }

    let (event, data) = read_sample_data(ctx, &config);
    let Some(data) = forget_known_values(data) else {
        return;
    };
    let Some(event) = event else {
        lose(LossKind::UnknownEvent);
        return;
    };
    add(&SAMPLES_FIRED, event, 1);
    // SAFETY: the kernel rewrites this context read into a load of the sample's period.
    add(&PERIOD_SUMS, event, unsafe { (*ctx.ctx).sample_period });

    let generation = enter_generation();
    let sample = Sample {
        pid,
        tid,
        cgroup,
        event,
        generation,
        data,
    };
    // A load-time constant: runs with frame-pointer stacks leave the unwinder out.
    if config.flags & (CAPTURE_USER_STACKS | CAPTURE_UNWIND_DWARF)
        == CAPTURE_USER_STACKS | CAPTURE_UNWIND_DWARF
    {
        hand_to_unwinder(ctx, &sample);
    }
    // With stack copies the agent unwinds and counts the sample's stacks from its record; a
    // sample that could not be copied is counted here, with its frame-pointer stack. With the
    // table walk too (`--unwind check`), the walk counts the sample and copies it when it ends.
    let copied = config.flags & (CAPTURE_STACK_COPY | CAPTURE_UNWIND_DWARF) == CAPTURE_STACK_COPY
        && copy_stacks(ctx, &config, &sample, NO_STACK);
    let user_stack = if !copied && config.flags & CAPTURE_USER_STACKS != 0 {
        let losses = user_stack_losses();
        let mut captured = capture_stack(ctx, BPF_F_USER_STACK as u64, losses.failed);
        // Tables or a copy were asked for: say that this stack had neither.
        if config.flags & (CAPTURE_UNWIND_DWARF | CAPTURE_STACK_COPY) != 0 {
            captured = captured.map(|stack| stack.map(mark_frame_pointers_only));
        }
        stack_hash(captured, generation, &losses)
    } else {
        NO_STACK
    };
    finish_sample(ctx, &config, &sample, user_stack, copied);
}

/// A sample between its capture and its counting, which the unwinder's programs finish.
#[repr(C)]
#[derive(Clone, Copy)]
struct Sample {
    pid: u32,
    tid: u32,
    cgroup: u64,
    event: u32,
    /// The generation this sample entered (`INFLIGHT`), left when it is counted.
    generation: u32,
    data: SampleData,
}

/// Counts a sample whose user stack is known, and leaves its generation.
#[inline(always)]
fn finish_sample(
    ctx: &PerfEventContext,
    config: &CaptureConfig,
    sample: &Sample,
    user_stack: u64,
    copied: bool,
) {
    record(
        ctx,
        config,
        Generation {
            entered: &sample.generation,
        },
        sample.pid,
        sample.tid,
        sample.cgroup,
        sample.event,
        &sample.data,
        user_stack,
        copied,
    );
    leave_generation(sample.generation);
}

/// This CPU's sample being unwound, and where its walk is.
#[map]
static PENDING_SAMPLE: PerCpuArray<Sample> = PerCpuArray::with_max_entries(1, 0);

#[map]
static WALK_STATE: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(1, 0);

/// Index 0: the `unwind_user` program, which walks [`UNWIND_FRAMES_PER_RUN`] frames a run and
/// tail-calls itself until the stack is walked.
#[map]
static UNWINDER: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Hands the sample to the unwinder's programs, which count it; returns only when they cannot
/// take it (the agent has not loaded the process's mappings yet, a kernel thread, the tail call
/// failed): the sample goes on with the kernel's frame-pointer walk then.
#[inline(always)]
fn hand_to_unwinder(ctx: &PerfEventContext, sample: &Sample) {
    let Some(arch::UserFrame { regs, .. }) = arch::user_frame(ctx) else {
        return;
    };
    start_walk(
        ctx,
        regs,
        sample.pid,
        (&PENDING_SAMPLE, *sample),
        &WALK_STATE,
        &UNWINDER,
    );
}

/// Walks a few more frames of the pending sample's user stack, then goes on in a new run of
/// itself, or counts the sample once the walk has ended.
#[perf_event]
pub fn unwind_user(ctx: PerfEventContext) -> u32 {
    let Some(pending) = PENDING_SAMPLE.get(0) else {
        return 0;
    };
    let sample = *pending;
    let config = config();
    let walked = continue_walk(
        &ctx,
        &UNWINDER,
        sample.pid,
        sample.generation,
        &WALK_STATE,
        FramesBuffer::Sample,
    );
    if let Some(user_stack) = walked {
        finish_sample(&ctx, &config, &sample, user_stack, false);
        // `--unwind check`: the same sample's stack copy, which the agent unwinds and compares
        // with this walk's stack (the stack has not changed: the thread is interrupted).
        if config.flags & CAPTURE_STACK_COPY != 0 && user_stack != LOST_STACK {
            copy_stacks(&ctx, &config, &sample, user_stack);
        }
    }
    0
}
