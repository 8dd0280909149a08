//! Live limits: tenant weights, concurrency caps and depths, queue worker bounds and
//! pause flags — the config's values overlaid with runtime overrides.
//!
//! It is also the one owner of the config in force: a reload (SIGHUP, `qctl
//! reload`) swaps it here with [`Limits::replace_config`], and every actor reads it
//! at the point of use through [`Limits::config`], so nothing holds a stale copy.
//!
//! Overrides are set by operators through qctl (`limits set`, `workers set`,
//! `queue pause`), stored in the store's `overrides` table so they survive restarts
//! until reset, and read here by the Broker (depth; on a shared store also caps,
//! which the store keeps across nodes), the Broker's queue dispatches (weights, caps, pause) and
//! WorkerPools (bounds). Unconfigured tenants inherit `[tenants.default]`.
//!
//! Override keys: scope `tenant` with `weight`, `max_concurrency`, `max_depth`;
//! scope `queue` with `workers_min`, `workers_max`, `paused`; scope `limiter` with
//! `per_second`, `burst` (read by [`crate::rate_limit`], applied by the admin handler).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::config::{Config, DEFAULT_TENANT, RateLimiterConfig, WorkersConfig};
use crate::store::Override;

/// Where a live value comes from (config or a runtime override); the admin protocol
/// reports it as is.
pub use qd_proto::Source;

/// A tenant's effective limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    /// Share weight (>= 1).
    pub weight: u32,
    /// Most jobs leased at once per queue (None: unlimited).
    pub max_concurrency: Option<u32>,
    /// Most unfinished jobs per queue (None: only the queue's max_depth).
    pub max_depth: Option<u64>,
}

/// The override store: (scope, name, key) → value.
type Overrides = BTreeMap<(String, String, String), String>;

/// Config plus runtime overrides, shared by every actor that enforces a limit.
pub struct Limits {
    config: RwLock<Arc<Config>>,
    overrides: RwLock<Overrides>,
}

impl Limits {
    /// Limits from the config and the stored overrides.
    pub fn new(config: Arc<Config>, stored: Vec<Override>) -> Self {
        let overrides = stored
            .into_iter()
            .map(|o| ((o.scope, o.name, o.key), o.value))
            .collect();
        Limits {
            config: RwLock::new(config),
            overrides: RwLock::new(overrides),
        }
    }

