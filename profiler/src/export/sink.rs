//! Where the continuous agent's closed windows go: each backend (a directory of pprof files,
//! Pyroscope, an OTLP endpoint) is a [`WindowSink`]. Sinks run on the export thread, never on the
//! capture thread, so a slow or unreachable backend cannot delay a drain; HTTP backends hand
//! their requests to a thread of their own, so one cannot delay the others.

use std::time::SystemTime;

use super::upload::UploadCounts;
use super::ExportError;
use crate::profile::Profile;

/// One closed capture window: what was sampled between `start` and `end`, symbolized.
pub struct Window {
    /// Counts windows from 0 since the agent started; names files and spool entries.
    pub sequence: u64,
    pub start: SystemTime,
    pub end: SystemTime,
    pub profile: Profile,
}

/// A backend that windows are exported to, one after another, in window order.
pub trait WindowSink: Send {
    /// The backend as the user named it (`--pyroscope URL`, `--output-dir DIR`), for logs and
    /// metrics.
    fn name(&self) -> &str;

    /// Exports one window. An error is counted and logged by the caller; the sink itself decides
    /// whether the window is kept to retry (spooled) or dropped.
    fn export(&mut self, window: &Window) -> Result<(), ExportError>;

    /// Running totals of what an HTTP backend took, spooled, dropped and refused; `None` for
    /// sinks that write locally.
    fn delivery(&self) -> Option<UploadCounts> {
        None
    }

    /// Called once after the last window: a last try at what is waiting to be delivered.
    fn finish(&mut self) -> Result<(), ExportError> {
        Ok(())
    }
}
