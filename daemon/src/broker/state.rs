//! The broker's in-memory state and the logic behind each [`super::BrokerMsg`].
//!
//! Invariants: `jobs` holds exactly the unfinished jobs (delayed, ready, leased,
//! dead) as last committed to the store; `deadlines` (the one home of lease
//! deadlines; the one timer, kept by the actor, is asked for the soonest) and
//! `by_worker` hold exactly the leased ones; `counts` is derived from `jobs` plus
//! enqueues whose write is still pending. Every change goes through [`BrokerState::replace`].
//!
//! Each configured queue's ready order is part of this state ([`Dispatches`]): every
//! change of a job's state updates it in the same step (`broker/events.rs`), and
//! after each message the waiting lessees are served from it ([`BrokerState::serve`]).
//! Invariant: every ready or delayed job of a configured queue is in its
//! Dispatch, once; every leased one counts as running for its tenant there.
//!
//! The state does no I/O: store operations, lease records, replies and the timer's
//! next time are collected while a message is handled and returned by
//! `BrokerState::take` as `Effects` (`broker/effects.rs`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::Instant;
use tracing::{debug, info, warn};

mod crashed;
mod elsewhere;
mod fire;
mod settle;
mod shared;

use super::deadlines::Deadlines;
use super::dispatch::{Dispatch, Dispatches, Snapshot, Waiting};
use super::effects::{Back, Effects, Reply, StoreEffect};
use super::events;
use super::hot::HotPayloads;
use super::table::JobTable;
use super::{
    BatchError, BatchOutcome, BrokerArgs, BrokerError, BrokerMsg, EnqueueRequest, Enqueued,
    LeaseInfo, LeasedJob,
};
use crate::backoff::{Backoff, Jitter};
use crate::config::{Config, QueueConfig};
use crate::job::{
    self, Event, Failure, HistoryEntry, Job, JobId, NewJob, Outcome, State, Token, Transition,
    UnixMillis,
};
use crate::limits::Limits;
use crate::metrics::{self, Completion, RejectReason, TenantLabels};
use crate::store::{Backend, Inserted, LeaseKind, NewRecord, StoreError};
pub use fire::FireWrite;
use settle::Intent;
pub(crate) use settle::PROBE_EVERY;
pub use settle::Settle;

/// The bytes of payloads the Broker keeps for jobs not yet leased (see
/// [`HotPayloads`]): 16 MiB, 16 bytes per job with a million queued.
const HOT_PAYLOAD_BYTES: usize = 16 << 20;

/// Unfinished jobs of one queue, by state, plus enqueues not yet durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Ready or delayed (the queue's dispatch counts which).
    pub waiting: u64,
    /// Leased (running under a lease).
    pub leased: u64,
    /// Dead (in the DLQ).
    pub dead: u64,
    /// Waiting for a parent named in `after` (`deps.rs`).
    pub held_waiting: u64,
    /// Blocked by a dead or cancelled parent (`deps.rs`).
    pub held_blocked: u64,
    /// Enqueues whose write is in flight.
    pub pending: u64,
}

impl QueueCounts {
    /// Jobs that count against `max_depth`: everything not dead.
    pub fn depth(&self) -> u64 {
        self.waiting + self.leased + self.pending + self.held_waiting + self.held_blocked
    }

    fn slot(&mut self, state: State) -> Option<&mut u64> {
        match state {
            State::Ready | State::Delayed => Some(&mut self.waiting),
            State::Leased => Some(&mut self.leased),
            State::Dead => Some(&mut self.dead),
            State::Waiting => Some(&mut self.held_waiting),
            State::Blocked => Some(&mut self.held_blocked),
            State::Succeeded | State::Cancelled => None,
        }
    }
}

/// DLQ depth and the oldest death, for one queue: a query to the Broker, which
/// owns the dead jobs ([`super::BrokerMsg::DlqStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DlqStats {
    /// Dead jobs.
    pub depth: u64,
    /// When the oldest one died (Unix ms).
    pub oldest_died_at: Option<UnixMillis>,
}

/// The broker's state (see the module doc for its invariants).
pub struct BrokerState {
    /// Whether this process's leases are its own ([`crate::store::Backend::leases_are_local`]):
    /// false on a store shared by several nodes.
    leases_are_local: bool,
    /// How far a loaded job's token jumps past its stored one
    /// ([`crate::store::Backend::token_skip`], at least 1).
    token_skip: Token,
    pub(super) accepting: bool,
    /// The config in force as of the message being handled (see [`Self::follow_config`]).
    config: Arc<Config>,
    limits: Arc<Limits>,
    jobs: JobTable,
    deadlines: Deadlines,
    /// When the armed lease timer fires (the soonest deadline when it was armed).
    timer: Option<Instant>,
    /// A new time for the lease timer, asked of the actor with this message's effects.
    arm_at: Option<Instant>,
    by_worker: HashMap<String, HashSet<JobId>>,
    counts: HashMap<Arc<str>, QueueCounts>,
    /// Dead jobs per queue by the time they died: DLQ depth and age.
    dead: HashMap<Arc<str>, BTreeSet<(UnixMillis, JobId)>>,
    tenant_depth: HashMap<(Arc<str>, Arc<str>), u64>,
    names: HashSet<Arc<str>>,
    /// The size of `names` after its last sweep of names nobody holds.
    names_swept_at: usize,
    labels: TenantLabels,
    rng: StdRng,
    /// Jobs whose planned change waits for its write (see [`settle`]).
    writing: HashSet<JobId>,
    /// False from a failed write until a write succeeds; no leasing meanwhile.
    store_writable: bool,
    /// Leases qd ended without charging their job (the lessee went away before its
    /// answer, a shutdown stopped the attempt) whose write the store refused: job,
    /// token and reason. Written again whenever the store accepts writes, kept until
    /// the lease is gone; left alone they would expire and be charged for an attempt
    /// that never ran.
    uncharged_ends: Vec<(JobId, Token, String)>,
    /// Payloads of recently accepted jobs, so their first lease needs no store read.
    hot: HotPayloads,
    /// Each configured queue's ready order, waiting lessees and limiter tokens.
    pub(super) dispatches: Dispatches,
    /// The shared rate limiters, for the queues' dispatches.
    limiters: Arc<crate::rate_limit::Limiters>,
    /// Store effects of the Broker message being handled, in order.
    store_effects: Vec<StoreEffect>,
    /// Replies of the Broker message being handled, sent after its store effects.
    replies: Vec<Reply>,
    /// A shared store: a look for other nodes' jobs is under way, and whether
    /// another was asked for meanwhile (see `state/shared.rs`).
    refreshing: bool,
    refresh_again: bool,
    /// A shared store: the leader's sweep for expired leases is under way.
    sweeping: bool,
}

impl BrokerState {
    pub(super) fn new(args: BrokerArgs, rng: StdRng) -> Self {
        let config = args.limits.config();
        let counts = config
            .queues
            .keys()
            .map(|q| (Arc::<str>::from(q.as_str()), QueueCounts::default()))
            .collect();
        let labels = TenantLabels::new(config.tenants.keys().cloned());
        BrokerState {
            leases_are_local: args.store.leases_are_local(),
            token_skip: args.store.token_skip().max(1),
            accepting: true,
            config,
            limits: args.limits,
            jobs: JobTable::default(),
            deadlines: Deadlines::default(),
            timer: None,
            arm_at: None,
            by_worker: HashMap::new(),
            counts,
            dead: HashMap::new(),
            tenant_depth: HashMap::new(),
            names: HashSet::new(),
            names_swept_at: 0,
            labels,
            rng,
            writing: HashSet::new(),
            store_writable: true,
            uncharged_ends: Vec::new(),
            hot: HotPayloads::new(HOT_PAYLOAD_BYTES),
            dispatches: Dispatches::default(),
            limiters: args.limiters,
            store_effects: Vec::new(),
            replies: Vec::new(),
            refreshing: false,
            refresh_again: false,
            sweeping: false,
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
            let (now, mono) = self.dispatches.now();
            self.sync_dispatches(now, mono);
        }
    }

