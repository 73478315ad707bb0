//! Fuzzes the unwind-table compiler: whatever the call-frame information, `compile` returns a
//! table or an error, never panics, never holds more rows than its limit, and a table it
//! returns is sorted and ends the code it covers. The first byte says which section the rest
//! is (odd: `.debug_frame`, even: `.eh_frame`). (The bounded run that CI does is a unit test
//! of the profiler crate: `unwind::tables::tests`.)
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;

use profiler::unwind::tables::{CfiSections, CompileLimits};
use profiler_common::unwind::CfaRule;

const LIMITS: CompileLimits = CompileLimits {
    section_bytes: 1 << 20,
    rows: 1 << 16,
};

fuzz_target!(|data: &[u8]| {
    let Some((&which, cfi)) = data.split_first() else {
        return;
    };
    let mut sections = CfiSections {
        architecture: "X86_64".into(),
        text: Some(0x1000),
        executable: vec![0x1000..0x8_0000, 0x8_0000..0x10_0000],
        ..CfiSections::default()
    };
    if which & 1 == 1 {
        sections.debug_frame = Some(Cow::Borrowed(cfi));
    } else {
        sections.eh_frame = Some((0x20_0000, Cow::Borrowed(cfi)));
    }
    let _ = sections.digest();
    if let Ok(table) = sections.compile(&LIMITS) {
        assert!(table.rows.len() <= LIMITS.rows);
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        assert_eq!(table.rows.last().unwrap().cfa_rule, CfaRule::NoInfo as u8);
    }
});
