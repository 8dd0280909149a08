//! The configuration compiler: a TOML file in, typed and validated settings out.
//!
//! Owns the config file format (keys and defaults are listed in
//! `config/production.toml`). The pipeline, after vector's `src/config`:
//! 1. parse into toml's spanned tree (`diag.rs`); syntax errors stop here;
//! 2. read each section into raw serde structs that deny unknown keys (`raw.rs`);
//! 3. compile: apply `[defaults]` key by key, resolve relative paths against the
//!    config file's directory, check meaning (`compile.rs`, `compile/queue.rs`,
//!    `compile/executor.rs`).
//!
//! Every problem found by any step is reported at once, with its key path and,
//! where the file has the key, its line and column ([`ConfigErrors`]).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use database::{DatabaseConfig, describe_postgres};

mod compile;
/// The tenant of jobs enqueued without one; every tenant without a `[tenants.NAME]`
/// table inherits its limits.
pub(crate) use compile::DEFAULT_TENANT;
mod database;
mod diag;
mod raw;
mod units;
pub(crate) use units::is_valid_name;

#[cfg(test)]
mod tests;

/// The history cap (`[daemon] history = { keep_first, keep_last, max_error }`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Oldest entries always kept (default 5; may be 0).
    pub keep_first: u32,
    /// Newest entries always kept (default 20; at least 1, so the numbering of
    /// entries never restarts and the latest attempt is always shown).
    pub keep_last: u32,
    /// Most bytes of error text stored per entry (default 2 KiB; at least
    /// [`MIN_MAX_ERROR`]). Longer text keeps its first quarter and its end.
    pub max_error: usize,
}

/// The smallest `max_error`: room for the elision marker and some text around it.
pub const MIN_MAX_ERROR: usize = 64;

/// The default of a queue's `max_result`: 64 KiB.
pub const DEFAULT_MAX_RESULT: usize = 64 * 1024;
/// The most a queue's `max_result` may be: 1 MiB.
pub const MAX_RESULT_LIMIT: usize = 1024 * 1024;

impl Default for HistoryLimits {
    /// The first 5 and the last 20 entries, 2 KiB of error text each: a job's history
    /// stays under about 60 KB however often it was attempted.
    fn default() -> Self {
        HistoryLimits {
            keep_first: 5,
            keep_last: 20,
            max_error: 2048,
        }
    }
}

/// A queue created through SQS's `CreateQueue`, as the store keeps it: its
/// attributes (every settable one, defaults filled in), tags and times (Unix ms).
/// Its rules (defaults, checks, what a change does) are in `api::sqs::created`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedQueue {
    /// Its settable attributes, every one with a default present.
    pub attributes: BTreeMap<String, String>,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
    /// When it was created.
    pub created_at: crate::job::UnixMillis,
    /// When its attributes last changed.
    pub modified_at: crate::job::UnixMillis,
}

/// The largest retry budget a job may have (a producer's `max_attempts`, a
/// schedule's).
pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;

/// The checks against the machine that [`Config::load_checked`] runs in the same
/// pass as the file's own, so one run lists every problem. They need the API's
/// token file parser, the admin socket's group lookup and the executors, all above
/// config, so the caller passes them in (`crate::machine::Machine`). Each answers
/// the problem's message, reported at the key that named the thing checked.
pub trait MachineChecks {
    /// Reads the API token file at `path` (exists, owner-only, valid, names only
    /// queues for which `known_queue` is true).
    fn token_file(&self, path: &Path, known_queue: &dyn Fn(&str) -> bool) -> Result<(), String>;
    /// Resolves the admin socket's group.
    fn admin_group(&self, group: &str) -> Result<(), String>;
    /// Builds the executor `spec` describes (header and env names, the HTTP client).
    fn executor(&self, spec: &crate::executor::spec::ExecutorSpec) -> Result<(), String>;
}

/// The compiled configuration of one daemon.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `[daemon]`.
    pub daemon: DaemonConfig,
    /// `[console]`: the web console, `None` when off.
    pub console: Option<ConsoleConfig>,
    /// `[queues.NAME]`, by name; never empty.
    pub queues: BTreeMap<String, QueueConfig>,
    /// `[rate_limiters.NAME]`, by name.
    pub rate_limiters: BTreeMap<String, RateLimiterConfig>,
    /// `[tenants.NAME]`, by name; always holds `default` (weight 1, no caps,
    /// unless configured), the tenant of jobs enqueued without one.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// `[sqs]`: the SQS-compatible API on `api_listen`.
    pub sqs: SqsConfig,
    /// `[schedules.NAME]`, by name: periodic jobs (see `daemon/docs/schedules.md`).
    pub schedules: BTreeMap<String, ScheduleConfig>,
    /// The file this was read from (as given to [`Config::load`], made absolute).
    pub source: PathBuf,
}

