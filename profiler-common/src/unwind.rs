//! Unwind rows: the compact form of an executable's call-frame information (CFI) that stack
//! walkers read without frame pointers, one row per address range over which the rule for
//! finding the caller stays the same. This module owns the row layout, the bounded row lookup
//! and the one-frame [`step`], shared by the agent (which compiles rows from `.eh_frame`) and by
//! any walker that runs them, in the eBPF program or on the host.
//!
//! Everything here is written for the BPF verifier as much as for the host: no allocation, no
//! recursion, no floating point, no indexing without a bounds check, and every loop bounded by
//! a constant. Rows are plain integers, so a row read from a map or a file can hold any bytes;
//! unknown rule values are reported ([`StepEnd::InvalidRow`]), never trusted.
//!
//! The rules are architecture-neutral (a CFA from the stack or frame pointer, registers saved at
//! offsets); what is x86-64's alone is named so ([`CfaRule::PltX86_64`],
//! [`UnwindRow::FRAME_POINTER_X86_64`]), so that an aarch64 walker (which also tracks the link
//! register) can reuse the layout.

/// The registers a walk carries from frame to frame (x86-64: rip, rsp, rbp).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Registers {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
}

/// How a row finds the CFA: the value the stack pointer had just before the call into this
/// frame (the caller's stack pointer after the return).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfaRule {
    /// No call-frame information covers this address (assembly without CFI, padding between
    /// functions, JIT code): a walker may fall back to frame pointers.
    NoInfo = 0,
    /// CFA = SP + offset.
    SpOffset = 1,
    /// CFA = FP + offset.
    FpOffset = 2,
    /// CFA = *(SP + offset): the stack pointer saved in a signal context.
    DerefSpOffset = 3,
    /// CFA = *(FP + offset): a frame that realigned its stack and saved the old pointer.
    DerefFpOffset = 4,
    /// A PLT stub's DWARF expression: CFA = SP + offset, plus 8 once the stub has pushed its
    /// relocation index, that is when `(ip & 15) >= arg` (`arg` is the row's `cfa_arg`).
    PltX86_64 = 5,
    /// CFI exists here but says something this format cannot express.
    Unsupported = 6,
}

impl CfaRule {
    pub const fn from_u8(value: u8) -> Option<CfaRule> {
        Some(match value {
            0 => CfaRule::NoInfo,
            1 => CfaRule::SpOffset,
            2 => CfaRule::FpOffset,
            3 => CfaRule::DerefSpOffset,
            4 => CfaRule::DerefFpOffset,
            5 => CfaRule::PltX86_64,
            6 => CfaRule::Unsupported,
            _ => return None,
        })
    }
}

/// Where the caller's value of a register (the frame pointer, the return address) is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedAt {
    /// The register still holds the caller's value (a callee-saved register this frame has not
    /// saved). Meaningless for the return address, where it is [`SavedAt::Unsupported`].
    Unchanged = 0,
    /// At CFA + offset.
    CfaOffset = 1,
    /// At SP + offset: in the context the kernel saved on a signal (for the return address,
    /// the interrupted instruction itself, not a return address).
    SpOffset = 2,
    /// Nothing to recover: for the return address, the outermost frame (`_start`, a thread's
    /// start), where the stack is complete.
    Undefined = 3,
    /// CFI this format cannot express.
    Unsupported = 4,
}

impl SavedAt {
    pub const fn from_u8(value: u8) -> Option<SavedAt> {
        Some(match value {
            0 => SavedAt::Unchanged,
            1 => SavedAt::CfaOffset,
            2 => SavedAt::SpOffset,
            3 => SavedAt::Undefined,
            4 => SavedAt::Unsupported,
            _ => return None,
        })
    }
}

/// One row: from `pc` (an offset from its table's base address) up to the next row's `pc`, how
/// to find the caller. 16 bytes, no padding; any bytes are a valid value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    pub cfa_offset: i32,
    /// With [`SavedAt::CfaOffset`] or [`SavedAt::SpOffset`]: where the caller's frame pointer is.
    pub fp_offset: i16,
    /// With [`SavedAt::CfaOffset`] or [`SavedAt::SpOffset`]: where the return address is.
    pub ra_offset: i16,
    /// A [`CfaRule`].
    pub cfa_rule: u8,
    /// Second operand of the CFA rule ([`CfaRule::PltX86_64`]'s threshold), else 0.
    pub cfa_arg: u8,
    /// A [`SavedAt`] for the frame pointer.
    pub fp_rule: u8,
    /// A [`SavedAt`] for the return address.
    pub ra_rule: u8,
}

