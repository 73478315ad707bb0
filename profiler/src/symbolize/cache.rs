//! What the agent keeps from one window's symbolization to the next. A window's profile holds
//! its own frames, but the code it samples is mostly the code the last window sampled: without
//! this, every window symbolized every address again (blazesym's lookups, PLT stubs and alias
//! tables read anew), about half of the agent's steady CPU time under process churn.

use std::{
    cell::{Ref, RefCell},
    collections::{HashMap, HashSet},
    fs::File,
    path::{Path, PathBuf},
    sync::{Arc, Weak},
};

use blazesym::symbolize::{
    evict::{self, Evict},
    Symbolizer,
};

use super::{fill_from_elf, function_start, kallsyms::KernelSymbols, module_names, new_symbolizer};
use crate::{
    process::FileIdentity,
    profile::{Frame, FunctionAliases, InlinedFrame},
};

/// The symbolizer (its parsed files), the kernel's functions, and each open module's
/// symbolized code, by file and file offset.
pub struct SymbolCache {
    symbolizer: RefCell<Symbolizer>,
    /// Whether lines and inlined functions are read from DWARF.
    source_lines: bool,
    /// Read at the first kernel frame.
    /// Replaced by /proc/kallsyms read whole when a window has an address it does not cover.
    kernel: RefCell<Option<KernelSymbols>>,
    modules: RefCell<HashMap<FileIdentity, ModuleSymbols>>,
    /// Whether the functions' other names are looked up ([`SymbolCache::without_aliases`]).
    aliases: bool,
}

#[derive(Default)]
struct ModuleSymbols {
    /// The open file this was read from. While anyone holds it open (the side-band, for the
    /// processes that map it), its inode names no other file, and what was read stays true.
    file: Weak<File>,
    /// The descriptor path the symbolizer read the module at: what it caches the module's
    /// parsed file under. Empty once the file closed (the parse is evicted then).
    path: PathBuf,
    /// The module's build ID (hex): a file opened again under the same identity with the same
    /// build ID is the same code, and what was read from it stays true.
    build_id: Option<String>,
    /// The file had closed at the last [`SymbolCache::forget_closed`]: at the next, the module
    /// goes unless the file was opened again.
    closed: bool,
    by_offset: HashMap<u64, Symbol>,
    /// The module's functions with more than one name, of the code symbolized so far.
    aliases: Vec<Vec<String>>,
    /// The functions (their start's file offset) whose other names were looked up: a new
    /// offset in one of them needs no reading of the module's symbol tables again.
    names_read: HashSet<u64>,
    /// Whether the current window symbolized code of this module.
    sampled: bool,
}

impl ModuleSymbols {
    /// Whether `frame`, symbolized from the module's own symbols, needs the names that only
    /// reading the module's tables gives: a name at all, or (with `aliases`) its function's
    /// other names.
    fn needs_names(&self, frame: &Frame, aliases: bool) -> bool {
        match function_start(frame) {
            None => true,
            Some(start) => aliases && !self.names_read.contains(&start),
        }
    }
}

/// What symbolizing a file offset says, apart from where the module is mapped.
struct Symbol {
    function: Option<String>,
    /// How far into `function` the offset is.
    into_function: Option<u64>,
    file: Option<String>,
    line: Option<u32>,
    inlined: Vec<InlinedFrame>,
}

impl Symbol {
    fn of(frame: &Frame) -> Symbol {
        Symbol {
            function: frame.function.clone(),
            into_function: frame
                .function_address
                .and_then(|start| frame.address.checked_sub(start)),
            file: frame.file.clone(),
            line: frame.line,
            inlined: frame.inlined.clone(),
        }
    }

    fn fill(&self, frame: &mut Frame) {
        frame.function = self.function.clone();
        frame.function_address = self
            .into_function
            .and_then(|into| frame.address.checked_sub(into));
        frame.file = self.file.clone();
        frame.line = self.line;
        frame.inlined = self.inlined.clone();
    }
}

impl SymbolCache {
    /// With `source_lines`, frames get their source lines and inlined functions from DWARF
    /// (parsed once per file and kept: tens of MB for a large program or glibc's debug file);
    /// without, functions from symbol tables.
    pub fn new(source_lines: bool) -> SymbolCache {
        SymbolCache {
            symbolizer: RefCell::new(new_symbolizer()),
            source_lines,
            kernel: RefCell::default(),
            modules: RefCell::default(),
            aliases: true,
        }
    }

