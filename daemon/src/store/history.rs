//! The history cap: how much of a job's attempt history the store keeps.
//!
//! A job may be attempted up to 1,000 times per life and redriven any number of
//! times; storing every entry in full made a poison job's `GET /v1/jobs/{id}` grow
//! to megabytes. The rule, applied by both engines right after each append:
//! - keep the first [`HistoryLimits::keep_first`] entries (how the trouble began) and
//!   the last [`HistoryLimits::keep_last`] (what happens now), delete those between;
//! - store at most [`HistoryLimits::max_error`] bytes of each entry's error text,
//!   keeping its head and tail around a marker that says how much was cut.
//!
//! Entries are numbered `seq` 1, 2, ... per job and the newest is always kept, so the
//! numbering never restarts: the entries elided are the gaps in `seq`, counted on
//! read ([`elided`]) and shown as `history_elided` by the API and qctl.
//!
//! The rule is pure ([`doomed`], [`bound_error`], [`elided`]) and engine-neutral:
//! the memory engine applies it as is, the SQL engines spell [`doomed`] in the
//! `DELETE` that follows each history insert (`store/sqlite.rs`,
//! `store/postgres/jobs.rs`), and the conformance suite holds all of them to the
//! same kept entries. Takes no messages.

use std::borrow::Cow;

use crate::job::HistoryEntry;

pub use crate::config::{HistoryLimits, MIN_MAX_ERROR};

/// After appending entry `newest` (its `seq`), the `seq` range (inclusive) to delete,
/// if any: everything after the first `keep_first` and before the last `keep_last`.
pub fn doomed(limits: &HistoryLimits, newest: u64) -> Option<(u64, u64)> {
    let from = u64::from(limits.keep_first) + 1;
    let to = newest.checked_sub(u64::from(limits.keep_last.max(1)))?;
    (from <= to).then_some((from, to))
}

/// `text` cut to at most `max` bytes (UTF-8 safe): its first quarter, a marker
/// naming how many bytes were cut, and its end (where a stderr tail ends). Text
/// within `max` is returned as is.
pub fn bound_error(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let marker = |cut: usize| format!(" [... {cut} bytes cut ...] ");
    let budget = max.saturating_sub(marker(text.len()).len());
    let head = floor_boundary(text, budget / 4);
    let tail = ceil_boundary(text, text.len() - (budget - budget / 4));
    Cow::Owned(format!(
        "{}{}{}",
        &text[..head],
        marker(tail - head),
        &text[tail..]
    ))
}

/// `entry` with its error text bounded by `limits.max_error`.
pub fn bounded<'a>(entry: &'a HistoryEntry, limits: &HistoryLimits) -> Cow<'a, HistoryEntry> {
    match entry
        .error
        .as_deref()
        .map(|e| bound_error(e, limits.max_error))
    {
        Some(Cow::Owned(error)) => Cow::Owned(HistoryEntry {
            error: Some(error),
            ..entry.clone()
        }),
        _ => Cow::Borrowed(entry),
    }
}

/// How many entries are missing from the kept `seqs` (ascending, from 1) and where
/// the first gap is: `(elided, at)`, `at` being the number of kept entries before it
/// (`seqs.len()` when nothing is missing).
pub fn elided(seqs: &[u64]) -> (u64, usize) {
    let newest = seqs.last().copied().unwrap_or(0);
    let at = (1..)
        .zip(seqs)
        .position(|(want, seq)| want != *seq)
        .unwrap_or(seqs.len());
    (newest - seqs.len() as u64, at)
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: HistoryLimits = HistoryLimits {
        keep_first: 5,
        keep_last: 20,
        max_error: 100,
    };

    #[test]
    fn a_thousand_appends_keep_the_first_five_and_the_last_twenty() {
        let mut kept: Vec<u64> = Vec::new();
        for seq in 1..=1000 {
            kept.push(seq);
            if let Some((from, to)) = doomed(&CAP, seq) {
                kept.retain(|s| *s < from || *s > to);
            }
        }
        let expected: Vec<u64> = (1..=5).chain(981..=1000).collect();
        assert_eq!(kept, expected);
        assert_eq!(elided(&kept), (975, 5));
    }

    #[test]
    fn nothing_is_elided_until_the_history_outgrows_the_cap() {
        assert_eq!(doomed(&CAP, 25), None);
        assert_eq!(doomed(&CAP, 26), Some((6, 6)));
        let all: Vec<u64> = (1..=25).collect();
        assert_eq!(elided(&all), (0, 25));
        assert_eq!(elided(&[]), (0, 0));
        let first_zero = HistoryLimits {
            keep_first: 0,
            keep_last: 1,
            ..CAP
        };
        assert_eq!(doomed(&first_zero, 1), None);
        assert_eq!(doomed(&first_zero, 3), Some((1, 2)));
        assert_eq!(elided(&[3]), (2, 0));
    }

    #[test]
    fn long_errors_keep_head_and_tail_within_the_cap() {
        let text = format!("exit status 1: {}END", "é".repeat(3000));
        let cut = bound_error(&text, CAP.max_error);
        assert!(cut.len() <= CAP.max_error, "{} bytes: {cut}", cut.len());
        assert!(cut.starts_with("exit status"), "{cut}");
        assert!(cut.ends_with("END"), "{cut}");
        assert!(cut.contains("bytes cut"), "{cut}");
        assert_eq!(bound_error("short", CAP.max_error), "short");
        let smallest = bound_error(&text, MIN_MAX_ERROR);
        assert!(smallest.len() <= MIN_MAX_ERROR, "{smallest}");
    }
}
