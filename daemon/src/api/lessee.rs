//! External worker endpoints: lease (long poll), heartbeat, ack, nack.
//!
//! Only queues with `executor = { kind = "external" }` are leased over HTTP; their
//! jobs go through the same Scheduler (fairness, caps, rate limits), Broker
//! (fencing tokens, retries, DLQ) and LeaseReaper as in-process workers' jobs. A
//! stale or unknown token gets 409 with the job's current state in the message.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use base64::Engine;
use ractor::ActorRef;
use serde::Deserialize;
use serde_json::{Value, json};

use super::producer::{parse_id, parse_seconds_or_duration};
use super::{ApiArgs, ApiError};
use crate::broker::{self, BrokerMsg, LeasedJob};
use crate::executor::ExecutorSpec;
use crate::job::{Failure, Token};
use crate::scheduler::{self, LeaseRequest, MAX_WAIT, SchedulerMsg};

/// The most jobs one lease request may take.
pub const MAX_JOBS: u32 = 100;
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
    Path(queue): Path<String>,
    body: Result<Json<LeaseBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let qcfg = args
        .config
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
    let scheduler =
        ActorRef::<SchedulerMsg>::where_is(scheduler::name(&queue)).ok_or_else(|| {
            ApiError::from(broker::BrokerError::Unavailable(
                "scheduler restarting".into(),
            ))
        })?;
    let request = LeaseRequest {
        worker: body.worker_id,
        max_jobs: body.max_jobs,
        wait,
    };
    let jobs = match scheduler
        .call(
            |tx| SchedulerMsg::Lease(request, tx),
            Some(wait + REPORT_TIMEOUT),
        )
        .await
    {
        Ok(ractor::rpc::CallResult::Success(jobs)) => jobs,
        _ => Vec::new(),
    };
    Ok(Json(
        json!({ "jobs": jobs.iter().map(leased_json).collect::<Vec<_>>() }),
    ))
}

fn parse_wait(value: Option<Value>) -> Result<Duration, ApiError> {
    let wait = parse_seconds_or_duration("wait", value)?;
    if wait > MAX_WAIT {
        return Err(ApiError::bad_request("wait must be at most 30s"));
    }
    Ok(wait)
}

fn leased_json(job: &LeasedJob) -> Value {
    json!({
        "id": job.id,
        "queue": &*job.queue,
        "tenant": &*job.tenant,
        "attempt": job.attempt,
        "token": job.token,
        "idempotency_key": job.idempotency_key,
        "payload_b64": base64::engine::general_purpose::STANDARD.encode(&job.payload),
        "payload": std::str::from_utf8(&job.payload).ok(),
        "lease_seconds": job.lease.as_secs_f64(),
        "deadline": job.deadline_ms,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HeartbeatBody {
    token: Token,
    extend: Option<Value>,
}

/// `POST /v1/jobs/{id}/heartbeat`.
pub async fn heartbeat(
    Path(id): Path<String>,
    body: Result<Json<HeartbeatBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let extend = match body.extend {
        None => None,
        v => Some(parse_seconds_or_duration("extend", v)?),
    };
    let info = broker::request(
        |tx| BrokerMsg::Heartbeat(id, body.token, extend, tx),
        REPORT_TIMEOUT,
    )
    .await??;
    Ok(Json(json!({ "id": id, "deadline": info.deadline_ms })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AckBody {
    token: Token,
}

/// `POST /v1/jobs/{id}/ack`.
pub async fn ack(
    Path(id): Path<String>,
    body: Result<Json<AckBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    broker::request(|tx| BrokerMsg::Ack(id, body.token, tx), REPORT_TIMEOUT).await??;
    Ok(Json(json!({ "id": id, "state": "succeeded" })))
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
    Path(id): Path<String>,
    body: Result<Json<NackBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let retry_after = match body.retry_after {
        None => None,
        v => Some(parse_seconds_or_duration("retry_after", v)?),
    };
    let error: String = body.error.chars().take(4096).collect();
    let failure = match body.kind.unwrap_or(NackKind::Transient) {
        NackKind::Transient => Failure::Transient { error, retry_after },
        NackKind::Permanent => Failure::Permanent { error },
        NackKind::Throttled => Failure::Throttled {
            retry_after: retry_after.unwrap_or(Duration::from_secs(1)),
            error,
        },
    };
    broker::request(
        |tx| BrokerMsg::Nack(id, body.token, failure, tx),
        REPORT_TIMEOUT,
    )
    .await??;
    Ok(Json(json!({ "id": id, "nacked": true })))
}
