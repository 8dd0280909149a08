use std::collections::HashMap;

use metrics_exporter_prometheus::PrometheusRecorder;
use prometheus_parse::{Sample, Scrape, Value};

use super::*;

/// Runs `events` against a fresh recorder with the production settings and returns
/// the parsed scrape plus the raw text. No network, no global recorder.
fn scrape(events: impl FnOnce()) -> (Scrape, String) {
    let recorder: PrometheusRecorder = builder().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, events);
    let text = handle.render();
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parse render");
    (scrape, text)
}

fn samples<'a>(scrape: &'a Scrape, name: &str) -> Vec<&'a Sample> {
    scrape.samples.iter().filter(|s| s.metric == name).collect()
}

fn every_event(tenants: &TenantLabels) {
    describe();
    set_build_info();
    job_enqueued(tenants, "email", "acme");
    enqueue_rejected(Some("email"), RejectReason::QueueFull);
    attempt_finished("email", Outcome::Failed, Duration::from_millis(300));
    job_completed(tenants, "email", "acme", Completion::Dead);
    job_waited("email", Duration::from_secs(2));
    lease_expired("email");
    dependencies_released("email");
    dependencies_blocked("email");
    Restarts::default().record("broker");
    limiter_throttled("smtp");
    set_queue_depth("email", DepthState::Ready, 7);
    set_oldest_ready_age("email", Duration::from_secs(12));
    set_dlq("email", 3, Duration::from_secs(90));
    set_workers("email", 2, 1, 4);
    store_writable(false);
    store_batch(Duration::from_millis(3));
    config_loaded();
    config_reloaded(false);
    jobs_pruned("email", 1_000);
    set_prune_backlog_age("email", Duration::from_secs(3));
    cluster_leader(true);
    set_cluster_depth("email", DepthState::Leased, 4);
    register_schedule("nightly");
    schedule_ticks("nightly", ScheduleResult::CaughtUp, 1);
    schedule_next_fire("nightly", Some(1_764_550_800_000));
    schedule_last_fire("nightly", 1_764_464_400_000);
}

#[derive(Debug, PartialEq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

fn kind(value: &Value) -> Option<Kind> {
    match value {
        Value::Counter(_) => Some(Kind::Counter),
        Value::Gauge(_) => Some(Kind::Gauge),
        Value::Histogram(_) => Some(Kind::Histogram),
        Value::Summary(_) | Value::Untyped(_) => None,
    }
}

#[test]
fn every_metric_name_is_exported_with_its_type_and_help() {
    let expected: HashMap<&str, Kind> = HashMap::from([
        ("qd_jobs_enqueued_total", Kind::Counter),
        ("qd_jobs_completed_total", Kind::Counter),
        ("qd_job_attempts_total", Kind::Counter),
        ("qd_queue_depth", Kind::Gauge),
        ("qd_queue_oldest_ready_age_seconds", Kind::Gauge),
        ("qd_dlq_depth", Kind::Gauge),
        ("qd_dlq_oldest_age_seconds", Kind::Gauge),
        ("qd_job_wait_seconds", Kind::Histogram),
        ("qd_store_batch_seconds", Kind::Histogram),
        ("qd_job_run_seconds", Kind::Histogram),
        ("qd_leases_expired_total", Kind::Counter),
        ("qd_enqueue_rejected_total", Kind::Counter),
        ("qd_workers", Kind::Gauge),
        ("qd_workers_desired", Kind::Gauge),
        ("qd_actor_restarts_total", Kind::Counter),
        ("qd_rate_limiter_throttled_total", Kind::Counter),
        ("qd_build_info", Kind::Gauge),
        ("qd_store_writable", Kind::Gauge),
        ("qd_config_reloads_total", Kind::Counter),
        (
            "qd_config_last_reload_success_timestamp_seconds",
            Kind::Gauge,
        ),
        ("qd_jobs_pruned_total", Kind::Counter),
        ("qd_prune_backlog_age_seconds", Kind::Gauge),
        ("qd_cluster_leader", Kind::Gauge),
        ("qd_cluster_queue_depth", Kind::Gauge),
        ("qd_schedule_fires_total", Kind::Counter),
        ("qd_schedule_next_fire_timestamp_seconds", Kind::Gauge),
        ("qd_schedule_last_fire_timestamp_seconds", Kind::Gauge),
        ("qd_dependencies_released_total", Kind::Counter),
        ("qd_dependencies_blocked_total", Kind::Counter),
    ]);
    assert_eq!(
        METRIC_NAMES.len(),
        expected.len(),
        "vocabulary and test disagree"
    );
    let (scrape, _) = scrape(|| every_event(&TenantLabels::new(["acme"])));
    for name in METRIC_NAMES {
        let found = samples(&scrape, name);
        assert!(!found.is_empty(), "{name} was not exported");
        for sample in found {
            assert_eq!(
                kind(&sample.value).as_ref(),
                expected.get(name),
                "type of {name}"
            );
        }
        assert!(scrape.docs.contains_key(*name), "{name} has no # HELP");
    }
}

