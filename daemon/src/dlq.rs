//! The Dlq actor: the dead-letter queue's index and its operator commands.
//!
//! It keeps, per queue, the dead jobs ordered by the time they died, so DLQ depth
//! and the age of the oldest dead job are exact at any moment (and right after a
//! restart, since it is rebuilt from the Broker). Listings and selections read the
//! store (payload, last error, history); redrive and purge go through the Broker,
//! the only writer, in atomic batches. Redrive is never automatic: only an operator
//! request moves a dead job.
//!
//! Messages ([`DlqMsg`]): `Dead`, `Removed`, `Reset` (from the Broker); `Stats`,
//! `Redrive`, `Purge` (from the admin server; DLQ listings read the store directly). Supervised by the Supervisor.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::broker::{self, BatchOutcome, BrokerError, BrokerMsg, Resync};
use crate::job::{Job, JobId, State, UnixMillis};
use crate::store::{JobFilter, JobOrder, Store};

/// The registered actor name of the Dlq.
pub const NAME: &str = "dlq";

/// The most jobs one selection may resolve to.
pub const MAX_SELECTION: u32 = 100_000;

/// A dead job as the index sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadEntry {
    /// The job.
    pub id: JobId,
    /// Its queue.
    pub queue: Arc<str>,
    /// Its tenant.
    pub tenant: Arc<str>,
    /// When it died (Unix ms).
    pub died_at: UnixMillis,
}

/// DLQ depth and the oldest death, for one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DlqStats {
    /// Dead jobs.
    pub depth: u64,
    /// When the oldest one died (Unix ms).
    pub oldest_died_at: Option<UnixMillis>,
}

/// Which dead jobs an operator means. Empty `ids` means "by filter"; a filter with
/// no field set selects nothing unless `all` is true.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Exactly these jobs.
    pub ids: Vec<JobId>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only jobs whose last error contains this text.
    pub error_contains: Option<String>,
    /// Only jobs that died at or after this time (Unix ms).
    pub since: Option<UnixMillis>,
    /// Select every dead job the filters allow, even with no filter.
    pub all: bool,
}

impl Selection {
    fn is_unbounded(&self) -> bool {
        self.ids.is_empty()
            && self.queue.is_none()
            && self.tenant.is_none()
            && self.error_contains.is_none()
            && self.since.is_none()
    }
}

/// Messages the Dlq takes.
pub enum DlqMsg {
    /// A job died.
    Dead(DeadEntry),
    /// These jobs left the DLQ (redriven, cancelled, purged).
    Removed(Vec<JobId>),
    /// Replace the index (resync from the Broker).
    Reset(Vec<DeadEntry>),
    /// Depth and oldest death per queue.
    Stats(RpcReplyPort<HashMap<Arc<str>, DlqStats>>),
    /// Redrive what a selection matches, as `by`; with `dry_run` only report it.
    Redrive(
        Selection,
        String,
        bool,
        RpcReplyPort<Result<BatchOutcome, BrokerError>>,
    ),
    /// Delete what a selection matches; with `dry_run` only report it.
    Purge(
        Selection,
        bool,
        RpcReplyPort<Result<BatchOutcome, BrokerError>>,
    ),
}

/// The Dlq's state.
pub struct DlqState {
    store: Store,
    by_queue: HashMap<Arc<str>, BTreeSet<(UnixMillis, JobId)>>,
    entries: HashMap<JobId, DeadEntry>,
}

/// The Dlq actor.
pub struct Dlq;

impl Actor for Dlq {
    type Msg = DlqMsg;
    type State = DlqState;
    type Arguments = Store;

