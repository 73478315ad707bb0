//! How often an event is sampled: every N events, or about N times a second. Shared by the
//! catalog's defaults and the specifications users write.

use std::fmt;

use perf_event_open_sys::bindings::perf_event_attr;
use serde::Serialize;

/// How often an event produces a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// A sample every N events (the overflow value).
    Period(u64),
    /// About N samples per second; the kernel adjusts the period to get there.
    Frequency(u64),
}

impl Sampling {
    /// Sets `freq` and `sample_period`/`sample_freq`.
    pub fn apply(&self, attr: &mut perf_event_attr) {
        match *self {
            Sampling::Period(period) => {
                attr.set_freq(0);
                attr.sample_period = period;
            }
            Sampling::Frequency(hz) => {
                attr.set_freq(1);
                attr.sample_freq = hz;
            }
        }
    }
}

impl fmt::Display for Sampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sampling::Period(period) => write!(f, "{period}"),
            Sampling::Frequency(hz) => write!(f, "{hz} Hz"),
        }
    }
}
