//! The frames of the viewer exports (speedscope, the HTML report): one table of named frames,
//! each function once, and each sample's stack as indices into it, root first.
//!
//! A frame is one function: its name, and as `file` its source file where the symbols say it
//! and the frame is not inlined-into elsewhere, else its load module, so that a view with one
//! row per frame gives a function the share the report gives it. Each function inlined at an
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

/// The frame list, each frame once.
#[derive(Default)]
pub struct FrameTable<'a> {
    pub list: Vec<NamedFrame<'a>>,
    index: HashMap<NamedFrame<'a>, usize>,
}

impl<'a> FrameTable<'a> {
    fn intern(&mut self, frame: NamedFrame<'a>) -> usize {
        if let Some(&at) = self.index.get(&frame) {
            return at;
        }
        self.list.push(frame.clone());
        self.index.insert(frame, self.list.len() - 1);
        self.list.len() - 1
    }

    /// A frame's function, then the functions inlined at its address, outermost first.
    fn push_frame(&mut self, frame: &'a Frame, stack: &mut Vec<usize>) {
        let module = Some(frame.module.as_str()).filter(|module| !module.is_empty());
        stack.push(self.intern(NamedFrame {
            name: frame.display_name().into(),
            // Where code was inlined, the address's source file may be the inlined code's.
            file: match frame.inlined.is_empty() {
                true => frame.file.as_deref().or(module),
                false => module,
            },
        }));
        for inlined in &frame.inlined {
            stack.push(self.intern(NamedFrame {
                name: inlined.function.as_str().into(),
                file: inlined.file.as_deref().or(module),
            }));
        }
    }

    fn push_name(&mut self, name: impl Into<Cow<'a, str>>, stack: &mut Vec<usize>) {
        stack.push(self.intern(NamedFrame {
            name: name.into(),
            file: None,
        }));
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
