//! Metrics, autoscaling and systemd notifications, tested through the real `qd`
//! binary: the `/metrics` scrape is parsed with `prometheus-parse` and checked
//! against what the jobs did, across a pause, a `kill -9` restart and a drain; a
//! backlog of slow jobs grows a pool to `max` and idleness shrinks it to `min`
//! without flapping; `READY=1`, `WATCHDOG=1` and `STOPPING=1` reach a
//! `NOTIFY_SOCKET` the test binds, at the right moments.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Qd, script, wait_for};
use prometheus_parse::{Sample, Scrape, Value};
use serde_json::json;

const LONG: Duration = Duration::from_secs(60);

/// Exit 65 (EX_DATAERR) is a permanent failure: the job is dead-lettered at once.
const PROGRAM: &str = r#"p=$(cat)
case "$p" in
  bad) echo "cannot parse the payload" >&2; exit 65 ;;
esac
exit 0"#;

fn command_queue(name: &str, program: &Path, extra: &str) -> String {
    format!(
        "[queues.{name}]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n{extra}\n",
        program.display()
    )
}

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("the scrape parses")
}

/// The samples of `name` whose labels include every pair of `labels`.
fn matching<'a>(scrape: &'a Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect()
}

/// The sum of the counter/gauge samples of `name` matching `labels`; `None` if there are none.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found = matching(scrape, name, labels);
    (!found.is_empty()).then(|| {
        found
            .iter()
            .map(|s| match &s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
                other => panic!("{name} is not a counter or gauge: {other:?}"),
            })
            .sum()
    })
}

