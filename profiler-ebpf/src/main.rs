//! The capture program: runs on every perf counter overflow, records who was running where, and
//! aggregates in per-CPU maps that the agent drains.
//!
//! Call stacks are content-addressed: each is written into a per-CPU frames buffer, named by the
//! hash of its frames, and stored once in the stack-frames map (both generations share it);
//! samples are counted under the hashes.
//!
//! Every map the agent drains exists twice (generation 0 and 1). The program writes to the
//! generation named in `CONTROL`; the agent flips it, waits until no program is still writing the
//! old one (`INFLIGHT`), drains the old one and clears it. Nothing written during a drain is lost
//! or counted twice.
#![no_std]
#![no_main]

mod arch;
mod offcpu;

use aya_ebpf::{
    bindings::{
        BPF_F_MMAPABLE, BPF_F_USER_STACK, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP,
        BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
    },
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_uid_gid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
    },
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, ProgramArray, RingBuf},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    capture::{
        access_of_data_source, fill_index, sample_flags, CaptureConfig, DataLineKey, DataSourceKey,
        Fill, IbsRecord, InstructionKey, LatencyKey, LineLatencyKey, LossKind, RawDecoding,
        RawSample, SampleStats, StackCopyHeader, StackCopyRecord, StackKey, ACCESS_UNKNOWN,
        CACHE_LINE_BYTES, CAPTURE_DATA_SOURCES, CAPTURE_EVENT_IDS, CAPTURE_FILTER_CGROUP,
        CAPTURE_FILTER_UID, CAPTURE_INSTRUCTIONS, CAPTURE_KERNEL_STACKS,
        CAPTURE_QUIET_NEW_PROCESSES, CAPTURE_RAW, CAPTURE_STACK_COPY, CAPTURE_UNWIND_DWARF,
        CAPTURE_USER_STACKS, CONTROL_GENERATION, IBS_PAYLOAD_MAX_BYTES, IBS_PAYLOAD_MIN_BYTES,
        MAX_EVENTS, OFFSETS_SAMPLE_FLAGS, STACK_COPY_KERNEL_FRAMES, STACK_COPY_MAX_PAGES,
        STACK_COPY_PAGE_BYTES,
    },
    hw::ibs::IbsOpSample,
    latency::{bucket_index, LatencyBuckets, LATENCY_BUCKETS},
    stack::{
        intern, Refused, StackFrames, StackLoss, StackStore, LOST_STACK, MAX_STACK_DEPTH, NO_STACK,
    },
    unwind::{find_row_by, is_row_for, step, Caller, CfaRule, Registers, StepEnd, UnwindRow},
    unwind_maps::{
        use_stamp, ExecMapping, ProcessMappings, UnwindCount, FRAME_POINTERS_ONLY_FRAME,
        MAX_UNWIND_FRAMES, TABLE_NOT_LOADED, TRUNCATED_FRAME, UNWIND_FRAMES_PER_RUN,
    },
};

/// Read-only options and kernel offsets, set by the agent at load time.
#[unsafe(no_mangle)]
static CAPTURE_CONFIG: CaptureConfig = CaptureConfig::EMPTY;

// Sizes here are defaults; the agent sets the real ones from its options before loading.
/// Stack hash -> frames, for every stack the agent has not taken into its stack cache yet.
/// Inserted only when new; only the agent deletes (after copying).
#[map]
static STACK_FRAMES: HashMap<u64, StackFrames> = HashMap::with_max_entries(32768, 0);
/// Per-CPU frames buffers ([`FramesBuffer`]): a stack is captured in one, then interned from
/// there.
#[map]
static STACK_SCRATCH: PerCpuArray<StackFrames> =
    PerCpuArray::with_max_entries(FramesBuffer::COUNT, 0);

/// This CPU's frames buffers, by their index in [`STACK_SCRATCH`]: a number, which a global
/// function can be handed on every kernel (a pointer argument needs 5.12, and 6.1 refuses one
/// as a map helper's value), and one map, so that the verifier checks what follows a lookup
/// once for every buffer.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq)]
enum FramesBuffer {
    /// Samples' stacks.
    Sample = 0,
    /// Stacks of blocked threads: an overflow sample (an NMI) may interrupt the switch and
    /// wake-up programs, and has its own; a switch runs with interrupts off, so a wake-up in an
    /// interrupt never interrupts one.
    OffCpu = 1,
}

impl FramesBuffer {
    const COUNT: u32 = 2;

    /// This CPU's buffer.
    #[inline(always)]
    fn get(self) -> Option<*mut StackFrames> {
        STACK_SCRATCH.get_ptr_mut(self as u32)
    }
}
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

/// Index `CONTROL_GENERATION`: the generation the program writes to.
#[map]
static CONTROL: Array<u32> = Array::with_max_entries(1, 0);
/// Entries each generation has created in each of its maps, per CPU (index `fill_index`): the
/// agent drains early when the generation it is not draining fills up.
#[map]
static NEW_KEYS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2 * Fill::COUNT as u32, 0);
/// A `Fill` index each time a CPU has created `drain_request_steps` more entries in one map:
/// wakes the agent to check the fill between its timer ticks, however fast samples come.
#[map]
static DRAIN_REQUESTS: RingBuf = RingBuf::with_byte_size(4096, 0);
/// Programs currently writing each generation, per CPU.
#[map]
static INFLIGHT: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);
/// Program runs per event index, counted before anything can fail.
#[map]
static SAMPLES_FIRED: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_EVENTS as u32, 0);
/// Sum of the sample periods per event index: the event count that frequency-sampled events
/// (whose period the kernel adjusts) stand for.
#[map]
static PERIOD_SUMS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_EVENTS as u32, 0);
/// Samples dropped by the uid or cgroup filter (not losses: the user asked for it).
#[map]
static SAMPLES_FILTERED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map]
static LOSSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(LossKind::COUNT as u32, 0);
/// perf event id (of the top-level event; inherited events report their parent's) -> index.
#[map]
static EVENT_IDS: HashMap<u64, u32> = HashMap::with_max_entries(4096, 0);
/// Cgroup ids whose samples are kept, with `CAPTURE_FILTER_CGROUP`.
#[map]
static CGROUP_FILTER: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);
/// Time-ordered stream of every sample, with `CAPTURE_RAW`.
#[map]
static RAW_SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 22, 0);
/// The registers of every IBS sample, for the derived counters the agent accumulates.
#[map]
static IBS_SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 22, 0);
/// With `CAPTURE_STACK_COPY`: every sample's user registers, user stack and kernel frames.
#[map]
static STACK_COPIES: RingBuf = RingBuf::with_byte_size(1 << 22, 0);
/// Where a sample's stack-copy record is built, one per CPU (too large for a per-CPU array,
/// whose values the kernel caps at 32 KiB); the agent sizes it to the possible CPUs.
#[map]
static STACK_COPY_SCRATCH: Array<StackCopyRecord> = Array::with_max_entries(1, 0);

