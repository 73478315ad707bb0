//! `cargo xtask arm-pmu`: hardware-counter sampling checked on an emulated Arm PMU. QEMU's
//! `virt` machine with `-cpu max` emulates PMUv3 (the `armv8_pmuv3` PMU: a cycle counter and six
//! general counters), and with `-icount shift=0` every guest instruction takes exactly one
//! nanosecond of virtual time, so instruction counts are exact and repeatable and the cycle
//! counter (1 GHz of virtual time) counts the same instructions. Debian's arm64 cloud kernel
//! boots with an initramfs holding busybox, the cross-built profiler and a static workload
//! that retires a known number of instructions in two functions (1:3); the profiler's answers
//! are checked against those numbers. The same boot records the off-CPU workload of the
//! x86-64 kernel matrix (`--off-cpu --wakers`) and checks it as that matrix does.
//!
//! QEMU 7.2 (Debian 12) and later fire a general counter's overflow about once per timer tick
//! rather than at the period (its overflow timer is wrong), while the cycle counter overflows
//! exactly: sampling is checked on `cycles`, and `instructions` sampling is reported, not
//! asserted.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::{
    kernels::{self, check_accounting, console_of, Check, Guest, PrivateApt},
    run_command,
    setup::apt_install,
    target_dir, workspace_root,
};

/// Loop iterations of known_instructions: 8 instructions each (2 in one_share, 6 in
/// three_shares), 200 million in all, about 0.2 s of virtual time.
const ITERATIONS: u64 = 25_000_000;
/// Sampling period: about 2000 samples of the loops.
const PERIOD: u64 = 100_000;
/// How far sampled and counted figures may be from the known ones.
const TOLERANCE: f64 = 0.01;
/// `record --target-rate`: samples per second asked for. The cycle counter of a busy CPU runs at
/// 1 GHz of virtual time, so calibration should pick an overflow value near 10^9 / this.
const TARGET_RATE: u64 = 1000;
/// How far the calibrated period and the sample rate may be from those: the profiler shares
/// the one virtual CPU with the workload.
const RATE_TOLERANCE: f64 = 0.1;
/// How long the guest may take to boot and run every step: about 4 minutes on a busy 2-CPU
/// machine (TCG with icount is slower than plain TCG; each profiler start reads the kernel's BTF).
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
/// Events counted at once by the multiplexing step: more than the PMU's seven counters.
const MULTIPLEXED: usize = 9;

/// How long one step may run before it is stopped as hung: a whole boot may take minutes here.
const STEP_LIMIT: Duration = Duration::from_secs(300);

/// The guest's steps, run by /init after `cargo xtask kernels`' [`kernels::GUEST_PRELUDE`].
const STEPS: &str = r#"
W="./known_instructions @ITERATIONS@"
if grep -q pmu_suite=general /proc/cmdline; then
    step instructions /tmp/instructions.json ./profiler record -e instructions:u -c @PERIOD@ --json /tmp/instructions.json -- $W
    echo "@@DONE"
    poweroff -f
fi
step stat /tmp/stat.json ./profiler stat -e instructions:u,cycles:u --json -o /tmp/stat.json -- $W
step cycles /tmp/cycles.json ./profiler record -e cycles:u -c @PERIOD@ --json /tmp/cycles.json -- $W
step copy /tmp/copy.json ./profiler record -e cycles:u -c @PERIOD@ --unwind copy --json /tmp/copy.json -- $W
step instructions /tmp/instructions.json ./profiler record -e instructions:u -c @PERIOD@ --json /tmp/instructions.json -- $W
step together /tmp/together.json ./profiler record -e cycles:u,instructions:u -c @PERIOD@ --json /tmp/together.json -- $W
step offcpu /tmp/offcpu.json ./profiler record --off-cpu --wakers --top 0 --json /tmp/offcpu.json -- ./off_cpu /tmp
./known_instructions 2000000000 > /dev/null &
busy=$!
step rate /tmp/rate.json ./profiler record --target-rate @RATE@ -e cycles:u -p $busy --duration 1 --json /tmp/rate.json
kill $busy
step multiplexed /tmp/multiplexed.json ./profiler stat -e @MULTIPLEXED@ --json -o /tmp/multiplexed.json -- $W
refused() {
    name=$1; shift
    if ./profiler record -e "$@" -- ./known_instructions 1000 2>/tmp/$name.log; then
        echo "@@SAID $name accepted"
    else
        echo "@@SAID $name $(tr '\n' ' ' < /tmp/$name.log)"
    fi
}
refused precise cycles:pp
refused spe arm_spe_0//
echo "@@DONE"
poweroff -f
"#;

