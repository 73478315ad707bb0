//! Off-CPU time: programs on the scheduler's switch. When a thread in scope leaves the CPU they
//! remember when, its state and its stacks (content-addressed, as the overflow samples'); when
//! it runs again they add the time it was off to its (thread, stacks, state) key and to a
//! histogram of block durations, in the generation the agent drains.
//!
//! Two attachments of the same logic, the agent picks one at load: the BTF-enabled
//! `tp_btf/sched_switch` (task pointers, fields read at BTF offsets), and the classic
//! `sched:sched_switch` tracepoint, whose record carries the pids and state itself (kernels or
//! builds without BTF). Processes in scope fork into scope through `sched_process_fork`.

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_uid_gid,
        bpf_ktime_get_ns, bpf_probe_read_kernel, generated::bpf_get_current_task,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{HashMap, PerCpuArray, PerCpuHashMap, ProgramArray},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use profiler_common::{
    capture::{
        CaptureConfig, LossKind, CAPTURE_FILTER_CGROUP, CAPTURE_FILTER_UID, CAPTURE_KERNEL_STACKS,
        CAPTURE_USER_STACKS,
    },
    latency::LatencyBuckets,
    offcpu::{
        BlockState, Blocked, OffCpuConfig, OffCpuCount, OffCpuKey, OffCpuStats, Waker,
        HISTOGRAM_UNIT_NS, OFFCPU_ALL, OFFCPU_DWARF, OFFCPU_WAKERS,
    },
    stack::NO_STACK,
};

use crate::{
    arch,
    generations::{enter_generation, leave_generation, Generation},
    maps::{add, bump, config, lose, record_latency, CGROUP_FILTER, SAMPLES_FILTERED},
    stacks::{capture_stack_into, stack_hash, user_stack_losses, FramesBuffer, StackLosses},
    unwind::{continue_walk, start_walk, WalkState},
};

/// Read-only options, set by the agent at load time.
#[unsafe(no_mangle)]
static OFFCPU_CONFIG: OffCpuConfig = OffCpuConfig::EMPTY;

/// Thread id -> the block it is in, from its switch off the CPU to its switch back; closed
/// after that, and reused by its next block, until the thread exits.
#[map]
static OFFCPU_BLOCKED: HashMap<u32, Blocked> = HashMap::with_max_entries(16384, 0);
/// Process ids in scope (without `OFFCPU_ALL`): the command or `-p` processes and what they fork.
#[map]
static OFFCPU_SCOPE: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);
#[map]
static OFFCPU_STATS_0: PerCpuHashMap<OffCpuKey, OffCpuStats> =
    PerCpuHashMap::with_max_entries(16384, 0);
#[map]
static OFFCPU_STATS_1: PerCpuHashMap<OffCpuKey, OffCpuStats> =
    PerCpuHashMap::with_max_entries(16384, 0);
/// Block durations in `HISTOGRAM_UNIT_NS` per key.
#[map]
static OFFCPU_HISTOGRAMS_0: PerCpuHashMap<OffCpuKey, LatencyBuckets> =
    PerCpuHashMap::with_max_entries(4096, 0);
#[map]
static OFFCPU_HISTOGRAMS_1: PerCpuHashMap<OffCpuKey, LatencyBuckets> =
    PerCpuHashMap::with_max_entries(4096, 0);
/// `OffCpuCount` index -> count, per CPU.
#[map]
static OFFCPU_COUNTS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(OffCpuCount::COUNT as u32, 0);
/// A block whose user stack the unwinder is walking, between its tail calls.
#[repr(C)]
#[derive(Clone, Copy)]
struct PendingBlock {
    blocked: Blocked,
    tid: u32,
    /// The generation the switch entered (`INFLIGHT`), left when the block is remembered.
    generation: u32,
}

#[map]
static OFFCPU_PENDING: PerCpuArray<PendingBlock> = PerCpuArray::with_max_entries(1, 0);
#[map]
static OFFCPU_WALK: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(1, 0);
/// Index 0: `offcpu_unwind`, which walks a user stack as `unwind_user` does, tail-calling itself.
#[map]
static OFFCPU_UNWINDER: ProgramArray = ProgramArray::with_max_entries(1, 0);

