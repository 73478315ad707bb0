//! GNU build IDs: read from the mapped ELF files, and spelled in hex as perf and debuginfod spell
//! them (the unwind-table cache and the symbolizer name files by them).

use std::{fs, sync::Arc};

use crate::input::ModuleImage;

/// The GNU build ID of an ELF file, read in bounded ranges.
pub(super) fn build_id_of(file: &fs::File) -> Option<Arc<[u8]>> {
    let image = ModuleImage::of(file)?;
    let elf = object::File::parse(&image).ok()?;
    object::Object::build_id(&elf).ok().flatten().map(Arc::from)
}

/// `bytes` in lower-case hex: a build ID as perf and debuginfod spell it.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
    hex
}
