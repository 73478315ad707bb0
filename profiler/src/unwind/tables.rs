//! Unwind tables: an executable's call-frame information (`.eh_frame`, and `.debug_frame` where
//! present) compiled with gimli into the sorted rows of [`profiler_common::unwind`], which a
//! stack walker looks up by address without interpreting DWARF. Consecutive rows that unwind the
//! same way are merged; addresses no FDE covers get [`CfaRule::NoInfo`] rows and are listed;
//! CFI the rows cannot express becomes [`CfaRule::Unsupported`] or [`SavedAt::Unsupported`] and
//! is counted by pattern.
//!
//! A [`TableCache`] compiles each file once, keyed by its build ID (else the file itself) and
//! the digest of its call-frame information, so that a library mapped by many processes costs
//! one compilation, and keeps the tables on disk across runs ([`crate::disk_cache`]): every
//! count is bounded by the file's size, every row checked, and the whole file by a checksum; a
//! bad file is refused with the reason and recompiled. Compiling holds no more rows than a
//! table may have, and reads no CFI section over 256 MB ([`CompileLimits`]).

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    io::{Read, Write},
    ops::Range,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{anyhow, bail, Context, Result};
use gimli::{
    BaseAddresses, CieOrFde, DebugFrame, EhFrame, Expression, Operation, Reader, Register,
    RegisterRule, UnwindContext, UnwindSection,
};
use object::{Object, ObjectSection, ReadRef, SectionKind};
use profiler_common::unwind::{CfaRule, SavedAt, UnwindRow, MAX_TABLE_ROWS};
use sha2::{Digest, Sha256};

use crate::disk_cache::{start_file, CacheDir, CacheFields, CacheHeader, Checked, StreamBytes};
use crate::input::ModuleImage;

/// x86-64 DWARF register numbers (System V psABI, figure 3.36).
const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RIP: Register = Register(16);
/// Where x86-64's `call` leaves the return address when the CFI gives no rule for it.
const DEFAULT_RA_OFFSET: i16 = -8;

/// CFI a row cannot express, counted per pattern (rows of gimli's table before merging).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Unsupported {
    /// The CFA is relative to a register other than the stack or frame pointer (gcc's DRAP
    /// prologues use r10 for a few instructions).
    CfaRegister = 0,
    /// A CFA expression other than the known PLT and saved-pointer patterns.
    CfaExpression = 1,
    /// A CFA offset beyond 32 bits.
    CfaOffsetRange = 2,
    /// The frame pointer is kept in another register or computed by an expression.
    FpRule = 3,
    /// A frame-pointer offset beyond 16 bits.
    FpOffsetRange = 4,
    /// The return address is in a register or computed by an expression outside a signal
    /// trampoline.
    RaRule = 5,
    /// A return-address offset beyond 16 bits.
    RaOffsetRange = 6,
}

impl Unsupported {
    const ALL: [Unsupported; 7] = [
        Unsupported::CfaRegister,
        Unsupported::CfaExpression,
        Unsupported::CfaOffsetRange,
        Unsupported::FpRule,
        Unsupported::FpOffsetRange,
        Unsupported::RaRule,
        Unsupported::RaOffsetRange,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            Unsupported::CfaRegister => "CFA relative to another register",
            Unsupported::CfaExpression => "other CFA expression",
            Unsupported::CfaOffsetRange => "CFA offset beyond 32 bits",
            Unsupported::FpRule => "frame pointer in a register or expression",
            Unsupported::FpOffsetRange => "frame-pointer offset beyond 16 bits",
            Unsupported::RaRule => "return address in a register or expression",
            Unsupported::RaOffsetRange => "return-address offset beyond 16 bits",
        }
    }

    fn from_u8(value: u8) -> Option<Unsupported> {
        Unsupported::ALL.get(usize::from(value)).copied()
    }
}

/// What compiling a file found, besides its rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// FDEs read from `.eh_frame` and `.debug_frame`.
    pub fdes: u64,
    /// FDEs that start inside an earlier one's range (only their tail is used).
    pub overlapping_fdes: u64,
    /// FDEs gimli could not parse or evaluate: their addresses get no rows, the rest of the
    /// section is still used.
    pub malformed_fdes: u64,
    /// Rows of gimli's tables, before merging.
    pub cfi_rows: u64,
    /// Rows of gimli's tables the format cannot express, per pattern.
    pub unsupported: BTreeMap<Unsupported, u64>,
}

impl CompileStats {
    pub fn unsupported_rows(&self) -> u64 {
        self.unsupported.values().sum()
    }
}

/// `3713 FDEs, 25212 CFI rows; unsupported: 4 (CFA relative to another register), 2 (...)`.
impl std::fmt::Display for CompileStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} FDEs, {} CFI rows", self.fdes, self.cfi_rows)?;
        if self.overlapping_fdes > 0 {
            write!(f, ", {} overlapping FDEs", self.overlapping_fdes)?;
        }
        if self.malformed_fdes > 0 {
            write!(f, ", {} malformed FDEs", self.malformed_fdes)?;
        }
        let mut separator = "; unsupported:";
        for (pattern, count) in &self.unsupported {
            write!(f, "{separator} {count} ({})", pattern.describe())?;
            separator = ",";
        }
        Ok(())
    }
}

/// One file's compiled rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwindTable {
    /// The ELF virtual address that rows' `pc` are offsets from.
    pub base: u64,
    /// Sorted by `pc`, strictly increasing; the last row is [`CfaRule::NoInfo`] and marks the end
    /// of the last FDE.
    pub rows: Vec<UnwindRow>,
    /// Ranges of executable sections (ELF virtual addresses) that no FDE covers.
    pub no_cfi: Vec<Range<u64>>,
    pub stats: CompileStats,
}

