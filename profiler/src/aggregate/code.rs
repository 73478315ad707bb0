//! Machine code of sampled functions: captured from the module files at record time (bytes and a
//! line table per instruction), disassembled at report time with iced-x86 in the GNU (AT&T)
//! syntax that objdump prints.

use std::collections::{BTreeMap, BTreeSet};

use blazesym::symbolize::{Symbolized, Symbolizer};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Formatter, GasFormatter, Instruction};
use object::{ReadRef, SymbolKind};

use crate::{
    process::ProcessTable,
    profile::{CodeBytes, CodeLine, Frame, Profile},
    symbolize::module_file::{address_of_file_offset, build_id, sized_symbols},
};

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

/// Largest function whose code a profile keeps: a symbol's size comes from a file that may be
/// crafted, and real functions are far smaller.
const MAX_FUNCTION_BYTES: u64 = 1 << 20;

/// Reads the bytes and the line table of every user function with instruction samples from its
/// module file, as the side-band opened it while the process lived, so that the function
/// details view disassembles offline. Kernel functions are skipped (their text is not in a file
/// this profiler reads), as are functions whose module was not opened, is not ELF, or was
/// replaced by a file with another build ID since it was sampled.
pub fn capture_code(profile: &mut Profile, processes: &ProcessTable, symbolizer: &Symbolizer) {
    let mut wanted: BTreeMap<FunctionStart, Option<String>> = BTreeMap::new();
    let mut pids: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    // Modules with a source line at some sampled address: the others (no debug information)
    // have none at any, and their instructions are not looked up one by one.
    let mut with_lines: BTreeSet<&str> = BTreeSet::new();
    for sample in &profile.instructions {
        let frame = &profile.frames[sample.frame as usize];
        if frame.kernel || !frame.module.starts_with('/') {
            continue;
        }
        if let Some(start) = function_file_offset(frame) {
            wanted.insert((frame.module.clone(), start), frame.build_id.clone());
            pids.entry(&frame.module).or_default().insert(sample.pid);
        }
        if frame.line.is_some() || frame.inlined.iter().any(|inlined| inlined.line.is_some()) {
            with_lines.insert(&frame.module);
        }
    }
    let mut by_module: BTreeMap<&str, Vec<(u64, &Option<String>)>> = BTreeMap::new();
    for ((module, start), build_id) in &wanted {
        by_module
            .entry(module)
            .or_default()
            .push((*start, build_id));
    }
    let mut captured = Vec::new();
    for (module, functions) in by_module {
        let pids = pids.get(module).cloned().unwrap_or_default();
        let Some((file, image)) = processes.module_image(pids, module) else {
            continue;
        };
        let Ok(elf) = object::File::parse(&image) else {
            continue;
        };
        let file_build_id = build_id(&elf);
        let starts: BTreeMap<u64, u64> = functions
            .iter()
            .filter_map(|&(start, _)| Some((address_of_file_offset(&elf, start)?, start)))
            .collect();
        let symbols = sized_symbols(&elf, SymbolKind::Text, |address, _| {
            starts.contains_key(&address)
        });
        let mut module_code: Vec<(CodeBytes, Vec<u64>)> = Vec::new();
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
            if symbol.size > MAX_FUNCTION_BYTES {
                continue;
            }
            let Ok(code) = (&image).read_bytes_at(start, symbol.size) else {
                continue;
            };
            // Where instructions start, to line-map them (formatting them would take half the
            // capture).
            let offsets = match with_lines.contains(module) {
                true => decode(code, address)
                    .map(|instruction| start + (instruction.ip() - address))
                    .collect(),
                false => Vec::new(),
            };
            module_code.push((
                CodeBytes {
                    module: module.to_string(),
                    build_id: file_build_id.clone(),
                    file_offset: start,
                    address,
                    bytes: code.to_vec(),
                    lines: Vec::new(),
                },
                offsets,
            ));
        }
        // Every instruction of the module's sampled functions in one symbolization: finding
        // the module's debug information is done once, not per function.
        let offsets: Vec<u64> = module_code
            .iter()
            .flat_map(|(_, offsets)| offsets.iter().copied())
            .collect();
        // A module the symbolizer may not read (see `input::symbol_path`) keeps its code
        // without lines.
        let path = crate::input::symbol_path(&file).ok().map(|read| read.path);
        let mut results = match (offsets.is_empty(), path) {
            (false, Some(path)) => {
                crate::symbolize::symbolize_offsets(symbolizer, &path, true, &offsets)
            }
            _ => Vec::new(),
        }
        .into_iter();
        for (mut code, offsets) in module_code {
            let symbolized = results.by_ref().take(offsets.len());
            code.lines = line_table(code.file_offset, &offsets, symbolized);
            captured.push(code);
        }
    }
    profile.code.extend(captured);
}

/// The innermost source location of every instruction of a function (at `offsets`, as
/// `symbolized`) that has one.
fn line_table<'s>(
    file_offset: u64,
    offsets: &[u64],
    symbolized: impl Iterator<Item = Symbolized<'s>>,
) -> Vec<CodeLine> {
    offsets
        .iter()
        .zip(symbolized)
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

/// Whether [`disassemble`] reads code of a profile recorded on `architecture`: x86-64, or a
/// profile from before files recorded their architecture (all x86-64).
pub fn can_disassemble(architecture: &str) -> bool {
    matches!(architecture, "x86_64" | "")
}

/// The instructions of x86-64 code that starts at `address`.
fn decode(bytes: &[u8], address: u64) -> impl Iterator<Item = Instruction> + '_ {
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    std::iter::from_fn(move || decoder.can_decode().then(|| decoder.decode()))
}

