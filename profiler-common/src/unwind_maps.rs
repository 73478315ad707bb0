//! What the agent loads into the capture program's maps for the in-kernel unwinder, and what the
//! unwinder counts: per process, its executable mappings sorted by address, each naming the
//! slice of the shared row arena that holds its file's unwind rows (one copy per file however
//! many processes map it); the walk's outcomes by reason; the marker frame that ends a stack the
//! walk could not finish.

/// Executable mappings one process may have in the walker's table (the agent keeps the ones
/// with tables first when a process has more). A mapping lookup takes
/// [`MAPPING_SEARCH_STEPS`] steps.
pub const MAX_PROCESS_MAPPINGS: usize = 256;
const _: () = assert!(MAX_PROCESS_MAPPINGS.is_power_of_two());
/// Binary-search steps over [`MAX_PROCESS_MAPPINGS`] mappings.
pub const MAPPING_SEARCH_STEPS: u32 = 9;

/// User frames one walk takes at most (one less than a stack holds, for the marker); a deeper
/// stack ends in [`TRUNCATED_FRAME`].
pub const MAX_UNWIND_FRAMES: usize = 126;

/// Frames one run of the unwinder program walks before it tail-calls itself: each run looks
/// the walk's state and process up again. The verifier checks a frame's step once, however
/// many a run takes (it is a global function), so runs are long: a walk of up to 32 frames is
/// one run.
pub const UNWIND_FRAMES_PER_RUN: u32 = 32;
/// Tail calls one chain may make (the kernel's MAX_TAIL_CALL_CNT); the first run of the walk
/// is itself one.
const MAX_TAIL_CALLS: usize = 33;
const _: () = assert!(MAX_UNWIND_FRAMES.div_ceil(UNWIND_FRAMES_PER_RUN as usize) <= MAX_TAIL_CALLS);

/// The frame that ends a user stack the walk could not finish (no rule found the caller, a
/// return address outside every executable mapping, or more frames than the walk takes): no code
/// lives at address 0, and reports name it `[truncated]`.
pub const TRUNCATED_FRAME: u64 = 0;

/// The frame that ends a user stack walked by frame pointers alone where unwinding by tables or
/// from a stack copy was asked for (a process sampled before the agent loaded its mappings, a
/// stack that could not be copied): no code lives at address 1, and reports name it
/// `[frame pointers only]` and count such stacks apart.
pub const FRAME_POINTERS_ONLY_FRAME: u64 = 1;

/// Whether a frame is one of the markers above rather than code.
pub const fn is_marker_frame(address: u64) -> bool {
    address == TRUNCATED_FRAME || address == FRAME_POINTERS_ONLY_FRAME
}

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// The run-time address that row `pc` 0 of the mapping's table stands for (the file's load
    /// bias plus the table's base).
    pub table_base: u64,
    /// First row of the table in the row arena.
    pub rows_start: u32,
    /// Rows of the table; 0 when the mapping has no table (walked by frame pointers).
    pub rows_len: u32,
}

/// Files whose tables the walker finds by the file itself (`UNWIND_FILES`), for mappings the
/// agent has not published.
pub const MAX_UNWIND_FILES: u32 = 4096;

/// A file as the kernel names it in a VMA: its filesystem's device numbers (`MAJOR` and `MINOR`
/// of the superblock's `s_dev`, which `stat` reports too for a disk or tmpfs file) and its
/// inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
}

impl FileKey {
    /// The vDSO's key: the same code in every process, mapped from no file. No device has
    /// these numbers (12 bits of major, 20 of minor).
    pub const VDSO: FileKey = FileKey {
        major: u32::MAX,
        minor: u32::MAX,
        inode: 0,
    };

    /// The key of inode `inode` on the filesystem of the kernel's device number `dev`
    /// (12 bits of major above 20 of minor).
    pub const fn of_kernel_dev(dev: u32, inode: u64) -> FileKey {
        FileKey {
            major: dev >> 20,
            minor: dev & 0xf_ffff,
            inode,
        }
    }
}

