//! Fan-out of job state changes to the actors derived from the broker's state:
//! the queue's Scheduler (ready jobs, running counts), plus the matching metrics. A throttled
//! result, from qd's own workers or an external one, pauses the queue's shared rate
//! limiter through its Scheduler until the job's retry time.
//!
//! The changes of one Broker message are collected in an [`Outbox`] and sent when the
//! message is done, as one actor message per queue ([`SchedulerMsg::Batch`] when there
//! are several): a batch of 1,000 acks is one Scheduler message, not 1,000.
//!
//! Actors are looked up by registered name on every send, so a restarted actor is
//! found under its old name; a send to an actor that is restarting is dropped, which
//! is safe because every derived actor asks for a full [`super::Resync`] on start.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::until;
use crate::job::{Job, Outcome, State, Transition, UnixMillis};
use crate::scheduler::{self, SchedulerMsg, Snapshot};

/// Sends `msg` to the Scheduler of `queue`, if it is running.
fn to_scheduler(queue: &str, msg: SchedulerMsg) {
    if let Some(actor) = ractor::ActorRef::<SchedulerMsg>::where_is(scheduler::name(queue)) {
        let _ = actor.cast(msg);
    }
}

/// Scheduler messages produced while the Broker handles one message, in order.
#[derive(Default)]
pub struct Outbox(Vec<(Arc<str>, SchedulerMsg)>);

impl Outbox {
    fn push(&mut self, queue: &Arc<str>, msg: SchedulerMsg) {
        self.0.push((queue.clone(), msg));
    }

    /// Sends everything collected, in order, one actor message per queue.
    pub fn flush(&mut self) {
        let mut by_queue: Vec<(Arc<str>, Vec<SchedulerMsg>)> = Vec::new();
        for (queue, msg) in self.0.drain(..) {
            match by_queue.iter_mut().find(|(q, _)| *q == queue) {
                Some((_, msgs)) => msgs.push(msg),
                None => by_queue.push((queue, vec![msg])),
            }
        }
        for (queue, mut msgs) in by_queue {
            let msg = match msgs.len() {
                1 => msgs.pop().expect("invariant: one message"),
                _ => SchedulerMsg::Batch(msgs),
            };
            to_scheduler(&queue, msg);
        }
    }
}

/// Tells the derived actors that `old` became `new` (the same job) at wall time `now`.
pub fn changed(out: &mut Outbox, old: &Job, new: &Job, now: UnixMillis) {
    if old.state == State::Leased && new.state != State::Leased {
        let run = old
            .leased_at
            .map(|at| Duration::from_millis(u64::try_from(now - at).unwrap_or(0)))
            .unwrap_or_default();
        out.push(&old.queue, SchedulerMsg::Finished(old.tenant.clone(), run));
    }
    if matches!(old.state, State::Ready | State::Delayed) && new.state == State::Cancelled {
        let remove = SchedulerMsg::Remove(old.tenant.clone(), old.id, old.ready_at);
        out.push(&old.queue, remove);
    }
    if matches!(new.state, State::Ready | State::Delayed)
        && !matches!(old.state, State::Ready | State::Delayed)
    {
        ready(out, new);
    }
}

/// After a throttled result, pauses the queue's shared rate limiter (through its
/// Scheduler) until the job's retry time: at least `retry_after` from now, plus the
/// job's jitter (see [`crate::job::Failure::Throttled`]).
pub fn throttled(out: &mut Outbox, t: &Transition, now: UnixMillis) {
    if t.entry.as_ref().map(|e| e.outcome) == Some(Outcome::Throttled) {
        let pause = until(t.job.ready_at, now);
        out.push(&t.job.queue, SchedulerMsg::Throttled(pause));
    }
}

/// Hands a ready or delayed job to its queue's Scheduler.
pub fn ready(out: &mut Outbox, job: &Job) {
    out.push(
        &job.queue,
        SchedulerMsg::Ready(job.tenant.clone(), job.id, job.ready_at),
    );
}

/// Rebuilds the Scheduler of `queue` from `snapshot` in one message, sent at once
/// (a resync is a Broker message of its own); `snapshot` runs only if that
/// Scheduler is running.
pub fn restore(queue: &str, snapshot: impl FnOnce() -> Snapshot) {
    if let Some(actor) = ractor::ActorRef::<SchedulerMsg>::where_is(scheduler::name(queue)) {
        let _ = actor.cast(SchedulerMsg::Restore(Box::new(snapshot())));
    }
}

/// Tells a queue's Scheduler that a job it handed out was not leased after all.
pub fn release(out: &mut Outbox, queue: &Arc<str>, tenant: Arc<str>) {
    out.push(queue, SchedulerMsg::Finished(tenant, Duration::ZERO));
}
