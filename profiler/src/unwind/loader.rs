//! Keeps the capture program's unwind maps (`record --unwind dwarf`) in step with the processes
//! the side-band reports: each executable file's table is compiled once (by build ID, through
//! [`TableCache`]) and written once into the row arena, however many processes map it; each
//! process's executable mappings are published, sorted, with their load bias and the slice of
//! the arena holding their table. Mappings that get no table are counted by reason. When the
//! arena is full, tables no process maps any more and those of idle processes are evicted
//! ([`super::arena`]) for the process being sampled, and counted.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt::Write,
    os::{
        fd::{AsFd, AsRawFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray};
use profiler_common::{
    capture::LossKind,
    unwind::UnwindRow,
    unwind_maps::{
        use_stamp, ExecMapping, FileKey, FileRows, ProcessMappings, UnwindCount,
        MAX_PROCESS_MAPPINGS, TABLE_NOT_LOADED,
    },
};

use super::{
    arena::{eviction_order, ArenaSpace, Placed, TableUse},
    python::PythonProcesses,
    segments::{load_bias, segment_holding, segments, Segment, PAGE_BYTES},
    tables::{compile, NoCallFrameInformation, TableCache, TableKey, UnwindTable},
    trampoline::TrampolineLayout,
};
use crate::{
    capture::{program::CaptureProgram, ring::KernelRing},
    input::{open_regular, FileWarning, FinalLink, ModuleImage},
    process::{
        vdso::{self, VDSO},
        FileIdentity, MappedFiles, Mapping, ProcessTable,
    },
};

/// The vDSO as the loader keys the files it publishes (no file has it: no device is all ones),
/// published under the walker's [`FileKey::VDSO`].
const VDSO_IDENTITY: FileIdentity = (u64::MAX, 0);

/// Files `--stats` names whose mappings found no room in the arena, the most refused first.
const NO_ROOM_NAMED: usize = 10;

/// Why a mapping has no table when the arena has no room for it.
const NO_ROOM: &str = "the unwind-table memory is full (--unwind-table-mib)";

static NO_TABLE_WARNING: FileWarning =
    FileWarning::new("more files have no unwind table: their frames are walked by frame pointers");

/// A file's table as the loader knows it: what it is placed in the arena by, its size, and
/// where the file's loadable segments are, to turn a mapping into a load bias. Its compiled rows
/// are held apart ([`UnwindLoader::held`]), as long as the memory budget allows.
#[derive(Clone)]
struct FileTable {
    key: TableRef,
    /// The ELF virtual address the rows' `pc` are offsets from.
    base: u64,
    rows: usize,
    segments: Vec<Segment>,
}

impl FileTable {
    fn new(key: TableRef, table: &UnwindTable, segments: Vec<Segment>) -> FileTable {
        FileTable {
            key,
            base: table.base,
            rows: table.rows.len(),
            segments,
        }
    }
}

/// What a table is placed in the arena by: one table however many files and processes have it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum TableRef {
    Cached(TableKey),
    /// The vDSO's, compiled from the agent's own image.
    Vdso,
    /// A mapping of CPython's perf trampolines, made from its layout.
    Trampolines(TrampolineLayout),
}

/// The row arena map, memory-mapped (it is created `BPF_F_MMAPABLE`): a file's rows are copied
/// in with one memcpy instead of a system call per row, so a new process's tables are in place
/// within a millisecond of its exec, before most of its samples.
///
/// The kernel maps every page of a mapped BPF array at once, so mapping the whole arena would
/// make all of it resident in the agent (64 MiB at the default size) however few rows are used.
/// Its address range is reserved instead, and the map's pages are mapped into it only while
/// rows are copied in or out, a chunk at a time, then handed back to the reservation: the rows
/// live in the kernel's map (reported as such), not in the agent's resident memory, where a
/// JVM's tables (45 MB of rows) or a compiler's stayed for as long as they were loaded.
pub struct RowArena {
    rows: *mut UnwindRow,
    len: u32,
    /// Which chunks are mapped.
    mapped: Vec<bool>,
    map: MapData,
}

/// Rows mapped at a time: 1 MiB, a whole number of pages.
const ARENA_CHUNK_ROWS: u32 = (1 << 20) / UnwindRow::SIZE as u32;

impl RowArena {
    pub fn new(map: MapData) -> Result<RowArena> {
        let len = map
            .info()
            .context("reading the unwind-row arena's size")?
            .max_entries();
        // SAFETY: reserves address space only (no access, no memory behind it), at an address
        // the kernel picks; checked for failure below.
        let address = unsafe { Self::reserve(std::ptr::null_mut(), Self::bytes(len)) };
        if address == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .context("reserving address space for the unwind-row arena");
        }
        Ok(RowArena {
            rows: address.cast(),
            len,
            mapped: vec![false; len.div_ceil(ARENA_CHUNK_ROWS) as usize],
            map,
        })
    }

    /// Reserves `bytes` of address space at `address` (anywhere when null): no access, no memory
    /// behind it.
    ///
    /// # Safety
    /// A non-null `address` must start a page-aligned range of this arena's reservation, which
    /// it replaces.
    unsafe fn reserve(address: *mut UnwindRow, bytes: usize) -> *mut libc::c_void {
        let fixed = if address.is_null() {
            0
        } else {
            libc::MAP_FIXED
        };
        // SAFETY: as the caller promises.
        unsafe {
            libc::mmap(
                address.cast(),
                bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
                -1,
                0,
            )
        }
    }

    fn bytes(rows: u32) -> usize {
        rows as usize * UnwindRow::SIZE
    }

    fn len(&self) -> u32 {
        self.len
    }

    /// The rows of chunk `chunk`: its first row and how many.
    fn chunk_rows(&self, chunk: usize) -> (u32, u32) {
        let start = chunk as u32 * ARENA_CHUNK_ROWS;
        (start, ARENA_CHUNK_ROWS.min(self.len - start))
    }

    /// Maps the map's pages of rows `start..end` (within the arena) into the reservation.
    fn map_rows(&mut self, start: u32, end: u32) -> std::io::Result<()> {
        let chunks = (start / ARENA_CHUNK_ROWS) as usize..end.div_ceil(ARENA_CHUNK_ROWS) as usize;
        for chunk in chunks {
            if self.mapped[chunk] {
                continue;
            }
            let (first, rows) = self.chunk_rows(chunk);
            let offset = Self::bytes(first);
            // SAFETY: replaces one chunk of the reservation made in `new` (it lies within it)
            // with the map's own pages at the same offset; chunks are a whole number of pages.
            // Checked for failure below.
            let address = unsafe {
                libc::mmap(
                    self.rows.add(first as usize).cast(),
                    Self::bytes(rows),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    self.map.fd().as_fd().as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if address == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            self.mapped[chunk] = true;
        }
        Ok(())
    }

    /// Hands the mapped chunks back to the reservation (the map keeps their pages; the agent's
    /// resident memory does not).
    fn unmap_all(&mut self) -> std::io::Result<()> {
        for chunk in 0..self.mapped.len() {
            let (first, rows) = self.chunk_rows(chunk);
            if !self.mapped[chunk] {
                continue;
            }
            // SAFETY: the chunk lies within the reservation made in `new`, at a whole number of
            // pages; no table's rows are there, so nothing reads it. Checked below.
            let address =
                unsafe { Self::reserve(self.rows.add(first as usize), Self::bytes(rows)) };
            if address == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            self.mapped[chunk] = false;
        }
        Ok(())
    }

    /// Rows `start..end` cut at chunk boundaries: rows pass through the agent a chunk at a
    /// time, so that a large table (a compiler's 44 MB of rows) is not also resident here while
    /// it is copied.
    fn parts(start: u32, end: u32) -> impl Iterator<Item = (u32, u32)> {
        let mut at = start;
        std::iter::from_fn(move || {
            let part = (at < end).then(|| {
                (
                    at,
                    ((at / ARENA_CHUNK_ROWS + 1) * ARENA_CHUNK_ROWS).min(end),
                )
            })?;
            at = part.1;
            Some(part)
        })
    }

    /// A copy of the rows at `placed`.
    fn read(&mut self, placed: Placed) -> std::io::Result<Vec<UnwindRow>> {
        let end = placed.start.saturating_add(placed.len).min(self.len);
        let start = placed.start.min(end);
        let mut rows = Vec::with_capacity((end - start) as usize);
        for (first, last) in Self::parts(start, end) {
            self.map_rows(first, last)?;
            // SAFETY: `first..last` lies within the arena (clamped above), in the chunk mapped
            // above; UnwindRow is plain data, any bytes a valid value.
            rows.extend_from_slice(unsafe {
                std::slice::from_raw_parts(self.rows.add(first as usize), (last - first) as usize)
            });
            self.unmap_all()?;
        }
        Ok(rows)
    }

    /// Copies `rows` to `start`; `false` when they do not fit.
    fn write(&mut self, start: u32, rows: &[UnwindRow]) -> Result<bool> {
        let Some(end) = u32::try_from(rows.len())
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= self.len)
        else {
            return Ok(false);
        };
        for (first, last) in Self::parts(start, end) {
            self.map_rows(first, last)
                .context("memory-mapping more of the unwind-row arena")?;
            let part = &rows[(first - start) as usize..(last - start) as usize];
            // SAFETY: `first..last` lies within the arena, in the chunk mapped above; UnwindRow
            // is plain data, and the walker reads these rows only once a mapping published
            // afterwards names them.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    part.as_ptr(),
                    self.rows.add(first as usize),
                    part.len(),
                )
            };
            self.unmap_all()
                .context("unmapping the unwind-row arena's chunks")?;
        }
        Ok(true)
    }
}

