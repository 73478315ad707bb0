//! An HTTP backend's uploads on a thread of their own. A backend that accepts connections but
//! never answers makes each request wait out its timeout; on the export thread that would hold
//! up every backend and the next windows, until the agent's window queue overflowed and windows
//! were dropped for all of them. Here it holds up only its own windows, which wait in a queue,
//! then in the uploader's spool.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::upload::{UploadCounts, Uploader};
use super::ExportError;

/// Bodies waiting for the upload thread. A request takes at most its timeout, and after a
/// failure the uploader spools windows without a request until its backoff ends, so a queue
/// this long fills only when the backend is far behind; a body past it is dropped and counted.
const QUEUED_BODIES: usize = 16;

pub struct Delivery {
    /// The backend as the user named it, for errors.
    name: String,
    queue: Option<SyncSender<Vec<u8>>>,
    thread: Option<JoinHandle<Uploader>>,
    reports: Arc<Mutex<Reports>>,
    /// Bodies dropped because the queue was full.
    dropped_queued: u64,
}

/// What the upload thread tells the export thread.
#[derive(Default)]
struct Reports {
    counts: UploadCounts,
    /// What went wrong since the export thread last asked: windows refused or dropped.
    problems: Vec<String>,
}

impl Delivery {
    /// Starts the upload thread of `uploader`, the backend `name`.
    pub fn start(name: &str, uploader: Uploader) -> Result<Delivery, ExportError> {
        let (queue, bodies) = sync_channel(QUEUED_BODIES);
        let reports = Arc::new(Mutex::new(Reports {
            counts: uploader.counts,
            problems: Vec::new(),
        }));
        let thread = {
            let reports = Arc::clone(&reports);
            std::thread::Builder::new()
                .name("upload".into())
                .spawn(move || upload(uploader, &bodies, &reports))
                .map_err(|e| {
                    ExportError::Upload(format!("{name}: starting its upload thread: {e}"))
                })?
        };
        Ok(Delivery {
            name: name.to_string(),
            queue: Some(queue),
            thread: Some(thread),
            reports,
            dropped_queued: 0,
        })
    }

    /// Hands a window's body to the upload thread without waiting for the backend. The error
    /// says what went wrong since the last call (windows refused or dropped: the upload thread
    /// learns it later than the window it is about), and whether this window was dropped because
    /// the backend is too far behind.
    pub fn send(&mut self, body: Vec<u8>) -> Result<(), ExportError> {
        let queue = self
            .queue
            .as_ref()
            .expect("windows are sent before the end");
        let dropped = match queue.try_send(body) {
            Ok(()) => None,
            Err(TrySendError::Full(_)) => {
                self.dropped_queued += 1;
                Some(format!(
                    "window dropped: {QUEUED_BODIES} windows are still waiting for the backend"
                ))
            }
            Err(TrySendError::Disconnected(_)) => {
                Some("window dropped: the upload thread ended".into())
            }
        };
        let mut problems = std::mem::take(&mut lock(&self.reports).problems);
        problems.extend(dropped);
        reported(problems)
    }

    /// Running totals of what the backend took, spooled, dropped and refused.
    pub fn counts(&self) -> UploadCounts {
        let mut counts = lock(&self.reports).counts;
        counts.dropped += self.dropped_queued;
        counts
    }

    /// Waits for the queued windows to be sent or spooled, then tries the spool once more.
    pub fn finish(&mut self) -> Result<(), ExportError> {
        drop(self.queue.take());
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let mut uploader = thread
            .join()
            .map_err(|_| ExportError::Upload(format!("{}: the upload thread failed", self.name)))?;
        let flushed = uploader.flush();
        let mut reports = lock(&self.reports);
        reports.counts = uploader.counts;
        let mut problems = std::mem::take(&mut reports.problems);
        drop(reports);
        problems.extend(flushed.err().map(|e| e.to_string()));
        reported(problems)
    }
}

fn reported(problems: Vec<String>) -> Result<(), ExportError> {
    match problems.is_empty() {
        true => Ok(()),
        false => Err(ExportError::Upload(problems.join("; "))),
    }
}

/// The upload thread: sends (or spools) each body in turn, reporting as it goes; returns the
/// uploader once the export thread is done with it.
fn upload(
    mut uploader: Uploader,
    bodies: &Receiver<Vec<u8>>,
    reports: &Mutex<Reports>,
) -> Uploader {
    for body in bodies {
        let sent = uploader.send(body);
        let mut reports = lock(reports);
        reports.counts = uploader.counts;
        if let Err(e) = sent {
            reports.problems.push(e.to_string());
        }
    }
    uploader
}

/// The reports, even if a thread panicked holding them: they are plain counts and messages.
fn lock(reports: &Mutex<Reports>) -> MutexGuard<'_, Reports> {
    reports
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
