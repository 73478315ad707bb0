//! Compiled rows checked against gimli's own evaluation of the same CFI at every address of
//! real programs' code (Debian's libc, python3.11 and xz, and a workload built without frame
//! pointers); the cache with good, corrupt and hostile files.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Instant;

use object::ObjectSymbol;

use gimli::{
    EhFrame, EhFrameHdr, Evaluation, EvaluationResult, Location, UnwindContext, UnwindTableRow,
    Value,
};
use profiler_common::unwind::{step, Registers, StepEnd};

use super::*;
use crate::input::{open_regular, FinalLink};

#[path = "../../../../tests/tests/common/c_workload.rs"]
mod c_workload;
mod perf;

const SYSTEM_FILES: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/bin/python3.11",
    "/usr/bin/xz",
];

use c_workload::build_no_frame_pointers as build_workload;

/// Stack memory as the checks see it: every word a distinct value far above the stack pointer,
/// so that any misplaced read shows.
const SP: u64 = 0x7ffd_0000_0000;
const FP: u64 = SP + 0x1000;

fn memory(address: u64) -> u64 {
    // splitmix64
    let mut z = address.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    SP + 0x10_0000 + ((z ^ (z >> 31)) & 0xffff_fff8)
}

/// What gimli's row says the caller's registers are, evaluated here independently of the
/// compiler: `None` where it needs a register the walker does not track.
#[derive(Debug, PartialEq, Eq)]
enum Expected {
    Caller { ip: u64, sp: u64, fp: u64 },
    EndOfStack,
    Untracked,
}

fn register_value(register: gimli::Register, ip: u64) -> Option<u64> {
    match register.0 {
        6 => Some(FP),
        7 => Some(SP),
        16 => Some(ip),
        _ => None,
    }
}

/// Evaluates a DWARF expression with gimli, `initial` pushed first; its address or value.
fn evaluate<R: gimli::Reader>(
    expression: gimli::Expression<R>,
    initial: Option<u64>,
    ip: u64,
) -> Option<(bool, u64)> {
    let encoding = gimli::Encoding {
        format: gimli::Format::Dwarf64,
        version: 4,
        address_size: 8,
    };
    let mut evaluation: Evaluation<R> = expression.evaluation(encoding);
    if let Some(value) = initial {
        evaluation.set_initial_value(value);
    }
    let mut result = evaluation.evaluate().ok()?;
    loop {
        result = match result {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresRegister { register, .. } => evaluation
                .resume_with_register(Value::Generic(register_value(register, ip)?))
                .ok()?,
            EvaluationResult::RequiresMemory { address, .. } => evaluation
                .resume_with_memory(Value::Generic(memory(address)))
                .ok()?,
            _ => return None,
        };
    }
    match evaluation.result().first()?.location {
        Location::Address { address } => Some((true, address)),
        Location::Value {
            value: Value::Generic(value),
        } => Some((false, value)),
        _ => None,
    }
}

fn expected<R: gimli::Reader<Offset = usize>, S: UnwindSection<R>>(
    section: &S,
    row: &UnwindTableRow<usize>,
    ip: u64,
) -> Expected {
    let cfa = match row.cfa() {
        gimli::CfaRule::RegisterAndOffset { register, offset } => {
            let Some(base) = register_value(*register, ip) else {
                return Expected::Untracked;
            };
            base.wrapping_add_signed(*offset)
        }
        gimli::CfaRule::Expression(expression) => {
            match evaluate(expression.get(section).unwrap(), None, ip) {
                Some((_, cfa)) => cfa,
                None => return Expected::Untracked,
            }
        }
    };
    let recover = |rule: Option<RegisterRule<usize>>, unchanged: u64| -> Option<Option<u64>> {
        Some(Some(match rule {
            None if unchanged == 0 => memory(cfa.wrapping_sub(8)),
            None | Some(RegisterRule::SameValue) => unchanged,
            Some(RegisterRule::Undefined) => return Some(None),
            Some(RegisterRule::Offset(n)) => memory(cfa.wrapping_add_signed(n)),
            Some(RegisterRule::ValOffset(n)) => cfa.wrapping_add_signed(n),
            Some(RegisterRule::Register(r)) => register_value(r, ip)?,
            Some(RegisterRule::Expression(e)) => {
                memory(evaluate(e.get(section).unwrap(), Some(cfa), ip)?.1)
            }
            Some(RegisterRule::ValExpression(e)) => {
                evaluate(e.get(section).unwrap(), Some(cfa), ip)?.1
            }
            Some(_) => return None,
        }))
    };
    let Some(ra) = recover(row.register(RIP), 0) else {
        return Expected::Untracked;
    };
    let Some(ra) = ra else {
        return Expected::EndOfStack;
    };
    // An undefined frame pointer is left as it is, as the walker does.
    let Some(fp) = recover(row.register(RBP), FP) else {
        return Expected::Untracked;
    };
    Expected::Caller {
        ip: ra,
        sp: cfa,
        fp: fp.unwrap_or(FP),
    }
}

