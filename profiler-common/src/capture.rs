//! Map keys, map values and configuration of the in-kernel capture program.

use crate::hw::ibs::IbsErrata;

/// Most events one recording can sample at once; event indices are `0..MAX_EVENTS`.
pub const MAX_EVENTS: usize = 16;

/// Bytes in a data cache line: data addresses are aggregated per line.
pub const CACHE_LINE_BYTES: u64 = 64;

/// Key of the stack-count map: one entry per distinct (thread, event, user stack, kernel stack).
/// Stacks are named by their hash ([`crate::stack::StackFrames::hash`]), or
/// [`crate::stack::NO_STACK`] / [`crate::stack::LOST_STACK`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    pub pid: u32,
    pub tid: u32,
    pub event: u32,
    pub _pad: u32,
    pub user_stack: u64,
    pub kernel_stack: u64,
    pub cgroup: u64,
}

/// Key of the instruction map: samples per (process, event, instruction pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstructionKey {
    pub pid: u32,
    pub event: u32,
    pub ip: u64,
}

/// Key of the data cache-line map: samples per (thread, event, access, 64-byte line,
/// instruction). The thread and access type show false sharing: several threads storing to one
/// line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DataLineKey {
    pub pid: u32,
    pub tid: u32,
    pub event: u32,
    /// One of the `ACCESS_*` values.
    pub access: u32,
    pub line: u64,
    pub ip: u64,
}

/// The access is not known (the PMU gave no data source).
pub const ACCESS_UNKNOWN: u32 = 0;
pub const ACCESS_LOAD: u32 = 1;
pub const ACCESS_STORE: u32 = 2;

/// The access type of a sample from its `perf_mem_data_src` (mem_op: LOAD 2, STORE 4).
#[inline(always)]
pub fn access_of_data_source(data_src: u64) -> u32 {
    const MEM_OP_LOAD: u64 = 2;
    const MEM_OP_STORE: u64 = 4;
    if data_src & MEM_OP_STORE != 0 {
        ACCESS_STORE
    } else if data_src & MEM_OP_LOAD != 0 {
        ACCESS_LOAD
    } else {
        ACCESS_UNKNOWN
    }
}

/// Key of the latency-histogram map: one histogram per (process, event, instruction pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LatencyKey {
    pub pid: u32,
    pub event: u32,
    pub ip: u64,
}

/// Key of the data cache-line latency-histogram map: one histogram per (process, event, 64-byte
/// data line), whatever instruction made the access: load-latency percentiles per cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LineLatencyKey {
    pub pid: u32,
    pub event: u32,
    pub line: u64,
}

/// Key of the data-source map: samples per (process, event, instruction, data line, data
/// source), for `perf mem`-style breakdowns by instruction, function and cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DataSourceKey {
    pub pid: u32,
    pub event: u32,
    pub ip: u64,
    /// The data address's 64-byte line; 0 when the sample had no data address.
    pub line: u64,
    /// The raw `perf_mem_data_src` value.
    pub data_src: u64,
}

/// Per-CPU value of the instruction and data cache-line maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleStats {
    pub count: u64,
    /// Samples that carried a latency (a subset of `count`).
    pub latency_count: u64,
    pub latency_sum: u64,
    pub latency_max: u64,
}

impl SampleStats {
    /// Counts one sample with its latency (0: none), as the capture program counts its own.
    pub fn add_sample(&mut self, latency: u64) {
        self.count += 1;
        if latency != 0 {
            self.latency_count += 1;
            self.latency_sum += latency;
            self.latency_max = self.latency_max.max(latency);
        }
    }

    pub fn merge(&mut self, other: &SampleStats) {
        self.count += other.count;
        self.latency_count += other.latency_count;
        self.latency_sum += other.latency_sum;
        self.latency_max = self.latency_max.max(other.latency_max);
    }
}

