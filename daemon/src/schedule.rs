//! Schedules' pure core: when a schedule's ticks come, when each one fires, and
//! what to do with the ticks that came while nobody fired them. No I/O, no clock:
//! every function takes the instant it reasons about, so tests inject time.
//!
//! - A **tick** is a nominal instant of a schedule (Unix ms, UTC): a match of its
//!   cron expression in its time zone, or a multiple of its `every` interval since
//!   the Unix epoch (so every node and every run of qd agrees on the ticks). Cron
//!   expressions are parsed and evaluated by `croner` (5 fields, or 6 with seconds
//!   first), which handles daylight-saving time as Vixie cron does: a fixed time in
//!   the spring-forward gap fires once, right after the gap; a fixed time in the
//!   repeated autumn hour fires once, at its first pass.
//! - A tick **fires** at the tick plus its jitter offset, a deterministic function
//!   of (schedule, tick) in `[0, jitter)` ([`jitter_offset`]): every node computes
//!   the same instant, and a restart does not move it.
//! - The job a tick enqueues carries the idempotency key `schedule:NAME:TICK`
//!   ([`idempotency_key`], TICK in RFC 3339 UTC), so a tick enqueued twice (by a
//!   deposed leader, or a retried write) is stored once.
//! - When more than one tick is due at once (after downtime, a lost leader, a
//!   store that refused writes), [`plan`] applies the schedule's [`CatchUp`] and
//!   counts the ticks it leaves out as missed.
//!
//! The Periodic actor (`periodic.rs`) owns the firing; this module decides.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use sha2::{Digest, Sha256};

use crate::job::UnixMillis;

#[cfg(test)]
mod tests;

/// The prefix of the idempotency key of every job a schedule enqueues; producers
/// may not use it, so a job's schedule and tick can be read back from its key.
pub const KEY_PREFIX: &str = "schedule:";

/// The default of `max_catch_up`.
pub const DEFAULT_MAX_CATCH_UP: u32 = 10;

/// The most due ticks [`plan`] walks through one by one; past it (a per-second
/// schedule down for more than a day) the rest are counted without being listed.
const WALK_LIMIT: u64 = 100_000;

/// When a schedule's ticks come.
#[derive(Clone, Debug)]
pub enum Spec {
    /// A cron expression, evaluated in the schedule's time zone.
    Cron(Box<Cron>),
    /// A fixed interval, ticks at its multiples since the Unix epoch.
    Every(Duration),
}

impl PartialEq for Spec {
    fn eq(&self, other: &Spec) -> bool {
        match (self, other) {
            (Spec::Cron(a), Spec::Cron(b)) => a.pattern.to_string() == b.pattern.to_string(),
            (Spec::Every(a), Spec::Every(b)) => a == b,
            _ => false,
        }
    }
}

/// Parses a cron expression: 5 fields (minute first) or 6 (seconds first), or a
/// nickname such as `@daily`. Errors: croner's reason, or a wrong field count.
pub fn parse_cron(text: &str) -> Result<Cron, String> {
    let fields = text.split_whitespace().count();
    if !text.trim_start().starts_with('@') && !(5..=6).contains(&fields) {
        return Err(format!(
            "cron expression {text:?} has {fields} fields; expected 5 (minute hour day month weekday) \
             or 6 (seconds first)"
        ));
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(text)
        .map_err(|e| format!("invalid cron expression {text:?}: {e}"))
}

/// Parses an IANA time zone name (`Europe/Berlin`, `UTC`).
pub fn parse_timezone(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>()
        .map_err(|_| format!("unknown time zone {name:?} (expected an IANA name such as \"Europe/Berlin\" or \"UTC\")"))
}

/// A schedule's ticks and the offset each one fires at.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Cron or interval.
    pub spec: Spec,
    /// The zone cron expressions are read in (intervals ignore it).
    pub tz: Tz,
    /// Each tick fires at a deterministic offset in `[0, jitter)`.
    pub jitter: Duration,
}

