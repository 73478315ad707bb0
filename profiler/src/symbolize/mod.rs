//! Symbolization: drained addresses to functions, inlined functions, files and lines, with
//! blazesym. User addresses are first normalized to (file, file offset) through the process
//! table recorded while the processes lived, so processes that exited are symbolized too.

mod ahead;
mod aliases;
mod cache;
mod call_frames;
pub mod debuginfod;
pub mod demangle;
mod kallsyms;
pub mod kernel_addresses;
pub mod module_file;
pub mod perf_map;
mod plain_debug;
mod plt;
mod python;
mod separate_debug;

use std::{
    collections::{btree_map, hash_map::Entry, BTreeMap},
    fs,
    hash::BuildHasher,
    path::Path,
    sync::Arc,
};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Sym, Symbolized, Symbolizer,
};

use profiler_common::unwind_maps::{FRAME_POINTERS_ONLY_FRAME, TRUNCATED_FRAME};

use crate::{
    fast_hash::{HashMap, HashSet},
    process::{hex, vdso, FileIdentity, Mapping, ProcessTable},
    profile::{Frame, FrameId, FunctionAliases, InlinedFrame},
};
use demangle::demangle;

/// What a stack the unwinder could not finish ends in (its `TRUNCATED_FRAME`).
pub const TRUNCATED_FUNCTION: &str = "[truncated]";
/// What a stack walked by frame pointers alone ends in, where tables or a stack copy were asked
/// for (its `FRAME_POINTERS_ONLY_FRAME`).
pub const FRAME_POINTERS_ONLY_FUNCTION: &str = "[frame pointers only]";

pub use ahead::ReadAhead;
pub use cache::SymbolCache;
use kallsyms::KernelSymbols;
pub use profiler_common::capture::KERNEL_SPACE_START;
pub use python::{splice_python_frames, PYTHON_MODULE};

pub fn is_kernel_address(address: u64) -> bool {
    address >= KERNEL_SPACE_START
}

#[cfg(test)]
#[test]
fn the_kernel_boundary_holds_under_4_and_5_level_paging() {
    // x86-64, 4-level: the top of user space and the kernel's direct map.
    assert!(!is_kernel_address(0x0000_7fff_ffff_f000));
    assert!(is_kernel_address(0xffff_8880_0000_0000));
    // 5-level: user space reaches 2^56, the kernel starts at 0xff00_0000_0000_0000.
    assert!(!is_kernel_address(0x00ff_ffff_ffff_f000));
    assert!(is_kernel_address(0xff11_0000_0000_0000));
    // arm64 kernel text.
    assert!(is_kernel_address(0xffff_8000_8000_0000));
}

/// An address to symbolize. Caller frames are looked up one byte before their return address,
/// so that the line is the call's and a call at the very end of a function still names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CodeAddress {
    pub pid: u32,
    pub address: u64,
}

impl CodeAddress {
    /// A sampled instruction of process `pid`: kernel addresses belong to no process (pid 0).
    pub fn sampled(pid: u32, address: u64) -> CodeAddress {
        CodeAddress {
            pid: if is_kernel_address(address) { 0 } else { pid },
            address,
        }
    }
}

/// Stack addresses as looked up: the leaf as sampled, callers one byte before their return
/// address (inside the call instruction), the unwinder's marker frames as they are.
pub fn lookup_addresses(pid: u32, ips: &[u64]) -> impl Iterator<Item = CodeAddress> + '_ {
    ips.iter().enumerate().map(move |(depth, ip)| CodeAddress {
        pid,
        address: if depth == 0
            || profiler_common::unwind_maps::is_marker_frame(*ip)
            || profiler_common::python::decode_frame(*ip).is_some()
        {
            *ip
        } else {
            ip.saturating_sub(1)
        },
    })
}

/// The address a frame of a mapped file carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameAddresses {
    /// Where its process had the file mapped: what reports of instructions and annotated code
    /// show, as perf does.
    Runtime,
    /// Its file offset, as if the file were mapped at 0 (the vDSO's offset in it likewise): the
    /// same code in every process that maps the file is one frame (one location and one
    /// mapping in pprof), however its load address differs. The agent's windows, where under
    /// process churn each new process's code is at new addresses (a window at 997 Hz held
    /// three locations per distinct file offset).
    FileOffsets,
}

/// A module file as the side-band opened it, and addresses in it with their frames before
/// symbolizing (each with its file offset).
type FileFrames = (Arc<fs::File>, Vec<(CodeAddress, Frame)>);

