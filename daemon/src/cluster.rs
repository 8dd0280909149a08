//! The Cluster actor: this node's membership of a cluster sharing one PostgreSQL
//! database (only spawned when `[daemon] database_url` is set).
//!
//! It owns the node's heartbeat and its claim to the leader lease, and wakes the
//! Broker when other nodes may have made work:
//! - every fifth of `node_timeout` it writes the node's heartbeat, which also renews
//!   the leases this node holds in the store and takes or keeps the leader lease
//!   ([`crate::store::SharedStore::beat`]). Then it asks its Broker to check the
//!   node's leases in the store against its memory and, while this node is the
//!   leader, to end the leases of dead or silent nodes ([`BrokerMsg::Sweep`], fenced
//!   by the leader lease's epoch); only the leader prunes ([`ClusterView::prunes`]).
//!   A heartbeat refused because another node took this node's name
//!   ([`StoreError::Replaced`]: this one was silent longer than `node_timeout`) asks
//!   for no sweep (the leases under the name are the new node's) and stops the
//!   daemon ([`SupervisorMsg::Fatal`]), which exits non-zero;
//! - while this node is the leader it publishes the cluster's depths from the
//!   database (`qd_cluster_queue_depth`, 0 once it stops being the leader);
//! - at each heartbeat it reads the runtime overrides (`qctl limits`, pause and
//!   resume, set on any node) and puts them in force here when they changed;
//! - it listens on the store's notification channel (`LISTEN qd_jobs`, on a
//!   connection of its own, reconnected after a loss) and sends the Broker
//!   [`BrokerMsg::Refresh`] for each notification, and once per `poll_interval`
//!   whatever arrives (polling is the fallback when notifications are lost);
//! - on the same connection it hears of rate limiters paused on other nodes
//!   (`LISTEN qd_limiters`) and pauses them here for what is left of the pause;
//!   each heartbeat also reads the pauses in force, for announcements it missed;
//! - at each poll and heartbeat it tells the Broker to try again the tenants its
//!   queues' dispatches hold at their `max_concurrency` across the cluster
//!   ([`BrokerMsg::Reopen`]): a lease of theirs may have ended on another node,
//!   which sends no notification for it.
//!
//! - it keeps this node's fence (`fence.rs`): each successful heartbeat moves it,
//!   and a task of its own looks every [`fence::CHECK_EVERY`] whether the last one
//!   is `node_timeout` old, without waiting for a hung store call. Then the node
//!   is fenced (its workers stop their attempts); it stops being the leader
//!   (`qd_cluster_leader` 0, no sweep, no pruning) one heartbeat period earlier,
//!   before its leader lease in the database can end, whatever the hung heartbeat
//!   answers later.
//! - after each heartbeat it tells the Periodic actor, which fires schedules only
//!   on the leader ([`crate::periodic`]).
//!
//! Messages: its own timers ([`ClusterMsg::Beat`], [`ClusterMsg::Poll`]).
//! Supervised by the Supervisor; the listener and fencing tasks are aborted when it
//! stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};
use tracing::{debug, error, info, warn};

use crate::broker::{self, BrokerMsg};
use crate::config::DatabaseConfig;
use crate::daemon::Daemon;
use crate::fence;
use crate::metrics::DepthState;
use crate::rate_limit::Limiters;
use crate::store::StoreError;
use crate::store::postgres::NOTIFY_CHANNEL;
use crate::store::postgres::limiter_pause::{self, LIMITER_CHANNEL};
use crate::supervisor::{self, SupervisorMsg};

/// The registered name of the Cluster actor.
pub const NAME: &str = "cluster";

/// This node's standing in the cluster, shared with the Pruner and `qctl status`.
/// Its one writer is the Cluster actor.
#[derive(Debug, Default)]
pub struct ClusterView {
    /// The leader lease's epoch while this node holds it, else 0 (epochs start at 1).
    epoch: AtomicU64,
}

impl ClusterView {
    /// The epoch of the leader lease this node holds, if it holds it (as of its last
    /// heartbeat).
    pub fn leader_epoch(&self) -> Option<u64> {
        Some(self.epoch.load(Ordering::Relaxed)).filter(|e| *e > 0)
    }

    /// Whether this node does the cluster's pruning: true on a store only this
    /// node writes (`None`), else only while it is the leader.
    pub fn prunes(view: Option<&ClusterView>) -> bool {
        view.is_none_or(|v| v.leader_epoch().is_some())
    }
}

/// What the Cluster actor is started with.
pub struct ClusterArgs {
    /// The daemon: its shared store, its limits (overrides set on other nodes are
    /// taken at each heartbeat) and where this node's standing is published.
    pub daemon: Daemon,
    /// Where the database is, `node_timeout` and `poll_interval`.
    pub database: DatabaseConfig,
}