impl UnwindTable {
    /// The row for ELF virtual address `address`; `None` outside the table.
    pub fn lookup(&self, address: u64) -> Option<&UnwindRow> {
        let offset = u32::try_from(address.checked_sub(self.base)?).ok()?;
        profiler_common::unwind::find_row(&self.rows, offset)
    }

    /// Bytes the rows take (in a BPF map, in memory, on disk).
    pub fn row_bytes(&self) -> usize {
        self.rows.len() * UnwindRow::SIZE
    }
}

/// One FDE found in a section: its rows are evaluated when its turn comes to be laid out, so
/// that a file's rows are held once, in the table, and not also FDE by FDE (a compiler's
/// 6 MB `.eh_frame` held 100 MB of rows so, the peak of an agent starting on its host).
struct FdeEntry {
    range: Range<u64>,
    /// `.eh_frame` first: where both sections describe an address, it wins.
    from_debug_frame: bool,
    /// Where the FDE is in its section.
    offset: usize,
}

/// Evaluates an FDE's rows into the buffer given (emptied first): `false` when the FDE is
/// malformed (counted), an error when the file has more rows than it may.
type EvaluateFde<'a> = dyn FnMut(&FdeEntry, &mut Vec<(u64, UnwindRow)>, &mut CompileStats) -> Result<bool, TooManyRows>
    + 'a;

/// What compiling one file may take, whatever its sections say: a crafted `.debug_frame` of
/// one-byte rows once held over 1 GiB of rows, and ended the recording, before the table's size
/// was checked. A file over a limit gets no table, and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileLimits {
    /// Bytes of one CFI section read, after decompression (libc's `.eh_frame` is 150 KB).
    pub section_bytes: u64,
    /// Rows held at once while compiling: the FDEs' rows, counted as gimli produces them, then
    /// the table's.
    pub rows: usize,
}

impl CompileLimits {
    /// 4,194,304 rows (libLLVM's CFI has about 0.8 million), a quarter of what a table may
    /// hold ([`MAX_TABLE_ROWS`]): 24 bytes each while compiling, in vectors that double, a
    /// crafted FDE at the table's limit took `record -a` past the unit's 512 MiB
    /// (tests/security.rs).
    pub const DEFAULT: CompileLimits = CompileLimits {
        section_bytes: 256 << 20,
        rows: 1 << 22,
    };
}

/// Everything a table is compiled from, read out of the file: the table is a function of these
/// alone, so their digest tells the tables of different files apart (see [`TableKey`]).
#[derive(Clone, Debug, Default)]
pub struct CfiSections<'d> {
    pub architecture: String,
    /// `.eh_frame`'s address and bytes.
    pub eh_frame: Option<(u64, Cow<'d, [u8]>)>,
    pub debug_frame: Option<Cow<'d, [u8]>>,
    /// Addresses of `.text` and `.got`, which CFI pointers may be relative to.
    pub text: Option<u64>,
    pub got: Option<u64>,
    /// Executable sections' address ranges.
    pub executable: Vec<Range<u64>>,
}