/// Addresses sorted by where their names come from, with what naming them needs from the
/// process table (see [`FrameTable::sort`]): [`KnownFrames::name`] needs it no more, so a
/// recording sorts them on the capture thread and names them on another (see [`ReadAhead`]).
#[derive(Default)]
pub struct SortedCode {
    files: BTreeMap<FileIdentity, FileFrames>,
    /// Kernel code, with its function where the side-band saw the code loaded (BPF programs,
    /// trampolines: kallsyms lists them only while they live); kallsyms names the rest.
    kernel: Vec<(CodeAddress, Option<(String, u64)>)>,
    /// The unwinder's marker frames, by the function they stand for.
    markers: Vec<(CodeAddress, &'static str)>,
    /// Frames named while sorting: Python frames, whose code objects are read from their
    /// process's memory while it lives.
    named: Vec<(CodeAddress, Frame)>,
    /// With [`FrameAddresses::FileOffsets`]: addresses whose file offset another address in
    /// `files` has, or a frame known has: resolved with it.
    same_code: Vec<(CodeAddress, (FileIdentity, u64))>,
    /// Frames no module file names: anonymous and special mappings (JIT code, the vDSO),
    /// unmapped addresses, files that could not be opened.
    unnamed: Vec<(CodeAddress, Frame)>,
    /// Addresses in module files that could not be opened (or were closed for the descriptor
    /// budget and could not be opened again), by module path: said in the losses, not left
    /// silently unnamed.
    unreadable: BTreeMap<String, u64>,
}

impl SortedCode {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
            && self.kernel.is_empty()
            && self.markers.is_empty()
            && self.named.is_empty()
            && self.same_code.is_empty()
            && self.unnamed.is_empty()
    }

    /// Leaves out the addresses `known` says are resolved.
    fn retain_unknown(&mut self, known: impl Fn(&CodeAddress) -> bool) {
        self.files.retain(|_, (_, frames)| {
            frames.retain(|(address, _)| !known(address));
            !frames.is_empty()
        });
        self.kernel.retain(|(address, _)| !known(address));
        self.markers.retain(|(address, _)| !known(address));
        self.named.retain(|(address, _)| !known(address));
        self.same_code.retain(|(address, _)| !known(address));
        self.unnamed.retain(|(address, _)| !known(address));
    }
}

/// The frames resolved so far, and what finds them again. Apart from the process table, so
/// that a recording's symbolizing thread keeps them from one drain to the next.
#[derive(Default)]
pub struct KnownFrames {
    pub frames: Vec<Frame>,
    /// Other names of the symbolized functions.
    pub aliases: Vec<FunctionAliases>,
    /// Each frame's id by the frame's hash, so that a frame (its module, function and file
    /// names) is stored once, in `frames`: a window of a busy machine holds hundreds of
    /// thousands, and a second copy as the key was a quarter of the agent's heap at 997 Hz.
    interned: HashMap<u64, FrameId>,
    /// Frames whose hash an earlier, different frame has: never merged with it.
    collided: HashMap<Frame, FrameId>,
    hasher: foldhash::fast::RandomState,
    resolved: HashMap<CodeAddress, FrameId>,
    /// With [`FrameAddresses::FileOffsets`], the frame of each file offset resolved: the
    /// same code sampled in another process is that frame, found without symbolizing it again.
    by_file_offset: HashMap<(FileIdentity, u64), FrameId>,
    /// See [`SortedCode::unreadable`]: every batch's.
    pub unreadable: BTreeMap<String, u64>,
    /// Files read only in part or not at all, by why (a loss counter's name): each counted
    /// once, however many frames and drains it had.
    unread: BTreeMap<&'static str, HashSet<FileIdentity>>,
}

impl KnownFrames {
    fn intern(&mut self, frame: Frame) -> FrameId {
        let id = self.frames.len() as FrameId;
        match self.interned.entry(self.hasher.hash_one(&frame)) {
            Entry::Occupied(first) if self.frames[*first.get() as usize] == frame => {
                return *first.get();
            }
            Entry::Occupied(_) => match self.collided.get(&frame) {
                Some(&known) => return known,
                None => {
                    self.collided.insert(frame.clone(), id);
                }
            },
            Entry::Vacant(slot) => {
                slot.insert(id);
            }
        }
        self.frames.push(frame);
        id
    }

