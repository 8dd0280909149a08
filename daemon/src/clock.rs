//! Time sources. Wall time (Unix milliseconds) is what qd stores and shows; live
//! leases and delays are timed on tokio's monotonic clock, so a wall-clock jump
//! neither expires a live lease nor freezes a delayed job.
//!
//! [`wall_ms`] reads the system clock. `QD_TEST_WALL_OFFSET_MS` (test hook, read once)
//! shifts it, so tests can jump the wall clock of a running daemon without libfaketime.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::job::UnixMillis;

/// Milliseconds since the Unix epoch, now (plus the test offset, if set).
pub fn wall_ms() -> UnixMillis {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX) + offset_ms()
}

fn offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var("QD_TEST_WALL_OFFSET_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// Converts a stored wall time into a delay from `now` (zero if it has passed).
pub fn until(at: UnixMillis, now: UnixMillis) -> Duration {
    Duration::from_millis(u64::try_from(at.saturating_sub(now)).unwrap_or(0))
}
