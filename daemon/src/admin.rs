//! The admin handler: what each qctl request does, on top of the actors.
//!
//! [`crate::admin_server`] owns the socket, framing and peer checks; this module
//! implements its [`AdminHandler`] by sending one message to the Broker, Dlq,
//! WorkerPools, or by reading the store, and mapping the answer to
//! the protocol's types (`admin/views.rs`). Runtime overrides (`limits set`,
//! `workers set`, `queue pause`) are written to the store first, then applied to
//! the live [`crate::limits::Limits`] and announced to the actors that enforce them.

mod audit;
pub use audit::Author;
mod deps;
mod inspect;
mod ops;
mod schedules;
mod views;

use std::sync::Arc;
use std::time::Duration;

use qd_proto::{DlqSelection, ErrorBody, ErrorCode, Request, Response};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

use crate::admin_server::{AdminHandler, AdminServer, AdminServerArgs, DEFAULT_IDLE_TIMEOUT, Peer};
use crate::api::JobBody;
use crate::broker::{self, BatchError, BrokerError, BrokerMsg, EnqueueRequest};
use crate::config::MAX_WORKERS;
use crate::daemon::Daemon;
use crate::dlq::{self, DlqMsg, Selection};
use crate::job::{JobId, State};
use crate::store::{self, JobDetail as StoredJob};
use crate::worker_pool::{self, PoolMsg};

/// The registered name of the admin server.
pub const NAME: &str = "admin";
/// Default and largest page of `jobs list` / `dlq list`.
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 10_000;
const CALL: Duration = Duration::from_secs(30);

/// What the admin handler needs.
pub struct AdminArgs {
    daemon: Daemon,
}

impl AdminArgs {
    /// Handler arguments from the daemon's shared parts.
    pub fn new(daemon: Daemon) -> Self {
        AdminArgs { daemon }
    }
}

/// Spawns the AdminServer, linked to `supervisor`, serving this handler.
pub async fn spawn(
    args: AdminArgs,
    supervisor: ActorCell,
) -> Result<ActorCell, ActorProcessingErr> {
    let config = args.daemon.config();
    let d = &config.daemon;
    let server_args = AdminServerArgs {
        socket_path: d.admin_socket.clone(),
        socket_mode: d.admin_socket_mode,
        admin_group: d.admin_group.clone(),
        idle_timeout: DEFAULT_IDLE_TIMEOUT,
        handler: Arc::new(Handler {
            daemon: args.daemon,
        }),
    };
    let (actor, _) = Actor::spawn_linked(
        Some(NAME.into()),
        AdminServer::<Handler>::new(),
        server_args,
        supervisor,
    )
    .await?;
    Ok(actor.get_cell())
}

/// The qctl request handler.
pub struct Handler {
    daemon: Daemon,
}

fn err(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(code, message.into())
}

impl From<BrokerError> for ErrorBody {
    fn from(e: BrokerError) -> Self {
        let code = match &e {
            BrokerError::UnknownQueue(_) | BrokerError::UnknownJob(_) => ErrorCode::NotFound,
            BrokerError::KeyConflict { .. }
            | BrokerError::KeyConflictInBatch { .. }
            | BrokerError::Transition(_) => ErrorCode::Conflict,
            BrokerError::Invalid(_)
            | BrokerError::PayloadTooLarge { .. }
            | BrokerError::UnknownDependency(_) => ErrorCode::BadRequest,
            BrokerError::QueueFull { .. }
            | BrokerError::TenantFull { .. }
            | BrokerError::ShuttingDown
            | BrokerError::Unavailable(_) => ErrorCode::Unavailable,
            BrokerError::Store(_) => ErrorCode::Internal,
        };
        err(code, e.to_string())
    }
}

/// The one job a `dlq_redrive` with a new payload names: exactly one id, no
/// filter, no `all`, not a dry run.
fn one_id(selection: &DlqSelection, dry_run: bool) -> Result<JobId, ErrorBody> {
    match selection.ids.as_slice() {
        [id] if !selection.has_filter() && !selection.all && !dry_run => parse_id(id),
        _ => Err(err(
            ErrorCode::BadRequest,
            "a new payload redrives exactly one dead job: name one id, no filter, no all, no dry_run",
        )),
    }
}

