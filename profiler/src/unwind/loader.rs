//! Keeps the capture program's unwind maps (`record --unwind dwarf`) in step with the processes
//! the side-band reports: each executable file's table is compiled once (by build ID, through
//! [`TableCache`]) and written once into the row arena, however many processes map it; each
//! process's executable mappings are published, sorted, with their load bias and the slice of
//! the arena holding their table. Mappings that get no table are counted by reason.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write,
    os::fd::{AsFd, AsRawFd},
    sync::Arc,
};

use anyhow::{Context, Result};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray};
use object::{Object, ObjectSegment};
use profiler_common::{
    unwind::UnwindRow,
    unwind_maps::{ExecMapping, ProcessMappings, UnwindCount, MAX_PROCESS_MAPPINGS},
};

use super::tables::{TableCache, UnwindTable};
use crate::{
    capture::{
        ring::KernelRing,
        sideband::{FileIdentity, Mapping, ProcessTable},
    },
    input::{open_regular, FinalLink, ModuleImage},
};

/// A file's table and where its loadable segments are, to turn a mapping into a load bias.
struct FileTable {
    table: Arc<UnwindTable>,
    segments: Vec<Segment>,
}

/// Where a table's rows are in the arena.
#[derive(Clone, Copy)]
struct Placed {
    start: u32,
    len: u32,
}

/// The row arena map, memory-mapped (it is created `BPF_F_MMAPABLE`): a file's rows are copied
/// in with one memcpy instead of a system call per row, so a new process's tables are in place
/// within a millisecond of its exec, before most of its samples.
pub struct RowArena {
    rows: *mut UnwindRow,
    len: u32,
    _map: MapData,
}

impl RowArena {
    pub fn new(map: MapData) -> Result<RowArena> {
        let len = map
            .info()
            .context("reading the unwind-row arena's size")?
            .max_entries();
        let bytes = len as usize * UnwindRow::SIZE;
        // SAFETY: maps the map's own memory, `bytes` long (what the kernel allocated for its
        // entries), shared, at an address the kernel picks; checked for failure below.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .context("memory-mapping the unwind-row arena");
        }
        Ok(RowArena {
            rows: address.cast(),
            len,
            _map: map,
        })
    }

    fn len(&self) -> u32 {
        self.len
    }

    /// Copies `rows` to `start`; `false` when they do not fit.
    fn write(&mut self, start: u32, rows: &[UnwindRow]) -> bool {
        let fits = (start as usize)
            .checked_add(rows.len())
            .is_some_and(|end| end <= self.len as usize);
        if fits {
            // SAFETY: `start..start + rows.len()` lies within the mapping (checked above);
            // UnwindRow is plain data, and the walker reads these rows only once a mapping
            // published afterwards names them.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    rows.as_ptr(),
                    self.rows.add(start as usize),
                    rows.len(),
                )
            };
        }
        fits
    }
}

impl Drop for RowArena {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, which nothing references any more.
        unsafe { libc::munmap(self.rows.cast(), self.len as usize * UnwindRow::SIZE) };
    }
}

/// The agent's side of the in-kernel unwinder.
pub struct UnwindLoader {
    rows: RowArena,
    processes: BpfHashMap<MapData, u32, ProcessMappings>,
    counts: PerCpuArray<MapData, u64>,
    /// Process ids the walker met before their mappings were published.
    requests: KernelRing,
    cache: TableCache,
    files: HashMap<FileIdentity, Result<Arc<FileTable>, String>>,
    /// By the table's address: the cache hands out one `Arc` per distinct file.
    placed: HashMap<*const UnwindTable, Placed>,
    next_row: u32,
    published: HashMap<u32, Vec<ExecMapping>>,
    /// Mappings published without a table, by reason.
    without_table: BTreeMap<&'static str, u64>,
    /// Processes the full process table refused, counted once each.
    refused: std::collections::HashSet<u32>,
}

