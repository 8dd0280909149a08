//! Logging of an error that repeats (a store that refuses every write, a hung
//! database) at most once per interval, with the count of the occurrences not
//! logged in between, so an outage writes a few lines, not one per call. Takes no
//! messages: each call site owns a `static` [`Every`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a repeated store error is logged at most.
pub const STORE_ERRORS: Duration = Duration::from_secs(10);

/// One call site's log limiter.
pub struct Every {
    every: Duration,
    /// When the last logged occurrence was, and how many were left out since.
    state: Mutex<Option<(Instant, u64)>>,
}

impl Every {
    /// A limiter logging at most once per `every`.
    pub const fn new(every: Duration) -> Self {
        Every {
            every,
            state: Mutex::new(None),
        }
    }

    /// Counts one occurrence; `Some(left_out)` when this one is to be logged
    /// (`left_out` occurrences since the last logged one were not), else `None`.
    pub fn due(&self) -> Option<u64> {
        self.due_at(Instant::now())
    }

    fn due_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *state {
            Some((last, left_out)) if now.saturating_duration_since(*last) < self.every => {
                *left_out += 1;
                None
            }
            slot => {
                let left_out = slot.map_or(0, |(_, n)| n);
                *slot = Some((now, 0));
                Some(left_out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_first_then_once_per_interval_with_the_count_left_out() {
        let every = Every::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(every.due_at(t0), Some(0));
        assert_eq!(every.due_at(t0 + Duration::from_secs(1)), None);
        assert_eq!(every.due_at(t0 + Duration::from_secs(9)), None);
        assert_eq!(every.due_at(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(every.due_at(t0 + Duration::from_secs(11)), None);
        assert_eq!(every.due_at(t0 + Duration::from_secs(30)), Some(1));
    }
}