/// Unwind rows of every file the agent has loaded, each file's table once, in one arena that
/// processes' mappings index into. Memory-mapped by the agent, which writes rows there before
/// any mapping names them.
#[map]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// Row indexes found lately, by table and offset: samples unwind through the same few return
/// addresses again and again, and a remembered index takes two row reads where a search takes
/// up to 24. Checked against the table before use (`is_row_for`), so an entry left by a table
/// since evicted or replaced, or torn by two CPUs writing it at once, is only a miss: shared by
/// every CPU and process, and never invalidated.
#[map]
static ROW_CACHE: Array<RememberedRow> = Array::with_max_entries(ROW_CACHE_SLOTS, 0);
const ROW_CACHE_SLOTS: u32 = 4096;

#[repr(C)]
#[derive(Clone, Copy)]
struct RememberedRow {
    /// The table's first row in `UNWIND_ROWS` (high half) and the offset looked up (low half).
    key: u64,
    index: u32,
    _pad: u32,
}

/// Process id -> its executable mappings, for `CAPTURE_UNWIND_DWARF`. Preallocated (sized by
/// the agent): kernels before 6.1 refuse other hash maps in perf_event programs.
#[map]
static UNWIND_PROCESSES: HashMap<u32, ProcessMappings> = HashMap::with_max_entries(1, 0);
/// Process ids sampled before the agent loaded their mappings: wakes the agent to load them now
/// rather than at its next side-band tick.
#[map]
static UNWIND_REQUESTS: RingBuf = RingBuf::with_byte_size(4096, 0);
/// `UnwindCount` index -> what the unwinder did, per CPU.
#[map]
static UNWIND_COUNTS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(UnwindCount::COUNT as u32, 0);

const EEXIST: i64 = 17;
const EFAULT: i64 = 14;

/// The generation a sample or an off-CPU block entered, whose maps count it. Each map is picked
/// where it is used, from the number read anew: once the map's pointers are dead the
/// verifier's states of both generations are the same again and it checks what follows once.
/// Maps picked once, up front, stay in its state to the end, and it checked everything after
/// the pick twice (the kernel stack's hashing among it).
#[derive(Clone, Copy)]
struct Generation<'a> {
    entered: &'a u32,
}

impl Generation<'_> {
    /// 0 or 1. A volatile load, so the compiler keeps no copy that an earlier pick narrowed,
    /// and the `& 1` is a new value to the verifier, whose branch on it narrows nothing else.
    #[inline(always)]
    fn index(self) -> u32 {
        // SAFETY: a reference is valid for reads.
        (unsafe { core::ptr::read_volatile(self.entered) }) & 1
    }

    /// This generation's map of the pair; picked in code, as BPF data sections cannot hold the
    /// maps' relocations.
    #[inline(always)]
    fn pick<T>(self, zero: &'static T, one: &'static T) -> &'static T {
        if self.index() == 0 {
            zero
        } else {
            one
        }
    }
}

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

#[inline(always)]
fn config() -> CaptureConfig {
    // SAFETY: a plain read of our own read-only global; volatile so the compiler cannot fold
    // the all-zero initializer that the agent overrides at load time.
    unsafe { core::ptr::read_volatile(&CAPTURE_CONFIG) }
}

#[inline(always)]
fn add(counter: &PerCpuArray<u64>, index: u32, n: u64) {
    if let Some(slot) = counter.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and programs do not nest on one CPU (the kernel's
        // bpf_prog_active guard), so nothing else writes it concurrently.
        unsafe { *slot += n };
    }
}

/// Counts `new` new entries in the maps of `fill` in `generation`, and asks the agent to look at
/// the fills each time this CPU's count passes a multiple of `drain_request_steps`.
#[inline(always)]
fn count_new_keys(config: &CaptureConfig, generation: u32, fill: Fill, new: u64) {
    let Some(slot) = NEW_KEYS.get_ptr_mut(fill_index(generation, fill)) else {
        return;
    };
    // SAFETY: per-CPU slot, and programs do not nest on one CPU.
    let created = unsafe {
        *slot += new;
        *slot
    };
    let step = u64::from(config.drain_request_steps[fill as usize]);
    if step != 0 && (created - new) / step != created / step {
        // A full request ring only means the agent already has requests to read.
        let _ = DRAIN_REQUESTS.output::<u32>(&(fill as u32), BPF_RB_FORCE_WAKEUP as u64);
    }
}

#[inline(always)]
fn lose(kind: LossKind) {
    add(&LOSSES, kind as u32, 1);
}

#[inline(always)]
fn current_generation() -> u32 {
    match CONTROL.get_ptr(CONTROL_GENERATION) {
        // SAFETY: pointer into the control array value; volatile because the agent changes it.
        Some(generation) => (unsafe { core::ptr::read_volatile(generation) }) & 1,
        None => 0,
    }
}

/// Enters the current generation, checking it did not flip in between: the agent waits for
/// `INFLIGHT` of the old generation to reach zero before draining it. Left by
/// [`leave_generation`].
#[inline(always)]
fn enter_generation() -> u32 {
    let mut generation = current_generation();
    add(&INFLIGHT, generation, 1);
    let now = current_generation();
    if now != generation {
        leave_generation(generation);
        generation = now;
        add(&INFLIGHT, generation, 1);
    }
    generation
}

