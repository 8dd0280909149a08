//! The job record and its life cycle: one enum of states, one transition function.
//!
//! This module is the pure core of qd. It owns no I/O, no clock and no randomness:
//! callers pass the time (`now`, Unix milliseconds) and the jitter sample in, so
//! every transition is deterministic and property-testable.
//!
//! ```text
//!   waiting/blocked --last parent final (deps.rs)--> ready/delayed
//!   delayed --due--> ready --lease--> leased --ack--> succeeded
//!      ^               ^               |
//!      |  backoff      | interrupted   | fail (transient, timeout, lease expired, crash)
//!      +---------------+---------------+   budget left -> delayed
//!                                      |   budget spent or permanent -> dead --redrive--> ready
//! ```
//!
//! Attempts are *charged* when an attempt ends with a failure or success. An attempt
//! cut short by a graceful shutdown ("interrupted") or answered "throttled" by a
//! downstream is not charged: a deploy or a rate limit must never dead-letter a job.
//! `attempts` never decreases; a redrive gives a fresh budget by moving
//! `budget_start` up to `attempts`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::backoff::Backoff;

/// Wall-clock time in milliseconds since the Unix epoch. Persisted and shown to users;
/// never used to time a live lease (leases use the monotonic clock).
pub type UnixMillis = i64;

/// A job's id: a UUIDv7 (RFC 9562), so ids sort by creation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub Uuid);

impl JobId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        JobId(Uuid::now_v7())
    }
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for JobId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(JobId)
    }
}

/// The fencing token of a lease: the job's lease sequence number. Every ack, nack and
/// heartbeat must present the token of the job's current lease; an older token means
/// the lease was lost (expired and handed to another worker) and is refused.
pub type Token = u64;

/// Where a job is in its life cycle. Stored as the lowercase name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Waiting for `ready_at` (a requested delay or a retry backoff).
    Delayed,
    /// Waiting for a worker.
    Ready,
    /// Held by a worker under a lease.
    Leased,
    /// Acked; kept for `retention`, then pruned.
    Succeeded,
    /// In the dead-letter queue: budget spent or permanent error.
    Dead,
    /// Removed by an operator; kept for `retention`, then pruned.
    Cancelled,
    /// Waits for a parent named in `after` to reach a final state (`deps.rs`). Not
    /// leasable; counts toward `max_depth`.
    Waiting,
    /// A parent named in `after` died or was cancelled (`deps.rs`): waits for a
    /// redrive of the parent or an operator's release. Not leasable; counts toward
    /// `max_depth`.
    Blocked,
}

impl State {
    /// The stored and displayed name (`"ready"`, `"dead"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Delayed => "delayed",
            State::Ready => "ready",
            State::Leased => "leased",
            State::Succeeded => "succeeded",
            State::Dead => "dead",
            State::Cancelled => "cancelled",
            State::Waiting => "waiting",
            State::Blocked => "blocked",
        }
    }

    /// True for states a job never leaves by itself (succeeded, dead, cancelled).
    pub fn is_final(self) -> bool {
        matches!(self, State::Succeeded | State::Dead | State::Cancelled)
    }

    /// All states, in life-cycle order.
    pub const ALL: [State; 8] = [
        State::Delayed,
        State::Ready,
        State::Leased,
        State::Succeeded,
        State::Dead,
        State::Cancelled,
        State::Waiting,
        State::Blocked,
    ];

    /// Waiting on parents named in `after` (waiting or blocked): not leasable, no
    /// concurrency slot, counted toward `max_depth`.
    pub fn is_held(self) -> bool {
        matches!(self, State::Waiting | State::Blocked)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        State::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown job state {s:?}"))
    }
}

/// How an attempt (or an operator event) ended, as recorded in the job's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The executor succeeded and the job was acked.
    Succeeded,
    /// A transient failure (exit 75, HTTP 5xx, connection error, ...): retried.
    Failed,
    /// A permanent failure (exit 64/65, HTTP 4xx): dead-lettered at once.
    Permanent,
    /// The executor ran past the queue's `timeout` and was killed.
    TimedOut,
    /// The lease expired without an ack (worker or daemon died, or heartbeats stopped).
    LeaseExpired,
    /// The worker running the job crashed (panicked).
    WorkerCrashed,
    /// Cut short by a graceful shutdown; not charged to the budget.
    Interrupted,
    /// The downstream asked to slow down (HTTP 429/503 with Retry-After); not charged.
    Throttled,
    /// An operator redrove the job from the dead-letter queue (an event, not an attempt).
    Redriven,
    /// An operator cancelled the job: an event, or the end of the attempt it
    /// stopped (not charged).
    Cancelled,
    /// A parent named in `after` died or was cancelled: the job is blocked (an
    /// event naming the parent, not an attempt).
    Blocked,
    /// An operator counted the job's broken edges as met (an event, not an attempt).
    Released,
}

