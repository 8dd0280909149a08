//! Producer endpoints: enqueue a job or a batch of jobs, read a job's status and
//! history.
//!
//! `POST /v1/queues/{queue}/jobs` with a job object
//! `{"tenant"?, "payload" | "payload_b64", "idempotency_key"?, "delay"?, "max_attempts"?,
//! "priority"?}`
//! answers `202 {"id", "state"}` once the job is durable, or `200 {"id", "duplicate": true}`
//! when the idempotency key names an existing job with the same payload.
//! `POST /v1/queues/{queue}/jobs/batch` with `{"jobs": [job object, ...]}` (1 to
//! [`broker::MAX_BATCH_JOBS`]) enqueues them all in one commit or none: `202 {"jobs":
//! [{"id", "duplicate"}, ...]}` in request order; an error names the item
//! (`jobs[3]: ...`) and nothing is enqueued.
//! Batch items may carry a `"ref"` that later items name in `after`
//! ([`batch_requests`]); `POST /v1/jobs/batch` takes a `queue` per item.
//! `GET /v1/jobs/{id}` answers the job with its history as the history cap keeps it
//! (the first and last entries, `history_elided` counting those deleted between).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::auth::{Caller, Role};
use super::params::ApiPath;
use super::{ApiArgs, ApiError};
use crate::broker::{self, BatchError, BrokerError, BrokerMsg, EnqueueRequest};
use crate::clock::wall_ms;
use crate::config::Config;
use crate::job::{JobId, State as JobState};
use crate::metrics::RejectReason;
use crate::store::JobDetail;

/// How long an enqueue may wait for the broker and the group commit.
const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// A job object: the single enqueue's body, an item of a batch, a line of
/// `qctl enqueue --ndjson` (through the admin socket's `enqueue_batch`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobBody {
    tenant: Option<String>,
    payload: Option<Box<RawValue>>,
    payload_b64: Option<String>,
    idempotency_key: Option<String>,
    delay: Option<Value>,
    max_attempts: Option<u32>,
    priority: Option<Value>,
    after: Option<Vec<String>>,
    after_policy: Option<String>,
    /// A batch item's name for the `after` of later items of the same batch.
    #[serde(rename = "ref")]
    reference: Option<String>,
    /// The queue of an item of `POST /v1/jobs/batch` (the path names it elsewhere).
    queue: Option<String>,
}

/// The most bytes of a batch item's `ref`.
const MAX_REF_BYTES: usize = 128;

/// Where the items of a batch go.
#[derive(Clone, Copy, Debug)]
pub enum BatchQueues<'a> {
    /// Every item to this queue (`POST /v1/queues/{queue}/jobs/batch`, `qctl
    /// enqueue --ndjson`); an item may not name one.
    Path(&'a str),
    /// Each item to its own `queue` (`POST /v1/jobs/batch`).
    PerItem,
}

