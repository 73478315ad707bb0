//! Code without symbols, named by the function that holds it. Stripping keeps the call-frame
//! information (`.eh_frame`: unwinding and C++ exceptions need it), and its FDEs give every
//! function's bounds; so a stripped function is one name, `module+0xstart` (its link-time
//! start, as `nm` of the unstripped file and `readelf --debug-dump=frames` show it), however
//! many of its addresses were sampled, and one row in every view and export.

use object::ReadRef;

use super::module_file::address_of_file_offset;
use crate::{
    profile::{module_basename, Frame},
    unwind::tables::{CfiSections, CompileLimits},
};

/// Names the frames of `module` that have no function by the FDE holding their address.
pub fn name_by_call_frames<'d, R: ReadRef<'d>>(module: &object::File<'d, R>, frames: &mut [Frame]) {
    let Ok(sections) = CfiSections::read(module, &CompileLimits::DEFAULT) else {
        return;
    };
    let functions = sections.function_ranges();
    for frame in frames.iter_mut().filter(|frame| frame.function.is_none()) {
        let Some(address) = address_of_file_offset(module, frame.module_offset) else {
            continue;
        };
        let after = functions.partition_point(|range| range.start <= address);
        let Some(function) = after
            .checked_sub(1)
            .map(|index| &functions[index])
            .filter(|range| range.contains(&address))
        else {
            continue;
        };
        frame.function = Some(format!(
            "{}+{:#x}",
            module_basename(&frame.module),
            function.start
        ));
        frame.function_address = Some(frame.address - (address - function.start));
    }
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSymbol};

    use super::*;

    /// A function of this test binary, its symbols set aside, is named by its start: every
    /// address in it one name, the symbol's address as `nm` shows it.
    #[test]
    fn code_without_a_symbol_is_named_by_the_start_of_its_function() {
        let function =
            code_without_a_symbol_is_named_by_the_start_of_its_function as *const () as u64;
        let text = crate::symbolize::own_mapping_of(function);
        let exe = std::env::current_exe().unwrap();
        let image = std::fs::read(&exe).unwrap();
        let module = object::File::parse(&*image).unwrap();
        let symbol = module
            .symbols()
            .find(|symbol| {
                symbol.name().is_ok_and(|name| {
                    name.contains("code_without_a_symbol_is_named_by_the_start_of_its_function")
                })
            })
            .unwrap();
        let module_path = exe.to_str().unwrap().to_string();
        let frame_at = |address: u64| Frame {
            address,
            module: module_path.clone(),
            module_offset: address - text.start + text.file_offset,
            ..Frame::default()
        };
        let mut frames = [
            frame_at(function),
            frame_at(function + 7),
            frame_at(function + 30),
        ];
        name_by_call_frames(&module, &mut frames);
        let expected = format!("{}+{:#x}", module_basename(&module_path), symbol.address());
        for frame in &frames {
            assert_eq!(
                frame.function.as_deref(),
                Some(expected.as_str()),
                "{frame:?}"
            );
            assert_eq!(frame.function_address, Some(function));
        }
        // An address no FDE covers keeps no name: the ELF header.
        let mut header = [frame_at(text.start - text.file_offset)];
        name_by_call_frames(&module, &mut header);
        assert_eq!(header[0].function, None);
    }
}
