//! Checks that `deploy/` agrees with the code and with its tools:
//! - every `qd_*` series named by the Grafana dashboard and the Prometheus rules
//!   (and their unit tests) is in `qd::metrics::METRIC_NAMES`;
//! - `promtool` accepts the rules, passes their unit tests, accepts the example
//!   config and parses every dashboard query (without promtool: fails under
//!   `CI=true`, a visible skip elsewhere);
//! - the systemd unit has the keys the deployment relies on, and
//!   `systemd-analyze verify` accepts it without a single warning (when present).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use qd::metrics::METRIC_NAMES;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read(relative: &str) -> String {
    let path = deploy_dir().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The `qd_*` identifiers in a PromQL expression, histogram suffixes stripped.
fn qd_series(expr: &str) -> BTreeSet<String> {
    let bytes = expr.as_bytes();
    let mut found = BTreeSet::new();
    let mut i = 0;
    while let Some(pos) = expr[i..].find("qd_") {
        let start = i + pos;
        let boundary = start == 0
            || !matches!(bytes[start - 1], b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b':');
        let len = expr[start..]
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(expr.len() - start);
        if boundary {
            let name = &expr[start..start + len];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            found.insert(base.to_owned());
        }
        i = start + len;
    }
    found
}

fn assert_known(source: &str, exprs: &[String]) {
    assert!(!exprs.is_empty(), "{source}: no expressions found");
    for expr in exprs {
        for name in qd_series(expr) {
            assert!(
                METRIC_NAMES.contains(&name.as_str()),
                "{source}: {name} (in `{expr}`) is not in METRIC_NAMES"
            );
        }
    }
}

/// Every string under a `expr`, `query` or `definition` key, anywhere in the dashboard.
fn dashboard_queries(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains("qd_") => out.push(s.clone()),
                    _ => dashboard_queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

fn dashboard_exprs() -> Vec<String> {
    let dashboard: Value =
        serde_json::from_str(&read("grafana/qd-dashboard.json")).expect("dashboard is JSON");
    let mut out = Vec::new();
    dashboard_queries(&dashboard, &mut out);
    out
}

/// The values of `key:` lines of a YAML file. Single-line values only: a block
/// scalar (`key: |`) fails loudly rather than being skipped.
fn yaml_values(file: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}:");
    read(file)
        .lines()
        .filter_map(|line| {
            line.trim_start()
                .trim_start_matches("- ")
                .strip_prefix(&prefix)
        })
        .map(|v| {
            let v = v.trim();
            assert!(
                !v.is_empty() && !v.starts_with(['|', '>']),
                "{file}: multi-line {key} is not supported by this check"
            );
            v.trim_matches(['\'', '"']).to_owned()
        })
        .collect()
}

#[test]
fn dashboard_uses_only_exported_metrics() {
    let exprs = dashboard_exprs();
    assert_known("grafana/qd-dashboard.json", &exprs);
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| qd_series(e)).collect();
    assert!(used.len() >= 12, "dashboard covers only {used:?}");
}

#[test]
fn dashboard_has_datasource_and_queue_variables() {
    let dashboard: Value =
        serde_json::from_str(&read("grafana/qd-dashboard.json")).expect("dashboard is JSON");
    let vars = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no ${name} variable"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    assert_eq!(
        var("queue")["definition"],
        "label_values(qd_queue_depth, queue)"
    );
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "panel {} ignores $datasource",
                panel["title"]
            );
        }
    }
}

#[test]
fn alert_rules_and_their_tests_use_only_exported_metrics() {
    let exprs = yaml_values("prometheus/qd-alerts.yml", "expr");
    let alerts = yaml_values("prometheus/qd-alerts.yml", "alert");
    assert_eq!(
        exprs.len(),
        alerts.len(),
        "every alert has exactly one single-line expr"
    );
    assert_known("prometheus/qd-alerts.yml", &exprs);
    assert_known(
        "prometheus/qd-alerts.test.yml",
        &yaml_values("prometheus/qd-alerts.test.yml", "series"),
    );
}

#[test]
fn series_scanner_finds_names_and_strips_histogram_suffixes() {
    let names = qd_series(
        r#"histogram_quantile(0.9, sum by (le) (rate(qd_job_wait_seconds_bucket{queue=~"$queue"}[5m]))) / qd_dlq_depth + foo_qd_x"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["qd_job_wait_seconds".to_owned(), "qd_dlq_depth".to_owned()])
    );
}

/// Runs `program args` in `dir`; `None` when the program is not installed.
fn run(program: &str, args: &[&str], dir: &Path) -> Option<Output> {
    match Command::new(program).args(args).current_dir(dir).output() {
        Ok(out) => Some(out),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => panic!("cannot run {program}: {e}"),
    }
}

fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_rules_tests_config_and_dashboard_queries() {
    let dir = deploy_dir().join("prometheus");
    let Some(out) = run("promtool", &["check", "rules", "qd-alerts.yml"], &dir) else {
        common::tool_missing(
            "promtool",
            "Debian package `prometheus`; .ci/run installs it",
        );
        return;
    };
    assert_success("promtool check rules", &out);
    let out = run("promtool", &["test", "rules", "qd-alerts.test.yml"], &dir).expect("promtool");
    assert_success("promtool test rules", &out);
    let out = run("promtool", &["check", "config", "prometheus.yml"], &dir).expect("promtool");
    assert_success("promtool check config", &out);

    // Dashboard queries as recording rules, with Grafana's variables filled in,
    // so promtool parses every one of them as PromQL.
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in dashboard_exprs()
        .iter()
        .filter(|e| !e.starts_with("label_values("))
        .enumerate()
    {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$queue", ".*");
        let quoted = serde_json::to_string(&expr).expect("string");
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {quoted}\n"
        ));
    }
    std::fs::write(tmp.path().join("dashboard.yml"), rules).expect("write rules");
    let out = run("promtool", &["check", "rules", "dashboard.yml"], tmp.path()).expect("promtool");
    assert_success("promtool check rules (dashboard queries)", &out);
}

/// `section -> key -> values` (a key may repeat, e.g. `ExecStartPre=`).
fn parse_unit(text: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut sections: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut current = String::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
    {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.to_owned();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not key=value: {line}"));
        assert!(!current.is_empty(), "key {key} outside a section");
        sections
            .entry(current.clone())
            .or_default()
            .entry(key.trim().to_owned())
            .or_default()
            .push(value.trim().to_owned());
    }
    sections
}

#[test]
fn systemd_unit_has_the_keys_the_deployment_relies_on() {
    let unit = parse_unit(&read("systemd/qd.service"));
    let service = &unit["Service"];
    let one = |key: &str| -> &str {
        let values = service
            .get(key)
            .unwrap_or_else(|| panic!("[Service] {key}= missing"));
        assert_eq!(values.len(), 1, "[Service] {key}= set more than once");
        &values[0]
    };
    let expected = [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("WatchdogSec", "30s"),
        (
            "ExecStartPre",
            "/usr/local/bin/qd check-config /etc/qd/qd.toml",
        ),
        (
            "ExecStart",
            "/usr/local/bin/qd run --config /etc/qd/qd.toml",
        ),
        (
            "ExecReload",
            "/usr/local/bin/qctl --config /etc/qd/qd.toml reload",
        ),
        ("User", "qd"),
        ("Group", "qd"),
        ("StateDirectory", "qd"),
        ("RuntimeDirectory", "qd"),
        ("RuntimeDirectoryMode", "0750"),
        ("UMask", "0027"),
        ("Restart", "on-failure"),
        ("RestartSec", "2s"),
        ("KillMode", "mixed"),
        ("LimitNOFILE", "65536"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("SystemCallArchitectures", "native"),
        ("SystemCallFilter", "@system-service"),
        ("CapabilityBoundingSet", ""),
        ("ProtectSystem", "strict"),
    ];
    for (key, value) in expected {
        assert_eq!(one(key), value, "[Service] {key}=");
    }
    for key in [
        "NoNewPrivileges",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "MemoryDenyWriteExecute",
    ] {
        assert_eq!(one(key), "yes", "[Service] {key}=");
    }
    // systemd must wait longer than qd's default shutdown_grace (30s) plus the
    // supervisor's 15s for interrupted jobs to be killed and nacked, plus the store
    // flush, or it SIGKILLs a clean shutdown.
    let stop: Duration = humantime::parse_duration(one("TimeoutStopSec")).expect("TimeoutStopSec");
    assert!(
        stop >= Duration::from_secs(30 + 15 + 10),
        "TimeoutStopSec {stop:?} leaves no margin over 30s grace + 15s interrupt"
    );
    assert_eq!(unit["Install"]["WantedBy"], ["multi-user.target"]);
}

#[test]
fn systemd_analyze_verifies_the_unit_without_warnings() {
    // verify checks that ExecStart binaries exist; qd is not installed here, so
    // verify a copy whose commands point at /bin/true. Everything else is strict:
    // any output at all (unknown keys only warn!) fails the test.
    let tmp = tempfile::tempdir().expect("tempdir");
    let unit = read("systemd/qd.service")
        .replace("/usr/local/bin/qd ", "/bin/true ")
        .replace("/usr/local/bin/qctl ", "/bin/true ");
    assert!(
        !unit.contains("/usr/local/bin/q"),
        "an unsubstituted qd or qctl command remains"
    );
    let path = tmp.path().join("qd.service");
    std::fs::write(&path, unit).expect("write unit copy");
    let path = path.to_str().expect("utf-8 temp path");
    let Some(out) = run("systemd-analyze", &["verify", path], tmp.path()) else {
        common::tool_missing(
            "systemd-analyze",
            "Debian package `systemd`; the key check above still ran",
        );
        return;
    };
    assert_success("systemd-analyze verify", &out);
    let noise = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        noise.trim().is_empty(),
        "systemd-analyze verify complained:\n{noise}"
    );
}
