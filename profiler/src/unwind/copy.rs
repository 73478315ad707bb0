//! The copy unwinder: a thread's user frames from the user registers and a copy of its user
//! stack taken by the kernel at the sample, walked in the agent with framehop (samply's
//! unwinder) over each module's `.eh_frame`/`.eh_frame_hdr`/`.debug_frame` and `.text`, with
//! frame pointers where a module has no unwind information. Modules are read only through the
//! descriptors the process table opened while the processes lived, each file once per run; a
//! process's module list is rebuilt only when its executable mappings change.

use std::{
    collections::{hash_map::DefaultHasher, HashMap},
    hash::{Hash, Hasher},
    ops::Range,
    sync::Arc,
};

use framehop::{Error as WalkError, ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSection, ObjectSegment};
use profiler_common::capture::LossKind;

use crate::process::vdso::{self, VDSO};
use crate::process::{FileIdentity, Mapping, ProcessTable};

/// Most frames a walk produces: deeper stacks end as [`StackEnd::TooDeep`].
pub const MAX_FRAMES: usize = profiler_common::stack::MAX_STACK_DEPTH;

/// The user registers the walk starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegisters {
    pub ip: u64,
    pub sp: u64,
    /// The frame pointer (x86-64's rbp, aarch64's x29).
    pub fp: u64,
    /// aarch64's link register (x30), the return address of a frame that has not saved it yet;
    /// unused on x86-64.
    pub link: u64,
}

/// framehop's walker for the machine's architecture: the stacks are copied from its processes.
/// framehop does not unwind through signal frames (their call-frame information is made of
/// DWARF expressions), so the walk recognises a return into the C library's or the vDSO's
/// signal-return trampoline by its code, and restores the interrupted context the kernel saved
/// on the stack (as libgcc's and LLVM's libunwind do).
#[cfg(target_arch = "x86_64")]
mod native {
    use framehop::x86_64::UnwindRegsX86_64 as Registers;
    pub use framehop::x86_64::{CacheX86_64 as Cache, UnwinderX86_64 as ArchUnwinder};

    pub fn registers(user: &super::UserRegisters) -> Registers {
        Registers::new(user.ip, user.sp, user.fp)
    }

