//! API authentication: bearer tokens from `daemon.api_tokens_file`, each with a
//! name, roles and the queues it may use.
//!
//! The file is TOML and must not be readable by group or other (mode 0600 or 0400,
//! like an ssh key); it is read at start-up and again on every config reload
//! (SIGHUP, `qctl reload`), which swaps the whole set in [`LiveTokens`]:
//!
//! ```toml
//! [[tokens]]
//! name = "billing-workers"       # shown in errors, never the secret
//! token = "b3f1…"                # the bearer secret, 16 to 512 visible ASCII bytes
//! roles = ["work"]               # any of "produce", "work", "read", "admin"
//! queues = ["billing"]           # queue names, or ["*"] for every queue
//! access_key_id = "AKIDBILLING"  # optional: AWS credentials for the SQS API (SigV4),
//! secret_access_key = "…"        #   both or neither; the same roles and queues apply
//! ```
//!
//! With no file configured the API is open and loopback-only (the config compiler
//! refuses a non-loopback `api_listen` without a token file). With one, every `/v1`
//! request needs `Authorization: Bearer <token>`: the [`authenticate`] middleware
//! answers 401 (with `WWW-Authenticate: Bearer`, RFC 6750) for a missing or unknown
//! token and puts the [`Caller`] in the request's extensions; each handler then asks
//! [`Caller::allow`] for its role and queue, which answers 403. Presented tokens are
//! compared with every configured one in constant time (`subtle`), with no early exit,
//! and are never logged.

use std::collections::{BTreeSet, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::ApiError;
use crate::config::Config;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Enqueue jobs (`POST /v1/queues/{queue}/jobs`).
    Produce,
    /// Work an external queue: lease, heartbeat, ack, nack.
    Work,
    /// Read a job's status and history (`GET /v1/jobs/{id}`); in the web console,
    /// look at every page.
    Read,
    /// In the web console: act (pause, resume, workers, cancel, redrive, purge,
    /// limits). It grants nothing on the HTTP API.
    Admin,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Produce => "produce",
            Role::Work => "work",
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }
}

/// Why the token file cannot be used. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file cannot be read (missing, not a file, no permission).
    #[error("api_tokens_file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Group or other may read or write it.
    #[error(
        "api_tokens_file {} has mode {mode:04o}; it holds secrets, so group and other must have no access (chmod 600)",
        path.display()
    )]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Not valid TOML of the documented shape, or a token breaks a rule.
    #[error("api_tokens_file {}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (the token's name, never its secret).
        message: String,
    },
}

/// The shortest and longest secret accepted, in bytes.
const SECRET_LEN: std::ops::RangeInclusive<usize> = 16..=512;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    tokens: Vec<RawToken>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: String,
    token: String,
    roles: Vec<Role>,
    queues: Vec<String>,
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
}

/// What one token grants.
#[derive(Debug)]
pub struct Grant {
    /// The token's name (for errors and logs).
    pub name: String,
    roles: BTreeSet<Role>,
    /// `None` = every queue.
    queues: Option<BTreeSet<String>>,
}

struct Entry {
    secret: Vec<u8>,
    grant: Arc<Grant>,
    /// AWS credentials for the SQS API: access key id and secret access key.
    aws: Option<(String, String)>,
}

/// The configured tokens; empty means the API is open (loopback-only).
pub struct Tokens {
    entries: Vec<Entry>,
}

impl Tokens {
    /// No tokens: every request is allowed.
    pub fn open() -> Tokens {
        Tokens {
            entries: Vec::new(),
        }
    }

    /// Loads `config.daemon.api_tokens_file`, or [`Tokens::open`] when it is not set.
    ///
    /// # Errors
    /// See [`Tokens::load`].
    pub fn from_config(config: &Config) -> Result<Tokens, TokenFileError> {
        match &config.daemon.api_tokens_file {
            None => Ok(Tokens::open()),
            Some(path) => Tokens::load(path, |q| config.queues.contains_key(q)),
        }
    }