impl Drop for RowArena {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the reservation made in `new` (and the map's pages mapped into
        // it), which nothing references any more.
        unsafe { libc::munmap(self.rows.cast(), Self::bytes(self.len)) };
    }
}

/// The unwind tables in the walker's arena, and the compiled rows the agent holds besides (those
/// of the files open: a table is placed again from them after an eviction).
#[derive(Clone, Copy, Debug)]
pub struct TablesLoaded {
    pub files: usize,
    pub rows: u64,
    pub rows_held: u64,
    /// Tables whose compiled rows were let go for the memory budget, since the start.
    pub tables_shed: u64,
}

/// The agent's side of the in-kernel unwinder.
pub struct UnwindLoader {
    rows: RowArena,
    processes: BpfHashMap<MapData, u32, ProcessMappings>,
    /// Where each placed file's table is, for the walker to unwind a mapping of it that is not
    /// published (a process it meets before the side-band has told of it), and what it holds.
    kernel_files: BpfHashMap<MapData, FileKey, FileRows>,
    files_published: HashMap<FileIdentity, FileRows>,
    /// Files whose tables were placed before any process mapped them ([`UnwindLoader::preload`]),
    /// held open (their inode numbers cannot be reused meanwhile) with their tables.
    preloaded: HashMap<FileIdentity, (std::fs::File, FileTable)>,
    counts: PerCpuArray<MapData, u64>,
    /// Process ids the walker met before their mappings were published.
    requests: KernelRing,
    cache: TableCache,
    files: HashMap<FileIdentity, Result<FileTable, String>>,
    /// The compiled rows the agent holds, of the open files' tables: a table evicted from the
    /// arena is placed again from them without reading it back. Over the memory budget the
    /// coldest go ([`UnwindLoader::keep_within`]) and are read back from the cache when needed.
    held: HashMap<TableRef, Arc<UnwindTable>>,
    /// Compiled when a process first maps the vDSO.
    vdso: Option<Result<VdsoTable, String>>,
    placed: HashMap<TableRef, Placed>,
    /// Placed tables no open file had at the last release: evicted at the next one unless a
    /// file with them is opened again meanwhile (under churn the same program starts again as
    /// soon as its last process exits).
    unreferenced: HashSet<TableRef>,
    /// The compiled rows let go for the memory budget.
    shed: Shed,
    /// Mappings published without their table because the arena had no room, by file.
    no_room: BTreeMap<String, u64>,
    space: ArenaSpace,
    published: HashMap<u32, Vec<ExecMapping>>,
    /// The process table's change counter at the last sync: processes that have not changed
    /// since are not resolved again, unless they are to be retried.
    synced: u64,
    /// Published processes with a table not loaded (evicted, or no room for it), and processes
    /// the walker's full process table refused: resolved again at every sync.
    retry: HashSet<u32>,
    /// Published processes' use stamps as last read from the kernel, and when.
    use_stamps: HashMap<u32, u32>,
    use_stamps_read: Option<Instant>,
    evicted: Evictions,
    /// Tables moved down to gather the free rows.
    moved: u64,
    /// Mappings published without a table, by reason.
    without_table: BTreeMap<&'static str, u64>,
    /// Processes the full process table refused, counted once each.
    refused: HashSet<u32>,
    /// The process table's count of closed files at the last sync.
    files_closed: u64,
    /// The agent's memory budget, over which compiled rows are let go.
    memory_budget: Option<u64>,
    /// The CPython processes whose stacks the walker reads Python frames of.
    python: PythonProcesses,
    /// The layout of each anonymous executable mapping (pid, start, end) read so far, where it
    /// holds CPython's perf trampolines.
    trampolines: HashMap<(u32, u64, u64), Option<TrampolineLayout>>,
    /// Tables are published by file (`CAPTURE_TABLES_BY_FILE`): the walker finds each frame's
    /// file in the kernel's own tree, and processes (but `own_entry`) are tracked here only to
    /// know which tables they need; their use stamps are the files'.
    by_file: bool,
    /// The files' use stamps as last read from the kernel, by table (its first row).
    file_stamps: HashMap<u32, u32>,
    /// Processes published all the same where tables go by file, since the walker cannot find
    /// some table of theirs by file: code of no file with a table (CPython's perf trampolines),
    /// or a file the kernel names by another device than `stat` (overlayfs, btrfs).
    own_entry: HashSet<u32>,
    /// Whether the kernel names each open file as `stat` does, asked once per file.
    kernel_names_as_stat: HashMap<FileIdentity, bool>,
}