    /// `__restore_rt`: `mov $15, %rax` (rt_sigreturn); `syscall`.
    pub const SIGNAL_RETURN_CODE: &[u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

    /// The interrupted context, from the signal frame at the stack pointer of a return into the
    /// trampoline (the `ucontext` follows the popped return address): its instruction pointer
    /// and registers. The `sigcontext` is 40 bytes in; rbp, rsp and rip are its 11th, 16th
    /// and 17th words.
    pub fn interrupted_context(
        regs: &Registers,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Result<(u64, Registers), ()> {
        let context = regs.sp().checked_add(40).ok_or(())?;
        let [fp, sp, ip] = super::saved_words(read, context, [10, 15, 16])?;
        Ok((ip, Registers::new(ip, sp, fp)))
    }
}
#[cfg(target_arch = "aarch64")]
mod native {
    use framehop::aarch64::UnwindRegsAarch64 as Registers;
    pub use framehop::aarch64::{CacheAarch64 as Cache, UnwinderAarch64 as ArchUnwinder};

    pub fn registers(user: &super::UserRegisters) -> Registers {
        Registers::new(user.link, user.sp, user.fp)
    }

    /// The vDSO's `__kernel_rt_sigreturn`: `mov x8, #139` (rt_sigreturn); `svc #0`.
    pub const SIGNAL_RETURN_CODE: &[u8] = &[0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];

    /// The interrupted context, from the signal frame at the stack pointer of a return into the
    /// trampoline: `siginfo` (128 bytes), then the `ucontext`, whose `sigcontext` starts 176
    /// bytes in with the fault address, x0 to x30, sp and pc.
    pub fn interrupted_context(
        regs: &Registers,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Result<(u64, Registers), ()> {
        let context = regs.sp().checked_add(128 + 176 + 8).ok_or(())?;
        let [fp, link, sp, pc] = super::saved_words(read, context, [29, 30, 31, 32])?;
        Ok((pc, Registers::new(link, sp, fp)))
    }
}

/// The words at `indices` of the array of saved registers at `base`, read from the stack copy.
fn saved_words<const N: usize>(
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
    base: u64,
    indices: [u64; N],
) -> Result<[u64; N], ()> {
    let mut words = [0; N];
    for (word, index) in words.iter_mut().zip(indices) {
        *word = read(base.checked_add(8 * index).ok_or(())?)?;
    }
    Ok(words)
}

/// User stack bytes as the kernel copied them: `bytes` were at `start` in the thread's memory.
#[derive(Clone, Copy, Debug)]
pub struct StackCopy<'a> {
    pub start: u64,
    pub bytes: &'a [u8],
}

impl StackCopy<'_> {
    /// The word at `address`, if the copy holds all of it.
    fn word(&self, address: u64) -> Option<u64> {
        let offset = usize::try_from(address.checked_sub(self.start)?).ok()?;
        let bytes = self.bytes.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

/// Why a walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StackEnd {
    /// A function with no caller (`_start`, a thread start: their unwind information says the
    /// return address is undefined, or the frame chain ends in a null return address), or a
    /// return into a module's entry point (the dynamic loader's `_start`, whose assembly has no
    /// unwind information, calling its start-up code).
    Root,
    /// The next return address lies past the copied stack bytes.
    CopyTooSmall,
    /// The next return address is in no executable mapping of the process: garbage read as a
    /// return address, or code the agent never saw mapped. It is not kept.
    OutsideCode,
    /// The unwind rules led nowhere: the stack pointer did not advance or moved backwards.
    Broken,
    /// The walk reached [`MAX_FRAMES`].
    TooDeep,
}

impl StackEnd {
    /// The loss a walk that ended so counts as: none when it reached its root.
    pub const fn loss(self) -> Option<LossKind> {
        match self {
            StackEnd::Root => None,
            StackEnd::CopyTooSmall => Some(LossKind::UnwindCopyTooSmall),
            StackEnd::OutsideCode => Some(LossKind::UnwindOutsideCode),
            StackEnd::Broken => Some(LossKind::UnwindBroken),
            StackEnd::TooDeep => Some(LossKind::UnwindTooDeep),
        }
    }
}

/// A walked stack: the sampled instruction first, then return addresses, innermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwoundStack {
    pub frames: Vec<u64>,
    pub end: StackEnd,
}

/// A module's unwind sections, read once per run and shared by every process that maps it.
struct ModuleSections {
    /// Loadable segments as (file offset, address): where a mapping of the file puts it.
    segments: Vec<(Range<u64>, u64)>,
    /// The ELF entry point's address.
    entry: u64,
    /// Addresses of signal-return trampolines in its code.
    signal_returns: Vec<u64>,
    info: ExplicitModuleSectionInfo<Arc<[u8]>>,
}

/// The addresses in `text` (at `text_address`) where the signal-return code starts.
fn signal_returns(text: &[u8], text_address: u64) -> Vec<u64> {
    let code = native::SIGNAL_RETURN_CODE;
    text.windows(code.len())
        .enumerate()
        .filter(|(_, bytes)| *bytes == code)
        .map(|(offset, _)| text_address + offset as u64)
        .collect()
}

impl ModuleSections {
    fn read<'a>(image: impl object::ReadRef<'a>) -> Option<ModuleSections> {
        let file = object::File::parse(image).ok()?;
        let segments = file
            .segments()
            .map(|segment| {
                let (offset, size) = segment.file_range();
                (offset..offset.saturating_add(size), segment.address())
            })
            .collect();
        let section = |name: &str| file.section_by_name(name);
        let range = |name: &str| {
            section(name).map(|section| section.address()..section.address() + section.size())
        };
        // Compressed sections (`.debug_frame` of some debug builds) are left out: object reads
        // them only with its compression support, which nothing else here needs.
        let data = |name: &str| -> Option<Arc<[u8]>> {
            let bytes = section(name)?.data().ok()?;
            (!bytes.is_empty()).then(|| Arc::from(bytes))
        };
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: range(".text"),
            text: data(".text"),
            got_svma: range(".got"),
            eh_frame_svma: range(".eh_frame"),
            eh_frame: data(".eh_frame"),
            eh_frame_hdr_svma: range(".eh_frame_hdr"),
            eh_frame_hdr: data(".eh_frame_hdr"),
            debug_frame: data(".debug_frame"),
            ..ExplicitModuleSectionInfo::default()
        };
        let signal_returns = match (&info.text, &info.text_svma) {
            (Some(text), Some(address)) => signal_returns(text, address.start),
            _ => Vec::new(),
        };
        Some(ModuleSections {
            segments,
            entry: file.entry(),
            signal_returns,
            info,
        })
    }

    /// The address the file's address 0 has in a process that mapped it as `mapping`.
    fn base_address(&self, mapping: &Mapping) -> Option<u64> {
        const PAGE: u64 = 4096;
        // Segments can share a page (text starting in the page where read-only data ends):
        // the mapping is of the last one that starts at or before its first page.
        let (offsets, address) = self
            .segments
            .iter()
            .filter(|(offsets, _)| {
                offsets.start & !(PAGE - 1) <= mapping.file_offset
                    && mapping.file_offset < offsets.end
            })
            .max_by_key(|(offsets, _)| offsets.start)?;
        // The mapping's first byte is file offset `file_offset`, at file address
        // `address + (file_offset - offsets.start)`.
        Some(
            mapping
                .start
                .wrapping_sub(*address)
                .wrapping_add(offsets.start)
                .wrapping_sub(mapping.file_offset),
        )
    }
}

