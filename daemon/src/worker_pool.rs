//! The WorkerPool actor, one per queue with an in-process executor: supervises its
//! Workers and sizes the pool between `workers.min` and `workers.max` on the age of
//! the oldest ready job ([`autoscale`]).
//!
//! A Worker that panics is restarted after a backoff (100 ms doubling to 10 s per
//! consecutive crash of that slot), and the Broker is told to fail the job it held
//! (charged as `worker_crashed`, then retried or dead-lettered by the normal policy)
//! — never lost. Every second the pool asks the Broker for its queue's oldest ready age,
//! decides, logs each change with its reason, and exports `qd_workers` and
//! `qd_workers_desired`.
//!
//! An operator's cancel of a running job reaches the attempt through its pool
//! ([`PoolMsg::Revoke`]): the worker that runs it is stopped gracefully (see
//! [`crate::executor::Executor::run`]) and goes on to its next job. A revoke that
//! arrives before the worker reported the job finds nothing; that worker's next
//! heartbeat is refused and cuts the attempt short instead.
//!
//! Messages ([`PoolMsg`]): `Busy` (from Workers), `Tick`, `Respawn` (its timers),
//! `LimitsChanged`, `Revoke` (from admin), `Drain`, `Interrupt` (from the Supervisor during
//! shutdown), `Stats`. Supervised by the Supervisor.

pub mod autoscale;
pub mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::{self, BrokerMsg};
use crate::config::WorkersConfig;
use crate::executor::Executors;
use crate::job::JobId;
use crate::limits::Limits;
use crate::metrics;
use autoscale::{Observation, Policy};
use worker::{Worker, WorkerArgs, WorkerMsg};

/// The `actor` label of `qd_actor_restarts_total` for a pool's crashed workers,
/// created at 0 when a pool starts so the `QdActorRestarts` alert sees the first.
const WORKER: &str = "worker";

/// The registered name of the pool of `queue`.
pub fn name(queue: &str) -> String {
    format!("pool:{queue}")
}

/// Busy and total workers, and the desired size.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolStats {
    /// Workers running a job.
    pub busy: u32,
    /// Workers alive.
    pub total: u32,
    /// What the autoscaler wants.
    pub desired: u32,
    /// Current lower bound.
    pub min: u32,
    /// Current upper bound.
    pub max: u32,
}

/// Messages the pool takes.
pub enum PoolMsg {
    /// A worker started a job (with the token that stops its attempt gracefully) or
    /// finished it (`None`).
    Busy(String, Option<(JobId, CancellationToken)>),
    /// An operator cancelled this job (the Broker already revoked its lease): stop
    /// its attempt if one of this pool's workers runs it.
    Revoke(JobId),
    /// Autoscaler timer.
    Tick,
    /// Restart the worker of this slot (after a crash backoff).
    Respawn(u32),
    /// Worker bounds changed: reread them from [`Limits`].
    LimitsChanged,
    /// Shutdown: take no new jobs; answer when every worker has stopped.
    Drain(RpcReplyPort<()>),
    /// Shutdown grace ran out: interrupt running jobs.
    Interrupt,
    /// Busy/total/desired.
    Stats(RpcReplyPort<PoolStats>),
}

/// What a pool is started with.
pub struct PoolArgs {
    /// The queue whose jobs its workers run.
    pub queue: Arc<str>,
    /// Every queue's executor (looked up per attempt by the workers).
    pub executors: Arc<Executors>,
    /// Owner of the config in force (sizing, heartbeat) and of the runtime overrides
    /// of the bounds; read at each decision, so a reload applies at the next tick.
    pub limits: Arc<Limits>,
    /// Enables the worker panic test hook.
    pub test_hooks: bool,
    /// Where worker restarts are counted (shared with the Supervisor's).
    pub restarts: metrics::Restarts,
    /// The store, from which a worker reads a job's parents before an attempt.
    pub store: crate::store::Store,
}

struct Slot {
    id: String,
    actor: Option<ActorRef<WorkerMsg>>,
    /// Told to stop by a scale-down: it finishes the job it holds (one it is still
    /// long-polling for included), then terminates. The slot, and with it the
    /// worker's registered name, stays taken until then, so no new worker is
    /// started under that name, a cancel still reaches its job and a drain waits
    /// for it; it no longer counts towards the pool's size.
    stopping: bool,
    busy: bool,
    /// The job it runs and the token that stops that attempt gracefully.
    running: Option<(JobId, CancellationToken)>,
    idle_since: Instant,
    crashes: u32,
}

/// The pool's state.
pub struct PoolState {
    args: PoolArgs,
    slots: BTreeMap<u32, Slot>,
    by_actor: BTreeMap<ActorId, u32>,
    desired: u32,
    last_scale_up: Instant,
    draining: CancellationToken,
    interrupt: CancellationToken,
    drained: Vec<RpcReplyPort<()>>,
}

/// The pool actor.
pub struct WorkerPool;

