//! The stack-copy stream (`record --unwind copy`): the capture program sends every sample's user
//! registers, user stack bytes and kernel frames through a ring buffer instead of counting its
//! stacks in the maps; they are unwound here with the copy unwinder against the process table
//! the side-band keeps, and counted into the same drained stacks as every other sample.

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use profiler_common::capture::{LossKind, StackCopyHeader};

use super::{add_per_cpu, stacks::StackCache, Drained, DrainedStack};
use crate::{
    capture::{ring::KernelRing, sideband::ProcessTable},
    unwind::copy::{CopyUnwinder, StackCopy, UserRegisters},
};

/// Records read at most per [`StackCopyStream::read_into`], so that a busy ring cannot keep the
/// agent from its other work.
const RECORDS_PER_READ: usize = 1 << 12;

pub struct StackCopyStream {
    ring: KernelRing,
    unwinder: CopyUnwinder,
    /// Walks that ended short of a root, per [`LossKind`].
    losses: [u64; LossKind::COUNT],
}

impl StackCopyStream {
    pub fn new(ring: RingBuf<MapData>) -> Result<StackCopyStream> {
        Ok(StackCopyStream {
            ring: KernelRing::new(ring)?,
            unwinder: CopyUnwinder::default(),
            losses: [0; LossKind::COUNT],
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
        self.ring.for_each_bytes(RECORDS_PER_READ, |record| {
            let cache = &mut drained.stack_cache;
            let Some((stack, cpu)) = unwind_record(record, processes, unwinder, losses, cache)
            else {
                return Ok(());
            };
            let mut per_cpu = vec![0; cpu + 1];
            per_cpu[cpu] = 1;
            add_per_cpu(drained.stacks.entry(stack).or_default(), &per_cpu);
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
}

/// The stacks of one record and the CPU it was taken on; `None` for a record too short to be
/// one (the program writes none).
fn unwind_record(
    record: &[u8],
    processes: &ProcessTable,
    unwinder: &mut CopyUnwinder,
    losses: &mut [u64; LossKind::COUNT],
    cache: &mut StackCache,
) -> Option<(DrainedStack, usize)> {
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
    if let Some(loss) = unwound.end.loss() {
        losses[loss as usize] += 1;
    }
    let kernel_frames = (header.kernel_bytes as usize / 8).min(header.kernel.len());
    let stack = DrainedStack {
        pid: header.pid,
        tid: header.tid,
        event: header.event,
        cgroup: header.cgroup,
        user: cache.intern(&unwound.frames),
        kernel: cache.intern(&header.kernel[..kernel_frames]),
    };
    Some((stack, header.cpu as usize))
}