    /// The config in force (cheap: one read lock and an `Arc` clone). Read it where
    /// it is used, not once at start, so a reload reaches every reader.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts a reloaded, validated config in force. Overrides keep their precedence.
    pub fn replace_config(&self, config: Arc<Config>) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
    }

    fn get<T: std::str::FromStr>(&self, scope: &str, name: &str, key: &str) -> Option<T> {
        let map = self.overrides.read().unwrap_or_else(|e| e.into_inner());
        map.get(&(scope.to_string(), name.to_string(), key.to_string()))
            .and_then(|v| v.parse().ok())
    }

    fn has(&self, scope: &str, name: &str, key: &str) -> bool {
        let map = self.overrides.read().unwrap_or_else(|e| e.into_inner());
        map.contains_key(&(scope.to_string(), name.to_string(), key.to_string()))
    }

    /// Replaces every override in memory with `stored` (read from a store other
    /// nodes write too); answers whether anything changed.
    pub fn replace_overrides(&self, stored: Vec<Override>) -> bool {
        let fresh: Overrides = stored
            .into_iter()
            .map(|o| ((o.scope, o.name, o.key), o.value))
            .collect();
        let mut map = self.overrides.write().unwrap_or_else(|e| e.into_inner());
        if *map == fresh {
            return false;
        }
        *map = fresh;
        true
    }

    /// Sets (Some) or removes (None) one override in memory. The caller stores it.
    pub fn set(&self, scope: &str, name: &str, key: &str, value: Option<String>) {
        let mut map = self.overrides.write().unwrap_or_else(|e| e.into_inner());
        let k = (scope.to_string(), name.to_string(), key.to_string());
        match value {
            Some(v) => map.insert(k, v),
            None => map.remove(&k),
        };
    }

    /// Whether `tenant` has no `[tenants.NAME]` table of its own, so it inherits the
    /// default tenant's limits (config and overrides) where it has no override.
    fn inherits_default(&self, tenant: &str) -> bool {
        tenant != DEFAULT_TENANT && !self.config().tenants.contains_key(tenant)
    }

    /// A tenant's effective limits: its own overrides, then its `[tenants.NAME]`
    /// table, or for a tenant without one the default tenant's effective limits
    /// (so an override of `default` reaches every unlisted tenant, as it does in the
    /// queue dispatches). "0" as an override of a cap or depth means unlimited.
    pub fn tenant(&self, tenant: &str) -> TenantLimits {
        let base = if self.inherits_default(tenant) {
            self.tenant(DEFAULT_TENANT)
        } else {
            let cfg = self.config().tenant(tenant);
            TenantLimits {
                weight: cfg.weight,
                max_concurrency: cfg.max_concurrency,
                max_depth: cfg.max_depth,
            }
        };
        let opt = |key: &str, inherited: Option<u64>| match self.get::<u64>("tenant", tenant, key) {
            Some(0) => None,
            Some(v) => Some(v),
            None => inherited,
        };
        TenantLimits {
            weight: self
                .get("tenant", tenant, "weight")
                .unwrap_or(base.weight)
                .max(1),
            max_concurrency: opt("max_concurrency", base.max_concurrency.map(u64::from))
                .map(|v| u32::try_from(v).unwrap_or(u32::MAX)),
            max_depth: opt("max_depth", base.max_depth),
        }
    }

    /// Where each of a tenant's values comes from: (weight, max_concurrency,
    /// max_depth). A value a tenant without its own table inherits from an override
    /// of `default` is an override too.
    pub fn tenant_sources(&self, tenant: &str) -> [Source; 3] {
        let inherits = self.inherits_default(tenant);
        ["weight", "max_concurrency", "max_depth"].map(|k| {
            if inherits && !self.has("tenant", tenant, k) {
                self.source("tenant", DEFAULT_TENANT, k)
            } else {
                self.source("tenant", tenant, k)
            }
        })
    }

    fn source(&self, scope: &str, name: &str, key: &str) -> Source {
        if self.has(scope, name, key) {
            Source::Override
        } else {
            Source::Config
        }
    }

    /// A tenant's cap in `queue`: an operator override wins, then the queue's
    /// `tenants.T.max_concurrency`, then the tenant's own; a tenant without a
    /// `[tenants.NAME]` table and without those has the default tenant's cap in
    /// `queue` (which the queue's `tenants.default` may set).
    pub fn tenant_cap(&self, queue: &str, tenant: &str) -> Option<u32> {
        if self.has("tenant", tenant, "max_concurrency") {
            return self.tenant(tenant).max_concurrency;
        }
        if let Some(&cap) = self
            .config()
            .queues
            .get(queue)
            .and_then(|q| q.tenant_caps.get(tenant))
        {
            return Some(cap);
        }
        if self.inherits_default(tenant) {
            return self.tenant_cap(queue, DEFAULT_TENANT);
        }
        self.tenant(tenant).max_concurrency
    }

    /// Every tenant named in the config or in an override (and "default"), sorted,
    /// each once.
    pub fn tenant_names(&self) -> Vec<String> {
        let map = self.overrides.read().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = self.config().tenants.keys().cloned().collect();
        names.extend(
            map.keys()
                .filter(|(scope, _, _)| scope == "tenant")
                .map(|(_, name, _)| name.clone()),
        );
        names.push("default".into());
        names.sort();
        names.dedup();
        names
    }

    /// A queue's worker bounds (min, max), min never above max.
    pub fn workers(&self, queue: &str, cfg: &WorkersConfig) -> (u32, u32) {
        let min = self.get("queue", queue, "workers_min").unwrap_or(cfg.min);
        let max = self.get("queue", queue, "workers_max").unwrap_or(cfg.max);
        (min.min(max), max)
    }

    /// Where a queue's worker bounds come from: (min, max).
    pub fn worker_sources(&self, queue: &str) -> [Source; 2] {
        ["workers_min", "workers_max"].map(|k| self.source("queue", queue, k))
    }

    /// The configured `[rate_limiters.*]` names.
    pub fn limiter_names(&self) -> Vec<String> {
        self.config().rate_limiters.keys().cloned().collect()
    }

    /// A limiter's settings in force, or `None` if no `[rate_limiters.NAME]` exists.
    /// An override of `per_second` alone keeps the configured burst.
    pub fn limiter(&self, name: &str) -> Option<RateLimiterConfig> {
        let cfg = *self.config().rate_limiters.get(name)?;
        Some(RateLimiterConfig {
            per_second: self
                .get("limiter", name, "per_second")
                .unwrap_or(cfg.per_second)
                .max(1),
            burst: self
                .get("limiter", name, "burst")
                .unwrap_or(cfg.burst)
                .max(1),
        })
    }

    /// Where a limiter's settings come from: (per_second, burst).
    pub fn limiter_sources(&self, name: &str) -> [Source; 2] {
        ["per_second", "burst"].map(|k| self.source("limiter", name, k))
    }

    /// Whether an operator paused the queue.
    pub fn paused(&self, queue: &str) -> bool {
        self.get("queue", queue, "paused").unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn limits(stored: Vec<Override>) -> Limits {
        let text = r#"
[queues.q]
executor = { kind = "external" }
tenants.acme = { max_concurrency = 2 }
[tenants.default]
weight = 1
max_concurrency = 4
[tenants.acme]
weight = 3
max_concurrency = 10
"#;
        let config = Config::parse(text, Path::new("/tmp/qd.toml")).expect("config");
        Limits::new(Arc::new(config), stored)
    }

    fn ov(scope: &str, name: &str, key: &str, value: &str) -> Override {
        Override {
            scope: scope.into(),
            name: name.into(),
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn unconfigured_tenants_inherit_default_and_queue_caps_win_over_tenant_caps() {
        let l = limits(vec![]);
        assert_eq!(l.tenant("someone").max_concurrency, Some(4));
        assert_eq!(l.tenant("acme").weight, 3);
        assert_eq!(l.tenant_cap("q", "acme"), Some(2));
        assert_eq!(l.tenant_sources("acme"), [Source::Config; 3]);
    }

    #[test]
    fn overrides_win_and_can_be_reset() {
        let l = limits(vec![ov("tenant", "acme", "weight", "5")]);
        assert_eq!(l.tenant("acme").weight, 5);
        l.set("tenant", "acme", "max_concurrency", Some("1".into()));
        assert_eq!(l.tenant_cap("q", "acme"), Some(1));
        l.set("tenant", "acme", "max_concurrency", Some("0".into()));
        assert_eq!(l.tenant_cap("q", "acme"), None);
        l.set("tenant", "acme", "weight", None);
        assert_eq!(l.tenant("acme").weight, 3);
        assert_eq!(l.tenant_sources("acme")[0], Source::Config);
    }

    #[test]
    fn unlisted_tenants_inherit_the_default_tenants_overrides_and_queue_caps() {
        let text = "[queues.q]\nexecutor = { kind = \"external\" }\n\
                    tenants.default = { max_concurrency = 1 }\n\
                    [queues.r]\nexecutor = { kind = \"external\" }\n\
                    [tenants.default]\nmax_concurrency = 4\n[tenants.acme]\nweight = 3\n";
        let config = Config::parse(text, Path::new("/tmp/qd.toml")).expect("config");
        let l = Limits::new(
            Arc::new(config),
            vec![
                ov("tenant", "default", "max_depth", "7"),
                ov("tenant", "someone", "weight", "5"),
            ],
        );
        let someone = l.tenant("someone");
        assert_eq!(
            (someone.weight, someone.max_concurrency, someone.max_depth),
            (5, Some(4), Some(7))
        );
        assert_eq!(
            l.tenant_cap("q", "someone"),
            Some(1),
            "the queue's default cap"
        );
        assert_eq!(
            l.tenant_sources("someone"),
            [Source::Override, Source::Config, Source::Override],
            "weight its own, max_depth default's override"
        );
        assert_eq!(l.tenant_cap("r", "someone"), Some(4));
        // A tenant with its own table inherits nothing.
        let acme = l.tenant("acme");
        assert_eq!((acme.max_concurrency, acme.max_depth), (None, None));
        assert_eq!(l.tenant_cap("q", "acme"), None);
        // Its own override still wins.
        l.set("tenant", "someone", "max_concurrency", Some("0".into()));
        assert_eq!(l.tenant_cap("q", "someone"), None);
    }

    #[test]
    fn limiter_overrides_overlay_the_config_field_by_field() {
        let text = "[queues.q]\nexecutor = { kind = \"external\" }\nrate_limiter = \"smtp\"\n\
                    [rate_limiters.smtp]\nper_second = 50\nburst = 10\n";
        let config = Config::parse(text, Path::new("/tmp/qd.toml")).expect("config");
        let l = Limits::new(
            Arc::new(config),
            vec![ov("limiter", "smtp", "per_second", "5")],
        );
        let smtp = l.limiter("smtp").expect("configured");
        assert_eq!((smtp.per_second, smtp.burst), (5, 10));
        assert_eq!(
            l.limiter_sources("smtp"),
            [Source::Override, Source::Config]
        );
        assert_eq!(l.limiter("nope"), None);
        assert_eq!(l.limiter_names(), ["smtp"]);
    }

    #[test]
    fn worker_bounds_keep_min_at_most_max() {
        let l = limits(vec![ov("queue", "q", "workers_max", "2")]);
        let cfg = WorkersConfig {
            min: 3,
            max: 8,
            target_age: std::time::Duration::from_secs(5),
            idle_cooldown: std::time::Duration::from_secs(30),
        };
        assert_eq!(l.workers("q", &cfg), (2, 2));
    }
}
