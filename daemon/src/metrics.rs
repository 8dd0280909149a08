//! The closed vocabulary of qd's Prometheus metrics, defined in one place.
//!
//! This module owns every exported series name ([`METRIC_NAMES`]), its label set,
//! its help text ([`describe`]) and the exporter ([`install`]). The rest of the
//! daemon never calls the `metrics` macros itself: it calls one small typed event
//! function per thing that happened ([`job_enqueued`], [`attempt_finished`], ...),
//! and each call is exactly one metric update.
//!
//! Labels are bounded (an idea taken from vector's `internal_events`): `queue` is a
//! configured queue name, `tenant` is a configured tenant or `"other"`
//! ([`TenantLabels`]), `actor` is a `&'static str`, and every other label value
//! comes from a closed enum. Job ids, payloads and error texts never become labels.
//!
//! Names follow the Prometheus conventions: base units (seconds), counters end in
//! `_total`. The exporter is `metrics-exporter-prometheus` with an HTTP listener
//! that runs as a task on the daemon's tokio runtime.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

use crate::job::Outcome;

/// Counter `{queue,tenant}`: jobs durably accepted by enqueue.
pub const JOBS_ENQUEUED: &str = "qd_jobs_enqueued_total";
/// Counter `{queue,tenant,outcome}`: jobs that reached a final state ([`Completion`]).
pub const JOBS_COMPLETED: &str = "qd_jobs_completed_total";
/// Counter `{queue,outcome}`: finished attempts, by [`Outcome`] name.
pub const JOB_ATTEMPTS: &str = "qd_job_attempts_total";
/// Gauge `{queue,state}`: jobs per [`DepthState`].
pub const QUEUE_DEPTH: &str = "qd_queue_depth";
/// Gauge `{queue}`, seconds: age of the oldest ready job (0 when none is ready).
pub const QUEUE_OLDEST_READY_AGE: &str = "qd_queue_oldest_ready_age_seconds";
/// Gauge `{queue}`: jobs in the dead-letter queue.
pub const DLQ_DEPTH: &str = "qd_dlq_depth";
/// Gauge `{queue}`, seconds: age of the oldest dead-lettered job (0 when empty).
pub const DLQ_OLDEST_AGE: &str = "qd_dlq_oldest_age_seconds";
/// Histogram `{queue}`, seconds: time from ready to leased.
pub const JOB_WAIT: &str = "qd_job_wait_seconds";
/// Histogram `{queue,outcome}`, seconds: run time of one attempt.
pub const JOB_RUN: &str = "qd_job_run_seconds";
/// Histogram, seconds: time the store's writer spent on one batch (group commit),
/// its operations and the commit itself (the fsync on SQLite, the round trip on
/// PostgreSQL), whether it committed or not.
pub const STORE_BATCH: &str = "qd_store_batch_seconds";
/// Counter `{queue}`: leases that expired without an ack.
pub const LEASES_EXPIRED: &str = "qd_leases_expired_total";
/// Counter `{queue,reason}`: enqueue requests refused, by [`RejectReason`].
pub const ENQUEUE_REJECTED: &str = "qd_enqueue_rejected_total";
/// Gauge `{queue,state}`: workers that are `busy` or `idle`.
pub const WORKERS: &str = "qd_workers";
/// Gauge `{queue}`: the pool size the autoscaler currently wants.
pub const WORKERS_DESIRED: &str = "qd_workers_desired";
/// Counter `{actor}`: restarts of a supervised actor.
pub const ACTOR_RESTARTS: &str = "qd_actor_restarts_total";
/// Counter `{limiter}`: times a throttled result (HTTP 429, 503 with
/// `Retry-After`, a throttled exit code or nack) paused the limiter; 0 from the
/// limiter's start. Jobs waiting for the limiter's next token are not counted.
pub const RATE_LIMITER_THROTTLED: &str = "qd_rate_limiter_throttled_total";
/// Gauge `{version}`, always 1: which build is running.
pub const BUILD_INFO: &str = "qd_build_info";
/// Gauge, 1 or 0: whether the store accepts writes (0 from a failed write until one
/// succeeds; leasing stops meanwhile).
pub const STORE_WRITABLE: &str = "qd_store_writable";
/// 1 while this node holds a shared store's leader lease (see `cluster.rs`).
pub const CLUSTER_LEADER: &str = "qd_cluster_leader";
/// Gauge `{queue,state}`: jobs per [`DepthState`] across a cluster, read from the
/// database by the leader (0 on the other nodes).
pub const CLUSTER_QUEUE_DEPTH: &str = "qd_cluster_queue_depth";
/// Counter `{result}`: config reloads (SIGHUP, `qctl reload`), `success` or `failure`.
pub const CONFIG_RELOADS: &str = "qd_config_reloads_total";
/// Gauge, Unix seconds: when the config in force was last loaded successfully
/// (start-up or reload), as Prometheus' own `..._last_reload_success_timestamp_seconds`.
pub const CONFIG_LAST_RELOAD_SUCCESS: &str = "qd_config_last_reload_success_timestamp_seconds";
/// Counter `{queue}`: finished jobs deleted after their queue's retention.
pub const JOBS_PRUNED: &str = "qd_jobs_pruned_total";
/// Gauge `{queue}`, seconds: how long the oldest finished job not yet pruned has been
/// past its queue's retention, at the start of a prune pass (0 when none is).
pub const PRUNE_BACKLOG_AGE: &str = "qd_prune_backlog_age_seconds";
/// Counter `{queue}`: jobs whose last dependency was met, moved from waiting or
/// blocked to ready or delayed (`deps.rs`).
pub const DEPENDENCIES_RELEASED: &str = "qd_dependencies_released_total";
/// Counter `{queue}`: jobs blocked by a dead or cancelled parent, at enqueue or
/// when the parent failed.
pub const DEPENDENCIES_BLOCKED: &str = "qd_dependencies_blocked_total";

