//! The mapping that holds a user address, found in the kernel's own tree of the sampled
//! process's mappings (Linux 6.1 on), with its file's unwind table from those the agent loaded
//! by file: what lets the walker unwind a process from its first sample and a thread from its
//! first block, before the agent has read the process's mappings from the side-band and
//! published them (a short process's whole life).

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel, generated::bpf_get_current_task},
    macros::map,
    maps::HashMap,
};
use profiler_common::{
    capture::{KernelOffsets, OFFSETS_VMA_TREE},
    maple::{self, NodeLayout, NODE_WORDS},
    unwind_maps::{use_stamp, ExecMapping, FileKey, FileRows, FILE_NOT_SEEN, MAX_UNWIND_FILES},
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
    if file == 0 {
        // Code of no file: the vDSO, whose table is published under one key for every
        // process, or code a JIT wrote (no table: frame pointers).
        let vdso: u64 = read(at(mm, |o| &o.mm_vdso))?;
        return Some(match vdso == start {
            true => file_mapping(&FileKey::VDSO, start, end, 0),
            false => without_table(start, end, 0),
        });
    }
    let page_offset: u64 = read(at(vma, |o| &o.vma_pgoff))?;
    let inode: u64 = read(at(file, |o| &o.file_inode))?;
    let number: u64 = read(at(inode, |o| &o.inode_ino))?;
    let superblock: u64 = read(at(inode, |o| &o.inode_sb))?;
    let device: u32 = read(at(superblock, |o| &o.sb_dev))?;
    let key = FileKey::of_kernel_dev(device, number);
    Some(file_mapping(
        &key,
        start,
        end,
        page_offset << arch::PAGE_SHIFT,
    ))
}

/// A mapping from `start` to `end` without rows: `rows_start` says whether its file is not
/// known yet (`FILE_NOT_SEEN`: the walker asks for its table) or it has no table.
#[inline(always)]
fn without_table(start: u64, end: u64, rows_start: u32) -> ExecMapping {
    ExecMapping {
        start,
        end,
        table_base: 0,
        rows_start,
        rows_len: 0,
    }
}

/// The mapping from `start` to `end` of the file `key` from `file_offset`, by the table the
/// agent placed for the file (or its word that the table is not loaded, or that there is none),
/// stamped as walked now (once a stamp period: most walks only read it); `FILE_NOT_SEEN`
/// where the agent has said nothing of the file.
#[inline(always)]
fn file_mapping(key: &FileKey, start: u64, end: u64, file_offset: u64) -> ExecMapping {
    let Some(rows) = UNWIND_FILES.get_ptr_mut(key) else {
        return without_table(start, end, FILE_NOT_SEEN);
    };
    // SAFETY: helper without preconditions.
    let now = use_stamp(unsafe { bpf_ktime_get_ns() });
    // SAFETY: a map value the kernel keeps alive while the program runs; the agent rewrites an
    // entry only to point it at rows it has already written, and a racing stamp from another
    // CPU is as recent.
    unsafe {
        if (*rows).last_used != now {
            (*rows).last_used = now;
        }
        (*rows).mapping(start, end, file_offset)
    }
}
