//! `profiler agent --pyroscope URL --otlp URL`: a real agent exports every window to the strict
//! receiver (tests/receiver) while a workload runs; the receiver goes away for a few windows and
//! comes back, and the windows it missed arrive from the spool. Its Prometheus metrics say the
//! same as its log, and show it letting go of what it kept for programs that exited.

mod common;
mod receiver;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    c_workload::build_no_frame_pointers, is_window, metric, metrics_address, profiler_bin,
    read_pprof, scrape, wait_until_recording, workload, write_containerd_task, write_file,
    PodContainer, Running,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use receiver::Receiver;

/// Stops the agent with SIGTERM; its log, once it exited successfully and the receiver refused
/// nothing it sent.
fn stop_agent(mut agent: Running, receiver: &Receiver) -> String {
    let log = agent.terminate();
    assert!(
        receiver.refusals().is_empty(),
        "refused: {:?}",
        receiver.refusals()
    );
    log
}

#[test]
fn every_window_reaches_pyroscope_and_otlp_even_across_a_backend_outage() {
    let mut receiver = Receiver::start(0);
    let spool = tempfile::tempdir().unwrap();
    let metrics_addr = metrics_address();
    let agent = Running::spawn(
        Command::new(profiler_bin())
            .args([
                "agent",
                "--interval",
                "1",
                "--service-name",
                "=bench-service",
            ])
            .args(["--pyroscope", &receiver.url(), "--otlp", &receiver.url()])
            .arg("--spool-dir")
            .arg(spool.path())
            .args(["--metrics-addr", &metrics_addr])
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let mut cpu_split = Running::spawn(
        Command::new(workload("cpu_split"))
            .arg("24000")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    std::thread::sleep(Duration::from_millis(4500));
    // The backends go away for about two windows.
    receiver.stop();
    std::thread::sleep(Duration::from_millis(4200));
    let receiver = receiver.restart();
    assert!(cpu_split.wait_at_most(Duration::from_secs(90)).success());
    // Past the retry backoff (1 s, then 2 s), the spooled windows go with the next ones.
    std::thread::sleep(Duration::from_millis(4500));
    let scraped = scrape(&metrics_addr);
    let log = stop_agent(agent, &receiver);

    // Every window with samples reached both backends, none twice: windows are told apart by
    // their start time.
    let windows = log.matches("exported to --pyroscope").count();
    assert!(windows >= 6, "{log}");
    let mut pushed_windows: Vec<i64> = receiver
        .pushes()
        .iter()
        .map(|push| push[0].profile.time_nanos)
        .collect();
    let pushes = pushed_windows.len();
    pushed_windows.sort_unstable();
    pushed_windows.dedup();
    assert_eq!(pushed_windows.len(), pushes, "a window pushed twice");
    let otlp_windows = receiver.otlp().len();
    // A window without any sample sends nothing; the machine is never idle for two seconds
    // while the workload runs, so at most the windows outside it may be empty.
    assert!(
        pushes + 3 >= windows,
        "{pushes} pushes for {windows} windows\n{log}"
    );
    assert_eq!(otlp_windows, pushes, "OTLP got what Pyroscope got");

    // The workload is there, named by the service rule, with its functions.
    let workload_series: Vec<_> = receiver
        .pushes()
        .into_iter()
        .flatten()
        .filter(|series| series.label("executable") == Some("cpu_split"))
        .collect();
    assert!(
        workload_series.len() >= 3,
        "{} windows",
        workload_series.len()
    );
    for series in &workload_series {
        assert_eq!(series.label("service_name"), Some("bench-service"));
        assert_eq!(series.label("__name__"), Some("process_cpu"));
    }
    let names_heavy = workload_series.iter().any(|series| {
        series
            .profile
            .string_table
            .iter()
            .any(|name| name.contains("heavy_work"))
    });
    assert!(names_heavy);

    // The metrics, scraped before the end, agree: windows delivered, some spooled, none lost.
    let backend = format!("--pyroscope {}", receiver.url());
    assert!(
        metric(
            &scraped,
            "profiler_backend_windows_total",
            &[&backend, "\"delivered\""]
        ) >= 2.0,
        "{scraped}"
    );
    assert!(
        metric(
            &scraped,
            "profiler_backend_windows_total",
            &[&backend, "\"spooled\""]
        ) >= 1.0,
        "{scraped}"
    );
    assert_eq!(
        metric(
            &scraped,
            "profiler_backend_windows_total",
            &[&backend, "\"dropped\""]
        ),
        0.0
    );
    assert!(metric(&scraped, "profiler_samples_fired_total", &["cpu-clock"]) > 0.0);
    assert!(metric(&scraped, "profiler_resident_memory_bytes", &[]) > 1e6);
}

#[test]
fn with_bpf_stats_the_metrics_carry_each_programs_time_in_the_kernel() {
    // Unless kernel.bpf_stats_enabled is 1 (the bench sets it while it measures, never
    // during the tests), the programs' runs are counted only because the agent asked.
    let windows = tempfile::tempdir().unwrap();
    let metrics_addr = metrics_address();
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "--interval", "1", "--off-cpu", "--bpf-stats"])
            .arg("--output-dir")
            .arg(windows.path())
            .args(["--metrics-addr", &metrics_addr])
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let mut cpu_split = Running::spawn(
        Command::new(workload("cpu_split"))
            .arg("1500")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    assert!(cpu_split.wait_at_most(Duration::from_secs(60)).success());
    // Past the next window's close, where the metrics are read.
    std::thread::sleep(Duration::from_millis(1500));
    let scraped = scrape(&metrics_addr);
    agent.terminate();

    // The sampling program ran once per sample fired (and for the samples of the window still
    // open); the switch program once per context switch. Each costs what a BPF program on a
    // clock tick or a switch costs: between 100 ns and 100 us a run.
    let fired = metric(&scraped, "profiler_samples_fired_total", &[]);
    for (program, at_least) in [("on_overflow", fired), ("offcpu_switch", 100.0)] {
        let label = format!("program=\"{program}\"");
        let runs = metric(&scraped, "profiler_bpf_runs_total", &[&label]);
        let seconds = metric(&scraped, "profiler_bpf_run_seconds_total", &[&label]);
        assert!(
            runs >= at_least && runs > 0.0,
            "{program}: {runs} runs\n{scraped}"
        );
        let ns_per_run = seconds * 1e9 / runs;
        assert!(
            (100.0..100_000.0).contains(&ns_per_run),
            "{program}: {ns_per_run} ns a run\n{scraped}"
        );
    }
}

#[test]
fn a_backend_that_never_answers_holds_up_no_other_window() {
    // A listener that accepts nothing: connections complete in the kernel's backlog and no
    // answer ever comes, so each request waits out its timeout (5 s).
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());
    let windows = tempfile::tempdir().unwrap();
    let spool = tempfile::tempdir().unwrap();
    let metrics_addr = metrics_address();
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "--interval", "1", "--pyroscope", &hung_url])
            .arg("--output-dir")
            .arg(windows.path())
            .arg("--spool-dir")
            .arg(spool.path())
            .args(["--metrics-addr", &metrics_addr])
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    // Long enough for three requests to wait out their timeouts (at 0, 6 and 13 s with the
    // backoff), each of which would have held five 1 s windows on the export thread.
    std::thread::sleep(Duration::from_secs(15));
    let scraped = scrape(&metrics_addr);
    let log = agent.terminate();
    drop(hung);

    // Every window reached the directory, none was dropped; the hung backend's windows wait in
    // its spool.
    assert!(!log.contains("dropped"), "{log}");
    assert_eq!(metric(&scraped, "profiler_windows_dropped_total", &[]), 0.0);
    let exported = log.matches("exported to --output-dir").count();
    let files = std::fs::read_dir(windows.path())
        .unwrap()
        .filter(|entry| is_window(&entry.as_ref().unwrap().path()))
        .count();
    assert!(exported >= 14, "{exported} windows\n{log}");
    assert_eq!(files, exported, "{log}");
    let backend = format!("--pyroscope {hung_url}");
    assert_eq!(
        metric(
            &scraped,
            "profiler_backend_windows_total",
            &[&backend, "\"delivered\""]
        ),
        0.0
    );
    assert!(
        metric(
            &scraped,
            "profiler_backend_windows_total",
            &[&backend, "\"spooled\""]
        ) >= 10.0,
        "{scraped}"
    );
    assert!(
        metric(
            &scraped,
            "profiler_backend_failed_requests_total",
            &[&backend]
        ) >= 2.0,
        "{scraped}"
    );
}

