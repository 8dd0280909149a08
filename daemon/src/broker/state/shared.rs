//! The Broker on a store shared by several nodes (PostgreSQL): its memory is a view
//! of the store that other nodes change too, so the store decides and memory
//! follows.
//!
//! - **Finding work**: jobs other nodes enqueued, redrove or gave back are found by
//!   a look at the store's claimable jobs ([`BrokerMsg::Refresh`], sent by the
//!   Cluster actor when a notification arrives or its poll interval passes, and by
//!   the Broker itself after a look that found something or a lost claim).
//! - **Claiming**: a lease is a conditional claim in the store; one that does not
//!   apply (another node took the job or changed it) drops the job from memory.
//!   So does any change the store refused: memory had a stale copy.
//! - **Operators' changes** (redrive, purge, cancel) of jobs another node may have
//!   changed run on the store's current records: the jobs are read first
//!   ([`BrokerMsg::Reloaded`]).
//! - **Leases of dead nodes**: the leader (see `cluster.rs`) asks its Broker to end
//!   them ([`BrokerMsg::Sweep`]); each is charged as an expired lease through the
//!   retry policy, in a write fenced by the leader's epoch.

use rand::Rng;
use tracing::{debug, warn};

use super::settle::Intent;
use super::{BrokerState, events};
use crate::broker::{BrokerError, BrokerMsg};
use crate::job::{self, Event, Failure, Job, JobId, State, UnixMillis};
use crate::store::StoreError;

/// Claimable jobs a look at the store reads per queue, oldest first.
const REFRESH_WINDOW: u32 = 1000;

/// Expired leases the leader ends per sweep.
const SWEEP_BATCH: u32 = 500;

/// The error of a shared operation on a store that is not shared.
fn not_shared() -> StoreError {
    StoreError::Other("the store is not shared by several nodes".into())
}

impl BrokerState {
    /// Whether the store is shared by several nodes (its leases are not this
    /// process's alone).
    pub(in crate::broker) fn shared(&self) -> bool {
        !self.store.leases_are_local()
    }

    /// Looks for claimable jobs in the store, unless a look is under way (then one
    /// more follows it).
    pub(in crate::broker) fn refresh(&mut self) {
        if !self.shared() {
            return;
        }
        if self.refreshing {
            self.refresh_again = true;
            return;
        }
        self.refreshing = true;
        let queues: Vec<String> = self.config.queues.keys().cloned().collect();
        let myself = self.myself.clone();
        self.store.submit(
            move |b| {
                b.shared()
                    .ok_or_else(not_shared)?
                    .claimable(&queues, REFRESH_WINDOW)
            },
            move |result| {
                let _ = myself.cast(BrokerMsg::Refreshed(result));
            },
        );
    }

    /// A look at the store answered: adopts the jobs memory did not know (or knew
    /// in an older state), and looks again at once if it found any.
    pub(in crate::broker) fn refreshed(
        &mut self,
        result: Result<Vec<Job>, StoreError>,
        now: UnixMillis,
    ) {
        self.refreshing = false;
        let found = match result {
            Ok(jobs) => jobs
                .into_iter()
                .filter(|j| self.adopt(j.clone(), now))
                .count(),
            Err(err) => {
                debug!(error = %err, "Looking for other nodes' jobs failed; the next poll tries again.");
                0
            }
        };
        if found > 0 || std::mem::take(&mut self.refresh_again) {
            self.refresh();
        }
    }

    /// Takes a stored record into memory unless memory holds this node's lease of
    /// it or a write of it is in flight; answers whether memory changed. A record
    /// leased by another node is not kept (that node owns it until its lease ends).
    fn adopt(&mut self, stored: Job, now: UnixMillis) -> bool {
        if self.writing.contains(&stored.id) {
            return false;
        }
        let known = self.jobs.get(stored.id);
        match &known {
            Some(k) if k.state == State::Leased => return false,
            Some(k) if k.state == stored.state && k.lease_seq == stored.lease_seq => return false,
            _ => {}
        }
        if stored.state == State::Leased || (stored.state.is_final() && stored.state != State::Dead)
        {
            if let Some(known) = known {
                self.drop_stale(&known);
            }
            return false;
        }
        let queue = self.intern(&stored.queue);
        let tenant = self.intern(&stored.tenant);
        let job = Job {
            queue,
            tenant,
            ..stored
        };
        self.replace(job.clone());
        match known {
            Some(old) => events::changed(&mut self.out, &old, &job, now),
            None if matches!(job.state, State::Ready | State::Delayed) => {
                events::ready(&mut self.out, &job)
            }
            None => {}
        }
        true
    }

