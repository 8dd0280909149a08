//! Cumulative attempt counters per queue that the daemon itself can read back:
//! `qctl top` turns two readings into completed and failed per second.
//!
//! The Prometheus recorder keeps its counters write-only (the exporter renders them
//! for scrapes), so [`crate::metrics::attempt_finished`] also counts here, in the same
//! event: the two can never disagree. The counters live for the process (like every
//! Prometheus counter, they restart at 0 with the daemon).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::job::Outcome;

/// Attempts of one queue since the daemon started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttemptTotals {
    /// Attempts that succeeded.
    pub completed: u64,
    /// Charged attempts that did not succeed (failed, permanent, timed out, lease
    /// expired, worker crashed).
    pub failed: u64,
}

static TOTALS: Mutex<Option<HashMap<String, AttemptTotals>>> = Mutex::new(None);

/// Counts one finished attempt of `queue`; outcomes that are not charged
/// (interrupted, throttled, operator events) are not counted.
pub(super) fn count(queue: &str, outcome: Outcome) {
    if !outcome.is_charged() {
        return;
    }
    let mut guard = TOTALS.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = guard
        .get_or_insert_with(HashMap::new)
        .entry(queue.to_owned())
        .or_default();
    if outcome == Outcome::Succeeded {
        entry.completed += 1;
    } else {
        entry.failed += 1;
    }
}

/// The totals of `queue` so far (zero when it has finished no attempt).
pub fn attempt_totals(queue: &str) -> AttemptTotals {
    let guard = TOTALS.lock().unwrap_or_else(PoisonError::into_inner);
    guard
        .as_ref()
        .and_then(|m| m.get(queue).copied())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successes_and_charged_failures_are_counted_apart_and_events_not_at_all() {
        let q = "totals-test-queue";
        for outcome in [
            Outcome::Succeeded,
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::LeaseExpired,
            Outcome::Throttled,
            Outcome::Interrupted,
            Outcome::Redriven,
        ] {
            count(q, outcome);
        }
        assert_eq!(
            attempt_totals(q),
            AttemptTotals {
                completed: 2,
                failed: 2
            }
        );
        assert_eq!(attempt_totals("never-seen"), AttemptTotals::default());
    }
}
