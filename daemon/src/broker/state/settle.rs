//! Writes first, memory second: how a planned change of the Broker's state reaches
//! the store and, only once it committed, the Broker's memory.
//!
//! A change is planned ([`BrokerState::plan`]) without touching memory, its job is
//! marked as *writing* (no other event applies to it meanwhile), and the write is
//! returned as an effect (`broker/effects.rs`) for the actor to submit. The store's
//! completion sends a [`Settle`] back to the Broker, which
//! applies the change if it committed or, if it failed, leaves the job as it was
//! (a lease gets a fresh deadline: a failed write is never charged to a job).
//!
//! The same answers tell the Broker whether the store accepts writes: while it does
//! not, nothing is picked for lessees (they wait in their long poll), lease
//! expiries wait, and a probe write every [`PROBE_EVERY`] finds out when it does
//! again; then everything resumes by itself. `qd_store_writable` shows it.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::{BrokerState, events, record_end};
use crate::broker::BrokerMsg;
use crate::job::{Failure, Job, JobId, Outcome, State, Token, Transition, UnixMillis};
use crate::metrics::{self, Completion};
use crate::store::StoreError;

use std::sync::Arc;

/// How often the Broker tries a small write while the store refuses writes.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Which store intent a planned batch of transitions is written as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Intent {
    /// The end of attempts (ack, nack, expiry, lost worker, cancel of a running job):
    /// [`crate::store::Backend::complete`].
    End,
    /// Dead jobs back to ready: [`crate::store::Backend::redrive`].
    Redrive,
    /// One dead job back to ready with these new payload bytes:
    /// [`crate::store::Backend::redrive_with_payload`].
    RedriveWithPayload(Arc<[u8]>),
    /// Operator cancels: [`crate::store::Backend::cancel`].
    Cancel,
    /// The leader of this epoch ends leases of dead or silent nodes (never held in
    /// this node's memory): [`crate::store::SharedStore::expire`].
    Expire(u64),
    /// Leases of this node the store holds and its memory does not (uncharged):
    /// [`crate::store::Backend::complete`].
    Orphan,
    /// An operator's cancel of a job another node runs (never held in this node's
    /// memory): [`crate::store::Backend::complete`], conditioned on that lease's token.
    CancelElsewhere,
}

/// What a [`Settle`] runs: the Broker's state, wall time, monotonic time.
type SettleFn = dyn FnOnce(&mut BrokerState, UnixMillis, Instant) + Send;

/// The memory side of a store write, run on the Broker once the write answered.
pub struct Settle(Box<SettleFn>);

impl Settle {
    /// A settle that runs `f`.
    pub(super) fn with(
        f: impl FnOnce(&mut BrokerState, UnixMillis, Instant) + Send + 'static,
    ) -> Settle {
        Settle(Box::new(f))
    }

    /// Runs it against the Broker's state at wall time `now`, monotonic `mono`.
    pub(crate) fn run(self, state: &mut BrokerState, now: UnixMillis, mono: Instant) {
        (self.0)(state, now, mono)
    }
}

/// What a purge's write did.
#[derive(Debug, Default)]
pub(super) struct Purged {
    /// Deleted.
    pub(super) gone: Vec<JobId>,
    /// Kept, with the unfinished jobs each holds back.
    pub(super) held: Vec<(JobId, Vec<JobId>)>,
    /// Children a released edge moved (their new records).
    pub(super) released: Vec<Job>,
}

impl BrokerState {
    /// [`BrokerState::commit_each`] answered as one result: an error if the write
    /// failed or any item was refused.
    pub(super) fn commit(
        &mut self,
        intent: Intent,
        planned: Vec<(Job, Transition)>,
        done: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) {
        self.commit_each(intent, planned, move |result| {
            done(result.and_then(|applied| {
                let refused = applied.iter().filter(|a| !**a).count();
                if refused == 0 {
                    Ok(())
                } else {
                    Err(StoreError::Other(format!(
                        "{refused} job(s) were not in the stored state the broker expected; \
                         nothing written for them"
                    )))
                }
            }))
        });
    }

