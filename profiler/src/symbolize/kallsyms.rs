//! The kernel's functions, from /proc/kallsyms, in a compact table. An always-on agent keeps
//! them for its whole life: an address and a name's place per function plus the names end to
//! end in one buffer (5 MB for 122,000 functions) where a symbol object each took 10.7 MB.
//!
//! Reading /proc/kallsyms costs about 40 ms (most of it the kernel printing 122,000 lines), in
//! every recording with a kernel frame. The kernel's text, init text and modules' stay where they
//! are for a whole boot while no module comes or goes, so their functions are kept in a cache file
//! ([`crate::disk_cache`]) for that boot and module list; an address outside them (a BPF program, a
//! trampoline, a module loaded since) has /proc/kallsyms read whole, as perf keeps a copy of
//! kallsyms in its build-ID cache. BPF programs and trampolines the side-band saw loaded are named
//! from it first ([`crate::process::KernelCode`]).

use std::io::{BufRead, BufReader, Read};
use std::ops::Range;

use anyhow::{bail, Result};

use crate::disk_cache::{end_file, start_file, CacheBytes, CacheDir, CacheFields};

/// Bytes read from /proc/kallsyms at once.
const READ_BYTES: usize = 256 * 1024;

/// The bounds of the kernel's text that stays put for a boot: its text, and its init text,
/// whose functions kallsyms lists after boot too and which every idle CPU 0's stack ends in
/// (`x86_64_start_kernel`, `start_kernel`).
const BOOT_TEXT: [(&[u8], &[u8]); 2] = [(b"_stext", b"_etext"), (b"_sinittext", b"_einittext")];

/// Kernel functions by start address, ascending.
#[derive(Default)]
pub struct KernelSymbols {
    functions: Vec<KernelFunction>,
    /// The functions' names, end to end, in the order kallsyms lists them; checked as UTF-8
    /// when one is looked up (a few hundred a profile) rather than when read.
    names: Vec<u8>,
    /// The kernel's own text and init text ([`BOOT_TEXT`]); empty where kallsyms lacks a bound.
    boot_text: [Range<u64>; BOOT_TEXT.len()],
    coverage: Coverage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KernelFunction {
    address: u64,
    name_start: u32,
    name_len: u32,
}

/// Where a table's lookups are right.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Coverage {
    /// Read whole from /proc/kallsyms: every function the kernel listed then.
    #[default]
    Everything,
    /// From the cache: the kernel's text and its modules' as they were when it was written.
    Ranges(Vec<Range<u64>>),
}

impl KernelSymbols {
    /// The running kernel's functions, enough to name `addresses`: this boot's cached table
    /// when it covers them all, else /proc/kallsyms read whole (and the cache written). None
    /// when /proc/kallsyms cannot be read or hides its addresses (`kernel.kptr_restrict`), and
    /// kernel frames then stay unnamed.
    pub fn of_running_kernel(addresses: &[u64]) -> KernelSymbols {
        KernelSymbols::of_running_kernel_cached(addresses, CacheDir::default_for("kernel").as_ref())
    }

    fn of_running_kernel_cached(addresses: &[u64], cache: Option<&CacheDir>) -> KernelSymbols {
        let running = cache.and_then(|_| RunningKernel::now());
        let mut cached_valid = false;
        if let (Some(cache), Some(running)) = (cache, &running) {
            match load(cache, running) {
                Ok(Some(symbols)) => {
                    if addresses.iter().all(|&address| symbols.covers(address)) {
                        return symbols;
                    }
                    cached_valid = true;
                }
                Ok(None) => {}
                Err(error) => eprintln!(
                    "note: kernel-symbol cache {}: {error:#}; it is ignored and rewritten",
                    cache.path().join(CACHE_FILE).display()
                ),
            }
        }
        let symbols = KernelSymbols::read_live();
        if let (Some(cache), Some(running), false) = (cache, &running, cached_valid) {
            if let Err(error) = store(cache, running, &symbols) {
                eprintln!("note: kernel-symbol cache: {error:#}");
            }
        }
        symbols
    }

    /// /proc/kallsyms read whole.
    fn read_live() -> KernelSymbols {
        match std::fs::File::open("/proc/kallsyms") {
            // The kernel writes the text at each read (about 25 ms for 122,000 lines): large
            // reads make fewer of them.
            Ok(file) => KernelSymbols::parse(BufReader::with_capacity(READ_BYTES, file)),
            Err(_) => KernelSymbols::default(),
        }
    }

