//! The HTTP API's connection loop: accepts, caps and times connections, and makes
//! sure every 4xx qd sends has the documented JSON error body.
//!
//! `axum::serve` has no read timeouts and no connection cap, so a client sending
//! its headers a byte a second, or a chunked body that never ends, held a
//! connection (and a descriptor) for ever, before authentication ran. Here each
//! connection is served by hyper's HTTP/1 engine with `daemon.http`'s limits:
//! - `header_timeout`: hyper's header read timeout (the connection is closed);
//! - `body_timeout`: [`limit_body_time`] bounds a request body's whole read and
//!   answers `408 request_timeout`;
//! - `idle_timeout`: a connection with no request in flight and no byte read or
//!   written for that long is shut down gracefully;
//! - `max_connections`: past it a new connection gets a `503` JSON answer and is
//!   closed at once, so clients being served are not affected.
//!
//! hyper answers requests it cannot parse (`414`, `431`, a bad or duplicate
//! `Content-Length`, a malformed request line) itself, with an empty body;
//! [`Guarded`] replaces such an answer on its way out with qd's JSON error body.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::debug;

use super::ApiError;
use crate::config::HttpLimits;

/// Serves `app` on `listener` under `limits` until `stop` is cancelled; then
/// accepts no more and asks each open connection to finish its request and close.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    debug!(error = %e, "Cannot accept an HTTP connection.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse(stream, limits.max_connections);
            continue;
        };
        let (app, stop) = (app.clone(), stop.clone());
        tokio::spawn(async move {
            connection(stream, app, limits, stop).await;
            drop(slot);
        });
    }
}

/// Answers a connection over the cap with a `503` in one non-blocking write (the
/// socket's send buffer is empty, so it fits) and closes it. The write goes through
/// the std socket: tokio's `try_write` refuses before the reactor has seen the
/// socket writable.
fn refuse(stream: TcpStream, max: u32) {
    let body = error_json(
        "too_many_connections",
        &format!(
            "the server already serves daemon.http.max_connections = {max} connections; retry later"
        ),
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if let Ok(mut stream) = stream.into_std() {
        let _ = io::Write::write(&mut stream, response.as_bytes());
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
}

/// Serves one connection to its end.
async fn connection(stream: TcpStream, app: Router, limits: HttpLimits, stop: CancellationToken) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Guarded::new(stream, activity.clone()));
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let (app, activity) = (app.clone(), activity.clone());
            activity.in_flight.fetch_add(1, Ordering::SeqCst);
            async move {
                let response = app.oneshot(req.map(Body::new)).await;
                activity.in_flight.fetch_sub(1, Ordering::SeqCst);
                activity.touch();
                response
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(conn);
    let check = (limits.idle_timeout / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
    let mut shutting = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    debug!(error = %e, "HTTP connection ended with an error.");
                }
                return;
            }
            () = stop.cancelled(), if !shutting => {
                shutting = true;
                conn.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep(check), if !shutting => {
                if activity.idle_for() >= limits.idle_timeout {
                    shutting = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// What a connection is doing: requests in flight and when a byte last moved.
struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last read, write or answered request.
    last: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::SeqCst);
    }

    /// How long the connection has been idle; zero while a request is in flight.
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last.load(Ordering::SeqCst));
        self.start.elapsed().saturating_sub(last)
    }
}

/// The TCP stream of one connection: records activity, and replaces the
/// body-less 4xx answers hyper writes for requests it cannot parse with qd's JSON
/// error body (see [`json_for_bare_error`]).
struct Guarded {
    inner: TcpStream,
    activity: Arc<Activity>,
    /// A replacement answer being written, and how much of it is out.
    replacing: Option<(Vec<u8>, usize)>,
}