/// Where one file's table lies in the row arena, for the walker to make the mapping of a VMA of
/// that file itself.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileRows {
    /// A mapping's `table_base` minus the address its file's offset 0 would be mapped at.
    pub table_delta: u64,
    /// File offsets of the code the table covers (its executable segment, from that segment's
    /// first page): a VMA mapping another part of the file gets no table.
    pub code_start: u64,
    pub code_end: u64,
    pub rows_start: u32,
    pub rows_len: u32,
    /// The last walk through the file, a [`use_stamp`], written by the walker: the agent
    /// evicts the tables of the files walked least lately.
    pub last_used: u32,
    pub _pad: u32,
}

impl FileRows {
    /// The walker's mapping of a VMA from `start` to `end` that maps the file from
    /// `file_offset`.
    pub const fn mapping(&self, start: u64, end: u64, file_offset: u64) -> ExecMapping {
        if file_offset < self.code_start || file_offset >= self.code_end {
            return ExecMapping {
                start,
                end,
                table_base: 0,
                rows_start: 0,
                rows_len: 0,
            };
        }
        ExecMapping {
            start,
            end,
            table_base: start
                .wrapping_sub(file_offset)
                .wrapping_add(self.table_delta),
            rows_start: self.rows_start,
            rows_len: self.rows_len,
        }
    }
}

/// `rows_start` of a mapping whose file has a table that is not in the arena (it did not fit,
/// or was evicted for a busier process's): the walker steps its frames by frame pointers and
/// asks the agent to load it.
pub const TABLE_NOT_LOADED: u32 = u32::MAX;

/// `rows_start` of a mapping of a file the agent has said nothing of yet (a program never seen
/// before, found in the kernel's tree): unloaded as with [`TABLE_NOT_LOADED`], and a stack that
/// goes wrong there is a frame-pointer walk for want of tables still to come.
pub const FILE_NOT_SEEN: u32 = u32::MAX - 1;

/// A process's last sample, in units of 2^[`USE_STAMP_SHIFT`] ns of `CLOCK_MONOTONIC` (about
/// 17 ms; wraps after two years, so ages are compared by wrapping subtraction).
pub const USE_STAMP_SHIFT: u32 = 24;

/// The use stamp of the monotonic time `ns`.
pub const fn use_stamp(ns: u64) -> u32 {
    (ns >> USE_STAMP_SHIFT) as u32
}

/// A process's executable mappings, sorted by `start`, not overlapping.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    pub count: u32,
    /// When the walker last unwound one of the process's samples (a [`use_stamp`]; the agent
    /// sets it when it publishes the process): which tables are in use, for eviction.
    pub last_used: u32,
    pub mappings: [ExecMapping; MAX_PROCESS_MAPPINGS],
}

impl ProcessMappings {
    pub const EMPTY: ProcessMappings = ProcessMappings {
        count: 0,
        last_used: 0,
        mappings: [ExecMapping {
            start: 0,
            end: 0,
            table_base: 0,
            rows_start: 0,
            rows_len: 0,
        }; MAX_PROCESS_MAPPINGS],
    };

    /// The mapping containing `address`, and its index. Bounded by [`MAPPING_SEARCH_STEPS`] for
    /// the verifier, and indexes masked to the array (the verifier does not follow the search's
    /// own bounds). The search's bounds pass through `opaque`, which in BPF hides their values
    /// from the verifier (see [`crate::unwind::find_last_at_or_below`]).
    #[inline(always)]
    pub fn find_through(
        &self,
        address: u64,
        opaque: impl FnMut(u32) -> u32,
    ) -> Option<(u32, &ExecMapping)> {
        let count = if self.count as usize > MAX_PROCESS_MAPPINGS {
            MAX_PROCESS_MAPPINGS as u32
        } else {
            self.count
        };
        let at = |i: u32| &self.mappings[i as usize & (MAX_PROCESS_MAPPINGS - 1)];
        let found = crate::unwind::find_last_at_or_below(
            count,
            MAPPING_SEARCH_STEPS,
            address,
            |i| Some(at(i).start),
            opaque,
        )?;
        let mapping = at(found);
        (address < mapping.end).then_some((found, mapping))
    }

    /// The mapping at `index` when it contains `address`.
    #[inline(always)]
    pub fn at_if_contains(&self, index: u32, address: u64) -> Option<&ExecMapping> {
        if index >= self.count {
            return None;
        }
        let mapping = &self.mappings[index as usize & (MAX_PROCESS_MAPPINGS - 1)];
        (mapping.start <= address && address < mapping.end).then_some(mapping)
    }
}

