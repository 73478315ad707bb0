//! Threads that wait in known ways, for off-CPU time.
//!
//! Usage: off_cpu DIR (a directory on a disk-backed file system, for the file it reads)
//! - `sleeper`: sleeps 100 ms, 10 times, in `offcpu_sleeper`;
//! - `pipe-reader`: blocks reading a pipe in `offcpu_pipe_reader` that `pipe-writer` feeds one
//!   byte every 50 ms, 20 times;
//! - `locker-0`, `locker-1`: take turns at a mutex in `offcpu_locker`, 12 turns each, each
//!   turn a 20 ms hold (asleep in `offcpu_hold`) while the other waits on a condition variable
//!   for its own turn, woken by the holder's notification;
//! - `disk-reader`: writes a 256 MiB file, drops it from the page cache and reads it back in
//!   `offcpu_disk_reader` (uninterruptible disk waits).
//!
//! Each thread measures its own waits and lifetime; the main thread prints them, on standard
//! output, once every thread has ended: one line per kind of wait, `wait KIND tid TID count N
//! total_ns T p50_ns P max_ns M`, and one per thread, `thread NAME tid TID wall_ns W`. (A
//! thread that printed itself would wait on standard output's lock outside its measured life.)
//!
//! The threads start after a settling sleep of the main thread, which lets a profiler that
//! loads a new process's unwind tables after its first samples or blocks walk the measured
//! waits with tables; with `--at-once` they start at once, and each thread's first wait is
//! measured too. With `--after-a-line` it first waits for a line on standard input, so a
//! profiler attached to it can load its tables before anything is measured.

use std::{
    fs::File,
    io::{Read, Write},
    os::fd::{AsRawFd, FromRawFd},
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

/// Durations of one kind of wait, as the thread measured them.
struct Waits {
    kind: &'static str,
    durations: Vec<u64>,
}

impl Waits {
    fn new(kind: &'static str) -> Waits {
        Waits {
            kind,
            durations: Vec::new(),
        }
    }

    /// Runs `wait`, timing it.
    fn time<T>(&mut self, wait: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let result = wait();
        self.durations.push(started.elapsed().as_nanos() as u64);
        result
    }

    fn line(mut self, tid: i32) -> String {
        self.durations.sort_unstable();
        let n = self.durations.len();
        format!(
            "wait {} tid {tid} count {n} total_ns {} p50_ns {} max_ns {}\n",
            self.kind,
            self.durations.iter().sum::<u64>(),
            self.durations[(n - 1) / 2],
            self.durations[n - 1]
        )
    }
}

/// Runs `body` on a thread named `name`; the thread returns the lines of its waits and
/// lifetime.
fn spawn(
    name: &'static str,
    body: impl FnOnce() -> Vec<Waits> + Send + 'static,
) -> std::thread::JoinHandle<String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let started = Instant::now();
            let waits = body();
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let mut lines: String = waits.into_iter().map(|waits| waits.line(tid)).collect();
            let wall = started.elapsed().as_nanos();
            lines.push_str(&format!("thread {name} tid {tid} wall_ns {wall}\n"));
            lines
        })
        .expect("a thread starts")
}

/// A sleep in the C library, so that the stack below the system call is libc's; a call of its
/// own, so that even a frame-pointer walk (which skips the caller of a C library function that
/// keeps no frame) names the function that naps.
#[inline(never)]
fn nap(duration: Duration) {
    let time = libc::timespec {
        tv_sec: duration.as_secs() as i64,
        tv_nsec: duration.subsec_nanos() as i64,
    };
    // SAFETY: nanosleep reads one valid timespec; no remainder is asked for. Its result is
    // used, so the call is no tail call: this function keeps its frame in the stack.
    std::hint::black_box(unsafe { libc::nanosleep(&time, std::ptr::null_mut()) });
}

#[inline(never)]
fn offcpu_sleeper() -> Vec<Waits> {
    let mut sleeps = Waits::new("sleep");
    for _ in 0..10 {
        sleeps.time(|| nap(Duration::from_millis(100)));
    }
    vec![sleeps]
}

