//! A CPU-bound workload with a known split: `heavy_work`, `medium_work` and `light_work` do
//! 60%, 30% and 10% of the work, all called from `run_round`, called from `main`.
//!
//! Usage: cpu_split [ROUNDS] (default 4000; about 1.5 s of CPU on this machine)
//!
//! It measures each function's thread CPU time itself and prints the split it really got, so a
//! test can compare the profiler against the truth even on a busy machine.

use std::hint::black_box;

/// This thread's CPU time in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Calls `work` and adds the CPU time it took to `spent`.
#[inline(always)]
fn timed(spent: &mut u64, work: impl FnOnce() -> u64) -> u64 {
    let start = thread_cpu_ns();
    let result = work();
    *spent += thread_cpu_ns() - start;
    result
}

/// One unit of work: a dependent multiply-xorshift chain the optimizer cannot remove.
#[inline(always)]
fn churn(units: u64, seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..units * 20_000 {
        x = black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
        x ^= x >> 29;
    }
    x
}

#[inline(never)]
fn heavy_work(seed: u64) -> u64 {
    churn(6, seed)
}

#[inline(never)]
fn medium_work(seed: u64) -> u64 {
    churn(3, seed)
}

#[inline(never)]
fn light_work(seed: u64) -> u64 {
    churn(1, seed)
}

#[inline(never)]
fn run_round(round: u64, spent: &mut [u64; 3]) -> u64 {
    timed(&mut spent[0], || heavy_work(round))
        ^ timed(&mut spent[1], || medium_work(round + 1))
        ^ timed(&mut spent[2], || light_work(round + 2))
}

fn main() {
    let rounds: u64 = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(4000);
    let mut spent = [0u64; 3];
    let mut result = 0;
    for round in 0..rounds {
        result ^= run_round(round, &mut spent);
    }
    let total: u64 = spent.iter().sum::<u64>().max(1);
    let share = |i: usize| 100.0 * spent[i] as f64 / total as f64;
    // On stderr: a profiler's report owns stdout.
    eprintln!(
        "cpu_split: {rounds} rounds, result {result:#x}, measured CPU split: heavy_work {:.1}% \
         medium_work {:.1}% light_work {:.1}%",
        share(0),
        share(1),
        share(2)
    );
}