fn parse_id(id: &str) -> Result<JobId, ErrorBody> {
    id.parse().map_err(|_| {
        err(
            ErrorCode::BadRequest,
            format!("{id:?} is not a job id (a UUID)"),
        )
    })
}

impl AdminHandler for Handler {
    async fn handle(&self, req: Request, peer: Peer) -> Result<Response, ErrorBody> {
        self.serve(req, Author::Uid(peer.uid)).await
    }
}

impl Handler {
    /// A handler for requests that do not come through the socket (the console).
    pub fn new(daemon: Daemon) -> Self {
        Handler { daemon }
    }

    /// Handles one request on behalf of `author`, who is named in the audit line
    /// and in job history (`redriven by ...`).
    pub async fn serve(&self, req: Request, author: Author) -> Result<Response, ErrorBody> {
        let by = author.to_string();
        let peer = &author;
        let req_op = req.op();
        match req {
            Request::Status {} => Ok(Response::Status(views::status(&self.daemon).await)),
            Request::Queues {} => Ok(Response::Queues {
                queues: self.queues().await,
            }),
            Request::JobsList {
                queue,
                tenant,
                state,
                error_contains,
                since_secs,
                limit,
                after,
            } => {
                let selection = DlqSelection {
                    queue,
                    tenant,
                    error_contains,
                    since_secs,
                    ..DlqSelection::default()
                };
                self.jobs_list(&selection, state, limit, after).await
            }
            Request::JobsShow { id } => self.show(&id, false).await,
            Request::DlqShow { id } => self.show(&id, true).await,
            Request::JobsRelease { id } => self.release(&id, peer, req_op).await,
            Request::JobsTree {
                id,
                parents,
                max_depth,
                max_nodes,
            } => self.tree(&id, parents, max_depth, max_nodes).await,
            Request::JobsCancel {
                id,
                keep_dependents,
            } => {
                let id = parse_id(&id)?;
                let previous = match broker::request(|tx| BrokerMsg::Cancel(id, by, tx), CALL)
                    .await?
                {
                    Err(BrokerError::UnknownJob(_)) => return Err(self.not_cancellable(id).await),
                    other => other?,
                };
                if previous == State::Leased {
                    self.revoke(id);
                }
                audit::change(
                    peer,
                    req_op,
                    &format!("job {id}"),
                    previous.as_str(),
                    "cancelled",
                );
                let dependents = if keep_dependents {
                    Vec::new()
                } else {
                    self.cancel_dependents(id, peer, req_op).await?
                };
                Ok(Response::Cancelled {
                    id: id.to_string(),
                    previous_state: previous.to_string(),
                    dependents,
                })
            }
            Request::Enqueue {
                queue,
                tenant,
                key,
                delay_ms,
                max_attempts,
                priority,
                payload,
                after,
                after_policy,
            } => {
                self.queue_exists(&queue)?;
                let after =
                    crate::deps::parse_after((!after.is_empty()).then_some(after), after_policy)
                        .map_err(|e| err(ErrorCode::BadRequest, e))?;
                let payload = payload
                    .into_bytes()
                    .map_err(|e| err(ErrorCode::BadRequest, e))?;
                let delayed = delay_ms.is_some_and(|d| d > 0);
                let req = EnqueueRequest {
                    queue,
                    tenant,
                    payload,
                    idempotency_key: key,
                    delay: Duration::from_millis(delay_ms.unwrap_or(0)),
                    max_attempts,
                    priority_ms: match priority.as_deref() {
                        Some(text) => crate::priority::parse_priority(text)
                            .map_err(|e| err(ErrorCode::BadRequest, e))?,
                        None => 0,
                    },
                    after,
                };
                let what = format!("queue {}", req.queue);
                let done = broker::request(|tx| BrokerMsg::Enqueue(req, tx), CALL).await??;
                if !done.duplicate {
                    let state = if delayed { "delayed" } else { "ready" };
                    let job = format!("{what} job {}", done.id);
                    audit::change(peer, req_op, &job, "-", state);
                }
                Ok(Response::Enqueued(qd_proto::Enqueued {
                    id: done.id.to_string(),
                    duplicate: done.duplicate,
                }))
            }
            Request::EnqueueBatch {
                queue,
                jobs,
                job_texts,
            } => {
                let jobs = batch_jobs(jobs, job_texts)?;
                self.enqueue_batch(queue, jobs, peer, req_op).await
            }
            Request::DlqList {
                selection,
                limit,
                after,
            } => self.dlq_list(&selection, limit, after).await,
            Request::DlqRedrive {
                selection,
                dry_run,
                payload: Some(payload),
                ..
            } => {
                let id = one_id(&selection, dry_run)?;
                let payload = payload
                    .into_bytes()
                    .map_err(|e| err(ErrorCode::BadRequest, e))?;
                let summary = store::payload_summary(&payload);
                match broker::request(
                    |tx| BrokerMsg::RedriveWithPayload(id, payload, by, tx),
                    CALL,
                )
                .await?
                {
                    Err(BrokerError::UnknownJob(_)) => return Err(self.not_dead(id).await),
                    other => other?,
                }
                let after = format!("ready, payload {summary}");
                audit::change(peer, req_op, &format!("job {id}"), "dead", &after);
                let moved = broker::BatchOutcome {
                    moved: vec![id],
                    refused: Vec::new(),
                };
                Ok(Response::Redrive(views::redrive(moved, false)))
            }
            Request::DlqRedrive {
                selection,
                dry_run,
                batch_size,
                rate_per_sec,
                payload: None,
            } => {
                selection
                    .check_mutation()
                    .and_then(|()| qd_proto::check_pace(batch_size, rate_per_sec))
                    .map_err(|e| err(ErrorCode::BadRequest, e))?;
                self.queue_filter(selection.queue.as_deref())?;
                let sel = selection_of(&selection)?;
                let pace = Pace::new(batch_size, rate_per_sec);
                let outcome = self
                    .batched(sel, dry_run, pace, |s, dry, tx| {
                        DlqMsg::Redrive(s, by.clone(), dry, tx)
                    })
                    .await?;
                if !dry_run {
                    audit::jobs(peer, req_op, &outcome.moved, "dead", "ready");
                }
                Ok(Response::Redrive(views::redrive(outcome, dry_run)))
            }
            Request::DlqPurge {
                selection,
                dry_run,
                cascade,
                release,
            } => {
                self.purge(&selection, dry_run, (cascade, release), peer, req_op)
                    .await
            }
            Request::LimitsShow {} => Ok(self.limits()),
            Request::LimitsSet {
                tenant,
                weight,
                max_concurrency,
                max_depth,
            } => {
                crate::broker::check_name("tenant", &tenant)?;
                if weight == Some(0) {
                    return Err(err(ErrorCode::BadRequest, "weight must be at least 1"));
                }
                let mut changes = Vec::new();
                let fields = [
                    ("weight", weight.map(u64::from)),
                    ("max_concurrency", max_concurrency.map(u64::from)),
                    ("max_depth", max_depth),
                ];
                for (key, value) in fields {
                    if let Some(v) = value {
                        changes.push(("tenant", tenant.clone(), key, Some(v.to_string())));
                    }
                }
                self.set_overrides(peer, req_op, changes).await
            }
            Request::LimitsReset {
                tenant,
                queue,
                limiter,
            } => {
                let changes = match (tenant, queue, limiter) {
                    (Some(t), None, None) => ["weight", "max_concurrency", "max_depth"]
                        .map(|k| ("tenant", t.clone(), k, None))
                        .to_vec(),
                    (None, Some(q), None) => {
                        self.queue_exists(&q)?;
                        ["workers_min", "workers_max", "paused"]
                            .map(|k| ("queue", q.clone(), k, None))
                            .to_vec()
                    }
                    (None, None, Some(l)) => {
                        self.limiter_exists(&l)?;
                        ["per_second", "burst"]
                            .map(|k| ("limiter", l.clone(), k, None))
                            .to_vec()
                    }
                    _ => {
                        return Err(err(
                            ErrorCode::BadRequest,
                            "give exactly one of tenant, queue or limiter",
                        ));
                    }
                };
                self.set_overrides(peer, req_op, changes).await
            }
            Request::LimiterSet {
                limiter,
                per_second,
                burst,
            } => {
                self.limiter_exists(&limiter)?;
                if per_second == Some(0) || burst == Some(0) {
                    return Err(err(
                        ErrorCode::BadRequest,
                        "per_second and burst must be at least 1",
                    ));
                }
                let changes: Vec<_> = [("per_second", per_second), ("burst", burst)]
                    .into_iter()
                    .filter_map(|(key, v)| {
                        Some(("limiter", limiter.clone(), key, Some(v?.to_string())))
                    })
                    .collect();
                if changes.is_empty() {
                    return Err(err(ErrorCode::BadRequest, "give per_second or burst"));
                }
                self.set_overrides(peer, req_op, changes).await
            }
            Request::WorkersSet { queue, min, max } => {
                self.queue_exists(&queue)?;
                if !self.daemon.executors.has(&queue) {
                    return Err(err(
                        ErrorCode::BadRequest,
                        format!("queue {queue:?} has no worker pool (external workers)"),
                    ));
                }
                if min > max || max == 0 || max > MAX_WORKERS {
                    return Err(err(
                        ErrorCode::BadRequest,
                        format!(
                            "need 0 <= min <= max, 1 <= max <= {MAX_WORKERS}; got min {min}, max {max}"
                        ),
                    ));
                }
                let changes = vec![
                    ("queue", queue.clone(), "workers_min", Some(min.to_string())),
                    ("queue", queue, "workers_max", Some(max.to_string())),
                ];
                self.set_overrides(peer, req_op, changes).await
            }
            Request::QueuePause { queue } => {
                self.queue_exists(&queue)?;
                let changes = vec![("queue", queue, "paused", Some("true".into()))];
                self.set_overrides(peer, req_op, changes).await
            }
            Request::JobsPayload { id } => self.jobs_payload(&id).await,
            Request::JobsResult { id } => self.jobs_result(&id).await,
            Request::DlqExport {
                selection,
                limit,
                after,
            } => self.dlq_export(&selection, limit, after).await,
            Request::Top { tenants_of } => self.top(tenants_of).await,
            Request::QueueResume { queue } => {
                self.queue_exists(&queue)?;
                let changes = vec![("queue", queue, "paused", None)];
                self.set_overrides(peer, req_op, changes).await
            }
            Request::Backup { path, force } => ops::backup(&self.daemon, path, force, &by).await,
            Request::Reload {} => ops::reload(&self.daemon, &by).await,
            Request::SchedulesList {} => schedules::list(&self.daemon).await,
            Request::SchedulesPause { name } => {
                schedules::set_paused(&self.daemon, peer, req_op, &name, true).await
            }
            Request::SchedulesResume { name } => {
                schedules::set_paused(&self.daemon, peer, req_op, &name, false).await
            }
            Request::SchedulesTrigger { name } => {
                schedules::trigger(&self.daemon, peer, req_op, &name).await
            }
        }
    }
}