    /// Asks for `planned` (each job's record before and its transition) as one store
    /// batch of `intent`. Once it answered, `done` is called at once on the writer
    /// thread (the write is durable: the caller need not wait for the Broker) with
    /// whether each item applied, or the write's error, and a [`Settle`] applies the
    /// committed items to the Broker's memory.
    pub(super) fn commit_each(
        &mut self,
        intent: Intent,
        planned: Vec<(Job, Transition)>,
        done: impl FnOnce(Result<Vec<bool>, StoreError>) + Send + 'static,
    ) {
        if planned.is_empty() {
            self.reply_later(move || done(Ok(Vec::new())));
            return;
        }
        self.writing.extend(planned.iter().map(|(old, _)| old.id));
        let writes: Vec<Transition> = planned.iter().map(|(_, t)| t.clone()).collect();
        let op = intent.clone();
        self.write(
            move |b| {
                let applied = match op {
                    Intent::End | Intent::Orphan | Intent::CancelElsewhere => b.complete(&writes),
                    Intent::Redrive => b.redrive(&writes),
                    Intent::RedriveWithPayload(payload) => writes
                        .iter()
                        .map(|t| b.redrive_with_payload(t, &payload))
                        .collect(),
                    Intent::Cancel => b.cancel(&writes),
                    Intent::Expire(epoch) => match b.shared() {
                        Some(shared) => shared.expire(&writes, epoch),
                        None => Err(StoreError::Other("expire: the store is not shared".into())),
                    },
                }?;
                // The edges of the jobs just written move in the same transaction,
                // after their fenced updates applied (`deps.rs`).
                let moved: Vec<(JobId, State)> = writes
                    .iter()
                    .zip(&applied)
                    .filter(|(_, a)| **a)
                    .map(|(t, _)| (t.job.id, t.job.state))
                    .collect();
                let now = writes.iter().map(|t| t.job.updated_at).max().unwrap_or(0);
                let children = b.move_edges(&moved, now)?;
                Ok((applied, children))
            },
            move |result, back| {
                let (result, children) = match result {
                    Ok((applied, children)) => (Ok(applied), children),
                    Err(e) => (Err(e), Vec::new()),
                };
                // The Settle is queued before the caller hears the answer, so any
                // message the caller sends next reaches the Broker after it.
                let answer = result.clone();
                let settle = Settle(Box::new(move |state: &mut BrokerState, now, mono| {
                    state.settle(intent, planned, result, now, mono);
                    state.dependents_moved(children, now);
                }));
                back(BrokerMsg::Settle(settle));
                done(answer);
            },
        );
    }

    pub(super) fn settle(
        &mut self,
        intent: Intent,
        planned: Vec<(Job, Transition)>,
        result: Result<Vec<bool>, StoreError>,
        now: UnixMillis,
        mono: Instant,
    ) {
        for (old, _) in &planned {
            self.writing.remove(&old.id);
        }
        let applied = match result {
            Ok(applied) => applied,
            Err(err) => {
                self.store_refused(&err);
                for (old, t) in &planned {
                    self.rearm(old.id, old.lease_seq, mono);
                    if let Some(entry) = t
                        .entry
                        .as_ref()
                        .filter(|e| e.outcome == Outcome::Interrupted)
                    {
                        let reason = entry.error.clone().unwrap_or_default();
                        self.end_uncharged_later(old.id, old.lease_seq, reason);
                    }
                }
                return;
            }
        };
        for ((old, t), applied) in planned.into_iter().zip(applied) {
            if applied {
                self.apply(&intent, old, t, now);
            } else if self.shared() {
                // Another node changed the job: memory's copy is stale.
                if let Some(known) = self.jobs.get(old.id) {
                    self.drop_stale(&known);
                }
            } else {
                error!(job = %old.id, state = %old.state, "The store did not hold the state the Broker expected; the change was not written.");
            }
        }
        // Only now, with this write applied, may uncharged ends be planned (and
        // waiting lessees served, after this message): they must see what it
        // changed (a cancel, an end).
        self.store_accepted(now);
        self.end_uncharged(now);
    }

