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
    /// The limiter pauses asked for so far, in order (for tests).
    #[cfg(test)]
    pub(crate) fn throttle_pauses(&self) -> Vec<Duration> {
        self.0
            .iter()
            .filter_map(|(_, msg)| match msg {
                SchedulerMsg::Throttled(pause) => Some(*pause),
                _ => None,
            })
            .collect()
    }

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
    let waiting = |job: &Job| matches!(job.state, State::Ready | State::Delayed);
    // Still waiting at another ready time (another node retried it): the Scheduler
    // finds its entry by the old time and queues it again at the new one.
    let moved = waiting(old) && waiting(new) && old.ready_at != new.ready_at;
    if waiting(old) && (new.state == State::Cancelled || moved) {
        remove(out, old);
    }
    if waiting(new) && (!waiting(old) || moved) {
        ready(out, new);
    }
}

/// Takes a ready or delayed job out of its queue's Scheduler, named as it was
/// handed over (tenant and ready time).
fn remove(out: &mut Outbox, job: &Job) {
    let msg = SchedulerMsg::Remove(job.tenant.clone(), job.id, job.ready_at);
    out.push(&job.queue, msg);
}

/// After a throttled result, pauses the queue's shared rate limiter (through its
/// Scheduler) until the job's retry time: at least `retry_after` from now, plus the
/// job's jitter (see [`crate::job::Failure::Throttled`]). Sent when the result is
/// planned, before its write: the Scheduler has it before the lessee's answer.
pub fn throttled(out: &mut Outbox, t: &Transition, now: UnixMillis) {
    if t.entry.as_ref().map(|e| e.outcome) == Some(Outcome::Throttled) {
        let pause = until(t.job.ready_at, now);
        out.push(&t.job.queue, SchedulerMsg::Throttled(pause));
    }
}

/// Hands a ready or delayed job to its queue's Scheduler.
pub fn ready(out: &mut Outbox, job: &Job) {
    let msg = match job.priority_ms {
        0 => SchedulerMsg::Ready(job.tenant.clone(), job.id, job.ready_at),
        p => SchedulerMsg::ReadyPrioritized(job.tenant.clone(), job.id, job.ready_at, p),
    };
    out.push(&job.queue, msg);
}

/// Rebuilds the Scheduler of `queue` from `snapshot` in one message, sent at once
/// (a resync is a Broker message of its own); `snapshot` runs only if that
/// Scheduler is running.
pub fn restore(queue: &str, snapshot: impl FnOnce() -> Snapshot) {
    if let Some(actor) = ractor::ActorRef::<SchedulerMsg>::where_is(scheduler::name(queue)) {
        let _ = actor.cast(SchedulerMsg::Restore(Box::new(snapshot())));
    }
}

/// Tells a queue's Scheduler that `job` left this node's view (another node changed
/// it): a waiting job is removed, a lease held here frees its tenant's slot.
pub fn dropped(out: &mut Outbox, job: &Job) {
    match job.state {
        State::Ready | State::Delayed => remove(out, job),
        State::Leased => release(out, &job.queue, job.tenant.clone()),
        State::Dead | State::Succeeded | State::Cancelled | State::Waiting | State::Blocked => {}
    }
}

/// Tells a queue's Scheduler that a job it handed out (`job`, its record before the
/// lease) was refused by the shared store for its tenant's cap across the cluster:
/// the job waits again, uncharged, and the tenant is held at its cap.
pub fn at_cap(out: &mut Outbox, job: &Job) {
    let msg = match job.priority_ms {
        0 => SchedulerMsg::AtCap(job.tenant.clone(), job.id, job.ready_at),
        p => SchedulerMsg::AtCapPrioritized(job.tenant.clone(), job.id, job.ready_at, p),
    };
    out.push(&job.queue, msg);
}

/// Tells a queue's Scheduler that a job it handed out was not leased after all.
pub fn release(out: &mut Outbox, queue: &Arc<str>, tenant: Arc<str>) {
    out.push(queue, SchedulerMsg::Finished(tenant, Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::NewJob;

    fn waiting(ready_at: UnixMillis) -> Job {
        let new = NewJob {
            queue: "q".into(),
            tenant: "t".into(),
            idempotency_key: None,
            delay: Duration::ZERO,
            max_attempts: 3,
            priority_ms: 0,
        };
        Job {
            ready_at,
            ..Job::new(new, 1_000)
        }
    }

    /// The Scheduler messages in `out` as (kind, ready time) pairs.
    fn sent(out: &Outbox) -> Vec<(&'static str, UnixMillis)> {
        out.0
            .iter()
            .map(|(_, msg)| match msg {
                SchedulerMsg::Remove(_, _, at) => ("remove", *at),
                SchedulerMsg::Ready(_, _, at) => ("ready", *at),
                _ => ("other", 0),
            })
            .collect()
    }

    #[test]
    fn a_waiting_job_is_removed_by_the_ready_time_it_was_handed_over_with() {
        let old = waiting(1_000);
        let mut out = Outbox::default();
        let cancelled = Job {
            state: State::Cancelled,
            ..old.clone()
        };
        changed(&mut out, &old, &cancelled, 2_000);
        assert_eq!(sent(&out), vec![("remove", 1_000)]);

        // Another node retried it: still waiting, at a new time.
        let mut out = Outbox::default();
        let retried = Job {
            ready_at: 5_000,
            ..old.clone()
        };
        changed(&mut out, &old, &retried, 2_000);
        assert_eq!(sent(&out), vec![("remove", 1_000), ("ready", 5_000)]);

        let mut out = Outbox::default();
        changed(&mut out, &old, &old.clone(), 2_000);
        assert!(sent(&out).is_empty(), "an unchanged job sends nothing");
        dropped(&mut out, &old);
        assert_eq!(sent(&out), vec![("remove", 1_000)]);
    }
}