impl UnwindLoader {
    /// The agent's side of the in-kernel unwinder, with the maps of `program` it fills
    /// (`--unwind dwarf`).
    /// Over `memory_budget` bytes of heap, the coldest tables' compiled rows are let go.
    /// With `by_file`, files' tables are published, and a process's mappings only where the
    /// walker cannot find its tables by file.
    pub fn for_program(
        program: &mut CaptureProgram,
        memory_budget: Option<u64>,
        by_file: bool,
    ) -> Result<UnwindLoader> {
        let rows = match program.take_map("UNWIND_ROWS")? {
            aya::maps::Map::Array(map) => map,
            _ => return Err(anyhow!("the capture program has no array UNWIND_ROWS")),
        };
        let rows = RowArena::new(rows)?;
        Ok(UnwindLoader {
            space: ArenaSpace::new(rows.len()),
            rows,
            processes: program.take_map("UNWIND_PROCESSES")?,
            kernel_files: program.take_map("UNWIND_FILES")?,
            files_published: HashMap::new(),
            preloaded: HashMap::new(),
            counts: program.take_map("UNWIND_COUNTS")?,
            requests: KernelRing::new(program.take_map("UNWIND_REQUESTS")?)?,
            cache: TableCache::new(TableCache::default_directory()),
            files: HashMap::new(),
            held: HashMap::new(),
            vdso: None,
            placed: HashMap::new(),
            unreferenced: HashSet::new(),
            shed: Shed::default(),
            no_room: BTreeMap::new(),
            published: HashMap::new(),
            synced: 0,
            retry: HashSet::new(),
            use_stamps: HashMap::new(),
            use_stamps_read: None,
            evicted: Evictions::default(),
            moved: 0,
            without_table: BTreeMap::new(),
            refused: HashSet::new(),
            files_closed: 0,
            memory_budget,
            python: PythonProcesses::new(program.take_map("PYTHON_PROCESSES")?),
            trampolines: HashMap::new(),
            by_file,
            file_stamps: HashMap::new(),
            own_entry: HashSet::new(),
            kernel_names_as_stat: HashMap::new(),
        })
    }

    /// Waits until the walker meets a process whose mappings are not published, or a table it
    /// needs that is not loaded: the side-band has news to read and [`UnwindLoader::sync`] to
    /// publish.
    pub async fn requested(&self) -> std::io::Result<()> {
        self.requests.readable().await
    }

    /// Publishes every live process's executable mappings that changed since the last call,
    /// loading (and evicting for) the tables they need, and forgets the processes that exited.
    /// Under process churn it runs often: a process whose mappings did not change and whose
    /// tables are all loaded is passed over, so its cost follows the changes, not the processes.
    pub fn sync(&mut self, table: &ProcessTable) -> Result<()> {
        self.publish_changes(table)?;
        if let Some(budget) = self.memory_budget {
            self.keep_within(crate::heap::in_use_bytes().saturating_sub(budget));
        }
        Ok(())
    }

