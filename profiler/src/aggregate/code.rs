//! Machine code of sampled functions: captured from the module files at record time (bytes and a
//! line table per instruction), disassembled at report time with iced-x86 in the GNU (AT&T)
//! syntax that objdump prints.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Symbolized, Symbolizer,
};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Formatter, GasFormatter, Instruction};
use object::SymbolKind;

use crate::profile::{CodeBytes, CodeLine, Frame, Profile};

use super::module_file::{address_of_file_offset, build_id, read_module, sized_symbols};

/// Offset in its module's file of the first byte of the function holding `frame`.
pub fn function_file_offset(frame: &Frame) -> Option<u64> {
    let start = frame.function_address?;
    frame
        .module_offset
        .checked_sub(frame.address.checked_sub(start)?)
}

/// The captured code of the function holding `frame`, if it was captured.
pub fn code_of<'a>(profile: &'a Profile, frame: &Frame) -> Option<&'a CodeBytes> {
    let start = function_file_offset(frame)?;
    profile
        .code
        .iter()
        .find(|code| code.module == frame.module && code.file_offset == start)
}

/// A function to capture: module path and the file offset of its first byte.
type FunctionStart = (String, u64);

/// Reads the bytes and the line table of every user function with instruction samples from its
/// module file, so that the function details view disassembles offline. Kernel functions are
/// skipped (their text is not in a file this profiler reads), as are functions whose module is
/// gone or was replaced by a file with another build ID since it was sampled.
pub fn capture_code(profile: &mut Profile) {
    let mut wanted: BTreeMap<FunctionStart, Option<String>> = BTreeMap::new();
    let mut pids: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for sample in &profile.instructions {
        let frame = &profile.frames[sample.frame as usize];
        if frame.kernel || !frame.module.starts_with('/') {
            continue;
        }
        if let Some(start) = function_file_offset(frame) {
            wanted.insert((frame.module.clone(), start), frame.build_id.clone());
            pids.entry(&frame.module).or_default().insert(sample.pid);
        }
    }
    let mut by_module: BTreeMap<&str, Vec<(u64, &Option<String>)>> = BTreeMap::new();
    for ((module, start), build_id) in &wanted {
        by_module
            .entry(module)
            .or_default()
            .push((*start, build_id));
    }
    let symbolizer = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .build();
    let mut captured = Vec::new();
    for (module, functions) in by_module {
        let pids = pids.get(module).cloned().unwrap_or_default();
        let Some((path, bytes)) = read_module(pids, module) else {
            continue;
        };
        let Ok(elf) = object::File::parse(bytes.as_slice()) else {
            continue;
        };
        let file_build_id = build_id(&elf);
        let symbols = sized_symbols(&elf, SymbolKind::Text);
        for (start, sampled_build_id) in functions {
            // A file rebuilt since the recording started has other code at these offsets.
            if sampled_build_id.is_some()
                && file_build_id.is_some()
                && sampled_build_id != &file_build_id
            {
                continue;
            }
            let Some(address) = address_of_file_offset(&elf, start) else {
                continue;
            };
            let Some(symbol) = symbols.iter().find(|s| s.address == address) else {
                continue;
            };
            let Some(code) = bytes.get(start as usize..(start + symbol.size) as usize) else {
                continue;
            };
            captured.push(CodeBytes {
                module: module.to_string(),
                build_id: file_build_id.clone(),
                file_offset: start,
                address,
                bytes: code.to_vec(),
                lines: line_table(&symbolizer, &path, start, code, address),
            });
        }
    }
    profile.code.extend(captured);
}

