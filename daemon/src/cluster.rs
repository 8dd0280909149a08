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
//!   by the leader lease's epoch); only the leader prunes ([`ClusterView::prunes`](crate::daemon::ClusterView::prunes)).
//!   A heartbeat refused because another node took this node's name
//!   ([`StoreError::Replaced`]: this one was silent longer than `node_timeout`) asks
//!   for no sweep (the leases under the name are the new node's) and stops the
//!   daemon ([`Control::Fatal`](crate::daemon::Control::Fatal)), which exits non-zero;
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
//! - on it too it hears of SQS queues created, changed or deleted on other nodes
//!   (`LISTEN qd_sqs_queues`, `store/postgres/sqs_queues.rs`) and has the
//!   Supervisor apply them ([`Control::SqsQueuesChanged`](crate::daemon::Control::SqsQueuesChanged)); each heartbeat
//!   also compares the stored SQS queues with those in force, for announcements
//!   it missed;
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
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};
use tracing::{debug, error, info, warn};

use crate::broker::{self, BrokerMsg};
use crate::config::DatabaseConfig;
use crate::daemon::{ClusterView, Controls, Daemon};
use crate::fence;
use crate::metrics::DepthState;
use crate::rate_limit::Limiters;
use crate::store::StoreError;
use crate::store::postgres::NOTIFY_CHANNEL;
use crate::store::postgres::limiter_pause::{self, LIMITER_CHANNEL};
use crate::store::postgres::sqs_queues::SQS_QUEUES_CHANNEL;

/// The registered name of the Cluster actor.
pub const NAME: &str = "cluster";

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
        let listener = tokio::spawn(listen(
            args.database,
            args.daemon.limiters.clone(),
            args.daemon
                .config()
                .sqs
                .enabled
                .then(|| args.daemon.control.clone()),
        ));
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
        state.daemon.cluster.set_epoch(None);
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
        let sqs = self.daemon.config().sqs.enabled;
        let result = self
            .daemon
            .store
            .run(move |b| {
                let (epoch, pauses) = match b.shared() {
                    Some(shared) => (shared.beat()?, shared.limiter_pauses()?),
                    None => (None, Vec::new()),
                };
                let sqs_queues = if sqs { Some(b.sqs_queues()?) } else { None };
                Ok((epoch, b.overrides()?, pauses, sqs_queues))
            })
            .await;
        let epoch = match result {
            Ok((epoch, overrides, pauses, sqs_queues)) => {
                for (name, left) in pauses {
                    self.daemon.limiters.hold_paused(&name, left);
                }
                if let Some(records) = sqs_queues
                    && !crate::api::sqs::created::in_force(&self.daemon.config(), &records)
                {
                    debug!("The stored SQS queues differ from those in force; applying them.");
                    self.daemon.control.sqs_queues_changed_elsewhere();
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
                self.daemon.control.fatal(reason);
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
        let before = self.daemon.cluster.set_epoch(epoch);
        broker::cast(BrokerMsg::Sweep(epoch));
        match (epoch, before) {
            (Some(epoch), _) if before != Some(epoch) => {
                info!(epoch, "This node is the cluster's leader.");
            }
            (None, Some(before)) => {
                info!(
                    epoch = before,
                    "This node is no longer the cluster's leader."
                );
            }
            _ => {}
        }
        crate::metrics::cluster_leader(epoch.is_some());
        if epoch.is_some() || before.is_some() {
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
        if fence::heartbeat_age().is_some_and(|age| age >= node_timeout - node_timeout / 5)
            && let Some(epoch) = view.set_epoch(None)
        {
            warn!(
                epoch,
                "This node is no longer the cluster's leader: its heartbeat is older than node_timeout."
            );
            crate::metrics::cluster_leader(false);
        }
    }
}

/// What the notification connection heard.
enum Heard {
    /// New jobs may be claimable ([`NOTIFY_CHANNEL`]).
    Jobs,
    /// A limiter's pause ([`LIMITER_CHANNEL`]), its payload.
    Pause(String),
    /// The SQS queues changed ([`SQS_QUEUES_CHANNEL`]); the payload names the
    /// node that changed them.
    SqsQueues(String),
}

/// Listens on [`NOTIFY_CHANNEL`] and sends the Broker a [`BrokerMsg::Refresh`] per
/// notification, on [`LIMITER_CHANNEL`] and pauses the limiter it names, and (with
/// `sqs`) on [`SQS_QUEUES_CHANNEL`] and has other nodes' changes applied;
/// reconnects after a lost connection (polling and heartbeats cover the gap).
/// `sqs`: where to say that another node changed the SQS queues, with the SQS API on.
async fn listen(database: DatabaseConfig, limiters: Arc<Limiters>, sqs: Option<Controls>) {
    let retry = database.poll_interval.max(Duration::from_secs(1));
    loop {
        match listen_once(&database, &limiters, sqs.as_ref()).await {
            Ok(()) => debug!("Notification connection closed; reconnecting."),
            Err(err) => debug!(error = %err, "Notification connection failed; polling meanwhile."),
        }
        tokio::time::sleep(retry).await;
    }
}

/// One notification connection, until it ends.
async fn listen_once(
    database: &DatabaseConfig,
    limiters: &Limiters,
    sqs: Option<&Controls>,
) -> Result<(), String> {
    let config = database.client_config()?;
    let (client, mut connection) = config.connect(NoTls).await.map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let heard = match n.channel() {
                        LIMITER_CHANNEL => Heard::Pause(n.payload().to_owned()),
                        SQS_QUEUES_CHANNEL => Heard::SqsQueues(n.payload().to_owned()),
                        _ => Heard::Jobs,
                    };
                    if tx.send(heard).is_err() {
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
    let mut channels = format!("LISTEN {NOTIFY_CHANNEL}; LISTEN {LIMITER_CHANNEL}");
    if sqs.is_some() {
        channels.push_str(&format!("; LISTEN {SQS_QUEUES_CHANNEL}"));
    }
    client
        .batch_execute(&channels)
        .await
        .map_err(|e| e.to_string())?;
    // Jobs and queues may have arrived before the LISTEN: look once.
    broker::cast(BrokerMsg::Refresh);
    if let Some(control) = sqs {
        control.sqs_queues_changed_elsewhere();
    }
    while let Some(heard) = rx.recv().await {
        match heard {
            Heard::Jobs => broker::cast(BrokerMsg::Refresh),
            Heard::Pause(payload) => match limiter_pause::parse_announcement(&payload) {
                Some((name, left)) => limiters.hold_paused(name, left),
                None => debug!(
                    payload,
                    "A limiter announcement of an unknown shape; ignored."
                ),
            },
            // This node applied its own change before answering it.
            Heard::SqsQueues(node) if node == database.node_name => {}
            Heard::SqsQueues(_) => {
                if let Some(control) = sqs {
                    control.sqs_queues_changed_elsewhere();
                }
            }
        }
    }
    driver.abort();
    Ok(())
}