/// Daemon-side batching of a bulk redrive or purge: each batch is one atomic write;
/// `rate` (jobs per second) spaces them out so a redrive cannot become a retry storm.
struct Pace {
    batch: usize,
    rate: Option<f64>,
}

impl Pace {
    /// A pace already checked by [`qd_proto::check_pace`] (the clamp and filter only
    /// keep this total).
    fn new(batch: Option<u32>, rate: Option<f64>) -> Self {
        Pace {
            batch: batch.unwrap_or(100).clamp(1, qd_proto::MAX_REDRIVE_BATCH) as usize,
            rate: rate
                .filter(|r| (qd_proto::MIN_REDRIVE_RATE..=qd_proto::MAX_REDRIVE_RATE).contains(r)),
        }
    }

    async fn wait(&self, moved: usize) {
        if let Some(rate) = self.rate {
            tokio::time::sleep(Duration::from_secs_f64(moved as f64 / rate)).await;
        }
    }
}

async fn dlq_call<T: Send + 'static>(
    build: impl FnOnce(ractor::RpcReplyPort<Result<T, BrokerError>>) -> DlqMsg,
) -> Result<T, ErrorBody> {
    let dlq = ActorRef::<DlqMsg>::where_is(dlq::NAME)
        .ok_or_else(|| err(ErrorCode::Unavailable, "the dlq actor is restarting; retry"))?;
    match dlq.call(build, Some(Duration::from_secs(120))).await {
        Ok(ractor::rpc::CallResult::Success(r)) => Ok(r?),
        _ => Err(err(
            ErrorCode::Unavailable,
            "the dlq actor did not answer; retry",
        )),
    }
}

