//! The table-walking unwinder of user stacks: walks a thread's stack by the unwind rows the
//! agent loaded for its process's files (by frame pointers where a file has none), a few frames
//! a run, in tail calls of the program that started it, and interns the stack it walked.

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, ProgramArray, RingBuf},
    EbpfContext,
};
use profiler_common::{
    capture::{CAPTURE_QUIET_NEW_PROCESSES, CAPTURE_TABLES_BY_FILE},
    maple::NODE_WORDS,
    stack::{StackFrames, MAX_STACK_DEPTH},
    unwind::{find_row_by, is_row_for, step, Caller, CfaRule, Registers, StepEnd, UnwindRow},
    unwind_maps::{
        use_stamp, ExecMapping, ProcessMappings, UnwindCount, FILE_NOT_SEEN,
        FRAME_POINTERS_ONLY_FRAME, MAX_UNWIND_FRAMES, TABLE_NOT_LOADED, TRUNCATED_FRAME,
        UNWIND_FRAMES_PER_RUN,
    },
};

use crate::{
    arch,
    maps::{add, config},
    python::append_python_frames,
    stacks::{stack_hash, user_stack_losses, FramesBuffer},
    vma::{kernel_mapping, kernel_tree_known},
};

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

/// The mappings of a process the agent has not published: none, so that every frame's mapping
/// is found in the kernel's own tree ([`kernel_mapping`]). Never written.
#[map]
static NO_MAPPINGS: Array<ProcessMappings> = Array::with_max_entries(1, 0);

/// Process ids sampled before the agent loaded their mappings: wakes the agent to load them now
/// rather than at its next side-band tick.
#[map]
static UNWIND_REQUESTS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// `UnwindCount` index -> what the unwinder did, per CPU.
#[map]
pub(crate) static UNWIND_COUNTS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(UnwindCount::COUNT as u32, 0);

#[inline(always)]
pub(crate) fn count_unwind(what: UnwindCount) {
    add(&UNWIND_COUNTS, what as u32, 1);
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
    /// 1 once that mapping was of a file the agent has said nothing of yet.
    met_unseen_file: u64,
    /// 1 once the walk has found a mapping in the kernel's record of a process the agent has
    /// published: a library mapped since (dlopen), which the agent is asked to publish at once.
    met_new_mapping: u64,
    /// 1 when the agent had not published the process: its mappings come from the kernel's
    /// own record, and its tables may not be loaded yet.
    unpublished: u64,
    /// The index of the mapping the last frame was in.
    mapping: u64,
    /// 1 when `found` holds the mapping the walk last found in the kernel's tree (callers are
    /// mostly in the module of the frame they called: one tree walk a module, not a frame).
    found_held: u64,
    found: ExecMapping,
    /// Scratch for the nodes of the kernel's mapping tree.
    node: [u64; NODE_WORDS],
    /// Where [`opaque`] passes values through.
    opaque: u64,
    /// 1 when `page_words` holds the user-stack page at `page`.
    page_held: u64,
    page: u64,
    /// The stack page the walk last read return addresses and saved registers from.
    page_words: [u64; STACK_PAGE_BYTES as usize / 8],
}

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

/// The last use-stamp period in which a walk on this CPU could ask for a table, with tables
/// published by file (`CAPTURE_TABLES_BY_FILE`), where no process entry holds a stamp.
#[map]
static REQUEST_PERIODS: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Whether this is the first walk on this CPU in this use-stamp period: the one that may ask
/// the agent for a table it meets unloaded (a file the agent gave no table, or none yet, is
/// met again and again; a request per walk would wake the agent at the sampling rate).
#[inline(always)]
fn first_request_of_period() -> bool {
    let Some(period) = REQUEST_PERIODS.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: helper without preconditions.
    let now = use_stamp(unsafe { bpf_ktime_get_ns() });
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe {
        let fresh = *period != now;
        *period = now;
        fresh
    }
}