/// Messages the Cluster actor takes (its own timers).
pub enum ClusterMsg {
    /// Write this node's heartbeat; sweep if it is the leader.
    Beat,
    /// Ask the Broker to look for other nodes' jobs (the polling fallback).
    Poll,
}

/// The Cluster actor (its state is [`ClusterState`]).
pub struct Cluster;

/// The Cluster actor's state.
pub struct ClusterState {
    daemon: Daemon,
    /// Whether the last heartbeat failed (logged once per outage).
    failing: bool,
    listener: JoinHandle<()>,
    fencing: JoinHandle<()>,
    node_timeout: Duration,
}

impl Actor for Cluster {
    type Msg = ClusterMsg;
    type State = ClusterState;
    type Arguments = ClusterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ClusterMsg>,
        args: ClusterArgs,
    ) -> Result<ClusterState, ActorProcessingErr> {
        let beat_every = args.database.node_timeout / 5;
        myself.send_interval(beat_every, || ClusterMsg::Beat);
        myself.send_interval(args.database.poll_interval, || ClusterMsg::Poll);
        let _ = myself.cast(ClusterMsg::Beat);
        let node_timeout = args.database.node_timeout;
        fence::arm(node_timeout);
        let fencing = tokio::spawn(watch_fence(args.daemon.cluster.clone(), node_timeout));
        let listener = tokio::spawn(listen(args.database, args.daemon.limiters.clone()));
        Ok(ClusterState {
            daemon: args.daemon,
            failing: false,
            listener,
            fencing,
            node_timeout,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ClusterMsg>,
        state: &mut ClusterState,
    ) -> Result<(), ActorProcessingErr> {
        state.listener.abort();
        state.fencing.abort();
        state.daemon.cluster.epoch.store(0, Ordering::Relaxed);
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<ClusterMsg>,
        msg: ClusterMsg,
        state: &mut ClusterState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ClusterMsg::Beat => {
                state.beat().await;
                state.reopen();
                crate::periodic::beat();
            }
            ClusterMsg::Poll => {
                broker::cast(BrokerMsg::Refresh);
                state.reopen();
            }
        }
        Ok(())
    }
}

impl ClusterState {
    /// Tells the Broker to try again the tenants its queues' dispatches hold at
    /// their cap across the cluster.
    fn reopen(&self) {
        broker::cast(BrokerMsg::Reopen);
    }

    async fn beat(&mut self) {
        let started = tokio::time::Instant::now();
        let result = self
            .daemon
            .store
            .run(|b| {
                let (epoch, pauses) = match b.shared() {
                    Some(shared) => (shared.beat()?, shared.limiter_pauses()?),
                    None => (None, Vec::new()),
                };
                Ok((epoch, b.overrides()?, pauses))
            })
            .await;
        let epoch = match result {
            Ok((epoch, overrides, pauses)) => {
                for (name, left) in pauses {
                    self.daemon.limiters.hold_paused(&name, left);
                }
                if std::mem::take(&mut self.failing) {
                    info!("Node heartbeat written again.");
                }
                if fence::beat_ok(started) {
                    info!("Node heartbeat written again; this node takes and runs jobs again.");
                }
                if self.daemon.limits.replace_overrides(overrides) {
                    info!("Limits changed on another node; now in force here.");
                    self.daemon.limits_changed();
                }
                epoch
            }
            Err(StoreError::Replaced(why)) => {
                // The leases stored under this name are the new node's: no sweep
                // (it would end them as orphans), and this process stops.
                let reason = format!("this node must stop: {why}");
                error!("{reason}");
                if let Some(root) = ActorRef::<SupervisorMsg>::where_is(supervisor::NAME) {
                    let _ = root.cast(SupervisorMsg::Fatal(reason));
                }
                return;
            }
            Err(err) => {
                if !std::mem::replace(&mut self.failing, true) {
                    warn!(error = %err, "Node heartbeat failed; this node does no cluster duty until one succeeds.");
                }
                None
            }
        };
        // A heartbeat that took longer than node_timeout (a store call hung, then
        // answered) must not make this node the leader again: others may already
        // have taken it for dead.
        let epoch = epoch.filter(|_| started.elapsed() < self.node_timeout);
        let before = self
            .daemon
            .cluster
            .epoch
            .swap(epoch.unwrap_or(0), Ordering::Relaxed);
        broker::cast(BrokerMsg::Sweep(epoch));
        if let Some(epoch) = epoch {
            if before != epoch {
                info!(epoch, "This node is the cluster's leader.");
            }
        } else if before != 0 {
            info!(
                epoch = before,
                "This node is no longer the cluster's leader."
            );
        }
        crate::metrics::cluster_leader(epoch.is_some());
        if epoch.is_some() || before != 0 {
            self.cluster_gauges(epoch.is_some()).await;
        }
    }