/// Validates a batch's job objects into broker requests, in order, resolving
/// `ref`s: an item may name a `ref` (1 to 128 bytes, not a job id, once per
/// batch), and a later item's `after` may name it in place of a job id, so a
/// fan-out and its finisher are one all-or-nothing enqueue. An `after` entry
/// that is an earlier item's `ref` is that item; otherwise it must be a job id.
///
/// Errors, naming the item by index (nothing of the batch is enqueued): as a
/// single enqueue's, plus a `ref` given twice or shaped like a job id, an
/// `after` naming a `ref` of the item itself or of a later item (a forward ref)
/// or one no item has (an unknown ref), the same `ref` twice in one `after`, more
/// than [`crate::deps::MAX_PARENTS`] parents in all, a `queue` missing
/// ([`BatchQueues::PerItem`]) or given where the path names it.
pub fn batch_requests(
    items: Vec<JobBody>,
    queues: BatchQueues<'_>,
    max_payload: usize,
) -> Result<Vec<EnqueueRequest>, BatchError> {
    let refused = |index: usize, message: String| BatchError {
        index: Some(index),
        error: invalid(message),
    };
    let mut refs: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (n, item) in items.iter().enumerate() {
        let Some(name) = item.reference.as_deref() else {
            continue;
        };
        if name.is_empty() || name.len() > MAX_REF_BYTES {
            return Err(refused(
                n,
                format!("ref must be 1 to {MAX_REF_BYTES} bytes"),
            ));
        }
        if name.parse::<JobId>().is_ok() {
            return Err(refused(
                n,
                format!("ref {name:?} is shaped like a job id; after could not tell them apart"),
            ));
        }
        if let Some(first) = refs.insert(name, n) {
            return Err(refused(
                n,
                format!("ref {name:?} is given twice in the batch, by jobs[{first}] and jobs[{n}]"),
            ));
        }
    }
    let refs: std::collections::HashMap<String, usize> =
        refs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let mut reqs = Vec::with_capacity(items.len());
    for (n, mut item) in items.into_iter().enumerate() {
        item.reference = None;
        let queue = match (queues, item.queue.take()) {
            (BatchQueues::Path(q), None) => q.to_owned(),
            (BatchQueues::Path(_), Some(_)) => {
                return Err(refused(
                    n,
                    "queue is named by the path; give a queue per item only to POST /v1/jobs/batch"
                        .into(),
                ));
            }
            (BatchQueues::PerItem, Some(q)) => q,
            (BatchQueues::PerItem, None) => {
                return Err(refused(
                    n,
                    "queue is required in each job of POST /v1/jobs/batch".into(),
                ));
            }
        };
        let mut earlier = Vec::new();
        if let Some(after) = item.after.take() {
            let given = after.len();
            let mut ids = Vec::with_capacity(given);
            for (i, entry) in after.into_iter().enumerate() {
                match refs.get(&entry) {
                    Some(&k) if k < n && earlier.contains(&k) => {
                        return Err(refused(n, format!("after names ref {entry:?} twice")));
                    }
                    Some(&k) if k < n => earlier.push(k),
                    Some(&k) if k == n => {
                        return Err(refused(
                            n,
                            format!("after names the job's own ref {entry:?}"),
                        ));
                    }
                    Some(&k) => {
                        return Err(refused(
                            n,
                            format!(
                                "after[{i}] names ref {entry:?} of jobs[{k}], which comes later in                                  the batch (a forward ref); a job may name only earlier jobs' refs"
                            ),
                        ));
                    }
                    None if entry.parse::<JobId>().is_ok() => ids.push(entry),
                    None => {
                        return Err(refused(
                            n,
                            format!(
                                "after[{i}] names unknown ref {entry:?}: no earlier job of the batch                                  has it, and it is not a job id"
                            ),
                        ));
                    }
                }
            }
            if given > crate::deps::MAX_PARENTS {
                return Err(refused(
                    n,
                    format!(
                        "after names {given} jobs; at most {} are allowed",
                        crate::deps::MAX_PARENTS
                    ),
                ));
            }
            // Only refs: no job id left to check, but the policy still is.
            item.after = (!ids.is_empty() || earlier.is_empty()).then_some(ids);
        }
        let mut req = item
            .into_request(&queue, None, max_payload)
            .map_err(|error| BatchError {
                index: Some(n),
                error,
            })?;
        req.after.refs = earlier;
        reqs.push(req);
    }
    Ok(reqs)
}

impl JobBody {
    /// Validates the job object into a broker request for `queue`; `header_key` is an
    /// `Idempotency-Key` header's value, used when the body gives no key.
    ///
    /// Errors: [`BrokerError::Invalid`] naming the field (payload missing or given
    /// twice, bad base64, bad delay, tenant, key or retry budget),
    /// [`BrokerError::PayloadTooLarge`] over `max_payload` decoded bytes.
    pub fn into_request(
        self,
        queue: &str,
        header_key: Option<String>,
        max_payload: usize,
    ) -> Result<EnqueueRequest, BrokerError> {
        if self.reference.is_some() {
            return Err(invalid(
                "ref names a job of a batch for the after of later jobs of the same batch; a single enqueue has none",
            ));
        }
        if self.queue.is_some() {
            return Err(invalid(
                "queue is named by the path; give a queue per job only to POST /v1/jobs/batch",
            ));
        }
        let payload = match (self.payload, self.payload_b64) {
            (Some(_), Some(_)) => return Err(invalid("give payload or payload_b64, not both")),
            (None, None) => return Err(invalid("payload or payload_b64 is required")),
            (Some(raw), None) => payload_bytes(&raw)?,
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| invalid(format!("payload_b64 is not valid base64: {e}")))?,
        };
        let delay = parse_seconds_or_duration("delay", self.delay)
            .map_err(|e| BrokerError::Invalid(e.message))?;
        let after = crate::deps::parse_after(self.after, self.after_policy).map_err(invalid)?;
        let req = EnqueueRequest {
            queue: queue.to_string(),
            tenant: self.tenant,
            payload,
            idempotency_key: self.idempotency_key.or(header_key),
            delay,
            max_attempts: self.max_attempts,
            priority_ms: priority_ms(self.priority)?,
            after,
        };
        broker::validate(&req, max_payload)?;
        Ok(req)
    }
}

