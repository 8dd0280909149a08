//! Producer endpoints: enqueue a job, read a job's status and history.
//!
//! `POST /v1/queues/{queue}/jobs` with
//! `{"tenant"?, "payload" | "payload_b64", "idempotency_key"?, "delay"?, "max_attempts"?}`
//! answers `202 {"id", "state"}` once the job is durable, or `200 {"id", "duplicate": true}`
//! when the idempotency key names an existing job with the same payload.
//! `GET /v1/jobs/{id}` answers the job with its history as the history cap keeps it
//! (the first and last entries, `history_elided` counting those deleted between).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::{Caller, Role};
use super::{ApiArgs, ApiError};
use crate::broker::{self, BrokerMsg, EnqueueRequest};
use crate::clock::wall_ms;
use crate::job::{JobId, State as JobState};
use crate::store::JobDetail;

/// How long an enqueue may wait for the broker and the group commit.
const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// The enqueue body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnqueueBody {
    tenant: Option<String>,
    payload: Option<Value>,
    payload_b64: Option<String>,
    idempotency_key: Option<String>,
    delay: Option<Value>,
    max_attempts: Option<u32>,
}

/// `POST /v1/queues/{queue}/jobs`.
pub async fn enqueue(
    State(args): State<Arc<ApiArgs>>,
    Extension(caller): Extension<Caller>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.allow(Role::Produce, &queue)?;
    let config = args.config();
    let max = config.daemon.max_payload;
    let body = body.map_err(|e| too_large(max, e.to_string()))?;
    if !config.queues.contains_key(&queue) {
        return Err(broker::BrokerError::UnknownQueue(queue).into());
    }
    let req = parse_enqueue(&queue, &body, &headers, max)?;
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
    let body: EnqueueBody = super::body::parse_json(body)?;
    let payload = match (body.payload, body.payload_b64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give payload or payload_b64, not both",
            ));
        }
        (None, None) => return Err(ApiError::bad_request("payload or payload_b64 is required")),
        (Some(Value::String(s)), None) => s.into_bytes(),
        (Some(v), None) => v.to_string().into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| ApiError::bad_request(format!("payload_b64 is not valid base64: {e}")))?,
    };
    let header_key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().map(str::to_string))
        .transpose()
        .map_err(|_| ApiError::bad_request("Idempotency-Key header is not visible ASCII"))?;
    let req = EnqueueRequest {
        queue: queue.to_string(),
        tenant: body.tenant,
        payload,
        idempotency_key: body.idempotency_key.or(header_key),
        delay: parse_seconds_or_duration("delay", body.delay)?,
        max_attempts: body.max_attempts,
    };
    broker::validate(&req, max_payload)?;
    Ok(req)
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
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Read)?;
    let id = parse_id(&id)?;
    let detail = args.store.run(move |b| b.job(id)).await?;
    let detail = detail.ok_or_else(|| ApiError::from(broker::BrokerError::UnknownJob(id)))?;
    caller.allow_queue(&detail.job.queue)?;
    Ok(Json(job_json(&detail, wall_ms())))
}

/// A job's public JSON form. A delayed job whose time has come shows as `ready`.
pub fn job_json(d: &JobDetail, now: i64) -> Value {
    let j = &d.job;
    let state = match j.state {
        JobState::Delayed if j.ready_at <= now => JobState::Ready,
        s => s,
    };
    json!({
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<EnqueueRequest, ApiError> {
        parse_enqueue("q", body.as_bytes(), &HeaderMap::new(), 16)
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