/// `[daemon]`: process-wide settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Directory of the SQLite store (default `/var/lib/qd`; see [`Config::db_path`])
    /// and of the node's lock, also when the store is PostgreSQL.
    pub data_dir: PathBuf,
    /// The PostgreSQL store (`database_url`, `database_password_file`); `None`: the
    /// SQLite store in `data_dir`.
    pub database: Option<DatabaseConfig>,
    /// Unix socket `qctl` talks to (default `/run/qd/qctl.sock`).
    pub admin_socket: PathBuf,
    /// Permission bits of the admin socket (default `0o660`, from the octal string "0660").
    pub admin_socket_mode: u32,
    /// Group that owns the admin socket (default: the daemon's group).
    pub admin_group: Option<String>,
    /// HTTP API address (default `127.0.0.1:7070`).
    pub api_listen: SocketAddr,
    /// Prometheus exporter address (default `127.0.0.1:9464`).
    pub metrics_listen: SocketAddr,
    /// How long a shutdown waits for running attempts (default 30 s).
    pub shutdown_grace: Duration,
    /// Largest accepted job payload, in bytes (default 1 MiB).
    pub max_payload: usize,
    /// File of API bearer tokens; required when `api_listen` is not loopback.
    pub api_tokens_file: Option<PathBuf>,
    /// More `Host` names the API answers (`name` or `name:port`), beside its listen
    /// address and `localhost`/`127.0.0.1`/`[::1]` with its port; others get 421.
    pub api_allowed_hosts: Vec<String>,
    /// Supervisor restart intensity (default 10 restarts in 60 s).
    pub restart: RestartIntensity,
    /// The history cap: entries kept per job and error bytes per entry (default
    /// the first 5 and the last 20 entries, 2 KiB each).
    pub history: HistoryLimits,
    /// The HTTP API's connection limits (`daemon.http`).
    pub http: HttpLimits,
}

/// `daemon.http`: how long the HTTP API waits for slow clients and how many
/// connections it serves at once (see `daemon/docs/faults.md`). Fixed while the
/// API runs: a change needs a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest time from the start of a request (or of a new connection) to the end
    /// of its headers; past it the connection is closed (default 10 s).
    pub header_timeout: Duration,
    /// Longest time a handler waits for a request's whole body; past it the
    /// answer is `408 request_timeout` and the connection is closed (default 60 s).
    pub body_timeout: Duration,
    /// How long a keep-alive connection may sit idle between requests (default 60 s).
    pub idle_timeout: Duration,
    /// Most connections served at once; more are answered `503` and closed
    /// (default 1024).
    pub max_connections: u32,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
        }
    }
}

/// `[sqs]`: the SQS-compatible API (`daemon/docs/sqs.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqsConfig {
    /// Whether `api_listen` answers SQS requests (default false).
    pub enabled: bool,
    /// The 12-digit account id in queue URLs and ARNs (default `000000000000`).
    pub account_id: String,
    /// The region in ARNs (default `us-east-1`).
    pub region: String,
    /// The base of queue URLs, without a trailing slash (default `http://` +
    /// `api_listen`).
    pub advertised_url: String,
    /// The queues created through SQS's `CreateQueue` that are in force (stored in
    /// the store, not the file; a file queue of the same name wins), by name. Their
    /// qd settings are in [`Config::queues`] beside the file's.
    pub created: BTreeMap<String, CreatedQueue>,
}

/// One periodic job: which job each tick of its timing enqueues, and how missed
/// ticks and overlapping runs are handled.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleConfig {
    /// The schedule's name (`[A-Za-z0-9_.-]{1,64}`), part of its jobs' keys.
    pub name: String,
    /// The queue its jobs go to (a configured queue).
    pub queue: String,
    /// When its ticks come and fire (cron in a time zone, or an interval; jitter).
    pub timing: crate::schedule::Timing,
    /// The payload of every job it enqueues.
    pub payload: Vec<u8>,
    /// The tenant of its jobs (default `default`).
    pub tenant: Option<String>,
    /// Its jobs' retry budget (default the queue's).
    pub max_attempts: Option<u32>,
    /// What to do with ticks that came while nobody fired them (default latest).
    pub catch_up: crate::schedule::CatchUp,
    /// Whether a run starts while the previous one is unfinished (default allow).
    pub overlap: crate::schedule::Overlap,
}