/// Every way the capture program can lose a sample or a part of it. Indices of the loss map.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LossKind {
    /// The stack-count map was full: the whole sample is lost.
    StackCountsFull = 0,
    /// The sample's perf event id was not registered: the whole sample is lost.
    UnknownEvent = 1,
    /// A different user stack was stored under the user stack's hash (verified frame by frame
    /// on insert): sample kept, stack lost rather than merged with the other.
    UserStackHashCollision = 2,
    /// The user stack could not be read (`bpf_get_stack` failed): stack lost.
    UserStackFailed = 3,
    /// A different kernel stack was stored under the kernel stack's hash: stack lost.
    KernelStackHashCollision = 4,
    /// The kernel stack could not be read: stack lost.
    KernelStackFailed = 5,
    /// The instruction map was full: the instruction view misses this sample.
    InstructionsFull = 6,
    /// The data cache-line map was full: the data view misses this sample.
    DataLinesFull = 7,
    /// The latency-histogram map was full: the histogram misses this sample.
    LatencyFull = 8,
    /// Reading `perf_sample_data` from the kernel failed: data address and latency lost.
    SampleDataReadFailed = 9,
    /// The raw ring buffer was full: the time-ordered stream misses this sample.
    RingBufferFull = 10,
    /// An IBS sample's registers could not be read or parsed: what the program decodes from
    /// them (an op's data address, latency and data source) or the derived counters are lost.
    IbsRegistersUnreadable = 11,
    /// The data-source map was full: the hardware view misses this sample.
    DataSourcesFull = 12,
    /// The IBS register ring buffer was full: the IBS-derived counters miss this sample.
    IbsRingFull = 13,
    /// The per-data-line latency-histogram map was full: the line's histogram misses this
    /// sample.
    LineLatencyFull = 14,
    /// The stack-frames map was full or busy when a new user stack was to be stored: stack lost.
    UserStackFramesFull = 15,
    /// As [`LossKind::UserStackFramesFull`], for a kernel stack.
    KernelStackFramesFull = 16,
    /// `--unwind copy`: the stack-copy ring buffer was full: the sample is counted with the
    /// frame-pointer stacks instead.
    StackCopyRingFull = 17,
    /// `--unwind copy`: not one page of the user stack could be read: the sample is counted
    /// with the frame-pointer stacks instead.
    StackCopyUnreadable = 18,
    /// A copied user stack's walk reached the end of the bytes copied (`--stack-copy-kib`, or
    /// perf's `--call-graph dwarf,SIZE`): its outer frames are lost.
    UnwindCopyTooSmall = 19,
    /// A copied user stack's walk met a return address in no executable mapping (garbage, or
    /// code mapped unseen): the walk stops there, dropping it.
    UnwindOutsideCode = 20,
    /// A copied user stack's unwind rules led nowhere (the stack pointer did not advance or went
    /// backwards): its outer frames are lost.
    UnwindBroken = 21,
    /// A copied user stack was deeper than the unwinder walks: its outermost frames are lost.
    UnwindTooDeep = 22,
    /// `--off-cpu`: a thread left the CPU but the blocked-threads map was full: its block is
    /// lost.
    OffCpuBlockedFull = 23,
    /// `--off-cpu`: a block ended but the off-CPU map was full: the block is lost.
    OffCpuFull = 24,
    /// `--off-cpu`: the off-CPU histogram map was full: the block is counted without its
    /// duration in the histograms.
    OffCpuHistogramFull = 25,
    /// `--off-cpu`: a thread left the CPU while its last block was still remembered: the
    /// switch back onto the CPU that ends a block was not seen, and the scheduler's record of
    /// the thread's time on the CPU could not date it (no BTF, a real-time thread): the block
    /// is lost.
    OffCpuSwitchInMissed = 26,
    /// Arm SPE: a record's packets did not decode, or it had no PC: the whole sample is lost.
    SpeRecordsDamaged = 27,
    /// Arm SPE: no context packet, owning task or switch record named a record's thread: the
    /// sample is counted under pid 0.
    SpeRecordsWithoutThread = 28,
    /// Arm SPE: the kernel truncated the AUX data (the area was full), the unit dropped records
    /// that collided (a period too short), or the kernel lost ring records: the records in them
    /// are lost, uncounted.
    SpeTraceLost = 29,
    /// The in-kernel walker met a process before the agent had published its mappings (its
    /// first moments, read from the side-band): the stack was walked by frame pointers only.
    UnwindProcessNotLoaded = 30,
}

impl LossKind {
    pub const COUNT: usize = 31;
    pub const ALL: [LossKind; Self::COUNT] = [
        LossKind::StackCountsFull,
        LossKind::UnknownEvent,
        LossKind::UserStackHashCollision,
        LossKind::UserStackFailed,
        LossKind::KernelStackHashCollision,
        LossKind::KernelStackFailed,
        LossKind::InstructionsFull,
        LossKind::DataLinesFull,
        LossKind::LatencyFull,
        LossKind::SampleDataReadFailed,
        LossKind::RingBufferFull,
        LossKind::IbsRegistersUnreadable,
        LossKind::DataSourcesFull,
        LossKind::IbsRingFull,
        LossKind::LineLatencyFull,
        LossKind::UserStackFramesFull,
        LossKind::KernelStackFramesFull,
        LossKind::StackCopyRingFull,
        LossKind::StackCopyUnreadable,
        LossKind::UnwindCopyTooSmall,
        LossKind::UnwindOutsideCode,
        LossKind::UnwindBroken,
        LossKind::UnwindTooDeep,
        LossKind::OffCpuBlockedFull,
        LossKind::OffCpuFull,
        LossKind::OffCpuHistogramFull,
        LossKind::OffCpuSwitchInMissed,
        LossKind::SpeRecordsDamaged,
        LossKind::SpeRecordsWithoutThread,
        LossKind::SpeTraceLost,
        LossKind::UnwindProcessNotLoaded,
    ];

