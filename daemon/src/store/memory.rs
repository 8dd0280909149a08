//! The in-memory engine: the same [`Backend`] semantics as SQLite over ordered maps,
//! with savepoints and rollback from an undo log. A row keeps the durable record and,
//! apart, its live lease, as SQLite keeps leases in a temp table. It is the model the property tests
//! compare the SQLite engine against, so it favours plainness over speed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::contract::{Intent, UNFINISHED};
use super::{
    Backend, Engine, HistoryLimits, Inserted, JobDetail, JobFilter, JobOrder, NewRecord, Override,
    PruneScope, SqsQueueRecord, StoreError, history, sort_counts,
};
use crate::job::{HistoryEntry, Job, JobId, State, Token, Transition, UnixMillis};

/// A [`Backend`] kept in memory; nothing survives the process.
#[derive(Default)]
pub struct MemoryBackend {
    jobs: BTreeMap<JobId, Row>,
    /// `(queue, idempotency_key)` of every stored job that has a key.
    keys: HashMap<(Arc<str>, String), JobId>,
    overrides: BTreeMap<OverrideKey, String>,
    sqs_queues: BTreeMap<String, SqsQueueRecord>,
    schedules: BTreeMap<String, super::ScheduleRow>,
    /// Writes of the open transaction, newest last, as the values they replaced.
    undo: Vec<Undo>,
    /// Lengths of `undo` at each open savepoint.
    savepoints: Vec<usize>,
    in_transaction: bool,
    history_limits: HistoryLimits,
    /// Models a backend shared by several nodes ([`MemoryBackend::shared`]).
    shared: bool,
}

#[derive(Clone)]
struct Row {
    /// The durable record (never in state leased).
    job: Job,
    payload: Vec<u8>,
    /// What the job handed back, written by the ack, cleared by a redrive.
    result: Option<Vec<u8>>,
    /// `(seq, entry)`, numbered and capped as SQLite does.
    history: Vec<(u64, HistoryEntry)>,
    /// The live lease, if any: (token, worker, leased_at).
    lease: Option<(Token, String, UnixMillis)>,
}

impl Row {
    /// The record as readers see it: the live lease laid over the stored row.
    fn view(&self) -> Job {
        let mut job = self.job.clone();
        if let Some((token, worker, at)) = &self.lease {
            job.state = State::Leased;
            job.lease_seq = *token;
            job.worker = Some(worker.clone());
            job.leased_at = Some(*at);
        }
        job
    }

    fn claimable(&self) -> bool {
        self.lease.is_none() && Intent::Claim.applies_to(self.job.state)
    }
}

/// The mutable columns of a transition's record, as SQLite's `UPDATE` writes them.
fn stored(t: &Transition, old: &Job) -> Job {
    Job {
        state: t.job.state,
        attempts: t.job.attempts,
        budget_start: t.job.budget_start,
        lease_seq: t.job.lease_seq,
        ready_at: t.job.ready_at,
        updated_at: t.job.updated_at,
        last_error: t.job.last_error.clone(),
        ..old.clone()
    }
}

type OverrideKey = (String, String, String);

enum Undo {
    Job(JobId, Option<Box<Row>>),
    Override(OverrideKey, Option<String>),
    SqsQueue(String, Option<SqsQueueRecord>),
    Schedule(String, Option<super::ScheduleRow>),
}

fn key_of(job: &Job) -> Option<(Arc<str>, String)> {
    job.idempotency_key
        .as_ref()
        .map(|key| (Arc::clone(&job.queue), key.clone()))
}

impl MemoryBackend {
    /// An empty store applying `history_limits` on every append.
    pub fn new(history_limits: HistoryLimits) -> Self {
        MemoryBackend {
            history_limits,
            ..MemoryBackend::default()
        }
    }

    /// The model of a backend shared by several nodes (PostgreSQL): leases are not
    /// local ([`Backend::leases_are_local`] is `false`), so a claim is the lease, and
    /// an attempt ends only under its recorded lease's token.
    pub fn shared(history_limits: HistoryLimits) -> Self {
        MemoryBackend {
            shared: true,
            ..MemoryBackend::new(history_limits)
        }
    }