#[test]
fn a_backend_url_without_a_scheme_is_refused_before_profiling() {
    let output = Command::new(profiler_bin())
        .args(["agent", "--pyroscope", "localhost:4040"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--pyroscope localhost:4040: give the backend's http:// or https:// URL"),
        "{stderr}"
    );
}

/// The shipped unit file passes `systemd-analyze verify` without a warning, run on the profiler
/// the tests built (systemd checks that the program exists and every key is known).
#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/profiler-agent.service"),
    )
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/profiler agent "));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("profiler-agent.service");
    let bin = profiler_bin();
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/profiler", bin.to_str().unwrap()),
    )
    .unwrap();
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze runs (apt-get install systemd)");
    let said = String::from_utf8_lossy(&verified.stderr);
    assert!(
        verified.status.success() && said.trim().is_empty(),
        "{said}"
    );
}

/// The data samples of one pushed pprof: (object, line, function) -> samples, read from the
/// stacks of its `data_samples` column (root first: object, line, function).
fn data_samples(
    profile: &pyroscope::encode::gen::google::Profile,
) -> Vec<(String, u64, String, i64)> {
    let text = |index: i64| profile.string_table[index as usize].as_str();
    let Some(column) = profile
        .sample_type
        .iter()
        .position(|t| text(t.r#type) == "data_samples")
    else {
        return Vec::new();
    };
    let name = |id: u64| {
        let location = &profile.location[id as usize - 1];
        location.line.last().map_or_else(
            || format!("{:#x}", location.address),
            |line| text(profile.function[line.function_id as usize - 1].name).to_string(),
        )
    };
    profile
        .sample
        .iter()
        .filter(|s| s.value[column] > 0)
        .map(|s| {
            let [function, line, object] = s.location_id[..] else {
                panic!("a data sample's stack is object, line, function: {s:?}");
            };
            let line = u64::from_str_radix(name(line).trim_start_matches("0x"), 16).unwrap();
            (name(object), line, name(function), s.value[column])
        })
        .collect()
}

#[test]
fn page_fault_data_addresses_reach_pyroscope_and_otlp_by_object_line_and_function() {
    let receiver = Receiver::start(0);
    let spool = tempfile::tempdir().unwrap();
    let agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-e", "page-faults", "-c", "1", "--interval", "1"])
            .args(["--pyroscope", &receiver.url(), "--otlp", &receiver.url()])
            .arg("--spool-dir")
            .arg(spool.path())
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let toucher = Command::new(workload("page_toucher"))
        .args(["3000", "9"])
        .output()
        .unwrap();
    assert!(toucher.status.success());
    let (start, pages, line) = common::touched_region(&String::from_utf8_lossy(&toucher.stderr));
    std::thread::sleep(Duration::from_millis(1500));
    let log = stop_agent(agent, &receiver);

    // Every page of the region faulted once, at the line written: each is a data sample under
    // the anonymous memory the region is, made by touch_pages.
    let end = start + pages * 4096;
    let mut touched: Vec<(String, u64, String, i64)> = receiver
        .pushes()
        .into_iter()
        .flatten()
        .filter(|series| series.label("executable") == Some("page_toucher"))
        .flat_map(|series| data_samples(&series.profile))
        .filter(|(_, address, _, _)| (start..end).contains(address))
        .collect();
    touched.sort();
    let expected: Vec<(String, u64, String, i64)> = (0..pages)
        .map(|page| {
            (
                "anonymous memory".to_string(),
                start + page * 4096 + line * 64,
                "page_toucher::touch_pages".to_string(),
                1,
            )
        })
        .collect();
    assert_eq!(touched.len(), expected.len(), "{log}");
    assert_eq!(touched, expected);

    // OTLP has them as a profile of data samples beside the call stacks, with the same count.
    let data_samples_in_region: i64 = receiver
        .otlp()
        .iter()
        .map(|request| {
            let tables = request.dictionary.as_ref().unwrap();
            let text = |index: i32| tables.string_table[index as usize].as_str();
            let function_of = |location: i32| {
                let location = &tables.location_table[location as usize];
                location.lines.last().map_or("", |line| {
                    text(tables.function_table[line.function_index as usize].name_strindex)
                })
            };
            let profiles = request
                .resource_profiles
                .iter()
                .flat_map(|r| &r.scope_profiles)
                .flat_map(|s| &s.profiles)
                .filter(|p| text(p.sample_type.as_ref().unwrap().type_strindex) == "data_samples");
            profiles
                .flat_map(|p| &p.samples)
                .filter(|sample| {
                    let stack = &tables.stack_table[sample.stack_index as usize];
                    let line = function_of(stack.location_indices[1]);
                    let address = u64::from_str_radix(line.trim_start_matches("0x"), 16);
                    address.is_ok_and(|address| (start..end).contains(&address))
                })
                .map(|sample| sample.values[0])
                .sum::<i64>()
        })
        .sum();
    assert_eq!(data_samples_in_region, pages as i64);
}

/// A system-wide agent sampling at `hz` with 1 s windows written to `windows`, serving metrics
/// at the address returned, once two windows closed (its gauges are set at each).
fn agent_of_short_windows(hz: &str, windows: &std::path::Path) -> (Running, String) {
    let metrics_addr = metrics_address();
    let agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", hz, "--interval", "1"])
            .arg("--output-dir")
            .arg(windows)
            .args(["--metrics-addr", &metrics_addr])
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    std::thread::sleep(Duration::from_millis(2500));
    (agent, metrics_addr)
}

/// Each sample's frames of a pprof window, innermost first: (module file, function); and its
/// count (a pprof sample is a distinct stack, its first value how many samples had it).
fn sample_frames(
    profile: &profiler::export::pprof::proto::Profile,
) -> Vec<(Vec<(&str, &str)>, usize)> {
    let string = |index: i64| profile.string_table[index as usize].as_str();
    profile
        .sample
        .iter()
        .map(|sample| {
            let frames = sample
                .location_id
                .iter()
                .map(|id| &profile.location[*id as usize - 1])
                .flat_map(|location| {
                    let module = profile
                        .mapping
                        .get((location.mapping_id as usize).wrapping_sub(1))
                        .map_or("", |mapping| string(mapping.filename));
                    location.line.iter().map(move |line| {
                        let function = &profile.function[line.function_id as usize - 1];
                        (module, string(function.name))
                    })
                })
                .collect();
            (frames, sample.value[0] as usize)
        })
        .collect()
}

#[test]
fn the_agent_lets_go_of_the_files_and_unwind_tables_of_programs_that_exited() {
    // Sixteen distinct programs (each its own build ID, so its own unwind table), run one after
    // another: a system-wide agent meets new executables all day, and kept every table and
    // every file the symbolizer ever read (a descriptor each) until this was fixed.
    let dir = tempfile::tempdir().unwrap();
    let programs: Vec<std::path::PathBuf> = (0..16u32)
        .map(|k| {
            let build_id = format!("-Wl,--build-id=0x{:032x}", 0xfeed_0000 + k);
            build_no_frame_pointers(dir.path(), &format!("program_{k}"), &[&build_id])
        })
        .collect();
    let windows = tempfile::tempdir().unwrap();
    let (mut agent, metrics_addr) = agent_of_short_windows("999", windows.path());
    let tables = |scraped: &str| metric(scraped, "profiler_unwind_tables", &[]);
    let tables_before = tables(&scrape(&metrics_addr));
    for program in &programs {
        let mut running = Running::spawn(Command::new(program).arg("400"));
        assert!(running.wait_at_most(Duration::from_secs(30)).success());
    }
    // Three windows later every program's process is gone from the agent's table.
    std::thread::sleep(Duration::from_millis(3500));
    let after = scrape(&metrics_addr);
    let tables_after = tables(&after);
    let open_files = metric(&after, "profiler_open_files", &[]);
    let programs_open: Vec<std::path::PathBuf> =
        std::fs::read_dir(format!("/proc/{}/fd", agent.id()))
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| programs.contains(target))
            .collect();
    agent.terminate();

    // Every program was sampled, so its file was symbolized; nearly every one had stacks
    // walked through glibc's qsort to main by its table (it has no frame pointers), so its
    // table was loaded (on a loaded machine a program's few samples may all come before).
    let mut sampled = std::collections::HashSet::new();
    let mut unwound_to_main = std::collections::HashSet::new();
    for window in std::fs::read_dir(windows.path()).unwrap() {
        let window = window.unwrap().path();
        if !is_window(&window) {
            continue;
        }
        let profile = read_pprof(&window);
        for (frames, _) in sample_frames(&profile) {
            sampled.extend(frames.iter().map(|(module, _)| module.to_string()));
            if let [(module, "record_key"), ref callers @ ..] = frames[..] {
                if callers.iter().any(|&(_, function)| function == "main") {
                    unwound_to_main.insert(module.to_string());
                }
            }
        }
    }
    let names = |modules: &std::collections::HashSet<String>| {
        programs
            .iter()
            .filter(|program| modules.contains(program.to_str().unwrap()))
            .count()
    };
    assert_eq!(names(&sampled), programs.len(), "sampled: {sampled:?}");
    assert!(
        names(&unwound_to_main) >= programs.len() - 2,
        "unwound from record_key to main: {unwound_to_main:?}"
    );
    assert!(tables_before > 0.0, "{after}");
    // Other processes on the machine may start meanwhile: a little slack, well short of 16.
    assert!(
        tables_after <= tables_before + 6.0,
        "tables: {tables_before} before, {tables_after} after\n{after}"
    );
    assert!(programs_open.is_empty(), "still open: {programs_open:?}");
    assert!(open_files > 3.0, "{after}");
}

/// Resident bytes of the agent's memory-mapped BPF maps (the unwind-row arena, ring buffers).
fn bpf_map_resident_bytes(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut in_map = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some(first) if first.contains('-') && !first.ends_with(':') => {
                in_map = line.ends_with("anon_inode:bpf-map");
            }
            Some("Rss:") if in_map => kib += fields.next().unwrap().parse::<u64>().unwrap(),
            _ => {}
        }
    }
    kib * 1024
}

