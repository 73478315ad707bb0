//! Functions by self and total samples, and the hottest call paths.

use std::collections::{HashMap, HashSet};

use crate::profile::{module_basename, EventIndex, Frame, Profile};

/// A function as reports name it: the symbol, or module+offset for stripped code.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionName {
    pub name: String,
    pub module: String,
}

impl FunctionName {
    pub fn of(frame: &Frame) -> FunctionName {
        FunctionName {
            name: frame.display_name(),
            module: module_basename(&frame.module).to_string(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionRow {
    pub function: FunctionName,
    /// Samples whose leaf frame is in this function.
    pub self_samples: u64,
    /// Samples with this function anywhere on the stack (counted once per sample).
    pub total_samples: u64,
}

/// Per-function samples of one event, hottest self first.
pub fn function_rows(profile: &Profile, event: EventIndex) -> Vec<FunctionRow> {
    let names: Vec<FunctionName> = profile.frames.iter().map(FunctionName::of).collect();
    let mut rows: HashMap<&FunctionName, (u64, u64)> = HashMap::new();
    for stack in profile.stacks.iter().filter(|s| s.event == event) {
        if let Some(leaf) = stack.frames.first() {
            rows.entry(&names[*leaf as usize]).or_default().0 += stack.count;
        }
        let mut seen = HashSet::new();
        for frame in &stack.frames {
            let name = &names[*frame as usize];
            if seen.insert(name) {
                rows.entry(name).or_default().1 += stack.count;
            }
        }
    }
    let mut rows: Vec<FunctionRow> = rows
        .into_iter()
        .map(|(function, (self_samples, total_samples))| FunctionRow {
            function: function.clone(),
            self_samples,
            total_samples,
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.self_samples, b.total_samples, &a.function).cmp(&(
            a.self_samples,
            a.total_samples,
            &b.function,
        ))
    });
    rows
}

/// A call path (function names, leaf first) and its samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallPath {
    pub functions: Vec<String>,
    pub samples: u64,
}

/// The hottest call paths of one event by function (stacks that differ only in addresses inside
/// the same functions are merged).
pub fn hot_paths(profile: &Profile, event: EventIndex, limit: usize) -> Vec<CallPath> {
    let mut paths: HashMap<Vec<String>, u64> = HashMap::new();
    for stack in profile.stacks.iter().filter(|s| s.event == event) {
        let functions = stack
            .frames
            .iter()
            .map(|f| profile.frames[*f as usize].display_name())
            .collect();
        *paths.entry(functions).or_default() += stack.count;
    }
    let mut paths: Vec<CallPath> = paths
        .into_iter()
        .map(|(functions, samples)| CallPath { functions, samples })
        .collect();
    paths.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then(a.functions.cmp(&b.functions))
    });
    paths.truncate(limit);
    paths
}

/// Samples of one event.
pub fn event_samples(profile: &Profile, event: EventIndex) -> u64 {
    profile
        .stacks
        .iter()
        .filter(|s| s.event == event)
        .map(|s| s.count)
        .sum()
}