impl Outcome {
    /// The stored and displayed name (`"failed"`, `"lease_expired"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Permanent => "permanent",
            Outcome::TimedOut => "timed_out",
            Outcome::LeaseExpired => "lease_expired",
            Outcome::WorkerCrashed => "worker_crashed",
            Outcome::Interrupted => "interrupted",
            Outcome::Throttled => "throttled",
            Outcome::Redriven => "redriven",
            Outcome::Cancelled => "cancelled",
            Outcome::Blocked => "blocked",
            Outcome::Released => "released",
        }
    }

    /// Whether an attempt can end with this outcome: all but [`Outcome::Redriven`],
    /// [`Outcome::Blocked`] and [`Outcome::Released`], which only ever name events
    /// in the history.
    pub fn ends_attempts(self) -> bool {
        !matches!(
            self,
            Outcome::Redriven | Outcome::Blocked | Outcome::Released
        )
    }

    /// Whether an attempt with this outcome uses up one unit of the retry budget.
    pub fn is_charged(self) -> bool {
        matches!(
            self,
            Outcome::Succeeded
                | Outcome::Failed
                | Outcome::Permanent
                | Outcome::TimedOut
                | Outcome::LeaseExpired
                | Outcome::WorkerCrashed
        )
    }

    /// All outcomes (for metrics label sets and parsing).
    pub const ALL: [Outcome; 12] = [
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Permanent,
        Outcome::TimedOut,
        Outcome::LeaseExpired,
        Outcome::WorkerCrashed,
        Outcome::Interrupted,
        Outcome::Throttled,
        Outcome::Redriven,
        Outcome::Cancelled,
        Outcome::Blocked,
        Outcome::Released,
    ];
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Outcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Outcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| format!("unknown attempt outcome {s:?}"))
    }
}

/// One line of a job's history: an attempt (with its worker and start time) or an
/// operator event (redrive, cancel). History is append-only and survives redrive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The attempt number this entry is about (1-based); for events, the job's
    /// `attempts` at the time.
    pub attempt: u32,
    /// How it ended.
    pub outcome: Outcome,
    /// The worker that held the lease (`"email/3"`, an external worker's id), if any.
    pub worker: Option<String>,
    /// When the attempt started (lease time), if it was an attempt.
    pub started_at: Option<UnixMillis>,
    /// When it ended.
    pub ended_at: UnixMillis,
    /// The error, stderr tail or response-body head (at most 4 KiB), or an event's
    /// detail. The store keeps at most `[daemon] history.max_error` bytes of it.
    pub error: Option<String>,
}

/// A job without its payload: what the broker keeps in memory and what the store
/// keeps in the `jobs` table. Payloads stay on disk and are read when a job is leased.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// Time-ordered id.
    pub id: JobId,
    /// The queue (job class) it belongs to.
    pub queue: Arc<str>,
    /// The tenant it belongs to (`"default"` when the producer gave none).
    pub tenant: Arc<str>,
    /// The producer's idempotency key, unique per queue within `retention`.
    pub idempotency_key: Option<String>,
    /// Where it is in its life cycle.
    pub state: State,
    /// Charged attempts so far. Never decreases.
    pub attempts: u32,
    /// `attempts` at the last redrive: the budget left is `max_attempts - (attempts - budget_start)`.
    pub budget_start: u32,
    /// The retry budget (attempts per life in the queue).
    pub max_attempts: u32,
    /// The fencing token of the latest lease (0 before the first lease).
    pub lease_seq: Token,
    /// The worker holding the current lease, while leased.
    pub worker: Option<String>,
    /// When the current lease started, while leased.
    pub leased_at: Option<UnixMillis>,
    /// When the producer's enqueue was accepted.
    pub created_at: UnixMillis,
    /// When the job is (or was) due to run.
    pub ready_at: UnixMillis,
    /// When it reached its current state.
    pub updated_at: UnixMillis,
    /// The last attempt's error, if the last attempt failed.
    pub last_error: Option<String>,
    /// How much earlier than `ready_at` the job ranks among its tenant's ready jobs
    /// (milliseconds, within [`PRIORITY_RANGE_MS`]; 0 for most jobs): the ready
    /// order of a tenant is by [`Job::order_key`]. Set at enqueue, never changed.
    pub priority_ms: i64,
}

