//! Threads with known, distinct amounts of CPU work, for per-thread attribution.
//!
//! Usage: threads [N] [UNITS_PER_STEP] (defaults 4 and 1)
//! Starts N threads named spin-0 .. spin-{N-1}; thread i does (i + 1) * UNITS_PER_STEP units of
//! the same CPU-bound work (about 30 ms each here), so their CPU times rank in thread order. The
//! main thread only waits. Each thread prints its tid and the CPU time it measured itself.

use std::hint::black_box;

/// One unit of work: a dependent multiply-xorshift chain the optimizer cannot remove.
fn churn(units: u64, seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..units * 20_000_000 {
        x = black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
        x ^= x >> 29;
    }
    x
}

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

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let step: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let handles: Vec<_> = (0..threads)
        .map(|index| {
            std::thread::Builder::new()
                .name(format!("spin-{index}"))
                .spawn(move || {
                    let result = churn((index + 1) * step, index);
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() };
                    eprintln!(
                        "spin-{index} tid {tid} cpu_ns {} result {result}",
                        thread_cpu_ns()
                    );
                })
                .expect("a thread starts")
        })
        .collect();
    for handle in handles {
        handle.join().expect("the thread finishes");
    }
}