#[inline(always)]
fn leave_generation(generation: u32) {
    add(&INFLIGHT, generation & 1, u64::MAX);
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

#[inline(always)]
fn user_stack_losses() -> StackLosses {
    StackLosses {
        collision: LossKind::UserStackHashCollision,
        full: LossKind::UserStackFramesFull,
        failed: LossKind::UserStackFailed,
    }
}

/// The event index and, with BTF offsets, the sample's data address, latency and data source;
/// for AMD IBS op events also decoded from the op registers in PERF_SAMPLE_RAW.
#[inline(always)]
fn read_sample_data(ctx: &PerfEventContext, config: &CaptureConfig) -> (Option<u32>, SampleData) {
    let mut data = SampleData::default();
    let offsets = &config.offsets;
    if offsets.valid == 0 {
        return (Some(0), data);
    }
    // The context is really `struct bpf_perf_event_data_kern { regs, data, event }`: three
    // pointers. Read them whole and pick by the BTF offsets, so no arithmetic is done on the
    // context pointer itself.
    // SAFETY: bpf_probe_read_kernel checks the source and fails cleanly on a bad address.
    let Ok(kern) = (unsafe { bpf_probe_read_kernel(ctx.as_ptr() as *const [u64; 3]) }) else {
        lose(LossKind::SampleDataReadFailed);
        return (event_index(0, config), data);
    };
    let pick = |offset: u32| match offset {
        0 => kern[0],
        8 => kern[1],
        16 => kern[2],
        _ => 0,
    };
    let sample = pick(offsets.ctx_data);
    let perf_event = pick(offsets.ctx_event);
    let event = event_index(perf_event, config);
    if sample == 0 {
        lose(LossKind::SampleDataReadFailed);
        return (event, data);
    }
    let read = |offset: u32| -> Option<u64> {
        // SAFETY: reads a u64 from kernel memory through the checking helper.
        unsafe { bpf_probe_read_kernel((sample + offset as u64) as *const u64) }.ok()
    };
    // Before Linux 6.1 there are no sample_flags: the kernel fills what sample_type asks for.
    let flags = if offsets.valid & OFFSETS_SAMPLE_FLAGS != 0 {
        read(offsets.sample_flags)
    } else if perf_event != 0 {
        // SAFETY: reads a u64 from kernel memory through the checking helper.
        unsafe {
            bpf_probe_read_kernel((perf_event + offsets.event_sample_type as u64) as *const u64)
        }
        .ok()
    } else {
        None
    };
    let Some(flags) = flags else {
        lose(LossKind::SampleDataReadFailed);
        return (event, data);
    };
    data.flags = flags;
    // A field is valid only when the PMU driver set its bit; otherwise it is stale memory.
    if flags & sample_flags::ADDR != 0 {
        data.addr = read(offsets.addr).unwrap_or(0);
        // The kernel fills a 0 for events that have no address (clocks, context switches):
        // no data line for those, or every clock sample would cost a map update for nothing.
        if data.addr == 0 {
            data.flags &= !sample_flags::ADDR;
        }
    }
    if flags & sample_flags::PHYS_ADDR != 0 {
        data.phys_addr = read(offsets.phys_addr).unwrap_or(0);
    }
    if flags & sample_flags::WEIGHT_STRUCT != 0 {
        // union perf_sample_weight: var1 (the cache/load latency) is the low 32 bits.
        data.latency = read(offsets.weight).unwrap_or(0) & 0xffff_ffff;
    } else if flags & sample_flags::WEIGHT != 0 {
        data.latency = read(offsets.weight).unwrap_or(0);
    }
    if flags & sample_flags::DATA_SRC != 0 {
        data.data_src = read(offsets.data_src).unwrap_or(0);
    }
    let decoding = raw_decoding();
    // The IBS event bits are load-time constants: without IBS events the verifier drops these
    // branches instead of walking the decoder on every path.
    if decoding.ibs_events() != 0 && event.is_some_and(|event| decoding.is_ibs(event)) {
        // Without PERF_SAMPLE_RAW there are no registers to read: counted like unreadable ones.
        let raw = if flags & sample_flags::RAW != 0 {
            read(offsets.raw)
        } else {
            None
        };
        match raw.and_then(|raw| raw_payload(raw, offsets)) {
            Some((payload, size)) => {
                data.raw_payload = payload;
                data.raw_size = size;
            }
            None => lose(LossKind::IbsRegistersUnreadable),
        }
    }
    if decoding.ibs_op_events != 0
        && data.raw_payload != 0
        && event.is_some_and(|event| decoding.is_ibs_op(event))
    {
        let mut bytes = [0u8; IBS_PAYLOAD_MAX_BYTES];
        let registers = read_ibs_payload(data.raw_payload, data.raw_size, bytes.as_mut_ptr())
            .and_then(|len| IbsOpSample::parse(bytes.get(..len)?).ok());
        match registers {
            Some(registers) => add_ibs_op_fields(&registers, &decoding, &mut data),
            None => {
                lose(LossKind::IbsRegistersUnreadable);
                // Counted once: nothing is streamed of it either.
                data.raw_payload = 0;
            }
        }
    }
    (event, data)
}

/// Which events' PERF_SAMPLE_RAW payloads are decoded, and the CPU's IBS errata.
#[unsafe(no_mangle)]
static RAW_DECODING: profiler_common::capture::RawDecoding =
    profiler_common::capture::RawDecoding::EMPTY;

#[inline(always)]
fn raw_decoding() -> RawDecoding {
    // SAFETY: a plain read of our own read-only global; volatile so the compiler cannot fold
    // the all-zero initializer that the agent overrides at load time.
    unsafe { core::ptr::read_volatile(&RAW_DECODING) }
}

/// The PERF_SAMPLE_RAW payload behind `perf_sample_data.raw` (a `perf_raw_record *`): its
/// address and length.
#[inline(always)]
fn raw_payload(
    raw_record: u64,
    offsets: &profiler_common::capture::KernelOffsets,
) -> Option<(u64, u64)> {
    // SAFETY: kernel reads through the checking helper.
    let payload =
        unsafe { bpf_probe_read_kernel((raw_record + offsets.raw_frag_data as u64) as *const u64) }
            .ok()?;
    // SAFETY: as above.
    let size =
        unsafe { bpf_probe_read_kernel((raw_record + offsets.raw_frag_size as u64) as *const u32) }
            .ok()?;
    (payload != 0).then_some((payload, u64::from(size)))
}

/// Copies an IBS payload of `size` bytes at `payload` to the `IBS_PAYLOAD_MAX_BYTES` bytes at
/// `into`, in fixed-size pieces the verifier can bound: the part every payload has, then whole
/// registers while the payload has more. The bytes copied; `None` when the payload is too short
/// or unreadable. `into` is a raw pointer because it may be uninitialized ring-buffer memory.
#[inline(always)]
fn read_ibs_payload(payload: u64, size: u64, into: *mut u8) -> Option<usize> {
    let size = size as usize;
    if size < IBS_PAYLOAD_MIN_BYTES {
        return None;
    }
    let copy = |offset: usize, bytes: usize| -> Option<()> {
        // SAFETY: the callers' buffers hold `IBS_PAYLOAD_MAX_BYTES >= offset + bytes` writable
        // bytes at `into`, and `offset + bytes <= size` bytes are behind `payload`; the checking
        // helper fails cleanly on a bad source address.
        let failed = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                into.add(offset) as *mut core::ffi::c_void,
                bytes as u32,
                (payload + offset as u64) as *const core::ffi::c_void,
            )
        };
        (failed == 0).then_some(())
    };
    copy(0, IBS_PAYLOAD_MIN_BYTES)?;
    let mut len = IBS_PAYLOAD_MIN_BYTES;
    while len + 8 <= IBS_PAYLOAD_MAX_BYTES && len + 8 <= size {
        copy(len, 8)?;
        len += 8;
    }
    Some(len)
}