    fn keep(&mut self, address: CodeAddress, frame: Frame) {
        let id = self.intern(frame);
        self.resolved.insert(address, id);
    }

    fn count_unread(&mut self, why: &'static str, file: FileIdentity) {
        self.unread.entry(why).or_default().insert(file);
    }

    /// How many files each reason left unread or cut short, as loss counters.
    pub fn unread_files(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        self.unread
            .iter()
            .map(|(why, files)| (why.to_string(), files.len() as u64))
    }

    /// Whether `address` is resolved.
    fn knows(&self, address: &CodeAddress) -> bool {
        self.resolved.contains_key(address)
    }

    /// The frame of an address resolved.
    pub fn frame(&self, address: CodeAddress) -> FrameId {
        self.resolved[&address]
    }

    /// Names `sorted` (by a table that knew these frames: none of its addresses is resolved)
    /// through `cache` (else a symbolizer made for the call) and keeps the frames, which carry
    /// `addresses`: one blazesym call per ELF file and one for the kernel.
    pub fn name(
        &mut self,
        sorted: SortedCode,
        cache: Option<&SymbolCache>,
        addresses: FrameAddresses,
        progress: &indicatif::ProgressBar,
    ) {
        let SortedCode {
            files,
            kernel,
            markers,
            named,
            same_code,
            mut unnamed,
            unreadable,
        } = sorted;
        for (address, frame) in named {
            self.keep(address, frame);
        }
        for (module, addresses) in unreadable {
            *self.unreadable.entry(module).or_default() += addresses;
        }
        for (address, marker) in markers {
            let frame = Frame {
                function: Some(marker.to_string()),
                ..Frame::default()
            };
            self.keep(address, frame);
        }
        // Without a cache, the call's own, made at its first file.
        let mut own = None;
        progress.set_length(files.len() as u64 + 1);
        for (identity, (file, entries)) in files {
            progress.inc(1);
            let (sampled, mut frames): (Vec<CodeAddress>, Vec<Frame>) = entries.into_iter().unzip();
            if let Some(frame) = frames.first() {
                progress.set_message(frame.module.clone());
            }
            let path = match crate::input::symbol_path(&file) {
                Ok(read) => {
                    if read.links_not_followed {
                        self.count_unread(crate::input::LINKS_NOT_FOLLOWED, identity);
                    }
                    Some(read.path)
                }
                Err(refused) => {
                    self.count_unread(refused.describe(), identity);
                    None
                }
            };
            let aliases = match (cache, path) {
                (_, None) => Vec::new(),
                (Some(cache), Some(path)) => cache.fill(identity, &file, &path, &mut frames),
                (None, Some(path)) => {
                    fill_from_elf(
                        own.get_or_insert_with(new_symbolizer),
                        &path,
                        true,
                        &mut frames,
                    );
                    module_names(&path, &mut frames, true)
                }
            };
            // A recording names its code a drain at a time: a function once.
            for names in aliases {
                if !self.aliases.contains(&names) {
                    self.aliases.push(names);
                }
            }
            for (address, frame) in sampled.into_iter().zip(frames) {
                let offset = frame.module_offset;
                let id = self.intern(frame);
                self.resolved.insert(address, id);
                if addresses == FrameAddresses::FileOffsets {
                    self.by_file_offset.insert((identity, offset), id);
                }
            }
        }
        for (address, code) in same_code {
            match self.by_file_offset.get(&code) {
                Some(&id) => {
                    self.resolved.insert(address, id);
                }
                // Sorted with its file open, so named above; never left out, however.
                None => unnamed.push((address, Frame::default())),
            }
        }
        progress.set_message("kernel");
        progress.inc(1);
        if !kernel.is_empty() {
            let from_kallsyms: Vec<u64> = kernel
                .iter()
                .filter(|(_, loaded)| loaded.is_none())
                .map(|(address, _)| address.address)
                .collect();
            let (own_kernel, cached_kernel);
            let functions: &KernelSymbols = match cache {
                Some(cache) => {
                    cached_kernel = cache.kernel_symbols(&from_kallsyms);
                    &cached_kernel
                }
                None => {
                    own_kernel = KernelSymbols::of_running_kernel(&from_kallsyms);
                    &own_kernel
                }
            };
            for (address, loaded) in kernel {
                let mut frame = Frame {
                    address: address.address,
                    kernel: true,
                    module: "[kernel.kallsyms]".into(),
                    module_offset: address.address,
                    ..Frame::default()
                };
                let named = loaded.or_else(|| {
                    functions
                        .lookup(address.address)
                        .map(|(name, start)| (name.to_string(), start))
                });
                if let Some((name, start)) = named {
                    frame.function = Some(name);
                    frame.function_address = Some(start);
                }
                self.keep(address, frame);
            }
        }
        progress.finish_and_clear();
        let mut perf_maps = perf_map::PerfMaps::default();
        let vdso = unnamed
            .iter()
            .any(|(_, frame)| frame.module == vdso::VDSO)
            .then(vdso::Vdso::own)
            .flatten();
        for (address, mut frame) in unnamed {
            if frame.module == vdso::VDSO {
                if let Some((name, start)) =
                    vdso.as_ref().and_then(|v| v.lookup(frame.module_offset))
                {
                    frame.function = Some(name.to_string());
                    frame.function_address = Some(frame.address - (frame.module_offset - start));
                }
            } else if let Some((name, start)) = perf_maps.lookup(address.pid, address.address) {
                frame.function = Some(name);
                frame.function_address = Some(start);
                // JIT code lives in anonymous memory (`//anon`): the map names its module.
                frame.module = format!("[perf-{}.map]", address.pid);
            }
            self.keep(address, frame);
        }
        for map in perf_maps.cut {
            self.count_unread(perf_map::CUT_AT_CAP, map);
        }
    }
}

