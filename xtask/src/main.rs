//! Project tasks: `cargo xtask setup | build | run | test | layers | fuzz | bench | kernels |
//! arm-pmu | manuals | deb`.
//!
//! Every task sets up what it needs first (idempotently, saying what it installs), so a fresh
//! clone on a fresh machine needs nothing but these commands.

mod arm_pmu;
mod backends;
mod bench;
mod deb;
#[cfg(test)]
mod doc_links;
mod fuzz;
mod kernels;
mod layers;
mod setup;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building the eBPF side and running the tests need.
    Setup,
    /// Build the profiler (release) with its embedded eBPF program.
    Build {
        /// Cross-build for this architecture (the eBPF program is built for its kernels too):
        /// `aarch64` installs Debian's aarch64 std and cross linker, and writes
        /// target/aarch64-unknown-linux-gnu/release/profiler.
        #[arg(long, value_enum)]
        target: Option<CrossTarget>,
    },
    /// Profile the bundled demo workload and print the report.
    Run {
        /// Extra arguments for `profiler record` (before `--`).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Check the profiler crate's imports against its floors (xtask/src/layers.rs): none up a
    /// floor, no circles.
    Layers,
    /// Fuzz every target in fuzz/fuzz_targets for a while each (installs cargo-fuzz and the
    /// nightly compiler it needs).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Run every test: unit tests, and integration tests on the real kernel (needs root); in CI
    /// (`CI` set), also a fuzz pass of 15 s per target.
    Test {
        /// Only tests whose name contains this.
        filter: Option<String>,
    },
    /// Measure the profiler against `perf record` (overhead, loss, data volume, report speed,
    /// in-kernel cost, footprint) and write the tables and plots (needs root).
    Bench(bench::BenchArgs),
    /// Only the bench's comparison with the OpenTelemetry eBPF profiler (built from the Go
    /// module proxy), each tool reporting into a real OpenTelemetry Collector.
    BenchFleet {
        /// Interleaved rounds per tool and rate.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds of each run.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Where fleet.json and fleet.md go.
        #[arg(long, value_name = "DIR", default_value = "bench/results")]
        output: PathBuf,
    },
    /// Only the bench's Python section: fixed pure-Python work bare, under `record` and under
    /// py-spy (from PyPI) at the same rate.
    BenchPython {
        /// Interleaved rounds per tool.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Rounds of work of each run (about 2 ms each here).
        #[arg(long, default_value_t = bench::PYTHON_FULL_LOOPS)]
        loops: u32,
        /// Where python.json and python.md go.
        #[arg(long, value_name = "DIR", default_value = "bench/results")]
        output: PathBuf,
    },
    /// Only the bench's live views: `profiler top` beside `perf top` (with and without call
    /// graphs), system-wide at 1 kHz on the churn load, each in a terminal of its own (tmux).
    BenchLive {
        /// Interleaved rounds per tool.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds of each run.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Where live.json and live.md go.
        #[arg(long, value_name = "DIR", default_value = "bench/results")]
        output: PathBuf,
    },
    /// Run the profiler on Debian's 5.10, 6.1 and 6.12 kernels under QEMU and check its
    /// answers (needs root: installs QEMU, fetches the kernels into target/kernels).
    Kernels,
    /// Cross-build the profiler for aarch64 and check hardware-counter sampling and counting on
    /// QEMU's emulated Arm PMU, instruction-exact (needs root: installs the cross toolchain and
    /// QEMU, fetches Debian's arm64 kernel into target/arm-pmu).
    ArmPmu,
    /// The agent's soak test: system-wide at 99 Hz under churn, its backend stopped midway;
    /// prints the RSS curve and checks memory, delivery and sample accounting (needs root).
    Soak {
        /// How long the agent runs.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
    },
    /// Write the man pages and the bash, zsh and fish completions, generated from the command
    /// line's definition: under target/manuals, or installed under PREFIX/share.
    Manuals {
        /// Install under PREFIX/share (man/man1, bash-completion, zsh/site-functions,
        /// fish/vendor_completions.d), e.g. /usr/local.
        #[arg(long, value_name = "PREFIX")]
        prefix: Option<PathBuf>,
    },
    /// Build the Debian package target/debian/profiler_<version>_<arch>.deb: the binary (with
    /// its eBPF program), man pages, bash/zsh/fish completions, the agent's systemd unit and the
    /// README.
    Deb,
}

