//! Request bodies: JSON whatever the `Content-Type` says.
//!
//! Producers and workers post from shells (`curl -d '{…}'` sends
//! `application/x-www-form-urlencoded`), scripts and SDKs; qd reads every body as
//! JSON and names the problem when it is not, instead of refusing on a header.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::ApiError;

/// Parses a JSON body into `T`; a 400 naming the problem when it does not fit.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// An extractor for a JSON body of any content type (see [`parse_json`]).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    e.body_text(),
                )
            } else {
                ApiError::bad_request(e.body_text())
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}
