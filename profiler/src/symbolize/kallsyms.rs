//! The kernel's functions, from /proc/kallsyms, in a compact table. An always-on agent keeps
//! them for its whole life: an address and a name's place per function plus the names in one
//! string (5 MB for 122,000 functions) where a symbol object each took 10.7 MB.

use std::io::{BufRead, BufReader};

/// Kernel functions by start address, ascending.
#[derive(Default)]
pub struct KernelSymbols {
    functions: Vec<KernelFunction>,
    /// The functions' names, end to end, in the order kallsyms lists them.
    names: String,
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
            Ok(file) => KernelSymbols::parse(BufReader::new(file)),
            Err(_) => KernelSymbols::default(),
        }
    }

    /// Reads kallsyms lines (`address type name [module]`), one at a time into the compact
    /// table: text symbols only, since stacks hold code addresses. Lines that do not parse are
    /// skipped.
    fn parse(mut reader: impl BufRead) -> KernelSymbols {
        let mut symbols = KernelSymbols::default();
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|read| read > 0) {
            symbols.add(&line);
            line.clear();
        }
        // Modules' functions come after the kernel's; several names may share an address
        // (the first listed is kept).
        symbols.functions.sort_by_key(|function| function.address);
        symbols.functions.dedup_by_key(|function| function.address);
        symbols.functions.shrink_to_fit();
        symbols.names.shrink_to_fit();
        symbols
    }

    /// Adds the function of one kallsyms line, when it names one.
    fn add(&mut self, line: &str) -> Option<()> {
        let mut fields = line.split_ascii_whitespace();
        let address = u64::from_str_radix(fields.next()?, 16).ok()?;
        let kind = fields.next()?;
        let name = fields.next()?;
        if address == 0 || !matches!(kind, "t" | "T" | "w" | "W") {
            return None;
        }
        let name_start = u32::try_from(self.names.len()).ok()?;
        let name_len = u32::try_from(name.len()).ok()?;
        self.names.push_str(name);
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
        Some((name, function.address))
    }
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
    fn hidden_addresses_make_an_empty_table() {
        let hidden = "0000000000000000 T _text\n0000000000000000 t secondary_startup\n";
        let symbols = KernelSymbols::parse(hidden.as_bytes());
        assert_eq!(symbols.lookup(0), None);
        assert_eq!(symbols.lookup(u64::MAX), None);
    }
}