    /// Whether the whole sample is gone (it counts against conservation), rather than a part of
    /// it or a secondary view.
    pub const fn loses_sample(self) -> bool {
        matches!(
            self,
            LossKind::StackCountsFull | LossKind::UnknownEvent | LossKind::SpeRecordsDamaged
        )
    }

    pub const fn describe(self) -> &'static str {
        match self {
            LossKind::StackCountsFull => "samples lost: stack-count map full",
            LossKind::UnknownEvent => "samples lost: unregistered perf event",
            LossKind::UserStackHashCollision => "user stacks lost: another stack has the same hash",
            LossKind::UserStackFailed => "user stacks lost: unreadable",
            LossKind::KernelStackHashCollision => {
                "kernel stacks lost: another stack has the same hash"
            }
            LossKind::KernelStackFailed => "kernel stacks lost: unreadable",
            LossKind::InstructionsFull => "instruction view: map full",
            LossKind::DataLinesFull => "data cache-line view: map full",
            LossKind::LatencyFull => "latency histograms: map full",
            LossKind::SampleDataReadFailed => "sample data unreadable (address/latency lost)",
            LossKind::RingBufferFull => "raw stream: ring buffer full",
            LossKind::IbsRegistersUnreadable => {
                "IBS registers unreadable (decoded fields or derived counters lost)"
            }
            LossKind::DataSourcesFull => "hardware view (data sources): map full",
            LossKind::IbsRingFull => "IBS derived counters: register ring buffer full",
            LossKind::LineLatencyFull => "data cache-line latency histograms: map full",
            LossKind::UserStackFramesFull => "user stacks lost: stack-frames map full",
            LossKind::KernelStackFramesFull => "kernel stacks lost: stack-frames map full",
            LossKind::StackCopyRingFull => {
                "user stacks by frame pointers only: stack-copy ring buffer full"
            }
            LossKind::StackCopyUnreadable => {
                "user stacks by frame pointers only: user stack unreadable for the copy"
            }
            LossKind::UnwindCopyTooSmall => {
                "user stacks cut short: walk reached the end of the stack copy"
            }
            LossKind::UnwindOutsideCode => {
                "user stacks cut short: return address outside executable mappings"
            }
            LossKind::UnwindBroken => "user stacks cut short: unwind rules led nowhere",
            LossKind::UnwindTooDeep => "user stacks cut short: deeper than the unwinder walks",
            LossKind::OffCpuBlockedFull => "off-CPU blocks lost: blocked-threads map full",
            LossKind::OffCpuFull => "off-CPU blocks lost: off-CPU map full",
            LossKind::OffCpuHistogramFull => "off-CPU histograms: map full",
            LossKind::OffCpuSwitchInMissed => {
                "off-CPU blocks lost: the switch back onto the CPU was not seen"
            }
            LossKind::SpeRecordsDamaged => "samples lost: Arm SPE record undecodable or without PC",
            LossKind::SpeRecordsWithoutThread => {
                "Arm SPE records without a thread (no context packet, owning task or switch): \
                 counted under pid 0"
            }
            LossKind::SpeTraceLost => {
                "Arm SPE trace lost: AUX data truncated, records collided or ring records lost \
                 (records uncounted)"
            }
            LossKind::UnwindProcessNotLoaded => {
                "user stacks by frame pointers only: the process's mappings were not loaded yet"
            }
        }
    }
}

/// Addresses at or above this are the kernel's: on x86-64 user space ends at 2^47 (4-level
/// paging) or 2^56 (5-level) and kernel space starts at 0xffff_8000_0000_0000 or
/// 0xff00_0000_0000_0000; on arm64 the kernel's half has the top bits set too. The top bit
/// tells them apart under every layout.
pub const KERNEL_SPACE_START: u64 = 0x8000_0000_0000_0000;

/// `KernelOffsets::valid` bit: the offsets were read from the kernel's BTF.
pub const OFFSETS_VALID: u32 = 1;
/// `KernelOffsets::valid` bit: `perf_sample_data.sample_flags` exists (Linux 6.1 on) and says
/// which fields the PMU filled. Older kernels fill the fields the event's `attr.sample_type`
/// asks for, which the program then reads instead.
pub const OFFSETS_SAMPLE_FLAGS: u32 = 2;
/// `KernelOffsets::valid` bit: the kernel keeps a process's mappings in a maple tree (Linux 6.1
/// on) whose layout the offsets describe, so the walker finds the mapping of an address itself,
/// before the agent has published the process.
pub const OFFSETS_VMA_TREE: u32 = 4;

