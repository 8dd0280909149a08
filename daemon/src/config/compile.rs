//! Compiling raw sections into typed settings: `[daemon]`, `[tenants]` and
//! `[rate_limiters]` here, queues in `compile/queue.rs`, executors in
//! `compile/executor.rs`. Each check records its problem and goes on with a
//! default, so one run finds every problem.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::diag::{self, Diagnostics, KeyPath};
use super::raw::{self, Named, RawConsole, RawDaemon, RawRateLimiter, RawTenant};
use super::units::{is_valid_name, parse_mode};
use super::{
    Config, ConfigError, ConsoleConfig, DaemonConfig, DatabaseConfig, HttpLimits,
    RateLimiterConfig, RestartIntensity, TenantConfig,
};
use super::{HistoryLimits, MIN_MAX_ERROR};

mod environment;
mod executor;
mod queue;
mod schedule;
mod sqs;

/// The tenant every job without one belongs to; it always exists.
pub(crate) const DEFAULT_TENANT: &str = "default";

/// Compiles a whole document; `source` must be absolute (relative paths in the
/// file are resolved against its directory). With `machine`, the checks against
/// the machine (token file, admin group, executors) run in the same pass.
pub(crate) fn compile(
    text: &str,
    source: &Path,
    machine: Option<&dyn super::MachineChecks>,
) -> Result<Config, Vec<ConfigError>> {
    let (table, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        return Err(diag::syntax_errors(text, &syntax));
    }
    let span = table.span();
    let root = Spanned::new(span, DeValue::Table(table.into_inner()));
    let mut diag = Diagnostics::new(text, &root);
    let doc = raw::read(&mut diag);
    let base_dir = source.parent().unwrap_or_else(|| Path::new("/"));

    let daemon = compile_daemon(&mut diag, &doc.daemon, base_dir);
    let console = doc
        .console
        .as_ref()
        .map(|raw| compile_console(&mut diag, raw, &daemon));
    let tenants = compile_tenants(&mut diag, &doc.tenants);
    let rate_limiters = compile_rate_limiters(&mut diag, &doc.rate_limiters);
    let sqs = sqs::compile_sqs(&mut diag, &doc.sqs, daemon.api_listen);
    let scope = queue::Scope {
        base_dir,
        tenants: names(&doc.tenants),
        rate_limiters: names(&doc.rate_limiters),
    };
    let queues = queue::compile_queues(&mut diag, &doc, &scope);
    check_fence(&mut diag, &daemon, &queues);
    let schedules = schedule::compile_schedules(&mut diag, &doc, &queues, daemon.max_payload);
    if let Some(machine) = machine {
        environment::check(&mut diag, machine, &daemon, &queues);
    }

    let errors = diag.into_errors();
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Config {
        daemon,
        console,
        queues,
        rate_limiters,
        tenants,
        sqs,
        schedules,
        source: source.to_path_buf(),
    })
}

/// On a cluster, refuses a command queue whose `kill_grace` the leader's
/// `fence_wait` does not cover: a node cut off from the database stops its
/// attempts once its heartbeat is `node_timeout` old (SIGTERM, SIGKILL
/// `kill_grace` later), and the leader may hand their jobs to another node
/// `node_timeout + fence_wait` after that heartbeat, so `kill_grace +
/// FENCE_MARGIN <= fence_wait` keeps the two runs apart (`cluster.md`).
fn check_fence(
    diag: &mut Diagnostics<'_>,
    daemon: &super::DaemonConfig,
    queues: &std::collections::BTreeMap<String, super::QueueConfig>,
) {
    let Some(fence_wait) = daemon.database.as_ref().and_then(|d| d.fence_wait) else {
        return;
    };
    for (name, queue) in queues {
        let crate::executor::spec::ExecutorSpec::Command(command) = &queue.executor else {
            continue;
        };
        if command.kill_grace + super::database::FENCE_MARGIN > fence_wait {
            diag.error(
                &KeyPath::of(&["queues", name, "kill_grace"]),
                format!(
                    "{} plus {}s of margin is longer than daemon.fence_wait ({}): a node cut \
                     off from the database could still be stopping this queue's job when the \
                     leader hands it to another node; raise daemon.fence_wait to at least {} \
                     or lower kill_grace",
                    humantime::format_duration(command.kill_grace),
                    super::database::FENCE_MARGIN.as_secs(),
                    humantime::format_duration(fence_wait),
                    humantime::format_duration(command.kill_grace + super::database::FENCE_MARGIN),
                ),
            );
        }
    }
}

