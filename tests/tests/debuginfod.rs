//! Stripped binaries named from separate debug files fetched by build ID: from Debian's real
//! `debuginfod` server indexing a directory on loopback (functions, lines, inlined frames; the
//! cache once the server is gone; `record`, `report` of a perf.data, and the agent), and from a stand-in that answers
//! wrong, slowly or not at all (refused, timed out, counted; never a wrong name).

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{
    c_workload::gcc, free_port, profiler_bin, read_pprof, report_json, require_root, self_percent,
    temp_dir, wait_until_recording, Running,
};
use serde_json::Value;

/// The stripped workload: its build ID is new at every build, so no earlier run's cache can
/// answer for the server.
struct Stripped {
    binary: PathBuf,
    /// The directory the server indexes: the split-off debug file alone.
    served: PathBuf,
    build_id: String,
}

impl Stripped {
    fn build(dir: &Path) -> Stripped {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let build_id = format!("{:024x}{:08x}", nanos, std::process::id());
        let full = gcc(
            "stripped.c",
            &dir.join("full"),
            &["-g", &format!("-Wl,--build-id=0x{build_id}")],
        );
        let served = dir.join("served");
        std::fs::create_dir_all(&served).unwrap();
        let objcopy = |args: &[&Path]| {
            let status = Command::new("objcopy").args(args).status().unwrap();
            assert!(status.success(), "objcopy {args:?}");
        };
        let debug = served.join("stripped.debug");
        objcopy(&[Path::new("--only-keep-debug"), &full, &debug]);
        let binary = dir.join("stripped");
        objcopy(&[Path::new("--strip-all"), &full, &binary]);
        Stripped {
            binary,
            served,
            build_id,
        }
    }

    fn cached_copy(&self) -> PathBuf {
        PathBuf::from(format!(
            "/var/cache/profiler/debuginfod/{}.debug",
            self.build_id
        ))
    }
}

impl Drop for Stripped {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.cached_copy());
    }
}

