//! Latency of a group of samples: mean and maximum from the per-instruction statistics, and
//! percentiles from the kernel's log-linear bucket counts merged into an hdrhistogram.

use std::collections::{BTreeMap, HashMap};

use hdrhistogram::Histogram;
use profiler_common::latency::bucket_range;

use crate::profile::{EventIndex, Profile, Stats};

use super::{
    filter::{selected_data_lines, Selection},
    functions::FunctionName,
    location::innermost_location,
};

/// Latency of the samples of one report row. Percentiles are `None` when no bucket counts were
/// captured for these samples (only sums and maxima). Serialized as the JSON report's Latency.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Samples that carried a latency.
    pub samples: u64,
    pub mean: f64,
    pub p50: Option<u64>,
    pub p90: Option<u64>,
    pub p99: Option<u64>,
    pub max: u64,
}

/// Accumulates latency statistics and bucket counts of the samples of one row.
#[derive(Clone, Debug, Default)]
pub struct LatencyAccumulator {
    samples: u64,
    sum: u64,
    max: u64,
    distribution: Option<Histogram<u64>>,
}

/// The value a bucket's samples are recorded at: its midpoint, so that percentiles are off by
/// at most half the bucket's width.
pub fn representative_value(bucket: usize) -> u64 {
    let (low, high) = bucket_range(bucket);
    low + (high - low) / 2
}

/// An empty histogram for latencies of the u32 range at the buckets' precision.
fn new_histogram() -> Histogram<u64> {
    // Three significant digits are finer than the kernel buckets (1/8 relative width), so the
    // merge adds no error of its own.
    Histogram::new_with_max(u64::from(u32::MAX), 3).expect("valid hdrhistogram bounds")
}

impl LatencyAccumulator {
    pub fn add_stats(&mut self, stats: &Stats) {
        self.samples += stats.latency_count;
        self.sum += stats.latency_sum;
        self.max = self.max.max(stats.latency_max);
    }

    /// Adds sparse `(bucket, count)` pairs of a [`crate::profile::LatencyHistogram`].
    pub fn add_buckets(&mut self, buckets: &[(u16, u64)]) {
        let histogram = self.distribution.get_or_insert_with(new_histogram);
        for (bucket, count) in buckets {
            let value = representative_value(usize::from(*bucket)).min(histogram.high());
            histogram
                .record_n(value, *count)
                .expect("bucket values lie within the histogram's range");
        }
    }

    /// `None` when no sample of the row carried a latency.
    pub fn summary(&self) -> Option<LatencySummary> {
        let from_buckets = self.distribution.as_ref().filter(|h| !h.is_empty());
        if self.samples == 0 && from_buckets.is_none() {
            return None;
        }
        // Rows that only have histograms (no instruction statistics) take mean and max from them.
        let (samples, mean, max) = match (self.samples, from_buckets) {
            (0, Some(h)) => (h.len(), h.mean(), h.max()),
            (n, _) => (n, self.sum as f64 / n as f64, self.max),
        };
        // A bucket's midpoint may lie above the exact maximum of the samples in it.
        let percentile = |q: f64| from_buckets.map(|h| h.value_at_quantile(q).min(max));
        Some(LatencySummary {
            samples,
            mean,
            max,
            p50: percentile(0.50),
            p90: percentile(0.90),
            p99: percentile(0.99),
        })
    }
}

/// The latency histograms of one event's data cache lines, for the rows that hold them. A line
/// is given its histogram only when the histogram holds exactly the latencies of the line's
/// samples the filters keep: histograms are kept per line, not per instruction, so a module
/// filter that drops some of the line's instructions, or a histogram or data-line map that was
/// full for part of the recording, leaves the row without percentiles rather than with wrong
/// ones.
pub struct LineHistograms<'a> {
    /// Sparse buckets by (pid, line).
    histograms: HashMap<(u32, u64), &'a [(u16, u64)]>,
}

impl<'a> LineHistograms<'a> {
    pub fn new(profile: &'a Profile, event: EventIndex, selection: &Selection) -> Self {
        let mut latencies: HashMap<(u32, u64), u64> = HashMap::new();
        for sample in selected_data_lines(profile, event, selection) {
            *latencies.entry((sample.pid, sample.line)).or_default() += sample.stats.latency_count;
        }
        let histograms = profile
            .line_latency
            .iter()
            .filter(|h| {
                let counted: u64 = h.buckets.iter().map(|(_, count)| count).sum();
                h.event == event && latencies.get(&(h.pid, h.line)) == Some(&counted)
            })
            .map(|h| ((h.pid, h.line), h.buckets.as_slice()))
            .collect();
        LineHistograms { histograms }
    }

