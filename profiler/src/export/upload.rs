//! Delivery of encoded windows to an HTTP backend, losing as little as the spool allows.
//!
//! A window the backend cannot take now (it is down, or answers 429 or 5xx) goes to a spool
//! directory, bounded in bytes: when it is full the oldest window is dropped and counted. Spooled
//! windows are sent first, oldest first, once the backend answers again; between failures the
//! uploader backs off exponentially (1 s doubling to 5 min), so a dead backend costs one
//! connection attempt per backoff, not one per window. A window the backend refuses for what it
//! is (another 4xx) is dropped and counted at once: sending it again would be refused again.
//! The spool survives a restart of the agent: windows left in it are sent by the next run.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::ExportError;
use crate::output::PrivateDir;

/// How long one request may take, connection included. Requests run on the backend's own
/// upload thread ([`super::delivery`]): a backend that accepts connections but never answers
/// delays only its own windows, by this much per request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const LONGEST_BACKOFF: Duration = Duration::from_secs(300);
/// Most of a refusal's body kept for the error message.
const REFUSAL_TEXT_LIMIT: u64 = 1024;

/// What happened to the windows given to one uploader; the agent's metrics and logs read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadCounts {
    /// Windows the backend accepted, spooled ones included.
    pub delivered: u64,
    /// Windows put in the spool because the backend could not take them.
    pub spooled: u64,
    /// Windows dropped from a full spool, or too big for it.
    pub dropped: u64,
    /// Windows the backend refused (4xx other than 429).
    pub refused: u64,
    /// Requests that failed (unreachable, 429, 5xx); each is retried later from the spool.
    pub failed_requests: u64,
}

/// The request every window of one backend is sent as.
pub struct Endpoint {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
}

pub struct Uploader {
    endpoint: Endpoint,
    agent: ureq::Agent,
    spool: Spool,
    backoff: Duration,
    /// No request is made before this, after a failure.
    retry_at: Option<Instant>,
    pub counts: UploadCounts,
    /// Why the last request that failed did, for logs: spooling a window is not an error.
    pub last_failure: Option<String>,
}

/// Why one request did not deliver.
enum Failure {
    /// Worth retrying: the backend is down, overloaded or failing.
    Transient(String),
    /// The backend refused this window for what it is.
    Refused(String),
}

impl Uploader {
    /// An uploader whose spool is `spool_dir` (created 0700 if absent), at most `spool_bytes`.
    pub fn new(
        endpoint: Endpoint,
        spool_dir: &Path,
        spool_bytes: u64,
    ) -> Result<Uploader, ExportError> {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .http_status_as_error(false)
            .user_agent(format!("profiler/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Uploader {
            endpoint,
            agent,
            spool: Spool::open(spool_dir, spool_bytes)?,
            backoff: FIRST_BACKOFF,
            retry_at: None,
            counts: UploadCounts::default(),
            last_failure: None,
        })
    }

    /// Windows waiting in the spool.
    pub fn spooled_now(&self) -> usize {
        self.spool.entries.len()
    }

    /// Sends the spooled windows, then `body`; whatever cannot be sent now is spooled. An error
    /// says what was lost or refused; a window spooled for later is not an error.
    pub fn send(&mut self, body: Vec<u8>) -> Result<(), ExportError> {
        let mut refusals = Vec::new();
        if self.ready() {
            self.send_spooled(&mut refusals);
        }
        let sent_now = self.spool.entries.is_empty() && self.ready();
        let lost = if sent_now {
            match self.post(&body) {
                Ok(()) => None,
                Err(Failure::Refused(why)) => {
                    refusals.push(why);
                    None
                }
                Err(Failure::Transient(why)) => {
                    self.last_failure = Some(why);
                    self.spool_window(&body)
                }
            }
        } else {
            self.spool_window(&body)
        };
        if refusals.is_empty() && lost.is_none() {
            return Ok(());
        }
        let mut problems = refusals;
        problems.extend(lost);
        Err(ExportError::Upload(format!(
            "{}: {}",
            self.endpoint.url,
            problems.join("; ")
        )))
    }

    /// Tries the spooled windows once more, whatever the backoff says: the agent is ending,
    /// and what cannot be sent now stays spooled for its next run.
    pub fn flush(&mut self) -> Result<(), ExportError> {
        let mut refusals = Vec::new();
        self.send_spooled(&mut refusals);
        if refusals.is_empty() {
            Ok(())
        } else {
            Err(ExportError::Upload(format!(
                "{}: {}",
                self.endpoint.url,
                refusals.join("; ")
            )))
        }
    }

