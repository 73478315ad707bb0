//! Python frames named: the code objects the walker recorded read from their process's memory
//! (its function's qualified name, file, first line and line table) while the process lives,
//! and each evaluator call's Python frames put in place of its native frame
//! (`_PyEval_EvalFrameDefault`), so that native code a Python function called stays under it.
//!
//! The process's memory is another program's: every read is bounded and checked (the object's
//! type is `code`, strings are compact and short, the line table small), and a code object
//! that does not read so is named as unreadable, never guessed.

use std::{collections::HashMap, fs::File, os::unix::fs::FileExt};

use profiler_common::python::{decode_frame, line_of};

use crate::{
    process::{
        python::{interpreter_mappings, PythonCode},
        ProcessTable,
    },
    profile::{Frame, FrameId},
};

/// The module of every Python frame: flame graphs and reports tell them apart by it.
pub const PYTHON_MODULE: &str = "[python]";
/// A Python frame whose code object could not be read (its process exited first, or the
/// object was freed): it keeps its place in the stack.
pub const UNREADABLE_CODE: &str = "[python code not readable]";
/// The native function each call of CPython's evaluator is.
const EVALUATOR: &str = "_PyEval_EvalFrameDefault";

/// Longest name or file name read; longer ones are cut.
const MAX_NAME_BYTES: u64 = 1024;
/// Largest line table read (a function of some 10,000 lines); larger ones give no lines.
const MAX_LINE_TABLE_BYTES: u64 = 64 << 10;

/// Where a code object and its strings keep what naming needs, for one minor version (the
/// official headers' layout, LP64).
struct CodeLayout {
    first_line: u64,
    file_name: u64,
    /// `co_qualname` (3.11 on), else `co_name`.
    name: u64,
    line_table: u64,
    /// Where a compact ASCII string's characters start (`sizeof(PyASCIIObject)`), and a compact
    /// string's of wider characters (`sizeof(PyCompactUnicodeObject)`).
    ascii_data: u64,
    compact_data: u64,
}

impl CodeLayout {
    fn of_minor(minor: u32) -> Option<CodeLayout> {
        Some(match minor {
            10 => CodeLayout {
                first_line: 40,
                file_name: 104,
                name: 112,
                line_table: 120,
                ascii_data: 48,
                compact_data: 72,
            },
            11 => CodeLayout {
                first_line: 72,
                file_name: 112,
                name: 128,
                line_table: 136,
                ascii_data: 48,
                compact_data: 72,
            },
            12 | 13 => CodeLayout {
                first_line: 68,
                file_name: 112,
                name: 128,
                line_table: 136,
                ascii_data: 40,
                compact_data: 56,
            },
            _ => return None,
        })
    }
}

/// `PyObject.ob_type`, `PyTypeObject.tp_name`, `PyVarObject.ob_size`, `PyBytesObject.ob_sval`,
/// `PyASCIIObject.length` and `.state`: the same in every version.
const OB_TYPE: u64 = 8;
const TP_NAME: u64 = 24;
const OB_SIZE: u64 = 16;
const BYTES_DATA: u64 = 32;
const STRING_LENGTH: u64 = 16;
const STRING_STATE: u64 = 32;

/// The memory and interpreter version of the processes read in one naming pass; the code
/// objects read are kept in the process table ([`crate::process::python::PythonCodeCache`]).
#[derive(Default)]
pub struct PythonCodeReader {
    processes: HashMap<u32, Option<(File, u32)>>,
}

impl PythonCodeReader {
    /// The frame of the Python frame `recorded` of process `pid` (`None` when `recorded` is
    /// no Python frame).
    pub fn frame(&mut self, table: &ProcessTable, pid: u32, recorded: u64) -> Option<Frame> {
        let (code_address, instruction, _) = decode_frame(recorded)?;
        let processes = &mut self.processes;
        let code = table.python_code.get_or_read(pid, code_address, || {
            let (memory, minor) = processes
                .entry(pid)
                .or_insert_with(|| open_process(table, pid))
                .as_ref()?;
            read_code(memory, *minor, code_address)
        });
        let function = code.as_ref().map_or(UNREADABLE_CODE, |code| &code.name);
        Some(Frame {
            address: recorded,
            module: PYTHON_MODULE.to_string(),
            function: Some(function.to_string()),
            file: code.as_ref().map(|code| code.file.clone()),
            line: code.as_ref().and_then(|code| {
                let line = line_of(code.minor, &code.line_table, code.first_line, instruction)?;
                u32::try_from(line).ok()
            }),
            ..Frame::default()
        })
    }
}

/// Process `pid`'s memory and its interpreter's minor version, where it runs CPython.
fn open_process(table: &ProcessTable, pid: u32) -> Option<(File, u32)> {
    let process = table.processes.get(&pid)?;
    let (_, minor) = interpreter_mappings(process.mappings.iter()).next()?;
    CodeLayout::of_minor(minor)?;
    let memory = File::open(format!("/proc/{pid}/mem")).ok()?;
    Some((memory, minor))
}

fn read_u64(memory: &File, address: u64) -> Option<u64> {
    let mut bytes = [0; 8];
    memory.read_exact_at(&mut bytes, address).ok()?;
    Some(u64::from_le_bytes(bytes))
}

fn read_bytes(memory: &File, address: u64, length: u64) -> Option<Vec<u8>> {
    let mut bytes = vec![0; usize::try_from(length).ok()?];
    memory.read_exact_at(&mut bytes, address).ok()?;
    Some(bytes)
}

