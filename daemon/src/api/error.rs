//! The API's error type and its mapping to HTTP status codes.
//!
//! Every error body is `{"error": {"code": "...", "message": "..."}}`; the code is
//! stable for scripts, the message says what is wrong in words. A 409 about a
//! lease (`stale_token`, `wrong_state`) adds `"state"`, the job's current state.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::broker::BrokerError;
use crate::job::{State, TransitionError};
use crate::store::StoreError;

/// An API failure: status, stable code, message, and an optional `Retry-After` (s).
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code (`"queue_full"`, `"not_found"`, ...).
    pub code: &'static str,
    /// What went wrong, in words.
    pub message: String,
    /// Seconds to wait before retrying, sent as `Retry-After`.
    pub retry_after: Option<u64>,
    /// The job's current state, for a 409 about its lease (body field `state`).
    pub state: Option<State>,
    /// A 401's `WWW-Authenticate` challenge (RFC 6750), e.g. `Bearer realm="qd"`.
    pub challenge: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming the problem.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// Any status with a code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
            state: None,
            challenge: None,
        }
    }

    /// A 409 `stale_token`: the lease this request names is over; `state` is the job's.
    pub fn stale(message: impl Into<String>, state: State) -> Self {
        let mut err = Self::new(StatusCode::CONFLICT, "stale_token", message);
        err.state = Some(state);
        err
    }

    fn retry(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

impl From<BrokerError> for ApiError {
    fn from(err: BrokerError) -> Self {
        let msg = err.to_string();
        match err {
            BrokerError::UnknownQueue(_) => Self::new(StatusCode::NOT_FOUND, "unknown_queue", msg),
            BrokerError::UnknownJob(_) => Self::new(StatusCode::NOT_FOUND, "not_found", msg),
            BrokerError::QueueFull { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "queue_full", msg).retry(1)
            }
            BrokerError::TenantFull { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "tenant_full", msg).retry(1)
            }
            BrokerError::KeyConflict { .. } | BrokerError::KeyConflictInBatch { .. } => {
                Self::new(StatusCode::CONFLICT, "idempotency_conflict", msg)
            }
            BrokerError::ShuttingDown => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", msg).retry(5)
            }
            BrokerError::Unavailable(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", msg).retry(1)
            }
            BrokerError::Invalid(_) => Self::bad_request(msg),
            BrokerError::UnknownDependency(_) => {
                Self::new(StatusCode::BAD_REQUEST, "unknown_dependency", msg)
            }
            BrokerError::PayloadTooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", msg)
            }
            BrokerError::Transition(TransitionError::StaleToken { state, .. }) => {
                Self::stale(msg, state)
            }
            BrokerError::Transition(TransitionError::IllegalState { state, .. }) => {
                let mut err = Self::new(StatusCode::CONFLICT, "wrong_state", msg);
                err.state = Some(state);
                err
            }
            BrokerError::Store(e) => e.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        let msg = format!("store: {err}");
        match err {
            StoreError::Full(_) => {
                Self::new(StatusCode::INSUFFICIENT_STORAGE, "store_full", msg).retry(30)
            }
            _ => Self::new(StatusCode::SERVICE_UNAVAILABLE, "store_error", msg).retry(5),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = json!({ "code": self.code, "message": self.message });
        if let Some(state) = self.state {
            error["state"] = json!(state);
        }
        let mut response = (self.status, Json(json!({ "error": error }))).into_response();
        let headers = response.headers_mut();
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(challenge) = self.challenge {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}