/// The observation count (the `+Inf` bucket) of histogram `name`, summed over `labels`.
fn observations(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    matching(scrape, name, labels)
        .iter()
        .map(|s| match &s.value {
            Value::Histogram(buckets) => buckets
                .iter()
                .find(|b| b.less_than.is_infinite())
                .map_or(0.0, |b| b.count),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}

/// Scrapes until `check` holds (the gauges refresh every second); returns that scrape.
fn wait_scrape(qd: &Qd, what: &str, check: impl Fn(&Scrape) -> bool) -> Scrape {
    wait_for(what, Duration::from_secs(20), || {
        let scrape = parse(&qd.scrape());
        check(&scrape).then_some(scrape)
    })
}

fn gauge_is(scrape: &Scrape, name: &str, queue: &str, extra: &[(&str, &str)], want: f64) -> bool {
    let mut labels = vec![("queue", queue)];
    labels.extend_from_slice(extra);
    value(scrape, name, &labels) == Some(want)
}

fn qctl_ok(qd: &Qd, args: &[&str]) -> String {
    let out = qd.qctl(args);
    assert!(
        out.status.success(),
        "qctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_limiter_throttle_counter_starts_at_zero_and_counts_each_throttled_pause() {
    let qd = Qd::start(
        "[rate_limiters.smtp]\nper_second = 100\nburst = 10\n\n\
         [queues.ext]\nexecutor = { kind = \"external\" }\nrate_limiter = \"smtp\"\n",
    );
    let limiter = [("limiter", "smtp")];
    let name = "qd_rate_limiter_throttled_total";
    let scrape = parse(&qd.scrape());
    assert_eq!(
        value(&scrape, name, &limiter),
        Some(0.0),
        "exported at 0 before the first pause, so rate() sees that pause"
    );
    let id = qd.enqueue("ext", "x");
    let job = common::lease_one(&qd, "ext", "w", "5s").expect("lease");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/nack"),
        &json!({ "token": job["token"], "kind": "throttled", "retry_after": "1s" }),
    );
    assert_eq!(status, 200, "nack: {body}");
    wait_scrape(&qd, "one throttled pause", |s| {
        value(s, name, &limiter) == Some(1.0)
    });
}

#[test]
fn gauges_counters_and_histograms_follow_the_jobs_across_restart_and_drain() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "work.sh", PROGRAM);
    let body = format!(
        "[tenants.acme]\nweight = 2\n\n{}",
        command_queue(
            "work",
            &prog,
            "max_attempts = 3\nworkers = { min = 2, max = 2 }"
        )
    );
    let mut qd = Qd::start(&body);

    // 10 jobs: tenant acme (configured), zed (not configured: label "other"), and
    // none (the built-in "default" tenant); one bad payload each for acme and zed.
    let plan = [
        (Some("acme"), "ok", 3),
        (Some("acme"), "bad", 1),
        (Some("zed"), "ok", 3),
        (Some("zed"), "bad", 1),
        (None, "ok", 2),
    ];
    let mut ids = Vec::new();
    for (tenant, payload, n) in plan {
        for _ in 0..n {
            let mut job = json!({ "payload": payload });
            if let Some(t) = tenant {
                job["tenant"] = json!(t);
            }
            ids.push(qd.enqueue_json("work", job));
        }
    }
    assert_eq!(ids.len(), 10);
    for id in &ids {
        qd.wait_final(id, LONG);
    }

    let q = "work";
    let s = wait_scrape(&qd, "qd_dlq_depth{queue=work} = 2", |s| {
        gauge_is(s, "qd_dlq_depth", q, &[], 2.0)
            && gauge_is(s, "qd_queue_depth", q, &[("state", "dead")], 2.0)
    });
    let completed = |tenant: &str, outcome: &str| {
        value(
            &s,
            "qd_jobs_completed_total",
            &[("queue", q), ("tenant", tenant), ("outcome", outcome)],
        )
    };
    assert_eq!(completed("acme", "succeeded"), Some(3.0));
    assert_eq!(completed("other", "succeeded"), Some(3.0));
    assert_eq!(completed("default", "succeeded"), Some(2.0));
    assert_eq!(completed("acme", "dead"), Some(1.0));
    assert_eq!(completed("other", "dead"), Some(1.0));
    let enqueued = |tenant: &str| {
        value(
            &s,
            "qd_jobs_enqueued_total",
            &[("queue", q), ("tenant", tenant)],
        )
    };
    assert_eq!(
        (enqueued("acme"), enqueued("other"), enqueued("default")),
        (Some(4.0), Some(4.0), Some(2.0))
    );
    let attempts = |outcome: &str| {
        value(
            &s,
            "qd_job_attempts_total",
            &[("queue", q), ("outcome", outcome)],
        )
    };
    assert_eq!(attempts("succeeded"), Some(8.0));
    assert_eq!(attempts("permanent"), Some(2.0));
    // Registered at 0 so that rate() sees the first one.
    assert_eq!(attempts("failed"), Some(0.0));
    assert_eq!(attempts("lease_expired"), Some(0.0));
    assert_eq!(
        observations(&s, "qd_job_wait_seconds", &[("queue", q)]),
        10.0
    );
    let run = |outcome: &str| {
        observations(
            &s,
            "qd_job_run_seconds",
            &[("queue", q), ("outcome", outcome)],
        )
    };
    assert_eq!((run("succeeded"), run("permanent")), (8.0, 2.0));
    assert!(gauge_is(
        &s,
        "qd_queue_depth",
        q,
        &[("state", "ready")],
        0.0
    ));
    assert!(gauge_is(
        &s,
        "qd_queue_oldest_ready_age_seconds",
        q,
        &[],
        0.0
    ));

    // Bounded labels: no unconfigured tenant and no job id anywhere in the scrape.
    let text = qd.scrape();
    assert!(
        !text.contains("zed"),
        "an unconfigured tenant became a label"
    );
    for id in &ids {
        assert!(!text.contains(id.as_str()), "job id {id} became a label");
    }
    let parsed = parse(&text);
    let tenants: std::collections::BTreeSet<&str> = parsed
        .samples
        .iter()
        .filter_map(|s| s.labels.get("tenant"))
        .map(|t| match t {
            "acme" | "other" | "default" => t,
            other => panic!("unexpected tenant label {other}"),
        })
        .collect();
    assert_eq!(tenants.len(), 3, "{tenants:?}");

    // Paused: jobs wait, and the oldest ready age grows.
    qctl_ok(&qd, &["queue", "pause", q]);
    let waiting: Vec<String> = (0..3).map(|_| qd.enqueue(q, "ok")).collect();
    let s = wait_scrape(&qd, "3 ready jobs older than 1s", |s| {
        gauge_is(s, "qd_queue_depth", q, &[("state", "ready")], 3.0)
            && value(s, "qd_queue_oldest_ready_age_seconds", &[("queue", q)])
                .is_some_and(|age| age >= 1.0)
    });
    let age_before =
        value(&s, "qd_queue_oldest_ready_age_seconds", &[("queue", q)]).expect("oldest ready age");
    let dlq_age = value(&s, "qd_dlq_oldest_age_seconds", &[("queue", q)]).expect("dlq age");
    assert!(dlq_age > 0.0, "oldest DLQ age is {dlq_age}");

    // kill -9 and start again: the gauges come back from the store, not from memory.
    qd.kill9();
    qd.spawn(&[]);
    wait_scrape(&qd, "the gauges to be rebuilt after kill -9", |s| {
        gauge_is(s, "qd_dlq_depth", q, &[], 2.0)
            && gauge_is(s, "qd_queue_depth", q, &[("state", "dead")], 2.0)
            && gauge_is(s, "qd_queue_depth", q, &[("state", "ready")], 3.0)
            && value(s, "qd_queue_oldest_ready_age_seconds", &[("queue", q)])
                .is_some_and(|age| age > age_before)
            && value(s, "qd_dlq_oldest_age_seconds", &[("queue", q)])
                .is_some_and(|age| age >= dlq_age)
    });

    // Drain everything: resume, purge the DLQ, cancel a delayed job.
    let delayed = qd.enqueue_json(q, json!({ "payload": "ok", "delay": "1h" }));
    wait_scrape(&qd, "one delayed job", |s| {
        gauge_is(s, "qd_queue_depth", q, &[("state", "delayed")], 1.0)
    });
    qctl_ok(&qd, &["queue", "resume", q]);
    for id in &waiting {
        assert_eq!(qd.wait_final(id, LONG)["state"], "succeeded");
    }
    qctl_ok(&qd, &["dlq", "purge", "--queue", q, "--all", "--yes"]);
    qctl_ok(&qd, &["jobs", "cancel", &delayed]);
    wait_scrape(&qd, "every gauge of a drained queue to be 0", |s| {
        ["ready", "delayed", "leased", "dead"]
            .iter()
            .all(|state| gauge_is(s, "qd_queue_depth", q, &[("state", state)], 0.0))
            && gauge_is(s, "qd_queue_oldest_ready_age_seconds", q, &[], 0.0)
            && gauge_is(s, "qd_dlq_depth", q, &[], 0.0)
            && gauge_is(s, "qd_dlq_oldest_age_seconds", q, &[], 0.0)
            && gauge_is(s, "qd_workers", q, &[("state", "busy")], 0.0)
    });
}

