//! Config reload (SIGHUP, `qctl reload`): what may change live, and what changed.
//!
//! This module is the pure half of a reload: the file is read and checked by
//! [`Config::load_checked`] exactly as `qd check-config` and `qd run` do, and [`plan`] compares the
//! config in force with the new one, refusing what cannot change while qd runs and
//! describing everything else, one line per change. The Supervisor carries a plan
//! out (see `supervisor.rs`): it swaps the config in [`crate::limits::Limits`], the
//! executors, rate limiters and API tokens, and starts or stops the actors of added
//! or removed queues. Nothing is changed unless the whole file is valid and every
//! change can be applied, like `nginx -s reload` keeping its old workers when the
//! new config fails `nginx -t`.

use std::fmt::Debug;

use crate::config::{Config, QueueConfig};
use crate::executor::ExecutorSpec;

/// What a valid reload will do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// One line per change, in a stable order (`queues.q.lease: 30s -> 1m`).
    pub changes: Vec<String>,
    /// Queues to start (pool when in-process, metrics; the Broker builds their
    /// dispatch when it sees the new config).
    pub added: Vec<String>,
    /// Queues to stop; the caller must first check they hold no jobs.
    pub removed: Vec<String>,
}

/// Why a reload was refused; nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// The file is unreadable or invalid: every problem, one per line.
    #[error("{0}")]
    Invalid(String),
    /// The file is valid but asks for changes qd cannot make while running.
    #[error("{}", .0.join("\n"))]
    Refused(Vec<String>),
    /// The supervisor could not be asked (shutting down, or no answer in time).
    #[error("reload not done: {0}")]
    Unavailable(String),
}

/// Compares the config in force with `new`. Refuses (every reason at once) a change
/// of a key that needs a restart (listen addresses, `data_dir`, the database, admin socket,
/// `max_payload`) or of a queue between in-process and external workers.
pub fn plan(old: &Config, new: &Config) -> Result<Plan, Vec<String>> {
    let mut refused = Vec::new();
    let (o, n) = (&old.daemon, &new.daemon);
    let restart_only: [(&str, bool); 10] = [
        ("data_dir", o.data_dir != n.data_dir),
        ("database_url", o.database != n.database),
        ("admin_socket", o.admin_socket != n.admin_socket),
        (
            "admin_socket_mode",
            o.admin_socket_mode != n.admin_socket_mode,
        ),
        ("admin_group", o.admin_group != n.admin_group),
        ("api_listen", o.api_listen != n.api_listen),
        (
            "api_allowed_hosts",
            o.api_allowed_hosts != n.api_allowed_hosts,
        ),
        ("metrics_listen", o.metrics_listen != n.metrics_listen),
        ("max_payload", o.max_payload != n.max_payload),
        ("http", o.http != n.http),
    ];
    if old.console != new.console {
        refused.push(
            "console: changed; the console's settings need a restart (systemctl restart qd)".into(),
        );
    }
    for (key, changed) in restart_only {
        if changed {
            refused.push(format!(
                "daemon.{key}: changed; this setting needs a restart (systemctl restart qd)"
            ));
        }
    }
    // The leader's wait for a fenced node is fixed at start: a kill_grace raised
    // past it would let two runs of a job overlap (`cluster.md`).
    if let (Some(in_force), Some(wanted)) = (old.fence_wait(), new.fence_wait())
        && wanted > in_force
    {
        refused.push(format!(
            "daemon.fence_wait: the new config needs the leader to wait {} for a fenced \
             node (a longer kill_grace), {} is in force since start; this needs a restart \
             (systemctl restart qd)",
            humantime::format_duration(wanted),
            humantime::format_duration(in_force)
        ));
    }
    // The SQS routes are added to the API's router when it starts; the account,
    // region and advertised URL are read per request and reload live.
    if old.sqs.enabled != new.sqs.enabled {
        refused.push(
            "sqs.enabled: changed; this setting needs a restart (systemctl restart qd)".into(),
        );
    }
    let mut p = Plan::default();
    diff(
        &mut p.changes,
        "daemon.shutdown_grace",
        &o.shutdown_grace,
        &n.shutdown_grace,
    );
    diff(
        &mut p.changes,
        "daemon.api_tokens_file",
        &o.api_tokens_file,
        &n.api_tokens_file,
    );
    diff(&mut p.changes, "daemon.restart", &o.restart, &n.restart);
    for (name, q) in &new.queues {
        match old.queues.get(name) {
            None => {
                p.changes.push(format!("queues.{name}: added"));
                p.added.push(name.clone());
            }
            Some(before) => {
                let in_process = |spec: &ExecutorSpec| *spec != ExecutorSpec::External;
                if in_process(&before.executor) != in_process(&q.executor) {
                    refused.push(format!(
                        "queues.{name}.executor: switching between external and in-process workers needs a restart"
                    ));
                }
                queue_changes(&mut p.changes, before, q);
            }
        }
    }
    for name in old.queues.keys().filter(|q| !new.queues.contains_key(*q)) {
        p.changes.push(format!("queues.{name}: removed"));
        p.removed.push(name.clone());
    }
    map_changes(
        &mut p.changes,
        "rate_limiters",
        &old.rate_limiters,
        &new.rate_limiters,
        |out, at, o, n| {
            diff(
                out,
                &format!("{at}.per_second"),
                &o.per_second,
                &n.per_second,
            );
            diff(out, &format!("{at}.burst"), &o.burst, &n.burst);
        },
    );
    map_changes(
        &mut p.changes,
        "schedules",
        &old.schedules,
        &new.schedules,
        |out, at, o, n| {
            if o != n {
                out.push(format!("{at}: changed"));
            }
        },
    );
    map_changes(
        &mut p.changes,
        "tenants",
        &old.tenants,
        &new.tenants,
        |out, at, o, n| {
            diff(out, &format!("{at}.weight"), &o.weight, &n.weight);
            diff(
                out,
                &format!("{at}.max_concurrency"),
                &o.max_concurrency,
                &n.max_concurrency,
            );
            diff(out, &format!("{at}.max_depth"), &o.max_depth, &n.max_depth);
        },
    );
    if refused.is_empty() {
        Ok(p)
    } else {
        Err(refused)
    }
}