/// One job of an `enqueue_batch`: an object, or its JSON text (kept as written).
enum BatchJob {
    Object(serde_json::Value),
    Text(String),
}

impl BatchJob {
    /// The job's body, parsed as the HTTP API parses one.
    fn body(self) -> Result<JobBody, serde_json::Error> {
        match self {
            BatchJob::Object(job) => serde_json::from_value(job),
            BatchJob::Text(text) => serde_json::from_str(&text),
        }
    }
}

/// The jobs of an `enqueue_batch`, from `jobs` or `job_texts` (not both).
fn batch_jobs(
    jobs: Vec<serde_json::Value>,
    texts: Vec<String>,
) -> Result<Vec<BatchJob>, ErrorBody> {
    match (jobs.is_empty(), texts.is_empty()) {
        (false, false) => Err(err(
            ErrorCode::BadRequest,
            "give the jobs as jobs or as job_texts, not both",
        )),
        (_, true) => Ok(jobs.into_iter().map(BatchJob::Object).collect()),
        (true, false) => Ok(texts.into_iter().map(BatchJob::Text).collect()),
    }
}

/// A tenant filter must be a name a tenant can have: one that cannot match any job
/// is a `bad_request` naming it, not an empty listing or a redrive of nothing.
fn tenant_filter(tenant: Option<&str>) -> Result<(), ErrorBody> {
    tenant.map_or(Ok(()), |t| Ok(broker::check_name("tenant", t)?))
}