/// Offsets (bytes) of kernel structure fields, read from the running kernel's BTF by the agent
/// and handed to the program as read-only data. `valid == 0` means no BTF: the program then
/// captures IP and stacks only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub valid: u32,
    /// `bpf_perf_event_data_kern.data` and `.event`.
    pub ctx_data: u32,
    pub ctx_event: u32,
    /// `perf_sample_data` fields.
    pub sample_flags: u32,
    pub addr: u32,
    pub phys_addr: u32,
    pub weight: u32,
    pub data_src: u32,
    pub raw: u32,
    /// `perf_event.parent` and `perf_event.id`: inherited events report their parent's id.
    pub event_parent: u32,
    pub event_id: u32,
    /// `perf_event.attr.sample_type`: what the sample holds where there is no `sample_flags`.
    pub event_sample_type: u32,
    /// `perf_raw_record.frag.data` and `.frag.size`: the PERF_SAMPLE_RAW payload (the IBS
    /// registers) and its length.
    pub raw_frag_data: u32,
    pub raw_frag_size: u32,
    /// With `OFFSETS_VMA_TREE`, what the walker reads to find the mapping holding an address in
    /// the kernel's own tree of a process's mappings (Linux 6.1 on: a maple tree): the task's
    /// `mm`, the tree's root in it, where the two kinds of node hold their pivots, slots and
    /// the count of slots in use, and the mapping's range, flags, file offset and file (its
    /// inode's number and device).
    pub task_mm: u32,
    pub mm_vma_root: u32,
    pub maple_range_pivots: u32,
    pub maple_range_slots: u32,
    pub maple_range_end: u32,
    pub maple_arange_pivots: u32,
    pub maple_arange_slots: u32,
    pub maple_arange_end: u32,
    pub vma_start: u32,
    pub vma_end: u32,
    pub vma_flags: u32,
    pub vma_pgoff: u32,
    pub vma_file: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// `task_struct.thread.fsbase` (x86-64): the thread pointer, which is what CPython 3.10
    /// records as a thread's id (`pthread_self()`); 0 where the kernel has no such field.
    pub task_fsbase: u32,
    /// `task_struct.thread_pid`, `pid.level` and `pid.numbers` (an array of `upid`, whose
    /// `nr` is first): the thread's id in its own pid namespace, `numbers[level].nr`, which is
    /// what CPython 3.11+ records as a thread's id (`gettid()`); 0 where the kernel lacks one.
    pub task_thread_pid: u32,
    pub pid_level: u32,
    pub pid_numbers: u32,
    /// `mm_struct.context.vdso`: where the process's vDSO is, the one executable mapping of no
    /// file whose table the walker has (published under [`crate::unwind_maps::FileKey::VDSO`]).
    pub mm_vdso: u32,
}

/// Bytes of one `upid` (an `int` and a pointer) in `pid.numbers`.
pub const UPID_BYTES: u64 = 16;

/// [`KernelOffsets`] as words and back, from one list of its fields: what the offsets cache
/// stores.
macro_rules! offsets_as_words {
    ($($field:ident),+ $(,)?) => {
        impl KernelOffsets {
            /// How many fields, all `u32`.
            pub const WORDS: usize = [$(stringify!($field)),+].len();

            /// The fields in declaration order.
            pub fn to_words(&self) -> [u32; Self::WORDS] {
                // Destructured, so a field left out of the list does not compile.
                let KernelOffsets { $($field),+ } = *self;
                [$($field),+]
            }

            /// The offsets [`KernelOffsets::to_words`] gave these words.
            pub fn from_words(words: [u32; Self::WORDS]) -> KernelOffsets {
                let [$($field),+] = words;
                KernelOffsets { $($field),+ }
            }
        }
    };
}

offsets_as_words!(
    valid,
    ctx_data,
    ctx_event,
    sample_flags,
    addr,
    phys_addr,
    weight,
    data_src,
    raw,
    event_parent,
    event_id,
    event_sample_type,
    raw_frag_data,
    raw_frag_size,
    task_mm,
    mm_vma_root,
    maple_range_pivots,
    maple_range_slots,
    maple_range_end,
    maple_arange_pivots,
    maple_arange_slots,
    maple_arange_end,
    vma_start,
    vma_end,
    vma_flags,
    vma_pgoff,
    vma_file,
    file_inode,
    inode_ino,
    inode_sb,
    sb_dev,
    task_fsbase,
    task_thread_pid,
    pid_level,
    pid_numbers,
    mm_vdso,
);

/// Capture options, a read-only global of the program (`CAPTURE_CONFIG`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureConfig {
    pub offsets: KernelOffsets,
    /// `CAPTURE_*` bits.
    pub flags: u32,
    /// With `CAPTURE_FILTER_UID`: only samples of this user id are kept.
    pub uid: u32,
    /// Per [`Fill`]: every this many new entries on one CPU, the program asks the agent for a
    /// drain (through the drain-request ring), which drains when the generation is half full.
    /// Zero: never ask.
    pub drain_request_steps: [u32; Fill::COUNT],
    /// With `CAPTURE_STACK_COPY`: pages of user stack each sample copies, from the page the
    /// stack pointer is in (at most [`STACK_COPY_MAX_PAGES`]).
    pub stack_copy_pages: u32,
}

