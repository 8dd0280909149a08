//! Reports for any lease on a store shared by several nodes (PostgreSQL): the
//! database's row is the lease, so any node answers a heartbeat, ack, nack (single
//! or per item of a batch) or cancel for any lease, fenced by its token in the
//! same `UPDATE` that applies it. Takes no message of its own: the Broker routes
//! [`BrokerMsg::Heartbeat`], [`BrokerMsg::Ack`], [`BrokerMsg::AckResult`],
//! [`BrokerMsg::AckBatch`] and
//! [`BrokerMsg::Nack`] here when memory does not hold the lease the report names.
//!
//! - **A report for a lease memory does not hold** (another node leased the job, or
//!   memory's copy is stale) first reads the stored record
//!   ([`BrokerState::reload_then`], as an operator's cancel does); the event is then
//!   applied by [`job::apply`] to that record and written as [`Intent::End`], whose
//!   `UPDATE` applies only while the stored lease has the report's token. A token
//!   that is not the stored lease's is answered `stale_token` with the job's state,
//!   never with the current token ([`job::TransitionError::StaleToken`]).
//! - **An external worker's lease ends by the store's clock.** Its claim stores its
//!   own end (`lease_end`, see `store/postgres.rs`), which every heartbeat, on any
//!   node, moves ([`crate::store::SharedStore::extend_lease`]). The node holding
//!   the lease keeps a deadline in memory as before, but when it passes it only
//!   asks the store to end the lease if the stored end passed too
//!   ([`crate::store::SharedStore::end_if_due`]): a lease heartbeated elsewhere is
//!   re-armed for what it has left; one acked, nacked or cancelled elsewhere is let
//!   go (its dispatch slot and depth are freed). A lease of a node's own worker
//!   stores no end and expires by its node's memory, as before.
//! - **The node holding a lease learns of reports applied elsewhere** at its next
//!   sweep (every cluster heartbeat, `node_timeout / 5`: [`BrokerMsg::Sweep`]),
//!   which lets go of the leases the store no longer gives it, or sooner when its
//!   own deadline passes.
//! - **A node that died** leaves its external leases to their workers: the leader
//!   ends such a lease only once its stored end passed (a lease of a node's own
//!   worker, once the node is silent for `node_timeout`).

use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use super::settle::{Intent, Settle};
use super::{BrokerState, FALLBACK_BACKOFF, MAX_EXTEND};
use crate::broker::{BrokerError, BrokerMsg, LeaseInfo};
use crate::executor::ExecutorSpec;
use crate::job::{self, Event, Failure, Job, JobId, State, Token, Transition, UnixMillis};
use crate::store::{Backend, LeaseCheck, StoreError};
use ractor::RpcReplyPort;

/// The least a re-armed deadline waits: a lease whose stored end is just now
/// is asked about again a little later, not in a tight loop.
const RECHECK_AFTER: Duration = Duration::from_millis(10);

/// The leases a report names, each with the token it gives, when the message is a
/// lessee's report (heartbeat, ack, batch ack, nack).
pub(in crate::broker) fn reported_leases(msg: &BrokerMsg) -> Option<Vec<(JobId, Token)>> {
    match msg {
        BrokerMsg::Heartbeat(id, token, ..)
        | BrokerMsg::Ack(id, token, _)
        | BrokerMsg::AckResult(id, token, ..)
        | BrokerMsg::Nack(id, token, ..) => Some(vec![(*id, *token)]),
        BrokerMsg::AckBatch(acks, _) => Some(acks.clone()),
        _ => None,
    }
}

