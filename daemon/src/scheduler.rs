//! The Scheduler actor, one per queue: decides which ready job goes to which lessee.
//!
//! It owns the dispatch order of the queue's ready jobs per tenant (a
//! [`fair::FairQueue`]: weighted deficit round robin with per-tenant concurrency
//! caps, 24 bytes per ready job), the delayed jobs (a [`delayed::DelayedJobs`] keyed
//! by monotonic due time), and the lessees waiting in a long poll (in-process Workers
//! and external workers alike). The jobs' states are the Broker's: it holds ids and
//! ready times only, never payloads, and the Broker refuses a pick that is no longer
//! leasable. It arms one timer for the soonest of: a delayed job's due time, a
//! waiter's deadline, or the rate limiter's next token — it never polls.
//!
//! Messages ([`SchedulerMsg`]): `Ready`, `Remove`, `Finished`, `AtCap`, `Restore`,
//! `Batch`, `Throttled` (from the Broker), `Lease` (from Workers and the API),
//! `LimitsChanged`, `Pause`, `Drain`, `Stats`, `Reopen` (from the Cluster actor), and
//! its own `Tick`. Chosen jobs go to the Broker as one `Lease`
//! message whose reply port is the lessee's, so the scheduler never waits on the
//! broker. On start it asks the broker to resync it. Supervised by the Supervisor.

pub mod delayed;
pub mod fair;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::broker::{self, BrokerMsg, DispatchStats, LeaseRequest, LeasedJob, MAX_WAIT, Resync};
use crate::clock::{until, wall_ms};
use crate::job::{JobId, UnixMillis};
use crate::limits::Limits;
use crate::rate_limit::RateLimiter;
use delayed::DelayedJobs;
use fair::{FairQueue, Fairness, TenantLimits};

/// The registered name of the scheduler of `queue`.
pub fn name(queue: &str) -> String {
    format!("scheduler:{queue}")
}

/// Messages the scheduler takes.
pub enum SchedulerMsg {
    /// A job is ready at `ready_at` (now or later).
    Ready(Arc<str>, JobId, UnixMillis),
    /// A job with a priority (milliseconds, non-zero) is ready at `ready_at` (now or
    /// later): it ranks among its tenant's jobs by `ready_at - priority`. Removed by
    /// `Remove` with its `ready_at`, as any job.
    ReadyPrioritized(Arc<str>, JobId, UnixMillis, i64),
    /// Forget a ready or delayed job of this tenant (cancelled), ready at this time
    /// (Unix ms) as it was handed over.
    Remove(Arc<str>, JobId, UnixMillis),
    /// A leased job of this tenant ended after running this long.
    Finished(Arc<str>, Duration),
    /// A job of this tenant, ready at this time (Unix ms) as it was handed over, was
    /// picked but not leased: the shared store refused it because the tenant is at
    /// its `max_concurrency` across the cluster. It is queued again uncharged and
    /// the tenant is held at its cap until one of its jobs ends here or `Reopen`
    /// ([`FairQueue::at_cap`]).
    AtCap(Arc<str>, JobId, UnixMillis),
    /// `AtCap` of a job with a priority (milliseconds, non-zero).
    AtCapPrioritized(Arc<str>, JobId, UnixMillis, i64),
    /// Other nodes may have ended leases (the cluster's poll or heartbeat): tenants
    /// held at their cap across the cluster are tried again.
    Reopen,
    /// Replace every job and running count with the Broker's view (a resync), in
    /// one message however many jobs the queue holds.
    Restore(Box<Snapshot>),
    /// A job's downstream said "slow down" (a throttled result, from qd's workers or
    /// an external one): pause the queue's shared rate limiter for this long.
    Throttled(Duration),
    /// A lessee asks for work; answered by the Broker (or empty on timeout).
    Lease(LeaseRequest, RpcReplyPort<Vec<LeasedJob>>),
    /// Weights or caps changed: reread them from [`Limits`].
    LimitsChanged,
    /// Stop (true) or resume (false) handing out jobs.
    Pause(bool),
    /// Shutdown: hand out nothing more, answer waiting lessees empty.
    Drain,
    /// Snapshot for metrics, qctl and the autoscaler.
    Stats(RpcReplyPort<DispatchStats>),
    /// Several of the Broker's messages at once (the changes of one Broker message,
    /// in order), applied before one dispatch.
    Batch(Vec<SchedulerMsg>),
    /// Its one timer: the soonest delayed job, waiter deadline or limiter token.
    Tick,
}

