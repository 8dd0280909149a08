//! One queue's dispatch state, owned by the Broker: which ready job goes to which
//! lessee, and when.
//!
//! [`Dispatch`] holds the queue's ready jobs in their weighted fair order per tenant
//! (a [`FairQueue`]: deficit round robin, per-tenant caps, priorities), its delayed
//! jobs by monotonic due time (a [`DelayedJobs`], with the priorities they take
//! along once due), the lessees waiting in a long poll, the rate limiter's token
//! bookkeeping, and the queue's paused and draining flags. It holds ids and ready
//! times only; the jobs' records are the Broker's, which changes this state in the
//! same step in which it changes a job's state, so the two never disagree for
//! longer than one Broker message.
//!
//! Pure data: no actor, no clock of its own (the caller passes wall and monotonic
//! time), no I/O beyond answering an expired waiter's reply port empty. The Broker
//! asks it for [`Grant`]s (a waiter and the jobs picked for it), leases them, and
//! arms its one timer for [`Dispatch::soonest`]: the next delayed due time, waiter
//! deadline, or limiter token. It takes no messages; every change is a method call
//! from the Broker's state.
//!
//! Invariant (unit- and property-tested below): every ready or delayed job handed
//! over is in exactly one place, the fair queue or the delayed heap, until it is
//! removed or picked; every picked job counts as running for its tenant until
//! [`Dispatch::finish`] or [`Dispatch::at_cap`] gives its slot back.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use tokio::time::Instant;

use super::LeasedJob;
use super::lease::{DispatchStats, LeaseRequest, MAX_WAIT};
use crate::clock::until;
use crate::job::{JobId, UnixMillis};
use crate::limits::Limits;
use crate::rate_limit::RateLimiter;
use crate::scheduler::delayed::DelayedJobs;
use crate::scheduler::fair::{FairQueue, Fairness, TenantLimits};

/// A ready or delayed job in a [`Snapshot`]: its id and `ready_at` (Unix ms).
pub(crate) type Waiting = (JobId, UnixMillis);

/// A queue's jobs as the Broker holds them, for [`Dispatch::restore`]: what a
/// queue's dispatch is built from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Per tenant (each named once), its ready and delayed jobs as `(id, ready_at)`
    /// (Unix ms), sorted by `(ready_at, id)`: oldest first, so they queue in that
    /// order. A job due later than now waits as delayed.
    pub(crate) jobs: Vec<(Arc<str>, Vec<Waiting>)>,
    /// Per tenant (each named once), how many of its jobs are leased (running).
    pub(crate) running: Vec<(Arc<str>, u32)>,
    /// The priorities (milliseconds) of the jobs of `jobs` that have one.
    pub(crate) priorities: HashMap<JobId, i64>,
}

/// A lessee waiting in a long poll.
struct Waiter {
    request: LeaseRequest,
    reply: RpcReplyPort<Vec<LeasedJob>>,
    deadline: Instant,
}

/// Jobs picked for one waiting lessee, to be leased by the Broker.
pub(crate) struct Grant {
    /// The jobs, each with the tenant it was counted against.
    pub(crate) picks: Vec<(Arc<str>, JobId)>,
    /// The lessee, recorded as the lease holder.
    pub(crate) worker: String,
    /// Where the leased jobs go.
    pub(crate) reply: RpcReplyPort<Vec<LeasedJob>>,
}

/// One queue's dispatch state (see the module doc).
pub(crate) struct Dispatch {
    fair: FairQueue,
    delayed: DelayedJobs<Instant>,
    /// The priorities of the delayed jobs that have one, until they are due.
    delayed_priorities: HashMap<JobId, i64>,
    waiters: VecDeque<Waiter>,
    limiter: Option<Arc<RateLimiter>>,
    /// A rate-limiter token taken when every backlogged tenant was capped, spent on
    /// the next pick (once a pause of the limiter ended).
    prepaid: bool,
    limiter_retry: Option<Instant>,
    paused: bool,
    draining: bool,
}

impl Dispatch {
    /// An empty queue ordered by `fairness`, drawing tokens from `limiter`.
    pub(crate) fn new(fairness: Fairness, limiter: Option<Arc<RateLimiter>>) -> Self {
        Dispatch {
            fair: FairQueue::new(fairness),
            delayed: DelayedJobs::new(),
            delayed_priorities: HashMap::new(),
            waiters: VecDeque::new(),
            limiter,
            prepaid: false,
            limiter_retry: None,
            paused: false,
            draining: false,
        }
    }

