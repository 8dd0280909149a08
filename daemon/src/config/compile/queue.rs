//! Compiling `[queues.NAME]`: each key inherits from `[defaults]`, then from the
//! built-in default, one key at a time (so `workers = { max = 16 }` keeps the
//! other worker settings). A problem is reported at the key that set the value:
//! the queue's key if it has one, else the `[defaults]` key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use super::super::diag::{Diagnostics, KeyPath};
use super::super::raw::{RawDoc, RawQueue};
use super::super::{MAX_WORKERS, QueueConfig, WorkersConfig};
use super::{DEFAULT_TENANT, at_least_one, check_name, executor};
use crate::backoff::Backoff;
use crate::executor::spec::ExecutorSpec;

/// What queues may refer to.
pub(crate) struct Scope<'a> {
    /// Directory relative paths are resolved against.
    pub base_dir: &'a Path,
    /// Names of `[tenants.X]` (broken ones included).
    pub tenants: BTreeSet<&'a str>,
    /// Names of `[rate_limiters.X]` (broken ones included).
    pub rate_limiters: BTreeSet<&'a str>,
}

/// A value after inheritance, with where it came from.
struct Setting<T> {
    value: T,
    /// The key that set it: `queues.Q.KEY` if the queue did, else `defaults.KEY`.
    path: KeyPath,
    from_queue: bool,
    /// The queue's or the defaults' key failed to deserialize: checks skip it.
    broken: bool,
}

/// The queue's table over `[defaults]` over built-in defaults.
struct Layers<'r> {
    queue: &'r RawQueue,
    defaults: &'r RawQueue,
    path: KeyPath,
}

impl Layers<'_> {
    fn get<T>(
        &self,
        diag: &Diagnostics<'_>,
        keys: &[&str],
        pick: impl Fn(&RawQueue) -> Option<T>,
        builtin: T,
    ) -> Setting<T> {
        let queue_path = self.path.join(keys);
        let defaults_path = KeyPath::of(&["defaults"]).join(keys);
        let broken = diag.is_broken(&queue_path) || diag.is_broken(&defaults_path);
        match pick(self.queue) {
            Some(value) => Setting {
                value,
                path: queue_path,
                from_queue: true,
                broken,
            },
            None => Setting {
                value: pick(self.defaults).unwrap_or(builtin),
                path: defaults_path,
                from_queue: false,
                broken,
            },
        }
    }
}

/// Where to report a problem between two settings: the one the queue set.
fn blame<'s, A, B>(a: &'s Setting<A>, b: &'s Setting<B>) -> &'s KeyPath {
    if !a.from_queue && b.from_queue {
        &b.path
    } else {
        &a.path
    }
}

