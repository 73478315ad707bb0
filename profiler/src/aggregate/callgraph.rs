//! The call graph around one function (its callers and callees with sample counts) and the
//! hottest call paths, from the sampled call stacks.

use crate::fast_hash::{HashMap, HashSet};

use crate::profile::{EventIndex, Profile};

use super::{
    filter::Selection,
    functions::{FunctionName, FunctionNumbers},
    startup::{startup_frames, RuntimeFrames},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Callers,
    Callees,
}

/// A caller or callee and the samples of the stacks where it is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// `None`: for callers, the function was the outermost frame of the stack (its caller was
    /// not captured); for callees, the function itself was the leaf (self samples).
    pub function: Option<FunctionName>,
    pub samples: u64,
}

/// Callers or callees of a function in one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbours {
    pub function: FunctionName,
    pub direction: Direction,
    /// Samples of the event that pass the filters.
    pub event_samples: u64,
    /// Samples with the function anywhere on the stack.
    pub total_samples: u64,
    /// Samples with the function as the leaf.
    pub self_samples: u64,
    /// Most samples first. A stack counts once per neighbour, however often the function
    /// recurses in it.
    pub neighbours: Vec<Neighbour>,
}

pub fn neighbours(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
    function: &FunctionName,
    direction: Direction,
) -> Neighbours {
    let mut result = Neighbours {
        function: function.clone(),
        direction,
        event_samples: 0,
        total_samples: 0,
        self_samples: 0,
        neighbours: Vec::new(),
    };
    let mut numbers = FunctionNumbers::new(profile);
    let wanted = numbers.number(function);
    // Neighbours by number; `None` past the stack's ends.
    let mut counts: HashMap<Option<u32>, u64> = HashMap::default();
    let mut functions = Vec::new();
    for stack in profile
        .stacks
        .iter()
        .filter(|s| s.event == event && selection.thread(s.pid, s.tid))
    {
        result.event_samples += stack.count;
        functions.clear();
        for id in &stack.frames {
            functions.extend_from_slice(numbers.logical(*id));
        }
        let positions: Vec<usize> = (0..functions.len())
            .filter(|i| functions[*i] == wanted)
            .collect();
        if positions.is_empty() {
            continue;
        }
        result.total_samples += stack.count;
        if positions[0] == 0 {
            result.self_samples += stack.count;
        }
        let mut seen = HashSet::default();
        for position in positions {
            // Stacks are leaf first: the caller is one frame further, the callee one nearer.
            let neighbour = match direction {
                Direction::Callers => functions.get(position + 1).copied(),
                Direction::Callees => position.checked_sub(1).map(|i| functions[i]),
            };
            if seen.insert(neighbour) {
                *counts.entry(neighbour).or_default() += stack.count;
            }
        }
    }
    result.neighbours = counts
        .into_iter()
        .map(|(function, samples)| Neighbour {
            function: function.map(|number| numbers.function(number).clone()),
            samples,
        })
        .collect();
    result
        .neighbours
        .sort_by(|a, b| b.samples.cmp(&a.samples).then(a.function.cmp(&b.function)));
    result
}

/// A call path (function names, leaf first) and its samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallPath {
    pub functions: Vec<String>,
    pub samples: u64,
}

