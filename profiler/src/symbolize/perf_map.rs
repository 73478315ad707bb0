//! JIT perf maps (`/tmp/perf-PID.map`, written by JIT runtimes: "START SIZE name" in hex), read
//! from the process's own root so containers work; the files outlive their processes. Anyone
//! can create such a file in /tmp: only a regular file is read (never through a link, never
//! blocking on a FIFO), streamed a line at a time, and what its entries hold is capped per file
//! ([`MAX_ENTRY_BYTES_PER_MAP`]) and across the maps of one naming pass
//! ([`MAX_ENTRY_BYTES_IN_ALL`]); a file hard-linked as several pids' maps is read once.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read},
    os::unix::fs::MetadataExt,
    path::Path,
    sync::Arc,
};

use crate::input::{open_regular, FinalLink};
use crate::process::FileIdentity;

/// Most memory the entries of one perf map take: a JIT runtime writes a line of some 100 bytes
/// per compiled function, so this holds well over 100,000 functions.
pub const MAX_ENTRY_BYTES_PER_MAP: usize = 16 << 20;
/// Most memory the entries of all perf maps read in one naming pass take.
pub const MAX_ENTRY_BYTES_IN_ALL: usize = 64 << 20;
/// Most bytes of one perf map read: a file of lines that are no entries is not read without end.
const MAX_MAP_BYTES: u64 = 64 << 20;
/// Longest line taken as an entry; longer ones are skipped.
const MAX_LINE_BYTES: usize = 4096;

/// What an entry costs beside its name's bytes: its place in the lookup, and the allocator's
/// smallest block, which holds the name.
const ENTRY_BYTES: usize = std::mem::size_of::<Entry>() + 32;

/// One JIT function: (start, size, name).
pub type Entry = (u64, u64, String);

/// The loss counter of maps cut at a cap, as the report shows it.
pub const CUT_AT_CAP: &str = "perf maps cut at their cap (16 MiB of entries each, 64 MiB in all)";

/// A perf map's entries, sorted by start, and whether a cap cut it short.
#[derive(Debug, Default)]
pub struct PerfMap {
    pub entries: Vec<Entry>,
    /// Memory the entries take, as the caps count it.
    pub entry_bytes: usize,
    pub cut: bool,
}

/// Parses a perf map from `reader` a line at a time, keeping entries while they take at most
/// `max_entry_bytes`: reading stops at the first entry past it.
pub fn parse_perf_map(reader: impl BufRead, max_entry_bytes: usize) -> PerfMap {
    let mut map = PerfMap::default();
    let mut lines = Lines {
        reader,
        line: Vec::new(),
    };
    while let Some(line) = lines.next_line() {
        let Some(entry) = line.and_then(parse_line) else {
            continue;
        };
        let bytes = ENTRY_BYTES + entry.2.len();
        if map.entry_bytes + bytes > max_entry_bytes {
            map.cut = true;
            break;
        }
        map.entry_bytes += bytes;
        map.entries.push(entry);
    }
    map.entries.sort_by_key(|(start, _, _)| *start);
    map
}

fn parse_line(line: &[u8]) -> Option<Entry> {
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.splitn(3, ' ');
    let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
    let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
    Some((start, size, parts.next()?.trim().to_string()))
}

/// Lines of at most [`MAX_LINE_BYTES`], never holding more of a longer one.
struct Lines<R> {
    reader: R,
    line: Vec<u8>,
}

impl<R: BufRead> Lines<R> {
    /// The next line (`None` within: too long), or `None` at the end.
    fn next_line(&mut self) -> Option<Option<&[u8]>> {
        self.line.clear();
        let mut too_long = false;
        let mut any = false;
        loop {
            let buffer = match self.reader.fill_buf() {
                Ok(buffer) => buffer,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => &[],
            };
            if buffer.is_empty() {
                break;
            }
            any = true;
            let (taken, ended) = match buffer.iter().position(|&byte| byte == b'\n') {
                Some(at) => (at, true),
                None => (buffer.len(), false),
            };
            if !too_long && self.line.len() + taken <= MAX_LINE_BYTES {
                self.line.extend_from_slice(&buffer[..taken]);
            } else {
                too_long = true;
                self.line.clear();
            }
            self.reader.consume(taken + usize::from(ended));
            if ended {
                break;
            }
        }
        any.then_some((!too_long).then_some(self.line.as_slice()))
    }
}

/// The perf maps read in one naming pass, by pid and by file.
#[derive(Default)]
pub struct PerfMaps {
    by_pid: HashMap<u32, Option<Arc<PerfMap>>>,
    /// By device and inode: hard links to one file are one map, read and counted once.
    by_file: HashMap<FileIdentity, Arc<PerfMap>>,
    entry_bytes: usize,
    /// The maps a cap cut short.
    pub cut: Vec<FileIdentity>,
}

impl PerfMaps {
    /// The JIT symbol covering `address`: (name, start).
    pub fn lookup(&mut self, pid: u32, address: u64) -> Option<(String, u64)> {
        if !self.by_pid.contains_key(&pid) {
            let map = self.read(pid);
            self.by_pid.insert(pid, map);
        }
        let entries = &self.by_pid[&pid].as_ref()?.entries;
        let index = entries.partition_point(|(start, _, _)| *start <= address);
        let (start, size, name) = entries.get(index.checked_sub(1)?)?;
        (address < start.saturating_add(*size)).then(|| (name.clone(), *start))
    }

