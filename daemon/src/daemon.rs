//! What the actor tree shares, built by `main` before the Supervisor starts
//! ([`Daemon`]): the store, the limits and config in force, the rate limiters, the
//! executors, the API tokens, the cluster view and the supervisor's failure slot.
//! It takes no messages; every actor gets a clone of it.

use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use ractor::ActorRef;

use crate::api::auth::LiveTokens;
use crate::attempt_groups::LeftBehind;
use crate::cluster::ClusterView;
use crate::config::Config;
use crate::executor::Executors;
use crate::limits::Limits;
use crate::metrics;
use crate::rate_limit::Limiters;
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
