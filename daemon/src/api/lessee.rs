//! External worker endpoints: lease (long poll), heartbeat, ack, nack, batch acks.
//!
//! Only queues with `executor = { kind = "external" }` are leased over HTTP; their
//! jobs go through the same dispatch (fairness, caps, rate limits) and Broker
//! (fencing tokens, lease deadlines, retries, DLQ) as in-process workers' jobs. A
//! stale or unknown token gets 409 `stale_token` with the job's current state (also
//! for a job that has finished and left the Broker's memory, or whose lease another
//! node ended in a shared store: the store answers). On a shared store any node
//! answers a report for any lease (see `broker/state/elsewhere.rs`).
//! Every endpoint needs the `work` role; for a token limited to some queues, the
//! per-job endpoints look the job's queue up in the store. A lease answer carries
//! each job's parents (`after`) with their results, read in one store read.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::auth::{Caller, Role};
use super::body::JsonBody;
use super::params::ApiPath;
use super::producer::{parse_id, parse_seconds_or_duration};
use super::{ApiArgs, ApiError};
use crate::broker::{self, BrokerError, BrokerMsg, LeaseRequest, LeasedJob, MAX_WAIT};
use crate::executor::ExecutorSpec;
use crate::executor::OUTPUT_LIMIT;
use crate::executor::http::MAX_RETRY_AFTER;
use crate::job::{Failure, JobId, Token};
use crate::results::ParentBody;

/// The most jobs one lease request may take.
pub const MAX_JOBS: u32 = 1000;
/// The most acks one `POST /v1/acks` may carry.
pub const MAX_ACKS: usize = 1000;
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LeaseBody {
    worker_id: String,
    #[serde(default = "one")]
    max_jobs: u32,
    #[serde(default)]
    wait: Option<Value>,
}

fn one() -> u32 {
    1
}

/// `POST /v1/queues/{queue}/leases`.
pub async fn lease(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    ApiPath(queue): ApiPath<String>,
    JsonBody(body): JsonBody<LeaseBody>,
) -> Result<Json<LeaseAnswer>, ApiError> {
    caller.allow(Role::Work, &queue)?;
    let config = args.config();
    let qcfg = config
        .queues
        .get(&queue)
        .ok_or_else(|| ApiError::from(broker::BrokerError::UnknownQueue(queue.clone())))?;
    if qcfg.executor != ExecutorSpec::External {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_external",
            format!(
                "queue {queue:?} is run by qd's own workers; only kind = \"external\" queues are leased over HTTP"
            ),
        ));
    }
    if body.worker_id.is_empty() || body.worker_id.len() > 128 {
        return Err(ApiError::bad_request("worker_id must be 1 to 128 bytes"));
    }
    if body.max_jobs == 0 || body.max_jobs > MAX_JOBS {
        return Err(ApiError::bad_request(format!(
            "max_jobs must be between 1 and {MAX_JOBS}"
        )));
    }
    let wait = parse_wait(body.wait)?;
    let request = LeaseRequest {
        worker: body.worker_id,
        max_jobs: body.max_jobs,
        wait,
    };
    let jobs = broker::lease(&queue, request).await?;
    let parents = parents_of(&args, &jobs).await?;
    Ok(Json(LeaseAnswer {
        jobs: jobs
            .into_iter()
            .zip(parents)
            .map(|(job, parents)| LeasedBody::of(job, parents))
            .collect(),
    }))
}

/// The parents of each of `jobs`, just leased, in one store read. If the read
/// fails the leases are given back uncharged (interrupted), so the jobs are
/// handed out again with their parents rather than without them, and the
/// store's error is the answer.
async fn parents_of(
    args: &ApiArgs,
    jobs: &[LeasedJob],
) -> Result<Vec<Vec<crate::store::ParentView>>, ApiError> {
    if jobs.is_empty() || !args.store.may_hold_parents() {
        return Ok(vec![Vec::new(); jobs.len()]);
    }
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    match args.store.run(move |b| b.parents_of(&ids)).await {
        Ok(parents) => Ok(parents),
        Err(err) => {
            for job in jobs {
                let (id, token) = (job.id, job.token);
                let failure = Failure::Interrupted {
                    reason: format!("the job's parents could not be read: {err}"),
                };
                let _ =
                    broker::request(|tx| BrokerMsg::Nack(id, token, failure, tx), REPORT_TIMEOUT)
                        .await;
            }
            Err(err.into())
        }
    }
}

/// A lease's answer: `{"jobs": [...]}`, possibly empty.
#[derive(Serialize)]
pub(super) struct LeaseAnswer {
    jobs: Vec<LeasedBody>,
}

fn parse_wait(value: Option<Value>) -> Result<Duration, ApiError> {
    let wait = parse_seconds_or_duration("wait", value)?;
    if wait > MAX_WAIT {
        return Err(ApiError::bad_request("wait must be at most 30s"));
    }
    Ok(wait)
}