/// Resolves code addresses to interned frames.
pub struct FrameTable<'a> {
    processes: &'a ProcessTable,
    addresses: FrameAddresses,
    /// The symbols kept across tables (the agent's, serving every window); else a symbolizer
    /// is made per [`FrameTable::resolve`].
    cache: Option<&'a SymbolCache>,
    pub known: KnownFrames,
}

impl<'a> FrameTable<'a> {
    pub fn new(processes: &'a ProcessTable) -> Self {
        Self::with_cache(processes, None, FrameAddresses::Runtime)
    }

    /// A table that symbolizes through `cache` (see [`FrameTable::cache`]), whose frames of
    /// mapped files carry `addresses`.
    pub fn with_cache(
        processes: &'a ProcessTable,
        cache: Option<&'a SymbolCache>,
        addresses: FrameAddresses,
    ) -> Self {
        Self::with_known(processes, cache, addresses, KnownFrames::default())
    }

    /// A table that goes on from frames `known` already, resolved with the same `addresses`.
    pub fn with_known(
        processes: &'a ProcessTable,
        cache: Option<&'a SymbolCache>,
        addresses: FrameAddresses,
        known: KnownFrames,
    ) -> Self {
        FrameTable {
            processes,
            addresses,
            cache,
            known,
        }
    }