/// Which of `reports` must be read from the store first: those whose lease memory
/// does not hold with the report's token (`held` answers whether it does).
pub(in crate::broker) fn to_read(
    reports: &[(JobId, Token)],
    held: impl Fn(JobId, Token) -> bool,
) -> Vec<JobId> {
    let mut ids: Vec<JobId> = reports
        .iter()
        .filter(|(id, token)| !held(*id, *token))
        .map(|(id, _)| *id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl BrokerState {
    /// Whether `queue` is worked by external workers (over HTTP), whose leases may
    /// be reported to any node.
    pub(in crate::broker) fn external(&self, queue: &str) -> bool {
        self.config
            .queues
            .get(queue)
            .is_some_and(|q| q.executor == ExecutorSpec::External)
    }

    /// Whether memory holds job `id` as this node's lease with `token`.
    pub(in crate::broker) fn holds_lease(&self, id: JobId, token: Token) -> bool {
        self.jobs
            .get(id)
            .is_some_and(|j| j.state == State::Leased && j.lease_seq == token)
    }

    /// On a shared store, the jobs a report names whose leases memory does not hold
    /// with the report's token: they are read from the store before the report is
    /// applied (see the module doc). `None` when none is (or the store is local).
    pub(in crate::broker) fn report_targets(&self, msg: &BrokerMsg) -> Option<Vec<JobId>> {
        if !self.shared() {
            return None;
        }
        let ids = to_read(&reported_leases(msg)?, |id, t| self.holds_lease(id, t));
        (!ids.is_empty()).then_some(ids)
    }

    /// Plans a lessee's report `event` of job `id`: on memory's record when memory
    /// holds its lease with `token`, else on the stored lease among `stored` (read
    /// for this report), else on memory's record (answering unknown or stale).
    pub(super) fn plan_report(
        &mut self,
        id: JobId,
        token: Token,
        event: Event,
        stored: &[Job],
        now: UnixMillis,
    ) -> Result<(Job, Transition), BrokerError> {
        let Some(lease) = stored
            .iter()
            .find(|j| j.id == id && !self.holds_lease(id, token))
        else {
            return self.plan(id, event, now);
        };
        if self.writing.contains(&id) {
            return Err(BrokerError::Unavailable(format!(
                "job {id} has a write in flight; retry"
            )));
        }
        if let Some(known) = self.jobs.get(id).filter(|k| k.state == State::Leased) {
            // Memory's lease of this job is older than the store's: it is over.
            self.drop_stale(&known);
        }
        let lease = self.interned(lease.clone());
        let backoff = self
            .queue(&lease.queue)
            .map_or(FALLBACK_BACKOFF, |q| q.backoff);
        let t = job::apply(&lease, event, &backoff, now)?;
        Ok((lease, t))
    }

    /// `job` with its queue and tenant names interned.
    pub(super) fn interned(&mut self, job: Job) -> Job {
        Job {
            queue: self.intern(&job.queue),
            tenant: self.intern(&job.tenant),
            ..job
        }
    }

    /// A heartbeat of job `id` with `token`: renews the lease memory holds, and on
    /// a shared store writes an external lease's new end, fenced by its token, on
    /// whichever node it arrives (`stored`: the records read for it when memory
    /// does not hold the lease). Answers the new deadline (Unix ms).
    pub(in crate::broker) fn heartbeat_any(
        &mut self,
        (id, token): (JobId, Token),
        extend: Option<Duration>,
        stored: &[Job],
        reply: RpcReplyPort<Result<LeaseInfo, BrokerError>>,
        now: UnixMillis,
        mono: Instant,
    ) {
        let held = self.holds_lease(id, token);
        let stored = stored
            .iter()
            .find(|j| j.id == id && j.state == State::Leased);
        if let Some(lease) = stored.filter(|_| self.shared() && !held) {
            let lease = lease.clone();
            match job::check_token(&lease, token) {
                Ok(()) => self.extend_stored(&lease, token, extend, reply),
                Err(err) => self.answer(reply, Err(err.into())),
            }
            return;
        }
        let answer = self.heartbeat(id, token, extend, now, mono);
        let job = self.jobs.get(id);
        match (answer, job) {
            (Ok(_), Some(job)) if held && self.shared() && self.external(&job.queue) => {
                self.extend_stored(&job, token, extend, reply)
            }
            (answer, _) => self.answer(reply, answer),
        }
    }

    /// Writes the new end of `lease` (its queue's lease length, or `extend`),
    /// fenced by `token`; a lease the store no longer holds with that token is
    /// answered as unknown here (the API reads the stored state for its `409`).
    fn extend_stored(
        &mut self,
        lease: &Job,
        token: Token,
        extend: Option<Duration>,
        reply: RpcReplyPort<Result<LeaseInfo, BrokerError>>,
    ) {
        let length = self.queue(&lease.queue).map_or(MAX_EXTEND, |q| q.lease);
        let extend = extend.unwrap_or(length).min(MAX_EXTEND);
        let id = lease.id;
        self.write(
            move |b| shared_of(b)?.extend_lease(id, token, extend),
            move |result, _| {
                let answer = match result {
                    Ok(Some(deadline_ms)) => Ok(LeaseInfo { deadline_ms }),
                    Ok(None) => Err(BrokerError::UnknownJob(id)),
                    Err(err) => Err(BrokerError::Store(err)),
                };
                let _ = reply.send(answer);
            },
        );
    }

    /// A lease of this node on a shared store whose memory deadline passed, for
    /// an external worker: ends it only if its stored end passed too, as an
    /// expired lease through the retry policy (see the module doc).
    pub(super) fn expire_stored(&mut self, id: JobId, token: Token, now: UnixMillis) {
        let reason = "lease expired without an ack or heartbeat".to_string();
        let event = Event::Fail {
            token,
            jitter: rand::Rng::random::<f64>(&mut self.rng),
            failure: Failure::LeaseExpired { reason },
        };
        let (old, t) = match self.plan(id, event, now) {
            Ok(planned) => planned,
            Err(err) => {
                debug!(job = %id, error = %err, "A due lease could not be planned to end.");
                return;
            }
        };
        self.writing.insert(id);
        let write = vec![t.clone()];
        self.write(
            move |b| {
                let check = shared_of(b)?
                    .end_if_due(&write)?
                    .first()
                    .copied()
                    .unwrap_or(LeaseCheck::Gone);
                // An ended lease may have been the job's last attempt: its edges
                // move in the same transaction, as after any end (`deps.rs`).
                let children = match check {
                    LeaseCheck::Ended => {
                        let t = &write[0];
                        b.move_edges(&[(t.job.id, t.job.state)], t.job.updated_at)?
                    }
                    _ => Vec::new(),
                };
                Ok((check, children))
            },
            move |result, back| {
                let (check, children) = match result {
                    Ok((check, children)) => (Ok(check), children),
                    Err(e) => (Err(e), Vec::new()),
                };
                back(BrokerMsg::Settle(Settle::with(move |state, now, mono| {
                    state.checked(old, t, check, now, mono);
                    state.dependents_moved(children, now);
                })));
            },
        );
    }

    /// What the store answered for a due external lease: ended (applied as any
    /// end), still live (heartbeated elsewhere: re-armed for what it has left) or
    /// gone (ended elsewhere: memory lets go of it and frees its slot).
    fn checked(
        &mut self,
        old: Job,
        t: Transition,
        check: Result<LeaseCheck, StoreError>,
        now: UnixMillis,
        mono: Instant,
    ) {
        let planned = vec![(old.clone(), t)];
        match check {
            Ok(LeaseCheck::Ended) => self.settle(Intent::End, planned, Ok(vec![true]), now, mono),
            Ok(LeaseCheck::Gone) => self.settle(Intent::End, planned, Ok(vec![false]), now, mono),
            Ok(LeaseCheck::Live(left)) => {
                self.writing.remove(&old.id);
                if self.holds_lease(old.id, old.lease_seq) {
                    debug!(job = %old.id, left_ms = left.as_millis() as u64, "A due lease was heartbeated on another node; re-armed.");
                    self.deadlines
                        .track(old.id, old.lease_seq, mono + left.max(RECHECK_AFTER));
                }
                self.store_accepted(now);
            }
            Err(err) => self.settle(Intent::End, planned, Err(err), now, mono),
        }
    }
}

/// The shared side of the store, or an error on a store only this node writes.
fn shared_of(b: &mut dyn Backend) -> Result<&mut dyn crate::store::SharedStore, StoreError> {
    b.shared()
        .ok_or_else(|| StoreError::Other("the store is not shared by several nodes".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> JobId {
        JobId(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn only_reports_of_leases_memory_does_not_hold_with_their_token_are_read() {
        let held = |id: JobId, token: Token| id == self::id(1) && token == 5;
        let reports = [(id(1), 5), (id(1), 4), (id(2), 5), (id(2), 5), (id(3), 1)];
        // Job 1 at token 5 is memory's; token 4 of job 1 is read (memory may be
        // stale), job 2 once although named twice.
        assert_eq!(to_read(&reports, held), vec![id(1), id(2), id(3)]);
        assert!(to_read(&[(id(1), 5)], held).is_empty());
    }
}