/// What the compiled rows say, in the same terms; `None` for an unsupported row.
fn compiled(table: &UnwindTable, ip: u64) -> Option<Result<Expected, StepEnd>> {
    let Some(row) = table.lookup(ip) else {
        return Some(Err(StepEnd::NoUnwindInfo));
    };
    let regs = Registers { ip, sp: SP, fp: FP };
    match step(row, &regs, |address| Some(memory(address))) {
        Ok(caller) => Some(Ok(Expected::Caller {
            ip: caller.regs.ip,
            sp: caller.regs.sp,
            fp: caller.regs.fp,
        })),
        Err(StepEnd::EndOfStack) => Some(Ok(Expected::EndOfStack)),
        Err(StepEnd::UnsupportedRule) => None,
        Err(end) => Some(Err(end)),
    }
}

/// Counts from checking one file.
#[derive(Debug, Default)]
struct Agreement {
    addresses: u64,
    agree: u64,
    /// Addresses whose row the format cannot express (counted by the compiler too).
    unsupported: u64,
    /// Addresses gimli needs an untracked register for, and the rows say unsupported.
    untracked: u64,
    mismatches: Vec<String>,
}

impl Agreement {
    fn check(
        &mut self,
        ip: u64,
        gimli_says: Option<Expected>,
        rows_say: Option<Result<Expected, StepEnd>>,
    ) {
        self.addresses += 1;
        match (gimli_says, rows_say) {
            (Some(Expected::Untracked), None) => self.untracked += 1,
            (_, None) => self.unsupported += 1,
            (None, Some(Err(StepEnd::NoUnwindInfo))) => self.agree += 1,
            (Some(want), Some(Ok(got))) if want == got => self.agree += 1,
            (want, got) => {
                if self.mismatches.len() < 10 {
                    self.mismatches
                        .push(format!("{ip:#x}: gimli {want:?}, rows {got:?}"));
                }
            }
        }
    }
}

