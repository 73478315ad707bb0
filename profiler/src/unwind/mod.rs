//! Unwinding user call stacks for code built without frame pointers: [`tables`] compiles each
//! executable's call-frame information into the compact rows that stack walkers look up;
//! [`loader`] keeps the capture program's copy of them in step with the processes.

pub mod loader;
pub mod tables;
