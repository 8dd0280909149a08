//! The SQS-compatible API: Amazon SQS's wire protocols on `daemon.api_listen`, so
//! unmodified AWS SDKs, the AWS CLI and Celery/Kombu use qd as their queue
//! (`[sqs] enabled = true`; the manual is `daemon/docs/sqs.md`).
//!
//! A request is `POST /` or `POST /ACCOUNT/QUEUE` (a queue URL) in either protocol
//! (`sqs/wire.rs`); it is authorised (`sqs/sigv4.rs`), dispatched by its action to
//! a handler that, like the HTTP API's, holds no business logic: it checks the
//! caller's role and queue, reads and checks the parameters against SQS's ranges,
//! sends the Broker one message and renders the answer.
//! Queue actions are in `sqs/queues.rs`, sending in `sqs/send.rs`, receiving in
//! `sqs/receive.rs`, deletes and visibility changes in `sqs/settle.rs`.
//!
//! The model mapping: a message is a job (its id the `MessageId`); receiving
//! leases it, with the visibility timeout as the lease; `DeleteMessage` acks with
//! the lease's fencing token from the receipt handle (`sqs/handle.rs`);
//! `ChangeMessageVisibility` is a heartbeat (`extend`), or for 0 an uncharged
//! return (`Failure::Interrupted`) fenced by the same token. `MessageGroupId` is the
//! tenant, `MessageDeduplicationId` the idempotency key. A queue that a
//! `RedrivePolicy` names also hands out, deletes and counts the dead jobs of its
//! source queues (`sqs/dead.rs`). A created queue's `MessageRetentionPeriod`
//! expires its old messages (`sqs/retention.rs`).

pub mod created;
mod dead;
mod error;
mod handle;
mod message;
mod moves;
mod params;
mod queues;
mod receive;
mod retention;
mod send;
mod settle;
mod sigv4;
mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use axum::routing::post;
use serde_json::{Map, Value};

use super::ApiArgs;
use super::auth::{Caller, Role};
use crate::config::Config;
use error::{ErrorKind, SqsError};

/// How long an action may wait for the Broker (a long poll waits its own time on top).
const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// What the SQS API keeps between requests.
pub struct SqsState {
    /// When this API started (Unix ms): the `CreatedTimestamp` of configured queues.
    started_at: i64,
    /// The last `PurgeQueue` of each queue (SQS allows one per 60 seconds).
    purges: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Held while an action changes the SQS-created queues, so two changes do not
    /// interleave their store writes and Supervisor applies.
    queue_writes: tokio::sync::Mutex<()>,
    /// The message move tasks started on this node.
    moves: Arc<moves::MoveTasks>,
    /// The dead jobs handed out through dead-letter queues on this node.
    dead: Arc<dead::DeadLeases>,
    /// When this node last read the SQS queues other nodes created, for a
    /// request naming a queue not in force here (`queues::catch_up`).
    caught_up: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// Expires messages past their queue's `MessageRetentionPeriod`; stops with
    /// the routes.
    _retention: retention::Sweeper,
}

impl SqsState {
    fn new(args: &ApiArgs) -> Self {
        SqsState {
            started_at: crate::clock::wall_ms(),
            purges: Mutex::new(HashMap::new()),
            queue_writes: tokio::sync::Mutex::new(()),
            moves: Arc::default(),
            dead: Arc::default(),
            caught_up: tokio::sync::Mutex::new(None),
            _retention: retention::Sweeper::start(args.store.clone(), args.limits.clone()),
        }
    }
}

/// The SQS routes (`POST /` and `POST /ACCOUNT/QUEUE`, also as GET with the query
/// string), for `api::router` to merge when `[sqs] enabled`; their background
/// work (the retention sweep) runs as long as they exist.
pub fn routes(args: &ApiArgs) -> Router<Arc<ApiArgs>> {
    let state = Arc::new(SqsState::new(args));
    Router::new()
        .route("/", post(serve).get(serve))
        .route("/{account}/{queue}", post(serve).get(serve))
        .layer(Extension(state))
}

