//! CPython frames: where CPython 3.10-3.13 keep a thread's frame chain (offsets from the
//! official headers, x86-64 and aarch64 alike: LP64), how the walker encodes a Python frame
//! among a stack's native frames, and the line tables that turn a frame's instruction into its
//! source line.
//!
//! The walker reads, at sample time, each frame's code object and instruction: a process's
//! frames change too fast to be read afterwards. Code objects live as long as their functions,
//! so names, files and lines are read in userspace from the code object, by address.

/// Where CPython keeps what the walker reads, for one minor version. Byte offsets; `NONE` where
/// the version has no such field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonOffsets {
    /// 10 to 13.
    pub minor: u32,
    /// `_PyRuntimeState.interpreters.head`: the main interpreter.
    pub runtime_interpreters: u32,
    /// `PyInterpreterState.threads.head`.
    pub interpreter_threads: u32,
    /// `PyThreadState.next`.
    pub thread_next: u32,
    /// `PyThreadState.native_thread_id` (3.11 on: the kernel's thread id), or `thread_id` (3.10:
    /// `pthread_self()`, which glibc makes the thread pointer, `fsbase` on x86-64).
    pub thread_id: u32,
    /// 1 when `thread_id` is the kernel's thread id, 0 when it is the thread pointer.
    pub thread_id_is_native: u32,
    /// `PyThreadState.frame` (3.10), `.cframe` (3.11, 3.12) or `.current_frame` (3.13).
    pub thread_frame: u32,
    /// `_PyCFrame.current_frame` behind `cframe` (3.11, 3.12); `NONE` where `thread_frame` is
    /// the frame itself.
    pub cframe_current: u32,
    /// The caller: `PyFrameObject.f_back` (3.10), `_PyInterpreterFrame.previous`.
    pub frame_back: u32,
    /// `f_code` (to 3.12), `f_executable` (3.13).
    pub frame_code: u32,
    /// `f_lasti` (3.10: an `int`, the index of the last instruction), `prev_instr` (3.11,
    /// 3.12) or `instr_ptr` (3.13): a pointer into the code object's `co_code_adaptive`.
    pub frame_instruction: u32,
    /// `is_entry` (3.11) or `owner` (3.12 on), one byte; `NONE` for 3.10.
    pub frame_marker: u32,
    /// `PyCodeObject.co_code_adaptive` (3.11 on); `NONE` for 3.10.
    pub code_adaptive: u32,
}

/// An offset the version does not have.
pub const NONE: u32 = u32::MAX;

/// `_PyInterpreterFrame.owner` of the frame a C call of the evaluator pushes under the first
/// frame it runs (3.12 on): it ends the frames that call ran.
pub const FRAME_OWNED_BY_CSTACK: u8 = 3;

impl PythonOffsets {
    /// The offsets of CPython 3.`minor`, for the versions the walker knows.
    pub const fn of_minor(minor: u32) -> Option<PythonOffsets> {
        let offsets = match minor {
            10 => PythonOffsets {
                minor,
                runtime_interpreters: 32,
                interpreter_threads: 8,
                thread_next: 8,
                thread_id: 176,
                thread_id_is_native: 0,
                thread_frame: 24,
                cframe_current: NONE,
                frame_back: 24,
                frame_code: 32,
                frame_instruction: 96,
                frame_marker: NONE,
                code_adaptive: NONE,
            },
            11 => PythonOffsets {
                minor,
                runtime_interpreters: 40,
                interpreter_threads: 16,
                thread_next: 8,
                thread_id: 160,
                thread_id_is_native: 1,
                thread_frame: 56,
                cframe_current: 8,
                frame_back: 48,
                frame_code: 32,
                frame_instruction: 56,
                frame_marker: 68,
                code_adaptive: 184,
            },
            12 => PythonOffsets {
                minor,
                runtime_interpreters: 40,
                interpreter_threads: 72,
                thread_next: 8,
                thread_id: 144,
                thread_id_is_native: 1,
                thread_frame: 56,
                cframe_current: 0,
                frame_back: 8,
                frame_code: 0,
                frame_instruction: 56,
                frame_marker: 70,
                code_adaptive: 192,
            },
            13 => PythonOffsets {
                minor,
                runtime_interpreters: 632,
                interpreter_threads: 7344,
                thread_next: 8,
                thread_id: 160,
                thread_id_is_native: 1,
                thread_frame: 72,
                cframe_current: NONE,
                frame_back: 8,
                frame_code: 0,
                frame_instruction: 56,
                frame_marker: 70,
                code_adaptive: 200,
            },
            _ => return None,
        };
        Some(offsets)
    }
}

