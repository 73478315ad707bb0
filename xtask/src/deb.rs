//! `cargo xtask deb`: the profiler as a Debian package, built with `dpkg-deb` from what the
//! other tasks make: the release binary (the eBPF object is embedded in it), the man pages and
//! completions of `cargo xtask manuals`, the agent's systemd unit and the README. `cargo xtask
//! test` installs it with `dpkg -i` and profiles from the installed path ([`check_installed`]).

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{build_release, manuals, run_command, target_dir, workspace_root};

/// The unit file's path for the binary: the package installs it in /usr/bin.
const UNIT_BINARY: &str = "/usr/local/bin/profiler";

/// Builds target/debian/profiler_<version>_<arch>.deb; returns its path.
pub fn build() -> Result<PathBuf> {
    build_release()?;
    let arch = command_output(Command::new("dpkg").arg("--print-architecture"))?;
    let version = env!("CARGO_PKG_VERSION");
    let debian = target_dir().join("debian");
    let root = debian.join(format!("profiler_{version}_{arch}"));
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    let usr = root.join("usr");
    install(
        &target_dir().join("release/profiler"),
        &usr.join("bin/profiler"),
        0o755,
    )?;
    manuals(Some(usr.clone()))?;
    // Debian's zsh reads vendor completions from vendor-completions, not site-functions.
    let zsh = usr.join("share/zsh");
    fs::create_dir_all(zsh.join("vendor-completions"))?;
    fs::rename(
        zsh.join("site-functions/_profiler"),
        zsh.join("vendor-completions/_profiler"),
    )?;
    fs::remove_dir(zsh.join("site-functions"))?;
    // Debian's man pages are compressed (policy 12.1).
    let man = usr.join("share/man/man1");
    for page in fs::read_dir(&man)? {
        run_command(Command::new("gzip").args(["-9n"]).arg(page?.path()))?;
    }
    let unit = fs::read_to_string(workspace_root().join("dist/profiler-agent.service"))?;
    ensure!(
        unit.contains(UNIT_BINARY),
        "dist/profiler-agent.service no longer runs {UNIT_BINARY}: update xtask/src/deb.rs"
    );
    write(
        &root.join("lib/systemd/system/profiler-agent.service"),
        &unit.replace(UNIT_BINARY, "/usr/bin/profiler"),
        0o644,
    )?;
    install(
        &workspace_root().join("README.md"),
        &usr.join("share/doc/profiler/README.md"),
        0o644,
    )?;
    let installed_kib = directory_bytes(&root)?.div_ceil(1024);
    write(
        &root.join("DEBIAN/control"),
        &format!(
            "Package: profiler\n\
             Version: {version}\n\
             Architecture: {arch}\n\
             Maintainer: profiler developers <profiler@localhost>\n\
             Installed-Size: {installed_kib}\n\
             Depends: libc6\n\
             Section: devel\n\
             Priority: optional\n\
             Description: eBPF sampling profiler\n \
             Samples call stacks, instructions and data addresses on counter overflow with an\n \
             eBPF program: record a command, processes, cgroups or the whole system, report\n \
             on it, count events (stat), or profile continuously as an agent (systemd unit\n \
             profiler-agent.service).\n"
        ),
        0o644,
    )?;
    let deb = debian.join(format!("profiler_{version}_{arch}.deb"));
    run_command(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&root)
            .arg(&deb),
    )?;
    eprintln!("xtask: built {}", deb.display());
    Ok(deb)
}

/// Installs the package and checks it from the installed paths: `/usr/bin/profiler record`
/// names the workload's functions, `man -w` finds the pages, the completions and the unit are
/// where bash and systemd look.
pub fn check_installed(deb: &Path) -> Result<()> {
    run_command(Command::new("dpkg").arg("-i").arg(deb))?;
    // In target/debian: the default profile (profiler.data) is written there.
    let report = command_output(
        Command::new("/usr/bin/profiler")
            .args(["record", "--json", "-", "--"])
            .arg(target_dir().join("release/cpu_split"))
            .arg("1000")
            .current_dir(target_dir().join("debian")),
    )?;
    let json: serde_json::Value =
        serde_json::from_str(&report).context("the installed profiler's JSON report")?;
    let functions: Vec<&str> = json["events"][0]["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row["function"].as_str())
        .collect();
    ensure!(
        functions.contains(&"cpu_split::heavy_work"),
        "/usr/bin/profiler record did not name cpu_split::heavy_work: {functions:?}"
    );
    let page = command_output(Command::new("man").args(["-w", "profiler-record"]))?;
    ensure!(
        page == "/usr/share/man/man1/profiler-record.1.gz",
        "man -w profiler-record found {page:?}"
    );
    for installed in [
        "/usr/share/bash-completion/completions/profiler",
        "/usr/share/zsh/vendor-completions/_profiler",
        "/usr/share/fish/vendor_completions.d/profiler.fish",
        "/lib/systemd/system/profiler-agent.service",
        "/usr/share/doc/profiler/README.md",
    ] {
        ensure!(
            Path::new(installed).is_file(),
            "{installed} is not installed"
        );
    }
    eprintln!("xtask: the installed package profiles from /usr/bin/profiler; man -w finds {page}");
    Ok(())
}

fn command_output(command: &mut Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("cannot start {:?}", command.get_program()))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write(path: &Path, text: &str, mode: u32) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn directory_bytes(dir: &Path) -> Result<u64> {
    let mut bytes = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        bytes += if metadata.is_dir() {
            directory_bytes(&entry.path())?
        } else {
            metadata.len()
        };
    }
    Ok(bytes)
}
