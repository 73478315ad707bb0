//! The agent's own health as Prometheus metrics (`--metrics-addr HOST:PORT`): what it sampled,
//! kept and lost, what its backends took, how long windows take, its memory and its kernel cost
//! per sample. Served as Prometheus' text format (version 0.0.4) on `GET /metrics` by one small
//! thread, so a scrape never touches the capture or export threads.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A scrape that does not send its request within this is dropped.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

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
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(stream, &metrics);
            }
        })?;
    Ok(bound)
}

fn answer(stream: TcpStream, metrics: &Metrics) {
    stream.set_read_timeout(Some(SCRAPE_TIMEOUT)).ok();
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    // The headers are read and ignored: a scrape is a plain GET.
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
        line.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (status, content_type, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        (Some("GET"), _) => ("404 Not Found", "text/plain", "try /metrics\n".into()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
    };
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

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
