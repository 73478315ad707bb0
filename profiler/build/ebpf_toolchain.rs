//! Finding a compiler that can build the eBPF crate. Shared by `profiler/build.rs` (which builds
//! with it) and `cargo xtask setup` (which installs what is missing).
//!
//! Two setups work: Debian's `rustc-web` compiler, which ships a prebuilt `core` for the BPF
//! targets (used with `RUSTC_BOOTSTRAP`, no build-std), or a rustup nightly with `rust-src`
//! (the usual aya setup, with `-Z build-std=core`). Both need `bpf-linker`.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

pub const BPF_TARGET: &str = "bpfel-unknown-none";
/// The kernels' architectures the eBPF program reads registers for (`profiler-ebpf/src/arch`).
pub const SUPPORTED_ARCHITECTURES: [&str; 2] = ["x86_64", "aarch64"];
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EbpfCompiler {
    /// Debian's rustc with `core` prebuilt for BPF under /usr/lib/rustlib.
    Debian { rustc: PathBuf },
    /// A rustup nightly toolchain with the `rust-src` component.
    Nightly,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfToolchain {
    pub compiler: EbpfCompiler,
    pub bpf_linker: PathBuf,
}

/// What is missing to build the eBPF side, each with how to get it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Missing {
    pub compiler: bool,
    pub bpf_linker: bool,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "the eBPF program cannot be built on this machine:")?;
        if self.compiler {
            writeln!(
                f,
                "  - no Rust compiler with `core` for {BPF_TARGET}: on Debian install \
                 `rustc-web libstd-rust-web-dev-bpf`, elsewhere `rustup toolchain install nightly \
                 --component rust-src`"
            )?;
        }
        if self.bpf_linker {
            writeln!(
                f,
                "  - no `bpf-linker` on PATH: `cargo install bpf-linker` (built against the LLVM \
                 of the compiler above)"
            )?;
        }
        write!(f, "`cargo xtask setup` installs all of it.")
    }
}

/// `bpf-linker` on PATH or in cargo's bin directory.
pub fn find_bpf_linker() -> Option<PathBuf> {
    let cargo_bin = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
        .map(|home| home.join("bin"));
    env::var_os("PATH")
        .into_iter()
        .flat_map(|path| env::split_paths(&path).collect::<Vec<_>>())
        .chain(cargo_bin)
        .map(|dir| dir.join("bpf-linker"))
        .find(|candidate| candidate.is_file())
}

/// Whether Debian's compiler and its BPF `core` are installed.
pub fn debian_compiler() -> Option<PathBuf> {
    let rustc = PathBuf::from(DEBIAN_RUSTC);
    let core_dir = Path::new("/usr/lib/rustlib").join(BPF_TARGET).join("lib");
    (rustc.is_file() && core_dir.is_dir()).then_some(rustc)
}

/// Whether a rustup nightly with rust-src is installed.
pub fn nightly_with_rust_src() -> bool {
    let Ok(output) = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
    else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
    output.status.success()
        && Path::new(&sysroot)
            .join("lib/rustlib/src/rust/library")
            .is_dir()
}

pub fn detect() -> Result<EbpfToolchain, Missing> {
    let compiler = debian_compiler()
        .map(|rustc| EbpfCompiler::Debian { rustc })
        .or_else(|| nightly_with_rust_src().then_some(EbpfCompiler::Nightly));
    let bpf_linker = find_bpf_linker();
    match (compiler, bpf_linker) {
        (Some(compiler), Some(bpf_linker)) => Ok(EbpfToolchain {
            compiler,
            bpf_linker,
        }),
        (compiler, linker) => Err(Missing {
            compiler: compiler.is_none(),
            bpf_linker: linker.is_none(),
        }),
    }
}

impl EbpfToolchain {
    /// `cargo build` of the eBPF crate in `crate_dir`, into `target_dir`, in release mode (the
    /// verifier rejects unoptimized code), for a kernel of architecture `arch` (`x86_64`,
    /// `aarch64`): `bpf_target_arch` picks the `pt_regs` layout in aya's bindings and the
    /// program's own register reads. The environment of an enclosing cargo is cleared so host
    /// flags and compilers do not leak into the BPF build.
    pub fn build_command(&self, crate_dir: &Path, target_dir: &Path, arch: &str) -> Command {
        let mut command = Command::new("cargo");
        for (key, _) in env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_") && key != "CARGO_HOME"
                || key.starts_with("RUSTC")
                || key.starts_with("RUSTFLAGS")
                || key == "RUSTUP_TOOLCHAIN"
            {
                command.env_remove(key.as_ref());
            }
        }
        let linker_dir = self.bpf_linker.parent().unwrap_or(Path::new("/"));
        let path = env::var_os("PATH").unwrap_or_default();
        let paths = std::iter::once(linker_dir.to_path_buf()).chain(env::split_paths(&path));
        if let Ok(joined) = env::join_paths(paths) {
            command.env("PATH", joined);
        }
        command.current_dir(crate_dir);
        // BTF (bpf-linker makes it from full debug info): the verifier checks a global function
        // once, whatever calls it, and learns which functions are global from the program's BTF;
        // without BTF every function is static to it, checked again at each call.
        let flags = [
            format!("--cfg=bpf_target_arch=\"{arch}\""),
            "-Cdebuginfo=2".into(),
            "-Clink-arg=--btf".into(),
        ];
        command.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
        match &self.compiler {
            EbpfCompiler::Debian { rustc } => {
                command.env("RUSTC", rustc).env("RUSTC_BOOTSTRAP", "1");
            }
            EbpfCompiler::Nightly => {
                command.arg("+nightly");
            }
        }
        command.args(["build", "--release", "--target", BPF_TARGET, "--target-dir"]);
        command.arg(target_dir);
        if self.compiler == EbpfCompiler::Nightly {
            command.args(["-Z", "build-std=core"]);
        }
        command
    }
}
