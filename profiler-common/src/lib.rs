//! Types shared by the eBPF capture program and the userspace agent, and pure decoders that both
//! sides compile.
//!
//! Everything crossing the kernel boundary is `#[repr(C)]` plain old data with explicit padding,
//! so the layout the eBPF program writes is exactly the layout the agent reads.
#![no_std]

pub mod capture;
pub mod hw;
pub mod latency;
pub mod maple;
pub mod offcpu;
pub mod python;
pub mod stack;
pub mod unwind;
pub mod unwind_maps;