/// A `payload` field's bytes: a JSON string's UTF-8 text, or any other JSON value's
/// text as sent, with the whitespace between its tokens removed. Numbers and key
/// order are kept as the producer wrote them (a parsed value would round a big
/// integer to a float and reorder keys, changing the payload and its idempotency
/// comparison).
fn payload_bytes(raw: &RawValue) -> Result<Vec<u8>, BrokerError> {
    let text = raw.get();
    if text.starts_with('"') {
        return serde_json::from_str::<String>(text)
            .map(String::into_bytes)
            .map_err(|e| invalid(format!("payload is not a valid JSON string: {e}")));
    }
    Ok(compact(text).into_bytes())
}

/// Valid JSON `text` without the whitespace outside its strings.
fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

/// A job object's `priority`: a signed duration string (`"10m"`, `"-5m"`); absent
/// or null is 0.
fn priority_ms(value: Option<Value>) -> Result<i64, BrokerError> {
    match value {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(text)) => crate::priority::parse_priority(&text).map_err(invalid),
        Some(other) => Err(invalid(format!(
            "priority must be a duration string like \"10m\" or \"-5m\", got {other}"
        ))),
    }
}

fn invalid(message: impl Into<String>) -> BrokerError {
    BrokerError::Invalid(message.into())
}

/// `POST /v1/queues/{queue}/jobs`.
pub async fn enqueue(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    ApiPath(queue): ApiPath<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.allow(Role::Produce, &queue)?;
    let config = args.config();
    let req = counted(&config, &queue, || {
        let max = config.daemon.max_payload;
        let body = body.map_err(|e| unreadable(e, |d| too_large(max, d)))?;
        known_queue(&config, &queue)?;
        parse_enqueue(&queue, &body, &headers, max)
    })?;
    authorize_parents(&args, &caller, std::slice::from_ref(&req), false).await?;
    let delayed = !req.delay.is_zero();
    let done = broker::request(|tx| BrokerMsg::Enqueue(req, tx), ENQUEUE_TIMEOUT).await??;
    if done.duplicate {
        return Ok((
            StatusCode::OK,
            Json(json!({ "id": done.id, "duplicate": true })),
        ));
    }
    let state = if delayed {
        JobState::Delayed
    } else {
        JobState::Ready
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "id": done.id, "state": state })),
    ))
}

/// `403 forbidden` unless `caller` may use the queue of every stored job that
/// `reqs` name in `after`, naming the first that it may not (the item's index in
/// a batch): a token limited to some queues cannot make its jobs wait on, and
/// read the results of, jobs of other queues. One store read, skipped for a
/// caller that may use every queue. An unknown parent is left to the Broker
/// (`400 unknown_dependency`).
async fn authorize_parents(
    args: &ApiArgs,
    caller: &Caller,
    reqs: &[EnqueueRequest],
    batch: bool,
) -> Result<(), ApiError> {
    if caller.every_queue() {
        return Ok(());
    }
    let named: Vec<(usize, JobId)> = reqs
        .iter()
        .enumerate()
        .flat_map(|(n, r)| r.after.parents.iter().map(move |id| (n, *id)))
        .collect();
    if named.is_empty() {
        return Ok(());
    }
    let ids: Vec<JobId> = named.iter().map(|(_, id)| *id).collect();
    let queues = args.store.run(move |b| b.queues_of(&ids)).await?;
    for ((n, id), queue) in named.into_iter().zip(queues) {
        let Some(queue) = queue else { continue };
        if let Err(mut err) = caller.allow_queue(&queue) {
            let item = if batch {
                format!("jobs[{n}]: ")
            } else {
                String::new()
            };
            err.message = format!(
                "{item}after names job {id} of queue {queue:?}, which this token may not use"
            );
            return Err(err);
        }
    }
    Ok(())
}