/// Appends `KEY: OLD -> NEW` when the values differ.
fn diff<T: PartialEq + Debug>(out: &mut Vec<String>, key: &str, old: &T, new: &T) {
    if old != new {
        out.push(format!("{key}: {old:?} -> {new:?}"));
    }
}

fn queue_changes(out: &mut Vec<String>, old: &QueueConfig, new: &QueueConfig) {
    let at = |key: &str| format!("queues.{}.{key}", new.name);
    diff(out, &at("executor"), &old.executor, &new.executor);
    diff(out, &at("lease"), &old.lease, &new.lease);
    diff(out, &at("heartbeat"), &old.heartbeat, &new.heartbeat);
    diff(out, &at("timeout"), &old.timeout, &new.timeout);
    diff(
        out,
        &at("max_attempts"),
        &old.max_attempts,
        &new.max_attempts,
    );
    diff(out, &at("backoff"), &old.backoff, &new.backoff);
    diff(out, &at("max_depth"), &old.max_depth, &new.max_depth);
    diff(out, &at("retention"), &old.retention, &new.retention);
    diff(out, &at("workers"), &old.workers, &new.workers);
    diff(
        out,
        &at("rate_limiter"),
        &old.rate_limiter,
        &new.rate_limiter,
    );
    diff(out, &at("fairness"), &old.fairness, &new.fairness);
    diff(out, &at("tenants"), &old.tenant_caps, &new.tenant_caps);
}

/// Added, removed and changed entries of a `[section.NAME]` map; `fields` lists
/// the changed fields of an entry present in both.
fn map_changes<T>(
    out: &mut Vec<String>,
    section: &str,
    old: &std::collections::BTreeMap<String, T>,
    new: &std::collections::BTreeMap<String, T>,
    fields: impl Fn(&mut Vec<String>, &str, &T, &T),
) {
    for (name, value) in new {
        match old.get(name) {
            None => out.push(format!("{section}.{name}: added")),
            Some(before) => fields(out, &format!("{section}.{name}"), before, value),
        }
    }
    for name in old.keys().filter(|k| !new.contains_key(*k)) {
        out.push(format!("{section}.{name}: removed"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(text: &str) -> Config {
        Config::parse(text, Path::new("/tmp/qd.toml")).expect("valid config")
    }

    const BASE: &str = "[daemon]\napi_listen = \"127.0.0.1:7070\"\n\
        [queues.a]\nexecutor = { kind = \"external\" }\n\
        [tenants.acme]\nweight = 1\n";

    #[test]
    fn an_added_queue_and_a_changed_weight_are_planned_and_described() {
        let new = config(&format!(
            "{}\n[queues.b]\nexecutor = {{ kind = \"external\" }}\n",
            BASE.replace("weight = 1", "weight = 3")
        ));
        let p = plan(&config(BASE), &new).expect("valid plan");
        assert_eq!(p.added, ["b"]);
        assert!(p.removed.is_empty());
        assert!(p.changes.contains(&"queues.b: added".to_string()), "{p:?}");
        assert!(
            p.changes
                .contains(&"tenants.acme.weight: 1 -> 3".to_string()),
            "{p:?}"
        );
    }

    #[test]
    fn turning_the_sqs_api_on_needs_a_restart_and_its_urls_reload_live() {
        let on = format!("{BASE}\n[sqs]\nenabled = true\n");
        let refused = plan(&config(BASE), &config(&on)).expect_err("refused");
        assert!(refused[0].contains("sqs.enabled"), "{refused:?}");
        let moved = format!("{on}advertised_url = \"http://qd.example:7070\"\n");
        assert!(plan(&config(&on), &config(&moved)).is_ok());
    }

    #[test]
    fn listen_addresses_and_executor_kind_need_a_restart_and_are_all_reported() {
        let new = config(&BASE.replace("7070", "7071").replace(
            "kind = \"external\"",
            "kind = \"command\", program = \"/bin/true\"",
        ));
        let refused = plan(&config(BASE), &new).expect_err("refused");
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused[0].contains("daemon.api_listen") && refused[0].contains("needs a restart"));
        assert!(refused[1].contains("queues.a.executor"));
    }

    #[test]
    fn an_unchanged_file_plans_nothing() {
        assert_eq!(plan(&config(BASE), &config(BASE)), Ok(Plan::default()));
    }
}
