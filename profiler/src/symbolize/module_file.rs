//! Reading load modules (ELF files) at record time, through the descriptors the side-band
//! opened ([`crate::process::ProcessTable::module_image`]): where a file offset lies
//! in the module's address space, its symbols, and the load bias of a mapping.

use object::{Object, ObjectSegment, ObjectSymbol, ReadRef, SymbolKind};

use crate::symbolize::demangle::demangle;

/// Most symbols one module gives a capture: a crafted symbol table can hold millions at the
/// wanted addresses, each with a 4 KiB name.
const MAX_MATCHED_SYMBOLS: usize = 10_000;

/// The hex build ID of a parsed module.
pub fn build_id<'d, R: ReadRef<'d>>(module: &object::File<'d, R>) -> Option<String> {
    module.build_id().ok().flatten().map(crate::process::hex)
}

/// A symbol with its extent, at its link-time address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleSymbol {
    pub name: String,
    pub address: u64,
    pub size: u64,
}

/// Symbols of one kind with a size whose extent `wanted` accepts (at most
/// [`MAX_MATCHED_SYMBOLS`]), from the symbol table or, in stripped files, the dynamic symbol
/// table; sorted by address. Only those accepted are named, so a module's size never decides
/// what this keeps.
pub fn sized_symbols<'d, R: ReadRef<'d>>(
    module: &object::File<'d, R>,
    kind: SymbolKind,
    wanted: impl Fn(u64, u64) -> bool,
) -> Vec<ModuleSymbol> {
    let mut symbols: Vec<ModuleSymbol> = module
        .symbols()
        .chain(module.dynamic_symbols())
        .filter(|s| {
            s.kind() == kind && s.size() > 0 && s.is_definition() && wanted(s.address(), s.size())
        })
        .take(MAX_MATCHED_SYMBOLS)
        .filter_map(|s| {
            Some(ModuleSymbol {
                name: demangle(s.name().ok()?),
                address: s.address(),
                size: s.size(),
            })
        })
        .collect();
    symbols.sort_by(|a, b| (a.address, &a.name).cmp(&(b.address, &b.name)));
    symbols.dedup();
    symbols
}

/// Link-time address of a file offset, through the loadable segment holding it.
pub fn address_of_file_offset<'d, R: ReadRef<'d>>(
    module: &object::File<'d, R>,
    offset: u64,
) -> Option<u64> {
    module.segments().find_map(|segment| {
        let (start, size) = segment.file_range();
        (start..start + size)
            .contains(&offset)
            .then(|| segment.address() + (offset - start))
    })
}

/// How far a mapping of the module at `start` (file offset `file_offset`) moved its link-time
/// addresses: runtime address = link-time address + bias (wrapping).
pub fn load_bias<'d, R: ReadRef<'d>>(
    module: &object::File<'d, R>,
    start: u64,
    file_offset: u64,
) -> Option<u64> {
    module.segments().find_map(|segment| {
        let (segment_offset, size) = segment.file_range();
        // Mappings start on a page boundary below the segment's first byte.
        let page_start = segment_offset & !0xfff;
        (page_start..segment_offset + size)
            .contains(&file_offset)
            .then(|| {
                let linked = segment
                    .address()
                    .wrapping_add(file_offset)
                    .wrapping_sub(segment_offset);
                start.wrapping_sub(linked)
            })
    })
}

/// Whether a link-time address lies in one of the module's loadable segments (bss included).
pub fn in_segments<'d, R: ReadRef<'d>>(module: &object::File<'d, R>, address: u64) -> bool {
    module
        .segments()
        .any(|s| (s.address()..s.address() + s.size()).contains(&address))
}