/// One process's modules as framehop sees them, for the executable mappings it had.
struct ProcessModules {
    /// Identifies the mappings these modules were built from (see [`fingerprint`]).
    fingerprint: u64,
    unwinder: native::ArchUnwinder<Arc<[u8]>>,
    /// Every executable mapping (with or without a file): return addresses must be in one.
    code: Vec<Range<u64>>,
    /// The first bytes of each module's entry point: a return there ends the stack.
    entries: Vec<Range<u64>>,
    /// Where the signal-return trampolines are: a return there resumes an interrupted context.
    signal_returns: Vec<u64>,
}

impl ProcessModules {
    fn is_signal_return(&self, address: u64) -> bool {
        self.signal_returns.contains(&address)
    }

    fn holds_code(&self, address: u64) -> bool {
        self.code.iter().any(|range| range.contains(&address))
    }

    fn is_entry_point(&self, address: u64) -> bool {
        self.entries.iter().any(|range| range.contains(&address))
    }
}

/// Walks copied user stacks; keeps what it read of modules and processes for the whole run.
pub struct CopyUnwinder {
    files: HashMap<FileIdentity, Option<Arc<ModuleSections>>>,
    /// The `[vdso]` every process maps: the kernel's one image, read from this process's copy,
    /// and its length (a perf.data file from another kernel maps another image).
    vdso: Option<Arc<ModuleSections>>,
    vdso_bytes: u64,
    processes: HashMap<u32, ProcessModules>,
    cache: native::Cache,
}

impl Default for CopyUnwinder {
    fn default() -> Self {
        let vdso_image = vdso::own_image();
        CopyUnwinder {
            files: HashMap::new(),
            vdso: vdso_image.and_then(ModuleSections::read).map(Arc::new),
            vdso_bytes: vdso_image.map_or(0, |image| image.len() as u64),
            processes: HashMap::new(),
            cache: native::Cache::new(),
        }
    }
}

/// The executable mappings that apply now: a later mapping of a range supersedes an earlier one.
fn executable_mappings(table: &ProcessTable, pid: u32) -> Vec<&Mapping> {
    let mut kept: Vec<&Mapping> = Vec::new();
    let Some(process) = table.processes.get(&pid) else {
        return kept;
    };
    for mapping in process.mappings.iter().rev() {
        let hidden = kept
            .iter()
            .any(|newer| newer.start < mapping.end && mapping.start < newer.end);
        if !hidden {
            kept.push(mapping);
        }
    }
    kept.retain(|mapping| mapping.executable);
    kept
}

/// Identifies a process's mappings as the table holds them, cheaply enough to check on every
/// sample: the list only grows, except at exec, which empties it and maps another program.
fn fingerprint(table: &ProcessTable, pid: u32) -> u64 {
    let mut hasher = DefaultHasher::new();
    if let Some(process) = table.processes.get(&pid) {
        process.mappings.len().hash(&mut hasher);
        if let Some(last) = process.mappings.last() {
            (last.start, last.end, last.file_offset, last.file).hash(&mut hasher);
        }
    }
    hasher.finish()
}