/// Decodes x86-64 code that starts at `address`, and formats it.
pub fn disassemble(bytes: &[u8], address: u64) -> Vec<DecodedInstruction> {
    let mut formatter = GasFormatter::new();
    let options = formatter.options_mut();
    // objdump's layout: the mnemonic padded to 7 columns, lowercase hex.
    options.set_first_operand_char_index(7);
    options.set_branch_leading_zeros(false);
    options.set_uppercase_hex(false);
    options.set_rip_relative_addresses(true);
    let end = address + bytes.len() as u64;
    let mut decoded = Vec::new();
    for instruction in decode(bytes, address) {
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
    use object::{Object, ObjectSymbol};

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
        let call = disassemble(&[0xff, 0x15, 0x10, 0, 0, 0], 0x1000);
        assert_eq!(call[0].text, "callq  *0x10(%rip)");
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

    /// A function of this test binary with a loop and a call, disassembled by objdump and by
    /// this module.
    #[no_mangle]
    #[inline(never)]
    pub extern "C" fn profiler_objdump_probe(n: u64) -> u64 {
        let mut x = n | 1;
        for i in 0..n {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            x ^= x >> 29;
        }
        x
    }

    /// Whether two AT&T mnemonics name the same instruction: binutils 2.40 leaves out the
    /// operand-size suffix where the size is implied (`call *0x10(%rip)`), iced-x86 prints it
    /// (`callq`).
    fn same_mnemonic(ours: &str, theirs: &str) -> bool {
        ours == theirs
            || ours
                .strip_suffix(['b', 'w', 'l', 'q'])
                .is_some_and(|base| base == theirs)
    }

    /// (address, mnemonic) of every instruction objdump prints for `symbol`.
    fn objdump(binary: &std::path::Path, symbol: &str) -> Vec<(u64, String)> {
        let output = std::process::Command::new("objdump")
            .args([
                "-d",
                "--no-show-raw-insn",
                &format!("--disassemble={symbol}"),
            ])
            .arg(binary)
            .output()
            .expect("objdump runs (install binutils)");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .filter_map(|line| {
                let (address, rest) = line.trim_start().split_once(":\t")?;
                let address = u64::from_str_radix(address, 16).ok()?;
                Some((address, rest.split_whitespace().next()?.to_string()))
            })
            .collect()
    }

    #[test]
    fn captured_code_disassembles_like_objdump() {
        assert_eq!(profiler_objdump_probe(3), profiler_objdump_probe(3));
        let binary = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&binary).unwrap();
        let elf = object::File::parse(bytes.as_slice()).unwrap();
        let probe = elf
            .symbol_by_name("profiler_objdump_probe")
            .expect("the probe is in the symbol table");
        let symbol = sized_symbols(&elf, SymbolKind::Text, |address, _| {
            address == probe.address()
        })
        .into_iter()
        .find(|s| s.name == "profiler_objdump_probe")
        .expect("the probe is a sized function");
        let file_offset = (0..bytes.len() as u64)
            .step_by(4096)
            .find_map(|page| {
                let address = address_of_file_offset(&elf, page)?;
                (address <= symbol.address && symbol.address < address + 4096)
                    .then(|| page + (symbol.address - address))
            })
            .expect("the probe's file offset");
        // A sample 4 bytes into the probe, as recorded at the link-time address.
        let mut profile = Profile {
            frames: vec![Frame {
                address: symbol.address + 4,
                module: binary.to_string_lossy().into_owned(),
                module_offset: file_offset + 4,
                function: Some(symbol.name.clone()),
                function_address: Some(symbol.address),
                ..Frame::default()
            }],
            instructions: vec![crate::profile::InstructionSample {
                pid: std::process::id(),
                ..Default::default()
            }],
            ..Profile::default()
        };
        // The test binary, opened as the side-band opens a live process's modules.
        let mut processes = ProcessTable::default();
        processes.scan_process(std::process::id());
        capture_code(
            &mut profile,
            &processes,
            &crate::symbolize::new_symbolizer(),
        );
        let code = code_of(&profile, &profile.frames[0]).expect("the probe's code is captured");
        assert_eq!(code.address, symbol.address);
        assert_eq!(code.bytes.len() as u64, symbol.size);
        let ours: Vec<(u64, String)> = disassemble(&code.bytes, code.address)
            .into_iter()
            .map(|i| (i.address, i.mnemonic))
            .collect();
        let theirs = objdump(&binary, &symbol.name);
        assert!(ours.len() > 5, "{ours:?}");
        assert_eq!(ours.len(), theirs.len(), "{ours:?}\n{theirs:?}");
        for (ours, theirs) in ours.iter().zip(&theirs) {
            assert_eq!(ours.0, theirs.0, "addresses differ: {ours:?} {theirs:?}");
            assert!(
                same_mnemonic(&ours.1, &theirs.1),
                "mnemonics differ: {ours:?} {theirs:?}"
            );
        }
        // The line table places instructions in this file (or in what it inlined). Release
        // builds of this crate carry no DWARF (`Cargo.toml`): then there are no lines, and
        // `function_details_disassemble_the_hot_function_by_cache_line` checks them on a
        // workload built with them.
        let has_line_table = std::fs::read(&binary)
            .ok()
            .and_then(|image| {
                let elf = object::File::parse(image.as_slice()).ok()?;
                Some(elf.section_by_name(".debug_line").is_some())
            })
            .expect("the test binary is an ELF file");
        if !has_line_table {
            assert!(code.lines.is_empty(), "{:?}", code.lines);
            return;
        }
        assert!(
            code.lines
                .iter()
                .any(|l| l.file.ends_with("aggregate/code.rs")),
            "{:?}",
            code.lines
        );
        assert!(code
            .lines
            .iter()
            .all(|l| l.line > 0 && (l.offset as u64) < symbol.size));
    }
}
