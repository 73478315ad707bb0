//! Installing the toolchain for the eBPF side and the tools the tests compare against.
//!
//! On Debian (this project's machines): Debian's rustc with a prebuilt `core` for BPF, the
//! matching LLVM, and bpf-linker built against it. With a rustup nightly that has rust-src, the
//! usual aya setup. Anywhere else: a message naming what to install.

// The same detection the profiler's build script uses; xtask only detects, build.rs builds.
#[allow(dead_code)]
#[path = "../../profiler/build/ebpf_toolchain.rs"]
mod ebpf_toolchain;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{anyhow, bail, Context, Result};

use crate::{run_command, target_dir};

/// The viewers' npm packages the export tests open their files in, pinned: speedscope's offline
/// build (its JSON schema inside), Ajv to check files against that schema, and playwright-core to
/// drive Debian's Chromium.
/// The Firefox Profiler's own import and call-tree code, as its command-line client bundles it.
const VIEWER_PACKAGES: [&str; 4] = [
    "speedscope@1.25.0",
    "ajv@8.20.0",
    "playwright-core@1.65.2",
    "@firefox-devtools/profiler-cli@0.10.0",
];

/// Where the viewers' packages are installed (`node_modules` below it); the tests look there.
pub const VIEWERS_DIR: &str = "viewers";
/// Where py-spy is installed in the target directory, and which release.
const PY_SPY_DIR: &str = "py-spy";
const PY_SPY_VERSION: &str = "0.4.3";

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Build,
    /// Also the reference tools the tests use: perf, bpftool, objdump, Go's pprof, and setcap
    /// and useradd for the tests that run without root.
    Test,
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn have_apt() -> bool {
    Path::new("/usr/bin/apt-get").exists()
}

fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installs the Debian packages that are missing, running `apt-get update` once first.
pub fn apt_install(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages: {}. Install them as root: apt-get install {}",
            missing.join(", "),
            missing.join(" ")
        );
    }
    eprintln!("xtask setup: installing {}", missing.join(" "));
    run_command(Command::new("apt-get").arg("update").arg("-q"))?;
    run_command(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// The LLVM major version of Debian's rustc (`LLVM version: 22.1.8`): bpf-linker must link the
/// same LLVM to read its bitcode.
fn debian_rustc_llvm_major() -> Result<u32> {
    let output = Command::new("/usr/bin/rustc")
        .arg("-vV")
        .output()
        .context("running /usr/bin/rustc -vV")?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|line| line.strip_prefix("LLVM version: "))
        .and_then(|version| version.split('.').next()?.parse().ok())
        .ok_or_else(|| anyhow!("cannot read the LLVM version from /usr/bin/rustc -vV"))
}

fn setup_ebpf_toolchain() -> Result<()> {
    if ebpf_toolchain::detect().is_ok() {
        eprintln!("xtask setup: eBPF toolchain present");
        return Ok(());
    }
    let nightly = ebpf_toolchain::nightly_with_rust_src();
    if !nightly {
        if !have_apt() {
            bail!(
                "{}",
                ebpf_toolchain::Missing {
                    compiler: true,
                    bpf_linker: ebpf_toolchain::find_bpf_linker().is_none(),
                }
            );
        }
        eprintln!("xtask setup: installing Debian's Rust compiler with core for BPF");
        apt_install(&["rustc-web", "libstd-rust-web-dev-bpf"])?;
    }
    if ebpf_toolchain::find_bpf_linker().is_none() {
        let mut install = Command::new("cargo");
        install.args(["install", "--locked", "bpf-linker@0.13.0"]);
        if !nightly {
            let llvm = debian_rustc_llvm_major()?;
            apt_install(&[&format!("llvm-{llvm}-dev"), "libzstd-dev", "zlib1g-dev"])?;
            install
                .args([
                    "--no-default-features",
                    "--features",
                    &format!("llvm-{llvm}"),
                ])
                .env("LLVM_PREFIX", format!("/usr/lib/llvm-{llvm}"));
        }
        eprintln!("xtask setup: building bpf-linker");
        run_command(&mut install)?;
    }
    ebpf_toolchain::detect()
        .map(drop)
        .map_err(|missing| anyhow!("{missing}"))
}