impl UnwindLoader {
    pub fn new(
        rows: RowArena,
        processes: BpfHashMap<MapData, u32, ProcessMappings>,
        counts: PerCpuArray<MapData, u64>,
        requests: KernelRing,
    ) -> UnwindLoader {
        UnwindLoader {
            rows,
            processes,
            counts,
            requests,
            cache: TableCache::new(TableCache::default_directory()),
            files: HashMap::new(),
            placed: HashMap::new(),
            next_row: 0,
            published: HashMap::new(),
            without_table: BTreeMap::new(),
            refused: std::collections::HashSet::new(),
        }
    }

    /// Waits until the walker meets a process whose mappings are not published: the side-band
    /// has news to read and [`UnwindLoader::sync`] to publish.
    pub async fn requested(&self) -> std::io::Result<()> {
        self.requests.readable().await
    }

    /// Publishes every live process's executable mappings that changed since the last call,
    /// and forgets the processes that exited.
    pub fn sync(&mut self, table: &ProcessTable) -> Result<()> {
        // The requests only say "look": every process is compared below.
        while self.requests.for_each(usize::MAX, |_: u32| Ok(()))? > 0 {}
        let mut gone = Vec::new();
        for (&pid, process) in &table.processes {
            if process.exited {
                gone.push(pid);
                continue;
            }
            let mut mappings = current_code_mappings(&process.mappings);
            // The walker's table holds so many: mappings with tables first.
            if mappings.len() > MAX_PROCESS_MAPPINGS {
                mappings.sort_by_key(|mapping| !mapping.is_file());
                mappings.truncate(MAX_PROCESS_MAPPINGS);
                mappings.sort_by_key(|mapping| mapping.start);
            }
            let resolved: Vec<(ExecMapping, Option<&'static str>)> = mappings
                .iter()
                .map(|mapping| self.entry(table, mapping))
                .collect::<Result<_>>()?;
            let entries: Vec<ExecMapping> = resolved.iter().map(|(entry, _)| *entry).collect();
            let before = self.published.get(&pid);
            if before == Some(&entries) {
                continue;
            }
            // Each mapping without a table once, when it is first published.
            for (entry, reason) in &resolved {
                let new = before.is_none_or(|old| !old.contains(entry));
                if let (true, Some(reason)) = (new, reason) {
                    *self.without_table.entry(reason).or_default() += 1;
                }
            }
            let mut value = ProcessMappings::EMPTY;
            value.count = entries.len() as u32;
            value.mappings[..entries.len()].copy_from_slice(&entries);
            // A process that exits meanwhile is refused by no one: its entry is removed below
            // once the side-band says so.
            match self.processes.insert(pid, value, 0) {
                Ok(()) => {
                    self.published.insert(pid, entries);
                }
                // The preallocated table is full: this process's stacks are walked by frame
                // pointers, and its mappings are counted.
                Err(aya::maps::MapError::SyscallError(error))
                    if error.io_error.raw_os_error() == Some(libc::E2BIG) =>
                {
                    if self.refused.insert(pid) {
                        *self
                            .without_table
                            .entry("the unwinder's process table is full")
                            .or_default() += entries.len() as u64;
                    }
                }
                Err(error) => {
                    return Err(error)
                        .with_context(|| format!("publishing the mappings of process {pid}"))
                }
            }
        }
        for pid in gone {
            if self.published.remove(&pid).is_some() {
                // Already gone when the kernel never had it: nothing to undo.
                let _ = self.processes.remove(&pid);
            }
        }
        Ok(())
    }

    /// The walker's entry for one executable mapping, its table written into the arena if it
    /// is not there yet, and why it has no table when it has none.
    fn entry(
        &mut self,
        processes: &ProcessTable,
        mapping: &Mapping,
    ) -> Result<(ExecMapping, Option<&'static str>)> {
        let mut entry = ExecMapping {
            start: mapping.start,
            end: mapping.end,
            ..ExecMapping::default()
        };
        let file = match (mapping.is_file(), mapping.file) {
            (false, _) => Err("not a file (JIT code, the vDSO)"),
            (true, None) => Err("its file could not be opened"),
            (true, Some(identity)) => self.file_table(processes, identity),
        };
        let file = match file {
            Ok(file) => file,
            Err(reason) => return Ok((entry, Some(reason))),
        };
        let Some(bias) = load_bias(&file.segments, mapping) else {
            return Ok((entry, Some("no loadable segment holds it")));
        };
        let Some(placed) = self.place(&file.table)? else {
            let reason = "the unwind-table memory is full (--unwind-table-mib)";
            return Ok((entry, Some(reason)));
        };
        entry.table_base = bias.wrapping_add(file.table.base);
        entry.rows_start = placed.start;
        entry.rows_len = placed.len;
        Ok((entry, None))
    }

    fn file_table(
        &mut self,
        processes: &ProcessTable,
        identity: FileIdentity,
    ) -> Result<Arc<FileTable>, &'static str> {
        if let Some(known) = self.files.get(&identity) {
            return known
                .clone()
                .map_err(|_| "its call-frame information did not compile");
        }
        let compiled = (|| -> Result<FileTable> {
            let path = processes
                .files
                .path(identity)
                .context("the mapped file is no longer open")?;
            let file = open_regular(&path, FinalLink::Follow)?;
            let table = self.cache.table(&file, &path)?;
            let image = ModuleImage::new(file);
            let elf = object::File::parse(&image)?;
            let segments = elf
                .segments()
                .map(|segment| {
                    let (offset, size) = segment.file_range();
                    let executable = matches!(
                        segment.flags(),
                        object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
                    );
                    Segment {
                        offset,
                        size,
                        address: segment.address(),
                        executable,
                    }
                })
                .collect();
            Ok(FileTable { table, segments })
        })();
        let compiled = compiled.map(Arc::new).map_err(|e| format!("{e:#}"));
        self.files.insert(identity, compiled.clone());
        compiled.map_err(|_| "its call-frame information did not compile")
    }