/// Counter `{schedule,result}`: ticks of a configured schedule, by
/// [`ScheduleResult`]: run on time, run for missed ticks, missed, or skipped
/// because the previous run was unfinished.
pub const SCHEDULE_FIRES: &str = "qd_schedule_fires_total";
/// Gauge `{schedule}`, Unix seconds: when the schedule fires next on this node (0
/// when it does not fire here: paused, or another node of a cluster fires).
pub const SCHEDULE_NEXT_FIRE: &str = "qd_schedule_next_fire_timestamp_seconds";
/// Gauge `{schedule}`, Unix seconds: when this node last enqueued a run of the
/// schedule (absent until it does).
pub const SCHEDULE_LAST_FIRE: &str = "qd_schedule_last_fire_timestamp_seconds";

/// Every exported series name (for histograms the base name, without
/// `_bucket`/`_sum`/`_count`). Dashboards and alert rules may use only these;
/// `daemon/tests/deploy.rs` checks that they do.
pub const METRIC_NAMES: &[&str] = &[
    JOBS_ENQUEUED,
    JOBS_COMPLETED,
    JOB_ATTEMPTS,
    QUEUE_DEPTH,
    QUEUE_OLDEST_READY_AGE,
    DLQ_DEPTH,
    DLQ_OLDEST_AGE,
    JOB_WAIT,
    JOB_RUN,
    LEASES_EXPIRED,
    ENQUEUE_REJECTED,
    WORKERS,
    WORKERS_DESIRED,
    ACTOR_RESTARTS,
    RATE_LIMITER_THROTTLED,
    BUILD_INFO,
    STORE_WRITABLE,
    STORE_BATCH,
    CONFIG_RELOADS,
    CONFIG_LAST_RELOAD_SUCCESS,
    JOBS_PRUNED,
    PRUNE_BACKLOG_AGE,
    CLUSTER_LEADER,
    CLUSTER_QUEUE_DEPTH,
    SCHEDULE_FIRES,
    SCHEDULE_NEXT_FIRE,
    SCHEDULE_LAST_FIRE,
    DEPENDENCIES_RELEASED,
    DEPENDENCIES_BLOCKED,
];

/// Histogram bucket upper bounds in seconds, 1 ms to 1 h, roughly 1-2.5-5 steps:
/// wide enough for a 5 ms HTTP call and a 45 min batch job in the same family.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// The `tenant` label value for any tenant that is not configured.
pub const OTHER_TENANT: &str = "other";