/// A ready or delayed job in a [`Snapshot`]: its id and `ready_at` (Unix ms).
pub type Waiting = (JobId, UnixMillis);

/// A queue's jobs as the Broker holds them, for [`SchedulerMsg::Restore`]: what a
/// Scheduler is rebuilt from after a (re)start of either actor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Per tenant (each named once), its ready and delayed jobs as `(id, ready_at)`
    /// (Unix ms), sorted by `(ready_at, id)`: oldest first, so they queue in that
    /// order. A job due later than now waits as delayed.
    pub jobs: Vec<(Arc<str>, Vec<Waiting>)>,
    /// Per tenant (each named once), how many of its jobs are leased (running).
    pub running: Vec<(Arc<str>, u32)>,
    /// The priorities (milliseconds) of the jobs of `jobs` that have one.
    pub priorities: HashMap<JobId, i64>,
}

/// What a scheduler is started with.
pub struct SchedulerArgs {
    /// The queue whose ready jobs it orders.
    pub queue: Arc<str>,
    /// Jobs or run time.
    pub fairness: Fairness,
    /// Live weights, caps and pause flags.
    pub limits: Arc<Limits>,
    /// The queue's shared rate limiter, if it names one.
    pub limiter: Option<Arc<RateLimiter>>,
}

struct Waiter {
    request: LeaseRequest,
    reply: RpcReplyPort<Vec<LeasedJob>>,
    deadline: Instant,
}

/// The pending `Tick` of the armed timer.
type Timer = JoinHandle<Result<(), ractor::MessagingErr<SchedulerMsg>>>;

/// The scheduler's state.
pub struct SchedulerState {
    queue: Arc<str>,
    fair: FairQueue,
    delayed: DelayedJobs<Instant>,
    /// The priorities of the delayed jobs that have one, until they are due.
    delayed_priorities: HashMap<JobId, i64>,
    waiters: VecDeque<Waiter>,
    limits: Arc<Limits>,
    limiter: Option<Arc<RateLimiter>>,
    /// A rate-limiter token taken when every backlogged tenant was capped, spent on
    /// the next pick (once a pause of the limiter ended).
    prepaid: bool,
    limiter_retry: Option<Instant>,
    paused: bool,
    draining: bool,
    timer: Option<(Instant, Timer)>,
    myself: ActorRef<SchedulerMsg>,
}

/// The scheduler actor.
pub struct Scheduler;

impl Actor for Scheduler {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = SchedulerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SchedulerMsg>,
        args: SchedulerArgs,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        let mut state = SchedulerState {
            paused: args.limits.paused(&args.queue),
            queue: args.queue,
            fair: FairQueue::new(args.fairness),
            delayed: DelayedJobs::new(),
            delayed_priorities: HashMap::new(),
            waiters: VecDeque::new(),
            limits: args.limits,
            limiter: args.limiter,
            prepaid: false,
            limiter_retry: None,
            draining: false,
            timer: None,
            myself,
        };
        state.apply_limits();
        broker::cast(BrokerMsg::Resync(Resync::Scheduler(state.queue.clone())));
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<SchedulerMsg>,
        msg: SchedulerMsg,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        state.take(msg, Instant::now());
        state.dispatch(Instant::now());
        Ok(())
    }
}

