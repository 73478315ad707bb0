//! CPU-bound work spread over many threads (more than there are CPUs), so a profiler follows
//! thread creation and exit and samples threads that migrate and preempt each other.
//!
//! Usage: many_threads [ROUNDS] [THREADS] (defaults 1000 and 16; the rounds are shared out)

use std::hint::black_box;

#[inline(never)]
fn thread_work(rounds: u64, seed: u64) -> u64 {
    let mut x = 2 * seed + 1;
    for _ in 0..rounds * 50_000 {
        x = black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
        x ^= x >> 29;
    }
    x
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let threads: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(16)
        .max(1);
    let workers: Vec<_> = (0..threads)
        .map(|index| {
            // The first threads take the remainder, so every round is done.
            let share = rounds / threads + u64::from(index < rounds % threads);
            std::thread::spawn(move || thread_work(share, index))
        })
        .collect();
    let result = workers
        .into_iter()
        .map(|worker| worker.join().expect("a worker thread panicked"))
        .fold(0, |acc, x| acc ^ x);
    eprintln!("many_threads: {rounds} rounds on {threads} threads, result {result:#x}");
}