/// The Rust target the guest runs.
pub const AARCH64: &str = "aarch64-unknown-linux-gnu";

/// Cross-builds the profiler for aarch64 with Debian's compiler and its aarch64 `std`; returns
/// the binary, which embeds the eBPF program built for aarch64 kernels.
pub fn build_aarch64() -> Result<PathBuf> {
    cross_build(&["-p", "profiler"])?;
    Ok(target_dir().join(AARCH64).join("release/profiler"))
}

/// Cross-builds the tests' workload `name` for aarch64, as [`build_aarch64`] the profiler.
fn build_aarch64_workload(name: &str) -> Result<PathBuf> {
    cross_build(&["-p", "integration-tests", "--bin", name])?;
    Ok(target_dir().join(AARCH64).join("release").join(name))
}

/// `cargo build --release --target aarch64-unknown-linux-gnu PACKAGE_ARGS` with Debian's
/// compiler and cross linker.
fn cross_build(package_args: &[&str]) -> Result<()> {
    crate::setup::aarch64_cross_toolchain()?;
    run_command(
        crate::cargo()
            .args(["build", "--release", "--target", AARCH64])
            .args(package_args)
            .env("RUSTC", "/usr/bin/rustc")
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
                "aarch64-linux-gnu-gcc",
            ),
    )
}

/// Which steps a boot runs (the guest reads it from the kernel command line).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Suite {
    /// Every step, on this machine's QEMU.
    Every,
    /// `instructions` sampling alone, on Debian 11's QEMU 5.2, whose general counters overflow
    /// at their period.
    GeneralCounter,
}

