//! The kernel architecture's part of the capture program: where the sampled and the saved user
//! registers are in `pt_regs`, whether they are a user context, and how a frame without CFI
//! links to its caller. Chosen by `bpf_target_arch`, which the profiler's build script sets to
//! the architecture the profiler is built for; aya's bindings lay out `pt_regs` by the same
//! setting, so a program built for one architecture cannot read another's register slots.

use aya_ebpf::{
    bindings::bpf_user_pt_regs_t,
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    },
    programs::PerfEventContext,
};
use profiler_common::unwind::{Registers, UnwindRow};

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!("the capture program reads registers of x86_64 and aarch64 kernels only");

/// The user registers a stack walk starts from.
#[derive(Clone, Copy)]
pub struct UserFrame {
    pub regs: Registers,
    /// aarch64's link register (x30): the return address while a function has not stored its
    /// frame record yet. 0 on x86-64, where `call` pushes the return address.
    pub link: u64,
}

/// Bytes of a page, as a VMA's `vm_pgoff` counts file offsets: 4 KiB on x86-64, and on the
/// arm64 kernels the profiler is built for (Debian's; 16 and 64 KiB kernels are not read).
pub const PAGE_SHIFT: u32 = 12;

/// The row a frame without CFI is walked by. x86-64's `push rbp; mov rbp, rsp` and AAPCS64's
/// frame record (`stp x29, x30, [sp, -N]!; mov x29, sp`) have the same shape: at the frame
/// pointer, the caller's frame pointer, then the return address. On aarch64 the record sits at
/// the bottom of the frame, so the caller's stack pointer the row gives (FP + 16) is a lower
/// bound, which only the walk's ordering check reads.
pub const FRAME_POINTER_ROW: UnwindRow = UnwindRow::FRAME_POINTER_X86_64;

#[cfg(bpf_target_arch = "x86_64")]
mod target {
    use super::*;

    /// The code segment's privilege level is user's (ring 3).
    #[inline(always)]
    pub fn is_user(
        regs: *const bpf_user_pt_regs_t,
        read: impl Fn(*const u64) -> Option<u64>,
    ) -> Option<bool> {
        // SAFETY: only the field's address is computed; `read` does the access.
        Some(read(unsafe { core::ptr::addr_of!((*regs).cs) })? & 3 == 3)
    }

    #[inline(always)]
    pub fn frame(
        regs: *const bpf_user_pt_regs_t,
        read: impl Fn(*const u64) -> Option<u64>,
    ) -> Option<UserFrame> {
        // SAFETY: only the fields' addresses are computed; `read` does the accesses.
        unsafe {
            Some(UserFrame {
                regs: Registers {
                    ip: read(core::ptr::addr_of!((*regs).rip))?,
                    sp: read(core::ptr::addr_of!((*regs).rsp))?,
                    fp: read(core::ptr::addr_of!((*regs).rbp))?,
                },
                link: 0,
            })
        }
    }

    #[inline(always)]
    pub fn ip(regs: &bpf_user_pt_regs_t) -> u64 {
        regs.rip
    }
}

#[cfg(bpf_target_arch = "aarch64")]
mod target {
    use super::*;

    /// PSTATE.M[4:0] is 0 (AArch64 EL0t) in user code. 32-bit user code (M[4] set) keeps its
    /// registers in other slots: it gets no user frame, and the kernel's walk stands in.
    #[inline(always)]
    pub fn is_user(
        regs: *const bpf_user_pt_regs_t,
        read: impl Fn(*const u64) -> Option<u64>,
    ) -> Option<bool> {
        // SAFETY: only the field's address is computed; `read` does the access.
        Some(read(unsafe { core::ptr::addr_of!((*regs).pstate) })? & 0x1f == 0)
    }

    #[inline(always)]
    pub fn frame(
        regs: *const bpf_user_pt_regs_t,
        read: impl Fn(*const u64) -> Option<u64>,
    ) -> Option<UserFrame> {
        // SAFETY: only the fields' addresses are computed; `read` does the accesses. x29 is the
        // frame pointer and x30 the link register (AAPCS64).
        unsafe {
            let x = core::ptr::addr_of!((*regs).regs).cast::<u64>();
            Some(UserFrame {
                regs: Registers {
                    ip: read(core::ptr::addr_of!((*regs).pc))?,
                    sp: read(core::ptr::addr_of!((*regs).sp))?,
                    fp: read(x.add(29))?,
                },
                link: read(x.add(30))?,
            })
        }
    }

    #[inline(always)]
    pub fn ip(regs: &bpf_user_pt_regs_t) -> u64 {
        regs.pc
    }
}

/// The sampled instruction's address.
#[inline(always)]
pub fn sample_ip(ctx: &PerfEventContext) -> u64 {
    // SAFETY: the kernel rewrites context reads of the saved registers into safe loads.
    target::ip(unsafe { &(*ctx.ctx).regs })
}

/// Whether the sample was taken in user mode, where it has no kernel stack to walk.
#[inline(always)]
pub fn sampled_in_user_mode(ctx: &PerfEventContext) -> bool {
    // SAFETY: the kernel rewrites context reads of the saved registers into safe loads.
    let sampled = unsafe { core::ptr::addr_of!((*ctx.ctx).regs) };
    // SAFETY: `sampled` points into the context, read at a constant offset.
    target::is_user(sampled, |field| Some(unsafe { *field })).unwrap_or(false)
}

/// The registers of the interrupted user code: the sample's own when it was taken in user mode,
/// else those the task saved on entering the kernel. `None` for a kernel thread.
#[inline(always)]
pub fn user_frame(ctx: &PerfEventContext) -> Option<UserFrame> {
    // SAFETY: the kernel rewrites context reads of the saved registers into safe loads.
    let sampled = unsafe { core::ptr::addr_of!((*ctx.ctx).regs) };
    // SAFETY: `sampled` points into the context, read at constant offsets.
    let from_context = |field: *const u64| Some(unsafe { *field });
    if target::is_user(sampled, from_context)? {
        return target::frame(sampled, from_context);
    }
    saved_user_frame()
}

/// The user registers the current task saved on entering the kernel; `None` for a kernel
/// thread.
#[inline(always)]
pub fn saved_user_frame() -> Option<UserFrame> {
    // SAFETY: helpers on the current task, which the kernel keeps alive while the program runs;
    // its saved `pt_regs` start with the `bpf_user_pt_regs_t` layout and are read through the
    // checking helper.
    let saved =
        unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const bpf_user_pt_regs_t;
    // SAFETY: as above.
    let checked = |field: *const u64| unsafe { bpf_probe_read_kernel(field) }.ok();
    if !target::is_user(saved, checked)? {
        return None;
    }
    target::frame(saved, checked)
}
