//! The broker's in-memory state and the logic behind each [`super::BrokerMsg`].
//!
//! Invariants: `jobs` holds exactly the unfinished jobs (delayed, ready, leased,
//! dead) as last written to the store (or queued to be); `deadlines` and
//! `by_worker` hold exactly the leased ones; `counts` is derived from `jobs` plus
//! enqueues whose write is still pending. Every change goes through [`BrokerState::replace`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::events;
use super::{
    BatchOutcome, BrokerArgs, BrokerError, BrokerMsg, EnqueueRequest, Enqueued, LeaseInfo,
    LeasedJob, Resync,
};
use crate::backoff::{Backoff, Jitter};
use crate::config::{Config, QueueConfig};
use crate::dlq::DlqMsg;
use crate::job::{
    self, Event, Failure, HistoryEntry, Job, JobId, NewJob, Outcome, State, Token, Transition,
    UnixMillis,
};
use crate::lease_reaper::ReaperMsg;
use crate::limits::Limits;
use crate::metrics::{self, Completion, RejectReason, TenantLabels};
use crate::scheduler::SchedulerMsg;
use crate::store::{Inserted, Store, StoreError};

/// Unfinished jobs of one queue, by state, plus enqueues not yet durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Ready or delayed (the Scheduler knows which).
    pub waiting: u64,
    /// Leased.
    pub leased: u64,
    /// Dead (in the DLQ).
    pub dead: u64,
    /// Enqueues whose write is in flight.
    pub pending: u64,
}

impl QueueCounts {
    /// Jobs that count against `max_depth`: everything not dead.
    pub fn depth(&self) -> u64 {
        self.waiting + self.leased + self.pending
    }

    fn slot(&mut self, state: State) -> Option<&mut u64> {
        match state {
            State::Ready | State::Delayed => Some(&mut self.waiting),
            State::Leased => Some(&mut self.leased),
            State::Dead => Some(&mut self.dead),
            State::Succeeded | State::Cancelled => None,
        }
    }
}

/// The broker's state (see the module doc for its invariants).
pub struct BrokerState {
    pub(super) store: Store,
    pub(super) accepting: bool,
    /// The config in force as of the message being handled (see [`Self::follow_config`]).
    config: Arc<Config>,
    limits: Arc<Limits>,
    jobs: HashMap<JobId, Job>,
    deadlines: HashMap<JobId, Instant>,
    by_worker: HashMap<String, HashSet<JobId>>,
    counts: HashMap<Arc<str>, QueueCounts>,
    tenant_depth: HashMap<(Arc<str>, Arc<str>), u64>,
    names: HashSet<Arc<str>>,
    labels: TenantLabels,
    rng: StdRng,
    myself: ActorRef<BrokerMsg>,
}

impl BrokerState {
    pub(super) fn new(args: BrokerArgs, rng: StdRng, myself: ActorRef<BrokerMsg>) -> Self {
        let config = args.limits.config();
        let counts = config
            .queues
            .keys()
            .map(|q| (Arc::<str>::from(q.as_str()), QueueCounts::default()))
            .collect();
        let labels = TenantLabels::new(config.tenants.keys().cloned());
        BrokerState {
            store: args.store,
            accepting: true,
            config,
            limits: args.limits,
            jobs: HashMap::new(),
            deadlines: HashMap::new(),
            by_worker: HashMap::new(),
            counts,
            tenant_depth: HashMap::new(),
            names: HashSet::new(),
            labels,
            rng,
            myself,
        }
    }

    /// Takes the config in force from its owner ([`Limits`]) before each message, so
    /// one message sees one config and a reload applies from the next message on
    /// (new queues, depths, retry and lease settings for new attempts). Tenant labels
    /// follow the configured tenants.
    pub(super) fn follow_config(&mut self) {
        let current = self.limits.config();
        if !Arc::ptr_eq(&current, &self.config) {
            self.labels = TenantLabels::new(current.tenants.keys().cloned());
            self.config = current;
        }
    }