impl SchedulerState {
    /// Applies one message to the state (dispatch follows once per actor message).
    fn take(&mut self, msg: SchedulerMsg, now: Instant) {
        match msg {
            SchedulerMsg::Batch(msgs) => {
                for msg in msgs {
                    self.take(msg, now);
                }
            }
            SchedulerMsg::Ready(tenant, id, ready_at) => self.ready(tenant, id, ready_at, 0, now),
            SchedulerMsg::ReadyPrioritized(tenant, id, ready_at, priority) => {
                self.ready(tenant, id, ready_at, priority, now)
            }
            SchedulerMsg::Remove(tenant, id, ready_at) => {
                if self.delayed.remove(id) {
                    self.delayed_priorities.remove(&id);
                } else {
                    self.fair.remove(&tenant, id, ready_at);
                }
            }
            SchedulerMsg::Finished(tenant, run) => self.fair.finish(&tenant, run),
            SchedulerMsg::AtCap(tenant, id, ready_at) => self.fair.at_cap(tenant, id, ready_at),
            SchedulerMsg::AtCapPrioritized(tenant, id, ready_at, priority) => {
                self.fair.at_cap_prioritized(tenant, id, ready_at, priority)
            }
            SchedulerMsg::Reopen => self.fair.reopen(),
            SchedulerMsg::Restore(snapshot) => self.restore(*snapshot, now),
            SchedulerMsg::Throttled(pause) => {
                if let Some(limiter) = &self.limiter {
                    limiter.pause(pause);
                }
            }
            SchedulerMsg::Lease(request, reply) => self.enlist(request, reply, now),
            SchedulerMsg::LimitsChanged => {
                self.paused = self.limits.paused(&self.queue);
                self.apply_limits();
            }
            SchedulerMsg::Pause(paused) => self.paused = paused,
            SchedulerMsg::Drain => {
                self.draining = true;
                for w in self.waiters.drain(..) {
                    let _ = w.reply.send(Vec::new());
                }
            }
            SchedulerMsg::Stats(reply) => {
                let _ = reply.send(self.stats());
            }
            SchedulerMsg::Tick => self.timer = None,
        }
    }

    fn apply_limits(&mut self) {
        let default = self.limits.tenant("default");
        self.fair.set_default_limits(TenantLimits {
            weight: default.weight,
            max_concurrency: self.limits.tenant_cap(&self.queue, "default"),
        });
        let names = self.limits.tenant_names();
        // A tenant no longer named (its override reset) falls back to the default.
        self.fair
            .retain_limits(|tenant| names.binary_search_by(|n| n.as_str().cmp(tenant)).is_ok());
        for tenant in names {
            let t = self.limits.tenant(&tenant);
            let cap = self.limits.tenant_cap(&self.queue, &tenant);
            self.fair.set_limits(
                &tenant,
                TenantLimits {
                    weight: t.weight,
                    max_concurrency: cap,
                },
            );
        }
    }

