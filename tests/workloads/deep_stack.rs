//! CPU-bound work at the bottom of a deep call stack: `main` calls `frame_01`, which calls
//! `frame_02`, ... down to `frame_60`, which does the work in `leaf_work`. Every level is a
//! distinct function, so each sample's stack is more than 60 distinct frames deep: what
//! stack walking costs a profiler, in the kernel and in the report.
//!
//! Usage: deep_stack [ROUNDS] (default 1000; each round descends the whole chain once)

use std::hint::black_box;

/// One round of work: a dependent multiply-xorshift chain the optimizer cannot remove.
#[inline(never)]
fn leaf_work(seed: u64) -> u64 {
    let mut x = 2 * seed + 1;
    for _ in 0..50_000 {
        x = black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
        x ^= x >> 29;
    }
    x
}

/// Defines a chain of functions, each calling the next and the last calling the leaf. The
/// rotate after each call keeps it a real call (no tail call), so every frame stays on the stack.
macro_rules! call_chain {
    ($last:ident => $leaf:ident) => {
        #[inline(never)]
        fn $last(seed: u64) -> u64 {
            black_box($leaf(seed)).rotate_left(1)
        }
    };
    ($first:ident $next:ident $($rest:ident)* => $leaf:ident) => {
        #[inline(never)]
        fn $first(seed: u64) -> u64 {
            black_box($next(seed)).rotate_left(1)
        }
        call_chain!($next $($rest)* => $leaf);
    };
}

call_chain!(
    frame_01 frame_02 frame_03 frame_04 frame_05 frame_06 frame_07 frame_08 frame_09 frame_10
    frame_11 frame_12 frame_13 frame_14 frame_15 frame_16 frame_17 frame_18 frame_19 frame_20
    frame_21 frame_22 frame_23 frame_24 frame_25 frame_26 frame_27 frame_28 frame_29 frame_30
    frame_31 frame_32 frame_33 frame_34 frame_35 frame_36 frame_37 frame_38 frame_39 frame_40
    frame_41 frame_42 frame_43 frame_44 frame_45 frame_46 frame_47 frame_48 frame_49 frame_50
    frame_51 frame_52 frame_53 frame_54 frame_55 frame_56 frame_57 frame_58 frame_59 frame_60
    => leaf_work
);

fn main() {
    let rounds: u64 = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(1000);
    let result = (0..rounds).fold(0, |acc, round| acc ^ frame_01(round));
    // On stderr: a profiler's report owns stdout.
    eprintln!("deep_stack: {rounds} rounds, result {result:#x}");
}