    fn publish_changes(&mut self, table: &ProcessTable) -> Result<()> {
        // The requests only say "look": every changed process is compared below.
        while self.requests.for_each(usize::MAX, |_: u32| Ok(()))? > 0 {}
        // Files closed since, or tables found unused at the last release: they go at this one.
        if table.files.closed() != self.files_closed
            || self.cache.holds_unused()
            || !self.unreferenced.is_empty()
        {
            self.files_closed = table.files.closed();
            self.release_closed_files(&table.files)?;
        }
        let last_change = table.last_change();
        if last_change == self.synced && self.retry.is_empty() {
            return Ok(());
        }
        let changed: Vec<(u32, bool)> = table
            .changed_since(self.synced)
            .map(|(pid, process)| (pid, process.exited))
            .collect();
        // The exited first: their tables are the first to make room for the living.
        let exited = changed
            .iter()
            .filter(|(_, exited)| *exited)
            .map(|&(pid, _)| pid);
        for pid in exited {
            self.retry.remove(&pid);
            self.python.forget(pid);
            self.trampolines.retain(|&(owner, _, _), _| owner != pid);
            // Only a process published to the walker has a use stamp.
            self.own_entry.remove(&pid);
            if self.published.remove(&pid).is_some() && self.use_stamps.remove(&pid).is_some() {
                // Already gone when the kernel never had it: nothing to undo.
                let _ = self.processes.remove(&pid);
            }
        }
        let mut to_resolve: BTreeSet<u32> = changed
            .iter()
            .filter(|(_, exited)| !exited)
            .map(|&(pid, _)| pid)
            .collect();
        to_resolve.extend(self.retry.iter().filter(|pid| {
            table
                .processes
                .get(pid)
                .is_some_and(|process| !process.exited)
        }));
        self.synced = last_change;
        for pid in to_resolve {
            let process = &table.processes[&pid];
            let mut mappings = current_code_mappings(&process.mappings);
            self.python.sync(table, pid, mappings.iter().copied());
            // The walker's table holds so many: mappings with tables first.
            if mappings.len() > MAX_PROCESS_MAPPINGS {
                mappings.sort_by_key(|mapping| !mapping.is_file());
                mappings.truncate(MAX_PROCESS_MAPPINGS);
                mappings.sort_by_key(|mapping| mapping.start);
            }
            // The largest tables first, while the arena has the most room for them.
            let mut order: Vec<(usize, usize)> = mappings
                .iter()
                .enumerate()
                .map(|(i, mapping)| (i, self.table_rows(table, mapping)))
                .collect();
            order.sort_by_key(|&(i, rows)| (std::cmp::Reverse(rows), i));
            let mut resolved: Vec<(ExecMapping, Option<&'static str>)> =
                vec![(ExecMapping::default(), None); mappings.len()];
            let mut keep = Vec::new();
            for (i, _) in order {
                resolved[i] = self.entry(table, pid, mappings[i], &keep)?;
                if resolved[i].0.rows_len > 0 {
                    keep.push(resolved[i].0.rows_start);
                }
            }
            let entries: Vec<ExecMapping> = resolved.iter().map(|(entry, _)| *entry).collect();
            if self.by_file
                && !self.own_entry.contains(&pid)
                && mappings
                    .iter()
                    .any(|mapping| !self.found_by_file(table, pid, mapping))
            {
                self.own_entry.insert(pid);
            }
            let before = self.published.get(&pid);
            if before == Some(&entries) {
                continue;
            }
            // Each mapping without a table once, when it is first published.
            for ((entry, reason), mapping) in resolved.iter().zip(&mappings) {
                let new = before.is_none_or(|old| !old.contains(entry));
                if let (true, Some(reason)) = (new, reason) {
                    *self.without_table.entry(reason).or_default() += 1;
                    if *reason == NO_ROOM {
                        *self.no_room.entry(mapping.path.to_string()).or_default() += 1;
                    }
                }
            }
            // A process that exits meanwhile is refused by no one: its entry is removed above
            // once the side-band says so.
            match self.publish(pid, &entries) {
                Ok(()) => {}
                // The preallocated table is full: this process's stacks are walked by frame
                // pointers, and its mappings are counted.
                Err(aya::maps::MapError::SyscallError(error))
                    if error.io_error.raw_os_error() == Some(libc::E2BIG) =>
                {
                    self.retry.insert(pid);
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
        Ok(())
    }

    /// Lets go of the tables of the files closed (no process maps them) and frees their rows:
    /// a system-wide agent meets new executables all day, and kept every table it ever
    /// loaded. A file mapped again is opened again, and its table read from the disk cache.
    fn release_closed_files(&mut self, files: &MappedFiles) -> Result<()> {
        self.files.retain(|identity, _| files.is_open(*identity));
        self.kernel_names_as_stat
            .retain(|identity, _| files.is_open(*identity));
        self.python.release_closed_files(files);
        // A closed file's inode number may be given to another file: the walker must not find
        // this table by it.
        let closed: Vec<FileIdentity> = self
            .files_published
            .keys()
            .filter(|identity| {
                !files.is_open(**identity)
                    && !self.preloaded.contains_key(identity)
                    && **identity != VDSO_IDENTITY
            })
            .copied()
            .collect();
        for identity in closed {
            self.unpublish_file(identity)?;
        }
        let referenced: HashSet<TableRef> = self
            .files
            .values()
            .filter_map(|file| file.as_ref().ok())
            .chain(self.preloaded.values().map(|(_, file)| file))
            .map(|file| file.key.clone())
            .chain(std::iter::once(TableRef::Vdso))
            .chain(
                self.trampolines
                    .values()
                    .flatten()
                    .map(|&layout| TableRef::Trampolines(layout)),
            )
            .collect();
        self.held.retain(|key, _| referenced.contains(key));
        self.cache.release_unused();
        let unreferenced: HashSet<TableRef> = self
            .placed
            .keys()
            .filter(|key| !referenced.contains(key))
            .cloned()
            .collect();
        let gone: Vec<Placed> = unreferenced
            .intersection(&self.unreferenced)
            .filter_map(|key| self.placed.get(key).copied())
            .collect();
        for placed in gone {
            self.repoint(placed.start, None)?;
        }
        self.unreferenced = unreferenced
            .into_iter()
            .filter(|key| self.placed.contains_key(key))
            .collect();
        Ok(())
    }

    /// Writes `pid`'s mappings into the walker's table, keeping the stamp of its last sample
    /// (a new process counts as used now).
    /// By file, only the processes of `own_entry` are written into the walker's table.
    fn publish(&mut self, pid: u32, entries: &[ExecMapping]) -> Result<(), aya::maps::MapError> {
        if !self.by_file || self.own_entry.contains(&pid) {
            self.publish_to_kernel(pid, entries)?;
        }
        self.published.insert(pid, entries.to_vec());
        if entries
            .iter()
            .any(|entry| entry.rows_start == TABLE_NOT_LOADED)
        {
            self.retry.insert(pid);
        } else {
            self.retry.remove(&pid);
        }
        Ok(())
    }

    /// The walker's entry of process `pid`, where processes are published.
    fn publish_to_kernel(
        &mut self,
        pid: u32,
        entries: &[ExecMapping],
    ) -> Result<(), aya::maps::MapError> {
        let mut value = ProcessMappings::EMPTY;
        value.count = entries.len() as u32;
        value.mappings[..entries.len()].copy_from_slice(entries);
        // Only a process published before has a stamp the walker may have moved on; most
        // publishes under churn are new processes, spared reading 8 KiB back.
        let published_before = self.published.contains_key(&pid);
        value.last_used = match published_before.then(|| self.processes.get(&pid, 0)) {
            Some(Ok(old)) => old.last_used,
            _ => use_stamp_now(),
        };
        self.processes.insert(pid, value, 0)?;
        self.use_stamps.insert(pid, value.last_used);
        Ok(())
    }

    /// Whether the walker finds the table of `pid`'s `mapping` by file (see `own_entry`).
    fn found_by_file(&mut self, processes: &ProcessTable, pid: u32, mapping: &Mapping) -> bool {
        match (mapping.is_file(), mapping.file) {
            (false, _) => !self
                .trampolines
                .get(&(pid, mapping.start, mapping.end))
                .is_some_and(Option::is_some),
            // Published by file (not refused by a full file table), under the kernel's name.
            (true, Some(identity)) => {
                self.files_published.contains_key(&identity)
                    && *self
                        .kernel_names_as_stat
                        .entry(identity)
                        .or_insert_with(|| processes.files.kernel_names_as_stat(identity))
            }
            (true, None) => true,
        }
    }

    /// Rows of the table of `mapping`'s file, 0 when it has none.
    fn table_rows(&mut self, processes: &ProcessTable, mapping: &Mapping) -> usize {
        match (mapping.is_file(), mapping.file) {
            (true, Some(identity)) => self
                .file_table(processes, identity, &mapping.path)
                .map_or(0, |file| file.rows),
            _ => 0,
        }
    }

    /// The walker's entry for one executable mapping of process `pid`, its table written into
    /// the arena if it is not there yet, and why it has no table when it has none. `keep`: the
    /// tables of the process's mappings resolved so far, which stay where they are.
    fn entry(
        &mut self,
        processes: &ProcessTable,
        pid: u32,
        mapping: &Mapping,
        keep: &[u32],
    ) -> Result<(ExecMapping, Option<&'static str>)> {
        let mut entry = ExecMapping {
            start: mapping.start,
            end: mapping.end,
            ..ExecMapping::default()
        };
        let is_vdso = !mapping.is_file() && *mapping.path == *VDSO;
        let file = match (mapping.is_file(), mapping.file) {
            (false, _) if is_vdso => self.vdso_table(mapping),
            (false, _) => self.trampoline_table(pid, mapping),
            (true, None) => Err("its file could not be opened"),
            (true, Some(identity)) => self.file_table(processes, identity, &mapping.path),
        };
        // What the walker finds this mapping's table by.
        let identity = match is_vdso {
            true => Some(VDSO_IDENTITY),
            false => mapping.file.filter(|_| mapping.is_file()),
        };
        let file = match file {
            Ok(file) => file,
            Err(reason) => {
                // Said to have no table, where tables go by file: the walker steps its frames
                // by frame pointers instead of asking for its table again and again.
                if let (true, Some(identity)) = (self.by_file, identity) {
                    self.publish_file(identity, FileRows::default())?;
                }
                return Ok((entry, Some(reason)));
            }
        };
        let Some(segment) = segment_holding(&file.segments, mapping.file_offset) else {
            return Ok((entry, Some("no loadable segment holds it")));
        };
        let bias = load_bias(segment, mapping);
        let rows = |loader: &mut UnwindLoader| {
            loader.held_rows(&file.key, processes, mapping.file, &mapping.path)
        };
        let placed = self.place(&file, rows, (pid, identity), keep)?;
        let Some(placed) = placed else {
            // The walker asks for it when it steps through this mapping.
            entry.rows_start = TABLE_NOT_LOADED;
            if let Some(identity) = identity {
                let no_room = FileRows {
                    rows_start: TABLE_NOT_LOADED,
                    rows_len: 0,
                    ..file_rows(segment, &file, Placed { start: 0, len: 0 })
                };
                self.publish_file(identity, no_room)?;
            }
            return Ok((entry, Some(NO_ROOM)));
        };
        entry.table_base = bias.wrapping_add(file.base);
        entry.rows_start = placed.start;
        entry.rows_len = placed.len;
        if let Some(identity) = identity {
            self.publish_file(identity, file_rows(segment, &file, placed))?;
        }
        Ok((entry, None))
    }

    /// Places the tables of the files at `paths` before any process maps them (the command
    /// about to run, the C library and loader every program maps), for the walker to unwind a
    /// new process's first samples and first blocks by them: otherwise those wait for the
    /// side-band to tell of the process. A file that cannot be read is loaded when a process
    /// maps it, like any other.
    pub fn preload(&mut self, paths: &[PathBuf]) -> Result<()> {
        for path in paths {
            let Ok(file) = open_regular(path, FinalLink::Follow) else {
                continue;
            };
            let Ok(metadata) = file.metadata() else {
                continue;
            };
            let identity = (metadata.dev(), metadata.ino());
            if self.preloaded.contains_key(&identity) {
                continue;
            }
            let Ok(cached) = self.cache.table(&file, path) else {
                continue;
            };
            let image = ModuleImage::new(file.try_clone()?);
            let Ok(elf) = object::File::parse(&image) else {
                continue;
            };
            let segments = segments(&elf);
            let Some(segment) = segments.iter().copied().find(|s| s.executable) else {
                continue;
            };
            let key = TableRef::Cached(cached.key);
            let table = FileTable::new(key.clone(), &cached.table, segments);
            self.held.entry(key).or_insert(cached.table);
            let rows = |loader: &mut UnwindLoader| loader.held.get(&table.key).cloned();
            let Some(placed) = self.place(&table, rows, (0, None), &[])? else {
                continue;
            };
            self.publish_file(identity, file_rows(&segment, &table, placed))?;
            self.preloaded.insert(identity, (file, table));
        }
        Ok(())
    }

    /// When a walk last needed a table of `pid`'s file `identity`, as a use stamp: the last
    /// sample of a process the walker has an entry of; by file, the last walk through the
    /// file (the walker stamps its entry, loaded or not); now for a file it has not met yet.
    /// A process that stopped running (stopped, or waiting) cannot take the room of a busy
    /// one's table, however often its unloaded table is retried.
    fn last_need(&self, pid: u32, identity: Option<FileIdentity>) -> u32 {
        if let Some(&stamp) = self.use_stamps.get(&pid) {
            return stamp;
        }
        let walked = identity
            .filter(|_| self.by_file)
            .filter(|identity| self.files_published.contains_key(identity))
            .and_then(|identity| self.kernel_files.get(&kernel_file_key(identity), 0).ok());
        walked.map_or_else(use_stamp_now, |rows| rows.last_used)
    }

    /// Tells the walker where the table of the file `identity` is.
    fn publish_file(&mut self, identity: FileIdentity, rows: FileRows) -> Result<()> {
        let same_place = |known: &FileRows| {
            FileRows {
                last_used: known.last_used,
                ..rows
            } == *known
        };
        if self.files_published.get(&identity).is_some_and(same_place) {
            return Ok(());
        }
        // A file new to the walker counts as walked now (a table placed for a process about
        // to run is not the first to go); one it knows keeps its last walk, whatever moved.
        let last_used = match self.files_published.contains_key(&identity) {
            true => self.kernel_files.get(&kernel_file_key(identity), 0).ok(),
            false => None,
        };
        let rows = FileRows {
            last_used: last_used.map_or_else(use_stamp_now, |known| known.last_used),
            ..rows
        };
        match self.kernel_files.insert(kernel_file_key(identity), rows, 0) {
            Ok(()) => {}
            // Full: this file's mappings are unwound by table once their process is published,
            // as on kernels without the walker's own lookup.
            Err(aya::maps::MapError::SyscallError(error))
                if error.io_error.raw_os_error() == Some(libc::E2BIG) =>
            {
                *self
                    .without_table
                    .entry("the unwinder's file table is full (until published)")
                    .or_default() += 1;
                return Ok(());
            }
            Err(error) => return Err(error).context("publishing a file's unwind table"),
        }
        if rows.rows_len > 0 {
            self.file_stamps.insert(rows.rows_start, rows.last_used);
        }
        self.files_published.insert(identity, rows);
        Ok(())
    }

    fn unpublish_file(&mut self, identity: FileIdentity) -> Result<()> {
        if self.files_published.remove(&identity).is_some() {
            match self.kernel_files.remove(&kernel_file_key(identity)) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(error) => return Err(error).context("withdrawing a file's unwind table"),
            }
        }
        Ok(())
    }

    /// The vDSO's table, compiled on first use, for a `[vdso]` mapping the size of the agent's.
    /// Its rows (a few dozen) are held for the agent's life.
    fn vdso_table(&mut self, mapping: &Mapping) -> Result<FileTable, &'static str> {
        let vdso = self.vdso.get_or_insert_with(|| {
            let compiled = VdsoTable::compile().map_err(|e| format!("{e:#}"));
            if let Ok((_, rows)) = &compiled {
                self.held.insert(TableRef::Vdso, Arc::clone(rows));
            }
            compiled.map(|(vdso, _)| vdso)
        });
        match vdso {
            Ok(vdso) if vdso.bytes == mapping.end - mapping.start => Ok(vdso.file.clone()),
            Ok(_) => Err("a vDSO unlike the profiler's own (a 32-bit process?)"),
            Err(_) => Err("the vDSO's call-frame information did not compile"),
        }
    }

    /// The table of `pid`'s anonymous mapping `mapping` where it holds CPython's perf trampolines
    /// (other JIT code is walked by frame pointers). Its bytes are read once per mapping.
    fn trampoline_table(&mut self, pid: u32, mapping: &Mapping) -> Result<FileTable, &'static str> {
        let bytes = mapping.end - mapping.start;
        let layout = *self
            .trampolines
            .entry((pid, mapping.start, mapping.end))
            .or_insert_with(|| TrampolineLayout::of_mapping(pid, mapping.start, bytes));
        let layout = layout.ok_or("not a file (JIT code)")?;
        let key = TableRef::Trampolines(layout);
        let rows = self
            .held
            .entry(key.clone())
            .or_insert_with(|| Arc::new(layout.table()))
            .rows
            .len();
        // The table's `pc` are offsets from the mapping's start, whatever offset it is said to
        // map (an anonymous mapping's is 0 in /proc, its page number in the side-band).
        let segment = Segment {
            offset: mapping.file_offset,
            size: layout.bytes(),
            address: 0,
            executable: true,
        };
        Ok(FileTable {
            key,
            base: 0,
            rows,
            segments: vec![segment],
        })
    }

    /// The table of the file `identity`, mapped as `shown`.
    fn file_table(
        &mut self,
        processes: &ProcessTable,
        identity: FileIdentity,
        shown: &str,
    ) -> Result<FileTable, &'static str> {
        if let Some(known) = self.files.get(&identity) {
            return known
                .clone()
                .map_err(|_| "its call-frame information did not compile");
        }
        let path = processes.files.path(identity);
        let mut has_no_cfi = false;
        let compiled = (|| -> Result<FileTable> {
            let path = path.as_ref().context("the mapped file is no longer open")?;
            let file = open_regular(path, FinalLink::Follow)?;
            let cached = self.cache.table(&file, Path::new(shown))?;
            let image = ModuleImage::new(file);
            let elf = object::File::parse(&image)?;
            let key = TableRef::Cached(cached.key);
            let table = FileTable::new(key.clone(), &cached.table, segments(&elf));
            self.held.entry(key).or_insert(cached.table);
            Ok(table)
        })();
        let compiled = compiled.map_err(|e| {
            has_no_cfi = e.downcast_ref::<NoCallFrameInformation>().is_some();
            format!("{e:#}")
        });
        // Once per file, for the first few files: a table refused (a crafted or huge section, a
        // file gone) is said by name, not only counted, since that file's stacks are walked by
        // frame pointers.
        // A file closed meanwhile (a short process exited) is no refusal: not said either.
        if let (Err(error), false, Some(_)) = (&compiled, has_no_cfi, &path) {
            NO_TABLE_WARNING.warn(format_args!(
                "{shown}: no unwind table ({error}): its frames are walked by frame pointers"
            ));
        }
        self.files.insert(identity, compiled.clone());
        compiled.map_err(|_| "its call-frame information did not compile")
    }

