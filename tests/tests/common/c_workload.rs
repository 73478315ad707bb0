//! Builds the C workload tests/workloads/c/no_frame_pointers.c, and the library it loads with
//! dlopen, with gcc, `-O2 -fomit-frame-pointer`, so that only their unwind tables describe their
//! frames. Shared by the integration tests (through `common`) and the profiler's unwind-table
//! tests (which include this file by path).

#![allow(dead_code)] // each includer uses a part

use std::path::{Path, PathBuf};

/// The workload built into `dir/name` with `flags` added to gcc's command line.
pub fn build_no_frame_pointers(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    gcc("no_frame_pointers.c", &dir.join(name), flags)
}

/// tests/workloads/c/dlopened.c built into `dir/libdlopened.so`.
pub fn build_dlopened_library(dir: &Path) -> PathBuf {
    gcc(
        "dlopened.c",
        &dir.join("libdlopened.so"),
        &["-shared", "-fPIC"],
    )
}

/// tests/workloads/c/`source` built into `binary` with `flags` added to gcc's command line.
pub fn gcc(source: &str, binary: &Path, flags: &[&str]) -> PathBuf {
    // Both crates that use this live one level below the workspace's root.
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/workloads/c")
        .join(source);
    let status = std::process::Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(binary)
        .arg(&source)
        .status()
        .expect("gcc runs (Debian: apt-get install gcc)");
    assert!(status.success(), "gcc failed on {}", source.display());
    binary.to_path_buf()
}