/// Debian 11's qemu-system-aarch64 (5.2) and the directory of the two libraries it needs that
/// Debian 12 has under other names, fetched with a private apt configuration.
fn bullseye_qemu(cache: &Path) -> Result<(PathBuf, PathBuf)> {
    let apt = PrivateApt::new(cache, &["bullseye"], "amd64")?;
    let version = apt.newest_version("qemu-system-arm")?;
    let qemu = apt
        .unpack(&format!("qemu-system-arm={version}"))?
        .join("usr/bin/qemu-system-aarch64");
    let libraries = cache.join("lib");
    std::fs::create_dir_all(&libraries)?;
    for package in ["liburing1", "libvirglrenderer1"] {
        let unpacked = apt.unpack(package)?.join("usr/lib/x86_64-linux-gnu");
        for entry in std::fs::read_dir(&unpacked)? {
            let path = entry?.path();
            let copy = libraries.join(path.file_name().expect("a directory entry has a name"));
            // Symbolic links (the sonames) are copied as the files they name.
            std::fs::copy(&path, &copy).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok((qemu, libraries))
}

pub fn run() -> Result<()> {
    apt_install(&["qemu-system-arm"])?;
    let profiler = build_aarch64()?;
    let off_cpu = build_aarch64_workload("off_cpu")?;
    let cache = target_dir().join("arm-pmu");
    let apt = PrivateApt::new(&cache, &["bookworm"], "arm64")?;
    let vmlinuz = apt.kernel("6.1", "arm64")?;
    let busybox = apt.unpack("busybox-static")?.join("bin/busybox");
    let initrd = build_initramfs(&cache.join("initramfs"), &profiler, &off_cpu, &busybox)?;
    let (old_qemu, old_libraries) = bullseye_qemu(&cache.join("bullseye"))?;
    let mut old = Command::new(old_qemu);
    old.env("LD_LIBRARY_PATH", old_libraries);
    let mut failures = Vec::new();
    for (suite, mut qemu, name) in [
        (
            Suite::Every,
            Command::new("qemu-system-aarch64"),
            "this machine's QEMU",
        ),
        (Suite::GeneralCounter, old, "QEMU 5.2"),
    ] {
        let started = Instant::now();
        let (label, append) = match suite {
            Suite::Every => ("every", "console=ttyAMA0 panic=-1 quiet"),
            Suite::GeneralCounter => (
                "general",
                "console=ttyAMA0 panic=-1 quiet pmu_suite=general",
            ),
        };
        qemu.args(["-M", "virt", "-cpu", "max", "-icount", "shift=0"])
            .args(["-append", append]);
        let console = console_of(qemu, &vmlinuz, &initrd, BOOT_TIMEOUT)?;
        let log = cache.join(format!("console-{label}.log"));
        std::fs::write(&log, &console)?;
        let guest = Guest::parse(&console);
        eprintln!(
            "xtask: {} on {name} ran in {:.0} s; its console is in {}",
            guest
                .release
                .as_deref()
                .unwrap_or("the arm64 kernel did not boot"),
            started.elapsed().as_secs_f64(),
            log.display()
        );
        for check in checks(&guest, suite) {
            let mark = if check.passed { "ok  " } else { "FAIL" };
            println!("{mark} arm64 {name:<19} {:<13} {}", check.step, check.said);
            if !check.passed {
                failures.push(format!("{name} {}: {}", check.step, check.said));
            }
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} check(s) failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

/// The guest's initramfs: busybox, the stripped profiler and the off-CPU workload with the
/// aarch64 libraries they load, the counting workload built static, and its /init ([`STEPS`]).
fn build_initramfs(
    root: &Path,
    profiler: &Path,
    off_cpu: &Path,
    busybox: &Path,
) -> Result<PathBuf> {
    if root.exists() {
        std::fs::remove_dir_all(root)?;
    }
    for dir in ["bin", "lib", "proc", "sys", "dev", "tmp", "work"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    std::fs::copy(busybox, root.join("bin/busybox")).context("copying busybox")?;
    run_command(
        Command::new("aarch64-linux-gnu-strip")
            .arg("-o")
            .arg(root.join("work/profiler"))
            .arg(profiler),
    )?;
    // Its symbols stay: the off-CPU step names its functions.
    std::fs::copy(off_cpu, root.join("work/off_cpu")).context("copying off_cpu")?;
    // The loader's default path is /lib: the libraries and the loader itself go there.
    let sysroot = Path::new("/usr/aarch64-linux-gnu/lib");
    let mut libraries = needed_libraries(profiler)?;
    libraries.extend(needed_libraries(off_cpu)?);
    libraries.push("ld-linux-aarch64.so.1".into());
    libraries.sort();
    libraries.dedup();
    for library in &libraries {
        std::fs::copy(sysroot.join(library), root.join("lib").join(library))
            .with_context(|| format!("copying {library} from {}", sysroot.display()))?;
    }
    run_command(
        Command::new("aarch64-linux-gnu-gcc")
            .args(["-O2", "-fno-ipa-icf", "-static", "-o"])
            .arg(root.join("work/known_instructions"))
            .arg(workspace_root().join("tests/workloads/c/known_instructions.c")),
    )?;
    let multiplexed = ["armv8_pmuv3/inst_retired/u"; MULTIPLEXED].join(",");
    let init = kernels::guest_init(STEPS, STEP_LIMIT)
        .replace("@ITERATIONS@", &ITERATIONS.to_string())
        .replace("@PERIOD@", &PERIOD.to_string())
        .replace("@RATE@", &TARGET_RATE.to_string())
        .replace("@MULTIPLEXED@", &multiplexed);
    std::fs::write(root.join("init"), init)?;
    std::fs::set_permissions(
        root.join("init"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let archive = root.with_extension("cpio");
    run_command(
        Command::new("sh")
            .arg("-c")
            .arg("cd \"$1\" && find . | busybox cpio -o -H newc > \"$0\" 2>/dev/null")
            .arg(&archive)
            .arg(root),
    )?;
    Ok(archive)
}

/// The shared libraries an ELF file names (`DT_NEEDED`), read with the cross binutils.
fn needed_libraries(program: &Path) -> Result<Vec<String>> {
    let output = Command::new("aarch64-linux-gnu-readelf")
        .arg("-d")
        .arg(program)
        .output()
        .context("running aarch64-linux-gnu-readelf")?;
    Ok(needed_in(&String::from_utf8_lossy(&output.stdout)))
}

/// The `(NEEDED)` entries of `readelf -d` output.
fn needed_in(dynamic_section: &str) -> Vec<String> {
    dynamic_section
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| Some(line.split_once('[')?.1.split_once(']')?.0.to_string()))
        .collect()
}

/// The instructions known_instructions retires in its two loops.
const LOOP_INSTRUCTIONS: u64 = 8 * ITERATIONS;

fn within(value: f64, expected: f64) -> bool {
    (value - expected).abs() <= TOLERANCE * expected
}

/// Checks one step's JSON document; says what it found.
type StepCheck = fn(&Value) -> Result<String>;

fn checks(guest: &Guest, suite: Suite) -> Vec<Check> {
    let mut checks = vec![guest.boot_check()];
    let steps: &[(&str, StepCheck)] = match suite {
        Suite::Every => &[
            ("stat", check_stat),
            ("cycles", check_cycles),
            ("copy", check_copy),
            ("instructions", check_late_instructions),
            ("together", check_together),
            ("rate", check_rate),
            ("multiplexed", check_multiplexed),
        ],
        Suite::GeneralCounter => &[("instructions", check_instructions)],
    };
    for &(step, check) in steps {
        checks.push(guest.step_check(step, check));
    }
    if suite == Suite::GeneralCounter {
        return checks;
    }
    // Off-CPU time on arm64: the x86-64 kernels' check, against what the workload measured.
    let said = guest
        .said
        .get("offcpu")
        .map(Vec::as_slice)
        .unwrap_or_default();
    checks.push(guest.step_check("offcpu", |document| kernels::check_off_cpu(document, said)));
    // Arm's driver would ignore precise_ip: the profiler refuses it, naming the PMU. QEMU
    // emulates no SPE: refused as a PMU this machine lacks, saying what SPE needs.
    for (step, expected) in [
        (
            "precise",
            &[
                "precise sampling (:p) is x86's",
                "(armv8_pmuv3) has no precise mode",
            ][..],
        ),
        (
            "spe",
            &["arm_spe_0: no such PMU on this machine (Arm SPE needs"][..],
        ),
    ] {
        let said = guest
            .said
            .get(step)
            .and_then(|said| said.first())
            .map_or("never ran", String::as_str);
        checks.push(Check {
            step,
            passed: expected.iter().all(|text| said.contains(text)),
            said: said.to_string(),
        });
    }
    checks
}

/// An event's count from `stat --json`, by its position.
fn stat_count(report: &Value, index: usize) -> Result<(u64, &Value)> {
    let event = &report["events"][index];
    let count = event["count"]
        .as_u64()
        .ok_or_else(|| anyhow!("event {index} has no count: {event}"))?;
    Ok((count, event))
}

fn check_stat(report: &Value) -> Result<String> {
    let (instructions, _) = stat_count(report, 0)?;
    let (cycles, _) = stat_count(report, 1)?;
    for (name, count) in [("instructions:u", instructions), ("cycles:u", cycles)] {
        if !within(count as f64, LOOP_INSTRUCTIONS as f64) {
            bail!("{name} counted {count}, the loops retire {LOOP_INSTRUCTIONS}");
        }
    }
    Ok(format!(
        "instructions:u {instructions}, cycles:u {cycles} for {LOOP_INSTRUCTIONS} loop \
         instructions"
    ))
}

/// Samples of each loop function in one event of `record --json`.
fn loop_samples(event: &Value) -> (u64, u64) {
    (
        kernels::stacks_through(event, "one_share"),
        kernels::stacks_through(event, "three_shares"),
    )
}

/// One sampled event: a sample every [`PERIOD`] loop instructions, split 1:3 between the loop
/// functions, every fired sample kept.
fn check_sampled(report: &Value, event: &Value) -> Result<String> {
    check_accounting(event, report)?;
    let expected = (LOOP_INSTRUCTIONS / PERIOD) as f64;
    let (one, three) = loop_samples(event);
    let samples = event["samples"].as_u64().unwrap_or_default();
    if !within((one + three) as f64, expected) {
        bail!(
            "{} samples in the loops ({one} in one_share, {three} in three_shares) of {samples}, \
             expected {expected} (one every {PERIOD} of {LOOP_INSTRUCTIONS} instructions)",
            one + three
        );
    }
    if !within(one as f64, expected / 4.0) || !within(three as f64, expected * 3.0 / 4.0) {
        bail!("one_share {one} and three_shares {three} samples are not 1:3 of {expected}");
    }
    Ok(format!(
        "{} of {samples} samples in the loops for an expected {expected}: one_share {one}, \
         three_shares {three}",
        one + three
    ))
}

/// Exact cycle samples, each with a user stack that reaches `_start`: the in-kernel walk
/// follows frame records (the unwind tables are x86-64's only) to the zero frame pointer
/// `_start` leaves.
fn check_cycles(report: &Value) -> Result<String> {
    let event = &report["events"][0];
    let sampled = check_sampled(report, event)?;
    let stacks = &event["user_stacks"];
    if stacks["complete"] != event["samples"] {
        bail!("user stacks not all complete: {stacks}");
    }
    Ok(format!("{sampled}; every user stack complete"))
}

/// `--unwind copy` walks the copied stacks with the CFI and the link register: a leaf loop
/// function, which stores no frame record, is found called from main.
fn check_copy(report: &Value) -> Result<String> {
    let event = &report["events"][0];
    let sampled = check_sampled(report, event)?;
    let (one, three) = loop_samples(event);
    let from_main: u64 = event["hot_paths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|path| {
            let functions = &path["functions"];
            (functions[0] == "one_share" || functions[0] == "three_shares")
                && functions[1] == "main"
        })
        .filter_map(|path| path["samples"].as_u64())
        .sum();
    if from_main != one + three {
        bail!(
            "{from_main} of {} loop samples have main as caller: {}",
            one + three,
            event["hot_paths"]
        );
    }
    Ok(format!("{sampled}; all called from main"))
}

/// Instruction-exact sampling on a general counter (QEMU 5.2).
fn check_instructions(report: &Value) -> Result<String> {
    check_sampled(report, &report["events"][0])
}

/// Reported, not asserted: QEMU >= 7.2 fires general counters' overflows late (see the module
/// documentation). Fails only when nothing was sampled.
fn check_late_instructions(report: &Value) -> Result<String> {
    let event = &report["events"][0];
    match check_sampled(report, event) {
        Ok(said) => Ok(said),
        Err(_) if event["samples"].as_u64().unwrap_or_default() > 0 => {
            let (one, three) = loop_samples(event);
            Ok(format!(
                "{} samples, {one} in one_share and {three} in three_shares, for an exact {}: \
                 this QEMU's general-counter overflow fires late",
                event["samples"],
                LOOP_INSTRUCTIONS / PERIOD
            ))
        }
        Err(error) => Err(error),
    }
}

/// Two counters sampled at once: the cycle counter exactly, the general one as it can.
fn check_together(report: &Value) -> Result<String> {
    let cycles = check_sampled(report, &report["events"][0])?;
    let instructions = &report["events"][1];
    if instructions["samples"].as_u64().unwrap_or_default() == 0 {
        bail!("no instructions samples beside cycles: {instructions}");
    }
    Ok(format!(
        "cycles: {cycles}; instructions beside it: {} samples",
        instructions["samples"]
    ))
}

/// `--target-rate` on a running process: the counting pass sees the cycle counter at 1 GHz, and
/// one second sampled at the calibrated period gives about the asked rate.
fn check_rate(report: &Value) -> Result<String> {
    let event = &report["events"][0];
    check_accounting(event, report)?;
    let period = event["period"]
        .as_u64()
        .ok_or_else(|| anyhow!("no fixed period after calibration: {event}"))?;
    let expected_period = 1e9 / TARGET_RATE as f64;
    let samples = event["samples"].as_u64().unwrap_or_default() as f64;
    let close = |value: f64, expected: f64| (value - expected).abs() <= RATE_TOLERANCE * expected;
    if !close(period as f64, expected_period) || !close(samples, TARGET_RATE as f64) {
        bail!(
            "calibrated period {period} (expected about {expected_period}) gave {samples} \
             samples in one second (asked for {TARGET_RATE})"
        );
    }
    Ok(format!(
        "calibrated period {period} for {TARGET_RATE} Hz of a 1 GHz cycle counter: {samples} \
         samples in one second"
    ))
}

/// More events than counters: each ran part of the time, and its scaled count still estimates
/// the known total.
fn check_multiplexed(report: &Value) -> Result<String> {
    let mut shares = Vec::new();
    for index in 0..MULTIPLEXED {
        let (count, event) = stat_count(report, index)?;
        if event["scaled"] != true {
            bail!("event {index} was not multiplexed: {event}");
        }
        if !within(count as f64, LOOP_INSTRUCTIONS as f64) {
            bail!("event {index} scaled to {count}, the loops retire {LOOP_INSTRUCTIONS}: {event}");
        }
        shares.push(event["running_percent"].as_f64().unwrap_or_default());
    }
    Ok(format!(
        "{MULTIPLEXED} inst_retired events, each counting {:.0}-{:.0}% of the time, scaled \
         within {:.0}% of {LOOP_INSTRUCTIONS}",
        shares.iter().copied().fold(f64::INFINITY, f64::min),
        shares.iter().copied().fold(0.0, f64::max),
        TOLERANCE * 100.0
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A `record --json` document with the loop functions' samples.
    fn recording(one: u64, three: u64, fired: u64) -> Value {
        json!({
            "losses": {"samples lost: stack-count map full": 0},
            "events": [{
                "samples": one + three,
                "samples_fired": fired,
                "functions": [
                    {"function": "three_shares", "total_samples": three},
                    {"function": "one_share", "total_samples": one},
                ],
                "user_stacks": {"complete": one + three},
            }],
        })
    }

    #[test]
    fn sampling_is_exact_within_one_percent_and_split_one_to_three() {
        let expected = LOOP_INSTRUCTIONS / PERIOD;
        assert!(check_cycles(&recording(expected / 4, expected * 3 / 4, expected)).is_ok());
        // 2% short, or the right total in the wrong functions, or a sample neither kept nor
        // counted lost: each fails.
        let short = expected * 98 / 100;
        assert!(check_cycles(&recording(short / 4, short * 3 / 4, short)).is_err());
        assert!(check_cycles(&recording(expected / 2, expected / 2, expected)).is_err());
        let err = check_cycles(&recording(expected / 4, expected * 3 / 4, expected + 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("samples fired"), "{err}");
        // QEMU 7.2's late general counter is reported; nothing sampled is a failure.
        assert!(check_late_instructions(&recording(15, 43, 58))
            .unwrap()
            .contains("fires late"));
        assert!(check_late_instructions(&recording(0, 0, 0)).is_err());
        assert!(check_instructions(&recording(15, 43, 58)).is_err());
    }

    #[test]
    fn multiplexed_counts_must_be_scaled_and_close() {
        let event = |count: u64, scaled: bool| json!({"count": count, "scaled": scaled, "running_percent": 66.7});
        let report = |events: Vec<Value>| json!({ "events": events });
        let good: Vec<Value> = (0..MULTIPLEXED)
            .map(|_| event(LOOP_INSTRUCTIONS + 13_694, true))
            .collect();
        assert!(check_multiplexed(&report(good.clone())).is_ok());
        let mut unscaled = good.clone();
        unscaled[3] = event(LOOP_INSTRUCTIONS, false);
        assert!(check_multiplexed(&report(unscaled)).is_err());
        let mut off = good;
        off[8] = event(LOOP_INSTRUCTIONS * 103 / 100, true);
        assert!(check_multiplexed(&report(off)).is_err());
    }

    #[test]
    fn the_precise_refusal_is_read_from_the_console() {
        let console = "@@KERNEL 6.1.0-50-cloud-arm64\n@@SAID precise error: cannot open event \
                       'cycles:pp': precise sampling (:p) is x86's (Intel PEBS, AMD IBS); this \
                       machine's PMU (armv8_pmuv3) has no precise mode, so its samples skid\n\
                       @@SAID spe error: arm_spe_0: no such PMU on this machine (Arm SPE needs \
                       an Arm CPU with the Statistical Profiling Extension)\n\
                       @@DONE\n";
        let checks = checks(&Guest::parse(console), Suite::Every);
        for step in ["precise", "spe"] {
            let check = checks.iter().find(|c| c.step == step).unwrap();
            assert!(check.passed, "{}", check.said);
        }
        let accepted = checks_of("@@KERNEL 6.1\n@@SAID precise accepted\n@@DONE\n");
        assert!(
            !accepted
                .iter()
                .find(|c| c.step == "precise")
                .unwrap()
                .passed
        );
        // The QEMU 5.2 boot runs one step, and is not asked for the others.
        let general = super::checks(
            &Guest::parse("@@KERNEL 6.1\n@@DONE\n"),
            Suite::GeneralCounter,
        );
        let steps: Vec<&str> = general.iter().map(|c| c.step).collect();
        assert_eq!(steps, ["boot", "instructions"]);
    }

    fn checks_of(console: &str) -> Vec<Check> {
        checks(&Guest::parse(console), Suite::Every)
    }

    #[test]
    fn needed_libraries_are_read_from_readelf_lines() {
        let output = "Dynamic section at offset 0x1 contains 3 entries:\n\
                      0x0000000000000001 (NEEDED)   Shared library: [libgcc_s.so.1]\n\
                      0x0000000000000001 (NEEDED)   Shared library: [libc.so.6]\n\
                      0x000000000000000e (SONAME)   Library soname: [libfoo.so]\n";
        assert_eq!(needed_in(output), ["libgcc_s.so.1", "libc.so.6"]);
    }
}