    /// Orders by `fairness` and draws tokens from `limiter` from now on (a reload
    /// that changed the queue's config); a token already taken from another
    /// limiter is forgotten.
    pub(crate) fn set_policy(&mut self, fairness: Fairness, limiter: Option<Arc<RateLimiter>>) {
        self.fair.set_fairness(fairness);
        if !same_limiter(&self.limiter, &limiter) {
            self.limiter = limiter;
            self.prepaid = false;
            self.limiter_retry = None;
        }
    }

    /// Takes the queue's weights, caps and pause flag from `limits`.
    pub(crate) fn configure(&mut self, queue: &str, limits: &Limits) {
        self.paused = limits.paused(queue);
        let default = limits.tenant("default");
        self.fair.set_default_limits(TenantLimits {
            weight: default.weight,
            max_concurrency: limits.tenant_cap(queue, "default"),
        });
        let names = limits.tenant_names();
        // A tenant no longer named (its override reset) falls back to the default.
        self.fair
            .retain_limits(|tenant| names.binary_search_by(|n| n.as_str().cmp(tenant)).is_ok());
        for tenant in names {
            let t = limits.tenant(&tenant);
            let cap = limits.tenant_cap(queue, &tenant);
            self.fair.set_limits(
                &tenant,
                TenantLimits {
                    weight: t.weight,
                    max_concurrency: cap,
                },
            );
        }
    }

    /// A job of `tenant` is ready at `ready_at` (Unix ms; later than `wall` means
    /// delayed until then), ranked by `priority` (ms, 0 for none).
    pub(crate) fn ready(
        &mut self,
        tenant: Arc<str>,
        id: JobId,
        ready_at: UnixMillis,
        priority: i64,
        wall: UnixMillis,
        now: Instant,
    ) {
        if ready_at > wall {
            self.delayed
                .push(now + until(ready_at, wall), tenant, id, ready_at);
            if priority == 0 {
                self.delayed_priorities.remove(&id);
            } else {
                self.delayed_priorities.insert(id, priority);
            }
        } else {
            self.fair.push_prioritized(tenant, id, ready_at, priority);
        }
    }

    /// Forgets a ready or delayed job of `tenant`, named by the ready time it was
    /// handed over with.
    pub(crate) fn remove(&mut self, tenant: &str, id: JobId, ready_at: UnixMillis) {
        if self.delayed.remove(id) {
            self.delayed_priorities.remove(&id);
        } else {
            self.fair.remove(tenant, id, ready_at);
        }
    }

    /// Takes a waiting job out of the order as leased outside a pick (an attempt an
    /// earlier run left, recorded as interrupted): it counts as running for its
    /// tenant until its lease ends, as a picked job does.
    pub(crate) fn take(&mut self, tenant: &str, id: JobId, ready_at: UnixMillis) {
        self.remove(tenant, id, ready_at);
        self.fair.start_running(tenant);
    }

    /// While the store refuses writes nothing is picked, but time still passes:
    /// due delayed jobs join the ready order, and a limiter retry time is dropped
    /// (the next pick asks the limiter again), so no passed time keeps the Broker's
    /// timer firing.
    pub(crate) fn hold(&mut self, now: Instant) {
        self.promote_due(now);
        self.limiter_retry = None;
    }

    fn promote_due(&mut self, now: Instant) {
        for (tenant, id, ready_at) in self.delayed.pop_due(now) {
            let priority = self.delayed_priorities.remove(&id).unwrap_or(0);
            self.fair.push_prioritized(tenant, id, ready_at, priority);
        }
    }

    /// A picked job of `tenant` ended after running `run` (zero: it was not leased
    /// after all), freeing its slot.
    pub(crate) fn finish(&mut self, tenant: &str, run: Duration) {
        self.fair.finish(tenant, run);
    }

    /// A picked job the store refused for its tenant's cap across the cluster:
    /// queued again uncharged, the tenant held at its cap ([`FairQueue::at_cap`]).
    pub(crate) fn at_cap(
        &mut self,
        tenant: Arc<str>,
        id: JobId,
        ready_at: UnixMillis,
        priority: i64,
    ) {
        self.fair.at_cap_prioritized(tenant, id, ready_at, priority);
    }

    /// Other nodes may have ended leases: tenants held at their cap are tried again.
    pub(crate) fn reopen(&mut self) {
        self.fair.reopen();
    }

    /// A job's downstream said "slow down": the queue's limiter pauses this long.
    pub(crate) fn throttled(&self, pause: Duration) {
        if let Some(limiter) = &self.limiter {
            limiter.pause(pause);
        }
    }

