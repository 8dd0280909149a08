//! The `http` executor: one webhook POST per attempt.
//!
//! The payload is the request body; the job's identity travels in `Idempotency-Key`
//! (the IETF httpapi idempotency-key draft, as used by Stripe), `Qd-Job-Id`,
//! `Qd-Attempt`, `Qd-Tenant`, `Qd-Queue` and the attempt's fencing value
//! `Qd-Lease-Token`, which win over configured headers.
//! `Content-Type` is `application/octet-stream` unless configured. One pooled
//! `reqwest::Client` per executor; proxies come from the usual `HTTPS_PROXY`/`NO_PROXY`
//! environment. Redirects are not followed: a webhook that moved is a config error.
//!
//! The response is classified by status: 2xx success; 429, and 503 with `Retry-After`,
//! throttled; 408, other 5xx and connection errors transient (honouring `Retry-After`);
//! 3xx and other 4xx permanent. `Retry-After` (RFC 9110 §10.2.3) is read in both its
//! delay-seconds and HTTP-date forms. At most [`OUTPUT_LIMIT`] bytes of the body are
//! read, for the error or detail text; with `store_result`, a 2xx response's whole
//! body (at most the queue's `max_result`, else the attempt fails as permanent,
//! naming the size) is the job's result. With `send_parents` the body is a JSON
//! envelope, `{"payload" | "payload_b64", "parents": [...]}` (`Content-Type:
//! application/json`), carrying the job's parents and their results.

use std::time::{Duration, SystemTime};

use base64::Engine;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Response, StatusCode, Url};
use tokio_util::sync::CancellationToken;

use super::{ExecResult, ExecutorError, HttpSpec, JobRun, OUTPUT_LIMIT, output_text, with_output};
use crate::job::Failure;

/// A `send_parents` request's body: `{"payload": text}` (or `{"payload_b64"}` for
/// bytes that are not UTF-8) with `"parents": [...]`, empty for a job without.
fn envelope(job: &JobRun) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Envelope<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        payload: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload_b64: Option<String>,
        parents: &'a [crate::results::ParentBody],
    }
    let text = std::str::from_utf8(&job.payload).ok();
    let body = Envelope {
        payload: text,
        payload_b64: text
            .is_none()
            .then(|| base64::engine::general_purpose::STANDARD.encode(&job.payload)),
        parents: job.parents.as_deref().unwrap_or_default(),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The delay of a 429 that carries no `Retry-After`.
const DEFAULT_THROTTLE: Duration = Duration::from_secs(1);

/// The longest `Retry-After` honoured; a larger one is clamped to it (one day).
/// Also bounds an external worker's nack `retry_after` (see `api::lessee`).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// POSTs each attempt's payload to one URL. Built from a validated [`HttpSpec`];
/// keeps one connection pool for all attempts.
#[derive(Debug)]
pub struct HttpExecutor {
    client: Client,
    url: Url,
    headers: HeaderMap,
    timeout: Duration,
    store_result: bool,
    send_parents: bool,
}

impl HttpExecutor {
    /// Parses the URL and headers and builds the client (redirects off, `timeout` on
    /// the whole exchange, connect to last body byte).
    ///
    /// # Errors
    /// [`ExecutorError::Invalid`] for a URL that does not parse or is not http(s), a
    /// header name or value HTTP does not allow, or a zero `timeout`;
    /// [`ExecutorError::HttpClient`] when the TLS backend cannot be loaded.
    pub fn new(spec: &HttpSpec) -> Result<HttpExecutor, ExecutorError> {
        let url =
            Url::parse(&spec.url).map_err(|e| ExecutorError::invalid("url", e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ExecutorError::invalid(
                "url",
                "the scheme must be http or https",
            ));
        }
        if spec.timeout.is_zero() {
            return Err(ExecutorError::invalid(
                "timeout",
                "must be greater than zero",
            ));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &spec.headers {
            let key = || format!("headers.{name}");
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| ExecutorError::invalid(key(), e.to_string()))?;
            let value = HeaderValue::from_str(value)
                .map_err(|e| ExecutorError::invalid(key(), e.to_string()))?;
            headers.insert(name, value);
        }
        headers
            .entry(header::CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/octet-stream"));
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(spec.timeout)
            .user_agent(concat!("qd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ExecutorError::HttpClient)?;
        Ok(HttpExecutor {
            client,
            url,
            headers,
            timeout: spec.timeout,
            store_result: spec.store_result,
            send_parents: spec.send_parents,
        })
    }

    /// Whether each attempt POSTs the envelope with the job's parents.
    pub fn sends_parents(&self) -> bool {
        self.send_parents
    }

    /// Runs one attempt: POST, read at most [`OUTPUT_LIMIT`] bytes of the body,
    /// classify. When `cancel` fires the request is dropped (its connection closed)
    /// and the result is [`Failure::Interrupted`].
    pub async fn run(&self, job: &JobRun, cancel: &CancellationToken) -> ExecResult {
        tokio::select! {
            result = self.attempt(job) => result,
            () = cancel.cancelled() => ExecResult::Failure(Failure::Interrupted {
                reason: "cancelled by the worker (shutdown or lost lease); request aborted"
                    .to_owned(),
            }),
        }
    }

    async fn attempt(&self, job: &JobRun) -> ExecResult {
        let mut headers = match self.headers_for(job) {
            Ok(headers) => headers,
            Err(error) => return ExecResult::Failure(Failure::Permanent { error }),
        };
        let body = if self.send_parents {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            envelope(job)
        } else {
            job.payload.clone()
        };
        let request = self
            .client
            .post(self.url.clone())
            .headers(headers)
            .body(body);
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return ExecResult::Failure(self.request_failure(&e)),
        };
        let status = response.status();
        let text = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        let retry_after =
            text(header::RETRY_AFTER).and_then(|v| parse_retry_after(v, SystemTime::now()));
        let location = text(header::LOCATION).map(str::to_owned);
        if self.store_result && status.is_success() {
            return match read_result(response, job.max_result).await {
                Ok(result) => {
                    let head = &result[..result.len().min(OUTPUT_LIMIT)];
                    match classify(status, retry_after, None, &output_text(head)) {
                        ExecResult::Success { detail, .. } => ExecResult::Success {
                            detail,
                            result: (!result.is_empty()).then_some(result),
                        },
                        other => other,
                    }
                }
                Err(failure) => ExecResult::Failure(failure),
            };
        }
        let body = output_text(&read_head(response).await);
        classify(status, retry_after, location.as_deref(), &body)
    }

    /// The configured headers plus the job's identity (which wins).
    fn headers_for(&self, job: &JobRun) -> Result<HeaderMap, String> {
        let mut headers = self.headers.clone();
        let mut identity = vec![
            ("idempotency-key", job.idempotency_key.clone()),
            ("qd-job-id", job.id.to_string()),
            ("qd-attempt", job.attempt.to_string()),
            ("qd-tenant", job.tenant.to_string()),
            ("qd-queue", job.queue.to_string()),
            ("qd-lease-token", job.token.to_string()),
        ];
        if let Some(schedule) = crate::schedule::JobSchedule::of_key(&job.idempotency_key) {
            identity.push(("qd-schedule", schedule.name));
            identity.push(("qd-schedule-tick", schedule.tick));
        }
        for (name, value) in identity {
            let value = HeaderValue::try_from(value)
                .map_err(|_| format!("the job's {name} cannot be sent as an HTTP header value"))?;
            headers.insert(HeaderName::from_static(name), value);
        }
        Ok(headers)
    }

    fn request_failure(&self, e: &reqwest::Error) -> Failure {
        let error = error_chain(e);
        if e.is_timeout() {
            let limit = humantime::format_duration(self.timeout);
            Failure::TimedOut {
                error: format!("timed out after {limit}: {error}"),
            }
        } else {
            Failure::Transient {
                error,
                retry_after: None,
            }
        }
    }
}

/// Reads at most [`OUTPUT_LIMIT`] bytes of the body. Best effort: the status already
/// decided the outcome, so a body that breaks off just yields what arrived.
async fn read_head(mut response: Response) -> Vec<u8> {
    let mut head = Vec::new();
    while head.len() < OUTPUT_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(OUTPUT_LIMIT - head.len());
                head.extend_from_slice(&chunk[..take]);
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %error_chain(&e), "The webhook's response body broke off.");
                break;
            }
        }
    }
    head
}