    /// A cache that looks up no other names of the functions: the agent's exports carry none,
    /// and under churn each window's functions not named before had the module's symbol tables
    /// read again for them (5% of the agent's CPU at 99 Hz under the bench's churn, in a perf
    /// profile of it). A frame the module's own symbols leave unnamed is still named from its
    /// PLT stubs or its debug file.
    pub fn without_aliases(self) -> SymbolCache {
        SymbolCache {
            aliases: false,
            ..self
        }
    }

    /// The symbolizer, for other reads of the modules it parsed (a recording's code lines).
    pub fn symbolizer(&self) -> Ref<'_, Symbolizer> {
        self.symbolizer.borrow()
    }

    /// The kernel's functions, enough to name `addresses`.
    pub fn kernel_symbols(&self, addresses: &[u64]) -> Ref<'_, KernelSymbols> {
        let covered = self
            .kernel
            .borrow()
            .as_ref()
            .is_some_and(|symbols| addresses.iter().all(|&address| symbols.covers(address)));
        if !covered {
            *self.kernel.borrow_mut() = Some(KernelSymbols::of_running_kernel(addresses));
        }
        Ref::map(self.kernel.borrow(), |symbols| {
            symbols.as_ref().expect("filled above")
        })
    }

    /// Symbolizes `frames` of the module `identity`, the open `file`, read at `path`: offsets
    /// seen before from the cache, the others from the file. Returns the other names of the
    /// functions they are in.
    pub fn fill(
        &self,
        identity: FileIdentity,
        file: &Arc<File>,
        path: &Path,
        frames: &mut [Frame],
    ) -> Vec<FunctionAliases> {
        let mut modules = self.modules.borrow_mut();
        let module = modules.entry(identity).or_default();
        // Another open of the identity: the file it was read from closed in between, and its
        // inode may name another file now, unless the build ID says it is the same code (the
        // same program started again, under churn every few hundred milliseconds).
        if !std::ptr::eq(module.file.as_ptr(), Arc::as_ptr(file)) {
            if !module.path.as_os_str().is_empty() {
                let parse = Evict::Elf(evict::Elf::new(&module.path));
                let _ = self.symbolizer.borrow_mut().evict(&parse);
            }
            let build_id = frames.first().and_then(|frame| frame.build_id.clone());
            if build_id.is_some() && module.build_id == build_id {
                module.file = Arc::downgrade(file);
                module.path = PathBuf::new();
                module.closed = false;
            } else {
                *module = ModuleSymbols {
                    file: Arc::downgrade(file),
                    build_id,
                    ..ModuleSymbols::default()
                };
            }
        }
        if module.path != path {
            module.path = path.to_path_buf();
        }
        module.sampled = true;
        let mut missed = Vec::new();
        for (index, frame) in frames.iter_mut().enumerate() {
            match module.by_offset.get(&frame.module_offset) {
                Some(symbol) => symbol.fill(frame),
                None => missed.push(index),
            }
        }
        if !missed.is_empty() {
            let mut new: Vec<Frame> = missed.iter().map(|&index| frames[index].clone()).collect();
            fill_from_elf(&self.symbolizer(), path, self.source_lines, &mut new);
            // Under churn most new offsets are in functions seen before: the module's tables
            // are read only for the others.
            let needing_tables: Vec<usize> = (0..new.len())
                .filter(|&index| module.needs_names(&new[index], self.aliases))
                .collect();
            if !needing_tables.is_empty() {
                let mut naming: Vec<Frame> =
                    needing_tables.iter().map(|&i| new[i].clone()).collect();
                for names in module_names(path, &mut naming, self.aliases) {
                    if !module.aliases.contains(&names.names) {
                        module.aliases.push(names.names);
                    }
                }
                for (index, frame) in needing_tables.into_iter().zip(naming) {
                    module.names_read.extend(function_start(&frame));
                    new[index] = frame;
                }
            }
            for (index, frame) in missed.into_iter().zip(new) {
                module
                    .by_offset
                    .insert(frame.module_offset, Symbol::of(&frame));
                frames[index] = frame;
            }
        }
        let functions: HashSet<&str> = frames
            .iter()
            .filter_map(|frame| frame.function.as_deref())
            .collect();
        let Some(first) = frames.first() else {
            return Vec::new();
        };
        module
            .aliases
            .iter()
            .filter(|names| names.iter().any(|name| functions.contains(name.as_str())))
            .map(|names| FunctionAliases {
                module: first.module.clone(),
                names: names.clone(),
            })
            .collect()
    }

    /// Forgets the modules whose files closed: nothing holds them open any more (the
    /// side-band closes a file once no process maps it). The symbolizer's parse of it goes at
    /// once: the symbolizer keeps every file a path ever named (and a descriptor to each), and
    /// descriptor paths are reused for other files, so without this the agent grew by every
    /// distinct executable it ever symbolized. What was read from it stays until the next
    /// call, for the same code opened again (see [`SymbolCache::fill`]); a module without a
    /// build ID goes at once, since its inode may name another file. A module a window did not
    /// sample stays while its file is open: forgetting it with the window re-read its tables at
    /// its next samples.
    pub fn forget_closed(&mut self) {
        let mut closed = Vec::new();
        self.modules.get_mut().retain(|_, module| {
            if module.file.strong_count() > 0 {
                return true;
            }
            if !module.path.as_os_str().is_empty() {
                closed.push(std::mem::take(&mut module.path));
            }
            let keep = module.build_id.is_some() && !module.closed;
            module.closed = true;
            keep
        });
        evict_parses(self.symbolizer.get_mut(), closed);
    }

    /// Forgets the modules the current window did not sample, and the symbolizer's parse of
    /// each: over the agent's memory budget, symbols of code that stopped running go first.
    /// They are read again at the module's next sample. Returns how many went.
    pub fn forget_unsampled(&mut self) -> usize {
        let mut parses = Vec::new();
        self.modules.get_mut().retain(|_, module| {
            if module.sampled {
                return true;
            }
            parses.push(std::mem::take(&mut module.path));
            false
        });
        let forgotten = parses.len();
        parses.retain(|path| !path.as_os_str().is_empty());
        evict_parses(self.symbolizer.get_mut(), parses);
        forgotten
    }

    /// Starts a window: no module is sampled in it yet, and the modules whose debug files
    /// debuginfod delivered since the last window are forgotten, to be named from them.
    pub fn start_window(&mut self) {
        self.forget_build_ids(&super::debuginfod::arrived());
        for module in self.modules.get_mut().values_mut() {
            module.sampled = false;
        }
    }

    fn forget_build_ids(&mut self, build_ids: &[String]) {
        if build_ids.is_empty() {
            return;
        }
        let mut parses = Vec::new();
        self.modules.get_mut().retain(|_, module| {
            let named_again = module
                .build_id
                .as_ref()
                .is_some_and(|build_id| build_ids.contains(build_id));
            if named_again {
                parses.push(std::mem::take(&mut module.path));
            }
            !named_again
        });
        parses.retain(|path| !path.as_os_str().is_empty());
        evict_parses(self.symbolizer.get_mut(), parses);
    }

    /// Modules whose symbols are held.
    pub fn modules(&self) -> usize {
        self.modules.borrow().len()
    }

    #[cfg(test)]
    fn cached_offsets(&self, identity: FileIdentity) -> usize {
        self.modules
            .borrow()
            .get(&identity)
            .map_or(0, |module| module.by_offset.len())
    }
}

