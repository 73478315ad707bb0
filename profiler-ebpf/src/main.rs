//! The capture program: runs on every perf counter overflow, records who was running where, and
//! aggregates in per-CPU maps that the agent drains.
//!
//! [`sample`] holds the overflow program, [`offcpu`] the scheduler's programs. Both capture
//! stacks into [`stacks`], walk user stacks by the agent's unwind tables with [`unwind`], and
//! count into the generation ([`generations`]) the agent is not draining; [`maps`] holds what
//! they share. Map sizes are defaults: the agent sets the real ones from its options before
//! loading.
#![no_std]
#![no_main]

mod arch;
mod generations;
mod maps;
mod offcpu;
mod python;
mod sample;
mod stacks;
mod unwind;
mod vma;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "license")]
pub static LICENSE: [u8; 4] = *b"GPL\0";