    fn read(&mut self, pid: u32) -> Option<Arc<PerfMap>> {
        let file = [
            format!("/proc/{pid}/root/tmp/perf-{pid}.map"),
            format!("/tmp/perf-{pid}.map"),
        ]
        .iter()
        .find_map(|path| open_regular(Path::new(path), FinalLink::Refuse).ok())?;
        let metadata = file.metadata().ok()?;
        let identity = (metadata.dev(), metadata.ino());
        if let Some(known) = self.by_file.get(&identity) {
            return Some(Arc::clone(known));
        }
        let room = MAX_ENTRY_BYTES_IN_ALL.saturating_sub(self.entry_bytes);
        let reader = BufReader::new(file.take(MAX_MAP_BYTES));
        let map = Arc::new(parse_perf_map(reader, room.min(MAX_ENTRY_BYTES_PER_MAP)));
        self.entry_bytes += map.entry_bytes;
        if map.cut {
            self.cut.push(identity);
        }
        self.by_file.insert(identity, Arc::clone(&map));
        Some(map)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn maps_with(pid: u32, text: &str) -> PerfMaps {
        let mut maps = PerfMaps::default();
        let map = parse_perf_map(Cursor::new(text), MAX_ENTRY_BYTES_PER_MAP);
        maps.by_pid.insert(pid, Some(Arc::new(map)));
        maps
    }

    #[test]
    fn finds_the_covering_jit_symbol() {
        let mut maps = maps_with(
            1,
            "2000 10 jitted_b\n1000 100 LazyCompile:*foo app.js:3\nbad line\n",
        );
        assert_eq!(
            maps.lookup(1, 0x1050),
            Some(("LazyCompile:*foo app.js:3".into(), 0x1000))
        );
        assert_eq!(maps.lookup(1, 0x2008), Some(("jitted_b".into(), 0x2000)));
        assert_eq!(maps.lookup(1, 0x1100), None);
        assert_eq!(maps.lookup(1, 0x10), None);
    }

    /// A map of the smallest entries, far past its cap: read until its entries take the cap,
    /// no further (never to the endless rest), and said to be cut.
    #[test]
    fn a_map_of_tiny_lines_stops_at_its_cap() {
        let endless = Cursor::new(b"0 1 a\n".repeat(1 << 20)).chain(std::io::repeat(b'7'));
        let map = parse_perf_map(BufReader::new(endless), 1 << 20);
        assert!(map.cut);
        assert!(map.entry_bytes <= 1 << 20);
        assert_eq!(map.entries.len(), (1 << 20) / (ENTRY_BYTES + 1));
        // A line past the longest taken is skipped, whatever its length, and the next read.
        let long = format!("1000 10 {}\n2000 10 next\n", "x".repeat(MAX_LINE_BYTES * 3));
        let map = parse_perf_map(Cursor::new(long), 1 << 20);
        assert_eq!(map.entries, vec![(0x2000, 0x10, "next".to_string())]);
        assert!(!map.cut);
        // A last line without its newline is an entry.
        let map = parse_perf_map(Cursor::new("10 4 last"), 1 << 20);
        assert_eq!(map.entries, vec![(0x10, 4, "last".to_string())]);
    }

    /// Anyone can create /tmp/perf-PID.map: a FIFO there (no writer) must not block the
    /// symbolizer, nor a link to /dev/zero feed it without end.
    #[test]
    fn planted_fifo_and_device_link_are_not_read() {
        // Pids no process has (above the kernel's pid_max limit).
        for (pid, plant) in [(4_000_000_001u32, "fifo"), (4_000_000_002, "link")] {
            let path = format!("/tmp/perf-{pid}.map");
            let _ = std::fs::remove_file(&path);
            if plant == "fifo" {
                let name = std::ffi::CString::new(path.clone()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
            } else {
                std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
            }
            let mut maps = PerfMaps::default();
            let found = maps.lookup(pid, 0x1000);
            std::fs::remove_file(&path).unwrap();
            assert_eq!(found, None);
        }
    }

    /// Hard links to one map are read once and counted once against the caps.
    #[test]
    fn hard_links_to_one_map_are_read_once() {
        let (first, second) = (4_000_000_003u32, 4_000_000_004u32);
        let paths = [first, second].map(|pid| format!("/tmp/perf-{pid}.map"));
        for path in &paths {
            let _ = std::fs::remove_file(path);
        }
        std::fs::write(&paths[0], "1000 100 jitted\n").unwrap();
        std::fs::hard_link(&paths[0], &paths[1]).unwrap();
        let mut maps = PerfMaps::default();
        let found = [first, second].map(|pid| maps.lookup(pid, 0x1010));
        for path in &paths {
            std::fs::remove_file(path).unwrap();
        }
        assert_eq!(found, [0, 1].map(|_| Some(("jitted".to_string(), 0x1000))));
        assert_eq!(maps.by_file.len(), 1);
        assert_eq!(maps.entry_bytes, ENTRY_BYTES + "jitted".len());
    }
}
