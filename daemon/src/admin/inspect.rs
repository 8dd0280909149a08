//! The read-only requests operators inspect with: paged job and DLQ listings,
//! whole payloads, the DLQ export and the numbers of `qctl top`. Everything here
//! reads the store (`list_jobs`, `job`, `tenant_counts`) or live gauges; nothing
//! changes state.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use qd_proto::{
    DlqSelection, ErrorBody, ErrorCode, JobPayload, JobResult, Response, TopInfo, TopQueue,
};

use super::{CALL, DEFAULT_LIMIT, Handler, MAX_LIMIT, err, parse_id, since_ms, views};
use crate::broker::{self, BrokerError, BrokerMsg};
use crate::job::{Job, State};
use crate::store::{JobDetail as StoredJob, JobFilter, JobOrder};

/// Default and largest page of `dlq_export` (each job carries its whole payload).
const EXPORT_LIMIT: u32 = 100;
const EXPORT_MAX: u32 = 1000;

impl Handler {
    /// `jobs_list`: newest first, one page after `after`. `filters` are those of a
    /// DLQ listing (queue, tenant, error, since; no ids), over jobs in `state` or
    /// in any state.
    pub(super) async fn jobs_list(
        &self,
        filters: &DlqSelection,
        state: Option<String>,
        limit: Option<u32>,
        after: Option<String>,
    ) -> Result<Response, ErrorBody> {
        let state = state
            .map(|s| {
                s.parse::<State>()
                    .map_err(|e| err(ErrorCode::BadRequest, e))
            })
            .transpose()?;
        let limit = page_size(limit, DEFAULT_LIMIT, MAX_LIMIT)?;
        let filter = self.selection_filter(filters, state, JobOrder::NewestFirst, after, limit)?;
        let (jobs, next_after) = self.page(filter).await?;
        Ok(Response::Jobs {
            jobs: jobs.iter().map(views::summary).collect(),
            next_after,
        })
    }

    /// `dlq_list`: most recently dead first, one page after `after`, each with the
    /// number of unfinished jobs it holds back.
    pub(super) async fn dlq_list(
        &self,
        selection: &DlqSelection,
        limit: Option<u32>,
        after: Option<String>,
    ) -> Result<Response, ErrorBody> {
        let limit = page_size(limit, DEFAULT_LIMIT, MAX_LIMIT)?;
        let filter = self.dead_filter(selection, after, limit)?;
        let (jobs, next_after) = self.page(filter).await?;
        let jobs = self
            .with_blocks(jobs.iter().map(views::summary).collect())
            .await?;
        Ok(Response::Jobs { jobs, next_after })
    }

    /// `jobs_payload`: the whole payload of any stored job.
    pub(super) async fn jobs_payload(&self, id: &str) -> Result<Response, ErrorBody> {
        let detail = self.stored(id).await?;
        Ok(Response::Payload(JobPayload {
            id: detail.job.id.to_string(),
            payload_bytes: detail.payload.len() as u64,
            payload_b64: BASE64.encode(&detail.payload),
        }))
    }

    /// `jobs_result`: what a stored job handed back, if anything.
    pub(super) async fn jobs_result(&self, id: &str) -> Result<Response, ErrorBody> {
        let detail = self.stored(id).await?;
        let state = detail.job.shown_state(crate::clock::wall_ms());
        let Some(result) = &detail.result else {
            let id = detail.job.id;
            return Err(err(
                ErrorCode::NotFound,
                format!("job {id} has no result (it is {state})"),
            ));
        };
        Ok(Response::JobResult(JobResult {
            id: detail.job.id.to_string(),
            state: state.to_string(),
            result_bytes: result.len() as u64,
            result_b64: BASE64.encode(result),
        }))
    }

    /// `dlq_export`: a page of dead jobs with payload and history. A job redriven or
    /// purged between the listing and the read is left out of the page.
    pub(super) async fn dlq_export(
        &self,
        selection: &DlqSelection,
        limit: Option<u32>,
        after: Option<String>,
    ) -> Result<Response, ErrorBody> {
        let limit = page_size(limit, EXPORT_LIMIT, EXPORT_MAX)?;
        let filter = self.dead_filter(selection, after, limit)?;
        let (jobs, next_after) = self.page(filter).await?;
        let ids: Vec<_> = jobs.iter().map(|j| j.id).collect();
        let details: Vec<StoredJob> = self
            .daemon
            .store
            .run(move |b| {
                let mut found = Vec::with_capacity(ids.len());
                for id in ids {
                    found.extend(b.job(id)?.filter(|d| d.job.state == State::Dead));
                }
                Ok(found)
            })
            .await
            .map_err(BrokerError::from)?;
        Ok(Response::Export {
            jobs: details.iter().map(views::export).collect(),
            next_after,
        })
    }