/// Fills what the kernel did not put in `perf_sample_data` (kernels before 6.1 decode nothing
/// of IBS themselves) from the op registers.
#[inline(always)]
fn add_ibs_op_fields(registers: &IbsOpSample, decoding: &RawDecoding, data: &mut SampleData) {
    let fields = registers.decode(decoding.errata()).sample_fields();
    if data.flags & sample_flags::ADDR == 0 {
        if let Some(addr) = fields.data_addr {
            data.addr = addr;
            data.flags |= sample_flags::ADDR;
        }
    }
    if data.flags & sample_flags::PHYS_ADDR == 0 {
        if let Some(phys_addr) = fields.phys_addr {
            data.phys_addr = phys_addr;
            data.flags |= sample_flags::PHYS_ADDR;
        }
    }
    if data.latency == 0 {
        data.latency = fields.load_latency.unwrap_or(0);
    }
    if data.flags & sample_flags::DATA_SRC == 0 {
        if let Some(source) = fields.data_source {
            data.data_src = source.encode();
            data.flags |= sample_flags::DATA_SRC;
        }
    }
}

/// Per-CPU scratch for [`forget_known_values`].
#[map]
static SAMPLE_SCRATCH: PerCpuArray<SampleData> = PerCpuArray::with_max_entries(1, 0);

/// Passes the sample data through a map value. The decoders leave the verifier with many
/// distinct known values for these fields, and every combination would be explored again
/// through everything that follows (past its instruction budget with IBS and several events);
/// what is loaded back from a map is an unknown value, so all those paths merge here.
#[inline(always)]
fn forget_known_values(data: SampleData) -> Option<SampleData> {
    let scratch = SAMPLE_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array; programs do not nest on one CPU. Volatile so
    // the compiler keeps the store and the load instead of forwarding the known values.
    unsafe {
        core::ptr::write_volatile(scratch, data);
        Some(core::ptr::read_volatile(scratch))
    }
}

/// Index of the event that overflowed. With one event there is nothing to look up.
#[inline(always)]
fn event_index(perf_event: u64, config: &CaptureConfig) -> Option<u32> {
    if config.flags & CAPTURE_EVENT_IDS == 0 {
        return Some(0);
    }
    if perf_event == 0 {
        return None;
    }
    let offsets = &config.offsets;
    // SAFETY: kernel reads through the checking helper.
    let parent =
        unsafe { bpf_probe_read_kernel((perf_event + offsets.event_parent as u64) as *const u64) }
            .unwrap_or(0);
    let owner = if parent != 0 { parent } else { perf_event };
    // SAFETY: as above.
    let id =
        unsafe { bpf_probe_read_kernel((owner + offsets.event_id as u64) as *const u64) }.ok()?;
    // SAFETY: the value is copied out at once.
    let index = unsafe { EVENT_IDS.get(&id) }.copied()?;
    if (index as usize) < MAX_EVENTS {
        Some(index)
    } else {
        None
    }
}

/// The stack-frames map as interning sees it.
struct FramesMap;

impl StackStore for FramesMap {
    #[inline(always)]
    fn stored(&self, hash: u64) -> Option<&StackFrames> {
        // SAFETY: the value is only read, and only the agent deletes entries (see
        // `profiler_common::stack::intern` on what a concurrent take means).
        unsafe { STACK_FRAMES.get(&hash) }
    }

    #[inline(always)]
    fn insert_new(&self, hash: u64, frames: &StackFrames) -> Result<(), Refused> {
        match STACK_FRAMES.insert(&hash, frames, BPF_NOEXIST as u64) {
            Ok(()) => Ok(()),
            Err(e) if -i64::from(e) == EEXIST => Err(Refused::Exists),
            Err(_) => Err(Refused::Full),
        }
    }
}

/// What a stack that could not be kept is counted as.
struct StackLosses {
    collision: LossKind,
    full: LossKind,
    failed: LossKind,
}

/// Captures the stack `flags` selects into this CPU's frames buffer with `bpf_get_stack`; `None`
/// when there is none (a kernel thread has no user stack, a user-mode sample no kernel stack),
/// `Err` when it could not be read (counted as `failed`).
#[inline(always)]
fn capture_stack(
    ctx: &PerfEventContext,
    flags: u64,
    failed: LossKind,
) -> Result<Option<FramesBuffer>, ()> {
    capture_stack_into(ctx, FramesBuffer::Sample, flags, failed)
}

/// [`capture_stack`] into the frames buffer `into`, from any program's context.
#[inline(always)]
fn capture_stack_into(
    ctx: &impl EbpfContext,
    into: FramesBuffer,
    flags: u64,
    failed: LossKind,
) -> Result<Option<FramesBuffer>, ()> {
    let Some(buffer) = into.get() else {
        lose(failed);
        return Err(());
    };
    // SAFETY: `buffer` is this CPU's frames buffer, `MAX_STACK_DEPTH` frames long; programs do
    // not nest on one CPU, so nothing else writes it meanwhile.
    let bytes = unsafe {
        aya_ebpf::helpers::generated::bpf_get_stack(
            ctx.as_ptr(),
            core::ptr::addr_of_mut!((*buffer).frames) as *mut core::ffi::c_void,
            (MAX_STACK_DEPTH * 8) as u32,
            flags,
        )
    };
    if bytes < 0 {
        if -bytes == EFAULT {
            return Ok(None);
        }
        lose(failed);
        return Err(());
    }
    let depth = bytes as u64 / 8;
    if depth == 0 {
        return Ok(None);
    }
    // SAFETY: as above.
    unsafe { (*buffer).depth = depth };
    Ok(Some(into))
}

/// Ends the stack in this CPU's frames buffer `stack` in `FRAME_POINTERS_ONLY_FRAME` (in place
/// of its last frame when it is full).
#[inline(always)]
fn mark_frame_pointers_only(stack: FramesBuffer) -> FramesBuffer {
    let Some(buffer) = stack.get() else {
        return stack;
    };
    // SAFETY: this CPU's frames buffer; programs do not nest on one CPU.
    let buffer = unsafe { &mut *buffer };
    let mut depth = buffer.depth as usize;
    if depth >= MAX_STACK_DEPTH {
        depth = MAX_STACK_DEPTH - 1;
    }
    if let Some(slot) = buffer.frames.get_mut(depth) {
        *slot = FRAME_POINTERS_ONLY_FRAME;
        buffer.depth = depth as u64 + 1;
    }
    stack
}