#[test]
fn unconfigured_tenant_is_labelled_other() {
    let tenants = TenantLabels::new(["acme"]);
    let (scrape, text) = scrape(|| {
        job_enqueued(&tenants, "email", "acme");
        job_enqueued(&tenants, "email", "mallory-0001");
        job_enqueued(&tenants, "email", "mallory-0002");
        job_completed(&tenants, "email", "mallory-0003", Completion::Succeeded);
    });
    let enqueued = samples(&scrape, JOBS_ENQUEUED);
    let by_tenant: HashMap<&str, f64> = enqueued
        .iter()
        .map(|s| match s.value {
            Value::Counter(v) => (s.labels.get("tenant").expect("tenant label"), v),
            ref other => panic!("not a counter: {other:?}"),
        })
        .collect();
    assert_eq!(by_tenant, HashMap::from([("acme", 1.0), ("other", 2.0)]));
    let completed = samples(&scrape, JOBS_COMPLETED);
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].labels.get("tenant"), Some("other"));
    assert!(
        !text.contains("mallory"),
        "an unconfigured tenant leaked into a label"
    );
}

#[test]
fn tenant_label_passes_configured_names_only() {
    let tenants = TenantLabels::new(vec!["default".to_owned(), "acme".to_owned()]);
    assert_eq!(tenants.label("acme"), "acme");
    assert_eq!(tenants.label("default"), "default");
    assert_eq!(tenants.label("ACME"), OTHER_TENANT);
    assert_eq!(tenants.label(""), OTHER_TENANT);
    assert_eq!(TenantLabels::default().label("acme"), OTHER_TENANT);
}

#[test]
fn attempt_run_time_lands_in_seconds_buckets() {
    let (scrape, _) =
        scrape(|| attempt_finished("email", Outcome::TimedOut, Duration::from_millis(300)));
    let run = samples(&scrape, JOB_RUN);
    assert_eq!(run.len(), 1);
    assert_eq!(run[0].labels.get("outcome"), Some("timed_out"));
    let Value::Histogram(buckets) = &run[0].value else {
        panic!("not a histogram: {:?}", run[0].value)
    };
    let count_le = |le: f64| {
        buckets
            .iter()
            .find(|b| b.less_than == le)
            .unwrap_or_else(|| panic!("no bucket le={le}"))
            .count
    };
    assert_eq!(count_le(0.001), 0.0);
    assert_eq!(count_le(0.25), 0.0);
    assert_eq!(count_le(0.5), 1.0);
    assert_eq!(count_le(3600.0), 1.0);
    let attempts = samples(&scrape, JOB_ATTEMPTS);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].labels.get("outcome"), Some("timed_out"));
}

#[test]
fn rejection_for_unknown_queue_uses_the_fixed_label() {
    let (scrape, text) = scrape(|| enqueue_rejected(None, RejectReason::BadRequest));
    let rejected = samples(&scrape, ENQUEUE_REJECTED);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].labels.get("queue"), Some(UNKNOWN_QUEUE));
    assert_eq!(rejected[0].labels.get("reason"), Some("bad_request"));
    assert!(text.contains("qd_enqueue_rejected_total{queue=\"unknown\",reason=\"bad_request\"} 1"));
}