/// Every address of every executable section of the ELF image `data`, through the `.eh_frame_hdr` lookup
/// table or a search of `.debug_frame`.
fn check_every_address(name: &str, data: &[u8]) -> (UnwindTable, Agreement) {
    let elf = object::File::parse(data).unwrap();
    let started = Instant::now();
    let table = compile(&elf).unwrap();
    let took = started.elapsed();
    // The table's cost, as the bench would show it.
    println!(
        "{name}: {} rows, {} bytes, compiled in {:.1} ms; no CFI: {} bytes in {} ranges; {}",
        table.rows.len(),
        table.row_bytes(),
        took.as_secs_f64() * 1e3,
        table.no_cfi.iter().map(|r| r.end - r.start).sum::<u64>(),
        table.no_cfi.len(),
        table.stats,
    );
    let section_data = |name: &str| {
        elf.section_by_name(name)
            .map(|s| (s.address(), s.data().unwrap()))
    };
    let mut bases = BaseAddresses::default();
    if let Some((address, _)) = section_data(".text") {
        bases = bases.set_text(address);
    }
    if let Some((address, _)) = section_data(".got") {
        bases = bases.set_got(address);
    }
    let mut agreement = Agreement::default();
    let mut context = Box::new(UnwindContext::new());
    let executable: Vec<_> = elf
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .map(|s| s.address()..s.address() + s.size())
        .collect();
    // gimli's answer from .eh_frame through its .eh_frame_hdr search table, else from a search
    // of .debug_frame.
    let (hdr_address, hdr) = section_data(".eh_frame_hdr").expect(".eh_frame_hdr");
    let (eh_address, eh) = section_data(".eh_frame").expect(".eh_frame");
    let eh_bases = bases
        .clone()
        .set_eh_frame_hdr(hdr_address)
        .set_eh_frame(eh_address);
    let eh_frame = EhFrame::new(eh, gimli::LittleEndian);
    let hdr = EhFrameHdr::new(hdr, gimli::LittleEndian)
        .parse(&eh_bases, 8)
        .unwrap();
    let hdr_table = hdr.table().expect(".eh_frame_hdr has a search table");
    let mut debug_frame =
        section_data(".debug_frame").map(|(_, data)| DebugFrame::new(data, gimli::LittleEndian));
    if let Some(debug_frame) = &mut debug_frame {
        debug_frame.set_address_size(8);
    }
    for ip in executable.iter().flat_map(|r| r.clone()) {
        let mut gimli_says = hdr_table
            .unwind_info_for_address(
                &eh_frame,
                &eh_bases,
                &mut context,
                ip,
                EhFrame::cie_from_offset,
            )
            .ok()
            .map(|row| expected(&eh_frame, row, ip));
        if let (None, Some(debug_frame)) = (&gimli_says, &debug_frame) {
            gimli_says = debug_frame
                .fde_for_address(&bases, ip, DebugFrame::cie_from_offset)
                .and_then(|fde| {
                    fde.unwind_info_for_address(debug_frame, &bases, &mut context, ip)
                        .cloned()
                })
                .ok()
                .map(|row| expected(debug_frame, &row, ip));
        }
        agreement.check(ip, gimli_says, compiled(&table, ip));
    }
    println!("{name}: {agreement:?}");
    (table, agreement)
}

fn assert_agrees(path: &Path) -> UnwindTable {
    assert_image_agrees(&path.display().to_string(), &std::fs::read(path).unwrap())
}

fn assert_image_agrees(name: &str, data: &[u8]) -> UnwindTable {
    let (table, agreement) = check_every_address(name, data);
    assert!(
        agreement.mismatches.is_empty(),
        "{}: rows and gimli disagree: {:#?}",
        name,
        agreement.mismatches
    );
    // Unsupported CFI is rare, and counted by the compiler wherever it appears.
    assert!(
        agreement.unsupported * 1000 <= agreement.addresses,
        "{}: {} of {} addresses unsupported",
        name,
        agreement.unsupported,
        agreement.addresses
    );
    assert_eq!(
        agreement.agree + agreement.unsupported + agreement.untracked,
        agreement.addresses
    );
    if agreement.unsupported + agreement.untracked > 0 {
        assert!(table.stats.unsupported_rows() > 0);
    }
    table
}

#[test]
fn debian_libraries_and_programs_compile_to_rows_that_unwind_as_gimli_says() {
    for path in SYSTEM_FILES {
        let table = assert_agrees(Path::new(path));
        assert!(table.rows.len() > 100, "{path}: {} rows", table.rows.len());
    }
    // The kernel's vDSO, which every process maps with no file behind it.
    let vdso = crate::process::vdso::own_image().expect("this process has a vDSO");
    let table = assert_image_agrees("[vdso]", vdso);
    assert!(table.stats.fdes > 2, "{}", table.stats);
}