/// An architecture `cargo xtask build --target` cross-builds for.
#[derive(Clone, Copy, clap::ValueEnum)]
enum CrossTarget {
    Aarch64,
}

fn main() -> ExitCode {
    match run(Cli::parse().task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ is inside the workspace")
        .to_path_buf()
}

/// Runs a command in the workspace, echoing it, failing on a non-zero exit.
pub fn run_command(command: &mut Command) -> Result<()> {
    eprintln!("xtask: running {command:?}");
    let status = command
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("cannot start {:?}", command.get_program()))?;
    if !status.success() {
        bail!("{:?} failed with {status}", command.get_program());
    }
    Ok(())
}

/// Passed and failed tests in one `test result:` line of cargo test.
fn test_result_counts(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let count = |word: &str| {
        rest.split(';').find_map(|part| {
            part.trim()
                .strip_suffix(word)?
                .split_whitespace()
                .last()?
                .parse()
                .ok()
        })
    };
    Some((count(" passed")?, count(" failed")?))
}

/// Runs cargo test, echoing its output, and ends with one closing line over every test binary:
/// cargo's own last line is that of whichever binary ran last, often one with no tests.
fn run_tests(command: &mut Command) -> Result<()> {
    use std::io::{BufRead, BufReader};

    eprintln!("xtask: running {command:?}");
    let mut child = command
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot start cargo test")?;
    let (mut passed, mut failed) = (0, 0);
    let stdout = child.stdout.take().expect("stdout is piped");
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some((p, f)) = test_result_counts(&line) {
            passed += p;
            failed += f;
        }
    }
    let status = child.wait()?;
    println!("tests: {passed} passed, {failed} failed");
    if !status.success() {
        bail!("cargo test failed with {status}");
    }
    if passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

pub fn build_release() -> Result<()> {
    run_command(cargo().args([
        "build",
        "--release",
        "-p",
        "profiler",
        "-p",
        "integration-tests",
        "--bins",
    ]))
}

/// Writes the man pages and completions with the profiler's `shell_docs` example.
fn manuals(prefix: Option<PathBuf>) -> Result<()> {
    let share = prefix.map_or_else(|| target_dir().join("manuals"), |p| p.join("share"));
    let generate = |args: &[&std::ffi::OsStr]| {
        run_command(
            cargo()
                .args(["run", "--quiet", "--release", "-p", "profiler", "--example"])
                .arg("shell_docs")
                .arg("--")
                .args(args),
        )
    };
    generate(&["man".as_ref(), share.join("man/man1").as_os_str()])?;
    for (shell, file) in [
        ("bash", "bash-completion/completions/profiler"),
        ("zsh", "zsh/site-functions/_profiler"),
        ("fish", "fish/vendor_completions.d/profiler.fish"),
    ] {
        generate(&[
            "completion".as_ref(),
            shell.as_ref(),
            share.join(file).as_os_str(),
        ])?;
    }
    eprintln!(
        "xtask: man pages and completions written under {}",
        share.display()
    );
    Ok(())
}

/// Seconds each fuzz target runs in CI: 45 s in all, beside minutes of tests.
const CI_FUZZ_SECONDS: u64 = 15;