    fn ready(&self) -> bool {
        self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    /// Sends spooled windows oldest first until the spool is empty or the backend fails.
    fn send_spooled(&mut self, refusals: &mut Vec<String>) {
        while let Some(entry) = self.spool.entries.first().cloned() {
            // Bounded by what was written: a window is never larger than the whole spool.
            let Ok(body) = self.spool.dir.read(&entry.name, self.spool.limit) else {
                // Removed or changed behind our back: nothing left to send.
                self.spool.remove_oldest();
                continue;
            };
            match self.post(&body) {
                Ok(()) => self.spool.remove_oldest(),
                Err(Failure::Refused(why)) => {
                    refusals.push(why);
                    self.spool.remove_oldest();
                }
                Err(Failure::Transient(why)) => {
                    self.last_failure = Some(why);
                    return;
                }
            }
        }
    }

    fn spool_window(&mut self, body: &[u8]) -> Option<String> {
        match self.spool.push(body) {
            Ok(dropped) => {
                self.counts.spooled += 1;
                self.counts.dropped += dropped;
                (dropped > 0)
                    .then(|| format!("the spool is full: dropped the {dropped} oldest window(s)"))
            }
            Err(e) => {
                self.counts.dropped += 1;
                Some(format!("window dropped: {e}"))
            }
        }
    }

    fn post(&mut self, body: &[u8]) -> Result<(), Failure> {
        let mut request = self.agent.post(&self.endpoint.url);
        for (name, value) in &self.endpoint.headers {
            request = request.header(*name, value);
        }
        let failure = match request.send(body) {
            Ok(mut response) => {
                let status = response.status().as_u16();
                if (200..300).contains(&status) {
                    self.counts.delivered += 1;
                    self.backoff = FIRST_BACKOFF;
                    self.retry_at = None;
                    return Ok(());
                }
                let text = response
                    .body_mut()
                    .with_config()
                    .limit(REFUSAL_TEXT_LIMIT)
                    .read_to_string()
                    .unwrap_or_default();
                let why = format!("HTTP {status}: {}", text.trim());
                if status == 429 || status >= 500 {
                    Failure::Transient(why)
                } else {
                    self.counts.refused += 1;
                    return Err(Failure::Refused(format!(
                        "the backend refused a window ({why})"
                    )));
                }
            }
            Err(e) => Failure::Transient(e.to_string()),
        };
        self.counts.failed_requests += 1;
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(LONGEST_BACKOFF);
        Err(failure)
    }
}

#[derive(Clone)]
struct SpoolEntry {
    name: String,
    bytes: u64,
    sequence: u64,
}

/// Windows on disk, oldest first, at most `limit` bytes in all.
struct Spool {
    dir: PrivateDir,
    limit: u64,
    entries: Vec<SpoolEntry>,
}

impl Spool {
    /// Opens (or creates, 0700) the spool directory and takes over the windows left in it. The
    /// agent runs as root: a directory another user owns or may write to could feed it files,
    /// so it is refused.
    fn open(dir: &Path, limit: u64) -> Result<Spool, ExportError> {
        let dir = PrivateDir::open(dir, 0o700)
            .map_err(|e| ExportError::Upload(format!("--spool-dir {}: {e:#}", dir.display())))?;
        let names = dir.names().map_err(|e| {
            ExportError::Upload(format!("--spool-dir {}: {e}", dir.path().display()))
        })?;
        let mut entries: Vec<SpoolEntry> = names
            .into_iter()
            .filter_map(|name| {
                let sequence = name.strip_suffix(".window")?.parse().ok()?;
                let bytes = dir.file(&name)?.bytes;
                Some(SpoolEntry {
                    name,
                    bytes,
                    sequence,
                })
            })
            .collect();
        entries.sort_by_key(|e| e.sequence);
        let mut spool = Spool {
            dir,
            limit,
            entries,
        };
        // A smaller limit than the last run's applies at once.
        while spool.bytes() > limit {
            spool.remove_oldest();
        }
        Ok(spool)
    }

    fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Adds a window, dropping the oldest ones to make room; returns how many were dropped.
    fn push(&mut self, body: &[u8]) -> Result<u64, String> {
        let bytes = body.len() as u64;
        if bytes > self.limit {
            return Err(format!(
                "it is {bytes} bytes, more than the whole spool ({} bytes)",
                self.limit
            ));
        }
        let mut dropped = 0;
        while self.bytes() + bytes > self.limit {
            self.remove_oldest();
            dropped += 1;
        }
        let sequence = self.entries.last().map_or(0, |e| e.sequence + 1);
        let name = format!("{sequence:020}.window");
        self.dir
            .output("--spool-dir", &name)
            .and_then(|output| output.write(|out| Ok(out.write_all(body)?)))
            .map_err(|e| format!("{e:#}"))?;
        self.entries.push(SpoolEntry {
            name,
            bytes,
            sequence,
        });
        Ok(dropped)
    }