/// `base_dir/path`, or `path` itself when it is absolute, with `.` and `..`
/// resolved lexically (`/etc/qd/../var/qd` is `/etc/var/qd`), so logs and `qctl
/// status` show the path an operator would write.
pub(crate) fn resolve(base_dir: &Path, path: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for part in base_dir.join(path).components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push(part);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Records an error unless `value >= 1`.
pub(crate) fn at_least_one<T: PartialOrd + From<u8>>(
    diag: &mut Diagnostics<'_>,
    path: &KeyPath,
    value: T,
) {
    if value < T::from(1) {
        diag.error(path, "must be at least 1");
    }
}

/// Records an error for a name outside `[A-Za-z0-9_.-]{1,64}`.
pub(crate) fn check_name(diag: &mut Diagnostics<'_>, path: &KeyPath, what: &str, name: &str) {
    if !is_valid_name(name) {
        diag.error(
            path,
            format!("invalid {what} name {name:?}: use 1 to 64 characters from A-Z a-z 0-9 _ . -"),
        );
    }
}

fn listen_address(
    diag: &mut Diagnostics<'_>,
    key: &str,
    given: Option<&str>,
    default: SocketAddr,
) -> SocketAddr {
    let Some(text) = given else { return default };
    text.parse().unwrap_or_else(|e| {
        diag.error(
            &KeyPath::of(&["daemon", key]),
            format!("invalid address {text:?}: {e} (expected IP:PORT, e.g. \"127.0.0.1:7070\")"),
        );
        default
    })
}

fn compile_daemon(diag: &mut Diagnostics<'_>, raw: &RawDaemon, base_dir: &Path) -> DaemonConfig {
    let at = |key: &str| KeyPath::of(&["daemon", key]);
    let path = |given: &Option<String>, default: &str| {
        resolve(base_dir, given.as_deref().unwrap_or(default))
    };
    let admin_socket_mode = match raw.admin_socket_mode.as_deref().map(parse_mode) {
        None => 0o660,
        Some(Ok(mode)) => mode,
        Some(Err(e)) => {
            diag.error(&at("admin_socket_mode"), e);
            0o660
        }
    };
    let api_listen = listen_address(
        diag,
        "api_listen",
        raw.api_listen.as_deref(),
        SocketAddr::from(([127, 0, 0, 1], 7070)),
    );
    let metrics_listen = listen_address(
        diag,
        "metrics_listen",
        raw.metrics_listen.as_deref(),
        SocketAddr::from(([127, 0, 0, 1], 9464)),
    );
    let max_payload = raw.max_payload.map_or(1 << 20, |s| s.0);
    at_least_one(diag, &at("max_payload"), max_payload);
    let max_payload = usize::try_from(max_payload).unwrap_or_else(|_| {
        diag.error(&at("max_payload"), "too large for this machine");
        usize::MAX
    });
    let api_tokens_file = raw.api_tokens_file.as_deref().map(|p| resolve(base_dir, p));
    if !api_listen.ip().is_loopback()
        && api_tokens_file.is_none()
        && !diag.is_broken(&at("api_tokens_file"))
    {
        diag.error(
            &at("api_listen"),
            format!("api_listen {api_listen} is not loopback; set daemon.api_tokens_file"),
        );
    }
    let api_allowed_hosts = allowed_hosts(diag, &at("api_allowed_hosts"), &raw.api_allowed_hosts);
    DaemonConfig {
        data_dir: path(&raw.data_dir, "/var/lib/qd"),
        database: compile_database(diag, raw, base_dir),
        admin_socket: path(&raw.admin_socket, "/run/qd/qctl.sock"),
        admin_socket_mode,
        admin_group: raw.admin_group.clone(),
        api_listen,
        metrics_listen,
        shutdown_grace: raw.shutdown_grace.map_or(Duration::from_secs(30), |d| d.0),
        max_payload,
        api_tokens_file,
        api_allowed_hosts,
        restart: compile_restart(diag, raw),
        history: compile_history(diag, raw),
        http: compile_http(diag, raw),
    }
}

fn compile_http(diag: &mut Diagnostics<'_>, raw: &RawDaemon) -> HttpLimits {
    let at = |key: &str| KeyPath::of(&["daemon", "http", key]);
    let given = raw.http.as_ref();
    let default = HttpLimits::default();
    let mut timeout = |key: &str, value: Option<Duration>, default: Duration| {
        let value = value.unwrap_or(default);
        if value < Duration::from_millis(10) {
            diag.error(&at(key), "must be at least 10ms");
        }
        value
    };
    let header_timeout = timeout(
        "header_timeout",
        given.and_then(|h| h.header_timeout).map(|d| d.0),
        default.header_timeout,
    );
    let body_timeout = timeout(
        "body_timeout",
        given.and_then(|h| h.body_timeout).map(|d| d.0),
        default.body_timeout,
    );
    let idle_timeout = timeout(
        "idle_timeout",
        given.and_then(|h| h.idle_timeout).map(|d| d.0),
        default.idle_timeout,
    );
    let max_connections = given
        .and_then(|h| h.max_connections)
        .unwrap_or(default.max_connections);
    if max_connections < 1 {
        diag.error(&at("max_connections"), "must be at least 1");
    }
    HttpLimits {
        header_timeout,
        body_timeout,
        idle_timeout,
        max_connections: max_connections.max(1),
    }
}

fn compile_console(
    diag: &mut Diagnostics<'_>,
    raw: &RawConsole,
    daemon: &DaemonConfig,
) -> ConsoleConfig {
    let at = |key: &str| KeyPath::of(&["console", key]);
    let fallback = SocketAddr::from(([127, 0, 0, 1], 7071));
    let listen = match raw.listen.as_deref() {
        None => {
            diag.error(
                &at("listen"),
                "the console needs its own listener, e.g. listen = \"127.0.0.1:7071\" (remove [console] to turn it off)",
            );
            fallback
        }
        Some(text) => text.parse().unwrap_or_else(|e| {
            diag.error(
                &at("listen"),
                format!(
                    "invalid address {text:?}: {e} (expected IP:PORT, e.g. \"127.0.0.1:7071\")"
                ),
            );
            fallback
        }),
    };
    if !listen.ip().is_loopback() && daemon.api_tokens_file.is_none() {
        diag.error(
            &at("listen"),
            format!("console listen {listen} is not loopback; set daemon.api_tokens_file (console logins use its tokens)"),
        );
    }
    let path_prefix = raw.path_prefix.clone().unwrap_or_default();
    let prefix_ok = path_prefix.is_empty()
        || (path_prefix.starts_with('/')
            && !path_prefix.ends_with('/')
            && path_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b))
            && !path_prefix.contains("//"));
    if !prefix_ok {
        diag.error(
            &at("path_prefix"),
            format!("invalid path_prefix {path_prefix:?}: a path like \"/qd\" (starting with /, no trailing /, letters, digits, - . _ ~)"),
        );
    }
    let session_idle = raw
        .session_idle
        .map_or(Duration::from_secs(30 * 60), |d| d.0);
    let session_max = raw
        .session_max
        .map_or(Duration::from_secs(12 * 3600), |d| d.0);
    if session_idle.is_zero() || session_max < session_idle {
        diag.error(&at("session_idle"), "need 0 < session_idle <= session_max");
    }
    let max_streams = raw.max_streams.unwrap_or(32);
    if max_streams == 0 {
        diag.error(&at("max_streams"), "must be at least 1");
    }
    ConsoleConfig {
        listen,
        path_prefix,
        allowed_hosts: allowed_hosts(diag, &at("allowed_hosts"), &raw.allowed_hosts),
        session_idle,
        session_max,
        max_streams,
    }
}