impl<'d> CfiSections<'d> {
    /// Reads the sections of `elf`, refusing one over `limits.section_bytes` before reading it.
    pub fn read<R: ReadRef<'d>>(
        elf: &object::File<'d, R>,
        limits: &CompileLimits,
    ) -> Result<CfiSections<'d>> {
        let read = |name: &str| -> Result<Option<(u64, Cow<'d, [u8]>)>> {
            let Some(section) = elf.section_by_name(name) else {
                return Ok(None);
            };
            let over = |size: u64| {
                anyhow!(
                    "{name} is {size} bytes, more than the {} a CFI section may take",
                    limits.section_bytes
                )
            };
            if section.size() > limits.section_bytes {
                return Err(over(section.size()));
            }
            let compressed = section
                .compressed_data()
                .with_context(|| format!("reading {name}"))?;
            if compressed.uncompressed_size > limits.section_bytes {
                return Err(over(compressed.uncompressed_size));
            }
            let data = compressed
                .decompress()
                .with_context(|| format!("reading {name}"))?;
            Ok(Some((section.address(), data)))
        };
        let address = |name: &str| elf.section_by_name(name).map(|s| s.address());
        Ok(CfiSections {
            architecture: format!("{:?}", elf.architecture()),
            eh_frame: read(".eh_frame")?,
            debug_frame: read(".debug_frame")?.map(|(_, data)| data),
            text: address(".text"),
            got: address(".got"),
            executable: elf
                .sections()
                .filter(|s| s.kind() == SectionKind::Text && s.size() > 0)
                .map(|s| s.address()..s.address() + s.size())
                .collect(),
        })
    }

    /// SHA-256 of everything [`CfiSections::compile`] reads.
    pub fn digest(&self) -> [u8; 32] {
        let mut hash = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        field(self.architecture.as_bytes());
        let (eh_frame_address, eh_frame) = match &self.eh_frame {
            Some((address, data)) => (Some(*address), Some(data)),
            None => (None, None),
        };
        for (present, bytes) in [
            (eh_frame.is_some(), eh_frame.map_or(&[][..], |d| d)),
            (
                self.debug_frame.is_some(),
                self.debug_frame.as_deref().unwrap_or_default(),
            ),
        ] {
            field(&[u8::from(present)]);
            field(bytes);
        }
        for address in [eh_frame_address, self.text, self.got] {
            field(&address.map_or([0; 9], |a| {
                let mut out = [1; 9];
                out[1..].copy_from_slice(&a.to_le_bytes());
                out
            }));
        }
        for range in &self.executable {
            field(&[range.start.to_le_bytes(), range.end.to_le_bytes()].concat());
        }
        hash.finalize().into()
    }

    /// What CFI pointers may be relative to, apart from `.eh_frame` itself.
    fn bases(&self) -> BaseAddresses {
        let mut bases = BaseAddresses::default();
        if let Some(text) = self.text {
            bases = bases.set_text(text);
        }
        if let Some(got) = self.got {
            bases = bases.set_got(got);
        }
        bases
    }

    /// The code ranges the FDEs describe (ELF virtual addresses), sorted by start: one per
    /// function (a compiler's split-off cold part is one more), so that code without symbols
    /// is named by the function that holds it. Malformed entries are skipped, as compiling
    /// them does.
    pub fn function_ranges(&self) -> Vec<Range<u64>> {
        fn ranges_of<R: Reader<Offset = usize>, S: UnwindSection<R>>(
            section: &S,
            bases: &BaseAddresses,
            out: &mut Vec<Range<u64>>,
        ) {
            let mut entries = section.entries(bases);
            while let Ok(Some(entry)) = entries.next() {
                if let CieOrFde::Fde(partial) = entry {
                    if let Ok(fde) = partial.parse(S::cie_from_offset) {
                        out.push(fde.initial_address()..fde.end_address());
                    }
                }
            }
        }
        let bases = self.bases();
        let mut ranges = Vec::new();
        if let Some((address, data)) = &self.eh_frame {
            let eh_frame = EhFrame::new(data, gimli::LittleEndian);
            ranges_of(
                &eh_frame,
                &bases.clone().set_eh_frame(*address),
                &mut ranges,
            );
        }
        if let Some(data) = &self.debug_frame {
            let mut debug_frame = DebugFrame::new(data, gimli::LittleEndian);
            debug_frame.set_address_size(8);
            ranges_of(&debug_frame, &bases, &mut ranges);
        }
        ranges.retain(|range| !range.is_empty());
        ranges.sort_by_key(|range| (range.start, range.end));
        ranges.dedup();
        ranges
    }

    /// The sections' rows, holding no more than `limits.rows` of them at any time.
    pub fn compile(&self, limits: &CompileLimits) -> Result<UnwindTable> {
        if self.architecture != "X86_64" {
            bail!(
                "unwind tables are compiled for x86-64 only, and this file is for {}",
                self.architecture
            );
        }
        let bases = self.bases();
        let mut stats = CompileStats::default();
        let mut fdes = Vec::new();
        let eh_frame = self.eh_frame.as_ref().map(|(address, data)| {
            (
                bases.clone().set_eh_frame(*address),
                EhFrame::new(data, gimli::LittleEndian),
            )
        });
        let debug_frame = self.debug_frame.as_ref().map(|data| {
            let mut section = DebugFrame::new(data, gimli::LittleEndian);
            section.set_address_size(8);
            section
        });
        if let Some((bases, section)) = &eh_frame {
            index_fdes(section, bases, false, &mut fdes, &mut stats);
        }
        if let Some(section) = &debug_frame {
            index_fdes(section, &bases, true, &mut fdes, &mut stats);
        }
        let mut context = Box::new(UnwindContext::new());
        // Counted over the whole file, as gimli produces them, as when they were all held.
        let mut rows_left = limits.rows;
        let mut evaluate =
            |fde: &FdeEntry, rows: &mut Vec<(u64, UnwindRow)>, stats: &mut CompileStats| {
                let context = &mut context;
                let rows_left = &mut rows_left;
                match (fde.from_debug_frame, &eh_frame, &debug_frame) {
                    (false, Some((bases, section)), _) => {
                        evaluate_fde(section, bases, fde.offset, context, rows_left, rows, stats)
                    }
                    (true, _, Some(section)) => {
                        evaluate_fde(section, &bases, fde.offset, context, rows_left, rows, stats)
                    }
                    _ => Ok(false),
                }
            };
        lay_out(fdes, &self.executable, stats, limits.rows, &mut evaluate)
    }
}

/// Compiles an ELF file's `.eh_frame` and `.debug_frame` into rows.
pub fn compile<'d, R: ReadRef<'d>>(elf: &object::File<'d, R>) -> Result<UnwindTable> {
    CfiSections::read(elf, &CompileLimits::DEFAULT)?.compile(&CompileLimits::DEFAULT)
}

/// A file without call-frame information (Go's binaries, code built without unwind tables):
/// its frames are walked by frame pointers, as with no table at all; not worth a warning.
#[derive(Debug, thiserror::Error)]
#[error("no call-frame information (no FDE in .eh_frame or .debug_frame)")]
pub struct NoCallFrameInformation;

/// CFI with more rows than a table may hold, found before the rows are held.
struct TooManyRows;

/// The refusal of CFI with more than `limit` rows.
fn too_many_rows(limit: usize) -> anyhow::Error {
    anyhow!("more than the {limit} unwind rows a table may hold")
}

/// Lists the FDEs of one section with their address ranges. A malformed FDE is counted and
/// skipped; a malformed entry header ends the section, since the entries after it cannot be
/// found.
fn index_fdes<R: Reader<Offset = usize>, S: UnwindSection<R>>(
    section: &S,
    bases: &BaseAddresses,
    from_debug_frame: bool,
    out: &mut Vec<FdeEntry>,
    stats: &mut CompileStats,
) {
    let mut entries = section.entries(bases);
    loop {
        let partial = match entries.next() {
            Ok(Some(CieOrFde::Fde(partial))) => partial,
            Ok(Some(CieOrFde::Cie(_))) => continue,
            Ok(None) => return,
            Err(_) => {
                stats.malformed_fdes += 1;
                return;
            }
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            stats.malformed_fdes += 1;
            continue;
        };
        let range = fde.initial_address()..fde.end_address();
        if !range.is_empty() {
            out.push(FdeEntry {
                range,
                from_debug_frame,
                offset: fde.offset(),
            });
        }
    }
}

