//! The agent's soak test (`cargo xtask soak`, not part of `cargo xtask test`): system-wide at
//! 99 Hz for 10 minutes (`SOAK_SECONDS` to change it) under churn (a stream of short processes,
//! long-lived threads, a CPU loop), exporting to the strict Pyroscope stand-in, which is stopped
//! for a minute midway. It prints the agent's RSS curve and checks that memory stays bounded,
//! that every window reached the backend once (the spool held the outage), and that in every
//! window each fired sample is kept or counted as lost.

mod common;
mod receiver;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{profiler_bin, wait_until_recording, workload, Running};
use receiver::Receiver;

/// A shell loop that reruns a workload until killed.
fn churn(program: &str, args: &str) -> Child {
    Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "while :; do {} {args} >/dev/null 2>&1; done",
            workload(program).display()
        ))
        .spawn()
        .expect("the churn loop starts")
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `window N: S samples (F fired, L lost) exported to SINK` lines: (N, S, F, L).
fn window_lines(log: &str) -> Vec<(u64, u64, u64, u64)> {
    log.lines()
        .filter(|line| line.contains(" exported to --pyroscope"))
        .filter_map(|line| {
            let rest = line.split("window ").nth(1)?;
            let numbers: Vec<u64> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter(|part| !part.is_empty())
                .take(4)
                .map(|part| part.parse().unwrap())
                .collect();
            (numbers.len() == 4).then(|| (numbers[0], numbers[1], numbers[2], numbers[3]))
        })
        .collect()
}

#[test]
fn the_agent_soaks_under_churn_and_a_backend_outage() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let mut receiver = Receiver::start(0);
    let spool = tempfile::tempdir().unwrap();
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", "99", "--interval", "10"])
            .args(["--pyroscope", &receiver.url()])
            .arg("--spool-dir")
            .arg(spool.path())
            .stderr(Stdio::piped()),
    );
    let log = Arc::new(Mutex::new(String::new()));
    let reader = {
        let stderr = agent.0.stderr.take().unwrap();
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        })
    };
    wait_until_recording(agent.id());
    let mut load = vec![
        churn("short_processes", "200"),
        churn("many_threads", "2000 4"),
        churn("cpu_split", "4000"),
    ];

    let start = Instant::now();
    let outage = (seconds / 2, seconds / 2 + seconds.min(600) / 10);
    let mut curve: Vec<(u64, u64)> = Vec::new();
    let mut down = false;
    while start.elapsed() < Duration::from_secs(seconds) {
        let now = start.elapsed().as_secs();
        if now >= outage.0 && now < outage.1 && !down {
            receiver.stop();
            down = true;
        } else if now >= outage.1 && down {
            receiver = receiver.restart();
            down = false;
        }
        curve.push((now, rss_kib(agent.id())));
        std::thread::sleep(Duration::from_secs(10));
    }
    if down {
        receiver = receiver.restart();
    }
    for child in &mut load {
        child.kill().ok();
        child.wait().ok();
    }
    // Past the longest backoff the outage can have built up, the spool empties.
    std::thread::sleep(Duration::from_secs(20));
    agent.signal(libc::SIGTERM);
    let status = agent.wait_at_most(Duration::from_secs(30));
    reader.join().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(status.success(), "{log}");

    println!("agent RSS over the soak (seconds, MiB):");
    for (at, kib) in &curve {
        println!("{at:>6} {:>8.1}", *kib as f64 / 1024.0);
    }
    let half = curve.len() / 2;
    let first = curve[..half].iter().map(|p| p.1).max().unwrap_or(0);
    let second = curve[half..].iter().map(|p| p.1).max().unwrap_or(0);
    println!("peak RSS: first half {first} KiB, second half {second} KiB");
    assert!(
        second as f64 <= first as f64 * 1.25 + 8.0 * 1024.0,
        "RSS keeps growing: {first} KiB then {second} KiB"
    );

    let windows = window_lines(&log);
    assert!(
        windows.len() as u64 >= seconds / 10,
        "{} windows in {seconds} s\n{log}",
        windows.len()
    );
    let (mut kept, mut fired, mut lost) = (0, 0, 0);
    for &(window, samples, window_fired, window_lost) in &windows {
        // A sample fired between a window's accounting read and its drain lands in the next
        // window: a few either way, never more.
        let difference = (samples + window_lost).abs_diff(window_fired);
        assert!(
            difference <= 16,
            "window {window}: {samples} kept + {window_lost} lost vs {window_fired} fired"
        );
        kept += samples;
        fired += window_fired;
        lost += window_lost;
    }
    println!(
        "{} windows: {fired} fired, {kept} kept, {lost} lost",
        windows.len()
    );
    assert_eq!(kept + lost, fired, "over the whole run");

    let mut pushed: Vec<i64> = receiver
        .pushes()
        .iter()
        .map(|push| push[0].profile.time_nanos)
        .collect();
    let pushes = pushed.len();
    pushed.sort_unstable();
    pushed.dedup();
    assert_eq!(pushed.len(), pushes, "a window pushed twice");
    assert_eq!(
        pushes,
        windows.len(),
        "every window reached the backend: the spool held the outage\n{log}"
    );
    assert!(receiver.refusals().is_empty(), "{:?}", receiver.refusals());
}