/// Drops the symbolizer's parse of the files at `paths`. A path may name a module still held by
/// now (a reused descriptor): its parse is read again at its next frame. Evicting what is not
/// cached is no error.
fn evict_parses(symbolizer: &mut Symbolizer, paths: Vec<PathBuf>) {
    for path in paths {
        let _ = symbolizer.evict(&Evict::Elf(evict::Elf::new(path)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary's own function, at a file offset as the side-band would give it.
    fn frame_of_this_test(at: u64) -> (std::path::PathBuf, Frame) {
        let exe = std::env::current_exe().unwrap();
        let frame = Frame {
            address: at,
            module: exe.to_string_lossy().into_owned(),
            module_offset: at,
            ..Frame::default()
        };
        (exe, frame)
    }

    #[test]
    fn an_offset_symbolized_once_is_filled_from_the_cache_at_any_load_address() {
        let cache = SymbolCache::new(true);
        let address = an_offset_symbolized_once_is_filled_from_the_cache_at_any_load_address
            as *const () as u64;
        let (exe, mut first) = frame_of_this_test(file_offset_of(address));
        first.address = address;
        let identity = (1, 2);
        let file = Arc::new(File::open(&exe).unwrap());
        let mut frames = [first.clone()];
        cache.fill(identity, &file, &exe, &mut frames);
        let symbolized = frames[0].clone();
        assert!(
            symbolized
                .function
                .as_deref()
                .is_some_and(|name| name.contains("at_any_load_address")),
            "{symbolized:?}"
        );
        assert_eq!(symbolized.function_address, Some(address));
        assert_eq!(cache.cached_offsets(identity), 1);
        // Another process maps the module elsewhere: the same offset, from the cache, with the
        // function's start moved along; a path that opens nothing proves no file was read.
        let mut elsewhere = first.clone();
        elsewhere.address += 0x10_0000;
        let mut frames = [elsewhere];
        cache.fill(identity, &file, Path::new("/nonexistent"), &mut frames);
        assert_eq!(frames[0].function, symbolized.function);
        assert_eq!(frames[0].function_address, Some(address + 0x10_0000));
        assert_eq!(frames[0].line, symbolized.line);
    }

    #[test]
    fn modules_are_kept_while_their_files_are_open_and_forgotten_with_the_parse_once_closed() {
        let dir = tempfile::tempdir().unwrap();
        let module = module_of_this_test(dir.path());
        let descriptors_on_module = || descriptors_on(&module);
        let mut cache = SymbolCache::new(false);
        let frame = Frame {
            module_offset: 0x1000,
            ..Frame::default()
        };
        let file = Arc::new(File::open(&module).unwrap());
        cache.fill((1, 2), &file, &module, &mut [frame.clone()]);
        assert_eq!(cache.cached_offsets((1, 2)), 1);
        assert_eq!(descriptors_on_module(), 2);
        // Open elsewhere (the side-band's table), if not in this window: kept.
        cache.forget_closed();
        assert_eq!(cache.cached_offsets((1, 2)), 1);
        assert_eq!(descriptors_on_module(), 2);
        // The identity opened again (its file closed in between): read anew.
        let reopened = Arc::new(File::open(&module).unwrap());
        cache.fill((1, 2), &reopened, Path::new("/nonexistent"), &mut [frame]);
        assert_eq!(cache.cached_offsets((1, 2)), 1);
        drop(file);
        assert_eq!(descriptors_on_module(), 1);
        drop(reopened);
        cache.forget_closed();
        assert_eq!(cache.cached_offsets((1, 2)), 0);
        assert_eq!(descriptors_on_module(), 0);
    }

    #[test]
    fn a_closed_module_is_kept_one_more_window_for_the_same_build_id_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let module = module_of_this_test(dir.path());
        let descriptors_on_module = || descriptors_on(&module);
        let mut cache = SymbolCache::new(false);
        let frame = |build_id: &str| Frame {
            module_offset: 0x1000,
            build_id: Some(build_id.to_string()),
            ..Frame::default()
        };
        let file = Arc::new(File::open(&module).unwrap());
        cache.fill((1, 2), &file, &module, &mut [frame("ab")]);
        drop(file);
        // Closed: the symbolizer's parse (and its descriptor) goes at once, what was read stays.
        cache.forget_closed();
        assert_eq!(descriptors_on_module(), 0);
        assert_eq!(cache.cached_offsets((1, 2)), 1);
        // Opened again with the same build ID: served from the cache, no file read.
        let reopened = Arc::new(File::open("/dev/null").unwrap());
        let mut frames = [frame("ab")];
        cache.fill((1, 2), &reopened, Path::new("/nonexistent"), &mut frames);
        assert_eq!(cache.cached_offsets((1, 2)), 1);
        // Open again: kept however many windows pass.
        cache.forget_closed();
        cache.forget_closed();
        assert_eq!(cache.cached_offsets((1, 2)), 1);
        drop(reopened);
        cache.forget_closed();
        assert_eq!(cache.cached_offsets((1, 2)), 1, "one more window");
        cache.forget_closed();
        assert_eq!(cache.cached_offsets((1, 2)), 0, "then forgotten");
        // Another build ID under the identity: read anew.
        let file = Arc::new(File::open(&module).unwrap());
        cache.fill((1, 2), &file, &module, &mut [frame("ab")]);
        drop(file);
        cache.forget_closed();
        let other = Arc::new(File::open(&module).unwrap());
        cache.fill(
            (1, 2),
            &other,
            Path::new("/nonexistent"),
            &mut [frame("cd")],
        );
        assert_eq!(cache.cached_offsets((1, 2)), 1);
        assert_eq!(
            cache.modules.borrow()[&(1, 2)].build_id.as_deref(),
            Some("cd")
        );
    }

    /// glibc's `malloc` is also `__libc_malloc`: a recording's cache says so, the agent's
    /// looks no other names up, and both name the function.
    #[test]
    fn a_cache_without_aliases_names_functions_and_looks_up_no_other_names() {
        let address = libc::malloc as *const () as u64;
        let libc = crate::symbolize::own_mapping_of(address);
        let frame = Frame {
            address,
            module: libc.path.to_string(),
            module_offset: address - libc.start + libc.file_offset,
            ..Frame::default()
        };
        let path = Path::new(&*libc.path);
        let file = Arc::new(File::open(path).unwrap());
        let named = |cache: &SymbolCache| {
            let mut frames = [frame.clone()];
            let aliases = cache.fill((1, 2), &file, path, &mut frames);
            let [frame] = frames;
            (frame.function, aliases)
        };
        let (function, aliases) = named(&SymbolCache::new(false));
        let malloc = ["__libc_malloc", "malloc"].map(String::from);
        assert!(
            aliases
                .iter()
                .any(|names| malloc.iter().all(|name| names.names.contains(name))),
            "{aliases:?}"
        );
        let (agents, none) = named(&SymbolCache::new(false).without_aliases());
        assert!(none.is_empty(), "{none:?}");
        assert_eq!(agents, function);
        assert!(function.is_some_and(|name| malloc.contains(&name)));
    }

    /// A module file of this test's own in `dir`: the descriptors open on it are the test's
    /// and the symbolizer's.
    fn module_of_this_test(dir: &Path) -> PathBuf {
        let module = dir.join("module");
        std::fs::copy("/bin/true", &module).unwrap();
        module
    }

    /// How many descriptors this process holds open on `file`.
    fn descriptors_on(file: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| target == file)
            .count()
    }

    /// The file offset of one of the test binary's addresses, from /proc/self/maps.
    #[test]
    fn over_the_budget_modules_a_window_did_not_sample_are_forgotten() {
        let mut cache = SymbolCache::new(false);
        let address =
            over_the_budget_modules_a_window_did_not_sample_are_forgotten as *const () as u64;
        let (exe, mut frame) = frame_of_this_test(file_offset_of(address));
        frame.address = address;
        let file = Arc::new(File::open(&exe).unwrap());
        let (sampled, idle) = ((1, 2), (1, 3));
        for identity in [sampled, idle] {
            cache.fill(identity, &file, &exe, &mut [frame.clone()]);
        }
        // Both were sampled in this window: nothing goes.
        assert_eq!(cache.forget_unsampled(), 0);
        assert_eq!(cache.modules(), 2);
        // The next window samples one of them.
        cache.start_window();
        cache.fill(sampled, &file, &exe, &mut [frame.clone()]);
        assert_eq!(cache.forget_unsampled(), 1);
        assert_eq!(
            (cache.cached_offsets(sampled), cache.cached_offsets(idle)),
            (1, 0)
        );
        // The one forgotten is read again at its next sample.
        cache.start_window();
        let mut frames = [frame];
        cache.fill(idle, &file, &exe, &mut frames);
        assert!(
            frames[0]
                .function
                .as_deref()
                .is_some_and(|name| name.contains("did_not_sample_are_forgotten")),
            "{:?}",
            frames[0]
        );
    }

    fn file_offset_of(address: u64) -> u64 {
        let mapping = crate::symbolize::own_mapping_of(address);
        address - mapping.start + mapping.file_offset
    }
}
