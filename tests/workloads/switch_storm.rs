//! Context switches as fast as threads can make them, for the cost of watching every switch:
//! two threads passing a byte back and forth over a pair of pipes, then a pool of workers
//! taking jobs one at a time from a queue on a condition variable.
//!
//! Usage: switch_storm ROUND_TRIPS JOBS
//! Prints, on standard output, `switch_storm round_trips N jobs N elapsed_ns N`.

use std::{
    fs::File,
    io::{Read, Write},
    os::fd::FromRawFd,
    sync::{Arc, Condvar, Mutex},
    time::Instant,
};

/// Workers of the pool.
const WORKERS: usize = 4;

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: the descriptors are new and owned by these files alone.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// `round_trips` bytes there and back between two threads: each one a block on a pipe read.
#[inline(never)]
fn ping_pong(round_trips: u64) {
    let (mut ping_read, mut ping_write) = pipe();
    let (mut pong_read, mut pong_write) = pipe();
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        for _ in 0..round_trips {
            ping_read.read_exact(&mut byte).expect("a ping");
            pong_write.write_all(&byte).expect("a pong");
        }
    });
    let mut byte = [0u8; 1];
    for _ in 0..round_trips {
        ping_write.write_all(b"x").expect("a ping");
        pong_read.read_exact(&mut byte).expect("a pong");
    }
    echo.join().expect("the echo thread ends");
}

/// Jobs waiting, jobs done, and whether the pool is closing.
#[derive(Default)]
struct Queue {
    waiting: u64,
    done: u64,
    closing: bool,
}

/// `jobs` handed one at a time to a pool of workers asleep on a condition variable.
#[inline(never)]
fn thread_pool(jobs: u64) {
    let shared = Arc::new((Mutex::new(Queue::default()), Condvar::new(), Condvar::new()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let (queue, work, finished) = &*shared;
                let mut queue = queue.lock().expect("not poisoned");
                loop {
                    if queue.waiting > 0 {
                        queue.waiting -= 1;
                        queue.done += 1;
                        finished.notify_one();
                    } else if queue.closing {
                        return;
                    } else {
                        queue = work.wait(queue).expect("not poisoned");
                    }
                }
            })
        })
        .collect();
    let (queue, work, finished) = &*shared;
    for job in 0..jobs {
        let mut queue = queue.lock().expect("not poisoned");
        queue.waiting += 1;
        work.notify_one();
        while queue.done <= job {
            queue = finished.wait(queue).expect("not poisoned");
        }
    }
    queue.lock().expect("not poisoned").closing = true;
    work.notify_all();
    for worker in workers {
        worker.join().expect("a worker ends");
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut number = |what: &str| -> u64 {
        args.next()
            .and_then(|arg| arg.parse().ok())
            .unwrap_or_else(|| panic!("usage: switch_storm ROUND_TRIPS JOBS ({what})"))
    };
    let (round_trips, jobs) = (number("ROUND_TRIPS"), number("JOBS"));
    let started = Instant::now();
    ping_pong(round_trips);
    thread_pool(jobs);
    println!(
        "switch_storm round_trips {round_trips} jobs {jobs} elapsed_ns {}",
        started.elapsed().as_nanos()
    );
}