/// Interns the stack in this CPU's frames buffer `buffer` (a [`FramesBuffer`]) into the
/// stack-frames map: the stack's hash, or `LOST_STACK` (counted as the loss `collision` or
/// `full`, [`LossKind`]s) when a different stack has its hash or the map has no room. Whatever
/// fills a frames buffer (`bpf_get_stack` here, an unwinder of its own) ends here.
///
/// A global function, which the verifier checks once, not again at each of a program's calls
/// (its hash and comparison walk every frame): a third of the capture program's instructions
/// to check. Its arguments are numbers, which every kernel takes.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn intern_frames(generation: u32, buffer: u32, collision: u32, full: u32) -> u64 {
    let Some(frames) = STACK_SCRATCH.get_ptr_mut(buffer) else {
        return LOST_STACK;
    };
    // SAFETY: this CPU's frames buffer; programs do not nest on one CPU.
    match intern(&FramesMap, unsafe { &*frames }) {
        Ok(interned) => {
            if interned.new {
                count_new_keys(&config(), generation & 1, Fill::StackFrames, 1);
            }
            interned.hash
        }
        Err(StackLoss::HashCollision) => {
            add(&LOSSES, collision, 1);
            LOST_STACK
        }
        Err(StackLoss::Full) => {
            add(&LOSSES, full, 1);
            LOST_STACK
        }
    }
}

/// The hash of a captured stack: `NO_STACK` when there is none, `LOST_STACK` (counted) when it
/// could not be kept.
#[inline(always)]
fn stack_hash(
    captured: Result<Option<FramesBuffer>, ()>,
    generation: u32,
    losses: &StackLosses,
) -> u64 {
    match captured {
        Ok(Some(buffer)) => intern_frames(
            generation,
            buffer as u32,
            losses.collision as u32,
            losses.full as u32,
        ),
        Ok(None) => NO_STACK,
        Err(()) => LOST_STACK,
    }
}

#[inline(always)]
fn count_unwind(what: UnwindCount) {
    add(&UNWIND_COUNTS, what as u32, 1);
}

/// How a walk ended short of its frame limit.
enum WalkEnd {
    /// At the outermost frame: the stack is complete.
    Complete,
    /// Short of it, for this reason: the stack ends in `TRUNCATED_FRAME`.
    Truncated(UnwindCount),
}

impl WalkEnd {
    /// The end as the count it is counted under: what [`walk_frame`] returns.
    #[inline(always)]
    fn code(&self) -> u64 {
        match self {
            WalkEnd::Complete => UnwindCount::Complete as u64,
            WalkEnd::Truncated(reason) => *reason as u64,
        }
    }

    /// The end [`WalkEnd::code`] gave `code`.
    #[inline(always)]
    fn of_code(code: u64) -> WalkEnd {
        match code {
            c if c == UnwindCount::Complete as u64 => WalkEnd::Complete,
            c if c == UnwindCount::TruncatedOutsideMappings as u64 => {
                WalkEnd::Truncated(UnwindCount::TruncatedOutsideMappings)
            }
            c if c == UnwindCount::TruncatedNoCaller as u64 => {
                WalkEnd::Truncated(UnwindCount::TruncatedNoCaller)
            }
            _ => WalkEnd::Truncated(UnwindCount::TruncatedDepth),
        }
    }
}

/// The caller of the frame `frame`, by its row in the process's tables, else by frame pointers;
/// notes in `state` a mapping whose table is not loaded.
#[inline(always)]
fn unwind_frame(
    process: &ProcessMappings,
    frame: &Caller,
    state: &mut WalkState,
) -> Result<Caller, WalkEnd> {
    let pc = frame.lookup_ip();
    let Some(mapping) = find_mapping(process, pc, state) else {
        return Err(WalkEnd::Truncated(UnwindCount::TruncatedOutsideMappings));
    };
    let mut table_row = None;
    if mapping.rows_len == 0 {
        count_unwind(UnwindCount::FramesWithoutTable);
        if mapping.rows_start == TABLE_NOT_LOADED {
            count_unwind(UnwindCount::FramesTableNotLoaded);
            state.met_unloaded_table = 1;
        }
    } else {
        let offset = pc.wrapping_sub(mapping.table_base);
        let found = if offset > u64::from(u32::MAX) {
            None
        } else {
            table_row_of(mapping, offset as u32, state)
        };
        match found {
            Some(found) if found.cfa_rule != CfaRule::NoInfo as u8 => table_row = Some(*found),
            _ => count_unwind(UnwindCount::FramesWithoutRow),
        }
    }
    let row = match table_row {
        Some(row) => row,
        // Both ABIs end the frame-pointer chain with a zero frame pointer (`_start` clears rbp
        // or x29): walked by frame pointers, that frame is the outermost.
        None if frame.regs.fp == 0 => return Err(WalkEnd::Complete),
        None => arch::FRAME_POINTER_ROW,
    };
    match step(&row, &frame.regs, |address| read_stack_word(state, address)) {
        Ok(caller) => Ok(caller),
        Err(StepEnd::EndOfStack | StepEnd::ZeroReturnAddress) => Err(WalkEnd::Complete),
        Err(_) => Err(WalkEnd::Truncated(UnwindCount::TruncatedNoCaller)),
    }
}

/// The row of `mapping`'s table that covers `offset`: the index remembered for it when the
/// table confirms it, else found by binary search and remembered.
#[inline(always)]
fn table_row_of(
    mapping: &ExecMapping,
    offset: u32,
    state: &mut WalkState,
) -> Option<&'static UnwindRow> {
    let (start, len) = (mapping.rows_start, mapping.rows_len);
    let pc_at = |i: u32| UNWIND_ROWS.get(start.wrapping_add(i)).map(|row| row.pc);
    let key = u64::from(start) << 32 | u64::from(offset);
    let slot = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as u32 & (ROW_CACHE_SLOTS - 1);
    // The slot is within the array, so the lookup cannot fail; were it to, the frame would go
    // without a row. One path into the search below instead of one with and one without a
    // slot: the verifier checks the search's steps once for each.
    let remembered = ROW_CACHE.get_ptr_mut(slot)?;
    // SAFETY: a map value the kernel keeps alive; a racing write from another CPU can only
    // make the entry fail the check.
    let RememberedRow { key: at, index, .. } = unsafe { *remembered };
    if at == key && is_row_for(len, offset, index, pc_at) {
        return UNWIND_ROWS.get(start.wrapping_add(index));
    }
    let index = find_row_by(len, offset, pc_at, |bound| opaque(&mut state.opaque, bound))?;
    // SAFETY: as above.
    unsafe {
        *remembered = RememberedRow {
            key,
            index,
            _pad: 0,
        }
    };
    UNWIND_ROWS.get(start.wrapping_add(index))
}