/// `[console]`: the web console's listener and sessions (see `daemon/docs/console.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// Its own listener (required); a non-loopback one needs `daemon.api_tokens_file`.
    pub listen: SocketAddr,
    /// Where a reverse proxy mounts it (`/qd`), or empty: every link, asset, form
    /// action and stream URL starts with it.
    pub path_prefix: String,
    /// More `Host` names it answers, beside its address and loopback names.
    pub allowed_hosts: Vec<String>,
    /// A session unused this long ends (default 30 min).
    pub session_idle: Duration,
    /// A session ends this long after login however it is used (default 12 h).
    pub session_max: Duration,
    /// Most event streams open at once (default 32); more get 503.
    pub max_streams: u32,
}

/// Restart intensity, as in Erlang/OTP supervisors: more than `max_restarts`
/// child restarts within `window` and the daemon gives up and exits non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartIntensity {
    /// Restarts tolerated within `window` (>= 1; default 10).
    pub max_restarts: u32,
    /// The sliding window (> 0; default 60 s).
    pub window: Duration,
}

/// One queue, with `[defaults]` applied.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueConfig {
    /// The queue's name (`[A-Za-z0-9_.-]{1,64}`).
    pub name: String,
    /// How attempts run; its `timeout`/`kill_grace` are the queue's.
    pub executor: crate::executor::spec::ExecutorSpec,
    /// Lease (visibility timeout) of one attempt (default 30 s; > heartbeat).
    pub lease: Duration,
    /// Interval at which a running attempt renews its lease (default 10 s; > 0).
    pub heartbeat: Duration,
    /// Wall-time limit of one attempt (default 5 min; > 0).
    pub timeout: Duration,
    /// Attempts before a job is dead-lettered (default 5; >= 1).
    pub max_attempts: u32,
    /// Retry delay policy (default base 1 s, max 10 min, full jitter).
    pub backoff: crate::backoff::Backoff,
    /// Most jobs held (ready + delayed + leased) before enqueue is refused (default 100000).
    pub max_depth: u64,
    /// How long succeeded/cancelled jobs and idempotency keys are kept (default 24 h).
    pub retention: Duration,
    /// Worker pool bounds; `min = max = 0` for external queues (no pool).
    pub workers: WorkersConfig,
    /// Name of a `[rate_limiters.X]` this queue dispatches through.
    pub rate_limiter: Option<String>,
    /// What tenant shares are measured in (default jobs).
    pub fairness: crate::scheduler::fair::Fairness,
    /// Per-queue tenant concurrency caps (`tenants.T = { max_concurrency = N }`),
    /// overriding the tenant's global `max_concurrency` in this queue.
    pub tenant_caps: BTreeMap<String, u32>,
    /// Largest result a job of this queue may hand back, bytes (default 64 KiB, at
    /// most 1 MiB): a larger one fails the attempt as permanent.
    pub max_result: usize,
}

/// The most workers one queue's pool may have (`workers.max` in the config and in
/// `qctl workers set`): each is a task and, for a command queue, a process at a time.
pub const MAX_WORKERS: u32 = 1024;

/// A queue's worker pool bounds and autoscaling knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkersConfig {
    /// Workers kept even when idle (default 1).
    pub min: u32,
    /// Most workers (default 4; 1 to [`MAX_WORKERS`], and >= min).
    pub max: u32,
    /// Grow the pool while the oldest ready job is older than this (default 5 s).
    pub target_age: Duration,
    /// Shrink by one after a worker has been idle this long (default 30 s).
    pub idle_cooldown: Duration,
}

/// A token bucket: `per_second` tokens a second, at most `burst` saved up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimiterConfig {
    /// Sustained rate, jobs per second (>= 1).
    pub per_second: u32,
    /// Bucket size, jobs (>= 1; default `per_second`).
    pub burst: u32,
}

/// A tenant's share and caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantConfig {
    /// Weight in weighted fair scheduling (>= 1; default 1).
    pub weight: u32,
    /// Most jobs of this tenant leased at once, per queue (default unlimited).
    pub max_concurrency: Option<u32>,
    /// Most jobs of this tenant held per queue (default unlimited).
    pub max_depth: Option<u64>,
}

impl Default for TenantConfig {
    /// Weight 1, no caps: the settings of an unconfigured tenant.
    fn default() -> Self {
        TenantConfig {
            weight: 1,
            max_concurrency: None,
            max_depth: None,
        }
    }
}

/// One problem in a config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Key path, e.g. `queues.email.lease` (empty for syntax errors).
    pub path: String,
    /// 1-based line, where the file has the key.
    pub line: Option<usize>,
    /// 1-based column (in characters), where the file has the key.
    pub column: Option<usize>,
    /// What is wrong, in one line.
    pub message: String,
}