/// The DLQ actor's form of a redrive's or purge's selection: ids parsed, each once.
/// Errors: `bad_request` for a malformed id or a tenant filter no tenant can have.
fn selection_of(sel: &DlqSelection) -> Result<Selection, ErrorBody> {
    tenant_filter(sel.tenant.as_deref())?;
    let mut ids: Vec<JobId> = Vec::with_capacity(sel.ids.len());
    for id in &sel.ids {
        let id = parse_id(id)?;
        // The same id twice is one job: it moves once and is counted once.
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(Selection {
        ids,
        queue: sel.queue.clone(),
        tenant: sel.tenant.clone(),
        error_contains: sel.error_contains.clone(),
        since: sel.since_secs.map(since_ms),
        all: sel.all,
    })
}

/// The Unix ms `secs` seconds ago (a `since_secs` filter's bound).
fn since_ms(secs: u64) -> crate::job::UnixMillis {
    crate::clock::wall_ms() - i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX / 2)
}

impl From<BatchError> for ErrorBody {
    fn from(e: BatchError) -> Self {
        let message = e.to_string();
        let index = e.index;
        ErrorBody {
            message,
            index,
            ..ErrorBody::from(e.error)
        }
    }
}

impl Handler {
    /// `enqueue_batch`: job objects of the HTTP shape ([`JobBody`]), all or nothing
    /// in one commit. Errors name the job in `index` (`bad_request` for a malformed
    /// one, the Broker's refusal otherwise).
    async fn enqueue_batch(
        &self,
        queue: String,
        jobs: Vec<BatchJob>,
        author: &Author,
        op: &str,
    ) -> Result<Response, ErrorBody> {
        self.queue_exists(&queue)?;
        broker::check_batch_len(jobs.len())?;
        let max_payload = self.daemon.config().daemon.max_payload;
        let mut bodies = Vec::with_capacity(jobs.len());
        for (index, job) in jobs.into_iter().enumerate() {
            let body = job.body().map_err(|e| BatchError {
                index: Some(index),
                error: BrokerError::Invalid(e.to_string()),
            })?;
            bodies.push(body);
        }
        let reqs =
            crate::api::batch_requests(bodies, crate::api::BatchQueues::Path(&queue), max_payload)?;
        let done = broker::request(|tx| BrokerMsg::EnqueueBatch(reqs, tx), CALL).await??;
        let new: Vec<JobId> = done.iter().filter(|e| !e.duplicate).map(|e| e.id).collect();
        audit::jobs(author, op, &new, "-", &format!("enqueued in queue {queue}"));
        let jobs = done
            .into_iter()
            .map(|e| qd_proto::Enqueued {
                id: e.id.to_string(),
                duplicate: e.duplicate,
            })
            .collect();
        Ok(Response::EnqueuedBatch { jobs })
    }

    fn limiter_exists(&self, name: &str) -> Result<(), ErrorBody> {
        if self.daemon.limiters.get(name).is_some() {
            Ok(())
        } else {
            Err(err(
                ErrorCode::NotFound,
                format!("no [rate_limiters.{name}] in the config"),
            ))
        }
    }

