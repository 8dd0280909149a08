//! The Api actor: qd's HTTP interface (axum) at `daemon.api_listen`.
//!
//! Producers enqueue (one job or a batch) and read job status (`api/producer.rs`); external workers
//! lease, heartbeat, ack and nack (`api/lessee.rs`). Handlers hold no business
//! logic: they check the caller's role and queue (`api/auth.rs`), validate input,
//! send one message to the Broker, and map the answer to a status
//! code. The endpoints are specified in `daemon/docs/http-api.md`.
//!
//! Before any route, [`browser_guard`] refuses what a web page could make a browser
//! send (`api/origin.rs`): a cross-site `POST` gets `403 cross_origin`, a `Host` not
//! naming this listener `421 misdirected_request`.
//!
//! The actor reads `daemon.api_tokens_file` and binds the listener in `pre_start` (a
//! bad token file or a bind failure fails the start, naming the file or address) and
//! serves from a spawned task ([`serve`]: timeouts and a cap on connections), so its
//! mailbox is never blocked by `accept`. It takes no messages. Supervised by the Supervisor.

pub mod auth;
mod body;
mod error;
mod lessee;
pub(crate) mod origin;
mod params;
mod producer;
mod serve;
pub mod sqs;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::Config;
use crate::limits::Limits;
use crate::store::Store;
use auth::LiveTokens;

pub use error::ApiError;
pub use producer::{BatchQueues, JobBody, batch_requests};

/// What the Api actor is started with.
#[derive(Clone)]
pub struct ApiArgs {
    /// Owner of the config in force (queues, `max_payload`, `api_listen`).
    pub limits: Arc<Limits>,
    /// The bearer tokens in force (replaced on reload).
    pub tokens: Arc<LiveTokens>,
    /// The store, for job status reads.
    pub store: Store,
    /// Requests to the Supervisor (the SQS API's created queues).
    pub control: crate::daemon::Controls,
}

impl ApiArgs {
    /// The config in force, read per request so a reload reaches the API.
    pub fn config(&self) -> Arc<Config> {
        self.limits.config()
    }
}

/// The running server: cancel to stop accepting.
pub struct ApiState {
    stop: CancellationToken,
    /// The bound address (useful when `api_listen` has port 0).
    pub local_addr: SocketAddr,
}

/// The Api actor.
pub struct Api;

impl Actor for Api {
    type Msg = ();
    type State = ApiState;
    type Arguments = ApiArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        args: ApiArgs,
    ) -> Result<ApiState, ActorProcessingErr> {
        let addr = args.config().daemon.api_listen;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on api_listen {addr}: {e}"))?;
        let local_addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let hosts =
            origin::HostAllow::new(addr, local_addr, &args.config().daemon.api_allowed_hosts);
        let http = args.config().daemon.http;
        let app = router(args, hosts);
        tokio::spawn(serve::serve(listener, app, http, stop.clone()));
        info!(listen = %local_addr, "HTTP API listening.");
        Ok(ApiState { stop, local_addr })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<()>,
        state: &mut ApiState,
    ) -> Result<(), ActorProcessingErr> {
        state.stop.cancel();
        Ok(())
    }
}

/// Bytes a JSON string may spend on one payload byte: `\u0001` (any control
/// character, or a client that escapes everything) is 6 bytes for 1. Base64
/// (`payload_b64`) spends 4 for 3, so this bounds it too.
const WORST_ESCAPE: usize = 6;

/// Room for the JSON envelope around the payload (tenant, key, delay, ...).
const ENVELOPE: usize = 64 * 1024;

/// The largest request body accepted (bytes): a payload of `max_payload` decoded
/// bytes fits however its JSON is escaped. The payload limit itself is checked on
/// the decoded bytes (`broker::validate`).
pub fn body_limit(max_payload: usize) -> usize {
    max_payload
        .saturating_mul(WORST_ESCAPE)
        .saturating_add(ENVELOPE)
}

/// The smallest body limit of a batch enqueue (16 MiB): 1,000 jobs of up to
/// about 16 KiB each.
const BATCH_BODY_MIN: usize = 16 << 20;

/// The largest batch enqueue body accepted (bytes): [`BATCH_BODY_MIN`], or a single
/// enqueue's [`body_limit`] if that is larger (a job that may be enqueued alone may
/// also be a batch of one). Larger batches get `413`: split them.
pub fn batch_body_limit(max_payload: usize) -> usize {
    body_limit(max_payload).max(BATCH_BODY_MIN)
}

/// The largest single ack body accepted (bytes): room for the largest result any
/// queue may take (`max_result` is at most 1 MiB) however it is escaped, or the
/// other routes' [`body_limit`] if that is larger. The result's own limit, the
/// queue's `max_result`, is checked on the decoded bytes (a 400 naming the size).
pub fn ack_body_limit(max_payload: usize) -> usize {
    body_limit(max_payload).max(body_limit(crate::results::MAX_RESULT_LIMIT))
}

