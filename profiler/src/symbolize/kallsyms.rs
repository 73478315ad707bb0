//! The kernel's functions, from /proc/kallsyms, in a compact table. An always-on agent keeps
//! them for its whole life: an address and a name's place per function plus the names end to
//! end in one buffer (5 MB for 122,000 functions) where a symbol object each took 10.7 MB.

use std::io::{BufRead, BufReader};

/// Bytes read from /proc/kallsyms at once.
const READ_BYTES: usize = 256 * 1024;

/// Kernel functions by start address, ascending.
#[derive(Default)]
pub struct KernelSymbols {
    functions: Vec<KernelFunction>,
    /// The functions' names, end to end, in the order kallsyms lists them; checked as UTF-8
    /// when one is looked up (a few hundred a profile) rather than when read.
    names: Vec<u8>,
}

struct KernelFunction {
    address: u64,
    name_start: u32,
    name_len: u32,
}

impl KernelSymbols {
    /// The running kernel's functions; none when /proc/kallsyms cannot be read or hides its
    /// addresses (`kernel.kptr_restrict`), and kernel frames then stay unnamed.
    pub fn of_running_kernel() -> KernelSymbols {
        match std::fs::File::open("/proc/kallsyms") {
            // The kernel writes the text at each read (about 25 ms for 122,000 lines): large
            // reads make fewer of them.
            Ok(file) => KernelSymbols::parse(BufReader::with_capacity(READ_BYTES, file)),
            Err(_) => KernelSymbols::default(),
        }
    }

    /// Reads kallsyms lines (`address type name [module]`) into the compact table, a buffer
    /// at a time, as bytes (a line read into a string cost twice the kernel's time): text
    /// symbols only, since stacks hold code addresses. Lines that do not parse are skipped.
    fn parse(mut reader: impl BufRead) -> KernelSymbols {
        let mut symbols = KernelSymbols::default();
        // A line the buffer's end cut, completed from the next buffer.
        let mut cut_line = Vec::new();
        loop {
            let buffer = match reader.fill_buf() {
                Ok([]) | Err(_) => break,
                Ok(buffer) => buffer,
            };
            let mut lines = buffer.split(|&byte| byte == b'\n');
            // The last piece has no newline yet (empty when the buffer ends one).
            let rest = lines.next_back().unwrap_or_default();
            for line in lines {
                if cut_line.is_empty() {
                    symbols.add(line);
                } else {
                    cut_line.extend_from_slice(line);
                    symbols.add(&cut_line);
                    cut_line.clear();
                }
            }
            cut_line.extend_from_slice(rest);
            let read = buffer.len();
            reader.consume(read);
        }
        symbols.add(&cut_line);
        // Modules' functions come after the kernel's; several names may share an address
        // (the first listed is kept).
        symbols.functions.sort_by_key(|function| function.address);
        symbols.functions.dedup_by_key(|function| function.address);
        symbols.functions.shrink_to_fit();
        symbols.names.shrink_to_fit();
        symbols
    }

    /// Adds the function of one kallsyms line, when it names one.
    fn add(&mut self, line: &[u8]) -> Option<()> {
        // `address kind name`, one space apart, then a tab and the module, if any.
        let space = line.iter().position(|&byte| byte == b' ')?;
        let (address, rest) = line.split_at(space);
        let (&kind, rest) = rest.get(1..)?.split_first()?;
        let name = rest.strip_prefix(b" ")?;
        let name = &name[..name
            .iter()
            .position(u8::is_ascii_whitespace)
            .unwrap_or(name.len())];
        if name.is_empty() || !matches!(kind, b't' | b'T' | b'w' | b'W') {
            return None;
        }
        let address = parse_hex(address).filter(|&address| address != 0)?;
        let name_start = u32::try_from(self.names.len()).ok()?;
        let name_len = u32::try_from(name.len()).ok()?;
        self.names.extend_from_slice(name);
        self.functions.push(KernelFunction {
            address,
            name_start,
            name_len,
        });
        Some(())
    }

    /// The function holding `address` and where it starts: the one starting last at or before
    /// it (kallsyms has no sizes).
    pub fn lookup(&self, address: u64) -> Option<(&str, u64)> {
        let index = self
            .functions
            .partition_point(|function| function.address <= address)
            .checked_sub(1)?;
        let function = &self.functions[index];
        let start = function.name_start as usize;
        let name = self.names.get(start..start + function.name_len as usize)?;
        let name = std::str::from_utf8(name).ok()?;
        Some((name, function.address))
    }
}

/// A hexadecimal number of at most 16 digits (kallsyms' addresses), without a prefix.
fn parse_hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &digit| {
        Some(value << 4 | char::from(digit).to_digit(16)? as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81001000 t secondary_startup
ffffffff82000000 D some_data
ffffffffc0201000 t nf_hook_slow\t[nf_tables]
ffffffff81002000 W weak_function
0000000000000000 A fixed_percpu_data
garbage line
";

    #[test]
    fn an_address_names_the_text_symbol_starting_at_or_before_it() {
        let symbols = KernelSymbols::parse(KALLSYMS.as_bytes());
        assert_eq!(
            symbols.lookup(0xffff_ffff_8100_0010),
            Some(("_text", 0xffff_ffff_8100_0000))
        );
        assert_eq!(
            symbols.lookup(0xffff_ffff_8100_1000),
            Some(("secondary_startup", 0xffff_ffff_8100_1000))
        );
        // Weak functions count; data does not, so its address falls in the last function.
        assert_eq!(
            symbols.lookup(0xffff_ffff_8200_0008),
            Some(("weak_function", 0xffff_ffff_8100_2000))
        );
        // Modules' functions are listed after the kernel's.
        assert_eq!(
            symbols.lookup(0xffff_ffff_c020_1004),
            Some(("nf_hook_slow", 0xffff_ffff_c020_1000))
        );
        assert_eq!(symbols.lookup(0xffff_ffff_80ff_ffff), None);
    }

    #[test]
    fn lines_cut_by_the_read_buffer_are_read_whole() {
        let whole = KernelSymbols::parse(KALLSYMS.as_bytes());
        for capacity in [1, 7, 16, 17, 40] {
            let cut = KernelSymbols::parse(BufReader::with_capacity(capacity, KALLSYMS.as_bytes()));
            assert_eq!(cut.names, whole.names, "buffers of {capacity} bytes");
            for address in [
                0xffff_ffff_8100_0010,
                0xffff_ffff_8100_2000,
                0xffff_ffff_c020_1004,
            ] {
                assert_eq!(cut.lookup(address), whole.lookup(address));
            }
        }
        // The last line needs no newline.
        let unterminated = KernelSymbols::parse(&b"ffffffff81000000 T _text"[..]);
        assert_eq!(
            unterminated.lookup(0xffff_ffff_8100_0001),
            Some(("_text", 0xffff_ffff_8100_0000))
        );
    }

    #[test]
    fn hidden_addresses_make_an_empty_table() {
        let hidden = "0000000000000000 T _text\n0000000000000000 t secondary_startup\n";
        let symbols = KernelSymbols::parse(hidden.as_bytes());
        assert_eq!(symbols.lookup(0), None);
        assert_eq!(symbols.lookup(u64::MAX), None);
    }
}