/// Runs an enqueue's checks before the Broker (body size, queue, parsing,
/// validation); a refusal counts once in `qd_enqueue_rejected_total{queue,reason}`
/// (`payload_too_large` for a 413, else `bad_request`; the queue `unknown` when it
/// is not configured). Refusals the Broker decides (full, shutting down, store) are
/// counted by the Broker, bodies declared over the limit by `api::refuse_oversized`.
fn counted<T>(
    config: &Config,
    queue: &str,
    checks: impl FnOnce() -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    checks().inspect_err(|err| {
        let reason = if err.status == StatusCode::PAYLOAD_TOO_LARGE {
            RejectReason::PayloadTooLarge
        } else {
            RejectReason::BadRequest
        };
        crate::metrics::enqueue_rejected(super::known_queue(config, queue), reason);
    })
}

/// `404 unknown_queue` for a queue the config does not name.
fn known_queue(config: &Config, queue: &str) -> Result<(), ApiError> {
    if config.queues.contains_key(queue) {
        Ok(())
    } else {
        Err(BrokerError::UnknownQueue(queue.to_owned()).into())
    }
}

/// A body that could not be read: too large (`too_large`), or broken on the wire
/// (bad chunked encoding, the client went away): `400`, not `413`.
fn unreadable(e: BytesRejection, too_large: impl FnOnce(String) -> ApiError) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large(e.to_string())
    } else {
        ApiError::bad_request(format!("cannot read the request body: {e}"))
    }
}

fn too_large(max: usize, detail: String) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("request body too large (max_payload is {max} bytes): {detail}"),
    )
}

/// Validates an enqueue body into a broker request.
fn parse_enqueue(
    queue: &str,
    body: &[u8],
    headers: &HeaderMap,
    max_payload: usize,
) -> Result<EnqueueRequest, ApiError> {
    let body: JobBody = super::body::parse_json(body)?;
    let header_key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().map(str::to_string))
        .transpose()
        .map_err(|_| ApiError::bad_request("Idempotency-Key header is not visible ASCII"))?;
    Ok(body.into_request(queue, header_key, max_payload)?)
}

/// A batch body with its jobs typed (`JobBody`) or raw (`Value`, to locate an error).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody<T> {
    jobs: Vec<T>,
}

/// `POST /v1/queues/{queue}/jobs/batch`.
pub async fn enqueue_batch(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    ApiPath(queue): ApiPath<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<BatchAnswer>), ApiError> {
    caller.allow(Role::Produce, &queue)?;
    let config = args.config();
    let reqs = counted(&config, &queue, || {
        let max = config.daemon.max_payload;
        let body = body.map_err(|e| unreadable(e, |d| batch_too_large(max, d)))?;
        known_queue(&config, &queue)?;
        if headers.contains_key("idempotency-key") {
            return Err(ApiError::bad_request(
                "the Idempotency-Key header does not apply to a batch: give each job its idempotency_key",
            ));
        }
        parse_batch(&queue, &body, max)
    })?;
    submit_batch(&args, &caller, reqs).await
}

/// The common end of both batch endpoints: the parents' queues checked against
/// the token, the batch enqueued all or nothing, each item's id answered in order.
async fn submit_batch(
    args: &ApiArgs,
    caller: &Caller,
    reqs: Vec<EnqueueRequest>,
) -> Result<(StatusCode, Json<BatchAnswer>), ApiError> {
    authorize_parents(args, caller, &reqs, true).await?;
    let done = broker::request(|tx| BrokerMsg::EnqueueBatch(reqs, tx), ENQUEUE_TIMEOUT)
        .await?
        .map_err(batch_error)?;
    let jobs: Vec<EnqueuedBody> = done
        .iter()
        .map(|e| EnqueuedBody {
            duplicate: e.duplicate,
            id: e.id,
        })
        .collect();
    Ok((StatusCode::ACCEPTED, Json(BatchAnswer { jobs })))
}

