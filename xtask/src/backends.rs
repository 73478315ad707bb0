//! The real backends the agent's tests push to: Grafana Pyroscope and the OpenTelemetry
//! Collector (OTLP receiver with profiles, file and debug exporters), built from the Go module
//! proxy at pinned versions into target/backends, once per version. Nothing of theirs is kept
//! in this repository: only the versions and the few lines that ask Go to build them.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

use crate::{run_command, target_dir};

/// Pyroscope's last release the module proxy serves whose `api` module was published with it.
pub const PYROSCOPE_VERSION: &str = "v1.9.0";
/// The release builds its own `./api` directory (a `replace` a dependent cannot inherit); the
/// `api` module published five days after it carries that directory's packages.
const PYROSCOPE_API_VERSION: &str = "v1.0.0";
/// One collector release for every component: the core modules' v0.x and v1.x of a release, and
/// the contrib file exporter of the same release.
pub const COLLECTOR_VERSION: &str = "v0.161.0";
const COLLECTOR_STABLE_VERSION: &str = "v1.67.0";
/// The OpenTelemetry eBPF profiler the bench runs beside the agent: the newest the proxy serves.
pub const EBPF_PROFILER_VERSION: &str = "v0.0.202547";
/// The Collector release of the eBPF profiler's own pdata (v1.46.0): OTLP profiles changed on
/// the wire since, and 0.161 refuses what it sends.
pub const PEER_COLLECTOR_VERSION: &str = "v0.140.0";
const PEER_COLLECTOR_STABLE_VERSION: &str = "v1.46.0";

/// The oldest Go that builds both.
const MIN_GO_MINOR: u32 = 24;

/// Builds whichever backend the tests push to is missing or of another version.
pub fn build() -> Result<()> {
    let go = go()?;
    build_once("pyroscope", PYROSCOPE_VERSION, |dir| pyroscope(&go, dir))?;
    build_once("otelcol", COLLECTOR_VERSION, |dir| {
        collector(
            &go,
            dir,
            "otelcol",
            COLLECTOR_VERSION,
            COLLECTOR_STABLE_VERSION,
        )
    })
    .map(|_| ())
}

/// The OpenTelemetry eBPF profiler and the Collector it reports into, for the bench: their
/// paths.
pub fn build_ebpf_profiler() -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let go = go()?;
    let profiler = build_once("ebpf-profiler", EBPF_PROFILER_VERSION, |dir| {
        let module = "go.opentelemetry.io/ebpf-profiler";
        std::fs::write(
            dir.join("go.mod"),
            format!(
                "module profiler.test/ebpfprofiler\n\ngo 1.24\n\nrequire {module} \
                 {EBPF_PROFILER_VERSION}\n"
            ),
        )?;
        // Its released module carries its compiled eBPF object (support/ebpf).
        run_command(go_command(&go, dir).args(["build", "-o", "ebpf-profiler", module]))
    })?;
    let collector = build_once("otelcol-peer", PEER_COLLECTOR_VERSION, |dir| {
        collector(
            &go,
            dir,
            "otelcol-peer",
            PEER_COLLECTOR_VERSION,
            PEER_COLLECTOR_STABLE_VERSION,
        )
    })?;
    Ok((profiler, collector))
}

/// target/backends/NAME, built by `build` into its own directory unless the stamp beside it
/// names `version` already.
fn build_once(
    name: &str,
    version: &str,
    build: impl FnOnce(&Path) -> Result<()>,
) -> Result<std::path::PathBuf> {
    let backends = target_dir().join("backends");
    let binary = backends.join(name);
    let stamp = backends.join(format!("{name}.version"));
    if binary.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|built| built == version) {
        return Ok(binary);
    }
    eprintln!("xtask setup: building {name} {version} from the Go module proxy (minutes, once)");
    let dir = backends.join(format!("{name}-{version}"));
    std::fs::create_dir_all(&dir)?;
    build(&dir).with_context(|| format!("building {name} {version}"))?;
    // Beside, then renamed over: the old binary may be running.
    let new = backends.join(format!("{name}.new"));
    std::fs::copy(dir.join(name), &new)
        .with_context(|| format!("{name} was not built into {}", dir.display()))?;
    std::fs::rename(&new, &binary)?;
    std::fs::write(&stamp, version)?;
    Ok(binary)
}