    /// Reads and checks the token file at `path`; `known_queue` says whether a queue
    /// name is configured (a token naming an unknown queue is a typo, refused).
    ///
    /// # Errors
    /// [`TokenFileError::Io`] if it cannot be read, [`TokenFileError::Mode`] if group
    /// or other have any access, [`TokenFileError::Invalid`] for bad TOML, no tokens,
    /// a duplicate name or secret, a secret that is too short or long or not visible
    /// ASCII, no roles, or an unknown queue.
    pub fn load(path: &Path, known_queue: impl Fn(&str) -> bool) -> Result<Tokens, TokenFileError> {
        let io = |source| TokenFileError::Io {
            path: path.to_owned(),
            source,
        };
        let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(TokenFileError::Mode {
                path: path.to_owned(),
                mode,
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Tokens::parse(&text, known_queue).map_err(|message| TokenFileError::Invalid {
            path: path.to_owned(),
            message,
        })
    }

    fn parse(text: &str, known_queue: impl Fn(&str) -> bool) -> Result<Tokens, String> {
        let raw: RawFile = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        if raw.tokens.is_empty() {
            return Err("no [[tokens]]; remove api_tokens_file to run loopback-only".into());
        }
        let (mut names, mut secrets, mut keys) = (HashSet::new(), HashSet::new(), HashSet::new());
        let mut entries = Vec::with_capacity(raw.tokens.len());
        for (i, t) in raw.tokens.into_iter().enumerate() {
            let at = format!("tokens[{i}] ({:?})", t.name);
            check_token(&t, &at, &known_queue)?;
            if !names.insert(t.name.clone()) {
                return Err(format!("{at}: the name is used twice"));
            }
            if !secrets.insert(t.token.clone()) {
                return Err(format!("{at}: the same secret is used by two tokens"));
            }
            let aws = aws_credentials(&t, &at)?;
            if let Some((key, _)) = &aws
                && !keys.insert(key.clone())
            {
                return Err(format!("{at}: access_key_id {key:?} is used by two tokens"));
            }
            let queues =
                (!t.queues.iter().any(|q| q == "*")).then(|| t.queues.into_iter().collect());
            entries.push(Entry {
                aws,
                secret: t.token.into_bytes(),
                grant: Arc::new(Grant {
                    name: t.name,
                    roles: t.roles.into_iter().collect(),
                    queues,
                }),
            });
        }
        Ok(Tokens { entries })
    }

    /// The grant of the token whose secret is `presented`, if any. Compares against
    /// every entry in constant time per entry and does not stop at a match.
    fn find(&self, presented: &[u8]) -> Option<Arc<Grant>> {
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.secret.as_slice().ct_eq(presented)) {
                found = Some(entry.grant.clone());
            }
        }
        found
    }
}

/// The AWS credentials of the SQS API (`sqs/sigv4.rs`) for the access key id
/// `key`: the secret access key and the grant of its token. Compares the id with
/// every configured one and does not stop at a match.
pub(super) fn aws_credentials_of(tokens: &Tokens, key: &str) -> Option<(String, Arc<Grant>)> {
    let mut found = None;
    for entry in &tokens.entries {
        if let Some((id, secret)) = &entry.aws
            && bool::from(id.as_bytes().ct_eq(key.as_bytes()))
        {
            found = Some((secret.clone(), entry.grant.clone()));
        }
    }
    found
}

impl Tokens {
    /// True when no tokens are configured (the API is open, loopback-only).
    pub fn is_open(&self) -> bool {
        self.entries.is_empty()
    }

    /// The grant of the token whose secret is `presented` (a console login), in
    /// constant time per configured token.
    pub fn grant_of(&self, presented: &[u8]) -> Option<Arc<Grant>> {
        self.find(presented)
    }
}

impl Grant {
    /// True when the token has `role`.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// True when the token may use every queue (`queues = ["*"]`).
    pub fn every_queue(&self) -> bool {
        self.queues.is_none()
    }
}

/// A token's `access_key_id` and `secret_access_key`: both or neither; the id 16 to
/// 128 of `A-Z0-9`, the secret 16 to 128 visible ASCII characters.
fn aws_credentials(t: &RawToken, at: &str) -> Result<Option<(String, String)>, String> {
    match (&t.access_key_id, &t.secret_access_key) {
        (None, None) => Ok(None),
        (Some(id), Some(secret)) => {
            let id_ok = (16..=128).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
            if !id_ok {
                return Err(format!(
                    "{at}: access_key_id must be 16 to 128 of A-Z and 0-9, like AWS's (AKIA…)"
                ));
            }
            if !(16..=128).contains(&secret.len()) || !secret.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(format!(
                    "{at}: secret_access_key must be 16 to 128 visible ASCII characters"
                ));
            }
            Ok(Some((id.clone(), secret.clone())))
        }
        _ => Err(format!(
            "{at}: give access_key_id and secret_access_key together, or neither"
        )),
    }
}

