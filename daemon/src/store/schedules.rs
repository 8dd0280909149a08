//! The durable state of schedules (periodic jobs): one row per schedule with its
//! next tick, its last run and whether an operator paused it. What makes a tick
//! fire once: the Periodic actor advances the next tick with a compare-and-set
//! ([`super::Backend::advance_schedule`]) in the same store operation, and so the
//! same commit, as the enqueue of the tick's job; a writer whose expected next
//! tick is no longer stored (a deposed leader, a stale retry) changes nothing.
//!
//! Table (SQLite `schedules`, PostgreSQL `qd_schedules`):
//! ```text
//! schedules(name TEXT PK, spec TEXT, next_tick INTEGER NULL, last_tick INTEGER NULL,
//!           last_job BLOB(16)/uuid NULL, paused INTEGER/boolean, updated_at INTEGER)
//! ```
//! Times are Unix ms. `spec` is [`crate::schedule::Timing::describe`] of the
//! config the next tick was computed for: a changed spec is recomputed, not caught
//! up. A row outlives its schedule's removal from the config (a re-added schedule
//! keeps its pause); rows are small and few.

use crate::job::{JobId, UnixMillis};

/// One schedule's stored state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleRow {
    /// The schedule's name.
    pub name: String,
    /// The spec its next tick was computed for (empty until the first advance).
    pub spec: String,
    /// The next tick to fire (`None` until computed, or when it never comes).
    pub next_tick: Option<UnixMillis>,
    /// The tick of the last run (a trigger's time for a manual run).
    pub last_tick: Option<UnixMillis>,
    /// The job of the last run.
    pub last_job: Option<JobId>,
    /// Paused by an operator (`qctl schedules pause`): no tick fires.
    pub paused: bool,
    /// When the row last changed.
    pub updated_at: UnixMillis,
}

impl ScheduleRow {
    /// A row as first written for `name`: nothing computed, not paused.
    pub fn new(name: &str, now: UnixMillis) -> Self {
        ScheduleRow {
            name: name.to_owned(),
            spec: String::new(),
            next_tick: None,
            last_tick: None,
            last_job: None,
            paused: false,
            updated_at: now,
        }
    }
}

/// A compare-and-set of a schedule's next tick ([`super::Backend::advance_schedule`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advance {
    /// The schedule.
    pub name: String,
    /// The spec `next` was computed for.
    pub spec: String,
    /// The next tick the writer read: the write applies only if it is still the
    /// stored one (`None`: no row, or a row without a next tick).
    pub expect: Option<UnixMillis>,
    /// The new next tick.
    pub next: Option<UnixMillis>,
    /// Now (the row's `updated_at`).
    pub now: UnixMillis,
}