/// A module that needs Pyroscope's server and builds its command from there.
fn pyroscope(go: &Path, dir: &Path) -> Result<()> {
    let dependency = "github.com/grafana/pyroscope";
    std::fs::write(
        dir.join("go.mod"),
        format!(
            "module profiler.test/pyroscope\n\ngo 1.22.7\n\nrequire (\n\t{dependency} \
             {PYROSCOPE_VERSION}\n\t{dependency}/api {PYROSCOPE_API_VERSION}\n)\n\n\
             // The release's own replacements, which a dependent must repeat.\nreplace (\n\t\
             github.com/hashicorp/memberlist => github.com/grafana/memberlist \
             v0.3.1-0.20220708130638-bd88e10a3d91\n\tgopkg.in/yaml.v3 => \
             github.com/colega/go-yaml-yaml v0.0.0-20220720105220-255a8d16d094\n)\n"
        ),
    )?;
    run_command(
        go_command(go, dir)
            .args(["build", "-o", "pyroscope"])
            .arg(format!("{dependency}/cmd/pyroscope")),
    )
}

/// The collector `name` of release `v` (`stable`: its v1 modules' version) as its builder
/// (ocb) makes a distribution: our manifest, its generated code.
fn collector(go: &Path, dir: &Path, name: &str, v: &str, stable: &str) -> Result<()> {
    let core = "go.opentelemetry.io/collector";
    let contrib = "github.com/open-telemetry/opentelemetry-collector-contrib";
    let receivers = [(format!("{core}/receiver/otlpreceiver"), v)];
    let exporters = [
        (format!("{core}/exporter/debugexporter"), v),
        (format!("{contrib}/exporter/fileexporter"), v),
    ];
    let providers = [
        (format!("{core}/confmap/provider/envprovider"), stable),
        (format!("{core}/confmap/provider/fileprovider"), stable),
    ];
    let list = |modules: &[(String, &str)]| {
        modules
            .iter()
            .map(|(module, version)| format!("  - gomod: {module} {version}\n"))
            .collect::<String>()
    };
    std::fs::write(
        dir.join("manifest.yaml"),
        format!(
            "dist:\n  name: {name}\n  description: OpenTelemetry Collector for the profiler's \
             tests\n  output_path: .\n  version: \"{v}\"\nreceivers:\n{}exporters:\n{}\
             providers:\n{}",
            list(&receivers),
            list(&exporters),
            list(&providers),
        ),
    )?;
    run_command(
        go_command(go, dir)
            .args(["run", &format!("{core}/cmd/builder@{v}")])
            .args(["--config", "manifest.yaml"])
            // Its own `go mod tidy` also resolves the components' test dependencies, some of
            // which the proxy does not serve (0.140's file exporter's): generate the code,
            // then build only what the program imports, from our own go.mod.
            .args(["--skip-get-modules", "--skip-compilation"]),
    )?;
    let requires: String = (receivers.iter().chain(&exporters).chain(&providers))
        .map(|(module, version)| format!("\t{module} {version}\n"))
        .chain([format!("\t{core}/otelcol {v}\n")])
        .collect();
    std::fs::write(
        dir.join("go.mod"),
        format!("module profiler.test/{name}\n\ngo 1.24\n\nrequire (\n{requires})\n"),
    )?;
    run_command(go_command(go, dir).args(["build", "-o", name, "."]))
}

fn go_command(go: &Path, dir: &Path) -> Command {
    let mut command = Command::new(go);
    // run_command runs in the workspace; the module is the backend's own directory.
    command
        .env("GOWORK", "off")
        .env("GOFLAGS", "-mod=mod -buildvcs=false")
        .arg("-C")
        .arg(dir);
    command
}

/// A Go of at least 1.[`MIN_GO_MINOR`]: the machine's own (/usr/local/go), else the first on
/// the PATH (Debian's golang-go, 1.19 on Debian 12, is too old for either backend).
fn go() -> Result<std::path::PathBuf> {
    let candidates = [Path::new("/usr/local/go/bin/go"), Path::new("go")];
    for go in candidates {
        let Ok(output) = Command::new(go).args(["env", "GOVERSION"]).output() else {
            continue;
        };
        let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let minor = version
            .strip_prefix("go1.")
            .and_then(|rest| rest.split(['.', 'r', 'b']).next()?.parse::<u32>().ok());
        if minor.is_some_and(|minor| minor >= MIN_GO_MINOR) {
            return Ok(go.to_path_buf());
        }
    }
    bail!(
        "the backends the agent's tests push to (Pyroscope, the OpenTelemetry Collector) are \
         built with Go 1.{MIN_GO_MINOR} or newer: install it (https://go.dev/dl) so that \
         /usr/local/go/bin/go or `go` on the PATH is that one"
    )
}