#[inline(always)]
fn offcpu_config() -> OffCpuConfig {
    // SAFETY: a plain read of our own read-only global; volatile so the compiler cannot fold
    // the all-zero initializer that the agent overrides at load time.
    unsafe { core::ptr::read_volatile(&OFFCPU_CONFIG) }
}

#[inline(always)]
fn count(what: OffCpuCount) {
    add(&OFFCPU_COUNTS, what as u32, 1);
}

/// A task field at a BTF offset (a `u32`: pids, and the low half of the task state).
#[inline(always)]
fn task_u32(task: u64, offset: u32) -> Option<u32> {
    // SAFETY: kernel memory read through the checking helper, which fails cleanly.
    unsafe { bpf_probe_read_kernel((task + u64::from(offset)) as *const u32) }.ok()
}

/// `tp_btf/sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...)`.
#[btf_tracepoint(function = "sched_switch")]
pub fn offcpu_switch(ctx: BtfTracePointContext) -> u32 {
    let options = offcpu_config();
    let preempt: u64 = ctx.arg(0);
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    let state = task_u32(prev, options.task_state).unwrap_or(0);
    let next_tid = task_u32(next, options.task_pid).unwrap_or(0);
    // Only read to tell unmatched switches of processes in scope.
    let next_pid = || task_u32(next, options.task_tgid).unwrap_or(0);
    on_switch(
        &ctx,
        &options,
        BlockState::of_task(preempt & 1 != 0, u64::from(state)),
        next_tid,
        next_pid,
    );
    0
}

/// The classic `sched:sched_switch` record (stable since Linux 4.x): `prev_state` is the
/// reported state.
const SWITCH_PREV_STATE: usize = 32;
const SWITCH_NEXT_PID: usize = 56;

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn offcpu_switch_tracepoint(ctx: TracePointContext) -> u32 {
    let options = offcpu_config();
    // SAFETY: reads inside the tracepoint record through the checking helper.
    let state: u64 = unsafe { ctx.read_at(SWITCH_PREV_STATE) }.unwrap_or(0);
    // SAFETY: as above.
    let next_tid: u32 = unsafe { ctx.read_at(SWITCH_NEXT_PID) }.unwrap_or(0);
    on_switch(
        &ctx,
        &options,
        BlockState::of_reported(state),
        next_tid,
        // The record has no process id of the next task: no unmatched count.
        || 0,
    );
    0
}

/// `tp_btf/sched_process_fork(struct task_struct *parent, struct task_struct *child)`.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn offcpu_fork(ctx: BtfTracePointContext) -> u32 {
    let options = offcpu_config();
    let child: u64 = ctx.arg(1);
    let pid = task_u32(child, options.task_tgid).unwrap_or(0);
    follow_fork(&options, pid);
    0
}

/// `sched:sched_process_fork`: `child_pid` (the new task's id) at 44.
#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn offcpu_fork_tracepoint(ctx: TracePointContext) -> u32 {
    // SAFETY: a read inside the tracepoint record through the checking helper.
    let child: u32 = unsafe { ctx.read_at(44) }.unwrap_or(0);
    follow_fork(&offcpu_config(), child);
    0
}