    /// Interns a queue or tenant name so every job shares one allocation.
    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(found) = self.names.get(name) {
            return found.clone();
        }
        let arc: Arc<str> = Arc::from(name);
        self.names.insert(arc.clone());
        arc
    }

    /// The queue's name if it is configured (metrics label only known queues).
    fn known_queue<'a>(&self, name: &'a str) -> Option<&'a str> {
        self.config.queues.contains_key(name).then_some(name)
    }

    fn queue(&self, name: &str) -> Result<&QueueConfig, BrokerError> {
        self.config
            .queues
            .get(name)
            .ok_or_else(|| BrokerError::UnknownQueue(name.to_string()))
    }

    /// Puts `job` in place of its previous record, keeping every derived index right.
    fn replace(&mut self, job: Job) {
        let id = job.id;
        if let Some(old) = self.jobs.remove(&id) {
            self.account(&old, false);
        }
        self.account(&job, true);
        if job.state == State::Leased
            && let Some(worker) = &job.worker
        {
            self.by_worker.entry(worker.clone()).or_default().insert(id);
        }
        if !job.state.is_final() || job.state == State::Dead {
            self.jobs.insert(id, job);
        }
    }

    fn account(&mut self, job: &Job, add: bool) {
        let apply = |n: &mut u64| *n = if add { *n + 1 } else { n.saturating_sub(1) };
        if let Some(n) = self
            .counts
            .entry(job.queue.clone())
            .or_default()
            .slot(job.state)
        {
            apply(n);
        }
        if matches!(job.state, State::Ready | State::Delayed | State::Leased) {
            let key = (job.queue.clone(), job.tenant.clone());
            apply(self.tenant_depth.entry(key).or_default());
        }
        if job.state == State::Leased && !add {
            self.deadlines.remove(&job.id);
            if let Some(worker) = &job.worker
                && let Some(held) = self.by_worker.get_mut(worker)
            {
                held.remove(&job.id);
                if held.is_empty() {
                    self.by_worker.remove(worker);
                }
            }
        }
    }

    /// Applies `event` to job `id` in memory and returns the old record and the transition.
    fn transition(
        &mut self,
        id: JobId,
        event: Event,
        now: UnixMillis,
    ) -> Result<(Job, Transition), BrokerError> {
        let old = self
            .jobs
            .get(&id)
            .ok_or(BrokerError::UnknownJob(id))?
            .clone();
        let backoff = self
            .config
            .queues
            .get(&*old.queue)
            .map(|q| q.backoff)
            .unwrap_or(FALLBACK_BACKOFF);
        let t = job::apply(&old, event, &backoff, now)?;
        debug!(queue = %old.queue, job = %id, from = %old.state, to = %t.job.state,
            attempts = t.job.attempts, "Job state changed.");
        self.replace(t.job.clone());
        events::changed(&old, &t.job, now);
        events::throttled(&t, now);
        Ok((old, t))
    }

    /// Queues the durable write of `t` and calls `done` after it commits.
    fn write(&self, t: Transition, done: impl FnOnce(Result<(), StoreError>) + Send + 'static) {
        let Transition { job, entry } = t;
        self.store
            .submit(move |b| b.update_job(&job, entry.as_ref()), done);
    }

    // ---- start-up ----

    /// Loads the store's unfinished jobs. After a daemon start every stored lease
    /// was held by an earlier run and counts as expired. After a restart of the Broker
    /// alone (`keep_leases` = now), workers may still be running those jobs, so each
    /// lease is kept with a fresh deadline: a live worker's heartbeats and ack go
    /// through, and a dead worker's lease expires through the reaper as usual.
    pub(super) fn recover(
        &mut self,
        jobs: Vec<Job>,
        now: UnixMillis,
        keep_leases: Option<Instant>,
    ) {
        let (mut expired, mut kept) = (0usize, 0usize);
        for job in jobs {
            let queue = self.intern(&job.queue);
            let tenant = self.intern(&job.tenant);
            let job = Job {
                queue,
                tenant,
                ..job
            };
            if !self.config.queues.contains_key(&*job.queue) {
                warn!(queue = %job.queue, job = %job.id, "Job belongs to a queue that is not configured; it waits until the queue is configured again.");
            }
            let leased = (job.state == State::Leased).then_some(job.lease_seq);
            self.replace(job.clone());
            let Some(token) = leased else { continue };
            let lease = self.queue(&job.queue).map(|q| q.lease);
            match (keep_leases, lease) {
                (Some(mono), Ok(lease)) => {
                    kept += 1;
                    self.deadlines.insert(job.id, mono + lease);
                }
                _ => {
                    expired += 1;
                    let failure = Failure::LeaseExpired {
                        reason: "lease held by an earlier run of qd (daemon restarted)".into(),
                    };
                    self.fail_quietly(job.id, token, failure, now);
                }
            }
        }
        info!(
            jobs = self.jobs.len(),
            expired, kept, "Broker recovered its state from the store."
        );
    }

    /// Rebuilds every derived actor from this state.
    pub(super) fn push_all(&self) {
        for queue in self.config.queues.keys() {
            self.resync(Resync::Scheduler(Arc::from(queue.as_str())));
        }
        self.resync(Resync::Reaper);
        self.resync(Resync::Dlq);
    }

    pub(super) fn resync(&self, what: Resync) {
        match what {
            Resync::Scheduler(queue) => {
                events::to_scheduler(&queue, SchedulerMsg::Reset);
                for job in self.jobs.values().filter(|j| j.queue == queue) {
                    match job.state {
                        State::Ready | State::Delayed => events::ready(job),
                        State::Leased => {
                            events::to_scheduler(&queue, SchedulerMsg::Running(job.tenant.clone()))
                        }
                        _ => {}
                    }
                }
            }
            Resync::Reaper => {
                events::to_reaper(ReaperMsg::Reset);
                for (id, deadline) in &self.deadlines {
                    if let Some(job) = self.jobs.get(id) {
                        events::track(*id, job.lease_seq, *deadline);
                    }
                }
            }
            Resync::Dlq => {
                let dead = self
                    .jobs
                    .values()
                    .filter(|j| j.state == State::Dead)
                    .map(events::dead_entry)
                    .collect();
                events::to_dlq(DlqMsg::Reset(dead));
            }
        }
    }

    // ---- producers ----

    pub(super) fn enqueue(
        &mut self,
        req: EnqueueRequest,
        reply: RpcReplyPort<Result<Enqueued, BrokerError>>,
        now: UnixMillis,
    ) {
        match self.admit(&req) {
            Ok(new) => {
                let queue = new.queue.clone();
                self.counts.entry(queue.clone()).or_default().pending += 1;
                *self
                    .tenant_depth
                    .entry((queue, new.tenant.clone()))
                    .or_default() += 1;
                let job = Job::new(new, now);
                let record = job.clone();
                let payload = req.payload;
                let myself = self.myself.clone();
                self.store.submit(
                    move |b| b.insert_job(&record, &payload),
                    move |result| {
                        let _ = myself.cast(BrokerMsg::Inserted(Box::new(job), result, reply));
                    },
                );
            }
            Err(err) => {
                metrics::enqueue_rejected(self.known_queue(&req.queue), reject_reason(&err));
                let _ = reply.send(Err(err));
            }
        }
    }

    /// Checks an enqueue against the config and backpressure limits.
    fn admit(&mut self, req: &EnqueueRequest) -> Result<NewJob, BrokerError> {
        if !self.accepting {
            return Err(BrokerError::ShuttingDown);
        }
        let qcfg = self.queue(&req.queue)?;
        super::validate(req, self.config.daemon.max_payload)?;
        let (max_depth, default_attempts) = (qcfg.max_depth, qcfg.max_attempts);
        let queue = self.intern(&req.queue);
        let tenant = self.intern(req.tenant.as_deref().unwrap_or("default"));
        let depth = self.counts.get(&queue).map(QueueCounts::depth).unwrap_or(0);
        if depth >= max_depth {
            return Err(BrokerError::QueueFull {
                queue: req.queue.clone(),
                depth,
                max: max_depth,
            });
        }
        if let Some(max) = self.limits.tenant(&tenant).max_depth {
            let depth = self
                .tenant_depth
                .get(&(queue.clone(), tenant.clone()))
                .copied()
                .unwrap_or(0);
            if depth >= max {
                return Err(BrokerError::TenantFull {
                    queue: req.queue.clone(),
                    tenant: tenant.to_string(),
                    depth,
                    max,
                });
            }
        }
        Ok(NewJob {
            queue,
            tenant,
            idempotency_key: req.idempotency_key.clone(),
            delay: req.delay,
            max_attempts: req.max_attempts.unwrap_or(default_attempts),
        })
    }

    pub(super) fn inserted(
        &mut self,
        job: Job,
        result: Result<Inserted, StoreError>,
        reply: RpcReplyPort<Result<Enqueued, BrokerError>>,
    ) {
        let queue = job.queue.clone();
        let counts = self.counts.entry(queue.clone()).or_default();
        counts.pending = counts.pending.saturating_sub(1);
        if let Some(n) = self
            .tenant_depth
            .get_mut(&(job.queue.clone(), job.tenant.clone()))
        {
            *n = n.saturating_sub(1);
        }
        let answer = match result {
            Ok(Inserted::New) => {
                debug!(queue = %job.queue, tenant = %job.tenant, job = %job.id, "Job accepted.");
                metrics::job_enqueued(&self.labels, &job.queue, &job.tenant);
                let id = job.id;
                events::ready(&job);
                self.replace(job);
                Ok(Enqueued {
                    id,
                    duplicate: false,
                })
            }
            Ok(Inserted::Duplicate {
                id,
                same_payload: true,
            }) => Ok(Enqueued {
                id,
                duplicate: true,
            }),
            Ok(Inserted::Duplicate { id, .. }) => Err(BrokerError::KeyConflict {
                queue: job.queue.to_string(),
                key: job.idempotency_key.clone().unwrap_or_default(),
                id,
            }),
            Err(err) => {
                warn!(queue = %job.queue, error = %err, "Enqueue failed in the store; nothing was accepted.");
                Err(BrokerError::Store(err))
            }
        };
        if let Err(err) = &answer {
            metrics::enqueue_rejected(Some(&queue), reject_reason(err));
        }
        let _ = reply.send(answer);
    }

    // ---- workers ----

    pub(super) fn lease(
        &mut self,
        queue: &Arc<str>,
        picks: Vec<(Arc<str>, JobId)>,
        worker: String,
        reply: RpcReplyPort<Vec<LeasedJob>>,
        now: UnixMillis,
        mono: Instant,
    ) {
        let Ok(lease) = self.queue(queue).map(|q| q.lease) else {
            let _ = reply.send(Vec::new());
            return;
        };
        let mut granted = Vec::new();
        for (tenant, id) in picks {
            match self.lease_one(id, &worker, now) {
                Ok(t) => granted.push(t),
                Err(err) => {
                    debug!(queue = %queue, job = %id, error = %err, "Scheduler pick not leasable.");
                    events::release(queue, tenant);
                }
            }
        }
        if granted.is_empty() {
            let _ = reply.send(Vec::new());
            return;
        }
        let deadline = mono + lease;
        let deadline_ms = now + i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
        for t in &granted {
            self.deadlines.insert(t.job.id, deadline);
            events::track(t.job.id, t.job.lease_seq, deadline);
            let ready_since = t.job.ready_at.max(t.job.created_at);
            metrics::job_waited(queue, millis(now - ready_since));
        }
        let jobs: Vec<Job> = granted.iter().map(|t| t.job.clone()).collect();
        let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
        let myself = self.myself.clone();
        self.store.submit(
            move |b| {
                for job in &jobs {
                    b.update_job(job, None)?;
                }
                b.payloads(&ids).map(|p| (jobs, p))
            },
            move |result| match result {
                Ok((jobs, payloads)) => {
                    let leased: Vec<LeasedJob> = jobs
                        .into_iter()
                        .zip(payloads)
                        .map(|(job, payload)| leased_job(job, payload.unwrap_or_default(), lease, deadline_ms))
                        .collect();
                    let tokens = leased.iter().map(|l| (l.id, l.token)).collect();
                    if reply.send(leased).is_err() {
                        let _ = myself.cast(BrokerMsg::Abandoned(tokens));
                    }
                }
                Err(err) => {
                    warn!(error = %err, "Lease write failed; the leases will expire and the jobs be redelivered.");
                    let _ = reply.send(Vec::new());
                }
            },
        );
    }

    fn lease_one(
        &mut self,
        id: JobId,
        worker: &str,
        now: UnixMillis,
    ) -> Result<Transition, BrokerError> {
        let mut old = self
            .jobs
            .get(&id)
            .cloned()
            .ok_or(BrokerError::UnknownJob(id))?;
        if old.state == State::Delayed {
            old = job::apply(&old, Event::Promote, &FALLBACK_BACKOFF, now)?.job;
        }
        let event = Event::Lease {
            worker: worker.to_string(),
        };
        let t = job::apply(&old, event, &FALLBACK_BACKOFF, now)?;
        self.replace(t.job.clone());
        Ok(t)
    }

    pub(super) fn abandoned(&mut self, leases: Vec<(JobId, Token)>, now: UnixMillis) {
        for (id, token) in leases {
            let failure = Failure::Interrupted {
                reason: "the lessee went away before it received the job".into(),
            };
            self.fail_quietly(id, token, failure, now);
        }
    }

    pub(super) fn heartbeat(
        &mut self,
        id: JobId,
        token: Token,
        extend: Option<Duration>,
        now: UnixMillis,
        mono: Instant,
    ) -> Result<LeaseInfo, BrokerError> {
        let job = self.jobs.get(&id).ok_or(BrokerError::UnknownJob(id))?;
        job::check_token(job, token)?;
        let lease = self.queue(&job.queue)?.lease;
        let extend = extend.unwrap_or(lease).min(MAX_EXTEND);
        self.deadlines.insert(id, mono + extend);
        events::track(id, token, mono + extend);
        Ok(LeaseInfo {
            deadline_ms: now + i64::try_from(extend.as_millis()).unwrap_or(0),
        })
    }

    pub(super) fn ack(
        &mut self,
        id: JobId,
        token: Token,
        reply: RpcReplyPort<Result<(), BrokerError>>,
        now: UnixMillis,
    ) {
        match self.transition(id, Event::Ack { token }, now) {
            Ok((old, t)) => {
                record_end(&self.labels, &old, &t, now);
                self.write(t, move |r| {
                    let _ = reply.send(r.map_err(BrokerError::from));
                });
            }
            Err(err) => {
                let _ = reply.send(Err(err));
            }
        }
    }

    /// A failed attempt: back to delayed/ready with backoff, or dead.
    pub(super) fn fail(
        &mut self,
        id: JobId,
        token: Token,
        failure: Failure,
        reply: Option<RpcReplyPort<Result<(), BrokerError>>>,
        now: UnixMillis,
    ) {
        let jitter = self.rng.random::<f64>();
        match self.transition(
            id,
            Event::Fail {
                token,
                failure,
                jitter,
            },
            now,
        ) {
            Ok((old, t)) => {
                record_end(&self.labels, &old, &t, now);
                if let Some(entry) = &t.entry {
                    warn!(queue = %old.queue, tenant = %old.tenant, job = %id, attempt = entry.attempt,
                        outcome = %entry.outcome, next = %t.job.state,
                        error = entry.error.as_deref().unwrap_or(""), "Attempt failed.");
                }
                self.write(t, move |r| {
                    if let Some(reply) = reply {
                        let _ = reply.send(r.map_err(BrokerError::from));
                    }
                });
            }
            Err(err) => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(err));
                }
            }
        }
    }

    fn fail_quietly(&mut self, id: JobId, token: Token, failure: Failure, now: UnixMillis) {
        self.fail(id, token, failure, None, now);
    }

    pub(super) fn expire(&mut self, id: JobId, token: Token, now: UnixMillis, mono: Instant) {
        let due = self.deadlines.get(&id).is_some_and(|d| *d <= mono);
        let current = self
            .jobs
            .get(&id)
            .is_some_and(|j| j.state == State::Leased && j.lease_seq == token);
        if !(due && current) {
            return;
        }
        let queue = self
            .jobs
            .get(&id)
            .map(|j| j.queue.clone())
            .unwrap_or_default();
        metrics::lease_expired(&queue);
        let reason = "lease expired without an ack or heartbeat".to_string();
        self.fail_quietly(id, token, Failure::LeaseExpired { reason }, now);
    }

    pub(super) fn worker_lost(&mut self, worker: &str, error: &str, now: UnixMillis) {
        let held: Vec<JobId> = self
            .by_worker
            .get(worker)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for id in held {
            if let Some(token) = self.jobs.get(&id).map(|j| j.lease_seq) {
                let failure = Failure::WorkerCrashed {
                    error: format!("worker {worker} crashed: {error}"),
                };
                self.fail_quietly(id, token, failure, now);
            }
        }
    }

    // ---- operators ----

    pub(super) fn redrive(
        &mut self,
        ids: Vec<JobId>,
        by: &str,
        reply: RpcReplyPort<Result<BatchOutcome, BrokerError>>,
        now: UnixMillis,
    ) {
        let mut outcome = BatchOutcome::default();
        let mut writes = Vec::new();
        for id in ids {
            match self.transition(id, Event::Redrive { by: by.to_string() }, now) {
                Ok((_, t)) => {
                    outcome.moved.push(id);
                    writes.push(t);
                }
                Err(err) => outcome.refused.push((id, err.to_string())),
            }
        }
        if !outcome.moved.is_empty() {
            info!(moved = outcome.moved.len(), by, "Dead jobs redriven.");
        }
        self.write_batch(writes, move |r| {
            let _ = reply.send(r.map(|()| outcome).map_err(BrokerError::from));
        });
    }

    pub(super) fn purge(
        &mut self,
        ids: Vec<JobId>,
        reply: RpcReplyPort<Result<BatchOutcome, BrokerError>>,
    ) {
        let mut outcome = BatchOutcome::default();
        for id in ids {
            match self.jobs.get(&id).map(|j| j.state) {
                Some(State::Dead) => {
                    if let Some(job) = self.jobs.remove(&id) {
                        self.account(&job, false);
                    }
                    outcome.moved.push(id);
                }
                Some(state) => outcome.refused.push((
                    id,
                    format!("job {id} is {state}; only dead jobs can be purged"),
                )),
                None => outcome.refused.push((id, format!("unknown job {id}"))),
            }
        }
        events::to_dlq(DlqMsg::Removed(outcome.moved.clone()));
        let ids = outcome.moved.clone();
        self.store.submit(
            move |b| b.delete_jobs(&ids),
            move |r| {
                let _ = reply.send(r.map(|_| outcome).map_err(BrokerError::from));
            },
        );
    }

    pub(super) fn cancel(
        &mut self,
        id: JobId,
        by: &str,
        reply: RpcReplyPort<Result<State, BrokerError>>,
        now: UnixMillis,
    ) {
        match self.transition(id, Event::Cancel { by: by.to_string() }, now) {
            Ok((old, t)) => {
                metrics::job_completed(
                    &self.labels,
                    &old.queue,
                    &old.tenant,
                    Completion::Cancelled,
                );
                let previous = old.state;
                self.write(t, move |r| {
                    let _ = reply.send(r.map(|()| previous).map_err(BrokerError::from));
                });
            }
            Err(err) => {
                let _ = reply.send(Err(err));
            }
        }
    }

    fn write_batch(
        &self,
        writes: Vec<Transition>,
        done: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) {
        if writes.is_empty() {
            done(Ok(()));
            return;
        }
        self.store.submit(
            move |b| {
                writes
                    .iter()
                    .try_for_each(|t| b.update_job(&t.job, t.entry.as_ref()))
            },
            done,
        );
    }

    pub(super) fn counts(&self) -> HashMap<Arc<str>, QueueCounts> {
        self.counts.clone()
    }
}