    /// The processes whose addresses the table resolves.
    pub fn processes(&self) -> &'a ProcessTable {
        self.processes
    }

    /// The frame of `address` in the mapped file `mapping`, before symbolizing.
    fn file_frame(&self, address: CodeAddress, mapping: &Mapping) -> Frame {
        let offset = address.address - mapping.start + mapping.file_offset;
        Frame {
            address: match self.addresses {
                FrameAddresses::Runtime => address.address,
                FrameAddresses::FileOffsets => offset,
            },
            module: mapping.path.to_string(),
            module_offset: offset,
            build_id: mapping.build_id.as_deref().map(hex),
            ..Frame::default()
        }
    }

    /// The frame of an address resolved by [`FrameTable::resolve`].
    pub fn frame(&self, address: CodeAddress) -> FrameId {
        self.known.frame(address)
    }

    /// Sorts the addresses the table has not resolved by where their names come from.
    pub fn sort(&self, addresses: impl IntoIterator<Item = CodeAddress>) -> SortedCode {
        let mut sorted = SortedCode::default();
        // With file offsets: code queued above for another process, resolved with it.
        let mut queued = HashSet::default();
        let mut python = python::PythonCodeReader::default();
        for address in addresses {
            if self.known.resolved.contains_key(&address) {
                continue;
            }
            if let Some(frame) = (address.pid != 0)
                .then(|| python.frame(self.processes, address.pid, address.address))
                .flatten()
            {
                sorted.named.push((address, frame));
                continue;
            }
            // Kernel code belongs to no process (pid 0, see [`CodeAddress::sampled`]): a
            // kernel-space value in a process's user stack is no kernel frame but whatever a
            // frame-pointer walk read from the stack, and named from kallsyms it showed a
            // kernel function inside user code.
            if address.pid == 0 && is_kernel_address(address.address) {
                let loaded = self.processes.kernel_code.lookup(address.address);
                let loaded = loaded.map(|(name, start)| (name.to_string(), start));
                sorted.kernel.push((address, loaded));
                continue;
            }
            let marker = match address.address {
                TRUNCATED_FRAME => Some(TRUNCATED_FUNCTION),
                FRAME_POINTERS_ONLY_FRAME => Some(FRAME_POINTERS_ONLY_FUNCTION),
                _ => None,
            };
            if let Some(marker) = marker {
                sorted.markers.push((address, marker));
                continue;
            }
            match self
                .processes
                .code_mapping_for(address.pid, address.address)
            {
                Some(mapping) if mapping.is_file() => {
                    if let (FrameAddresses::FileOffsets, Some(identity)) =
                        (self.addresses, mapping.file)
                    {
                        let code = (
                            identity,
                            address.address - mapping.start + mapping.file_offset,
                        );
                        // Code resolved before, or queued above for another process: resolved
                        // with it. Unless its file is not open: then unnamed, as the first.
                        if self.known.by_file_offset.contains_key(&code)
                            || (!queued.insert(code)
                                && self.processes.files.file(identity).is_some())
                        {
                            sorted.same_code.push((address, code));
                            continue;
                        }
                    }
                    let frame = self.file_frame(address, mapping);
                    // Only through the descriptor opened while the process lived: by now its
                    // owner may have put a FIFO, a device or a link at the path. Looked up once
                    // per file, not per address.
                    let frames = match mapping.file.map(|identity| sorted.files.entry(identity)) {
                        Some(btree_map::Entry::Occupied(entry)) => Some(&mut entry.into_mut().1),
                        Some(btree_map::Entry::Vacant(entry)) => self
                            .processes
                            .files
                            .file(*entry.key())
                            .map(|file| &mut entry.insert((Arc::clone(file), Vec::new())).1),
                        None => None,
                    };
                    match frames {
                        Some(frames) => frames.push((address, frame)),
                        None => {
                            *sorted.unreadable.entry(frame.module.clone()).or_default() += 1;
                            sorted.unnamed.push((address, frame))
                        }
                    }
                }
                Some(mapping) => {
                    let offset = address.address - mapping.start;
                    // The vDSO is the same image in every process.
                    let shared = self.addresses == FrameAddresses::FileOffsets
                        && &*mapping.path == vdso::VDSO;
                    sorted.unnamed.push((
                        address,
                        Frame {
                            address: if shared { offset } else { address.address },
                            module: mapping.path.to_string(),
                            module_offset: offset,
                            ..Frame::default()
                        },
                    ))
                }
                None => sorted.unnamed.push((
                    address,
                    Frame {
                        address: address.address,
                        ..Frame::default()
                    },
                )),
            }
        }
        sorted
    }

    /// Symbolizes all addresses in batches: one blazesym call per ELF file and one for the
    /// kernel.
    pub fn resolve(&mut self, addresses: impl IntoIterator<Item = CodeAddress>) {
        let sorted = self.sort(addresses);
        let progress = progress_bar(0, "symbolizing");
        self.known
            .name(sorted, self.cache, self.addresses, &progress);
    }
}

/// What the symbolizer does not say, from the module open at `path` (a descriptor path): names
/// of the frames in its PLT stubs (`memcpy@plt`) or only in its separate debug file's symbol
/// table (glibc's internal functions, when DWARF is not read), else the bounds of the function
/// its call-frame information gives (`liblzma.so.5.4.1+0x15b80`), and with `aliases` the other
/// names of the frames' functions.
fn module_names(path: &Path, frames: &mut [Frame], aliases: bool) -> Vec<FunctionAliases> {
    let Ok(file) = crate::input::open_regular(path, crate::input::FinalLink::Follow) else {
        return Vec::new();
    };
    let image = crate::input::ModuleImage::new(file);
    let Ok(module) = object::File::parse(&image) else {
        return Vec::new();
    };
    if frames.iter().any(|frame| frame.function.is_none()) {
        let stubs = plt::PltStubs::read(&module);
        for frame in frames.iter_mut().filter(|frame| frame.function.is_none()) {
            if let Some((name, start)) = stubs.lookup(frame.module_offset) {
                frame.function = Some(name.to_string());
                frame.function_address = Some(frame.address - (frame.module_offset - start));
            }
        }
    }
    // Read once for both: the names it alone has, and other names of the frames' functions.
    let debug_image = separate_debug::open(&module);
    let debug = debug_image
        .as_ref()
        .and_then(|image| object::File::parse(image).ok());
    if let Some(debug) = &debug {
        if frames.iter().any(|frame| frame.function.is_none()) {
            aliases::name_from_debug_file(&module, debug, frames);
        }
    }
    if frames.iter().any(|frame| frame.function.is_none()) {
        call_frames::name_by_call_frames(&module, frames);
    }
    if !aliases {
        return Vec::new();
    }
    aliases::function_aliases(&module, debug.as_ref(), frames)
}