    /// Publishes the cluster's depths from the database while this node is the
    /// leader, and zeros once it stopped being it (so a sum across nodes counts the
    /// leader's figures once).
    async fn cluster_gauges(&self, leader: bool) {
        let depths = if leader {
            let now = crate::clock::wall_ms();
            let read = self
                .daemon
                .store
                .run(move |b| match b.shared() {
                    Some(shared) => shared.depths(now),
                    None => Ok(Vec::new()),
                })
                .await;
            match read {
                Ok(depths) => depths,
                Err(err) => {
                    debug!(error = %err, "Reading the cluster's depths failed.");
                    return;
                }
            }
        } else {
            Vec::new()
        };
        for queue in self.daemon.config().queues.keys() {
            for state in DepthState::ALL {
                let jobs = depths
                    .iter()
                    .filter(|(q, s, _)| q == queue && s.as_str() == state.as_str())
                    .map(|(_, _, n)| *n)
                    .sum();
                crate::metrics::set_cluster_depth(queue, state, jobs);
            }
        }
    }
}

/// Every [`fence::CHECK_EVERY`]: raises this node's fence once its last
/// successful heartbeat is `node_timeout` old, and stops it acting as the leader
/// (epoch 0, `qd_cluster_leader` 0) one heartbeat period before that, however
/// long the heartbeat in flight hangs.
async fn watch_fence(view: std::sync::Arc<ClusterView>, node_timeout: Duration) {
    let mut tick = tokio::time::interval(fence::CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if fence::check() {
            error!(
                node_timeout = ?node_timeout,
                "No node heartbeat written for node_timeout: this node is fenced. It stops \
                 its running attempts (SIGTERM, then SIGKILL after kill_grace) before the \
                 leader may hand their jobs to another node, and takes no job until a \
                 heartbeat is written again."
            );
        }
        // One heartbeat period early: the leader lease this node wrote lasts
        // node_timeout from its last heartbeat, and another node may take it
        // the moment it ends.
        if fence::heartbeat_age().is_some_and(|age| age >= node_timeout - node_timeout / 5) {
            let epoch = view.epoch.swap(0, Ordering::Relaxed);
            if epoch != 0 {
                warn!(
                    epoch,
                    "This node is no longer the cluster's leader: its heartbeat is older than node_timeout."
                );
                crate::metrics::cluster_leader(false);
            }
        }
    }
}

/// Listens on [`NOTIFY_CHANNEL`] and sends the Broker a [`BrokerMsg::Refresh`] per
/// notification, and on [`LIMITER_CHANNEL`] and pauses the limiter it names;
/// reconnects after a lost connection (polling and heartbeats cover the gap).
async fn listen(database: DatabaseConfig, limiters: Arc<Limiters>) {
    let retry = database.poll_interval.max(Duration::from_secs(1));
    loop {
        match listen_once(&database, &limiters).await {
            Ok(()) => debug!("Notification connection closed; reconnecting."),
            Err(err) => debug!(error = %err, "Notification connection failed; polling meanwhile."),
        }
        tokio::time::sleep(retry).await;
    }
}

/// One notification connection, until it ends.
async fn listen_once(database: &DatabaseConfig, limiters: &Limiters) -> Result<(), String> {
    let config = database.client_config()?;
    let (client, mut connection) = config.connect(NoTls).await.map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let pause = (n.channel() == LIMITER_CHANNEL).then(|| n.payload().to_owned());
                    if tx.send(pause).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(err) => {
                    debug!(error = %err, "Notification connection failed.");
                    return;
                }
            }
        }
    });
    client
        .batch_execute(&format!(
            "LISTEN {NOTIFY_CHANNEL}; LISTEN {LIMITER_CHANNEL}"
        ))
        .await
        .map_err(|e| e.to_string())?;
    // Jobs may have arrived before the LISTEN: look once.
    broker::cast(BrokerMsg::Refresh);
    while let Some(pause) = rx.recv().await {
        match pause {
            None => broker::cast(BrokerMsg::Refresh),
            Some(payload) => match limiter_pause::parse_announcement(&payload) {
                Some((name, left)) => limiters.hold_paused(name, left),
                None => debug!(
                    payload,
                    "A limiter announcement of an unknown shape; ignored."
                ),
            },
        }
    }
    driver.abort();
    Ok(())
}
