//! The API's error type and its mapping to HTTP status codes.
//!
//! Every error body is `{"error": {"code": "...", "message": "..."}}`; the code is
//! stable for scripts, the message says what is wrong in words.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::broker::BrokerError;
use crate::job::TransitionError;
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
        }
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
            BrokerError::KeyConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "idempotency_conflict", msg)
            }
            BrokerError::ShuttingDown => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", msg).retry(5)
            }
            BrokerError::Unavailable(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", msg).retry(1)
            }
            BrokerError::Invalid(_) => Self::bad_request(msg),
            BrokerError::PayloadTooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", msg)
            }
            BrokerError::Transition(TransitionError::StaleToken { .. }) => {
                Self::new(StatusCode::CONFLICT, "stale_token", msg)
            }
            BrokerError::Transition(TransitionError::IllegalState { .. }) => {
                Self::new(StatusCode::CONFLICT, "wrong_state", msg)
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
        let body = Json(json!({ "error": { "code": self.code, "message": self.message } }));
        let mut response = (self.status, body).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