    /// Where `table`'s rows are in the arena, written there on first use; `None` when they do
    /// not fit.
    fn place(&mut self, table: &Arc<UnwindTable>) -> Result<Option<Placed>> {
        if let Some(placed) = self.placed.get(&Arc::as_ptr(table)) {
            return Ok(Some(*placed));
        }
        let len = u32::try_from(table.rows.len()).unwrap_or(u32::MAX);
        let capacity = self.rows.len();
        if u64::from(self.next_row) + u64::from(len) > u64::from(capacity) {
            return Ok(None);
        }
        let start = self.next_row;
        // Rows first: the walker reaches them only through a mapping published afterwards.
        if !self.rows.write(start, &table.rows) {
            return Ok(None);
        }
        self.next_row += len;
        let placed = Placed { start, len };
        self.placed.insert(Arc::as_ptr(table), placed);
        Ok(Some(placed))
    }

    /// The `--stats` lines: the tables loaded and what the walker did.
    pub fn render_stats(&self) -> String {
        let mut out = String::new();
        let counts: Vec<u64> = UnwindCount::ALL
            .iter()
            .map(|what| {
                self.counts
                    .get(&(*what as u32), 0)
                    .map(|per_cpu| per_cpu.iter().sum())
                    .unwrap_or(0)
            })
            .collect();
        let count = |what: UnwindCount| counts[what as usize];
        let _ = writeln!(
            out,
            "  unwind tables: {} files, {} rows ({:.1} MiB of {:.1} MiB); compiled {}, from the \
             disk cache {}",
            self.placed.len(),
            self.next_row,
            f64::from(self.next_row) * UnwindRow::SIZE as f64 / (1024.0 * 1024.0),
            f64::from(self.rows.len()) * UnwindRow::SIZE as f64 / (1024.0 * 1024.0),
            self.cache.stats.compiled,
            self.cache.stats.from_disk,
        );
        let reasons: Vec<String> = self
            .without_table
            .iter()
            .map(|(reason, n)| format!("{n} ({reason})"))
            .collect();
        if !reasons.is_empty() {
            let _ = writeln!(out, "  mappings without a table: {}", reasons.join(", "));
        }
        let _ = writeln!(
            out,
            "  user stacks unwound: {} with tables ({} complete), {} by frame pointers (process \
             not loaded yet); frames stepped by frame pointers: {} without a table, {} without \
             a row; truncated: {} outside every mapping, {} no caller found, {} too deep",
            count(UnwindCount::Walked),
            count(UnwindCount::Complete),
            count(UnwindCount::ProcessUnknown),
            count(UnwindCount::FramesWithoutTable),
            count(UnwindCount::FramesWithoutRow),
            count(UnwindCount::TruncatedOutsideMappings),
            count(UnwindCount::TruncatedNoCaller),
            count(UnwindCount::TruncatedDepth),
        );
        out
    }
}