/// The C workload (tests/workloads/c/no_frame_pointers.c) with `functions` small functions
/// more, each with call-frame information (three rows each), and its own build ID from `id`.
fn large_table_program(
    dir: &std::path::Path,
    name: &str,
    functions: u32,
    id: u64,
) -> std::path::PathBuf {
    let assembly = dir.join(format!("{name}.s"));
    let mut text = String::from(".text\n");
    for k in 0..functions {
        text.push_str(&format!(
            ".globl many_{k}\nmany_{k}:\n.cfi_startproc\npush %rbp\n.cfi_def_cfa_offset 16\n\
             .cfi_offset %rbp, -16\npop %rbp\n.cfi_def_cfa_offset 8\nret\n.cfi_endproc\n"
        ));
    }
    std::fs::write(&assembly, text).unwrap();
    let build_id = format!("-Wl,--build-id=0x{id:032x}");
    build_no_frame_pointers(dir, name, &[assembly.to_str().unwrap(), &build_id])
}

#[test]
fn a_large_unwind_table_leaves_the_agents_memory_when_its_program_exits() {
    // A program with a table large enough to span several arena chunks: 150,000 small
    // functions with call-frame information, three rows each, about 7 MB of rows. The agent
    // kept the arena pages such a table was written to mapped (resident) after it exited; now
    // they are mapped only while the rows are copied in, and live in the kernel's map, which
    // the metrics report apart from the compiled rows the agent holds while the file is open.
    let dir = tempfile::tempdir().unwrap();
    let program = large_table_program(dir.path(), "large_table", 150_000, 0xfeedface);
    let windows = tempfile::tempdir().unwrap();
    let (mut agent, metrics_addr) = agent_of_short_windows("99", windows.path());
    let rows = |scraped: &str| metric(scraped, "profiler_unwind_table_rows", &[]);
    let memory = |scraped: &str, part: &str| {
        metric(
            scraped,
            "profiler_memory_bytes",
            &[&format!("part=\"{part}\"")],
        )
    };
    let (arena, held) = (
        "unwind rows in the kernel's arena",
        "compiled unwind rows held by the agent",
    );
    let before = scrape(&metrics_addr);
    let (rows_before, held_before, resident_before) = (
        rows(&before),
        memory(&before, held),
        bpf_map_resident_bytes(agent.id()),
    );

    let mut running = Running::spawn(Command::new(&program).arg("4000"));
    let (mut rows_during, mut held_during, mut resident_during) = (0.0f64, 0.0f64, 0);
    while running.0.try_wait().unwrap().is_none() {
        let scraped = scrape(&metrics_addr);
        rows_during = rows_during.max(rows(&scraped));
        held_during = held_during.max(memory(&scraped, held));
        assert_eq!(memory(&scraped, arena), rows(&scraped) * 16.0);
        resident_during = resident_during.max(bpf_map_resident_bytes(agent.id()));
        std::thread::sleep(Duration::from_millis(200));
    }
    // Three windows later the program's table is gone from the arena and from the agent.
    std::thread::sleep(Duration::from_millis(3500));
    let after = scrape(&metrics_addr);
    let (rows_after, held_after, resident_after) = (
        rows(&after),
        memory(&after, held),
        bpf_map_resident_bytes(agent.id()),
    );
    agent.terminate();

    let table_rows = rows_during - rows_before;
    assert!(
        table_rows >= 400_000.0,
        "{rows_before} rows, {rows_during} with the program"
    );
    assert!(
        resident_during <= resident_before + (1 << 20),
        "{resident_before} bytes of mapped maps, {resident_during} with the table: its rows \
         must stay in the kernel's map"
    );
    assert!(
        held_during >= held_before + table_rows * 16.0,
        "{held_before} bytes of compiled rows held before, {held_during} with the table"
    );
    assert!(
        rows_after < rows_before + 10_000.0,
        "{rows_after} rows after, {rows_before} before"
    );
    assert!(
        held_after < held_before + 10_000.0 * 16.0,
        "{held_after} bytes of compiled rows held after, {held_before} before"
    );
    assert!(
        resident_after <= resident_before + (1 << 20),
        "{resident_before} bytes of mapped maps before, {resident_after} after its program exited"
    );
}