/// Evaluates the FDE at `offset` of `section` into `rows`, counting it (or counting it
/// malformed and returning `false`); an error when the file has more rows than `rows_left`.
fn evaluate_fde<R: Reader<Offset = usize>, S: UnwindSection<R>>(
    section: &S,
    bases: &BaseAddresses,
    offset: usize,
    context: &mut UnwindContext<usize>,
    rows_left: &mut usize,
    rows: &mut Vec<(u64, UnwindRow)>,
    stats: &mut CompileStats,
) -> Result<bool, TooManyRows> {
    let evaluated =
        match section.fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset) {
            Ok(fde) => fde_rows(section, bases, context, &fde, rows_left, rows, stats)?,
            Err(error) => Err(error),
        };
    match evaluated {
        Ok(()) => stats.fdes += 1,
        Err(_) => stats.malformed_fdes += 1,
    }
    Ok(evaluated.is_ok())
}

/// One FDE's rows into `rows` (emptied first), with what they cost counted; an error, before
/// the row is held, when it has more than `rows_left`.
fn fde_rows<R: Reader<Offset = usize>, S: UnwindSection<R>>(
    section: &S,
    bases: &BaseAddresses,
    context: &mut UnwindContext<usize>,
    fde: &gimli::FrameDescriptionEntry<R>,
    rows_left: &mut usize,
    rows: &mut Vec<(u64, UnwindRow)>,
    stats: &mut CompileStats,
) -> Result<gimli::Result<()>, TooManyRows> {
    rows.clear();
    let signal = fde.is_signal_trampoline();
    let mut table = match fde.rows(section, bases, context) {
        Ok(table) => table,
        Err(error) => return Ok(Err(error)),
    };
    let mut counted = CompileStats::default();
    loop {
        let row = match table.next_row() {
            Ok(Some(row)) => row,
            Ok(None) => break,
            Err(error) => {
                // The rows are let go: give them back.
                *rows_left += rows.len();
                return Ok(Err(error));
            }
        };
        counted.cfi_rows += 1;
        let (compact, unsupported) = compact_row(section, row, signal);
        if let Some(pattern) = unsupported {
            *counted.unsupported.entry(pattern).or_default() += 1;
        }
        *rows_left = rows_left.checked_sub(1).ok_or(TooManyRows)?;
        rows.push((row.start_address(), compact));
    }
    // Counted only once the whole FDE evaluated.
    stats.cfi_rows += counted.cfi_rows;
    for (pattern, count) in counted.unsupported {
        *stats.unsupported.entry(pattern).or_default() += count;
    }
    Ok(Ok(()))
}

/// One of gimli's rows as an [`UnwindRow`] (its `pc` set later), with the pattern that made it
/// unsupported, if one did.
fn compact_row<R: Reader<Offset = usize>, S: UnwindSection<R>>(
    section: &S,
    row: &gimli::UnwindTableRow<usize>,
    signal: bool,
) -> (UnwindRow, Option<Unsupported>) {
    let mut unsupported = None;
    let mut compact = UnwindRow::default();
    match cfa_rule(section, row.cfa()) {
        Ok((rule, offset, arg)) => {
            compact.cfa_rule = rule as u8;
            compact.cfa_offset = offset;
            compact.cfa_arg = arg;
        }
        Err(pattern) => {
            compact.cfa_rule = CfaRule::Unsupported as u8;
            unsupported = Some(pattern);
        }
    }
    let mut resolve = |saved: Result<(SavedAt, i16), Unsupported>| {
        saved.unwrap_or_else(|pattern| {
            unsupported.get_or_insert(pattern);
            (SavedAt::Unsupported, 0)
        })
    };
    let (fp_rule, fp_offset) = resolve(saved_at(section, row, RBP, signal));
    let (ra_rule, ra_offset) = resolve(saved_at(section, row, RIP, signal));
    compact.fp_rule = fp_rule as u8;
    compact.fp_offset = fp_offset;
    compact.ra_rule = ra_rule as u8;
    compact.ra_offset = ra_offset;
    (compact, unsupported)
}

/// The row's CFA rule, offset and argument.
fn cfa_rule<R: Reader<Offset = usize>, S: UnwindSection<R>>(
    section: &S,
    rule: &gimli::CfaRule<usize>,
) -> Result<(CfaRule, i32, u8), Unsupported> {
    match rule {
        gimli::CfaRule::RegisterAndOffset { register, offset } => {
            let kind = match *register {
                RSP => CfaRule::SpOffset,
                RBP => CfaRule::FpOffset,
                _ => return Err(Unsupported::CfaRegister),
            };
            let offset = i32::try_from(*offset).map_err(|_| Unsupported::CfaOffsetRange)?;
            Ok((kind, offset, 0))
        }
        gimli::CfaRule::Expression(expression) => {
            let expression = expression
                .get(section)
                .map_err(|_| Unsupported::CfaExpression)?;
            cfa_expression(expression).ok_or(Unsupported::CfaExpression)
        }
    }
}

/// Most operations of an expression pattern this format knows (the PLT one has 9).
const MAX_PATTERN_OPERATIONS: usize = 9;

