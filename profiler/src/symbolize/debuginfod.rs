//! Separate debug files fetched by build ID from debuginfod servers (`DEBUGINFOD_URLS`, as
//! perf, gdb, samply and elfutils read it, and `--debuginfod URL`), for modules that carry no
//! debug information and have no debug file installed: distributions ship stripped binaries
//! and serve their debug files this way.
//!
//! Fetches run on their own threads into a private cache by build ID, bounded in size and time
//! (`DEBUGINFOD_TIMEOUT`, `DEBUGINFOD_MAXTIME`, `DEBUGINFOD_MAXSIZE`, elfutils' variables). A
//! file is kept only when it is an ELF file with the build ID asked for: a server, or anyone
//! between it and us, cannot make a module's code carry another's names. A recording waits for
//! the fetch of each module it names; the agent never waits: a module is named without its
//! debug file until the fetch lands, then again with it ([`arrived`]). A server that cannot be
//! reached is left alone for a minute, so a dead one costs one time-out, not one per module.

use std::{
    collections::{HashMap, VecDeque},
    io::Read,
    path::PathBuf,
    sync::{Condvar, Mutex, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use crate::disk_cache::CacheDir;

/// elfutils' default: the time a server may take to connect and to start answering.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);
/// The longest one fetch may take (elfutils has no bound by default; one hung transfer would
/// hold a recording's end forever).
const DEFAULT_MAX_TIME: Duration = Duration::from_secs(600);
/// The largest debug file fetched (elfutils' `DEBUGINFOD_MAXSIZE` has no default).
const DEFAULT_MAX_SIZE: u64 = 2 << 30;
/// What the cache holds at most: the least recently used files go beyond it.
const MAX_CACHE_BYTES: u64 = 4 << 30;
/// How long a build ID no server had is not asked for again (elfutils' `cache_miss_s`).
const MISSING_RETRY: Duration = Duration::from_secs(600);
/// How long a server that could not be reached, or failed, is not asked.
const SERVER_RETRY: Duration = Duration::from_secs(60);
/// Fetches running at once.
const FETCH_THREADS: usize = 2;
/// Build IDs asked for at most in [`ASK_PERIOD`]: every program a local user builds has a new
/// one, and each must not cost a request (nor a recording's end its time-out).
const MAX_ASKS: usize = 256;
const ASK_PERIOD: Duration = Duration::from_secs(600);
/// Build IDs whose outcome is remembered at most, past which those not fetched are forgotten
/// (asked again at most [`MAX_ASKS`] at a time): a stream of new programs must not grow the
/// agent's memory.
const MAX_REMEMBERED: usize = 4096;
const CACHE_EXTENSION: &str = "debug";

/// Whether a caller waits for the fetches it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// A recording or a report: symbolizes once, so it waits for the module's debug file.
    Wait,
    /// The agent: a window is never held up; the module is named again when the file lands.
    Background,
}

/// The servers asked, in order, and the limits of a fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebuginfodConfig {
    pub servers: Vec<String>,
    pub timeout: Duration,
    pub max_time: Duration,
    pub max_size: u64,
}