    /// The compiled rows of the table `key`: those held, else read back through the cache from
    /// the file `identity` (they were let go for the memory budget).
    fn held_rows(
        &mut self,
        key: &TableRef,
        processes: &ProcessTable,
        identity: Option<FileIdentity>,
        shown: &str,
    ) -> Option<Arc<UnwindTable>> {
        if let Some(rows) = self.held.get(key) {
            return Some(Arc::clone(rows));
        }
        if let TableRef::Trampolines(layout) = key {
            let rows = Arc::new(layout.table());
            self.held.insert(key.clone(), Arc::clone(&rows));
            return Some(rows);
        }
        let path = processes.files.path(identity?)?;
        let file = open_regular(&path, FinalLink::Follow).ok()?;
        let cached = self.cache.table(&file, Path::new(shown)).ok()?;
        // The same identity is the same open file: another key would be another table.
        (TableRef::Cached(cached.key) == *key).then_some(())?;
        self.held.insert(key.clone(), Arc::clone(&cached.table));
        Some(cached.table)
    }

    /// Where `table`'s rows are in the arena, written there on first use (`rows` gives them),
    /// for process `pid`'s file `identity` (evicting what it may, but not the tables at
    /// `keep`); `None` when they do not fit.
    fn place(
        &mut self,
        table: &FileTable,
        rows: impl FnOnce(&mut UnwindLoader) -> Option<Arc<UnwindTable>>,
        needer: (u32, Option<FileIdentity>),
        keep: &[u32],
    ) -> Result<Option<Placed>> {
        if let Some(placed) = self.placed.get(&table.key) {
            return Ok(Some(*placed));
        }
        let Ok(len) = u32::try_from(table.rows) else {
            return Ok(None);
        };
        if len > self.space.capacity() {
            return Ok(None);
        }
        let placed = match self.space.allocate(len) {
            Some(placed) => placed,
            None => {
                if !self.evict_for(len, needer, keep)? {
                    return Ok(None);
                }
                self.space
                    .allocate(len)
                    .context("the unwind-row arena has no room after evicting for it")?
            }
        };
        // Read back only once there is room: a table with none is asked for again and again.
        let Some(rows) = rows(self).filter(|rows| rows.rows.len() == table.rows) else {
            self.space.free(placed.start);
            return Ok(None);
        };
        // Rows first: the walker reaches them only through a mapping published afterwards.
        if !self.rows.write(placed.start, &rows.rows)? {
            self.space.free(placed.start);
            return Ok(None);
        }
        self.placed.insert(table.key.clone(), placed);
        Ok(Some(placed))
    }