/// The operations of a short expression; `None` if it is longer than any known pattern or
/// does not parse.
fn operations<R: Reader>(expression: Expression<R>) -> Option<Vec<Operation<R>>> {
    let encoding = gimli::Encoding {
        format: gimli::Format::Dwarf64,
        version: 4,
        address_size: 8,
    };
    let mut iter = expression.operations(encoding);
    let mut out = Vec::new();
    while let Some(operation) = iter.next().ok()? {
        if out.len() == MAX_PATTERN_OPERATIONS {
            return None;
        }
        out.push(operation);
    }
    Some(out)
}

/// The CFA expressions x86-64 code uses: a pointer saved on the stack (signal trampolines,
/// realigned frames) and the PLT stubs' position-dependent offset.
fn cfa_expression<R: Reader>(expression: Expression<R>) -> Option<(CfaRule, i32, u8)> {
    use Operation::*;
    let ops = operations(expression)?;
    match ops.as_slice() {
        [RegisterOffset {
            register, offset, ..
        }, Deref {
            size: 8,
            space: false,
            ..
        }] => {
            let rule = match *register {
                RSP => CfaRule::DerefSpOffset,
                RBP => CfaRule::DerefFpOffset,
                _ => return None,
            };
            Some((rule, i32::try_from(*offset).ok()?, 0))
        }
        // DW_OP_breg7 N; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_litT; DW_OP_ge;
        // DW_OP_lit3; DW_OP_shl; DW_OP_plus: CFA = RSP + N + ((RIP & 15) >= T) << 3.
        [RegisterOffset {
            register: RSP,
            offset,
            ..
        }, RegisterOffset {
            register: RIP,
            offset: 0,
            ..
        }, UnsignedConstant { value: 15 }, And, UnsignedConstant { value: threshold }, Ge, UnsignedConstant { value: 3 }, Shl, Plus] => {
            Some((
                CfaRule::PltX86_64,
                i32::try_from(*offset).ok()?,
                u8::try_from(*threshold).ok()?,
            ))
        }
        _ => None,
    }
}

/// Where the caller's frame pointer (`RBP`) or return address (`RIP`) is, or the pattern that
/// makes it unsupported.
fn saved_at<R: Reader<Offset = usize>, S: UnwindSection<R>>(
    section: &S,
    row: &gimli::UnwindTableRow<usize>,
    register: Register,
    signal: bool,
) -> Result<(SavedAt, i16), Unsupported> {
    let (unsupported, out_of_range) = if register == RIP {
        (Unsupported::RaRule, Unsupported::RaOffsetRange)
    } else {
        (Unsupported::FpRule, Unsupported::FpOffsetRange)
    };
    let fits = |offset: i64| i16::try_from(offset).map_err(|_| out_of_range);
    match row.register(register) {
        None if register == RIP => Ok((SavedAt::CfaOffset, DEFAULT_RA_OFFSET)),
        // A return address cannot be "unchanged": the register holds the callee's own ip.
        Some(RegisterRule::SameValue) if register == RIP => Err(unsupported),
        None | Some(RegisterRule::SameValue) => Ok((SavedAt::Unchanged, 0)),
        Some(RegisterRule::Undefined) => Ok((SavedAt::Undefined, 0)),
        Some(RegisterRule::Offset(offset)) => Ok((SavedAt::CfaOffset, fits(offset)?)),
        // A signal trampoline's registers are in the context the kernel saved below its
        // stack pointer: DW_OP_breg7 N.
        Some(RegisterRule::Expression(expression)) if signal => {
            let expression = expression.get(section).map_err(|_| unsupported)?;
            match operations(expression).as_deref() {
                Some(
                    [Operation::RegisterOffset {
                        register: RSP,
                        offset,
                        ..
                    }],
                ) => Ok((SavedAt::SpOffset, fits(*offset)?)),
                _ => Err(unsupported),
            }
        }
        Some(_) => Err(unsupported),
    }
}

/// Lays the FDEs' rows end to end in address order, each FDE evaluated by `evaluate` when its
/// turn comes (one wholly covered by those before it is not evaluated): gaps between FDEs
/// become [`CfaRule::NoInfo`] rows, and consecutive rows with the same rule merge. More than
/// `max_rows` rows refuse the table as soon as they are reached.
fn lay_out(
    mut fdes: Vec<FdeEntry>,
    executable: &[Range<u64>],
    mut stats: CompileStats,
    max_rows: usize,
    evaluate: &mut EvaluateFde<'_>,
) -> Result<UnwindTable> {
    fdes.sort_by_key(|fde| (fde.range.start, fde.from_debug_frame));
    let mut table = Merged::default();
    let mut covered: Vec<Range<u64>> = Vec::new();
    let mut end = 0u64;
    let mut rows = Vec::new();
    for fde in fdes {
        if fde.range.end <= end {
            stats.overlapping_fdes += 1;
            continue;
        }
        if !evaluate(&fde, &mut rows, &mut stats).map_err(|TooManyRows| too_many_rows(max_rows))? {
            continue;
        }
        if fde.range.start < end {
            stats.overlapping_fdes += 1;
        } else if table.base.is_some() && fde.range.start > end {
            table.push(end, UnwindRow::no_info(0))?;
        }
        let start = fde.range.start.max(end);
        // The row in force at `start`, then those after it.
        let first = rows.iter().rposition(|(pc, _)| *pc <= start).unwrap_or(0);
        for (i, (pc, row)) in rows.iter().enumerate().skip(first) {
            let pc = if i == first { start } else { *pc };
            if pc < fde.range.end {
                table.push(pc, *row)?;
            }
        }
        if table.rows.len() > max_rows {
            return Err(too_many_rows(max_rows));
        }
        match covered.last_mut() {
            Some(last) if last.end >= start => last.end = fde.range.end,
            _ => covered.push(start..fde.range.end),
        }
        end = fde.range.end;
    }
    let Some(base) = table.base else {
        return Err(NoCallFrameInformation.into());
    };
    table.push(end, UnwindRow::no_info(0))?;
    if table.rows.len() > max_rows.min(MAX_TABLE_ROWS as usize) {
        return Err(too_many_rows(max_rows.min(MAX_TABLE_ROWS as usize)));
    }
    Ok(UnwindTable {
        base,
        rows: table.rows,
        no_cfi: uncovered(executable, &covered),
        stats,
    })
}