/// The `queue` label value for a queue that is not configured: a rejected enqueue
/// whose request named no configured queue, or jobs pruned from a queue removed
/// from the config.
pub const UNKNOWN_QUEUE: &str = "unknown";

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// [`install`] was called outside a tokio runtime (the listener is a task on it).
    #[error("the metrics exporter must be installed from inside a tokio runtime")]
    NoRuntime,
    /// The scrape listener could not bind (address in use, permission, bad interface).
    #[error("cannot listen for Prometheus scrapes on {addr} (daemon.metrics_listen): {reason}")]
    Bind {
        /// The configured `daemon.metrics_listen` address.
        addr: SocketAddr,
        /// The operating system's reason.
        reason: String,
    },
    /// The recorder could not be built or installed (e.g. one is already installed).
    #[error("cannot install the Prometheus recorder: {0}")]
    Install(String),
}

/// Starts the Prometheus exporter: an HTTP listener on `listen` serving `/metrics`
/// (any path, in fact) as a task on the current tokio runtime, and installs the
/// process-wide recorder, then registers help texts ([`describe`]) and sets
/// `qd_build_info`.
///
/// Errors: [`MetricsError::NoRuntime`] outside a runtime, [`MetricsError::Bind`] naming
/// the address when the port cannot be bound, [`MetricsError::Install`] when a
/// recorder is already installed. Call it once, early in start-up.
pub fn install(listen: SocketAddr) -> Result<(), MetricsError> {
    tokio::runtime::Handle::try_current().map_err(|_| MetricsError::NoRuntime)?;
    // `build()` binds the socket synchronously, so a busy port fails here, before
    // the recorder is installed, rather than later inside a detached task. It also
    // spawns the exporter's upkeep task (`run_upkeep` every 5 s, checked in
    // metrics-exporter-prometheus 0.18.3 `PrometheusBuilder::build`), which drains
    // histogram samples into their buckets, so memory stays bounded when nobody scrapes.
    let (recorder, exporter) =
        builder()
            .with_http_listener(listen)
            .build()
            .map_err(|e| match e {
                BuildError::FailedToCreateHTTPListener(reason) => MetricsError::Bind {
                    addr: listen,
                    reason,
                },
                other => MetricsError::Install(other.to_string()),
            })?;
    metrics::set_global_recorder(recorder).map_err(|e| MetricsError::Install(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(error) = exporter.await {
            tracing::error!(?error, addr = %listen, "Metrics listener stopped; scrapes will fail.");
        }
    });
    describe();
    set_build_info();
    Ok(())
}

/// Bucket upper bounds in seconds for [`STORE_BATCH`], 100 µs to 10 s: a batch on
/// a healthy disk takes well under a millisecond, so the fsync's own latency needs
/// finer steps there than [`SECONDS_BUCKETS`] has.
pub const STORE_BATCH_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The exporter settings shared by [`install`] and the tests: seconds buckets for
/// every histogram ([`STORE_BATCH_BUCKETS`] for the store's batches), names
/// exported exactly as written here (no suffixes added).
fn builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets(SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(STORE_BATCH.into()), STORE_BATCH_BUCKETS)
        })
        .expect("invariant: the bucket lists are not empty")
}

