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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::broker::dispatch::Dispatch;
use crate::broker::{self, BrokerMsg, DispatchStats, LeaseRequest, LeasedJob, Resync};
use crate::clock::wall_ms;
use crate::job::{JobId, UnixMillis};
use crate::limits::Limits;
use crate::rate_limit::RateLimiter;
use fair::Fairness;

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

/// The pending `Tick` of the armed timer.
type Timer = JoinHandle<Result<(), ractor::MessagingErr<SchedulerMsg>>>;

/// The scheduler's state: the queue's [`Dispatch`] and the timer armed for it.
pub struct SchedulerState {
    queue: Arc<str>,
    dispatch: Dispatch,
    limits: Arc<Limits>,
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
        let mut dispatch = Dispatch::new(args.fairness, args.limiter);
        dispatch.configure(&args.queue, &args.limits);
        let state = SchedulerState {
            queue: args.queue,
            dispatch,
            limits: args.limits,
            timer: None,
            myself,
        };
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
        let d = &mut self.dispatch;
        match msg {
            SchedulerMsg::Batch(msgs) => {
                for msg in msgs {
                    self.take(msg, now);
                }
            }
            SchedulerMsg::Ready(tenant, id, ready_at) => {
                d.ready(tenant, id, ready_at, 0, wall_ms(), now)
            }
            SchedulerMsg::ReadyPrioritized(tenant, id, ready_at, priority) => {
                d.ready(tenant, id, ready_at, priority, wall_ms(), now)
            }
            SchedulerMsg::Remove(tenant, id, ready_at) => d.remove(&tenant, id, ready_at),
            SchedulerMsg::Finished(tenant, run) => d.finish(&tenant, run),
            SchedulerMsg::AtCap(tenant, id, ready_at) => d.at_cap(tenant, id, ready_at, 0),
            SchedulerMsg::AtCapPrioritized(tenant, id, ready_at, priority) => {
                d.at_cap(tenant, id, ready_at, priority)
            }
            SchedulerMsg::Reopen => d.reopen(),
            SchedulerMsg::Restore(snapshot) => d.restore(*snapshot, wall_ms(), now),
            SchedulerMsg::Throttled(pause) => d.throttled(pause),
            SchedulerMsg::Lease(request, reply) => d.enlist(request, reply, now),
            SchedulerMsg::LimitsChanged => d.configure(&self.queue, &self.limits),
            SchedulerMsg::Pause(paused) => d.pause(paused),
            SchedulerMsg::Drain => d.drain(),
            SchedulerMsg::Stats(reply) => {
                let _ = reply.send(d.stats());
            }
            SchedulerMsg::Tick => self.timer = None,
        }
    }

    /// Hands ready jobs to waiting lessees (through the Broker's `Lease`), then
    /// re-arms the timer.
    fn dispatch(&mut self, now: Instant) {
        for grant in self.dispatch.grants(now) {
            broker::cast(BrokerMsg::Lease {
                queue: self.queue.clone(),
                picks: grant.picks,
                worker: grant.worker,
                reply: grant.reply,
            });
        }
        self.dispatch.expire(now);
        self.arm(now);
    }

    /// Arms one timer for the soonest deadline (delayed job, waiter, limiter).
    fn arm(&mut self, now: Instant) {
        match (self.dispatch.soonest(), &self.timer) {
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