fn run(task: Task) -> Result<()> {
    match task {
        Task::Setup => setup::all(setup::Purpose::Test),
        Task::Manuals { prefix } => {
            setup::all(setup::Purpose::Build)?;
            manuals(prefix)
        }
        Task::Deb => {
            setup::all(setup::Purpose::Build)?;
            deb::build().map(|_| ())
        }
        Task::Build { target: None } => {
            setup::all(setup::Purpose::Build)?;
            build_release()
        }
        Task::Build {
            target: Some(CrossTarget::Aarch64),
        } => {
            let profiler = arm_pmu::build_aarch64()?;
            eprintln!("xtask: built {}", profiler.display());
            Ok(())
        }
        Task::Run { args } => {
            setup::all(setup::Purpose::Build)?;
            build_release()?;
            let release = target_dir().join("release");
            run_command(
                Command::new(release.join("profiler"))
                    .arg("record")
                    .args(args)
                    .arg("--")
                    .arg(release.join("cpu_split")),
            )
        }
        Task::Test { filter } => {
            setup::all(setup::Purpose::Test)?;
            if !setup::is_root() {
                bail!(
                    "the integration tests load BPF programs and open perf events: run as root \
                     (sudo -E cargo xtask test)"
                );
            }
            run_command(cargo().args(["fmt", "--all", "--", "--check"]))?;
            // The eBPF crate is its own workspace (another target), out of `--all`'s reach.
            // rustfmt goes on into the modules the crate root declares: every file of the crate.
            run_command(Command::new("rustfmt").args([
                "--check",
                "--edition",
                "2021",
                "profiler-ebpf/src/main.rs",
            ]))?;
            run_command(cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))?;
            layers::run(&workspace_root())?;
            if filter.is_none() && std::env::var_os("CI").is_some() {
                fuzz::run(CI_FUZZ_SECONDS)?;
            }
            // The package builds the release binaries the tests run; installed, it is checked
            // from /usr/bin as a user runs it.
            let package = deb::build()?;
            deb::check_installed(&package)?;
            if filter.is_none() {
                // The benchmark's smoke run: every figure is produced, nothing is asserted about
                // speed. Before the tests, so that their closing line ends the output.
                let Cli {
                    task: Task::Bench(quick),
                } = Cli::parse_from(["xtask", "bench", "--quick"])
                else {
                    unreachable!("`bench --quick` parses as the bench task");
                };
                bench::run(quick)?;
                // The same answers on the kernels users run (a few minutes under QEMU).
                kernels::run()?;
            }
            let mut test = cargo();
            test.args(["test", "--workspace", "--release", "--no-fail-fast"])
                .env("PROFILER_BIN", target_dir().join("release/profiler"));
            test.arg("--");
            if let Some(filter) = filter {
                test.arg(filter);
            }
            // Kernel tests count samples: one at a time, so they do not disturb each other.
            test.arg("--test-threads=1");
            run_tests(&mut test)
        }
        Task::Layers => layers::run(&workspace_root()),
        Task::Fuzz { seconds } => fuzz::run(seconds),
        Task::Bench(args) => bench::run(args),
        Task::BenchFleet {
            rounds,
            seconds,
            output,
        } => bench::run_fleet(rounds.max(1), seconds, &output),
        Task::BenchLive {
            rounds,
            seconds,
            output,
        } => bench::run_live(rounds.max(1), seconds, &output),
        Task::BenchPython {
            rounds,
            loops,
            output,
        } => bench::run_python(rounds.max(1), loops.max(1), &output),
        Task::Kernels => {
            setup::all(setup::Purpose::Build)?;
            kernels::run()
        }
        Task::ArmPmu => arm_pmu::run(),
        Task::Soak { seconds } => {
            setup::all(setup::Purpose::Test)?;
            build_release()?;
            run_command(
                cargo()
                    .args([
                        "test",
                        "--release",
                        "-p",
                        "integration-tests",
                        "--test",
                        "soak",
                    ])
                    .args(["--", "--nocapture"])
                    .env("PROFILER_BIN", target_dir().join("release/profiler"))
                    .env("SOAK_SECONDS", seconds.to_string()),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_result_counts;

    #[test]
    fn reads_cargo_test_result_lines() {
        let line = "test result: ok. 123 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; \
                    finished in 10.86s";
        assert_eq!(test_result_counts(line), Some((123, 2)));
        assert_eq!(test_result_counts("running 4 tests"), None);
    }
}
