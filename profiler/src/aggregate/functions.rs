//! Functions as reports name them, finding one by name (or by any other name its symbol has), and
//! sample totals.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

use crate::{
    fast_hash::HashMap,
    profile::{module_basename, EventIndex, Frame, FrameId, Profile},
};

use super::filter::Selection;

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

    /// The functions a frame stands for, innermost first: those inlined at its address, then the
    /// one they were inlined into, as folded stacks list them. A call graph walks these, so an
    /// inlined function has callers and callees like any other.
    pub fn logical(frame: &Frame) -> impl Iterator<Item = FunctionName> + '_ {
        let module = module_basename(&frame.module);
        frame
            .inlined
            .iter()
            .rev()
            .map(move |inlined| FunctionName {
                name: inlined.function.clone(),
                module: module.to_string(),
            })
            .chain(std::iter::once(FunctionName::of(frame)))
    }
}

/// Numbers for the functions of a profile's frames, each frame named once: a pass over every
/// frame of every stack hashes and compares small numbers where it would build two strings a
/// frame (a third of a report's time). Functions are numbered, and so are their bare names
/// (call paths merge functions of one name whatever their module).
pub struct FunctionNumbers<'p> {
    frames: &'p [Frame],
    numbers: HashMap<FunctionName, u32>,
    /// By number: the function and the number of its bare name.
    functions: Vec<(FunctionName, u32)>,
    name_numbers: HashMap<String, u32>,
    names: Vec<String>,
    /// By frame: the number of [`FunctionName::of`].
    own: Vec<Option<u32>>,
    /// By frame: the numbers of [`FunctionName::logical`].
    logical: Vec<Option<Box<[u32]>>>,
}