    /// Puts each configured queue's dispatch in step with the config and limits in
    /// force: a queue configured now gets one, built from the jobs memory holds
    /// (at start, or when a reload adds the queue back); a queue no longer
    /// configured loses its own (its lessees are answered empty, its jobs wait in
    /// memory); every one takes its fairness mode, rate limiter, weights, caps and
    /// pause flag. `now` and `mono` place the due times of delayed jobs.
    pub(super) fn sync_dispatches(&mut self, now: UnixMillis, mono: Instant) {
        self.dispatches.at(now, mono);
        let config = self.config.clone();
        self.dispatches
            .retain(|queue| config.queues.contains_key(queue));
        for (name, qcfg) in &config.queues {
            let limiter = qcfg
                .rate_limiter
                .as_ref()
                .and_then(|n| self.limiters.get(n));
            if !self.dispatches.contains(name) {
                let queue = self.intern(name);
                let mut d = Dispatch::new(qcfg.fairness, limiter.clone());
                d.restore(self.snapshot(name), now, mono);
                self.dispatches.insert(queue, d);
            }
            if let Some(d) = self.dispatches.get_mut(name) {
                d.set_policy(qcfg.fairness, limiter);
                d.configure(name, &self.limits);
            }
        }
    }

    /// Shutdown: no enqueue is taken and no job handed out any more; waiting
    /// lessees are answered empty.
    pub(super) fn stop_intake(&mut self) {
        self.accepting = false;
        for (_, d) in self.dispatches.iter_mut() {
            d.drain();
        }
    }

    /// Hands ready jobs to the lessees waiting for them, queue by queue, and
    /// answers those whose long poll ended. Called after every message: whatever it
    /// changed (a job ready, a slot freed, a lessee arrived, time passed) is served
    /// in the same step. Nothing is picked while the store refuses writes: the
    /// lessees wait, or end their poll empty.
    pub(super) fn serve(&mut self, now: UnixMillis, mono: Instant) {
        for queue in self.dispatches.names() {
            let grants = match self.dispatches.get_mut(&queue) {
                Some(d) if self.store_writable => d.grants(mono),
                Some(d) => {
                    d.hold(mono);
                    Vec::new()
                }
                None => Vec::new(),
            };
            for grant in grants {
                self.lease(&queue, grant.picks, grant.worker, grant.reply, now, mono);
            }
            if let Some(d) = self.dispatches.get_mut(&queue) {
                d.expire(mono);
            }
        }
    }

    /// Interns a queue or tenant name so every job shares one allocation. Names
    /// nothing else holds any more (every job of a tenant finished) are dropped
    /// whenever the set has doubled since the last sweep, so a stream of tenants,
    /// each seen for a while, costs memory for the names in use only: amortized
    /// O(1) per new name.
    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(found) = self.names.get(name) {
            return found.clone();
        }
        if self.names.len() >= self.names_swept_at.saturating_mul(2).max(64) {
            self.names.retain(|n| Arc::strong_count(n) > 1);
            self.names_swept_at = self.names.len();
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
        if let Some(old) = self.jobs.remove(id) {
            self.account(&old, false);
        }
        self.account(&job, true);
        if job.state == State::Leased
            && let Some(worker) = &job.worker
        {
            self.by_worker.entry(worker.clone()).or_default().insert(id);
        }
        if job.state.is_final() {
            self.hot.forget(id);
        }
        if !job.state.is_final() || job.state == State::Dead {
            self.jobs.insert(job);
        }
    }

