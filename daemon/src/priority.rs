//! A job's priority within its tenant as users write it: `"10m"`, `"-5m"`, from
//! -1 day to +1 day. Pure; no messages. The priority is stored on the job
//! ([`crate::job::Job::priority_ms`]) and orders it among its tenant's ready jobs
//! ([`crate::job::Job::order_key`]); the fair choice between tenants ignores it.

use crate::job::PRIORITY_RANGE_MS;

/// Parses a priority: a duration (`"10m"`, `"1h 30m"`, `"0s"`) with an optional
/// sign (`"-5m"`), from -1 day to +1 day, into milliseconds. The error names the
/// field and what was wrong.
pub fn parse_priority(text: &str) -> Result<i64, String> {
    let trimmed = text.trim();
    let (negative, body) = match trimmed.as_bytes().first() {
        Some(b'-') => (true, &trimmed[1..]),
        Some(b'+') => (false, &trimmed[1..]),
        _ => (false, trimmed),
    };
    let duration = humantime::parse_duration(body.trim())
        .map_err(|e| format!("priority {text:?} is not a duration like \"10m\" or \"-5m\": {e}"))?;
    let ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
    let ms = if negative { -ms } else { ms };
    if !PRIORITY_RANGE_MS.contains(&ms) {
        return Err(format!(
            "priority {text:?} is out of range: it must be from -1d to 1d"
        ));
    }
    Ok(ms)
}

/// A priority as a user writes it: `"10m"`, `"-5m 30s"`, `"0s"`.
pub fn format_priority(ms: i64) -> String {
    let magnitude = humantime::format_duration(std::time::Duration::from_millis(ms.unsigned_abs()));
    match ms {
        0 => "0s".to_string(),
        ms if ms < 0 => format!("-{magnitude}"),
        _ => magnitude.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_priority_reads_as_a_signed_duration_within_a_day() {
        assert_eq!(parse_priority("10m"), Ok(600_000));
        assert_eq!(parse_priority("-5m"), Ok(-300_000));
        assert_eq!(parse_priority("+1s"), Ok(1_000));
        assert_eq!(parse_priority("0s"), Ok(0));
        assert_eq!(parse_priority("1day"), Ok(86_400_000));
        assert_eq!(parse_priority("-24h"), Ok(-86_400_000));
        for bad in [
            "",
            "-",
            "10",
            "ten minutes",
            "1day 1s",
            "-25h",
            "--5m",
            "1e9999h",
        ] {
            let err = parse_priority(bad).expect_err(bad);
            assert!(err.starts_with("priority "), "{bad}: {err}");
        }
    }

    #[test]
    fn a_priority_prints_back_as_it_parses() {
        for ms in [
            0,
            1_000,
            -300_000,
            600_000,
            86_400_000,
            -86_400_000,
            90_061_000 - 4_061_000,
        ] {
            assert_eq!(parse_priority(&format_priority(ms)), Ok(ms), "{ms}");
        }
    }
}