/// Rows laid end to end, merged as they come: addresses are offsets from the first row's.
#[derive(Default)]
struct Merged {
    base: Option<u64>,
    rows: Vec<UnwindRow>,
}

impl Merged {
    fn push(&mut self, pc: u64, mut row: UnwindRow) -> Result<()> {
        let base = *self.base.get_or_insert(pc);
        row.pc = pc
            .checked_sub(base)
            .and_then(|offset| u32::try_from(offset).ok())
            .ok_or_else(|| anyhow!("the code with call-frame information spans more than 4 GiB"))?;
        let rows = &mut self.rows;
        match rows.last_mut() {
            // A later row at the same address replaces an earlier one (an FDE's first row at
            // the end of the previous).
            Some(last) if last.pc == row.pc => *last = row,
            Some(last) if last.same_rule(&row) => {}
            _ => rows.push(row),
        }
        // Replacing may have made the last two rows alike.
        if let [.., before, last] = rows.as_slice() {
            if before.same_rule(last) {
                rows.pop();
            }
        }
        Ok(())
    }
}

/// The parts of `sections` outside `covered` (sorted, disjoint).
fn uncovered(sections: &[Range<u64>], covered: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for section in sections {
        let mut cursor = section.start;
        for range in covered {
            if range.end <= cursor || range.start >= section.end {
                continue;
            }
            if range.start > cursor {
                out.push(cursor..range.start);
            }
            cursor = range.end;
        }
        if cursor < section.end {
            out.push(cursor..section.end);
        }
    }
    out
}

/// What identifies a file's tables across processes and runs: the file, and the digest of the
/// sections its table is compiled from ([`CfiSections::digest`]). A build ID alone is whatever
/// the file says: a user's file that carried a root program's build ID once had its table
/// cached for the root program, which then unwound by it in every later run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TableKey {
    BuildId {
        id: Vec<u8>,
        cfi: [u8; 32],
    },
    /// For files without a build ID (Rust's toolchain libraries, programs linked without one):
    /// the file itself, not a path to it. The loader reaches files through descriptor paths
    /// (`/proc/self/fd/N`), which differ between runs and each time a file is opened again, so
    /// a key by path recompiled such a file on every open and stored one more copy on disk.
    File {
        device: u64,
        inode: u64,
        size: u64,
        mtime_ns: i64,
        cfi: [u8; 32],
    },
}

impl TableKey {
    /// The key of `file`: its build ID, else its device, inode, size and modification time;
    /// with the digest of `cfi`, read from it.
    pub fn of<'d, R: ReadRef<'d>>(
        elf: &object::File<'d, R>,
        file: &File,
        cfi: &CfiSections<'d>,
    ) -> Result<TableKey> {
        let cfi = cfi.digest();
        if let Some(id) = elf.build_id().ok().flatten().filter(|id| !id.is_empty()) {
            return Ok(TableKey::BuildId {
                id: id.to_vec(),
                cfi,
            });
        }
        let metadata = file.metadata()?;
        Ok(TableKey::File {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.len(),
            mtime_ns: metadata.mtime() * 1_000_000_000 + metadata.mtime_nsec(),
            cfi,
        })
    }

    /// The key's bytes, as cache files store it.
    fn encode(&self) -> Vec<u8> {
        match self {
            TableKey::BuildId { id, cfi } => [&[1u8][..], cfi, id].concat(),
            TableKey::File {
                device,
                inode,
                size,
                mtime_ns,
                cfi,
            } => [
                &[3u8][..],
                &device.to_le_bytes(),
                &inode.to_le_bytes(),
                &size.to_le_bytes(),
                &mtime_ns.to_le_bytes(),
                cfi,
            ]
            .concat(),
        }
    }

    /// The cache file's name: the build ID in hex and the start of the CFI's digest, else a
    /// hash of the key (which the file stores in full, so a collision is only a miss).
    fn file_name(&self) -> String {
        match self {
            TableKey::BuildId { id, cfi } => format!(
                "{}-{}.unwind",
                crate::process::hex(id),
                crate::process::hex(&cfi[..8])
            ),
            TableKey::File { .. } => {
                // FNV-1a: stable across builds, unlike std's hasher.
                let hash = self.encode().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
                });
                format!("file-{hash:016x}.unwind")
            }
        }
    }
}

/// Identifies cache files; the version changes with the row format or the compiler's output.
const CACHE_MAGIC: &[u8; 8] = b"PRFUNWND";
const CACHE_VERSION: u32 = 1;
/// Largest cache file read: a table of the most rows, plus its lists.
const MAX_CACHE_FILE: u64 = (MAX_TABLE_ROWS as u64) * UnwindRow::SIZE as u64 + (64 << 20);

/// Rows encoded at a time when a table is written.
const ROWS_PER_WRITE: usize = 4096;

/// A table's cache file: header, key, table, CRC-32 of everything before it.
#[cfg(test)]
fn encode_table(key: &TableKey, table: &UnwindTable) -> Vec<u8> {
    let mut out = Vec::new();
    write_table(key, table, &mut out).expect("a vector takes every write");
    crate::disk_cache::end_file(out)
}