#[test]
fn a_program_without_frame_pointers_compiles_from_eh_frame_and_from_debug_frame() {
    let dir = tempfile::tempdir().unwrap();
    let eh = build_workload(dir.path(), "eh_frame", &[]);
    let eh_table = assert_agrees(&eh);
    // Without asynchronous unwind tables and with -g, gcc puts the CFI in .debug_frame only.
    let debug = build_workload(
        dir.path(),
        "debug_frame",
        &["-g", "-fno-asynchronous-unwind-tables"],
    );
    let data = std::fs::read(&debug).unwrap();
    let elf = object::File::parse(data.as_slice()).unwrap();
    assert!(elf.section_by_name(".debug_frame").is_some());
    let debug_table = assert_agrees(&debug);
    // main's FDE is in .debug_frame alone, and the table has its rows.
    let main = elf
        .symbols()
        .find(|symbol| symbol.name() == Ok("main"))
        .expect("main has a symbol")
        .address();
    let eh_frame = elf.section_by_name(".eh_frame").unwrap();
    let bases = BaseAddresses::default().set_eh_frame(eh_frame.address());
    let eh_frame = EhFrame::new(eh_frame.data().unwrap(), gimli::LittleEndian);
    assert!(eh_frame
        .fde_for_address(&bases, main, EhFrame::cie_from_offset)
        .is_err());
    let row = debug_table.lookup(main).unwrap();
    assert_eq!(row.cfa_rule, CfaRule::SpOffset as u8, "{row:?}");
    // The program's own functions are frameless: rows with SP-relative CFAs.
    for table in [&eh_table, &debug_table] {
        assert!(table
            .rows
            .iter()
            .any(|row| row.cfa_rule == CfaRule::SpOffset as u8 && row.cfa_offset > 8));
        assert!(!table
            .rows
            .iter()
            .any(|row| row.cfa_rule == CfaRule::FpOffset as u8));
    }
}

fn open(path: &Path) -> File {
    open_regular(path, FinalLink::Follow).unwrap()
}

fn table_key(elf: &object::File<'_>, file: &File) -> TableKey {
    let cfi = CfiSections::read(elf, &CompileLimits::DEFAULT).unwrap();
    TableKey::of(elf, file, &cfi).unwrap()
}

#[test]
fn tables_are_compiled_once_per_build_id_and_kept_on_disk_across_runs() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("profiler/unwind");
    // Two copies of one program: one build ID, so one compilation.
    let first = build_workload(dir.path(), "first", &[]);
    let second = dir.path().join("second");
    std::fs::copy(&first, &second).unwrap();
    let libc = Path::new(SYSTEM_FILES[0]);
    let mut cache = TableCache::new(Some(cache_dir.clone()));
    let table = cache.table(&open(&first), &first).unwrap();
    let again = cache.table(&open(&second), &second).unwrap();
    assert!(Arc::ptr_eq(&table.table, &again.table));
    let libc_table = cache.table(&open(libc), libc).unwrap();
    assert_eq!(
        (
            cache.stats.compiled,
            cache.stats.from_memory,
            cache.stats.from_disk
        ),
        (2, 1, 0)
    );
    assert!(
        cache.stats.problems.is_empty(),
        "{:?}",
        cache.stats.problems
    );
    let mode = std::fs::metadata(&cache_dir).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700, "the cache directory is private");
    assert_eq!(std::fs::read_dir(&cache_dir).unwrap().count(), 2);
    // A later run reads them back, equal to what was compiled.
    let mut next_run = TableCache::new(Some(cache_dir));
    assert_eq!(*next_run.table(&open(libc), libc).unwrap(), *libc_table);
    assert_eq!(*next_run.table(&open(&second), &second).unwrap(), *table);
    assert_eq!((next_run.stats.compiled, next_run.stats.from_disk), (0, 2));
}

#[test]
fn tables_no_one_holds_are_let_go_and_read_back_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let program = build_workload(dir.path(), "program", &[]);
    let mut cache = TableCache::new(Some(dir.path().join("cache")));
    let table = cache.table(&open(&program), &program).unwrap();
    assert!(cache.release_unused() == 0, "held, so kept");
    let compiled = (**table).clone();
    drop(table);
    assert!(
        cache.release_unused() == 0,
        "kept through the first release that finds it unused"
    );
    // Mapped again in between: served from memory, and held again.
    let table = cache.table(&open(&program), &program).unwrap();
    assert_eq!(cache.stats.from_memory, 1);
    assert!(cache.release_unused() == 0, "held again, so kept");
    drop(table);
    assert!(cache.release_unused() == 0);
    assert_eq!(cache.release_unused(), 1);
    assert!(cache.release_unused() == 0);
    // Mapped again: read back from disk, not compiled again.
    let again = cache.table(&open(&program), &program).unwrap();
    assert_eq!(**again, compiled);
    assert_eq!((cache.stats.compiled, cache.stats.from_disk), (1, 1));
}

