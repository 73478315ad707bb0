//! CPython's perf trampolines (`python -X perf`, `PYTHONPERFSUPPORT=1`, 3.12 and later): an
//! anonymous executable mapping filled with copies of one small stub, each listed in the
//! process's perf map under the Python function it starts. The stub calls the interpreter
//! without a frame record or unwind information (x86-64: `sub $8,%rsp; call *%rcx;
//! add $8,%rsp; ret`, from `Python/asm_trampoline.S`), so frame pointers cannot step it and a
//! stack through it ended there. Its rule is known from its bytes, and every copy has the same:
//! a table of rows for the whole mapping lets the walker step it like any function with CFI.
//!
//! Other JIT code (node's `--perf-basic-prof`, a JVM's) keeps frame pointers and gets no table:
//! the walker steps it by them.

use std::{fs::File, os::unix::fs::FileExt};

use profiler_common::unwind::{CfaRule, SavedAt, UnwindRow};

use super::tables::{CompileStats, UnwindTable};

/// `endbr64`, which a CET-enabled build puts first.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// The stub after it: `sub $8,%rsp; call *%rcx; add $8,%rsp; ret`.
const STUB_X86_64: [u8; 11] = [
    0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08, 0xc3,
];
/// Where, in the stub, the stack pointer is 8 bytes lower than at its entry: from after the
/// `sub` up to the `ret` (the return address of the `call` points at the `add`).
const LOWERED: std::ops::Range<u32> = 4..10;

/// Bytes of a mapping read to recognize it: enough for a few copies of the stub.
const PROBE_BYTES: usize = 64;
/// Most bytes of a mapping given a table: CPython's arenas are 64 KiB each (adjacent ones may
/// merge into one mapping), two rows per copy; code beyond is walked by frame pointers.
const MAX_TABLE_BYTES: u64 = 1 << 20;

/// The layout of a mapping of stub copies: all the table depends on, so mappings of the same
/// layout, in any process, share one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TrampolineLayout {
    /// Bytes before the stub in each copy (`endbr64`), 0 or 4.
    prefix: u8,
    /// Distance between copies: the stub and its padding (11 bytes in 3.12, 16 in 3.13).
    stride: u8,
    /// Bytes of the mapping the table covers.
    bytes: u32,
}

impl TrampolineLayout {
    /// The layout of a mapping of `bytes` that starts with `code`, if it is stub copies: the
    /// stub, then at the same stride as many more copies as `code` holds whole.
    pub fn recognize(code: &[u8], bytes: u64) -> Option<TrampolineLayout> {
        let prefix = if code.starts_with(&ENDBR64) { 4 } else { 0 };
        let stub = code.get(..prefix + STUB_X86_64.len())?;
        if stub[prefix..] != STUB_X86_64 {
            return None;
        }
        // The next copy: the first place the stub repeats, padding between.
        let stride =
            (stub.len()..=code.len() - stub.len()).find(|&at| code[at..].starts_with(stub))?;
        let whole = code.len() / stride;
        let copies_agree = (1..whole).all(|k| code[k * stride..].starts_with(stub));
        let padding_is_padding = code[stub.len()..stride]
            .iter()
            .all(|&byte| byte == 0 || byte == 0xcc || byte == 0x90);
        (copies_agree && padding_is_padding && whole >= 2).then(|| TrampolineLayout {
            prefix: prefix as u8,
            stride: stride as u8,
            bytes: bytes.min(MAX_TABLE_BYTES) as u32,
        })
    }

    /// The layout of process `pid`'s executable anonymous mapping at `start`, of `bytes`, read
    /// from its memory; `None` when it is something else or cannot be read.
    pub fn of_mapping(pid: u32, start: u64, bytes: u64) -> Option<TrampolineLayout> {
        let memory = File::open(format!("/proc/{pid}/mem")).ok()?;
        let mut code = [0; PROBE_BYTES];
        let read = usize::try_from(bytes).map_or(PROBE_BYTES, |b| b.min(PROBE_BYTES));
        memory.read_exact_at(&mut code[..read], start).ok()?;
        TrampolineLayout::recognize(&code[..read], bytes)
    }