    /// The histogram of a line, when it holds exactly the selected samples' latencies.
    pub fn get(&self, pid: u32, line: u64) -> Option<&'a [(u16, u64)]> {
        self.histograms.get(&(pid, line)).copied()
    }

    /// Lines with a histogram, by (pid, line).
    pub fn iter(&self) -> impl Iterator<Item = ((u32, u64), &'a [(u16, u64)])> + '_ {
        self.histograms
            .iter()
            .map(|(line, buckets)| (*line, *buckets))
    }
}

/// The latency distribution of a group of instructions: the merged kernel buckets (for plots)
/// and their summary.
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    /// What the distribution is of: `all samples`, a function, a source line.
    pub label: String,
    pub scope: DistributionScope,
    /// Sparse `(bucket, count)`, by bucket.
    pub buckets: Vec<(u16, u64)>,
    pub summary: LatencySummary,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DistributionScope {
    Event,
    Function,
    Line,
    /// A 64-byte line of data addresses.
    DataLine,
}

impl DistributionScope {
    pub fn name(self) -> &'static str {
        match self {
            DistributionScope::Event => "event",
            DistributionScope::Function => "function",
            DistributionScope::Line => "line",
            DistributionScope::DataLine => "dcache-line",
        }
    }
}

/// Latency distributions of one event: all its samples, then the `top` functions, the `top`
/// source lines and the `top` data cache lines with the most latency samples.
pub fn distributions(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
    top: usize,
) -> Vec<Distribution> {
    let mut all: BTreeMap<u16, u64> = BTreeMap::new();
    let mut by_function: HashMap<String, BTreeMap<u16, u64>> = HashMap::new();
    let mut by_line: HashMap<String, BTreeMap<u16, u64>> = HashMap::new();
    for histogram in profile.latency.iter().filter(|h| {
        h.event == event
            && selection.process(h.pid)
            && selection.module(&profile.frames[h.frame as usize])
    }) {
        let frame = &profile.frames[histogram.frame as usize];
        let (file, line, function) = innermost_location(frame);
        let line = match (file, line) {
            (Some(file), Some(line)) => format!("{file}:{line}"),
            _ => function,
        };
        for map in [
            &mut all,
            by_function.entry(FunctionName::of(frame).name).or_default(),
            by_line.entry(line).or_default(),
        ] {
            for (bucket, count) in &histogram.buckets {
                *map.entry(*bucket).or_default() += count;
            }
        }
    }
    if all.is_empty() {
        return Vec::new();
    }
    let mut result = vec![distribution(
        "all samples".into(),
        DistributionScope::Event,
        all,
    )];
    let by_data_line: HashMap<String, BTreeMap<u16, u64>> =
        LineHistograms::new(profile, event, selection)
            .iter()
            .map(|((pid, line), buckets)| {
                (
                    format!("{line:#x} (pid {pid})"),
                    buckets.iter().copied().collect(),
                )
            })
            .collect();
    for (scope, groups) in [
        (DistributionScope::Function, by_function),
        (DistributionScope::Line, by_line),
        (DistributionScope::DataLine, by_data_line),
    ] {
        let mut group: Vec<Distribution> = groups
            .into_iter()
            .map(|(label, buckets)| distribution(label, scope, buckets))
            .collect();
        group.sort_by(|a, b| {
            b.summary
                .samples
                .cmp(&a.summary.samples)
                .then(a.label.cmp(&b.label))
        });
        group.truncate(top);
        result.extend(group);
    }
    result
}

fn distribution(
    label: String,
    scope: DistributionScope,
    buckets: BTreeMap<u16, u64>,
) -> Distribution {
    let buckets: Vec<(u16, u64)> = buckets.into_iter().collect();
    let mut accumulator = LatencyAccumulator::default();
    accumulator.add_buckets(&buckets);
    Distribution {
        label,
        scope,
        summary: accumulator
            .summary()
            .expect("a distribution has at least one sample"),
        buckets,
    }
}

#[cfg(test)]
mod tests {
    use profiler_common::latency::{bucket_index, LATENCY_BUCKETS};

    use super::*;
    use crate::aggregate::test_samples::buckets as bucketize;

