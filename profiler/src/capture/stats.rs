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
    /// Memory locked by the program's maps (fdinfo memlock).
    pub map_bytes: u64,
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
        let _ = writeln!(
            out,
            "  map memory: {:.1} MiB locked",
            self.map_bytes as f64 / (1024.0 * 1024.0)
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

/// `memlock:` of a BPF map or program file descriptor, from /proc/self/fdinfo.
pub fn fdinfo_memlock(fd: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("memlock:"))
                .and_then(|value| value.trim().parse().ok())
        })
        .unwrap_or(0)
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
            map_bytes: 3 * 1024 * 1024,
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
        assert!(text.contains("3.0 MiB locked"));
        assert!(text.contains("drains: 4 taking 10.0 ms in all, 2.50 ms each"));
        assert!(text.contains("stacks: 120 distinct, 130 read from the kernel"));
    }
}
