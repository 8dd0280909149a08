//! Raw config: the TOML document as written, before defaults and meaning checks.
//!
//! Every struct denies unknown keys and leaves every key optional (except the
//! few that are required), so the compiler can tell "not given" from "given"
//! and apply `[defaults]` key by key. Each section (`[daemon]`, `[defaults]`,
//! each `[queues.X]`, `[rate_limiters.X]`, `[tenants.X]`, `[schedules.X]`) is read on its own, so
//! a broken section does not hide the problems of the others.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::de::DeValue;

use super::diag::{Diagnostics, KeyPath, Node};
use super::units::{Dur, Size};
use crate::backoff::Jitter;
use crate::executor::spec::ErrorClass;
use crate::scheduler::fair::Fairness;

/// `[daemon]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "the [daemon] table")]
pub(crate) struct RawDaemon {
    pub data_dir: Option<String>,
    pub admin_socket: Option<String>,
    pub admin_socket_mode: Option<String>,
    pub admin_group: Option<String>,
    pub api_listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub shutdown_grace: Option<Dur>,
    pub max_payload: Option<Size>,
    pub api_tokens_file: Option<String>,
    pub api_allowed_hosts: Option<Vec<String>>,
    pub database_url: Option<String>,
    pub database_password_file: Option<String>,
    pub node_name: Option<String>,
    pub node_timeout: Option<Dur>,
    pub fence_wait: Option<Dur>,
    pub poll_interval: Option<Dur>,
    pub restart: Option<RawRestart>,
    pub history: Option<RawHistory>,
    pub http: Option<RawHttp>,
}

/// `daemon.http`: the HTTP API's connection limits.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { header_timeout = \"10s\", body_timeout = \"60s\", idle_timeout = \"60s\", max_connections = 1024 }"
)]
pub(crate) struct RawHttp {
    pub header_timeout: Option<Dur>,
    pub body_timeout: Option<Dur>,
    pub idle_timeout: Option<Dur>,
    pub max_connections: Option<u32>,
}

/// `daemon.history`: the history cap.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { keep_first = 5, keep_last = 20, max_error = \"2KiB\" }"
)]
pub(crate) struct RawHistory {
    pub keep_first: Option<u32>,
    pub keep_last: Option<u32>,
    pub max_error: Option<Size>,
}

/// `daemon.restart`: supervisor restart intensity.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { max_restarts = 10, window = \"60s\" }"
)]
pub(crate) struct RawRestart {
    pub max_restarts: Option<u32>,
    pub window: Option<Dur>,
}

/// `[console]`: the web console (off unless the section is present).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "the [console] table")]
pub(crate) struct RawConsole {
    pub listen: Option<String>,
    pub path_prefix: Option<String>,
    pub allowed_hosts: Option<Vec<String>>,
    pub session_idle: Option<Dur>,
    pub session_max: Option<Dur>,
    pub max_streams: Option<u32>,
}

/// `[queues.X]`, and `[defaults]` (which may not set the queue-only keys
/// `executor`, `rate_limiter` and `tenants`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a queue table")]
pub(crate) struct RawQueue {
    pub executor: Option<RawExecutor>,
    pub rate_limiter: Option<String>,
    pub tenants: Option<BTreeMap<String, RawTenantCap>>,
    pub lease: Option<Dur>,
    pub heartbeat: Option<Dur>,
    pub timeout: Option<Dur>,
    pub max_attempts: Option<u32>,
    pub backoff: Option<RawBackoff>,
    pub max_depth: Option<u64>,
    pub retention: Option<Dur>,
    pub workers: Option<RawWorkers>,
    pub fairness: Option<Fairness>,
    pub kill_grace: Option<Dur>,
    pub max_result: Option<Size>,
}

/// `backoff = { base, max, jitter }`; each key inherits separately.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { base = \"1s\", max = \"10m\", jitter = \"full\" }"
)]
pub(crate) struct RawBackoff {
    pub base: Option<Dur>,
    pub max: Option<Dur>,
    pub jitter: Option<Jitter>,
}

/// `workers = { min, max, target_age, idle_cooldown }`; each key inherits separately.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { min = 1, max = 4, target_age = \"5s\", idle_cooldown = \"30s\" }"
)]
pub(crate) struct RawWorkers {
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub target_age: Option<Dur>,
    pub idle_cooldown: Option<Dur>,
}

/// The executor kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ExecutorKind {
    Command,
    Http,
    External,
}

/// `executor = { kind = ..., ... }`. One flat struct rather than a serde tagged
/// enum: tagged enums buffer their input and lose the spans of inner keys. The
/// compiler rejects keys that do not belong to the kind.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { kind = \"command\", program = \"...\" }"
)]
pub(crate) struct RawExecutor {
    pub kind: ExecutorKind,
    pub program: Option<String>,
    pub args: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub cwd: Option<String>,
    pub exit_codes: Option<RawExitCodes>,
    pub url: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub store_result: Option<bool>,
    pub send_parents: Option<bool>,
}

