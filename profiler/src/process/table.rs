//! The process table: what the agent knows of every process it saw, from the /proc scan at start
//! and the side-band's records after (names, mappings, forks, exits, kernel code), and the copy
//! of it each window keeps to symbolize its samples after their processes exited.

use std::{
    cell::Cell,
    collections::{BTreeMap, BTreeSet},
    fs, io,
    sync::Arc,
};

use super::{
    build_id::build_id_of,
    files::{open_again, FileInode, MappedFiles, WINDOW_REOPENS},
    kernel_code::KernelCode,
    mapping::{parse_maps_line, FileIdentity, Mapping},
    pending::{Pending, RecordBytes},
};
use crate::fast_hash::{HashMap, HashSet};
use crate::input::ModuleImage;
use crate::perf_data::{maps_code, ProcessRecord};

mod short_lives;
pub use short_lives::Settle;

/// One process as the table knows it: its name, its mappings and whether it exited.
#[derive(Clone, Debug, Default)]
pub struct ProcessInfo {
    pub comm: String,
    /// In the order they were made: a later mapping of the same range supersedes an earlier one.
    /// Shared until changed: a forked child starts with its parent's list and, under churn,
    /// nearly always replaces it by exec at once.
    pub mappings: Arc<Vec<Mapping>>,
    /// The mappings of the image an exec replaced, or of an exited process whose pid a new one
    /// took, kept until the window they were sampled in closes: a sample taken before the exec
    /// (or the pid's reuse) and drained after it is symbolized against them, where the current
    /// mappings do not cover its address.
    pub retired: Vec<Arc<Vec<Mapping>>>,
    pub exited: bool,
    /// The table's change counter when this process's mappings last changed or it exited (a
    /// process that takes an exited one's pid starts anew): the unwinder resolves only the
    /// processes that changed since it last looked.
    pub changed: u64,
}

impl ProcessInfo {
    /// The current mappings and those of the images replaced in this window.
    fn all_mappings(&self) -> impl Iterator<Item = &Mapping> {
        self.mappings
            .iter()
            .chain(self.retired.iter().flat_map(|image| image.iter()))
    }
}

/// What the agent knows of every process it saw (that has not exited before the last closed
/// window: see [`ProcessTable::forget`]).
#[derive(Debug, Default)]
pub struct ProcessTable {
    pub processes: HashMap<u32, ProcessInfo>,
    /// Thread names by tid.
    pub threads: HashMap<u32, String>,
    /// Threads that exited (not main threads), forgotten with the exited processes.
    exited_threads: Vec<u32>,
    /// Side-band records the kernel dropped (its ring buffer was full).
    pub lost_records: u64,
    pub files: MappedFiles,
    /// The Python code objects of the processes, read while they lived.
    pub python_code: super::python::PythonCodeCache,
    /// The last [`ProcessInfo::changed`] given out.
    last_change: u64,
    /// Each process with a [`ProcessInfo::changed`] stamp, by that stamp: the unwinder asks
    /// for the processes changed since it last looked, and under churn, scanning the whole
    /// table 20 times a second for them cost more than resolving them.
    by_change: BTreeMap<u64, u32>,
    /// The last value [`ProcessTable::last_change`] gave out: a change after it needs a stamp
    /// after it.
    last_read: Cell<u64>,
    /// Each mapped path once: under churn thousands of processes a second map the same few
    /// files, and a new copy of each path per mapping was a tenth of the side-band's time.
    path_names: HashSet<Arc<str>>,
    /// Processes born and gone between two reads, entered only once sampled.
    short_lives: short_lives::ShortLives,
    /// Whether such processes are held back: not where stack copies are unwound as they are
    /// read (`--unwind copy`), which needs every process's mappings then.
    hold_short_lives: bool,
    /// BPF programs and trampolines loaded since the side-band started.
    pub kernel_code: KernelCode,
}

/// Thread ids of a process, from /proc/PID/task.
pub fn threads_of(pid: u32) -> io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

fn read_comm(path: &str) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim_end().to_string())
}

impl ProcessTable {
    /// An empty table; `hold_short_lives`: see [`ProcessTable::hold_short_lives`].
    pub fn new(hold_short_lives: bool) -> ProcessTable {
        ProcessTable {
            hold_short_lives,
            ..ProcessTable::default()
        }
    }

    /// Whether the table holds `pid`.
    pub fn knows(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }

    /// Records a running process from /proc: name, threads and mappings.
    pub fn scan_process(&mut self, pid: u32) {
        let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
            return;
        };
        let mut mappings: Vec<Mapping> = maps.lines().filter_map(parse_maps_line).collect();
        for mapping in &mut mappings {
            // The process lives: its map_files links reach the files.
            self.open_mapped_file(pid, mapping, None);
            if let Some(identity) = mapping.file {
                self.files.remember_path(&mapping.path, identity);
            }
        }
        let comm = read_comm(&format!("/proc/{pid}/comm")).unwrap_or_default();
        for tid in threads_of(pid).unwrap_or_default() {
            if let Some(name) = read_comm(&format!("/proc/{pid}/task/{tid}/comm")) {
                self.threads.insert(tid, name);
            }
        }
        self.remove_process(pid);
        self.processes.insert(
            pid,
            ProcessInfo {
                comm,
                mappings: Arc::new(mappings),
                ..ProcessInfo::default()
            },
        );
        self.mark_changed(pid);
    }

    /// Counts a change of `pid`'s process, and gives the process the new stamp unless its
    /// stamp is still newer than any the readers were given: a new process's dozens of
    /// mappings then move its index entry once, not once each.
    fn mark_changed(&mut self, pid: u32) {
        self.last_change += 1;
        let Some(process) = self.processes.get_mut(&pid) else {
            return;
        };
        if process.changed > self.last_read.get() {
            return;
        }
        self.by_change.remove(&process.changed);
        process.changed = self.last_change;
        self.by_change.insert(self.last_change, pid);
    }

    /// Takes `pid`'s process out of the table.
    fn remove_process(&mut self, pid: u32) -> Option<ProcessInfo> {
        let process = self.processes.remove(&pid)?;
        self.by_change.remove(&process.changed);
        self.python_code.forget(pid);
        Some(process)
    }

    /// The processes whose mappings changed, or that exited, after the change stamp `stamp`,
    /// oldest change first.
    pub fn changed_since(&self, stamp: u64) -> impl Iterator<Item = (u32, &ProcessInfo)> {
        self.by_change
            .range(stamp + 1..)
            .map(|(_, pid)| (*pid, &self.processes[pid]))
    }

    /// The change counter's last value: no process's mappings changed, and none exited, while
    /// it stays.
    pub fn last_change(&self) -> u64 {
        self.last_read.set(self.last_change);
        self.last_change
    }

    /// Records a running process and, from /proc, the processes it forked that still run:
    /// they are in scope when they were forked after the capture programs were attached, which
    /// may be before the side-band that would name them was enabled.
    pub fn scan_process_tree(&mut self, pid: u32) {
        let mut pending = vec![pid];
        while let Some(pid) = pending.pop() {
            if self.knows(pid) {
                continue;
            }
            self.scan_process(pid);
            for tid in threads_of(pid).unwrap_or_default() {
                let children = fs::read_to_string(format!("/proc/{pid}/task/{tid}/children"));
                pending.extend(
                    children
                        .unwrap_or_default()
                        .split_whitespace()
                        .filter_map(|child| child.parse::<u32>().ok()),
                );
            }
        }
    }

    /// Opens an executable mapping's file as the side-band reports it (see [`MappedFiles::open`]),
    /// and reads its build ID from it when the kernel did not send one.
    fn open_mapped_file(&mut self, pid: u32, mapping: &mut Mapping, inode: Option<FileInode>) {
        if !(mapping.executable && mapping.is_file()) {
            return;
        }
        // A file already open (the same build ID, or the same inode) is not opened and read
        // again: under process churn every new process maps the same few files. One closed
        // for the budget since is opened again, through this process.
        let known = match (&mapping.build_id, inode) {
            (Some(build_id), _) => self.files.by_build_id.get(build_id).copied(),
            (None, Some(inode)) => Some((libc::makedev(inode.major, inode.minor), inode.inode)),
            (None, None) => None,
        }
        .filter(|identity| self.files.is_open(*identity));
        if let Some(identity) = known {
            self.files.touch(identity);
            mapping.file = Some(identity);
            if mapping.build_id.is_none() {
                mapping.build_id = self.files.build_ids.get(&identity).cloned().flatten();
            }
        } else {
            mapping.file = self.files.open(pid, mapping, inode);
            if mapping.build_id.is_none() {
                mapping.build_id = mapping
                    .file
                    .and_then(|identity| self.files.by_identity.get(&identity))
                    .and_then(|file| build_id_of(file));
            }
            if let Some(identity) = mapping.file {
                self.files
                    .build_ids
                    .insert(identity, mapping.build_id.clone());
                if let Some(build_id) = &mapping.build_id {
                    self.files.by_build_id.insert(build_id.clone(), identity);
                }
            }
        }
    }

    /// Records every running process.
    pub fn scan_all(&mut self) {
        let Ok(entries) = fs::read_dir("/proc") else {
            return;
        };
        let pids: Vec<u32> = entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        for pid in pids {
            self.scan_process(pid);
        }
    }

    /// What one side-band record changes, read while its process lives: a new mapping's file
    /// is opened now, before the process can exit.
    fn change_of(&mut self, record: ProcessRecord) -> Change {
        match record {
            ProcessRecord::Mmap(mmap) => {
                let mut mapping = Mapping {
                    start: mmap.start,
                    end: mmap.start.saturating_add(mmap.len),
                    file_offset: mmap.pgoff,
                    path: self.path_name(mmap.filename),
                    executable: maps_code(mmap.prot, mmap.data),
                    // Read from the file below: the side-band asks for none (see the
                    // reader's `Sideband::open`).
                    build_id: None,
                    file: None,
                };
                // Live only: a pid in a perf.data import may belong to another process now.
                self.open_mapped_file(mmap.pid, &mut mapping, mmap.file_id.map(FileInode::from));
                Change::Map(mmap.pid, mapping)
            }
            ProcessRecord::Comm(comm) => Change::NameThread {
                pid: comm.pid,
                tid: comm.tid,
                name: String::from_utf8_lossy(comm.comm).into_owned(),
                exec: comm.exec,
            },
            ProcessRecord::Fork(fork) => Change::Fork(fork.pid, fork.ppid),
            ProcessRecord::Exit(exit) if exit.pid == exit.tid => Change::Exit(exit.pid),
            ProcessRecord::Exit(exit) => Change::ThreadExit(exit.tid),
            ProcessRecord::Lost(lost) => Change::Lost(lost),
            ProcessRecord::KernelSymbol(code) => Change::KernelCode {
                start: code.address,
                len: code.len,
                name: String::from_utf8_lossy(code.name).into(),
                unloaded: code.unloaded,
            },
        }
    }

    /// The shared copy of the path `bytes` (invalid UTF-8 replaced).
    fn path_name(&mut self, bytes: &[u8]) -> Arc<str> {
        // Paths are nearly always UTF-8, which the plain check finds fastest.
        let path = match std::str::from_utf8(bytes) {
            Ok(text) => std::borrow::Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(bytes),
        };
        if let Some(known) = self.path_names.get(&*path) {
            return Arc::clone(known);
        }
        let name: Arc<str> = path.into();
        self.path_names.insert(Arc::clone(&name));
        name
    }

    /// Applies one record of a read, its kept fields in `bytes`.
    fn apply_pending(&mut self, pending: Pending, bytes: &RecordBytes) {
        let change = match pending {
            Pending::Fork { pid, ppid } => Change::Fork(pid, ppid),
            Pending::Exit(pid) => Change::Exit(pid),
            Pending::ThreadExit(tid) => Change::ThreadExit(tid),
            Pending::Lost(records) => Change::Lost(records),
            Pending::Kept(record) => match bytes.decode(record) {
                Some(decoded) => self.change_of(decoded),
                None => return,
            },
        };
        self.apply(change);
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Map(pid, mapping) => self.map(pid, mapping),
            Change::NameThread {
                pid,
                tid,
                name,
                exec,
            } => self.name_thread(pid, tid, name, exec),
            Change::Fork(pid, ppid) => self.fork(pid, ppid),
            Change::Exit(pid) => self.exit(pid),
            Change::ThreadExit(tid) => self.exited_threads.push(tid),
            Change::Lost(records) => self.lost_records += records,
            Change::KernelCode {
                start, unloaded, ..
            } if unloaded => self.kernel_code.unload(start),
            Change::KernelCode {
                start, len, name, ..
            } => self.kernel_code.load(start, len, name),
        }
    }

    /// A new mapping of `pid` (PERF_RECORD_MMAP/MMAP2). One the /proc scan already found (the
    /// side-band is enabled before the scan, so a mapping made in between arrives twice) is kept
    /// once.
    pub fn map(&mut self, pid: u32, mapping: Mapping) {
        if let Some(identity) = mapping.file {
            self.files.remember_path(&mapping.path, identity);
        }
        let process = self.processes.entry(pid).or_default();
        let overlaps = |known: &&Mapping| known.start < mapping.end && mapping.start < known.end;
        let latest = process.mappings.iter().rev().find(overlaps);
        let same = latest.is_some_and(|known| {
            (known.start, known.end, known.file_offset, &known.path)
                == (
                    mapping.start,
                    mapping.end,
                    mapping.file_offset,
                    &mapping.path,
                )
        });
        if !same {
            Arc::make_mut(&mut process.mappings).push(mapping);
            self.mark_changed(pid);
        }
    }

    /// A thread's name (PERF_RECORD_COMM); `exec` when exec gave it, which also replaced the
    /// process's address space.
    pub fn name_thread(&mut self, pid: u32, tid: u32, name: String, exec: bool) {
        self.threads.insert(tid, name.clone());
        let process = self.processes.entry(pid).or_default();
        if pid == tid {
            process.comm = name;
        }
        if exec {
            // Older mappings no longer apply to new samples.
            let replaced = std::mem::take(&mut process.mappings);
            process.retired.push(replaced);
            self.mark_changed(pid);
        }
    }

    /// A fork (PERF_RECORD_FORK). A new thread shares its process's table; a new process starts
    /// with a copy of its parent's address space.
    pub fn fork(&mut self, pid: u32, ppid: u32) {
        if pid == ppid {
            return;
        }
        let (comm, mappings) = self.inherited_from(ppid);
        self.start_process(pid, comm, mappings);
    }

    /// What a process forked by `ppid` starts with: its parent's name and address space.
    fn inherited_from(&self, ppid: u32) -> (String, Arc<Vec<Mapping>>) {
        self.processes
            .get(&ppid)
            .map(|parent| (parent.comm.clone(), Arc::clone(&parent.mappings)))
            .unwrap_or_default()
    }

    /// A new process on `pid` with its parent's name and address space.
    fn start_process(&mut self, pid: u32, comm: String, mappings: Arc<Vec<Mapping>>) {
        // A reused pid: the exited process's samples may not be drained yet.
        let retired = match self.remove_process(pid) {
            Some(mut gone) if gone.exited => {
                gone.retired.push(gone.mappings);
                gone.retired
            }
            _ => Vec::new(),
        };
        self.processes.insert(
            pid,
            ProcessInfo {
                comm,
                mappings,
                retired,
                exited: false,
                changed: 0,
            },
        );
        self.mark_changed(pid);
    }

    /// A process exit (PERF_RECORD_EXIT of its main thread).
    pub fn exit(&mut self, pid: u32) {
        self.processes.entry(pid).or_default().exited = true;
        self.mark_changed(pid);
    }

    /// The processes that exited.
    pub fn exited(&self) -> Vec<u32> {
        self.processes
            .iter()
            .filter(|(_, process)| process.exited)
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Drops the processes `pids` (exited, and their last samples taken into a window), the
    /// threads that exited, and the files no process left maps: what the table holds follows
    /// the processes alive, not every process ever seen.
    pub fn forget(&mut self, pids: &[u32]) {
        for tid in std::mem::take(&mut self.exited_threads) {
            self.threads.remove(&tid);
        }
        // Every sample taken before an exec or a pid's reuse is in a closed window now.
        for process in self.processes.values_mut() {
            process.retired = Vec::new();
        }
        self.drop_processes(pids);
        self.close_unmapped_files();
    }

    /// Drops, within a window, the processes that had exited when the change counter read
    /// `exited_by` and that no sample drained into the window references (`sampled`): all
    /// their samples were drained when the counter was read before a drain, so none will
    /// need them. Under process churn most short processes are never sampled at a low rate,
    /// and keeping each one's mappings until its window closed grew the agent by megabytes a
    /// second. The files they mapped are closed when the window closes: a few, a few seconds
    /// later, where looking for them after every drain cost more than the process table did.
    pub fn forget_unsampled(&mut self, exited_by: u64, sampled: &BTreeSet<u32>) {
        let unsampled: Vec<u32> = self
            .processes
            .iter()
            .filter(|(pid, process)| {
                process.exited && process.changed <= exited_by && !sampled.contains(pid)
            })
            .map(|(pid, _)| *pid)
            .collect();
        self.drop_processes(&unsampled);
    }

    /// Drops the processes `pids` and their main threads' names.
    fn drop_processes(&mut self, pids: &[u32]) {
        for &pid in pids {
            self.remove_process(pid);
            self.threads.remove(&pid);
        }
    }

    /// Closes the files that no process maps any more (nor mapped before an exec in this
    /// window).
    fn close_unmapped_files(&mut self) {
        let mapped: HashSet<FileIdentity> = self
            .processes
            .values()
            .flat_map(ProcessInfo::all_mappings)
            .filter_map(|mapping| mapping.file)
            .collect();
        self.files.retain_open(|identity| mapped.contains(identity));
        self.files
            .by_path
            .retain(|_, identity| mapped.contains(identity));
        self.files
            .build_ids
            .retain(|identity, _| mapped.contains(identity));
        self.files
            .by_build_id
            .retain(|_, identity| mapped.contains(identity));
        self.path_names.retain(|name| Arc::strong_count(name) > 1);
    }

    /// A copy of what the table knows of `pids`: their mappings, thread names and the files
    /// they map (shared, not reopened).
    pub fn snapshot(&self, pids: &BTreeSet<u32>) -> ProcessTable {
        let processes = pids
            .iter()
            .filter_map(|pid| Some((*pid, self.processes.get(pid)?.clone())))
            .collect();
        self.table_of(processes)
    }

    /// The processes of the window closing now, as [`ProcessTable::snapshot`] gives them, then
    /// forgets those that exited (`exited`, see [`ProcessTable::forget`]). An exited process
    /// the window references is moved into it, not copied: under churn most of a window's
    /// processes have exited, and copying them doubled the process table as the window closed.
    pub fn close_window(&mut self, pids: &BTreeSet<u32>, exited: &[u32]) -> ProcessTable {
        let gone: HashSet<u32> = exited.iter().copied().collect();
        let processes = pids
            .iter()
            .filter_map(|pid| {
                let process = if gone.contains(pid) {
                    self.remove_process(*pid)?
                } else {
                    self.processes.get(pid)?.clone()
                };
                Some((*pid, process))
            })
            .collect();
        let window = self.table_of(processes);
        self.forget(exited);
        self.kernel_code.forget_unloaded();
        window
    }

    /// A table of `processes` with the thread names and the files they map (shared, not
    /// reopened).
    fn table_of(&self, processes: HashMap<u32, ProcessInfo>) -> ProcessTable {
        let mut by_identity: HashMap<FileIdentity, Arc<fs::File>> = HashMap::default();
        let mut reopened = 0;
        let mappings = processes
            .iter()
            .flat_map(|(pid, process)| process.all_mappings().map(move |mapping| (*pid, mapping)));
        for (pid, mapping) in mappings {
            let Some(identity) = mapping.file else {
                continue;
            };
            if by_identity.contains_key(&identity) {
                continue;
            }
            // Closed for the budget since: opened again for this window, a bounded few.
            let file = match self.files.by_identity.get(&identity) {
                Some(file) => file.clone(),
                None if reopened < WINDOW_REOPENS => {
                    let Some(file) = open_again(pid, mapping, identity) else {
                        continue;
                    };
                    reopened += 1;
                    Arc::new(file)
                }
                None => continue,
            };
            by_identity.insert(identity, file);
        }
        let by_path = self
            .files
            .by_path
            .iter()
            .filter(|(_, identity)| by_identity.contains_key(identity))
            .map(|(path, identity)| (path.clone(), *identity))
            .collect();
        ProcessTable {
            python_code: self.python_code.of(|pid| processes.contains_key(&pid)),
            processes,
            threads: self.threads.clone(),
            exited_threads: Vec::new(),
            lost_records: self.lost_records,
            files: MappedFiles {
                by_identity,
                by_path,
                // Only what finding files by path needs: a snapshot opens nothing.
                build_ids: HashMap::default(),
                by_build_id: HashMap::default(),
                ..MappedFiles::default()
            },
            last_change: self.last_change,
            // A window's table is read, never synced from.
            by_change: BTreeMap::new(),
            last_read: Cell::new(self.last_change),
            path_names: HashSet::default(),
            short_lives: short_lives::ShortLives::default(),
            hold_short_lives: false,
            kernel_code: self.kernel_code.clone(),
        }
    }

    /// The newest mapping of `pid` that contains `address`.
    pub fn mapping_for(&self, pid: u32, address: u64) -> Option<&Mapping> {
        self.newest_mapping(pid, address, |_| true)
    }

    /// The newest executable mapping of `pid` that contains the code address `address`: data
    /// mappings made later over part of a file's range (bss, heap) do not hide its code.
    pub fn code_mapping_for(&self, pid: u32, address: u64) -> Option<&Mapping> {
        self.newest_mapping(pid, address, |mapping| mapping.executable)
    }

    /// The module file at `path` as one of `pids` mapped it, else as any process that mapped
    /// that path did: only through a descriptor opened while the process lived, never by path
    /// afterwards, when another user may have put anything there.
    pub fn module_image(
        &self,
        pids: impl IntoIterator<Item = u32>,
        path: &str,
    ) -> Option<(Arc<fs::File>, ModuleImage)> {
        let opened = |process: &ProcessInfo| {
            process
                .mappings
                .iter()
                .rev()
                .filter(|mapping| *mapping.path == *path)
                .find_map(|mapping| mapping.file)
        };
        let identity = pids
            .into_iter()
            .filter_map(|pid| self.processes.get(&pid))
            .find_map(opened)
            .or_else(|| self.files.by_path.get(path).copied())?;
        Some((
            self.files.file(identity)?.clone(),
            self.files.image(identity)?,
        ))
    }

    fn newest_mapping(
        &self,
        pid: u32,
        address: u64,
        keep: impl Fn(&Mapping) -> bool,
    ) -> Option<&Mapping> {
        let process = self.processes.get(&pid)?;
        let found = |mappings: &'_ [Mapping]| -> Option<usize> {
            mappings
                .iter()
                .rposition(|mapping| mapping.contains(address) && keep(mapping))
        };
        // The current image first, then the replaced ones, newest first.
        std::iter::once(&process.mappings)
            .chain(process.retired.iter().rev())
            .find_map(|mappings| found(mappings).map(|index| &mappings[index]))
    }

    pub fn thread_name(&self, pid: u32, tid: u32) -> String {
        self.threads
            .get(&tid)
            .or_else(|| self.processes.get(&pid).map(|p| &p.comm))
            .cloned()
            .unwrap_or_default()
    }
}