/// The executable mappings in force, sorted by address: a later mapping over part of an earlier
/// one's range supersedes it.
fn current_code_mappings(mappings: &[Mapping]) -> Vec<&Mapping> {
    let mut current: Vec<&Mapping> = Vec::new();
    for mapping in mappings {
        current.retain(|known| known.end <= mapping.start || mapping.end <= known.start);
        if mapping.executable {
            current.push(mapping);
        }
    }
    current.sort_by_key(|mapping| mapping.start);
    current
}

/// Run-time address minus ELF virtual address for `mapping`, from the loadable segment its file
/// offset falls in. The kernel maps whole pages, so a segment that starts mid-page (file offset
/// 0x13730 at address 0x14730) is mapped from the page before (file offset 0x13000), which
/// may also hold the end of the previous segment: the page-aligned range is matched, the
/// executable segment first (the mapping is code).
fn load_bias(segments: &[Segment], mapping: &Mapping) -> Option<u64> {
    let holds = |segment: &&Segment| {
        let start = segment.offset & !(PAGE_BYTES - 1);
        (start..segment.offset.saturating_add(segment.size)).contains(&mapping.file_offset)
    };
    let segment = segments
        .iter()
        .filter(|segment| segment.executable)
        .find(holds)
        .or_else(|| segments.iter().find(holds))?;
    // mapping.start holds file offset `file_offset`, at virtual address
    // segment.address + (file_offset - segment.offset).
    let virtual_address = segment
        .address
        .wrapping_add(mapping.file_offset)
        .wrapping_sub(segment.offset);
    Some(mapping.start.wrapping_sub(virtual_address))
}

/// The page size loadable segments are mapped in (x86-64).
const PAGE_BYTES: u64 = 4096;

/// One loadable segment of a file.
#[derive(Clone, Copy, Debug)]
struct Segment {
    offset: u64,
    size: u64,
    address: u64,
    executable: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, file_offset: u64, executable: bool) -> Mapping {
        Mapping {
            start,
            end,
            file_offset,
            path: "/usr/lib/libx.so".into(),
            executable,
            build_id: None,
            file: None,
        }
    }

    #[test]
    fn later_mappings_supersede_earlier_ones_and_only_code_is_kept() {
        let mappings = [
            mapping(0x5000, 0x9000, 0x1000, true),
            mapping(0x1000, 0x2000, 0, true),
            // Replaces part of the first: the first is gone as a whole.
            mapping(0x8000, 0x9000, 0, false),
            mapping(0xa000, 0xb000, 0, true),
        ];
        let current = current_code_mappings(&mappings);
        let starts: Vec<u64> = current.iter().map(|m| m.start).collect();
        assert_eq!(starts, [0x1000, 0xa000]);
    }

    #[test]
    fn the_load_bias_comes_from_the_segment_holding_the_mapping() {
        let segment = |offset, size, address, executable| Segment {
            offset,
            size,
            address,
            executable,
        };
        // As lld lays out a PIE (deep_stack): read-only data, then text starting mid-page at
        // file offset 0x13730 and address 0x14730, mapped from file offset 0x13000.
        let segments = [
            segment(0, 0x1372c, 0, false),
            segment(0x13730, 0x3e2f0, 0x14730, true),
            segment(0x51a20, 0x2718, 0x53a20, false),
        ];
        let text = mapping(0x5555_0001_4000, 0x5555_0005_3000, 0x13000, true);
        assert_eq!(load_bias(&segments, &text), Some(0x5555_0000_0000));
        // gcc's layout: text at the same offset and address.
        let gcc = [
            segment(0, 0x800, 0, false),
            segment(0x1000, 0x3000, 0x1000, true),
        ];
        let text = mapping(0x7f00_0000_1000, 0x7f00_0000_4000, 0x1000, true);
        assert_eq!(load_bias(&gcc, &text), Some(0x7f00_0000_0000));
        assert_eq!(load_bias(&gcc, &mapping(0, 0x1000, 0x9000, true)), None);
    }
}