/// How often the autoscaler decides.
const TICK: Duration = Duration::from_secs(1);

impl Actor for WorkerPool {
    type Msg = PoolMsg;
    type State = PoolState;
    type Arguments = PoolArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<PoolMsg>,
        args: PoolArgs,
    ) -> Result<PoolState, ActorProcessingErr> {
        let (min, _) = args.limits.workers(&args.queue, &workers_config(&args));
        metrics::register_actor(WORKER);
        let mut state = PoolState {
            args,
            slots: BTreeMap::new(),
            by_actor: BTreeMap::new(),
            desired: min,
            last_scale_up: Instant::now(),
            draining: CancellationToken::new(),
            interrupt: CancellationToken::new(),
            drained: Vec::new(),
        };
        state.resize(&myself).await?;
        myself.send_interval(TICK, || PoolMsg::Tick);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<PoolMsg>,
        msg: PoolMsg,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            PoolMsg::Busy(id, running) => state.set_busy(&id, running),
            PoolMsg::Revoke(job) => state.revoke(job),
            PoolMsg::Tick => state.autoscale(&myself).await?,
            PoolMsg::Respawn(slot) => state.respawn(&myself, slot).await?,
            PoolMsg::LimitsChanged => state.autoscale(&myself).await?,
            PoolMsg::Drain(reply) => {
                state.draining.cancel();
                state.drained.push(reply);
                state.check_drained();
            }
            PoolMsg::Interrupt => state.interrupt.cancel(),
            PoolMsg::Stats(reply) => {
                let _ = reply.send(state.stats());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<PoolMsg>,
        event: SupervisionEvent,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                state.crashed(&myself, &cell, &err.to_string())
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(n) = state.by_actor.remove(&cell.get_id()) {
                    state.slots.remove(&n);
                }
                state.check_drained();
            }
            _ => {}
        }
        Ok(())
    }
}

impl PoolState {
    fn stats(&self) -> PoolStats {
        let (min, max) = self.bounds();
        PoolStats {
            busy: self.slots.values().filter(|s| s.busy).count() as u32,
            total: self.slots.values().filter(|s| s.actor.is_some()).count() as u32,
            desired: self.desired,
            min,
            max,
        }
    }

    fn bounds(&self) -> (u32, u32) {
        self.args
            .limits
            .workers(&self.args.queue, &workers_config(&self.args))
    }

    fn set_busy(&mut self, id: &str, running: Option<(JobId, CancellationToken)>) {
        if let Some(slot) = self.slots.values_mut().find(|s| s.id == id) {
            slot.busy = running.is_some();
            slot.running = running;
            if !slot.busy {
                slot.idle_since = Instant::now();
            }
        }
    }

    /// Stops the attempt of `job`, if a worker of this pool runs it.
    fn revoke(&mut self, job: JobId) {
        let mut running = self.slots.values().filter_map(|s| s.running.as_ref());
        if let Some((_, stop)) = running.find(|(id, _)| *id == job) {
            info!(queue = %self.args.queue, job = %job, "Stopping the attempt of a cancelled job.");
            stop.cancel();
        }
    }

    async fn autoscale(&mut self, myself: &ActorRef<PoolMsg>) -> Result<(), ActorProcessingErr> {
        if self.draining.is_cancelled() {
            return Ok(());
        }
        let Ok(stats) = broker::dispatch_stats(&self.args.queue, Duration::from_secs(1)).await
        else {
            return Ok(());
        };
        let now = Instant::now();
        let wall = crate::clock::wall_ms();
        let (min, max) = self.bounds();
        let obs = Observation {
            current: self.active(),
            ready: stats.ready,
            oldest_ready_age: stats
                .oldest_ready_at
                .map(|at| Duration::from_millis(u64::try_from(wall - at).unwrap_or(0))),
            longest_idle: self
                .slots
                .values()
                .filter(|s| !s.busy && !s.stopping)
                .map(|s| now - s.idle_since)
                .max()
                .unwrap_or_default(),
            since_scale_up: now - self.last_scale_up,
        };
        let sizing = workers_config(&self.args);
        let policy = Policy {
            min,
            max,
            target_age: sizing.target_age,
            idle_cooldown: sizing.idle_cooldown,
        };
        let decision = autoscale::decide(obs, policy);
        if decision.desired != self.desired {
            info!(queue = %self.args.queue, from = self.desired, to = decision.desired,
                reason = %decision.reason, "Worker pool resized.");
            if decision.desired > self.desired {
                self.last_scale_up = now;
            }
            self.desired = decision.desired;
        }
        self.resize(myself).await?;
        let s = self.stats();
        metrics::set_workers(&self.args.queue, s.busy, s.total - s.busy, s.desired);
        Ok(())
    }

    /// Workers that count towards the pool's size: every slot not stopping.
    fn active(&self) -> u32 {
        self.slots.values().filter(|s| !s.stopping).count() as u32
    }

