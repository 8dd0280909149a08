//! The shipped alert rules against a real Prometheus server scraping a real qd:
//! a dead-lettered job makes `QdDlqNotEmpty` go pending, then firing, as seen
//! through Prometheus' HTTP API (`/api/v1/alerts`), and every rule evaluates
//! without error on qd's real series.
//!
//! Needs `/usr/bin/prometheus` (Debian package `prometheus`, installed by `.ci/run`);
//! without it the test fails under `CI=true` and prints a visible skip elsewhere. The rules are a copy of
//! `deploy/prometheus/qd-alerts.yml` with the DLQ alert's `for: 5m` shortened to
//! `for: 5s`, so the test takes seconds; everything else is the shipped file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Qd, free_port, script, tool_missing, wait_for};
use serde_json::Value;

const PROMETHEUS: &str = "/usr/bin/prometheus";
/// The DLQ alert's hold time in the shipped rules, and in the test's copy.
const SHIPPED_FOR: &str = "for: 5m";
const TEST_FOR: &str = "for: 5s";

/// A Prometheus server on loopback; killed (and reaped) when dropped.
struct Prometheus {
    child: Child,
    url: String,
    log: PathBuf,
    agent: ureq::Agent,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Writes a config scraping `target` (host:port) every second as job `qd`, with
    /// `rules` as its only rule file, and starts the server in `dir`.
    fn start(dir: &Path, target: &str, rules: &Path) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules}\n\
                 scrape_configs:\n  - job_name: qd\n    static_configs:\n      - targets: [\"{target}\"]\n",
                rules = rules.display()
            ),
        )
        .expect("write prometheus.yml");
        let port = free_port();
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("prometheus log");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start prometheus");
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            agent,
        };
        wait_for("prometheus to be ready", Duration::from_secs(60), || {
            prometheus.api("/-/ready").map(|_| ())
        });
        prometheus
    }

    /// GET `path`; the JSON body when the answer is 200 (`None` for any failure).
    fn api(&self, path: &str) -> Option<Value> {
        let mut resp = self.agent.get(format!("{}{path}", self.url)).call().ok()?;
        if resp.status() != 200 {
            return None;
        }
        let text = resp.body_mut().read_to_string().ok()?;
        Some(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The state (`pending`, `firing`) of alert `name` for `queue`, if active.
    fn alert_state(&self, name: &str, queue: &str) -> Option<String> {
        let body = self.api("/api/v1/alerts")?;
        body["data"]["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == name && a["labels"]["queue"] == queue)
            .and_then(|a| a["state"].as_str().map(str::to_owned))
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The shipped rules with the DLQ alert's hold time shortened, written into `dir`.
fn test_rules(dir: &Path) -> PathBuf {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/qd-alerts.yml"),
    )
    .expect("read deploy/prometheus/qd-alerts.yml");
    assert_eq!(
        shipped.matches(SHIPPED_FOR).count(),
        1,
        "expected exactly one `{SHIPPED_FOR}` (QdDlqNotEmpty) in qd-alerts.yml; update this test"
    );
    let path = dir.join("qd-alerts.yml");
    std::fs::write(&path, shipped.replace(SHIPPED_FOR, TEST_FOR)).expect("write rules");
    path
}

#[test]
fn a_dead_lettered_job_makes_the_dlq_alert_pending_then_firing_in_real_prometheus() {
    if !Path::new(PROMETHEUS).exists() {
        tool_missing(
            PROMETHEUS,
            "Debian package `prometheus`; .ci/run installs it",
        );
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(
        work.path(),
        "work.sh",
        "echo \"cannot parse the payload\" >&2\nexit 65",
    );
    let qd = Qd::start(&format!(
        "[queues.work]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n",
        prog.display()
    ));
    let target = qd
        .metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_owned();
    let rules_path = test_rules(work.path());
    let prometheus = Prometheus::start(work.path(), &target, &rules_path);
    wait_for("prometheus to scrape qd", Duration::from_secs(30), || {
        let up = prometheus.api("/api/v1/query?query=up%7Bjob%3D%22qd%22%7D")?;
        (up["data"]["result"][0]["value"][1] == "1").then_some(())
    });
    assert_eq!(prometheus.alert_state("QdDlqNotEmpty", "work"), None);

    let id = qd.enqueue("work", "not json");
    assert_eq!(qd.wait_final(&id, Duration::from_secs(30))["state"], "dead");
    let dead_at = Instant::now();

    let mut seen: Vec<String> = Vec::new();
    let fired = wait_for("QdDlqNotEmpty to fire", Duration::from_secs(60), || {
        let state = prometheus.alert_state("QdDlqNotEmpty", "work");
        if let Some(s) = &state
            && seen.last() != Some(s)
        {
            seen.push(s.clone());
        }
        (state.as_deref() == Some("firing")).then(|| dead_at.elapsed())
    });
    assert_eq!(
        seen,
        ["pending", "firing"],
        "alert states seen, in order\n{}",
        prometheus.logs()
    );

    // Every shipped rule evaluated cleanly against qd's real series.
    let rules = prometheus.api("/api/v1/rules").expect("rules");
    let all: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .collect();
    let shipped = std::fs::read_to_string(&rules_path).expect("read the test's rules");
    let alerts = shipped.matches("- alert: ").count();
    assert_eq!(all.len(), alerts, "every shipped rule is loaded: {rules}");
    for rule in &all {
        assert_eq!(rule["health"], "ok", "rule {} failed: {rule}", rule["name"]);
    }
    let active: Vec<String> = prometheus.api("/api/v1/alerts").expect("alerts")["data"]["alerts"]
        .as_array()
        .expect("alerts")
        .iter()
        .map(|a| a["labels"]["alertname"].to_string())
        .collect();
    assert_eq!(
        active,
        ["\"QdDlqNotEmpty\""],
        "only the DLQ alert should be active"
    );
    eprintln!(
        "prometheus: QdDlqNotEmpty firing {fired:?} after the job died (for: 5s, 1s scrape and evaluation)"
    );
}
