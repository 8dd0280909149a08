//! The Pruner actor: deletes finished jobs (succeeded, cancelled) once their queue's
//! retention has passed, which frees their idempotency keys, and gives the freed
//! space back to the file system.
//!
//! One pass per [`EVERY`]: for each configured queue, at that queue's `retention`,
//! bounded batches until a batch comes back short, i.e. until the backlog of expired
//! rows is gone however large it grew; then the same for jobs of
//! queues no longer in the config (at the longest retention of any queue); then free
//! pages beyond [`KEEP_FREE_PAGES`] are released, [`RELEASE_STEP_PAGES`] at a time.
//! Every batch and step is its own short store operation, and the Pruner awaits each
//! before sending the next, so enqueues submitted meanwhile commit in between (group
//! commit). A batch shares its transaction with those enqueues, so its size is set
//! by time, not rows ([`BatchSize`]): each batch aims at [`BATCH_TIME`] of the
//! writer, between [`MIN_BATCH`] and [`MAX_BATCH`] jobs, so an enqueue waits at most
//! about that long for pruning on any disk. The next pass is armed when one ends, so
//! passes never pile up behind a slow disk.
//!
//! Retention is read from the config, its one owner. Counts go to
//! `qd_jobs_pruned_total{queue}`; how far behind pruning was when a pass started goes
//! to `qd_prune_backlog_age_seconds{queue}`. A store error ends the pass (logged once);
//! the next pass retries.
//!
//! On a store shared by several nodes only the leader prunes (see `cluster.rs`).
//!
//! Messages: only its own [`PrunerMsg::Pass`] timer. Supervised by the Supervisor.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::clock::wall_ms;
use crate::config::Config;
use crate::daemon::ClusterView;
use crate::job::UnixMillis;
use crate::limits::Limits;
use crate::metrics;
use crate::store::{PruneScope, Store, StoreError};

/// The registered name of the pruner.
pub const NAME: &str = "pruner";
/// Pause between the end of one pass and the start of the next.
pub const EVERY: Duration = Duration::from_secs(1);
/// How long one batch should hold the store writer: what an enqueue sharing its
/// transaction waits for pruning, at most about.
pub const BATCH_TIME: Duration = Duration::from_millis(20);
/// The fewest jobs a batch deletes (so a slow disk still makes progress).
pub const MIN_BATCH: u32 = 50;
/// The most jobs a batch deletes, however fast the disk.
pub const MAX_BATCH: u32 = 10_000;
/// Free pages (4 KiB) kept for reuse by new rows rather than given back (8 MiB).
pub const KEEP_FREE_PAGES: u32 = 2_048;
/// Most pages given back by one store operation (2 MiB).
pub const RELEASE_STEP_PAGES: u32 = 512;

/// What the pruner is started with.
pub struct PrunerArgs {
    /// The config in force (queues and their retention), read at every pass so a
    /// reload's retention applies from the next pass.
    pub limits: Arc<Limits>,
    /// The store to prune.
    pub store: Store,
    /// On a store shared by several nodes, this node's standing: only the leader
    /// prunes. `None`: the store is this node's alone.
    pub cluster: Option<Arc<ClusterView>>,
}

/// Messages the pruner takes.
pub enum PrunerMsg {
    /// Timer: run one pass.
    Pass,
}

/// The pruner actor.
pub struct Pruner;

/// The pruner's state: its arguments and the batch size learnt so far.
pub struct PrunerState {
    args: PrunerArgs,
    batch: BatchSize,
}