    /// Sets the row of `id` (or removes it), keeping the key index; returns the old row.
    fn replace(&mut self, id: JobId, row: Option<Row>) -> Option<Row> {
        let old = match row {
            Some(row) => self.jobs.insert(id, row),
            None => self.jobs.remove(&id),
        };
        if let Some(key) = old.as_ref().and_then(|o| key_of(&o.job)) {
            self.keys.remove(&key);
        }
        if let Some(key) = self.jobs.get(&id).and_then(|n| key_of(&n.job)) {
            self.keys.insert(key, id);
        }
        old
    }

    /// [`MemoryBackend::replace`], remembered for rollback inside a transaction.
    fn write_job(&mut self, id: JobId, row: Option<Row>) {
        let old = self.replace(id, row);
        if self.in_transaction {
            self.undo.push(Undo::Job(id, old.map(Box::new)));
        }
    }

    fn write_override(&mut self, key: OverrideKey, value: Option<String>) {
        let old = match value {
            Some(value) => self.overrides.insert(key.clone(), value),
            None => self.overrides.remove(&key),
        };
        if self.in_transaction {
            self.undo.push(Undo::Override(key, old));
        }
    }

    /// Changes the schedule row `name` (created if missing) with `change`,
    /// remembered for rollback inside a transaction.
    fn write_schedule(
        &mut self,
        name: &str,
        now: UnixMillis,
        change: impl FnOnce(&mut super::ScheduleRow),
    ) {
        let old = self.schedules.get(name).cloned();
        let mut row = old
            .clone()
            .unwrap_or_else(|| super::ScheduleRow::new(name, now));
        change(&mut row);
        row.updated_at = now;
        self.schedules.insert(name.to_owned(), row);
        if self.in_transaction {
            self.undo.push(Undo::Schedule(name.to_owned(), old));
        }
    }

    /// Undoes writes, newest first, until `undo` is `len` long.
    fn undo_to(&mut self, len: usize) {
        while self.undo.len() > len {
            match self.undo.pop() {
                Some(Undo::Job(id, row)) => {
                    self.replace(id, row.map(|r| *r));
                }
                Some(Undo::Override(key, Some(value))) => {
                    self.overrides.insert(key, value);
                }
                Some(Undo::Override(key, None)) => {
                    self.overrides.remove(&key);
                }
                Some(Undo::SqsQueue(name, Some(record))) => {
                    self.sqs_queues.insert(name, record);
                }
                Some(Undo::SqsQueue(name, None)) => {
                    self.sqs_queues.remove(&name);
                }
                Some(Undo::Schedule(name, Some(row))) => {
                    self.schedules.insert(name, row);
                }
                Some(Undo::Schedule(name, None)) => {
                    self.schedules.remove(&name);
                }
                None => break,
            }
        }
    }

    /// Writes `t` and its history line if `allowed` holds for the stored row.
    fn change(&mut self, t: &Transition, allowed: impl Fn(&Row) -> bool) -> bool {
        self.change_result(t, allowed, false)
    }

    /// [`Self::change`], clearing the stored result first with `clear` (a redrive).
    fn change_result(
        &mut self,
        t: &Transition,
        allowed: impl Fn(&Row) -> bool,
        clear: bool,
    ) -> bool {
        let Some(mut row) = self.jobs.get(&t.job.id).filter(|r| allowed(r)).cloned() else {
            return false;
        };
        row.job = stored(t, &row.job);
        row.lease = None;
        if clear {
            row.result = None;
        }
        if let Some(result) = &t.result {
            row.result = Some(result.to_vec());
        }
        if let Some(entry) = &t.entry {
            let seq = row.history.last().map_or(1, |(seq, _)| seq + 1);
            let entry = history::bounded(entry, &self.history_limits).into_owned();
            row.history.push((seq, entry));
            if let Some((from, to)) = history::doomed(&self.history_limits, seq) {
                row.history.retain(|(s, _)| *s < from || *s > to);
            }
        }
        self.write_job(t.job.id, Some(row));
        true
    }

