//! JIT perf maps (`/tmp/perf-PID.map`, written by JIT runtimes: "START SIZE name" in hex), read
//! from the process's own root so containers work; the files outlive their processes. Anyone
//! can create such a file in /tmp: only a regular file is read (never through a link, never
//! blocking on a FIFO), and at most [`MAX_PERF_MAP_BYTES`] of it.

use std::{collections::HashMap, path::Path};

use crate::input::{open_regular, read_text_bounded, FinalLink};

/// Most of a perf map read: far above what JIT runtimes write (a line per compiled function).
const MAX_PERF_MAP_BYTES: u64 = 256 << 20;

#[derive(Default)]
pub struct PerfMaps {
    by_pid: HashMap<u32, Vec<(u64, u64, String)>>,
}

pub fn parse_perf_map(text: &str) -> Vec<(u64, u64, String)> {
    let mut entries: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
            let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
            Some((start, size, parts.next()?.trim().to_string()))
        })
        .collect();
    entries.sort_by_key(|(start, _, _)| *start);
    entries
}

impl PerfMaps {
    /// The JIT symbol covering `address`: (name, start).
    pub fn lookup(&mut self, pid: u32, address: u64) -> Option<(String, u64)> {
        let entries = self.by_pid.entry(pid).or_insert_with(|| {
            [
                format!("/proc/{pid}/root/tmp/perf-{pid}.map"),
                format!("/tmp/perf-{pid}.map"),
            ]
            .iter()
            .find_map(|path| {
                let file = open_regular(Path::new(path), FinalLink::Refuse).ok()?;
                read_text_bounded(file, MAX_PERF_MAP_BYTES).ok()
            })
            .map(|text| parse_perf_map(&text))
            .unwrap_or_default()
        });
        let index = entries.partition_point(|(start, _, _)| *start <= address);
        let (start, size, name) = entries.get(index.checked_sub(1)?)?;
        (address < start + size).then(|| (name.clone(), *start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_covering_jit_symbol() {
        let mut maps = PerfMaps::default();
        maps.by_pid.insert(
            1,
            parse_perf_map("2000 10 jitted_b\n1000 100 LazyCompile:*foo app.js:3\nbad line\n"),
        );
        assert_eq!(
            maps.lookup(1, 0x1050),
            Some(("LazyCompile:*foo app.js:3".into(), 0x1000))
        );
        assert_eq!(maps.lookup(1, 0x2008), Some(("jitted_b".into(), 0x2000)));
        assert_eq!(maps.lookup(1, 0x1100), None);
        assert_eq!(maps.lookup(1, 0x10), None);
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
}
