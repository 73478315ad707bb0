//! One event's count over some counters, with the kernel's enabled and running times, and the
//! estimate for the whole enabled time when the kernel multiplexed the counters.

use std::ops::{Add, AddAssign};

/// What one or more counters of an event counted.
///
/// When the PMU has fewer counters than events, the kernel rotates them (multiplexing): a counter
/// then runs only part of the time it is enabled, and its count is scaled by enabled / running
/// to estimate the whole. Sums keep each counter's own scaling, so CPUs that ran an event for
/// different shares of the time are each estimated correctly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Events counted while the counters ran.
    pub raw: u64,
    /// The estimate for the whole enabled time (equal to `raw` when nothing was multiplexed).
    pub estimate: u64,
    pub enabled_ns: u64,
    pub running_ns: u64,
}

impl Count {
    /// One counter's reading, scaled for multiplexing.
    pub fn from_reading(raw: u64, enabled_ns: u64, running_ns: u64) -> Count {
        let estimate = if running_ns == 0 || running_ns >= enabled_ns {
            raw
        } else {
            let scaled = u128::from(raw) * u128::from(enabled_ns) / u128::from(running_ns);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        };
        Count {
            raw,
            estimate,
            enabled_ns,
            running_ns,
        }
    }

    /// A task's counters on one or more CPUs as one count, unscaled. Each is enabled whenever
    /// the task runs anywhere but runs only while the task is on its CPU, and the kernel's swaps
    /// of counter contexts between a task's threads leave those enabled times unusable, so
    /// multiplexing cannot be told apart from the task running elsewhere: the count is what ran,
    /// and both times are how long it ran.
    pub fn of_task_on_cpus(readings: impl IntoIterator<Item = Count>) -> Count {
        let (raw, running_ns) = readings
            .into_iter()
            .fold((0u64, 0u64), |(raw, running), count| {
                (
                    raw.saturating_add(count.raw),
                    running.saturating_add(count.running_ns),
                )
            });
        Count::from_reading(raw, running_ns, running_ns)
    }

    /// Whether the counters ever ran; a count that never ran is `<not counted>`, not zero.
    pub fn counted(&self) -> bool {
        self.running_ns > 0
    }

    /// Whether the estimate is scaled from part of the time.
    pub fn scaled(&self) -> bool {
        self.counted() && self.running_ns < self.enabled_ns
    }

    /// The share of the enabled time the counters ran, in percent.
    pub fn running_percent(&self) -> f64 {
        if self.enabled_ns == 0 {
            0.0
        } else {
            100.0 * self.running_ns as f64 / self.enabled_ns as f64
        }
    }

    /// What is left of `self` once `part` is taken out (a thread's own share of a counter that
    /// also counted the threads it started).
    pub fn minus(&self, part: &Count) -> Count {
        Count {
            raw: self.raw.saturating_sub(part.raw),
            estimate: self.estimate.saturating_sub(part.estimate),
            enabled_ns: self.enabled_ns.saturating_sub(part.enabled_ns),
            running_ns: self.running_ns.saturating_sub(part.running_ns),
        }
    }
}

impl Add for Count {
    type Output = Count;

    fn add(self, other: Count) -> Count {
        Count {
            raw: self.raw.saturating_add(other.raw),
            estimate: self.estimate.saturating_add(other.estimate),
            enabled_ns: self.enabled_ns.saturating_add(other.enabled_ns),
            running_ns: self.running_ns.saturating_add(other.running_ns),
        }
    }
}

impl AddAssign for Count {
    fn add_assign(&mut self, other: Count) {
        *self = *self + other;
    }
}

impl std::iter::Sum for Count {
    fn sum<I: Iterator<Item = Count>>(counts: I) -> Count {
        counts.fold(Count::default(), Add::add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_time_counts_are_exact() {
        let count = Count::from_reading(1_000, 500, 500);
        assert_eq!(count.estimate, 1_000);
        assert!(count.counted() && !count.scaled());
        assert_eq!(count.running_percent(), 100.0);
    }

    #[test]
    fn multiplexed_counts_are_scaled_by_enabled_over_running() {
        let count = Count::from_reading(431, 1_000, 431);
        assert_eq!(count.estimate, 1_000);
        assert!(count.scaled());
        assert!((count.running_percent() - 43.1).abs() < 1e-9);
        // Large counts do not overflow the intermediate product.
        let big = Count::from_reading(u64::MAX / 2, 3_000_000_000, 1_000_000_000);
        assert_eq!(big.estimate, u64::MAX);
    }

    #[test]
    fn counters_that_never_ran_are_not_counted() {
        let count = Count::from_reading(0, 1_000, 0);
        assert!(!count.counted() && !count.scaled());
        assert_eq!(count.estimate, 0);
        assert_eq!(Count::default().running_percent(), 0.0);
    }

    #[test]
    fn sums_keep_each_counters_own_scaling() {
        // CPU 0 ran the whole time, CPU 1 a quarter of it.
        let total: Count = [
            Count::from_reading(100, 1_000, 1_000),
            Count::from_reading(50, 1_000, 250),
        ]
        .into_iter()
        .sum();
        assert_eq!(total.raw, 150);
        assert_eq!(total.estimate, 300);
        assert!(total.scaled());
        assert!((total.running_percent() - 62.5).abs() < 1e-9);
    }

    #[test]
    fn a_tasks_counters_on_cpus_add_up_unscaled() {
        // Enabled times of per-CPU task counters do not add up: they are not used.
        let task = Count::of_task_on_cpus([
            Count::from_reading(60, 1_000, 600),
            Count::from_reading(40, 250, 400),
        ]);
        assert_eq!(task, Count::from_reading(100, 1_000, 1_000));
        assert!(!task.scaled());
        assert_eq!(Count::of_task_on_cpus([]), Count::default());
        let one = Count::of_task_on_cpus([Count::from_reading(30, 1_000, 300)]);
        assert_eq!(
            (one.estimate, one.enabled_ns, one.scaled()),
            (30, 300, false)
        );
    }

    #[test]
    fn a_threads_own_share_is_the_rest() {
        let all = Count::from_reading(1_000, 900, 900);
        let child = Count::from_reading(400, 300, 300);
        assert_eq!(all.minus(&child), Count::from_reading(600, 600, 600));
        assert_eq!(child.minus(&all).raw, 0, "saturates rather than wraps");
    }
}
