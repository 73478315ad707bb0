//! Builds the eBPF capture program from source on every build and hands its path to the agent,
//! which embeds it.

#[path = "build/ebpf_toolchain.rs"]
mod ebpf_toolchain;

use std::{env, fs, path::PathBuf, process::ExitCode};

fn main() -> ExitCode {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let workspace = manifest_dir
        .parent()
        .expect("profiler/ is inside the workspace");
    let ebpf_crate = workspace.join("profiler-ebpf");
    for watched in [
        "profiler-ebpf/src",
        "profiler-ebpf/Cargo.toml",
        "profiler-common/src",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    println!("cargo:rerun-if-changed=build/ebpf_toolchain.rs");

    let toolchain = match ebpf_toolchain::detect() {
        Ok(toolchain) => toolchain,
        Err(missing) => {
            eprintln!("error: {missing}");
            return ExitCode::FAILURE;
        }
    };
    // The program reads the registers of the kernel it runs in: that of the profiler's target.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("set by cargo");
    if !ebpf_toolchain::SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
        eprintln!(
            "error: the eBPF program supports {} kernels, not {arch}",
            ebpf_toolchain::SUPPORTED_ARCHITECTURES.join(" and ")
        );
        return ExitCode::FAILURE;
    }
    let target_dir = out_dir.join("ebpf-target");
    let status = toolchain
        .build_command(&ebpf_crate, &target_dir, &arch)
        .status()
        .expect("cargo runs");
    if !status.success() {
        eprintln!(
            "error: building the eBPF program in {} failed",
            ebpf_crate.display()
        );
        return ExitCode::FAILURE;
    }
    let object = target_dir
        .join(ebpf_toolchain::BPF_TARGET)
        .join("release/profiler");
    let embedded = out_dir.join("profiler.bpf.o");
    fs::copy(&object, &embedded).expect("eBPF object was built");
    ExitCode::SUCCESS
}
