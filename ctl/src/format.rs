//! Small formatting and parsing helpers for human output: ages (`3m12s`), sizes
//! (`1.2 MiB`), times (RFC 3339 UTC) and rates (`20/s`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An age or duration in seconds as its two largest units: `45s`, `3m12s`, `2h5m`,
/// `3d4h`. Negative or non-finite input shows as `0s`.
pub fn age(secs: f64) -> String {
    let total = if secs.is_finite() && secs > 0.0 {
        secs as u64
    } else {
        0
    };
    let (d, h, m, s) = (
        total / 86_400,
        total / 3600 % 24,
        total / 60 % 60,
        total % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

/// Seconds from Unix-ms `at` until `now_ms` (never negative).
pub fn secs_since(at_ms: i64, now_ms: i64) -> f64 {
    (now_ms.saturating_sub(at_ms)).max(0) as f64 / 1000.0
}

/// A byte count in binary units with one decimal: `512 B`, `1.2 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Unix ms as RFC 3339 UTC to the second (`2025-03-01T12:00:00Z`); `-` if negative.
pub fn time(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
        }
        Err(_) => "-".into(),
    }
}

/// Now, as Unix ms.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Parses a rate `N/s` (or plain `N`), jobs per second, within the daemon's bounds
/// ([`qd_proto::check_pace`]): a rate so small that the wait between batches cannot be
/// represented must be refused before anything moves, not panic after the first batch.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let number = text.strip_suffix("/s").unwrap_or(text).trim();
    match number.parse::<f64>() {
        Ok(r) if (qd_proto::MIN_REDRIVE_RATE..=qd_proto::MAX_REDRIVE_RATE).contains(&r) => Ok(r),
        _ => Err(format!(
            "{text:?} is not a rate; use a number of jobs per second from {} to {}, e.g. 20/s",
            qd_proto::MIN_REDRIVE_RATE,
            qd_proto::MAX_REDRIVE_RATE
        )),
    }
}

/// Text cut to at most `max` characters on one line (newlines become spaces), with `…`.
pub fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_show_their_two_largest_units() {
        assert_eq!(age(0.4), "0s");
        assert_eq!(age(45.0), "45s");
        assert_eq!(age(192.0), "3m12s");
        assert_eq!(age(7500.0), "2h5m");
        assert_eq!(age(273_600.0), "3d4h");
        assert_eq!(age(-5.0), "0s");
        assert_eq!(age(f64::NAN), "0s");
    }

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(1_258_291), "1.2 MiB");
        assert_eq!(bytes(5 * 1024 * 1024 * 1024), "5.0 GiB");
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
        assert_eq!(time(1_700_000_000_123), "2023-11-14T22:13:20Z");
        assert_eq!(time(-1), "-");
    }

    #[test]
    fn seconds_since_never_goes_negative() {
        assert_eq!(secs_since(1_000, 3_500), 2.5);
        assert_eq!(secs_since(5_000, 3_500), 0.0);
    }

    #[test]
    fn rates_parse_with_or_without_the_unit() {
        assert_eq!(parse_rate("20/s"), Ok(20.0));
        assert_eq!(parse_rate("0.5"), Ok(0.5));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("inf").is_err());
        assert!(parse_rate("1e-300/s").is_err(), "below the slowest pace");
        assert!(parse_rate("-5/s").is_err());
        assert_eq!(parse_rate("0.001/s"), Ok(0.001));
    }

    #[test]
    fn one_line_flattens_and_truncates() {
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("abcdefgh", 5), "abcd…");
    }
}