    /// Starts or stops workers until the pool has `desired` of them (not counting
    /// those already stopping). A new worker takes the lowest slot number not held
    /// by a live or stopping worker; a stopped one keeps its slot until it has
    /// terminated (see [`Slot::stopping`]).
    async fn resize(&mut self, myself: &ActorRef<PoolMsg>) -> Result<(), ActorProcessingErr> {
        while self.active() < self.desired {
            let slot = (0..).find(|n| !self.slots.contains_key(n)).unwrap_or(0);
            self.spawn(myself, slot).await?;
        }
        while self.active() > self.desired {
            let running = || self.slots.iter().filter(|(_, s)| !s.stopping);
            let idle = running()
                .filter(|(_, s)| !s.busy)
                .max_by_key(|(n, _)| **n)
                .or_else(|| running().max_by_key(|(n, _)| **n))
                .map(|(n, _)| *n);
            let Some(n) = idle else { break };
            let Some(slot) = self.slots.get_mut(&n) else {
                break;
            };
            match &slot.actor {
                Some(actor) => {
                    slot.stopping = true;
                    actor.stop(Some("pool scaled down".into()));
                }
                // Crashed and waiting for its respawn: nothing runs there.
                None => {
                    self.slots.remove(&n);
                }
            }
        }
        Ok(())
    }

    /// Restarts the crashed worker of slot `n`, unless a scale-down gave the slot up
    /// meanwhile.
    async fn respawn(
        &mut self,
        myself: &ActorRef<PoolMsg>,
        n: u32,
    ) -> Result<(), ActorProcessingErr> {
        match self.slots.get(&n) {
            Some(slot) if slot.actor.is_none() && !slot.stopping => self.spawn(myself, n).await,
            _ => {
                self.check_drained();
                Ok(())
            }
        }
    }

    async fn spawn(
        &mut self,
        myself: &ActorRef<PoolMsg>,
        n: u32,
    ) -> Result<(), ActorProcessingErr> {
        if self.draining.is_cancelled() {
            self.slots.remove(&n);
            self.check_drained();
            return Ok(());
        }
        let id = format!("{}/{n}", self.args.queue);
        let args = WorkerArgs {
            id: id.clone(),
            queue: self.args.queue.clone(),
            executors: self.args.executors.clone(),
            limits: self.args.limits.clone(),
            pool: myself.clone(),
            draining: self.draining.clone(),
            interrupt: self.interrupt.clone(),
            test_hooks: self.args.test_hooks,
            store: self.args.store.clone(),
        };
        let name = format!("worker:{id}");
        let (actor, _) = Actor::spawn_linked(Some(name), Worker, args, myself.get_cell()).await?;
        let crashes = self.slots.get(&n).map(|s| s.crashes).unwrap_or(0);
        self.by_actor.insert(actor.get_id(), n);
        self.slots.insert(
            n,
            Slot {
                id,
                actor: Some(actor),
                stopping: false,
                busy: false,
                running: None,
                idle_since: Instant::now(),
                crashes,
            },
        );
        Ok(())
    }

    fn crashed(&mut self, myself: &ActorRef<PoolMsg>, cell: &ActorCell, error: &str) {
        let Some(n) = self.by_actor.remove(&cell.get_id()) else {
            return;
        };
        let Some(slot) = self.slots.get_mut(&n) else {
            return;
        };
        if slot.stopping {
            let id = slot.id.clone();
            self.slots.remove(&n);
            warn!(queue = %self.args.queue, worker = %id, error, "Stopping worker crashed; its job goes back through the retry policy.");
            self.args.restarts.record(WORKER);
            broker::cast(BrokerMsg::WorkerLost(id, error.to_string()));
            self.check_drained();
            return;
        }
        slot.actor = None;
        slot.busy = false;
        slot.running = None;
        slot.crashes += 1;
        let delay =
            Duration::from_millis(100 * 2u64.pow(slot.crashes.min(7))).min(Duration::from_secs(10));
        warn!(queue = %self.args.queue, worker = %slot.id, error, restart_in = ?delay, "Worker crashed; its job goes back through the retry policy.");
        self.args.restarts.record(WORKER);
        broker::cast(BrokerMsg::WorkerLost(slot.id.clone(), error.to_string()));
        myself.send_after(delay, move || PoolMsg::Respawn(n));
    }

    fn check_drained(&mut self) {
        if self.draining.is_cancelled() && self.slots.values().all(|s| s.actor.is_none()) {
            for reply in self.drained.drain(..) {
                let _ = reply.send(());
            }
        }
    }
}

/// The queue's `workers` settings in force (all zero if a reload removed the queue;
/// its pool is being stopped then).
fn workers_config(args: &PoolArgs) -> WorkersConfig {
    args.limits.config().queues.get(&*args.queue).map_or(
        WorkersConfig {
            min: 0,
            max: 0,
            target_age: Duration::from_secs(5),
            idle_cooldown: Duration::from_secs(30),
        },
        |q| q.workers,
    )
}