#[test]
fn registration_creates_every_bounded_counter_at_zero() {
    let (scrape, _) = scrape(|| {
        register_queue("email");
        register_actor("broker");
    });
    let zero_labels = |name: &str, label: &str| -> Vec<String> {
        let mut values: Vec<String> = samples(&scrape, name)
            .iter()
            .map(|s| {
                assert!(
                    matches!(s.value, Value::Counter(v) if v == 0.0),
                    "{name} not 0"
                );
                s.labels.get(label).expect("label present").to_owned()
            })
            .collect();
        values.sort();
        values
    };
    let mut reasons: Vec<String> = RejectReason::ALL
        .iter()
        .map(|r| r.as_str().to_owned())
        .collect();
    reasons.sort();
    assert_eq!(zero_labels(ENQUEUE_REJECTED, "reason"), reasons);
    let mut outcomes: Vec<String> = Outcome::ALL.iter().map(|o| o.as_str().to_owned()).collect();
    // Events, never an attempt's end.
    outcomes.retain(|o| !["redriven", "blocked", "released"].contains(&o.as_str()));
    outcomes.sort();
    assert_eq!(zero_labels(JOB_ATTEMPTS, "outcome"), outcomes);
    assert_eq!(zero_labels(LEASES_EXPIRED, "queue"), ["email"]);
    assert_eq!(zero_labels(JOBS_PRUNED, "queue"), ["email"]);
    assert_eq!(zero_labels(DEPENDENCIES_RELEASED, "queue"), ["email"]);
    assert_eq!(zero_labels(DEPENDENCIES_BLOCKED, "queue"), ["email"]);
    assert_eq!(zero_labels(ACTOR_RESTARTS, "actor"), ["broker"]);
}

#[test]
fn gauges_hold_the_last_snapshot() {
    let (scrape, _) = scrape(|| {
        set_workers("email", 5, 0, 8);
        set_workers("email", 2, 1, 4);
        set_dlq("email", 0, Duration::ZERO);
    });
    let value = |name: &str, state: Option<&str>| {
        let found: Vec<_> = samples(&scrape, name)
            .into_iter()
            .filter(|s| state.is_none_or(|st| s.labels.get("state") == Some(st)))
            .collect();
        assert_eq!(found.len(), 1, "{name} {state:?}");
        match found[0].value {
            Value::Gauge(v) => v,
            ref other => panic!("{name} not a gauge: {other:?}"),
        }
    };
    assert_eq!(value(WORKERS, Some("busy")), 2.0);
    assert_eq!(value(WORKERS, Some("idle")), 1.0);
    assert_eq!(value(WORKERS_DESIRED, None), 4.0);
    assert_eq!(value(DLQ_DEPTH, None), 0.0);
    assert_eq!(value(DLQ_OLDEST_AGE, None), 0.0);
}

#[test]
fn install_outside_a_runtime_is_an_error() {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    assert!(matches!(install(addr), Err(MetricsError::NoRuntime)));
}

#[tokio::test]
async fn install_on_a_busy_port_names_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("local addr");
    let err = install(addr).expect_err("port is taken");
    assert!(
        matches!(err, MetricsError::Bind { addr: a, .. } if a == addr),
        "{err:?}"
    );
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

/// The only test that installs the process-wide recorder (a second install would fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_serves_described_metrics_over_http() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = free.local_addr().expect("local addr");
    drop(free);
    install(addr).expect("install exporter");
    // A queue name no other test uses: this recorder is global to the test binary.
    lease_expired("install-test");
    let body = tokio::task::spawn_blocking(move || {
        ureq::get(format!("http://{addr}/metrics"))
            .call()
            .expect("scrape")
            .body_mut()
            .read_to_string()
            .expect("body")
    })
    .await
    .expect("scrape task");
    assert!(
        body.contains("# HELP qd_leases_expired_total Leases that expired without an ack."),
        "{body}"
    );
    assert!(body.contains(&format!(
        "qd_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    )));
    assert!(
        body.contains("qd_leases_expired_total{queue=\"install-test\"} 1"),
        "{body}"
    );
}

#[test]
fn restart_counts_and_the_restart_counter_move_together() {
    let restarts = Restarts::default();
    let clone = restarts.clone();
    let (scrape, _) = scrape(|| {
        restarts.record("worker");
        clone.record("worker");
        restarts.record("broker");
    });
    assert_eq!((restarts.count("worker"), clone.count("broker")), (2, 1));
    assert_eq!(restarts.count("dlq"), 0);
    let worker = samples(&scrape, "qd_actor_restarts_total")
        .into_iter()
        .find(|s| s.labels.get("actor") == Some("worker"))
        .map(|s| s.value.clone());
    assert!(
        matches!(worker, Some(Value::Counter(n)) if n == 2.0),
        "{worker:?}"
    );
}

#[test]
fn a_store_batch_under_a_millisecond_lands_in_a_sub_millisecond_bucket() {
    let (_, text) = scrape(|| store_batch(Duration::from_micros(300)));
    assert!(
        text.contains("qd_store_batch_seconds_bucket{le=\"0.00025\"} 0")
            && text.contains("qd_store_batch_seconds_bucket{le=\"0.0005\"} 1"),
        "{text}"
    );
}