impl UnwindRow {
    /// Bytes of one row, in memory and in files.
    pub const SIZE: usize = 16;

    /// x86-64's frame-pointer convention (`push rbp; mov rbp, rsp`), for code without CFI whose
    /// frames keep it: CFA = RBP + 16, the caller's RBP at CFA - 16, the return address at
    /// CFA - 8.
    pub const FRAME_POINTER_X86_64: UnwindRow = UnwindRow {
        pc: 0,
        cfa_offset: 16,
        fp_offset: -16,
        ra_offset: -8,
        cfa_rule: CfaRule::FpOffset as u8,
        cfa_arg: 0,
        fp_rule: SavedAt::CfaOffset as u8,
        ra_rule: SavedAt::CfaOffset as u8,
    };

    /// A row saying that no CFI covers the addresses from `pc` on.
    pub const fn no_info(pc: u32) -> UnwindRow {
        UnwindRow {
            pc,
            cfa_offset: 0,
            fp_offset: 0,
            ra_offset: 0,
            cfa_rule: CfaRule::NoInfo as u8,
            cfa_arg: 0,
            fp_rule: SavedAt::Unchanged as u8,
            ra_rule: SavedAt::Unchanged as u8,
        }
    }

    /// Whether two rows unwind the same way (everything but `pc`): consecutive rows that do are
    /// merged.
    pub const fn same_rule(&self, other: &UnwindRow) -> bool {
        self.cfa_offset == other.cfa_offset
            && self.fp_offset == other.fp_offset
            && self.ra_offset == other.ra_offset
            && self.cfa_rule == other.cfa_rule
            && self.cfa_arg == other.cfa_arg
            && self.fp_rule == other.fp_rule
            && self.ra_rule == other.ra_rule
    }

    /// Whether every rule byte names a known rule.
    pub const fn is_valid(&self) -> bool {
        CfaRule::from_u8(self.cfa_rule).is_some()
            && SavedAt::from_u8(self.fp_rule).is_some()
            && SavedAt::from_u8(self.ra_rule).is_some()
    }

    /// The row's bytes, little-endian whatever the host (files written on one machine are read
    /// on another).
    pub fn to_bytes(&self) -> [u8; UnwindRow::SIZE] {
        let mut out = [0u8; UnwindRow::SIZE];
        let (pc, rest) = out.split_at_mut(4);
        pc.copy_from_slice(&self.pc.to_le_bytes());
        let (cfa_offset, rest) = rest.split_at_mut(4);
        cfa_offset.copy_from_slice(&self.cfa_offset.to_le_bytes());
        let (fp_offset, rest) = rest.split_at_mut(2);
        fp_offset.copy_from_slice(&self.fp_offset.to_le_bytes());
        let (ra_offset, rest) = rest.split_at_mut(2);
        ra_offset.copy_from_slice(&self.ra_offset.to_le_bytes());
        rest.copy_from_slice(&[self.cfa_rule, self.cfa_arg, self.fp_rule, self.ra_rule]);
        out
    }

    pub fn from_bytes(bytes: &[u8; UnwindRow::SIZE]) -> UnwindRow {
        let [p0, p1, p2, p3, c0, c1, c2, c3, f0, f1, r0, r1, cfa_rule, cfa_arg, fp_rule, ra_rule] =
            *bytes;
        UnwindRow {
            pc: u32::from_le_bytes([p0, p1, p2, p3]),
            cfa_offset: i32::from_le_bytes([c0, c1, c2, c3]),
            fp_offset: i16::from_le_bytes([f0, f1]),
            ra_offset: i16::from_le_bytes([r0, r1]),
            cfa_rule,
            cfa_arg,
            fp_rule,
            ra_rule,
        }
    }
}