    /// `not_found` naming the configured queues unless `queue` is one of them:
    /// `unknown queue "dmeo" (known: demo, echo, hooks)`.
    fn queue_exists(&self, queue: &str) -> Result<(), ErrorBody> {
        let config = self.daemon.config();
        let queues = &config.queues;
        if queues.contains_key(queue) {
            return Ok(());
        }
        let known: Vec<&str> = queues.keys().map(String::as_str).collect();
        Err(err(
            ErrorCode::NotFound,
            format!("unknown queue {queue:?} (known: {})", known.join(", ")),
        ))
    }

    /// [`Handler::queue_exists`] for an optional filter: a typo in `--queue` is an
    /// error, never an empty answer.
    fn queue_filter(&self, queue: Option<&str>) -> Result<(), ErrorBody> {
        queue.map_or(Ok(()), |q| self.queue_exists(q))
    }

    /// Cancels the unfinished transitive dependents of `root` (`deps.rs`), each
    /// through the Broker as an operator's cancel, in id order (parents before
    /// children: ids are time-ordered and a child names only earlier jobs);
    /// answers the ids cancelled. One that finished meanwhile is skipped.
    async fn cancel_dependents(
        &self,
        root: JobId,
        author: &Author,
        req_op: &str,
    ) -> Result<Vec<String>, ErrorBody> {
        let ids = self
            .daemon
            .store
            .run(move |b| b.dependents(root))
            .await
            .map_err(BrokerError::from)?;
        let mut cancelled = Vec::new();
        for id in ids {
            let by = format!("{author} (cascade from {root})");
            match broker::request(|tx| BrokerMsg::Cancel(id, by, tx), CALL).await? {
                Ok(previous) => {
                    if previous == State::Leased {
                        self.revoke(id);
                    }
                    audit::change(
                        author,
                        req_op,
                        &format!("job {id}"),
                        previous.as_str(),
                        "cancelled",
                    );
                    cancelled.push(id.to_string());
                }
                Err(BrokerError::UnknownJob(_) | BrokerError::Transition(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(cancelled)
    }

    /// One stored job with payload and history; `not_found` when there is none.
    async fn stored(&self, id: &str) -> Result<StoredJob, ErrorBody> {
        let id = parse_id(id)?;
        let detail = self
            .daemon
            .store
            .run(move |b| b.job(id))
            .await
            .map_err(BrokerError::from)?;
        detail.ok_or_else(|| ErrorBody::from(BrokerError::UnknownJob(id)))
    }

    /// Why the broker, which holds only unfinished jobs, did not know `id`: a finished
    /// (succeeded or cancelled) job is a `conflict` naming its state, else `not_found`.
    /// Tells every pool that job `id` was cancelled while leased: the one whose worker
    /// runs it stops the attempt (an external lessee learns it from its next call).
    fn revoke(&self, id: JobId) {
        for queue in self.daemon.config().queues.keys() {
            if let Some(pool) = ActorRef::<PoolMsg>::where_is(worker_pool::name(queue)) {
                let _ = pool.cast(PoolMsg::Revoke(id));
            }
        }
    }

    /// Why a job the Broker does not hold (it only holds unfinished and dead jobs)
    /// cannot be redriven: `conflict` naming its state if the store has it (a
    /// succeeded or cancelled job), else `not_found`.
    async fn not_dead(&self, id: JobId) -> ErrorBody {
        match self.stored(&id.to_string()).await {
            Ok(d) => err(
                ErrorCode::Conflict,
                format!("job {id} is {}, not dead", d.job.state),
            ),
            Err(e) => e,
        }
    }

    async fn not_cancellable(&self, id: JobId) -> ErrorBody {
        match self.stored(&id.to_string()).await {
            Ok(d) => err(
                ErrorCode::Conflict,
                format!(
                    "job {id} is {}; only ready, delayed, leased or dead jobs can be cancelled",
                    d.job.state
                ),
            ),
            Err(e) => e,
        }
    }

    async fn queues(&self) -> Vec<qd_proto::QueueInfo> {
        let counts = broker::request(BrokerMsg::Counts, CALL)
            .await
            .unwrap_or_default();
        let held = self.held_depths().await;
        let mut out = Vec::new();
        for (name, qcfg) in &self.daemon.config().queues {
            let sched = broker::dispatch_stats(name, Duration::from_secs(5))
                .await
                .unwrap_or_default();
            let pool = match ActorRef::<PoolMsg>::where_is(worker_pool::name(name)) {
                Some(p) => ractor::call_t!(p, PoolMsg::Stats, 5000).unwrap_or_default(),
                None => Default::default(),
            };
            let (min, max) = self.daemon.limits.workers(name, &qcfg.workers);
            let mut c = counts.get(name.as_str()).copied().unwrap_or_default();
            if let Some(held) = &held {
                let of = |state: State| {
                    held.iter()
                        .filter(|(q, s, _)| q == name && *s == state)
                        .map(|(_, _, n)| n)
                        .sum()
                };
                c.held_waiting = of(State::Waiting);
                c.held_blocked = of(State::Blocked);
            }
            out.push(views::queue(
                name,
                &sched,
                &c,
                &pool,
                (min, max),
                self.daemon.limits.paused(name),
            ));
        }
        out
    }

    /// On a shared store, the cluster's waiting and blocked jobs per queue, which
    /// no node's memory holds (`SharedStore::held_depths`); `None` on a local
    /// store, whose Broker counts them, or when the read fails (memory's counts
    /// are shown then).
    async fn held_depths(&self) -> Option<Vec<(String, State, u64)>> {
        if self.daemon.store.leases_are_local() {
            return None;
        }
        let read = self
            .daemon
            .store
            .run(|b| match b.shared() {
                Some(shared) => shared.held_depths(),
                None => Ok(Vec::new()),
            })
            .await;
        read.inspect_err(|e| tracing::warn!(error = %e, "Reading the cluster's held jobs failed."))
            .ok()
    }

    fn limits(&self) -> Response {
        Response::Limits(views::limits(&self.daemon))
    }

    /// Stores overrides (durable first), applies them, tells the enforcing actors,
    /// and writes one audit line per changed scope with its values before and after.
    async fn set_overrides(
        &self,
        peer: &Author,
        op: &'static str,
        changes: Vec<(&'static str, String, &'static str, Option<String>)>,
    ) -> Result<Response, ErrorBody> {
        let mut scopes: Vec<(&'static str, String)> = Vec::new();
        for (scope, name, _, _) in &changes {
            if !scopes.iter().any(|(s, n)| s == scope && n == name) {
                scopes.push((scope, name.clone()));
            }
        }
        let before: Vec<String> = scopes
            .iter()
            .map(|(s, n)| audit::scope_state(&self.daemon, s, n))
            .collect();
        let stored = changes.clone();
        self.daemon
            .store
            .run(move |b| {
                for (scope, name, key, value) in &stored {
                    b.set_override(scope, name, key, value.as_deref())?;
                }
                Ok(())
            })
            .await
            .map_err(BrokerError::from)?;
        for (scope, name, key, value) in changes {
            self.daemon.limits.set(scope, &name, key, value);
        }
        self.daemon.limits_changed();
        for ((scope, name), before) in scopes.iter().zip(before) {
            let after = audit::scope_state(&self.daemon, scope, name);
            audit::change(peer, op, &audit::scope_name(scope, name), &before, &after);
        }
        Ok(self.limits())
    }

    /// Resolves a selection (a dry run), then applies `msg` batch by batch at `pace`.
    async fn batched(
        &self,
        sel: Selection,
        dry_run: bool,
        pace: Pace,
        msg: impl Fn(
            Selection,
            bool,
            ractor::RpcReplyPort<Result<broker::BatchOutcome, BrokerError>>,
        ) -> DlqMsg,
    ) -> Result<broker::BatchOutcome, ErrorBody> {
        let resolved = dlq_call(|tx| msg(sel, true, tx)).await?;
        if dry_run {
            return Ok(resolved);
        }
        let mut total = broker::BatchOutcome {
            moved: Vec::new(),
            refused: resolved.refused,
        };
        let batches: Vec<Vec<JobId>> = resolved
            .moved
            .chunks(pace.batch)
            .map(<[JobId]>::to_vec)
            .collect();
        for (n, ids) in batches.into_iter().enumerate() {
            if n > 0 {
                pace.wait(pace.batch).await;
            }
            let batch = Selection {
                ids,
                ..Selection::default()
            };
            let outcome = dlq_call(|tx| msg(batch, false, tx)).await?;
            total.moved.extend(outcome.moved);
            total.refused.extend(outcome.refused);
        }
        Ok(total)
    }
}
