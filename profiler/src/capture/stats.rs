//! `record --stats`: what the capture itself costs, from the kernel's BPF run-time statistics,
//! the maps' locked memory, and the agent's drain time.

use std::{fmt::Write, time::Duration};

/// The kernel's own budget per sample: at its default maximum of 100,000 samples/s and 25% of
/// a CPU, 2,500 ns before it throttles ("perf: interrupt took too long").
pub const KERNEL_BUDGET_NS: f64 = 2500.0;

/// The program that runs on every counter overflow: its runs are the samples.
pub const SAMPLE_PROGRAM: &str = "on_overflow";

/// One BPF program's runs and time in the kernel, as the kernel's run-time statistics count
/// them (while `kernel.bpf_stats_enabled` is 1; a tail call runs inside its caller's time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramRuns {
    pub name: String,
    pub runs: u64,
    pub run_time: Duration,
}

impl ProgramRuns {
    pub fn ns_per_run(&self) -> Option<f64> {
        (self.runs > 0).then(|| self.run_time.as_nanos() as f64 / self.runs as f64)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// The entry programs' runs; all zero unless the statistics were on.
    pub programs: Vec<ProgramRuns>,
    /// Memory locked by the program's maps (fdinfo memlock), and the part that grows with the
    /// CPUs.
    pub map_memory: MapMemory,
    /// What the maps would lock on a [`HOST_CPUS`]-CPU host, and the sample maps' entries there
    /// when the default sizing picks them (`None`: the sizes given hold there too).
    pub host_map_memory: (u64, Option<u32>),
    pub drain_time: Duration,
    pub drains: u32,
    /// Distinct call stacks in the agent's stack cache, and stacks read from the kernel's
    /// stack-frames map to fill it (each new stack once, plus the stacks seen again after the
    /// map was emptied).
    pub stacks_cached: u64,
    pub stacks_read: u64,
    pub raw_samples_written: u64,
    /// With `--unwind dwarf`: the unwind tables' lines.
    pub unwind: Option<String>,
    /// With `--unwind check`: how the kernel's walks and the copies compared.
    pub unwind_check: Option<String>,
}

impl CaptureStats {
    fn sample_program(&self) -> Option<&ProgramRuns> {
        self.programs
            .iter()
            .find(|program| program.name == SAMPLE_PROGRAM)
    }

    pub fn ns_per_sample(&self) -> Option<f64> {
        self.sample_program().and_then(ProgramRuns::ns_per_run)
    }

    pub fn render(&self, samples_fired: u64) -> String {
        let mut out = String::from("Capture cost:\n");
        match (self.sample_program(), self.ns_per_sample()) {
            (Some(program), Some(ns)) => {
                let _ = writeln!(
                    out,
                    "  in the kernel: {ns:.0} ns per sample over {} runs ({:.1}% of the kernel's \
                     {KERNEL_BUDGET_NS:.0} ns budget); {samples_fired} samples fired",
                    program.runs,
                    100.0 * ns / KERNEL_BUDGET_NS
                );
            }
            _ => {
                let _ = writeln!(out, "  in the kernel: no runs counted");
            }
        }
        for program in self.programs.iter().filter(|p| p.name != SAMPLE_PROGRAM) {
            if let Some(ns) = program.ns_per_run() {
                let _ = writeln!(
                    out,
                    "  {}: {ns:.0} ns per run over {} runs",
                    program.name, program.runs
                );
            }
        }
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        let memory = &self.map_memory;
        let (host_locked, host_entries) = self.host_map_memory;
        let host_sizes = match host_entries {
            Some(entries) => format!("the default sample maps of {entries} entries there"),
            None => "these sizes".to_string(),
        };
        let _ = writeln!(
            out,
            "  map memory: {:.1} MiB locked, {:.2} MiB of it per CPU ({:.0} MiB on a \
             {HOST_CPUS}-CPU host with {host_sizes})",
            mib(memory.locked),
            mib(memory.per_cpu),
            mib(host_locked)
        );
        let drains = self.drains.max(1);
        let _ = writeln!(
            out,
            "  drains: {} taking {:.1} ms in all, {:.2} ms each on average",
            self.drains,
            self.drain_time.as_secs_f64() * 1e3,
            self.drain_time.as_secs_f64() * 1e3 / f64::from(drains)
        );
        let _ = writeln!(
            out,
            "  stacks: {} distinct, {} read from the kernel",
            self.stacks_cached, self.stacks_read
        );
        if self.raw_samples_written > 0 {
            let _ = writeln!(out, "  raw samples written: {}", self.raw_samples_written);
        }
        if let Some(unwind) = &self.unwind {
            out.push_str(unwind);
        }
        out
    }
}

/// The CPUs of the large host `--stats` projects map memory to: per-CPU maps hold a value per
/// possible CPU for every entry, so what a small machine locks says little about a server.
pub const HOST_CPUS: u64 = 128;

/// Kernel memory locked by BPF maps, and the part of it that grows with the possible CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapMemory {
    pub locked: u64,
    /// Bytes per possible CPU: the values of the per-CPU maps (and maps with an entry per CPU).
    pub per_cpu: u64,
    /// The possible CPUs the maps were made for.
    pub cpus: u64,
}

