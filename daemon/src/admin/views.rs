//! Conversions from qd's internal records to the admin protocol's types.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use qd_proto::{
    ActorInfo, ExportedJob, HistoryItem, JobDetail, JobSummary, LimitsView, NodeStatus, QueueInfo,
    QueueLimits, RedriveResult, Refusal, StatusInfo, TenantCounts, TenantLimits, Valued,
};

use crate::broker::{BatchOutcome, DispatchStats, QueueCounts};
use crate::clock::wall_ms;
use crate::daemon::Daemon;
use crate::job::{Job, State};
use crate::limits::Source;
use crate::store::JobDetail as StoredJob;
use crate::worker_pool::PoolStats;

/// The actor kinds `qctl status` reports, in tree order.
const ACTORS: [&str; 9] = [
    "broker",
    "cluster",
    "dlq",
    "worker_pool",
    "worker",
    "pruner",
    "gauges",
    "api",
    "admin",
];

/// `qctl status`.
pub async fn status(d: &Daemon) -> StatusInfo {
    let stats = d.store.stats();
    let config = d.config();
    let nodes = match &config.daemon.database {
        Some(database) => nodes(d, database).await,
        None => Vec::new(),
    };
    StatusInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        uptime_secs: d.started.elapsed().as_secs_f64(),
        store_path: match &d.config().daemon.database {
            Some(database) => database.describe(),
            None => d.config().db_path().display().to_string(),
        },
        store_bytes: stats.size_bytes,
        actors: ACTORS
            .iter()
            .filter(|name| **name != "cluster" || config.daemon.database.is_some())
            .map(|name| ActorInfo {
                name: (*name).to_string(),
                restarts: d.restarts.count(name),
            })
            .collect(),
        nodes,
    }
}

/// The nodes of the cluster, from the shared store (empty if it cannot be read).
async fn nodes(d: &Daemon, database: &crate::config::DatabaseConfig) -> Vec<NodeStatus> {
    let listed = d
        .store
        .run(|b| match b.shared() {
            Some(shared) => shared.nodes(),
            None => Ok(Vec::new()),
        })
        .await;
    let timeout = u64::try_from(database.node_timeout.as_millis()).unwrap_or(u64::MAX);
    listed
        .unwrap_or_else(|err| {
            tracing::warn!(error = %err, "Could not list the cluster's nodes.");
            Vec::new()
        })
        .into_iter()
        .map(|n| NodeStatus {
            this: n.name == database.node_name,
            alive: n.heartbeat_age_ms < timeout,
            name: n.name,
            heartbeat_age_ms: n.heartbeat_age_ms,
            leader: n.leader,
            epoch: n.epoch,
        })
        .collect()
}

/// One line of `jobs list` / `dlq list`.
pub fn summary(job: &Job) -> JobSummary {
    let state = job.shown_state(wall_ms());
    JobSummary {
        id: job.id.to_string(),
        queue: job.queue.to_string(),
        tenant: job.tenant.to_string(),
        state: state.to_string(),
        attempts: job.attempts,
        budget_used: job.attempts_in_budget(),
        max_attempts: job.max_attempts,
        created_at: job.created_at,
        updated_at: job.updated_at,
        ready_at: (state == State::Delayed).then_some(job.ready_at),
        last_error: job.last_error.clone(),
        blocks: None,
    }
}

/// `jobs show` / `dlq show`.
pub fn detail(d: &StoredJob) -> JobDetail {
    JobDetail {
        summary: summary(&d.job),
        idempotency_key: d.job.idempotency_key.clone(),
        payload_preview: JobDetail::preview(&d.payload),
        payload_bytes: d.payload.len() as u64,
        history: history(d),
        history_elided: d.history_elided,
        history_elided_at: d.history_elided_at as u64,
        priority_ms: d.job.priority_ms,
        result_bytes: d.result.as_ref().map(|r| r.len() as u64),
        parents: Vec::new(),
        dependents: Vec::new(),
        dependents_total: 0,
        blocks_transitive: None,
    }
}

/// One line of `dlq export`: the summary, the whole payload and every history entry.
pub fn export(d: &StoredJob) -> ExportedJob {
    ExportedJob {
        summary: summary(&d.job),
        idempotency_key: d.job.idempotency_key.clone(),
        payload_bytes: d.payload.len() as u64,
        payload_b64: BASE64.encode(&d.payload),
        history: history(d),
    }
}