impl CaptureConfig {
    /// All zero: no BTF offsets, no options. The program's global starts like this and the
    /// agent overrides it at load time.
    pub const EMPTY: CaptureConfig = CaptureConfig {
        offsets: KernelOffsets {
            valid: 0,
            ctx_data: 0,
            ctx_event: 0,
            sample_flags: 0,
            addr: 0,
            phys_addr: 0,
            weight: 0,
            data_src: 0,
            raw: 0,
            event_parent: 0,
            event_id: 0,
            event_sample_type: 0,
            raw_frag_data: 0,
            raw_frag_size: 0,
            task_mm: 0,
            mm_vma_root: 0,
            maple_range_pivots: 0,
            maple_range_slots: 0,
            maple_range_end: 0,
            maple_arange_pivots: 0,
            maple_arange_slots: 0,
            maple_arange_end: 0,
            vma_start: 0,
            vma_end: 0,
            vma_flags: 0,
            vma_pgoff: 0,
            vma_file: 0,
            file_inode: 0,
            inode_ino: 0,
            inode_sb: 0,
            sb_dev: 0,
            task_fsbase: 0,
            task_thread_pid: 0,
            pid_level: 0,
            pid_numbers: 0,
            mm_vdso: 0,
        },
        flags: 0,
        uid: 0,
        drain_request_steps: [0; Fill::COUNT],
        stack_copy_pages: 0,
    };
}

pub const CAPTURE_USER_STACKS: u32 = 1 << 0;
pub const CAPTURE_KERNEL_STACKS: u32 = 1 << 1;
/// Also stream every sample through the raw ring buffer.
pub const CAPTURE_RAW: u32 = 1 << 2;
/// Keep only samples whose cgroup id is in the cgroup filter map.
pub const CAPTURE_FILTER_CGROUP: u32 = 1 << 3;
pub const CAPTURE_FILTER_UID: u32 = 1 << 4;
/// Several events: map each perf event id to its index through the event map (needs BTF).
pub const CAPTURE_EVENT_IDS: u32 = 1 << 5;
/// Count samples per data source (`perf mem`-style breakdowns): some event's PMU reports
/// `perf_mem_data_src` (PEBS memory events, IBS ops, precise events).
pub const CAPTURE_DATA_SOURCES: u32 = 1 << 6;
/// `record --unwind copy`: each sample's user registers, user stack bytes and kernel frames go
/// to the agent through the stack-copy ring, which unwinds and counts them.
pub const CAPTURE_STACK_COPY: u32 = 1 << 7;

/// Bytes of one page of user stack copied.
pub const STACK_COPY_PAGE_BYTES: usize = 4096;
/// Most pages a sample copies: 32 KiB above the stack pointer, and the part of its page below.
pub const STACK_COPY_MAX_PAGES: usize = 9;
/// Kernel frames a stack-copy record holds (the kernel's own callchain limit).
pub const STACK_COPY_KERNEL_FRAMES: usize = 127;

/// The fixed part of a stack-copy record; `stack_bytes` bytes of user stack follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackCopyHeader {
    pub pid: u32,
    pub tid: u32,
    pub event: u32,
    pub cpu: u32,
    pub cgroup: u64,
    /// The user registers at the sample (the task's saved ones when it was in the kernel).
    pub ip: u64,
    pub sp: u64,
    /// The frame pointer (x86-64's rbp, aarch64's x29).
    pub fp: u64,
    /// aarch64's link register (x30); 0 on x86-64.
    pub link: u64,
    /// Address of the first byte copied: the start of the stack pointer's page.
    pub stack_start: u64,
    pub stack_bytes: u32,
    /// Bytes of `kernel` that hold frames (`bpf_get_stack`), 0 for a user-mode sample.
    pub kernel_bytes: u32,
    /// With `--unwind check`: the hash of the user stack the kernel's table walk found for this
    /// same sample, which it counted; the copy is only compared with it. `NO_STACK` for a
    /// sample the agent unwinds and counts from the copy.
    pub walked_in_kernel: u64,
    pub kernel: [u64; STACK_COPY_KERNEL_FRAMES],
}

/// The scratch a sample's record is built in before it is copied, as long as it is, to the ring.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackCopyRecord {
    pub header: StackCopyHeader,
    pub stack: [u8; STACK_COPY_MAX_PAGES * STACK_COPY_PAGE_BYTES],
}

