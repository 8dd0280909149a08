//! The Supervisor actor: the root of qd's actor tree.
//!
//! It spawns, linked to itself: the Broker (which also orders each queue's ready
//! jobs), the Dlq, one
//! WorkerPool per queue with an in-process executor, the Pruner (retention), the
//! Periodic actor (schedules), the
//! Gauges (metrics and watchdog), the HTTP Api and the AdminServer — listeners last,
//! so nothing is accepted before the tree is up. It restarts a failed child
//! one-for-one after a short delay, under the same name. More than `restart.max_restarts`
//! restarts within `restart.window` means something is persistently wrong: the
//! supervisor stops with a failure, the daemon exits non-zero and systemd restarts it.
//!
//! Messages ([`SupervisorMsg`]): `Shutdown` (from signals and the admin socket),
//! `Control` — a reload (SIGHUP, `qctl reload`), the SQS API's created queues, or
//! `Fatal` from the Cluster actor when another node took this node's name (it stops
//! at once, as past the restart intensity) — which the tree sends through
//! [`Controls`](crate::daemon::Controls), so no actor below imports this one; and its own `Restart` timers. A reload
//! (`supervisor/reload.rs`) validates the whole file first and changes nothing
//! unless every change can be applied live. Shutdown is ordered and bounded
//! by `shutdown_grace`: stop intake → stop leasing → let running jobs finish (then
//! interrupt them, uncharged) → on a shared store, end the leases left (external
//! workers'), uncharged → flush the store → stop.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::admin::{self, AdminArgs};
use crate::api::{Api, ApiArgs};
use crate::broker::{self, Broker, BrokerArgs, BrokerMsg};
use crate::cluster::{self, Cluster, ClusterArgs};
use crate::daemon::{Control, Daemon};
use crate::dlq::{self, Dlq};
use crate::gauges::{self, Gauges, GaugesArgs};
use crate::metrics;
use crate::periodic::{self, Periodic};
use crate::pruner::{self, Pruner, PrunerArgs};
use crate::reload::ReloadError;
use crate::worker_pool::{self, PoolArgs, PoolMsg, WorkerPool};

/// A child of the supervisor, by role.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Child {
    /// The Broker: job state and leases.
    Broker,
    /// The Cluster (a shared store only).
    Cluster,
    /// The Dlq: operators' redrives and purges.
    Dlq,
    /// A queue's WorkerPool.
    Pool(Arc<str>),
    /// The Pruner: retention of finished jobs.
    Pruner,
    /// The Periodic actor (schedules).
    Periodic,
    /// The Gauges: state gauges and the watchdog.
    Gauges,
    /// The HTTP Api.
    Api,
    /// The AdminServer.
    Admin,
    /// The web console (only with `[console]`).
    Console,
}

impl Child {
    /// The label used in logs and `qd_actor_restarts_total{actor}`.
    pub fn kind(&self) -> &'static str {
        match self {
            Child::Broker => "broker",
            Child::Cluster => "cluster",
            Child::Dlq => "dlq",
            Child::Pool(_) => "worker_pool",
            Child::Pruner => "pruner",
            Child::Periodic => "periodic",
            Child::Gauges => "gauges",
            Child::Api => "api",
            Child::Admin => "admin",
            Child::Console => "console",
        }
    }
}

/// Messages the supervisor takes.
pub enum SupervisorMsg {
    /// Graceful, ordered shutdown (SIGTERM, SIGINT, or `qctl shutdown`).
    Shutdown(String),
    /// A request from `main` or from an actor of the tree
    /// ([`Controls`](crate::daemon::Controls)).
    Control(Control),
    /// Timer: restart this child.
    Restart(Child),
}

/// The supervisor's state.
pub struct SupervisorState {
    daemon: Daemon,
    children: HashMap<ActorId, Child>,
    recent: VecDeque<Instant>,
    shutting_down: bool,
    /// Whether a Broker has been started before in this run (then a new one is a restart).
    broker_started: bool,
}

/// The supervisor actor.
pub struct Supervisor;