    /// Whether the table names `address` as a read of /proc/kallsyms would now.
    pub fn covers(&self, address: u64) -> bool {
        match &self.coverage {
            Coverage::Everything => true,
            Coverage::Ranges(ranges) => ranges.iter().any(|range| range.contains(&address)),
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
        for ((start, end), text) in BOOT_TEXT.iter().zip(&mut self.boot_text) {
            if name == *start {
                text.start = address;
            } else if name == *end {
                text.end = address;
            }
        }
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

/// The kernel a cached table was read from: this boot (the kernel is placed anew at each), the
/// first address kallsyms lists as this process sees it (zero when hidden), and the modules
/// loaded and where. A table is used only for the same.
struct RunningKernel {
    key: Vec<u8>,
    /// The text of the modules live now.
    module_text: Vec<Range<u64>>,
}

impl RunningKernel {
    /// None when the boot cannot be told or kallsyms hides its addresses.
    fn now() -> Option<RunningKernel> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        // The first lines only: the kernel prints a read's worth.
        let mut first = [0u8; 256];
        let read = std::fs::File::open("/proc/kallsyms")
            .and_then(|mut file| file.read(&mut first))
            .ok()?;
        let first_line = first[..read].split(|&byte| byte == b'\n').next()?;
        let first_address = first_line
            .split(|&byte| byte == b' ')
            .next()
            .and_then(parse_hex)
            .filter(|&address| address != 0)?;
        let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
        Some(RunningKernel::of(boot_id.trim(), first_address, &modules))
    }

    /// From the boot ID, the first address and the text of /proc/modules (`name size refcount
    /// dependencies state address`): reference counts and dependencies change with use and are
    /// left out of the key.
    fn of(boot_id: &str, first_address: u64, modules: &str) -> RunningKernel {
        let mut key = format!("boot {boot_id}\nfirst {first_address:x}\n");
        let mut module_text = Vec::new();
        for line in modules.lines() {
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let [name, size, _, _, state, address, ..] = fields[..] else {
                continue;
            };
            key.push_str(&format!("module {name} {size} {state} {address}\n"));
            let base = address
                .strip_prefix("0x")
                .and_then(|hex| parse_hex(hex.as_bytes()));
            if let (Some(base), Ok(size), "Live") = (base, size.parse::<u64>(), state) {
                if base != 0 {
                    module_text.push(base..base.saturating_add(size));
                }
            }
        }
        RunningKernel {
            key: key.into_bytes(),
            module_text,
        }
    }
}

/// The cache's one file: a later boot or module list replaces it.
const CACHE_FILE: &str = "kallsyms";
const CACHE_MAGIC: &[u8; 8] = b"PRFKSYMS";
// 2: init text cached too.
const CACHE_VERSION: u32 = 2;
/// Largest cache file read: far above a kernel's functions and names (5 MB for 122,000).
const MAX_CACHE_FILE: u64 = 64 << 20;

/// The cached table of `running`, `None` when the cache holds another kernel's or none.
fn load(cache: &CacheDir, running: &RunningKernel) -> Result<Option<KernelSymbols>> {
    let Some(bytes) = cache.read(CACHE_FILE, MAX_CACHE_FILE)? else {
        return Ok(None);
    };
    decode(&bytes, &running.key)
}

/// Caches the functions of `symbols` that stay put while `running` does: the kernel's text
/// and init text, and the live modules'.
fn store(cache: &CacheDir, running: &RunningKernel, symbols: &KernelSymbols) -> Result<()> {
    let ranges: Vec<Range<u64>> = symbols
        .boot_text
        .iter()
        .filter(|text| text.start != 0 && !text.is_empty())
        .chain(&running.module_text)
        .cloned()
        .collect();
    cache.write(
        "kernel-symbol cache",
        CACHE_FILE,
        &encode(&running.key, &ranges, symbols),
    )
}

/// Key, covered ranges, the functions in them and their names, CRC-32.
fn encode(key: &[u8], ranges: &[Range<u64>], symbols: &KernelSymbols) -> Vec<u8> {
    let covered =
        |function: &&KernelFunction| ranges.iter().any(|range| range.contains(&function.address));
    let mut names = Vec::new();
    let mut functions = Vec::new();
    for function in symbols.functions.iter().filter(covered) {
        let start = function.name_start as usize;
        let name = &symbols.names[start..start + function.name_len as usize];
        functions.push((function.address, names.len() as u32, name.len() as u32));
        names.extend_from_slice(name);
    }
    let mut out = start_file(
        CACHE_MAGIC,
        CACHE_VERSION,
        key,
        16 * functions.len() + names.len(),
    );
    out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    for range in ranges {
        out.extend_from_slice(&range.start.to_le_bytes());
        out.extend_from_slice(&range.end.to_le_bytes());
    }
    out.extend_from_slice(&(functions.len() as u32).to_le_bytes());
    for (address, name_start, name_len) in functions {
        out.extend_from_slice(&address.to_le_bytes());
        out.extend_from_slice(&name_start.to_le_bytes());
        out.extend_from_slice(&name_len.to_le_bytes());
    }
    out.extend_from_slice(&(names.len() as u32).to_le_bytes());
    out.extend_from_slice(&names);
    end_file(out)
}

/// The table a cache file holds, `None` when it was written for another kernel than `key`'s;
/// refused when damaged.
fn decode(bytes: &[u8], key: &[u8]) -> Result<Option<KernelSymbols>> {
    let Some(mut r) =
        CacheBytes::checked(bytes, CACHE_MAGIC, CACHE_VERSION, "a kernel-symbol", key)?
    else {
        return Ok(None);
    };
    let mut ranges = Vec::new();
    for _ in 0..r.count(16, "range count")? {
        let range = r.u64("range start")?..r.u64("range end")?;
        if range.is_empty() {
            bail!("an empty range {:#x}..{:#x}", range.start, range.end);
        }
        ranges.push(range);
    }
    let mut functions: Vec<KernelFunction> = Vec::new();
    for _ in 0..r.count(16, "function count")? {
        let function = KernelFunction {
            address: r.u64("function address")?,
            name_start: r.u32("name start")?,
            name_len: r.u32("name length")?,
        };
        if functions
            .last()
            .is_some_and(|last| last.address >= function.address)
        {
            bail!(
                "function at {:#x} is out of address order",
                function.address
            );
        }
        functions.push(function);
    }
    let names_len = r.count(1, "names length")?;
    let names = r.take(names_len, "names")?.to_vec();
    if let Some(function) = functions
        .iter()
        .find(|f| f.name_start as usize + f.name_len as usize > names.len())
    {
        bail!(
            "the name of the function at {:#x} lies past the names",
            function.address
        );
    }
    if !r.rest().is_empty() {
        bail!("{} bytes after the names", r.rest().len());
    }
    Ok(Some(KernelSymbols {
        functions,
        names,
        boot_text: Default::default(),
        coverage: Coverage::Ranges(ranges),
    }))
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

    const MODULES: &str = "\
nf_tables 372736 2 nft_ct, Live 0xffffffffc0200000
loading 4096 0 - Loading 0xffffffffc0300000
";

    /// What a cached table holds: the kernel's text (`_stext` to `_etext`), init text
    /// (`_sinittext` to `_einittext`) and live modules'.
    #[test]
    fn the_cache_keeps_the_kernel_text_and_live_modules_for_one_boot() {
        let kallsyms = "\
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81001000 t secondary_startup
ffffffff81900000 T _etext
ffffffff83000000 T _sinittext
ffffffff83000000 T start_kernel
ffffffff83100000 T _einittext
ffffffff83200000 T past_init_text
ffffffffa0001000 t bpf_prog_0123_on_overflow\t[bpf]
ffffffffc0201000 t nf_hook_slow\t[nf_tables]
";
        let live = KernelSymbols::parse(kallsyms.as_bytes());
        assert_eq!(
            live.boot_text,
            [
                0xffff_ffff_8100_0000..0xffff_ffff_8190_0000,
                0xffff_ffff_8300_0000..0xffff_ffff_8310_0000
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path().join("kernel"));
        let running = RunningKernel::of("boot-a", 0xffff_ffff_8100_0000, MODULES);
        store(&cache, &running, &live).unwrap();
        let cached = load(&cache, &running).unwrap().expect("this boot's table");
        for address in [
            0xffff_ffff_8100_0010,
            0xffff_ffff_8100_1008,
            0xffff_ffff_8300_0004,
            0xffff_ffff_c020_1004,
        ] {
            assert!(cached.covers(address), "{address:#x}");
            assert_eq!(cached.lookup(address), live.lookup(address), "{address:#x}");
        }
        // BPF programs and modules still loading come and go, and text outside the kernel's
        // bounds is not cached: a read whole names them.
        for address in [
            0xffff_ffff_a000_1004,
            0xffff_ffff_8320_0004,
            0xffff_ffff_c030_0004,
        ] {
            assert!(!cached.covers(address), "{address:#x}");
            assert!(live.covers(address));
        }
        // Another boot, module list or view of the addresses: the cache holds nothing for it.
        for other in [
            RunningKernel::of("boot-b", 0xffff_ffff_8100_0000, MODULES),
            RunningKernel::of("boot-a", 0xffff_ffff_9100_0000, MODULES),
            RunningKernel::of("boot-a", 0xffff_ffff_8100_0000, ""),
        ] {
            assert!(load(&cache, &other).unwrap().is_none());
        }
        // Reference counts change with use, not where the text lies.
        let busier = MODULES.replace(" 2 nft_ct,", " 7 nft_ct,nft_nat,");
        assert!(load(
            &cache,
            &RunningKernel::of("boot-a", 0xffff_ffff_8100_0000, &busier)
        )
        .unwrap()
        .is_some());
    }

    #[test]
    fn damaged_cache_files_are_refused_with_the_reason() {
        let live = KernelSymbols::parse(KALLSYMS.as_bytes());
        let key = b"key";
        let text = 0xffff_ffff_8100_0000..0xffff_ffff_8200_0000;
        let valid = encode(key, std::slice::from_ref(&text), &live);
        assert!(decode(&valid, key).unwrap().is_some());
        // Every truncation is refused, never read past its end.
        for len in 0..valid.len() {
            assert!(decode(&valid[..len], key).is_err(), "cut at {len}");
        }
        // Contents made to pass the checksum: a name past the names, addresses out of order.
        let reframed = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut body = valid[..valid.len() - 4].to_vec();
            edit(&mut body);
            end_file(body)
        };
        // The first function's entry starts after magic, version, key and the one range.
        let first_function = 8 + 4 + 4 + key.len() + 4 + 16 + 4;
        let past_names = reframed(&|body| {
            body[first_function + 12..first_function + 16].copy_from_slice(&u32::MAX.to_le_bytes())
        });
        let error = decode(&past_names, key).err().unwrap().to_string();
        assert!(error.contains("lies past the names"), "{error}");
        let unordered = reframed(&|body| {
            body[first_function..first_function + 8].copy_from_slice(&u64::MAX.to_le_bytes())
        });
        let error = decode(&unordered, key).err().unwrap().to_string();
        assert!(error.contains("out of address order"), "{error}");
    }

    /// The running kernel, through a cache: the second read names every function as the first.
    #[test]
    fn the_running_kernels_cached_table_names_as_kallsyms_does() {
        let live = KernelSymbols::read_live();
        let [text, init_text] = live.boot_text.clone();
        assert!(
            text.start != 0 && !text.is_empty() && init_text.start != 0 && !init_text.is_empty(),
            "/proc/kallsyms lists _stext, _etext, _sinittext and _einittext (this test runs as \
             root): {text:x?} {init_text:x?}"
        );
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path().join("kernel"));
        // Functions of the text and of the init text (where an idle CPU 0's stack ends).
        let addresses: Vec<u64> = live
            .functions
            .iter()
            .map(|function| function.address + 1)
            .filter(|address| text.contains(address))
            .step_by(97)
            .chain(
                live.functions
                    .iter()
                    .map(|function| function.address + 1)
                    .filter(|address| init_text.contains(address))
                    .step_by(13),
            )
            .collect();
        assert!(
            addresses.len() > 100,
            "{} kernel functions",
            addresses.len()
        );
        let first = KernelSymbols::of_running_kernel_cached(&addresses, Some(&cache));
        assert!(
            cache.path().join(CACHE_FILE).exists(),
            "the first read wrote the cache"
        );
        let cached = KernelSymbols::of_running_kernel_cached(&addresses, Some(&cache));
        assert_ne!(cached.coverage, Coverage::Everything, "read from the cache");
        for &address in &addresses {
            assert_eq!(
                cached.lookup(address),
                first.lookup(address),
                "{address:#x}"
            );
            assert_eq!(cached.lookup(address), live.lookup(address), "{address:#x}");
        }
        // An address outside the kernel's text has kallsyms read whole.
        let outside = KernelSymbols::of_running_kernel_cached(&[text.end + 1], Some(&cache));
        assert_eq!(outside.coverage, Coverage::Everything);
    }

    #[test]
    fn hidden_addresses_make_an_empty_table() {
        let hidden = "0000000000000000 T _text\n0000000000000000 t secondary_startup\n";
        let symbols = KernelSymbols::parse(hidden.as_bytes());
        assert_eq!(symbols.lookup(0), None);
        assert_eq!(symbols.lookup(u64::MAX), None);
    }
}