/// A batch enqueue's answer: `{"jobs": [...]}` in request order.
#[derive(Serialize)]
pub(super) struct BatchAnswer {
    jobs: Vec<EnqueuedBody>,
}

/// One job of a batch enqueue's answer (typed, so a batch builds no map per job).
#[derive(Serialize)]
struct EnqueuedBody {
    duplicate: bool,
    id: JobId,
}

/// The API error of a refused batch: the status the item alone would get, the
/// message naming the item.
fn batch_error(err: BatchError) -> ApiError {
    let message = err.to_string();
    let mut api = ApiError::from(err.error);
    api.message = message;
    api
}

/// Validates a batch body into broker requests: 1 to [`broker::MAX_BATCH_JOBS`]
/// job objects; the first bad item is named by its index.
fn parse_batch(
    queue: &str,
    body: &[u8],
    max_payload: usize,
) -> Result<Vec<EnqueueRequest>, ApiError> {
    let jobs = batch_items(body)?;
    batch_requests(jobs, BatchQueues::Path(queue), max_payload).map_err(batch_error)
}

/// A batch body's job objects, 1 to [`broker::MAX_BATCH_JOBS`]; the first item
/// that is not a job object is named by its index.
fn batch_items(body: &[u8]) -> Result<Vec<JobBody>, ApiError> {
    let jobs = match super::body::parse_json::<BatchBody<JobBody>>(body) {
        Ok(batch) => batch.jobs,
        Err(err) => return Err(locate_bad_item(body).unwrap_or(err)),
    };
    broker::check_batch_len(jobs.len())?;
    Ok(jobs)
}

/// `POST /v1/jobs/batch`: a batch whose jobs each name their `queue`, so a flow
/// across queues (a fan-out in one queue, its finisher in another) is one
/// all-or-nothing commit. The token must be allowed to produce on every queue
/// named; answers as `POST /v1/queues/{queue}/jobs/batch` does.
pub async fn enqueue_flow(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<BatchAnswer>), ApiError> {
    caller.require(Role::Produce)?;
    let config = args.config();
    let max = config.daemon.max_payload;
    let parsed = (|| {
        let body = body.map_err(|e| unreadable(e, |d| batch_too_large(max, d)))?;
        if headers.contains_key("idempotency-key") {
            return Err(ApiError::bad_request(
                "the Idempotency-Key header does not apply to a batch: give each job its idempotency_key",
            ));
        }
        let items = batch_items(&body)?;
        for (n, item) in items.iter().enumerate() {
            let Some(queue) = item.queue.as_deref() else {
                continue;
            };
            let named = |mut err: ApiError| {
                err.message = format!("jobs[{n}]: {}", err.message);
                err
            };
            known_queue(&config, queue).map_err(named)?;
            caller.allow_queue(queue).map_err(named)?;
        }
        batch_requests(items, BatchQueues::PerItem, max).map_err(batch_error)
    })();
    let reqs = parsed.inspect_err(|err| {
        let reason = if err.status == StatusCode::PAYLOAD_TOO_LARGE {
            RejectReason::PayloadTooLarge
        } else {
            RejectReason::BadRequest
        };
        crate::metrics::enqueue_rejected(None, reason);
    })?;
    submit_batch(&args, &caller, reqs).await
}

/// Why a batch body that is valid JSON with a `jobs` list did not read as job
/// objects: the size check, or the first item that is not a job object, by index.
fn locate_bad_item(body: &[u8]) -> Option<ApiError> {
    let batch: BatchBody<Value> = serde_json::from_slice(body).ok()?;
    if let Err(err) = broker::check_batch_len(batch.jobs.len()) {
        return Some(err.into());
    }
    batch.jobs.into_iter().enumerate().find_map(|(n, job)| {
        let err = match job {
            Value::Object(_) => serde_json::from_value::<JobBody>(job).err()?.to_string(),
            Value::Array(_) => "must be a job object {\"payload\": ...}, not an array".into(),
            _ => "must be a job object {\"payload\": ...}".into(),
        };
        Some(ApiError::bad_request(format!("jobs[{n}]: {err}")))
    })
}