    /// `top`: every queue with its attempt counters, and one queue's tenants.
    pub(super) async fn top(&self, tenants_of: Option<String>) -> Result<Response, ErrorBody> {
        self.queue_filter(tenants_of.as_deref())?;
        let queues = self
            .queues()
            .await
            .into_iter()
            .map(|info| {
                let totals = crate::metrics::attempt_totals(&info.name);
                TopQueue {
                    info,
                    completed_total: totals.completed,
                    failed_total: totals.failed,
                }
            })
            .collect();
        let tenants = match tenants_of {
            Some(queue) => views::tenant_counts(&self.tenant_counts(queue).await?),
            None => Vec::new(),
        };
        Ok(Response::Top(TopInfo { queues, tenants }))
    }

    /// One queue's unfinished jobs per tenant and state, for `top` (asked every
    /// second while it runs). With SQLite the Broker holds every unfinished job, so
    /// its memory answers: the store has no index of unfinished jobs by queue (the
    /// hot path writes none), and a count there scans the table on the writer
    /// thread. A shared store (PostgreSQL) counts every node's jobs.
    async fn tenant_counts(&self, queue: String) -> Result<Vec<(String, State, u64)>, ErrorBody> {
        if self.daemon.store.leases_are_local() {
            return broker::request(|reply| BrokerMsg::TenantCounts(queue, reply), CALL)
                .await
                .map_err(ErrorBody::from);
        }
        self.daemon
            .store
            .run(move |b| b.tenant_counts(&queue))
            .await
            .map_err(|e| ErrorBody::from(BrokerError::from(e)))
    }

    /// The store filter of a DLQ listing: dead jobs, most recently dead first.
    fn dead_filter(
        &self,
        sel: &DlqSelection,
        after: Option<String>,
        limit: u32,
    ) -> Result<JobFilter, ErrorBody> {
        if !sel.ids.is_empty() {
            return Err(err(
                ErrorCode::BadRequest,
                "a DLQ listing takes filters, not ids; show one job with dlq_show",
            ));
        }
        self.selection_filter(
            sel,
            Some(State::Dead),
            JobOrder::RecentlyUpdated,
            after,
            limit,
        )
    }

    /// The store filter of a listing by `sel`'s filters (its ids are the caller's
    /// business): shared by `jobs_list` and the DLQ listings, so `error` and
    /// `since` mean the same in both. Errors: `not_found` for an unknown queue,
    /// `bad_request` for a tenant no job can have or a malformed cursor.
    fn selection_filter(
        &self,
        sel: &DlqSelection,
        state: Option<State>,
        order: JobOrder,
        after: Option<String>,
        limit: u32,
    ) -> Result<JobFilter, ErrorBody> {
        self.queue_filter(sel.queue.as_deref())?;
        super::tenant_filter(sel.tenant.as_deref())?;
        Ok(JobFilter {
            queue: sel.queue.clone(),
            tenant: sel.tenant.clone(),
            state,
            error_contains: sel.error_contains.clone(),
            updated_since: sel.since_secs.map(since_ms),
            after: after.as_deref().map(parse_id).transpose()?,
            order,
            limit,
            ..JobFilter::default()
        })
    }

    /// One page of `filter`, with the cursor of the next page: asks the store for one
    /// job more than the limit to learn whether another page follows.
    async fn page(&self, mut filter: JobFilter) -> Result<(Vec<Job>, Option<String>), ErrorBody> {
        let limit = filter.limit as usize;
        filter.limit = filter.limit.saturating_add(1);
        let mut jobs = self
            .daemon
            .store
            .run(move |b| b.list_jobs(&filter))
            .await
            .map_err(BrokerError::from)?;
        let more = jobs.len() > limit;
        jobs.truncate(limit);
        let next = if more {
            jobs.last().map(|j| j.id.to_string())
        } else {
            None
        };
        Ok((jobs, next))
    }
}

/// A listing's page size: `default` when absent, at most `max`. A limit of 0 is a
/// `bad_request` (an empty page would read as "no jobs").
fn page_size(limit: Option<u32>, default: u32, max: u32) -> Result<u32, ErrorBody> {
    match limit {
        Some(0) => Err(err(
            ErrorCode::BadRequest,
            format!("limit must be between 1 and {max}"),
        )),
        limit => Ok(limit.unwrap_or(default).min(max)),
    }
}