/// What a side-band record does to the process table.
#[derive(Debug)]
enum Change {
    Map(u32, Mapping),
    NameThread {
        pid: u32,
        tid: u32,
        name: String,
        exec: bool,
    },
    Fork(u32, u32),
    Exit(u32),
    /// A thread other than the main one exited.
    ThreadExit(u32),
    Lost(u64),
    /// Kernel code loaded or unloaded (PERF_RECORD_KSYMBOL).
    KernelCode {
        start: u64,
        len: u32,
        name: Arc<str>,
        unloaded: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An executable mapping of the running test binary, as a process `pid` would report it.
    fn test_binary_mapping(path: &str) -> Mapping {
        let exe = std::env::current_exe().unwrap();
        Mapping {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            path: path.into(),
            executable: true,
            build_id: build_id_of(&fs::File::open(exe).unwrap()),
            file: None,
        }
    }

    /// Under process churn every new process maps the same files: one whose build ID is already
    /// open is not opened again, so it is found even where its path no longer leads to it.
    #[test]
    fn a_file_already_open_is_reused_by_build_id() {
        let exe = std::env::current_exe().unwrap();
        let mut table = ProcessTable::default();
        // Pids that do not exist: the files are opened by path, checked by build ID.
        let mut first = test_binary_mapping(exe.to_str().unwrap());
        assert!(first.build_id.is_some(), "test binaries carry a build ID");
        table.open_mapped_file(u32::MAX - 1, &mut first, None);
        let opened = first.file.expect("the test binary opens");
        let mut again = test_binary_mapping("/nonexistent/copy-of-the-binary");
        table.open_mapped_file(u32::MAX - 2, &mut again, None);
        assert_eq!(again.file, Some(opened));
        assert_eq!(table.files.by_identity.len(), 1);
    }

    /// What exited processes held goes once they are forgotten; a window's snapshot keeps the
    /// files its processes map, shared, after the table let them go.
    #[test]
    fn exited_processes_are_forgotten_and_snapshots_keep_their_files() {
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().unwrap();
        let mut table = ProcessTable::default();
        let mut mapping = test_binary_mapping(exe);
        table.open_mapped_file(u32::MAX - 1, &mut mapping, None);
        table.map(10, mapping.clone());
        table.name_thread(10, 10, "short".into(), false);
        table.name_thread(10, 11, "worker".into(), false);
        table.map(
            20,
            parse_maps_line("1000-2000 rw-p 0 0:0 0 [heap]").unwrap(),
        );
        table.apply(Change::ThreadExit(11));
        table.exit(10);
        assert_eq!(table.exited(), [10]);

        let window = table.close_window(&[10].into(), &table.exited());
        assert!(!table.processes.contains_key(&10) && table.processes.contains_key(&20));
        assert!(!table.threads.contains_key(&10) && !table.threads.contains_key(&11));
        assert!(table.files.by_identity.is_empty() && table.files.by_path.is_empty());
        assert!(table.module_image([10], exe).is_none());
        // The window still names the thread and reads the module.
        assert_eq!(window.thread_name(10, 11), "worker");
        assert_eq!(*window.processes[&10].mappings, [mapping]);
        assert!(window.module_image([10], exe).is_some());
        assert!(!window.processes.contains_key(&20));
    }

    /// Within a window, an exited process goes at the first drain after the one that found it
    /// exited, unless a drained sample references it; a living one, or one that exited later,
    /// stays.
    #[test]
    fn exited_processes_no_sample_references_are_forgotten_within_the_window() {
        let mut table = ProcessTable::default();
        for pid in [10, 11, 12] {
            table.fork(pid, 1);
            table.map(
                pid,
                parse_maps_line("1000-2000 r-xp 0 0:0 0 /bin/child").unwrap(),
            );
        }
        table.exit(10);
        table.exit(11);
        // What a drain reads before it takes the samples.
        let exited_by = table.last_change();
        table.exit(12);
        table.fork(13, 1);
        let sampled: BTreeSet<u32> = [11].into();
        table.forget_unsampled(exited_by, &sampled);
        assert!(!table.processes.contains_key(&10), "exited, unsampled");
        assert!(
            table.processes.contains_key(&11),
            "its samples are in the window"
        );
        assert!(
            table.processes.contains_key(&12),
            "exited after the drain's reading"
        );
        assert!(table.processes.contains_key(&13), "alive");
        // A new process that took an exited one's pid is alive.
        table.fork(10, 1);
        table.forget_unsampled(table.last_change(), &sampled);
        assert!(table.processes.contains_key(&10));
        assert!(!table.processes.contains_key(&12));
    }

    /// A reader sees each process that changed after the stamp it last read, once, however
    /// many changes it had, and a change after a reading always comes after that stamp.
    #[test]
    fn changed_processes_are_found_after_the_stamp_last_read() {
        let mut table = ProcessTable::default();
        let map = |table: &mut ProcessTable, pid: u32, start: u64| {
            let line = format!("{start:x}-{:x} r-xp 0 0:0 0 /bin/child", start + 0x1000);
            table.map(pid, parse_maps_line(&line).unwrap());
        };
        let changed = |table: &ProcessTable, stamp: u64| -> Vec<u32> {
            table.changed_since(stamp).map(|(pid, _)| pid).collect()
        };
        table.fork(10, 1);
        for page in 0..40 {
            map(&mut table, 10, 0x10000 + page * 0x1000);
        }
        table.fork(11, 1);
        assert_eq!(changed(&table, 0), [10, 11]);
        let read = table.last_change();
        assert!(changed(&table, read).is_empty());
        // Changes after the reading: 10 again, 12 new, 11 exits.
        map(&mut table, 10, 0x90000);
        table.fork(12, 1);
        table.exit(11);
        assert_eq!(changed(&table, read), [10, 12, 11]);
        assert!(table
            .processes
            .values()
            .all(|p| p.changed <= table.last_change()));
        let again = table.last_change();
        map(&mut table, 12, 0xa0000);
        assert_eq!(changed(&table, again), [12]);
    }

    #[test]
    fn newest_mapping_wins_and_exec_clears() {
        let mut table = ProcessTable::default();
        let old = parse_maps_line("1000-2000 r-xp 0 0:0 0 /old").unwrap();
        let new = parse_maps_line("1000-3000 r-xp 0 0:0 0 /new").unwrap();
        let bss = parse_maps_line("1000-1200 rw-p 0 0:0 0").unwrap();
        table.processes.entry(7).or_default().mappings = Arc::new(vec![old, new, bss]);
        assert_eq!(&*table.code_mapping_for(7, 0x1100).unwrap().path, "/new");
        assert_eq!(&*table.mapping_for(7, 0x1100).unwrap().path, "");
        assert_eq!(&*table.mapping_for(7, 0x1800).unwrap().path, "/new");
        assert!(table.mapping_for(7, 0x3000).is_none());
        assert!(table.mapping_for(8, 0x1800).is_none());
    }

    /// A sample taken before an exec, or before a new process took an exited one's pid, is
    /// drained after the side-band reported it: until its window closes it is symbolized against
    /// the image it ran, where the new one does not cover its address.
    #[test]
    fn samples_before_an_exec_or_a_pids_reuse_keep_their_image_until_the_window_closes() {
        let mut table = ProcessTable::default();
        table.map(7, parse_maps_line("1000-2000 r-xp 0 0:0 0 /old").unwrap());
        table.name_thread(7, 7, "new".into(), true);
        table.map(7, parse_maps_line("5000-6000 r-xp 0 0:0 0 /new").unwrap());
        assert_eq!(&*table.code_mapping_for(7, 0x1100).unwrap().path, "/old");
        assert_eq!(&*table.code_mapping_for(7, 0x5100).unwrap().path, "/new");
        // Its pid, reused by a child of process 1 after it exited.
        table.map(
            1,
            parse_maps_line("9000-a000 r-xp 0 0:0 0 /bin/sh").unwrap(),
        );
        table.exit(7);
        table.fork(7, 1);
        assert_eq!(&*table.code_mapping_for(7, 0x9100).unwrap().path, "/bin/sh");
        assert_eq!(&*table.code_mapping_for(7, 0x5100).unwrap().path, "/new");
        assert_eq!(&*table.code_mapping_for(7, 0x1100).unwrap().path, "/old");
        // The window closed: only the living image is left.
        table.forget(&[]);
        assert_eq!(&*table.code_mapping_for(7, 0x9100).unwrap().path, "/bin/sh");
        assert!(table.code_mapping_for(7, 0x5100).is_none());
        assert!(table.code_mapping_for(7, 0x1100).is_none());
    }

    /// A PERF_RECORD_KSYMBOL's fields after its header, as the kernel writes them.
    fn kernel_symbol_record(address: u64, len: u32, flags: u16, name: &str) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&address.to_ne_bytes());
        bytes.extend_from_slice(&len.to_ne_bytes());
        bytes.extend_from_slice(&1u16.to_ne_bytes()); // PERF_RECORD_KSYMBOL_TYPE_BPF
        bytes.extend_from_slice(&flags.to_ne_bytes());
        bytes.extend_from_slice(name.as_bytes());
        bytes.resize(bytes.len().next_multiple_of(8) + 8, 0);
        bytes
    }

    #[test]
    fn bpf_programs_are_named_by_their_side_band_extent_until_the_window_after_they_unload() {
        let mut table = ProcessTable::default();
        let apply = |table: &mut ProcessTable, fields: &[u8]| {
            let mut bytes = RecordBytes::default();
            let pending = bytes.read(17, 0, fields).expect("a whole KSYMBOL record");
            table.apply_pending(pending, &bytes);
        };
        let name = "bpf_prog_6deef7357e7b4530_on_overflow";
        apply(
            &mut table,
            &kernel_symbol_record(0xffff_ffff_c000_1000, 0x200, 0, name),
        );
        assert_eq!(
            table.kernel_code.lookup(0xffff_ffff_c000_11ff),
            Some((name, 0xffff_ffff_c000_1000))
        );
        assert_eq!(table.kernel_code.lookup(0xffff_ffff_c000_1200), None);
        // Unloaded before the window closes: its samples drained later are still named.
        apply(
            &mut table,
            &kernel_symbol_record(0xffff_ffff_c000_1000, 0x200, 1, name),
        );
        let window = table.close_window(&BTreeSet::new(), &[]);
        assert_eq!(
            window.kernel_code.lookup(0xffff_ffff_c000_1010),
            Some((name, 0xffff_ffff_c000_1000))
        );
        assert_eq!(table.kernel_code.lookup(0xffff_ffff_c000_1010), None);
    }

    #[test]
    fn a_mapping_seen_by_the_scan_and_the_side_band_is_kept_once() {
        let mut table = ProcessTable::default();
        let code = parse_maps_line("1000-2000 r-xp 0 0:0 0 /bin/app").unwrap();
        let data = parse_maps_line("2000-3000 rw-p 1000 0:0 0 /bin/app").unwrap();
        table.processes.entry(7).or_default().mappings = Arc::new(vec![code.clone(), data.clone()]);
        // Made between enabling the side-band and the scan: in both.
        table.map(7, code.clone());
        table.map(7, data.clone());
        assert_eq!(*table.processes[&7].mappings, [code.clone(), data]);
        // A different file over the same range is a new mapping, and wins.
        let replaced = parse_maps_line("1000-2000 r-xp 0 0:0 0 /bin/other").unwrap();
        table.map(7, replaced);
        assert_eq!(
            &*table.code_mapping_for(7, 0x1800).unwrap().path,
            "/bin/other"
        );
        // The old one mapped again after it is newest once more.
        table.map(7, code);
        assert_eq!(
            &*table.code_mapping_for(7, 0x1800).unwrap().path,
            "/bin/app"
        );
        assert_eq!(table.processes[&7].mappings.len(), 4);
    }
}