#[test]
fn over_its_memory_budget_the_agent_lets_go_of_cold_rows_and_symbols_and_still_unwinds_all() {
    // Two programs whose tables (300,000 rows each) do not fit together in a 6 MiB arena,
    // under a budget of 1 MiB of heap: every table's compiled rows are let go once placed, and
    // symbols of modules a window did not sample after each window. `first` runs, is stopped
    // (idle, its file still open), `second` runs and takes the room of `first`'s table, then
    // `first` runs on: its table is placed again from the disk cache, and its stacks are whole
    // again. Without the read-back it would stay unloaded, walked by frame pointers.
    let dir = tempfile::tempdir().unwrap();
    let first = large_table_program(dir.path(), "first", 100_000, 0xf1257);
    let second = large_table_program(dir.path(), "second", 100_000, 0x5ec0d);
    let windows = tempfile::tempdir().unwrap();
    let metrics_addr = metrics_address();
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args([
                "agent",
                "-F",
                "499",
                "--interval",
                "1",
                "--memory-max",
                "1M",
            ])
            .args(["--unwind-table-mib", "6", "--output-dir"])
            .arg(windows.path())
            .args(["--metrics-addr", &metrics_addr])
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let mut first_run = Running::spawn(Command::new(&first).arg("10000"));
    std::thread::sleep(Duration::from_millis(2000));
    first_run.signal(libc::SIGSTOP);
    let mut second_run = Running::spawn(Command::new(&second).arg("2500"));
    assert!(second_run.wait_at_most(Duration::from_secs(30)).success());
    std::thread::sleep(Duration::from_millis(500));
    let resumed_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    first_run.signal(libc::SIGCONT);
    assert!(first_run.wait_at_most(Duration::from_secs(30)).success());
    std::thread::sleep(Duration::from_millis(2500));
    let scraped = scrape(&metrics_addr);
    let log = agent.terminate();

    let evictions = |part: &str| {
        metric(
            &scraped,
            "profiler_memory_evictions_total",
            &[&format!("part=\"{part}\"")],
        )
    };
    assert!(
        evictions("unwind tables' compiled rows") >= 3.0,
        "{scraped}"
    );
    assert!(evictions("modules' symbols") >= 1.0, "{scraped}");
    let held = metric(
        &scraped,
        "profiler_memory_bytes",
        &["part=\"compiled unwind rows held by the agent\""],
    );
    assert!(held < 1e6, "{held} bytes of compiled rows held\n{scraped}");
    // Each program's samples in record_key, and how many of them reach main; for `first`,
    // those after it ran on (windows that start once it was resumed).
    let (mut second_whole, mut second_all, mut resumed_whole, mut resumed_all) = (0, 0, 0, 0);
    for window in std::fs::read_dir(windows.path()).unwrap() {
        let window = window.unwrap().path();
        if !is_window(&window) {
            continue;
        }
        let profile = read_pprof(&window);
        let after_resuming = profile.time_nanos > resumed_ns;
        for (frames, count) in sample_frames(&profile) {
            let [(module, "record_key"), ref callers @ ..] = frames[..] else {
                continue;
            };
            let whole = callers.iter().any(|&(_, function)| function == "main");
            let counts = match module {
                m if m == second.to_str().unwrap() => (&mut second_whole, &mut second_all),
                m if m == first.to_str().unwrap() && after_resuming => {
                    (&mut resumed_whole, &mut resumed_all)
                }
                _ => continue,
            };
            *counts.0 += usize::from(whole) * count;
            *counts.1 += count;
        }
    }
    // `second`'s table (300,000 rows) is compiled when it is first seen and placed by evicting
    // `first`'s, and its samples until then do not reach main: 10-13% of its 2.5 s run (917 of
    // 1,023 samples reached main in CI, 866 of 1,001 here; counted as distinct stacks, as this
    // test did before, they were over 90%). `first`'s comes back from the disk cache.
    for (program, whole, all, percent) in [
        ("second", second_whole, second_all, 80),
        ("first, resumed", resumed_whole, resumed_all, 90),
    ] {
        assert!(all >= 20, "{program}: {all} samples in record_key\n{log}");
        assert!(
            whole * 100 >= all * percent,
            "{program}: {whole} of {all} samples in record_key reach main\n{log}"
        );
    }
}

