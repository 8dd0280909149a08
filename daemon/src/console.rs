//! The Console actor: qd's web console at `[console] listen` (off unless the
//! section is present; see `daemon/docs/console.md`).
//!
//! Server-rendered pages (`console/pages.rs`, `maud` templates escaped at compile
//! time) show what `qctl` shows; every action is a plain form whose handler
//! (`console/actions.rs`) sends the same admin request qctl sends, through
//! [`crate::admin::Handler::serve`], so it writes the same audit line, with
//! `console:<token name>` as its author. The overview updates by server-sent
//! events fed by one sampler (`console/live.rs`), with a polling fallback.
//!
//! Every request passes [`guard`] first: the `Host` allow-list (421) and the
//! cross-site check (403) of `api/origin.rs`, and the security headers (strict
//! CSP, `nosniff`, `frame-ancestors 'none'`, `no-store`). Then `console/session.rs`
//! establishes who is asking: a session from a token login (`read` may look,
//! `admin` may act, each POST checks it), or nobody needs to log in on a loopback
//! console without a token file.
//!
//! The actor binds in `pre_start` (a bind failure fails the start, naming the
//! address) and serves from a spawned task; it takes no messages. Supervised by
//! the Supervisor.

mod actions;
mod layout;
mod live;
mod pages;
mod session;
mod who;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::admin::{Author, Handler};
use crate::api::origin::{self, HostAllow};
use crate::config::ConsoleConfig;
use crate::daemon::Daemon;
use session::Sessions;
use who::Who;

/// The registered name of the Console actor.
pub const NAME: &str = "console";

/// The Content-Security-Policy of every response: scripts, styles and images from
/// the console itself only (no inline script or style), no framing, forms post
/// only to the console.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the Console actor is started with.
pub struct ConsoleArgs {
    /// The daemon's shared parts (config, tokens, store, actors).
    pub daemon: Daemon,
}

/// The running server: cancel to stop accepting and sampling.
pub struct ConsoleState {
    stop: CancellationToken,
    /// The bound address.
    pub local_addr: SocketAddr,
}

/// The Console actor.
pub struct Console;

/// What every handler shares.
pub(crate) struct Ctx {
    daemon: Daemon,
    handler: Handler,
    config: ConsoleConfig,
    hosts: HostAllow,
    sessions: Sessions,
    live: live::Live,
    streams: Arc<tokio::sync::Semaphore>,
}

impl Ctx {
    /// `path` (starting with `/`) under the configured prefix: every link, asset,
    /// form action and stream URL is built here.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.path_prefix)
    }

    /// Sends one admin request as `who`.
    pub(crate) async fn admin(
        &self,
        req: qd_proto::Request,
        who: &Who,
    ) -> Result<qd_proto::Response, qd_proto::ErrorBody> {
        self.handler
            .serve(req, Author::Console(who.name.clone()))
            .await
    }

    fn open(&self) -> bool {
        self.daemon.tokens.get().is_open()
    }
}

impl Actor for Console {
    type Msg = ();
    type State = ConsoleState;
    type Arguments = ConsoleArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        args: ConsoleArgs,
    ) -> Result<ConsoleState, ActorProcessingErr> {
        let config = args
            .daemon
            .config()
            .console
            .clone()
            .ok_or("the console is not configured")?;
        let addr = config.listen;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on console.listen {addr}: {e}"))?;
        let local_addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let hosts = HostAllow::new(addr, local_addr, &config.allowed_hosts);
        let ctx = Arc::new(Ctx {
            handler: Handler::new(args.daemon.clone()),
            daemon: args.daemon,
            sessions: Sessions::new(config.session_idle, config.session_max),
            streams: Arc::new(tokio::sync::Semaphore::new(config.max_streams as usize)),
            live: live::Live::new(),
            hosts,
            config,
        });
        tokio::spawn(live::sample(ctx.clone(), stop.clone()));
        let app = router(ctx);
        let shutdown = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(shutdown)
            .await;
        });
        info!(listen = %local_addr, "Web console listening.");
        Ok(ConsoleState { stop, local_addr })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<()>,
        state: &mut ConsoleState,
    ) -> Result<(), ActorProcessingErr> {
        state.stop.cancel();
        Ok(())
    }
}