impl CopyUnwinder {
    /// The user frames of a sample of process `pid`, whose modules are in `table`.
    pub fn unwind(
        &mut self,
        table: &ProcessTable,
        pid: u32,
        registers: UserRegisters,
        stack: StackCopy,
    ) -> UnwoundStack {
        self.update_modules(table, pid);
        let modules = &self.processes[&pid];
        let mut read_stack = |address| stack.word(address).ok_or(());
        let mut regs = native::registers(&registers);
        // The first frame is the sampled instruction itself.
        let mut frame = FrameAddress::InstructionPointer(registers.ip);
        let mut frames = vec![registers.ip];
        let end = loop {
            // The last frame returns into an entry point: nothing called it (the walk past it
            // would read what the kernel put on the stack at exec).
            if frames.len() > 1 && frames.last().is_some_and(|&at| modules.is_entry_point(at)) {
                break StackEnd::Root;
            }
            if frames.len() >= MAX_FRAMES {
                break StackEnd::TooDeep;
            }
            if let FrameAddress::ReturnAddress(at) = frame {
                if modules.is_signal_return(at.get()) {
                    // The handler returns into the trampoline: the next frame is the
                    // instruction the signal interrupted, in the context saved on the stack.
                    match native::interrupted_context(&regs, &mut read_stack) {
                        Ok((ip, interrupted)) if modules.holds_code(ip) => {
                            (frame, regs) = (FrameAddress::InstructionPointer(ip), interrupted);
                            frames.push(ip);
                            continue;
                        }
                        Ok(_) => break StackEnd::OutsideCode,
                        Err(()) => break StackEnd::CopyTooSmall,
                    }
                }
            }
            let next =
                modules
                    .unwinder
                    .unwind_frame(frame, &mut regs, &mut self.cache, &mut read_stack);
            match next {
                Ok(Some(at)) => match FrameAddress::from_return_address(at) {
                    // A null return address: nothing called it.
                    None => break StackEnd::Root,
                    Some(_) if !modules.holds_code(at) => break StackEnd::OutsideCode,
                    Some(caller) => {
                        frame = caller;
                        frames.push(at);
                    }
                },
                Ok(None) | Err(WalkError::ReturnAddressIsNull) => break StackEnd::Root,
                Err(WalkError::CouldNotReadStack(_)) => break StackEnd::CopyTooSmall,
                Err(
                    WalkError::DidNotAdvance
                    | WalkError::FramepointerUnwindingMovedBackwards
                    | WalkError::IntegerOverflow,
                ) => break StackEnd::Broken,
            }
        };
        UnwoundStack { frames, end }
    }

