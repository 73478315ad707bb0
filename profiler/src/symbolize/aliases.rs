//! Other names of sampled functions: one address can carry several symbols (glibc's
//! `__memmove_avx_unaligned_erms` is also `__memcpy_avx_unaligned_erms`), and a symbolizer
//! picks one. The module's symbol table, or its separate debug file's (Debian's `libc6-dbg`
//! keeps glibc's internal names there), names the rest, so that a user can find the function by
//! the name they know.

use std::collections::{BTreeMap, BTreeSet};

use object::SymbolKind;

use crate::{
    fast_hash::HashSet,
    profile::{Frame, FunctionAliases},
    symbolize::module_file::{address_of_file_offset, sized_symbols},
};

/// The alias sets of the functions of `frames` (symbolized frames of one module), from that
/// module's image and its `debug` file.
pub fn function_aliases<'d, R: object::ReadRef<'d>>(
    module: &object::File<'d, R>,
    debug: Option<&object::File<'d, R>>,
    frames: &[Frame],
) -> Vec<FunctionAliases> {
    let Some(path) = frames.first().map(|frame| frame.module.clone()) else {
        return Vec::new();
    };
    // Each function's start, as a file offset, then at its link-time address.
    let starts: BTreeSet<u64> = frames.iter().filter_map(super::function_start).collect();
    let linked: HashSet<u64> = starts
        .into_iter()
        .filter_map(|offset| address_of_file_offset(module, offset))
        .collect();
    let mut names: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    add_names(module, &linked, &mut names);
    if let Some(debug) = debug {
        add_names(debug, &linked, &mut names);
    }
    names
        .into_values()
        .filter(|names| names.len() > 1)
        .map(|names| FunctionAliases {
            module: path.clone(),
            names: names.into_iter().collect(),
        })
        .collect()
}

/// Names the unnamed `frames` of `module` from its separate `debug` file's symbol table, which
/// keeps the functions a distribution strips from the module itself (glibc's
/// `__memmove_avx_unaligned_erms`): the smallest function holding the frame's address.
pub fn name_from_debug_file<'d, R: object::ReadRef<'d>>(
    module: &object::File<'d, R>,
    debug: &object::File<'d, R>,
    frames: &mut [Frame],
) {
    let mut linked: Vec<(u64, usize)> = frames
        .iter()
        .enumerate()
        .filter(|(_, frame)| frame.function.is_none())
        .filter_map(|(index, frame)| {
            Some((address_of_file_offset(module, frame.module_offset)?, index))
        })
        .collect();
    linked.sort_unstable();
    let holds = |start: u64, size: u64, address: u64| {
        (start..start.saturating_add(size)).contains(&address)
    };
    // By address, so that each symbol looks for a frame inside it with one search.
    let symbols = sized_symbols(debug, SymbolKind::Text, |start, size| {
        let first = linked.partition_point(|&(address, _)| address < start);
        linked
            .get(first)
            .is_some_and(|&(address, _)| holds(start, size, address))
    });
    for (address, index) in linked {
        let smallest = symbols
            .iter()
            .filter(|symbol| holds(symbol.address, symbol.size, address))
            .min_by_key(|symbol| symbol.size);
        if let Some(symbol) = smallest {
            let frame = &mut frames[index];
            frame.function = Some(symbol.name.clone());
            frame.function_address = Some(frame.address - (address - symbol.address));
        }
    }
}

/// Adds the names of the functions of `file` that start at one of the `linked` addresses.
fn add_names<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    linked: &HashSet<u64>,
    names: &mut BTreeMap<u64, BTreeSet<String>>,
) {
    for symbol in sized_symbols(file, SymbolKind::Text, |address, _| {
        linked.contains(&address)
    }) {
        names.entry(symbol.address).or_default().insert(symbol.name);
    }
}
