//! JIT perf maps (`/tmp/perf-PID.map`, written by JIT runtimes: "START SIZE name" in hex), read
//! from the process's own root so containers work; the files outlive their processes.

use std::{collections::HashMap, fs};

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
            .find_map(|path| fs::read_to_string(path).ok())
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
}