/// What the walker knows of a CPython process: where its runtime state is and how its
/// version lays out what it reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonProcess {
    /// The address of `_PyRuntime` in the process.
    pub runtime: u64,
    pub offsets: PythonOffsets,
    pub _pad: u32,
}

/// Processes the walker reads Python frames of.
pub const MAX_PYTHON_PROCESSES: u32 = 4096;
/// Threads of one interpreter searched for the sampled one.
pub const MAX_PYTHON_THREADS: usize = 32;
/// Python frames read a stack; the outermost beyond are left out (counted).
pub const MAX_PYTHON_FRAMES: usize = 48;

/// A Python frame among a stack's frames: its two top bits are `10`. No address has them: user
/// addresses are below 2^57, kernel addresses (x86-64 with 4 or 5 levels of page tables,
/// aarch64) and perf's context markers have both top bits set.
pub const PYTHON_FRAME: u64 = 1 << 63;
const TAG_MASK: u64 = 3 << 62;
/// The first (innermost) Python frame of a native call of the evaluator other than the innermost
/// call: the frames before it belong to the calls it made. Each call's frames replace its
/// native frame.
pub const PYTHON_CALL_START: u64 = 1 << 61;
const INDEX_SHIFT: u32 = 45;
const INDEX_MAX: u64 = (1 << 16) - 1;
const CODE_BITS: u64 = (1 << INDEX_SHIFT) - 1;

/// A Python frame as the walker records it: its code object (an 8-aligned address below 2^48),
/// its instruction (code units from the start of the bytecode, at most 2^16 - 1: beyond, the
/// last), and whether it starts its evaluator call's frames. `None` for an address that cannot
/// be encoded.
#[inline(always)]
pub const fn encode_frame(code: u64, instruction: u64, starts_call: bool) -> Option<u64> {
    if code == 0 || code & 7 != 0 || code >> 48 != 0 {
        return None;
    }
    let index = if instruction > INDEX_MAX {
        INDEX_MAX
    } else {
        instruction
    };
    let starts_call = if starts_call { PYTHON_CALL_START } else { 0 };
    Some(PYTHON_FRAME | starts_call | index << INDEX_SHIFT | code >> 3)
}

/// A frame the walker recorded, when it is a Python frame: (code object, instruction, whether
/// it starts an evaluator call's frames).
pub const fn decode_frame(frame: u64) -> Option<(u64, u64, bool)> {
    if frame & TAG_MASK != PYTHON_FRAME {
        return None;
    }
    Some((
        (frame & CODE_BITS) << 3,
        (frame >> INDEX_SHIFT) & INDEX_MAX,
        frame & PYTHON_CALL_START != 0,
    ))
}

/// The source line of the instruction `index` (code units) of a code object whose first line is
/// `first_line` and whose `co_linetable` is `table`, in the format of CPython 3.`minor`; `None`
/// where the table gives the instruction no line.
pub fn line_of(minor: u32, table: &[u8], first_line: i64, index: u64) -> Option<i64> {
    match minor {
        10 => line_of_310(table, first_line, index.saturating_mul(2)),
        _ => line_of_311(table, first_line, index),
    }
}

/// 3.10 (PEP 626): pairs of (bytes of code, signed line delta); a delta of -128: no line.
fn line_of_310(table: &[u8], first_line: i64, byte: u64) -> Option<i64> {
    let (mut line, mut start) = (first_line, 0u64);
    for pair in table.chunks_exact(2) {
        let end = start + u64::from(pair[0]);
        let delta = pair[1] as i8;
        if delta != -128 {
            line += i64::from(delta);
        }
        if start <= byte && byte < end {
            return (delta != -128).then_some(line);
        }
        start = end;
    }
    None
}

/// 3.11 on: entries of a header byte `1CCCCLLL` (code C, L+1 code units) and the code's data.
fn line_of_311(table: &[u8], first_line: i64, index: u64) -> Option<i64> {
    let mut bytes = table.iter().copied();
    let (mut line, mut start) = (first_line, 0u64);
    while let Some(header) = bytes.next() {
        if header & 0x80 == 0 {
            return None;
        }
        let code = (header >> 3) & 15;
        let end = start + u64::from(header & 7) + 1;
        let known = match code {
            15 => false,
            14 => {
                line += signed_varint(&mut bytes)?;
                for _ in 0..3 {
                    varint(&mut bytes)?;
                }
                true
            }
            13 => {
                line += signed_varint(&mut bytes)?;
                true
            }
            10..=12 => {
                line += i64::from(code) - 10;
                bytes.next()?;
                bytes.next()?;
                true
            }
            _ => {
                bytes.next()?;
                true
            }
        };
        if start <= index && index < end {
            return known.then_some(line);
        }
        start = end;
    }
    None
}

