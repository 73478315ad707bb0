//! `profiler agent`'s arguments, and their resolution into the agent's options: its capture,
//! its sinks and its metrics endpoint.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{bail, Result};

use super::{
    options::{capture_options, system_wide_sampling},
    SamplingArgs,
};
use crate::{
    agent::{
        log::{self, log, LogLevel},
        output_dir::OutputDirSink,
        AgentOptions,
    },
    export::{
        otlp::otlp_sink,
        pyroscope::pyroscope_sink,
        series::{SeriesNaming, ServiceName},
        sink::WindowSink,
    },
    prometheus::{serve, Metrics},
    session::{CaptureOptions, AGENT_SIDEBAND_INTERVAL},
};

/// Samples per second per CPU when no event or rate is given: the fleet profilers' rate.
const DEFAULT_FREQUENCY: u64 = 99;

/// `profiler agent` arguments.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Close a window and export it this often (`10s`, `1m`; a bare number is seconds).
    #[arg(long, value_name = "TIME", default_value = "10s", value_parser = crate::duration::seconds)]
    pub interval: Duration,
    /// Write one gzipped pprof file per window into this directory.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Bytes the `--output-dir` profiles may take (suffixes K, M, G); the oldest are removed.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = byte_size)]
    pub max_disk: u64,
    /// Push each window to Grafana Pyroscope at this URL (`http://host:4040`).
    #[arg(long, value_name = "URL")]
    pub pyroscope: Option<String>,
    /// With `--pyroscope`: the tenant of a multi-tenant server (its `X-Scope-OrgID`).
    #[arg(long, value_name = "ID", requires = "pyroscope")]
    pub pyroscope_tenant: Option<String>,
    /// Send each window as OpenTelemetry profiles over OTLP/HTTP to this URL
    /// (`http://collector:4318`).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
    /// How `--pyroscope` and `--otlp` name a process's service: auto (its Kubernetes
    /// namespace/container, else its container, else its systemd service, else its
    /// executable), executable, unit, container, kubernetes, or =NAME.
    #[arg(long, value_name = "RULE", default_value = "auto", value_parser = ServiceName::parse)]
    pub service_name: ServiceName,
    /// Where windows a backend cannot take now wait until it can (a subdirectory per backend).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/profiler/spool")]
    pub spool_dir: PathBuf,
    /// Bytes each backend's spool may hold (suffixes K, M, G); past it the oldest windows are
    /// dropped and counted.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = byte_size)]
    pub spool_max: u64,
    /// Serve Prometheus metrics about the agent on `http://HOST:PORT/metrics`.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Give frames their source lines and inlined functions, read from DWARF debug information.
    /// Without it functions are named from symbol tables (a separate debug file's too), which
    /// keeps the agent's memory small: DWARF is parsed once per file and kept, tens of MB for
    /// a large program or glibc's debug file.
    #[arg(long)]
    pub source_lines: bool,
    /// The most the agent's own heap is to hold (suffixes K, M, G): compiled unwind rows,
    /// symbols, the processes' mappings and the window being exported. Over it, the compiled
    /// rows of the coldest unwind tables (their copy in the kernel stays) and the symbols of
    /// the modules the last window did not sample are let go, counted, and read again when
    /// needed. The kernel's maps are apart (--unwind-table-mib and the sample maps); --stats
    /// and the metrics show both.
    #[arg(long, value_name = "SIZE", default_value = "32M", value_parser = byte_size)]
    pub memory_max: u64,
    /// The least severe messages logged to standard error.
    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// Turn the kernel's BPF run-time statistics on while the agent runs, so that the metrics
    /// carry its programs' time in the kernel (`profiler_bpf_run_seconds_total`,
    /// `profiler_bpf_runs_total`). Every BPF program on the machine then reads the clock twice
    /// per run. Without it they are exported when `kernel.bpf_stats_enabled` is 1 already.
    #[arg(long)]
    pub bpf_stats: bool,
}

