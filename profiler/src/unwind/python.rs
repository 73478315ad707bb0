//! The walker's record of the CPython processes (`PYTHON_PROCESSES`): for each process whose
//! executable mappings hold an interpreter the walker knows, where its `_PyRuntime` is and how
//! its version lays out the frames, so that its stacks carry their Python frames
//! (`profiler-ebpf/src/python.rs`).

use std::collections::HashMap;

use aya::maps::{HashMap as BpfHashMap, MapData};
use object::{Object, ObjectSymbol};
use profiler_common::python::{PythonOffsets, PythonProcess};

use super::segments::{load_bias, segment_holding, segments, Segment};
use crate::{
    input::{open_regular, FinalLink, ModuleImage},
    process::{python::interpreter_mappings, FileIdentity, MappedFiles, Mapping, ProcessTable},
};

/// Where an interpreter file keeps `_PyRuntime` (its ELF virtual address), with its segments,
/// to place it in each process that maps the file.
struct RuntimeSymbol {
    address: u64,
    segments: Vec<Segment>,
}

pub(super) struct PythonProcesses {
    map: BpfHashMap<MapData, u32, PythonProcess>,
    /// Each interpreter file read, `None` where it has no `_PyRuntime` (stripped of its dynamic
    /// symbols, or no CPython at all).
    files: HashMap<FileIdentity, Option<RuntimeSymbol>>,
    published: HashMap<u32, PythonProcess>,
    /// Processes the full map refused, counted once each.
    pub refused: u64,
}

impl PythonProcesses {
    pub(super) fn new(map: BpfHashMap<MapData, u32, PythonProcess>) -> PythonProcesses {
        PythonProcesses {
            map,
            files: HashMap::new(),
            published: HashMap::new(),
            refused: 0,
        }
    }

    /// Forgets the interpreter files no process maps any more: their inode numbers may be
    /// given to other files.
    pub(super) fn release_closed_files(&mut self, files: &MappedFiles) {
        self.files.retain(|identity, _| files.is_open(*identity));
    }

    /// Publishes `pid` (whose executable mappings are `mappings`) when it runs an interpreter
    /// the walker knows, and withdraws it when it no longer does (it exec'd another program).
    pub(super) fn sync<'m>(
        &mut self,
        processes: &ProcessTable,
        pid: u32,
        mappings: impl IntoIterator<Item = &'m Mapping>,
    ) {
        let found = interpreter_mappings(mappings).find_map(|(mapping, minor)| {
            let offsets = PythonOffsets::of_minor(minor)?;
            let runtime = self.runtime_address(processes, mapping)?;
            Some(PythonProcess {
                runtime,
                offsets,
                _pad: 0,
            })
        });
        match found {
            Some(process) if self.published.get(&pid) != Some(&process) => {
                match self.map.insert(pid, process, 0) {
                    Ok(()) => {
                        self.published.insert(pid, process);
                    }
                    // Full: this process's stacks keep their native frames only.
                    Err(_) => self.refused += 1,
                }
            }
            Some(_) => {}
            None => self.forget(pid),
        }
    }

    pub(super) fn forget(&mut self, pid: u32) {
        if self.published.remove(&pid).is_some() {
            let _ = self.map.remove(&pid);
        }
    }

    /// Where `_PyRuntime` is in the process that maps the interpreter as `mapping`.
    fn runtime_address(&mut self, processes: &ProcessTable, mapping: &Mapping) -> Option<u64> {
        let identity = mapping.file?;
        let symbol = self
            .files
            .entry(identity)
            .or_insert_with(|| runtime_symbol(processes, identity))
            .as_ref()?;
        let segment = segment_holding(&symbol.segments, mapping.file_offset)?;
        Some(load_bias(segment, mapping).wrapping_add(symbol.address))
    }
}

/// `_PyRuntime` of the interpreter file `identity`, by its dynamic symbols (exported by every
/// CPython build) or its symbol table.
fn runtime_symbol(processes: &ProcessTable, identity: FileIdentity) -> Option<RuntimeSymbol> {
    let path = processes.files.path(identity)?;
    let file = open_regular(&path, FinalLink::Follow).ok()?;
    let image = ModuleImage::new(file);
    let elf = object::File::parse(&image).ok()?;
    let address = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|symbol| symbol.name() == Ok("_PyRuntime") && symbol.address() != 0)?
        .address();
    Some(RuntimeSymbol {
        address,
        segments: segments(&elf),
    })
}
