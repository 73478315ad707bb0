//! The frames of the viewer exports (speedscope, the HTML report): one table of named frames,
//! each function once, and each sample's stack as indices into it, root first.
//!
//! A frame is one function of one load module, whatever address of it was sampled: its name, and
//! as `file` its source file where the symbols say it at an address where nothing was inlined
//! into it (the address's lines are the inlined code's otherwise), else its load module. So a
//! view with one row per frame gives a function the share the report gives it (a function whose
//! addresses gave two files was two rows, each with part of its samples). Each function inlined at an
//! address is a frame of its own under the function it was inlined into, as in the report. Each
//! stack's root is its command name, as in the folded stacks.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Serialize;

use super::{stack_root_first, StackEntry, StackRoots};
use crate::profile::{Frame, Profile, StackSample};

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct NamedFrame<'a> {
    pub name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<&'a str>,
}

/// What a frame is one of: a function and its load module.
type FunctionKey<'a> = (Cow<'a, str>, Option<&'a str>);

/// The frame list, each frame once.
#[derive(Default)]
pub struct FrameTable<'a> {
    pub list: Vec<NamedFrame<'a>>,
    index: HashMap<FunctionKey<'a>, usize>,
}

impl<'a> FrameTable<'a> {
    /// The index of `frame`, a function of `module`; a source file found for a function first
    /// met where only its module could name it replaces the module.
    fn intern(&mut self, frame: NamedFrame<'a>, module: Option<&'a str>) -> usize {
        let key = (frame.name.clone(), module);
        if let Some(&at) = self.index.get(&key) {
            let known = &mut self.list[at];
            if known.file == module && frame.file != module {
                known.file = frame.file;
            }
            return at;
        }
        self.list.push(frame);
        self.index.insert(key, self.list.len() - 1);
        self.list.len() - 1
    }

    /// A frame's function, then the functions inlined at its address, outermost first.
    fn push_frame(&mut self, frame: &'a Frame, stack: &mut Vec<usize>) {
        let module = Some(frame.module.as_str()).filter(|module| !module.is_empty());
        let own = NamedFrame {
            name: frame.display_name().into(),
            // Where code was inlined, the address's source file may be the inlined code's.
            file: match frame.inlined.is_empty() {
                true => frame.file.as_deref().or(module),
                false => module,
            },
        };
        stack.push(self.intern(own, module));
        for inlined in &frame.inlined {
            let inlined = NamedFrame {
                name: inlined.function.as_str().into(),
                file: inlined.file.as_deref().or(module),
            };
            stack.push(self.intern(inlined, module));
        }
    }

    fn push_name(&mut self, name: impl Into<Cow<'a, str>>, stack: &mut Vec<usize>) {
        let named = NamedFrame {
            name: name.into(),
            file: None,
        };
        stack.push(self.intern(named, None));
    }

    /// `sample`'s stack, root (its command name) first, the lost parts of it named where they
    /// were lost.
    pub fn stack(
        &mut self,
        profile: &'a Profile,
        roots: &StackRoots<'a>,
        sample: &'a StackSample,
    ) -> Vec<usize> {
        let mut stack = Vec::new();
        self.push_name(roots.of(sample), &mut stack);
        for entry in stack_root_first(profile, sample) {
            match entry {
                StackEntry::Frame(_, frame) => self.push_frame(frame, &mut stack),
                StackEntry::UserStackLost => {
                    self.push_name(StackEntry::USER_STACK_LOST, &mut stack);
                }
                StackEntry::KernelStackLost => {
                    self.push_name(StackEntry::KERNEL_STACK_LOST, &mut stack);
                }
            }
        }
        stack
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::InlinedFrame;

    #[test]
    fn a_function_is_one_frame_whichever_address_and_names_its_source_file() {
        let at = |address: u64, file: &str, inlined: bool| Frame {
            address,
            module: "/usr/bin/app".into(),
            function: Some("lang_start_internal".into()),
            file: Some(file.into()),
            inlined: if inlined {
                vec![InlinedFrame {
                    function: "catch_unwind".into(),
                    file: Some("panic.rs".into()),
                    line: Some(3),
                }]
            } else {
                Vec::new()
            },
            ..Frame::default()
        };
        // First met at an address with inlined code (its lines are panic.rs's), then at one
        // without: one frame, named by its own file once that is known.
        let frames = [at(0x10, "panic.rs", true), at(0x20, "rt.rs", false)];
        let mut table = FrameTable::default();
        let mut stacks = [Vec::new(), Vec::new()];
        for (frame, stack) in frames.iter().zip(&mut stacks) {
            table.push_frame(frame, stack);
        }
        assert_eq!(stacks, [vec![0, 1], vec![0]]);
        assert_eq!(table.list[0].name, "lang_start_internal");
        assert_eq!(table.list[0].file, Some("rt.rs"));
        assert_eq!(table.list[1].name, "catch_unwind");
        // The same name in another module is another function.
        let mut other = at(0x30, "rt.rs", false);
        other.module = "/usr/lib/libother.so".into();
        let mut stack = Vec::new();
        table.push_frame(&other, &mut stack);
        assert_eq!(stack, [2]);
    }
}