/// Starts the table walk of `pid`'s user stack at `registers`: stores `pending` (what the walk
/// is for) and the walk's state in this CPU's slots, then tail-calls the walker in `unwinder`.
/// Returns only when the walk cannot start (the agent has not loaded the process's mappings
/// yet, which it is asked to, and the kernel's own tree cannot be read; the tail call failed).
#[inline(always)]
pub(crate) fn start_walk<P: Copy + 'static>(
    ctx: &impl EbpfContext,
    registers: Registers,
    pid: u32,
    (slot, pending): (&PerCpuArray<P>, P),
    walk: &PerCpuArray<WalkState>,
    unwinder: &ProgramArray,
) {
    let published = UNWIND_PROCESSES.get_ptr_mut(&pid);
    let fresh = match published {
        // A thread that is rarely sampled (one that mostly waits) must ask for the tables its
        // own walks meet unloaded.
        Some(process) => stamp_use(process),
        None => {
            let by_file = config().flags & CAPTURE_TABLES_BY_FILE != 0;
            if config().flags & (CAPTURE_QUIET_NEW_PROCESSES | CAPTURE_TABLES_BY_FILE) == 0 {
                request_mappings(pid);
            }
            // Walked all the same where the kernel's own tree says where the process's code
            // is; by frame pointers (the caller's walk) where it cannot.
            if !kernel_tree_known() {
                count_unwind(UnwindCount::ProcessUnknown);
                return;
            }
            count_unwind(UnwindCount::ProcessFromKernel);
            // Asked for above, where processes are published.
            by_file && first_request_of_period()
        }
    };
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
        (*state).met_unseen_file = 0;
        (*state).met_new_mapping = 0;
        (*state).unpublished = u64::from(published.is_none());
        (*state).mapping = 0;
        (*state).found_held = 0;
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

/// One run of an unwinder program (`programs[0]`, a program of `ctx`'s type) on process
/// `pid`'s stack, whose walk is in `walk` and whose frames so far are in `frames`: walks up to
/// [`UNWIND_FRAMES_PER_RUN`] more frames and goes on in a new run of the program, or, once
/// the walk has ended, interns the stack and returns its hash.
#[inline(always)]
pub(crate) fn continue_walk(
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
    // SAFETY: the values are only read.
    let process = unsafe { UNWIND_PROCESSES.get(&pid).or_else(|| NO_MAPPINGS.get(0)) };
    let end = match process {
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
    // A mapping the agent has not published asks at once, as a return address outside every
    // published mapping did before the walker read the kernel's record; a table evicted asks
    // once a period.
    if state.met_new_mapping != 0 || (state.met_unloaded_table != 0 && state.may_request != 0) {
        request_mappings(pid);
    }
    // A walk of a process not published yet that met a file the agent has not seen yet (a
    // program never seen before) and went wrong there is what the kernel's frame-pointer walk
    // of such a process was: a stack by frame pointers, for want of tables still to come.
    let not_loaded_yet = state.unpublished != 0 && state.met_unseen_file != 0;
    match end {
        WalkEnd::Complete => count_unwind(UnwindCount::Complete),
        WalkEnd::Truncated(reason) => {
            let (count, marker) = match not_loaded_yet {
                true => (UnwindCount::ProcessUnknown, FRAME_POINTERS_ONLY_FRAME),
                false => (reason, TRUNCATED_FRAME),
            };
            count_unwind(count);
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
                *slot = marker;
            }
            depth += 1;
        }
    }
    // CPython's frames after the native ones, for the agent to put in place.
    let depth = append_python_frames(pid, stack, depth);
    stack.depth = depth as u64;
    if !(not_loaded_yet && matches!(end, WalkEnd::Truncated(_))) {
        count_unwind(UnwindCount::Walked);
    }
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
    let mapping = &mapping;
    let mut table_row = None;
    if mapping.rows_len == 0 {
        count_unwind(UnwindCount::FramesWithoutTable);
        if mapping.rows_start == TABLE_NOT_LOADED || mapping.rows_start == FILE_NOT_SEEN {
            count_unwind(UnwindCount::FramesTableNotLoaded);
            state.met_unloaded_table = 1;
            state.met_unseen_file |= u64::from(mapping.rows_start == FILE_NOT_SEEN);
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
/// module of the frame they called), else searched for among the process's published
/// mappings, else in the kernel's own tree (a process or a library the agent has not published
/// yet).
#[inline(always)]
fn find_mapping(process: &ProcessMappings, pc: u64, state: &mut WalkState) -> Option<ExecMapping> {
    if let Some(mapping) = process.at_if_contains(state.mapping as u32, pc) {
        return Some(*mapping);
    }
    if let Some((index, mapping)) =
        process.find_through(pc, |index| opaque(&mut state.opaque, index))
    {
        state.mapping = u64::from(index);
        return Some(*mapping);
    }
    let held = state.found_held != 0 && state.found.start <= pc && pc < state.found.end;
    if !held {
        state.found_held = 0;
        state.found = kernel_mapping(pc, &mut state.node)?;
        state.found_held = 1;
    }
    if state.unpublished == 0 {
        state.met_new_mapping = 1;
    }
    count_unwind(UnwindCount::FramesMappingFromKernel);
    Some(state.found)
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
