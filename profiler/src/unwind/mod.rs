//! Unwinding user call stacks for code built without frame pointers: [`tables`] compiles each
//! executable's call-frame information into the compact rows that stack walkers look up;
//! [`loader`] keeps the capture program's copy of them in step with the processes, in the
//! bounded arena [`arena`] allocates and evicts from, with tables made for CPython's perf
//! trampolines ([`trampoline`]), JIT code that has no unwind information; and
//! [`copy`] walks a copy of a thread's user stack, taken by the kernel at the sample (`record
//! --unwind copy`, perf.data recorded with `--call-graph dwarf`), with each module's unwind
//! tables. The drain, which reads both, compares the two on the same samples (`record --unwind
//! check`).

pub mod arena;
pub mod copy;
pub mod loader;
mod python;
mod segments;
pub mod tables;
mod trampoline;