/// Unwind user stacks with the unwind tables the agent loads (`record --unwind dwarf`), frame
/// pointers where a frame has none; without it, user stacks are frame-pointer walks.
pub const CAPTURE_UNWIND_DWARF: u32 = 1 << 8;
/// The walker does not ask the agent for processes it has never published: the agent reads the
/// side-band and publishes every new process on its own schedule (every 50 ms). Set where the
/// whole machine is sampled, where processes the run did not start come and go: under process
/// churn nearly every new process is sampled before the side-band names it, and each such request
/// woke the agent (about 90 times a second at 99 Hz under the bench's churn load, four fifths of
/// its wake-ups, each a side-band read and a sync), mostly for processes already gone. Requests
/// for published processes (a library loaded by dlopen, a table to load) still wake it.
pub const CAPTURE_QUIET_NEW_PROCESSES: u32 = 1 << 9;
/// Count samples per instruction (their statistics in the instructions map): what `record`'s
/// instruction, annotation and cache-line reports read. The agent's exports carry stacks and
/// data lines only, and without it each sample costs one per-CPU map update less.
pub const CAPTURE_INSTRUCTIONS: u32 = 1 << 10;
/// The agent publishes tables by file, and a process's mappings only where the walker cannot
/// find a table of it by file (code of no file with a table, files the kernel names by another
/// device than `stat`): the walker finds every frame's mapping in the kernel's own tree
/// (`OFFSETS_VMA_TREE`) and its file's table by device and inode, so a process is unwound from
/// its first sample with no step of the agent's, and new processes cost the agent only what
/// their new files do. It asks for a table it meets unloaded at most once a use-stamp period
/// on each CPU. System-wide only.
pub const CAPTURE_TABLES_BY_FILE: u32 = 1 << 11;

/// How the program reads PERF_SAMPLE_RAW payloads, a read-only global of the program
/// (`RAW_DECODING`) the agent sets at load time. All zero: no event's payload is decoded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawDecoding {
    /// Bit `i` set: event index `i` is an AMD IBS op event, whose raw payload holds the op
    /// registers.
    pub ibs_op_events: u32,
    /// Bit `i` set: event index `i` is an AMD IBS fetch event, whose raw payload holds the fetch
    /// registers.
    pub ibs_fetch_events: u32,
    /// `IBS_ERRATUM_*` bits of the CPU the program runs on.
    pub ibs_errata: u32,
    pub _pad: u32,
}

/// Erratum 1293: OP_DATA2 is invalid with "DC miss, no MAB" or software prefetch.
pub const IBS_ERRATUM_OP_DATA2_WITHOUT_MAB: u32 = 1 << 0;
/// Erratum 1238: the fetch IC-miss bit is unreliable.
pub const IBS_ERRATUM_FETCH_IC_MISS: u32 = 1 << 1;
/// Erratum 1347: the fetch L1 TLB page size uses another table.
pub const IBS_ERRATUM_FETCH_PAGE_SIZE_TABLE: u32 = 1 << 2;
/// The cache-hit-state bit is unreliable.
pub const IBS_ERRATUM_CACHE_HIT_STATE: u32 = 1 << 3;

impl RawDecoding {
    pub const EMPTY: RawDecoding = RawDecoding {
        ibs_op_events: 0,
        ibs_fetch_events: 0,
        ibs_errata: 0,
        _pad: 0,
    };

    /// Decoding for IBS op events at `op_events` and IBS fetch events at `fetch_events` (indices
    /// below [`MAX_EVENTS`]) on a CPU with `errata`.
    pub fn new(
        op_events: impl IntoIterator<Item = u32>,
        fetch_events: impl IntoIterator<Item = u32>,
        errata: IbsErrata,
    ) -> RawDecoding {
        let flag = |set: bool, bit: u32| if set { bit } else { 0 };
        let bits = |events: &mut dyn Iterator<Item = u32>| {
            events
                .filter(|&event| (event as usize) < MAX_EVENTS)
                .fold(0, |bits, event| bits | (1 << event))
        };
        RawDecoding {
            ibs_op_events: bits(&mut op_events.into_iter()),
            ibs_fetch_events: bits(&mut fetch_events.into_iter()),
            _pad: 0,
            ibs_errata: flag(
                errata.op_data2_without_mab,
                IBS_ERRATUM_OP_DATA2_WITHOUT_MAB,
            ) | flag(errata.fetch_ic_miss, IBS_ERRATUM_FETCH_IC_MISS)
                | flag(
                    errata.fetch_page_size_table,
                    IBS_ERRATUM_FETCH_PAGE_SIZE_TABLE,
                )
                | flag(errata.cache_hit_state, IBS_ERRATUM_CACHE_HIT_STATE),
        }
    }

    #[inline(always)]
    pub const fn is_ibs_op(&self, event: u32) -> bool {
        event < MAX_EVENTS as u32 && self.ibs_op_events & (1 << event) != 0
    }

