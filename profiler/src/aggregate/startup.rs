//! The frames a language runtime runs before the user's code: the C library's, Rust's and Go's
//! start-up and thread (goroutine) start-up. They sit at the root of nearly every stack and say nothing about
//! where time goes, so the views people read (hot paths, flame graphs) hide them by default
//! (`--show-runtime-frames` shows them); the exports for tools (folded, pprof, JSON) keep them.

use std::ops::Range;

/// Whether runtime start-up frames are hidden from hot paths and flame graphs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RuntimeFrames {
    #[default]
    Hide,
    Show,
}

/// Start-up functions by their whole name: the C library's program and thread start, and the
/// kernel's clone entry as user stacks see it.
const C_RUNTIME_START: &[&str] = &[
    "_start",
    // The dynamic loader's: its `_start` jumps here, which runs the libraries' constructors
    // (`_dl_init`) before the program's own `_start`.
    "_dl_start_user",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__clone_internal",
];

/// Start-up functions by the start of their name: Rust's `lang_start` and what it and a new
/// thread call on the way to `main` or the thread's closure (panic catching, the short-backtrace
/// marker, the boxed closure's `call_once`). Demangled names carry generic arguments and
/// `{{closure}}` suffixes after these.
const STARTUP_PREFIXES: &[&str] = &[
    "std::rt::lang_start",
    "std::panicking::try",
    "std::panicking::r#try",
    "std::panicking::catch_unwind",
    "std::panic::catch_unwind",
    "std::sys::backtrace::__rust_begin_short_backtrace",
    "std::sys_common::backtrace::__rust_begin_short_backtrace",
    "std::thread::Builder::spawn_unchecked",
    "std::thread::lifecycle::spawn_unchecked",
    "core::ops::function::FnOnce::call_once",
];

/// Where a new Rust thread starts, under whichever path and spelling std gives it
/// (`std::sys::pal::unix::thread::Thread::new::thread_start`,
/// `<std::sys::thread::unix::Thread>::new::thread_start`).
const THREAD_START: &str = "::new::thread_start";

/// In a start-up function implementing `FnOnce` (`<&dyn Fn() as FnOnce<()>>::call_once`, the
/// boxed closure of a thread): what its name holds.
const CALL_ONCE_IMPL: &str = " as core::ops::function::FnOnce<";
const CALL_ONCE: &str = "::call_once";

/// The Go runtime's top frames (its assembly marks them TOPFRAME: Go's own traceback stops
/// there): every goroutine's stack ends in `runtime.goexit`, every system stack (g0) in
/// `runtime.mstart`, the first thread's in `runtime.rt0_go`. Its symbol table spells assembly
/// functions with an `.abi0` suffix, its DWARF without.
const GO_RUNTIME_START: &[&str] = &["runtime.goexit", "runtime.mstart", "runtime.rt0_go"];

/// Whether a user stack that reaches `function` starts at a program's or thread's first frame,
/// so that it is whole ([`super::stack_quality`]).
pub fn is_runtime_root(function: &str) -> bool {
    C_RUNTIME_START.contains(&function)
        || GO_RUNTIME_START.contains(&function.strip_suffix(".abi0").unwrap_or(function))
}

/// Whether `function` is one of the runtime's start-up functions.
pub fn is_startup(function: &str) -> bool {
    is_runtime_root(function)
        || STARTUP_PREFIXES
            .iter()
            .any(|prefix| function.starts_with(prefix))
        || (function.contains(CALL_ONCE_IMPL) && function.contains(CALL_ONCE))
        || (function.trim_start_matches('<').starts_with("std::sys::")
            && function.ends_with(THREAD_START))
}

/// Where the runtime start-up frames are at the root of a stack (`names`, root first): the
/// longest run of start-up functions from the root, through a `main` that only calls into more
/// of them (the C `main` rustc writes calls `std::rt::lang_start`). Markers at the root of a stack
/// cut short (`[truncated]`, `[frame pointers only]`) stay, and the run counts from after them.
/// A mid-stack `call_once` or `catch_unwind` is the program's own and stays. The leaf always
/// stays, so that a sample taken during start-up still has a frame.
pub fn startup_frames<'a>(names: impl IntoIterator<Item = &'a str>) -> Range<usize> {
    let (mut start, mut end, mut seen) = (0, 0, 0);
    for name in names {
        seen += 1;
        if start + 1 == seen && name.starts_with('[') {
            start = seen;
            end = seen;
        } else if is_startup(name) {
            end = seen;
        } else if name != "main" {
            break;
        }
    }
    start..end.min(seen.saturating_sub(1)).max(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_and_rust_start_up_is_counted_from_the_root_and_stops_at_the_program() {
        let c = ["_start", "__libc_start_call_main", "main", "work"];
        assert_eq!(startup_frames(c), 0..2, "C's main is the program's");
        let rust = [
            "_start",
            "__libc_start_main",
            "main",
            "std::rt::lang_start_internal",
            "std::panic::catch_unwind::<std::rt::lang_start_internal::{closure#0}, isize>",
            "<&dyn core::ops::function::Fn<(), Output = i32> + core::marker::Sync as \
             core::ops::function::FnOnce<()>>::call_once",
            "std::panicking::try::do_call",
            "std::rt::lang_start::{{closure}}",
            "std::sys::backtrace::__rust_begin_short_backtrace",
            "core::ops::function::FnOnce::call_once",
            "app::main",
            "core::ops::function::FnOnce::call_once",
            "app::work",
        ];
        assert_eq!(
            startup_frames(rust),
            0..10,
            "up to app::main; the later call_once stays"
        );
        let thread = [
            "clone3",
            "start_thread",
            "std::sys::pal::unix::thread::Thread::new::thread_start",
            "app::worker",
        ];
        assert_eq!(startup_frames(thread), 0..3);
        let thread = [
            "clone3",
            "start_thread",
            "<std::sys::thread::unix::Thread>::new::thread_start",
            "<<std::thread::lifecycle::spawn_unchecked<F, ()>::{closure#1} as \
             core::ops::function::FnOnce<()>>::call_once::{shim:vtable#0}",
            "rustc_interface::util::run_in_thread_pool_with_globals",
        ];
        assert_eq!(startup_frames(thread), 0..4);
        assert_eq!(startup_frames(["_start", "__libc_start_main"]), 0..1);
        assert_eq!(
            startup_frames([
                "[truncated]",
                "main",
                "std::rt::lang_start_internal",
                "app::main"
            ]),
            1..3,
            "a stack cut short keeps its marker"
        );
        assert_eq!(startup_frames(["main", "work"]), 0..0);
        assert_eq!(startup_frames(["work", "_start"]), 0..0, "only at the root");
        assert_eq!(startup_frames(std::iter::empty()), 0..0);
    }

    #[test]
    fn go_top_frames_are_roots_by_either_spelling() {
        for root in [
            "runtime.goexit",
            "runtime.goexit.abi0",
            "runtime.mstart.abi0",
            "runtime.rt0_go",
        ] {
            assert!(is_runtime_root(root), "{root}");
        }
        // Go's traceback goes on through these: they are mid-stack.
        for mid in [
            "runtime.goexit1",
            "runtime.main",
            "runtime.mcall",
            "runtime.mstart1",
        ] {
            assert!(!is_runtime_root(mid), "{mid}");
        }
        let goroutine = ["runtime.goexit.abi0", "main.worker", "main.spin"];
        assert_eq!(startup_frames(goroutine), 0..1);
    }
}