/// One request in the context its action runs in.
pub(crate) struct Ctx {
    pub args: Arc<ApiArgs>,
    pub config: Arc<Config>,
    pub caller: Caller,
    pub state: Arc<SqsState>,
    pub params: Map<String, Value>,
    /// `(account, queue)` when the request was posted to a queue URL.
    pub path_queue: Option<(String, String)>,
}

async fn serve(
    State(args): State<Arc<ApiArgs>>,
    Extension(state): Extension<Arc<SqsState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request_id = uuid::Uuid::now_v7().to_string();
    let guess = if headers.contains_key("x-amz-target") {
        wire::Protocol::Json
    } else {
        wire::Protocol::Query
    };
    let body = match body {
        Ok(body) => body,
        Err(e) => {
            let err = SqsError::invalid(format!(
                "the request body could not be read: {}",
                e.body_text()
            ));
            return wire::error(guess, &request_id, &err);
        }
    };
    let config = args.config();
    let request = match wire::read(&headers, uri.query(), &body) {
        Ok(r) => r,
        Err((protocol, err)) => return wire::error(protocol, &request_id, &err),
    };
    let caller = match authorise(&args, &method, &uri, &headers, &body) {
        Ok(c) => c,
        Err(err) => return wire::error(request.protocol, &request_id, &err),
    };
    let path_queue = {
        let mut parts = uri.path().trim_matches('/').split('/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(q), None) if !a.is_empty() => Some((a.to_string(), q.to_string())),
            _ => None,
        }
    };
    let mut ctx = Ctx {
        args,
        config,
        caller,
        state,
        params: request.params,
        path_queue,
    };
    let mut result = dispatch(&ctx, &request.action).await;
    // A queue this node does not have may have been created on another node a
    // moment ago; the answer is only given once this node has read the store. A
    // queue is looked up before anything is done, so the retry repeats nothing.
    if result
        .as_ref()
        .is_err_and(|e| e.kind == ErrorKind::QueueDoesNotExist)
        && queues::catch_up(&ctx).await
    {
        ctx.config = ctx.args.config();
        result = dispatch(&ctx, &request.action).await;
    }
    match result {
        Ok(result) => wire::answer(request.protocol, &request.action, &request_id, result),
        Err(err) => wire::error(request.protocol, &request_id, &err),
    }
}