/// The innermost source location of every instruction of a function that has one.
fn line_table(
    symbolizer: &Symbolizer,
    path: &Path,
    file_offset: u64,
    bytes: &[u8],
    address: u64,
) -> Vec<CodeLine> {
    let offsets: Vec<u64> = disassemble(bytes, address)
        .iter()
        .map(|i| file_offset + u64::from(i.offset))
        .collect();
    let source = Source::Elf(Elf::new(path));
    let Ok(results) = symbolizer.symbolize(&source, Input::FileOffset(&offsets)) else {
        return Vec::new();
    };
    offsets
        .iter()
        .zip(results)
        .filter_map(|(offset, result)| {
            let Symbolized::Sym(sym) = result else {
                return None;
            };
            let info = match sym.inlined.last() {
                Some(inlined) => inlined.code_info.clone(),
                None => sym.code_info.map(|info| *info),
            }?;
            Some(CodeLine {
                offset: (offset - file_offset) as u32,
                file: info.to_path().to_string_lossy().into_owned(),
                line: info.line?,
            })
        })
        .collect()
}

/// One decoded instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedInstruction {
    /// Offset from the function's first byte.
    pub offset: u32,
    pub address: u64,
    pub length: u32,
    pub mnemonic: String,
    /// Mnemonic and operands as objdump prints them; branches inside the function are
    /// followed by their target's offset (`<+0x1c>`).
    pub text: String,
}

/// Decodes x86-64 code that starts at `address`.
pub fn disassemble(bytes: &[u8], address: u64) -> Vec<DecodedInstruction> {
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    let mut formatter = GasFormatter::new();
    let options = formatter.options_mut();
    // objdump's layout: the mnemonic padded to 7 columns, lowercase hex.
    options.set_first_operand_char_index(7);
    options.set_branch_leading_zeros(false);
    options.set_uppercase_hex(false);
    let end = address + bytes.len() as u64;
    let mut instruction = Instruction::default();
    let mut decoded = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        let mut mnemonic = String::new();
        let mut text = String::new();
        if instruction.is_invalid() {
            mnemonic.push_str("(bad)");
            text.push_str("(bad)");
        } else {
            formatter.format_mnemonic(&instruction, &mut mnemonic);
            formatter.format(&instruction, &mut text);
            let target = instruction.near_branch_target();
            let branches = matches!(
                instruction.flow_control(),
                FlowControl::UnconditionalBranch
                    | FlowControl::ConditionalBranch
                    | FlowControl::Call
            );
            if branches && (address..end).contains(&target) {
                text.push_str(&format!(" <+{:#x}>", target - address));
            }
        }
        decoded.push(DecodedInstruction {
            offset: (instruction.ip() - address) as u32,
            address: instruction.ip(),
            length: instruction.len() as u32,
            mnemonic,
            text,
        });
    }
    decoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_small_function_in_gnu_syntax() {
        // push %rbp; mov %rsp,%rbp; test %edi,%edi; je +0x0b; imul %edi,%edi; pop %rbp; ret
        let bytes = [
            0x55, 0x48, 0x89, 0xe5, 0x85, 0xff, 0x74, 0x03, 0x0f, 0xaf, 0xff, 0x5d, 0xc3,
        ];
        let decoded = disassemble(&bytes, 0x401000);
        let mnemonics: Vec<&str> = decoded.iter().map(|i| i.mnemonic.as_str()).collect();
        assert_eq!(
            mnemonics,
            ["push", "mov", "test", "je", "imul", "pop", "ret"]
        );
        assert_eq!(decoded[1].text, "mov    %rsp,%rbp");
        assert_eq!(decoded[3].text, "je     0x40100b <+0xb>");
        let offsets: Vec<u32> = decoded.iter().map(|i| i.offset).collect();
        assert_eq!(offsets, [0, 1, 4, 6, 8, 11, 12]);
        assert_eq!(decoded[4].address, 0x401008);
    }

    #[test]
    fn function_offsets_come_from_the_frame() {
        let frame = Frame {
            address: 0x5555_0000_1290,
            module: "/bin/app".into(),
            module_offset: 0x1290,
            function_address: Some(0x5555_0000_1200),
            ..Frame::default()
        };
        assert_eq!(function_file_offset(&frame), Some(0x1200));
        let mut profile = Profile::default();
        profile.code.push(CodeBytes {
            module: "/bin/app".into(),
            file_offset: 0x1200,
            ..CodeBytes::default()
        });
        assert!(code_of(&profile, &frame).is_some());
        assert!(code_of(&profile, &Frame::default()).is_none());
    }
}