impl std::ops::AddAssign for MapMemory {
    fn add_assign(&mut self, other: MapMemory) {
        self.locked += other.locked;
        self.per_cpu += other.per_cpu;
        self.cpus = self.cpus.max(other.cpus);
    }
}

impl MapMemory {
    /// What the same maps would lock with `cpus` possible CPUs.
    pub fn on_cpus(&self, cpus: u64) -> u64 {
        let fixed = self.locked.saturating_sub(self.per_cpu * self.cpus);
        fixed + self.per_cpu * cpus
    }

    /// A map's memory from its descriptor's fdinfo (`map_type`, `value_size`, `max_entries`,
    /// `memlock`), made for `cpus` possible CPUs; `None` when the text is no map's.
    pub fn of_fdinfo(text: &str, cpus: u64) -> Option<MapMemory> {
        let field = |name: &str| -> Option<u64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?
                .trim()
                .parse()
                .ok()
        };
        let locked = field("memlock")?;
        let per_cpu = match field("map_type")? {
            // Per-CPU hash, array, LRU hash and cgroup storage: a value per CPU per entry,
            // each rounded up to 8 bytes.
            5 | 6 | 10 | 21 => field("max_entries")? * field("value_size")?.next_multiple_of(8),
            _ => 0,
        };
        Some(MapMemory {
            locked,
            per_cpu,
            cpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_cost_per_sample_against_the_budget() {
        let runs = |name: &str, runs, micros| ProgramRuns {
            name: name.to_string(),
            runs,
            run_time: Duration::from_micros(micros),
        };
        let stats = CaptureStats {
            programs: vec![
                runs("offcpu_switch", 400, 1000),
                runs(SAMPLE_PROGRAM, 1000, 1250),
                runs("offcpu_fork", 0, 0),
            ],
            map_memory: MapMemory {
                locked: 3 * 1024 * 1024,
                per_cpu: 512 * 1024,
                cpus: 2,
            },
            host_map_memory: (66 << 20, None),
            drain_time: Duration::from_millis(10),
            drains: 4,
            stacks_cached: 120,
            stacks_read: 130,
            raw_samples_written: 0,
            unwind: None,
            unwind_check: None,
        };
        assert_eq!(stats.ns_per_sample(), Some(1250.0));
        let text = stats.render(1000);
        assert!(text.contains("1250 ns per sample over 1000 runs (50.0% of the kernel's 2500 ns"));
        assert!(text.contains("  offcpu_switch: 2500 ns per run over 400 runs\n"));
        assert!(
            !text.contains("offcpu_fork"),
            "programs that never ran are left out"
        );
        assert!(text.contains(
            "3.0 MiB locked, 0.50 MiB of it per CPU (66 MiB on a 128-CPU host with these sizes)"
        ));
        let defaults = CaptureStats {
            host_map_memory: (40 << 20, Some(6144)),
            ..stats
        };
        assert!(defaults
            .render(1000)
            .contains("(40 MiB on a 128-CPU host with the default sample maps of 6144 entries"));
        assert!(text.contains("drains: 4 taking 10.0 ms in all, 2.50 ms each"));
        assert!(text.contains("stacks: 120 distinct, 130 read from the kernel"));
    }

    #[test]
    fn per_cpu_maps_grow_with_the_cpus_and_the_others_do_not() {
        // A latency map's fdinfo on a 2-CPU machine (one entry of a 960-byte histogram).
        let histogram = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t1038\nmap_type:\t5\n\
                         key_size:\t16\nvalue_size:\t960\nmax_entries:\t1\nmap_flags:\t0x0\n\
                         map_extra:\t0x0\nmemlock:\t2904\nmap_id:\t359424\nfrozen:\t0\n";
        let latencies = MapMemory::of_fdinfo(histogram, 2).unwrap();
        assert_eq!(latencies.per_cpu, 960);
        assert_eq!(latencies.on_cpus(2), 2904);
        assert_eq!(latencies.on_cpus(128), 2904 + 126 * 960);
        // A plain hash map (the stack frames), with a value size not a multiple of 8.
        let frames = "map_type:\t1\nkey_size:\t8\nvalue_size:\t1028\nmax_entries:\t32768\n\
                      memlock:\t35916800\n";
        let frames = MapMemory::of_fdinfo(frames, 2).unwrap();
        assert_eq!((frames.per_cpu, frames.on_cpus(128)), (0, 35916800));
        let counts = "map_type:\t6\nvalue_size:\t12\nmax_entries:\t10\nmemlock:\t1000\n";
        let counts = MapMemory::of_fdinfo(counts, 2).unwrap();
        assert_eq!(counts.per_cpu, 10 * 16, "values are rounded up to 8 bytes");
        let mut all = latencies;
        all += frames;
        all += counts;
        assert_eq!(
            all.on_cpus(128),
            2904 + 126 * 960 + 35916800 + 1000 + 126 * 160
        );
        assert_eq!(MapMemory::of_fdinfo("pos:\t0\nflags:\t02\n", 2), None);
    }
}
