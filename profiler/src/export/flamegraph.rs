//! Flame graph SVG of one event, drawn by inferno from the folded stacks, so the graph and the
//! folded export always agree. Two things differ, both so that the graph's first screen shows
//! where the samples are: runtime start-up frames are hidden (unless shown on request), and a
//! stack deeper than [`MAX_DEPTH`] frames is drawn with its middle cut (one 228-frame stack made
//! a system-wide graph 3,758 px tall, its first screen blank). The folded export keeps both.

use std::{collections::BTreeMap, io::Write};

use inferno::flamegraph::{
    color::{BasicPalette, MultiPalette},
    from_lines, Options, Palette,
};

use super::{
    event_info,
    folded::{annotated_folded_stacks, folded_function, Annotations},
    offcpu::OFF_CPU_EVENT,
    samples_of, ExportError,
};
use crate::{
    aggregate::startup::{startup_frames, RuntimeFrames},
    profile::{EventIndex, Profile},
};

/// Deepest stack drawn, in frames under the command's name: with inferno's 16 px frames and its
/// margins the graph is under 900 px tall, one screen.
pub const MAX_DEPTH: usize = 48;
/// Of a deeper stack, the outermost frames drawn; the innermost fill the rest, after [`CUT`].
const ROOT_FRAMES: usize = 12;
/// The frame that stands for the middle of a deeper stack.
pub const CUT: &str = "[… frames cut …]";

/// The folded stacks as drawn: without runtime start-up frames when they are hidden, deep stacks
/// cut in the middle, and merged again where that made stacks equal.
fn drawn_stacks(lines: &[String], runtime: RuntimeFrames) -> Vec<String> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for line in lines {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        // The command's name comes first, the stack under it.
        let mut frames: Vec<&str> = stack.split(';').collect();
        if runtime == RuntimeFrames::Hide {
            let hidden = startup_frames(frames[1..].iter().map(|f| folded_function(f)));
            frames.drain(1 + hidden.start..1 + hidden.end);
        }
        if frames.len() - 1 > MAX_DEPTH {
            let inner = MAX_DEPTH - 1 - ROOT_FRAMES;
            let end = frames.len() - inner;
            frames.splice(1 + ROOT_FRAMES..end, [CUT]);
        }
        *merged.entry(frames.join(";")).or_default() += count.parse::<u64>().unwrap_or(0);
    }
    merged
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect()
}

