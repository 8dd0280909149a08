//! How a change of a job's state reaches its queue's
//! [`Dispatch`](super::dispatch::Dispatch): a job that
//! becomes ready or delayed is handed over, one cancelled or moved is taken out by
//! the ready time it was handed over with, a lease that ended frees its tenant's
//! slot, and a throttled result pauses the queue's shared rate limiter until the
//! job's retry time.
//!
//! The Broker calls these in the same step in which it changes the job in memory,
//! so the queue's ready order never lags the jobs' states. A queue with no
//! Dispatch (not configured) drops the change: its jobs are handed over from the
//! Broker's memory when the queue is configured again.

use std::sync::Arc;
use std::time::Duration;

use super::dispatch::Dispatches;
use crate::clock::until;
use crate::job::{Job, Outcome, State, Transition, UnixMillis};

/// Tells the Dispatch of `old`'s queue that `old` became `new` (the same job) at
/// wall time `now`.
pub fn changed(d: &mut Dispatches, old: &Job, new: &Job, now: UnixMillis) {
    if old.state == State::Leased && new.state != State::Leased {
        let run = old
            .leased_at
            .map(|at| Duration::from_millis(u64::try_from(now - at).unwrap_or(0)))
            .unwrap_or_default();
        if let Some(q) = d.get_mut(&old.queue) {
            q.finish(&old.tenant, run);
        }
    }
    let waiting = |job: &Job| matches!(job.state, State::Ready | State::Delayed);
    // Still waiting at another ready time (another node retried it): the entry
    // is found by the old time and queued again at the new one.
    let moved = waiting(old) && waiting(new) && old.ready_at != new.ready_at;
    // Any way out of waiting takes the entry out (cancelled; or made dead or
    // leased by a change read from the store); a pick already took it, and taking
    // out what is not there does nothing.
    if waiting(old) && (!waiting(new) || moved) {
        remove(d, old);
    }
    if waiting(new) && (!waiting(old) || moved) {
        ready(d, new);
    }
}

/// Takes a ready or delayed job out of its queue's Dispatch, named as it was
/// handed over (tenant and ready time).
fn remove(d: &mut Dispatches, job: &Job) {
    if let Some(q) = d.get_mut(&job.queue) {
        q.remove(&job.tenant, job.id, job.ready_at);
    }
}

/// After a throttled result, pauses the queue's shared rate limiter until the
/// job's retry time: at least `retry_after` from now, plus the job's jitter (see
/// [`crate::job::Failure::Throttled`]). Called when the result is planned, before
/// its write, so the pause is in force before the lessee's answer.
pub fn throttled(d: &Dispatches, t: &Transition, now: UnixMillis) {
    if t.entry.as_ref().map(|e| e.outcome) == Some(Outcome::Throttled)
        && let Some(q) = d.get(&t.job.queue)
    {
        q.throttled(until(t.job.ready_at, now));
    }
}

/// Hands a ready or delayed job to its queue's Dispatch.
pub fn ready(d: &mut Dispatches, job: &Job) {
    d.ready(
        &job.queue,
        job.tenant.clone(),
        job.id,
        job.ready_at,
        job.priority_ms,
    );
}

/// Tells a queue's Dispatch that `job` left this node's view (another node changed
/// it): a waiting job is removed, a lease held here frees its tenant's slot.
pub fn dropped(d: &mut Dispatches, job: &Job) {
    match job.state {
        State::Ready | State::Delayed => remove(d, job),
        State::Leased => release(d, &job.queue, &job.tenant),
        State::Dead | State::Succeeded | State::Cancelled | State::Waiting | State::Blocked => {}
    }
}

/// Tells a queue's Dispatch that a job it picked (`job`, its record before the
/// lease) was refused by the shared store for its tenant's cap across the cluster:
/// the job waits again, uncharged, and the tenant is held at its cap.
pub fn at_cap(d: &mut Dispatches, job: &Job) {
    if let Some(q) = d.get_mut(&job.queue) {
        q.at_cap(job.tenant.clone(), job.id, job.ready_at, job.priority_ms);
    }
}

/// Tells a queue's Dispatch that a job it picked was not leased after all.
pub fn release(d: &mut Dispatches, queue: &str, tenant: &Arc<str>) {
    if let Some(q) = d.get_mut(queue) {
        q.finish(tenant, Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::dispatch::Dispatch;
    use crate::job::NewJob;
    use crate::scheduler::fair::Fairness;

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

    /// The queue's (ready, delayed, oldest ready time).
    fn seen(d: &Dispatches) -> (u64, u64, Option<UnixMillis>) {
        let s = d.get("q").expect("configured").stats();
        (s.ready, s.delayed, s.oldest_ready_at)
    }

    #[test]
    fn a_waiting_job_is_removed_by_the_ready_time_it_was_handed_over_with() {
        let mut d = Dispatches::default();
        d.at(10_000, tokio::time::Instant::now());
        d.insert(Arc::from("q"), Dispatch::new(Fairness::Jobs, None));
        let old = waiting(1_000);
        ready(&mut d, &old);
        assert_eq!(seen(&d), (1, 0, Some(1_000)));
        let cancelled = Job {
            state: State::Cancelled,
            ..old.clone()
        };
        changed(&mut d, &old, &cancelled, 2_000);
        assert_eq!(seen(&d), (0, 0, None));

        // Another node retried it: still waiting, at a new time.
        ready(&mut d, &old);
        let retried = Job {
            ready_at: 5_000,
            ..old.clone()
        };
        changed(&mut d, &old, &retried, 2_000);
        assert_eq!(seen(&d), (1, 0, Some(5_000)));

        changed(&mut d, &retried, &retried.clone(), 2_000);
        assert_eq!(
            seen(&d),
            (1, 0, Some(5_000)),
            "an unchanged job moves nothing"
        );
        dropped(&mut d, &retried);
        assert_eq!(seen(&d), (0, 0, None));

        // A job of a queue that is not configured is dropped.
        let elsewhere = Job {
            queue: Arc::from("gone"),
            ..old
        };
        ready(&mut d, &elsewhere);
        assert_eq!(seen(&d), (0, 0, None));
    }
}