/// The code object at `address`, checked to be one.
fn read_code(memory: &File, minor: u32, address: u64) -> Option<PythonCode> {
    let layout = CodeLayout::of_minor(minor)?;
    let kind = read_u64(memory, address + OB_TYPE)?;
    let kind_name = read_u64(memory, kind + TP_NAME)?;
    if read_bytes(memory, kind_name, 5)? != b"code\0" {
        return None;
    }
    let first_line = read_u64(memory, address + layout.first_line)? as u32 as i32;
    let table = read_u64(memory, address + layout.line_table)?;
    let table_length = read_u64(memory, table + OB_SIZE)?;
    let line_table = match table_length <= MAX_LINE_TABLE_BYTES {
        true => read_bytes(memory, table + BYTES_DATA, table_length)?,
        false => Vec::new(),
    };
    Some(PythonCode {
        minor,
        name: read_string(memory, &layout, read_u64(memory, address + layout.name)?)?,
        file: read_string(
            memory,
            &layout,
            read_u64(memory, address + layout.file_name)?,
        )?,
        first_line: i64::from(first_line),
        line_table,
    })
}

/// A compact `str` object's text (the only kind code objects hold), cut at
/// [`MAX_NAME_BYTES`] characters.
fn read_string(memory: &File, layout: &CodeLayout, address: u64) -> Option<String> {
    let state = read_u64(memory, address + STRING_STATE)? as u32;
    let (kind, compact, ascii) = (
        (state >> 2) & 7,
        state & (1 << 5) != 0,
        state & (1 << 6) != 0,
    );
    if !compact || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let length = read_u64(memory, address + STRING_LENGTH)?.min(MAX_NAME_BYTES);
    let data = address
        + if ascii {
            layout.ascii_data
        } else {
            layout.compact_data
        };
    let bytes = read_bytes(memory, data, length * u64::from(kind))?;
    let text = match kind {
        1 => bytes.iter().map(|&byte| char::from(byte)).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|unit| char::from_u32(u32::from(u16::from_le_bytes([unit[0], unit[1]]))))
            .collect::<Option<String>>()?,
        _ => bytes
            .chunks_exact(4)
            .map(|unit| char::from_u32(u32::from_le_bytes([unit[0], unit[1], unit[2], unit[3]])))
            .collect::<Option<String>>()?,
    };
    Some(text)
}

/// The stack `ids` (named frames of the recorded `frames`, leaf first: the native frames, then
/// the Python frames the walker appended, innermost first) with each evaluator call's Python
/// frames in place of its native frame. Python frames the native walk did not reach (it was
/// cut short) stay outermost, before the walk's end marker.
pub fn splice_python_frames(frames: &[u64], ids: Vec<FrameId>, named: &[Frame]) -> Vec<FrameId> {
    let Some(first) = frames
        .iter()
        .position(|frame| decode_frame(*frame).is_some())
    else {
        return ids;
    };
    let mut groups: Vec<&[FrameId]> = Vec::new();
    let mut start = first;
    for (at, frame) in frames.iter().enumerate().skip(first + 1) {
        if decode_frame(*frame).is_some_and(|(_, _, starts_call)| starts_call) {
            groups.push(&ids[start..at]);
            start = at;
        }
    }
    groups.push(&ids[start..]);
    let mut groups = groups.into_iter();
    let mut spliced = Vec::with_capacity(ids.len());
    for &id in &ids[..first] {
        let is_evaluator = named[id as usize].function.as_deref() == Some(EVALUATOR);
        match is_evaluator.then(|| groups.next()).flatten() {
            Some(group) => spliced.extend_from_slice(group),
            None => spliced.push(id),
        }
    }
    let rest: Vec<FrameId> = groups.flatten().copied().collect();
    let end_marker = frames[..first]
        .last()
        .is_some_and(|frame| profiler_common::unwind_maps::is_marker_frame(*frame));
    let at = spliced.len() - usize::from(end_marker && !spliced.is_empty());
    spliced.splice(at..at, rest);
    spliced
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::python::encode_frame;

    #[test]
    fn each_evaluator_call_is_replaced_by_the_python_frames_it_ran() {
        let named: Vec<Frame> = [
            "zlib_compress",
            EVALUATOR,
            "builtin_call",
            EVALUATOR,
            "main",
            "leaf",
            "caller",
            "module",
            "marker",
        ]
        .iter()
        .map(|name| Frame {
            function: Some(name.to_string()),
            ..Frame::default()
        })
        .collect();
        let python = |code: u64, starts: bool| encode_frame(code << 3, 0, starts).unwrap();
        // Native: compress <- eval <- builtin <- eval <- main; Python: leaf (the inner call),
        // caller (starts the outer call), module.
        let frames = [
            0x1000,
            0x2000,
            0x3000,
            0x2000,
            0x4000,
            python(1, false),
            python(2, true),
            python(3, false),
        ];
        let ids = vec![0, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(
            splice_python_frames(&frames, ids, &named),
            [0, 5, 2, 6, 7, 4]
        );
        // Cut short: the native walk ended (marker) before the outer call's evaluator.
        let frames = [0x1000, 0x2000, 0x3000, 0, python(1, false), python(2, true)];
        let ids = vec![0, 1, 2, 8, 5, 6];
        assert_eq!(splice_python_frames(&frames, ids, &named), [0, 5, 2, 6, 8]);
        // No Python frames: as it was.
        assert_eq!(
            splice_python_frames(&[0x1000, 0x2000], vec![0, 1], &named),
            [0, 1]
        );
    }
}