#[test]
fn files_without_a_build_id_are_keyed_by_the_file_whatever_path_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build_workload(dir.path(), "no_build_id", &["-Wl,--build-id=none"]);
    let data = std::fs::read(&binary).unwrap();
    let elf = object::File::parse(data.as_slice()).unwrap();
    let file = open(&binary);
    let key = table_key(&elf, &file);
    let TableKey::File { size, .. } = &key else {
        panic!("{key:?}");
    };
    assert_eq!(*size, data.len() as u64);
    assert!(key.file_name().starts_with("file-"));
    // The loader reaches files by descriptor: another descriptor, another run, the same table.
    let cache_dir = dir.path().join("cache");
    TableCache::new(Some(cache_dir.clone()))
        .table(&file, &crate::input::descriptor_path(&file))
        .unwrap();
    let mut next_run = TableCache::new(Some(cache_dir));
    let _other_descriptor = open(&binary);
    let reopened = open(&binary);
    next_run
        .table(&reopened, &crate::input::descriptor_path(&reopened))
        .unwrap();
    assert_eq!((next_run.stats.compiled, next_run.stats.from_disk), (0, 1));
    // A file changed in place is another file.
    let mut changed = data.clone();
    changed.extend_from_slice(b"more");
    std::fs::write(&binary, &changed).unwrap();
    let elf = object::File::parse(changed.as_slice()).unwrap();
    assert_ne!(table_key(&elf, &open(&binary)), key);
}