    /// Applies a committed transition to memory, the derived actors and the metrics.
    fn apply(&mut self, intent: &Intent, old: Job, t: Transition, now: UnixMillis) {
        debug!(queue = %old.queue, job = %old.id, from = %old.state, to = %t.job.state,
            attempts = t.job.attempts, "Job state changed.");
        // A lease memory did not hold as this node's (another node's, or one read
        // from the store for a report sent here) took no slot in this node's
        // dispatch: only a job that waits again is handed to it.
        let foreign = old.state == State::Leased
            && self
                .jobs
                .get(old.id)
                .is_none_or(|j| j.state != State::Leased || j.lease_seq != old.lease_seq);
        self.replace(t.job.clone());
        if foreign {
            if matches!(t.job.state, State::Ready | State::Delayed) {
                events::ready(&mut self.dispatches, &t.job);
            }
        } else {
            events::changed(&mut self.dispatches, &old, &t.job, now);
        }
        match intent {
            Intent::End | Intent::Expire(_) | Intent::Orphan | Intent::CancelElsewhere => {
                record_end(&self.labels, &old, &t, now);
                let Some(entry) = &t.entry else { return };
                if entry.outcome == Outcome::LeaseExpired {
                    metrics::lease_expired(&old.queue);
                }
                if !matches!(entry.outcome, Outcome::Succeeded | Outcome::Cancelled) {
                    warn!(queue = %old.queue, tenant = %old.tenant, job = %old.id, attempt = entry.attempt,
                        outcome = %entry.outcome, next = %t.job.state,
                        error = entry.error.as_deref().unwrap_or(""), "Attempt failed.");
                }
            }
            Intent::Cancel => {
                metrics::job_completed(&self.labels, &old.queue, &old.tenant, Completion::Cancelled)
            }
            Intent::Redrive | Intent::RedriveWithPayload(_) => {}
        }
    }

    /// Files children whose state a parent's committed change moved (`deps.rs`):
    /// a released one goes to its queue's dispatch, a blocked one is counted. On a shared
    /// store a released child this node did not hold is offered like one of its
    /// own enqueues (other nodes find it through their refresh, as another node's
    /// enqueue), and a held one stays (or becomes again) the database's alone.
    pub(super) fn dependents_moved(&mut self, children: Vec<Job>, now: UnixMillis) {
        for child in children {
            let old = self.jobs.get(child.id);
            // The store answers only children that left a held state or moved
            // between the two: one not held now was released.
            if !child.state.is_held() {
                metrics::dependencies_released(&child.queue);
            }
            if child.state == State::Blocked {
                metrics::dependencies_blocked(&child.queue);
            }
            debug!(queue = %child.queue, job = %child.id, to = %child.state, "Dependencies moved a job.");
            match old {
                // An operator's change read it into memory (`reload_then`); held
                // now, it is the database's alone again.
                Some(old) if self.shared() && child.state.is_held() => self.drop_stale(&old),
                Some(old) => {
                    self.replace(child.clone());
                    events::changed(&mut self.dispatches, &old, &child, now);
                }
                None if self.shared() && child.state.is_held() => {}
                None => {
                    let child = self.interned(child);
                    if !child.state.is_held() {
                        events::ready(&mut self.dispatches, &child);
                    }
                    self.replace(child);
                }
            }
        }
    }

    /// Deletes dead jobs from the store, then from memory once that committed. In
    /// the same write, a job that holds back unfinished jobs (`Backend::blocked_by`)
    /// is kept and answered in [`Purged::held`], unless `release_by` names the
    /// operator: then its edges to them count as met first (`release_parent`) and
    /// the children it released are applied to memory with the purge.
    pub(super) fn commit_purge(
        &mut self,
        ids: Vec<JobId>,
        release_by: Option<String>,
        now: UnixMillis,
        done: impl FnOnce(Result<Purged, StoreError>) + Send + 'static,
    ) {
        if ids.is_empty() {
            self.reply_later(move || done(Ok(Purged::default())));
            return;
        }
        self.writing.extend(ids.iter().copied());
        // In id order: on a shared store each check locks its parent's row, and
        // every transaction locks parents by id.
        let mut asked = ids.clone();
        asked.sort_unstable();
        self.write(
            move |b| {
                let mut free = Vec::new();
                let mut held = Vec::new();
                let mut released = Vec::new();
                for id in asked {
                    let blocked = b.blocked_by(id)?;
                    if blocked.is_empty() {
                        free.push(id);
                        continue;
                    }
                    match &release_by {
                        Some(by) => {
                            released.extend(b.release_parent(id, by, now)?);
                            free.push(id);
                        }
                        None => held.push((id, blocked)),
                    }
                }
                let applied = b.purge(&free)?;
                let gone: Vec<JobId> = free
                    .into_iter()
                    .zip(applied)
                    .filter_map(|(id, applied)| applied.then_some(id))
                    .collect();
                Ok(Purged {
                    gone,
                    held,
                    released,
                })
            },
            move |result, back| {
                let settle = Settle(Box::new(move |state: &mut BrokerState, now, _| {
                    for id in &ids {
                        state.writing.remove(id);
                    }
                    match &result {
                        Ok(purged) => {
                            state.forget(&purged.gone);
                            state.dependents_moved(purged.released.clone(), now);
                            state.store_accepted(now);
                        }
                        Err(err) => state.store_refused(err),
                    }
                    done(result);
                }));
                back(BrokerMsg::Settle(settle));
            },
        );
    }

