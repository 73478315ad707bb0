//! CPython frames, read when a user stack of a CPython process is walked: the sampled thread's
//! state found in its interpreter's thread list, then its frame chain, each frame's code object
//! and instruction recorded after the native frames (`profiler_common::python`). The agent
//! names them from the code objects and puts each evaluator call's frames in place of its
//! native frame.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::bpf_get_current_task,
    },
    macros::map,
    maps::HashMap,
};
use profiler_common::{
    capture::UPID_BYTES,
    python::{
        encode_frame, PythonProcess, FRAME_OWNED_BY_CSTACK, MAX_PYTHON_FRAMES,
        MAX_PYTHON_PROCESSES, MAX_PYTHON_THREADS, NONE,
    },
    stack::{StackFrames, MAX_STACK_DEPTH},
    unwind_maps::UnwindCount,
};

use crate::{
    maps::{add, kernel_offset},
    unwind::{count_unwind, UNWIND_COUNTS},
};

/// Process id -> where its interpreter is, for the processes the agent found CPython in.
/// Preallocated, like the other hash maps perf_event programs read.
#[map]
static PYTHON_PROCESSES: HashMap<u32, PythonProcess> =
    HashMap::with_max_entries(MAX_PYTHON_PROCESSES, 0);

#[inline(always)]
fn user<T>(address: u64) -> Option<T> {
    // SAFETY: user memory read through the checking helper, which fails cleanly; the
    // interpreter changes it meanwhile, and every value read is only an address to read next
    // or a frame recorded, which the agent checks before naming it.
    unsafe { bpf_probe_read_user(address as *const T) }.ok()
}

/// Appends the Python frames of the current thread of process `pid` to `stack`, whose first
/// `depth` frames are its native ones, where `pid` runs CPython; returns the new depth.
#[inline(always)]
pub(crate) fn append_python_frames(pid: u32, stack: &mut StackFrames, depth: usize) -> usize {
    // SAFETY: the value is only read, while the program runs.
    let Some(process) = (unsafe { PYTHON_PROCESSES.get(&pid) }) else {
        return depth;
    };
    // SAFETY: helper without preconditions.
    let start = unsafe { bpf_ktime_get_ns() };
    let thread = match process.offsets.thread_id_is_native {
        0 => thread_pointer(),
        _ => namespaced_thread_id(),
    };
    let depth = python_frames(process, stack, depth as u64, thread) as usize;
    // SAFETY: as above.
    let spent = unsafe { bpf_ktime_get_ns() }.wrapping_sub(start);
    add(&UNWIND_COUNTS, UnwindCount::PythonNanos as u32, spent);
    depth
}

/// The current task's thread pointer (`fsbase`), 0 where the kernel's offsets lack it.
#[inline(always)]
fn thread_pointer() -> u64 {
    let offset = kernel_offset(|offsets| &offsets.task_fsbase);
    if offset == 0 {
        return 0;
    }
    // SAFETY: helper without preconditions; the task is only read through the checking helper.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: kernel memory read through the checking helper, which fails cleanly.
    unsafe { bpf_probe_read_kernel((task + u64::from(offset)) as *const u64) }.unwrap_or(0)
}

/// The current task's id in its own pid namespace, as the thread itself sees it (`gettid()`):
/// a containerized interpreter records that one. Where the kernel's offsets lack it, or it
/// cannot be read, the id in the initial namespace, which is the same outside containers.
#[inline(always)]
fn namespaced_thread_id() -> u64 {
    let global = u64::from(bpf_get_current_pid_tgid() as u32);
    let (thread_pid, level, numbers) = (
        kernel_offset(|offsets| &offsets.task_thread_pid),
        kernel_offset(|offsets| &offsets.pid_level),
        kernel_offset(|offsets| &offsets.pid_numbers),
    );
    if thread_pid == 0 {
        return global;
    }
    let kernel = |address: u64| -> Option<u64> {
        // SAFETY: kernel memory read through the checking helper, which fails cleanly.
        unsafe { bpf_probe_read_kernel(address as *const u64) }.ok()
    };
    // SAFETY: helper without preconditions; the task is only read through the checking helper.
    let task = unsafe { bpf_get_current_task() };
    let Some(pid) = kernel(task + u64::from(thread_pid)).filter(|&pid| pid != 0) else {
        return global;
    };
    let Some(level) = kernel(pid + u64::from(level)) else {
        return global;
    };
    // `level` is an `unsigned int`: the word's low half on a little-endian machine.
    let upid = pid + u64::from(numbers) + (level & 0xffff_ffff) * UPID_BYTES;
    // `upid.nr`, an `int`, is the upid's first four bytes.
    kernel(upid).map_or(global, |nr| nr & 0xffff_ffff)
}

/// Records the Python frames of the thread whose id is `thread` after the `depth` frames of
/// `stack`; the new depth.
#[inline(always)]
fn python_frames(process: &PythonProcess, stack: &mut StackFrames, depth: u64, thread: u64) -> u64 {
    let Some(state) = thread_state(process, thread) else {
        count_unwind(UnwindCount::PythonThreadNotFound);
        return depth;
    };
    count_unwind(UnwindCount::PythonStacks);
    let offsets = &process.offsets;
    let mut frame: u64 = user(state + u64::from(offsets.thread_frame)).unwrap_or(0);
    if offsets.cframe_current != NONE && frame != 0 {
        frame = user(frame + u64::from(offsets.cframe_current)).unwrap_or(0);
    }
    // The innermost frame starts no call: the frames the innermost call ran come first.
    let (mut depth, mut starts_call) = (depth, 0);
    for _ in 0..MAX_PYTHON_FRAMES {
        if frame == 0 {
            return depth;
        }
        let stepped = python_frame(process, stack, frame, depth, starts_call);
        if stepped & STEP_FAILED != 0 {
            break;
        }
        depth = (stepped >> DEPTH_SHIFT) & 0xff;
        starts_call = (stepped >> STARTS_CALL_SHIFT) & 1;
        frame = stepped & CALLER_BITS;
    }
    count_unwind(UnwindCount::PythonFramesCut);
    depth
}