/// One autoscaler sample: what the pool wants and what it has.
#[derive(Clone, Copy, Debug)]
struct PoolSample {
    desired: f64,
    workers: f64,
    ready: f64,
}

fn pool_sample(qd: &Qd, queue: &str) -> Option<PoolSample> {
    let s = parse(&qd.scrape());
    Some(PoolSample {
        desired: value(&s, "qd_workers_desired", &[("queue", queue)])?,
        workers: value(&s, "qd_workers", &[("queue", queue)])?,
        ready: value(
            &s,
            "qd_queue_depth",
            &[("queue", queue), ("state", "ready")],
        )?,
    })
}

/// Samples every 250 ms until `done` holds for a sample (or `timeout`), appending to `log`.
fn sample_until(
    qd: &Qd,
    log: &mut Vec<PoolSample>,
    timeout: Duration,
    done: impl Fn(&PoolSample) -> bool,
) {
    let start = Instant::now();
    loop {
        if let Some(s) = pool_sample(qd, "slow") {
            log.push(s);
            if done(&s) {
                return;
            }
        }
        assert!(
            start.elapsed() < timeout,
            "autoscaler did not get there in {timeout:?}; samples: {log:?}\n{}",
            qd.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The number of times a sequence changes direction (up then down, or down then up).
fn direction_changes(values: &[f64]) -> usize {
    let steps: Vec<f64> = values
        .windows(2)
        .map(|w| w[1] - w[0])
        .filter(|d| *d != 0.0)
        .collect();
    steps
        .windows(2)
        .filter(|w| w[0].signum() != w[1].signum())
        .count()
}

#[test]
fn a_slow_backlog_grows_the_pool_to_max_and_idleness_shrinks_it_to_min_without_flapping() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "slow.sh", "cat >/dev/null\nsleep 1");
    let qd = Qd::start(&command_queue(
        "slow",
        &prog,
        "workers = { min = 1, max = 6, target_age = \"500ms\", idle_cooldown = \"2s\" }",
    ));
    let mut log = Vec::new();
    sample_until(&qd, &mut log, Duration::from_secs(20), |s| s.desired == 1.0);

    let ids: Vec<String> = (0..40)
        .map(|i| qd.enqueue("slow", &format!("{i}")))
        .collect();
    let started = Instant::now();
    sample_until(&qd, &mut log, Duration::from_secs(40), |s| {
        s.desired == 6.0 && s.workers == 6.0
    });
    let grown_in = started.elapsed();
    sample_until(&qd, &mut log, Duration::from_secs(90), |s| {
        s.desired == 1.0 && s.workers == 1.0 && s.ready == 0.0
    });
    let back_in = started.elapsed();
    // Steady and idle: nothing moves.
    let steady_from = log.len();
    let until = Instant::now() + Duration::from_secs(3);
    sample_until(&qd, &mut log, Duration::from_secs(10), |_| {
        Instant::now() >= until
    });
    for id in &ids {
        assert_eq!(qd.wait_final(id, LONG)["state"], "succeeded");
    }

    let desired: Vec<f64> = log.iter().map(|s| s.desired).collect();
    assert_eq!(
        direction_changes(&desired),
        1,
        "the pool should grow once and shrink once: {desired:?}"
    );
    assert!(
        log[steady_from..]
            .iter()
            .all(|s| s.desired == 1.0 && s.workers == 1.0),
        "idle pool moved: {:?}",
        &log[steady_from..]
    );
    assert!(desired.iter().all(|d| (1.0..=6.0).contains(d)));

    // Every decision is logged with its reason: growth on age, shrinking one
    // worker at a time on idleness (6 -> 1 is exactly five decisions).
    let logs = qd.logs();
    let resized: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("Worker pool resized.") && l.contains("queue=slow"))
        .collect();
    let ups = resized
        .iter()
        .filter(|l| l.contains("reason=oldest ready job"))
        .count();
    let downs = resized
        .iter()
        .filter(|l| l.contains("reason=a worker idle for"))
        .count();
    assert!(ups >= 1, "no scale-up logged: {resized:#?}");
    assert_eq!(downs, 5, "{resized:#?}");
    assert_eq!(
        ups + downs,
        resized.len(),
        "a decision without a reason: {resized:#?}"
    );
    eprintln!(
        "autoscaler: 1 -> 6 workers in {grown_in:?} ({ups} scale-ups), back to 1 after {back_in:?}; {} samples",
        log.len()
    );
}

