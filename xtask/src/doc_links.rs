//! The documentation as a reader meets it: the README stays a front page, and every relative
//! link in it, in `docs/` and in `bench/results/` leads to a file that exists and, with an
//! anchor, to a heading of that page. Run by `cargo test` (and so by `cargo xtask test`): pages
//! move often, and a broken link is found here rather than by a reader.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Component, Path, PathBuf},
};

/// The README is the project's front page; the guides under docs/ hold the rest.
const README_MAX_LINES: usize = 250;

/// The Markdown pages whose links are checked, relative to the workspace root.
fn pages(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut pages = BTreeMap::new();
    let mut add = |relative: PathBuf| {
        let text = fs::read_to_string(root.join(&relative))
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", relative.display()));
        pages.insert(relative, text);
    };
    add(PathBuf::from("README.md"));
    for folder in ["docs", "bench/results"] {
        let entries = fs::read_dir(root.join(folder))
            .unwrap_or_else(|error| panic!("cannot list {folder}: {error}"));
        for entry in entries {
            let name = entry.expect("a directory entry").file_name();
            if Path::new(&name).extension().is_some_and(|ext| ext == "md") {
                add(Path::new(folder).join(name));
            }
        }
    }
    pages
}

/// The lines of a page that are prose: fenced code blocks left out, inline code spans blanked
/// (a `[x](y)` or `# x` inside code is no link and no heading).
fn prose_lines(text: &str) -> Vec<String> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut prose = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                prose.push(c);
            }
        }
        lines.push(prose);
    }
    lines
}

/// The anchors GitHub gives a page's headings: lower case, spaces to hyphens, other punctuation
/// dropped (code spans keep their text), a repeated heading suffixed `-1`, `-2`...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if in_fence {
            continue;
        }
        let title = heading.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut anchor = slug.clone();
        let mut repeat = 0;
        while anchors.contains(&anchor) {
            repeat += 1;
            anchor = format!("{slug}-{repeat}");
        }
        anchors.insert(anchor);
    }
    anchors
}

/// The targets of a page's inline links `[text](target)`, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    for (index, line) in prose_lines(text).iter().enumerate() {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            links.push((index + 1, rest[..end].trim().to_string()));
            rest = &rest[end..];
        }
    }
    links
}

/// `base/relative` with `.` and `..` resolved; `None` when it leaves the workspace.
fn resolve(base: &Path, relative: &str) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    for component in base.join(relative).components() {
        match component {
            Component::Normal(part) => path.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !path.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(path)
}

/// Every relative link of `pages` that leads nowhere, as `page:line: target (why)`. `exists`
/// says whether a file or folder other than the pages exists; a link's anchor is checked
/// against the headings of the page it leads to.
fn broken_links(pages: &BTreeMap<PathBuf, String>, exists: &dyn Fn(&Path) -> bool) -> Vec<String> {
    let anchors: BTreeMap<&PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|(path, text)| (path, anchors(text)))
        .collect();
    let mut broken = Vec::new();
    for (page, text) in pages {
        for (line, target) in links(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if file.is_empty() {
                Some(page.clone())
            } else {
                resolve(page.parent().unwrap_or(Path::new("")), file)
            };
            let why = match resolved {
                None => Some("leaves the workspace".to_string()),
                Some(path) if !pages.contains_key(&path) && !exists(&path) => {
                    Some(format!("{} does not exist", path.display()))
                }
                Some(path) => match anchors.get(&path) {
                    Some(headings) if !anchor.is_empty() && !headings.contains(anchor) => {
                        Some(format!("{} has no heading #{anchor}", path.display()))
                    }
                    _ => None,
                },
            };
            if let Some(why) = why {
                broken.push(format!("{}:{line}: {target} ({why})", page.display()));
            }
        }
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace_root;

    #[test]
    fn the_readme_is_a_front_page() {
        let root = workspace_root();
        let lines = fs::read_to_string(root.join("README.md"))
            .expect("README.md")
            .lines()
            .count();
        assert!(
            lines <= README_MAX_LINES,
            "README.md has {lines} lines, more than {README_MAX_LINES}: move the details into a \
             guide under docs/ and link it from the README's documentation index"
        );
    }

    #[test]
    fn every_relative_link_in_the_docs_leads_to_a_file_and_heading() {
        let root = workspace_root();
        let pages = pages(&root);
        assert!(pages.len() > 3, "docs/ and bench/results/ hold pages");
        let broken = broken_links(&pages, &|path| root.join(path).exists());
        assert!(
            broken.is_empty(),
            "broken links (fix the link, or the heading it names):\n{}",
            broken.join("\n")
        );
    }

    #[test]
    fn headings_get_githubs_anchors() {
        let text =
            "# Call stacks\n## User stacks: `record --unwind dwarf|fp`\n## arm64 (aarch64)\n\
                    ## Notes\n## Notes\n```sh\n# a comment, not a heading\n```\n";
        let found = anchors(text);
        let expected = [
            "call-stacks",
            "user-stacks-record---unwind-dwarffp",
            "arm64-aarch64",
            "notes",
            "notes-1",
        ];
        assert_eq!(found, expected.iter().map(|a| a.to_string()).collect());
    }

    #[test]
    fn a_missing_file_a_missing_heading_and_a_way_out_are_found() {
        let pages = BTreeMap::from([
            (
                PathBuf::from("README.md"),
                "[ok](docs/a.md#part) [gone](docs/b.md) [web](https://example.com/x)\n\
                 [no heading](docs/a.md#nothing) `[code](nowhere.md)` [out](../up.md)\n\
                 [folder](bench/results/) [here](#top)\n# Top\n"
                    .to_string(),
            ),
            (
                PathBuf::from("docs/a.md"),
                "# A\n## Part\n[back](../README.md#top)\n".to_string(),
            ),
        ]);
        let broken = broken_links(&pages, &|path| path == Path::new("bench/results"));
        assert_eq!(
            broken,
            [
                "README.md:1: docs/b.md (docs/b.md does not exist)",
                "README.md:2: docs/a.md#nothing (docs/a.md has no heading #nothing)",
                "README.md:2: ../up.md (leaves the workspace)",
            ]
        );
    }
}