#[inline(never)]
fn offcpu_pipe_reader(mut pipe: File) -> Vec<Waits> {
    let mut reads = Waits::new("pipe");
    let mut byte = [0u8; 1];
    for _ in 0..20 {
        reads.time(|| pipe.read_exact(&mut byte).expect("the writer writes"));
    }
    vec![reads]
}

#[inline(never)]
fn offcpu_pipe_writer(mut pipe: File) -> Vec<Waits> {
    let mut sleeps = Waits::new("writer-sleep");
    for _ in 0..20 {
        sleeps.time(|| nap(Duration::from_millis(50)));
        pipe.write_all(b"x").expect("the reader reads");
    }
    vec![sleeps]
}

#[inline(never)]
fn offcpu_hold() {
    nap(Duration::from_millis(20));
    // No tail call: this function stays in the stack.
    std::hint::black_box(());
}

/// Whose turn it is at the lockers' mutex, and the condition variable each waits on for it.
struct Turns {
    next: Mutex<usize>,
    changed: Condvar,
}

#[inline(never)]
fn offcpu_locker(turns: &Turns, me: usize) -> Vec<Waits> {
    let mut waits = Waits::new("lock");
    let mut holds = Waits::new("hold");
    let mut next = turns.next.lock().expect("not poisoned");
    // Strict turns, where a bare contended mutex is not fair: its holder may take it back
    // before the woken waiter runs, every time on a loaded machine, and then the other thread
    // never waits at all. Here each wait for a turn but the first is ended by the other's
    // notification.
    for _ in 0..12 {
        next = waits.time(|| {
            turns
                .changed
                .wait_while(next, |next| *next != me)
                .expect("not poisoned")
        });
        holds.time(offcpu_hold);
        *next = 1 - me;
        turns.changed.notify_one();
    }
    vec![waits, holds]
}

#[inline(never)]
fn offcpu_disk_reader(path: std::path::PathBuf) -> Vec<Waits> {
    const MIB: usize = 1 << 20;
    let chunk = vec![0x5au8; MIB];
    let mut file = File::create(&path).expect("the file is created");
    // Large enough that the thread lives a few hundred ms: its start and exit (where a loaded
    // machine may keep it waiting outside its measured life) are a small part of it.
    for _ in 0..256 {
        file.write_all(&chunk).expect("the file is written");
    }
    file.sync_all().expect("the file reaches the disk");
    drop(file);
    let mut file = File::open(&path).expect("the file opens");
    // SAFETY: posix_fadvise on an open descriptor; DONTNEED drops its clean cached pages.
    let advised = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(advised, 0, "posix_fadvise");
    let mut reads = Waits::new("disk");
    let mut buffer = vec![0u8; MIB];
    reads.time(|| while file.read(&mut buffer).expect("the file reads") > 0 {});
    std::fs::remove_file(&path).expect("the file is removed");
    vec![reads]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .expect("usage: off_cpu DIR [--after-a-line | --at-once]");
    let option = args.next();
    if option.as_deref() == Some("--after-a-line") {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .expect("standard input reads");
    }
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: the descriptors are new and owned by these files alone.
    let (reader, writer) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    let turns: &'static Turns = Box::leak(Box::new(Turns {
        next: Mutex::new(0),
        changed: Condvar::new(),
    }));
    let path = std::path::Path::new(&dir).join(format!("off_cpu.{}", std::process::id()));
    if option.as_deref() != Some("--at-once") {
        nap(Duration::from_millis(150));
    }
    let threads = [
        spawn("sleeper", offcpu_sleeper),
        spawn("pipe-reader", move || offcpu_pipe_reader(reader)),
        spawn("pipe-writer", move || offcpu_pipe_writer(writer)),
        spawn("locker-0", move || offcpu_locker(turns, 0)),
        spawn("locker-1", move || offcpu_locker(turns, 1)),
        spawn("disk-reader", move || offcpu_disk_reader(path)),
    ];
    let lines: Vec<String> = threads
        .into_iter()
        .map(|thread| thread.join().expect("the thread finishes"))
        .collect();
    print!("{}", lines.concat());
}