/// The unit the walk copies the user stack in: 4 KiB, the smallest page, aligned, so a copy
/// fails only where the word it is made for cannot be read. A read costs about as much as the
/// rest of a frame's walk (110 ns measured, nearly all of it the helper's fixed cost, not the
/// bytes), and callers' frames mostly lie in the page of the frame they called.
const STACK_PAGE_BYTES: u64 = 4096;

/// The user-stack word at `address`: from the walk's copy of its page, copied now when the walk
/// holds another (aligned words; others are read alone).
#[inline(always)]
fn read_stack_word(state: &mut WalkState, address: u64) -> Option<u64> {
    if address & 7 != 0 {
        // SAFETY: user memory read through the checking helper, which fails cleanly.
        return unsafe { bpf_probe_read_user(address as *const u64) }.ok();
    }
    let page = address & !(STACK_PAGE_BYTES - 1);
    if state.page_held == 0 || state.page != page {
        state.page_held = 0;
        // SAFETY: user memory copied through the checking helper, which fails cleanly, into
        // this CPU's walk state, whose page buffer holds `STACK_PAGE_BYTES`.
        let copied = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                state.page_words.as_mut_ptr() as *mut core::ffi::c_void,
                STACK_PAGE_BYTES as u32,
                page as *const core::ffi::c_void,
            )
        };
        if copied != 0 {
            return None;
        }
        state.page = page;
        state.page_held = 1;
    }
    // Through `opaque`: else the compiler bounds the byte offset the index came from, not the
    // index, and the verifier cannot follow that to the access.
    let index = opaque(&mut state.opaque, ((address - page) / 8) as u32);
    state.page_words.get(index as usize).copied()
}

/// The mapping holding `pc`: the last frame's when it holds it (most callers are in the
/// module of the frame they called), else searched for.
#[inline(always)]
fn find_mapping<'p>(
    process: &'p ProcessMappings,
    pc: u64,
    state: &mut WalkState,
) -> Option<&'p ExecMapping> {
    if let Some(mapping) = process.at_if_contains(state.mapping as u32, pc) {
        return Some(mapping);
    }
    let (index, mapping) = process.find_through(pc, |index| opaque(&mut state.opaque, index))?;
    state.mapping = u64::from(index);
    Some(mapping)
}

/// `value`, written to map memory and read back: the verifier does not track what map memory
/// holds, so states that differ only in it are one to it. Searches through the mappings and rows
/// with bounds it tracked made it check 417,000 instructions of the unwinder at every start, 360
/// ms of CPU (127,000 and 75-95 ms through this).
#[inline(always)]
fn opaque(slot: &mut u64, value: u32) -> u32 {
    // SAFETY: a field of this CPU's walk state.
    unsafe {
        core::ptr::write_volatile(slot, u64::from(value));
        core::ptr::read_volatile(slot) as u32
    }
}

/// Where a user-stack walk is, between the unwinder's tail calls.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WalkState {
    /// The frame to record next.
    frame: Registers,
    /// `frame.ip` is an interrupted instruction (the sampled one), not a return address.
    interrupted: u64,
    /// Frames in this CPU's frames buffer.
    depth: u64,
    /// 1 when this is the process's first walk in this use-stamp period: the walk may ask the
    /// agent to load a table it met unloaded (at most one request per process a period).
    may_request: u64,
    /// 1 once the walk has stepped through a mapping whose table is not loaded.
    met_unloaded_table: u64,
    /// The index of the mapping the last frame was in.
    mapping: u64,
    /// Where [`opaque`] passes values through.
    opaque: u64,
    /// 1 when `page_words` holds the user-stack page at `page`.
    page_held: u64,
    page: u64,
    /// The stack page the walk last read return addresses and saved registers from.
    page_words: [u64; STACK_PAGE_BYTES as usize / 8],
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

/// Stamps the process as walked now, for the agent's choice of tables to evict (written once
/// a period, not on every walk); true the first time in a period, when the walk may ask the
/// agent for a table it meets unloaded.
#[inline(always)]
fn stamp_use(process: *mut ProcessMappings) -> bool {
    // SAFETY: helper without preconditions.
    let now = use_stamp(unsafe { bpf_ktime_get_ns() });
    // SAFETY: a map value the kernel keeps alive while the program runs; a racing write from
    // another CPU writes a stamp as recent.
    unsafe {
        let fresh = (*process).last_used != now;
        if fresh {
            (*process).last_used = now;
        }
        fresh
    }
}

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

/// Starts the table walk of `pid`'s user stack at `registers`: stores `pending` (what the walk
/// is for) and the walk's state in this CPU's slots, then tail-calls the walker in `unwinder`.
/// Returns only when the walk cannot start (the agent has not loaded the process's mappings
/// yet, which it is asked to; the tail call failed).
#[inline(always)]
fn start_walk<P: Copy + 'static>(
    ctx: &impl EbpfContext,
    registers: Registers,
    pid: u32,
    (slot, pending): (&PerCpuArray<P>, P),
    walk: &PerCpuArray<WalkState>,
    unwinder: &ProgramArray,
) {
    let Some(process) = UNWIND_PROCESSES.get_ptr_mut(&pid) else {
        count_unwind(UnwindCount::ProcessUnknown);
        if config().flags & CAPTURE_QUIET_NEW_PROCESSES == 0 {
            request_mappings(pid);
        }
        return;
    };
    // A thread that is rarely sampled (one that mostly waits) must ask for the tables its own
    // walks meet unloaded.
    let fresh = stamp_use(process);
    let (Some(stored), Some(state)) = (slot.get_ptr_mut(0), walk.get_ptr_mut(0)) else {
        return;
    };
    // SAFETY: this CPU's slots; the programs sharing them do not nest on one CPU.
    unsafe {
        *stored = pending;
        // The first address is the interrupted instruction, or the resume address of a system
        // call: an instruction of the caller's own code either way. Field by field: the page
        // buffer is too large for the program's stack, and its stale words are never read.
        (*state).frame = registers;
        (*state).interrupted = 1;
        (*state).depth = 0;
        (*state).may_request = u64::from(fresh);
        (*state).met_unloaded_table = 0;
        (*state).mapping = 0;
        (*state).page_held = 0;
        unwinder.tail_call(ctx, 0);
    }
}