    /// Builds `pid`'s modules anew when its executable mappings changed since the last walk.
    fn update_modules(&mut self, table: &ProcessTable, pid: u32) {
        let fingerprint = fingerprint(table, pid);
        if self
            .processes
            .get(&pid)
            .is_some_and(|known| known.fingerprint == fingerprint)
        {
            return;
        }
        let mappings = executable_mappings(table, pid);
        let mut unwinder = native::ArchUnwinder::new();
        let mut entries = Vec::new();
        let mut signal_returns = Vec::new();
        for mapping in &mappings {
            let sections = match mapping.file {
                Some(identity) => self.files.entry(identity).or_insert_with(|| {
                    let image = table.files.image(identity)?;
                    ModuleSections::read(&image).map(Arc::new)
                }),
                None if *mapping.path == *VDSO
                    && mapping.end - mapping.start == self.vdso_bytes =>
                {
                    &self.vdso
                }
                None => continue,
            };
            let Some(sections) = sections else {
                continue;
            };
            let Some(base) = sections.base_address(mapping) else {
                continue;
            };
            // A `call` in the entry point's first instructions returns within these bytes.
            const ENTRY_CALL_BYTES: u64 = 16;
            let entry = base.wrapping_add(sections.entry);
            if mapping.contains(entry) {
                entries.push(entry..entry.saturating_add(ENTRY_CALL_BYTES));
            }
            signal_returns.extend(
                sections
                    .signal_returns
                    .iter()
                    .map(|address| base.wrapping_add(*address))
                    .filter(|address| mapping.contains(*address)),
            );
            unwinder.add_module(Module::new(
                mapping.path.to_string(),
                mapping.start..mapping.end,
                base,
                sections.info.clone(),
            ));
        }
        let code = mappings
            .iter()
            .map(|mapping| mapping.start..mapping.end)
            .collect();
        self.processes.insert(
            pid,
            ProcessModules {
                fingerprint,
                unwinder,
                code,
                entries,
                signal_returns,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, file_offset: u64) -> Mapping {
        Mapping {
            start,
            end: start + 0x10000,
            file_offset,
            path: "/lib/libexample.so".into(),
            executable: true,
            build_id: None,
            file: None,
        }
    }

    #[test]
    fn a_module_is_placed_by_the_segment_its_mapping_starts_in() {
        let sections = ModuleSections {
            // Text at file offset 0x1000, address 0x1000; data at file offset 0x5e10 but
            // address 0x6e10 (a page apart, as linkers lay out RELRO).
            segments: vec![
                (0..0x800, 0),
                (0x1000..0x4000, 0x1000),
                (0x5e10..0x6000, 0x6e10),
            ],
            entry: 0,
            signal_returns: Vec::new(),
            info: ExplicitModuleSectionInfo::default(),
        };
        let text = mapping(0x7f00_0000_1000, 0x1000);
        assert_eq!(sections.base_address(&text), Some(0x7f00_0000_0000));
        // A mapping from the page the data segment starts in.
        let data = mapping(0x7f00_0000_6000, 0x5000);
        assert_eq!(sections.base_address(&data), Some(0x7f00_0000_0000));
        assert_eq!(
            sections.base_address(&mapping(0x7f00_0000_9000, 0x9000)),
            None
        );
    }

    #[test]
    fn a_text_segment_sharing_a_page_with_read_only_data_places_its_module() {
        // As rustc's linker lays out a PIE: read-only data ends in the page where text starts,
        // and text sits a page further in memory than in the file.
        let sections = ModuleSections {
            segments: vec![(0..0x1415c, 0), (0x14160..0x562d0, 0x15160)],
            entry: 0,
            signal_returns: Vec::new(),
            info: ExplicitModuleSectionInfo::default(),
        };
        let text = mapping(0x5642_c4cc_a000, 0x14000);
        assert_eq!(
            sections.base_address(&text),
            Some(0x5642_c4cc_a000 - 0x15000)
        );
    }

    #[test]
    fn words_are_read_only_where_the_copy_holds_all_their_bytes() {
        let bytes: Vec<u8> = (0..16).collect();
        let copy = StackCopy {
            start: 0x1000,
            bytes: &bytes,
        };
        assert_eq!(copy.word(0x1000), Some(0x0706_0504_0302_0100));
        assert_eq!(copy.word(0x1008), Some(0x0f0e_0d0c_0b0a_0908));
        assert_eq!(copy.word(0x1009), None, "one byte past the copy");
        assert_eq!(copy.word(0xff8), None, "below the copy");
        assert_eq!(copy.word(u64::MAX - 2), None);
    }

    #[test]
    fn a_return_address_in_no_executable_mapping_ends_the_walk_unkept() {
        let mut unwinder = CopyUnwinder::default();
        // Frame pointers are the fallback without modules: [bp + 8] holds this garbage.
        let stack = [0x11u8; 64];
        let unwound = unwinder.unwind(
            &ProcessTable::default(),
            42,
            UserRegisters {
                ip: 0x401000,
                sp: 0x7ffd_0000_0000,
                fp: 0x7ffd_0000_0010,
                link: 0,
            },
            StackCopy {
                start: 0x7ffd_0000_0000,
                bytes: &stack,
            },
        );
        assert_eq!(unwound.frames, vec![0x401000]);
        assert_eq!(unwound.end, StackEnd::OutsideCode);
    }

    #[test]
    fn the_signal_return_code_is_found_wherever_it_lies_in_the_text() {
        let code = native::SIGNAL_RETURN_CODE;
        let mut text = vec![0x90u8; 64];
        text[5..5 + code.len()].copy_from_slice(code);
        text[40..40 + code.len()].copy_from_slice(code);
        assert_eq!(signal_returns(&text, 0x1000), vec![0x1005, 0x1028]);
        assert_eq!(signal_returns(&text[..20], 0x1000), vec![0x1005]);
        assert!(signal_returns(&text[..8], 0x1000).is_empty());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_interrupted_context_is_read_from_the_ucontext_at_the_stack_pointer() {
        // The kernel's frame at a return into __restore_rt: uc_flags, uc_link, uc_stack (3
        // words), then the sigcontext: r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip.
        let sp = 0x7fff_0000u64;
        let mut words = [0u64; 5 + 17];
        words[5 + 10] = 0x7fff_1230; // rbp
        words[5 + 15] = 0x7fff_1200; // rsp
        words[5 + 16] = 0x40_1234; // rip
        let mut read = |address: u64| {
            let index = usize::try_from((address - sp) / 8).unwrap();
            words.get(index).copied().ok_or(())
        };
        let regs = native::registers(&UserRegisters {
            sp,
            ..UserRegisters::default()
        });
        let (ip, restored) = native::interrupted_context(&regs, &mut read).unwrap();
        assert_eq!(ip, 0x40_1234);
        assert_eq!(
            (restored.ip(), restored.sp(), restored.bp()),
            (0x40_1234, 0x7fff_1200, 0x7fff_1230)
        );
        // A copy that ends before the saved registers.
        let mut short = |address: u64| if address < sp + 64 { Ok(0) } else { Err(()) };
        assert!(native::interrupted_context(&regs, &mut short).is_err());
    }
}