/// A list of `Host` names (`api_allowed_hosts`, `console.allowed_hosts`), each checked.
pub(crate) fn allowed_hosts(
    diag: &mut Diagnostics<'_>,
    path: &KeyPath,
    given: &Option<Vec<String>>,
) -> Vec<String> {
    let hosts = given.clone().unwrap_or_default();
    for host in &hosts {
        if let Err(e) = check_allowed_host(host) {
            diag.error(path, e);
        }
    }
    hosts
}

/// Checks a configured allowed host (`name`, `name:port`, `[v6]:port`): a problem
/// in words, for the config compiler.
fn check_allowed_host(host: &str) -> Result<(), String> {
    let ok_char = |b: u8| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b);
    if host.is_empty() || host.len() > 255 || !host.bytes().all(ok_char) {
        return Err(format!(
            "{host:?} is not a host name: give a name or name:port as a browser sends it in Host, \
             e.g. \"qd.example.com\" or \"qd.example.com:8443\" (no scheme, no path)"
        ));
    }
    Ok(())
}

fn compile_database(
    diag: &mut Diagnostics<'_>,
    raw: &RawDaemon,
    base_dir: &Path,
) -> Option<DatabaseConfig> {
    let at = |key: &str| KeyPath::of(&["daemon", key]);
    let password_file = raw
        .database_password_file
        .as_deref()
        .map(|p| resolve(base_dir, p));
    let Some(url) = &raw.database_url else {
        let cluster_only = [
            ("database_password_file", password_file.is_some()),
            ("node_name", raw.node_name.is_some()),
            ("node_timeout", raw.node_timeout.is_some()),
            ("fence_wait", raw.fence_wait.is_some()),
            ("poll_interval", raw.poll_interval.is_some()),
        ];
        for (key, set) in cluster_only {
            if set {
                diag.error(
                    &at(key),
                    "set without daemon.database_url; remove it or name the database",
                );
            }
        }
        return None;
    };
    let mut database = DatabaseConfig::parse(url, password_file)
        .map_err(|e| diag.error(&at("database_url"), e))
        .ok()?;
    if let Some(name) = &raw.node_name {
        check_name(diag, &at("node_name"), "node", name);
        database.node_name = name.clone();
    }
    if let Some(timeout) = raw.node_timeout {
        if timeout.0 < Duration::from_secs(1) {
            diag.error(&at("node_timeout"), "must be at least 1s");
        }
        database.node_timeout = timeout.0;
    }
    if let Some(wait) = raw.fence_wait {
        if wait.0 > Duration::from_secs(3600) {
            diag.error(&at("fence_wait"), "must be at most 1h");
        }
        database.fence_wait = Some(wait.0);
    }
    if let Some(poll) = raw.poll_interval {
        if poll.0 < Duration::from_millis(10) || poll.0 > Duration::from_secs(60) {
            diag.error(&at("poll_interval"), "must be between 10ms and 60s");
        }
        database.poll_interval = poll.0;
    }
    Some(database)
}

