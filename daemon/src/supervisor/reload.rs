//! The Supervisor's half of a config reload: check, then apply a [`Plan`].
//!
//! Order: read and validate the file ([`Config::load_checked`], the checks of `qd
//! check-config`), plan the changes ([`reload::plan`]), refuse the removal of a queue
//! that still holds jobs, build the executors; only then swap the config in
//! [`crate::limits::Limits`], the executors, the rate limiters and the API tokens,
//! stop the pools of removed queues, start those of added ones and tell the Broker
//! (each queue's dispatch) and every WorkerPool to reread their limits. Runtime overrides (`qctl
//! limits`) live beside the config in `Limits` and keep their precedence.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tracing::{error, info, warn};

use super::{Child, SupervisorMsg, SupervisorState};
use crate::api::auth::Tokens;
use crate::broker::{self, BrokerMsg};
use crate::config::Config;
use crate::executor::Executors;
use crate::metrics;
use crate::reload::{self, Plan, ReloadError};
use crate::worker_pool::{self, PoolMsg};

/// The executors built for a reload, by queue, ready to swap in.
type ExecutorMap = std::collections::HashMap<String, Arc<crate::executor::Executor>>;

/// How long a stopping queue's actors get to finish.
const STOP_WAIT: Duration = Duration::from_secs(10);

impl SupervisorState {
    /// Reloads the config file in force; returns the changes made. Logs the outcome
    /// (every problem of a refused reload, file:line:col first) and counts it in
    /// `qd_config_reloads_total`. On error nothing was changed.
    pub(super) async fn reload(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
    ) -> Result<Vec<String>, ReloadError> {
        let old = self.daemon.config();
        let outcome = self.check(&old).await;
        let (new, plan, executors, tokens) = match outcome {
            Ok(checked) => checked,
            Err(err) => {
                metrics::config_reloaded(false);
                for line in err.to_string().lines() {
                    error!(file = %old.source.display(), "Config reload refused; the old config stays in force: {line}");
                }
                return Err(err);
            }
        };
        self.apply(myself, new, &plan, executors, Some(tokens))
            .await;
        metrics::config_reloaded(true);
        if plan.changes.is_empty() {
            info!(file = %old.source.display(), "Config reloaded; nothing changed.");
        }
        for change in &plan.changes {
            info!(change = %change, "Config reloaded.");
        }
        Ok(plan.changes)
    }

    /// Applies the store's SQS-created queues (`api/sqs/created.rs`) to the config in
    /// force, as a reload applies a file: added queues start, removed ones stop,
    /// changed ones reread their settings. The file is not reread. A removal is
    /// refused while the queue holds jobs only when `check_held` (this node's
    /// DeleteQueue, which cancels and tries again); a removal another node made is
    /// a fact of the store, applied as it is. On error nothing was changed.
    pub(super) async fn sync_sqs_queues(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        check_held: bool,
    ) -> Result<Vec<String>, ReloadError> {
        let old = self.daemon.config();
        let records = self
            .daemon
            .store
            .run(|b| b.sqs_queues())
            .await
            .map_err(|e| ReloadError::Unavailable(format!("cannot read the SQS queues: {e}")))?;
        // Nothing to tell the queues' actors when another node's announcement or a
        // request for an unknown queue finds the store as this node serves it.
        if crate::api::sqs::created::in_force(&old, &records) {
            return Ok(Vec::new());
        }
        let mut new = (*old).clone();
        crate::api::sqs::created::merge(&mut new, &records);
        let plan = reload::plan(&old, &new).map_err(ReloadError::Refused)?;
        if check_held {
            let held = self.still_holding(&plan.removed).await?;
            if !held.is_empty() {
                return Err(ReloadError::Refused(held));
            }
        }
        let executors = Executors::build(&new, Some((&old, &self.daemon.executors)))
            .map_err(ReloadError::Refused)?;
        self.apply(myself, Arc::new(new), &plan, executors, None)
            .await;
        for change in &plan.changes {
            info!(change = %change, "SQS queues applied.");
        }
        Ok(plan.changes)
    }

    /// Puts a checked config and its plan in force (with the reread API tokens,
    /// if the file was reread).
    async fn apply(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        new: Arc<Config>,
        plan: &Plan,
        executors: ExecutorMap,
        tokens: Option<Tokens>,
    ) {
        self.daemon.limits.replace_config(new);
        self.daemon.executors.replace(executors);
        self.daemon.limiters.sync(&self.daemon.limits);
        // At once, not only after the queues stopped below: the Broker may already
        // follow the new config, and a limiter it names exists only from here.
        broker::cast(BrokerMsg::LimitsChanged);
        if let Some(tokens) = tokens {
            self.daemon.tokens.replace(tokens);
        }
        for queue in &plan.removed {
            self.stop_queue(queue).await;
        }
        for queue in &plan.added {
            metrics::register_queue(queue);
            self.start_queue(myself, queue).await;
        }
        // A changed fairness mode or rate limiter reaches the dispatch here too.
        broker::cast(BrokerMsg::LimitsChanged);
        for queue in self.daemon.config().queues.keys() {
            if let Some(p) = ActorRef::<PoolMsg>::where_is(worker_pool::name(queue)) {
                let _ = p.cast(PoolMsg::LimitsChanged);
            }
        }
        for name in self.daemon.config().schedules.keys() {
            metrics::register_schedule(name);
        }
        crate::periodic::reread();
    }