    /// Drops purged jobs from memory.
    fn forget(&mut self, ids: &[JobId]) {
        for id in ids {
            if let Some(job) = self.jobs.remove(*id) {
                self.account(&job, false);
            }
        }
    }

    /// Gives a lease whose end could not be written (or whose expiry must wait for
    /// the store) a fresh deadline, so the failure is not charged to its job.
    pub(super) fn rearm(&mut self, id: JobId, token: Token, mono: Instant) {
        let Some(job) = self.jobs.get(id) else {
            return;
        };
        if job.state != State::Leased || job.lease_seq != token {
            return;
        }
        let lease = self
            .config
            .queues
            .get(&*job.queue)
            .map_or(PROBE_EVERY, |q| q.lease);
        let deadline = mono + lease;
        if self.deadlines.get(id).is_none_or(|d| d < deadline) {
            self.deadlines.track(id, token, deadline);
        }
    }

    /// A write failed: the store refuses writes until a later one succeeds.
    pub(super) fn store_refused(&mut self, err: &StoreError) {
        if self.store_writable {
            error!(error = %err, "Store refuses writes; leasing stops and lease expiries wait until a write succeeds.");
        }
        self.store_writable = false;
        metrics::store_writable(false);
    }

    /// A write committed: if the store had refused writes, leasing resumes (the
    /// lessees still waiting are served after this message) and the uncharged
    /// lease ends it refused are written again.
    pub(super) fn store_accepted(&mut self, now: UnixMillis) {
        if self.store_writable {
            return;
        }
        info!("Store accepts writes again; leasing resumes.");
        self.store_writable = true;
        metrics::store_writable(true);
        self.end_uncharged(now);
    }

    /// Remembers an uncharged end of the lease `token` of job `id` the store refused
    /// (once per lease), for [`Self::end_uncharged`].
    fn end_uncharged_later(&mut self, id: JobId, token: Token, reason: String) {
        if !self
            .uncharged_ends
            .iter()
            .any(|(i, t, _)| (*i, *t) == (id, token))
        {
            self.uncharged_ends.push((id, token, reason));
        }
    }

    /// While the store accepts writes, ends each remembered uncharged lease that is
    /// still held and has no write of its job in flight (that write's settle calls
    /// this again). An entry is kept until its lease is gone, so an end refused
    /// again, or a write of the same job that failed meanwhile, leaves it for later;
    /// a lease that ended otherwise (a cancel, an ack) drops it.
    fn end_uncharged(&mut self, now: UnixMillis) {
        if !self.store_writable || self.uncharged_ends.is_empty() {
            return;
        }
        let jobs = &self.jobs;
        self.uncharged_ends.retain(|(id, token, _)| {
            jobs.get(*id)
                .is_some_and(|j| j.state == State::Leased && j.lease_seq == *token)
        });
        let due: Vec<(JobId, Token, String)> = self
            .uncharged_ends
            .iter()
            .filter(|(id, ..)| !self.writing.contains(id))
            .cloned()
            .collect();
        for (id, token, reason) in due {
            self.fail(id, token, Failure::Interrupted { reason }, None, now);
        }
    }

    /// Returns a dispatch's picks unleased: each slot is released and each job
    /// still waiting is handed to the dispatch again.
    pub(super) fn hand_back(&mut self, queue: &Arc<str>, picks: Vec<(Arc<str>, JobId)>) {
        for (tenant, id) in picks {
            events::release(&mut self.dispatches, queue, &tenant);
            if let Some(job) = self
                .jobs
                .get(id)
                .filter(|j| matches!(j.state, State::Ready | State::Delayed))
            {
                events::ready(&mut self.dispatches, &job);
            }
        }
    }

    /// Timer: while the store refuses writes, tries one small write.
    pub(crate) fn probe(&mut self, now: UnixMillis) {
        if self.store_writable {
            return;
        }
        self.write(
            move |b| b.probe(now),
            move |result, back| {
                let settle = Settle(Box::new(
                    move |state: &mut BrokerState, now, _| match result {
                        Ok(()) => state.store_accepted(now),
                        Err(err) => debug!(error = %err, "Store still refuses writes."),
                    },
                ));
                back(BrokerMsg::Settle(settle));
            },
        );
    }
}
