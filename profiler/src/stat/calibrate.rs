//! Overflow calibration for `record --target-rate HZ`: a short counting pass on the recording's
//! scope measures each event's rate, and each event's overflow value becomes
//! rate / HZ, so that it samples about HZ times per second over the whole target (all CPUs for
//! a system-wide recording, all threads of the given processes). Values are rounded up to a
//! prime so sampling does not lock onto loop periods, and for AMD IBS, which counts in
//! sixteens, to a multiple of 16. Events whose spec sets its own overflow value keep it;
//! events that did not occur during the pass keep their default.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::Serialize;

use super::counters::{CountScope, CounterSet, Split};
use crate::events::count::Count;
use crate::events::{EventError, EventSpec, PmuRegistry, Sampling, SamplingOrigin, SystemFacts};

/// The default length of the counting pass.
pub const DEFAULT_PASS: Duration = Duration::from_millis(200);

/// What the counting pass counts: the scope the recording will sample.
///
/// A launched command does not exist before the recording starts, and the rest of the
/// system's rate says nothing about it, so recordings of a command should not calibrate
/// (sample at a frequency instead: the kernel then adapts the period to the command itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CalibrationTarget {
    /// Every CPU.
    System,
    /// These processes, all their threads.
    Pids(Vec<u32>),
}

/// What calibration did with one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CalibrationOutcome {
    /// The overflow value was chosen from the measured rate.
    Calibrated,
    /// Chosen from the measured rate, then rounded up to a multiple of 16 for AMD IBS.
    RoundedForIbs,
    /// The event did not occur during the pass: its default was kept.
    NoEvents,
    /// The spec sets its own overflow value, which was kept (it was not counted).
    GivenInSpec,
}

/// The overflow value calibration chose for one event.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Calibration {
    pub event: String,
    /// The event's rate over the whole target during the pass (zero for `GivenInSpec`).
    pub events_per_second: f64,
    /// What the event now samples with.
    pub sampling: Sampling,
    pub outcome: CalibrationOutcome,
}

impl Calibration {
    /// A line for the user, e.g. `cycles: 2.41e9 events/s -> every 2409997th`.
    pub fn describe(&self, target_rate_hz: u64) -> String {
        let rate = format!("{:.3e} events/s", self.events_per_second);
        match self.outcome {
            CalibrationOutcome::Calibrated => format!(
                "{}: {rate} -> overflow value {} (about {target_rate_hz} samples/s)",
                self.event, self.sampling
            ),
            CalibrationOutcome::RoundedForIbs => format!(
                "{}: {rate} -> overflow value {} (rounded up to a multiple of 16: IBS counts \
                 in sixteens)",
                self.event, self.sampling
            ),
            CalibrationOutcome::NoEvents => format!(
                "{}: no events during the calibration pass: kept the default overflow value {}",
                self.event, self.sampling
            ),
            CalibrationOutcome::GivenInSpec => format!(
                "{}: overflow value {} given in the event spec, kept",
                self.event, self.sampling
            ),
        }
    }
}

/// Whether `n` is prime: deterministic Miller-Rabin for all 64-bit numbers.
fn is_prime(n: u64) -> bool {
    const WITNESSES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    if let Some(&small) = WITNESSES.iter().find(|&&p| n.is_multiple_of(p)) {
        return n == small;
    }
    let mul = |a: u64, b: u64| (u128::from(a) * u128::from(b) % u128::from(n)) as u64;
    let pow = |mut base: u64, mut exp: u64| {
        let mut result = 1;
        while exp > 0 {
            if exp & 1 == 1 {
                result = mul(result, base);
            }
            base = mul(base, base);
            exp >>= 1;
        }
        result
    };
    let shift = (n - 1).trailing_zeros();
    let odd = (n - 1) >> shift;
    WITNESSES.iter().all(|&witness| {
        let mut x = pow(witness, odd);
        if x == 1 || x == n - 1 {
            return true;
        }
        (1..shift).any(|_| {
            x = mul(x, x);
            x == n - 1
        })
    })
}

/// The largest 64-bit prime: where the search for a next prime must stop.
const LARGEST_U64_PRIME: u64 = u64::MAX - 58;

/// The smallest prime >= `n` (2 for 0 and 1).
pub fn next_prime(n: u64) -> u64 {
    if n > LARGEST_U64_PRIME {
        return LARGEST_U64_PRIME;
    }
    (n.max(2)..=LARGEST_U64_PRIME)
        .find(|&candidate| is_prime(candidate))
        .unwrap_or(LARGEST_U64_PRIME)
}

