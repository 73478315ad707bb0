//! The bundled workloads the bench profiles (tests/workloads), and sizing each one so that it
//! runs about the requested time alone on this machine.

use std::path::Path;

use anyhow::{bail, Result};
use serde::Serialize;

use super::{machine::available_memory_kib, measure, tools::Tools};

#[derive(Debug)]
pub struct Workload {
    pub name: &'static str,
    pub description: &'static str,
    /// Arguments after the size.
    extra_args: &'static [&'static str],
    /// A size that runs for a fraction of a second, to time one unit of work.
    pilot_size: u64,
    /// Whether it is the page-fault workload, sampled on page-faults too.
    pub faults: bool,
}

pub const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "deep_stack",
        description: "CPU-bound, 60 distinct frames deep",
        extra_args: &[],
        pilot_size: 1000,
        faults: false,
    },
    Workload {
        name: "many_threads",
        description: "CPU-bound on 16 threads",
        extra_args: &["16"],
        pilot_size: 1000,
        faults: false,
    },
    Workload {
        name: "short_processes",
        description: "fork + exec of tiny children, one after another",
        extra_args: &[],
        pilot_size: 40,
        faults: false,
    },
    Workload {
        name: "page_toucher",
        description: "memory-bound: one page fault per fresh page",
        extra_args: &[],
        pilot_size: 25_000,
        faults: true,
    },
];

/// A workload at the size the bench runs it.
#[derive(Clone, Debug, Serialize)]
pub struct SizedWorkload {
    #[serde(skip)]
    workload: &'static Workload,
    pub name: &'static str,
    pub description: &'static str,
    pub faults: bool,
    /// Its size argument (rounds, children or pages).
    pub size: u64,
    /// The command, wrapped in `run_timed`.
    pub argv: Vec<String>,
}

impl SizedWorkload {
    /// The same workload at another size.
    pub fn resized(&self, tools: &Tools, release: &Path, size: u64) -> Vec<String> {
        self.workload.argv(tools, release, size.max(1))
    }
}

impl Workload {
    fn argv(&self, tools: &Tools, release: &Path, size: u64) -> Vec<String> {
        let mut args = vec![size.to_string()];
        args.extend(self.extra_args.iter().map(|arg| arg.to_string()));
        tools.timed(&release.join(self.name), &args)
    }

    /// Times the pilot size twice (the faster run counts: the first may pay for cold caches)
    /// and scales it to `seconds` of wall time (page_toucher: within half the free memory).
    pub fn calibrate(
        &'static self,
        tools: &Tools,
        release: &Path,
        seconds: f64,
    ) -> Result<SizedWorkload> {
        let pilot = self.argv(tools, release, self.pilot_size);
        let mut best = None::<measure::WorkloadTimes>;
        for _ in 0..2 {
            let run = measure::run(&pilot, None)?;
            let Some(times) = run.workload else {
                bail!(
                    "`{}` printed no run_timed line: is run_timed built from tests/workloads?",
                    run.command
                );
            };
            if best.is_none_or(|best| times.wall_s < best.wall_s) {
                best = Some(times);
            }
        }
        let best = best.expect("two pilot runs");
        let units = self.pilot_size as f64;
        let max_size = if self.faults {
            available_memory_kib() / 4 / 2
        } else {
            u64::MAX
        };
        let size = ((seconds * units / best.wall_s).round() as u64).clamp(1, max_size);
        Ok(SizedWorkload {
            workload: self,
            name: self.name,
            description: self.description,
            faults: self.faults,
            size,
            argv: self.argv(tools, release, size),
        })
    }
}