/// A backend's URL: http or https, said before the agent starts rather than at the first window.
fn backend_url<'a>(option: &str, url: &'a str) -> Result<&'a str> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(url)
    } else {
        bail!("{option} {url}: give the backend's http:// or https:// URL")
    }
}

/// `--max-disk`: a number of bytes with an optional K, M or G suffix (powers of 1024).
fn byte_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("unknown unit '{unit}': give bytes, or K, M or G")),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| "give a size such as 500M or 2G".to_string())?;
    match number.checked_mul(1 << shift) {
        Some(0) => Err("give a size above 0".into()),
        Some(bytes) => Ok(bytes),
        None => Err("too large".into()),
    }
}

impl AgentArgs {
    /// How the backends name their series.
    fn naming(&self) -> SeriesNaming {
        SeriesNaming {
            service_name: self.service_name.clone(),
            node_root: self.sampling.node_root.clone(),
        }
    }

    /// The sinks asked for; at least one.
    fn sinks(&self) -> Result<Vec<Box<dyn WindowSink>>> {
        let mut sinks: Vec<Box<dyn WindowSink>> = Vec::new();
        if let Some(dir) = &self.output_dir {
            sinks.push(Box::new(OutputDirSink::new(dir, self.max_disk)?));
        }
        if let Some(url) = &self.pyroscope {
            sinks.push(Box::new(pyroscope_sink(
                backend_url("--pyroscope", url)?,
                self.pyroscope_tenant.as_deref(),
                self.naming(),
                &self.spool_dir.join("pyroscope"),
                self.spool_max,
            )?));
        }
        if let Some(url) = &self.otlp {
            sinks.push(Box::new(otlp_sink(
                backend_url("--otlp", url)?,
                self.naming(),
                &self.spool_dir.join("otlp"),
                self.spool_max,
            )?));
        }
        if sinks.is_empty() {
            bail!(
                "nowhere to export the profiles: give --output-dir DIR, --pyroscope URL or \
                 --otlp URL"
            );
        }
        Ok(sinks)
    }

    /// Resolves the arguments into the agent's options, in the order the agent used to take
    /// them: the log level, the checks, the sinks, the metrics endpoint (serving from here),
    /// then the capture (with its calibration pass).
    pub fn resolve(mut self) -> Result<AgentOptions> {
        log::set_level(self.log_level);
        let sinks = self.sinks()?;
        let metrics = Arc::new(Metrics::default());
        if let Some(addr) = &self.metrics_addr {
            let bound = serve(addr, Arc::clone(&metrics))?;
            log(LogLevel::Info, format!("metrics on http://{bound}/metrics"));
        }
        let (target, title) =
            system_wide_sampling(&mut self.sampling, "the agent", DEFAULT_FREQUENCY)?;
        let capture = CaptureOptions {
            stats: self.bpf_stats,
            sideband_interval: AGENT_SIDEBAND_INTERVAL,
            // Its exports carry stacks and data lines, not instructions.
            per_instruction: false,
            memory_budget: Some(self.memory_max),
            ..capture_options(&self.sampling, target)?
        };
        Ok(AgentOptions {
            capture,
            target: title,
            interval: self.interval,
            sinks,
            metrics,
            source_lines: self.source_lines,
            memory_budget: self.memory_max,
            node_root: self.sampling.node_root,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_nonsense() {
        assert_eq!(byte_size("4096"), Ok(4096));
        assert_eq!(byte_size("500M"), Ok(500 << 20));
        assert_eq!(byte_size("2g"), Ok(2 << 30));
        assert_eq!(byte_size("1KiB"), Ok(1024));
        assert!(byte_size("0").is_err());
        assert!(byte_size("12X").unwrap_err().contains("unknown unit"));
        assert!(byte_size("M").is_err());
        assert!(byte_size("99999999999G").unwrap_err().contains("too large"));
    }
}