/// A process in scope forked `child` (a process, or a thread of its own): it is in scope too.
#[inline(always)]
fn follow_fork(options: &OffCpuConfig, child: u32) {
    if options.flags & OFFCPU_ALL != 0 || child == 0 {
        return;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: only tested for presence.
    if parent != child && unsafe { OFFCPU_SCOPE.get(&parent) }.is_some() {
        let _ = OFFCPU_SCOPE.insert(&child, &1, 0);
    }
}

/// Whether the current task (the one leaving the CPU) is in scope.
#[inline(always)]
fn in_scope(options: &OffCpuConfig, config: &CaptureConfig, pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: only tested for presence.
    if options.flags & OFFCPU_ALL == 0 && unsafe { OFFCPU_SCOPE.get(&pid) }.is_none() {
        return false;
    }
    if config.flags & CAPTURE_FILTER_UID != 0 && bpf_get_current_uid_gid() as u32 != config.uid {
        add(&SAMPLES_FILTERED, 0, 1);
        return false;
    }
    // SAFETY: a helper without arguments; the lookup is only tested for presence.
    if config.flags & CAPTURE_FILTER_CGROUP != 0
        && unsafe { CGROUP_FILTER.get(&bpf_get_current_cgroup_id()) }.is_none()
    {
        add(&SAMPLES_FILTERED, 0, 1);
        return false;
    }
    true
}

/// One context switch: the block of `next_tid` ends, the current task's begins (`state`:
/// `None` when it leaves for the last time).
#[inline(always)]
fn on_switch(
    ctx: &impl EbpfContext,
    options: &OffCpuConfig,
    state: Option<BlockState>,
    next_tid: u32,
    next_pid: impl Fn() -> u32,
) {
    // SAFETY: helpers without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let config = config();
    // Inside a generation, as an overflow sample: the agent drains the one left.
    let generation = enter_generation();
    end_block(options, generation, now, next_tid, next_pid);
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    match state {
        Some(state) if in_scope(options, &config, pid) => {
            // Returns only when the unwinder did not take the block over (it leaves the
            // generation).
            begin_block(ctx, options, &config, generation, now, pid, tid, state);
        }
        Some(_) => {}
        // SAFETY: only tested for presence.
        None if unsafe { OFFCPU_BLOCKED.get(&tid) }.is_some() => {
            let _ = OFFCPU_BLOCKED.remove(&tid);
        }
        None => {}
    }
    leave_generation(generation);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn begin_block(
    ctx: &impl EbpfContext,
    options: &OffCpuConfig,
    config: &CaptureConfig,
    generation: u32,
    now: u64,
    pid: u32,
    tid: u32,
    state: BlockState,
) {
    let kernel_stack = kernel_stack(ctx, config, generation);
    let mut blocked = Blocked {
        start_ns: now,
        pid,
        state: state as u32,
        user_stack: NO_STACK,
        kernel_stack,
        // SAFETY: a helper without arguments.
        cgroup: unsafe { bpf_get_current_cgroup_id() },
        waker: Waker::NONE,
    };
    if config.flags & CAPTURE_USER_STACKS != 0 {
        if options.flags & OFFCPU_DWARF != 0 {
            hand_to_unwinder(ctx, &blocked, tid, generation);
        }
        blocked.user_stack = frame_pointer_user_stack(ctx, generation);
    }
    remember(options, generation, tid, &blocked);
}

/// The current task's kernel stack, content-addressed; `NO_STACK` when not collected.
#[inline(always)]
fn kernel_stack(ctx: &impl EbpfContext, config: &CaptureConfig, generation: u32) -> u64 {
    if config.flags & CAPTURE_KERNEL_STACKS == 0 {
        return NO_STACK;
    }
    let losses = StackLosses {
        collision: LossKind::KernelStackHashCollision,
        full: LossKind::KernelStackFramesFull,
        failed: LossKind::KernelStackFailed,
    };
    stack_hash(
        capture_stack_into(ctx, FramesBuffer::OffCpu, 0, losses.failed),
        generation,
        &losses,
    )
}

/// The current task's user stack by the kernel's frame-pointer walk, from the user registers
/// the task entered the kernel with, content-addressed.
#[inline(always)]
fn frame_pointer_user_stack(ctx: &impl EbpfContext, generation: u32) -> u64 {
    let losses = user_stack_losses();
    stack_hash(
        capture_stack_into(
            ctx,
            FramesBuffer::OffCpu,
            BPF_F_USER_STACK as u64,
            losses.failed,
        ),
        generation,
        &losses,
    )
}

/// `tp_btf/sched_waking(struct task_struct *p)`, in the waker's context.
#[btf_tracepoint(function = "sched_waking")]
pub fn offcpu_waking(ctx: BtfTracePointContext) -> u32 {
    let wakee: u64 = ctx.arg(0);
    let tid = task_u32(wakee, offcpu_config().task_pid).unwrap_or(0);
    note_waker(&ctx, tid);
    0
}

/// The classic `sched:sched_waking` record: the woken task's `pid` at 24, after its `comm`.
const WAKING_PID: usize = 24;

#[tracepoint(category = "sched", name = "sched_waking")]
pub fn offcpu_waking_tracepoint(ctx: TracePointContext) -> u32 {
    // SAFETY: a read inside the tracepoint record through the checking helper.
    let tid: u32 = unsafe { ctx.read_at(WAKING_PID) }.unwrap_or(0);
    note_waker(&ctx, tid);
    0
}

/// `--wakers`: the current task is waking thread `tid`; if that thread's block is remembered
/// (it is in scope, off the CPU), the block keeps who woke it and the waker's stacks. A wake-up
/// from an interrupt (a timer's expiry) has the interrupted task as its waker, with the
/// interrupt's kernel stack.
#[inline(always)]
fn note_waker(ctx: &impl EbpfContext, tid: u32) {
    if tid == 0 {
        return;
    }
    let Some(blocked) = OFFCPU_BLOCKED.get_ptr_mut(&tid) else {
        return;
    };
    // SAFETY: a map value the kernel keeps alive; only read here.
    if !unsafe { (*blocked).is_open() } {
        return;
    }
    let config = config();
    let generation = enter_generation();
    let pid_tgid = bpf_get_current_pid_tgid();
    let waker = Waker {
        seen: 1,
        _pad: 0,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        user_stack: if config.flags & CAPTURE_USER_STACKS != 0 {
            frame_pointer_user_stack(ctx, generation)
        } else {
            NO_STACK
        },
        kernel_stack: kernel_stack(ctx, &config, generation),
    };
    // SAFETY: the thread's own entry, written only here and at its switches, which a wake-up
    // of it precedes (one racing the switch that begins the block finds it closed, or writes a
    // waker the switch then clears: the block counts as woken unseen).
    unsafe { (*blocked).waker = waker };
    leave_generation(generation);
}

/// Remembers a thread's block until it runs again, in the thread's entry when it has one. A
/// block still open there is one whose end was never seen: it is closed where the thread's time
/// on the CPU since began, or counted lost, and replaced.
#[inline(always)]
fn remember(options: &OffCpuConfig, generation: u32, tid: u32, blocked: &Blocked) {
    if let Some(entry) = OFFCPU_BLOCKED.get_ptr_mut(&tid) {
        // SAFETY: the thread's own entry; its switches do not run at once.
        let missed = unsafe { *entry };
        if missed.is_open() {
            match on_cpu_since(options, blocked.start_ns) {
                Some(back) if back > missed.start_ns => {
                    close_block(options, generation, back, tid, &missed);
                    count(OffCpuCount::SwitchInRecovered);
                }
                _ => lose(LossKind::OffCpuSwitchInMissed),
            }
        }
        // SAFETY: as above.
        unsafe { *entry = *blocked };
    } else if OFFCPU_BLOCKED
        .insert(&tid, blocked, BPF_NOEXIST as u64)
        .is_err()
    {
        lose(LossKind::OffCpuBlockedFull);
        return;
    }
    count(OffCpuCount::SwitchesOut);
}

/// When the current task (leaving the CPU at `now`) last came onto it: `now` less its run time
/// since, which the fair scheduler counts from the moment it put the task on the CPU. `None`
/// without the fields' offsets, and for the other scheduling classes, which do not keep that
/// moment.
#[inline(always)]
fn on_cpu_since(options: &OffCpuConfig, now: u64) -> Option<u64> {
    /// `SCHED_NORMAL`, `SCHED_BATCH`, `SCHED_IDLE`: the fair class's policies.
    const FAIR_POLICIES: [u32; 3] = [0, 3, 5];
    if options.task_runtime == 0 {
        return None;
    }
    // SAFETY: a helper without arguments; the task is only read through the checking helper.
    let task = unsafe { bpf_get_current_task() };
    let policy = task_u32(task, options.task_policy)?;
    if !FAIR_POLICIES.contains(&policy) {
        return None;
    }
    let field = |offset: u32| {
        // SAFETY: kernel memory read through the checking helper, which fails cleanly.
        unsafe { bpf_probe_read_kernel((task + u64::from(offset)) as *const u64) }.ok()
    };
    let on_cpu = field(options.task_runtime)?.checked_sub(field(options.task_slice_start)?)?;
    now.checked_sub(on_cpu)
}

/// Hands the block to the unwinder program, which remembers it with its user stack; returns
/// only when it cannot take it (a kernel thread, a process whose mappings the agent has not
/// loaded yet, a failed tail call): frame pointers then.
#[inline(always)]
fn hand_to_unwinder(ctx: &impl EbpfContext, blocked: &Blocked, tid: u32, generation: u32) {
    let Some(arch::UserFrame { regs, .. }) = arch::saved_user_frame() else {
        return;
    };
    let pending = PendingBlock {
        blocked: *blocked,
        tid,
        generation,
    };
    start_walk(
        ctx,
        regs,
        blocked.pid,
        (&OFFCPU_PENDING, pending),
        &OFFCPU_WALK,
        &OFFCPU_UNWINDER,
    );
}

/// Walks the pending block's user stack, a run at a time, then remembers the block with it.
#[btf_tracepoint(function = "sched_switch")]
pub fn offcpu_unwind(ctx: BtfTracePointContext) -> u32 {
    let Some(pending) = OFFCPU_PENDING.get(0) else {
        return 0;
    };
    let mut pending = *pending;
    if let Some(user_stack) = continue_walk(
        &ctx,
        &OFFCPU_UNWINDER,
        pending.blocked.pid,
        pending.generation,
        &OFFCPU_WALK,
        FramesBuffer::OffCpu,
    ) {
        pending.blocked.user_stack = user_stack;
        remember(
            &offcpu_config(),
            pending.generation,
            pending.tid,
            &pending.blocked,
        );
    }
    leave_generation(pending.generation);
    0
}

#[inline(always)]
fn end_block(options: &OffCpuConfig, generation: u32, now: u64, tid: u32, pid: impl Fn() -> u32) {
    let open = OFFCPU_BLOCKED.get_ptr_mut(&tid).and_then(|entry| {
        // SAFETY: the thread's own entry; its switches do not run at once. Copied out, then
        // closed in place: the thread's next block reuses it.
        unsafe {
            let blocked = *entry;
            (*entry).start_ns = Blocked::CLOSED;
            blocked.is_open().then_some(blocked)
        }
    });
    let Some(blocked) = open else {
        let pid = pid();
        // SAFETY: only tested for presence.
        if tid != 0 && pid != 0 && unsafe { OFFCPU_SCOPE.get(&pid) }.is_some() {
            count(OffCpuCount::Unmatched);
        }
        return;
    };
    close_block(options, generation, now, tid, &blocked);
}

/// Adds the block `blocked` of thread `tid`, ended at `now`, to the generation's maps.
#[inline(always)]
fn close_block(options: &OffCpuConfig, generation: u32, now: u64, tid: u32, blocked: &Blocked) {
    let blocked_ns = now.saturating_sub(blocked.start_ns);
    let stacked = blocked_ns >= options.min_block_ns;
    let key = OffCpuKey {
        pid: blocked.pid,
        tid,
        state: blocked.state,
        _pad: 0,
        user_stack: if stacked {
            blocked.user_stack
        } else {
            NO_STACK
        },
        kernel_stack: if stacked {
            blocked.kernel_stack
        } else {
            NO_STACK
        },
        cgroup: blocked.cgroup,
        waker: if stacked { blocked.waker } else { Waker::NONE },
    };
    count(if stacked {
        OffCpuCount::Blocks
    } else {
        OffCpuCount::ShortBlocks
    });
    // A sleeping thread runs again only once woken: a waker must have been seen.
    if stacked
        && options.flags & OFFCPU_WAKERS != 0
        && blocked.waker.seen == 0
        && (blocked.state == BlockState::Sleeping as u32
            || blocked.state == BlockState::Uninterruptible as u32)
    {
        count(OffCpuCount::WakerNotSeen);
    }
    let generation = Generation {
        entered: &generation,
    };
    let first = OffCpuStats {
        total_ns: blocked_ns,
        count: 1,
        max_ns: blocked_ns,
    };
    bump(
        generation.pick(&OFFCPU_STATS_0, &OFFCPU_STATS_1),
        &key,
        &first,
        |stats| {
            stats.total_ns += blocked_ns;
            stats.count += 1;
            if blocked_ns > stats.max_ns {
                stats.max_ns = blocked_ns;
            }
        },
        LossKind::OffCpuFull,
    );
    // Zero-length blocks have no bucket of their own worth keeping: the unit's first bucket.
    record_latency(
        generation.pick(&OFFCPU_HISTOGRAMS_0, &OFFCPU_HISTOGRAMS_1),
        &key,
        blocked_ns / HISTOGRAM_UNIT_NS,
        LossKind::OffCpuHistogramFull,
    );
}