fn batch_too_large(max_payload: usize, detail: String) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!(
            "request body too large (a batch body may be up to {} bytes; split the batch): {detail}",
            super::batch_body_limit(max_payload)
        ),
    )
}

/// A duration given as a humantime string ("10s", "5m") or a number of seconds;
/// absent or null is zero. `what` names the field in the error.
pub fn parse_seconds_or_duration(what: &str, value: Option<Value>) -> Result<Duration, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Duration::ZERO),
        Some(Value::String(s)) => humantime::parse_duration(&s).map_err(|e| {
            ApiError::bad_request(format!("{what} {s:?} is not a duration like \"10s\": {e}"))
        }),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{what} {n} must be a non-negative number of seconds"
                ))
            }),
        Some(other) => Err(ApiError::bad_request(format!(
            "{what} must be a duration string or seconds, got {other}"
        ))),
    }
}

/// Parses a job id from a path segment.
pub fn parse_id(id: &str) -> Result<JobId, ApiError> {
    id.parse()
        .map_err(|_| ApiError::bad_request(format!("{id:?} is not a job id (a UUID)")))
}

/// `GET /v1/jobs/{id}`.
pub async fn job(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Read)?;
    let id = parse_id(&id)?;
    let found = args
        .store
        .run(move |b| {
            let Some(detail) = b.job(id)? else {
                return Ok(None);
            };
            let edges = crate::store::edge_records(b, id, qd_proto::MAX_DEPENDENTS_SHOWN)?;
            Ok(Some((detail, edges)))
        })
        .await?;
    let (detail, edges) =
        found.ok_or_else(|| ApiError::from(broker::BrokerError::UnknownJob(id)))?;
    caller.allow_queue(&detail.job.queue)?;
    let now = wall_ms();
    let mut json = job_json(&detail, now);
    if let Some(fields) = json.as_object_mut() {
        fields.insert("parents".into(), edges_json(&edges.parents, &caller, now));
        fields.insert(
            "dependents".into(),
            edges_json(&edges.dependents, &caller, now),
        );
        fields.insert("dependents_total".into(), edges.dependents_total.into());
    }
    Ok(Json(json))
}

/// A job's parents or dependents as `GET /v1/jobs/{id}` lists them: each one's
/// id and edge, and its state and queue unless it was purged or pruned, or is in
/// a queue the caller may not use (then both are `null`).
fn edges_json(list: &[crate::store::EdgeRecord], caller: &Caller, now: i64) -> Value {
    list.iter()
        .map(|(id, edge, job)| {
            let shown = job
                .as_ref()
                .filter(|j| caller.allow_queue(&j.queue).is_ok());
            json!({
                "id": id,
                "edge": edge.as_str(),
                "state": shown.map(|j| j.shown_state(now)),
                "queue": shown.map(|j| &*j.queue),
            })
        })
        .collect()
}

/// A job's public JSON form. A delayed job whose time has come shows as `ready`.
/// Its result, if any, shows as `result` (text) when it is valid UTF-8, else as
/// `result_b64`.
pub fn job_json(d: &JobDetail, now: i64) -> Value {
    let j = &d.job;
    let state = j.shown_state(now);
    let mut json = job_fields(d, state);
    if let (Some(result), Some(fields)) = (&d.result, json.as_object_mut()) {
        let (key, value) = match std::str::from_utf8(result) {
            Ok(text) => ("result", Value::from(text)),
            Err(_) => (
                "result_b64",
                Value::from(base64::engine::general_purpose::STANDARD.encode(result)),
            ),
        };
        fields.insert(key.to_string(), value);
    }
    json
}