    /// Evicts tables until `len` rows fit, for process `pid`'s file `identity`: those no
    /// process maps, then those last used well before it last needed them (`last_need`);
    /// `false` (nothing evicted) when that is not enough.
    fn evict_for(
        &mut self,
        len: u32,
        (pid, identity): (u32, Option<FileIdentity>),
        keep: &[u32],
    ) -> Result<bool> {
        let needer = self.last_need(pid, identity);
        let now = use_stamp_now();
        let tables: Vec<(u32, TableUse)> = self
            .table_uses(now)
            .into_iter()
            .filter(|(start, _)| !keep.contains(start))
            .collect();
        let order = eviction_order(&tables, needer, now);
        // The fewest victims after which the rows fit, other tables moved aside where the free
        // rows are split (the process's own tables, at `keep`, stay): nothing is evicted when
        // even all of them would not make room, so that no table goes for nothing.
        // More victims never make less room: the fewest is found by bisection, each try
        // planning over every run (a system-wide agent places hundreds of tables).
        let room = |n: usize| self.space.room_for(len, &order[..n], keep);
        let Some(mut plan) = room(order.len()) else {
            return Ok(false);
        };
        let (mut fewest, mut needed) = (0, order.len());
        while fewest < needed {
            let middle = (fewest + needed) / 2;
            match room(middle) {
                Some(found) => (needed, plan) = (middle, found),
                None => fewest = middle + 1,
            }
        }
        for &start in &order[..needed] {
            self.repoint(start, None)?;
            match tables.contains(&(start, TableUse::Unmapped)) {
                true => self.evicted.unmapped += 1,
                false => self.evicted.idle += 1,
            }
        }
        for (old, to) in plan.moves {
            // The new rows first; the old ones stay until no published mapping names them.
            let rows = self
                .rows
                .read(Placed {
                    start: old,
                    len: to.len,
                })
                .context("memory-mapping a table's rows to move them")?;
            if !self.rows.write(to.start, &rows)? {
                return Ok(false);
            }
            self.space.take(to);
            self.repoint(old, Some(to))?;
            self.moved += 1;
        }
        Ok(self.space.victims_needed(len, &[]).is_some())
    }

    /// Each placed table's newest use (by its place in the arena): the last walk through its
    /// files (by file), and the last sample of the processes the walker has entries of that
    /// map it, by age across the stamp's wrap.
    fn table_uses(&mut self, now: u32) -> HashMap<u32, TableUse> {
        self.read_use_stamps();
        let mut newest: HashMap<u32, TableUse> = self
            .placed
            .values()
            .map(|placed| (placed.start, TableUse::Unmapped))
            .collect();
        if self.by_file {
            // The files' own stamps, for the tables some live process maps; one placed since
            // the stamps were read counts as used now.
            let mapped: HashSet<u32> = self
                .published
                .values()
                .flatten()
                .filter(|entry| entry.rows_len > 0)
                .map(|entry| entry.rows_start)
                .collect();
            for start in mapped {
                if let Some(seen) = newest.get_mut(&start) {
                    let stamp = self.file_stamps.get(&start).copied().unwrap_or(now);
                    *seen = newer_use(*seen, stamp, now);
                }
            }
        }
        // The last samples of the processes the walker has entries of.
        for (user, &stamp) in &self.use_stamps {
            let Some(entries) = self.published.get(user) else {
                continue;
            };
            for entry in entries.iter().filter(|entry| entry.rows_len > 0) {
                if let Some(seen) = newest.get_mut(&entry.rows_start) {
                    *seen = newer_use(*seen, stamp, now);
                }
            }
        }
        newest
    }