    fn account(&mut self, job: &Job, add: bool) {
        self.tally(&job.queue, &job.tenant, job.state, if add { 1 } else { -1 });
        if job.state == State::Dead {
            let dead = self.dead.entry(job.queue.clone()).or_default();
            if add {
                dead.insert((job.updated_at, job.id));
            } else {
                dead.remove(&(job.updated_at, job.id));
            }
        }
        if job.state == State::Leased && !add {
            self.deadlines.untrack(job.id);
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

    /// Adds `n` jobs in `state` of `queue` and `tenant` to the counts (a negative
    /// `n` takes them off, never below 0): the queue's count of that state, and the
    /// tenant's depth for a state that counts against `max_depth`.
    fn tally(&mut self, queue: &Arc<str>, tenant: &Arc<str>, state: State, n: i64) {
        let apply = |c: &mut u64| *c = c.saturating_add_signed(n);
        if let Some(c) = self.counts.entry(queue.clone()).or_default().slot(state) {
            apply(c);
        }
        if matches!(
            state,
            State::Ready | State::Delayed | State::Leased | State::Waiting | State::Blocked
        ) {
            let key = (queue.clone(), tenant.clone());
            let depth = self.tenant_depth.entry(key).or_default();
            apply(depth);
            if *depth == 0 {
                self.tenant_depth.remove(&(queue.clone(), tenant.clone()));
            }
        }
    }

    /// Computes what `event` does to job `id`, changing nothing: the change takes
    /// effect in memory only once its write committed (see [`settle`]). Refused while
    /// an earlier write of the job is in flight.
    fn plan(
        &self,
        id: JobId,
        event: Event,
        now: UnixMillis,
    ) -> Result<(Job, Transition), BrokerError> {
        let old = self.jobs.get(id).ok_or(BrokerError::UnknownJob(id))?;
        if self.writing.contains(&id) {
            return Err(BrokerError::Unavailable(format!(
                "job {id} has a write in flight; retry"
            )));
        }
        let backoff = self
            .config
            .queues
            .get(&*old.queue)
            .map(|q| q.backoff)
            .unwrap_or(FALLBACK_BACKOFF);
        let t = job::apply(&old, event, &backoff, now)?;
        Ok((old, t))
    }

    // ---- start-up ----

    /// Loads the store's unfinished jobs. Leases are not durable, so after a daemon
    /// start no job is leased: the leases of an earlier run are simply gone and their
    /// jobs, still ready or delayed in the store, are redelivered. After a restart of
    /// the Broker alone (`keep_leases` = now) the store still shows the leases this
    /// process holds: each is kept with a fresh deadline, so a live worker's
    /// heartbeats and ack go through and a dead worker's lease expires as usual.
    ///
    /// Fencing across runs: every lease that ended was written with its token, so the
    /// only tokens of earlier runs the store does not know are leases live at a
    /// crash: `lease_seq + 1` after one crash, and one more per run that crashed
    /// again before writing anything about the job (each handed out the token after
    /// the skip of its own start). The skip is [`crate::store::Backend::token_skip`],
    /// the count of the store's opens, which grows at every start: this run's
    /// first token, `lease_seq + skip + 1`, is above every token of an earlier run,
    /// and a late ack from any earlier run's holder is refused.
    ///
    /// Takes the store's jobs in pieces (call [`Self::recovered`] after the last);
    /// answers how many leases of this piece were kept.
    ///
    /// Must start from an empty state, with each job once (the store's rows are
    /// unique by id). Rows come in key order within a piece and mostly share their
    /// queue and tenant with the row before (the store hands out one allocation per
    /// name): such a run is interned, checked against the config and counted once,
    /// not per job.
    pub(super) fn recover(&mut self, jobs: Vec<Job>, keep_leases: Option<Instant>) -> usize {
        let mut kept = 0usize;
        let mut run: Option<Run> = None;
        for job in jobs {
            if !run.as_ref().is_some_and(|r| r.holds(&job)) {
                if let Some(done) = run.take() {
                    self.tally(&done.queue, &done.tenant, State::Ready, done.waiting);
                }
                run = Some(self.start_run(&job));
            }
            let r = run.as_mut().expect("invariant: a run was just started");
            let mut job = Job {
                queue: r.queue.clone(),
                tenant: r.tenant.clone(),
                ..job
            };
            match job.state {
                State::Ready | State::Delayed => {
                    job.lease_seq = job.lease_seq.saturating_add(self.token_skip);
                    r.waiting += 1;
                    self.jobs.insert_new(job);
                }
                State::Leased => {
                    let deadline = keep_leases.unwrap_or_else(Instant::now)
                        + self.queue(&job.queue).map_or(MAX_EXTEND, |q| q.lease);
                    kept += 1;
                    self.deadlines.track(job.id, job.lease_seq, deadline);
                    self.replace(job);
                }
                _ => {
                    job.lease_seq = job.lease_seq.saturating_add(self.token_skip);
                    self.replace(job);
                }
            }
        }
        if let Some(done) = run {
            self.tally(&done.queue, &done.tenant, State::Ready, done.waiting);
        }
        kept
    }

    /// Begins a [`Run`] of recovered jobs with the queue and tenant of `job`.
    fn start_run(&mut self, job: &Job) -> Run {
        let run = Run {
            stored: (job.queue.clone(), job.tenant.clone()),
            queue: self.intern(&job.queue),
            tenant: self.intern(&job.tenant),
            waiting: 0,
        };
        if !self.config.queues.contains_key(&*run.queue) {
            warn!(queue = %run.queue, job = %job.id, "Job belongs to a queue that is not configured; it waits until the queue is configured again.");
        }
        run
    }

    /// The start-up load ended: `kept` leases survived a restart of the Broker alone.
    pub(super) fn recovered(&self, kept: usize) {
        info!(
            jobs = self.jobs.len(),
            kept, "Broker recovered its state from the store."
        );
    }

    /// What the dispatch of `queue` is built from: its ready and delayed jobs per
    /// tenant, oldest first, and its leased jobs counted per tenant.
    ///
    /// Consecutive jobs of one tenant (the common case: the table is filled in key
    /// order) are filed without hashing the tenant's name.
    fn snapshot(&self, queue: &str) -> Snapshot {
        let mut jobs: Vec<(Arc<str>, Vec<Waiting>)> = Vec::new();
        let mut slots: HashMap<Arc<str>, usize> = HashMap::new();
        let mut running: HashMap<Arc<str>, u32> = HashMap::new();
        let mut priorities: HashMap<JobId, i64> = HashMap::new();
        let mut last: Option<usize> = None;
        for job in self.jobs.in_queue(queue) {
            match job.state {
                State::Ready | State::Delayed => {
                    let slot = match last.filter(|&k| Arc::ptr_eq(&jobs[k].0, job.tenant)) {
                        Some(k) => k,
                        None => *slots.entry(job.tenant.clone()).or_insert_with(|| {
                            jobs.push((job.tenant.clone(), Vec::new()));
                            jobs.len() - 1
                        }),
                    };
                    last = Some(slot);
                    jobs[slot].1.push((job.id, job.ready_at));
                    if job.priority_ms != 0 {
                        priorities.insert(job.id, job.priority_ms);
                    }
                }
                State::Leased => *running.entry(job.tenant.clone()).or_default() += 1,
                _ => {}
            }
        }
        for (_, waiting) in &mut jobs {
            waiting.sort_unstable_by_key(|&(id, ready_at)| (ready_at, id));
        }
        Snapshot {
            jobs,
            running: running.into_iter().collect(),
            priorities,
        }
    }

    /// Asks for `run` on the store's writer thread, then `done` with its result,
    /// sending what follows back through `back` (see [`StoreEffect::write`]).
    pub(super) fn write<R, Run, Done>(&mut self, run: Run, done: Done)
    where
        R: Send + 'static,
        Run: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
        Done: FnOnce(Result<R, StoreError>, &Back) + Send + 'static,
    {
        self.store_effects.push(StoreEffect::write(run, done));
    }

    /// [`Self::write`] of an enqueue that checks `depth` in the store: the writer
    /// takes its depth locks before its batch runs.
    pub(super) fn write_enqueue<R, Run, Done>(
        &mut self,
        depth: Option<&shared::DepthChecks>,
        run: Run,
        done: Done,
    ) where
        R: Send + 'static,
        Run: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
        Done: FnOnce(Result<R, StoreError>, &Back) + Send + 'static,
    {
        let locks = depth.map(shared::DepthChecks::locks).unwrap_or_default();
        self.store_effects
            .push(StoreEffect::write_locking_depth(locks, run, done));
    }

    /// Answers `reply` with `value` once this message's store effects are handed
    /// over (a [`Reply`] effect).
    pub(super) fn answer<T: Send + 'static>(&mut self, reply: RpcReplyPort<T>, value: T) {
        self.reply_later(move || {
            let _ = reply.send(value);
        });
    }

    /// Runs `reply` once this message's store effects are handed over (a [`Reply`]
    /// effect).
    pub(super) fn reply_later(&mut self, reply: impl FnOnce() + Send + 'static) {
        self.replies.push(Box::new(move |_: &Back| reply()));
    }

    /// Whether no store effect or reply waits to be taken.
    pub(super) fn no_effects_pending(&self) -> bool {
        self.store_effects.is_empty() && self.replies.is_empty()
    }

    /// The effects collected since the last call, in order.
    pub(super) fn effects(&mut self) -> Effects {
        Effects {
            store: std::mem::take(&mut self.store_effects),
            replies: std::mem::take(&mut self.replies),
            timer: self.arm_at.take(),
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
                let record = self.reserve(new, req.payload, now);
                let job = record.job.clone();
                let depth = self.depth_check([&job]);
                let check = depth.clone();
                let after = req.after;
                self.write_enqueue(
                    check.as_ref(),
                    move |b| {
                        if let Some(depth) = &depth {
                            depth.check(b)?;
                        }
                        let (inserted, state) = b
                            .enqueue_after(std::slice::from_ref(&record), &[after], false)
                            .map(first)?;
                        Ok((inserted, record.payload, state))
                    },
                    move |result, back| {
                        let mut job = job;
                        let result = result.map(|(inserted, payload, state)| {
                            job.state = state;
                            (inserted, payload)
                        });
                        back(BrokerMsg::Inserted(Box::new(job), result, reply));
                    },
                );
            }
            Err(err) => {
                metrics::enqueue_rejected(self.known_queue(&req.queue), reject_reason(&err));
                self.answer(reply, Err(err));
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
        // On a shared store the store decides both depths, counting every node's
        // jobs, in the enqueue's own transaction (`shared::DepthChecks`).
        if depth >= max_depth && !self.shared() {
            return Err(BrokerError::QueueFull {
                queue: req.queue.clone(),
                depth,
                max: max_depth,
            });
        }
        if let Some(max) = self.limits.tenant(&tenant).max_depth
            && !self.shared()
        {
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
            priority_ms: req.priority_ms,
        })
    }

    /// Counts an admitted job as pending (against `max_depth`) until its write
    /// answers ([`Self::unreserve`]); returns its record for the store.
    fn reserve(&mut self, new: NewJob, payload: Vec<u8>, now: UnixMillis) -> NewRecord {
        self.counts.entry(new.queue.clone()).or_default().pending += 1;
        *self
            .tenant_depth
            .entry((new.queue.clone(), new.tenant.clone()))
            .or_default() += 1;
        NewRecord {
            job: Job::new(new, now),
            payload,
        }
    }

    /// Undoes [`Self::reserve`] once the job's write answered (or was never sent).
    fn unreserve(&mut self, job: &Job) {
        let counts = self.counts.entry(job.queue.clone()).or_default();
        counts.pending = counts.pending.saturating_sub(1);
        let key = (job.queue.clone(), job.tenant.clone());
        if let Some(n) = self.tenant_depth.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.tenant_depth.remove(&key);
            }
        }
    }

    pub(super) fn inserted(
        &mut self,
        job: Job,
        result: Result<(Inserted, Vec<u8>), StoreError>,
        reply: RpcReplyPort<Result<Enqueued, BrokerError>>,
        now: UnixMillis,
    ) {
        self.unreserve(&job);
        match &result {
            Ok(_)
            | Err(
                StoreError::QueueFull { .. }
                | StoreError::TenantFull { .. }
                | StoreError::Busy(_)
                | StoreError::After { .. },
            ) => self.store_accepted(now),
            Err(err) => self.store_refused(err),
        }
        let answer = self.accept(job, result);
        self.answer(reply, answer);
    }

    /// Applies one enqueue's store answer (the job was unreserved): a new job joins
    /// memory and its queue's dispatch; a duplicate answers the holder's id, or a key
    /// conflict when its payload differs.
    fn accept(
        &mut self,
        job: Job,
        result: Result<(Inserted, Vec<u8>), StoreError>,
    ) -> Result<Enqueued, BrokerError> {
        let queue = job.queue.clone();
        let answer = match result {
            Ok((Inserted::New, payload)) => {
                debug!(queue = %job.queue, tenant = %job.tenant, job = %job.id, "Job accepted.");
                metrics::job_enqueued(&self.labels, &job.queue, &job.tenant);
                let id = job.id;
                if job.state == State::Blocked {
                    metrics::dependencies_blocked(&job.queue);
                }
                // On a shared store a held job is the database's alone: any node
                // may release it, and the one that does offers it to its queue's dispatch
                // (`settle::dependents_moved`); a copy here would go stale.
                if !(job.state.is_held() && self.shared()) {
                    self.hot.insert(id, payload);
                    if !job.state.is_held() {
                        events::ready(&mut self.dispatches, &job);
                    }
                    self.replace(job);
                }
                Ok(Enqueued {
                    id,
                    duplicate: false,
                })
            }
            Ok((
                Inserted::Duplicate {
                    id,
                    same_payload: true,
                },
                _,
            )) => Ok(Enqueued {
                id,
                duplicate: true,
            }),
            Ok((Inserted::Duplicate { id, .. }, _)) => Err(key_conflict(&job, id)),
            Err(
                err @ (StoreError::QueueFull { .. }
                | StoreError::TenantFull { .. }
                | StoreError::Busy(_)),
            ) => Err(refusal(err)),
            Err(StoreError::After { error, .. }) => Err(after_refused(error)),
            Err(err) => {
                static LOG: crate::log_every::Every =
                    crate::log_every::Every::new(crate::log_every::STORE_ERRORS);
                if let Some(left_out) = LOG.due() {
                    warn!(queue = %job.queue, error = %err, earlier_not_logged = left_out, "Enqueue failed in the store; nothing was accepted (logged at most every 10 s).");
                }
                Err(BrokerError::Store(err))
            }
        };
        if let Err(err) = &answer {
            metrics::enqueue_rejected(Some(&queue), reject_reason(err));
        }
        answer
    }

    // ---- batch enqueue (the single enqueue's steps, per item, one commit) ----

    /// Admits every item, then writes them all in one store operation that is
    /// undone whole on a key conflict ([`crate::store::Backend::enqueue_all`]).
    pub(super) fn enqueue_batch(
        &mut self,
        reqs: Vec<EnqueueRequest>,
        reply: RpcReplyPort<Result<Vec<Enqueued>, BatchError>>,
        now: UnixMillis,
    ) {
        let queue = reqs.first().map(|r| r.queue.clone()).unwrap_or_default();
        let mut afters: Vec<crate::deps::After> = reqs.iter().map(|r| r.after.clone()).collect();
        match self.admit_all(reqs, now) {
            Ok(records) => {
                // An item's refs name earlier items, whose ids were just chosen.
                for after in &mut afters {
                    let named: Vec<JobId> = after
                        .refs
                        .iter()
                        .filter_map(|&k| records.get(k).map(|r| r.job.id))
                        .collect();
                    after.parents.extend(named);
                }
                let jobs: Vec<Job> = records.iter().map(|r| r.job.clone()).collect();
                let depth = self.depth_check(&jobs);
                let check = depth.clone();
                self.write_enqueue(
                    check.as_ref(),
                    move |b| {
                        if let Some(depth) = &depth {
                            depth.check(b)?;
                        }
                        let answers = b.enqueue_after(&records, &afters, true)?;
                        let payloads = records.into_iter().map(|r| r.payload);
                        Ok(answers.into_iter().zip(payloads).collect::<Vec<_>>())
                    },
                    move |result, back| {
                        let mut jobs = jobs;
                        let result = result.map(|answers| {
                            answers
                                .into_iter()
                                .zip(jobs.iter_mut())
                                .map(|(((inserted, state), payload), job)| {
                                    job.state = state;
                                    (inserted, payload)
                                })
                                .collect()
                        });
                        back(BrokerMsg::InsertedBatch(jobs, result, reply));
                    },
                );
            }
            Err(err) => {
                metrics::enqueue_rejected(self.known_queue(&queue), reject_reason(&err.error));
                self.answer(reply, Err(err));
            }
        }
    }

    /// Admits and reserves each item in order, so each one's depth check counts the
    /// items before it; on the first refusal, unreserves them all.
    fn admit_all(
        &mut self,
        reqs: Vec<EnqueueRequest>,
        now: UnixMillis,
    ) -> Result<Vec<NewRecord>, BatchError> {
        super::check_batch_len(reqs.len()).map_err(BatchError::whole)?;
        let mut records: Vec<NewRecord> = Vec::with_capacity(reqs.len());
        for (index, req) in reqs.into_iter().enumerate() {
            match self.admit(&req) {
                Ok(new) => records.push(self.reserve(new, req.payload, now)),
                Err(error) => {
                    for record in &records {
                        self.unreserve(&record.job);
                    }
                    let whole = matches!(
                        error,
                        BrokerError::ShuttingDown | BrokerError::UnknownQueue(_)
                    );
                    let index = (!whole).then_some(index);
                    return Err(BatchError { index, error });
                }
            }
        }
        Ok(records)
    }

    pub(super) fn inserted_batch(
        &mut self,
        jobs: Vec<Job>,
        result: Result<Vec<(Inserted, Vec<u8>)>, StoreError>,
        reply: RpcReplyPort<Result<Vec<Enqueued>, BatchError>>,
        now: UnixMillis,
    ) {
        for job in &jobs {
            self.unreserve(job);
        }
        let queue = jobs.first().map(|j| j.queue.clone());
        let refused = match result {
            Ok(answers) => {
                self.store_accepted(now);
                // enqueue_all answered Ok: no item is a key conflict.
                let answer = jobs
                    .into_iter()
                    .zip(answers)
                    .enumerate()
                    .map(|(index, (job, inserted))| {
                        self.accept(job, Ok(inserted)).map_err(|error| BatchError {
                            index: Some(index),
                            error,
                        })
                    })
                    .collect();
                self.answer(reply, answer);
                return;
            }
            Err(StoreError::KeyConflict { index, id }) => {
                self.store_accepted(now);
                // The holder may be an earlier item of this very batch, which was
                // not stored: then name that item, not its unstored id.
                let earlier = jobs.iter().position(|j| j.id == id);
                let error = match (jobs.get(index), earlier) {
                    (Some(job), Some(earlier)) => BrokerError::KeyConflictInBatch {
                        key: job.idempotency_key.clone().unwrap_or_default(),
                        earlier,
                    },
                    (Some(job), None) => key_conflict(job, id),
                    (None, _) => BrokerError::Store(StoreError::KeyConflict { index, id }),
                };
                BatchError {
                    index: Some(index),
                    error,
                }
            }
            Err(StoreError::QueueFull { queue, depth, max }) => {
                self.store_accepted(now);
                batch_past_depth(&jobs, queue, depth, max)
            }
            Err(StoreError::TenantFull {
                queue,
                tenant,
                depth,
                max,
            }) => {
                self.store_accepted(now);
                batch_past_tenant_depth(&jobs, queue, tenant, depth, max)
            }
            Err(StoreError::After { index, error }) => {
                self.store_accepted(now);
                BatchError {
                    index: Some(index),
                    error: after_refused(error),
                }
            }
            Err(err @ StoreError::Busy(_)) => {
                self.store_accepted(now);
                BatchError::whole(refusal(err))
            }
            Err(err) => {
                self.store_refused(&err);
                static LOG: crate::log_every::Every =
                    crate::log_every::Every::new(crate::log_every::STORE_ERRORS);
                if let Some(left_out) = LOG.due() {
                    warn!(queue = ?queue, error = %err, earlier_not_logged = left_out, "Batch enqueue failed in the store; nothing was accepted.");
                }
                BatchError::whole(BrokerError::Store(err))
            }
        };
        metrics::enqueue_rejected(queue.as_deref(), reject_reason(&refused.error));
        self.answer(reply, Err(refused));
    }

    // ---- workers ----

    /// Leases the jobs a queue's dispatch picked for one lessee (`picks`, each with
    /// the tenant it was counted against); a pick no longer leasable gives its
    /// tenant's slot back.
    fn lease(
        &mut self,
        queue: &Arc<str>,
        picks: Vec<(Arc<str>, JobId)>,
        worker: String,
        reply: RpcReplyPort<Vec<LeasedJob>>,
        now: UnixMillis,
        mono: Instant,
    ) {
        let Ok(lease) = self.queue(queue).map(|q| q.lease) else {
            self.answer(reply, Vec::new());
            return;
        };
        let mut granted = Vec::new();
        for (tenant, id) in picks {
            if self.writing.contains(&id) {
                // A change of this job waits for its write: hand it back, so the
                // dispatch still has it if that write fails.
                self.hand_back(queue, vec![(tenant, id)]);
                continue;
            }
            match self.lease_one(id, &worker, now) {
                Ok(pair) => granted.push(pair),
                Err(err) => {
                    debug!(queue = %queue, job = %id, error = %err, "Pick not leasable.");
                    events::release(&mut self.dispatches, queue, &tenant);
                }
            }
        }
        if granted.is_empty() {
            self.answer(reply, Vec::new());
            return;
        }
        let deadline = mono + lease;
        let deadline_ms = now + i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
        for (_, job) in &granted {
            self.deadlines.track(job.id, job.lease_seq, deadline);
            let ready_since = job.ready_at.max(job.created_at);
            metrics::job_waited(queue, millis(now - ready_since));
        }
        let (before, jobs): (Vec<Job>, Vec<Job>) = granted.into_iter().unzip();
        if self.leases_are_local && jobs.iter().all(|j| self.hot.contains(j.id)) {
            self.lease_hot(jobs, reply, lease, deadline_ms);
            return;
        }
        let shared = self.shared().then(|| shared::ClaimRequest {
            caps: self.caps(queue, &jobs),
            queue: queue.clone(),
            worker: worker.clone(),
            now,
            lease,
            kind: if self.external(queue) {
                LeaseKind::External
            } else {
                LeaseKind::InProcess
            },
        });
        let planned = jobs.clone();
        self.write(
            move |b| {
                let claim = match &shared {
                    Some(request) => shared::claim(b, request, &jobs)?,
                    None => shared::SharedClaim::local(b.claim_for(&jobs, lease)?),
                };
                Ok((jobs, claim))
            },
            move |result, back| {
                let (leased, unclaimed) = match result {
                    Ok((jobs, claim)) => {
                        let shared::SharedClaim {
                            payloads,
                            at_cap,
                            others,
                        } = claim;
                        let (mut leased, unclaimed) =
                            claimed(before, jobs, payloads, lease, deadline_ms);
                        let (capped, unclaimed): (Vec<_>, Vec<_>) = unclaimed
                            .into_iter()
                            .partition(|(old, _)| at_cap.contains(&old.id));
                        if !capped.is_empty() {
                            back(BrokerMsg::AtCap(capped));
                        }
                        let (replaced, unclaimed) = shared::pair(unclaimed, &others);
                        if !replaced.is_empty() {
                            let taken: Vec<Job> = others.iter().map(|(j, _)| j.clone()).collect();
                            back(BrokerMsg::Substituted(replaced, taken));
                        }
                        leased.extend(
                            others
                                .into_iter()
                                .map(|(job, payload)| leased_job(job, payload, lease, deadline_ms)),
                        );
                        (leased, unclaimed)
                    }
                    Err(err) => {
                        static LOG: crate::log_every::Every =
                            crate::log_every::Every::new(crate::log_every::STORE_ERRORS);
                        if let Some(left_out) = LOG.due() {
                            warn!(error = %err, earlier_not_logged = left_out, jobs = before.len(), "Claim failed in the store; the jobs stay ready.");
                        }
                        (Vec::new(), before.into_iter().zip(planned).collect())
                    }
                };
                if !unclaimed.is_empty() {
                    back(BrokerMsg::Unclaimed(unclaimed));
                }
                let tokens = leased.iter().map(|l| (l.id, l.token)).collect();
                if reply.send(leased).is_err() {
                    back(BrokerMsg::Abandoned(tokens));
                }
            },
        );
    }

    /// Hands out leases whose payloads are all hot, without waiting for the store:
    /// leases are local ([`crate::store::Backend::leases_are_local`]), so the claim
    /// only records them for readers, and it costs no write of its own: the records
    /// ride on the writer's next batch ([`crate::store::Store::record_leases_later`]),
    /// which is before any later change of these jobs (handed to the store after the
    /// reply). The reply is an effect performed after the records were handed over,
    /// so a lessee that reads its job finds it leased.
    fn lease_hot(
        &mut self,
        jobs: Vec<Job>,
        reply: RpcReplyPort<Vec<LeasedJob>>,
        lease: Duration,
        deadline_ms: UnixMillis,
    ) {
        let leased: Vec<LeasedJob> = jobs
            .iter()
            .map(|job| {
                let payload = self.hot.take(job.id).unwrap_or_default();
                leased_job(job.clone(), payload, lease, deadline_ms)
            })
            .collect();
        self.store_effects.push(StoreEffect::RecordLeases(jobs));
        let tokens: Vec<(JobId, Token)> = leased.iter().map(|l| (l.id, l.token)).collect();
        self.replies.push(Box::new(move |back: &Back| {
            if reply.send(leased).is_err() {
                back(BrokerMsg::Abandoned(tokens));
            }
        }));
    }

    /// Takes back leases the store did not record, each given as the job's record
    /// before the lease and the lease planned: each job memory still holds under
    /// that very lease returns to its earlier record uncharged and is handed to its
    /// dispatch again (on a shared store it is dropped instead: another node took or
    /// changed it).
    pub(super) fn unclaimed(&mut self, unclaimed: Vec<(Job, Job)>, now: UnixMillis) {
        for (job, planned) in unclaimed {
            let Some(leased) = self.jobs.get(job.id).filter(|c| *c == planned) else {
                continue;
            };
            if self.shared() {
                self.drop_stale(&leased);
                self.refresh();
                continue;
            }
            debug!(queue = %job.queue, job = %job.id, "Lease taken back: the store did not record it.");
            self.replace(job.clone());
            events::changed(&mut self.dispatches, &leased, &job, now);
        }
    }

    /// Leases one job in memory; returns its record before (as the store holds it:
    /// a delayed job is promoted only on the way to its lease, in memory, so a lease
    /// taken back restores it delayed, as stored) and after.
    fn lease_one(
        &mut self,
        id: JobId,
        worker: &str,
        now: UnixMillis,
    ) -> Result<(Job, Job), BrokerError> {
        let stored = self.jobs.get(id).ok_or(BrokerError::UnknownJob(id))?;
        let ready = match stored.state {
            State::Delayed => job::apply(&stored, Event::Promote, &FALLBACK_BACKOFF, now)?.job,
            _ => stored.clone(),
        };
        let event = Event::Lease {
            worker: worker.to_string(),
        };
        let t = job::apply(&ready, event, &FALLBACK_BACKOFF, now)?;
        self.replace(t.job.clone());
        Ok((stored, t.job))
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
        let job = self.jobs.get(id).ok_or(BrokerError::UnknownJob(id))?;
        job::check_token(&job, token)?;
        let lease = self.queue(&job.queue)?.lease;
        let extend = extend.unwrap_or(lease).min(MAX_EXTEND);
        self.deadlines.track(id, token, mono + extend);
        Ok(LeaseInfo {
            deadline_ms: now + i64::try_from(extend.as_millis()).unwrap_or(0),
        })
    }

    /// An ack of job `id`'s lease with `token`: of memory's lease, or of a lease
    /// read from the shared store among `stored` (see `state/elsewhere.rs`).
    pub(super) fn ack(
        &mut self,
        id: JobId,
        token: Token,
        stored: &[Job],
        reply: RpcReplyPort<Result<(), BrokerError>>,
        now: UnixMillis,
    ) {
        self.ack_result(id, token, None, stored, reply, now);
    }

    /// [`Self::ack`] that stores `result` in the ack's own write. A result larger
    /// than the queue's `max_result` is refused naming its size, and nothing changes
    /// (the lease stays; the worker may still ack without it or nack).
    pub(super) fn ack_result(
        &mut self,
        id: JobId,
        token: Token,
        result: Option<Arc<[u8]>>,
        stored: &[Job],
        reply: RpcReplyPort<Result<(), BrokerError>>,
        now: UnixMillis,
    ) {
        if let Some(result) = &result {
            // Checked before planning, which may let go of a stale lease: a refused
            // result changes nothing.
            let queue = stored
                .iter()
                .find(|j| j.id == id)
                .map(|j| j.queue.clone())
                .or_else(|| self.jobs.get(id).map(|j| j.queue));
            let max = queue
                .and_then(|q| self.queue(&q).ok().map(|c| c.max_result))
                .unwrap_or(crate::results::DEFAULT_MAX_RESULT);
            if let Err(refused) = crate::results::check_result(result.len(), max) {
                self.answer(reply, Err(BrokerError::Invalid(refused)));
                return;
            }
        }
        let planned = self
            .plan_report(id, token, Event::Ack { token }, stored, now)
            .map(|(old, mut t)| {
                t.result = result;
                (old, t)
            });
        match planned {
            Ok(planned) => self.commit_each(Intent::End, vec![planned], move |r| {
                let _ = reply.send(reported(id, r));
            }),
            Err(err) => self.answer(reply, Err(err)),
        }
    }

    /// Acks many leases in one store commit. Each item is answered on its own, in
    /// order: `Ok`, or why it was refused (stale token, unknown job, a second ack of
    /// the same job in the batch, a lease the store no longer holds: see
    /// [`reported`]). The whole request fails only if the write fails; then nothing
    /// was acked.
    pub(super) fn ack_batch(
        &mut self,
        acks: Vec<(JobId, Token)>,
        stored: &[Job],
        reply: RpcReplyPort<Result<Vec<Result<(), BrokerError>>, BrokerError>>,
        now: UnixMillis,
    ) {
        let mut answers: Vec<Option<Result<(), BrokerError>>> = Vec::with_capacity(acks.len());
        let (mut planned, mut slots, mut seen) = (Vec::new(), Vec::new(), HashSet::new());
        for (n, (id, token)) in acks.into_iter().enumerate() {
            if !seen.insert(id) {
                let dup = format!("job {id} is acked twice in this batch");
                answers.push(Some(Err(BrokerError::Invalid(dup))));
                continue;
            }
            match self.plan_report(id, token, Event::Ack { token }, stored, now) {
                Ok(p) => {
                    planned.push(p);
                    slots.push((n, id));
                    answers.push(None);
                }
                Err(err) => answers.push(Some(Err(err))),
            }
        }
        self.commit_each(Intent::End, planned, move |result| {
            let answer = result.map_err(BrokerError::from).map(|applied| {
                for ((n, id), applied) in slots.into_iter().zip(applied) {
                    answers[n] = Some(reported(id, Ok(vec![applied])));
                }
                answers
                    .into_iter()
                    .map(|a| a.expect("invariant: every ack of the batch is answered"))
                    .collect()
            });
            let _ = reply.send(answer);
        });
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
        self.fail_on(id, token, failure, &[], reply, now);
    }

    /// [`Self::fail`] of memory's lease, or of a lease read from the shared store
    /// among `stored` (see `state/elsewhere.rs`).
    pub(super) fn fail_on(
        &mut self,
        id: JobId,
        token: Token,
        failure: Failure,
        stored: &[Job],
        reply: Option<RpcReplyPort<Result<(), BrokerError>>>,
        now: UnixMillis,
    ) {
        let jitter = self.rng.random::<f64>();
        let event = Event::Fail {
            token,
            failure,
            jitter,
        };
        match self.plan_report(id, token, event, stored, now) {
            Ok(planned) => {
                // The downstream said "slow down" whatever the store makes of the
                // result: the limiter pauses before the write is handed over, so
                // the pause is in force before the lessee hears its nack's answer
                // and asks for more.
                events::throttled(&self.dispatches, &planned.1, now);
                self.commit_each(Intent::End, vec![planned], move |r| {
                    if let Some(reply) = reply {
                        let _ = reply.send(reported(id, r));
                    }
                })
            }
            Err(err) => {
                if let Some(reply) = reply {
                    self.answer(reply, Err(err));
                }
            }
        }
    }

    fn fail_quietly(&mut self, id: JobId, token: Token, failure: Failure, now: UnixMillis) {
        self.fail(id, token, failure, None, now);
    }

    /// A due lease (popped from `deadlines`): the job goes through the retry policy.
    fn expire(&mut self, id: JobId, token: Token, now: UnixMillis, mono: Instant) {
        let current = self
            .jobs
            .get(id)
            .is_some_and(|j| j.state == State::Leased && j.lease_seq == token);
        if !current {
            return;
        }
        if !self.store_writable || self.writing.contains(&id) {
            // Never charge a job for qd's own store: the lease waits for the store.
            self.rearm(id, token, mono);
            return;
        }
        if self.shared() && self.jobs.get(id).is_some_and(|j| self.external(&j.queue)) {
            // Heartbeats may have reached other nodes: the store's lease end decides.
            self.expire_stored(id, token, now);
            return;
        }
        let reason = "lease expired without an ack or heartbeat".to_string();
        self.fail_quietly(id, token, Failure::LeaseExpired { reason }, now);
    }

    /// Timer: expires every lease whose deadline passed.
    pub(super) fn expire_due(&mut self, now: UnixMillis, mono: Instant) {
        self.timer = None;
        for (id, token) in self.deadlines.pop_due(mono) {
            self.expire(id, token, now, mono);
        }
    }

    /// Asks for the one timer to be armed for the soonest lease deadline or
    /// dispatch time (a delayed job due, a long poll's end, a limiter token),
    /// replacing the armed one, unless one is armed for that time or sooner.
    /// Called after every message.
    pub(super) fn arm(&mut self) {
        let next = match (self.deadlines.soonest(), self.dispatches.soonest()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(next) => next,
                None => return,
            },
        };
        if self.timer.is_some_and(|armed| armed <= next) {
            return;
        }
        self.timer = Some(next);
        self.arm_at = Some(next);
    }

    pub(super) fn worker_lost(&mut self, worker: &str, error: &str, now: UnixMillis) {
        let held: Vec<JobId> = self
            .by_worker
            .get(worker)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for id in held {
            if let Some(token) = self.jobs.get(id).map(|j| j.lease_seq) {
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
            match self.plan(id, Event::Redrive { by: by.to_string() }, now) {
                Ok(planned) => {
                    outcome.moved.push(id);
                    writes.push(planned);
                }
                Err(err) => outcome.refused.push((id, err.to_string())),
            }
        }
        let (moved, by) = (outcome.moved.len(), by.to_string());
        self.commit(Intent::Redrive, writes, move |r| {
            if r.is_ok() && moved > 0 {
                info!(moved, by, "Dead jobs redriven.");
            }
            let _ = reply.send(r.map(|()| outcome).map_err(BrokerError::from));
        });
    }

    pub(super) fn redrive_with_payload(
        &mut self,
        id: JobId,
        payload: Vec<u8>,
        by: &str,
        reply: RpcReplyPort<Result<(), BrokerError>>,
        now: UnixMillis,
    ) {
        let max = self.config.daemon.max_payload;
        if payload.len() > max {
            let size = payload.len();
            self.answer(reply, Err(BrokerError::PayloadTooLarge { size, max }));
            return;
        }
        match self.plan(id, Event::Redrive { by: by.to_string() }, now) {
            Ok(planned) => {
                let (intent, by) = (Intent::RedriveWithPayload(payload.into()), by.to_string());
                self.commit(intent, vec![planned], move |r| {
                    if r.is_ok() {
                        info!(job = %id, by, "Dead job redriven with a new payload.");
                    }
                    let _ = reply.send(r.map_err(BrokerError::from));
                });
            }
            Err(err) => self.answer(reply, Err(err)),
        }
    }

    /// Deletes dead jobs. One that holds back unfinished jobs is refused naming
    /// them, unless `release_by` (an operator) is given: then its edges to them
    /// count as met in the purge's commit.
    /// `done` gets the outcome and the dependents whose state a released edge
    /// changed.
    pub(super) fn purge(
        &mut self,
        ids: Vec<JobId>,
        release_by: Option<String>,
        done: impl FnOnce(Result<(BatchOutcome, Vec<JobId>), BrokerError>) + Send + 'static,
        now: UnixMillis,
    ) {
        let mut outcome = BatchOutcome::default();
        for id in ids {
            let state = self.jobs.get(id).map(|j| j.state);
            match state {
                Some(State::Dead) if !self.writing.contains(&id) => outcome.moved.push(id),
                Some(State::Dead) => outcome
                    .refused
                    .push((id, format!("job {id} has a write in flight; retry"))),
                Some(state) => outcome.refused.push((
                    id,
                    format!("job {id} is {state}; only dead jobs can be purged"),
                )),
                None => outcome.refused.push((id, format!("unknown job {id}"))),
            }
        }
        let ids = std::mem::take(&mut outcome.moved);
        self.commit_purge(ids, release_by, now, move |r| {
            done(r.map_err(BrokerError::from).map(|purged| {
                outcome.moved = purged.gone;
                for (id, blocked) in purged.held {
                    outcome
                        .refused
                        .push((id, crate::deps::holds_back(id, &blocked)));
                }
                (outcome, purged.released.iter().map(|j| j.id).collect())
            }));
        });
    }

    /// Counts a blocked job's broken edges as met (an operator's release, as `by`)
    /// and settles it: answers what the store did, `None` when the job is not
    /// blocked (nothing written). The job's new state reaches memory and its
    /// dispatch only after the commit.
    pub(super) fn release(
        &mut self,
        id: JobId,
        by: String,
        reply: RpcReplyPort<Result<Option<crate::store::Released>, BrokerError>>,
        now: UnixMillis,
    ) {
        match self.jobs.get(id).map(|j| j.state) {
            None => return self.answer(reply, Err(BrokerError::UnknownJob(id))),
            Some(_) if self.writing.contains(&id) => {
                let msg = format!("job {id} has a write in flight; retry");
                return self.answer(reply, Err(BrokerError::Unavailable(msg)));
            }
            Some(State::Blocked) => {}
            Some(_) => return self.answer(reply, Ok(None)),
        }
        self.writing.insert(id);
        self.write(
            move |b| b.release_edges_by(id, &by, now),
            move |result, back| {
                let moved = match &result {
                    Ok(Some((Some(job), _))) => vec![job.clone()],
                    _ => Vec::new(),
                };
                let failed = result.as_ref().err().cloned();
                let settle = Settle::with(move |state: &mut BrokerState, now, _| {
                    state.writing.remove(&id);
                    match failed {
                        None => {
                            state.dependents_moved(moved, now);
                            // Read into memory for this change on a shared store;
                            // still held (not blocked any more, or waiting on
                            // another parent), it stays the database's alone.
                            state.forget_held(id);
                            state.store_accepted(now);
                        }
                        Some(err) => state.store_refused(&err),
                    }
                });
                back(BrokerMsg::Settle(settle));
                let _ = reply.send(result.map_err(BrokerError::from));
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
        match self.plan(id, Event::Cancel { by: by.to_string() }, now) {
            Ok(planned) => {
                let previous = planned.0.state;
                // A running job's cancel ends its attempt (and lease) like an ack would.
                let intent = match previous {
                    State::Leased => Intent::End,
                    _ => Intent::Cancel,
                };
                self.commit(intent, vec![planned], move |r| {
                    let _ = reply.send(r.map(|()| previous).map_err(BrokerError::from));
                });
            }
            Err(err) => self.answer(reply, Err(err)),
        }
    }

    /// Per queue.
    pub(super) fn counts(&self) -> HashMap<Arc<str>, QueueCounts> {
        self.counts.clone()
    }

    /// See [`super::BrokerMsg::TenantCounts`]: one pass over the queue's jobs.
    pub(super) fn tenant_counts(&self, queue: &str) -> Vec<(String, State, u64)> {
        let mut by: HashMap<(&Arc<str>, State), u64> = HashMap::new();
        for job in self.jobs.in_queue(queue) {
            *by.entry((job.tenant, job.state)).or_default() += 1;
        }
        let mut counts: Vec<(String, State, u64)> = by
            .into_iter()
            .map(|((tenant, state), n)| (tenant.to_string(), state, n))
            .collect();
        crate::store::sort_counts(&mut counts);
        counts
    }

    pub(super) fn dlq_stats(&self) -> HashMap<Arc<str>, DlqStats> {
        self.dead
            .iter()
            .map(|(queue, dead)| {
                let stats = DlqStats {
                    depth: dead.len() as u64,
                    oldest_died_at: dead.first().map(|(at, _)| *at),
                };
                (queue.clone(), stats)
            })
            .collect()
    }
}

/// Recovered jobs in a row that share the store's allocations of their queue and
/// tenant names ([`BrokerState::recover`]).
struct Run {
    /// The store's names, compared by address.
    stored: (Arc<str>, Arc<str>),
    /// The interned queue.
    queue: Arc<str>,
    /// The interned tenant.
    tenant: Arc<str>,
    /// Ready or delayed jobs filed in this run, not counted yet.
    waiting: i64,
}

impl Run {
    /// True when `job` names the same allocations as the run.
    fn holds(&self, job: &Job) -> bool {
        Arc::ptr_eq(&self.stored.0, &job.queue) && Arc::ptr_eq(&self.stored.1, &job.tenant)
    }
}

/// Backoff for a job whose queue is no longer configured (it is never leased, so
/// only cancel/redrive reach it).
const FALLBACK_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(600),
    jitter: Jitter::Full,
};

/// The longest a single heartbeat may extend a lease: 12 h (SQS's longest
/// visibility timeout). `POST /v1/jobs/{id}/heartbeat` refuses a longer `extend`.
pub(crate) const MAX_EXTEND: Duration = Duration::from_secs(12 * 3600);

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

/// The Broker's answer to an enqueue the shared store refused for the queue's
/// depth across the cluster ([`StoreError::QueueFull`], [`StoreError::Busy`]).
fn refusal(err: StoreError) -> BrokerError {
    match err {
        StoreError::QueueFull { queue, depth, max } => BrokerError::QueueFull { queue, depth, max },
        StoreError::TenantFull {
            queue,
            tenant,
            depth,
            max,
        } => BrokerError::TenantFull {
            queue,
            tenant,
            depth,
            max,
        },
        StoreError::Busy(why) => BrokerError::Unavailable(why),
        other => BrokerError::Store(other),
    }
}

/// The Broker's error for an `after` the store refused.
fn after_refused(error: crate::deps::AfterError) -> BrokerError {
    match error {
        crate::deps::AfterError::Unknown(id) => BrokerError::UnknownDependency(id),
        other => BrokerError::Invalid(other.to_string()),
    }
}

/// [`batch_past_depth`] for a tenant's `max_depth`: names the first item of
/// `tenant` past its limit, with the tenant's depth counting its items before it.
fn batch_past_tenant_depth(
    jobs: &[Job],
    queue: String,
    tenant: String,
    depth: u64,
    max: u64,
) -> BatchError {
    let room = usize::try_from(max.saturating_sub(depth)).unwrap_or(usize::MAX);
    let mine: Vec<usize> = (0..jobs.len())
        .filter(|&i| *jobs[i].tenant == *tenant)
        .collect();
    let nth = room.min(mine.len().saturating_sub(1));
    BatchError {
        index: mine.get(nth).copied(),
        error: BrokerError::TenantFull {
            queue,
            tenant,
            depth: depth.saturating_add(nth as u64),
            max,
        },
    }
}

/// The refusal of a batch the shared store found would take `queue` (at `depth`
/// across the cluster) past `max`: it names the first item of `queue` past the
/// limit, with the depth counting the queue's items before it, as a batch
/// refused by memory's count does (a batch may span queues).
fn batch_past_depth(jobs: &[Job], queue: String, depth: u64, max: u64) -> BatchError {
    let room = usize::try_from(max.saturating_sub(depth)).unwrap_or(usize::MAX);
    let mine: Vec<usize> = (0..jobs.len())
        .filter(|&i| *jobs[i].queue == *queue)
        .collect();
    let nth = room.min(mine.len().saturating_sub(1));
    BatchError {
        index: mine.get(nth).copied(),
        error: BrokerError::QueueFull {
            queue,
            depth: depth.saturating_add(nth as u64),
            max,
        },
    }
}

/// `job`'s idempotency key is held by job `id` with a different payload.
fn key_conflict(job: &Job, id: JobId) -> BrokerError {
    BrokerError::KeyConflict {
        queue: job.queue.to_string(),
        key: job.idempotency_key.clone().unwrap_or_default(),
        id,
    }
}

/// The answer to a lessee's report (ack, nack) of job `id`, from its one-item write:
/// a write the store refused means the lease is over there (on a shared store,
/// another node ended it; memory's copy is dropped as stale), so it is answered as
/// [`BrokerError::UnknownJob`], as a report of a job the Broker no longer holds:
/// the API then answers 409 `stale_token` with the stored state, never a 503 the
/// worker would retry. A failed write is [`BrokerError::Store`].
fn reported(id: JobId, applied: Result<Vec<bool>, StoreError>) -> Result<(), BrokerError> {
    match first(applied?) {
        true => Ok(()),
        false => Err(BrokerError::UnknownJob(id)),
    }
}

/// The one answer of a one-item store batch.
fn first<T>(mut answers: Vec<T>) -> T {
    answers
        .pop()
        .expect("invariant: a store batch answers once per item")
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
        State::Cancelled => Some(Completion::Cancelled),
        _ => None,
    };
    if let Some(c) = completion {
        metrics::job_completed(labels, &old.queue, &old.tenant, c);
    }
    if *outcome == Outcome::Succeeded {
        debug!(queue = %old.queue, job = %old.id, "Job succeeded.");
    }
}

/// Splits a claim's answer into the jobs handed out and the pre-lease records of
/// those the store refused (`None` payload).
fn claimed(
    before: Vec<Job>,
    jobs: Vec<Job>,
    payloads: Vec<Option<Vec<u8>>>,
    lease: Duration,
    deadline_ms: UnixMillis,
) -> (Vec<LeasedJob>, Vec<(Job, Job)>) {
    let mut leased = Vec::with_capacity(jobs.len());
    let mut unclaimed: Vec<(Job, Job)> = Vec::new();
    for ((old, job), payload) in before.into_iter().zip(jobs).zip(payloads) {
        match payload {
            Some(payload) => leased.push(leased_job(job, payload, lease, deadline_ms)),
            None => unclaimed.push((old, job)),
        }
    }
    (leased, unclaimed)
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

#[cfg(test)]
mod props;