fn job_fields(d: &JobDetail, state: JobState) -> Value {
    let j = &d.job;
    let mut body = json!({
        "id": j.id,
        "queue": &*j.queue,
        "tenant": &*j.tenant,
        "state": state,
        "attempts": j.attempts,
        "max_attempts": j.max_attempts,
        "attempts_left": if j.state == JobState::Dead { 0 } else { j.max_attempts.saturating_sub(j.attempts_in_budget()) },
        "idempotency_key": j.idempotency_key,
        "created_at": j.created_at,
        "ready_at": j.ready_at,
        "updated_at": j.updated_at,
        "last_error": j.last_error,
        "payload_bytes": d.payload.len(),
        "history": d.history,
        "history_elided": d.history_elided,
        "history_elided_at": d.history_elided_at,
        "priority": crate::priority::format_priority(j.priority_ms),
        "priority_ms": j.priority_ms,
        "result_bytes": d.result.as_ref().map(Vec::len),
    });
    if let (Some(schedule), Some(map)) = (
        j.idempotency_key
            .as_deref()
            .and_then(crate::schedule::JobSchedule::of_key),
        body.as_object_mut(),
    ) {
        map.insert("schedule".into(), json!(schedule));
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<EnqueueRequest, ApiError> {
        parse_enqueue("q", body.as_bytes(), &HeaderMap::new(), 16)
    }

    #[test]
    fn a_json_payload_keeps_its_numbers_keys_and_strings_as_sent_without_spacing() {
        let stored = |payload: &str| {
            let body = format!(r#"{{"payload": {payload}}}"#);
            let req = parse_enqueue("q", body.as_bytes(), &HeaderMap::new(), 1024).expect(payload);
            String::from_utf8(req.payload).expect("utf-8")
        };
        assert_eq!(
            stored(r#"{ "order": 18446744073709551617, "b": 1, "a": 2.50 }"#),
            r#"{"order":18446744073709551617,"b":1,"a":2.50}"#
        );
        assert_eq!(
            stored(r#"[ "a b", "q\" \\", {"k" : "\t x"} ]"#),
            r#"["a b","q\" \\",{"k":"\t x"}]"#
        );
        assert_eq!(stored("\n 1e400 \r\n"), "1e400");
        assert_eq!(stored("true"), "true");
        assert_eq!(stored(r#""tab\there \u00e9""#), "tab\there é");
    }

    #[test]
    fn payload_forms_are_accepted_and_bad_bodies_name_the_problem() {
        assert_eq!(parse(r#"{"payload":"hi"}"#).expect("string").payload, b"hi");
        assert_eq!(
            parse(r#"{"payload":{"a":1}}"#).expect("json").payload,
            br#"{"a":1}"#
        );
        assert_eq!(
            parse(r#"{"payload_b64":"aGk="}"#).expect("b64").payload,
            b"hi"
        );
        let cases = [
            ("{", "invalid JSON"),
            (r#"{}"#, "required"),
            (r#"{"payload":"a","payload_b64":"YQ=="}"#, "not both"),
            (r#"{"payload_b64":"!!"}"#, "base64"),
            (r#"{"payload":"a","tenant":"no spaces"}"#, "tenant"),
            (r#"{"payload":"a","max_attempts":0}"#, "max_attempts"),
            (r#"{"payload":"a","delay":"soon"}"#, "delay"),
            (r#"{"payload":"a","delay":-1}"#, "delay"),
            (r#"{"payload":"a","colour":"red"}"#, "unknown field"),
            (r#"{"payload":"a","priority":"soon"}"#, "priority"),
            (r#"{"payload":"a","priority":"25h"}"#, "priority"),
            (r#"{"payload":"a","priority":"-1day 1s"}"#, "priority"),
            (r#"{"payload":"a","priority":600}"#, "priority"),
        ];
        for (body, needle) in cases {
            let err = parse(body).expect_err(body);
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{body}");
            assert!(err.message.contains(needle), "{body}: {}", err.message);
        }
        let err = parse(r#"{"payload":"0123456789abcdefXYZ"}"#).expect_err("too big");
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn delays_take_durations_or_seconds() {
        assert_eq!(
            parse(r#"{"payload":"a","delay":"1m"}"#).expect("d").delay,
            Duration::from_secs(60)
        );
        assert_eq!(
            parse(r#"{"payload":"a","delay":1.5}"#).expect("d").delay,
            Duration::from_millis(1500)
        );
    }
}