impl Timing {
    /// The first tick strictly after `after`, or `None` when the expression never
    /// matches again (a date that does not come before croner's year 5000 limit).
    pub fn next_tick(&self, after: UnixMillis) -> Option<UnixMillis> {
        match &self.spec {
            Spec::Every(every) => {
                let step = i64::try_from(every.as_millis()).unwrap_or(i64::MAX).max(1);
                after.div_euclid(step).checked_add(1)?.checked_mul(step)
            }
            Spec::Cron(cron) => {
                // Ticks are whole seconds: start from the second `after` is in, so a
                // tick at that second (which is not after `after`) is skipped.
                let start = self.tz.timestamp_millis_opt(after.div_euclid(1000) * 1000);
                let start = start.single()?;
                let next = cron.find_next_occurrence(&start, false).ok()?;
                Some(next.timestamp_millis())
            }
        }
    }

    /// The text stored with a schedule's state: a stored next tick computed for
    /// another text is recomputed, not caught up (the spec changed).
    pub fn describe(&self) -> String {
        match &self.spec {
            Spec::Cron(cron) => format!("cron {} {}", cron.pattern, self.tz.name()),
            Spec::Every(every) => format!("every {}", humantime::format_duration(*every)),
        }
    }

    /// When `tick` of schedule `name` fires: the tick plus its jitter offset.
    pub fn fire_at(&self, name: &str, tick: UnixMillis) -> UnixMillis {
        tick.saturating_add(jitter_offset(name, tick, self.jitter))
    }
}

/// The fire offset of `tick` of schedule `name`, in `[0, jitter)` ms (0 without
/// jitter): the first 8 bytes of SHA-256 over the name and the tick, modulo the
/// jitter. Stable across nodes, restarts and releases.
pub fn jitter_offset(name: &str, tick: UnixMillis, jitter: Duration) -> i64 {
    let span = u64::try_from(jitter.as_millis()).unwrap_or(u64::MAX);
    if span == 0 {
        return 0;
    }
    let mut hash = Sha256::new();
    hash.update(name.as_bytes());
    hash.update([0]);
    hash.update(tick.to_be_bytes());
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::try_from(u64::from_be_bytes(first) % span).unwrap_or(0)
}

/// `tick` as RFC 3339 UTC with millisecond precision only where it has any:
/// `2026-03-29T01:00:00Z`.
pub fn tick_text(tick: UnixMillis) -> String {
    let at: DateTime<Utc> = Utc
        .timestamp_millis_opt(tick)
        .single()
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The idempotency key of the job `tick` of schedule `name` enqueues.
pub fn idempotency_key(name: &str, tick: UnixMillis) -> String {
    format!("{KEY_PREFIX}{name}:{}", tick_text(tick))
}

/// The schedule name and tick (as written) of a job, read back from its
/// idempotency key; `None` for a job no schedule enqueued.
pub fn from_key(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix(KEY_PREFIX)?;
    // A schedule name has no ':' (config names are [A-Za-z0-9_.-]).
    rest.split_once(':')
}

/// The schedule and tick a job was enqueued for, as leases and `GET /v1/jobs/{id}`
/// show it: `"schedule": {"name": "nightly", "tick": "2026-03-29T01:00:00Z"}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JobSchedule {
    /// The schedule's name.
    pub name: String,
    /// The tick, RFC 3339 UTC.
    pub tick: String,
}

impl JobSchedule {
    /// The schedule of the job with idempotency key `key`, if a schedule enqueued it.
    pub fn of_key(key: &str) -> Option<JobSchedule> {
        from_key(key).map(|(name, tick)| JobSchedule {
            name: name.to_owned(),
            tick: tick.to_owned(),
        })
    }
}

