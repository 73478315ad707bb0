//! The finished text report: trailing spaces trimmed from every line, and on request coloured
//! modestly with ANSI sequences: headings bold, a view's hot shares red, losses yellow. Colour is
//! laid over the finished lines, so widths are counted on plain text and the plain report is
//! the same with or without it.

use std::fmt::Write;

const BOLD: &str = "\x1b[1m";
const HOT: &str = "\x1b[1;31m";
const WARNING: &str = "\x1b[33m";
const RESET: &str = "\x1b[0m";
/// A row's own share of the samples from which it is drawn hot, in percent.
const HOT_PERCENT: f64 = 10.0;
/// The heading of the loss counters, which follow it one a line, a count first.
const ACCOUNTING: &str = "Sample accounting:";

/// `text` with each line's trailing whitespace trimmed, coloured when `color`.
pub fn finish_text(text: &str, color: bool) -> String {
    let mut out = String::with_capacity(text.len());
    // The character column where the first `%` column of the current table ends.
    let mut percent_end: Option<usize> = None;
    let mut in_accounting = false;
    for line in text.lines() {
        let line = line.trim_end();
        if !color {
            let _ = writeln!(out, "{line}");
            continue;
        }
        if line.is_empty() {
            percent_end = None;
        }
        let indented = line.starts_with(' ');
        if !indented && !line.is_empty() {
            in_accounting = line == ACCOUNTING;
        }
        let header_percent = line.split_whitespace().any(|word| word == "%");
        if (!indented && !line.is_empty()) || (indented && line.ends_with(':')) {
            let _ = writeln!(out, "{BOLD}{line}{RESET}");
        } else if header_percent {
            percent_end = percent_column(line);
            let _ = writeln!(out, "{BOLD}{line}{RESET}");
        } else if in_accounting && line.trim_start().starts_with(|c: char| c.is_ascii_digit()) {
            let _ = writeln!(out, "{WARNING}{line}{RESET}");
        } else if let Some(end) = percent_end {
            let _ = writeln!(out, "{}", hot_share(line, end));
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// Where the first `%` header of a table's header line ends, in characters.
fn percent_column(header: &str) -> Option<usize> {
    let chars: Vec<char> = header.chars().collect();
    (0..chars.len()).find_map(|i| {
        let alone = chars[i] == '%'
            && i > 0
            && chars[i - 1] == ' '
            && chars.get(i + 1).is_none_or(|c| *c == ' ');
        alone.then_some(i + 1)
    })
}

/// A table row with its share (the number right-aligned to `end`) red when hot. A row starts
/// with a number; a note under the table (`(20 of 59 rows; …)`) does not.
fn hot_share(row: &str, end: usize) -> String {
    let chars: Vec<char> = row.chars().collect();
    if end > chars.len() || !row.trim_start().starts_with(|c: char| c.is_ascii_digit()) {
        return row.to_string();
    }
    let start = chars[..end]
        .iter()
        .rposition(|c| *c == ' ')
        .map_or(0, |i| i + 1);
    let share: String = chars[start..end].iter().collect();
    match share.parse::<f64>() {
        Ok(percent) if percent >= HOT_PERCENT => {
            let before: String = chars[..start].iter().collect();
            let after: String = chars[end..].iter().collect();
            format!("{before}{HOT}{share}{RESET}{after}")
        }
        _ => row.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "Profile of app   \n\
        \n\
        Event cpu-clock (1999 Hz), by function: 100 samples\n\
        \x20    self     %  sum% function\n\
        \x20      60  60.0  60.0 compute  \n\
        \x20       5   5.0  65.0 run\n\
        \x20 (2 of 90 rows; --top N shows more)\n\
        \n\
        Sample accounting:\n\
        \x20 cpu-clock: 100 fired in the kernel, 100 drained\n\
        \x20        3  user stacks lost\n";

    #[test]
    fn plain_text_is_trimmed_and_colour_marks_headings_hot_shares_and_losses() {
        let plain = finish_text(REPORT, false);
        assert!(plain.lines().all(|line| line == line.trim_end()), "{plain}");
        assert!(!plain.contains('\x1b'));
        assert_eq!(plain.lines().count(), REPORT.lines().count());

        let colored = finish_text(REPORT, true);
        let lines: Vec<&str> = colored.lines().collect();
        assert_eq!(lines[0], "\x1b[1mProfile of app\x1b[0m");
        assert!(lines[2].starts_with("\x1b[1mEvent cpu-clock"));
        assert_eq!(lines[4], "       60  \x1b[1;31m60.0\x1b[0m  60.0 compute");
        assert_eq!(lines[5], "        5   5.0  65.0 run", "5% is not hot");
        assert_eq!(lines[6], "  (2 of 90 rows; --top N shows more)");
        assert_eq!(lines[8], "\x1b[1mSample accounting:\x1b[0m");
        assert_eq!(
            lines[9],
            "  cpu-clock: 100 fired in the kernel, 100 drained"
        );
        assert_eq!(lines[10], "\x1b[33m         3  user stacks lost\x1b[0m");
        // Without the sequences, the coloured report is the plain one.
        let stripped = colored
            .replace(BOLD, "")
            .replace(HOT, "")
            .replace(WARNING, "")
            .replace(RESET, "");
        assert_eq!(stripped, plain);
    }
}
