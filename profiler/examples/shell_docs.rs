//! Writes the man pages or a shell completion script (`cargo xtask manuals` runs this):
//! `shell_docs man DIR` or `shell_docs completion bash|zsh|fish FILE`.

use std::{path::Path, process::ExitCode};

use clap_complete::Shell;
use profiler::shell_docs::{write_completion, write_manuals};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["man", dir] => write_manuals(Path::new(dir)).map(|pages| {
            for page in pages {
                println!("{}", page.display());
            }
        }),
        ["completion", shell, file] => match shell.parse::<Shell>() {
            Ok(shell) => write_completion(shell, Path::new(file)).map(|()| println!("{file}")),
            Err(_) => {
                eprintln!("shell_docs: unknown shell '{shell}': give bash, zsh or fish");
                return ExitCode::FAILURE;
            }
        },
        _ => {
            eprintln!("usage: shell_docs man DIR | shell_docs completion bash|zsh|fish FILE");
            return ExitCode::FAILURE;
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shell_docs: {error}");
            ExitCode::FAILURE
        }
    }
}