/// The registered name of the supervisor.
pub const NAME: &str = "supervisor";
/// Pause before restarting a failed child.
const RESTART_DELAY: Duration = Duration::from_millis(200);

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    /// The daemon and the receiving side of its [`Controls`].
    type Arguments = (Daemon, mpsc::UnboundedReceiver<Control>);

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        (daemon, mut controls): (Daemon, mpsc::UnboundedReceiver<Control>),
    ) -> Result<SupervisorState, ActorProcessingErr> {
        // The root is never restarted: this task lives as long as the daemon.
        let me = myself.clone();
        tokio::spawn(async move {
            while let Some(control) = controls.recv().await {
                if me.cast(SupervisorMsg::Control(control)).is_err() {
                    break;
                }
            }
        });
        let mut state = SupervisorState {
            daemon,
            children: HashMap::new(),
            recent: VecDeque::new(),
            shutting_down: false,
            broker_started: false,
        };
        for q in state.daemon.config().queues.keys() {
            metrics::register_queue(q);
        }
        for child in state.all_children() {
            metrics::register_actor(child.kind());
            state.spawn(&myself, child).await?;
        }
        info!(queues = state.daemon.config().queues.len(), "qd is up.");
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Restart(child)
                if !state.shutting_down && state.still_configured(&child) =>
            {
                if let Err(err) = state.spawn(&myself, child.clone()).await {
                    error!(actor = child.kind(), error = %err, "Restart failed; retrying.");
                    state.failed(&myself, child, &err.to_string());
                }
            }
            SupervisorMsg::Restart(_) => {}
            SupervisorMsg::Control(Control::Reload(reply)) => {
                let outcome = if state.shutting_down {
                    Err(ReloadError::Unavailable("qd is shutting down".into()))
                } else {
                    state.reload(&myself).await
                };
                if let Some(reply) = reply {
                    let _ = reply.send(outcome);
                }
            }
            SupervisorMsg::Control(Control::SqsQueuesChanged { here, reply }) => {
                let outcome = if state.shutting_down {
                    Err(ReloadError::Unavailable("qd is shutting down".into()))
                } else {
                    state.sync_sqs_queues(&myself, here).await
                };
                match reply {
                    Some(reply) => {
                        let _ = reply.send(outcome);
                    }
                    None => {
                        if let Err(err) = outcome {
                            warn!(error = %err, "SQS queues changed on another node could not be applied here; the next heartbeat tries again.");
                        }
                    }
                }
            }
            SupervisorMsg::Control(Control::Fatal(reason)) => {
                if !state.shutting_down {
                    state.give_up(&myself, reason);
                }
            }
            SupervisorMsg::Shutdown(reason) => {
                if !state.shutting_down {
                    state.shutting_down = true;
                    state.shutdown(&reason).await;
                    myself.stop(Some(format!("shutdown: {reason}")));
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                format!("stopped unexpectedly ({})", reason.unwrap_or_default()),
            ),
            _ => return Ok(()),
        };
        if let Some(child) = state.children.remove(&cell.get_id())
            && !state.shutting_down
        {
            state.failed(&myself, child, &why);
        }
        Ok(())
    }
}

impl SupervisorState {
    fn all_children(&self) -> Vec<Child> {
        let cfg = self.daemon.config();
        let queues = || cfg.queues.keys().map(|q| Arc::<str>::from(q.as_str()));
        let mut children = vec![Child::Broker];
        if cfg.daemon.database.is_some() {
            children.push(Child::Cluster);
        }
        children.push(Child::Dlq);
        children.extend(
            queues()
                .filter(|q| self.daemon.executors.has(q))
                .map(Child::Pool),
        );
        children.extend([
            Child::Pruner,
            Child::Periodic,
            Child::Gauges,
            Child::Api,
            Child::Admin,
        ]);
        if cfg.console.is_some() {
            children.push(Child::Console);
        }
        children
    }

    async fn spawn(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        child: Child,
    ) -> Result<(), ActorProcessingErr> {
        let d = &self.daemon;
        let config = d.config();
        let sup = myself.get_cell();
        let cell: ActorCell = match &child {
            Child::Broker => {
                let args = BrokerArgs {
                    store: d.store.clone(),
                    limits: d.limits.clone(),
                    limiters: d.limiters.clone(),
                    restarted: self.broker_started,
                };
                let broker = Actor::spawn_linked(Some(broker::NAME.into()), Broker, args, sup)
                    .await?
                    .0;
                // Before any pool or listener exists, so before any lease.
                let left: Vec<_> =
                    std::mem::take(&mut *d.left_behind.lock().unwrap_or_else(|e| e.into_inner()))
                        .into_iter()
                        .map(|l| (l.record.job, l.reason()))
                        .collect();
                if !left.is_empty() {
                    broker.cast(BrokerMsg::LeftBehind(left))?;
                }
                broker.get_cell()
            }
            Child::Cluster => {
                let database = config
                    .daemon
                    .database
                    .clone()
                    .ok_or("no database_url: not a cluster")?;
                let args = ClusterArgs {
                    daemon: d.clone(),
                    database,
                };
                Actor::spawn_linked(Some(cluster::NAME.into()), Cluster, args, sup)
                    .await?
                    .0
                    .get_cell()
            }
            Child::Dlq => Actor::spawn_linked(Some(dlq::NAME.into()), Dlq, d.store.clone(), sup)
                .await?
                .0
                .get_cell(),
            Child::Pool(q) => {
                let args = PoolArgs {
                    queue: q.clone(),
                    executors: d.executors.clone(),
                    limits: d.limits.clone(),
                    test_hooks: d.test_hooks,
                    restarts: d.restarts.clone(),
                    store: d.store.clone(),
                };
                Actor::spawn_linked(Some(worker_pool::name(q)), WorkerPool, args, sup)
                    .await?
                    .0
                    .get_cell()
            }
            Child::Pruner => {
                let args = PrunerArgs {
                    limits: d.limits.clone(),
                    store: d.store.clone(),
                    cluster: config.daemon.database.is_some().then(|| d.cluster.clone()),
                };
                Actor::spawn_linked(Some(pruner::NAME.into()), Pruner, args, sup)
                    .await?
                    .0
                    .get_cell()
            }
            Child::Periodic => {
                Actor::spawn_linked(Some(periodic::NAME.into()), Periodic, d.clone(), sup)
                    .await?
                    .0
                    .get_cell()
            }
            Child::Gauges => {
                let args = GaugesArgs {
                    limits: d.limits.clone(),
                };
                Actor::spawn_linked(Some(gauges::NAME.into()), Gauges, args, sup)
                    .await?
                    .0
                    .get_cell()
            }
            Child::Api => {
                let args = ApiArgs {
                    limits: d.limits.clone(),
                    tokens: d.tokens.clone(),
                    store: d.store.clone(),
                    control: d.control.clone(),
                };
                Actor::spawn_linked(Some("api".into()), Api, args, sup)
                    .await?
                    .0
                    .get_cell()
            }
            Child::Admin => {
                let args = AdminArgs::new(d.clone());
                admin::spawn(args, sup).await?
            }
            Child::Console => {
                let args = crate::console::ConsoleArgs { daemon: d.clone() };
                Actor::spawn_linked(
                    Some(crate::console::NAME.into()),
                    crate::console::Console,
                    args,
                    sup,
                )
                .await?
                .0
                .get_cell()
            }
        };
        self.broker_started |= child == Child::Broker;
        self.children.insert(cell.get_id(), child);
        Ok(())
    }