/// Writes the flame graph of `event` as an interactive SVG titled with the event and its sample
/// count.
pub fn write_flamegraph(
    profile: &Profile,
    event: EventIndex,
    runtime: RuntimeFrames,
    out: impl Write,
) -> Result<(), ExportError> {
    let info = event_info(profile, event)?;
    let folded = annotated_folded_stacks(profile, event, Annotations::Interpreted)?;
    let lines = drawn_stacks(&folded, runtime);
    if lines.is_empty() {
        return Err(ExportError::NoSamples {
            event: info.name.clone(),
        });
    }
    let measured: u64 = samples_of(profile, event).map(|s| s.measure()).sum();

    let mut options = Options::default();
    if info.name == OFF_CPU_EVENT {
        // Off-CPU flame graphs are blue, as Brendan Gregg draws them; widths are time blocked.
        options.title = format!("off-CPU time: {:.3} s blocked", measured as f64 / 1e9);
        options.count_name = "ns".into();
        options.colors = Palette::Basic(BasicPalette::Io);
    } else {
        options.title = format!("{}: {measured} samples", info.name);
        options.count_name = "samples".into();
        // The java palette is the one that reads stackcollapse-perf's annotations: kernel
        // frames orange, inlined frames aqua, Python's green.
        options.colors = Palette::Multi(MultiPalette::Java);
    }
    if !profile.meta.target.is_empty() {
        options.subtitle = Some(profile.meta.target.clone());
    }
    // Colours from a hash of the name: the same function has the same colour in every graph.
    options.hash = true;
    from_lines(&mut options, lines.iter().map(String::as_str), out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;

    /// The SVG parsed; inferno's output declares the SVG 1.1 DTD.
    fn parse(svg: &str) -> roxmltree::Document<'_> {
        let options = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        roxmltree::Document::parse_with_options(svg, options)
            .expect("the flame graph is well-formed XML")
    }

    /// The `<title>` texts of the SVG, which inferno writes as `name (N samples, P%)`.
    fn titles(svg: &str) -> Vec<String> {
        parse(svg)
            .descendants()
            .filter(|n| n.has_tag_name("title"))
            .filter_map(|n| n.text().map(str::to_owned))
            .collect()
    }

    fn flamegraph(event: EventIndex) -> String {
        let mut svg = Vec::new();
        write_flamegraph(
            &test_profile::profile(),
            event,
            RuntimeFrames::Show,
            &mut svg,
        )
        .unwrap();
        String::from_utf8(svg).unwrap()
    }

    #[test]
    fn svg_parses_and_names_functions_with_their_counts() {
        let svg = flamegraph(0);
        let titles = titles(&svg);
        for expected in [
            "all (100 samples, 100%)",
            "app (90 samples, 90.00%)",
            "main (85 samples, 85.00%)",
            "run (85 samples, 85.00%)",
            "compute (60 samples, 60.00%)",
            // Annotations colour the frames but are not part of the names shown.
            "vec_sum (60 samples, 60.00%)",
            "add_lanes (60 samples, 60.00%)",
            "do_syscall_64 (25 samples, 25.00%)",
            "do_syscall_64 (5 samples, 5.00%)",
            "[user stack lost] (5 samples, 5.00%)",
            "app worker (10 samples, 10.00%)",
            "libblob.so+0x4a10 (10 samples, 10.00%)",
        ] {
            assert!(
                titles.iter().any(|t| t == expected),
                "no <title>{expected}</title> in {titles:?}"
            );
        }
        let title = parse(&svg)
            .descendants()
            .find(|n| n.attribute("id") == Some("title"))
            .and_then(|n| n.text().map(str::to_owned));
        assert_eq!(title.as_deref(), Some("cpu-clock: 100 samples"));
    }

    #[test]
    fn python_frames_are_coloured_apart_and_named_without_their_annotation() {
        let mut profile = test_profile::profile();
        let run = profile
            .frames
            .iter_mut()
            .find(|frame| frame.function.as_deref() == Some("run"))
            .unwrap();
        run.module = crate::symbolize::PYTHON_MODULE.into();
        let mut svg = Vec::new();
        write_flamegraph(&profile, 0, RuntimeFrames::Show, &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        let document = parse(&svg);
        // Each frame is a <g> holding its <title> and its <rect>.
        let fill = |title: &str| -> String {
            let group = document
                .descendants()
                .filter(|n| n.has_tag_name("title"))
                .find(|n| n.text().is_some_and(|t| t.starts_with(title)))
                .and_then(|n| n.parent())
                .unwrap_or_else(|| panic!("no frame titled {title}"));
            let rect = group.children().find(|n| n.has_tag_name("rect")).unwrap();
            rect.attribute("fill").unwrap().to_string()
        };
        // inferno's green: rgb(R,G,B) with green the largest; the C functions are red-yellow.
        let rgb = |fill: String| -> [u32; 3] {
            let inner = fill.trim_start_matches("rgb(").trim_end_matches(')');
            let parts: Vec<u32> = inner
                .split(',')
                .map(|p| p.trim().parse().unwrap())
                .collect();
            [parts[0], parts[1], parts[2]]
        };
        let [r, g, b] = rgb(fill("run ("));
        assert!(g > r && g > b, "run: rgb({r},{g},{b})");
        let [r, g, _] = rgb(fill("main ("));
        assert!(r > g, "main: rgb({r},{g},..)");
        // The plain folded stacks are unchanged.
        assert!(crate::export::folded::folded_stacks(&profile, 0)
            .unwrap()
            .iter()
            .all(|line| !line.contains("_[j]")));
    }

    #[test]
    fn second_event_has_its_own_graph() {
        let titles = titles(&flamegraph(1));
        assert!(titles.iter().any(|t| t == "all (7 samples, 100%)"));
        assert!(titles
            .iter()
            .any(|t| t == "exc_page_fault (4 samples, 57.14%)"));
        assert!(!titles.iter().any(|t| t.starts_with("do_syscall_64")));
    }

    #[test]
    fn start_up_frames_are_hidden_and_deep_stacks_cut_in_the_middle() {
        let deep: Vec<String> = (0..100).map(|n| format!("f{n}")).collect();
        let lines = [
            "app;_start;__libc_start_main;main;work 3".to_string(),
            "app;main;work 2".to_string(),
            "app;[truncated];main;std::rt::lang_start_internal;app::main 4".to_string(),
            format!("app;main;{};leaf_[k] 1", deep.join(";")),
        ];
        let drawn = drawn_stacks(&lines, RuntimeFrames::Hide);
        assert_eq!(drawn.len(), 3, "{drawn:?}");
        assert_eq!(drawn[0], "app;[truncated];app::main 4", "markers stay");
        assert_eq!(drawn[2], "app;main;work 5", "hidden start-up merges stacks");
        let cut: Vec<&str> = drawn[1].split(';').collect();
        assert_eq!(cut.len(), 1 + MAX_DEPTH, "{cut:?}");
        assert_eq!(
            cut[1..=ROOT_FRAMES],
            ["main", "f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9", "f10"]
        );
        assert_eq!(cut[1 + ROOT_FRAMES], CUT);
        assert_eq!(cut[cut.len() - 2..], ["f99", "leaf_[k] 1"]);
        assert_eq!(
            drawn_stacks(&lines[..1], RuntimeFrames::Show),
            ["app;_start;__libc_start_main;main;work 3"]
        );
    }

    #[test]
    fn event_without_samples_is_an_error() {
        let mut profile = test_profile::profile();
        profile.stacks.retain(|s| s.event == 0);
        let err = write_flamegraph(&profile, 1, RuntimeFrames::Show, std::io::sink()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("event page-faults has no stack samples"),
            "{err}"
        );
    }
}