/// What [`python_frame`] returns: the caller's frame (an address below 2^48), the new depth
/// above it, whether the next frame recorded starts an evaluator call, or this bit when the
/// frame could not be read or recorded.
const STEP_FAILED: u64 = 1 << 63;
const STARTS_CALL_SHIFT: u32 = 62;
const DEPTH_SHIFT: u32 = 48;
const CALLER_BITS: u64 = (1 << DEPTH_SHIFT) - 1;

/// Records the Python frame at `frame` at `depth` in `stack`, marked as the first of its
/// evaluator call where `starts_call`; returns the caller, the new depth and whether the next
/// frame starts a call ([`STEP_FAILED`] where it could not). Frames are only ever written at
/// `depth`: Linux 6.1's verifier could not bound a write to the frame before.
///
/// A global function: the verifier checks it once, where inlined into the frame loop it
/// followed every frame's depth apart (a million instructions, refused).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn python_frame(
    process: *const PythonProcess,
    stack: *mut StackFrames,
    frame: u64,
    depth: u64,
    starts_call: u64,
) -> u64 {
    // SAFETY: map values the kernel keeps alive while the program runs (the process's entry,
    // this CPU's frames buffer), or null; programs do not nest on one CPU.
    let (Some(process), Some(stack)) = (unsafe { (process.as_ref(), stack.as_mut()) }) else {
        return STEP_FAILED;
    };
    // The stack is full: masked below, a larger depth would wrap.
    if depth >= MAX_STACK_DEPTH as u64 {
        return STEP_FAILED;
    }
    let Some(step) = read_frame(process, frame) else {
        return STEP_FAILED;
    };
    let (mut depth, mut starts_call) = (depth, starts_call != 0);
    if let Some(recorded) = step
        .recorded
        .and_then(|(code, instruction)| encode_frame(code, instruction, starts_call))
    {
        let Some(slot) = stack.frames.get_mut(slot_index(depth)) else {
            return STEP_FAILED;
        };
        *slot = recorded;
        depth += 1;
        starts_call = false;
    }
    starts_call |= step.ends_call;
    if step.caller > CALLER_BITS {
        return STEP_FAILED;
    }
    step.caller | depth << DEPTH_SHIFT | u64::from(starts_call) << STARTS_CALL_SHIFT
}

/// A frame's place in the frames buffer, masked to the buffer's power-of-two bound: Linux 6.1's
/// verifier loses the bound the buffer's own check gives a copy of the index ("math between mem
/// pointer and register with unbounded min value"); the check still refuses the last place.
#[inline(always)]
fn slot_index(depth: u64) -> usize {
    const { assert!((MAX_STACK_DEPTH + 1).is_power_of_two()) };
    (depth & MAX_STACK_DEPTH as u64) as usize
}

/// One frame read: its code object and instruction (none for the evaluator's own frame),
/// whether it ends an evaluator call's frames (the next frame recorded starts another), and its
/// caller.
struct FrameStep {
    recorded: Option<(u64, u64)>,
    ends_call: bool,
    caller: u64,
}

#[inline(always)]
fn read_frame(process: &PythonProcess, frame: u64) -> Option<FrameStep> {
    let offsets = &process.offsets;
    let at = |offset: u32| frame + u64::from(offset);
    let caller: u64 = user(at(offsets.frame_back))?;
    // 3.12 on: the frame a C call of the evaluator keeps on the C stack.
    let marker: u8 = match offsets.frame_marker {
        NONE => 0,
        offset => user(at(offset))?,
    };
    if offsets.minor >= 12 && marker == FRAME_OWNED_BY_CSTACK {
        return Some(FrameStep {
            recorded: None,
            ends_call: true,
            caller,
        });
    }
    let code: u64 = user(at(offsets.frame_code))?;
    let (instruction, ends_call) = match offsets.code_adaptive {
        // 3.10: the index of the last instruction; every frame is its own evaluator call.
        NONE => (
            user::<i32>(at(offsets.frame_instruction))?.max(0) as u64,
            true,
        ),
        adaptive => {
            let pointer: u64 = user(at(offsets.frame_instruction))?;
            let bytecode = code + u64::from(adaptive);
            // 3.11 marks the first frame a call of the evaluator ran (`is_entry`).
            (
                pointer.saturating_sub(bytecode) / 2,
                offsets.minor == 11 && marker != 0,
            )
        }
    };
    Some(FrameStep {
        recorded: Some((code, instruction)),
        ends_call,
        caller,
    })
}

/// The thread state of the thread `thread` in the main interpreter of `process`.
#[inline(always)]
fn thread_state(process: &PythonProcess, thread: u64) -> Option<u64> {
    let offsets = &process.offsets;
    if thread == 0 {
        return None;
    }
    let interpreter: u64 = user(process.runtime + u64::from(offsets.runtime_interpreters))?;
    let mut state: u64 = user(interpreter + u64::from(offsets.interpreter_threads))?;
    for _ in 0..MAX_PYTHON_THREADS {
        if state == 0 {
            return None;
        }
        let id: u64 = user(state + u64::from(offsets.thread_id))?;
        if id == thread {
            return Some(state);
        }
        state = user(state + u64::from(offsets.thread_next))?;
    }
    None
}
