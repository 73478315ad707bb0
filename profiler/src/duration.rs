//! Durations as every option takes them: a number with a unit (`500us`, `2ms`, `1.5s`, `2m`,
//! `1h`), or a bare number in the option's own unit (seconds for `--duration`, as before units
//! were taken). One parser, so that no option refuses a unit another takes.

use std::time::Duration;

/// The unit a bare number is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BareUnit {
    Nanoseconds,
    Milliseconds,
    Seconds,
}

impl BareUnit {
    fn name(self) -> &'static str {
        match self {
            BareUnit::Nanoseconds => "nanoseconds",
            BareUnit::Milliseconds => "milliseconds",
            BareUnit::Seconds => "seconds",
        }
    }

    fn example(self) -> &'static str {
        match self {
            BareUnit::Nanoseconds => "500us",
            BareUnit::Milliseconds => "250ms",
            BareUnit::Seconds => "1s",
        }
    }
}

/// A duration: a number with `ns`, `us`, `ms`, `s`, `m` or `h`, or a bare number in
/// `bare`. The error says what to write instead (clap prints it after the option's name).
pub fn parse_duration(text: &str, bare: BareUnit) -> Result<Duration, String> {
    let text = text.trim();
    if text.starts_with('-') {
        return Err(format!("give a time above 0, e.g. {}", bare.example()));
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let seconds_per_unit = match unit.trim() {
        "" => match bare {
            BareUnit::Nanoseconds => 1e-9,
            BareUnit::Milliseconds => 1e-3,
            BareUnit::Seconds => 1.0,
        },
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown unit '{other}': give a number with ns, us, ms, s, m or h (e.g. {}), or a \
                 bare number of {}",
                bare.example(),
                bare.name()
            ))
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        format!(
            "give a time such as {} (a bare number is {})",
            bare.example(),
            bare.name()
        )
    })?;
    Duration::try_from_secs_f64(value * seconds_per_unit)
        .map_err(|_| "too long: give at most about 5e11 seconds".to_string())
}

/// A duration above 0, for an option that waits that long.
fn positive(text: &str, bare: BareUnit) -> Result<Duration, String> {
    match parse_duration(text, bare)? {
        Duration::ZERO => Err(format!("give a time above 0, e.g. {}", bare.example())),
        duration => Ok(duration),
    }
}

/// `--duration`, `--interval`: a bare number is seconds.
pub fn seconds(text: &str) -> Result<Duration, String> {
    positive(text, BareUnit::Seconds)
}

/// `--drain-interval`: a bare number is milliseconds.
pub fn milliseconds(text: &str) -> Result<Duration, String> {
    positive(text, BareUnit::Milliseconds)
}

/// `--off-cpu-min`: a bare number is nanoseconds; 0 keeps every block's stacks.
pub fn nanoseconds(text: &str) -> Result<Duration, String> {
    parse_duration(text, BareUnit::Nanoseconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_numbers() {
        assert_eq!(seconds("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(seconds("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(seconds("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(seconds("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(milliseconds("250"), Ok(Duration::from_millis(250)));
        assert_eq!(milliseconds("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(nanoseconds("1500"), Ok(Duration::from_nanos(1500)));
        assert_eq!(nanoseconds("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(nanoseconds("2.5ms"), Ok(Duration::from_micros(2500)));
        assert_eq!(nanoseconds("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_times_say_what_to_write() {
        for (text, says) in [
            ("3 minutes", "unknown unit 'minutes'"),
            ("ms", "give a time such as 1s"),
            ("0", "above 0"),
            ("0ms", "above 0"),
            ("-1", "above 0"),
            ("inf", "unknown unit 'inf'"),
            ("nan", "unknown unit 'nan'"),
            ("1e300", "unknown unit 'e300'"),
            ("99999999999999999999h", "too long"),
            ("", "give a time such as 1s"),
        ] {
            let error = seconds(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
