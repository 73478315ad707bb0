//! What the results were measured on (kernel, CPUs, tool versions, the kernel's sampling
//! limits), how much CPU other processes took meanwhile, and changing a kernel setting for the
//! length of the bench only.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use serde::Serialize;

pub const MAX_SAMPLE_RATE: &str = "/proc/sys/kernel/perf_event_max_sample_rate";
pub const CPU_TIME_MAX_PERCENT: &str = "/proc/sys/kernel/perf_cpu_time_max_percent";

#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub date_utc: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_mib: u64,
    /// Whether the CPU has a hardware PMU (a VM usually has none: software events only).
    pub hardware_pmu: bool,
    pub perf_version: String,
    /// `git describe` of the profiler's sources, `-dirty` when they had uncommitted changes.
    pub profiler_revision: String,
    pub perf_event_max_sample_rate: u64,
    pub perf_cpu_time_max_percent: u64,
}

impl Machine {
    pub fn read(workspace: &Path) -> Result<Machine> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Ok(Machine {
            date_utc: utc_date_time(SystemTime::now()),
            kernel: read_trimmed("/proc/sys/kernel/osrelease")?,
            cpu_model: cpuinfo
                .lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
                .unwrap_or_else(|| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            memory_mib: meminfo_kib("MemTotal:") / 1024,
            hardware_pmu: Path::new("/sys/bus/event_source/devices/cpu").exists(),
            perf_version: output_of(Command::new("perf").arg("--version"))?,
            profiler_revision: output_of(
                Command::new("git")
                    .args(["describe", "--always", "--dirty"])
                    .current_dir(workspace),
            )?,
            perf_event_max_sample_rate: read_number(MAX_SAMPLE_RATE)?,
            perf_cpu_time_max_percent: read_number(CPU_TIME_MAX_PERCENT)?,
        })
    }

    /// The kernel's budget per sample: perf_cpu_time_max_percent of the interval between
    /// samples at the maximum rate (25% of 10 us = 2,500 ns by default). Interrupts that take
    /// longer make the kernel lower perf_event_max_sample_rate.
    pub fn sample_budget_ns(&self) -> f64 {
        1e9 / self.perf_event_max_sample_rate as f64 * self.perf_cpu_time_max_percent as f64 / 100.0
    }
}

fn output_of(command: &mut Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {:?}", command.get_program()))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn read_trimmed(path: &str) -> Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("reading {path}"))?
        .trim()
        .to_string())
}

pub fn read_number(path: &str) -> Result<u64> {
    let text = read_trimmed(path)?;
    text.parse()
        .with_context(|| format!("{path} holds {text:?}, not a number"))
}

fn meminfo_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Memory available for new allocations now, in KiB.
pub fn available_memory_kib() -> u64 {
    meminfo_kib("MemAvailable:")
}

/// CPU time spent on the whole machine and by the bench itself (this process and every child
/// it waited for), to tell how much other processes took while the bench ran.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuTimes {
    /// Busy CPU time of all CPUs (user, nice, system, irq, softirq), seconds.
    machine_busy_s: f64,
    /// Busy + idle + iowait + steal of all CPUs, seconds.
    machine_total_s: f64,
    bench_s: f64,
}

impl CpuTimes {
    pub fn now() -> Result<CpuTimes> {
        let stat = read_trimmed("/proc/stat")?;
        let (machine_busy_s, machine_total_s) = parse_proc_stat(&stat)
            .with_context(|| format!("no `cpu` line in /proc/stat:\n{stat}"))?;
        Ok(CpuTimes {
            machine_busy_s,
            machine_total_s,
            bench_s: rusage_s(libc::RUSAGE_SELF) + rusage_s(libc::RUSAGE_CHILDREN),
        })
    }

    /// Percentage of the machine's CPU time that processes other than the bench used since
    /// `start`.
    pub fn others_percent_since(&self, start: &CpuTimes) -> f64 {
        let total = self.machine_total_s - start.machine_total_s;
        let others = (self.machine_busy_s - start.machine_busy_s) - (self.bench_s - start.bench_s);
        if total > 0.0 {
            (100.0 * others / total).max(0.0)
        } else {
            0.0
        }
    }
}