#[test]
fn corrupt_or_hostile_cache_files_are_refused_with_the_reason_and_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    let xz = Path::new(SYSTEM_FILES[2]);
    let libc = Path::new(SYSTEM_FILES[0]);
    let mut cache = TableCache::new(Some(cache_dir.clone()));
    let good = cache.table(&open(xz), xz).unwrap();
    cache.table(&open(libc), libc).unwrap();
    let key_of = |path: &Path| {
        let data = std::fs::read(path).unwrap();
        let elf = object::File::parse(data.as_slice()).unwrap();
        table_key(&elf, &open(path))
    };
    let key = key_of(xz);
    let cache_file = cache_dir.join(key.file_name());
    let valid = std::fs::read(&cache_file).unwrap();
    // Rewrites the file's body and, when asked, a checksum that matches it.
    let with_crc = |mut body: Vec<u8>| {
        body.truncate(body.len() - 4);
        let crc = crc32fast::hash(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        body
    };
    let mut flipped = valid.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    let mut swapped = (**good).clone();
    swapped.rows.swap(1, 2);
    let mut unknown_rule = (**good).clone();
    unknown_rule.rows[3].cfa_rule = 99;
    // The row count claims more rows than the file holds.
    let count_at = valid.len() - 4 - good.row_bytes() - 4;
    let mut overcount = valid.clone();
    overcount[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let libc_file = std::fs::read(cache_dir.join(key_of(libc).file_name())).unwrap();
    for (bytes, reason) in [
        (flipped, "checksum mismatch: the file is corrupt"),
        (valid[..valid.len() / 3].to_vec(), "checksum mismatch"),
        (
            b"short".to_vec(),
            "truncated: magic needs 8 bytes, 1 are left",
        ),
        (
            encode_table(&key, &swapped),
            "row 2 is out of address order",
        ),
        (
            encode_table(&key, &unknown_rule),
            "row 3 names an unknown rule",
        ),
        (
            with_crc(overcount),
            "row count says 4294967295, more than the file holds",
        ),
        (libc_file, "it holds another file's table"),
    ] {
        std::fs::write(&cache_file, &bytes).unwrap();
        let mut next_run = TableCache::new(Some(cache_dir.clone()));
        let table = next_run.table(&open(xz), xz).unwrap();
        assert_eq!(*table, *good, "{reason}: recompiled");
        assert_eq!(next_run.stats.compiled, 1);
        let [problem] = next_run.stats.problems.as_slice() else {
            panic!("{reason}: {:?}", next_run.stats.problems);
        };
        assert!(
            problem.starts_with(&format!(
                "unwind-table cache file {}: ",
                cache_file.display()
            )) && problem.contains(reason)
                && problem.ends_with("it is ignored and the table recompiled"),
            "{problem}"
        );
        // The recompiled table replaced the bad file.
        assert_eq!(std::fs::read(&cache_file).unwrap(), valid);
    }
    // A directory other users may write to is not trusted, whatever its files say.
    std::fs::set_permissions(&cache_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut next_run = TableCache::new(Some(cache_dir.clone()));
    next_run.table(&open(xz), xz).unwrap();
    assert_eq!((next_run.stats.compiled, next_run.stats.from_disk), (1, 0));
    assert!(
        next_run.stats.problems[0].contains("is writable by other users (mode 777)"),
        "{:?}",
        next_run.stats.problems
    );
}

fn sp_row(offset: i32) -> UnwindRow {
    UnwindRow {
        cfa_rule: CfaRule::SpOffset as u8,
        cfa_offset: offset,
        ra_rule: SavedAt::CfaOffset as u8,
        ra_offset: -8,
        ..UnwindRow::default()
    }
}

/// An FDE's range, whether it is from `.debug_frame`, and its rows, for [`lay_out_fdes`].
type TestFde = (Range<u64>, bool, Vec<(u64, UnwindRow)>);

fn fde(range: Range<u64>, from_debug_frame: bool, rows: &[(u64, i32)]) -> TestFde {
    let rows = rows
        .iter()
        .map(|&(pc, offset)| (pc, sp_row(offset)))
        .collect();
    (range, from_debug_frame, rows)
}

/// [`lay_out`] of FDEs whose rows are given, in the order given.
fn lay_out_fdes(fdes: Vec<TestFde>, sections: &[Range<u64>]) -> Result<UnwindTable> {
    let entries = fdes
        .iter()
        .enumerate()
        .map(|(offset, (range, from_debug_frame, _))| FdeEntry {
            range: range.clone(),
            from_debug_frame: *from_debug_frame,
            offset,
        })
        .collect();
    let mut evaluate = |fde: &FdeEntry, rows: &mut Vec<(u64, UnwindRow)>, _: &mut CompileStats| {
        rows.clear();
        rows.extend_from_slice(&fdes[fde.offset].2);
        Ok(true)
    };
    lay_out(
        entries,
        sections,
        CompileStats::default(),
        100,
        &mut evaluate,
    )
}

#[test]
fn fdes_are_laid_end_to_end_with_gaps_marked_overlaps_clipped_and_equal_rows_merged() {
    let fdes = vec![
        // Out of order, as sections list them.
        fde(0x1038..0x1050, false, &[(0x1038, 16), (0x1048, 24)]),
        fde(
            0x1000..0x1010,
            false,
            &[(0x1000, 8), (0x1001, 16), (0x100f, 8)],
        ),
        // Its only row unwinds as the previous FDE's last: merged.
        fde(0x1010..0x1020, false, &[(0x1010, 8)]),
        fde(0x1030..0x1040, false, &[(0x1030, 8)]),
        // The same function in .debug_frame: .eh_frame's wins.
        fde(0x1030..0x1040, true, &[(0x1030, 64)]),
    ];
    let sections = [0xff0..0x1040, 0x1040..0x1060];
    let table = lay_out_fdes(fdes, &sections).unwrap();
    assert_eq!(table.base, 0x1000);
    let rows: Vec<(u32, u8, i32)> = table
        .rows
        .iter()
        .map(|row| (row.pc, row.cfa_rule, row.cfa_offset))
        .collect();
    let (sp, none) = (CfaRule::SpOffset as u8, CfaRule::NoInfo as u8);
    assert_eq!(
        rows,
        [
            (0x00, sp, 8),
            (0x01, sp, 16),
            (0x0f, sp, 8),
            (0x20, none, 0),
            (0x30, sp, 8),
            // The overlapping FDE from where the previous one ends, with its row in force there.
            (0x40, sp, 16),
            (0x48, sp, 24),
            (0x50, none, 0),
        ]
    );
    assert_eq!(
        table.no_cfi,
        [0xff0..0x1000, 0x1020..0x1030, 0x1050..0x1060]
    );
    assert_eq!(table.stats.overlapping_fdes, 2);
    assert_eq!(table.lookup(0x1025).unwrap().cfa_rule, none);
    assert_eq!(table.lookup(0x1047).unwrap().cfa_offset, 16);
    assert_eq!(table.lookup(0xfff), None);
    let err = lay_out_fdes(Vec::new(), &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no call-frame information (no FDE in .eh_frame or .debug_frame)"
    );
}

#[test]
fn a_file_without_cfi_is_refused_once_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("bare.s");
    std::fs::write(&source, ".text\n.globl f\nf:\n\tret\n").unwrap();
    let library = dir.path().join("bare.so");
    let status = std::process::Command::new("gcc")
        .args(["-shared", "-nostdlib", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success());
    let mut cache = TableCache::new(None);
    for _ in 0..2 {
        let err = cache.table(&open(&library), &library).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "compiling the unwind table of {}: no call-frame information (no FDE in \
                 .eh_frame or .debug_frame)",
                library.display()
            )
        );
    }
    assert_eq!((cache.stats.compiled, cache.stats.from_memory), (1, 1));
}