/// Asks the agent to publish `pid`'s mappings (new, or changed since: a library loaded by
/// dlopen), or to load a table the process needs. One wakeup until the agent reads the ring: a
/// request already waiting says enough.
#[inline(always)]
fn request_mappings(pid: u32) {
    if UNWIND_REQUESTS.query(BPF_RB_AVAIL_DATA as u64) == 0 {
        let _ = UNWIND_REQUESTS.output::<u32>(&pid, BPF_RB_FORCE_WAKEUP as u64);
    }
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

/// One run of an unwinder program (`programs[0]`, a program of `ctx`'s type) on process
/// `pid`'s stack, whose walk is in `walk` and whose frames so far are in `frames`: walks up to
/// [`UNWIND_FRAMES_PER_RUN`] more frames and goes on in a new run of the program, or, once
/// the walk has ended, interns the stack and returns its hash.
#[inline(always)]
fn continue_walk(
    ctx: &impl EbpfContext,
    programs: &ProgramArray,
    pid: u32,
    generation: u32,
    walk: &'static PerCpuArray<WalkState>,
    frames: FramesBuffer,
) -> Option<u64> {
    let (Some(state), Some(buffer)) = (walk.get_ptr_mut(0), frames.get()) else {
        return None;
    };
    // SAFETY: this CPU's slots; programs do not nest on one CPU.
    let (state, stack) = unsafe { (&mut *state, &mut *buffer) };
    // SAFETY: the value is only read.
    let end = match unsafe { UNWIND_PROCESSES.get(&pid) } {
        Some(process) => walk_frames(process, state, stack),
        None => Some(WalkEnd::Truncated(UnwindCount::TruncatedNoCaller)),
    };
    let end = match end {
        Some(end) => end,
        None if (state.depth as usize) < MAX_UNWIND_FRAMES => {
            // SAFETY: a tail call to the unwinder program; it returns only on failure.
            unsafe { programs.tail_call(ctx, 0) };
            WalkEnd::Truncated(UnwindCount::TruncatedDepth)
        }
        None => WalkEnd::Truncated(UnwindCount::TruncatedDepth),
    };
    let mut depth = state.depth as usize;
    if state.met_unloaded_table != 0 && state.may_request != 0 {
        request_mappings(pid);
    }
    match end {
        WalkEnd::Complete => count_unwind(UnwindCount::Complete),
        WalkEnd::Truncated(reason) => {
            count_unwind(reason);
            if reason == UnwindCount::TruncatedOutsideMappings {
                request_mappings(pid);
                // The address that led outside every mapping is garbage read as a return
                // address, no frame: the marker takes its place. The sampled instruction (the
                // first frame) stays.
                if depth > 1 {
                    depth -= 1;
                }
            }
            if depth >= MAX_STACK_DEPTH {
                depth = MAX_STACK_DEPTH - 1;
            }
            if let Some(slot) = stack.frames.get_mut(depth) {
                *slot = TRUNCATED_FRAME;
            }
            depth += 1;
        }
    }
    stack.depth = depth as u64;
    count_unwind(UnwindCount::Walked);
    Some(stack_hash(
        Ok(Some(frames)),
        generation,
        &user_stack_losses(),
    ))
}

/// Records and steps up to [`UNWIND_FRAMES_PER_RUN`] frames; how the walk ended, `None` while it
/// goes on.
#[inline(always)]
fn walk_frames(
    process: &ProcessMappings,
    state: &mut WalkState,
    stack: &mut StackFrames,
) -> Option<WalkEnd> {
    for _ in 0..UNWIND_FRAMES_PER_RUN {
        let stepped = walk_frame(process, state, stack);
        if stepped != FRAME_STEPPED {
            return Some(WalkEnd::of_code(stepped));
        }
    }
    None
}

/// What [`walk_frame`] returns when the walk goes on.
const FRAME_STEPPED: u64 = u64::MAX;

/// Records the walk's next frame and steps to its caller: [`FRAME_STEPPED`], or how the walk
/// ended ([`WalkEnd::code`]).
///
/// A global function: the verifier checks it once for itself, from any state of its arguments,
/// and a call to it as a call, where a function the compiler inlines, or a static one, it
/// checks again at every call, from the state there (each of the run's frames: 6,300
/// instructions a frame, two thirds of a recording's start-up time in the verifier).
/// Arguments of a global function may be null to the verifier: all three are checked. Pointer
/// arguments need Linux 5.12; the unwinder needs 5.15.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn walk_frame(
    process: *const ProcessMappings,
    state: *mut WalkState,
    stack: *mut StackFrames,
) -> u64 {
    // SAFETY: map values the kernel keeps alive while the program runs (the walker's process
    // entry, this CPU's walk state and frames buffer), or null; programs do not nest on one CPU.
    let (Some(process), Some(state), Some(stack)) =
        (unsafe { (process.as_ref(), state.as_mut(), stack.as_mut()) })
    else {
        return WalkEnd::Truncated(UnwindCount::TruncatedNoCaller).code();
    };
    let depth = state.depth as usize;
    if depth >= MAX_UNWIND_FRAMES {
        return WalkEnd::Truncated(UnwindCount::TruncatedDepth).code();
    }
    if let Some(slot) = stack.frames.get_mut(depth) {
        *slot = state.frame.ip;
    }
    state.depth += 1;
    let frame = Caller {
        regs: state.frame,
        interrupted: state.interrupted != 0,
    };
    match unwind_frame(process, &frame, state) {
        Ok(caller) => {
            state.frame = caller.regs;
            state.interrupted = u64::from(caller.interrupted);
            FRAME_STEPPED
        }
        Err(end) => end.code(),
    }
}

