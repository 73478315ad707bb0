//! What unwinding by tables costs in the kernel: our program's run time per sample (the kernel's
//! BPF run-time statistics, through `record --stats`) on the tests' C workload built without
//! frame pointers, recursing to 10 and to 30 user frames, under `--unwind dwarf` and, as the
//! baseline that walks two frames, `--unwind fp`. The cost of one unwound frame is the slope
//! between the fastest runs at the two depths, against the budget of [`BUDGET_NS_PER_FRAME`].

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

/// The rows at each depth, and the cost per unwound frame (see [`ns_per_frame`]).
#[derive(Clone, Debug, Serialize)]
pub struct UnwindCost {
    pub rows: Vec<UnwindCostRow>,
    pub ns_per_frame: Option<f64>,
    pub budget_ns_per_frame: f64,
}

/// The fewest rounds, even in the quick bench: one slow spell of the host in a single round
/// moved a CI run's slope to 366 ns a frame, while `--unwind fp`, which walks two frames at
/// both depths, slowed as much; with three, the same depth's runs spread from 2,657 to 7,298 ns
/// a sample, and no more than one run at each depth was near its fastest.
const MIN_ROUNDS: u32 = 5;

pub fn measure(profiler: &Path, work: &Path, rounds: u32) -> Result<UnwindCost> {
    let workload = build_workload(work)?;
    // Per depth, each round's cost per sample under each unwinder.
    let mut dwarf: [Vec<f64>; DEPTHS.len()] = Default::default();
    let mut fp: [Vec<f64>; DEPTHS.len()] = Default::default();
    let mut dwarf_commands: [String; DEPTHS.len()] = Default::default();
    // Every round runs both depths one after the other, so a slow spell of the host weighs on
    // both ends of that round's slope rather than on every run of one depth.
    for _ in 0..rounds.max(MIN_ROUNDS) {
        for (depth, frames) in DEPTHS.into_iter().enumerate() {
            for unwind in ["dwarf", "fp"] {
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
                if unwind == "dwarf" {
                    dwarf[depth].push(cost.ns_per_sample);
                    dwarf_commands[depth] = run.command;
                } else {
                    fp[depth].push(cost.ns_per_sample);
                }
            }
        }
    }
    let rows = DEPTHS
        .into_iter()
        .zip(dwarf.iter().zip(&fp).zip(dwarf_commands))
        .map(
            |(user_frames, ((dwarf, fp), dwarf_command))| UnwindCostRow {
                user_frames,
                dwarf_ns_per_sample: Spread::of(dwarf.iter().copied()),
                fp_ns_per_sample: Spread::of(fp.iter().copied()),
                dwarf_command,
            },
        )
        .collect();
    let [shallow, deep] = &dwarf;
    Ok(UnwindCost {
        rows,
        ns_per_frame: ns_per_frame(shallow, deep),
        budget_ns_per_frame: BUDGET_NS_PER_FRAME,
    })
}

/// The slope of `--unwind dwarf` between the fastest run at the shallow depth and the fastest
/// at the deep one. This host's slow spells only ever add to a run's cost per sample (the
/// program's run time counts while its virtual CPU is not running), and by up to twice: one
/// round's slope, or the median of the rounds' slopes, swung from -47 to 232 ns a frame in one
/// CI run, where the fastest runs stay near what the frames cost.
fn ns_per_frame(shallow: &[f64], deep: &[f64]) -> Option<f64> {
    let frames = f64::from(DEPTHS[1] - DEPTHS[0]);
    let fastest = |costs: &[f64]| costs.iter().copied().reduce(f64::min);
    Some((fastest(deep)? - fastest(shallow)?) / frames)
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
    fn the_cost_per_frame_is_the_slope_between_the_fastest_runs() {
        // 20 more frames; slow spells at either depth in any round leave the fastest runs.
        let (shallow, deep) = ([2000.0, 5960.0, 2100.0], [9000.0, 3600.0, 7298.0]);
        assert_eq!(ns_per_frame(&shallow, &deep), Some(80.0));
        // CI's run whose median slope was -24 ns a frame.
        let (shallow, deep) = ([4024.0, 5960.0, 2657.0], [3539.0, 5015.0, 7298.0]);
        assert_eq!(ns_per_frame(&shallow, &deep), Some(44.1));
        assert_eq!(ns_per_frame(&[], &[3600.0]), None);
    }
}