/// A symbolizer that reports lines and inlined functions. Names come back as the module spells
/// them: [`fill`] demangles those it keeps (blazesym would try every name of every instruction
/// a line table is read for, C names included).
pub fn new_symbolizer() -> Symbolizer {
    Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(false)
        .build()
}

/// Symbolizes frames of the ELF file at `path` in one batch, by their `module_offset` (file
/// offset); frames the file has no symbol for are left as they are. With `dwarf`, lines and
/// inlined functions come from its debug information (its own, or its separate debug file's);
/// without, names come from its symbol tables only.
pub fn fill_from_elf(symbolizer: &Symbolizer, path: &Path, dwarf: bool, frames: &mut [Frame]) {
    let offsets: Vec<u64> = frames.iter().map(|frame| frame.module_offset).collect();
    let results = symbolize_offsets(symbolizer, path, dwarf, &offsets);
    for (frame, result) in frames.iter_mut().zip(results) {
        if let Symbolized::Sym(sym) = result {
            let address = frame.address;
            fill(frame, &sym, address);
        }
    }
}

/// What blazesym says of each file offset of the ELF file at `path`; with `dwarf`, from its
/// debug information: its own, or its separate debug file's (through an uncompressed copy,
/// which names them alike, where that file is compressed). An empty list when it cannot be
/// read.
pub fn symbolize_offsets<'s>(
    symbolizer: &'s Symbolizer,
    path: &Path,
    dwarf: bool,
    offsets: &[u64],
) -> Vec<Symbolized<'s>> {
    match dwarf.then(|| debug_source(path, offsets)).flatten() {
        Some((debug, addresses)) => {
            let mut elf = Elf::new(debug);
            elf.debug_syms = true;
            symbolizer.symbolize(&Source::Elf(elf), Input::VirtOffset(addresses.as_slice()))
        }
        None => {
            let mut elf = Elf::new(path);
            elf.debug_syms = dwarf;
            symbolizer.symbolize(&Source::Elf(elf), Input::FileOffset(offsets))
        }
    }
    .unwrap_or_default()
}

/// The separate debug file of the module at `path` (or its uncompressed copy, see
/// [`plain_debug`]), with `offsets` as the link-time addresses it is read by; `None` when the
/// module has no separate debug file, or an offset lies outside its segments.
fn debug_source(path: &Path, offsets: &[u64]) -> Option<(std::path::PathBuf, Vec<u64>)> {
    let file = crate::input::open_regular(path, crate::input::FinalLink::Follow).ok()?;
    let image = crate::input::ModuleImage::new(file);
    let module = object::File::parse(&image).ok()?;
    let (build_id, debug) = separate_debug::find(&module)?;
    let addresses = offsets
        .iter()
        .map(|&offset| module_file::address_of_file_offset(&module, offset))
        .collect::<Option<Vec<u64>>>()?;
    let read = plain_debug::uncompressed_copy(&build_id, &debug).unwrap_or(debug);
    Some((read, addresses))
}

/// A progress bar on stderr when it is a terminal (symbolizing a large profile takes seconds);
/// hidden otherwise, so logs and pipes stay clean.
pub fn progress_bar(length: u64, what: &'static str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;

    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(length).with_prefix(what);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {wide_msg}")
    {
        bar.set_style(style);
    }
    bar
}

fn fill(frame: &mut Frame, sym: &Sym<'_>, address: u64) {
    frame.function = Some(demangle(&sym.name));
    frame.function_address = Some(address - sym.offset as u64);
    if let Some(info) = &sym.code_info {
        frame.file = Some(code_path(info.dir.as_deref(), &info.file));
        frame.line = info.line;
    }
    frame.inlined = sym
        .inlined
        .iter()
        .map(|inlined| InlinedFrame {
            function: demangle(&inlined.name),
            file: inlined
                .code_info
                .as_ref()
                .map(|info| code_path(info.dir.as_deref(), &info.file)),
            line: inlined.code_info.as_ref().and_then(|info| info.line),
        })
        .collect();
}

