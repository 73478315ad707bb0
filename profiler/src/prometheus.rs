//! The agent's own health as Prometheus metrics (`--metrics-addr HOST:PORT`): what it sampled,
//! kept and lost, what its backends took, how long windows take, its memory and its kernel cost
//! per sample. Served as Prometheus' text format (version 0.0.4) on `GET /metrics` by hyper on
//! a thread of its own, so a scrape never touches the capture or export threads. Other users of
//! the machine can reach the port: a request's headers are bounded in size and in time, each
//! connection is served on its own task (a slow client holds back no other), and so are the
//! connections open at once.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header::{ALLOW, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

/// A client that does not send its request's headers within this is cut off.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The most a connection lasts, whatever the client does (a scrape takes milliseconds).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes a request's line and headers may take (hyper's smallest buffer limit; a
/// scrape's are a few hundred bytes).
const MAX_HEADER_BYTES: usize = 8192;
/// Connections served at once; more are closed as they come.
const MAX_CONNECTIONS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

struct Family {
    help: &'static str,
    kind: Kind,
    /// Rendered label set (`{backend="otlp"}`, or empty) -> value.
    series: BTreeMap<String, f64>,
}

/// Every metric the agent exports, updated by its threads and read by scrapes.
#[derive(Default)]
pub struct Metrics {
    families: Mutex<BTreeMap<&'static str, Family>>,
}

impl Metrics {
    /// Sets a series to `value`: counters are set to the running total their owner keeps, so a
    /// counter never goes back as long as its owner's total does not.
    pub fn set(
        &self,
        name: &'static str,
        kind: Kind,
        help: &'static str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name).or_insert_with(|| Family {
            help,
            kind,
            series: BTreeMap::new(),
        });
        family.series.insert(label_set(labels), value);
    }

    /// Adds `delta` to a counter series.
    pub fn add(&self, name: &'static str, help: &'static str, labels: &[(&str, &str)], delta: f64) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name).or_insert_with(|| Family {
            help,
            kind: Kind::Counter,
            series: BTreeMap::new(),
        });
        *family.series.entry(label_set(labels)).or_default() += delta;
    }

    /// The text exposition format, with this process's resident memory and open files read at
    /// scrape time.
    pub fn render(&self) -> String {
        self.set(
            "profiler_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory of the agent.",
            &[],
            resident_bytes() as f64,
        );
        // The agent holds each mapped file open while a process maps it: a count that only
        // grows is a leak that ends in EMFILE.
        self.set(
            "profiler_open_files",
            Kind::Gauge,
            "File descriptors the agent holds open.",
            &[],
            open_files() as f64,
        );
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let mut text = String::new();
        for (name, family) in families.iter() {
            text.push_str(&format!("# HELP {name} {}\n", family.help));
            text.push_str(&format!("# TYPE {name} {}\n", family.kind.name()));
            for (labels, value) in &family.series {
                text.push_str(&format!("{name}{labels} {value}\n"));
            }
        }
        text
    }
}

/// `{a="x",b="y"}` with Prometheus' escapes, or "" without labels.
fn label_set(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels
        .iter()
        .map(|(name, value)| {
            let value = value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{name}=\"{value}\"")
        })
        .collect();
    format!("{{{}}}", pairs.join(","))
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |entries| entries.count())
}

/// Serves `metrics` on `addr` from a thread of its own; the address is checked (and bound)
/// before the agent starts, so a taken port is an error at once, not a silent gap.
pub fn serve(addr: &str, metrics: Arc<Metrics>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        anyhow::anyhow!(
            "--metrics-addr {addr}: cannot listen there ({e}); give a free HOST:PORT such as \
             127.0.0.1:9464"
        )
    })?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(accept(listener, metrics)))?;
    Ok(bound)
}

/// Accepts connections and serves each on a task of its own, [`MAX_CONNECTIONS`] at most.
async fn accept(listener: TcpListener, metrics: Arc<Metrics>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(false);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, most likely: let some close.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            continue;
        };
        let metrics = Arc::clone(&metrics);
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| {
                let metrics = Arc::clone(&metrics);
                async move { Ok::<_, Infallible>(answer(&request, &metrics)) }
            }),
        );
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
            drop(permit);
        });
    }
}

/// `GET /metrics`: the metrics; any other path 404, any other method 405.
fn answer(request: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, content_type.parse().expect("a valid header"));
        response
    };
    if request.method() != Method::GET {
        let mut response = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
        response
            .headers_mut()
            .insert(ALLOW, "GET".parse().expect("a valid header"));
        return response;
    }
    if request.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "text/plain", "try /metrics\n".into());
    }
    reply(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        metrics.render(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }

    #[test]
    fn scrapes_get_every_series_in_the_text_format() {
        let metrics = Arc::new(Metrics::default());
        metrics.add(
            "profiler_samples_lost_total",
            "Samples lost, by cause.",
            &[("cause", "ring \"full\"")],
            3.0,
        );
        metrics.add(
            "profiler_samples_lost_total",
            "Samples lost, by cause.",
            &[("cause", "ring \"full\"")],
            2.0,
        );
        metrics.set(
            "profiler_exports_total",
            Kind::Counter,
            "Windows exported, by backend and outcome.",
            &[("backend", "otlp"), ("outcome", "ok")],
            7.0,
        );
        let addr = serve("127.0.0.1:0", Arc::clone(&metrics)).unwrap();
        let reply = get(addr, "/metrics");
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(reply.contains("text/plain; version=0.0.4"), "{reply}");
        assert!(
            reply.contains("# TYPE profiler_samples_lost_total counter\n"),
            "{reply}"
        );
        assert!(
            reply.contains("profiler_samples_lost_total{cause=\"ring \\\"full\\\"\"} 5\n"),
            "{reply}"
        );
        assert!(
            reply.contains("profiler_exports_total{backend=\"otlp\",outcome=\"ok\"} 7\n"),
            "{reply}"
        );
        let rss_line = reply
            .lines()
            .find(|l| l.starts_with("profiler_resident_memory_bytes "))
            .unwrap();
        let rss: f64 = rss_line.split(' ').nth(1).unwrap().parse().unwrap();
        assert!(rss > 1e6, "{rss_line}");
        assert!(get(addr, "/").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn only_get_is_answered_and_a_slow_or_endless_request_holds_back_no_scrape() {
        let addr = serve("127.0.0.1:0", Arc::default()).unwrap();
        let mut post = TcpStream::connect(addr).unwrap();
        write!(post, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut reply = String::new();
        post.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
        // A client that sent part of its request line and nothing since.
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /met").unwrap();
        let started = std::time::Instant::now();
        assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200 OK"));
        assert!(started.elapsed() < Duration::from_secs(2));
        // A request line without end is cut off after a few KiB.
        let mut endless = TcpStream::connect(addr).unwrap();
        endless
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let chunk = vec![b'A'; 64 << 10];
        let mut sent = 0usize;
        while sent < 128 << 20 && endless.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
        assert!(sent < 16 << 20, "{} MiB sent, never cut off", sent >> 20);
        assert!(get(addr, "/metrics").starts_with("HTTP/1.1 200 OK"));
    }

    #[test]
    fn a_taken_address_is_refused_with_the_option_named() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let error = serve(&addr, Arc::default()).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("--metrics-addr {addr}")),
            "{error}"
        );
    }
}
