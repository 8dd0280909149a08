//! Path parameters with the API's JSON error body.
//!
//! axum answers a path segment it cannot decode (not UTF-8 once percent-decoded:
//! `/v1/queues/%FF/jobs`) with a plain-text 400; every qd error is
//! `{"error": {"code", "message"}}`, so handlers take [`ApiPath`] instead.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::ApiError;

/// The route's path parameters as `T`; a `400 bad_request` naming the problem when
/// they do not decode.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| ApiPath(value))
            .map_err(|e| ApiError::bad_request(e.body_text()))
    }
}