impl DebuginfodConfig {
    /// The servers of `--debuginfod` (checked: an error names what is wrong) and, unless
    /// `ignore_environment`, those of `DEBUGINFOD_URLS` (not ours to refuse: one that is not
    /// an http or https URL is skipped with a note). Limits from elfutils' variables.
    pub fn new(given: &[String], ignore_environment: bool) -> Result<DebuginfodConfig> {
        let mut servers = Vec::new();
        for url in given.iter().flat_map(|urls| urls.split_whitespace()) {
            servers.push(server_url(url).map_err(|why| {
                anyhow::anyhow!("--debuginfod {url}: {why}: give the server's base URL, e.g. http://debuginfod.example:8002")
            })?);
        }
        if !ignore_environment {
            let from_environment = std::env::var("DEBUGINFOD_URLS").unwrap_or_default();
            for url in from_environment.split_whitespace() {
                match server_url(url) {
                    Ok(url) => servers.push(url),
                    Err(why) => eprintln!("note: DEBUGINFOD_URLS: {url} skipped: {why}"),
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        servers.retain(|url| seen.insert(url.clone()));
        Ok(DebuginfodConfig {
            servers,
            timeout: seconds_from_environment("DEBUGINFOD_TIMEOUT").unwrap_or(DEFAULT_TIMEOUT),
            max_time: seconds_from_environment("DEBUGINFOD_MAXTIME").unwrap_or(DEFAULT_MAX_TIME),
            max_size: std::env::var("DEBUGINFOD_MAXSIZE")
                .ok()
                .and_then(|size| size.trim().parse().ok())
                .filter(|&size| size > 0)
                .unwrap_or(DEFAULT_MAX_SIZE),
        })
    }
}

/// A server's base URL without its trailing slashes.
fn server_url(url: &str) -> Result<String> {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        bail!("not an http:// or https:// URL");
    };
    if rest.trim_end_matches('/').is_empty() {
        bail!("no host");
    }
    Ok(url.trim_end_matches('/').to_string())
}

fn seconds_from_environment(name: &str) -> Option<Duration> {
    let seconds: u64 = std::env::var(name).ok()?.trim().parse().ok()?;
    (seconds > 0).then(|| Duration::from_secs(seconds))
}

/// What became of the build IDs asked for, for the profile's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchCounts {
    /// Debug files fetched from a server.
    pub fetched: u64,
    /// Build IDs no server had.
    pub not_found: u64,
    /// Fetches that failed: no server reached, an error, a time-out.
    pub failed: u64,
    /// Files refused: not ELF, another build ID, over the size limit.
    pub refused: u64,
    /// Build IDs not asked for: over [`MAX_ASKS`] in [`ASK_PERIOD`].
    pub over_limit: u64,
}

/// The loss counters of what could not be fetched since the last call (by the profile's
/// counter names): a recording's whole run, an agent's window. Nothing when no server is
/// configured.
pub fn unfetched_counters() -> Vec<(String, u64)> {
    let Some(client) = CLIENT.get() else {
        return Vec::new();
    };
    let mut state = client.state.lock().unwrap();
    let (counts, taken) = (state.counts, state.taken);
    state.taken = counts;
    [
        (
            "debug files no debuginfod server had",
            counts.not_found - taken.not_found,
        ),
        (
            "debug files debuginfod failed to fetch",
            counts.failed - taken.failed,
        ),
        (
            "debug files from debuginfod refused",
            counts.refused - taken.refused,
        ),
        (
            "debug files not asked of debuginfod: over 256 in 10 minutes",
            counts.over_limit - taken.over_limit,
        ),
    ]
    .into_iter()
    .filter(|(_, count)| *count > 0)
    .map(|(name, count)| (name.to_string(), count))
    .collect()
}

/// Counts since the process started; `None` when no server is configured.
pub fn counts() -> Option<FetchCounts> {
    Some(CLIENT.get()?.state.lock().unwrap().counts)
}

/// Asks the configured servers for separate debug files from now on. The first configuration
/// holds for the process; with no servers, nothing is ever asked.
pub fn configure(config: DebuginfodConfig, waiting: Waiting) {
    if config.servers.is_empty() {
        return;
    }
    let Some(cache) = CacheDir::default_for("debuginfod") else {
        eprintln!("note: debuginfod: no cache directory (no HOME): debug files are not fetched");
        return;
    };
    let _ = CLIENT.set(Client::new(config, cache, waiting));
}

/// The debug file of the module with `build_id` (lowercase hex) from the servers: the cached
/// copy, or fetched now (waiting for it where [`Waiting::Wait`]). `None` when no server is
/// configured, none has it, or (in the background) it is still on its way.
pub fn debug_file(build_id: &str) -> Option<PathBuf> {
    CLIENT.get()?.debug_file(build_id)
}

/// The build IDs whose debug files were fetched since the last call: modules already named
/// without them are to be named again.
pub fn arrived() -> Vec<String> {
    match CLIENT.get() {
        Some(client) => std::mem::take(&mut client.state.lock().unwrap().arrived),
        None => Vec::new(),
    }
}

static CLIENT: OnceLock<Client> = OnceLock::new();

struct Client {
    config: DebuginfodConfig,
    cache: CacheDir,
    waiting: Waiting,
    http: ureq::Agent,
    state: Mutex<State>,
    /// Signalled when a fetch ends.
    ended: Condvar,
    /// Signalled when a build ID is queued.
    queued: Condvar,
}

#[derive(Default)]
struct State {
    fetches: HashMap<String, Fetch>,
    queue: VecDeque<String>,
    /// Servers not to ask before the instant, by index in the configuration.
    resting: HashMap<usize, Instant>,
    arrived: Vec<String>,
    /// When each of the last [`MAX_ASKS`] build IDs was asked for.
    asks: VecDeque<Instant>,
    counts: FetchCounts,
    /// `counts` when [`unfetched_counters`] last took them.
    taken: FetchCounts,
    threads: usize,
}

enum Fetch {
    Queued,
    Done(PathBuf),
    /// Not to be asked for again before the instant.
    Missing(Instant),
}

/// How one server answered.
enum Answer {
    Fetched,
    NotFound,
    Refused(String),
    Failed(String),
}

impl Client {
    fn new(config: DebuginfodConfig, cache: CacheDir, waiting: Waiting) -> Client {
        let http = ureq::Agent::config_builder()
            .timeout_connect(Some(config.timeout))
            .timeout_recv_response(Some(config.timeout))
            .timeout_global(Some(config.max_time))
            .http_status_as_error(false)
            .user_agent(format!("profiler/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            config,
            cache,
            waiting,
            http,
            state: Mutex::default(),
            ended: Condvar::new(),
            queued: Condvar::new(),
        }
    }

    fn debug_file(&'static self, build_id: &str) -> Option<PathBuf> {
        if !is_build_id(build_id) {
            return None;
        }
        let mut state = self.state.lock().unwrap();
        loop {
            match state.fetches.get(build_id) {
                Some(Fetch::Done(path)) => return Some(path.clone()),
                Some(Fetch::Missing(until)) if Instant::now() < *until => return None,
                Some(Fetch::Queued) if self.waiting == Waiting::Background => return None,
                Some(Fetch::Queued) => state = self.ended.wait(state).unwrap(),
                Some(Fetch::Missing(_)) | None => {
                    // A file an earlier run fetched is used at once.
                    if let Ok(Some(path)) = self.cache.checked_path(&cache_name(build_id)) {
                        state
                            .fetches
                            .insert(build_id.to_string(), Fetch::Done(path.clone()));
                        return Some(path);
                    }
                    let outcome = self.queue(&mut state, build_id);
                    state.fetches.insert(build_id.to_string(), outcome);
                }
            }
        }
    }

    /// Queues the fetch of `build_id` (`Fetch::Queued`), unless over the ask limit or no
    /// thread can fetch it.
    fn queue(&'static self, state: &mut State, build_id: &str) -> Fetch {
        let now = Instant::now();
        if state.fetches.len() >= MAX_REMEMBERED {
            let expired = |fetch: &Fetch| matches!(fetch, Fetch::Missing(until) if *until <= now);
            state.fetches.retain(|_, fetch| !expired(fetch));
            if state.fetches.len() >= MAX_REMEMBERED {
                state
                    .fetches
                    .retain(|_, fetch| !matches!(fetch, Fetch::Missing(_)));
            }
        }
        while (state.asks.front()).is_some_and(|asked| now.duration_since(*asked) > ASK_PERIOD) {
            state.asks.pop_front();
        }
        if let Some(&oldest) = state.asks.front().filter(|_| state.asks.len() >= MAX_ASKS) {
            state.counts.over_limit += 1;
            return Fetch::Missing(oldest + ASK_PERIOD);
        }
        if state.threads < FETCH_THREADS {
            let spawned = std::thread::Builder::new()
                .name("debuginfod".into())
                .spawn(move || self.fetch_queued());
            match spawned {
                Ok(_) => state.threads += 1,
                Err(error) if state.threads == 0 => {
                    eprintln!("note: debuginfod: cannot start a thread: {error}");
                    return Fetch::Missing(now + MISSING_RETRY);
                }
                // The running threads fetch it.
                Err(_) => {}
            }
        }
        state.asks.push_back(now);
        state.queue.push_back(build_id.to_string());
        self.queued.notify_one();
        Fetch::Queued
    }

    /// A fetching thread: fetches queued build IDs for the life of the process.
    fn fetch_queued(&self) {
        let mut state = self.state.lock().unwrap();
        loop {
            let Some(build_id) = state.queue.pop_front() else {
                state = self.queued.wait(state).unwrap();
                continue;
            };
            drop(state);
            let fetched = self.fetch(&build_id);
            state = self.state.lock().unwrap();
            let outcome = match fetched {
                Some(path) => {
                    state.arrived.push(build_id.clone());
                    Fetch::Done(path)
                }
                None => Fetch::Missing(Instant::now() + MISSING_RETRY),
            };
            state.fetches.insert(build_id, outcome);
            self.ended.notify_all();
        }
    }

    /// Asks each server in turn until one has the file; counts how it went.
    fn fetch(&self, build_id: &str) -> Option<PathBuf> {
        let mut failures = Vec::new();
        let mut refused = false;
        for (index, server) in self.config.servers.iter().enumerate() {
            let resting = self.state.lock().unwrap().resting.get(&index).copied();
            if resting.is_some_and(|until| Instant::now() < until) {
                continue;
            }
            match self.ask(server, build_id) {
                Answer::Fetched => {
                    let path = self.cache.checked_path(&cache_name(build_id)).ok()??;
                    self.state.lock().unwrap().counts.fetched += 1;
                    // Failing to prune costs only room.
                    let _ = self.cache.prune(CACHE_EXTENSION, MAX_CACHE_BYTES);
                    return Some(path);
                }
                Answer::NotFound => {}
                Answer::Refused(why) => {
                    eprintln!("note: debuginfod {server}: debug file of {build_id} refused: {why}");
                    refused = true;
                }
                Answer::Failed(why) => {
                    eprintln!("note: debuginfod {server}: {why}; not asked again for a minute");
                    let mut state = self.state.lock().unwrap();
                    state.resting.insert(index, Instant::now() + SERVER_RETRY);
                    failures.push(why);
                }
            }
        }
        let mut state = self.state.lock().unwrap();
        if refused {
            state.counts.refused += 1;
        } else if !failures.is_empty() {
            state.counts.failed += 1;
        } else {
            state.counts.not_found += 1;
        }
        None
    }

    fn ask(&self, server: &str, build_id: &str) -> Answer {
        let url = format!("{server}/buildid/{build_id}/debuginfo");
        let response = match self.http.get(&url).call() {
            Ok(response) => response,
            Err(error) => return Answer::Failed(format!("GET {url}: {error}")),
        };
        match response.status().as_u16() {
            200 => {}
            404 => return Answer::NotFound,
            status => return Answer::Failed(format!("GET {url}: HTTP {status}")),
        }
        let name = cache_name(build_id);
        let part = format!("{name}.part");
        let max_size = self.config.max_size;
        let mut body = response.into_body().into_reader().take(max_size + 1);
        let mut written = 0;
        let stored = self.cache.write_with("debuginfod cache", &part, |out| {
            written = std::io::copy(&mut body, out)?;
            Ok(())
        });
        let checked = match stored {
            Err(error) => Err(Answer::Failed(format!("GET {url}: {error:#}"))),
            Ok(()) if written > max_size => Err(Answer::Refused(format!(
                "over {max_size} bytes (DEBUGINFOD_MAXSIZE)"
            ))),
            Ok(()) => self.check(&part, build_id).map_err(Answer::Refused),
        };
        let part_path = self.cache.path().join(&part);
        match checked {
            Ok(()) => match std::fs::rename(&part_path, self.cache.path().join(&name)) {
                Ok(()) => Answer::Fetched,
                Err(error) => Answer::Failed(format!("storing {}: {error}", part_path.display())),
            },
            Err(answer) => {
                let _ = std::fs::remove_file(&part_path);
                answer
            }
        }
    }

    /// Whether the cached file `name` is an ELF file with the build ID `build_id`.
    fn check(&self, name: &str, build_id: &str) -> Result<(), String> {
        let path = self
            .cache
            .checked_path(name)
            .map_err(|error| format!("{error:#}"))?
            .ok_or("not stored")?;
        let file = crate::input::open_regular(&path, crate::input::FinalLink::Refuse)
            .map_err(|error| error.to_string())?;
        let image = crate::input::ModuleImage::new(file);
        let module = object::File::parse(&image).map_err(|_| "not an ELF file")?;
        match super::module_file::build_id(&module) {
            Some(found) if found == build_id => Ok(()),
            Some(found) => Err(format!("it has build ID {found}")),
            None => Err("it has no build ID".into()),
        }
    }
}

fn cache_name(build_id: &str) -> String {
    format!("{build_id}.{CACHE_EXTENSION}")
}

/// A build ID as module files give it: lowercase hex, whole bytes, at most 64 of them (it
/// becomes a URL path and a file name).
fn is_build_id(text: &str) -> bool {
    (2..=128).contains(&text.len())
        && text.len().is_multiple_of(2)
        && text
            .bytes()
            .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_are_http_or_https_with_a_host() {
        assert_eq!(
            server_url("http://127.0.0.1:8002/").unwrap(),
            "http://127.0.0.1:8002"
        );
        assert_eq!(
            server_url("https://debuginfod.debian.net").unwrap(),
            "https://debuginfod.debian.net"
        );
        for bad in [
            "ftp://x",
            "debuginfod.debian.net",
            "http://",
            "https:///",
            "file:///tmp",
        ] {
            assert!(server_url(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn only_hex_build_ids_become_urls_and_file_names() {
        assert!(is_build_id("0123456789abcdef0123456789abcdef01234567"));
        for bad in [
            "",
            "a",
            "abc",
            "../etc/passwd",
            "ABCD",
            "12 4",
            &"ab".repeat(65),
        ] {
            assert!(!is_build_id(bad), "{bad:?} accepted");
        }
    }

    #[test]
    fn build_ids_past_the_ask_limit_are_counted_not_asked() {
        let cache = tempfile::tempdir().unwrap();
        let config = DebuginfodConfig {
            // Nothing listens on port 1: each fetch fails at once.
            servers: vec!["http://127.0.0.1:1".into()],
            timeout: Duration::from_secs(1),
            max_time: Duration::from_secs(1),
            max_size: 1 << 20,
        };
        let client: &'static Client = Box::leak(Box::new(Client::new(
            config,
            CacheDir::new(cache.path().to_path_buf()),
            Waiting::Background,
        )));
        for n in 0..=MAX_ASKS {
            assert_eq!(client.debug_file(&format!("{n:08x}")), None);
        }
        {
            let state = client.state.lock().unwrap();
            assert_eq!(state.counts.over_limit, 1);
            assert_eq!(state.asks.len(), MAX_ASKS);
        }
        // A stream of new build IDs past the limit is counted, and remembered within bounds.
        for n in 0..2 * MAX_REMEMBERED {
            assert_eq!(client.debug_file(&format!("{:08x}", 1 << 20 | n)), None);
        }
        let state = client.state.lock().unwrap();
        assert_eq!(state.counts.over_limit, 1 + 2 * MAX_REMEMBERED as u64);
        assert!(
            state.fetches.len() <= MAX_REMEMBERED,
            "{}",
            state.fetches.len()
        );
    }

    #[test]
    fn a_bad_given_server_is_an_error_naming_it() {
        let error = DebuginfodConfig::new(&["ftp://x".into()], true).unwrap_err();
        assert!(
            error.to_string().contains("--debuginfod ftp://x"),
            "{error}"
        );
        let config = DebuginfodConfig::new(
            &["http://a:1/ http://b:2".into(), "http://a:1".into()],
            true,
        )
        .unwrap();
        assert_eq!(config.servers, ["http://a:1", "http://b:2"]);
    }
}