/// Registers the help text and unit of every metric in [`METRIC_NAMES`] with the
/// installed recorder (shown as `# HELP` lines). Idempotent.
pub fn describe() {
    describe_counter!(
        SCHEDULE_FIRES,
        Unit::Count,
        "Ticks of each schedule by result (fired, caught_up, missed, skipped_overlap)."
    );
    describe_gauge!(
        SCHEDULE_NEXT_FIRE,
        Unit::Seconds,
        "When each schedule fires next on this node, Unix seconds (0: not here, or paused)."
    );
    describe_gauge!(
        SCHEDULE_LAST_FIRE,
        Unit::Seconds,
        "When this node last enqueued a run of each schedule, Unix seconds."
    );
    describe_counter!(
        JOBS_ENQUEUED,
        Unit::Count,
        "Jobs durably accepted by enqueue."
    );
    describe_counter!(
        JOBS_COMPLETED,
        Unit::Count,
        "Jobs that reached a final state (outcome: succeeded, dead, cancelled)."
    );
    describe_counter!(JOB_ATTEMPTS, Unit::Count, "Finished attempts by outcome.");
    describe_gauge!(
        QUEUE_DEPTH,
        Unit::Count,
        "Jobs per state (ready, delayed, leased, dead)."
    );
    describe_gauge!(
        QUEUE_OLDEST_READY_AGE,
        Unit::Seconds,
        "Age of the oldest ready job; 0 when none is ready."
    );
    describe_gauge!(DLQ_DEPTH, Unit::Count, "Jobs in the dead-letter queue.");
    describe_gauge!(
        CLUSTER_QUEUE_DEPTH,
        Unit::Count,
        "Jobs per state across a cluster sharing one PostgreSQL database; set by the leader, 0 on the other nodes."
    );
    describe_gauge!(
        CLUSTER_LEADER,
        Unit::Count,
        "1 while this node is the leader of a cluster sharing one PostgreSQL database, else 0."
    );
    describe_gauge!(
        STORE_WRITABLE,
        Unit::Count,
        "1 while the store accepts writes, 0 while it refuses them (leasing stops)."
    );
    describe_gauge!(
        DLQ_OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest dead-lettered job; 0 when the DLQ is empty."
    );
    describe_histogram!(
        JOB_WAIT,
        Unit::Seconds,
        "Time a job waited from ready to leased."
    );
    describe_histogram!(
        STORE_BATCH,
        Unit::Seconds,
        "Time the store's writer spent on one batch: its operations and the commit (fsync included)."
    );
    describe_histogram!(
        JOB_RUN,
        Unit::Seconds,
        "Run time of one attempt, by outcome."
    );
    describe_counter!(
        LEASES_EXPIRED,
        Unit::Count,
        "Leases that expired without an ack."
    );
    describe_counter!(
        ENQUEUE_REJECTED,
        Unit::Count,
        "Enqueue requests refused, by reason."
    );
    describe_gauge!(WORKERS, Unit::Count, "Workers by state (busy, idle).");
    describe_gauge!(
        WORKERS_DESIRED,
        Unit::Count,
        "Pool size the autoscaler wants."
    );
    describe_counter!(
        ACTOR_RESTARTS,
        Unit::Count,
        "Restarts of a supervised actor."
    );
    describe_counter!(
        RATE_LIMITER_THROTTLED,
        Unit::Count,
        "Times a throttled result paused the rate limiter."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label names the running build."
    );
    describe_counter!(
        DEPENDENCIES_RELEASED,
        Unit::Count,
        "Jobs moved from waiting or blocked to ready or delayed once their last dependency was met."
    );
    describe_counter!(
        DEPENDENCIES_BLOCKED,
        Unit::Count,
        "Jobs blocked by a dead or cancelled parent."
    );
    describe_counter!(
        JOBS_PRUNED,
        Unit::Count,
        "Finished jobs deleted after their queue's retention."
    );
    describe_gauge!(
        PRUNE_BACKLOG_AGE,
        Unit::Seconds,
        "How long the oldest finished job not yet pruned has been past retention; 0 when pruning keeps up."
    );
    describe_counter!(
        CONFIG_RELOADS,
        Unit::Count,
        "Config reloads (SIGHUP, qctl reload) by result (success, failure)."
    );
    describe_gauge!(
        CONFIG_LAST_RELOAD_SUCCESS,
        Unit::Seconds,
        "Unix time of the last successful config load (start-up or reload)."
    );
}

/// The config was loaded at start-up: both reload results exist at 0 (so the
/// failed-reload alert sees the first failure) and the success time is now.
pub fn config_loaded() {
    for result in ["success", "failure"] {
        counter!(CONFIG_RELOADS, "result" => result).increment(0);
    }
    gauge!(CONFIG_LAST_RELOAD_SUCCESS).set(unix_now());
}