/// The hottest call paths of one event by function (stacks that differ only in addresses inside
/// the same functions are merged), optionally only those through one function. Hidden runtime
/// start-up frames merge paths that differ only there.
pub fn hot_paths(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
    through: Option<&FunctionName>,
    limit: usize,
    runtime: RuntimeFrames,
) -> Vec<CallPath> {
    let mut numbers = FunctionNumbers::new(profile);
    let through = through.map(|function| numbers.number(function));
    // Paths of bare names, by number.
    let mut paths: HashMap<Vec<u32>, u64> = HashMap::default();
    let mut functions = Vec::new();
    for stack in profile
        .stacks
        .iter()
        .filter(|s| s.event == event && selection.thread(s.pid, s.tid))
    {
        functions.clear();
        for id in &stack.frames {
            functions.extend_from_slice(numbers.logical(*id));
        }
        if through.is_some_and(|through| !functions.contains(&through)) {
            continue;
        }
        let mut path: Vec<u32> = functions
            .iter()
            .map(|&function| numbers.name_number(function))
            .collect();
        if runtime == RuntimeFrames::Hide {
            // Root first there, leaf first here.
            let hidden = startup_frames(path.iter().rev().map(|&name| numbers.name(name)));
            path.drain(path.len() - hidden.end..path.len() - hidden.start);
        }
        *paths.entry(path).or_default() += stack.count;
    }
    let mut paths: Vec<(Vec<u32>, u64)> = paths.into_iter().collect();
    fn names<'a>(numbers: &'a FunctionNumbers, path: &'a [u32]) -> impl Iterator<Item = &'a str> {
        path.iter().map(|&name| numbers.name(name))
    }
    paths.sort_by(|(a, a_samples), (b, b_samples)| {
        b_samples
            .cmp(a_samples)
            .then_with(|| names(&numbers, a).cmp(names(&numbers, b)))
    });
    paths.truncate(limit);
    paths
        .into_iter()
        .map(|(path, samples)| CallPath {
            functions: names(&numbers, &path).map(str::to_string).collect(),
            samples,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregate::filter::SampleFilter, profile::test_profile};

    fn name(function: &str) -> Option<FunctionName> {
        Some(FunctionName {
            name: function.into(),
            module: "app".into(),
        })
    }

    fn entries(neighbours: &Neighbours) -> Vec<(Option<String>, u64)> {
        neighbours
            .neighbours
            .iter()
            .map(|n| (n.function.as_ref().map(|f| f.name.clone()), n.samples))
            .collect()
    }

    #[test]
    fn callers_and_callees_of_run() {
        let profile = test_profile::profile();
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let run = name("run").unwrap();
        let callers = neighbours(&profile, 0, &selection, &run, Direction::Callers);
        assert_eq!(callers.event_samples, 100);
        assert_eq!(callers.total_samples, 85);
        assert_eq!(callers.self_samples, 0);
        assert_eq!(entries(&callers), [(Some("main".into()), 85)]);
        let callees = neighbours(&profile, 0, &selection, &run, Direction::Callees);
        assert_eq!(
            entries(&callees),
            [
                (Some("compute".into()), 60),
                (Some("do_syscall_64".into()), 25)
            ]
        );
        // The syscall: 5 samples had no user stack, so no caller was captured.
        let syscall = FunctionName {
            name: "do_syscall_64".into(),
            module: "[kernel.kallsyms]".into(),
        };
        let callers = neighbours(&profile, 0, &selection, &syscall, Direction::Callers);
        assert_eq!(entries(&callers), [(Some("run".into()), 25), (None, 5)]);
        let callees = neighbours(&profile, 0, &selection, &syscall, Direction::Callees);
        assert_eq!(entries(&callees), [(None, 30)]);
        assert_eq!(callees.self_samples, 30);
    }

    #[test]
    fn inlined_functions_have_callers_and_callees() {
        let profile = test_profile::profile();
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let vec_sum = name("vec_sum").unwrap();
        let callers = neighbours(&profile, 0, &selection, &vec_sum, Direction::Callers);
        assert_eq!(entries(&callers), [(Some("compute".into()), 60)]);
        assert_eq!(callers.self_samples, 0);
        let callees = neighbours(&profile, 0, &selection, &vec_sum, Direction::Callees);
        assert_eq!(entries(&callees), [(Some("add_lanes".into()), 60)]);
        let add_lanes = name("add_lanes").unwrap();
        let callees = neighbours(&profile, 0, &selection, &add_lanes, Direction::Callees);
        assert_eq!(callees.self_samples, 60);
        let through = hot_paths(
            &profile,
            0,
            &selection,
            Some(&add_lanes),
            10,
            RuntimeFrames::Show,
        );
        assert_eq!(through.len(), 1);
        assert_eq!(through[0].samples, 60);
    }

    #[test]
    fn hot_paths_through_a_function() {
        let profile = test_profile::profile();
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let all = hot_paths(&profile, 0, &selection, None, 10, RuntimeFrames::Show);
        // Inlined functions are on the path, innermost first, as in folded stacks.
        assert_eq!(
            all[0].functions,
            ["add_lanes", "vec_sum", "compute", "run", "main"]
        );
        assert_eq!(all[0].samples, 60);
        assert_eq!(all.len(), 4);
        let through = hot_paths(
            &profile,
            0,
            &selection,
            name("run").as_ref(),
            10,
            RuntimeFrames::Show,
        );
        let samples: Vec<u64> = through.iter().map(|p| p.samples).collect();
        assert_eq!(samples, [60, 25]);
        let filter = SampleFilter {
            comm: Some("app worker".into()),
            ..SampleFilter::default()
        };
        let selection = Selection::new(&profile, &filter);
        let worker = hot_paths(&profile, 0, &selection, None, 10, RuntimeFrames::Show);
        assert_eq!(worker.len(), 1);
        assert_eq!(worker[0].samples, 10);
    }
}