impl fmt::Display for ConfigError {
    /// `LINE:COL: PATH: MESSAGE`, leaving out the parts that are unknown.
    /// [`ConfigErrors`] prefixes the file name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, "{line}:{column}: ")?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in a config file (never empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors {
    /// The file.
    pub source: PathBuf,
    /// The problems, in file order (those without a line last).
    pub errors: Vec<ConfigError>,
}

impl fmt::Display for ConfigErrors {
    /// One problem per line: `FILE:LINE:COL: PATH: MESSAGE`, or `FILE: PATH: MESSAGE`
    /// for a problem without a place in the file (a missing section, an unreadable
    /// file).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            let gap = if error.line.is_some() { "" } else { " " };
            write!(f, "{}:{gap}{error}", self.source.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl Config {
    /// How much longer than `node_timeout` the leader waits before it ends a
    /// silent node's leases (`None` without a database): `daemon.fence_wait` when
    /// written, else the longest `kill_grace` of a command queue plus
    /// [`database::FENCE_MARGIN`] (the margin alone without command queues), so
    /// a fenced node has stopped its attempts by then (`daemon/docs/cluster.md`).
    pub fn fence_wait(&self) -> Option<Duration> {
        let database = self.daemon.database.as_ref()?;
        Some(database.fence_wait.unwrap_or_else(|| {
            let grace = self
                .queues
                .values()
                .filter_map(|q| match &q.executor {
                    crate::executor::spec::ExecutorSpec::Command(c) => Some(c.kill_grace),
                    _ => None,
                })
                .max()
                .unwrap_or_default();
            grace + database::FENCE_MARGIN
        }))
    }

    /// Reads and compiles the config file at `path`. Errors: the file cannot be
    /// read, or any problem [`Config::parse`] reports.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = Self::read(path)?;
        Config::parse(&text, path)
    }

    /// [`Config::load`] plus, in the same pass, everything `qd run` needs from the
    /// machine: the API token file (exists, owner-only mode, valid, names only
    /// configured queues), the admin group, and each queue's executor. What `qd
    /// check-config`, `qd run` and a reload use, so one run lists every problem.
    pub fn load_checked(path: &Path, machine: &dyn MachineChecks) -> Result<Config, ConfigErrors> {
        let text = Self::read(path)?;
        Self::compile_text(&text, path, Some(machine))
    }

    fn read(path: &Path) -> Result<String, ConfigErrors> {
        std::fs::read_to_string(path).map_err(|e| ConfigErrors {
            source: path.to_path_buf(),
            errors: vec![ConfigError {
                path: String::new(),
                line: None,
                column: None,
                message: format!("cannot read config file: {e}"),
            }],
        })
    }

    /// Compiles config `text` read from `source`; relative paths in it are
    /// resolved against `source`'s directory. Reports every problem at once.
    /// Never panics. Checks the file system (executor programs, `cwd`).
    pub fn parse(text: &str, source: &Path) -> Result<Config, ConfigErrors> {
        Self::compile_text(text, source, None)
    }

    fn compile_text(
        text: &str,
        source: &Path,
        machine: Option<&dyn MachineChecks>,
    ) -> Result<Config, ConfigErrors> {
        let source = std::path::absolute(source).unwrap_or_else(|_| source.to_path_buf());
        compile::compile(text, &source, machine).map_err(|mut errors| {
            errors.sort_by_key(|e| (e.line.is_none(), e.line, e.column));
            ConfigErrors { source, errors }
        })
    }

    /// The settings of tenant `name`: as configured, else weight 1 and no caps.
    pub fn tenant(&self, name: &str) -> TenantConfig {
        self.tenants.get(name).copied().unwrap_or_default()
    }

    /// The SQLite database file: `data_dir/qd.db`.
    pub fn db_path(&self) -> PathBuf {
        self.daemon.data_dir.join("qd.db")
    }

    /// A one-line summary for `qd check-config`, e.g.
    /// `config OK: 2 queues (demo, echo), 2 tenants, 1 rate limiter`.
    pub fn summary(&self) -> String {
        let names: Vec<&str> = self.queues.keys().map(String::as_str).collect();
        let store = match &self.daemon.database {
            Some(database) => database.describe(),
            None => format!("SQLite {}", self.db_path().display()),
        };
        format!(
            "config OK: {} ({}), {}, {}; store: {store}",
            count(self.queues.len(), "queue"),
            names.join(", "),
            count(self.tenants.len(), "tenant"),
            count(self.rate_limiters.len(), "rate limiter"),
        )
    }
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