/// What the walker counts, per CPU (index = the variant).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindCount {
    /// User stacks walked with tables.
    Walked = 0,
    /// ... of which reached the outermost frame (an undefined return address).
    Complete = 1,
    /// User stacks walked by frame pointers because the agent had not loaded the process's
    /// mappings yet (the kernel's frame-pointer walk), or, where the walker reads the kernel's
    /// own record of them, the tables of the files the walk went wrong in.
    ProcessUnknown = 2,
    /// Frames stepped by frame pointers: their mapping has no table.
    FramesWithoutTable = 3,
    /// Frames stepped by frame pointers: their table has no row for the address.
    FramesWithoutRow = 4,
    /// Stacks ended in [`TRUNCATED_FRAME`]: a return address outside every executable mapping.
    TruncatedOutsideMappings = 5,
    /// ... no rule found the caller (a failed read, an unsupported rule, a frame-pointer step
    /// through a frame that keeps none).
    TruncatedNoCaller = 6,
    /// ... more than [`MAX_UNWIND_FRAMES`] frames.
    TruncatedDepth = 7,
    /// Frames stepped by frame pointers: their mapping's table is not loaded
    /// ([`TABLE_NOT_LOADED`]; also counted in `FramesWithoutTable`).
    FramesTableNotLoaded = 8,
    /// User stacks walked with tables before the agent published the process's mappings, by
    /// the kernel's own record of them (Linux 6.1 on).
    ProcessFromKernel = 9,
    /// Frames whose mapping the walker found in the kernel's own record (the process, or this
    /// mapping of it, not published yet).
    FramesMappingFromKernel = 10,
    /// Stacks of CPython processes with their Python frames read.
    PythonStacks = 11,
    /// ... whose thread the interpreter's thread list did not hold (not running Python yet, or
    /// more threads than the walker searches): native frames only.
    PythonThreadNotFound = 12,
    /// ... whose frame chain could not be read, or went on past the walker's frames or the
    /// stack's room: the outermost Python frames left out.
    PythonFramesCut = 13,
    /// Nanoseconds spent finding the thread and reading the Python frames, summed over the
    /// stacks of CPython processes (the walker's own cost per such stack, for `--stats`).
    PythonNanos = 14,
}

impl UnwindCount {
    pub const COUNT: usize = 15;
    pub const ALL: [UnwindCount; UnwindCount::COUNT] = [
        UnwindCount::Walked,
        UnwindCount::Complete,
        UnwindCount::ProcessUnknown,
        UnwindCount::FramesWithoutTable,
        UnwindCount::FramesWithoutRow,
        UnwindCount::TruncatedOutsideMappings,
        UnwindCount::TruncatedNoCaller,
        UnwindCount::TruncatedDepth,
        UnwindCount::FramesTableNotLoaded,
        UnwindCount::ProcessFromKernel,
        UnwindCount::FramesMappingFromKernel,
        UnwindCount::PythonStacks,
        UnwindCount::PythonThreadNotFound,
        UnwindCount::PythonFramesCut,
        UnwindCount::PythonNanos,
    ];

    /// The sample-accounting loss a walk ending this way is, as the copy unwinder counts the
    /// same ends: a stack cut short or left to frame pointers is a loss, whichever unwinder
    /// walked it.
    pub const fn loss(self) -> Option<crate::capture::LossKind> {
        use crate::capture::LossKind;
        match self {
            UnwindCount::ProcessUnknown => Some(LossKind::UnwindProcessNotLoaded),
            UnwindCount::TruncatedOutsideMappings => Some(LossKind::UnwindOutsideCode),
            UnwindCount::TruncatedNoCaller => Some(LossKind::UnwindBroken),
            UnwindCount::TruncatedDepth => Some(LossKind::UnwindTooDeep),
            _ => None,
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] with only integer fields and no padding (32 bytes).
unsafe impl aya::Pod for ExecMapping {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)] with only integer fields and no padding (16 bytes).
unsafe impl aya::Pod for FileKey {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)] with only integer fields and no padding (40 bytes: `_pad` fills the tail).
unsafe impl aya::Pod for FileRows {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], integer fields and an array of padding-free mappings; `last_used` fills
// the only gap.
unsafe impl aya::Pod for ProcessMappings {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mapping containing `address`, found with indexes passed through as they are, and
    /// checked against its index.
    fn find(process: &ProcessMappings, address: u64) -> Option<&ExecMapping> {
        let (index, mapping) = process.find_through(address, |index| index)?;
        assert!(core::ptr::eq(
            process.at_if_contains(index, address).unwrap(),
            mapping
        ));
        Some(mapping)
    }