    async fn pre_start(
        &self,
        _myself: ActorRef<DlqMsg>,
        store: Store,
    ) -> Result<DlqState, ActorProcessingErr> {
        broker::cast(BrokerMsg::Resync(Resync::Dlq));
        Ok(DlqState {
            store,
            by_queue: HashMap::new(),
            entries: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<DlqMsg>,
        msg: DlqMsg,
        state: &mut DlqState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DlqMsg::Dead(entry) => state.insert(entry),
            DlqMsg::Removed(ids) => ids.iter().for_each(|id| state.remove(*id)),
            DlqMsg::Reset(entries) => {
                state.by_queue.clear();
                state.entries.clear();
                entries.into_iter().for_each(|e| state.insert(e));
            }
            DlqMsg::Stats(reply) => {
                let _ = reply.send(state.stats());
            }
            DlqMsg::Redrive(sel, by, dry_run, reply) => {
                let result = state
                    .apply(&sel, dry_run, |ids, tx| BrokerMsg::Redrive(ids, by, tx))
                    .await;
                let _ = reply.send(result);
            }
            DlqMsg::Purge(sel, dry_run, reply) => {
                let result = state.apply(&sel, dry_run, BrokerMsg::Purge).await;
                let _ = reply.send(result);
            }
        }
        Ok(())
    }
}

/// How long a redrive or purge batch may take in the Broker and store.
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

impl DlqState {
    fn insert(&mut self, entry: DeadEntry) {
        self.remove(entry.id);
        self.by_queue
            .entry(entry.queue.clone())
            .or_default()
            .insert((entry.died_at, entry.id));
        self.entries.insert(entry.id, entry);
    }

    fn remove(&mut self, id: JobId) {
        if let Some(e) = self.entries.remove(&id)
            && let Some(set) = self.by_queue.get_mut(&e.queue)
        {
            set.remove(&(e.died_at, id));
        }
    }

    fn stats(&self) -> HashMap<Arc<str>, DlqStats> {
        self.by_queue
            .iter()
            .map(|(q, set)| {
                let stats = DlqStats {
                    depth: set.len() as u64,
                    oldest_died_at: set.first().map(|(at, _)| *at),
                };
                (q.clone(), stats)
            })
            .collect()
    }

    /// Resolves a selection to dead jobs, reading the store for the filters; filtered
    /// selections come most recently dead first.
    async fn select(&self, sel: &Selection) -> Result<Vec<Job>, BrokerError> {
        if !sel.ids.is_empty() {
            let ids = sel.ids.clone();
            let jobs = self
                .store
                .run(move |b| {
                    let mut found = Vec::new();
                    for id in ids {
                        if let Some(d) = b.job(id)? {
                            found.push(d.job);
                        }
                    }
                    Ok(found)
                })
                .await?;
            return Ok(jobs);
        }
        if sel.is_unbounded() && !sel.all {
            return Ok(Vec::new());
        }
        let filter = JobFilter {
            queue: sel.queue.clone(),
            tenant: sel.tenant.clone(),
            state: Some(State::Dead),
            error_contains: sel.error_contains.clone(),
            updated_since: sel.since,
            after: None,
            order: JobOrder::RecentlyUpdated,
            limit: MAX_SELECTION,
        };
        Ok(self.store.run(move |b| b.list_jobs(&filter)).await?)
    }

    /// Resolves `sel` and sends the ids to the Broker (unless `dry_run`).
    async fn apply(
        &self,
        sel: &Selection,
        dry_run: bool,
        msg: impl FnOnce(Vec<JobId>, RpcReplyPort<Result<BatchOutcome, BrokerError>>) -> BrokerMsg,
    ) -> Result<BatchOutcome, BrokerError> {
        let jobs = self.select(sel).await?;
        let (dead, refused): (Vec<Job>, Vec<Job>) =
            jobs.into_iter().partition(|j| j.state == State::Dead);
        let mut refused: Vec<(JobId, String)> = refused
            .iter()
            .map(|j| (j.id, format!("job {} is {}, not dead", j.id, j.state)))
            .collect();
        for id in &sel.ids {
            if !dead.iter().any(|j| j.id == *id) && !refused.iter().any(|(r, _)| r == id) {
                refused.push((*id, format!("unknown job {id}")));
            }
        }
        let ids: Vec<JobId> = dead.iter().map(|j| j.id).collect();
        if dry_run || ids.is_empty() {
            return Ok(BatchOutcome {
                moved: ids,
                refused,
            });
        }
        let mut outcome = broker::request(|tx| msg(ids, tx), BATCH_TIMEOUT).await??;
        outcome.refused.extend(refused);
        Ok(outcome)
    }
}