/// One leased job as a lease answer lists it (typed, so a lease of many jobs
/// builds no map per job; the keys are in the order `serde_json` prints a map's).
#[derive(Serialize)]
struct LeasedBody {
    attempt: u32,
    /// Lease deadline, Unix ms.
    deadline: i64,
    id: JobId,
    idempotency_key: String,
    lease_seconds: f64,
    /// The job's parents (`after`), with their results; absent for a job without.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    parents: Vec<ParentBody>,
    /// The payload as text when it is UTF-8, else `null`.
    payload: Option<String>,
    payload_b64: String,
    queue: Arc<str>,
    /// The schedule and tick of a job a schedule enqueued (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    schedule: Option<crate::schedule::JobSchedule>,
    tenant: Arc<str>,
    token: Token,
}

impl LeasedBody {
    fn of(job: LeasedJob, parents: Vec<crate::store::ParentView>) -> Self {
        let payload_b64 = base64::engine::general_purpose::STANDARD.encode(&job.payload);
        LeasedBody {
            schedule: crate::schedule::JobSchedule::of_key(&job.idempotency_key),
            attempt: job.attempt,
            deadline: job.deadline_ms,
            id: job.id,
            idempotency_key: job.idempotency_key,
            lease_seconds: job.lease.as_secs_f64(),
            parents: ParentBody::list(parents),
            payload: String::from_utf8(job.payload).ok(),
            payload_b64,
            queue: job.queue,
            tenant: job.tenant,
            token: job.token,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HeartbeatBody {
    token: Token,
    extend: Option<Value>,
}

/// Checks that `caller` may work job `id`: the `work` role, and the job's queue when
/// the token is limited to some queues (one store read; 404 if there is no such job).
async fn authorize_job(args: &ApiArgs, caller: &Caller, id: JobId) -> Result<(), ApiError> {
    caller.require(Role::Work)?;
    if caller.every_queue() {
        return Ok(());
    }
    let queue = args
        .store
        .run(move |b| Ok(b.job(id)?.map(|d| d.job.queue)))
        .await?;
    match queue {
        Some(queue) => caller.allow_queue(&queue),
        None => Err(BrokerError::UnknownJob(id).into()),
    }
}

/// Sends one lease report (heartbeat, ack, nack) for job `id` to the Broker. A job
/// the Broker no longer holds but the store does (it finished, or another node ended
/// the lease and the store refused the report's write) gets 409 `stale_token` with
/// its state, as any other stale report does.
async fn report<T: Send + 'static>(
    args: &ApiArgs,
    id: JobId,
    build: impl FnOnce(ractor::RpcReplyPort<Result<T, BrokerError>>) -> BrokerMsg,
) -> Result<T, ApiError> {
    match broker::request(build, REPORT_TIMEOUT).await.and_then(|r| r) {
        Ok(v) => Ok(v),
        Err(err) => Err(explain(args, id, err).await?),
    }
}

/// `text` cut to at most `max` bytes at a character boundary: a nack's error is kept
/// to the 4 KiB a history entry holds, however many bytes its characters take.
fn cut_to(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = (0..=max)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(end);
    }
    text
}

/// A heartbeat's `extend`: more than zero (a zero extension would end the lease at
/// once and charge the attempt; a worker giving a job back nacks it) and at most
/// [`broker::MAX_EXTEND`]. Errors: a 400 naming the value.
fn parse_extend(value: Option<Value>) -> Result<Duration, ApiError> {
    let extend = parse_seconds_or_duration("extend", value)?;
    if extend.is_zero() || extend > broker::MAX_EXTEND {
        return Err(ApiError::bad_request(format!(
            "extend must be more than 0s and at most {}, got {}; to give the job back, nack it",
            humantime::format_duration(broker::MAX_EXTEND),
            humantime::format_duration(extend)
        )));
    }
    Ok(extend)
}

/// `POST /v1/jobs/{id}/heartbeat`.
pub async fn heartbeat(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    JsonBody(body): JsonBody<HeartbeatBody>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    authorize_job(&args, &caller, id).await?;
    let extend = match body.extend {
        None | Some(Value::Null) => None,
        v => Some(parse_extend(v)?),
    };
    let info = report(&args, id, |tx| {
        BrokerMsg::Heartbeat(id, body.token, extend, tx)
    })
    .await?;
    Ok(Json(json!({ "id": id, "deadline": info.deadline_ms })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AckBody {
    token: Token,
    /// The job's result as text (stored as its UTF-8 bytes).
    result: Option<String>,
    /// The job's result as standard base64, for bytes that are not text.
    result_b64: Option<String>,
}

impl AckBody {
    /// The result the ack carries, decoded; 400 naming the field when both are
    /// given or the base64 is bad.
    fn result(self) -> Result<Option<Arc<[u8]>>, ApiError> {
        match (self.result, self.result_b64) {
            (Some(_), Some(_)) => Err(ApiError::bad_request("give result or result_b64, not both")),
            (Some(text), None) => Ok(Some(Arc::from(text.into_bytes()))),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map(|bytes| Some(Arc::from(bytes)))
                .map_err(|e| ApiError::bad_request(format!("result_b64 is not valid base64: {e}"))),
            (None, None) => Ok(None),
        }
    }
}

/// `POST /v1/jobs/{id}/ack`.
pub async fn ack(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    JsonBody(body): JsonBody<AckBody>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    authorize_job(&args, &caller, id).await?;
    let token = body.token;
    match body.result()? {
        Some(result) => report(&args, id, |tx| BrokerMsg::AckResult(id, token, result, tx)).await?,
        None => report(&args, id, |tx| BrokerMsg::Ack(id, token, tx)).await?,
    }
    Ok(Json(json!({ "id": id, "state": "succeeded" })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AcksBody {
    acks: Vec<AckItem>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AckItem {
    id: String,
    token: Token,
}

/// `POST /v1/acks`: up to [`MAX_ACKS`] acks, durable in one commit, answered per
/// item in request order (`{"id", "ok": true}` or `{"id", "ok": false, "error",
/// "message", "state"?}`). A malformed id fails the whole request (400 naming its
/// index); so does a job whose queue the token may not work (403).
pub async fn acks(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<AcksBody>,
) -> Result<Json<AcksAnswer>, ApiError> {
    caller.require(Role::Work)?;
    if body.acks.is_empty() || body.acks.len() > MAX_ACKS {
        return Err(ApiError::bad_request(format!(
            "acks must hold 1 to {MAX_ACKS} items, got {}",
            body.acks.len()
        )));
    }
    let mut acks = Vec::with_capacity(body.acks.len());
    for (n, item) in body.acks.iter().enumerate() {
        let id = parse_id(&item.id)
            .map_err(|e| ApiError::bad_request(format!("acks[{n}]: {}", e.message)))?;
        acks.push((id, item.token));
    }
    for (id, _) in &acks {
        authorize_job(&args, &caller, *id).await?;
    }
    let ids: Vec<JobId> = acks.iter().map(|(id, _)| *id).collect();
    let answers = broker::request(|tx| BrokerMsg::AckBatch(acks, tx), REPORT_TIMEOUT).await??;
    let mut results = Vec::with_capacity(ids.len());
    for (id, answer) in ids.into_iter().zip(answers) {
        results.push(match answer {
            Ok(()) => AckResult {
                id,
                ok: true,
                error: None,
                message: None,
                state: None,
            },
            Err(err) => {
                let err = explain(&args, id, err).await?;
                AckResult {
                    id,
                    ok: false,
                    error: Some(err.code),
                    message: Some(err.message),
                    state: err.state,
                }
            }
        });
    }
    Ok(Json(AcksAnswer { results }))
}

/// A batch ack's answer: `{"results": [...]}`, one per ack in request order.
#[derive(Serialize)]
pub(super) struct AcksAnswer {
    results: Vec<AckResult>,
}

/// One item of a `POST /v1/acks` answer: `{"id", "ok": true}`, or `{"id", "ok":
/// false, "error", "message", "state"?}` (typed, so a batch builds no map per item).
#[derive(Serialize)]
struct AckResult {
    id: JobId,
    ok: bool,
    /// The refusal's code (`stale_token`, `not_found`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// The job's current state, for a lease that is over.
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<crate::job::State>,
}

/// The API error of a refused report for job `id`: a job the Broker no longer
/// holds but the store does (it finished, or another node ended the lease and the
/// store refused the report's write) is `stale_token` with its stored state.
async fn explain(args: &ApiArgs, id: JobId, err: BrokerError) -> Result<ApiError, ApiError> {
    if !matches!(err, BrokerError::UnknownJob(_)) {
        return Ok(err.into());
    }
    let stored = args
        .store
        .run(move |b| Ok(b.job(id)?.map(|d| d.job.state)))
        .await?;
    Ok(match stored {
        Some(state) => ApiError::stale(format!("job {id} is {state}; this lease is over"), state),
        None => err.into(),
    })
}

/// The kind of failure an external worker reports.
#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub(super) enum NackKind {
    Transient,
    Permanent,
    Throttled,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NackBody {
    token: Token,
    #[serde(default)]
    error: String,
    kind: Option<NackKind>,
    retry_after: Option<Value>,
}

/// `POST /v1/jobs/{id}/nack`.
pub async fn nack(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    JsonBody(body): JsonBody<NackBody>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    authorize_job(&args, &caller, id).await?;
    // Clamped like a webhook's Retry-After: an unbounded one would pause the queue's
    // shared rate limiter (and every queue sharing it) for good.
    let retry_after = match body.retry_after {
        None => None,
        v => Some(parse_seconds_or_duration("retry_after", v)?.min(MAX_RETRY_AFTER)),
    };
    let error = cut_to(body.error, OUTPUT_LIMIT);
    let failure = match body.kind.unwrap_or(NackKind::Transient) {
        NackKind::Transient => Failure::Transient { error, retry_after },
        NackKind::Permanent => Failure::Permanent { error },
        NackKind::Throttled => Failure::Throttled {
            retry_after: retry_after.unwrap_or(Duration::from_secs(1)),
            error,
        },
    };
    report(&args, id, |tx| BrokerMsg::Nack(id, body.token, failure, tx)).await?;
    Ok(Json(json!({ "id": id, "nacked": true })))
}