/// The bounds of [`Job::priority_ms`]: one day either way.
pub const PRIORITY_RANGE_MS: std::ops::RangeInclusive<i64> = -86_400_000..=86_400_000;

/// What the producer asked for when enqueueing.
#[derive(Clone, Debug)]
pub struct NewJob {
    /// The queue it is enqueued in (configured).
    pub queue: Arc<str>,
    /// Whose job it is, for fairness, caps and depths (`default` when not given).
    pub tenant: Arc<str>,
    /// Optional idempotency key.
    pub idempotency_key: Option<String>,
    /// Run no sooner than this long after acceptance.
    pub delay: Duration,
    /// Retry budget.
    pub max_attempts: u32,
    /// The job's priority within its tenant ([`Job::priority_ms`]).
    pub priority_ms: i64,
}

impl Job {
    /// The state a user sees at wall time `now` (Unix ms): a delayed job whose
    /// `ready_at` is at or before `now` is ready (the store keeps it `delayed` until
    /// its next write). Every view and state filter reads states through this.
    pub fn shown_state(&self, now: UnixMillis) -> State {
        match self.state {
            State::Delayed if self.ready_at <= now => State::Ready,
            s => s,
        }
    }

    /// A freshly accepted job: `ready`, or `delayed` if `delay` is non-zero.
    pub fn new(new: NewJob, now: UnixMillis) -> Job {
        let delay_ms = i64::try_from(new.delay.as_millis()).unwrap_or(i64::MAX);
        let ready_at = now.saturating_add(delay_ms);
        Job {
            id: JobId::new(),
            queue: new.queue,
            tenant: new.tenant,
            idempotency_key: new.idempotency_key,
            state: if ready_at > now {
                State::Delayed
            } else {
                State::Ready
            },
            attempts: 0,
            budget_start: 0,
            max_attempts: new.max_attempts.max(1),
            lease_seq: 0,
            worker: None,
            leased_at: None,
            created_at: now,
            ready_at,
            updated_at: now,
            last_error: None,
            priority_ms: new
                .priority_ms
                .clamp(*PRIORITY_RANGE_MS.start(), *PRIORITY_RANGE_MS.end()),
        }
    }

    /// Where the job ranks among its tenant's ready jobs: `ready_at` moved earlier
    /// by its priority, so a job of priority 10m ranks as if it had become ready ten
    /// minutes sooner. The wait a user sees (queue age) stays `ready_at`'s.
    pub fn order_key(&self) -> UnixMillis {
        self.ready_at.saturating_sub(self.priority_ms)
    }

    /// Charged attempts since the last redrive.
    pub fn attempts_in_budget(&self) -> u32 {
        self.attempts - self.budget_start
    }

    /// The key the executor sees as `QD_IDEMPOTENCY_KEY`: the producer's key, else the job id.
    pub fn effect_key(&self) -> String {
        self.idempotency_key
            .clone()
            .unwrap_or_else(|| self.id.to_string())
    }

    /// The attempt number the next (or current) lease runs: `attempts + 1`.
    pub fn next_attempt(&self) -> u32 {
        self.attempts + 1
    }
}

/// Why an attempt failed, as reported by a worker, or by the Broker for a lease that
/// expired, a worker that crashed or a lessee that went away.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// Retry with backoff. `retry_after` is a delay the executor asked for (Retry-After).
    Transient {
        /// The error text.
        error: String,
        /// A minimum delay asked for by the downstream.
        retry_after: Option<Duration>,
    },
    /// Do not retry: dead-letter now.
    Permanent {
        /// The error text.
        error: String,
    },
    /// The executor ran past its timeout.
    TimedOut {
        /// The error text (stderr tail, if any).
        error: String,
    },
    /// The lease expired without an ack.
    LeaseExpired {
        /// Why (e.g. "no heartbeat", "daemon restarted").
        reason: String,
    },
    /// The worker running it crashed (panicked); charged.
    WorkerCrashed {
        /// The panic message or reason.
        error: String,
    },
    /// The downstream throttled us; not charged; retry no sooner than `retry_after`.
    Throttled {
        /// Wait at least this long. The job is retried after a delay drawn from
        /// `[retry_after, 2 * retry_after)` (jitter on top of the floor), so jobs
        /// throttled together do not all come back at the same instant.
        retry_after: Duration,
        /// The detail (status line, body head).
        error: String,
    },
    /// A graceful shutdown stopped the attempt; not charged; ready again at once.
    Interrupted {
        /// Why (e.g. "shutdown grace expired").
        reason: String,
    },
}

