//! An ELF file's loadable segments, and where a mapping of one puts the file's virtual
//! addresses: what the unwind loader places tables by and the Python walker finds
//! `_PyRuntime` by.

use object::{Object, ObjectSegment};

use crate::process::Mapping;

/// The loadable segment a mapping from `file_offset` maps. The kernel maps whole pages, so a
/// segment that starts mid-page (file offset 0x13730 at address 0x14730) is mapped from the page
/// before (file offset 0x13000), which may also hold the end of the previous segment: the
/// page-aligned range is matched, the executable segment first (the mapping is code).
pub fn segment_holding(segments: &[Segment], file_offset: u64) -> Option<&Segment> {
    let holds = |segment: &&Segment| {
        let start = segment.offset & !(PAGE_BYTES - 1);
        (start..segment.offset.saturating_add(segment.size)).contains(&file_offset)
    };
    segments
        .iter()
        .filter(|segment| segment.executable)
        .find(holds)
        .or_else(|| segments.iter().find(holds))
}

/// Run-time address minus ELF virtual address for `mapping`, which maps `segment`.
pub fn load_bias(segment: &Segment, mapping: &Mapping) -> u64 {
    // mapping.start holds file offset `file_offset`, at virtual address
    // segment.address + (file_offset - segment.offset).
    let virtual_address = segment
        .address
        .wrapping_add(mapping.file_offset)
        .wrapping_sub(segment.offset);
    mapping.start.wrapping_sub(virtual_address)
}

/// The page size loadable segments are mapped in (x86-64).
pub const PAGE_BYTES: u64 = 4096;

/// One loadable segment of a file.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub offset: u64,
    pub size: u64,
    pub address: u64,
    pub executable: bool,
}

/// The loadable segments of an ELF file.
pub fn segments<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Vec<Segment> {
    elf.segments()
        .map(|segment| {
            let (offset, size) = segment.file_range();
            let executable = matches!(
                segment.flags(),
                object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
            );
            Segment {
                offset,
                size,
                address: segment.address(),
                executable,
            }
        })
        .collect()
}