/// The overflow value that samples `events_per_second` about `target_rate_hz` times a second,
/// and whether IBS rounding applied; `None` when nothing was counted.
pub fn choose_period(events_per_second: f64, target_rate_hz: u64, ibs: bool) -> Option<u64> {
    if events_per_second.is_nan() || events_per_second <= 0.0 || target_rate_hz == 0 {
        return None;
    }
    let exact = (events_per_second / target_rate_hz as f64).round();
    let value = if exact >= u64::MAX as f64 {
        u64::MAX
    } else {
        (exact as u64).max(1)
    };
    Some(if ibs {
        value
            .max(16)
            .checked_next_multiple_of(16)
            .unwrap_or(u64::MAX - 15)
    } else if value == 1 {
        // Every event: the highest rate there is, and no period to lock onto a loop.
        1
    } else {
        next_prime(value)
    })
}

fn is_ibs(spec: &EventSpec) -> bool {
    spec.pmu
        .as_deref()
        .is_some_and(|pmu| pmu.starts_with("ibs_"))
}

/// Counts `specs` on `target` for `pass`, then sets each event's overflow value so it samples
/// about `target_rate_hz` times per second over the whole target (see the module docs). Blocks
/// for the pass. Events set by calibration get [`SamplingOrigin::Override`], as a global `-c`
/// would.
pub fn calibrate(
    specs: &mut [EventSpec],
    target: &CalibrationTarget,
    target_rate_hz: u64,
    pass: Duration,
) -> Result<Vec<Calibration>> {
    if target_rate_hz == 0 {
        bail!("--target-rate 0: give the samples per second wanted, e.g. --target-rate 1000");
    }
    if pass.is_zero() {
        bail!("the calibration pass must last longer than zero");
    }
    let scope = match target {
        CalibrationTarget::System => CountScope::System,
        CalibrationTarget::Pids(pids) => CountScope::processes(pids)?,
    };
    let measured: Vec<usize> = (0..specs.len())
        .filter(|&index| specs[index].sampling_origin != SamplingOrigin::Spec)
        .collect();
    let to_count: Vec<EventSpec> = measured.iter().map(|&index| specs[index].clone()).collect();
    let registry = PmuRegistry::live()?;
    let facts = SystemFacts::read(&registry);
    let mut counters = CounterSet::open(&to_count, &scope, Split::default(), &facts)?;
    if let Some((spec, reason)) = to_count
        .iter()
        .zip(counters.unsupported())
        .find_map(|(spec, reason)| Some((spec, reason.as_ref()?)))
    {
        return Err(EventError::Unavailable {
            event: spec.text.clone(),
            reason: reason.clone(),
        }
        .into());
    }
    let started = Instant::now();
    counters.enable()?;
    std::thread::sleep(pass);
    counters.disable()?;
    let seconds = started.elapsed().as_secs_f64();
    let readings = counters.read()?;

    let mut calibrations = Vec::with_capacity(specs.len());
    for (index, spec) in specs.iter_mut().enumerate() {
        let Some(position) = measured.iter().position(|&m| m == index) else {
            calibrations.push(Calibration {
                event: spec.name.clone(),
                events_per_second: 0.0,
                sampling: spec.sampling,
                outcome: CalibrationOutcome::GivenInSpec,
            });
            continue;
        };
        let count: Count = readings
            .iter()
            .filter(|reading| reading.event == position)
            .map(|reading| reading.count)
            .sum();
        let events_per_second = count.estimate as f64 / seconds;
        let outcome = match choose_period(events_per_second, target_rate_hz, is_ibs(spec)) {
            Some(period) => {
                spec.sampling = Sampling::Period(period);
                spec.sampling_origin = SamplingOrigin::Override;
                if is_ibs(spec) {
                    CalibrationOutcome::RoundedForIbs
                } else {
                    CalibrationOutcome::Calibrated
                }
            }
            None => CalibrationOutcome::NoEvents,
        };
        calibrations.push(Calibration {
            event: spec.name.clone(),
            events_per_second,
            sampling: spec.sampling,
            outcome,
        });
    }
    Ok(calibrations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::parse_event_list;

    #[test]
    fn primes_are_recognised() {
        let small: Vec<u64> = (0..40).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]);
        for prime in [
            100_003,
            1_000_003,
            9_999_991,
            2_147_483_647,
            LARGEST_U64_PRIME,
        ] {
            assert!(is_prime(prime), "{prime}");
        }
        // Carmichael numbers and a strong pseudoprime to base 2 are composite.
        for composite in [561, 1_105, 2_047, 3_215_031_751, 1_000_001, u64::MAX] {
            assert!(!is_prime(composite), "{composite}");
        }
    }

    #[test]
    fn next_prime_is_the_smallest_prime_not_below() {
        assert_eq!(next_prime(0), 2);
        assert_eq!(next_prime(1), 2);
        assert_eq!(next_prime(2), 2);
        assert_eq!(next_prime(24), 29);
        assert_eq!(next_prime(100_000), 100_003);
        assert_eq!(next_prime(9_999_990), 9_999_991);
        assert_eq!(next_prime(u64::MAX), LARGEST_U64_PRIME);
    }

    #[test]
    fn periods_divide_the_rate_by_the_target_and_round_to_a_prime() {
        // 2.4 GHz of cycles sampled at 1 kHz: every 2,400,000 -> the next prime.
        assert_eq!(choose_period(2.4e9, 1000, false), Some(2_400_001));
        assert_eq!(choose_period(2.4e9 + 2_000.0, 1000, false), Some(2_400_019));
        // Rounded to the nearest integer before the prime.
        assert_eq!(choose_period(23_600.0, 1000, false), Some(29));
        // Rarer than the target: every event.
        assert_eq!(choose_period(300.0, 1000, false), Some(1));
        assert_eq!(choose_period(1_400.0, 1000, false), Some(1));
        assert_eq!(choose_period(1_600.0, 1000, false), Some(2));
    }

    #[test]
    fn zero_counts_keep_the_default() {
        assert_eq!(choose_period(0.0, 1000, false), None);
        assert_eq!(choose_period(f64::NAN, 1000, false), None);
        assert_eq!(choose_period(1e6, 0, false), None);
    }

    #[test]
    fn ibs_periods_are_multiples_of_sixteen() {
        assert_eq!(choose_period(3.0e9, 1000, true), Some(3_000_000));
        assert_eq!(choose_period(3.0e9 + 5_000.0, 1000, true), Some(3_000_016));
        assert_eq!(choose_period(10.0, 1000, true), Some(16));
        assert_eq!(choose_period(f64::MAX, 1, true), Some(u64::MAX - 15));
    }

    #[test]
    fn descriptions_say_what_was_chosen_and_why() {
        let calibration = Calibration {
            event: "cycles".to_string(),
            events_per_second: 2.4e9,
            sampling: Sampling::Period(2_400_001),
            outcome: CalibrationOutcome::Calibrated,
        };
        assert_eq!(
            calibration.describe(1000),
            "cycles: 2.400e9 events/s -> overflow value 2400001 (about 1000 samples/s)"
        );
        let idle = Calibration {
            event: "major-faults".to_string(),
            events_per_second: 0.0,
            sampling: Sampling::Period(1),
            outcome: CalibrationOutcome::NoEvents,
        };
        assert_eq!(
            idle.describe(1000),
            "major-faults: no events during the calibration pass: kept the default overflow \
             value 1"
        );
    }

    /// Counts this process's own threads while one of them burns CPU.
    #[test]
    fn calibration_measures_the_target_and_keeps_spec_values() {
        let registry = PmuRegistry::live().unwrap();
        let mut specs = parse_event_list(
            "task-clock,emulation-faults,cpu-clock/period=5000/",
            &registry,
        )
        .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let target = CalibrationTarget::Pids(vec![std::process::id()]);
        let result = calibrate(&mut specs, &target, 100, Duration::from_millis(200));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().unwrap();
        let calibrations = result.unwrap();

        // The spinner runs up to a CPU-second per second (less when other tests share the
        // CPUs): at most ~2e9 ns/s on two CPUs, over 100 Hz.
        let clock = &calibrations[0];
        assert_eq!(clock.outcome, CalibrationOutcome::Calibrated);
        assert!(
            (0.1e9..=2.2e9).contains(&clock.events_per_second),
            "{clock:?}"
        );
        let Sampling::Period(period) = specs[0].sampling else {
            panic!("calibration sets a period: {:?}", specs[0].sampling);
        };
        assert!(is_prime(period), "{period}");
        assert!(
            period.abs_diff((clock.events_per_second / 100.0) as u64) < 1_000,
            "{period} for {clock:?}"
        );
        assert_eq!(specs[0].sampling_origin, SamplingOrigin::Override);

        assert_eq!(calibrations[1].outcome, CalibrationOutcome::NoEvents);
        assert_eq!(specs[1].sampling, Sampling::Period(1), "the default stays");
        assert_eq!(calibrations[2].outcome, CalibrationOutcome::GivenInSpec);
        assert_eq!(specs[2].sampling, Sampling::Period(5000));
    }

    #[test]
    fn bad_arguments_and_unavailable_events_are_refused() {
        let registry = PmuRegistry::live().unwrap();
        let mut specs = parse_event_list("task-clock", &registry).unwrap();
        let err = calibrate(&mut specs, &CalibrationTarget::System, 0, DEFAULT_PASS).unwrap_err();
        assert!(err.to_string().contains("--target-rate 0"), "{err}");
        let err = calibrate(
            &mut specs,
            &CalibrationTarget::Pids(vec![u32::MAX - 1]),
            100,
            DEFAULT_PASS,
        )
        .unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        if !registry.has_hardware_pmu() {
            let mut specs = parse_event_list("cycles", &registry).unwrap();
            let err =
                calibrate(&mut specs, &CalibrationTarget::System, 100, DEFAULT_PASS).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("cannot open event 'cycles': no hardware PMU"),
                "{err}"
            );
        }
    }
}