/// (busy, total) seconds from the aggregate `cpu` line, in USER_HZ ticks (100 per second).
fn parse_proc_stat(stat: &str) -> Option<(f64, f64)> {
    let ticks: Vec<u64> = stat
        .lines()
        .find_map(|line| line.strip_prefix("cpu "))?
        .split_whitespace()
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let field = |index: usize| ticks.get(index).copied().unwrap_or(0) as f64 / 100.0;
    // user nice system idle iowait irq softirq steal ...
    let busy = field(0) + field(1) + field(2) + field(5) + field(6);
    Some((busy, busy + field(3) + field(4) + field(7)))
}

fn rusage_s(who: libc::c_int) -> f64 {
    // SAFETY: rusage is plain old data that getrusage fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage through a valid pointer; `who` is RUSAGE_SELF or
    // RUSAGE_CHILDREN.
    unsafe { libc::getrusage(who, &mut usage) };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_date_time(time: SystemTime) -> String {
    let seconds = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let second_of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A kernel setting (a /proc/sys file) changed for the bench and put back when dropped.
pub struct SysctlOverride {
    path: PathBuf,
    original: String,
}

impl SysctlOverride {
    pub fn set(path: &str, value: u64) -> Result<SysctlOverride> {
        let original = read_trimmed(path)?;
        std::fs::write(path, value.to_string())
            .with_context(|| format!("setting {path} to {value} (needs root)"))?;
        eprintln!("xtask bench: {path} set to {value} for the bench (was {original})");
        Ok(SysctlOverride {
            path: path.into(),
            original,
        })
    }

    /// Keeps the current value to put back later, without changing it now: for settings the
    /// kernel itself may lower during the bench.
    pub fn remember(path: &str) -> Result<SysctlOverride> {
        Ok(SysctlOverride {
            path: path.into(),
            original: read_trimmed(path)?,
        })
    }
}

impl Drop for SysctlOverride {
    fn drop(&mut self) {
        let current = std::fs::read_to_string(&self.path).unwrap_or_default();
        if current.trim() == self.original {
            return;
        }
        match std::fs::write(&self.path, &self.original) {
            Ok(()) => eprintln!(
                "xtask bench: {} put back to {} (it was {} after the bench)",
                self.path.display(),
                self.original,
                current.trim()
            ),
            Err(error) => eprintln!(
                "xtask bench: could not put {} back to {}: {error}",
                self.path.display(),
                self.original
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_dates_across_leap_years() {
        let at = |seconds| utc_date_time(UNIX_EPOCH + Duration::from_secs(seconds));
        assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(at(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(at(1_709_251_199), "2024-02-29 23:59:59 UTC");
        assert_eq!(at(1_735_689_600), "2025-01-01 00:00:00 UTC");
    }

    #[test]
    fn reads_busy_and_total_cpu_time_from_proc_stat() {
        let stat = "cpu  1000 50 450 8000 100 20 30 10 0 0\ncpu0 500 25 225 4000 50 10 15 5 0 0\n";
        assert_eq!(parse_proc_stat(stat), Some((15.5, 96.6)));
        assert_eq!(parse_proc_stat("intr 5\n"), None);
        let start = CpuTimes {
            machine_busy_s: 10.0,
            machine_total_s: 100.0,
            bench_s: 2.0,
        };
        let end = CpuTimes {
            machine_busy_s: 90.0,
            machine_total_s: 300.0,
            bench_s: 62.0,
        };
        // 80 s busy, 60 s of it the bench's, out of 200 s: others took 10%.
        assert_eq!(end.others_percent_since(&start), 10.0);
    }

    #[test]
    fn budget_is_the_kernels_share_of_the_interval_at_the_maximum_rate() {
        let machine = Machine {
            date_utc: String::new(),
            kernel: String::new(),
            cpu_model: String::new(),
            cpus: 2,
            memory_mib: 0,
            hardware_pmu: false,
            perf_version: String::new(),
            profiler_revision: String::new(),
            perf_event_max_sample_rate: 100_000,
            perf_cpu_time_max_percent: 25,
        };
        assert_eq!(machine.sample_budget_ns(), 2500.0);
    }
}
