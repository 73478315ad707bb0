//! `profiler agent --metrics-addr`: the port is open to every user of the machine, so a client
//! that never ends its request line is cut off with the agent's memory unchanged, and one that
//! trickles a byte a second holds back no scrape.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{metrics_address, profiler_bin, require_root, wait_until_recording, Running};

/// An agent writing its windows into a temporary directory, serving its metrics; and the
/// directory, kept while the agent runs.
fn agent_with_metrics() -> (Running, String, tempfile::TempDir) {
    require_root();
    let windows = tempfile::tempdir().unwrap();
    let addr = metrics_address();
    let agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "--interval", "1", "--output-dir"])
            .arg(windows.path())
            .args(["--metrics-addr", &addr])
            .stderr(Stdio::null()),
    );
    wait_until_recording(agent.id());
    (agent, addr, windows)
}

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A scrape over a plain socket: the status line, and how long the answer took.
fn timed_scrape(addr: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply.lines().next().unwrap_or("").to_string();
    (status, started.elapsed())
}

#[test]
fn an_endless_request_line_is_cut_off_and_the_agent_s_memory_stays_bounded() {
    let (agent, addr, _windows) = agent_with_metrics();
    let before = resident_kib(agent.id());
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let chunk = vec![b'A'; 64 << 10];
    let mut sent = 0usize;
    // 256 MiB without a newline, unless cut off first.
    while sent < 256 << 20 {
        match stream.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(_) => break,
        }
    }
    let after = resident_kib(agent.id());
    assert!(
        sent < 16 << 20,
        "{} MiB sent without being cut off",
        sent >> 20
    );
    assert!(
        after < before + (16 << 10),
        "the agent's memory grew from {before} KiB to {after} KiB"
    );
    // And it still answers.
    let (status, _) = timed_scrape(&addr);
    assert_eq!(status, "HTTP/1.1 200 OK");
}

#[test]
fn a_client_trickling_a_byte_a_second_holds_back_no_scrape() {
    let (_agent, addr, _windows) = agent_with_metrics();
    let trickle_addr = addr.clone();
    let trickler = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(&trickle_addr).unwrap();
        let mut sent = 0;
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n".iter().take(8) {
            if stream.write_all(&[*byte]).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(Duration::from_secs(1));
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..3 {
        let (status, took) = timed_scrape(&addr);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(took < Duration::from_secs(2), "a scrape took {took:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(trickler.join().unwrap() > 0);
}