/// Writes a table's cache file but its CRC-32: the header, key and lists, then the rows a few
/// thousand at a time.
fn write_table(key: &TableKey, table: &UnwindTable, file: &mut dyn Write) -> std::io::Result<()> {
    let mut out = start_file(CACHE_MAGIC, CACHE_VERSION, &key.encode(), 256);
    out.extend_from_slice(&table.base.to_le_bytes());
    let stats = &table.stats;
    for value in [
        stats.fdes,
        stats.overlapping_fdes,
        stats.malformed_fdes,
        stats.cfi_rows,
    ] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&(stats.unsupported.len() as u32).to_le_bytes());
    for (pattern, count) in &stats.unsupported {
        out.push(*pattern as u8);
        out.extend_from_slice(&count.to_le_bytes());
    }
    out.extend_from_slice(&(table.no_cfi.len() as u32).to_le_bytes());
    for range in &table.no_cfi {
        out.extend_from_slice(&range.start.to_le_bytes());
        out.extend_from_slice(&range.end.to_le_bytes());
    }
    out.extend_from_slice(&(table.rows.len() as u32).to_le_bytes());
    file.write_all(&out)?;
    for rows in table.rows.chunks(ROWS_PER_WRITE) {
        out.clear();
        for row in rows {
            out.extend_from_slice(&row.to_bytes());
        }
        file.write_all(&out)?;
    }
    Ok(())
}

/// Decodes and checks the rest of a cache file, past its key: its rows a few thousand at a time,
/// straight into the table.
fn decode_table(r: &mut StreamBytes<impl Read>) -> Result<UnwindTable> {
    let base = r.u64("base")?;
    let mut stats = CompileStats {
        fdes: r.u64("FDE count")?,
        overlapping_fdes: r.u64("overlapping FDE count")?,
        malformed_fdes: r.u64("malformed FDE count")?,
        cfi_rows: r.u64("CFI row count")?,
        unsupported: BTreeMap::new(),
    };
    for _ in 0..r.count(9, "unsupported pattern count")? {
        let [code] = r.array("pattern")?;
        let pattern = Unsupported::from_u8(code)
            .ok_or_else(|| anyhow!("unknown unsupported-pattern code {code}"))?;
        stats.unsupported.insert(pattern, r.u64("pattern count")?);
    }
    let mut no_cfi = Vec::new();
    for _ in 0..r.count(16, "no-CFI range count")? {
        let range = r.u64("range start")?..r.u64("range end")?;
        if range.is_empty() {
            bail!("an empty no-CFI range {:#x}..{:#x}", range.start, range.end);
        }
        no_cfi.push(range);
    }
    let row_count = r.count(UnwindRow::SIZE, "row count")?;
    if row_count == 0 || row_count > MAX_TABLE_ROWS as usize {
        bail!("{row_count} rows, outside 1..={MAX_TABLE_ROWS}");
    }
    let mut rows: Vec<UnwindRow> = Vec::with_capacity(row_count);
    let mut buffer = vec![0u8; ROWS_PER_WRITE * UnwindRow::SIZE];
    while rows.len() < row_count {
        let batch = (row_count - rows.len()).min(ROWS_PER_WRITE);
        let bytes = &mut buffer[..batch * UnwindRow::SIZE];
        r.read_into(bytes, "row")?;
        for encoded in bytes.chunks_exact(UnwindRow::SIZE) {
            let row = UnwindRow::from_bytes(encoded.try_into().expect("a row's bytes"));
            let index = rows.len();
            if !row.is_valid() {
                bail!("row {index} names an unknown rule: {row:?}");
            }
            if rows.last().is_some_and(|last| last.pc >= row.pc) {
                bail!("row {index} is out of address order");
            }
            rows.push(row);
        }
    }
    if rows.last().map(|row| row.cfa_rule) != Some(CfaRule::NoInfo as u8) {
        bail!("the last row does not end the table");
    }
    if r.left() > 0 {
        bail!("{} bytes after the rows", r.left());
    }
    Ok(UnwindTable {
        base,
        rows,
        no_cfi,
        stats,
    })
}

/// How a [`TableCache`] found its tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub compiled: u64,
    pub from_disk: u64,
    pub from_memory: u64,
    /// Cache files refused or not written, each with its reason.
    pub problems: Vec<String>,
}

/// Why a file got no table, kept to be told again: its message, and whether it simply has no
/// call-frame information ([`NoCallFrameInformation`], which callers treat apart).
#[derive(Clone, Debug)]
struct Refused {
    message: String,
    no_cfi: bool,
}

impl Refused {
    fn error(&self) -> anyhow::Error {
        if self.no_cfi {
            anyhow::Error::new(NoCallFrameInformation).context(self.message.clone())
        } else {
            anyhow!("{}", self.message)
        }
    }
}

/// A table as the cache hands it out: the rows, and the key the same table has in every file
/// and run (what the loader places it in the arena by).
#[derive(Clone, Debug)]
pub struct CachedTable {
    pub key: TableKey,
    pub table: Arc<UnwindTable>,
}

impl std::ops::Deref for CachedTable {
    type Target = Arc<UnwindTable>;

    fn deref(&self) -> &Arc<UnwindTable> {
        &self.table
    }
}

/// Compiled tables by [`TableKey`], in memory and (when given a directory) on disk.
#[derive(Debug, Default)]
pub struct TableCache {
    /// Files that cannot be compiled (no CFI: Go, hand-written assembly) are remembered too, so
    /// that each process mapping one does not try again while it is open.
    memory: HashMap<TableKey, Result<Arc<UnwindTable>, Refused>>,
    /// The tables no one held at the last release, let go at the next one if still unused.
    idle: HashSet<TableKey>,
    directory: Option<CacheDir>,
    pub stats: CacheStats,
}