impl Guarded {
    fn new(inner: TcpStream, activity: Arc<Activity>) -> Self {
        Guarded {
            inner,
            activity,
            replacing: None,
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        result
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.replacing.is_none()
            && let Some(json) = json_for_bare_error(buf)
        {
            this.replacing = Some((json, 0));
        }
        if let Some((bytes, sent)) = &mut this.replacing {
            // Everything hyper writes after its error answer is dropped: the
            // connection closes after it.
            while *sent < bytes.len() {
                *sent += ready!(Pin::new(&mut this.inner).poll_write(cx, &bytes[*sent..]))?;
            }
            return Poll::Ready(Ok(buf.len()));
        }
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    // Not vectored, so hyper writes each answer's head as one buffer that
    // `json_for_bare_error` can recognise.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// If `buf` is a whole answer hyper wrote on its own, a 4xx with an empty body (qd's
/// handlers never send one: every error of theirs has a JSON body), the JSON answer
/// that replaces it.
fn json_for_bare_error(buf: &[u8]) -> Option<Vec<u8>> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if head_end != buf.len() || !buf.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    if !head.contains("\r\ncontent-length: 0\r\n") || head.contains("content-type:") {
        return None;
    }
    let status: u16 = head.get(9..12)?.parse().ok()?;
    let status = StatusCode::from_u16(status).ok()?;
    let (code, message) = match status {
        StatusCode::URI_TOO_LONG => ("uri_too_long", "the request target is too long"),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => {
            ("headers_too_large", "the request's headers are too large")
        }
        _ => (
            "bad_request",
            "the request is not valid HTTP/1.1 (request line, headers, Content-Length or chunked encoding)",
        ),
    };
    let body = error_json(code, message);
    let reason = status.canonical_reason().unwrap_or("Client Error");
    Some(
        format!(
            "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            status.as_u16(),
            body.len()
        )
        .into_bytes(),
    )
}

/// The documented error body `{"error": {"code": ..., "message": ...}}`.
fn error_json(code: &str, message: &str) -> String {
    serde_json::json!({ "error": { "code": code, "message": message } }).to_string()
}

/// Middleware: a request's body must arrive whole within `daemon.http.body_timeout`
/// of the handler's first read; past it the read fails and the answer is `408
/// request_timeout`, closing the connection (the rest of the body is not awaited).
pub async fn limit_body_time(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    let late = Arc::new(AtomicBool::new(false));
    let req = req.map(|body| {
        Body::new(Deadline {
            inner: body,
            limit,
            deadline: None,
            late: late.clone(),
        })
    });
    let response = next.run(req).await;
    if !late.load(Ordering::SeqCst) {
        return response;
    }
    let secs = limit.as_secs_f64();
    let mut response = ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        format!("the request body did not arrive within daemon.http.body_timeout ({secs}s)"),
    )
    .into_response();
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// A request body that fails once `limit` has passed since it was first polled.
struct Deadline {
    inner: Body,
    limit: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    late: Arc<AtomicBool>,
}

impl hyper::body::Body for Deadline {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let limit = this.limit;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if deadline.as_mut().poll(cx).is_ready() {
            this.late.store(true, Ordering::SeqCst);
            return Poll::Ready(Some(Err(axum::Error::new(io::Error::new(
                io::ErrorKind::TimedOut,
                "request body timed out",
            )))));
        }
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_4xx_from_hyper_becomes_json() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Thu, 03 Dec 2026 10:00:00 GMT\r\n\r\n";
        let json = String::from_utf8(json_for_bare_error(bare).expect("replaced")).expect("utf-8");
        assert!(json.starts_with("HTTP/1.1 431 "), "{json}");
        let body = json.split("\r\n\r\n").nth(1).expect("body");
        let value: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        assert_eq!(value["error"]["code"], "headers_too_large");
        assert!(json.contains(&format!("content-length: {}\r\n", body.len())));
    }

    #[test]
    fn answers_with_a_body_or_not_4xx_are_left_alone() {
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(json_for_bare_error(ours).is_none());
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(json_for_bare_error(ok).is_none());
        let partial = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n";
        assert!(json_for_bare_error(partial).is_none());
    }

    #[test]
    fn idle_time_counts_only_without_a_request_in_flight() {
        let a = Activity::new();
        a.in_flight.fetch_add(1, Ordering::SeqCst);
        assert_eq!(a.idle_for(), Duration::ZERO);
    }
}
