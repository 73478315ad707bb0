//! Unwinding user call stacks in the agent, for code built without frame pointers: [`copy`]
//! walks a copy of a thread's user stack, taken by the kernel at the sample (`record --unwind
//! copy`, perf.data recorded with `--call-graph dwarf`), with each module's unwind tables.

pub mod copy;