/// Who is calling: with no token configured, anyone (the API is then
/// loopback-only, as the HTTP API); else the token whose access key signed the
/// request (`sigv4.rs`).
fn authorise(
    args: &ApiArgs,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Caller, SqsError> {
    let tokens = args.tokens.get();
    if tokens.is_open() {
        return Ok(Caller::Open);
    }
    let request = sigv4::Signed {
        method,
        uri,
        headers,
        body,
    };
    sigv4::verify(&request, &tokens, std::time::SystemTime::now())
}

async fn dispatch(ctx: &Ctx, action: &str) -> Result<Value, SqsError> {
    match action {
        "GetQueueUrl" => queues::get_queue_url(ctx),
        "ListQueues" => queues::list_queues(ctx),
        "CreateQueue" => queues::create_queue(ctx).await,
        "DeleteQueue" => queues::delete_queue(ctx).await,
        "SetQueueAttributes" => queues::set_queue_attributes(ctx).await,
        "TagQueue" => queues::tag_queue(ctx).await,
        "UntagQueue" => queues::untag_queue(ctx).await,
        "ListQueueTags" => queues::list_queue_tags(ctx),
        "ListDeadLetterSourceQueues" => queues::list_dead_letter_source_queues(ctx),
        "GetQueueAttributes" => queues::get_queue_attributes(ctx).await,
        "PurgeQueue" => queues::purge_queue(ctx).await,
        "SendMessage" => send::send_message(ctx).await,
        "SendMessageBatch" => send::send_message_batch(ctx).await,
        "ReceiveMessage" => receive::receive_message(ctx).await,
        "DeleteMessage" => settle::delete_message(ctx).await,
        "DeleteMessageBatch" => settle::delete_message_batch(ctx).await,
        "ChangeMessageVisibility" => settle::change_visibility(ctx).await,
        "ChangeMessageVisibilityBatch" => settle::change_visibility_batch(ctx).await,
        "StartMessageMoveTask" => moves::start(ctx).await,
        "ListMessageMoveTasks" => moves::list(ctx),
        "CancelMessageMoveTask" => moves::cancel(ctx),
        "AddPermission" | "RemovePermission" => Err(SqsError::new(
            ErrorKind::UnsupportedOperation,
            format!(
                "qd does not support {action}; see daemon/docs/sqs.md for the actions it answers"
            ),
        )),
        other => Err(SqsError::new(
            ErrorKind::InvalidAction,
            format!("The action {other} is not valid for this endpoint."),
        )),
    }
}

impl Ctx {
    /// The queue the request names: its `QueueUrl` parameter, else the URL it was
    /// posted to; it must be one of this account's queues in the config.
    ///
    /// Errors: `MissingParameter` without either, `QueueDoesNotExist` for another
    /// account or a queue qd does not have.
    pub fn queue(&self) -> Result<String, SqsError> {
        let (account, name) = match params::opt_str(&self.params, "QueueUrl")? {
            Some(url) => split_queue_url(url).ok_or_else(|| SqsError::no_queue(url))?,
            None => self
                .path_queue
                .clone()
                .ok_or_else(|| SqsError::missing("QueueUrl"))?,
        };
        if account != self.config.sqs.account_id || !self.config.queues.contains_key(&name) {
            return Err(SqsError::no_queue(&name));
        }
        Ok(name)
    }

    /// `ADVERTISED_URL/ACCOUNT/NAME`.
    pub fn queue_url(&self, name: &str) -> String {
        let sqs = &self.config.sqs;
        format!("{}/{}/{name}", sqs.advertised_url, sqs.account_id)
    }

    /// `arn:aws:sqs:REGION:ACCOUNT:NAME`.
    pub fn arn(&self, name: &str) -> String {
        let sqs = &self.config.sqs;
        format!("arn:aws:sqs:{}:{}:{name}", sqs.region, sqs.account_id)
    }

    /// The queue of `config` an ARN of this account and region names.
    pub fn queue_of_arn(&self, config: &Config, arn: &str) -> Option<String> {
        let name = arn.strip_prefix(&self.arn(""))?;
        config.queues.contains_key(name).then(|| name.to_string())
    }

    /// Ok if the caller may use `queue` with `role` (any role when `None`);
    /// `AccessDenied` naming the token if not.
    pub fn allow(&self, role: Option<Role>, queue: &str) -> Result<(), SqsError> {
        let checked = match role {
            Some(role) => self.caller.allow(role, queue),
            None => self.caller.allow_queue(queue),
        };
        checked.map_err(|e| SqsError::new(ErrorKind::AccessDenied, e.message))
    }
}

/// `(account, name)` of a queue URL `scheme://host/ACCOUNT/NAME` (or the path alone).
fn split_queue_url(url: &str) -> Option<(String, String)> {
    let path = match url.split_once("://") {
        Some((_, rest)) => &rest[rest.find('/')?..],
        None => url,
    };
    let mut parts = path.trim_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(q), None) if !a.is_empty() && !q.is_empty() => {
            Some((a.to_string(), q.to_string()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_urls_split_into_account_and_name() {
        let split = |u| split_queue_url(u);
        assert_eq!(
            split("http://127.0.0.1:7070/000000000000/emails"),
            Some(("000000000000".into(), "emails".into()))
        );
        assert_eq!(
            split("/000000000000/emails/"),
            Some(("000000000000".into(), "emails".into()))
        );
        assert_eq!(split("http://h"), None);
        assert_eq!(split("http://h/a/b/c"), None);
        assert_eq!(split("emails"), None);
    }
}