/// Reads a successful response's whole body as the job's result: at most `max`
/// bytes, else a permanent failure naming the size (the `Content-Length`, when the
/// server sent one, or the bytes read so far); a body that breaks off is a
/// transient failure (the result would be cut).
async fn read_result(mut response: Response, max: usize) -> Result<Vec<u8>, Failure> {
    let too_large = |len: u64| Failure::Permanent {
        error: crate::results::check_result(usize::try_from(len).unwrap_or(usize::MAX), max)
            .err()
            .unwrap_or_default(),
    };
    if let Some(len) = response.content_length()
        && len > max as u64
    {
        return Err(too_large(len));
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > max {
                    return Err(too_large(body.len() as u64));
                }
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                return Err(Failure::Transient {
                    error: format!("the response body broke off: {}", error_chain(&e)),
                    retry_after: None,
                });
            }
        }
    }
}

/// Classifies a response by status (see the module doc).
fn classify(
    status: StatusCode,
    retry_after: Option<Duration>,
    location: Option<&str>,
    body: &str,
) -> ExecResult {
    let error = with_output(format!("HTTP {status}"), body);
    ExecResult::Failure(match status.as_u16() {
        200..=299 => {
            return ExecResult::Success {
                detail: Some(error),
                result: None,
            };
        }
        300..=399 => Failure::Permanent {
            error: with_output(
                format!(
                    "HTTP {status} to {}; redirects are not followed, configure the final URL",
                    location.unwrap_or("(no Location)")
                ),
                body,
            ),
        },
        429 => Failure::Throttled {
            retry_after: retry_after.unwrap_or(DEFAULT_THROTTLE),
            error,
        },
        503 if retry_after.is_some() => Failure::Throttled {
            retry_after: retry_after.unwrap_or(DEFAULT_THROTTLE),
            error,
        },
        408 | 500..=599 => Failure::Transient { error, retry_after },
        _ => Failure::Permanent { error },
    })
}

/// Parses a `Retry-After` value at time `now`: delay-seconds or an HTTP-date.
/// A negative delay or a past date gives zero; anything longer than a day is clamped
/// to a day; a value in neither form gives `None` (ignored).
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let delay = if all_digits(value) {
        value.parse().map_or(MAX_RETRY_AFTER, Duration::from_secs)
    } else if value.strip_prefix('-').is_some_and(all_digits) {
        Duration::ZERO
    } else {
        let at = httpdate::parse_http_date(value).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// An error and its sources, joined with ": " ("error sending request ...: tcp connect
/// error: Connection refused (os error 111)"); a source already quoted is skipped.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests;