/// What to do with ticks that came while nobody fired them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    /// One run, for the newest of them (the default).
    Latest,
    /// No run; they are counted as missed.
    None,
    /// One run each, for at most the newest `max` of them, oldest first.
    All {
        /// `max_catch_up` (default 10).
        max: u32,
    },
}

/// Whether a schedule starts a run while its previous one is unfinished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Always (the default).
    #[default]
    Allow,
    /// Not while the job of its previous run is waiting or running: the tick is
    /// counted `skipped_overlap`.
    Skip,
}

impl Overlap {
    /// Whether a tick runs, given whether the previous run's job is unfinished.
    pub fn allows(self, previous_unfinished: bool) -> bool {
        self == Overlap::Allow || !previous_unfinished
    }
}

/// How a planned run counts in `qd_schedule_fires_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FireKind {
    /// The one tick due, on time.
    OnTime,
    /// A run for ticks that came while nobody fired them.
    CaughtUp,
}

/// What [`plan`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The ticks to fire now, oldest first.
    pub fire: Vec<(UnixMillis, FireKind)>,
    /// Due ticks that will never run.
    pub missed: u64,
    /// The first tick after every due one: the stored next tick once the runs
    /// are written (`None`: the expression never matches again).
    pub next: Option<UnixMillis>,
}

/// Decides what schedule `name` does at `now` when its stored next tick is
/// `from`: the due ticks are `from` and the ticks after it whose fire time
/// ([`Timing::fire_at`]) is at or before `now`. One due tick fires on time; more
/// than one means nobody fired them when they came, and `catch_up` decides
/// (every due tick left out is missed). Nothing is due: no run, `next` = `from`.
pub fn plan(
    timing: &Timing,
    name: &str,
    catch_up: CatchUp,
    from: UnixMillis,
    now: UnixMillis,
) -> Plan {
    let keep = match catch_up {
        CatchUp::Latest => 1,
        CatchUp::None => 0,
        CatchUp::All { max } => u64::from(max),
    };
    let mut newest: std::collections::VecDeque<UnixMillis> = std::collections::VecDeque::new();
    let mut due = 0u64;
    let mut tick = Some(from);
    while let Some(t) = tick {
        if timing.fire_at(name, t) > now {
            break;
        }
        due += 1;
        newest.push_back(t);
        if newest.len() as u64 > keep.max(1) {
            newest.pop_front();
        }
        tick = timing.next_tick(t);
        if due >= WALK_LIMIT {
            // Count the rest without listing them: the next tick after `now`.
            let rest = timing.next_tick(now);
            due += count_between(timing, tick, rest);
            tick = rest;
            break;
        }
    }
    if due <= 1 {
        let fire = newest.into_iter().map(|t| (t, FireKind::OnTime)).collect();
        return Plan {
            fire,
            missed: 0,
            next: tick,
        };
    }
    if keep == 0 {
        newest.clear();
    }
    let fire: Vec<_> = newest
        .into_iter()
        .map(|t| (t, FireKind::CaughtUp))
        .collect();
    Plan {
        missed: due - fire.len() as u64,
        fire,
        next: tick,
    }
}

/// Ticks in `[from, until)`: exact for intervals, walked (capped) for cron.
fn count_between(timing: &Timing, from: Option<UnixMillis>, until: Option<UnixMillis>) -> u64 {
    let (Some(from), Some(until)) = (from, until) else {
        return 0;
    };
    if until <= from {
        return 0;
    }
    match &timing.spec {
        Spec::Every(every) => {
            let step = i64::try_from(every.as_millis()).unwrap_or(i64::MAX).max(1);
            u64::try_from((until - from) / step).unwrap_or(0)
        }
        Spec::Cron(_) => {
            let mut n = 0;
            let mut t = Some(from);
            while let Some(at) = t.filter(|at| *at < until) {
                n += 1;
                if n >= WALK_LIMIT {
                    break;
                }
                t = timing.next_tick(at);
            }
            n
        }
    }
}