    fn remove_oldest(&mut self) {
        if !self.entries.is_empty() {
            let oldest = self.entries.remove(0);
            self.dir.remove(&oldest.name).ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::{BufRead, BufReader, Read};
    use std::net::TcpListener;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::mpsc;

    /// A backend that answers each request with the next status of `statuses`, and reports
    /// each body it got.
    fn backend(statuses: Vec<u16>) -> (String, mpsc::Receiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/push", listener.local_addr().unwrap());
        let (bodies, received) = mpsc::channel();
        std::thread::spawn(move || {
            for status in statuses {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                bodies.send(body).unwrap();
                let reason = "x";
                write!(
                    reader.get_mut(),
                    "HTTP/1.1 {status} {reason}\r\ncontent-length: 4\r\nconnection: close\r\n\r\nnope"
                )
                .unwrap();
            }
        });
        (url, received)
    }

    fn uploader(url: &str, spool: &Path, limit: u64) -> Uploader {
        let endpoint = Endpoint {
            url: url.to_string(),
            headers: vec![("Content-Type", "application/proto".into())],
        };
        Uploader::new(endpoint, spool, limit).unwrap()
    }

    #[test]
    fn windows_a_failing_backend_could_not_take_are_sent_oldest_first_when_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        let (url, received) = backend(vec![503, 200, 200, 200]);
        let mut up = uploader(&url, &spool, 1 << 20);
        up.send(b"window 0".to_vec()).unwrap();
        assert_eq!(received.recv().unwrap(), b"window 0");
        assert_eq!(up.spooled_now(), 1);
        // Backing off: no request for the next window, which queues behind the first.
        up.send(b"window 1".to_vec()).unwrap();
        assert_eq!(up.spooled_now(), 2);
        up.retry_at = Some(Instant::now());
        up.send(b"window 2".to_vec()).unwrap();
        let order: Vec<Vec<u8>> = received.iter().take(3).collect();
        assert_eq!(order, [&b"window 0"[..], b"window 1", b"window 2"]);
        assert_eq!(up.spooled_now(), 0);
        assert_eq!(
            up.counts,
            UploadCounts {
                delivered: 3,
                spooled: 2,
                dropped: 0,
                refused: 0,
                failed_requests: 1
            }
        );
        assert_eq!(fs::read_dir(&spool).unwrap().count(), 0);
    }

    #[test]
    fn a_full_spool_drops_the_oldest_and_says_so_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        // Nothing listens here: every request fails.
        let dead = "http://127.0.0.1:9/push";
        let mut up = uploader(dead, &spool, 20);
        up.send(b"0123456789".to_vec()).unwrap();
        up.send(b"abcdefghij".to_vec()).unwrap();
        let error = up.send(b"ABCDEFGHIJ".to_vec()).unwrap_err().to_string();
        assert!(error.contains("dropped the 1 oldest window"), "{error}");
        assert_eq!(up.counts.dropped, 1);
        let error = up.send(vec![0; 21]).unwrap_err().to_string();
        assert!(error.contains("more than the whole spool"), "{error}");
        drop(up);

        // The next run sends what the last one spooled, oldest first, then its own window.
        let (url, received) = backend(vec![200, 200, 200]);
        let mut up = uploader(&url, &spool, 20);
        assert_eq!(up.spooled_now(), 2);
        up.send(b"new".to_vec()).unwrap();
        let order: Vec<Vec<u8>> = received.iter().take(3).collect();
        assert_eq!(order, [&b"abcdefghij"[..], b"ABCDEFGHIJ", b"new"]);
    }

    #[test]
    fn a_refused_window_is_dropped_with_the_backends_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (url, _received) = backend(vec![400]);
        let mut up = uploader(&url, &dir.path().join("spool"), 1 << 20);
        let error = up.send(b"bad".to_vec()).unwrap_err().to_string();
        assert!(
            error.contains("refused a window (HTTP 400: nope)"),
            "{error}"
        );
        assert_eq!(up.counts.refused, 1);
        assert_eq!(up.spooled_now(), 0);
    }

    #[test]
    fn a_spool_directory_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        fs::create_dir(&spool).unwrap();
        fs::set_permissions(&spool, fs::Permissions::from_mode(0o777)).unwrap();
        let endpoint = Endpoint {
            url: "http://127.0.0.1:9/".into(),
            headers: Vec::new(),
        };
        let error = Uploader::new(endpoint, &spool, 100)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("other users may write in it (mode 0777)"),
            "{error}"
        );
    }
}