/// A TOML error as "line N: message", without the source snippet the default
/// rendering quotes (that line may hold a secret).
fn toml_error(text: &str, err: &toml::de::Error) -> String {
    match err.span() {
        Some(span) => {
            let line = text
                .get(..span.start)
                .map_or(0, |t| t.matches('\n').count())
                + 1;
            format!("line {line}: {}", err.message())
        }
        None => err.message().to_string(),
    }
}

fn check_token(t: &RawToken, at: &str, known_queue: &impl Fn(&str) -> bool) -> Result<(), String> {
    if t.name.is_empty() {
        return Err(format!("{at}: name must not be empty"));
    }
    if !SECRET_LEN.contains(&t.token.len()) || !t.token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{at}: token must be {} to {} visible ASCII characters (no spaces), e.g. from `openssl rand -hex 32`",
            SECRET_LEN.start(),
            SECRET_LEN.end()
        ));
    }
    if t.roles.is_empty() {
        return Err(format!(
            "{at}: roles is empty; give any of \"produce\", \"work\", \"read\", \"admin\""
        ));
    }
    if t.queues.is_empty() {
        return Err(format!(
            "{at}: queues is empty; give queue names or [\"*\"]"
        ));
    }
    match t.queues.iter().find(|q| *q != "*" && !known_queue(q)) {
        Some(q) => Err(format!("{at}: queue {q:?} is not configured")),
        None => Ok(()),
    }
}

/// Who is calling, as established by [`authenticate`].
#[derive(Clone, Debug)]
pub enum Caller {
    /// No tokens are configured (loopback-only): everything is allowed.
    Open,
    /// A configured token.
    Token(Arc<Grant>),
}

impl Caller {
    /// Ok if the caller has `role`; 403 `forbidden` naming the token and role if not.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        match self {
            Caller::Token(g) if !g.roles.contains(&role) => Err(forbidden(format!(
                "token {:?} does not have the {:?} role",
                g.name,
                role.name()
            ))),
            _ => Ok(()),
        }
    }

    /// Ok if the caller may use `queue`; 403 `forbidden` naming the token and queue if not.
    pub fn allow_queue(&self, queue: &str) -> Result<(), ApiError> {
        match self {
            Caller::Token(g) if g.queues.as_ref().is_some_and(|qs| !qs.contains(queue)) => Err(
                forbidden(format!("token {:?} may not use queue {queue:?}", g.name)),
            ),
            _ => Ok(()),
        }
    }

    /// [`Caller::require`] then [`Caller::allow_queue`].
    pub fn allow(&self, role: Role, queue: &str) -> Result<(), ApiError> {
        self.require(role)?;
        self.allow_queue(queue)
    }

    /// True when every queue is allowed (no need to look up a job's queue).
    pub fn every_queue(&self) -> bool {
        match self {
            Caller::Open => true,
            Caller::Token(g) => g.queues.is_none(),
        }
    }
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
}

fn unauthorized(message: &str, challenge: &'static str) -> ApiError {
    let mut err = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
    err.challenge = Some(challenge);
    err
}

/// The token set in force; a reload replaces it whole, so a request sees either the
/// old set or the new one, never a mix.
pub struct LiveTokens(RwLock<Arc<Tokens>>);

impl LiveTokens {
    /// Starts with `tokens`.
    pub fn new(tokens: Tokens) -> Self {
        LiveTokens(RwLock::new(Arc::new(tokens)))
    }

    /// The set in force.
    pub fn get(&self) -> Arc<Tokens> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts a freshly loaded set in force.
    pub fn replace(&self, tokens: Tokens) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
    }
}

/// Middleware for the `/v1` routes: establishes the [`Caller`] (in the request's
/// extensions) or answers 401 with a `WWW-Authenticate: Bearer` challenge.
pub async fn authenticate(
    State(live): State<Arc<LiveTokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    let tokens = live.get();
    let caller = if tokens.entries.is_empty() {
        Caller::Open
    } else {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()));
        let Some(presented) = presented else {
            return unauthorized(
                "this API needs a token: send Authorization: Bearer <token>",
                "Bearer realm=\"qd\"",
            )
            .into_response();
        };
        match tokens.find(presented) {
            Some(grant) => Caller::Token(grant),
            None => {
                return unauthorized(
                    "unknown bearer token",
                    "Bearer realm=\"qd\", error=\"invalid_token\"",
                )
                .into_response();
            }
        }
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// The credentials of an `Authorization: Bearer <token>` value (scheme case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !rest.is_empty()).then_some(rest.trim_ascii())
}

#[cfg(test)]
mod tests;