/// The route table, every path under `path_prefix`.
fn router(ctx: Arc<Ctx>) -> Router {
    let p = |path: &str| ctx.url(path);
    let mut app = Router::new()
        .route(&p("/"), get(pages::overview))
        .route(&p("/live/overview"), get(live::fragment))
        .route(&p("/live/events"), get(live::events))
        .route(&p("/queues/{queue}"), get(pages::queue))
        .route(&p("/queues/{queue}/pause"), post(actions::pause))
        .route(&p("/queues/{queue}/resume"), post(actions::resume))
        .route(&p("/queues/{queue}/workers"), post(actions::workers))
        .route(&p("/jobs"), get(pages::jobs))
        .route(&p("/jobs/{id}"), get(pages::job))
        .route(&p("/jobs/{id}/payload"), get(pages::payload))
        .route(&p("/jobs/{id}/cancel"), post(actions::cancel))
        .route(&p("/jobs/{id}/redrive"), post(actions::redrive_one))
        .route(&p("/dlq"), get(pages::dlq))
        .route(&p("/dlq/redrive"), post(actions::redrive))
        .route(&p("/dlq/purge"), post(actions::purge))
        .route(&p("/limits"), get(pages::limits))
        .route(&p("/limits/tenant"), post(actions::tenant_set))
        .route(&p("/limits/reset"), post(actions::tenant_reset))
        .route(&p("/logout"), post(session::logout));
    if ctx.daemon.config().daemon.database.is_some() {
        app = app.route(&p("/cluster"), get(pages::cluster));
    }
    let app = app
        .route_layer(middleware::from_fn_with_state(
            ctx.clone(),
            session::authenticate,
        ))
        .route(&p("/login"), get(session::login_page).post(session::login))
        .route(&p("/static/console.css"), get(pages::css))
        .route(&p("/static/console.js"), get(pages::js));
    let app = if ctx.config.path_prefix.is_empty() {
        app
    } else {
        let to = p("/");
        app.route(
            &ctx.config.path_prefix,
            get(move || async move { axum::response::Redirect::to(&to) }),
        )
    };
    app.fallback(pages::not_found)
        .layer(middleware::from_fn_with_state(ctx.clone(), guard))
        .layer(axum::extract::DefaultBodyLimit::max(FORM_LIMIT))
        .with_state(ctx)
}

/// The largest form body accepted (bytes): a replaced payload fits in it, bounded
/// by `daemon.max_payload` as well when the request is made.
const FORM_LIMIT: usize = 4 << 20;

/// Every request: `Host` allow-list (421), cross-site check (403), then the
/// security headers on whatever the handler answered.
async fn guard(
    State(ctx): State<Arc<Ctx>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    let mut response = if !ctx.hosts.allows(host) {
        layout::error_page(
            &ctx,
            StatusCode::MISDIRECTED_REQUEST,
            &format!(
                "Host {:?} does not name this console; add it to console.allowed_hosts if it is reached by that name",
                host.unwrap_or("")
            ),
        )
    } else if let Err(refused) = origin::cross_origin(req.method(), req.headers()) {
        tracing::warn!(peer = %peer, path = %req.uri().path(), "Console refused a cross-site request.");
        layout::error_page(&ctx, StatusCode::FORBIDDEN, &refused.to_string())
    } else {
        let method = req.method().clone();
        let mut response = next.run(req).await;
        if method == Method::HEAD {
            *response.body_mut() = axum::body::Body::empty();
        }
        response
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// An answer to a form: a redirect (303) back to `to` with a notice shown there.
pub(crate) fn see_other(ctx: &Ctx, to: &str, notice: &str) -> Response {
    let sep = if to.contains('?') { '&' } else { '?' };
    let location = format!(
        "{}{sep}notice={}",
        ctx.url(to),
        layout::query_escape(notice)
    );
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}
