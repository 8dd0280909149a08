//! Store health through the real binary: finished jobs are pruned per queue at
//! their queue's retention while enqueues keep flowing at an unchanged latency, and
//! a job's history stays small however often it was attempted.

mod common;

use std::time::{Duration, Instant};

use common::{Qd, ack, lease_one, metric, percentile, wait_for};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

/// Leases and acks jobs of `queue` until `stop` is set and nothing is left.
fn finish_until(qd: &Qd, queue: &str, worker: &str, stop: &std::sync::atomic::AtomicBool) {
    loop {
        let (status, body) = qd.post(
            &format!("/v1/queues/{queue}/leases"),
            &json!({ "worker_id": worker, "max_jobs": 100, "wait": "200ms" }),
        );
        assert_eq!(status, 200, "lease: {body}");
        let jobs = body["jobs"].as_array().expect("jobs").clone();
        if jobs.is_empty() && stop.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        for job in &jobs {
            ack(qd, job);
        }
    }
}

/// The 99th percentile of `latencies`.
fn p99(latencies: &[Duration]) -> Duration {
    assert!(!latencies.is_empty(), "no samples");
    let secs: Vec<f64> = latencies.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(percentile(&secs, 0.99))
}

#[test]
fn each_queue_is_pruned_at_its_own_retention_and_its_keys_are_freed() {
    let qd = Qd::start(
        "[queues.short]\nexecutor = { kind = \"external\" }\nretention = \"1s\"\n\
         [queues.long]\nexecutor = { kind = \"external\" }\nretention = \"1h\"\n",
    );
    let mut ids = Vec::new();
    for queue in ["short", "long"] {
        let id = qd.enqueue_json(queue, json!({ "payload": "p", "idempotency_key": "k" }));
        let job = lease_one(&qd, queue, "w", "5s").expect("leased");
        ack(&qd, &job);
        ids.push(id);
    }
    wait_for("the short-retention job to be pruned", LONG, || {
        (qd.get(&format!("/v1/jobs/{}", ids[0])).0 == 404).then_some(())
    });
    assert_eq!(qd.job(&ids[1])["state"], "succeeded", "kept for its hour");

    let (status, again) = qd.post(
        "/v1/queues/short/jobs",
        &json!({ "payload": "p", "idempotency_key": "k" }),
    );
    assert_eq!(status, 202, "the pruned job's key is free: {again}");
    assert_ne!(again["id"], json!(ids[0]));
    let (status, dup) = qd.post(
        "/v1/queues/long/jobs",
        &json!({ "payload": "p", "idempotency_key": "k" }),
    );
    assert_eq!((status, &dup["id"]), (200, &json!(ids[1])), "{dup}");

    let text = qd.scrape();
    assert_eq!(
        metric(&text, "qd_jobs_pruned_total", &[("queue", "short")]),
        1.0
    );
    assert_eq!(
        metric(&text, "qd_jobs_pruned_total", &[("queue", "long")]),
        0.0
    );
    assert!(
        text.contains("qd_prune_backlog_age_seconds{queue=\"short\"}"),
        "{text}"
    );
}