    /// Deletes the row of `id` if its stored state is one of `states`.
    fn delete(&mut self, id: JobId, states: &[State]) -> bool {
        let found = self
            .jobs
            .get(&id)
            .is_some_and(|r| states.contains(&r.job.state));
        if found {
            self.write_job(id, None);
        }
        found
    }

    fn matches(job: &Job, filter: &JobFilter) -> bool {
        let error_matches = |needle: &String| {
            job.last_error.as_ref().is_some_and(|e| {
                e.to_ascii_lowercase()
                    .contains(&needle.to_ascii_lowercase())
            })
        };
        filter.queue.as_deref().is_none_or(|q| *job.queue == *q)
            && filter.tenant.as_deref().is_none_or(|t| *job.tenant == *t)
            && filter
                .state
                .is_none_or(|s| job.shown_state(filter.now) == s)
            && filter.error_contains.as_ref().is_none_or(error_matches)
            && filter.updated_since.is_none_or(|t| job.updated_at >= t)
    }
}

impl Backend for MemoryBackend {
    fn enqueue(&mut self, batch: &[NewRecord]) -> Result<Vec<Inserted>, StoreError> {
        let mut answers = Vec::with_capacity(batch.len());
        for NewRecord { job, payload } in batch {
            if let Some(id) = key_of(job).and_then(|key| self.keys.get(&key).copied()) {
                let same_payload = self
                    .jobs
                    .get(&id)
                    .is_some_and(|row| row.payload == *payload);
                answers.push(Inserted::Duplicate { id, same_payload });
                continue;
            }
            if self.jobs.contains_key(&job.id) {
                return Err(StoreError::Other(format!("job {} already stored", job.id)));
            }
            let row = Row {
                job: job.clone(),
                payload: payload.clone(),
                result: None,
                history: Vec::new(),
                lease: None,
            };
            self.write_job(job.id, Some(row));
            answers.push(Inserted::New);
        }
        Ok(answers)
    }

    fn leases_are_local(&self) -> bool {
        !self.shared
    }

    fn claim(&mut self, leased: &[Job]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut payloads = Vec::with_capacity(leased.len());
        for job in leased {
            let Some(mut row) = self.jobs.get(&job.id).filter(|r| r.claimable()).cloned() else {
                payloads.push(None);
                continue;
            };
            let worker = job.worker.clone().unwrap_or_default();
            row.lease = Some((
                job.lease_seq,
                worker,
                job.leased_at.unwrap_or(job.updated_at),
            ));
            payloads.push(Some(row.payload.clone()));
            self.write_job(job.id, Some(row));
        }
        Ok(payloads)
    }

    fn complete(&mut self, ends: &[Transition]) -> Result<Vec<bool>, StoreError> {
        Ok(ends
            .iter()
            .map(|t| {
                let token = t.job.lease_seq;
                if self.shared {
                    return self.change(t, |r| {
                        r.lease.as_ref().is_some_and(|l| l.0 == token)
                            && Intent::Complete.applies_to(r.job.state)
                    });
                }
                if let Some(mut row) = self
                    .jobs
                    .get(&t.job.id)
                    .filter(|r| r.lease.as_ref().is_some_and(|l| l.0 == token))
                    .cloned()
                {
                    // Through the undo log, like every write: a rolled-back savepoint
                    // restores the lease, as SQLite restores its deleted row.
                    row.lease = None;
                    self.write_job(t.job.id, Some(row));
                }
                self.change(t, |r| {
                    r.lease.is_none()
                        && Intent::Complete.applies_to(r.job.state)
                        && r.job.lease_seq < token
                })
            })
            .collect())
    }

    fn redrive(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        Ok(changes
            .iter()
            .map(|t| self.change_result(t, |r| Intent::Redrive.applies_to(r.job.state), true))
            .collect())
    }

    fn set_payload(&mut self, id: JobId, payload: &[u8]) -> Result<bool, StoreError> {
        let Some(mut row) = self.jobs.get(&id).cloned() else {
            return Ok(false);
        };
        row.payload = payload.to_vec();
        self.write_job(id, Some(row));
        Ok(true)
    }