    #[test]
    fn a_files_rows_map_its_code_and_nothing_else() {
        // The text of a PIE laid out as lld does: file offset 0x13730 at address 0x14730, rows
        // from address 0x14730 on (table base 0x14730): offset - address + base.
        let rows = FileRows {
            table_delta: 0x13730,
            code_start: 0x13000,
            code_end: 0x13730 + 0x3e2f0,
            rows_start: 7,
            rows_len: 9,
            ..FileRows::default()
        };
        // Mapped from file offset 0x13000 at 0x5555_0001_4000: load bias 0x5555_0000_0000.
        let text = rows.mapping(0x5555_0001_4000, 0x5555_0005_3000, 0x13000);
        assert_eq!(text.table_base, 0x5555_0000_0000 + 0x14730);
        assert_eq!((text.rows_start, text.rows_len), (7, 9));
        let data = rows.mapping(0x5555_0005_3000, 0x5555_0005_6000, 0x52000);
        assert_eq!(
            data.rows_len, 0,
            "a VMA of another part of the file has no table"
        );
        let key = FileKey {
            major: 8,
            minor: 1,
            inode: 42,
        };
        assert_eq!(FileKey::of_kernel_dev(8 << 20 | 1, 42), key);
    }

    #[test]
    fn the_last_frames_mapping_is_used_only_when_it_holds_the_address() {
        let mut process = ProcessMappings::EMPTY;
        process.mappings[0] = ExecMapping {
            start: 0x1000,
            end: 0x2000,
            ..ExecMapping::default()
        };
        process.mappings[1] = ExecMapping {
            start: 0x5000,
            end: 0x6000,
            ..ExecMapping::default()
        };
        process.count = 1;
        assert!(process.at_if_contains(0, 0x1fff).is_some());
        assert!(process.at_if_contains(0, 0x2000).is_none());
        // Past the count: a stale index from a process that has fewer mappings now.
        assert!(process.at_if_contains(1, 0x5000).is_none());
        assert!(process.at_if_contains(u32::MAX, 0x1000).is_none());
    }

    #[test]
    fn finds_the_mapping_containing_an_address_and_nothing_between_mappings() {
        let mut process = ProcessMappings::EMPTY;
        let ranges = [(0x1000, 0x2000), (0x5000, 0x9000), (0x9000, 0xa000)];
        for (i, (start, end)) in ranges.iter().enumerate() {
            process.mappings[i] = ExecMapping {
                start: *start,
                end: *end,
                rows_start: i as u32,
                ..ExecMapping::default()
            };
        }
        process.count = ranges.len() as u32;
        assert_eq!(find(&process, 0xfff), None);
        assert_eq!(find(&process, 0x1000).map(|m| m.rows_start), Some(0));
        assert_eq!(find(&process, 0x1fff).map(|m| m.rows_start), Some(0));
        assert_eq!(find(&process, 0x2000), None);
        assert_eq!(find(&process, 0x8fff).map(|m| m.rows_start), Some(1));
        assert_eq!(find(&process, 0x9000).map(|m| m.rows_start), Some(2));
        assert_eq!(find(&process, 0xa000), None);
    }

    #[test]
    fn a_full_table_is_searched_within_its_steps() {
        let mut process = ProcessMappings::EMPTY;
        for (i, mapping) in process.mappings.iter_mut().enumerate() {
            let start = 0x10000 * (i as u64 + 1);
            *mapping = ExecMapping {
                start,
                end: start + 0x1000,
                rows_start: i as u32,
                ..ExecMapping::default()
            };
        }
        // A count past the array is cut to it, not trusted.
        for count in [MAX_PROCESS_MAPPINGS as u32, u32::MAX] {
            process.count = count;
            for i in 0..MAX_PROCESS_MAPPINGS {
                let start = 0x10000 * (i as u64 + 1);
                assert_eq!(
                    find(&process, start + 0xfff).map(|m| m.rows_start),
                    Some(i as u32)
                );
            }
        }
    }
}