    /// Drops a job memory held in a state the store no longer has (another node
    /// changed it): the Scheduler forgets it or, if it was leased here, frees its slot.
    pub(in crate::broker) fn drop_stale(&mut self, job: &Job) {
        debug!(queue = %job.queue, job = %job.id, state = %job.state, "Dropped a stale copy: another node changed the job.");
        if let Some(gone) = self.jobs.remove(job.id) {
            self.account(&gone, false);
        }
        events::dropped(&mut self.out, job);
    }

    /// Reads the current records of `ids` before an operator's change, then handles
    /// `then` on them ([`BrokerMsg::Reloaded`]).
    pub(in crate::broker) fn reload_then(&mut self, ids: Vec<JobId>, then: BrokerMsg) {
        let myself = self.myself.clone();
        self.store.submit(
            move |b| b.shared().ok_or_else(not_shared)?.reload(&ids),
            move |result| {
                let _ = myself.cast(BrokerMsg::Reloaded(result, Box::new(then)));
            },
        );
    }

    /// The records of an operator's change were read: memory takes them, then the
    /// change runs on them. A job leased by another node cannot be cancelled here.
    pub(in crate::broker) fn reloaded(
        &mut self,
        result: Result<Vec<Job>, StoreError>,
        then: BrokerMsg,
        now: UnixMillis,
        mono: tokio::time::Instant,
    ) {
        let jobs = match result {
            Ok(jobs) => jobs,
            Err(err) => {
                warn!(error = %err, "Reading jobs before an operator's change failed; it runs on memory's view.");
                Vec::new()
            }
        };
        let leased_elsewhere: Vec<JobId> = jobs
            .iter()
            .filter(|j| j.state == State::Leased)
            .filter(|j| {
                self.jobs
                    .get(j.id)
                    .is_none_or(|k| k.state != State::Leased || k.lease_seq != j.lease_seq)
            })
            .map(|j| j.id)
            .collect();
        for job in jobs {
            self.adopt(job, now);
        }
        match then {
            BrokerMsg::Cancel(id, _, reply) if leased_elsewhere.contains(&id) => {
                let _ = reply.send(Err(BrokerError::Invalid(format!(
                    "job {id} is running on another node; cancel it with that node's qctl, \
                     or wait for its attempt to end"
                ))));
            }
            then => self.dispatch(then, now, mono),
        }
    }

    /// The leader of `epoch` looks for leases that ended without their holder.
    pub(in crate::broker) fn sweep(&mut self, epoch: u64) {
        if !self.shared() || self.sweeping {
            return;
        }
        self.sweeping = true;
        let myself = self.myself.clone();
        self.store.submit(
            move |b| {
                b.shared()
                    .ok_or_else(not_shared)?
                    .expired_leases(SWEEP_BATCH)
            },
            move |result| {
                let _ = myself.cast(BrokerMsg::Swept(epoch, result));
            },
        );
    }

    /// Ends the expired leases the sweep found, each through the retry policy as an
    /// expired lease, in one write fenced by `epoch`.
    pub(in crate::broker) fn swept(
        &mut self,
        epoch: u64,
        result: Result<Vec<Job>, StoreError>,
        now: UnixMillis,
    ) {
        self.sweeping = false;
        let leases = match result {
            Ok(leases) => leases,
            Err(err) => {
                warn!(error = %err, "The sweep for expired leases failed; the next heartbeat tries again.");
                return;
            }
        };
        let mut planned = Vec::new();
        for lease in leases {
            let lease = Job {
                queue: self.intern(&lease.queue),
                tenant: self.intern(&lease.tenant),
                ..lease
            };
            if self.writing.contains(&lease.id) {
                continue;
            }
            if let Some(known) = self.jobs.get(lease.id) {
                if known.state == State::Leased {
                    continue;
                }
                self.drop_stale(&known);
            }
            let backoff = self
                .queue(&lease.queue)
                .map_or(super::FALLBACK_BACKOFF, |q| q.backoff);
            let event = Event::Fail {
                token: lease.lease_seq,
                jitter: self.rng.random::<f64>(),
                failure: Failure::LeaseExpired {
                    reason: format!(
                        "lease held by {} ended without its node (the node stopped \
                         heartbeating or its lease passed)",
                        lease.worker.as_deref().unwrap_or("a worker")
                    ),
                },
            };
            match job::apply(&lease, event, &backoff, now) {
                Ok(t) => planned.push((lease, t)),
                Err(err) => {
                    debug!(job = %lease.id, error = %err, "An expired lease could not be ended.")
                }
            }
        }
        if !planned.is_empty() {
            let n = planned.len();
            self.commit_each(Intent::Expire(epoch), planned, move |result| {
                if let Ok(applied) = result {
                    let ended = applied.iter().filter(|a| **a).count();
                    tracing::info!(
                        found = n,
                        ended,
                        "The leader ended leases of dead or silent nodes."
                    );
                }
            });
        }
    }
}