    /// A child failed: count it, give up past the restart intensity, else restart it.
    fn failed(&mut self, myself: &ActorRef<SupervisorMsg>, child: Child, why: &str) {
        let kind = child.kind();
        error!(actor = kind, error = why, "Actor failed; restarting it.");
        self.daemon.restarts.record(kind);
        let limit = self.daemon.config().daemon.restart;
        let now = Instant::now();
        self.recent.push_back(now);
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > limit.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() as u32 > limit.max_restarts {
            let reason = format!(
                "{} actor restarts within {}; giving up so systemd can restart qd",
                self.recent.len(),
                humantime::format_duration(limit.window)
            );
            error!(last = kind, "{reason}");
            self.give_up(myself, reason);
            return;
        }
        myself.send_after(RESTART_DELAY, move || SupervisorMsg::Restart(child));
    }

    /// Stops the tree at once (no drain) and makes the daemon exit non-zero with
    /// `reason` (the caller logs it).
    fn give_up(&mut self, myself: &ActorRef<SupervisorMsg>, reason: String) {
        *self
            .daemon
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
        self.shutting_down = true;
        myself.stop(Some(reason));
    }

    /// The ordered shutdown, bounded by `shutdown_grace`.
    async fn shutdown(&mut self, reason: &str) {
        let grace = self.daemon.config().daemon.shutdown_grace;
        info!(reason, grace = %humantime::format_duration(grace), "Shutting down: intake stopped.");
        let _ = crate::notify::stopping();
        let _ = crate::notify::status(&format!(
            "shutting down ({reason}): letting running jobs finish for up to {}",
            humantime::format_duration(grace)
        ));
        // Intake and leasing stop together: waiting lessees are answered empty.
        broker::cast(BrokerMsg::StopIntake);
        let queues: Vec<String> = self.daemon.config().queues.keys().cloned().collect();
        let pools: Vec<ActorRef<PoolMsg>> = queues
            .iter()
            .filter_map(|q| ActorRef::<PoolMsg>::where_is(worker_pool::name(q)))
            .collect();
        let drained = drain_pools(&pools, grace).await;
        if !drained {
            warn!(
                "Shutdown grace ran out; interrupting running jobs (their attempts are not charged)."
            );
            for p in &pools {
                let _ = p.cast(PoolMsg::Interrupt);
            }
            drain_pools(&pools, INTERRUPT_GRACE).await;
        }
        // Queued before the flush, so the flush waits for these ends too.
        broker::cast(BrokerMsg::ReleaseLeases);
        if let Err(err) = broker::request(BrokerMsg::Flush, Duration::from_secs(30)).await {
            warn!(error = %err, "Store flush not confirmed.");
        }
        info!("Shutdown complete.");
    }
}

mod reload;

/// How long interrupted jobs get to be killed and nacked.
const INTERRUPT_GRACE: Duration = Duration::from_secs(15);

/// Asks every pool to drain at once; true when all answered within `within`.
async fn drain_pools(pools: &[ActorRef<PoolMsg>], within: Duration) -> bool {
    let mut calls = tokio::task::JoinSet::new();
    for pool in pools {
        let pool = pool.clone();
        calls.spawn(async move { pool.call(PoolMsg::Drain, Some(within)).await });
    }
    let mut all = true;
    while let Some(result) = calls.join_next().await {
        all &= matches!(result, Ok(Ok(ractor::rpc::CallResult::Success(()))));
    }
    all
}