fn show(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

/// Compiles every queue; at least one is required.
pub(crate) fn compile_queues(
    diag: &mut Diagnostics<'_>,
    doc: &RawDoc,
    scope: &Scope<'_>,
) -> BTreeMap<String, QueueConfig> {
    reject_queue_only_keys(diag, &doc.defaults);
    let queues = doc.queues.as_deref().unwrap_or_default();
    if queues.is_empty() && !diag.is_broken(&KeyPath::of(&["queues"])) {
        diag.error(
            &KeyPath::of(&["queues"]),
            "at least one queue is required: add a [queues.NAME] table",
        );
    }
    let mut compiled = BTreeMap::new();
    for named in queues {
        let path = KeyPath::of(&["queues", &named.name]);
        check_name(diag, &path, "queue", &named.name);
        let Some(raw) = &named.raw else { continue };
        let layers = Layers {
            queue: raw,
            defaults: &doc.defaults,
            path,
        };
        if let Some(queue) = compile_queue(diag, &named.name, &layers, scope) {
            compiled.insert(named.name.clone(), queue);
        }
    }
    compiled
}

fn reject_queue_only_keys(diag: &mut Diagnostics<'_>, defaults: &RawQueue) {
    let given = [
        ("executor", defaults.executor.is_some()),
        ("rate_limiter", defaults.rate_limiter.is_some()),
        ("tenants", defaults.tenants.is_some()),
    ];
    for (key, _) in given.iter().filter(|(_, present)| *present) {
        diag.error(
            &KeyPath::of(&["defaults", key]),
            format!("`{key}` is a per-queue key; set it in [queues.NAME], not in [defaults]"),
        );
    }
}

fn compile_queue(
    diag: &mut Diagnostics<'_>,
    name: &str,
    layers: &Layers<'_>,
    scope: &Scope<'_>,
) -> Option<QueueConfig> {
    let lease = layers.get(diag, &["lease"], |r| r.lease.map(|d| d.0), secs(30));
    let heartbeat = layers.get(diag, &["heartbeat"], |r| r.heartbeat.map(|d| d.0), secs(10));
    let timeout = layers.get(diag, &["timeout"], |r| r.timeout.map(|d| d.0), secs(300));
    let kill_grace = layers.get(
        diag,
        &["kill_grace"],
        |r| r.kill_grace.map(|d| d.0),
        secs(5),
    );
    let max_attempts = layers.get(diag, &["max_attempts"], |r| r.max_attempts, 5);
    let max_depth = layers.get(diag, &["max_depth"], |r| r.max_depth, 100_000);
    let retention = layers.get(
        diag,
        &["retention"],
        |r| r.retention.map(|d| d.0),
        secs(86_400),
    );
    let fairness = layers.get(diag, &["fairness"], |r| r.fairness, Default::default());
    let max_result = layers.get(
        diag,
        &["max_result"],
        |r| r.max_result.map(|s| s.0),
        crate::config::DEFAULT_MAX_RESULT as u64,
    );
    let limit = crate::config::MAX_RESULT_LIMIT as u64;
    if !max_result.broken && !(1..=limit).contains(&max_result.value) {
        diag.error(
            &max_result.path,
            format!(
                "max_result must be from 1 byte to 1MiB ({limit} bytes), got {} bytes",
                max_result.value
            ),
        );
    }

    positive(diag, &heartbeat);
    positive(diag, &timeout);
    if !lease.broken && !heartbeat.broken && lease.value <= heartbeat.value {
        diag.error(
            blame(&lease, &heartbeat),
            format!(
                "lease ({}) must be longer than heartbeat ({}), or leases expire between heartbeats",
                show(lease.value),
                show(heartbeat.value)
            ),
        );
    }
    if !max_attempts.broken {
        at_least_one(diag, &max_attempts.path, max_attempts.value);
    }
    if !max_depth.broken {
        at_least_one(diag, &max_depth.path, max_depth.value);
    }
    let backoff = compile_backoff(diag, layers);
    let executor = compile_executor(diag, layers, scope, timeout.value, kill_grace.value);
    let workers = compile_workers(diag, layers, executor.as_ref());
    let rate_limiter = compile_rate_limiter(diag, layers, scope);
    let tenant_caps = compile_tenant_caps(diag, layers, scope);
    Some(QueueConfig {
        name: name.to_owned(),
        executor: executor?,
        lease: lease.value,
        heartbeat: heartbeat.value,
        timeout: timeout.value,
        max_attempts: max_attempts.value,
        backoff,
        max_depth: max_depth.value,
        retention: retention.value,
        workers,
        rate_limiter,
        fairness: fairness.value,
        tenant_caps,
        max_result: usize::try_from(max_result.value.min(limit))
            .unwrap_or(crate::config::MAX_RESULT_LIMIT),
    })
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn positive(diag: &mut Diagnostics<'_>, setting: &Setting<Duration>) {
    if !setting.broken && setting.value.is_zero() {
        diag.error(&setting.path, "must be longer than 0s");
    }
}

fn compile_backoff(diag: &mut Diagnostics<'_>, layers: &Layers<'_>) -> Backoff {
    let base = layers.get(
        diag,
        &["backoff", "base"],
        |r| r.backoff.as_ref()?.base.map(|d| d.0),
        secs(1),
    );
    let max = layers.get(
        diag,
        &["backoff", "max"],
        |r| r.backoff.as_ref()?.max.map(|d| d.0),
        secs(600),
    );
    let jitter = layers.get(
        diag,
        &["backoff", "jitter"],
        |r| r.backoff.as_ref()?.jitter,
        Default::default(),
    );
    if !base.broken && !max.broken && base.value > max.value {
        diag.error(
            blame(&base, &max),
            format!(
                "backoff.base ({}) must not exceed backoff.max ({})",
                show(base.value),
                show(max.value)
            ),
        );
    }
    Backoff {
        base: base.value,
        max: max.value,
        jitter: jitter.value,
    }
}

fn compile_workers(
    diag: &mut Diagnostics<'_>,
    layers: &Layers<'_>,
    executor: Option<&ExecutorSpec>,
) -> WorkersConfig {
    let min = layers.get(diag, &["workers", "min"], |r| r.workers.as_ref()?.min, 1);
    let max = layers.get(diag, &["workers", "max"], |r| r.workers.as_ref()?.max, 4);
    let target_age = layers.get(
        diag,
        &["workers", "target_age"],
        |r| r.workers.as_ref()?.target_age.map(|d| d.0),
        secs(5),
    );
    let idle_cooldown = layers.get(
        diag,
        &["workers", "idle_cooldown"],
        |r| r.workers.as_ref()?.idle_cooldown.map(|d| d.0),
        secs(30),
    );
    let mut workers = WorkersConfig {
        min: min.value,
        max: max.value,
        target_age: target_age.value,
        idle_cooldown: idle_cooldown.value,
    };
    if matches!(executor, Some(ExecutorSpec::External)) {
        if layers.queue.workers.is_some() {
            diag.error(
                &layers.path.join(&["workers"]),
                "an external queue has no worker pool (external workers lease over the HTTP API); remove `workers`",
            );
        }
        workers.min = 0;
        workers.max = 0;
        return workers;
    }
    if !max.broken {
        at_least_one(diag, &max.path, max.value);
        if max.value > MAX_WORKERS {
            diag.error(
                &max.path,
                format!("must be at most {MAX_WORKERS} (workers of one queue)"),
            );
        }
    }
    if !min.broken && !max.broken && min.value > max.value {
        diag.error(
            blame(&min, &max),
            format!(
                "workers.min ({}) must not exceed workers.max ({})",
                min.value, max.value
            ),
        );
    }
    workers
}

fn compile_executor(
    diag: &mut Diagnostics<'_>,
    layers: &Layers<'_>,
    scope: &Scope<'_>,
    timeout: Duration,
    kill_grace: Duration,
) -> Option<ExecutorSpec> {
    let path = layers.path.join(&["executor"]);
    let Some(raw) = &layers.queue.executor else {
        if !diag.is_broken(&path) {
            diag.error(
                &path,
                "missing: set executor = { kind = \"command\" | \"http\" | \"external\", ... }",
            );
        }
        return None;
    };
    let limits = executor::Limits {
        timeout,
        kill_grace,
    };
    executor::compile(diag, &path, raw, scope.base_dir, limits)
}

fn compile_rate_limiter(
    diag: &mut Diagnostics<'_>,
    layers: &Layers<'_>,
    scope: &Scope<'_>,
) -> Option<String> {
    let name = layers.queue.rate_limiter.as_ref()?;
    if !scope.rate_limiters.contains(name.as_str()) {
        let defined: Vec<&str> = scope.rate_limiters.iter().copied().collect();
        diag.error(
            &layers.path.join(&["rate_limiter"]),
            format!(
                "unknown rate limiter {name:?}: define [rate_limiters.{name}] (defined: {})",
                if defined.is_empty() {
                    "none".to_owned()
                } else {
                    defined.join(", ")
                }
            ),
        );
    }
    Some(name.clone())
}

fn compile_tenant_caps(
    diag: &mut Diagnostics<'_>,
    layers: &Layers<'_>,
    scope: &Scope<'_>,
) -> BTreeMap<String, u32> {
    let Some(caps) = &layers.queue.tenants else {
        return BTreeMap::new();
    };
    for (tenant, cap) in caps {
        let path = layers.path.join(&["tenants", tenant]);
        check_name(diag, &path, "tenant", tenant);
        if tenant != DEFAULT_TENANT && !scope.tenants.contains(tenant.as_str()) {
            diag.error(
                &path,
                format!("unknown tenant {tenant:?}: define [tenants.{tenant}] first"),
            );
        }
        at_least_one(diag, &path.join(&["max_concurrency"]), cap.max_concurrency);
    }
    caps.iter()
        .map(|(tenant, cap)| (tenant.clone(), cap.max_concurrency))
        .collect()
}
