//! The profiler: an eBPF sampling profiler's agent. The modules follow the data:
//! events (what to count) -> capture (open counters, load the kernel program, side-band) ->
//! drain (lossless map drain) -> symbolize -> assemble (the profile's one builder) -> profile
//! (the model, files) -> aggregate (views) -> report / export. `import` brings perf.data files
//! through the same builder; `hardware` holds
//! what precise samplers decoded (data sources, IBS) and skid backtracking. `session` runs a
//! capture for `record` and `agent`; `cli` turns the command line into their options.

pub mod agent;
pub mod aggregate;
#[cfg(test)]
mod alloc_meter;
pub mod assemble;
pub mod capture;
pub mod cli;
pub mod commands;
pub mod disk_cache;
pub mod drain;
pub mod duration;
pub mod events;
pub mod export;
pub mod fast_hash;
pub mod hardware;
pub mod heap;
pub mod import;
pub mod input;
pub mod launch;
pub mod output;
pub mod perf_data;
pub mod process;
pub mod profile;
pub mod prometheus;
pub mod record;
pub mod report;
pub mod scope;
pub mod session;
pub mod shell_docs;
pub mod stat;
pub mod symbolize;
pub mod top;
pub mod unwind;
