//! `cargo xtask layers`: the profiler crate's import graph, checked against its floors.
//!
//! The folders of `profiler/src` follow the data (events -> capture -> drain -> unwind ->
//! symbolize -> assemble -> aggregate -> report/export, with the commands on top). Each top-level
//! module (a "room") sits on a floor; a room may import rooms on its floor or below, never
//! above, and rooms of one floor import each other one way only. A new room must be given a floor
//! here, so that where it sits is decided, not drifted into. Test code (`#[cfg(test)]` modules
//! and `tests.rs` files) may import anything.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use anyhow::{bail, Context, Result};

/// Each room's floor, lowest first. A room imports only rooms on its floor or below.
const FLOORS: &[(&str, u32)] = &[
    // Plumbing every stage uses: hashing, the allocator, reading and writing files safely,
    // starting a command, cgroups and containers, the disk cache, the metrics endpoint.
    ("fast_hash", 0),
    ("heap", 0),
    ("alloc_meter", 0),
    ("input", 0),
    ("duration", 0),
    ("output", 0),
    ("launch", 0),
    ("scope", 0),
    ("disk_cache", 0),
    ("prometheus", 0),
    // The event model and perf's record formats.
    ("events", 1),
    ("perf_data", 1),
    // The process model (processes, mappings, file identities) and the profile model.
    ("process", 2),
    ("profile", 2),
    // Kernel-side capture: perf counters, the BPF program and maps, the side-band reader.
    ("capture", 3),
    ("unwind", 4),
    ("drain", 5),
    ("symbolize", 6),
    ("hardware", 7),
    ("assemble", 7),
    ("aggregate", 8),
    ("report", 9),
    ("export", 9),
    // Sources of profiles: perf.data files, and live capture sessions.
    ("import", 10),
    ("session", 10),
    // The commands, then the command line that calls them.
    ("stat", 11),
    ("record", 11),
    ("agent", 11),
    // The live view shows windows made as the agent makes them.
    ("top", 11),
    ("cli", 12),
    ("commands", 12),
    ("shell_docs", 12),
    ("main", 13),
    ("lib", 13),
];

/// One source file: its module path (`["capture", "sideband"]`) and what it imports.
struct SourceFile {
    path: String,
    module: Vec<String>,
    imports: Vec<Vec<String>>,
}

/// What `cargo xtask layers` found.
#[derive(Debug, Default, PartialEq)]
pub struct Findings {
    /// Rooms no floor was given to.
    pub unplaced: Vec<String>,
    /// `(from, to)` room imports that point up a floor, with the files that make them.
    pub upward: Vec<(String, String, Vec<String>)>,
    /// Circles of rooms (within one floor).
    pub room_circles: Vec<Vec<String>>,
    /// Circles of files.
    pub file_circles: Vec<Vec<String>>,
    pub rooms: usize,
    pub room_imports: usize,
}

impl Findings {
    fn is_clean(&self) -> bool {
        self.unplaced.is_empty()
            && self.upward.is_empty()
            && self.room_circles.is_empty()
            && self.file_circles.is_empty()
    }
}

/// Prints the graph's summary and fails on any import up a floor, any circle, or an unplaced room.
pub fn run(root: &Path) -> Result<()> {
    let findings = check(&read_sources(&root.join("profiler/src"))?);
    println!(
        "layers: {} rooms, {} imports between them, {} up a floor, {} room circles, {} file circles",
        findings.rooms,
        findings.room_imports,
        findings.upward.len(),
        findings.room_circles.len(),
        findings.file_circles.len()
    );
    for room in &findings.unplaced {
        println!("  no floor for `{room}`: give it one in xtask/src/layers.rs");
    }
    for (from, to, files) in &findings.upward {
        println!(
            "  {from} imports {to}, a higher floor, in {}",
            files.join(", ")
        );
    }
    for circle in &findings.room_circles {
        println!("  room circle: {}", circle.join(" <-> "));
    }
    for circle in &findings.file_circles {
        println!("  file circle: {}", circle.join(" <-> "));
    }
    if !findings.is_clean() {
        bail!("the profiler's imports break its layering (see above)");
    }
    Ok(())
}