    /// Lets go of the compiled rows of the coldest tables until the agent holds `over` bytes
    /// fewer (what it is over its memory budget by): first those no placement in the arena
    /// has (evicted from it, or given no room), then the placed ones by their processes' last
    /// sample. A placed table stays in the arena, so nothing is unwound less; one evicted from
    /// it later is read back from the disk cache. The vDSO's few rows stay.
    fn keep_within(&mut self, over: u64) {
        if over == 0 {
            return;
        }
        let now = use_stamp_now();
        let uses = self.table_uses(now);
        let age = |placed: Option<&Placed>| match placed.map(|placed| uses.get(&placed.start)) {
            None => u64::MAX,
            Some(None | Some(TableUse::Unmapped)) => u64::MAX - 1,
            Some(Some(TableUse::LastUsed(stamp))) => u64::from(now.wrapping_sub(*stamp)),
        };
        let mut coldest: Vec<(u64, TableRef)> = self
            .held
            .keys()
            .filter(|key| **key != TableRef::Vdso)
            .map(|key| (age(self.placed.get(key)), key.clone()))
            .collect();
        coldest.sort_by_key(|(age, _)| std::cmp::Reverse(*age));
        let mut freed = 0;
        for (_, key) in coldest {
            if freed >= over {
                break;
            }
            let Some(table) = self.held.remove(&key) else {
                continue;
            };
            if let TableRef::Cached(key) = &key {
                self.cache.forget(key);
            }
            freed += table.row_bytes() as u64;
            self.shed.tables += 1;
            self.shed.rows += table.rows.len() as u64;
        }
    }

    /// Frees the table at `start`, its rows now at `moved` (already written), else evicted:
    /// the processes mapping it are republished with the new place or the table not loaded
    /// (their walker asks for it again once they are sampled) before the old rows can be
    /// overwritten. A walk already past the process lookup may read new rows for one frame;
    /// the caller it finds is then checked like any other.
    fn repoint(&mut self, start: u32, moved: Option<Placed>) -> Result<()> {
        let uses = |entry: &ExecMapping| entry.rows_len > 0 && entry.rows_start == start;
        let users: Vec<(u32, Vec<ExecMapping>)> = self
            .published
            .iter()
            .filter(|(_, entries)| entries.iter().any(uses))
            .map(|(&pid, entries)| {
                let entries = entries
                    .iter()
                    .map(|&entry| match (uses(&entry), moved) {
                        (false, _) => entry,
                        (true, Some(moved)) => ExecMapping {
                            rows_start: moved.start,
                            ..entry
                        },
                        (true, None) => ExecMapping {
                            table_base: 0,
                            rows_start: TABLE_NOT_LOADED,
                            rows_len: 0,
                            ..entry
                        },
                    })
                    .collect();
                (pid, entries)
            })
            .collect();
        for (pid, entries) in users {
            self.publish(pid, &entries)
                .with_context(|| format!("republishing the mappings of process {pid}"))?;
        }
        let files: Vec<(FileIdentity, FileRows)> = self
            .files_published
            .iter()
            .filter(|(_, rows)| rows.rows_len > 0 && rows.rows_start == start)
            .map(|(identity, rows)| (*identity, *rows))
            .collect();
        for (identity, rows) in files {
            match moved {
                Some(moved) => self.publish_file(
                    identity,
                    FileRows {
                        rows_start: moved.start,
                        ..rows
                    },
                )?,
                // Known, its table not loaded: the walker asks for it again.
                None => self.publish_file(
                    identity,
                    FileRows {
                        rows_start: TABLE_NOT_LOADED,
                        rows_len: 0,
                        ..rows
                    },
                )?,
            }
        }
        match moved {
            Some(moved) => self
                .placed
                .values_mut()
                .filter(|placed| placed.start == start)
                .for_each(|placed| *placed = moved),
            None => self.placed.retain(|_, placed| placed.start != start),
        }
        self.space.free(start);
        Ok(())
    }

    /// Refreshes the files' (by file) and the published processes' use stamps from the kernel,
    /// at most every [`USE_STAMPS_TTL`] (each read copies a process's whole entry).
    fn read_use_stamps(&mut self) {
        if self
            .use_stamps_read
            .is_some_and(|read| read.elapsed() < USE_STAMPS_TTL)
        {
            return;
        }
        if self.by_file {
            self.file_stamps.clear();
            for (identity, rows) in &self.files_published {
                let Ok(value) = self.kernel_files.get(&kernel_file_key(*identity), 0) else {
                    continue;
                };
                // One table may be several files' (copies with one build ID): the newest.
                let stamp = self
                    .file_stamps
                    .entry(rows.rows_start)
                    .or_insert(value.last_used);
                let now = use_stamp_now();
                if now.wrapping_sub(value.last_used) < now.wrapping_sub(*stamp) {
                    *stamp = value.last_used;
                }
            }
        }
        let users: Vec<u32> = self.use_stamps.keys().copied().collect();
        for pid in users {
            if let Ok(value) = self.processes.get(&pid, 0) {
                self.use_stamps.insert(pid, value.last_used);
            }
        }
        self.use_stamps_read = Some(Instant::now());
    }

    pub fn loaded(&self) -> TablesLoaded {
        TablesLoaded {
            files: self.placed.len(),
            rows: self.space.used_rows(),
            rows_held: self
                .held
                .values()
                .map(|table| table.rows.len() as u64)
                .sum(),
            tables_shed: self.shed.tables,
        }
    }

    /// The `--stats` lines: the tables loaded and what the walker did.
    /// What the walker counted of `what`, on every CPU.
    fn count(&self, what: UnwindCount) -> u64 {
        self.counts
            .get(&(what as u32), 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }

    /// The walks the walker cut short, by the loss each is in the sample accounting.
    pub fn losses(&self) -> impl Iterator<Item = (LossKind, u64)> + '_ {
        UnwindCount::ALL
            .iter()
            .filter_map(|what| Some((what.loss()?, self.count(*what))))
    }