/// One datagram received on the test's `NOTIFY_SOCKET`.
#[derive(Debug)]
struct Note {
    at: Instant,
    text: String,
    /// For `READY=1`: did /healthz, /metrics and the admin socket answer right then?
    listening: bool,
}

impl Note {
    /// True when the datagram carries the `KEY=VALUE` line `line`.
    fn says(&self, line: &str) -> bool {
        self.text.lines().any(|l| l == line)
    }
}

fn listening(qd_api: &str, metrics: &str, socket: &Path) -> bool {
    let get = |url: &str| ureq::get(url).call().is_ok_and(|r| r.status() == 200);
    get(&format!("{qd_api}/healthz")) && get(metrics) && socket.exists()
}

/// Receives notifications into `notes` until `STOPPING=1` arrives or `within` passes.
fn receive(
    sock: UnixDatagram,
    notes: Arc<Mutex<Vec<Note>>>,
    (api, metrics, socket): (String, String, std::path::PathBuf),
    within: Duration,
) {
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("read timeout");
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < within {
        let Ok(n) = sock.recv(&mut buf) else { continue };
        let at = Instant::now();
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        let ready = text.lines().any(|l| l == "READY=1");
        let stopping = text.lines().any(|l| l == "STOPPING=1");
        let listening = ready && listening(&api, &metrics, &socket);
        notes.lock().expect("notes").push(Note {
            at,
            text,
            listening,
        });
        if stopping {
            return;
        }
    }
}