/// What cross-building the profiler for aarch64 needs on an x86-64 Debian machine: Debian's
/// `std` for aarch64 beside its rustc (a multiarch package: dpkg must know the arm64
/// architecture first), the cross C compiler and libc to link with, and the eBPF toolchain.
pub fn aarch64_cross_toolchain() -> Result<()> {
    setup_ebpf_toolchain()?;
    if !have_apt() {
        bail!(
            "cross-building for aarch64 needs a Rust std for aarch64-unknown-linux-gnu and an \
             aarch64 C linker: `rustup target add aarch64-unknown-linux-gnu` and a \
             gcc-aarch64-linux-gnu"
        );
    }
    let foreign = Command::new("dpkg")
        .arg("--print-foreign-architectures")
        .output()
        .context("running dpkg")?;
    if !String::from_utf8_lossy(&foreign.stdout)
        .split_whitespace()
        .any(|arch| arch == "arm64")
    {
        if !is_root() {
            bail!("Debian's std for aarch64 needs the arm64 architecture: dpkg --add-architecture arm64 (as root)");
        }
        eprintln!(
            "xtask setup: adding the arm64 architecture to dpkg (for libstd-rust-web-dev:arm64)"
        );
        run_command(Command::new("dpkg").args(["--add-architecture", "arm64"]))?;
    }
    apt_install(&[
        "gcc-aarch64-linux-gnu",
        "libc6-dev-arm64-cross",
        "libstd-rust-web-dev:arm64",
    ])
}

/// cargo-fuzz and the nightly compiler its sanitizers and coverage flags need, for the fuzz
/// pass: each installed only if missing.
pub fn fuzzing() -> Result<()> {
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !nightly {
        eprintln!("xtask setup: installing the nightly compiler for cargo-fuzz");
        run_command(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))
        .context("cargo-fuzz needs a rustup nightly toolchain (https://rustup.rs)")?;
    }
    let cargo_fuzz = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !cargo_fuzz {
        eprintln!("xtask setup: installing cargo-fuzz");
        run_command(Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]))?;
    }
    Ok(())
}

pub fn all(purpose: Purpose) -> Result<()> {
    setup_ebpf_toolchain()?;
    if purpose == Purpose::Test && have_apt() {
        apt_install(&[
            "linux-perf",
            "bpftool",
            "binutils",
            "golang-go",
            "golang-github-google-pprof-dev",
            // setcap (the capabilities-only test) and useradd (tests run as a second user).
            "libcap2-bin",
            "passwd",
            // A real JIT runtime whose perf map the JIT-naming test reads.
            "nodejs",
            // Unwinding tests: a C workload built without frame pointers, Debian's own
            // programs built so, and glibc's symbols for the frames that call main.
            "gcc",
            "xz-utils",
            "sqlite3",
            "python3",
            // pip, to install py-spy (the Python tests' reference) from PyPI.
            "python3-pip",
            // glibc's internal function names (memcpy's aliases), in its separate debug file.
            "libc6-dbg",
            // systemd-analyze checks the agent's unit file (dist/profiler-agent.service).
            "systemd",
            // The off-CPU tests' independent reference (bcc's tools need kernel headers).
            "bpftrace",
            // The browser the viewer tests open speedscope in.
            "chromium",
            // The terminal the `profiler top` tests type into and read back.
            "tmux",
            // elfutils' debuginfod server: stripped binaries named from the debug files it
            // serves on loopback.
            "debuginfod",
        ])?;
        viewers()?;
        py_spy()?;
        crate::backends::build()?;
    }
    Ok(())
}

/// py-spy from PyPI, in target/py-spy/bin: the Python tests and the bench run it beside the
/// profiler on the same interpreters.
pub fn py_spy() -> Result<PathBuf> {
    let dir = target_dir().join(PY_SPY_DIR);
    let program = dir.join("bin/py-spy");
    let installed = Command::new(&program)
        .arg("--version")
        .output()
        .is_ok_and(|out| {
            String::from_utf8_lossy(&out.stdout).trim() == format!("py-spy {PY_SPY_VERSION}")
        });
    if installed {
        return Ok(program);
    }
    if have_apt() {
        apt_install(&["python3-pip"])?;
    }
    run_command(
        Command::new("/usr/bin/python3")
            .args(["-m", "pip", "install", "--quiet", "--upgrade", "--target"])
            .arg(&dir)
            .arg(format!("py-spy=={PY_SPY_VERSION}")),
    )
    .context("installing py-spy (from PyPI), the Python tests' reference")?;
    Ok(program)
}

/// The viewers' npm packages ([`VIEWER_PACKAGES`]) in the target directory, installed once.
fn viewers() -> Result<()> {
    let dir = target_dir().join(VIEWERS_DIR);
    let installed = VIEWER_PACKAGES.iter().all(|package| {
        let (name, version) = package.rsplit_once('@').expect("name@version");
        let manifest = dir.join("node_modules").join(name).join("package.json");
        std::fs::read_to_string(manifest)
            .is_ok_and(|text| text.contains(&format!("\"version\": \"{version}\"")))
    });
    if installed {
        return Ok(());
    }
    if Command::new("npm").arg("--version").output().is_err() {
        apt_install(&["npm"])?;
    }
    std::fs::create_dir_all(&dir)?;
    run_command(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .args(VIEWER_PACKAGES),
    )
    .context("installing the viewers the export tests open files in (from the npm registry)")
}
