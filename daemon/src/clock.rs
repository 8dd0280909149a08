//! Time sources. Wall time (Unix milliseconds) is what qd stores and shows; live
//! leases and delays are timed on tokio's monotonic clock, so a wall-clock jump
//! neither expires a live lease nor freezes a delayed job.
//!
//! [`wall_ms`] reads the system clock, shifted by two test hooks (no libfaketime
//! needed):
//! - `QD_TEST_WALL_OFFSET_MS` (milliseconds, read once at start): a restart with a
//!   large offset simulates a jump between two runs of qd;
//! - `QD_TEST_WALL_OFFSET_FILE` (a path, read once): the file holds an offset in
//!   milliseconds that is re-read at most every [`OFFSET_FILE_REFRESH`], so a test can
//!   jump the wall clock of a live daemon by rewriting it. A missing or unparsable
//!   file counts as 0. Unset (production), the cost is one atomic load.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::job::UnixMillis;

/// How often the `QD_TEST_WALL_OFFSET_FILE` offset is re-read, at most.
pub const OFFSET_FILE_REFRESH: Duration = Duration::from_millis(100);

/// Milliseconds since the Unix epoch, now (plus the test offsets, if set).
pub fn wall_ms() -> UnixMillis {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let offset = fixed_offset_ms().saturating_add(file_offset_ms());
    i64::try_from(since.as_millis())
        .unwrap_or(i64::MAX)
        .saturating_add(offset)
}

fn fixed_offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var("QD_TEST_WALL_OFFSET_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// The live offset from `QD_TEST_WALL_OFFSET_FILE`: cached value plus when it was read.
struct OffsetFile {
    path: PathBuf,
    value: AtomicI64,
    read_at: Mutex<Option<Instant>>,
}

fn file_offset_ms() -> i64 {
    static FILE: OnceLock<Option<OffsetFile>> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        std::env::var_os("QD_TEST_WALL_OFFSET_FILE").map(|path| OffsetFile {
            path: PathBuf::from(path),
            value: AtomicI64::new(0),
            read_at: Mutex::new(None),
        })
    });
    let Some(file) = file else {
        return 0;
    };
    if let Ok(mut read_at) = file.read_at.try_lock() {
        let stale = read_at.is_none_or(|at| at.elapsed() >= OFFSET_FILE_REFRESH);
        if stale {
            let value = std::fs::read_to_string(&file.path)
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(0);
            file.value.store(value, Ordering::Relaxed);
            *read_at = Some(Instant::now());
        }
    }
    file.value.load(Ordering::Relaxed)
}

/// Converts a stored wall time into a delay from `now` (zero if it has passed).
pub fn until(at: UnixMillis, now: UnixMillis) -> Duration {
    Duration::from_millis(u64::try_from(at.saturating_sub(now)).unwrap_or(0))
}