#[test]
fn ready_comes_after_the_listeners_watchdog_pings_keep_time_and_sigterm_says_stopping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let notify = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify).expect("bind the notify socket");
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "work.sh", PROGRAM);
    let mut qd = Qd::configure(dir, &command_queue("work", &prog, ""), "5s");
    let notes = Arc::new(Mutex::new(Vec::new()));
    let receiver = {
        let notes = notes.clone();
        let addrs = (qd.api.clone(), qd.metrics.clone(), qd.socket.clone());
        std::thread::spawn(move || receive(sock, notes, addrs, Duration::from_secs(60)))
    };
    let notify_path = notify.to_string_lossy().into_owned();
    qd.spawn(&[
        ("NOTIFY_SOCKET", notify_path.as_str()),
        ("WATCHDOG_USEC", "2000000"),
    ]);
    let count = |what: &str| {
        notes
            .lock()
            .expect("notes")
            .iter()
            .filter(|n| n.says(what))
            .count()
    };
    wait_for("four watchdog pings", Duration::from_secs(20), || {
        (count("WATCHDOG=1") >= 4).then_some(())
    });
    let status = qd.terminate(Duration::from_secs(20));
    assert!(status.success(), "qd exited with {status}");
    receiver.join().expect("receiver thread");

    let notes = notes.lock().expect("notes");
    let ready: Vec<&Note> = notes.iter().filter(|n| n.says("READY=1")).collect();
    assert_eq!(ready.len(), 1, "{notes:?}");
    assert!(
        ready[0].listening,
        "READY=1 came before /healthz, /metrics and the admin socket answered"
    );
    let status = notes.iter().find(|n| {
        n.text
            .lines()
            .any(|l| l.starts_with("STATUS=serving 1 queues"))
    });
    assert!(
        status.is_some_and(|s| s.at >= ready[0].at),
        "no STATUS line after READY: {notes:?}"
    );
    let stopping: Vec<&Note> = notes.iter().filter(|n| n.says("STOPPING=1")).collect();
    assert_eq!(stopping.len(), 1, "{notes:?}");
    assert!(stopping[0].at > ready[0].at);
    let pings: Vec<Instant> = notes
        .iter()
        .filter(|n| n.says("WATCHDOG=1") && n.at > ready[0].at && n.at < stopping[0].at)
        .map(|n| n.at)
        .collect();
    assert!(pings.len() >= 3, "{notes:?}");
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    let widest = gaps.iter().max().copied().unwrap_or_default();
    // WATCHDOG_USEC=2s: systemd would kill qd after a 2 s silence.
    assert!(
        widest < Duration::from_secs(2),
        "a watchdog gap of {widest:?}: {gaps:?}"
    );
    eprintln!("sd_notify: {} pings, widest gap {widest:?}", pings.len());
}