fn history(d: &StoredJob) -> Vec<HistoryItem> {
    d.history
        .iter()
        .map(|h| HistoryItem {
            attempt: h.attempt,
            outcome: h.outcome.to_string(),
            worker: h.worker.clone(),
            started_at: h.started_at,
            ended_at: h.ended_at,
            error: h.error.clone(),
        })
        .collect()
}

/// The per-tenant rows of `qctl top` from the store's (tenant, state, count) rows,
/// which come sorted by tenant.
pub fn tenant_counts(counts: &[(String, State, u64)]) -> Vec<TenantCounts> {
    let mut rows: Vec<TenantCounts> = Vec::new();
    for (tenant, state, n) in counts {
        if rows.last().is_none_or(|r| &r.tenant != tenant) {
            rows.push(TenantCounts {
                tenant: tenant.clone(),
                ..TenantCounts::default()
            });
        }
        let Some(row) = rows.last_mut() else { continue };
        match state {
            State::Ready => row.ready += n,
            State::Delayed => row.delayed += n,
            State::Leased => row.leased += n,
            State::Dead => row.dead += n,
            State::Waiting => row.waiting += n,
            State::Blocked => row.blocked += n,
            State::Succeeded | State::Cancelled => {}
        }
    }
    rows
}

/// One row of `qctl queues`.
pub fn queue(
    name: &str,
    sched: &DispatchStats,
    counts: &QueueCounts,
    pool: &PoolStats,
    (min, max): (u32, u32),
    paused: bool,
) -> QueueInfo {
    let now = wall_ms();
    QueueInfo {
        name: name.to_string(),
        ready: sched.ready,
        delayed: sched.delayed,
        leased: counts.leased,
        dead: counts.dead,
        oldest_ready_age_secs: sched
            .oldest_ready_at
            .map(|at| (now - at).max(0) as f64 / 1000.0),
        workers_busy: pool.busy,
        workers_total: pool.total,
        workers_min: min,
        workers_max: max,
        paused,
        waiting: counts.held_waiting,
        blocked: counts.held_blocked,
    }
}

fn refusals(outcome: &BatchOutcome) -> Vec<Refusal> {
    outcome
        .refused
        .iter()
        .map(|(id, reason)| Refusal {
            id: id.to_string(),
            reason: reason.clone(),
        })
        .collect()
}

/// `dlq redrive`: `matched` counts every selected job, `moved` only those moved.
pub fn redrive(outcome: BatchOutcome, dry_run: bool) -> RedriveResult {
    RedriveResult {
        matched: (outcome.moved.len() + outcome.refused.len()) as u64,
        moved: if dry_run {
            0
        } else {
            outcome.moved.len() as u64
        },
        refused: refusals(&outcome),
        ids: outcome.moved.iter().map(ToString::to_string).collect(),
        dry_run,
    }
}

fn valued<T>(value: T, source: Source) -> Valued<T> {
    Valued { value, source }
}

/// `"smtp: 50/s burst 10"`, marked `(override)` when a runtime override is in force.
fn limiter_text(l: &crate::limits::Limits, name: &str) -> String {
    let Some(s) = l.limiter(name) else {
        return name.to_string();
    };
    let overridden = l.limiter_sources(name).contains(&Source::Override);
    let mark = if overridden { " (override)" } else { "" };
    format!("{name}: {}/s burst {}{mark}", s.per_second, s.burst)
}

/// `limits show`, and the answer to every limit change.
pub fn limits(d: &Daemon) -> LimitsView {
    let l = &d.limits;
    let tenants = l
        .tenant_names()
        .into_iter()
        .map(|t| {
            let v = l.tenant(&t);
            let [w, c, m] = l.tenant_sources(&t);
            TenantLimits {
                weight: valued(v.weight, w),
                max_concurrency: valued(v.max_concurrency, c),
                max_depth: valued(v.max_depth, m),
                tenant: t,
            }
        })
        .collect();
    let queues = d
        .config()
        .queues
        .iter()
        .map(|(name, q)| {
            let (min, max) = l.workers(name, &q.workers);
            let [smin, smax] = l.worker_sources(name);
            let paused = l.paused(name);
            let spaused = if paused {
                Source::Override
            } else {
                Source::Config
            };
            QueueLimits {
                queue: name.clone(),
                workers_min: valued(min, smin),
                workers_max: valued(max, smax),
                rate_limiter: q.rate_limiter.as_deref().map(|n| limiter_text(l, n)),
                paused: valued(paused, spaused),
            }
        })
        .collect();
    LimitsView { tenants, queues }
}