impl Failure {
    /// The history outcome for this failure.
    pub fn outcome(&self) -> Outcome {
        match self {
            Failure::Transient { .. } => Outcome::Failed,
            Failure::Permanent { .. } => Outcome::Permanent,
            Failure::TimedOut { .. } => Outcome::TimedOut,
            Failure::LeaseExpired { .. } => Outcome::LeaseExpired,
            Failure::WorkerCrashed { .. } => Outcome::WorkerCrashed,
            Failure::Throttled { .. } => Outcome::Throttled,
            Failure::Interrupted { .. } => Outcome::Interrupted,
        }
    }

    /// The text recorded as the attempt's error.
    pub fn message(&self) -> &str {
        match self {
            Failure::Transient { error, .. }
            | Failure::Permanent { error }
            | Failure::TimedOut { error }
            | Failure::WorkerCrashed { error }
            | Failure::Throttled { error, .. } => error,
            Failure::LeaseExpired { reason } | Failure::Interrupted { reason } => reason,
        }
    }
}

/// An input to the state machine.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A delayed job's `ready_at` has passed.
    Promote,
    /// A worker takes the job. The new lease's token is `lease_seq + 1`.
    Lease {
        /// The worker's id.
        worker: String,
    },
    /// The lease holder reports success.
    Ack {
        /// The lease's fencing token.
        token: Token,
    },
    /// The lease holder, or the Broker on its behalf (an expired lease, a crashed
    /// worker, an interrupted attempt), reports a failed attempt.
    Fail {
        /// The lease's fencing token.
        token: Token,
        /// What went wrong.
        failure: Failure,
        /// A sample of U[0,1) for full jitter, drawn by the caller.
        jitter: f64,
    },
    /// An operator moves a dead job back to ready with a fresh budget.
    Redrive {
        /// Who did it (e.g. "uid 1000").
        by: String,
    },
    /// An operator removes a job; a leased job's attempt ends with it (its lease is
    /// revoked).
    Cancel {
        /// Who did it.
        by: String,
    },
}

/// The result of a legal transition: the job's new record and the history line to append.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The job after the event.
    pub job: Job,
    /// The history entry to store with it, if the event makes one.
    pub entry: Option<HistoryEntry>,
    /// The attempt's result (an ack's), written with the transition; a redrive
    /// clears the stored one whatever this holds.
    pub result: Option<Arc<[u8]>>,
}

/// Why an event was refused. Nothing changes when a transition is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The event does not apply to the job's state (e.g. ack of a ready job).
    #[error("job {id} is {state}; cannot {event}")]
    IllegalState {
        /// The job the event was for.
        id: JobId,
        /// Its current state.
        state: State,
        /// The refused event's name.
        event: &'static str,
    },
    /// The token is not the current lease's (a stale worker).
    #[error("stale fencing token {given} for job {id} ({})", lease_now(.state))]
    StaleToken {
        /// The job the token was presented for.
        id: JobId,
        /// The token presented.
        given: Token,
        /// The job's current lease token (for logs and tests; never shown to the
        /// lessee).
        current: Token,
        /// Its current state.
        state: State,
    },
}

/// What a stale token is told about the job's lease now: that a newer lease holds
/// it (never that lease's token, which would let a stale worker report for it),
/// else that the lease ended.
fn lease_now(state: &State) -> String {
    if *state == State::Leased {
        "a newer lease holds it, job is leased".to_owned()
    } else {
        format!("its lease ended; job is {state}")
    }
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Event::Promote => "promote",
            Event::Lease { .. } => "lease",
            Event::Ack { .. } => "ack",
            Event::Fail { .. } => "fail",
            Event::Redrive { .. } => "redrive",
            Event::Cancel { .. } => "cancel",
        }
    }
}

/// Checks that `token` fences the job's current lease.
pub fn check_token(job: &Job, token: Token) -> Result<(), TransitionError> {
    if job.state == State::Leased && token == job.lease_seq {
        Ok(())
    } else {
        Err(TransitionError::StaleToken {
            id: job.id,
            given: token,
            current: job.lease_seq,
            state: job.state,
        })
    }
}