/// A reload finished: `qd_config_reloads_total{result} += 1`, and on success the
/// last-success time is set to now.
pub fn config_reloaded(success: bool) {
    let result = if success { "success" } else { "failure" };
    counter!(CONFIG_RELOADS, "result" => result).increment(1);
    if success {
        gauge!(CONFIG_LAST_RELOAD_SUCCESS).set(unix_now());
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Sets `qd_build_info{version="<crate version>"} 1`.
fn set_build_info() {
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// Bounds the `tenant` label to the configured tenants, so a producer inventing
/// tenant names cannot create unbounded series. Build it from the config's
/// `[tenants.*]` names; rebuild it on reload.
#[derive(Clone, Debug, Default)]
pub struct TenantLabels {
    known: HashSet<String>,
}

impl TenantLabels {
    /// A label set allowing exactly `names` (the configured tenant names).
    pub fn new<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            known: names.into_iter().map(Into::into).collect(),
        }
    }

    /// The label value for `tenant`: the name itself when configured, else
    /// [`OTHER_TENANT`]. (A tenant configured as `other` shares that series.)
    pub fn label<'a>(&'a self, tenant: &'a str) -> &'a str {
        if self.known.contains(tenant) {
            tenant
        } else {
            OTHER_TENANT
        }
    }
}

mod labels;
mod totals;
pub use labels::{Completion, DepthState, RejectReason};
pub use totals::{AttemptTotals, attempt_totals};

/// A job was durably enqueued: `qd_jobs_enqueued_total{queue,tenant} += 1`.
/// `tenant` is bounded through `tenants`.
pub fn job_enqueued(tenants: &TenantLabels, queue: &str, tenant: &str) {
    counter!(JOBS_ENQUEUED, "queue" => queue.to_owned(), "tenant" => tenants.label(tenant).to_owned())
        .increment(1);
}

/// An enqueue was refused: `qd_enqueue_rejected_total{queue,reason} += 1`.
/// `queue` is `None` when the request named no configured queue (label [`UNKNOWN_QUEUE`]),
/// so a typo in a producer cannot create a series per typo.
pub fn enqueue_rejected(queue: Option<&str>, reason: RejectReason) {
    let queue = queue.unwrap_or(UNKNOWN_QUEUE).to_owned();
    counter!(ENQUEUE_REJECTED, "queue" => queue, "reason" => reason.as_str()).increment(1);
}

/// An attempt finished after running for `run`: `qd_job_attempts_total{queue,outcome} += 1`
/// and `run` (seconds) into `qd_job_run_seconds{queue,outcome}`.
///
/// This is the one event that updates two series, a count and a duration, because
/// they describe the same attempt and must never disagree; it also bumps the
/// readable [`attempt_totals`] that `qctl top` shows as rates.
pub fn attempt_finished(queue: &str, outcome: Outcome, run: Duration) {
    counter!(JOB_ATTEMPTS, "queue" => queue.to_owned(), "outcome" => outcome.as_str()).increment(1);
    histogram!(JOB_RUN, "queue" => queue.to_owned(), "outcome" => outcome.as_str()).record(run);
    totals::count(queue, outcome);
}

/// A job reached a final state: `qd_jobs_completed_total{queue,tenant,outcome} += 1`.
pub fn job_completed(tenants: &TenantLabels, queue: &str, tenant: &str, outcome: Completion) {
    counter!(
        JOBS_COMPLETED,
        "queue" => queue.to_owned(),
        "tenant" => tenants.label(tenant).to_owned(),
        "outcome" => outcome.as_str()
    )
    .increment(1);
}

/// A job was leased after waiting `wait` since it became ready:
/// observed (seconds) in `qd_job_wait_seconds{queue}`.
pub fn job_waited(queue: &str, wait: Duration) {
    histogram!(JOB_WAIT, "queue" => queue.to_owned()).record(wait);
}

/// The store's writer finished one batch after `took`: observed (seconds) in
/// `qd_store_batch_seconds`.
pub fn store_batch(took: Duration) {
    histogram!(STORE_BATCH).record(took);
}

/// A waiting or blocked job's last edge was met:
/// `qd_dependencies_released_total{queue} += 1`.
pub fn dependencies_released(queue: &str) {
    counter!(DEPENDENCIES_RELEASED, "queue" => queue.to_owned()).increment(1);
}

/// A job became blocked by a dead or cancelled parent:
/// `qd_dependencies_blocked_total{queue} += 1`.
pub fn dependencies_blocked(queue: &str) {
    counter!(DEPENDENCIES_BLOCKED, "queue" => queue.to_owned()).increment(1);
}

/// A lease expired without an ack: `qd_leases_expired_total{queue} += 1`.
pub fn lease_expired(queue: &str) {
    counter!(LEASES_EXPIRED, "queue" => queue.to_owned()).increment(1);
}

/// The store accepts writes again (`true`) or refused one (`false`):
/// `qd_store_writable` = 1 or 0.
pub fn store_writable(writable: bool) {
    gauge!(STORE_WRITABLE).set(if writable { 1.0 } else { 0.0 });
}

/// This node holds (`true`) or does not hold the leader lease of a shared store:
/// `qd_cluster_leader` = 1 or 0.
pub fn cluster_leader(leader: bool) {
    gauge!(CLUSTER_LEADER).set(if leader { 1.0 } else { 0.0 });
}

/// Restarts per actor kind since the daemon started: the one record behind both
/// `qd_actor_restarts_total{actor}` and `qctl status`, so the two always agree.
/// Cloned into every supervisor (the Supervisor, each WorkerPool).
#[derive(Clone, Debug, Default)]
pub struct Restarts(Arc<Mutex<HashMap<&'static str, u64>>>);

impl Restarts {
    /// A supervisor restarts `actor`: counts it and `qd_actor_restarts_total{actor} += 1`.
    /// `actor` is `'static` so it is always a name written in the code, never input.
    pub fn record(&self, actor: &'static str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(actor)
            .or_default() += 1;
        counter!(ACTOR_RESTARTS, "actor" => actor).increment(1);
    }

    /// Restarts of `actor` so far (0 for a kind never restarted).
    pub fn count(&self, actor: &str) -> u64 {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(actor).copied().unwrap_or(0)
    }
}

/// A throttled result paused rate limiter `limiter` (a configured
/// `[rate_limiters.*]` name): `qd_rate_limiter_throttled_total{limiter} += 1`.
pub fn limiter_throttled(limiter: &str) {
    counter!(RATE_LIMITER_THROTTLED, "limiter" => limiter.to_owned()).increment(1);
}

/// Creates `qd_rate_limiter_throttled_total{limiter}` at 0 when the limiter is
/// built, so the first pause is an increase `rate()` sees, not a new series.
pub fn register_limiter(limiter: &str) {
    counter!(RATE_LIMITER_THROTTLED, "limiter" => limiter.to_owned()).increment(0);
}

/// Sets `qd_queue_depth{queue,state}` to `jobs`.
pub fn set_queue_depth(queue: &str, state: DepthState, jobs: u64) {
    gauge!(QUEUE_DEPTH, "queue" => queue.to_owned(), "state" => state.as_str()).set(jobs as f64);
}

/// Sets `qd_cluster_queue_depth{queue,state}` to `jobs`.
pub fn set_cluster_depth(queue: &str, state: DepthState, jobs: u64) {
    gauge!(CLUSTER_QUEUE_DEPTH, "queue" => queue.to_owned(), "state" => state.as_str())
        .set(jobs as f64);
}

/// Sets `qd_queue_oldest_ready_age_seconds{queue}`; pass `Duration::ZERO` when no job is ready.
pub fn set_oldest_ready_age(queue: &str, age: Duration) {
    gauge!(QUEUE_OLDEST_READY_AGE, "queue" => queue.to_owned()).set(age);
}

/// Sets `qd_dlq_depth{queue}` to `depth` and `qd_dlq_oldest_age_seconds{queue}` to
/// `oldest_age` (`Duration::ZERO` when the DLQ is empty). One snapshot, two gauges.
pub fn set_dlq(queue: &str, depth: u64, oldest_age: Duration) {
    gauge!(DLQ_DEPTH, "queue" => queue.to_owned()).set(depth as f64);
    gauge!(DLQ_OLDEST_AGE, "queue" => queue.to_owned()).set(oldest_age);
}

/// Sets `qd_workers{queue,state="busy"|"idle"}` and `qd_workers_desired{queue}` from
/// one pool snapshot, so busy + idle and desired are always read together.
pub fn set_workers(queue: &str, busy: u32, idle: u32, desired: u32) {
    gauge!(WORKERS, "queue" => queue.to_owned(), "state" => "busy").set(busy);
    gauge!(WORKERS, "queue" => queue.to_owned(), "state" => "idle").set(idle);
    gauge!(WORKERS_DESIRED, "queue" => queue.to_owned()).set(desired);
}

/// `jobs` finished jobs of `queue` were pruned: `qd_jobs_pruned_total{queue} += jobs`.
/// `queue` is a configured queue or [`UNKNOWN_QUEUE`].
pub fn jobs_pruned(queue: &str, jobs: u64) {
    counter!(JOBS_PRUNED, "queue" => queue.to_owned()).increment(jobs);
}

/// Sets `qd_prune_backlog_age_seconds{queue}`; `Duration::ZERO` when nothing is past
/// retention.
pub fn set_prune_backlog_age(queue: &str, age: Duration) {
    gauge!(PRUNE_BACKLOG_AGE, "queue" => queue.to_owned()).set(age);
}

/// Creates `queue`'s counters at 0 for every bounded label value (attempt outcomes,
/// rejection reasons, expired leases). Call once per configured queue at start-up.
///
/// Why: Prometheus' `rate()`/`increase()` see nothing for a series whose first sample
/// is already 1, so without this the first failure after a restart is invisible.
pub fn register_queue(queue: &str) {
    for outcome in Outcome::ALL.into_iter().filter(|o| o.ends_attempts()) {
        counter!(JOB_ATTEMPTS, "queue" => queue.to_owned(), "outcome" => outcome.as_str())
            .increment(0);
    }
    for reason in RejectReason::ALL {
        counter!(ENQUEUE_REJECTED, "queue" => queue.to_owned(), "reason" => reason.as_str())
            .increment(0);
    }
    counter!(LEASES_EXPIRED, "queue" => queue.to_owned()).increment(0);
    counter!(JOBS_PRUNED, "queue" => queue.to_owned()).increment(0);
    counter!(DEPENDENCIES_RELEASED, "queue" => queue.to_owned()).increment(0);
    counter!(DEPENDENCIES_BLOCKED, "queue" => queue.to_owned()).increment(0);
}

/// Creates `qd_actor_restarts_total{actor}` at 0, so the `QdActorRestarts` alert
/// (`increase(...[15m]) > 0`) sees the first restart. Call when the actor is first spawned.
pub fn register_actor(actor: &'static str) {
    counter!(ACTOR_RESTARTS, "actor" => actor).increment(0);
}

#[cfg(test)]
mod tests;

/// How one tick of a schedule counts in [`SCHEDULE_FIRES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleResult {
    /// Its run was enqueued on time.
    Fired,
    /// A run was enqueued for ticks that came while nobody fired them.
    CaughtUp,
    /// It will never run (catch-up left it out, or its queue refused the job).
    Missed,
    /// Not run: the previous run was unfinished (`overlap = "skip"`).
    SkippedOverlap,
}

impl ScheduleResult {
    /// The `result` label value.
    pub fn label(self) -> &'static str {
        match self {
            ScheduleResult::Fired => "fired",
            ScheduleResult::CaughtUp => "caught_up",
            ScheduleResult::Missed => "missed",
            ScheduleResult::SkippedOverlap => "skipped_overlap",
        }
    }
}