    /// The rows of a mapping of this layout, `pc` from its start: in each copy, the CFA is the
    /// stack pointer plus 8 at the entry and the `ret`, plus 16 between; the return address
    /// just below it, the frame pointer untouched. Past the last whole copy, no rule.
    pub fn table(&self) -> UnwindTable {
        let row = |pc: u32, cfa_offset: i32| UnwindRow {
            pc,
            cfa_offset,
            fp_offset: 0,
            ra_offset: -8,
            cfa_rule: CfaRule::SpOffset as u8,
            cfa_arg: 0,
            fp_rule: SavedAt::Unchanged as u8,
            ra_rule: SavedAt::CfaOffset as u8,
        };
        let stride = u32::from(self.stride);
        let copies = self.bytes / stride;
        let prefix = u32::from(self.prefix);
        let mut rows = Vec::with_capacity(2 * copies as usize + 2);
        for copy in 0..copies {
            let start = copy * stride;
            // The entry's rule is the previous `ret`'s: one row serves both.
            if copy == 0 {
                rows.push(row(0, 8));
            }
            rows.push(row(start + prefix + LOWERED.start, 16));
            rows.push(row(start + prefix + LOWERED.end, 8));
        }
        rows.push(UnwindRow::no_info(copies * stride));
        UnwindTable {
            base: 0,
            rows,
            no_cfi: Vec::new(),
            stats: CompileStats::default(),
        }
    }

    /// Bytes of the mapping the table covers.
    pub fn bytes(&self) -> u64 {
        u64::from(self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `copies` copies of the stub (with `prefix` before it) at `stride`, zero-padded.
    fn arena(prefix: &[u8], stride: usize, copies: usize) -> Vec<u8> {
        let mut code = vec![0; stride * copies];
        for copy in 0..copies {
            let at = copy * stride;
            code[at..at + prefix.len()].copy_from_slice(prefix);
            code[at + prefix.len()..at + prefix.len() + STUB_X86_64.len()]
                .copy_from_slice(&STUB_X86_64);
        }
        code
    }

    #[test]
    fn cpython_312_and_313_arenas_are_recognized_and_others_are_not() {
        // 3.12: copies back to back; 3.13: padded to 16 bytes; a CET build: endbr64 first.
        for (prefix, stride) in [(&[][..], 11), (&[][..], 16), (&ENDBR64[..], 16)] {
            let code = arena(prefix, stride, 8);
            let layout = TrampolineLayout::recognize(&code[..PROBE_BYTES], 0x10000).unwrap();
            assert_eq!(
                (layout.prefix as usize, layout.stride as usize, layout.bytes),
                (prefix.len(), stride, 0x10000)
            );
        }
        // One copy then other code; a stub that differs; too short to tell.
        let mut mixed = arena(&[], 11, 8);
        mixed[11..22].copy_from_slice(&[0x55; 11]);
        assert_eq!(
            TrampolineLayout::recognize(&mixed[..PROBE_BYTES], 0x10000),
            None
        );
        let mut other = arena(&[], 11, 8);
        for copy in 0..5 {
            other[copy * 11 + 5] = 0xd0; // call *%rax
        }
        assert_eq!(
            TrampolineLayout::recognize(&other[..PROBE_BYTES], 0x10000),
            None
        );
        assert_eq!(TrampolineLayout::recognize(&STUB_X86_64, 0x10000), None);
        assert_eq!(
            TrampolineLayout::recognize(&[0x90; PROBE_BYTES], 0x10000),
            None
        );
        // Non-padding bytes between copies are another program's code.
        let mut gaps = arena(&[], 16, 4);
        gaps[12] = 0x55;
        assert_eq!(TrampolineLayout::recognize(&gaps, 0x10000), None);
    }

    #[test]
    fn the_rows_step_each_copy_at_its_entry_inside_and_at_its_ret() {
        let code = arena(&[], 11, 8);
        let layout = TrampolineLayout::recognize(&code[..PROBE_BYTES], 0x10000).unwrap();
        let table = layout.table();
        let cfa = |pc: u64| {
            let row = table.lookup(pc)?;
            (row.cfa_rule == CfaRule::SpOffset as u8).then_some(row.cfa_offset)
        };
        // Copy 3 (at 33): entry, the call, the return address (the add), the ret.
        assert_eq!(
            [33, 37, 39, 43].map(cfa),
            [Some(8), Some(16), Some(16), Some(8)]
        );
        // The last whole copy ends the table: 5957 copies of 11 bytes in 64 KiB.
        assert_eq!(cfa(5956 * 11 + 6), Some(16));
        assert_eq!(cfa(5957 * 11), None);
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        assert_eq!(table.rows.len(), 2 * 5957 + 2);
        // A mapping larger than any arena is covered only so far.
        let huge = TrampolineLayout::recognize(&code[..PROBE_BYTES], 1 << 40).unwrap();
        assert_eq!(huge.bytes(), MAX_TABLE_BYTES);
    }
}