    fn cancel(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        let cancellable = |r: &Row| r.lease.is_none() && Intent::Cancel.applies_to(r.job.state);
        Ok(changes
            .iter()
            .map(|t| self.change(t, cancellable))
            .collect())
    }

    fn purge(&mut self, ids: &[JobId]) -> Result<Vec<bool>, StoreError> {
        Ok(ids
            .iter()
            .map(|id| self.delete(*id, Intent::Purge.states()))
            .collect())
    }

    fn load_unfinished(&mut self) -> Result<Vec<Job>, StoreError> {
        Ok(self
            .jobs
            .values()
            .filter(|row| UNFINISHED.contains(&row.job.state))
            .map(Row::view)
            .collect())
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobDetail>, StoreError> {
        Ok(self.jobs.get(&id).map(|row| {
            let seqs: Vec<u64> = row.history.iter().map(|(seq, _)| *seq).collect();
            let (history_elided, history_elided_at) = history::elided(&seqs);
            JobDetail {
                job: row.view(),
                payload: row.payload.clone(),
                result: row.result.clone(),
                history: row.history.iter().map(|(_, e)| e.clone()).collect(),
                history_elided,
                history_elided_at,
            }
        }))
    }

    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        let mut jobs: Vec<Job> = self
            .jobs
            .values()
            .map(Row::view)
            .filter(|job| Self::matches(job, filter))
            .collect();
        match filter.order {
            JobOrder::OldestFirst => {}
            JobOrder::NewestFirst => jobs.reverse(),
            JobOrder::RecentlyUpdated => {
                jobs.sort_by_key(|j| std::cmp::Reverse((j.updated_at, j.id)));
            }
        }
        if let Some(after) = filter.after {
            let beyond = |job: &Job| match filter.order {
                JobOrder::OldestFirst => Some(job.id > after),
                JobOrder::NewestFirst => Some(job.id < after),
                JobOrder::RecentlyUpdated => self
                    .jobs
                    .get(&after)
                    .map(|c| (job.updated_at, job.id) < (c.job.updated_at, after)),
            };
            jobs.retain(|job| beyond(job).unwrap_or(false));
        }
        jobs.truncate(filter.limit as usize);
        Ok(jobs)
    }

    fn prune_finished(
        &mut self,
        scope: &PruneScope,
        finished_before: UnixMillis,
        limit: u32,
    ) -> Result<u64, StoreError> {
        // Succeeded first, then cancelled; each oldest first, ties in id order, as
        // the SQL does.
        let mut doomed: Vec<(usize, UnixMillis, JobId)> = self
            .jobs
            .values()
            .filter(|row| scope.covers(&row.job) && row.job.updated_at < finished_before)
            .filter_map(|row| {
                let rank = Intent::Prune
                    .states()
                    .iter()
                    .position(|s| *s == row.job.state)?;
                Some((rank, row.job.updated_at, row.job.id))
            })
            .collect();
        doomed.sort_unstable();
        doomed.truncate(limit as usize);
        for (_, _, id) in &doomed {
            self.write_job(*id, None);
        }
        Ok(doomed.len() as u64)
    }

    fn oldest_finished(&mut self, scope: &PruneScope) -> Result<Option<UnixMillis>, StoreError> {
        Ok(self
            .jobs
            .values()
            .map(|row| &row.job)
            .filter(|job| scope.covers(job) && Intent::Prune.applies_to(job.state))
            .map(|job| job.updated_at)
            .min())
    }

    fn release_space(&mut self, _keep_free: u32, _max_pages: u32) -> Result<u32, StoreError> {
        Ok(0)
    }

    fn set_override(
        &mut self,
        scope: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        let at = (scope.to_owned(), name.to_owned(), key.to_owned());
        self.write_override(at, value.map(str::to_owned));
        Ok(())
    }

    fn sqs_queues(&mut self) -> Result<Vec<SqsQueueRecord>, StoreError> {
        Ok(self.sqs_queues.values().cloned().collect())
    }