fn compile_history(diag: &mut Diagnostics<'_>, raw: &RawDaemon) -> HistoryLimits {
    let at = |key: &str| KeyPath::of(&["daemon", "history", key]);
    let given = raw.history.as_ref();
    let default = HistoryLimits::default();
    let keep_last = given.and_then(|h| h.keep_last).unwrap_or(default.keep_last);
    if keep_last < 1 {
        diag.error(
            &at("keep_last"),
            "must be at least 1: the newest history entry is always kept",
        );
    }
    let max_error = given
        .and_then(|h| h.max_error)
        .map_or(default.max_error as u64, |s| s.0);
    if max_error < MIN_MAX_ERROR as u64 {
        diag.error(
            &at("max_error"),
            format!("must be at least {MIN_MAX_ERROR} bytes (got {max_error})"),
        );
    }
    HistoryLimits {
        keep_first: given
            .and_then(|h| h.keep_first)
            .unwrap_or(default.keep_first),
        keep_last: keep_last.max(1),
        max_error: usize::try_from(max_error).unwrap_or(usize::MAX),
    }
}

fn compile_restart(diag: &mut Diagnostics<'_>, raw: &RawDaemon) -> RestartIntensity {
    let restart = raw.restart.as_ref();
    let max_restarts = restart.and_then(|r| r.max_restarts).unwrap_or(10);
    let window = restart
        .and_then(|r| r.window)
        .map_or(Duration::from_secs(60), |d| d.0);
    at_least_one(
        diag,
        &KeyPath::of(&["daemon", "restart", "max_restarts"]),
        max_restarts,
    );
    if window.is_zero() {
        diag.error(
            &KeyPath::of(&["daemon", "restart", "window"]),
            "must be longer than 0s",
        );
    }
    RestartIntensity {
        max_restarts,
        window,
    }
}

fn compile_tenants(
    diag: &mut Diagnostics<'_>,
    tenants: &[Named<RawTenant>],
) -> BTreeMap<String, TenantConfig> {
    let mut compiled = BTreeMap::new();
    for Named { name, raw } in tenants {
        let path = KeyPath::of(&["tenants", name]);
        check_name(diag, &path, "tenant", name);
        let Some(raw) = raw else { continue };
        let tenant = TenantConfig {
            weight: raw.weight.unwrap_or(1),
            max_concurrency: raw.max_concurrency,
            max_depth: raw.max_depth,
        };
        at_least_one(diag, &path.join(&["weight"]), tenant.weight);
        if let Some(cap) = tenant.max_concurrency {
            at_least_one(diag, &path.join(&["max_concurrency"]), cap);
        }
        if let Some(depth) = tenant.max_depth {
            at_least_one(diag, &path.join(&["max_depth"]), depth);
        }
        compiled.insert(name.clone(), tenant);
    }
    compiled
        .entry(DEFAULT_TENANT.to_owned())
        .or_insert_with(TenantConfig::default);
    compiled
}

fn compile_rate_limiters(
    diag: &mut Diagnostics<'_>,
    limiters: &[Named<RawRateLimiter>],
) -> BTreeMap<String, RateLimiterConfig> {
    let mut compiled = BTreeMap::new();
    for Named { name, raw } in limiters {
        let path = KeyPath::of(&["rate_limiters", name]);
        check_name(diag, &path, "rate limiter", name);
        let Some(raw) = raw else { continue };
        let limiter = RateLimiterConfig {
            per_second: raw.per_second,
            burst: raw.burst.unwrap_or(raw.per_second),
        };
        at_least_one(diag, &path.join(&["per_second"]), limiter.per_second);
        if let Some(burst) = raw.burst {
            at_least_one(diag, &path.join(&["burst"]), burst);
        }
        compiled.insert(name.clone(), limiter);
    }
    compiled
}

/// Names defined in a `[family.NAME]` section, including ones whose body is broken.
fn names<T>(entries: &[Named<T>]) -> BTreeSet<&str> {
    entries.iter().map(|e| e.name.as_str()).collect()
}