#[test]
fn a_malformed_fde_loses_only_its_own_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build_workload(dir.path(), "workload", &[]);
    let mut data = std::fs::read(&binary).unwrap();
    let good = compile(&object::File::parse(data.as_slice()).unwrap()).unwrap();
    let range = break_last_fde(&mut data);
    let elf = object::File::parse(data.as_slice()).unwrap();
    let table = compile(&elf).unwrap();
    assert_eq!(table.stats.malformed_fdes, 1, "{}", table.stats);
    assert_eq!(table.stats.fdes, good.stats.fdes - 1);
    assert!(table.stats.to_string().contains(", 1 malformed FDEs"));
    for address in [range.start, range.end - 1] {
        assert_ne!(
            good.lookup(address).unwrap().cfa_rule,
            CfaRule::NoInfo as u8
        );
        assert!(
            table
                .lookup(address)
                .is_none_or(|row| row.cfa_rule == CfaRule::NoInfo as u8),
            "{address:#x}"
        );
    }
    assert!(table.no_cfi.iter().any(|r| r.contains(&range.start)));
}

/// Makes the last FDE of the program `data` malformed (its first instruction one that does not
/// exist); the addresses it covers.
fn break_last_fde(data: &mut [u8]) -> Range<u64> {
    let (range, patch_at) = {
        let elf = object::File::parse(&*data).unwrap();
        let section = elf.section_by_name(".eh_frame").unwrap();
        let (file_offset, _) = section.file_range().unwrap();
        let bases = BaseAddresses::default().set_eh_frame(section.address());
        let eh_frame = EhFrame::new(section.data().unwrap(), gimli::LittleEndian);
        let mut entries = eh_frame.entries(&bases);
        // The program's last function: its FDE is the last in the section.
        let mut last = None;
        while let Some(entry) = entries.next().unwrap() {
            if let CieOrFde::Fde(partial) = entry {
                let fde = partial.parse(EhFrame::cie_from_offset).unwrap();
                assert!(fde.lsda().is_none(), "no augmentation data");
                last = Some((fde.initial_address()..fde.end_address(), fde.offset()));
            }
        }
        let (range, offset) = last.unwrap();
        // length, CIE pointer, pc_begin, pc_range, augmentation length: then instructions.
        (range, file_offset as usize + offset + 17)
    };
    // DW_CFA 0x17 is no instruction.
    data[patch_at] = 0x17;
    range
}

#[test]
fn files_with_one_build_id_and_different_cfi_get_their_own_tables_in_memory_and_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    let program = build_workload(dir.path(), "program", &[]);
    // Another user's file that says it is the same build, with other CFI.
    let mut data = std::fs::read(&program).unwrap();
    break_last_fde(&mut data);
    let impostor = dir.path().join("impostor");
    std::fs::write(&impostor, &data).unwrap();
    let build_id = |path: &Path| {
        let data = std::fs::read(path).unwrap();
        let elf = object::File::parse(data.as_slice()).unwrap();
        elf.build_id().unwrap().unwrap().to_vec()
    };
    assert_eq!(build_id(&program), build_id(&impostor));
    let mut cache = TableCache::new(Some(cache_dir.clone()));
    // The impostor is profiled first.
    let bad = cache.table(&open(&impostor), &impostor).unwrap();
    let good = cache.table(&open(&program), &program).unwrap();
    assert!(*bad != *good, "the impostor's table is its own");
    assert_eq!(bad.stats.malformed_fdes, 1);
    assert_eq!(good.stats.malformed_fdes, 0);
    assert_eq!((cache.stats.compiled, cache.stats.from_memory), (2, 0));
    assert_eq!(std::fs::read_dir(&cache_dir).unwrap().count(), 2);
    // Later runs read each back for its own file.
    let mut next_run = TableCache::new(Some(cache_dir));
    assert_eq!(*next_run.table(&open(&program), &program).unwrap(), *good);
    assert_eq!(*next_run.table(&open(&impostor), &impostor).unwrap(), *bad);
    assert_eq!((next_run.stats.compiled, next_run.stats.from_disk), (0, 2));
}