/// Binary-search steps [`find_row_by`] takes at most: enough for any table of fewer than
/// [`MAX_TABLE_ROWS`] rows.
pub const MAX_SEARCH_STEPS: u32 = 24;
/// Rows one table may hold (the compiler refuses to build a larger one).
pub const MAX_TABLE_ROWS: u32 = (1 << MAX_SEARCH_STEPS) - 1;

/// The index of the last row whose `pc` is at or below `pc`, among `len` rows sorted by `pc`,
/// where `pc_at(i)` reads row `i`'s `pc` (a slice index, or a map lookup in BPF). `None` when
/// `pc` is below the first row, when a read fails, or when `len` exceeds [`MAX_TABLE_ROWS`].
/// Takes at most [`MAX_SEARCH_STEPS`] steps, whose bounds pass through `settle` (see
/// [`find_last_at_or_below`]).
#[inline(always)]
pub fn find_row_by(
    len: u32,
    pc: u32,
    pc_at: impl FnMut(u32) -> Option<u32>,
    settle: impl FnMut(u32) -> u32,
) -> Option<u32> {
    if len > MAX_TABLE_ROWS {
        return None;
    }
    find_last_at_or_below(len, MAX_SEARCH_STEPS, pc, pc_at, settle)
}

/// Whether `index` is what [`find_row_by`] finds for `pc` among `len` rows: its row's `pc` is at
/// or below `pc` and the next row's, if any, above it. Checked against the rows as they are, a
/// remembered answer that passes is the search's answer whatever happened to the table since,
/// so a cache of answers needs no invalidation. Two row reads, where a search takes up to
/// [`MAX_SEARCH_STEPS`].
#[inline(always)]
pub fn is_row_for(
    len: u32,
    pc: u32,
    index: u32,
    mut pc_at: impl FnMut(u32) -> Option<u32>,
) -> bool {
    if len > MAX_TABLE_ROWS || index >= len {
        return false;
    }
    if !matches!(pc_at(index), Some(at) if at <= pc) {
        return false;
    }
    index + 1 == len || matches!(pc_at(index + 1), Some(next) if next > pc)
}

/// The index of the last of `len` sorted keys (`key_at(i)` reads key `i`) at or below `key`, in
/// at most `steps` binary-search steps (enough for `len` below `2^steps`). `None` when `key` is
/// below the first key, a read fails, or the steps run out before the search ends. Each step's
/// bounds pass through `settle`: the identity, but in BPF it hides their values from the
/// verifier, which then sees every path through a step as one state. With the bounds tracked it
/// keeps each step's two outcomes apart (later branches depend on them): up to 2^steps states,
/// each checked through the rest of the program.
#[inline(always)]
pub fn find_last_at_or_below<K: PartialOrd + Copy>(
    len: u32,
    steps: u32,
    key: K,
    mut key_at: impl FnMut(u32) -> Option<K>,
    mut settle: impl FnMut(u32) -> u32,
) -> Option<u32> {
    // Keys below `lo` are at or below `key`, keys from `hi` on above it: once the two meet, the
    // answer is the one before `lo`.
    let mut lo = 0u32;
    let mut hi = len;
    for _ in 0..steps {
        lo = settle(lo);
        hi = settle(hi);
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if key_at(mid)? <= key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo < hi {
        return None;
    }
    lo.checked_sub(1)
}

/// [`find_row_by`] over a slice: the row covering `pc`.
pub fn find_row(rows: &[UnwindRow], pc: u32) -> Option<&UnwindRow> {
    let len = u32::try_from(rows.len()).ok()?;
    let index = find_row_by(len, pc, |i| rows.get(i as usize).map(|row| row.pc), |i| i)?;
    rows.get(index as usize)
}

/// Why [`step`] found no caller.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepEnd {
    /// The return address is undefined: this is the outermost frame and the stack is complete.
    EndOfStack = 0,
    /// The return address is zero: also the outermost frame, by the older convention.
    ZeroReturnAddress = 1,
    /// No CFI covers the address ([`CfaRule::NoInfo`]).
    NoUnwindInfo = 2,
    /// CFI this format cannot express.
    UnsupportedRule = 3,
    /// A rule byte names no known rule: a corrupt table.
    InvalidRow = 4,
    /// A stack read (saved stack pointer, frame pointer or return address) failed.
    ReadFailed = 5,
    /// The caller's stack pointer is not above this frame's: a garbage frame or a loop.
    StackWentBackwards = 6,
}