/// Backoff for a job whose queue is no longer configured (it is never leased, so
/// only cancel/redrive reach it).
const FALLBACK_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(600),
    jitter: Jitter::Full,
};

/// The longest a single heartbeat may extend a lease.
const MAX_EXTEND: Duration = Duration::from_secs(12 * 3600);

/// The `qd_enqueue_rejected_total{reason}` label of a refused enqueue.
fn reject_reason(err: &BrokerError) -> RejectReason {
    match err {
        BrokerError::QueueFull { .. } => RejectReason::QueueFull,
        BrokerError::TenantFull { .. } => RejectReason::TenantFull,
        BrokerError::ShuttingDown | BrokerError::Unavailable(_) => RejectReason::ShuttingDown,
        BrokerError::Store(_) => RejectReason::StoreError,
        BrokerError::PayloadTooLarge { .. } => RejectReason::PayloadTooLarge,
        _ => RejectReason::BadRequest,
    }
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Metrics for an attempt that ended (`old` was leased).
fn record_end(labels: &TenantLabels, old: &Job, t: &Transition, now: UnixMillis) {
    let Some(HistoryEntry { outcome, .. }) = &t.entry else {
        return;
    };
    let run = millis(now - old.leased_at.unwrap_or(now));
    metrics::attempt_finished(&old.queue, *outcome, run);
    let completion = match t.job.state {
        State::Succeeded => Some(Completion::Succeeded),
        State::Dead => Some(Completion::Dead),
        _ => None,
    };
    if let Some(c) = completion {
        metrics::job_completed(labels, &old.queue, &old.tenant, c);
    }
    if *outcome == Outcome::Succeeded {
        debug!(queue = %old.queue, job = %old.id, "Job succeeded.");
    }
}

fn leased_job(job: Job, payload: Vec<u8>, lease: Duration, deadline_ms: UnixMillis) -> LeasedJob {
    LeasedJob {
        id: job.id,
        attempt: job.next_attempt(),
        token: job.lease_seq,
        idempotency_key: job.effect_key(),
        queue: job.queue,
        tenant: job.tenant,
        payload,
        lease,
        deadline_ms,
    }
}

#[cfg(test)]
mod tests;