/// A `.debug_frame` of one FDE whose instructions are `rows` one-byte DW_CFA_advance_loc, each
/// a row: the shape that held over 1 GiB of rows from a 60 MB section.
fn one_byte_rows(rows: usize) -> Vec<u8> {
    let mut cie = Vec::new();
    cie.extend_from_slice(&u32::MAX.to_le_bytes()); // CIE id
    cie.push(1); // version
    cie.push(0); // augmentation ""
    cie.push(1); // code alignment
    cie.push(0x78); // data alignment -8
    cie.push(16); // return address register
    cie.extend_from_slice(&[0x0c, 7, 8]); // DW_CFA_def_cfa rsp+8
    cie.extend_from_slice(&[0x90, 1]); // DW_CFA_offset rip, cfa-8
    while (cie.len() + 4) % 8 != 0 {
        cie.push(0); // DW_CFA_nop
    }
    let mut fde = Vec::new();
    fde.extend_from_slice(&0u32.to_le_bytes()); // the CIE at offset 0
    fde.extend_from_slice(&0x1000u64.to_le_bytes()); // initial location
    fde.extend_from_slice(&(rows as u64 + 16).to_le_bytes()); // address range
    fde.resize(fde.len() + rows, 0x41); // DW_CFA_advance_loc 1
    while (fde.len() + 4) % 8 != 0 {
        fde.push(0);
    }
    let mut section = Vec::new();
    for entry in [cie, fde] {
        section.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        section.extend_from_slice(&entry);
    }
    section
}

fn debug_frame_only(data: &[u8]) -> CfiSections<'_> {
    CfiSections {
        architecture: "X86_64".into(),
        debug_frame: Some(Cow::Borrowed(data)),
        executable: vec![0x1000..0x1800, 0x1800..0x2000],
        ..CfiSections::default()
    }
}

#[test]
fn cfi_with_more_rows_than_the_limit_is_refused_before_they_are_held() {
    let rows = 200_000;
    let data = one_byte_rows(rows);
    let sections = debug_frame_only(&data);
    // Within the limit: every row evaluated, and merged into two.
    let within = CompileLimits {
        rows: rows + 1,
        ..CompileLimits::DEFAULT
    };
    let table = sections.compile(&within).unwrap();
    assert_eq!(table.stats.cfi_rows, rows as u64 + 1);
    assert_eq!(table.rows.len(), 2);
    // Over it: refused, having held no more than the limit's rows (24 bytes each, in a vector
    // that may double) and gimli's evaluation context.
    let limits = CompileLimits {
        rows: 1000,
        ..CompileLimits::DEFAULT
    };
    let (result, peak) = crate::alloc_meter::peak_bytes(|| sections.compile(&limits));
    assert_eq!(
        result.unwrap_err().to_string(),
        "more than the 1000 unwind rows a table may hold"
    );
    assert!(peak < 1000 * 48 + (64 << 10), "{peak} bytes held");
    // The default limit is within a table's.
    assert!(CompileLimits::DEFAULT.rows < MAX_TABLE_ROWS as usize);
}

#[test]
fn a_cfi_section_over_the_limit_is_refused_unread_with_the_reason() {
    let xz = Path::new(SYSTEM_FILES[2]);
    let data = std::fs::read(xz).unwrap();
    let elf = object::File::parse(data.as_slice()).unwrap();
    let size = elf.section_by_name(".eh_frame").unwrap().size();
    let limits = CompileLimits {
        section_bytes: 1000,
        ..CompileLimits::DEFAULT
    };
    let err = CfiSections::read(&elf, &limits).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(".eh_frame is {size} bytes, more than the 1000 a CFI section may take")
    );
    assert!(CfiSections::read(&elf, &CompileLimits::DEFAULT).is_ok());
}