fn code_path(dir: Option<&Path>, file: &std::ffi::OsStr) -> String {
    match dir {
        Some(dir) => dir.join(file).to_string_lossy().into_owned(),
        None => file.to_string_lossy().into_owned(),
    }
}

/// The file offset where `frame`'s function starts; `None` for a frame without a function.
pub fn function_start(frame: &Frame) -> Option<u64> {
    let into_function = frame.address.checked_sub(frame.function_address?)?;
    frame.module_offset.checked_sub(into_function)
}

#[cfg(test)]
#[test]
fn frames_are_interned_once_and_a_hash_collision_never_merges_two() {
    let mut known = KnownFrames::default();
    let frame = |function: &str| Frame {
        address: 0x1000,
        module: "/usr/bin/app".into(),
        function: Some(function.into()),
        ..Frame::default()
    };
    let main = known.intern(frame("main"));
    assert_eq!(known.intern(frame("main")), main);
    // Another frame whose hash is already `main`'s.
    let work_hash = known.hasher.hash_one(frame("work"));
    known.interned.insert(work_hash, main);
    let work = known.intern(frame("work"));
    assert_ne!(work, main);
    assert_eq!(known.intern(frame("work")), work);
    assert_eq!(known.frames[work as usize], frame("work"));
    assert_eq!(known.frames[main as usize], frame("main"));
    assert_eq!(known.frames.len(), 2);
}

/// The mapping of this process holding `address`, from /proc/self/maps.
#[cfg(test)]
fn own_mapping_of(address: u64) -> Mapping {
    fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(crate::process::parse_maps_line)
        .find(|mapping| mapping.contains(address))
        .unwrap()
}

/// This test binary's text (`text`, as it is mapped here) mapped by each process of `pids`,
/// the given number of bytes above.
#[cfg(test)]
fn map_own_text(processes: &mut ProcessTable, text: &Mapping, pids: &[(u32, u64)]) {
    let exe = std::env::current_exe().unwrap();
    let file = processes.files.open_path(exe.to_str().unwrap(), None, None);
    for &(pid, bias) in pids {
        processes.map(
            pid,
            Mapping {
                start: text.start + bias,
                end: text.end + bias,
                path: exe.to_str().unwrap().into(),
                file,
                ..text.clone()
            },
        );
    }
}

/// Code read ahead through one process is named at the end as reading it then names it, in
/// every process that maps it and at its address there: the cache keeps what it read by file
/// offset, and a recording's frames carry run-time addresses.
#[cfg(test)]
#[test]
fn code_read_ahead_is_named_at_the_end_as_code_read_then() {
    let function = code_read_ahead_is_named_at_the_end_as_code_read_then as *const () as u64;
    let text = own_mapping_of(function);
    let mut processes = ProcessTable::default();
    let elsewhere = 64 << 20;
    map_own_text(&mut processes, &text, &[(10, 0), (11, elsewhere)]);
    let sampled = [
        CodeAddress {
            pid: 10,
            address: function + 1,
        },
        CodeAddress {
            pid: 11,
            address: function + elsewhere + 1,
        },
    ];
    let mut at_the_end = FrameTable::new(&processes);
    at_the_end.resolve(sampled);

    // Sorted on one thread, named on another (see `ReadAhead`).
    let code = FrameTable::new(&processes).sort([sampled[0]]);
    assert_eq!(code.files.len(), 1);
    let cache = SymbolCache::new(true);
    let mut known = KnownFrames::default();
    let hidden = indicatif::ProgressBar::hidden();
    known.name(code, Some(&cache), FrameAddresses::Runtime, &hidden);
    let mut read_ahead =
        FrameTable::with_known(&processes, Some(&cache), FrameAddresses::Runtime, known);
    assert!(read_ahead.sort([sampled[0]]).is_empty());
    read_ahead.resolve(sampled);
    for address in sampled {
        let expected = &at_the_end.known.frames[at_the_end.frame(address) as usize];
        let named = &read_ahead.known.frames[read_ahead.frame(address) as usize];
        assert_eq!(named, expected);
        assert!(
            named
                .function
                .as_deref()
                .is_some_and(|name| name.ends_with("code_read_then")),
            "{named:?}"
        );
        assert_eq!(named.function_address, Some(address.address - 1));
    }
}

