//! Where sampled code is, as the views and details name it: its position in its module, its
//! innermost source location, its instruction (`function+offset`), and the cache line size that
//! groups instructions and data addresses into lines.

use crate::profile::Frame;

/// Bytes in an instruction or data cache line.
pub const CACHE_LINE: u64 = profiler_common::capture::CACHE_LINE_BYTES;

/// The innermost source location of a frame: where the address really is.
pub fn innermost_location(frame: &Frame) -> (Option<&str>, Option<u32>, String) {
    match frame.inlined.last() {
        Some(inlined) => (
            inlined.file.as_deref(),
            inlined.line,
            inlined.function.clone(),
        ),
        None => (frame.file.as_deref(), frame.line, frame.display_name()),
    }
}

/// Where code is, independent of the process's load address: module and offset in its file, or
/// no module and the address.
pub fn code_position(frame: &Frame) -> (String, u64) {
    if frame.module.is_empty() {
        (String::new(), frame.address)
    } else {
        (frame.module.clone(), frame.module_offset)
    }
}

/// `function+0x1c`, module+offset for code without a symbol, or the address in no mapping.
pub fn instruction_location(frame: &Frame) -> String {
    match (&frame.function, frame.function_address) {
        (Some(function), Some(start)) => {
            format!("{function}+{:#x}", frame.address.wrapping_sub(start))
        }
        _ if frame.module.is_empty() => format!("{:#x}", frame.address),
        _ => frame.display_name(),
    }
}