impl<'p> FunctionNumbers<'p> {
    pub fn new(profile: &'p Profile) -> FunctionNumbers<'p> {
        FunctionNumbers {
            frames: &profile.frames,
            numbers: HashMap::default(),
            functions: Vec::new(),
            name_numbers: HashMap::default(),
            names: Vec::new(),
            own: vec![None; profile.frames.len()],
            logical: vec![None; profile.frames.len()],
        }
    }

    /// The number of `function`, numbered now if no frame's function was.
    pub fn number(&mut self, function: &FunctionName) -> u32 {
        if let Some(&number) = self.numbers.get(function) {
            return number;
        }
        let name = match self.name_numbers.get(&function.name) {
            Some(&name) => name,
            None => {
                let name = self.names.len() as u32;
                self.names.push(function.name.clone());
                self.name_numbers.insert(function.name.clone(), name);
                name
            }
        };
        let number = self.functions.len() as u32;
        self.functions.push((function.clone(), name));
        self.numbers.insert(function.clone(), number);
        number
    }

    /// The number of the function holding frame `id`.
    pub fn own(&mut self, id: FrameId) -> u32 {
        if let Some(number) = self.own[id as usize] {
            return number;
        }
        let number = self.number(&FunctionName::of(&self.frames[id as usize]));
        self.own[id as usize] = Some(number);
        number
    }

    /// The numbers of the functions frame `id` stands for, innermost first (see
    /// [`FunctionName::logical`]).
    pub fn logical(&mut self, id: FrameId) -> &[u32] {
        if self.logical[id as usize].is_none() {
            let numbers = FunctionName::logical(&self.frames[id as usize])
                .map(|function| self.number(&function))
                .collect();
            self.logical[id as usize] = Some(numbers);
        }
        self.logical[id as usize].as_deref().unwrap_or_default()
    }

    pub fn function(&self, number: u32) -> &FunctionName {
        &self.functions[number as usize].0
    }

    /// The number of the bare name of function `number`.
    pub fn name_number(&self, number: u32) -> u32 {
        self.functions[number as usize].1
    }

    /// The bare name numbered `name` (see [`FunctionNumbers::name_number`]).
    pub fn name(&self, name: u32) -> &str {
        &self.names[name as usize]
    }
}

/// The function a user named: an exact name (or another name of its symbol), else the only
/// function whose name contains it. Inlined functions are candidates; functions of modules that
/// `--only-module` leaves out are not.
pub fn find_function(
    profile: &Profile,
    selection: &Selection,
    wanted: &str,
) -> Result<FunctionName> {
    // Samples per function (leaf and callers), to list the likeliest candidates first.
    let mut known: BTreeMap<FunctionName, u64> = BTreeMap::new();
    for stack in &profile.stacks {
        for id in &stack.frames {
            let frame = &profile.frames[*id as usize];
            if selection.module(frame) {
                for function in FunctionName::logical(frame) {
                    *known.entry(function).or_default() += stack.count;
                }
            }
        }
    }
    fn names<'a>(
        profile: &'a Profile,
        function: &'a FunctionName,
    ) -> impl Iterator<Item = &'a str> {
        std::iter::once(function.name.as_str()).chain(
            profile
                .aliases_of(&function.module, &function.name)
                .iter()
                .map(String::as_str),
        )
    }
    let exact: Vec<&FunctionName> = known
        .keys()
        .filter(|f| names(profile, f).any(|name| name == wanted))
        .collect();
    let candidates: Vec<&FunctionName> = if exact.is_empty() {
        known
            .keys()
            .filter(|f| names(profile, f).any(|name| name.contains(wanted)))
            .collect()
    } else {
        exact
    };
    match candidates.as_slice() {
        [one] => Ok((*one).clone()),
        [] => bail!(
            "no function named or containing `{wanted}` in the sampled call stacks; list them \
             with `--by function`"
        ),
        many => {
            let mut many: Vec<&FunctionName> = many.to_vec();
            many.sort_by(|a, b| known[b].cmp(&known[a]).then(a.cmp(b)));
            let names: Vec<String> = many
                .iter()
                .take(10)
                .map(|f| format!("{} ({})", f.name, f.module))
                .collect();
            bail!(
                "`{wanted}` matches {} functions; give the full name (and --only-module if \
                 names repeat across modules): {}{}",
                many.len(),
                names.join(", "),
                if many.len() > 10 { ", ..." } else { "" }
            )
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregate::filter::SampleFilter, profile::test_profile};

    #[test]
    fn functions_are_found_by_exact_name_or_unique_part() {
        let profile = test_profile::profile();
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let found = find_function(&profile, &selection, "compute").unwrap();
        assert_eq!(found.name, "compute");
        assert_eq!(found.module, "app");
        assert_eq!(
            find_function(&profile, &selection, "page_fa").unwrap().name,
            "exc_page_fault"
        );
        // `run` is a function, and part of `<[u8; 4] as app::Worker>::run`: exact wins.
        assert_eq!(
            find_function(&profile, &selection, "run").unwrap().name,
            "run"
        );
        let error = find_function(&profile, &selection, "u")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("matches") && error.contains("run (app)"),
            "{error}"
        );
        let error = find_function(&profile, &selection, "nope")
            .unwrap_err()
            .to_string();
        assert!(error.contains("no function"), "{error}");
    }

    #[test]
    fn inlined_functions_and_other_names_are_found() {
        let mut profile = test_profile::profile();
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let found = find_function(&profile, &selection, "vec_sum").unwrap();
        assert_eq!(
            (found.name.as_str(), found.module.as_str()),
            ("vec_sum", "app")
        );
        assert_eq!(
            find_function(&profile, &selection, "add_l").unwrap().name,
            "add_lanes"
        );
        profile.function_aliases = vec![crate::profile::FunctionAliases {
            module: test_profile::APP.into(),
            names: vec!["compute".into(), "compute_avx2".into()],
        }];
        let selection = Selection::new(&profile, &filter);
        // Found by the name the report does not show, and named as it shows it.
        assert_eq!(
            find_function(&profile, &selection, "compute_avx2")
                .unwrap()
                .name,
            "compute"
        );
        assert_eq!(
            find_function(&profile, &selection, "avx2").unwrap().name,
            "compute"
        );
    }
}