    fn set_sqs_queue(
        &mut self,
        name: &str,
        record: Option<&SqsQueueRecord>,
    ) -> Result<bool, StoreError> {
        let old = match record {
            Some(r) => self.sqs_queues.insert(name.to_string(), r.clone()),
            None => self.sqs_queues.remove(name),
        };
        let existed = old.is_some();
        if self.in_transaction {
            self.undo.push(Undo::SqsQueue(name.to_string(), old));
        }
        Ok(existed)
    }

    fn schedules(&mut self) -> Result<Vec<super::ScheduleRow>, StoreError> {
        Ok(self.schedules.values().cloned().collect())
    }

    fn advance_schedule(&mut self, advance: &super::Advance) -> Result<bool, StoreError> {
        let stored = self.schedules.get(&advance.name);
        let applies = match stored {
            None => advance.expect.is_none(),
            Some(row) => !row.paused && row.next_tick == advance.expect,
        };
        if applies {
            self.write_schedule(&advance.name, advance.now, |row| {
                row.spec.clone_from(&advance.spec);
                row.next_tick = advance.next;
            });
        }
        Ok(applies)
    }

    fn record_schedule_run(
        &mut self,
        name: &str,
        tick: UnixMillis,
        job: JobId,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.write_schedule(name, now, |row| {
            row.last_tick = Some(tick);
            row.last_job = Some(job);
        });
        Ok(())
    }

    fn set_schedule_paused(
        &mut self,
        name: &str,
        paused: bool,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.write_schedule(name, now, |row| {
            if row.paused && !paused {
                row.next_tick = None;
            }
            row.paused = paused;
        });
        Ok(())
    }

    fn overrides(&mut self) -> Result<Vec<Override>, StoreError> {
        Ok(self
            .overrides
            .iter()
            .map(|((scope, name, key), value)| Override {
                scope: scope.clone(),
                name: name.clone(),
                key: key.clone(),
                value: value.clone(),
            })
            .collect())
    }

    /// Memory never refuses a write.
    fn probe(&mut self, _now: UnixMillis) -> Result<(), StoreError> {
        Ok(())
    }

    fn counts(&mut self) -> Result<Vec<(String, State, u64)>, StoreError> {
        let mut tally: HashMap<(&str, State), u64> = HashMap::new();
        for row in self.jobs.values() {
            let state = if row.lease.is_some() {
                State::Leased
            } else {
                row.job.state
            };
            *tally.entry((&row.job.queue, state)).or_default() += 1;
        }
        let mut counts: Vec<_> = tally
            .into_iter()
            .map(|((queue, state), n)| (queue.to_owned(), state, n))
            .collect();
        sort_counts(&mut counts);
        Ok(counts)
    }

    fn tenant_counts(&mut self, queue: &str) -> Result<Vec<(String, State, u64)>, StoreError> {
        let mut tally: HashMap<(&str, State), u64> = HashMap::new();
        let unfinished = [State::Delayed, State::Ready, State::Leased, State::Dead];
        for row in self.jobs.values().filter(|row| &*row.job.queue == queue) {
            let state = if row.lease.is_some() {
                State::Leased
            } else {
                row.job.state
            };
            if unfinished.contains(&state) {
                *tally.entry((&row.job.tenant, state)).or_default() += 1;
            }
        }
        let mut counts: Vec<_> = tally
            .into_iter()
            .map(|((tenant, state), n)| (tenant.to_owned(), state, n))
            .collect();
        sort_counts(&mut counts);
        Ok(counts)
    }
}

impl Engine for MemoryBackend {
    fn begin(&mut self) -> Result<(), StoreError> {
        self.undo.clear();
        self.savepoints.clear();
        self.in_transaction = true;
        Ok(())
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.savepoints.push(self.undo.len());
        Ok(())
    }

    fn release(&mut self) -> Result<(), StoreError> {
        self.savepoints.pop();
        Ok(())
    }

    fn rollback_to(&mut self) -> Result<(), StoreError> {
        let mark = self.savepoints.pop().unwrap_or(0);
        self.undo_to(mark);
        Ok(())
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.undo.clear();
        self.savepoints.clear();
        self.in_transaction = false;
        Ok(())
    }

    fn rollback(&mut self) {
        self.undo_to(0);
        self.savepoints.clear();
        self.in_transaction = false;
    }

    fn shutdown(&mut self) {}
}