/// `n` ticks of configured schedule `schedule` counted as `result`.
pub fn schedule_ticks(schedule: &str, result: ScheduleResult, n: u64) {
    counter!(SCHEDULE_FIRES, "schedule" => schedule.to_owned(), "result" => result.label())
        .increment(n);
}

/// Registers every result of a configured schedule at 0, so rates and alerts see
/// the series before its first tick.
pub fn register_schedule(schedule: &str) {
    for result in [
        ScheduleResult::Fired,
        ScheduleResult::CaughtUp,
        ScheduleResult::Missed,
        ScheduleResult::SkippedOverlap,
    ] {
        schedule_ticks(schedule, result, 0);
    }
}

/// The next fire of `schedule` on this node, Unix ms (`None`: not here).
pub fn schedule_next_fire(schedule: &str, at: Option<crate::job::UnixMillis>) {
    let secs = at.map_or(0.0, |ms| ms as f64 / 1000.0);
    gauge!(SCHEDULE_NEXT_FIRE, "schedule" => schedule.to_owned()).set(secs);
}

/// A run of `schedule` enqueued at `at` (Unix ms).
pub fn schedule_last_fire(schedule: &str, at: crate::job::UnixMillis) {
    gauge!(SCHEDULE_LAST_FIRE, "schedule" => schedule.to_owned()).set(at as f64 / 1000.0);
}