/// The route table. Every request first passes [`browser_guard`] with `hosts`;
/// every `/v1` route goes through [`auth::authenticate`] with `args.tokens`;
/// `/healthz` is open. Body size is bounded at the transport by
/// [`body_limit`] (fixed while the Api runs, which is why a reload refuses a
/// `max_payload` change).
pub fn router(args: ApiArgs, hosts: origin::HostAllow) -> Router {
    let max_payload = args.config().daemon.max_payload;
    let body_timeout = args.config().daemon.http.body_timeout;
    let body_limit = body_limit(max_payload);
    let batch_limit = batch_body_limit(max_payload);
    let ack_limit = ack_body_limit(max_payload);
    let tokens = args.tokens.clone();
    let sqs = if args.config().sqs.enabled {
        sqs::routes(&args)
    } else {
        Router::new()
    };
    Router::new()
        .route("/v1/queues/{queue}/jobs", post(producer::enqueue))
        .route(
            "/v1/queues/{queue}/jobs/batch",
            post(producer::enqueue_batch).layer(DefaultBodyLimit::max(batch_limit)),
        )
        .route(
            "/v1/jobs/batch",
            post(producer::enqueue_flow).layer(DefaultBodyLimit::max(batch_limit)),
        )
        .route("/v1/jobs/{id}", get(producer::job))
        .route("/v1/queues/{queue}/leases", post(lessee::lease))
        .route("/v1/jobs/{id}/heartbeat", post(lessee::heartbeat))
        .route(
            "/v1/jobs/{id}/ack",
            post(lessee::ack).layer(DefaultBodyLimit::max(ack_limit)),
        )
        .route("/v1/jobs/{id}/nack", post(lessee::nack))
        .route("/v1/acks", post(lessee::acks))
        .route_layer(middleware::from_fn_with_state(tokens, auth::authenticate))
        .merge(sqs)
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(
            body_timeout,
            serve::limit_body_time,
        ))
        .layer(middleware::from_fn_with_state(
            BodyLimits {
                single: body_limit,
                batch: batch_limit,
                ack: ack_limit,
                max_payload,
                limits: args.limits.clone(),
            },
            refuse_oversized,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::new(hosts),
            browser_guard,
        ))
        .with_state(Arc::new(args))
}

/// Any path no route matches: `404 not_found` with the JSON error body.
async fn unknown_route(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        format!("no endpoint at {}; see daemon/docs/http-api.md", uri.path()),
    )
}

/// A known path with a method it does not take: `405 method_not_allowed` with the
/// JSON error body (axum adds the `Allow` header listing the methods it takes).
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}; see the Allow header",
            uri.path()
        ),
    )
}

/// Refuses what a browser page may not send (see `api/origin.rs`): a `Host` that
/// does not name this listener gets `421 misdirected_request`, a cross-site
/// unsafe request `403 cross_origin`, both with the JSON error body. Runs before
/// authentication and before the body is read.
async fn browser_guard(
    axum::extract::State(hosts): axum::extract::State<Arc<origin::HostAllow>>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let host = req
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok());
    if !hosts.allows(host) {
        return ApiError::new(
            axum::http::StatusCode::MISDIRECTED_REQUEST,
            "misdirected_request",
            format!(
                "Host {:?} does not name this listener; add it to daemon.api_allowed_hosts \
                 if clients reach qd by that name",
                host.unwrap_or("")
            ),
        )
        .into_response();
    }
    if let Err(refused) = origin::cross_origin(req.method(), req.headers()) {
        return ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "cross_origin",
            refused.to_string(),
        )
        .into_response();
    }
    next.run(req).await
}

/// The body limits [`refuse_oversized`] checks, in bytes.
#[derive(Clone)]
struct BodyLimits {
    /// Every route but the batch enqueue ([`body_limit`]).
    single: usize,
    /// `POST /v1/queues/{queue}/jobs/batch` ([`batch_body_limit`]).
    batch: usize,
    /// `POST /v1/jobs/{id}/ack` ([`ack_body_limit`]).
    ack: usize,
    /// `daemon.max_payload`, named in the message.
    max_payload: usize,
    /// The config in force, to label a refused enqueue with its queue.
    limits: Arc<Limits>,
}

/// The queue of an enqueue path (`/v1/queues/{queue}/jobs` or `.../jobs/batch`).
fn enqueue_path_queue(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/queues/")?;
    let queue = rest
        .strip_suffix("/jobs")
        .or_else(|| rest.strip_suffix("/jobs/batch"))?;
    (!queue.contains('/')).then_some(queue)
}

/// `queue` as the `queue` label of a metric: itself when the config names it, else
/// `None` (labelled `unknown`), so request paths cannot grow the label set.
pub(crate) fn known_queue<'q>(config: &crate::config::Config, queue: &'q str) -> Option<&'q str> {
    config.queues.contains_key(queue).then_some(queue)
}

/// Answers 413 at once when `Content-Length` already exceeds the route's body limit
/// (bytes), instead of reading up to the limit first; bodies without a length are
/// still bounded while they are read ([`DefaultBodyLimit`]).
async fn refuse_oversized(
    axum::extract::State(limits): axum::extract::State<BodyLimits>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let batch = req.uri().path().ends_with("/jobs/batch");
    let ack = req.uri().path().ends_with("/ack");
    let limit = match (batch, ack) {
        (true, _) => limits.batch,
        (_, true) => limits.ack,
        _ => limits.single,
    };
    match declared {
        Some(len) if len > limit as u64 => {
            let max_payload = limits.max_payload;
            let message = if batch {
                format!(
                    "request body of {len} bytes is over the batch limit of {limit} bytes \
                     (the larger of 16 MiB and a single enqueue's limit); split the batch"
                )
            } else {
                format!(
                    "request body of {len} bytes is over the limit of {limit} bytes \
                     (room for a payload of max_payload = {max_payload} bytes however it is escaped)"
                )
            };
            if let Some(queue) = enqueue_path_queue(req.uri().path()) {
                let config = limits.limits.config();
                crate::metrics::enqueue_rejected(
                    known_queue(&config, queue),
                    crate::metrics::RejectReason::PayloadTooLarge,
                );
            }
            let err = ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                message,
            );
            axum::response::IntoResponse::into_response(err)
        }
        _ => next.run(req).await,
    }
}
