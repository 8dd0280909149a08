//! What the actor tree shares, built by `main` before the Supervisor starts
//! ([`Daemon`]): the store, the limits and config in force, the rate limiters, the
//! executors, the API tokens, the cluster view, the supervisor's failure slot and
//! [`Controls`], the one way an actor below the Supervisor asks it for something.
//! It takes no messages; every actor gets a clone of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use ractor::ActorRef;

use crate::api::auth::LiveTokens;
use crate::attempt_groups::LeftBehind;
use crate::config::Config;
use crate::executor::Executors;
use crate::limits::Limits;
use crate::metrics;
use crate::rate_limit::Limiters;
use crate::reload::ReloadError;
use crate::store::Store;
use crate::worker_pool::{self, PoolMsg};

/// Everything the tree needs, built by `main` before the supervisor starts.
#[derive(Clone)]
pub struct Daemon {
    /// The durable store.
    pub store: Store,
    /// Live limits, and the owner of the config in force ([`Daemon::config`]).
    pub limits: Arc<Limits>,
    /// Shared rate limiters by name.
    pub limiters: Arc<Limiters>,
    /// The executor of each queue that has an in-process pool.
    pub executors: Arc<Executors>,
    /// The API's bearer tokens in force.
    pub tokens: Arc<LiveTokens>,
    /// Enables test hooks (`QD_TEST_HOOKS=1`).
    pub test_hooks: bool,
    /// When the daemon started (for `qctl status`).
    pub started: Instant,
    /// Restart count per actor kind (`qctl status`, `qd_actor_restarts_total`).
    pub restarts: metrics::Restarts,
    /// Set when the supervisor gives up: why the daemon must exit non-zero.
    pub failure: Arc<Mutex<Option<String>>>,
    /// This node's standing in a cluster sharing one database (unused on SQLite).
    pub cluster: Arc<ClusterView>,
    /// Attempts an earlier run of qd left when it died (found at start-up, their
    /// processes already stopped); handed to the Broker once, at its first start.
    pub left_behind: Arc<Mutex<Vec<LeftBehind>>>,
    /// Requests to the Supervisor (reload, SQS queues changed, a fatal condition).
    pub control: Controls,
}

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

    /// Publishes the epoch of the leader lease this node now holds (`None`: it holds
    /// none) and returns the one it held before.
    pub(crate) fn set_epoch(&self, epoch: Option<u64>) -> Option<u64> {
        Some(self.epoch.swap(epoch.unwrap_or(0), Ordering::Relaxed)).filter(|e| *e > 0)
    }
}

/// The answer to a reload: the changes made, or why nothing was changed.
pub type Reloaded = Result<Vec<String>, ReloadError>;

/// What the actors below the Supervisor ask of it. They send it through
/// [`Controls`], a channel the Supervisor drains, so none of them depends on the
/// Supervisor's own message type (the tree's root depends on them, not the reverse).
#[derive(Debug)]
pub enum Control {
    /// Re-read the config file and apply it live (SIGHUP, or `qctl reload` with a
    /// port for the changes made or the reason nothing was).
    Reload(Option<oneshot::Sender<Reloaded>>),
    /// The SQS-created queues in the store changed: read them and apply them to
    /// the config in force as a reload would (the file is not reread), answering
    /// the changes made or why nothing was. `here`: this node's SQS API made the
    /// change, so a deleted queue that still holds jobs is refused (its DeleteQueue
    /// cancels them and tries again). Otherwise another node made it (the Cluster
    /// actor heard of it, or a request here named a queue not yet in force), and a
    /// queue it deleted stops here whatever jobs this node's memory still holds of
    /// it: the deleting node cancelled them.
    SqsQueuesChanged {
        /// Whether this node's SQS API made the change.
        here: bool,
        /// Where to answer, if anyone waits.
        reply: Option<oneshot::Sender<Reloaded>>,
    },
    /// A condition no restart cures (another node took this node's name): stop at
    /// once, without draining, and exit non-zero naming it.
    Fatal(String),
}

/// The sending side of the Supervisor's control channel.
#[derive(Clone, Debug)]
pub struct Controls(mpsc::UnboundedSender<Control>);

impl Controls {
    /// A control channel: the handle for the tree and the receiver for the Supervisor.
    pub fn channel() -> (Controls, mpsc::UnboundedReceiver<Control>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Controls(tx), rx)
    }

    /// Asks for a reload of the config file and waits up to `wait` for its outcome.
    pub async fn reload(&self, wait: Duration) -> Reloaded {
        self.ask(|tx| Control::Reload(Some(tx)), wait).await
    }

    /// Asks the Supervisor to put the store's SQS queues in force, waiting up to
    /// `wait`; `here`: this node's SQS API changed them.
    pub async fn sqs_queues_changed(&self, here: bool, wait: Duration) -> Reloaded {
        let request = |tx| Control::SqsQueuesChanged {
            here,
            reply: Some(tx),
        };
        self.ask(request, wait).await
    }

    /// Tells the Supervisor that another node changed the stored SQS queues (it
    /// applies them; nobody waits for the outcome).
    pub fn sqs_queues_changed_elsewhere(&self) {
        let _ = self.0.send(Control::SqsQueuesChanged {
            here: false,
            reply: None,
        });
    }

    /// Tells the Supervisor to stop at once and exit non-zero with `reason`.
    pub fn fatal(&self, reason: String) {
        let _ = self.0.send(Control::Fatal(reason));
    }

    async fn ask(
        &self,
        request: impl FnOnce(oneshot::Sender<Reloaded>) -> Control,
        wait: Duration,
    ) -> Reloaded {
        let (tx, rx) = oneshot::channel();
        self.0
            .send(request(tx))
            .map_err(|_| ReloadError::Unavailable("the supervisor is not running".into()))?;
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(answer)) => answer,
            _ => Err(ReloadError::Unavailable(
                "no answer from the supervisor".into(),
            )),
        }
    }
}

impl Daemon {
    /// The config in force (it changes on reload; read it where it is used).
    pub fn config(&self) -> Arc<Config> {
        self.limits.config()
    }

    /// Puts the limits in force (config plus overrides) into effect after they
    /// changed: rate limiters take their settings, the Broker's queue dispatches
    /// reread caps, weights and pauses, and every WorkerPool its worker bounds.
    pub fn limits_changed(&self) {
        for limiter in self.limiters.all() {
            if let Some(settings) = self.limits.limiter(limiter.name()) {
                limiter.reconfigure(&settings);
            }
        }
        crate::broker::cast(crate::broker::BrokerMsg::LimitsChanged);
        for queue in self.config().queues.keys() {
            if let Some(p) = ActorRef::<PoolMsg>::where_is(worker_pool::name(queue)) {
                let _ = p.cast(PoolMsg::LimitsChanged);
            }
        }
    }
}