    #[inline(always)]
    pub const fn is_ibs_fetch(&self, event: u32) -> bool {
        event < MAX_EVENTS as u32 && self.ibs_fetch_events & (1 << event) != 0
    }

    /// Whether `event` is an IBS event of either kind, whose registers are streamed to the agent.
    #[inline(always)]
    pub const fn is_ibs(&self, event: u32) -> bool {
        event < MAX_EVENTS as u32 && self.ibs_events() & (1 << event) != 0
    }

    /// Bits of every IBS event.
    #[inline(always)]
    pub const fn ibs_events(&self) -> u32 {
        self.ibs_op_events | self.ibs_fetch_events
    }

    #[inline(always)]
    pub const fn errata(&self) -> IbsErrata {
        let bits = self.ibs_errata;
        IbsErrata {
            op_data2_without_mab: bits & IBS_ERRATUM_OP_DATA2_WITHOUT_MAB != 0,
            fetch_ic_miss: bits & IBS_ERRATUM_FETCH_IC_MISS != 0,
            fetch_page_size_table: bits & IBS_ERRATUM_FETCH_PAGE_SIZE_TABLE != 0,
            cache_hit_state: bits & IBS_ERRATUM_CACHE_HIT_STATE != 0,
        }
    }
}

/// `perf_sample_data.sample_flags` bits (the kernel's PERF_SAMPLE_* values).
pub mod sample_flags {
    pub const ADDR: u64 = 1 << 3;
    pub const RAW: u64 = 1 << 10;
    pub const WEIGHT: u64 = 1 << 14;
    pub const DATA_SRC: u64 = 1 << 15;
    pub const PHYS_ADDR: u64 = 1 << 19;
    pub const WEIGHT_STRUCT: u64 = 1 << 24;
}

/// Generation control: index 0 of the control map holds the generation (0 or 1) the program
/// writes to; the agent flips it and drains the other one.
pub const CONTROL_GENERATION: u32 = 0;

/// The maps whose new entries the program counts per generation, so the agent can drain every
/// one of them before it fills.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    StackCounts = 0,
    Instructions = 1,
    DataLines = 2,
    DataSources = 3,
    /// Both latency-histogram maps (per instruction and per data line).
    Histograms = 4,
    /// The stack-frames map, which both generations share: the agent empties it into its stack
    /// cache before it fills.
    StackFrames = 5,
}

impl Fill {
    pub const COUNT: usize = 6;
    pub const ALL: [Fill; Fill::COUNT] = [
        Fill::StackCounts,
        Fill::Instructions,
        Fill::DataLines,
        Fill::DataSources,
        Fill::Histograms,
        Fill::StackFrames,
    ];
}

/// Index of the fill counter of `fill` in `generation`.
#[inline(always)]
pub const fn fill_index(generation: u32, fill: Fill) -> u32 {
    generation * Fill::COUNT as u32 + fill as u32
}

/// Bytes of the largest IBS raw payload Linux sends: the `u32` capabilities word, the seven op
/// registers, BR_TARGET and OP_DATA4 (a fetch payload is shorter: three or four registers).
pub const IBS_PAYLOAD_MAX_BYTES: usize = 4 + 9 * 8;
/// Bytes every IBS payload has: the capabilities word and the three fetch registers; longer
/// payloads add whole registers.
pub const IBS_PAYLOAD_MIN_BYTES: usize = 4 + 3 * 8;

/// The registers of one IBS sample, streamed to the agent through the IBS ring buffer: the
/// derived counters (CodeXL's events) are accumulated there with the same decoders, since the
/// counters are too large for the program's stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbsRecord {
    pub pid: u32,
    pub event: u32,
    pub ip: u64,
    /// The data address's 64-byte line, valid with `sample_flags::ADDR` in `sample_flags`.
    pub line: u64,
    /// `perf_mem_data_src`, valid with `sample_flags::DATA_SRC`: the kernel's, or decoded from
    /// the op registers by the program.
    pub data_src: u64,
    pub sample_flags: u64,
    /// Valid bytes of `payload`.
    pub payload_len: u32,
    /// The PERF_SAMPLE_RAW payload: `u32` capabilities, then the registers.
    pub payload: [u8; IBS_PAYLOAD_MAX_BYTES],
}

impl IbsRecord {
    /// The valid part of the payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload[..(self.payload_len as usize).min(IBS_PAYLOAD_MAX_BYTES)]
    }
}

