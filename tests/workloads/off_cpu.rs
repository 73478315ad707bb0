//! Threads that wait in known ways, for off-CPU time.
//!
//! Usage: off_cpu DIR (a directory on a disk-backed file system, for the file it reads)
//! - `sleeper`: sleeps 100 ms, 10 times, in `offcpu_sleeper`;
//! - `pipe-reader`: blocks reading a pipe in `offcpu_pipe_reader` that `pipe-writer` feeds one
//!   byte every 50 ms, 20 times;
//! - `locker-0`, `locker-1`: contend a mutex in `offcpu_locker`, each holding it 20 ms at a
//!   time (asleep in `offcpu_hold`), 12 times each;
//! - `disk-reader`: writes a 64 MiB file, drops it from the page cache and reads it back in
//!   `offcpu_disk_reader` (uninterruptible disk waits).
//!
//! Each thread measures its own waits and prints, on standard output, one line per kind of
//! wait: `wait KIND tid TID count N total_ns T p50_ns P max_ns M`, and one line for its
//! lifetime: `thread NAME tid TID wall_ns W`.

use std::{
    fs::File,
    io::{Read, Write},
    os::fd::{AsRawFd, FromRawFd},
    sync::Mutex,
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

    fn print(mut self, tid: i32) {
        self.durations.sort_unstable();
        let n = self.durations.len();
        println!(
            "wait {} tid {tid} count {n} total_ns {} p50_ns {} max_ns {}",
            self.kind,
            self.durations.iter().sum::<u64>(),
            self.durations[(n - 1) / 2],
            self.durations[n - 1]
        );
    }
}

/// Runs `body` on a thread named `name`, printing its lifetime and waits.
fn spawn(
    name: &'static str,
    body: impl FnOnce() -> Vec<Waits> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let started = Instant::now();
            let waits = body();
            let wall = started.elapsed().as_nanos();
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            for waits in waits {
                waits.print(tid);
            }
            println!("thread {name} tid {tid} wall_ns {wall}");
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

#[inline(never)]
fn offcpu_locker(lock: &Mutex<u64>) -> Vec<Waits> {
    let mut waits = Waits::new("lock");
    let mut holds = Waits::new("hold");
    for _ in 0..12 {
        let mut guard = waits.time(|| lock.lock().expect("not poisoned"));
        holds.time(offcpu_hold);
        *guard += 1;
        drop(guard);
        // Leaves the other thread time to take the lock: the mutex is not fair.
        std::thread::yield_now();
    }
    vec![waits, holds]
}

#[inline(never)]
fn offcpu_disk_reader(path: std::path::PathBuf) -> Vec<Waits> {
    const MIB: usize = 1 << 20;
    let chunk = vec![0x5au8; MIB];
    let mut file = File::create(&path).expect("the file is created");
    for _ in 0..64 {
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
    let dir = std::env::args().nth(1).expect("usage: off_cpu DIR");
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: the descriptors are new and owned by these files alone.
    let (reader, writer) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    let lock: &'static Mutex<u64> = Box::leak(Box::new(Mutex::new(0)));
    let path = std::path::Path::new(&dir).join(format!("off_cpu.{}", std::process::id()));
    let threads = [
        spawn("sleeper", offcpu_sleeper),
        spawn("pipe-reader", move || offcpu_pipe_reader(reader)),
        spawn("pipe-writer", move || offcpu_pipe_writer(writer)),
        spawn("locker-0", move || offcpu_locker(lock)),
        spawn("locker-1", move || offcpu_locker(lock)),
        spawn("disk-reader", move || offcpu_disk_reader(path)),
    ];
    for thread in threads {
        thread.join().expect("the thread finishes");
    }
}