    /// The exact percentile of sorted values: the smallest value with at least q of them at or
    /// below it (hdrhistogram's definition).
    fn exact(sorted: &[u64], q: f64) -> u64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
        sorted[rank - 1]
    }

    #[test]
    fn percentiles_of_merged_buckets_lie_within_the_bucket_width() {
        // A bimodal load-latency shape: many L1 hits around 5 cycles, a tail of misses to
        // several hundred cycles, split over two histograms (two instructions) that merge.
        let mut hits: Vec<u64> = (0..900).map(|i| 4 + i % 5).collect();
        let misses: Vec<u64> = (0..100).map(|i| 200 + i * 7).collect();
        let mut accumulator = LatencyAccumulator::default();
        accumulator.add_buckets(&bucketize(&hits));
        accumulator.add_buckets(&bucketize(&misses));
        hits.extend(&misses);
        hits.sort_unstable();
        let summary = accumulator.summary().unwrap();
        assert_eq!(summary.samples, 1000);
        for (q, got) in [
            (0.50, summary.p50.unwrap()),
            (0.90, summary.p90.unwrap()),
            (0.99, summary.p99.unwrap()),
        ] {
            let truth = exact(&hits, q);
            let (low, high) = bucket_range(bucket_index(truth));
            let slack = (high - low) / 2 + 1;
            assert!(
                got.abs_diff(truth) <= slack.max(truth / 1000 + 1),
                "p{}: {got}, true value {truth}, bucket {low}..={high}",
                q * 100.0
            );
        }
        assert_eq!(exact(&hits, 0.5), 6);
        // The 990th of 1000 values is the miss at 823, in bucket 768..=831.
        assert_eq!(summary.p99, Some(799), "{summary:?}");
        // The maximum comes from the top bucket: at most its width away.
        let (low, high) = bucket_range(bucket_index(893));
        assert!((low..=high + 1).contains(&summary.max), "{summary:?}");
    }

    #[test]
    fn statistics_give_mean_and_max_without_percentiles() {
        let mut accumulator = LatencyAccumulator::default();
        accumulator.add_stats(&Stats {
            count: 10,
            latency_count: 4,
            latency_sum: 400,
            latency_max: 250,
        });
        accumulator.add_stats(&Stats {
            count: 3,
            latency_count: 1,
            latency_sum: 100,
            latency_max: 100,
        });
        let summary = accumulator.summary().unwrap();
        assert_eq!(summary.samples, 5);
        assert_eq!(summary.mean, 100.0);
        assert_eq!(summary.max, 250);
        assert_eq!(summary.p50, None);
        assert!(LatencyAccumulator::default().summary().is_none());
    }

    #[test]
    fn the_last_bucket_is_recorded_at_the_histogram_limit() {
        let mut accumulator = LatencyAccumulator::default();
        accumulator.add_buckets(&[((LATENCY_BUCKETS - 1) as u16, 2)]);
        let summary = accumulator.summary().unwrap();
        assert!(summary.p50.unwrap() >= 1 << 31);
    }

    #[test]
    fn distributions_of_the_event_its_functions_lines_and_data_lines() {
        let profile = crate::aggregate::test_samples::profile();
        let filter = crate::aggregate::filter::SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let found = distributions(&profile, 1, &selection, 5);
        let labels: Vec<(&str, &str, u64)> = found
            .iter()
            .map(|d| (d.scope.name(), d.label.as_str(), d.summary.samples))
            .collect();
        assert_eq!(
            labels,
            [
                ("event", "all samples", 7),
                ("function", "compute", 4),
                ("function", "exc_page_fault", 3),
                ("line", "src/simd.rs:88", 4),
                ("line", "exc_page_fault", 3),
                ("dcache-line", "0x555555558040 (pid 100)", 4),
                ("dcache-line", "0x555560000100 (pid 100)", 3),
            ]
        );
        // The shared line's loads and stores at 10, 40, 40 and 80: bucket midpoints 10, 41, 83.
        let shared = &found[5].summary;
        assert_eq!(
            (shared.p50, shared.p99, shared.max),
            (Some(41), Some(83), 83)
        );
        let buckets: u64 = found[0].buckets.iter().map(|(_, n)| n).sum();
        assert_eq!(buckets, 7);
        assert!(found[0].summary.max >= 1920);
        assert!(distributions(&profile, 0, &selection, 5).is_empty());
        assert_eq!(distributions(&profile, 1, &selection, 1).len(), 4);
    }
}