    /// Replaces every job and running count with `snapshot` (the Broker's jobs of
    /// the queue, at its start or after a reload changed the queue): ready jobs in
    /// bulk ([`FairQueue::extend`], each tenant's sorted list becomes its backlog),
    /// delayed ones by due time. Waiters, limits and flags stay.
    pub(crate) fn restore(&mut self, snapshot: Snapshot, wall: UnixMillis, now: Instant) {
        self.fair.clear();
        self.delayed.clear();
        self.delayed_priorities.clear();
        let priorities = snapshot.priorities;
        for (tenant, mut jobs) in snapshot.jobs {
            let due = jobs.partition_point(|&(_, ready_at)| ready_at <= wall);
            for (id, ready_at) in jobs.split_off(due) {
                let priority = priorities.get(&id).copied().unwrap_or(0);
                self.ready(tenant.clone(), id, ready_at, priority, wall, now);
            }
            if !priorities.is_empty() {
                let (boosted, plain): (Vec<Waiting>, Vec<Waiting>) = jobs
                    .into_iter()
                    .partition(|(id, _)| priorities.contains_key(id));
                jobs = plain;
                for (id, ready_at) in boosted {
                    self.fair
                        .push_prioritized(tenant.clone(), id, ready_at, priorities[&id]);
                }
            }
            self.fair.extend(tenant, jobs);
        }
        for (tenant, n) in snapshot.running {
            for _ in 0..n {
                self.fair.start_running(&tenant);
            }
        }
    }

    /// A lessee asks for work: it waits here until [`Self::grants`] picks jobs for
    /// it or its long poll (at most [`MAX_WAIT`]) ends. Answered empty at once while
    /// draining.
    pub(crate) fn enlist(
        &mut self,
        request: LeaseRequest,
        reply: RpcReplyPort<Vec<LeasedJob>>,
        now: Instant,
    ) {
        if self.draining {
            let _ = reply.send(Vec::new());
            return;
        }
        let deadline = now + request.wait.min(MAX_WAIT);
        self.waiters.push_back(Waiter {
            request,
            reply,
            deadline,
        });
    }

    /// Shutdown: hands out nothing more and answers every waiting lessee empty.
    pub(crate) fn drain(&mut self) {
        self.draining = true;
        for w in self.waiters.drain(..) {
            let _ = w.reply.send(Vec::new());
        }
    }

    /// The queue's counts for metrics, `qctl queues` and the autoscaler.
    pub(crate) fn stats(&self) -> DispatchStats {
        DispatchStats {
            ready: self.fair.len() as u64,
            delayed: self.delayed.len() as u64,
            oldest_ready_at: self.fair.oldest_ready_at(),
            waiting_lessees: self.waiters.len(),
            paused: self.paused,
        }
    }

    /// Jobs running per tenant as counted here.
    #[cfg(test)]
    pub(crate) fn running(&self, tenant: &str) -> u32 {
        self.fair.running(tenant)
    }

    /// Moves the delayed jobs due by `now` to the fair queue, then picks jobs for
    /// the waiting lessees in arrival order, one rate-limiter token each, until
    /// none is ready, every backlogged tenant is capped, the limiter says wait, or
    /// nobody waits. Each picked job counts as running for its tenant from here on.
    pub(crate) fn grants(&mut self, now: Instant) -> Vec<Grant> {
        self.promote_due(now);
        self.waiters.retain(|w| !w.reply.is_closed());
        let mut grants = Vec::new();
        if self.paused || self.draining {
            return grants;
        }
        while let Some(picks) = self.pick(now) {
            let Some(waiter) = self.waiters.pop_front() else {
                break;
            };
            grants.push(Grant {
                picks,
                worker: waiter.request.worker,
                reply: waiter.reply,
            });
        }
        grants
    }

    /// Up to the front waiter's `max_jobs` jobs, one rate-limiter token each.
    fn pick(&mut self, now: Instant) -> Option<Vec<(Arc<str>, JobId)>> {
        let max = self.waiters.front()?.request.max_jobs.max(1) as usize;
        let mut picks = Vec::new();
        while picks.len() < max && !self.fair.is_empty() {
            if !self.take_token(now) {
                break;
            }
            match self.fair.pop() {
                Some(pick) => {
                    self.prepaid = false;
                    picks.push(pick);
                }
                None => break,
            }
        }
        (!picks.is_empty()).then_some(picks)
    }