impl TableCache {
    /// A cache kept in memory and, with `directory`, on disk there.
    pub fn new(directory: Option<PathBuf>) -> TableCache {
        TableCache {
            directory: directory.map(CacheDir::new),
            ..TableCache::default()
        }
    }

    /// Where tables are kept across runs (see [`CacheDir::default_for`]).
    pub fn default_directory() -> Option<PathBuf> {
        CacheDir::default_for("unwind").map(|dir| dir.path().to_path_buf())
    }

    /// The table of the ELF file open as `file` (reached at `path`, named in messages), with
    /// the key it is cached by.
    pub fn table(&mut self, file: &File, path: &Path) -> Result<CachedTable> {
        let image = ModuleImage::new(file.try_clone()?);
        let elf = object::File::parse(&image)
            .map_err(|e| anyhow!("{}: not an ELF file: {e}", path.display()))?;
        // Read within the limits before anything else: the key is their digest.
        let cfi = CfiSections::read(&elf, &CompileLimits::DEFAULT).map_err(|error| {
            self.stats.compiled += 1;
            anyhow!(
                "compiling the unwind table of {}: {error:#}",
                path.display()
            )
        })?;
        let key = TableKey::of(&elf, file, &cfi)?;
        if let Some(table) = self.memory.get(&key) {
            self.stats.from_memory += 1;
            let table = table.clone().map_err(|refused| refused.error())?;
            return Ok(CachedTable { key, table });
        }
        let cached = self
            .directory
            .as_ref()
            .and_then(|dir| match load(dir, &key) {
                Ok(table) => table,
                Err(error) => {
                    self.stats.problems.push(format!(
                        "unwind-table cache file {}: {error:#}; it is ignored and the table \
                         recompiled",
                        dir.path().join(key.file_name()).display()
                    ));
                    None
                }
            });
        let table = match cached {
            Some(table) => {
                self.stats.from_disk += 1;
                table
            }
            None => {
                self.stats.compiled += 1;
                let table = match cfi.compile(&CompileLimits::DEFAULT) {
                    Ok(table) => table,
                    Err(error) => {
                        let refused = Refused {
                            no_cfi: error.downcast_ref::<NoCallFrameInformation>().is_some(),
                            message: format!(
                                "compiling the unwind table of {}: {error:#}",
                                path.display()
                            ),
                        };
                        let error = refused.error();
                        self.memory.insert(key, Err(refused));
                        return Err(error);
                    }
                };
                if let Some(dir) = &self.directory {
                    if let Err(error) = store(dir, &key, &table) {
                        self.stats.problems.push(format!("{error:#}"));
                    }
                }
                table
            }
        };
        let table = Arc::new(table);
        self.memory.insert(key.clone(), Ok(table.clone()));
        Ok(CachedTable { key, table })
    }

    /// Lets go of the table cached by `key` at once, however recently used: the loader's memory
    /// budget evicts it. The next file with this key reads it back from disk.
    pub fn forget(&mut self, key: &TableKey) {
        self.memory.remove(key);
        self.idle.remove(key);
    }

    /// Whether the last release found tables unused and kept them for the next.
    pub fn holds_unused(&self) -> bool {
        !self.idle.is_empty()
    }

    /// Lets go of the tables no one else holds any more (their files closed) and of the
    /// failures remembered, so that memory follows the files open, not every file ever mapped.
    /// A table is let go at the second release that finds it unused (the loader releases again
    /// at its next sync while [`TableCache::holds_unused`]): under process churn the same
    /// program starts again as soon as its last process exits, and reading its table back from
    /// disk and placing its rows again was a twelfth of the agent's CPU. Says how many went.
    pub fn release_unused(&mut self) -> usize {
        let unused = |table: &Result<Arc<UnwindTable>, Refused>| !matches!(table, Ok(t) if Arc::strong_count(t) > 1);
        let idle = std::mem::take(&mut self.idle);
        let released = self
            .memory
            .extract_if(|key, table| unused(table) && idle.contains(key))
            .count();
        self.idle = self
            .memory
            .iter()
            .filter(|(_, table)| unused(table))
            .map(|(key, _)| key.clone())
            .collect();
        released
    }
}

/// The table stored for `key`, `None` when there is none.
fn load(dir: &CacheDir, key: &TableKey) -> Result<Option<UnwindTable>> {
    let header = CacheHeader {
        magic: CACHE_MAGIC,
        version: CACHE_VERSION,
        kind: "an unwind-table",
        key: &key.encode(),
    };
    match dir.read_checked(&key.file_name(), MAX_CACHE_FILE, header)? {
        None => Ok(None),
        Some(Checked::Matches(mut rest)) => decode_table(&mut rest).map(Some),
        Some(Checked::OtherKey) => bail!("it holds another file's table"),
    }
}

/// What the cache directory holds at most: every build of every program a machine runs would
/// otherwise stay there (an agent's directory grew to 1.6 GB in a day of test runs).
const MAX_CACHE_BYTES: u64 = 256 << 20;

/// Writes `table` into the cache directory (created private to this user).
fn store(dir: &CacheDir, key: &TableKey, table: &UnwindTable) -> Result<()> {
    dir.write_ended("unwind-table cache", &key.file_name(), |out| {
        write_table(key, table, out)
    })?;
    dir.prune("unwind", MAX_CACHE_BYTES)
}

#[cfg(test)]
mod tests;
