//! Units in config values: humantime durations (`"30s"`, `"5m"`, `"250ms"`),
//! byte sizes (`1048576`, `"1MiB"`, `"512KiB"`), octal file modes (`"0660"`) and
//! the name syntax shared by queues and tenants.
//!
//! Each value type has a serde impl whose error says what was wrong and what a
//! good value looks like; the TOML deserializer attaches the value's span.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};

/// A duration written as a humantime string ("30s", "5m", "1h 30m", "250ms").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dur(pub Duration);

/// A size in bytes, written as a non-negative integer or a string with a unit
/// ("1MiB", "512KiB", "10MB").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Size(pub u64);

/// The longest duration a config value may give: 100 years (humantime's `"100y"`).
/// Anything longer means "never" in practice, and values near `u64::MAX` seconds
/// overflow monotonic-clock arithmetic (a lease deadline is `now + lease`).
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3_155_760_000);

/// Parses a humantime duration of at most [`MAX_DURATION`], with an error that shows
/// good examples.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        format!("invalid duration {text:?}: {e} (write e.g. \"30s\", \"5m\", \"250ms\")")
    })?;
    if d > MAX_DURATION {
        return Err(format!("duration {text:?} is too long: at most \"100y\""));
    }
    Ok(d)
}

/// Binary (IEC, 1024^n) and decimal (SI, 1000^n) units, matched case-insensitively.
const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
];

/// Parses "1MiB", "512 KiB", "10MB" or "4096" into bytes. Only whole numbers.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "invalid size {text:?}: expected a whole number of bytes or a number with a unit, \
             e.g. \"1MiB\", \"512KiB\", \"10MB\""
        ));
    }
    let unit = unit.trim();
    let multiplier = SIZE_UNITS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
        .map(|(_, m)| *m)
        .ok_or_else(|| {
            format!(
                "invalid size {text:?}: unknown unit {unit:?} \
                 (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
            )
        })?;
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("invalid size {text:?}: too large"))
}

/// Parses an octal file mode such as "0660" or "660" (at most 0o7777).
pub(crate) fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.trim().trim_start_matches("0o");
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|m| !digits.is_empty() && *m <= 0o7777)
        .ok_or_else(|| {
            format!("invalid file mode {text:?}: expected an octal string like \"0660\"")
        })
}

/// Whether `name` is a valid queue or tenant name: `[A-Za-z0-9_.-]{1,64}`.
pub(crate) fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl<'de> serde::Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurVisitor;
        impl Visitor<'_> for DurVisitor {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string like \"30s\", \"5m\" or \"250ms\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dur, E> {
                parse_duration(v).map(Dur).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(DurVisitor)
    }
}

impl<'de> serde::Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes, or a string like \"1MiB\" or \"512KiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Size, E> {
                parse_size(v).map(Size).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_bytes_and_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 * 1024));
        assert_eq!(parse_size("10mb"), Ok(10_000_000));
        assert_eq!(parse_size("7B"), Ok(7));
    }

    #[test]
    fn sizes_reject_garbage_units_fractions_and_overflow() {
        for bad in [
            "",
            "MiB",
            "1.5MiB",
            "12XB",
            "-1",
            "1 M i B",
            "99999999999TiB",
        ] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.starts_with("invalid size"), "{bad}: {err}");
        }
    }

    #[test]
    fn durations_use_humantime_and_explain_failures() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        let err = parse_duration("soon").expect_err("garbage");
        assert!(err.contains("\"30s\""), "{err}");
    }

    #[test]
    fn durations_past_a_century_are_refused_so_timers_cannot_overflow() {
        assert!(parse_duration("100y").is_ok());
        let err = parse_duration("500000000000y").expect_err("huge");
        assert!(err.contains("at most"), "{err}");
    }

    #[test]
    fn modes_are_octal_strings() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("").is_err());
        assert!(parse_mode("77777").is_err());
    }

    #[test]
    fn names_are_short_and_limited_to_a_safe_alphabet() {
        assert!(is_valid_name("email.v2_eu-1"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("has space"));
        assert!(!is_valid_name("ünïcode"));
        assert!(!is_valid_name(&"x".repeat(65)));
        assert!(is_valid_name(&"x".repeat(64)));
    }
}
