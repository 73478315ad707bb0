//! Stack copies: a sample's user registers, user stack bytes and kernel frames sent to the
//! agent, which unwinds them itself (`CAPTURE_STACK_COPY`), or compares them with the table
//! walk's stack (`--unwind check`).

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    helpers::bpf_get_smp_processor_id,
    macros::map,
    maps::{Array, RingBuf},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    capture::{
        CaptureConfig, LossKind, StackCopyHeader, StackCopyRecord, CAPTURE_KERNEL_STACKS,
        STACK_COPY_KERNEL_FRAMES, STACK_COPY_MAX_PAGES, STACK_COPY_PAGE_BYTES,
    },
    stack::NO_STACK,
    unwind::Registers,
};

use super::Sample;
use crate::{arch, maps::lose};

/// With `CAPTURE_STACK_COPY`: every sample's user registers, user stack and kernel frames.
#[map]
static STACK_COPIES: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// Where a sample's stack-copy record is built, one per CPU (too large for a per-CPU array,
/// whose values the kernel caps at 32 KiB); the agent sizes it to the possible CPUs.
#[map]
static STACK_COPY_SCRATCH: Array<StackCopyRecord> = Array::with_max_entries(1, 0);

/// Sends the sample's user registers, user stack bytes and kernel frames to the agent through
/// the stack-copy ring; whether it did. The stack is copied a page at a time from the stack
/// pointer's page up, so a read stops at the first page that cannot be read (the top of the
/// stack) and keeps the pages before it. `walked_in_kernel`: the hash of the user stack the
/// table walk counted for this sample, for the agent to compare (no kernel frames then), or
/// `NO_STACK` when the agent counts the sample from this record.
#[inline(always)]
pub(super) fn copy_stacks(
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
