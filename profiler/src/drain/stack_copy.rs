//! The stack-copy stream (`record --unwind copy`): the capture program sends every sample's user
//! registers, user stack bytes and kernel frames through a ring buffer instead of counting its
//! stacks in the maps; they are unwound here with the copy unwinder against the process table
//! the side-band keeps, and counted into the same drained stacks as every other sample. With
//! `--unwind check` the records are the copies of samples the kernel walked and counted: they
//! are unwound and compared with the walk's stacks instead.

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use profiler_common::{
    capture::{LossKind, StackCopyHeader},
    stack::NO_STACK,
};

use super::{
    add_on_cpu, stacks::StackCache, unwind_check::UnwinderComparison, Drained, DrainedStack,
};
use crate::{
    capture::ring::KernelRing,
    process::ProcessTable,
    unwind::copy::{CopyUnwinder, StackCopy, UnwoundStack, UserRegisters},
};

/// Records read at most per [`StackCopyStream::read_into`], so that a busy ring cannot keep the
/// agent from its other work.
const RECORDS_PER_READ: usize = 1 << 12;

pub struct StackCopyStream {
    ring: KernelRing,
    unwinder: CopyUnwinder,
    /// Walks that ended short of a root, per [`LossKind`].
    losses: [u64; LossKind::COUNT],
    /// With `--unwind check`: the copies compared with the kernel's walks.
    comparison: UnwinderComparison,
}

impl StackCopyStream {
    pub fn new(ring: RingBuf<MapData>) -> Result<StackCopyStream> {
        Ok(StackCopyStream {
            ring: KernelRing::new(ring)?,
            unwinder: CopyUnwinder::default(),
            losses: [0; LossKind::COUNT],
            comparison: UnwinderComparison::default(),
        })
    }

    /// Waits until the program signals that the ring is filling up.
    pub async fn readable(&self) -> std::io::Result<()> {
        self.ring.readable().await
    }

    /// Unwinds and counts the records in the ring, at most [`RECORDS_PER_READ`]; the records
    /// read. `processes` must hold the mappings the samples' processes had.
    pub fn read_into(&mut self, processes: &ProcessTable, drained: &mut Drained) -> Result<usize> {
        let (unwinder, losses) = (&mut self.unwinder, &mut self.losses);
        let comparison = &mut self.comparison;
        self.ring.for_each_bytes(RECORDS_PER_READ, |record| {
            let Some(copied) = unwind_record(record, processes, unwinder) else {
                return Ok(());
            };
            let header = &copied.header;
            if header.walked_in_kernel != NO_STACK {
                comparison.add(header.pid, header.walked_in_kernel, copied.unwound);
                return Ok(());
            }
            if let Some(loss) = copied.unwound.end.loss() {
                losses[loss as usize] += 1;
            }
            let cache = &mut drained.stack_cache;
            let kernel_frames = (header.kernel_bytes as usize / 8).min(header.kernel.len());
            let stack = DrainedStack {
                pid: header.pid,
                tid: header.tid,
                event: header.event,
                cgroup: header.cgroup,
                user: cache.intern(&copied.unwound.frames),
                kernel: cache.intern(&header.kernel[..kernel_frames]),
            };
            add_on_cpu(
                drained.stacks.entry(stack).or_default(),
                header.cpu as usize,
            );
            Ok(())
        })
    }

    /// Reads the ring to its end, after the counters stopped and the side-band was read.
    pub fn finish(&mut self, processes: &ProcessTable, drained: &mut Drained) -> Result<()> {
        while self.read_into(processes, drained)? == RECORDS_PER_READ {}
        Ok(())
    }

    /// Walks that ended short of a root, per [`LossKind`].
    pub fn losses(&self) -> &[u64; LossKind::COUNT] {
        &self.losses
    }

    /// With `--unwind check`, compares the copies whose kernel stacks `cache` holds now.
    pub fn compare_drained(&mut self, cache: &StackCache, processes: &ProcessTable) {
        self.comparison.compare_drained(cache, processes);
    }

    /// The comparison of the kernel's walks with the copies (`--unwind check`).
    pub fn comparison(&self) -> &UnwinderComparison {
        &self.comparison
    }
}

/// A stack-copy record, unwound.
struct CopiedSample {
    header: StackCopyHeader,
    unwound: UnwoundStack,
}

/// One record, its user stack unwound; `None` for a record too short to be one (the program
/// writes none).
fn unwind_record(
    record: &[u8],
    processes: &ProcessTable,
    unwinder: &mut CopyUnwinder,
) -> Option<CopiedSample> {
    let header_len = std::mem::size_of::<StackCopyHeader>();
    let header = record.get(..header_len)?;
    // SAFETY: `header` holds `size_of::<StackCopyHeader>()` bytes and the header is a
    // #[repr(C)] struct of integers, valid for any bytes; read_unaligned has no alignment needs.
    let header = unsafe { std::ptr::read_unaligned(header.as_ptr() as *const StackCopyHeader) };
    let stack_bytes = record.get(header_len..)?;
    let stack_bytes = &stack_bytes[..stack_bytes.len().min(header.stack_bytes as usize)];
    let unwound = unwinder.unwind(
        processes,
        header.pid,
        UserRegisters {
            ip: header.ip,
            sp: header.sp,
            fp: header.fp,
            link: header.link,
        },
        StackCopy {
            start: header.stack_start,
            bytes: stack_bytes,
        },
    );
    Some(CopiedSample { header, unwound })
}
