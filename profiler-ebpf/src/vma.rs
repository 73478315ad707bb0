//! The mapping that holds a user address, found in the kernel's own tree of the sampled
//! process's mappings (Linux 6.1 on), with its file's unwind table from those the agent loaded
//! by file: what lets the walker unwind a process from its first sample and a thread from its
//! first block, before the agent has read the process's mappings from the side-band and
//! published them (a short process's whole life).

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel, generated::bpf_get_current_task},
    macros::map,
    maps::HashMap,
};
use profiler_common::{
    capture::{KernelOffsets, OFFSETS_VMA_TREE},
    maple::{self, NodeLayout, NODE_WORDS},
    unwind_maps::{ExecMapping, FileKey, FileRows, MAX_UNWIND_FILES, TABLE_NOT_LOADED},
};

use crate::{arch, maps::kernel_offset};

/// File -> where its table lies in the row arena, for every file whose table the agent has
/// placed there. Preallocated, like the other hash maps perf_event programs read.
#[map]
static UNWIND_FILES: HashMap<FileKey, FileRows> = HashMap::with_max_entries(MAX_UNWIND_FILES, 0);

/// `vm_flags` bit of an executable mapping.
const VM_EXEC: u64 = 0x4;

/// Whether the kernel's offsets say where its mapping tree is.
#[inline(always)]
pub(crate) fn kernel_tree_known() -> bool {
    kernel_offset(|offsets| &offsets.valid) & OFFSETS_VMA_TREE != 0
}

#[inline(always)]
fn read<T>(address: u64) -> Option<T> {
    // SAFETY: kernel memory read through the checking helper, which fails cleanly on a bad
    // address; the structures are read without their locks, and every answer is checked.
    unsafe { bpf_probe_read_kernel(address as *const T) }.ok()
}

/// The executable mapping of the current task's process that holds `address`, by the kernel's
/// tree (read through `node`, a node's worth of scratch): with its file's table where the agent
/// has placed one, `TABLE_NOT_LOADED` where the file's table is not placed (the walker asks for
/// it), no table for anonymous code (JIT). `None` where no executable mapping holds the address,
/// or the tree could not be read (being changed): the address is treated as outside every
/// mapping, as for a published process.
#[inline(always)]
pub(crate) fn kernel_mapping(address: u64, node: &mut [u64; NODE_WORDS]) -> Option<ExecMapping> {
    if !kernel_tree_known() {
        return None;
    }
    // Field by field, where they are used (see `kernel_offset`).
    let at = |base: u64, field: fn(&KernelOffsets) -> &u32| base + u64::from(kernel_offset(field));
    // SAFETY: helper without preconditions; the task is only read through checking helpers.
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = read(at(task, |o| &o.task_mm))?;
    if mm == 0 {
        return None;
    }
    let root: u64 = read(at(mm, |o| &o.mm_vma_root))?;
    // Checked by the agent to lie within a node, on word boundaries (`NodeLayout::from_offsets`).
    let layout = NodeLayout {
        range_pivots: kernel_offset(|o| &o.maple_range_pivots) / 8,
        range_slots: kernel_offset(|o| &o.maple_range_slots) / 8,
        range_end: kernel_offset(|o| &o.maple_range_end),
        arange_pivots: kernel_offset(|o| &o.maple_arange_pivots) / 8,
        arange_slots: kernel_offset(|o| &o.maple_arange_slots) / 8,
        arange_end: kernel_offset(|o| &o.maple_arange_end),
    };
    let vma = maple::lookup(root, address, &layout, node, |at, into| {
        // SAFETY: copies one node's bytes through the checking helper into `into`, which holds
        // exactly that many.
        unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                into.as_mut_ptr() as *mut core::ffi::c_void,
                (NODE_WORDS * 8) as u32,
                at as *const core::ffi::c_void,
            ) == 0
        }
    })?;
    // No VMA (a gap), or a marker entry rather than a pointer.
    if vma == 0 || vma & 7 != 0 {
        return None;
    }
    let start: u64 = read(at(vma, |o| &o.vma_start))?;
    let end: u64 = read(at(vma, |o| &o.vma_end))?;
    let flags: u64 = read(at(vma, |o| &o.vma_flags))?;
    // A VMA freed and reused meanwhile holds another range.
    if !(start <= address && address < end) || flags & VM_EXEC == 0 {
        return None;
    }
    let file: u64 = read(at(vma, |o| &o.vma_file))?;
    let without_table = |rows_start| ExecMapping {
        start,
        end,
        table_base: 0,
        rows_start,
        rows_len: 0,
    };
    if file == 0 {
        return Some(without_table(0));
    }
    let page_offset: u64 = read(at(vma, |o| &o.vma_pgoff))?;
    let inode: u64 = read(at(file, |o| &o.file_inode))?;
    let number: u64 = read(at(inode, |o| &o.inode_ino))?;
    let superblock: u64 = read(at(inode, |o| &o.inode_sb))?;
    let device: u32 = read(at(superblock, |o| &o.sb_dev))?;
    let key = FileKey::of_kernel_dev(device, number);
    // SAFETY: the value is copied out at once; the agent rewrites an entry only to point it at
    // rows it has already written.
    Some(match unsafe { UNWIND_FILES.get(&key) } {
        Some(rows) => rows.mapping(start, end, page_offset << arch::PAGE_SHIFT),
        None => without_table(TABLE_NOT_LOADED),
    })
}
