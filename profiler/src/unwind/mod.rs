//! Unwinding user call stacks for code built without frame pointers: [`tables`] compiles each
//! executable's call-frame information into the compact rows that stack walkers look up.

pub mod tables;