    /// Everything that can fail, before anything changes.
    async fn check(
        &self,
        old: &Config,
    ) -> Result<(Arc<Config>, Plan, ExecutorMap, Tokens), ReloadError> {
        let path = old.source.clone();
        let new = tokio::task::spawn_blocking(move || {
            Config::load_checked(&path, &crate::machine::Machine)
        })
        .await
        .map_err(|e| ReloadError::Unavailable(e.to_string()))?
        .map_err(|errors| ReloadError::Invalid(errors.to_string()))?;
        let mut new = new;
        if new.sqs.enabled {
            let records = self
                .daemon
                .store
                .run(|b| b.sqs_queues())
                .await
                .map_err(|e| {
                    ReloadError::Unavailable(format!("cannot read the SQS queues: {e}"))
                })?;
            crate::api::sqs::created::merge(&mut new, &records);
        }
        // Every reason to refuse is named at once, not only the first found.
        let removed: Vec<String> = old
            .queues
            .keys()
            .filter(|q| !new.queues.contains_key(*q))
            .cloned()
            .collect();
        let plan = reload::plan(old, &new);
        let mut refused = plan.as_ref().err().cloned().unwrap_or_default();
        refused.extend(self.still_holding(&removed).await?);
        let executors = Executors::build(&new, Some((old, &self.daemon.executors)));
        if let Err(errors) = &executors {
            refused.extend(errors.iter().cloned());
        }
        let (Ok(plan), Ok(executors)) = (plan, executors) else {
            return Err(ReloadError::Refused(refused));
        };
        if !refused.is_empty() {
            return Err(ReloadError::Refused(refused));
        }
        let tokens = Tokens::from_config(&new).map_err(|e| ReloadError::Invalid(e.to_string()))?;
        Ok((Arc::new(new), plan, executors, tokens))
    }

    /// Why each removed queue that still holds jobs (waiting, leased, dead) cannot
    /// be removed; empty when all can.
    async fn still_holding(&self, removed: &[String]) -> Result<Vec<String>, ReloadError> {
        if removed.is_empty() {
            return Ok(Vec::new());
        }
        let counts = broker::request(BrokerMsg::Counts, Duration::from_secs(10))
            .await
            .map_err(|e| ReloadError::Unavailable(e.to_string()))?;
        let held: Vec<String> = removed
            .iter()
            .filter_map(|q| {
                let c = counts.get(q.as_str())?;
                let jobs = c.depth() + c.dead;
                (jobs > 0).then(|| {
                    format!(
                        "queues.{q}: removed from the file but still holds {jobs} jobs; \
                         let them finish (or purge its DLQ) and reload again; its jobs are kept"
                    )
                })
            })
            .collect();
        Ok(held)
    }

    /// Stops a removed queue's pool (drained first).
    async fn stop_queue(&mut self, queue: &str) {
        if let Some(pool) = ActorRef::<PoolMsg>::where_is(worker_pool::name(queue)) {
            let _ = pool.call(PoolMsg::Drain, Some(STOP_WAIT)).await;
        }
        self.stop_child(worker_pool::name(queue)).await;
    }

    /// Stops the child registered as `name` without it counting as a failure.
    async fn stop_child(&mut self, name: String) {
        let Some(cell) = ractor::registry::where_is(name.clone()) else {
            return;
        };
        self.children.remove(&cell.get_id());
        if let Err(e) = cell
            .stop_and_wait(Some("config reloaded".into()), Some(STOP_WAIT))
            .await
        {
            warn!(actor = %name, error = %e, "Actor did not stop in time after a reload.");
        }
    }

    /// Starts an added queue's pool if it has an in-process executor. A failure is
    /// handled as a failed child: restarted.
    async fn start_queue(&mut self, myself: &ActorRef<SupervisorMsg>, queue: &str) {
        if !self.daemon.executors.has(queue) {
            return;
        }
        let child = Child::Pool(Arc::from(queue));
        metrics::register_actor(child.kind());
        if let Err(err) = self.spawn(myself, child.clone()).await {
            self.failed(myself, child, &err.to_string());
        }
    }

    /// Whether `child` still belongs to the config in force (a pending restart of a
    /// removed queue's actor is dropped).
    pub(super) fn still_configured(&self, child: &Child) -> bool {
        match child {
            Child::Pool(q) => self.daemon.config().queues.contains_key(&**q),
            _ => true,
        }
    }
}
