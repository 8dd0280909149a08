//! The Dlq actor: the dead-letter queue's operator commands.
//!
//! It keeps no state of its own: DLQ depth and the age of the oldest dead job are a
//! query to the Broker, which owns the dead jobs ([`BrokerMsg::DlqStats`]).
//! Listings and selections read the store (payload, last error, history); redrive
//! and purge go through the Broker, the only writer, in atomic batches. Redrive is
//! never automatic: only an operator request moves a dead job.
//!
//! Messages ([`DlqMsg`]): `Redrive`, `Purge` (from the admin server; DLQ listings
//! read the store directly). Supervised by the Supervisor.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::broker::{self, BatchOutcome, BrokerError, BrokerMsg};
use crate::job::{Job, JobId, State, UnixMillis};
use crate::store::{JobFilter, JobOrder, Store};

/// The registered actor name of the Dlq.
pub const NAME: &str = "dlq";

/// The most jobs one selection may resolve to.
pub const MAX_SELECTION: u32 = 100_000;

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
        Ok(DlqState { store })
    }

    async fn handle(
        &self,
        _myself: ActorRef<DlqMsg>,
        msg: DlqMsg,
        state: &mut DlqState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
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
            ..JobFilter::default()
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