impl Actor for Pruner {
    type Msg = PrunerMsg;
    type State = PrunerState;
    type Arguments = PrunerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<PrunerMsg>,
        args: PrunerArgs,
    ) -> Result<PrunerState, ActorProcessingErr> {
        myself.send_after(EVERY, || PrunerMsg::Pass);
        Ok(PrunerState {
            args,
            batch: BatchSize::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<PrunerMsg>,
        PrunerMsg::Pass: PrunerMsg,
        state: &mut PrunerState,
    ) -> Result<(), ActorProcessingErr> {
        let PrunerState { args, batch } = state;
        if !ClusterView::prunes(args.cluster.as_deref()) {
            myself.send_after(EVERY, || PrunerMsg::Pass);
            return Ok(());
        }
        match pass(&args.limits.config(), &args.store, wall_ms(), batch).await {
            Ok(0) => {}
            Ok(pruned) => tracing::debug!(pruned, "Finished jobs past retention pruned."),
            Err(err) => {
                tracing::warn!(error = %err, "Pruning stopped for this pass; retrying in a second.");
            }
        }
        myself.send_after(EVERY, || PrunerMsg::Pass);
        Ok(())
    }
}

/// The size of the next batch, learnt from how long the last ones took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSize(u32);

impl Default for BatchSize {
    /// 1,000 jobs until a batch has been timed.
    fn default() -> Self {
        BatchSize(1_000)
    }
}

impl BatchSize {
    /// Jobs to delete in the next batch.
    pub fn jobs(self) -> u32 {
        self.0
    }

    /// Learns from a batch of `jobs` that took `took`: the next batch is sized to take
    /// [`BATCH_TIME`], at most twice the last one, within [`MIN_BATCH`]..=[`MAX_BATCH`].
    /// A batch that deleted fewer than it asked for says nothing about the size.
    pub fn learn(&mut self, jobs: u64, took: Duration) {
        if jobs < u64::from(self.0) {
            return;
        }
        let per_job = took.as_secs_f64() / jobs as f64;
        let fits = (BATCH_TIME.as_secs_f64() / per_job.max(1e-9)).min(f64::from(self.0) * 2.0);
        self.0 = (fits.round() as u32).clamp(MIN_BATCH, MAX_BATCH);
    }
}

/// One scope of a pass: which jobs, their metric label, their retention.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The jobs covered.
    pub scope: PruneScope,
    /// The `queue` label of their metrics.
    pub label: String,
    /// How long they are kept once finished.
    pub retention: Duration,
}

/// Every configured queue at its own retention, then the jobs of queues no longer
/// configured at the longest retention of any queue.
pub fn targets(config: &Config) -> Vec<Target> {
    let mut targets: Vec<Target> = config
        .queues
        .iter()
        .map(|(name, q)| Target {
            scope: PruneScope::Queue(name.clone()),
            label: name.clone(),
            retention: q.retention,
        })
        .collect();
    let longest = targets.iter().map(|t| t.retention).max();
    targets.push(Target {
        scope: PruneScope::Unconfigured(config.queues.keys().cloned().collect()),
        label: metrics::UNKNOWN_QUEUE.to_owned(),
        retention: longest.unwrap_or(Duration::from_secs(86_400)),
    });
    targets
}

/// One pass at wall time `now` (Unix ms): every target until its backlog is gone,
/// then the space; `batch` sizes the batches and learns from them. Returns how many
/// jobs were deleted.
///
/// Errors: the first store error; the rest of the pass is skipped.
pub async fn pass(
    config: &Config,
    store: &Store,
    now: UnixMillis,
    batch: &mut BatchSize,
) -> Result<u64, StoreError> {
    let mut pruned = 0;
    for target in targets(config) {
        pruned += prune_target(store, target, now, batch).await?;
    }
    while store
        .run(|b| b.release_space(KEEP_FREE_PAGES, RELEASE_STEP_PAGES))
        .await?
        == RELEASE_STEP_PAGES
    {}
    Ok(pruned)
}

