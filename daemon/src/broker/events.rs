//! Fan-out of job state changes to the actors derived from the broker's state:
//! the queue's Scheduler (ready jobs, running counts), plus the matching metrics. A throttled
//! result, from qd's own workers or an external one, pauses the queue's shared rate
//! limiter through its Scheduler until the job's retry time.
//!
//! Actors are looked up by registered name on every send, so a restarted actor is
//! found under its old name; a send to an actor that is restarting is dropped, which
//! is safe because every derived actor asks for a full [`super::Resync`] on start.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::until;
use crate::job::{Job, Outcome, State, Transition, UnixMillis};
use crate::scheduler::{self, SchedulerMsg};

/// Sends `msg` to the Scheduler of `queue`, if it is running.
pub fn to_scheduler(queue: &str, msg: SchedulerMsg) {
    if let Some(actor) = ractor::ActorRef::<SchedulerMsg>::where_is(scheduler::name(queue)) {
        let _ = actor.cast(msg);
    }
}

/// Tells the derived actors that `old` became `new` (the same job) at wall time `now`.
pub fn changed(old: &Job, new: &Job, now: UnixMillis) {
    if old.state == State::Leased && new.state != State::Leased {
        let run = old
            .leased_at
            .map(|at| Duration::from_millis(u64::try_from(now - at).unwrap_or(0)))
            .unwrap_or_default();
        to_scheduler(&old.queue, SchedulerMsg::Finished(old.tenant.clone(), run));
    }
    if matches!(old.state, State::Ready | State::Delayed) && new.state == State::Cancelled {
        to_scheduler(&old.queue, SchedulerMsg::Remove(old.id));
    }
    if matches!(new.state, State::Ready | State::Delayed)
        && !matches!(old.state, State::Ready | State::Delayed)
    {
        ready(new);
    }
}

/// After a throttled result, pauses the queue's shared rate limiter (through its
/// Scheduler) until the job's retry time: at least `retry_after` from now, plus the
/// job's jitter (see [`crate::job::Failure::Throttled`]).
pub fn throttled(t: &Transition, now: UnixMillis) {
    if t.entry.as_ref().map(|e| e.outcome) == Some(Outcome::Throttled) {
        let pause = until(t.job.ready_at, now);
        to_scheduler(&t.job.queue, SchedulerMsg::Throttled(pause));
    }
}

/// Hands a ready or delayed job to its queue's Scheduler.
pub fn ready(job: &Job) {
    to_scheduler(
        &job.queue,
        SchedulerMsg::Ready(job.tenant.clone(), job.id, job.ready_at),
    );
}

/// Tells a queue's Scheduler that a job it handed out was not leased after all.
pub fn release(queue: &str, tenant: Arc<str>) {
    to_scheduler(queue, SchedulerMsg::Finished(tenant, Duration::ZERO));
}