/// One sample as streamed through the raw ring buffer (`record --raw`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawSample {
    pub time_ns: u64,
    pub ip: u64,
    pub addr: u64,
    pub phys_addr: u64,
    pub latency: u64,
    pub data_src: u64,
    pub cgroup: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub event: u32,
    /// Stack hashes, as in [`StackKey`].
    pub user_stack: u64,
    pub kernel_stack: u64,
    /// `sample_flags` bits that were valid for this sample.
    pub sample_flags: u64,
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all these types are #[repr(C)] with only integer fields and explicit padding, so
    // every bit pattern is valid and there are no uninitialized bytes.
    unsafe impl aya::Pod for StackKey {}
    unsafe impl aya::Pod for InstructionKey {}
    unsafe impl aya::Pod for DataLineKey {}
    unsafe impl aya::Pod for LatencyKey {}
    unsafe impl aya::Pod for LineLatencyKey {}
    unsafe impl aya::Pod for DataSourceKey {}
    unsafe impl aya::Pod for SampleStats {}
    unsafe impl aya::Pod for CaptureConfig {}
    unsafe impl aya::Pod for RawDecoding {}
    unsafe impl aya::Pod for RawSample {}
    unsafe impl aya::Pod for IbsRecord {}
    unsafe impl aya::Pod for StackCopyHeader {}
    unsafe impl aya::Pod for crate::latency::LatencyBuckets {}
    unsafe impl aya::Pod for crate::stack::StackFrames {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<StackKey>(), 40);
        assert_eq!(size_of::<InstructionKey>(), 16);
        assert_eq!(size_of::<DataLineKey>(), 32);
        assert_eq!(size_of::<LatencyKey>(), 16);
        assert_eq!(size_of::<LineLatencyKey>(), 16);
        assert_eq!(size_of::<DataSourceKey>(), 32);
        assert_eq!(size_of::<SampleStats>(), 32);
        assert_eq!(size_of::<KernelOffsets>(), 144);
        assert_eq!(size_of::<CaptureConfig>(), 180);
        assert_eq!(size_of::<crate::stack::StackFrames>(), 1024);
        assert_eq!(size_of::<RawDecoding>(), 16);
        assert_eq!(size_of::<IbsRecord>(), 120);
        assert_eq!(size_of::<RawSample>(), 96);
    }

    #[test]
    fn raw_decoding_round_trips_events_and_errata() {
        let zen3 = IbsErrata::for_cpu(0x19, 0x01);
        let decoding = RawDecoding::new([0, 3, 15, 16, 40], [1, 17], zen3);
        assert_eq!(decoding.ibs_op_events, 0b1000_0000_0000_1001);
        assert_eq!(decoding.ibs_fetch_events, 0b10);
        assert!(decoding.is_ibs_op(3) && decoding.is_ibs_op(15));
        assert!(!decoding.is_ibs_op(1) && !decoding.is_ibs_op(16) && !decoding.is_ibs_op(40));
        assert!(decoding.is_ibs_fetch(1) && !decoding.is_ibs_fetch(0));
        assert!(decoding.is_ibs(0) && decoding.is_ibs(1) && !decoding.is_ibs(2));
        assert!(!decoding.is_ibs(17) && !decoding.is_ibs(40));
        assert_eq!(decoding.ibs_errata, 0b1111);
        assert_eq!(decoding.errata(), zen3);
        let zen3_plus = IbsErrata::for_cpu(0x19, 0x21);
        assert_eq!(
            RawDecoding::new([], [], zen3_plus).ibs_errata,
            IBS_ERRATUM_CACHE_HIT_STATE
        );
        assert_eq!(RawDecoding::new([], [], zen3_plus).errata(), zen3_plus);
        assert_eq!(RawDecoding::default(), RawDecoding::EMPTY);
    }

    #[test]
    fn loss_kinds_are_indexed_densely() {
        for (i, kind) in LossKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i);
        }
        let whole: usize = LossKind::ALL.iter().filter(|k| k.loses_sample()).count();
        assert_eq!(whole, 3);
    }

    #[test]
    fn fill_counters_of_the_two_generations_do_not_overlap() {
        let mut next = 0;
        for generation in [0, 1] {
            for fill in Fill::ALL {
                assert_eq!(
                    fill_index(generation, fill),
                    next,
                    "{fill:?} of {generation}"
                );
                next += 1;
            }
        }
    }

    #[test]
    fn access_comes_from_the_memory_operation() {
        assert_eq!(access_of_data_source(0x2), ACCESS_LOAD);
        assert_eq!(access_of_data_source(0x4), ACCESS_STORE);
        assert_eq!(access_of_data_source(0x1), ACCESS_UNKNOWN);
        assert_eq!(access_of_data_source(0), ACCESS_UNKNOWN);
    }

    #[test]
    fn merge_adds_counts_and_keeps_max() {
        let mut a = SampleStats {
            count: 2,
            latency_count: 1,
            latency_sum: 10,
            latency_max: 10,
        };
        a.merge(&SampleStats {
            count: 3,
            latency_count: 2,
            latency_sum: 50,
            latency_max: 40,
        });
        assert_eq!(
            a,
            SampleStats {
                count: 5,
                latency_count: 3,
                latency_sum: 60,
                latency_max: 40
            }
        );
    }
}