/// Batches until one comes back short; the first also reads how far behind it was.
async fn prune_target(
    store: &Store,
    target: Target,
    now: UnixMillis,
    batch: &mut BatchSize,
) -> Result<u64, StoreError> {
    let retention = i64::try_from(target.retention.as_millis()).unwrap_or(i64::MAX);
    let before = now.saturating_sub(retention);
    let scope = Arc::new(target.scope);
    let mut pruned = 0;
    let mut first = true;
    loop {
        let s = Arc::clone(&scope);
        let limit = batch.jobs();
        let (oldest, n, took) = store
            .run(move |b| {
                let oldest = if first { b.oldest_finished(&s)? } else { None };
                let started = Instant::now();
                let n = b.prune_finished(&s, before, limit)?;
                Ok((oldest, n, started.elapsed()))
            })
            .await?;
        batch.learn(n, took);
        if first {
            let behind = oldest.map_or(0, |t| before.saturating_sub(t).max(0));
            let behind = Duration::from_millis(u64::try_from(behind).unwrap_or(0));
            metrics::set_prune_backlog_age(&target.label, behind);
            first = false;
        }
        metrics::jobs_pruned(&target.label, n);
        pruned += n;
        if n < u64::from(limit) {
            return Ok(pruned);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Job, JobId, State};
    use crate::store::NewRecord;

    fn config() -> Config {
        let text = "[queues.short]\nexecutor = { kind = \"external\" }\nretention = \"1s\"\n\
                    [queues.long]\nexecutor = { kind = \"external\" }\nretention = \"1h\"\n";
        Config::parse(text, std::path::Path::new("/tmp/qd.toml")).expect("config")
    }

    fn finished(n: u128, queue: &str, updated_at: UnixMillis) -> Job {
        Job {
            id: JobId(uuid::Uuid::from_u128(n)),
            queue: queue.into(),
            tenant: "default".into(),
            idempotency_key: Some(format!("k{n}")),
            state: State::Succeeded,
            attempts: 1,
            budget_start: 0,
            max_attempts: 3,
            lease_seq: 1,
            worker: None,
            leased_at: None,
            created_at: updated_at,
            ready_at: updated_at,
            updated_at,
            last_error: None,
            priority_ms: 0,
        }
    }

    #[test]
    fn each_queue_is_pruned_at_its_own_retention_and_removed_queues_at_the_longest() {
        let t = targets(&config());
        let shown: Vec<(&str, u64)> = t
            .iter()
            .map(|t| (t.label.as_str(), t.retention.as_secs()))
            .collect();
        assert_eq!(shown, [("long", 3600), ("short", 1), ("unknown", 3600)]);
        assert_eq!(
            t[2].scope,
            PruneScope::Unconfigured(vec!["long".into(), "short".into()])
        );
    }

    #[tokio::test]
    async fn one_pass_clears_a_backlog_far_larger_than_a_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_sqlite(&dir.path().join("qd.db")).expect("open");
        let now: UnixMillis = 10_000_000;
        let backlog = 3 * MAX_BATCH as u128 + 17;
        let mut jobs: Vec<Job> = (0..backlog)
            .map(|n| finished(n, "short", now - 5_000))
            .collect();
        jobs.extend((0..5).map(|n| finished(1_000_000 + n, "long", now - 5_000)));
        jobs.extend((0..3).map(|n| finished(2_000_000 + n, "gone", now - 7_200_000)));
        let records = NewRecord::batch(jobs, b"x");
        store
            .run(move |b| b.enqueue(&records))
            .await
            .expect("insert");
        let mut batch = BatchSize::default();
        let pruned = pass(&config(), &store, now, &mut batch)
            .await
            .expect("pass");
        assert_eq!(pruned, backlog as u64 + 3);
        let counts = store.run(|b| b.counts()).await.expect("counts");
        assert_eq!(counts, [("long".to_string(), State::Succeeded, 5)]);
        assert_eq!(pass(&config(), &store, now, &mut batch).await, Ok(0));
    }

    #[test]
    fn batches_are_sized_by_time_within_bounds() {
        let mut batch = BatchSize::default();
        batch.learn(1_000, Duration::from_millis(80));
        assert_eq!(batch.jobs(), 250, "80 us a job: 250 fit in 20 ms");
        batch.learn(100, Duration::from_millis(1));
        assert_eq!(
            batch.jobs(),
            250,
            "a short batch (backlog gone) teaches nothing"
        );
        batch.learn(250, Duration::from_micros(250));
        assert_eq!(batch.jobs(), 500, "grows at most twofold a batch");
        for _ in 0..20 {
            let jobs = u64::from(batch.jobs());
            batch.learn(jobs, Duration::from_micros(jobs));
        }
        assert_eq!(batch.jobs(), MAX_BATCH);
        batch.learn(u64::from(MAX_BATCH), Duration::from_secs(10));
        assert_eq!(batch.jobs(), MIN_BATCH);
    }
}