/// `executor.exit_codes`.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { transient = [75], permanent = [64, 65] }"
)]
pub(crate) struct RawExitCodes {
    pub transient: Option<Vec<i32>>,
    pub permanent: Option<Vec<i32>>,
    pub throttled: Option<Vec<i32>>,
    pub other: Option<ErrorClass>,
    pub throttle_delay: Option<Dur>,
}

/// `[queues.X].tenants.T = { max_concurrency = N }`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { max_concurrency = 4 }"
)]
pub(crate) struct RawTenantCap {
    pub max_concurrency: u32,
}

/// `[rate_limiters.X]`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { per_second = 50, burst = 10 }"
)]
pub(crate) struct RawRateLimiter {
    pub per_second: u32,
    pub burst: Option<u32>,
}

/// `[tenants.X]`.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { weight = 1, max_concurrency = 4 }"
)]
pub(crate) struct RawTenant {
    pub weight: Option<u32>,
    pub max_concurrency: Option<u32>,
    pub max_depth: Option<u64>,
}

/// `[sqs]`: the SQS-compatible API (`daemon/docs/sqs.md`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "the [sqs] table")]
pub(crate) struct RawSqs {
    pub enabled: Option<bool>,
    pub account_id: Option<String>,
    pub region: Option<String>,
    pub advertised_url: Option<String>,
}

/// `[schedules.X]`: a periodic job. Every key is optional here so that a missing
/// one is reported by the compiler at the schedule's table, with the others.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { queue = \"reports\", cron = \"0 3 * * *\" }"
)]
pub(crate) struct RawSchedule {
    pub queue: Option<String>,
    pub cron: Option<String>,
    pub every: Option<Dur>,
    pub timezone: Option<String>,
    pub payload: Option<String>,
    pub payload_b64: Option<String>,
    pub tenant: Option<String>,
    pub max_attempts: Option<u32>,
    pub jitter: Option<Dur>,
    pub catch_up: Option<RawCatchUp>,
    pub max_catch_up: Option<u32>,
    pub overlap: Option<RawOverlap>,
}

/// `catch_up = "latest" | "none" | "all"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawCatchUp {
    Latest,
    None,
    All,
}

/// `overlap = "allow" | "skip"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawOverlap {
    Allow,
    Skip,
}

/// A named entry of a `[section.NAME]` family; `raw` is `None` when its body
/// could not be read (the errors are already recorded, the name still counts).
#[derive(Debug)]
pub(crate) struct Named<T> {
    pub name: String,
    pub raw: Option<T>,
}

/// The whole document, section by section.
#[derive(Debug, Default)]
pub(crate) struct RawDoc {
    pub daemon: RawDaemon,
    /// `None` when `[console]` is absent (the console is off).
    pub console: Option<RawConsole>,
    pub defaults: RawQueue,
    /// `None` when `[queues]` is absent.
    pub queues: Option<Vec<Named<RawQueue>>>,
    pub rate_limiters: Vec<Named<RawRateLimiter>>,
    pub tenants: Vec<Named<RawTenant>>,
    pub sqs: RawSqs,
    pub schedules: Vec<Named<RawSchedule>>,
}

const SECTIONS: &str = "daemon, console, defaults, queues, rate_limiters, tenants, sqs, schedules";

/// Reads every section of the document, recording every problem in `diag`.
pub(crate) fn read(diag: &mut Diagnostics<'_>) -> RawDoc {
    let root = diag.root();
    let mut doc = RawDoc::default();
    // The root is always a table: `compile` builds it from toml's DeTable.
    let DeValue::Table(table) = root.get_ref() else {
        return doc;
    };
    for (key, node) in table.iter() {
        let name = key.get_ref().as_ref();
        let path = KeyPath::of(&[name]);
        match name {
            "daemon" => doc.daemon = diag.deserialize(node, &path).unwrap_or_default(),
            "console" => {
                doc.console = Some(diag.deserialize(node, &path).unwrap_or_default());
            }
            "defaults" => doc.defaults = diag.deserialize(node, &path).unwrap_or_default(),
            "queues" => doc.queues = Some(read_family(diag, node, &path)),
            "rate_limiters" => doc.rate_limiters = read_family(diag, node, &path),
            "tenants" => doc.tenants = read_family(diag, node, &path),
            "sqs" => doc.sqs = diag.deserialize(node, &path).unwrap_or_default(),
            "schedules" => doc.schedules = read_family(diag, node, &path),
            other => diag.error_at(
                &path,
                key.span(),
                &format!("unknown section `{other}`, expected one of {SECTIONS}"),
            ),
        }
    }
    doc
}

/// Reads a `[family.NAME]` table of tables, each entry on its own.
fn read_family<'a, T: serde::de::DeserializeOwned>(
    diag: &mut Diagnostics<'a>,
    node: &Node<'a>,
    path: &KeyPath,
) -> Vec<Named<T>> {
    let DeValue::Table(table) = node.get_ref() else {
        diag.invalid(path, format!("expected a table of [{path}.NAME] tables"));
        return Vec::new();
    };
    table
        .iter()
        .map(|(key, entry)| {
            let name = key.get_ref().to_string();
            let raw = diag.deserialize(entry, &path.join(&[&name]));
            Named { name, raw }
        })
        .collect()
}