fn read_sources(src: &Path) -> Result<Vec<SourceFile>> {
    let mut files = Vec::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src)?.to_string_lossy().into_owned();
                let text = fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                if let Some(file) = parse_file(&relative, &text) {
                    files.push(file);
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The module path of a file (`capture/sideband.rs` and `capture/sideband/mod.rs` are both
/// `capture::sideband`); `None` for test-only files.
fn module_of(relative: &str) -> Option<Vec<String>> {
    let stem = relative.strip_suffix(".rs")?;
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if parts.iter().any(|p| p == "tests" || p.ends_with("_tests")) {
        return None;
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

fn parse_file(relative: &str, text: &str) -> Option<SourceFile> {
    let module = module_of(relative)?;
    let code = without_test_modules(&without_comments(text));
    // `super::` is relative to the parent of the file's module; a `mod.rs`'s module is its folder.
    let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
    let mut imports = Vec::new();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut rest = code.as_str();
        while let Some(at) = rest.find(prefix) {
            let preceded = rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            rest = &rest[at + prefix.len()..];
            if preceded {
                continue;
            }
            for path in use_tree_paths(rest) {
                let mut full = base.clone();
                full.extend(path);
                imports.push(full);
            }
        }
    }
    Some(SourceFile {
        path: relative.to_string(),
        module,
        imports,
    })
}

/// The text without comments: a doc link is a reference for readers, not an import.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text without `#[cfg(test)]` items: test code may import anything.
fn without_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        // Skip the item: up to its `;` (a `mod x;` or `use`) or its balanced braces.
        let mut depth = 0usize;
        let mut end = rest.len();
        for (i, c) in rest.char_indices().skip("#[cfg(test)]".len()) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The paths a use tree (or a plain path) names: `a::{b, c::{d, e}}` gives `a::b`, `a::c::d`,
/// `a::c::e`. Reads from the start of `text` to the end of the tree.
fn use_tree_paths(text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut at = 0;
    tree(&chars, &mut at, &mut Vec::new(), &mut paths);
    paths
}

fn tree(chars: &[char], at: &mut usize, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let depth = prefix.len();
    loop {
        skip_space(chars, at);
        if chars.get(*at) == Some(&'{') {
            *at += 1;
            loop {
                skip_space(chars, at);
                if chars.get(*at) == Some(&'}') {
                    *at += 1;
                    break;
                }
                tree(chars, at, prefix, out);
                skip_space(chars, at);
                match chars.get(*at) {
                    Some(',') => *at += 1,
                    Some('}') => {}
                    _ => break,
                }
            }
            prefix.truncate(depth);
            return;
        }
        let start = *at;
        while chars
            .get(*at)
            .is_some_and(|c| c.is_alphanumeric() || *c == '_')
        {
            *at += 1;
        }
        if *at == start {
            break;
        }
        prefix.push(chars[start..*at].iter().collect());
        if chars.get(*at) == Some(&':') && chars.get(*at + 1) == Some(&':') {
            *at += 2;
            continue;
        }
        break;
    }
    if prefix.len() > depth || depth > 0 {
        out.push(prefix.clone());
    }
    prefix.truncate(depth);
}

fn skip_space(chars: &[char], at: &mut usize) {
    while chars.get(*at).is_some_and(|c| c.is_whitespace()) {
        *at += 1;
    }
}

fn check(files: &[SourceFile]) -> Findings {
    let floors: BTreeMap<&str, u32> = FLOORS.iter().copied().collect();
    let rooms: BTreeSet<String> = files.iter().map(|f| f.module[0].clone()).collect();
    let by_module: BTreeMap<Vec<String>, &str> = files
        .iter()
        .map(|f| (f.module.clone(), f.path.as_str()))
        .collect();
    let mut room_edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut file_edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let from = &file.module[0];
        for path in &file.imports {
            let Some(to) = path.first().filter(|to| rooms.contains(*to)) else {
                continue;
            };
            if to != from {
                room_edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_default()
                    .insert(file.path.clone());
            }
            // The file imported: the longest prefix of the path that is a module.
            if let Some(target) = (1..=path.len())
                .rev()
                .find_map(|n| by_module.get(&path[..n]))
                .filter(|target| **target != file.path)
            {
                file_edges
                    .entry(file.path.clone())
                    .or_default()
                    .insert(target.to_string());
            }
        }
    }
    let mut findings = Findings {
        rooms: rooms.len(),
        room_imports: room_edges.values().map(BTreeMap::len).sum(),
        ..Findings::default()
    };
    findings.unplaced = rooms
        .iter()
        .filter(|room| !floors.contains_key(room.as_str()))
        .cloned()
        .collect();
    for (from, targets) in &room_edges {
        for (to, via) in targets {
            if let (Some(a), Some(b)) = (floors.get(from.as_str()), floors.get(to.as_str())) {
                if b > a {
                    findings
                        .upward
                        .push((from.clone(), to.clone(), via.iter().cloned().collect()));
                }
            }
        }
    }
    let room_graph: BTreeMap<String, BTreeSet<String>> = room_edges
        .iter()
        .map(|(from, targets)| (from.clone(), targets.keys().cloned().collect()))
        .collect();
    findings.room_circles = circles(&room_graph);
    findings.file_circles = circles(&file_edges);
    findings
}

/// The strongly connected parts of more than one node (Tarjan's algorithm).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut part = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    part.push(top.to_string());
                    if top == node {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found.sort();
    walk.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> SourceFile {
        parse_file(path, text).expect("not a test file")
    }

    #[test]
    fn use_trees_name_every_path() {
        let paths = use_tree_paths("{a::b, c::{d, e::f}, g};");
        let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(joined, ["a::b", "c::d", "c::e::f", "g"]);
        assert_eq!(use_tree_paths("capture::ring::KernelRing;")[0].len(), 3);
    }

    #[test]
    fn super_is_relative_to_the_parent_module_and_test_code_is_left_out() {
        let f = file(
            "capture/sideband/pending.rs",
            "use super::short_lives::Settle;\n#[cfg(test)]\nmod tests { use crate::cli::X; }",
        );
        assert_eq!(f.module, ["capture", "sideband", "pending"]);
        assert_eq!(
            f.imports,
            [["capture", "sideband", "short_lives", "Settle"]]
        );
        let m = file(
            "capture/mod.rs",
            "use super::events::X; // see [`crate::cli`]",
        );
        assert_eq!(m.module, ["capture"]);
        assert!(parse_file("unwind/tables/tests.rs", "use crate::cli::X;").is_none());
    }

    #[test]
    fn an_import_up_a_floor_and_a_circle_are_found() {
        let files = [
            file("capture/mod.rs", "use crate::drain::Drained;"),
            file("drain/mod.rs", "use crate::capture::Ring;"),
            file("events/mod.rs", ""),
            file("aggregate/a.rs", "use super::b::X;"),
            file("aggregate/b.rs", "use super::a::Y;"),
            file("aggregate/mod.rs", ""),
            file("newroom.rs", "use crate::events::Spec;"),
        ];
        let findings = check(&files);
        assert_eq!(findings.unplaced, ["newroom"]);
        assert_eq!(
            findings.upward,
            [(
                "capture".to_string(),
                "drain".to_string(),
                vec!["capture/mod.rs".to_string()]
            )]
        );
        assert_eq!(findings.room_circles, [["capture", "drain"]]);
        assert!(findings.file_circles.contains(&vec![
            "aggregate/a.rs".to_string(),
            "aggregate/b.rs".to_string()
        ]));
        assert!(!findings.is_clean());
    }
}