    pub fn render_stats(&self) -> String {
        let mut out = String::new();
        let count = |what: UnwindCount| self.count(what);
        let mib = |rows: f64| rows * UnwindRow::SIZE as f64 / (1024.0 * 1024.0);
        let loaded = self.loaded();
        let _ = writeln!(
            out,
            "  unwind tables: {} files, {} rows ({:.1} MiB of {:.1} MiB, in the kernel's map; \
             {:.1} MiB of compiled rows held by the agent); compiled {}, from the disk cache {}; \
             evicted {} ({} no longer mapped, {} of idle processes), moved {}",
            loaded.files,
            loaded.rows,
            mib(loaded.rows as f64),
            mib(f64::from(self.space.capacity())),
            mib(loaded.rows_held as f64),
            self.cache.stats.compiled,
            self.cache.stats.from_disk,
            self.evicted.unmapped + self.evicted.idle,
            self.evicted.unmapped,
            self.evicted.idle,
            self.moved,
        );
        let reasons: Vec<String> = self
            .without_table
            .iter()
            .map(|(reason, n)| format!("{n} ({reason})"))
            .collect();
        if !reasons.is_empty() {
            let _ = writeln!(out, "  mappings without a table: {}", reasons.join(", "));
        }
        if !self.no_room.is_empty() {
            let mut files: Vec<(&String, &u64)> = self.no_room.iter().collect();
            files.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let named: Vec<String> = files
                .iter()
                .take(NO_ROOM_NAMED)
                .map(|(file, mappings)| format!("{file} ({mappings})"))
                .collect();
            let more = files.len().saturating_sub(NO_ROOM_NAMED);
            let _ = writeln!(
                out,
                "  no room in the arena, mappings by file: {}{}",
                named.join(", "),
                if more > 0 {
                    format!(" and {more} more files")
                } else {
                    String::new()
                }
            );
        }
        if self.shed.tables > 0 {
            let _ = writeln!(
                out,
                "  compiled rows let go for the memory budget: {} tables, {:.1} MiB (their \
                 rows stay in the kernel's map; read back from the disk cache when placed again)",
                self.shed.tables,
                mib(self.shed.rows as f64),
            );
        }
        let _ = writeln!(
            out,
            "  user stacks unwound: {} with tables ({} complete), {} by frame pointers (process \
             not loaded yet); frames stepped by frame pointers: {} without a table, {} without \
             a row; truncated: {} outside every mapping, {} no caller found, {} too deep; \
             frames whose table was not loaded: {}",
            count(UnwindCount::Walked),
            count(UnwindCount::Complete),
            count(UnwindCount::ProcessUnknown),
            count(UnwindCount::FramesWithoutTable),
            count(UnwindCount::FramesWithoutRow),
            count(UnwindCount::TruncatedOutsideMappings),
            count(UnwindCount::TruncatedNoCaller),
            count(UnwindCount::TruncatedDepth),
            count(UnwindCount::FramesTableNotLoaded),
        );
        let _ = writeln!(
            out,
            "  {}: {} user stacks, by {} frames' mappings found in the kernel's own record of \
             the process",
            match self.by_file {
                true => "unwound by tables found by file (process not published)",
                false => "unwound before the process was loaded",
            },
            count(UnwindCount::ProcessFromKernel),
            count(UnwindCount::FramesMappingFromKernel),
        );
        if count(UnwindCount::PythonStacks) + count(UnwindCount::PythonThreadNotFound) > 0
            || self.python.refused > 0
        {
            let searched =
                count(UnwindCount::PythonStacks) + count(UnwindCount::PythonThreadNotFound);
            let _ = writeln!(
                out,
                "  python: {} stacks with their Python frames ({} cut short of the outermost), \
                 {} ns a stack reading them; {} of threads the interpreter does not list \
                 (native frames only); {} processes the walker's table refused",
                count(UnwindCount::PythonStacks),
                count(UnwindCount::PythonFramesCut),
                count(UnwindCount::PythonNanos) / searched.max(1),
                count(UnwindCount::PythonThreadNotFound),
                self.python.refused,
            );
        }
        // The walks the sample accounting counts as losses, under the accounting's own names.
        for (kind, walks) in self.losses() {
            let _ = writeln!(out, "  walker: {walks} {}", kind.describe());
        }
        out
    }
}

/// Compiled rows the agent let go of for its memory budget.
#[derive(Default)]
struct Shed {
    tables: u64,
    rows: u64,
}

/// Tables evicted from the arena, by why they could go.
#[derive(Default)]
struct Evictions {
    /// No live process mapped them (the processes exited or unmapped the file).
    unmapped: u64,
    /// Their processes had not been sampled for longer than the one that needed the room.
    idle: u64,
}

/// `seen` or `stamp`, whichever is the newer use at `now` (stamps wrap).
fn newer_use(seen: TableUse, stamp: u32, now: u32) -> TableUse {
    match seen {
        TableUse::LastUsed(seen) if now.wrapping_sub(seen) <= now.wrapping_sub(stamp) => {
            TableUse::LastUsed(seen)
        }
        _ => TableUse::LastUsed(stamp),
    }
}

/// How long the processes' use stamps read from the kernel are trusted.
const USE_STAMPS_TTL: Duration = Duration::from_millis(100);

/// The use stamp of now, on the clock the walker stamps with (`bpf_ktime_get_ns`).
fn use_stamp_now() -> u32 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes only `now`; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    use_stamp(now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64)
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

/// Where the walker finds the table of a file whose code is `segment`, placed at `placed`.
fn file_rows(segment: &Segment, table: &FileTable, placed: Placed) -> FileRows {
    FileRows {
        table_delta: segment
            .offset
            .wrapping_sub(segment.address)
            .wrapping_add(table.base),
        code_start: segment.offset & !(PAGE_BYTES - 1),
        code_end: segment.offset.saturating_add(segment.size),
        rows_start: placed.start,
        rows_len: placed.len,
        ..FileRows::default()
    }
}

/// The kernel's name of the file `identity` (`stat`'s device and inode): what the walker finds
/// in a VMA of it.
fn kernel_file_key((device, inode): FileIdentity) -> FileKey {
    if (device, inode) == VDSO_IDENTITY {
        return FileKey::VDSO;
    }
    FileKey {
        major: libc::major(device),
        minor: libc::minor(device),
        inode,
    }
}

/// The vDSO's table, from the agent's own image: every process of this kernel maps the same one
/// (a 32-bit process maps another, of another size, which gets no table).
struct VdsoTable {
    file: FileTable,
    bytes: u64,
}

impl VdsoTable {
    /// The table, and its rows.
    fn compile() -> Result<(VdsoTable, Arc<UnwindTable>)> {
        let image = vdso::own_image().context("the profiler has no vDSO to read")?;
        let elf = object::File::parse(image).context("parsing the vDSO")?;
        let rows = Arc::new(compile(&elf).context("compiling the vDSO's unwind table")?);
        let vdso = VdsoTable {
            file: FileTable::new(TableRef::Vdso, &rows, segments(&elf)),
            bytes: image.len() as u64,
        };
        Ok((vdso, rows))
    }
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
    fn rows_pass_through_the_agent_a_chunk_at_a_time() {
        let chunk = ARENA_CHUNK_ROWS;
        let parts: Vec<(u32, u32)> = RowArena::parts(5, 2 * chunk + 3).collect();
        assert_eq!(
            parts,
            [(5, chunk), (chunk, 2 * chunk), (2 * chunk, 2 * chunk + 3)]
        );
        assert_eq!(
            RowArena::parts(chunk, chunk + 1).collect::<Vec<_>>(),
            [(chunk, chunk + 1)]
        );
        assert_eq!(RowArena::parts(3, 3).count(), 0);
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
        let bias = |segments: &[Segment], mapping: &Mapping| {
            Some(load_bias(
                segment_holding(segments, mapping.file_offset)?,
                mapping,
            ))
        };
        let text = mapping(0x5555_0001_4000, 0x5555_0005_3000, 0x13000, true);
        assert_eq!(bias(&segments, &text), Some(0x5555_0000_0000));
        // gcc's layout: text at the same offset and address.
        let gcc = [
            segment(0, 0x800, 0, false),
            segment(0x1000, 0x3000, 0x1000, true),
        ];
        let text = mapping(0x7f00_0000_1000, 0x7f00_0000_4000, 0x1000, true);
        assert_eq!(bias(&gcc, &text), Some(0x7f00_0000_0000));
        assert_eq!(bias(&gcc, &mapping(0, 0x1000, 0x9000, true)), None);
    }
}
