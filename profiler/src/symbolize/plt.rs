//! PLT stubs: the trampolines through which a module calls functions of other modules have no
//! symbol of their own, so symbolizers leave them unnamed. perf names each `memcpy@plt` after the
//! PLT relocation whose GOT slot its jump goes through; so do we.
//!
//! A stub (in `.plt.sec` with Intel IBT, else in `.plt`) is 16 bytes holding an indirect jump
//! `jmp *disp32(%rip)` through its function's GOT slot: decoding that jump finds the slot, and
//! the slot's `JUMP_SLOT` relocation names the function, whatever the section layout.

use std::collections::HashMap;

use object::{
    read::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget},
    ReadRef,
};

/// Bytes of one PLT entry on x86-64.
const PLT_ENTRY_BYTES: u64 = 16;
/// `jmp *disp32(%rip)`: opcode FF, ModRM 0x25.
const JMP_RIP_RELATIVE: [u8; 2] = [0xff, 0x25];

/// The PLT stubs of one module, by file offset.
#[derive(Debug, Default)]
pub struct PltStubs {
    /// (file offset, `name@plt`), sorted by offset; each stub is [`PLT_ENTRY_BYTES`] long.
    stubs: Vec<(u64, String)>,
}

impl PltStubs {
    /// The stubs of an ELF module.
    pub fn read<'data, R: ReadRef<'data>>(file: &object::File<'data, R>) -> PltStubs {
        // GOT slot address -> the function its PLT relocation binds.
        let symbols = file.dynamic_symbol_table();
        let slots: HashMap<u64, String> = file
            .dynamic_relocations()
            .into_iter()
            .flatten()
            .filter_map(|(slot, relocation)| {
                let RelocationTarget::Symbol(index) = relocation.target() else {
                    return None;
                };
                let name = symbols.as_ref()?.symbol_by_index(index).ok()?.name().ok()?;
                (!name.is_empty()).then(|| (slot, name.to_string()))
            })
            .collect();
        let mut stubs = Vec::new();
        for section in file.sections() {
            if !matches!(section.name(), Ok(".plt" | ".plt.sec")) {
                continue;
            }
            let (Ok(code), Some((file_offset, _))) = (section.data(), section.file_range()) else {
                continue;
            };
            for (index, entry) in code.chunks(PLT_ENTRY_BYTES as usize).enumerate() {
                let entry_address = section.address() + index as u64 * PLT_ENTRY_BYTES;
                let Some(slot) = jump_slot(entry, entry_address) else {
                    continue;
                };
                if let Some(name) = slots.get(&slot) {
                    let offset = file_offset + index as u64 * PLT_ENTRY_BYTES;
                    stubs.push((offset, format!("{name}@plt")));
                }
            }
        }
        stubs.sort();
        PltStubs { stubs }
    }

    /// The stub at file offset `offset`: its name and start offset.
    pub fn lookup(&self, offset: u64) -> Option<(&str, u64)> {
        let index = self.stubs.partition_point(|(start, _)| *start <= offset);
        let (start, name) = self.stubs.get(index.checked_sub(1)?)?;
        (offset < start + PLT_ENTRY_BYTES).then_some((name.as_str(), *start))
    }
}

/// The GOT slot a PLT entry at `address` jumps through, from its `jmp *disp32(%rip)` (after an
/// `endbr64` or a `bnd` prefix, wherever in the entry it sits).
fn jump_slot(entry: &[u8], address: u64) -> Option<u64> {
    let at = entry
        .windows(JMP_RIP_RELATIVE.len())
        .position(|bytes| bytes == JMP_RIP_RELATIVE)?;
    let displacement: [u8; 4] = entry.get(at + 2..at + 6)?.try_into().ok()?;
    let next_instruction = address + at as u64 + 6;
    Some(next_instruction.wrapping_add_signed(i64::from(i32::from_le_bytes(displacement))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jump_of_a_plain_and_an_ibt_entry_names_its_slot() {
        // .plt entry: jmp *0x2fe2(%rip); push $0; jmp PLT0.
        let plain = [
            0xff, 0x25, 0xe2, 0x2f, 0, 0, 0x68, 0, 0, 0, 0, 0xe9, 0xe0, 0xff, 0xff, 0xff,
        ];
        assert_eq!(jump_slot(&plain, 0x1020), Some(0x1020 + 6 + 0x2fe2));
        // .plt.sec entry: endbr64; bnd jmp *-0x10(%rip); nop.
        let ibt = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0xf0, 0xff, 0xff, 0xff, 0x0f, 0x1f, 0x44, 0,
            0,
        ];
        assert_eq!(jump_slot(&ibt, 0x1100), Some(0x1100 + 11 - 0x10));
        // A lazy .plt entry with IBT: no jump through a slot.
        let lazy = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x68, 0, 0, 0, 0, 0xf2, 0xe9, 0xe1, 0xff, 0xff, 0xff, 0x90,
        ];
        assert_eq!(jump_slot(&lazy, 0x1030), None);
    }

    #[test]
    fn this_machines_bash_has_named_plt_stubs() {
        let data = std::fs::read("/bin/bash").expect("bash is installed");
        let stubs = PltStubs::read(&object::File::parse(data.as_slice()).unwrap());
        assert!(!stubs.stubs.is_empty(), "bash calls libc through its PLT");
        let (offset, name) = &stubs.stubs[0];
        assert!(name.ends_with("@plt"), "{name}");
        assert_eq!(stubs.lookup(offset + 15), Some((name.as_str(), *offset)));
        assert_eq!(stubs.lookup(offset - 1), None, "before the first stub");
    }

    #[test]
    fn stubs_are_where_objdump_names_them() {
        // A C program calling strlen: gcc routes the call through a PLT stub.
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("caller.c");
        std::fs::write(
            &source,
            "#include <string.h>\nint main(int c, char **v) { return (int)strlen(v[c - 1]); }\n",
        )
        .unwrap();
        let binary = dir.path().join("caller");
        let compiled = std::process::Command::new("gcc")
            .args(["-O1", "-fno-builtin", "-o"])
            .arg(&binary)
            .arg(&source)
            .status()
            .expect("gcc runs");
        assert!(compiled.success());
        let disassembly = std::process::Command::new("objdump")
            .arg("-d")
            .arg(&binary)
            .output()
            .expect("objdump runs (Debian: binutils)");
        let disassembly = String::from_utf8_lossy(&disassembly.stdout);
        let objdump_at = disassembly
            .lines()
            .find_map(|line| line.strip_suffix(" <strlen@plt>:"))
            .map(|address| u64::from_str_radix(address, 16).unwrap())
            .expect("objdump names strlen@plt");
        let data = std::fs::read(&binary).unwrap();
        let stubs = PltStubs::read(&object::File::parse(data.as_slice()).unwrap());
        // A PIE maps its first segment at offset 0: the stub's file offset is its address.
        assert_eq!(stubs.lookup(objdump_at), Some(("strlen@plt", objdump_at)));
        assert_eq!(
            stubs.lookup(objdump_at + 6).map(|(name, _)| name),
            Some("strlen@plt")
        );
    }
}