/// Applies `event` to `job` at wall time `now`, under `backoff`.
///
/// Returns the new record and the history entry, or a [`TransitionError`] and no
/// change. Retry delays follow [`Backoff::delay`] (capped exponential, full jitter).
pub fn apply(
    job: &Job,
    event: Event,
    backoff: &Backoff,
    now: UnixMillis,
) -> Result<Transition, TransitionError> {
    let illegal = |event: &Event| TransitionError::IllegalState {
        id: job.id,
        state: job.state,
        event: event.name(),
    };
    let mut next = job.clone();
    next.updated_at = now;
    let entry = match (job.state, &event) {
        (State::Delayed, Event::Promote) => {
            next.state = State::Ready;
            None
        }
        (State::Ready, Event::Lease { worker }) => {
            next.state = State::Leased;
            next.lease_seq += 1;
            next.worker = Some(worker.clone());
            next.leased_at = Some(now);
            None
        }
        (_, Event::Ack { token }) => {
            check_token(job, *token)?;
            next.attempts += 1;
            next.state = State::Succeeded;
            next.last_error = None;
            Some(end_lease(&mut next, job, Outcome::Succeeded, None, now))
        }
        (
            _,
            Event::Fail {
                token,
                failure,
                jitter,
            },
        ) => {
            check_token(job, *token)?;
            Some(fail(&mut next, job, failure, *jitter, backoff, now))
        }
        (State::Dead, Event::Redrive { by }) => {
            next.state = State::Ready;
            next.budget_start = next.attempts;
            next.ready_at = now;
            Some(event_entry(
                job,
                Outcome::Redriven,
                format!("redriven by {by}"),
                now,
            ))
        }
        (State::Leased, Event::Cancel { by }) => {
            next.state = State::Cancelled;
            let detail = format!("cancelled by {by} while running");
            Some(end_lease(
                &mut next,
                job,
                Outcome::Cancelled,
                Some(detail),
                now,
            ))
        }
        (
            State::Ready | State::Delayed | State::Dead | State::Waiting | State::Blocked,
            Event::Cancel { by },
        ) => {
            next.state = State::Cancelled;
            Some(event_entry(
                job,
                Outcome::Cancelled,
                format!("cancelled by {by}"),
                now,
            ))
        }
        _ => return Err(illegal(&event)),
    };
    Ok(Transition {
        job: next,
        entry,
        result: None,
    })
}

/// Ends the current lease of `next` (copied from `prev`) and returns its history line.
fn end_lease(
    next: &mut Job,
    prev: &Job,
    outcome: Outcome,
    error: Option<String>,
    now: UnixMillis,
) -> HistoryEntry {
    next.worker = None;
    next.leased_at = None;
    HistoryEntry {
        attempt: prev.next_attempt(),
        outcome,
        worker: prev.worker.clone(),
        started_at: prev.leased_at,
        ended_at: now,
        error,
    }
}

fn event_entry(job: &Job, outcome: Outcome, detail: String, now: UnixMillis) -> HistoryEntry {
    HistoryEntry {
        attempt: job.attempts,
        outcome,
        worker: None,
        started_at: None,
        ended_at: now,
        error: Some(detail),
    }
}

fn fail(
    next: &mut Job,
    prev: &Job,
    failure: &Failure,
    jitter: f64,
    backoff: &Backoff,
    now: UnixMillis,
) -> HistoryEntry {
    let outcome = failure.outcome();
    let message = failure.message().to_string();
    let entry = end_lease(next, prev, outcome, Some(message.clone()), now);
    if outcome.is_charged() {
        next.attempts += 1;
    }
    next.last_error = Some(message);
    let delay = match failure {
        Failure::Interrupted { .. } => Duration::ZERO,
        Failure::Throttled { retry_after, .. } => {
            // floor + floor * jitter; saturating, as a worker may send any Retry-After.
            let spread = retry_after.as_secs_f64() * jitter.clamp(0.0, 1.0);
            retry_after.saturating_add(Duration::try_from_secs_f64(spread).unwrap_or(Duration::MAX))
        }
        Failure::Transient { retry_after, .. } => {
            backoff.delay(next.attempts_in_budget(), *retry_after, jitter)
        }
        _ => backoff.delay(next.attempts_in_budget(), None, jitter),
    };
    let budget_spent = next.attempts_in_budget() >= next.max_attempts;
    if matches!(failure, Failure::Permanent { .. }) || (outcome.is_charged() && budget_spent) {
        next.state = State::Dead;
        next.ready_at = now;
    } else {
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        next.ready_at = now.saturating_add(delay_ms);
        next.state = if delay_ms > 0 {
            State::Delayed
        } else {
            State::Ready
        };
    }
    entry
}

#[cfg(test)]
mod tests;
