//! Console sessions: who is asking, established once per request.
//!
//! A login takes a token from `daemon.api_tokens_file` once (a token with the
//! `read` role may look, `admin` may act; it must cover every queue, since the
//! console shows every queue) and keeps a server-side session: a random 256-bit id
//! in an `HttpOnly; SameSite=Strict` cookie (`Secure` when the proxy in front says
//! the request came over https), ending after `console.session_idle` without use or
//! `console.session_max` after login, and at logout. A loopback console without a
//! token file has no login: every request may look and act, as the open API does.
//! Failed logins are logged with the peer address and answered after a pause.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::RngCore;

use super::Ctx;
use super::layout;
use super::who::Who;
use crate::api::auth::Role;

/// The cookie holding the session id.
pub const COOKIE: &str = "qd_console";

/// Most sessions held at once; past it the oldest is ended (a flood of logins
/// cannot grow memory).
const MAX_SESSIONS: usize = 10_000;

/// How long a failed login waits before it is answered (slows guessing; tokens
/// are at least 16 characters anyway).
const FAILED_LOGIN_PAUSE: Duration = Duration::from_millis(500);

struct Session {
    name: String,
    admin: bool,
    created: Instant,
    used: Instant,
}

/// The sessions in force, by id.
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
    idle: Duration,
    max: Duration,
}

impl Sessions {
    /// No sessions; each ends after `idle` unused or `max` after login.
    pub fn new(idle: Duration, max: Duration) -> Self {
        Sessions {
            map: Mutex::new(HashMap::new()),
            idle,
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a session for token `name` at `now`; returns its id.
    pub fn create(&self, name: &str, admin: bool, now: Instant) -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut map = self.lock();
        map.retain(|_, s| self.alive(s, now));
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            id.clone(),
            Session {
                name: name.to_string(),
                admin,
                created: now,
                used: now,
            },
        );
        id
    }

    fn alive(&self, s: &Session, now: Instant) -> bool {
        now.saturating_duration_since(s.used) < self.idle
            && now.saturating_duration_since(s.created) < self.max
    }

    /// The session `id` at `now`, marking it used; `None` (and forgotten) when it
    /// is unknown or has expired.
    pub fn get(&self, id: &str, now: Instant) -> Option<Who> {
        let mut map = self.lock();
        let alive = map.get(id).is_some_and(|s| self.alive(s, now));
        if !alive {
            map.remove(id);
            return None;
        }
        let s = map.get_mut(id)?;
        s.used = now;
        Some(Who {
            name: Some(s.name.clone()),
            admin: s.admin,
            session: Some(id.to_string()),
        })
    }

    /// Ends session `id`.
    pub fn end(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// The session id in the request's cookies.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// Establishes [`Who`] (in the request's extensions), or sends the browser to the
/// login page (a GET) or answers 401 (anything else).
pub async fn authenticate(State(ctx): State<Arc<Ctx>>, mut req: Request, next: Next) -> Response {
    let who = if ctx.open() {
        Some(Who {
            name: None,
            admin: true,
            session: None,
        })
    } else {
        cookie(req.headers()).and_then(|id| ctx.sessions.get(&id, Instant::now()))
    };
    match who {
        Some(who) => {
            req.extensions_mut().insert(who);
            next.run(req).await
        }
        None if req.method() == axum::http::Method::GET => {
            axum::response::Redirect::to(&ctx.url("/login")).into_response()
        }
        None => layout::error_page(
            &ctx,
            StatusCode::UNAUTHORIZED,
            "not logged in (or the session ended): log in again",
        ),
    }
}

/// `GET /login`.
pub async fn login_page(State(ctx): State<Arc<Ctx>>) -> Response {
    if ctx.open() {
        return axum::response::Redirect::to(&ctx.url("/")).into_response();
    }
    layout::login(&ctx, None, StatusCode::OK)
}

/// `POST /login` with `token`: a session, or the form again (401) with a reason.
pub async fn login(
    State(ctx): State<Arc<Ctx>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if ctx.open() {
        return axum::response::Redirect::to(&ctx.url("/")).into_response();
    }
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let token = form
        .iter()
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let grant = ctx.daemon.tokens.get().grant_of(token.as_bytes());
    let refused = match &grant {
        None => Some("unknown token".to_string()),
        Some(g) if !g.has(Role::Read) && !g.has(Role::Admin) => Some(format!(
            "token {:?} has neither the read nor the admin role",
            g.name
        )),
        Some(g) if !g.every_queue() => Some(format!(
            "token {:?} is limited to some queues; the console shows every queue, so it needs queues = [\"*\"]",
            g.name
        )),
        Some(_) => None,
    };
    let Some(grant) = grant.filter(|_| refused.is_none()) else {
        let why = refused.unwrap_or_default();
        tracing::warn!(peer = %peer, reason = %why, "Console login failed.");
        tokio::time::sleep(FAILED_LOGIN_PAUSE).await;
        return layout::login(&ctx, Some(&why), StatusCode::UNAUTHORIZED);
    };
    let id = ctx
        .sessions
        .create(&grant.name, grant.has(Role::Admin), Instant::now());
    tracing::info!(peer = %peer, token = %grant.name, "Console login.");
    let https = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let path = if ctx.config.path_prefix.is_empty() {
        "/"
    } else {
        &ctx.config.path_prefix
    };
    let secure = if https { "; Secure" } else { "" };
    let cookie = format!("{COOKIE}={id}; Path={path}; HttpOnly; SameSite=Strict{secure}");
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, ctx.url("/")),
        ],
    )
        .into_response()
}

/// `POST /logout`: ends the session on the server and clears the cookie.
pub async fn logout(
    State(ctx): State<Arc<Ctx>>,
    axum::Extension(who): axum::Extension<Who>,
) -> Response {
    if let Some(id) = &who.session {
        ctx.sessions.end(id);
    }
    let path = if ctx.config.path_prefix.is_empty() {
        "/"
    } else {
        &ctx.config.path_prefix
    };
    let clear = format!("{COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0");
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, clear),
            (header::LOCATION, ctx.url("/login")),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_when_idle_or_too_old_and_at_logout() {
        let s = Sessions::new(Duration::from_secs(60), Duration::from_secs(300));
        let t0 = Instant::now();
        let id = s.create("ops", true, t0);
        assert_eq!(id.len(), 64, "256 random bits, hex");
        assert_ne!(id, s.create("ops", true, t0), "ids are random");
        // Used every 50 s, it stays alive until the absolute limit.
        for n in 1..6 {
            let who = s.get(&id, t0 + Duration::from_secs(50 * n)).expect("alive");
            assert_eq!(who.name.as_deref(), Some("ops"));
        }
        assert!(
            s.get(&id, t0 + Duration::from_secs(300)).is_none(),
            "max age"
        );
        let idle = s.create("ro", false, t0);
        assert!(!s.get(&idle, t0).expect("alive").admin);
        assert!(s.get(&idle, t0 + Duration::from_secs(61)).is_none(), "idle");
        let out = s.create("ops", true, t0);
        s.end(&out);
        assert!(s.get(&out, t0).is_none(), "logged out");
        assert!(s.get("not-a-session", t0).is_none());
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; qd_console=abc; b=2".parse().expect("header"),
        );
        assert_eq!(cookie(&h).as_deref(), Some("abc"));
        assert_eq!(cookie(&HeaderMap::new()), None);
    }
}