/// Adds one sample to a per-CPU hash map entry, creating it on first use; whether it created
/// the entry.
#[inline(always)]
fn bump<K, V>(
    map: &PerCpuHashMap<K, V>,
    key: &K,
    init: &V,
    update: impl Fn(&mut V),
    full: LossKind,
) -> bool {
    if let Some(value) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of an existing entry; programs do not nest on one CPU.
        update(unsafe { &mut *value });
        return false;
    }
    if map.insert(key, init, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    // Another CPU may have created the key (EEXIST) between lookup and insert: retry once.
    match map.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(value) => update(unsafe { &mut *value }),
        None => lose(full),
    }
    false
}

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
fn record(
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

/// Sends the sample's user registers, user stack bytes and kernel frames to the agent through
/// the stack-copy ring; whether it did. The stack is copied a page at a time from the stack
/// pointer's page up, so a read stops at the first page that cannot be read (the top of the
/// stack) and keeps the pages before it. `walked_in_kernel`: the hash of the user stack the
/// table walk counted for this sample, for the agent to compare (no kernel frames then), or
/// `NO_STACK` when the agent counts the sample from this record.
#[inline(always)]
fn copy_stacks(
    ctx: &PerfEventContext,
    config: &CaptureConfig,
    sample: &Sample,
    walked_in_kernel: u64,
) -> bool {
    let Sample {
        pid,
        tid,
        cgroup,
        event,
        ..
    } = *sample;
    // A check's copy is of a sample the walk counted: one that cannot be made is not compared,
    // and loses no sample.
    let lose_copy = |kind| {
        if walked_in_kernel == NO_STACK {
            lose(kind)
        }
    };
    let Some(arch::UserFrame {
        regs: Registers { ip, sp, fp },
        link,
    }) = arch::user_frame(ctx)
    else {
        // No user context: the kernel frames are counted in the maps.
        return false;
    };
    // SAFETY: a helper without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(record) = STACK_COPY_SCRATCH.get_ptr_mut(cpu) else {
        lose_copy(LossKind::StackCopyUnreadable);
        return false;
    };
    let stack_start = sp & !(STACK_COPY_PAGE_BYTES as u64 - 1);
    let mut stack_bytes = 0usize;
    for page in 0..STACK_COPY_MAX_PAGES {
        if page as u32 >= config.stack_copy_pages {
            break;
        }
        let offset = page * STACK_COPY_PAGE_BYTES;
        // SAFETY: `record` is this CPU's scratch slot (programs do not nest on one CPU) and
        // `offset + STACK_COPY_PAGE_BYTES` is within its stack bytes; the checking helper
        // fails cleanly on a user address that cannot be read.
        let failed = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                core::ptr::addr_of_mut!((*record).stack)
                    .cast::<u8>()
                    .add(offset)
                    .cast(),
                STACK_COPY_PAGE_BYTES as u32,
                (stack_start + offset as u64) as *const core::ffi::c_void,
            )
        };
        if failed != 0 {
            break;
        }
        stack_bytes = offset + STACK_COPY_PAGE_BYTES;
    }
    if stack_bytes == 0 {
        lose_copy(LossKind::StackCopyUnreadable);
        return false;
    }
    let kernel_bytes = if config.flags & CAPTURE_KERNEL_STACKS == 0 || walked_in_kernel != NO_STACK
    {
        0
    } else {
        // SAFETY: as above; the kernel frames go straight into the record.
        let written = unsafe {
            aya_ebpf::helpers::generated::bpf_get_stack(
                ctx.as_ptr(),
                core::ptr::addr_of_mut!((*record).header.kernel).cast(),
                (STACK_COPY_KERNEL_FRAMES * 8) as u32,
                0,
            )
        };
        if written > 0 {
            written as u32
        } else {
            0
        }
    };
    // SAFETY: as above.
    unsafe {
        let header = core::ptr::addr_of_mut!((*record).header);
        (*header).pid = pid;
        (*header).tid = tid;
        (*header).event = event;
        (*header).cpu = cpu;
        (*header).cgroup = cgroup;
        (*header).ip = ip;
        (*header).sp = sp;
        (*header).fp = fp;
        (*header).link = link;
        (*header).stack_start = stack_start;
        (*header).stack_bytes = stack_bytes as u32;
        (*header).kernel_bytes = kernel_bytes;
        (*header).walked_in_kernel = walked_in_kernel;
    }
    let length = core::mem::size_of::<StackCopyHeader>() + stack_bytes;
    if length > core::mem::size_of::<StackCopyRecord>() {
        return false;
    }
    // SAFETY: `length` bytes of the scratch slot, checked just above.
    let bytes = unsafe { core::slice::from_raw_parts(record as *const u8, length) };
    // Wake the agent when this record fills the ring past half, as the IBS stream does.
    let half = STACK_COPIES.query(BPF_RB_RING_SIZE as u64) / 2;
    let waiting = STACK_COPIES.query(BPF_RB_AVAIL_DATA as u64);
    let wakeup = if waiting <= half && waiting + length as u64 > half {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    if STACK_COPIES.output::<[u8]>(bytes, wakeup as u64).is_err() {
        lose_copy(LossKind::StackCopyRingFull);
        return false;
    }
    true
}

/// Adds one latency to its histogram in `map`, creating the histogram on first use; 1 when it
/// created one, else 0.
#[inline(always)]
fn record_latency<K>(
    map: &PerCpuHashMap<K, LatencyBuckets>,
    key: &K,
    latency: u64,
    full: LossKind,
) -> u64 {
    let bucket = bucket_index(latency);
    if bucket >= LATENCY_BUCKETS {
        return 0;
    }
    let mut created = 0;
    if map.get_ptr_mut(key).is_none() {
        // An empty histogram is too large for the 512-byte BPF stack: insert the one kept in
        // read-only data.
        if map
            .insert(key, &EMPTY_HISTOGRAM, BPF_NOEXIST as u64)
            .is_ok()
        {
            created = 1;
        } else if map.get_ptr_mut(key).is_none() {
            lose(full);
            return 0;
        }
    }
    if let Some(histogram) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's slot; `bucket` was bounds-checked above.
        unsafe { (*histogram).counts[bucket] += 1 };
    }
    created
}

static EMPTY_HISTOGRAM: LatencyBuckets = LatencyBuckets {
    counts: [0; LATENCY_BUCKETS],
};

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

/// Streams an IBS sample's registers to the agent; whether it was streamed (the ring may be
/// full: counted as a loss).
#[inline(always)]
fn stream_ibs(pid: u32, event: u32, ip: u64, data: &SampleData) -> bool {
    let Some(mut entry) = IBS_SAMPLES.reserve::<IbsRecord>(0) else {
        lose(LossKind::IbsRingFull);
        return false;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points to the reserved, exclusively owned ring entry of IbsRecord size;
    // only the field's address is taken, no reference to the uninitialized bytes.
    let payload = unsafe { core::ptr::addr_of_mut!((*record).payload) } as *mut u8;
    let Some(len) = read_ibs_payload(data.raw_payload, data.raw_size, payload) else {
        entry.discard(0);
        lose(LossKind::IbsRegistersUnreadable);
        return false;
    };
    // SAFETY: as above; every header field is written before the entry is submitted.
    unsafe {
        (*record).pid = pid;
        (*record).event = event;
        (*record).ip = ip;
        (*record).line = data.addr & !(CACHE_LINE_BYTES - 1);
        (*record).data_src = data.data_src;
        (*record).sample_flags = data.flags;
        (*record).payload_len = len as u32;
    }
    // Wake the agent when this record fills the ring past half: it also reads the ring on a
    // timer, and a wakeup per sample would cost more than the sample.
    let half = IBS_SAMPLES.query(BPF_RB_RING_SIZE as u64) / 2;
    let waiting = IBS_SAMPLES.query(BPF_RB_AVAIL_DATA as u64);
    let crossing = waiting <= half && waiting + core::mem::size_of::<IbsRecord>() as u64 > half;
    let wakeup = if crossing {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    entry.submit(wakeup as u64);
    true
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "license")]
pub static LICENSE: [u8; 4] = *b"GPL\0";