/// The same code mapped by two processes at different addresses: one frame, at its file
/// offset, where frames carry file offsets (the agent's windows); a frame per process where
/// they carry runtime addresses (a recording's reports).
#[cfg(test)]
#[test]
fn file_offsets_make_the_same_code_in_two_processes_one_frame() {
    let function = file_offsets_make_the_same_code_in_two_processes_one_frame as *const () as u64;
    let text = own_mapping_of(function);
    let mut processes = ProcessTable::default();
    // Process 10 maps it where this test runs, process 11 64 MiB higher; their vDSOs at
    // 0x7f0000000000 and 0x7f1000000000.
    let elsewhere = 64 << 20;
    map_own_text(&mut processes, &text, &[(10, 0), (11, elsewhere)]);
    let vdso_at = |pid: u64| 0x7f00_0000_0000 + (pid - 10) * 0x10_0000_0000;
    for pid in [10, 11] {
        processes.map(
            pid,
            Mapping {
                start: vdso_at(u64::from(pid)),
                end: vdso_at(u64::from(pid)) + 0x2000,
                file_offset: 0,
                path: vdso::VDSO.into(),
                executable: true,
                build_id: None,
                file: None,
            },
        );
    }
    let sampled = [
        CodeAddress {
            pid: 10,
            address: function,
        },
        CodeAddress {
            pid: 11,
            address: function + elsewhere,
        },
    ];
    let in_vdso = [10, 11].map(|pid| CodeAddress {
        pid,
        address: vdso_at(u64::from(pid)) + 0x100,
    });
    let offset = function - text.start + text.file_offset;

    let mut table = FrameTable::with_cache(&processes, None, FrameAddresses::FileOffsets);
    table.resolve(sampled.into_iter().chain(in_vdso));
    let (first, second) = (table.frame(sampled[0]), table.frame(sampled[1]));
    assert_eq!(first, second);
    assert_eq!(table.frame(in_vdso[0]), table.frame(in_vdso[1]));
    assert_eq!(
        table.known.frames[table.frame(in_vdso[0]) as usize].address,
        0x100
    );
    let frame = &table.known.frames[first as usize];
    assert!(
        frame
            .function
            .as_deref()
            .is_some_and(|name| name.ends_with("the_same_code_in_two_processes_one_frame")),
        "{frame:?}"
    );
    assert_eq!((frame.address, frame.module_offset), (offset, offset));
    assert_eq!(frame.function_address, Some(offset));

    let mut table = FrameTable::with_cache(&processes, None, FrameAddresses::Runtime);
    table.resolve(sampled.into_iter().chain(in_vdso));
    let (first, second) = (table.frame(sampled[0]), table.frame(sampled[1]));
    assert_ne!(first, second);
    assert_ne!(table.frame(in_vdso[0]), table.frame(in_vdso[1]));
    assert_eq!(table.known.frames[first as usize].address, function);
    assert_eq!(
        table.known.frames[second as usize].address,
        function + elsewhere
    );
    assert_eq!(
        table.known.frames[second as usize].function_address,
        Some(function + elsewhere)
    );
}

/// A kernel-space value in a user stack (a frame-pointer walk through a frame without one) is
/// an unnamed frame of no module, not a kernel function.
#[cfg(test)]
#[test]
fn kernel_addresses_are_kernel_frames_only_outside_user_stacks() {
    let processes = ProcessTable::default();
    let mut table = FrameTable::new(&processes);
    let (kernel, in_user_stack) = (
        CodeAddress {
            pid: 0,
            address: 0xffff_ffff_8100_0000,
        },
        CodeAddress {
            pid: 10,
            address: 0xffff_ffff_8100_0000,
        },
    );
    table.resolve([kernel, in_user_stack]);
    let frame = |address| &table.known.frames[table.frame(address) as usize];
    assert!(frame(kernel).kernel);
    assert_eq!(frame(kernel).module, "[kernel.kallsyms]");
    let garbage = frame(in_user_stack);
    assert!(!garbage.kernel);
    assert!(
        garbage.module.is_empty() && garbage.function.is_none(),
        "{garbage:?}"
    );
    assert_eq!(garbage.address, 0xffff_ffff_8100_0000);
}
