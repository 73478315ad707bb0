//! What unwinding by tables costs in the kernel: our program's run time per sample (the kernel's
//! BPF run-time statistics, through `record --stats`) on the tests' C workload built without
//! frame pointers, recursing to 10 and to 30 user frames, under `--unwind dwarf` and, as the
//! baseline that walks two frames, `--unwind fp`. The cost of one unwound frame is the slope
//! between the two depths, against the budget of [`BUDGET_NS_PER_FRAME`].

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::{
    measure,
    summary::Spread,
    tools::{self, path_arg},
};

/// The in-kernel budget per unwound frame (issue 15).
pub const BUDGET_NS_PER_FRAME: f64 = 150.0;

/// User frames of the two runs, from `_start` to the leaf.
const DEPTHS: [u32; 2] = [10, 30];

/// Sampling rate of these runs.
const RATE_HZ: &str = "999";

/// Milliseconds each run lasts.
const RUN_MS: &str = "2000";

/// One depth's cost per sample under each unwinder, median (min–max) over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct UnwindCostRow {
    pub user_frames: u32,
    pub dwarf_ns_per_sample: Option<Spread>,
    pub fp_ns_per_sample: Option<Spread>,
    pub dwarf_command: String,
}

/// The rows at each depth, and the cost per unwound frame: the medians' slope.
#[derive(Clone, Debug, Serialize)]
pub struct UnwindCost {
    pub rows: Vec<UnwindCostRow>,
    pub ns_per_frame: Option<f64>,
    pub budget_ns_per_frame: f64,
}

pub fn measure(profiler: &Path, work: &Path, rounds: u32) -> Result<UnwindCost> {
    let workload = build_workload(work)?;
    let mut rows = Vec::new();
    for frames in DEPTHS {
        let mut dwarf = Vec::new();
        let mut fp = Vec::new();
        let mut dwarf_command = String::new();
        for _ in 0..rounds {
            for (unwind, costs) in [("dwarf", &mut dwarf), ("fp", &mut fp)] {
                let argv: Vec<String> = [
                    path_arg(profiler).as_str(),
                    "record",
                    "--stats",
                    "-F",
                    RATE_HZ,
                    "--unwind",
                    unwind,
                    "-o",
                    path_arg(&work.join("unwind-cost.prof")).as_str(),
                    "--",
                    path_arg(&workload).as_str(),
                    RUN_MS,
                    "deep",
                    &frames.to_string(),
                ]
                .map(String::from)
                .to_vec();
                let run = measure::run(&argv, None)?;
                let cost = tools::ours_capture_cost(&run.stderr)?;
                eprintln!(
                    "xtask bench: unwinding {frames} user frames --unwind {unwind:<5} {:.0} ns \
                     per sample",
                    cost.ns_per_sample
                );
                costs.push(cost.ns_per_sample);
                if unwind == "dwarf" {
                    dwarf_command = run.command;
                }
            }
        }
        rows.push(UnwindCostRow {
            user_frames: frames,
            dwarf_ns_per_sample: Spread::of(dwarf),
            fp_ns_per_sample: Spread::of(fp),
            dwarf_command,
        });
    }
    Ok(UnwindCost {
        ns_per_frame: ns_per_frame(&rows),
        rows,
        budget_ns_per_frame: BUDGET_NS_PER_FRAME,
    })
}

/// The slope of the `--unwind dwarf` medians between the shallowest and the deepest row.
fn ns_per_frame(rows: &[UnwindCostRow]) -> Option<f64> {
    let (shallow, deep) = (rows.first()?, rows.last()?);
    let frames = deep
        .user_frames
        .checked_sub(shallow.user_frames)
        .filter(|&n| n > 0)?;
    let cost = deep.dwarf_ns_per_sample?.median - shallow.dwarf_ns_per_sample?.median;
    Some(cost / f64::from(frames))
}

/// tests/workloads/c/no_frame_pointers.c built with `gcc -O2 -fomit-frame-pointer` into `work`.
fn build_workload(work: &Path) -> Result<std::path::PathBuf> {
    let source = crate::workspace_root().join("tests/workloads/c/no_frame_pointers.c");
    let binary = work.join("no_frame_pointers");
    let argv: Vec<String> = [
        "gcc",
        "-O2",
        "-fomit-frame-pointer",
        "-pthread",
        "-o",
        path_arg(&binary).as_str(),
        path_arg(&source).as_str(),
    ]
    .map(String::from)
    .to_vec();
    measure::run(&argv, None).with_context(|| format!("building {}", source.display()))?;
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_per_frame_is_the_slope_between_the_depths() {
        let row = |user_frames, ns: &[f64]| UnwindCostRow {
            user_frames,
            dwarf_ns_per_sample: Spread::of(ns.iter().copied()),
            fp_ns_per_sample: Spread::of([1000.0]),
            dwarf_command: String::new(),
        };
        // Medians 2000 and 3600 over 20 more frames.
        let rows = [row(10, &[2000.0, 1900.0, 2500.0]), row(30, &[3600.0])];
        assert_eq!(ns_per_frame(&rows), Some(80.0));
        assert_eq!(ns_per_frame(&rows[..1]), None);
        assert_eq!(ns_per_frame(&[row(10, &[]), row(30, &[3600.0])]), None);
    }
}
