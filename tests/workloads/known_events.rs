//! Causes a known number of one kind of software event, so sampling every Nth event can be
//! checked against an exact count.
//!
//! Usage: known_events KIND N
//! - `pipe-round-trips N`: two threads pass a byte back and forth over two pipes N times, both
//!   on one CPU: each round trip hands the CPU from one to the other and back, 2N context
//!   switches. (On two CPUs a thread whose answer came before it read would not block, and
//!   how often that happens changes with the load.)
//! - `migrations N`: moves itself between the first two CPUs it may run on N times (one
//!   migration each); needs two CPUs.
//! - `major-faults N`: writes an N-page file, drops it from the page cache, maps it with
//!   read-ahead off and reads every page: N major faults.
//! - `spin-ms N`: spins for N milliseconds of its own CPU time.
//! - `clock-reads-ms N`: reads CLOCK_MONOTONIC for N milliseconds: time spent in the vDSO.
//!
//! Prints on stderr what it did and the CPU time the process has used, its start included
//! (`known_events: KIND N done after NS ns of CPU time`).

use std::{
    fs::File,
    hint::black_box,
    io::{Read, Write},
    os::fd::{AsRawFd, FromRawFd},
    time::Duration,
};

const PAGE: usize = 4096;

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: both descriptors are fresh and owned by nothing else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

#[inline(never)]
fn pipe_round_trips(n: u64) {
    // The echo thread inherits the CPU.
    run_on(allowed_cpus()[0]);
    let (mut ping_read, mut ping_write) = pipe();
    let (mut pong_read, mut pong_write) = pipe();
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8];
        for _ in 0..n {
            ping_read.read_exact(&mut byte).unwrap();
            pong_write.write_all(&byte).unwrap();
        }
    });
    let mut byte = [1u8];
    for _ in 0..n {
        ping_write.write_all(&byte).unwrap();
        pong_read.read_exact(&mut byte).unwrap();
    }
    echo.join().unwrap();
}

fn run_on(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only read
    // and write it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity to CPU {cpu}"
        );
    }
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        (0..libc::CPU_SETSIZE as usize)
            .filter(|cpu| libc::CPU_ISSET(*cpu, &set))
            .collect()
    }
}

#[inline(never)]
fn migrations(n: u64) {
    let allowed = allowed_cpus();
    assert!(allowed.len() >= 2, "migrations need two CPUs");
    for i in 0..n {
        run_on(allowed[(i % 2) as usize]);
    }
}

#[inline(never)]
fn major_faults(n: u64) {
    let path = std::env::temp_dir().join(format!("known_events-{}", std::process::id()));
    let mut file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let len = n as usize * PAGE;
    file.write_all(&vec![7u8; len]).unwrap();
    file.sync_all().unwrap();
    let fd = file.as_raw_fd();
    // SAFETY: plain system calls on our own descriptor and a mapping we own for its lifetime.
    unsafe {
        // Clean pages after the fsync: the kernel drops them from the page cache.
        assert_eq!(libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED), 0);
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(map, libc::MAP_FAILED, "mmap");
        // No read-ahead and no fault-around: each page is read from disk by its own fault.
        assert_eq!(libc::madvise(map, len, libc::MADV_RANDOM), 0);
        let bytes = std::slice::from_raw_parts(map as *const u8, len);
        let mut sum = 0u64;
        for page in bytes.chunks(PAGE) {
            sum += u64::from(std::ptr::read_volatile(&page[0]));
        }
        black_box(sum);
        libc::munmap(map, len);
    }
}

/// The CPU time of a CPU-time clock: this thread's or this process's.
fn cpu_time(clock: libc::clockid_t) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(clock, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

#[inline(never)]
fn spin(duration: Duration) {
    let end = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID) + duration;
    let mut x = 0u64;
    while cpu_time(libc::CLOCK_THREAD_CPUTIME_ID) < end {
        for i in 0..10_000 {
            x = black_box(x.wrapping_add(i));
        }
    }
}

#[inline(never)]
fn clock_reads(duration: Duration) {
    let start = std::time::Instant::now();
    // Instant::now is clock_gettime(CLOCK_MONOTONIC), which the vDSO answers in user space.
    while start.elapsed() < duration {
        black_box(std::time::Instant::now());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(kind), Some(n)) = (
        args.first(),
        args.get(1).and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!(
            "usage: known_events pipe-round-trips|migrations|major-faults|spin-ms|clock-reads-ms N"
        );
        std::process::exit(2);
    };
    match kind.as_str() {
        "pipe-round-trips" => pipe_round_trips(n),
        "migrations" => migrations(n),
        "major-faults" => major_faults(n),
        "spin-ms" => spin(Duration::from_millis(n)),
        "clock-reads-ms" => clock_reads(Duration::from_millis(n)),
        other => {
            eprintln!("known_events: unknown kind {other}");
            std::process::exit(2);
        }
    }
    eprintln!(
        "known_events: {kind} {n} done after {} ns of CPU time",
        cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID).as_nanos()
    );
}