/// Debian's debuginfod indexing `stripped.served`, once it serves the debug file.
fn start_debuginfod(stripped: &Stripped, dir: &Path) -> (Running, String) {
    let port = free_port();
    let server = Running::spawn(
        Command::new("debuginfod")
            .args(["-F"])
            .arg(&stripped.served)
            .args(["-p", &port.to_string(), "-d"])
            .arg(dir.join("index.sqlite"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let url = format!("http://127.0.0.1:{port}");
    let asked = format!("{url}/buildid/{}/debuginfo", stripped.build_id);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(response) = ureq::get(&asked).call() {
            if response.status() == 200 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "debuginfod (cargo xtask setup installs it) did not serve {asked} within a minute"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, url)
}

/// `record` of the stripped workload for `seconds`, with `env` and `options`; the profile.
fn record(
    stripped: &Stripped,
    dir: &Path,
    name: &str,
    env: &[(&str, &str)],
    options: &[&str],
) -> PathBuf {
    let profile = dir.join(name);
    let mut command = Command::new(profiler_bin());
    command
        .env_remove("DEBUGINFOD_URLS")
        .envs(env.iter().copied())
        .args(["record", "-F", "999", "-o"])
        .arg(&profile)
        .args(options)
        .arg("--")
        .arg(&stripped.binary)
        .arg("1.5")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let output = Running::spawn(&mut command).output_at_most(Duration::from_secs(120));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    profile
}

fn functions(report: &Value) -> Vec<String> {
    report["events"][0]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["function"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn loss(report: &Value, name: &str) -> u64 {
    report["losses"][name].as_u64().unwrap_or(0)
}

/// What a profile of the stripped workload says when the debug file named it.
fn assert_named_by_the_debug_file(profile: &Path) {
    let report = report_json(profile, &[]);
    let event = &report["events"][0];
    let (hot, cold) = (
        self_percent(event, "hot_path"),
        self_percent(event, "cold_path"),
    );
    // hot_path's loop runs three times cold_path's; scramble is inlined into both, so their
    // samples are theirs.
    assert!(
        hot + cold > 90.0 && (60.0..90.0).contains(&(100.0 * hot / (hot + cold))),
        "hot_path {hot}%, cold_path {cold}%: {:?}",
        functions(&report)
    );
    assert!(functions(&report).iter().any(|name| name == "main"));
    let lines = report_json(profile, &["--by", "line"]);
    let scramble_lines: Vec<u64> = lines["events"][0]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["function"] == "scramble")
        .inspect(|row| assert!(row["file"].as_str().unwrap().ends_with("stripped.c")))
        .map(|row| row["line"].as_u64().unwrap())
        .collect();
    // scramble's body: lines 10-13 of stripped.c.
    assert!(
        !scramble_lines.is_empty() && scramble_lines.iter().all(|line| (10..=13).contains(line)),
        "{scramble_lines:?}"
    );
    let folded = common::profiler(&["report", "-i", profile.to_str().unwrap(), "--folded", "-"]);
    let folded = String::from_utf8_lossy(&folded.stdout);
    assert!(
        folded.contains(";main;hot_path;scramble") && folded.contains(";main;cold_path;scramble"),
        "{folded}"
    );
}

#[test]
fn a_stripped_binary_is_named_with_lines_and_inlined_frames_from_a_debuginfod_server() {
    require_root();
    let dir = temp_dir("debuginfod");
    let stripped = Stripped::build(&dir);
    let (mut server, url) = start_debuginfod(&stripped, &dir);

    // Without a server: the binary's code is only offsets.
    let profile = record(&stripped, &dir, "none.data", &[], &[]);
    let names = functions(&report_json(&profile, &[]));
    assert!(
        !names.iter().any(|name| name == "hot_path")
            && names.iter().any(|name| name.starts_with("stripped+0x")),
        "{names:?}"
    );

    // A dead server first: skipped for the next.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let both = format!("{dead} {url}");
    let profile = record(
        &stripped,
        &dir,
        "env.data",
        &[("DEBUGINFOD_URLS", &both)],
        &[],
    );
    assert_named_by_the_debug_file(&profile);
    let report = report_json(&profile, &[]);
    assert_eq!(loss(&report, "debug files debuginfod failed to fetch"), 0);
    assert!(stripped.cached_copy().is_file());

    // The server gone, and a different one given: the cache answers.
    server.stop();
    let profile = record(
        &stripped,
        &dir,
        "cached.data",
        &[("DEBUGINFOD_URLS", &url)],
        &["--debuginfod", &dead],
    );
    assert_named_by_the_debug_file(&profile);

    // --no-debuginfod-urls: the environment's servers are not asked (and the cache, which only
    // servers fill, is not read either when none is asked).
    std::fs::remove_file(stripped.cached_copy()).unwrap();
    let (_server, url) = start_debuginfod(&stripped, &dir);
    let profile = record(
        &stripped,
        &dir,
        "ignored.data",
        &[("DEBUGINFOD_URLS", &url)],
        &["--no-debuginfod-urls"],
    );
    assert!(!functions(&report_json(&profile, &[]))
        .iter()
        .any(|name| name == "hot_path"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_perf_data_of_a_stripped_binary_is_named_by_report_from_the_server() {
    require_root();
    let dir = temp_dir("debuginfod-perf");
    let stripped = Stripped::build(&dir);
    let (_server, url) = start_debuginfod(&stripped, &dir);
    let perf_data = dir.join("perf.data");
    common::run_checked(
        "perf",
        &[
            "record",
            "-q",
            "-F",
            "999",
            "-o",
            perf_data.to_str().unwrap(),
            "--",
            stripped.binary.to_str().unwrap(),
            "1.5",
        ],
    );
    let named = |debuginfod: &[&str]| {
        let mut args = vec!["--no-debuginfod-urls"];
        args.extend_from_slice(debuginfod);
        functions(&report_json(&perf_data, &args))
    };
    let before = named(&[]);
    assert!(!before.iter().any(|name| name == "hot_path"), "{before:?}");
    let after = named(&["--debuginfod", &url]);
    assert!(
        after.iter().any(|name| name == "hot_path") && after.iter().any(|name| name == "cold_path"),
        "{after:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_debug_file_over_debuginfod_maxsize_is_refused_and_counted() {
    require_root();
    let dir = temp_dir("debuginfod-maxsize");
    let stripped = Stripped::build(&dir);
    let (_server, url) = start_debuginfod(&stripped, &dir);
    let size = std::fs::metadata(stripped.served.join("stripped.debug"))
        .unwrap()
        .len();
    // A byte short of the file: refused; the file's own size: taken.
    let limit = (size - 1).to_string();
    let profile = record(
        &stripped,
        &dir,
        "small.data",
        &[("DEBUGINFOD_MAXSIZE", &limit)],
        &["--debuginfod", &url],
    );
    let report = report_json(&profile, &[]);
    assert!(!functions(&report).iter().any(|name| name == "hot_path"));
    assert_eq!(loss(&report, "debug files from debuginfod refused"), 1);
    assert!(!stripped.cached_copy().exists());
    let limit = size.to_string();
    let profile = record(
        &stripped,
        &dir,
        "exact.data",
        &[("DEBUGINFOD_MAXSIZE", &limit)],
        &["--debuginfod", &url],
    );
    assert_named_by_the_debug_file(&profile);
    let _ = std::fs::remove_dir_all(&dir);
}

/// How the stand-in answers the stripped workload's build ID (any other: 404).
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// 200 with another ELF file (this machine's /bin/true): another build ID.
    WrongFile,
    NotFound,
    /// Takes the request and says nothing for a minute.
    Silent,
}

/// A debuginfod stand-in answering `answer` for `build_id`; its URL, and the paths asked.
fn stand_in(answer: Answer, build_id: &str) -> (String, Arc<Mutex<Vec<String>>>) {
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
    let url = format!("http://{}", server.server_addr().to_ip().unwrap());
    let asked = Arc::new(Mutex::new(Vec::new()));
    let (ours, log) = (format!("/buildid/{build_id}/debuginfo"), asked.clone());
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            let path = request.url().to_string();
            log.lock().unwrap().push(path.clone());
            if path != ours {
                let _ = request.respond(tiny_http::Response::empty(404));
                continue;
            }
            match answer {
                Answer::WrongFile => {
                    let other = std::fs::read("/bin/true").unwrap();
                    let _ = request.respond(tiny_http::Response::from_data(other));
                }
                Answer::NotFound => {
                    let _ = request.respond(tiny_http::Response::empty(404));
                }
                Answer::Silent => {
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_secs(60));
                        drop(request);
                    });
                }
            }
        }
    });
    (url, asked)
}

#[test]
fn wrong_missing_and_silent_answers_are_counted_and_never_name_code() {
    require_root();
    let dir = temp_dir("debuginfod-faults");
    let stripped = Stripped::build(&dir);
    for (answer, counter) in [
        (Answer::WrongFile, "debug files from debuginfod refused"),
        (Answer::NotFound, "debug files no debuginfod server had"),
        (Answer::Silent, "debug files debuginfod failed to fetch"),
    ] {
        let (url, asked) = stand_in(answer, &stripped.build_id);
        let started = Instant::now();
        let profile = record(
            &stripped,
            &dir,
            "fault.data",
            &[("DEBUGINFOD_TIMEOUT", "2")],
            &["--debuginfod", &url],
        );
        let report = report_json(&profile, &[]);
        let names = functions(&report);
        assert!(
            names.iter().any(|name| name.starts_with("stripped+0x"))
                && !names.iter().any(|name| name == "hot_path"),
            "{answer:?}: {names:?}"
        );
        assert!(
            loss(&report, counter) >= 1,
            "{answer:?}: {}",
            report["losses"]
        );
        // Asked once for the module, however many of its frames there were.
        let ours = format!("/buildid/{}/debuginfo", stripped.build_id);
        let asked = asked.lock().unwrap().clone();
        assert_eq!(
            asked.iter().filter(|path| **path == ours).count(),
            1,
            "{asked:?}"
        );
        assert!(!stripped.cached_copy().exists(), "{answer:?} was cached");
        // A silent server costs its time-out (2 s here), not a hang: the recording's 1.5 s,
        // symbolizing and the wait are well within the bound.
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{answer:?}: {:?}",
            started.elapsed()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_agent_names_a_stripped_binary_once_its_debug_file_arrives_without_holding_a_window() {
    require_root();
    let dir = temp_dir("debuginfod-agent");
    let stripped = Stripped::build(&dir);
    let (_server, url) = start_debuginfod(&stripped, &dir);
    let windows = dir.join("windows");
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .env_remove("DEBUGINFOD_URLS")
            .args(["agent", "-F", "499", "--interval", "1", "--source-lines"])
            .args(["--debuginfod", &url, "--output-dir"])
            .arg(&windows)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let mut workload = Running::spawn(Command::new(&stripped.binary).arg("5"));
    assert!(workload.wait_at_most(Duration::from_secs(60)).success());
    agent.terminate();

    let mut paths: Vec<PathBuf> = std::fs::read_dir(&windows)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| common::is_window(path))
        .collect();
    paths.sort();
    // A window a second, fetch or no fetch.
    assert!(paths.len() >= 5, "{} windows", paths.len());
    let named = paths.iter().map(|path| read_pprof(path)).find(|profile| {
        let text = |index: i64| profile.string_table[index as usize].as_str();
        let function_id = |name: &str| {
            profile
                .function
                .iter()
                .find(|function| text(function.name) == name)
                .map(|function| function.id)
        };
        let (Some(hot), Some(scramble)) = (function_id("hot_path"), function_id("scramble")) else {
            return false;
        };
        // scramble inlined into hot_path: one location, two lines, scramble's innermost.
        profile.location.iter().any(|location| {
            location.line.len() >= 2
                && location.line[0].function_id == scramble
                && location.line[0].line >= 10
                && location.line[1..]
                    .iter()
                    .any(|line| line.function_id == hot)
        })
    });
    assert!(
        named.is_some(),
        "no window names hot_path with scramble inlined from the debug file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
