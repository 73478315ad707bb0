//! Man pages and shell completions, generated from the clap definitions of the command line so
//! that they never drift from it. `cargo xtask manuals` (and `cargo xtask deb`) writes them
//! through the `shell_docs` example; `profiler completions SHELL` prints a script.

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
};

use clap_complete::Shell;

use crate::cli::command;

/// Writes `profiler.1` and one page per subcommand (`profiler-record.1`, ...) into `dir`;
/// returns the files written.
pub fn write_manuals(dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let root = command();
    let mut pages = vec![("profiler".to_string(), root.clone())];
    for sub in root.get_subcommands() {
        let name = format!("profiler-{}", sub.get_name());
        // The page's title and synopsis name the command as it is typed.
        let sub = sub
            .clone()
            .name(name.clone())
            .bin_name(format!("profiler {}", sub.get_name()));
        pages.push((name, sub));
    }
    let mut written = Vec::new();
    for (name, page) in pages {
        let mut text = Vec::new();
        clap_mangen::Man::new(page).render(&mut text)?;
        let path = dir.join(format!("{name}.1"));
        fs::File::create(&path)?.write_all(&text)?;
        written.push(path);
    }
    Ok(written)
}

/// Writes the completion script of `shell` to `out` (`profiler completions SHELL`).
pub fn completion(shell: Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut command(), "profiler", out);
}

/// Writes the completion script of `shell` to `path` (`cargo xtask manuals`).
pub fn write_completion(shell: Shell, path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut file = fs::File::create(path)?;
    completion(shell, &mut file);
    file.flush()
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn manuals_cover_every_subcommand_and_its_options() {
        let dir = tempfile::tempdir().unwrap();
        let pages = write_manuals(dir.path()).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for page in [
            "profiler.1",
            "profiler-record.1",
            "profiler-report.1",
            "profiler-stat.1",
            "profiler-list.1",
        ] {
            assert!(names.iter().any(|n| n == page), "{page}: {names:?}");
        }
        let record = fs::read_to_string(dir.path().join("profiler-record.1")).unwrap();
        assert!(
            record.starts_with(".ie") || record.contains(".TH profiler-record 1"),
            "{record}"
        );
        assert!(record.contains("duration"), "options are documented");
        // groff reads the page without warnings, when it is installed.
        if let Ok(output) = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .arg(dir.path().join("profiler-record.1"))
            .output()
        {
            assert!(output.status.success());
            assert!(
                output.stderr.is_empty(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    #[test]
    fn bash_completion_parses_and_completes_the_options() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profiler.bash");
        write_completion(Shell::Bash, &path).unwrap();
        let script = fs::read_to_string(&path).unwrap();
        assert!(script.contains("--only-event") && script.contains("--ring-buffer-kib"));
        let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
        for shell in [Shell::Zsh, Shell::Fish] {
            let path = dir.path().join(format!("profiler.{shell}"));
            write_completion(shell, &path).unwrap();
            assert!(fs::read_to_string(&path).unwrap().contains("record"));
        }
    }
}
