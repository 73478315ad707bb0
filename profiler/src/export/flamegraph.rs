//! Flame graph SVG of one event, drawn by inferno from the folded stacks, so the graph and the
//! folded export always agree.

use std::io::Write;

use inferno::flamegraph::{
    color::{BasicPalette, MultiPalette},
    from_lines, Options, Palette,
};

use super::{event_info, folded::folded_stacks, offcpu::OFF_CPU_EVENT, samples_of, ExportError};
use crate::profile::{EventIndex, Profile};

/// Writes the flame graph of `event` as an interactive SVG titled with the event and its sample
/// count.
pub fn write_flamegraph(
    profile: &Profile,
    event: EventIndex,
    out: impl Write,
) -> Result<(), ExportError> {
    let info = event_info(profile, event)?;
    let lines = folded_stacks(profile, event)?;
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
        // frames orange, inlined frames aqua.
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
        write_flamegraph(&test_profile::profile(), event, &mut svg).unwrap();
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
    fn second_event_has_its_own_graph() {
        let titles = titles(&flamegraph(1));
        assert!(titles.iter().any(|t| t == "all (7 samples, 100%)"));
        assert!(titles
            .iter()
            .any(|t| t == "exc_page_fault (4 samples, 57.14%)"));
        assert!(!titles.iter().any(|t| t.starts_with("do_syscall_64")));
    }

    #[test]
    fn event_without_samples_is_an_error() {
        let mut profile = test_profile::profile();
        profile.stacks.retain(|s| s.event == 0);
        let err = write_flamegraph(&profile, 1, std::io::sink()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("event page-faults has no stack samples"),
            "{err}"
        );
    }
}