    fn ready(
        &mut self,
        tenant: Arc<str>,
        id: JobId,
        ready_at: UnixMillis,
        priority: i64,
        now: Instant,
    ) {
        let wall = wall_ms();
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

    /// Forgets every job and running count, then takes the Broker's: ready jobs in
    /// bulk ([`FairQueue::extend`], which keeps each tenant's list as its backlog),
    /// delayed ones by due time.
    fn restore(&mut self, snapshot: Snapshot, now: Instant) {
        self.fair.clear();
        self.delayed.clear();
        self.delayed_priorities.clear();
        let wall = wall_ms();
        let priorities = snapshot.priorities;
        for (tenant, mut jobs) in snapshot.jobs {
            let due = jobs.partition_point(|&(_, ready_at)| ready_at <= wall);
            for (id, ready_at) in jobs.split_off(due) {
                let priority = priorities.get(&id).copied().unwrap_or(0);
                self.ready(tenant.clone(), id, ready_at, priority, now);
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

    fn enlist(&mut self, request: LeaseRequest, reply: RpcReplyPort<Vec<LeasedJob>>, now: Instant) {
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

    fn stats(&self) -> DispatchStats {
        DispatchStats {
            ready: self.fair.len() as u64,
            delayed: self.delayed.len() as u64,
            oldest_ready_at: self.fair.oldest_ready_at(),
            waiting_lessees: self.waiters.len(),
            paused: self.paused,
        }
    }

    /// Hands ready jobs to waiting lessees, then re-arms the timer.
    fn dispatch(&mut self, now: Instant) {
        for (tenant, id, ready_at) in self.delayed.pop_due(now) {
            let priority = self.delayed_priorities.remove(&id).unwrap_or(0);
            self.fair.push_prioritized(tenant, id, ready_at, priority);
        }
        self.waiters.retain(|w| !w.reply.is_closed());
        if !self.paused && !self.draining {
            while let Some(picks) = self.pick(now) {
                let Some(waiter) = self.waiters.pop_front() else {
                    break;
                };
                let lease = BrokerMsg::Lease {
                    queue: self.queue.clone(),
                    picks,
                    worker: waiter.request.worker,
                    reply: waiter.reply,
                };
                broker::cast(lease);
            }
        }
        self.expire_waiters(now);
        self.arm(now);
    }

    /// Pops up to the front waiter's `max_jobs` jobs (with their tenants), one
    /// rate-limiter token each.
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

    fn expire_waiters(&mut self, now: Instant) {
        while let Some(pos) = self.waiters.iter().position(|w| w.deadline <= now) {
            if let Some(w) = self.waiters.remove(pos) {
                let _ = w.reply.send(Vec::new());
            }
        }
    }

    /// Arms one timer for the soonest deadline (delayed job, waiter, limiter).
    fn arm(&mut self, now: Instant) {
        let limiter = self.limiter_retry.filter(|_| !self.fair.is_empty());
        let soonest = [
            self.delayed.next_due(),
            self.waiters.iter().map(|w| w.deadline).min(),
            limiter,
        ]
        .into_iter()
        .flatten()
        .min();
        match (soonest, &self.timer) {
            (Some(at), Some((armed, _))) if *armed <= at => {}
            (Some(at), _) => {
                if let Some((_, old)) = self.timer.take() {
                    old.abort();
                }
                let delay = at.saturating_duration_since(now);
                let handle = self.myself.send_after(delay, || SchedulerMsg::Tick);
                self.timer = Some((at, handle));
            }
            (None, _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    async fn stats(actor: &ActorRef<SchedulerMsg>) -> DispatchStats {
        match actor
            .call(SchedulerMsg::Stats, Some(Duration::from_secs(10)))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(stats)) => stats,
            _ => panic!("the scheduler answers Stats"),
        }
    }

    #[tokio::test]
    async fn a_delayed_job_cancelled_after_it_became_ready_is_removed_by_its_ready_time() {
        let text = "[queues.q]\nexecutor = { kind = \"external\" }\n";
        let config = Config::parse(text, std::path::Path::new("/tmp/qd.toml")).expect("config");
        let args = SchedulerArgs {
            queue: Arc::from("q"),
            fairness: Fairness::Jobs,
            limits: Arc::new(Limits::new(Arc::new(config), Vec::new())),
            limiter: None,
        };
        let (actor, task) = Actor::spawn(None, Scheduler, args).await.expect("spawn");
        let (tenant, id) = (Arc::<str>::from("t"), JobId::new());
        let ready_at = wall_ms() + 100;
        actor
            .cast(SchedulerMsg::Ready(tenant.clone(), id, ready_at))
            .expect("cast");
        // Its timer moves it from delayed to ready once due.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = stats(&actor).await;
            if (s.ready, s.delayed) == (1, 0) {
                assert_eq!(s.oldest_ready_at, Some(ready_at), "its own ready time");
                break;
            }
            assert!(Instant::now() < deadline, "never became ready: {s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The Broker names the job by its tenant and the ready time it holds.
        actor
            .cast(SchedulerMsg::Remove(tenant, id, ready_at))
            .expect("cast");
        let s = stats(&actor).await;
        assert_eq!((s.ready, s.delayed, s.oldest_ready_at), (0, 0, None));
        actor.stop(None);
        let _ = task.await;
    }
}