    fn take_token(&mut self, now: Instant) -> bool {
        let Some(limiter) = &self.limiter else {
            return true;
        };
        if self.prepaid {
            // A token taken before a pause waits for its end: the downstream said
            // "slow down" since.
            if let Some(until) = limiter.paused_until(now) {
                self.limiter_retry = Some(until);
                return false;
            }
            return true;
        }
        match limiter.try_acquire(now) {
            Ok(()) => {
                self.prepaid = true;
                self.limiter_retry = None;
                true
            }
            Err(retry_at) => {
                self.limiter_retry = Some(retry_at);
                false
            }
        }
    }

    /// Answers empty every waiter whose long poll ended by `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        // Called after every Broker message: rebuild the list only when one is due.
        if !self.waiters.iter().any(|w| w.deadline <= now) {
            return;
        }
        let (expired, kept): (VecDeque<Waiter>, VecDeque<Waiter>) =
            std::mem::take(&mut self.waiters)
                .into_iter()
                .partition(|w| w.deadline <= now);
        self.waiters = kept;
        for w in expired {
            let _ = w.reply.send(Vec::new());
        }
    }

    /// When something here is next due: a delayed job, a waiter's deadline, or the
    /// limiter's next token while jobs are ready, a lessee waits and the queue is
    /// neither paused nor draining (otherwise nothing is picked, and a passed retry
    /// time would only wake the Broker again and again).
    pub(crate) fn soonest(&self) -> Option<Instant> {
        let limiter = self.limiter_retry.filter(|_| {
            !self.fair.is_empty() && !self.waiters.is_empty() && !self.paused && !self.draining
        });
        [
            self.delayed.next_due(),
            self.waiters.iter().map(|w| w.deadline).min(),
            limiter,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

fn same_limiter(a: &Option<Arc<RateLimiter>>, b: &Option<Arc<RateLimiter>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Every configured queue's [`Dispatch`], and the wall and monotonic time of the
/// Broker message being handled (a job's due time is placed on the monotonic
/// clock when it is handed over).
pub(crate) struct Dispatches {
    queues: HashMap<Arc<str>, Dispatch>,
    wall: UnixMillis,
    mono: Instant,
}

impl Default for Dispatches {
    fn default() -> Self {
        Dispatches {
            queues: HashMap::new(),
            wall: 0,
            mono: Instant::now(),
        }
    }
}

impl Dispatches {
    /// Sets the time of the message being handled.
    pub(crate) fn at(&mut self, wall: UnixMillis, mono: Instant) {
        self.wall = wall;
        self.mono = mono;
    }

    /// The time set by [`Self::at`].
    pub(crate) fn now(&self) -> (UnixMillis, Instant) {
        (self.wall, self.mono)
    }

    /// The Dispatch of `queue`, if it is configured.
    pub(crate) fn get(&self, queue: &str) -> Option<&Dispatch> {
        self.queues.get(queue)
    }

    /// The Dispatch of `queue`, if it is configured.
    pub(crate) fn get_mut(&mut self, queue: &str) -> Option<&mut Dispatch> {
        self.queues.get_mut(queue)
    }

    /// Whether `queue` has a Dispatch.
    pub(crate) fn contains(&self, queue: &str) -> bool {
        self.queues.contains_key(queue)
    }

    /// Adds the Dispatch of a queue that became configured.
    pub(crate) fn insert(&mut self, queue: Arc<str>, dispatch: Dispatch) {
        self.queues.insert(queue, dispatch);
    }

    /// Drops the Dispatch of every queue `keep` refuses (no longer configured),
    /// answering its waiting lessees empty.
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.queues.retain(|queue, d| {
            let kept = keep(queue);
            if !kept {
                d.drain();
            }
            kept
        });
    }

    /// Every queue's Dispatch, in no order.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&Arc<str>, &mut Dispatch)> {
        self.queues.iter_mut()
    }

    /// The names of the queues with a Dispatch.
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.queues.keys().cloned().collect()
    }

    /// The soonest time any queue's Dispatch is due.
    pub(crate) fn soonest(&self) -> Option<Instant> {
        self.queues.values().filter_map(Dispatch::soonest).min()
    }

    /// A job of `queue` is ready or delayed (see [`Dispatch::ready`]); dropped for
    /// a queue that is not configured (it is handed over when it is again).
    pub(crate) fn ready(
        &mut self,
        queue: &str,
        tenant: Arc<str>,
        id: JobId,
        ready_at: UnixMillis,
        priority: i64,
    ) {
        let (wall, mono) = (self.wall, self.mono);
        if let Some(d) = self.queues.get_mut(queue) {
            d.ready(tenant, id, ready_at, priority, wall, mono);
        }
    }
}

#[cfg(test)]
mod tests;