/// The caller's registers, found by [`step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub regs: Registers,
    /// `regs.ip` was restored from a signal context: it is the interrupted instruction, not a
    /// return address.
    pub interrupted: bool,
}

impl Caller {
    /// The address whose row unwinds the caller: a return address points after its call
    /// instruction, which may be a function's last (a call to a `noreturn` function), so the
    /// call itself is looked up; an interrupted instruction is looked up as it is.
    pub fn lookup_ip(&self) -> u64 {
        if self.interrupted {
            self.regs.ip
        } else {
            self.regs.ip.wrapping_sub(1)
        }
    }
}

/// Unwinds one frame: from the registers of the frame executing at `regs.ip`, whose row is
/// `row`, finds the caller's, reading the stack (8-byte words) through `read`.
#[inline(always)]
pub fn step(
    row: &UnwindRow,
    regs: &Registers,
    mut read: impl FnMut(u64) -> Option<u64>,
) -> Result<Caller, StepEnd> {
    let (Some(cfa_rule), Some(fp_rule), Some(ra_rule)) = (
        CfaRule::from_u8(row.cfa_rule),
        SavedAt::from_u8(row.fp_rule),
        SavedAt::from_u8(row.ra_rule),
    ) else {
        return Err(StepEnd::InvalidRow);
    };
    match cfa_rule {
        CfaRule::NoInfo => return Err(StepEnd::NoUnwindInfo),
        CfaRule::Unsupported => return Err(StepEnd::UnsupportedRule),
        _ => {}
    }
    // Checked before any read: a row's rules are used whole or not at all.
    if fp_rule == SavedAt::Unsupported
        || matches!(ra_rule, SavedAt::Unsupported | SavedAt::Unchanged)
    {
        return Err(StepEnd::UnsupportedRule);
    }
    let offset = i64::from(row.cfa_offset);
    let cfa = match cfa_rule {
        CfaRule::NoInfo | CfaRule::Unsupported => return Err(StepEnd::UnsupportedRule),
        CfaRule::SpOffset => regs.sp.wrapping_add_signed(offset),
        CfaRule::FpOffset => regs.fp.wrapping_add_signed(offset),
        CfaRule::DerefSpOffset => {
            read(regs.sp.wrapping_add_signed(offset)).ok_or(StepEnd::ReadFailed)?
        }
        CfaRule::DerefFpOffset => {
            read(regs.fp.wrapping_add_signed(offset)).ok_or(StepEnd::ReadFailed)?
        }
        CfaRule::PltX86_64 => {
            let pushed = if regs.ip & 15 >= u64::from(row.cfa_arg) {
                8
            } else {
                0
            };
            regs.sp.wrapping_add_signed(offset).wrapping_add(pushed)
        }
    };
    let interrupted = ra_rule == SavedAt::SpOffset;
    // A signal handler may run on its own stack, below or above the interrupted one.
    if !interrupted && cfa <= regs.sp {
        return Err(StepEnd::StackWentBackwards);
    }
    let mut saved = |rule: SavedAt, offset: i16, current: u64| -> Result<u64, StepEnd> {
        let address = match rule {
            SavedAt::Unchanged => return Ok(current),
            SavedAt::CfaOffset => cfa.wrapping_add_signed(i64::from(offset)),
            SavedAt::SpOffset => regs.sp.wrapping_add_signed(i64::from(offset)),
            SavedAt::Undefined => return Err(StepEnd::EndOfStack),
            SavedAt::Unsupported => return Err(StepEnd::UnsupportedRule),
        };
        read(address).ok_or(StepEnd::ReadFailed)
    };
    let ip = saved(ra_rule, row.ra_offset, 0)?;
    let fp = match fp_rule {
        // An undefined frame pointer is left as it is, as other unwinders do: callers rarely
        // need it, and the walk can go on.
        SavedAt::Undefined => regs.fp,
        rule => saved(rule, row.fp_offset, regs.fp)?,
    };
    if ip == 0 {
        return Err(StepEnd::ZeroReturnAddress);
    }
    Ok(Caller {
        regs: Registers { ip, sp: cfa, fp },
        interrupted,
    })
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] with only integer fields and no padding (16 bytes, checked below), so every
// bit pattern is a valid row and there are no uninitialized bytes.
unsafe impl aya::Pod for UnwindRow {}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u32, cfa_rule: CfaRule, cfa_offset: i32) -> UnwindRow {
        UnwindRow {
            pc,
            cfa_offset,
            cfa_rule: cfa_rule as u8,
            ra_rule: SavedAt::CfaOffset as u8,
            ra_offset: -8,
            ..UnwindRow::default()
        }
    }

    /// A stack of 8-byte words from `base` up.
    fn stack(base: u64, words: &[u64]) -> impl FnMut(u64) -> Option<u64> + '_ {
        move |address| {
            let index = address.checked_sub(base)? / 8;
            (address % 8 == 0).then_some(())?;
            words.get(usize::try_from(index).ok()?).copied()
        }
    }

    #[test]
    fn rows_are_sixteen_bytes_and_round_trip_through_bytes() {
        assert_eq!(core::mem::size_of::<UnwindRow>(), UnwindRow::SIZE);
        let row = UnwindRow {
            pc: 0x1234_5678,
            cfa_offset: -70000,
            fp_offset: -16,
            ra_offset: 300,
            cfa_rule: 5,
            cfa_arg: 11,
            fp_rule: 2,
            ra_rule: 9,
        };
        assert_eq!(UnwindRow::from_bytes(&row.to_bytes()), row);
        assert_eq!(row.to_bytes()[..4], [0x78, 0x56, 0x34, 0x12]);
        assert!(!row.is_valid(), "ra_rule 9 names no rule");
    }

    #[test]
    fn lookup_finds_the_last_row_at_or_below_the_pc() {
        let rows = [
            row(0x10, CfaRule::SpOffset, 8),
            row(0x20, CfaRule::SpOffset, 16),
        ];
        assert_eq!(find_row(&rows, 0xf), None);
        assert_eq!(find_row(&rows, 0x10).unwrap().cfa_offset, 8);
        assert_eq!(find_row(&rows, 0x1f).unwrap().cfa_offset, 8);
        assert_eq!(find_row(&rows, 0x20).unwrap().cfa_offset, 16);
        assert_eq!(find_row(&rows, u32::MAX).unwrap().cfa_offset, 16);
        assert_eq!(find_row(&[], 5), None);
        // Every index of a large table is reached within the step bound.
        let len = 1_000_003u32;
        for pc in [0, 1, 2, 500_000, len - 2, len - 1, len + 10] {
            let expected = pc.min(len - 1);
            assert_eq!(find_row_by(len, pc, Some, |i| i), Some(expected), "pc {pc}");
        }
        assert_eq!(
            find_row_by(MAX_TABLE_ROWS, MAX_TABLE_ROWS, Some, |i| i),
            Some(MAX_TABLE_ROWS - 1)
        );
        assert_eq!(find_row_by(MAX_TABLE_ROWS + 1, 0, Some, |i| i), None);
        // A failed read ends the search.
        assert_eq!(find_row_by(10, 5, |i| (i != 5).then_some(i), |i| i), None);
    }

    #[test]
    fn a_remembered_row_index_is_accepted_only_where_the_search_would_find_it() {
        // Rows at pcs 0, 10, 20, 20, 30: the search takes the last of equal pcs.
        let pcs = [0u32, 10, 20, 20, 30];
        let pc_at = |i: u32| pcs.get(i as usize).copied();
        let len = pcs.len() as u32;
        for pc in 0..40 {
            for index in 0..len + 2 {
                let found = find_row_by(len, pc, pc_at, |i| i);
                assert_eq!(
                    is_row_for(len, pc, index, pc_at),
                    found == Some(index),
                    "pc {pc}, index {index}"
                );
            }
        }
        // A pc below the first row has no row; a failed read accepts nothing.
        let shifted = |i: u32| pcs.get(i as usize).map(|pc| pc + 5);
        assert!(!is_row_for(len, 2, 0, shifted));
        assert!(!is_row_for(len, 15, 1, |i| (i != 2).then_some(10 * i)));
        assert!(!is_row_for(MAX_TABLE_ROWS + 1, 0, 0, Some));
    }

    #[test]
    fn a_frameless_frame_steps_by_its_stack_pointer_offset() {
        // sub rsp, 24 after the call: CFA = RSP + 32, return address at CFA - 8.
        let r = row(0, CfaRule::SpOffset, 32);
        let words = [0, 0, 0, 0x40_1123, 0];
        let regs = Registers {
            ip: 0x40_1000,
            sp: 0x1000,
            fp: 77,
        };
        let caller = step(&r, &regs, stack(0x1000, &words)).unwrap();
        assert_eq!(
            caller.regs,
            Registers {
                ip: 0x40_1123,
                sp: 0x1020,
                fp: 77
            }
        );
        assert!(!caller.interrupted);
        assert_eq!(caller.lookup_ip(), 0x40_1122);
    }

    #[test]
    fn frame_pointer_frames_restore_the_callers_frame_pointer() {
        let words = [0x2000, 0x40_5555];
        let regs = Registers {
            ip: 1,
            sp: 0x0f00,
            fp: 0x1000,
        };
        let caller = step(
            &UnwindRow::FRAME_POINTER_X86_64,
            &regs,
            stack(0x1000, &words),
        )
        .unwrap();
        assert_eq!(
            caller.regs,
            Registers {
                ip: 0x40_5555,
                sp: 0x1010,
                fp: 0x2000
            }
        );
    }

    #[test]
    fn plt_stubs_count_the_pushed_index_past_the_threshold() {
        let mut r = row(0, CfaRule::PltX86_64, 8);
        r.cfa_arg = 11;
        let words = [0, 0x1111, 0x2222];
        for (ip, sp, ra) in [(0x1030, 0x1008, 0x1111), (0x103b, 0x1000, 0x1111)] {
            let regs = Registers { ip, sp, fp: 0 };
            let caller = step(&r, &regs, stack(0x1000, &words)).unwrap();
            assert_eq!((caller.regs.ip, caller.regs.sp), (ra, 0x1010), "ip {ip:#x}");
        }
    }

    #[test]
    fn signal_frames_restore_the_interrupted_context() {
        // __restore_rt: CFA = *(RSP + 160), RBP at RSP + 120, RIP at RSP + 168.
        let r = UnwindRow {
            pc: 0,
            cfa_offset: 160,
            fp_offset: 120,
            ra_offset: 168,
            cfa_rule: CfaRule::DerefSpOffset as u8,
            cfa_arg: 0,
            fp_rule: SavedAt::SpOffset as u8,
            ra_rule: SavedAt::SpOffset as u8,
        };
        let mut words = [0u64; 22];
        words[15] = 0xbbbb;
        words[20] = 0x0800; // below the handler's stack: an alternate signal stack
        words[21] = 0x40_2000;
        let regs = Registers {
            ip: 0x7000,
            sp: 0x1000,
            fp: 0,
        };
        let caller = step(&r, &regs, stack(0x1000, &words)).unwrap();
        assert_eq!(
            caller.regs,
            Registers {
                ip: 0x40_2000,
                sp: 0x0800,
                fp: 0xbbbb
            }
        );
        assert!(caller.interrupted);
        assert_eq!(caller.lookup_ip(), 0x40_2000);
    }

    #[test]
    fn walks_end_with_the_reason() {
        let regs = Registers {
            ip: 1,
            sp: 0x1000,
            fp: 0x1000,
        };
        let words = [0u64; 4];
        let mut outermost = row(0, CfaRule::SpOffset, 8);
        outermost.ra_rule = SavedAt::Undefined as u8;
        let mut bad = row(0, CfaRule::SpOffset, 8);
        bad.fp_rule = 200;
        for (r, end) in [
            (outermost, StepEnd::EndOfStack),
            (row(0, CfaRule::SpOffset, 8), StepEnd::ZeroReturnAddress),
            (UnwindRow::no_info(0), StepEnd::NoUnwindInfo),
            (row(0, CfaRule::Unsupported, 0), StepEnd::UnsupportedRule),
            (bad, StepEnd::InvalidRow),
            (row(0, CfaRule::SpOffset, 4096), StepEnd::ReadFailed),
            (row(0, CfaRule::FpOffset, -16), StepEnd::StackWentBackwards),
        ] {
            assert_eq!(step(&r, &regs, stack(0x1000, &words)), Err(end), "{r:?}");
        }
    }
}