/// An OTLP resource's attribute `key`.
fn resource_attribute<'a>(
    resource: &'a opentelemetry_proto::tonic::resource::v1::Resource,
    key: &str,
) -> Option<&'a AnyValueKind> {
    let value = resource.attributes.iter().find(|kv| kv.key == key)?;
    value.value.as_ref()?.value.as_ref()
}

fn resource_text<'a>(
    resource: &'a opentelemetry_proto::tonic::resource::v1::Resource,
    key: &str,
) -> Option<&'a str> {
    match resource_attribute(resource, key)? {
        AnyValueKind::StringValue(text) => Some(text),
        _ => None,
    }
}

#[test]
fn kubernetes_pods_name_the_series_and_the_container_view() {
    let test = std::process::id();
    let parent = profiler::scope::cgroup::cgroup2_mount()
        .unwrap()
        .join(format!("profiler-k8s-{test}"));
    let node = tempfile::tempdir().unwrap();
    let node_root = node.path();
    // Under kubelet's systemd driver, run by containerd: named by the task's annotations.
    let (api_id, api_uid) = (
        format!("{:064x}", 0xa91_0000 + u64::from(test)),
        format!("{test:08x}-2f4d-4a8e-9c3b-1d2e3f4a5b6c"),
    );
    write_containerd_task(
        node_root,
        &api_id,
        &api_uid,
        ["shop", "checkout-7d9f5c", "api"],
    );
    let api_pod = PodContainer::start(
        &parent,
        &format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-{api_id}.scope",
            api_uid.replace('-', "_")
        ),
    );
    // Under the cgroupfs driver, whose path names no runtime: named by the pod's UID in
    // kubelet's log directories (one container: its name too).
    let (report_id, report_uid) = (
        format!("{:064x}", 0xb0b_0000 + u64::from(test)),
        format!("{test:08x}-77aa-4bbb-8ccc-0123456789ab"),
    );
    write_file(
        &node_root
            .join("var/log/pods")
            .join(format!("batch_nightly-28372_{report_uid}"))
            .join("report/0.log"),
        "",
    );
    let report_pod = PodContainer::start(
        &parent,
        &format!("kubepods/besteffort/pod{report_uid}/{report_id}"),
    );

    let receiver = Receiver::start(0);
    let spool = tempfile::tempdir().unwrap();
    let agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "--interval", "1"])
            .args(["--pyroscope", &receiver.url(), "--otlp", &receiver.url()])
            .arg("--spool-dir")
            .arg(spool.path())
            .arg("--node-root")
            .arg(node_root)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    std::thread::sleep(Duration::from_millis(3500));
    let log = stop_agent(agent, &receiver);

    // Pyroscope: the names Grafana's Kubernetes discovery gives, and the service by them.
    let expected = [
        (
            api_pod.program.id(),
            "shop",
            "checkout-7d9f5c",
            "api",
            &api_uid,
            &api_id,
        ),
        (
            report_pod.program.id(),
            "batch",
            "nightly-28372",
            "report",
            &report_uid,
            &report_id,
        ),
    ];
    let pushed = receiver.pushes().into_iter().flatten().collect::<Vec<_>>();
    for (pid, namespace, pod, container, uid, id) in expected {
        let series: Vec<_> = pushed
            .iter()
            .filter(|s| s.label("pid") == Some(pid.to_string().as_str()))
            .collect();
        assert!(!series.is_empty(), "no series of pid {pid}\n{log}");
        for one in series {
            assert_eq!(one.label("namespace"), Some(namespace), "{:?}", one.labels);
            assert_eq!(one.label("pod"), Some(pod), "{:?}", one.labels);
            assert_eq!(one.label("container"), Some(container), "{:?}", one.labels);
            assert_eq!(one.label("pod_uid"), Some(uid.as_str()));
            assert_eq!(one.label("container_id"), Some(id.as_str()));
            let service = format!("{namespace}/{container}");
            assert_eq!(one.label("service_name"), Some(service.as_str()));
        }
    }
    // A process outside any pod has none of them (the pods' programs keep both CPUs busy, so
    // the host's own may have taken no sample).
    for host_series in pushed.iter().filter(|s| s.label("pod_uid").is_none()) {
        assert_eq!(
            host_series.label("namespace"),
            None,
            "{:?}",
            host_series.labels
        );
    }

    // OTLP: the semantic conventions' resource attributes.
    let resources: Vec<_> = receiver
        .otlp()
        .into_iter()
        .flat_map(|request| request.resource_profiles)
        .filter_map(|profiles| profiles.resource)
        .collect();
    for (pid, namespace, pod, container, _, _) in expected {
        let resource = resources
            .iter()
            .find(|r| {
                resource_attribute(r, "process.pid")
                    == Some(&AnyValueKind::IntValue(i64::from(pid)))
            })
            .unwrap_or_else(|| panic!("no OTLP resource of pid {pid}"));
        assert_eq!(
            resource_text(resource, "k8s.namespace.name"),
            Some(namespace)
        );
        assert_eq!(resource_text(resource, "k8s.pod.name"), Some(pod));
        assert_eq!(
            resource_text(resource, "k8s.container.name"),
            Some(container)
        );
    }

    // A recording of the pods' cgroups breaks their samples down by namespace/pod/container.
    let profile = tempfile::tempdir().unwrap();
    let file = profile.path().join("pods.prof");
    let recorded = Command::new(profiler_bin())
        .args(["record", "--duration", "1.5", "-G"])
        .arg(&parent)
        .arg("--node-root")
        .arg(node_root)
        .arg("-o")
        .arg(&file)
        .output()
        .unwrap();
    assert!(recorded.status.success(), "{recorded:?}");
    let report = Command::new(profiler_bin())
        .args(["report", "--json", "--by", "container", "-i"])
        .arg(&file)
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let mut containers: Vec<&str> = json["events"][0]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["container"].as_str().unwrap())
        .collect();
    containers.sort_unstable();
    assert_eq!(
        containers,
        ["batch/nightly-28372/report", "shop/checkout-7d9f5c/api"]
    );
    drop((api_pod, report_pod));
    std::fs::remove_dir(&parent).ok();
}
