//! Capture in the kernel: opening perf counters, loading and attaching the eBPF program, and the
//! side-band stream of process mappings needed to symbolize later.

pub mod aux_trace;
pub mod btf;
pub mod counters;
pub mod hardware;
pub mod maps;
pub mod offcpu;
pub mod offsets_cache;
pub mod perf_ring;
pub mod program;
pub mod ring;
pub mod sideband;
pub mod stats;
