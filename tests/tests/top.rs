//! `profiler top` in a real terminal: tmux runs it at 80x24 and 200x60, keys are sent as a
//! user types them, and the screen is read back with capture-pane. The shares on screen are
//! checked against the split cpu_split measured itself; after `q`, Ctrl-C or SIGTERM the shell
//! gets its terminal back as it was (the main screen, cooked mode, echo).

mod common;

use std::{
    process::Command,
    time::{Duration, Instant},
};

use common::{cpu_split_measured, profiler_bin, workload, Running};

/// A tmux session of its own (its own server socket, so that nothing of the user's is
/// touched), killed when the test ends.
struct Tmux {
    socket: String,
    name: &'static str,
}

impl Tmux {
    /// Runs `script` under sh in a new `width`x`height` terminal.
    fn start(name: &'static str, width: u16, height: u16, script: &str) -> Tmux {
        let tmux = Tmux {
            socket: format!("profiler-top-test-{}-{name}", std::process::id()),
            name,
        };
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            "sh",
            "-c",
            script,
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let output = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs (cargo xtask setup installs it)");
        assert!(
            output.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", self.name])
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", self.name];
        args.extend(keys);
        self.run(&args);
    }

    /// The screen once `ready` holds of it; a panic with the last screen after `timeout`.
    fn wait_for(&self, timeout: Duration, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} on screen within {timeout:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The pid of top: the child of the shell tmux runs.
    fn top_pid(&self) -> i32 {
        let shell = self.run(&["display-message", "-p", "-t", self.name, "#{pane_pid}"]);
        let shell = shell.trim();
        std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .expect("the shell's children")
            .split_whitespace()
            .next()
            .expect("top runs under the shell")
            .parse()
            .unwrap()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output()
            .ok();
    }
}

/// The script tmux runs: a line before, the profiler with `arguments`, its exit status and the terminal's modes after,
/// then a wait so the screen can be read.
fn script(arguments: &str) -> String {
    format!(
        "echo BEFORE-TOP; {} {arguments} 2>/tmp/top-test-$$.err; echo TOP-EXIT=$?; \
         cat /tmp/top-test-$$.err; rm -f /tmp/top-test-$$.err; stty -a | tr ' ' '\\n' | \
         grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ' '; echo; sleep 600",
        profiler_bin().display()
    )
}

/// After top ended: the main screen is back with the line before it, top exited 0, and the
/// terminal is in cooked mode with echo.
fn assert_terminal_restored(tmux: &Tmux) -> String {
    let screen = tmux.wait_for(Duration::from_secs(15), "exit status", |screen| {
        screen.contains("TOP-EXIT=") && screen.contains("icanon")
    });
    assert!(screen.contains("BEFORE-TOP"), "{screen}");
    assert!(screen.contains("TOP-EXIT=0"), "{screen}");
    assert!(
        screen.contains("icanon echo") && !screen.contains("-icanon") && !screen.contains("-echo"),
        "the terminal is left in raw mode:\n{screen}"
    );
    assert!(
        !screen.contains("q quit"),
        "top's screen is still shown:\n{screen}"
    );
    screen
}

/// The numbers of the table row whose function (or process) contains `name`: the leading
/// percentages and counts.
fn row_numbers(screen: &str, name: &str) -> Vec<f64> {
    let line = screen
        .lines()
        .find(|line| line.contains(name) && !line.contains("of "))
        .unwrap_or_else(|| panic!("no row of {name}:\n{screen}"));
    line.split_whitespace()
        .map_while(|word| word.parse::<f64>().ok())
        .collect()
}

/// cpu_split running long enough for a test, and the split it measured once it ends.
struct CpuSplit(Running);

impl CpuSplit {
    fn start() -> CpuSplit {
        // About 20 s of CPU time: it outlives the test's keys, and its split is measured.
        CpuSplit(Running::spawn(
            Command::new(workload("cpu_split"))
                .arg("55000")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped()),
        ))
    }

    /// Its measured shares of heavy_work, medium_work and light_work, in percent.
    fn measured(mut self) -> [f64; 3] {
        let output = self.0.output_at_most(Duration::from_secs(120));
        cpu_split_measured(&String::from_utf8_lossy(&output.stderr))
    }
}

#[test]
fn top_at_80x24_shows_the_hot_function_within_3_points_and_sorts_filters_opens_and_quits() {
    common::require_root();
    let split = CpuSplit::start();
    let pid = split.0.id();
    let tmux = Tmux::start("small", 80, 24, &script(&format!("top -p {pid}")));
    // Five one-second windows make the shares: wait for the span to fill.
    let screen = tmux.wait_for(Duration::from_secs(30), "5 s of samples", |screen| {
        screen.contains("last 5 s") && screen.contains("heavy_work")
    });
    assert!(
        screen.contains(&format!("top process {pid}  event cpu-clock 1/1")),
        "{screen}"
    );
    assert!(
        screen.contains("samples kept") && screen.contains("lost"),
        "{screen}"
    );
    let heavy = row_numbers(&screen, "heavy_work");
    let medium = row_numbers(&screen, "medium_work");
    // Sorted by self share: heavy_work is the first row.
    let first_row = screen.lines().nth(3).unwrap();
    assert!(first_row.contains("heavy_work"), "{screen}");

    // `s`: by total share; the first row is on every stack.
    tmux.keys(&["s"]);
    let sorted = tmux.wait_for(Duration::from_secs(5), "sort total", |s| {
        s.contains("sort total")
    });
    let first = sorted.lines().nth(3).unwrap();
    let total: f64 = first.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(total > 99.0, "{sorted}");
    tmux.keys(&["s", "s"]);

    // `/medium` then Enter: only medium_work's row; Enter opens its callers and callees.
    tmux.keys(&["/", "m", "e", "d", "i", "u", "m", "Enter"]);
    let filtered = tmux.wait_for(Duration::from_secs(5), "the filter", |s| {
        s.contains("filter: medium") && !s.contains("filter: medium_")
    });
    assert!(!filtered.contains("heavy_work"), "{filtered}");
    assert!(filtered.contains("medium_work"), "{filtered}");
    tmux.keys(&["Enter"]);
    let opened = tmux.wait_for(Duration::from_secs(5), "callers", |s| {
        s.contains("callers of cpu_split::medium_work")
    });
    let caller = opened
        .lines()
        .skip_while(|line| !line.contains("callers of"))
        .nth(1)
        .unwrap();
    assert!(
        caller.contains("run_round") && caller.contains("(self)"),
        "the caller run_round beside medium_work's own samples:\n{opened}"
    );
    // Esc closes the callers, a second Esc clears the filter (one at a time: two escapes in
    // one read are the start of an escape sequence to a terminal).
    tmux.keys(&["Escape"]);
    tmux.wait_for(Duration::from_secs(5), "callers closed", |s| {
        !s.contains("callers of")
    });
    tmux.keys(&["Escape"]);
    tmux.wait_for(Duration::from_secs(5), "the filter cleared", |s| {
        !s.contains("filter: medium") && s.contains("heavy_work")
    });

    // `v`: processes; cpu_split has (nearly) every sample of -p.
    tmux.keys(&["v"]);
    let processes = tmux.wait_for(Duration::from_secs(5), "processes", |s| {
        s.contains("by processes")
    });
    let process = row_numbers(&processes, &format!("cpu_split {pid}"));
    assert!(process[0] > 95.0, "{processes}");
    tmux.keys(&["v", "v"]);

    tmux.keys(&["q"]);
    let after = assert_terminal_restored(&tmux);
    assert!(!after.contains("error"), "{after}");
    let [heavy_measured, medium_measured, _] = split.measured();
    assert!(
        (heavy[0] - heavy_measured).abs() <= 3.0,
        "heavy_work {heavy:?} on screen, {heavy_measured}% measured:\n{screen}"
    );
    assert!(
        (medium[0] - medium_measured).abs() <= 3.0,
        "medium_work {medium:?} on screen, {medium_measured}% measured:\n{screen}"
    );
}

#[test]
fn top_at_200x60_switches_to_off_cpu_time_and_back_and_ctrl_c_restores_the_terminal() {
    common::require_root();
    // A process that sleeps 20 ms at a time (off CPU in clock_nanosleep) and spins between.
    let mut sleeper = Running::spawn(Command::new("python3").args([
        "-c",
        "import time\nwhile True:\n    end = time.monotonic() + 0.005\n    \
         while time.monotonic() < end: pass\n    time.sleep(0.02)\n",
    ]));
    let pid = sleeper.id();
    let tmux = Tmux::start(
        "large",
        200,
        60,
        &script(&format!("top -p {pid} --off-cpu")),
    );
    let screen = tmux.wait_for(Duration::from_secs(30), "samples", |screen| {
        screen.contains("last 3 s") || screen.contains("last 4 s") || screen.contains("last 5 s")
    });
    assert!(screen.contains("event cpu-clock 1/2"), "{screen}");
    // At 200 columns the trends are 30 windows wide and nothing is cut.
    assert!(
        screen.contains("trend                         "),
        "{screen}"
    );
    tmux.keys(&["e"]);
    let off_cpu = tmux.wait_for(Duration::from_secs(5), "off-CPU time", |s| {
        s.contains("event off-cpu 2/2")
    });
    assert!(
        off_cpu.contains("s blocked") && off_cpu.contains(" ms "),
        "{off_cpu}"
    );
    // The blocks are the sleeps: the function that sleeps is on nearly all of them.
    tmux.keys(&[
        "/", "n", "a", "n", "o", "s", "l", "e", "e", "p", "Enter", "s",
    ]);
    let sleeping = tmux.wait_for(Duration::from_secs(5), "clock_nanosleep", |s| {
        s.contains("sort total") && s.contains("filter: nanosleep")
    });
    let first = sleeping.lines().nth(3).unwrap();
    assert!(first.contains("nanosleep"), "{sleeping}");
    let total: f64 = first.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(total > 90.0, "{sleeping}");
    tmux.keys(&["Tab"]);
    tmux.wait_for(Duration::from_secs(5), "cpu-clock again", |s| {
        s.contains("event cpu-clock 1/2")
    });
    tmux.keys(&["C-c"]);
    assert_terminal_restored(&tmux);
    sleeper.stop();
}

#[test]
fn sigterm_stops_top_and_restores_the_terminal() {
    common::require_root();
    let tmux = Tmux::start("term", 80, 24, &script("top -F 99"));
    tmux.wait_for(Duration::from_secs(30), "a window", |screen| {
        screen.contains("last 1 s") || screen.contains("last 2 s")
    });
    let profiler = tmux.top_pid();
    // SAFETY: kill(2) with a pid read from the shell's children, still running top.
    assert_eq!(unsafe { libc::kill(profiler, libc::SIGTERM) }, 0);
    let screen = assert_terminal_restored(&tmux);
    assert!(screen.contains("SIGTERM received: stopped"), "{screen}");
}

#[test]
fn top_whose_terminal_hangs_up_stops() {
    common::require_root();
    let tmux = Tmux::start("hangup", 80, 24, &script("top -F 99"));
    tmux.wait_for(Duration::from_secs(30), "a window", |screen| {
        screen.contains("last 1 s") || screen.contains("last 2 s")
    });
    let profiler = tmux.top_pid();
    // The terminal's window closes: tmux hangs up its terminal.
    drop(tmux);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{profiler}")).exists() {
        let state = std::fs::read_to_string(format!("/proc/{profiler}/stat")).unwrap_or_default();
        if state.split_whitespace().nth(2) == Some("Z") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "top still runs 10 s after its terminal hung up: {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn top_without_a_terminal_refuses_and_says_what_to_use() {
    let output = Command::new(profiler_bin())
        .args(["top", "-p", &std::process::id().to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("draws on a terminal") && stderr.contains("profiler record -a"),
        "{stderr}"
    );
}

#[test]
fn record_live_shows_the_recording_and_keeps_it_whole_until_q() {
    common::require_root();
    let dir = common::temp_dir("record-live");
    let (profile, report) = (dir.join("live.prof"), dir.join("live.report"));
    let split = CpuSplit::start();
    let pid = split.0.id();
    let tmux = Tmux::start(
        "record",
        120,
        40,
        &script(&format!(
            "record --live -p {pid} -o {} --report {}",
            profile.display(),
            report.display()
        )),
    );
    // The screen shows what is new each second, over the last five.
    let screen = tmux.wait_for(Duration::from_secs(30), "5 s of samples", |screen| {
        screen.contains("last 5 s") && screen.contains("heavy_work")
    });
    assert!(
        screen.contains(&format!("top process {pid}  event cpu-clock 1/1")),
        "{screen}"
    );
    let heavy_on_screen = row_numbers(&screen, "heavy_work")[0];
    tmux.keys(&["q"]);
    let after = assert_terminal_restored(&tmux);
    assert!(
        after.contains(&format!("profile written to {}", profile.display())),
        "{after}"
    );
    // The profile holds the whole recording, not the last window: more samples than the
    // screen's span, the same split.
    let json = common::report_json(&profile, &[]);
    let event = &json["events"][0];
    let samples = event["samples"].as_u64().unwrap();
    let kept_on_screen: u64 = screen
        .lines()
        .nth(1)
        .and_then(|line| line.split("s: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kept| kept.parse().ok())
        .unwrap_or_else(|| panic!("no samples kept on screen:\n{screen}"));
    assert!(
        samples > kept_on_screen,
        "{samples} recorded, {kept_on_screen} on screen"
    );
    let heavy_recorded = common::self_percent(event, "cpu_split::heavy_work");
    assert!(
        (heavy_recorded - heavy_on_screen).abs() <= 3.0,
        "heavy_work: {heavy_recorded}% recorded, {heavy_on_screen}% on screen"
    );
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(
        text.contains("Recording ended: the live view was quit"),
        "{text}"
    );
    let [heavy_measured, _, _] = split.measured();
    assert!(
        (heavy_recorded - heavy_measured).abs() <= 3.0,
        "heavy_work: {heavy_recorded}% recorded, {heavy_measured}% measured"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn record_live_refuses_a_command_that_would_write_over_the_screen() {
    let output = Command::new(profiler_bin())
        .args(["record", "--live", "--", "true"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--live draws on the terminal the command would write to")
            && stderr.contains("record --live -p PID"),
        "{stderr}"
    );
}