#[test]
fn sustained_load_keeps_finished_rows_bounded_and_enqueue_latency_flat() {
    const RATE: f64 = 150.0;
    const RETENTION: Duration = Duration::from_secs(3);
    const RUN: Duration = Duration::from_secs(11);
    // Jobs finish from t = 0, so nothing is past retention before `QUIET_UNTIL`.
    const QUIET_UNTIL: Duration = Duration::from_millis(2_500);
    let qd = Qd::start(
        "[queues.work]\nexecutor = { kind = \"external\" }\nretention = \"3s\"\nmax_depth = 1000000\n",
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (samples, pruned_while_quiet) = std::thread::scope(|s| {
        for w in ["w1", "w2"] {
            let (qd, stop) = (&qd, &stop);
            s.spawn(move || finish_until(qd, "work", w, stop));
        }
        let start = Instant::now();
        let mut samples: Vec<(Duration, Duration, String)> = Vec::new();
        let mut pruned_while_quiet = None;
        for n in 0u32.. {
            let due = Duration::from_secs_f64(f64::from(n) / RATE);
            if due >= RUN || start.elapsed() >= RUN {
                break;
            }
            if let Some(rest) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(rest);
            }
            if pruned_while_quiet.is_none() && start.elapsed() >= QUIET_UNTIL {
                let text = qd.scrape();
                pruned_while_quiet =
                    Some(metric(&text, "qd_jobs_pruned_total", &[("queue", "work")]));
            }
            let sent = Instant::now();
            let id = qd.enqueue("work", "steady");
            samples.push((sent - start, sent.elapsed(), id));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (samples, pruned_while_quiet.expect("run past retention"))
    });
    assert_eq!(
        pruned_while_quiet, 0.0,
        "nothing is prunable before the retention has passed"
    );

    // Before: nothing finished is past retention yet. During: the Pruner deletes
    // every second what finished `RETENTION` earlier.
    let window = |from: Duration, to: Duration| -> Vec<Duration> {
        samples
            .iter()
            .filter(|(at, _, _)| *at >= from && *at < to)
            .map(|(_, latency, _)| *latency)
            .collect()
    };
    let before = p99(&window(Duration::from_millis(300), QUIET_UNTIL));
    let during = p99(&window(RETENTION + Duration::from_secs(1), RUN));
    eprintln!(
        "enqueue p99 before pruning {before:?}, during pruning {during:?} ({} jobs at {RATE}/s)",
        samples.len()
    );
    assert!(
        during <= before * 5 + Duration::from_millis(200),
        "enqueue p99 went from {before:?} before pruning to {during:?} during pruning"
    );

    let text = qd.scrape();
    let finished = metric(
        &text,
        "qd_jobs_completed_total",
        &[("queue", "work"), ("outcome", "succeeded")],
    );
    let pruned = metric(&text, "qd_jobs_pruned_total", &[("queue", "work")]);
    assert_eq!(finished, samples.len() as f64, "every job was finished");
    // What is left is at most the last retention (plus a pass and the finishers' lag)
    // of finished jobs, not everything.
    let bound = RATE * (RETENTION.as_secs_f64() + 3.0);
    assert!(
        finished - pruned <= bound,
        "{finished} finished, {pruned} pruned: more than {bound} kept"
    );
    let first = &samples[0].2;
    assert_eq!(
        qd.get(&format!("/v1/jobs/{first}")).0,
        404,
        "pruned at retention"
    );

    let db = qd.dir.path().join("data/qd.db");
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open the store read-only");
    let stored: f64 = conn
        .query_row(
            "SELECT COUNT(*) FROM jobs WHERE queue = 'work' AND state = 'succeeded'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .expect("count") as f64;
    assert!(stored <= bound, "{stored} finished rows stored");
    let wal = std::fs::metadata(db.with_extension("db-wal")).map_or(0, |m| m.len());
    assert!(wal <= 64 << 20, "the WAL grew to {wal} bytes");
}

#[test]
fn a_thousand_attempt_poison_job_answers_a_small_history_quickly() {
    let qd = Qd::start(
        "[queues.poison]\n\
         executor = { kind = \"command\", program = \"/bin/sh\", args = [\"-c\", \"printf '%5000s' x >&2; exit 1\"] }\n\
         max_attempts = 1000\nbackoff = { base = \"1ms\", max = \"1ms\" }\nworkers = { min = 1, max = 1 }\n",
    );
    let id = qd.enqueue("poison", "fails every time");
    qd.wait_final(&id, Duration::from_secs(600));

    let started = Instant::now();
    let (status, job) = qd.get(&format!("/v1/jobs/{id}"));
    let took = started.elapsed();
    assert_eq!(status, 200);
    assert_eq!(
        (job["state"].as_str(), job["attempts"].as_u64()),
        (Some("dead"), Some(1000))
    );
    let text = serde_json::to_string(&job).expect("json");
    assert!(text.len() < 100_000, "GET answered {} bytes", text.len());
    assert!(took < Duration::from_secs(2), "GET took {took:?}");
    eprintln!("poison job: GET answered {} bytes in {took:?}", text.len());
    let attempts: Vec<u64> = job["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|h| h["attempt"].as_u64().expect("attempt"))
        .collect();
    let expected: Vec<u64> = (1..=5).chain(981..=1000).collect();
    assert_eq!(attempts, expected);
    assert_eq!(job["history_elided"], 975);
    assert_eq!(job["history_elided_at"], 5);
    for h in job["history"].as_array().expect("history") {
        let error = h["error"].as_str().expect("error text");
        assert!(error.len() <= 2048, "{} bytes of error stored", error.len());
    }

    let started = Instant::now();
    let shown = qd.qctl(&["dlq", "show", &id]);
    assert!(shown.status.success(), "{shown:?}");
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(out.contains("975 entries elided"), "{out}");
    let json = qd.qctl(&["dlq", "show", "--json", &id]);
    assert!(json.status.success(), "{json:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "qctl took {:?}",
        started.elapsed()
    );
    assert!(json.stdout.len() < 100_000, "{} bytes", json.stdout.len());
    let parsed: Value = serde_json::from_slice(&json.stdout).expect("qctl json");
    assert_eq!(parsed["history_elided"], 975, "{parsed}");
}