/// A varint of the location table: 6 bits a byte, low first, 0x40 while more follow.
fn varint(bytes: &mut impl Iterator<Item = u8>) -> Option<u64> {
    let mut byte = bytes.next()?;
    let mut value = u64::from(byte & 63);
    let mut shift = 6;
    while byte & 64 != 0 && shift < 64 {
        byte = bytes.next()?;
        value |= u64::from(byte & 63) << shift;
        shift += 6;
    }
    Some(value)
}

/// A signed varint: the sign in the lowest bit.
fn signed_varint(bytes: &mut impl Iterator<Item = u8>) -> Option<i64> {
    let value = varint(bytes)?;
    let magnitude = (value >> 1) as i64;
    Some(if value & 1 != 0 {
        -magnitude
    } else {
        magnitude
    })
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)] with only integer fields; `_pad` fills the tail (64 bytes).
unsafe impl aya::Pod for PythonProcess {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_frame_round_trips_and_no_native_address_looks_like_one() {
        let code = 0x7f12_3456_7890;
        let frame = encode_frame(code, 321, true).unwrap();
        assert_eq!(decode_frame(frame), Some((code, 321, true)));
        let frame = encode_frame(code, 1 << 20, false).unwrap();
        assert_eq!(decode_frame(frame), Some((code, INDEX_MAX, false)));
        assert_eq!(encode_frame(code + 4, 0, false), None);
        assert_eq!(encode_frame(1 << 48, 0, false), None);
        assert_eq!(decode_frame(0x7fff_ffff_f000), None);
        assert_eq!(decode_frame(crate::unwind_maps::TRUNCATED_FRAME), None);
        // Kernel text (x86-64 with 4 and 5 levels, aarch64) and perf's context markers.
        for kernel in [
            0xffff_ffff_8100_0000,
            0xff11_0000_0000_0000,
            0xffff_8000_8000_0000,
        ] {
            assert_eq!(decode_frame(kernel), None);
        }
        assert_eq!(decode_frame((-512i64) as u64), None);
    }

    /// `f` of 3.10-3.13, whose lines are 3 to 6 (a comprehension on 5), as each version
    /// compiled it, against the lines its `co_lines()` gives every instruction.
    #[test]
    fn line_tables_give_the_lines_the_interpreters_give() {
        // Minor version, line table, the line of each instruction.
        type Case = (u32, &'static [u8], &'static [Option<i64>]);
        let cases: [Case; 4] = [
            (
                10,
                &[8, 1, 8, 1, 18, 1, 4, 1],
                &[
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(6),
                    Some(6),
                ],
            ),
            (
                11,
                &[
                    128, 0, 216, 8, 9, 136, 65, 137, 5, 128, 65, 216, 7, 8, 136, 49, 130, 117, 128,
                    117, 216, 15, 36, 208, 15, 36, 157, 53, 160, 17, 153, 56, 156, 56, 208, 15, 36,
                    209, 15, 36, 212, 15, 36, 208, 8, 36, 216, 11, 12, 128, 72,
                ],
                &[
                    Some(2),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(6),
                    Some(6),
                ],
            ),
            (
                12,
                &[
                    128, 0, 216, 8, 9, 136, 65, 137, 5, 128, 65, 216, 7, 8, 136, 49, 130, 117, 220,
                    27, 32, 160, 17, 155, 56, 214, 15, 36, 144, 97, 146, 1, 210, 15, 36, 208, 8,
                    36, 216, 11, 12, 128, 72, 249, 242, 3, 0, 16, 37,
                ],
                &[
                    Some(2),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(6),
                    Some(6),
                    None,
                    None,
                    Some(5),
                    Some(5),
                    Some(5),
                ],
            ),
            (
                13,
                &[
                    128, 0, 216, 8, 9, 136, 65, 137, 5, 128, 65, 216, 7, 8, 136, 49, 131, 117, 220,
                    27, 32, 160, 17, 156, 56, 211, 15, 36, 153, 56, 144, 97, 146, 1, 153, 56, 209,
                    15, 36, 208, 8, 36, 216, 11, 12, 128, 72, 249, 242, 3, 0, 16, 37,
                ],
                &[
                    Some(2),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(3),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(4),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(5),
                    Some(6),
                    Some(6),
                    None,
                    None,
                    Some(5),
                    Some(5),
                    Some(5),
                ],
            ),
        ];
        for (minor, table, lines) in cases {
            for (index, line) in lines.iter().enumerate() {
                let found = line_of(minor, table, 2, index as u64);
                assert_eq!(found, *line, "3.{minor}, instruction {index}");
            }
        }
    }
}
