//! Restart over a large store through the real `qd`: after `kill -9`, the Broker
//! reloads every unfinished job (streamed from the store in pieces) and rebuilds each
//! Scheduler in one message; every job not acked before the kill is then served
//! exactly once, and no acked job comes back.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Qd, wait_for};
use serde_json::{Value, json};

/// Enough jobs for several load pieces (4,096 rows each) and three tenants, quick
/// enough for a debug build.
const JOBS: usize = 20_000;
const TENANTS: [&str; 3] = ["a", "b", "c"];

const EXTERNAL: &str = r#"[queues.ext]
executor = { kind = "external" }
max_depth = 1000000
lease = "10m"
"#;

/// Leases up to 1,000 jobs at once without waiting: `(id, token)` pairs.
fn lease(qd: &Qd) -> Vec<(String, Value)> {
    let (status, body) = qd.post(
        "/v1/queues/ext/leases",
        &json!({ "worker_id": "w", "max_jobs": 1000, "wait": "0s" }),
    );
    assert_eq!(status, 200, "lease: {body}");
    body["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| {
            (
                j["id"].as_str().expect("id").to_string(),
                j["token"].clone(),
            )
        })
        .collect()
}

/// Acks leased jobs in one request; every ack must succeed.
fn ack_all(qd: &Qd, leased: &[(String, Value)]) {
    let acks: Vec<Value> = leased
        .iter()
        .map(|(id, token)| json!({ "id": id, "token": token }))
        .collect();
    let (status, body) = qd.post("/v1/acks", &json!({ "acks": acks }));
    assert_eq!(status, 200, "acks: {body}");
    for result in body["results"].as_array().expect("results") {
        assert_eq!(result["ok"], json!(true), "ack refused: {result}");
    }
}

#[test]
fn after_kill9_every_unfinished_job_of_a_large_store_is_served_exactly_once() {
    let mut qd = Qd::start(EXTERNAL);
    let mut ids = Vec::with_capacity(JOBS);
    for batch in 0..JOBS / 1000 {
        let jobs: Vec<Value> = (0..1000)
            .map(|k| json!({ "payload": format!("{batch}/{k}"), "tenant": TENANTS[k % 3] }))
            .collect();
        let (status, body) = qd.post("/v1/queues/ext/jobs/batch", &json!({ "jobs": jobs }));
        assert_eq!(status, 202, "batch {batch}: {body}");
        let answered = body["jobs"].as_array().expect("jobs");
        ids.extend(
            answered
                .iter()
                .map(|j| j["id"].as_str().expect("id").to_string()),
        );
    }
    // Before the kill: 2,000 jobs leased, 1,000 of them acked. The other 1,000 leases
    // die with the process and their jobs are served again.
    let acked = lease(&qd);
    let held = lease(&qd);
    assert_eq!((acked.len(), held.len()), (1000, 1000));
    ack_all(&qd, &acked);
    qd.kill9();
    qd.spawn(&[]);

    let acked: HashSet<String> = acked.into_iter().map(|(id, _)| id).collect();
    let expected: HashSet<String> = ids.into_iter().filter(|id| !acked.contains(id)).collect();
    let mut served = HashSet::new();
    let mut empty_polls = 0;
    // Leases answer once the Broker has rebuilt the Scheduler; until then a poll may
    // come back empty, so stop only after every expected job came or a long wait.
    wait_for("every job to be served", Duration::from_secs(120), || {
        let leased = lease(&qd);
        if leased.is_empty() {
            empty_polls += 1;
            std::thread::sleep(Duration::from_millis(100));
        } else {
            for (id, _) in &leased {
                assert!(served.insert(id.clone()), "job {id} served twice");
                assert!(!acked.contains(id), "job {id} was acked before the kill");
            }
            ack_all(&qd, &leased);
        }
        (served.len() >= expected.len()).then_some(())
    });
    assert_eq!(served, expected, "served jobs differ from the unacked ones");
    // Nothing more to serve.
    let (status, body) = qd.post(
        "/v1/queues/ext/leases",
        &json!({ "worker_id": "w", "max_jobs": 1000, "wait": "1s" }),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["jobs"],
        json!([]),
        "after all: {body}; {empty_polls} empty polls"
    );
}

/// Fencing across several crashes in a row (a crash loop: every run hands the same
/// job to a new worker and is killed before anything about it is written). Each
/// run's lease of the job lives in memory only, so the store keeps the token of the
/// last lease that ended; a run that only skipped the one token after it would hand
/// out the previous run's token again, and that run's worker, still busy, could ack
/// (or nack) over its successor. Every token must be new, and only the live lease's
/// holder may ack.
#[test]
fn after_repeated_kill9_no_lease_token_is_handed_out_twice() {
    const RUNS: usize = 4;
    let mut qd = Qd::start(EXTERNAL);
    let id = qd.enqueue("ext", "crash loop");
    let mut tokens: Vec<Value> = Vec::new();
    for run in 0..RUNS {
        if run > 0 {
            qd.kill9();
            qd.spawn(&[]);
        }
        let leased = common::lease_one(&qd, "ext", &format!("w{run}"), "10s")
            .unwrap_or_else(|| panic!("run {run}: the job was not handed out"));
        assert_eq!(leased["id"], json!(id));
        let token = leased["token"].clone();
        assert!(
            !tokens.contains(&token),
            "run {run} handed out token {token} again (earlier runs: {tokens:?})"
        );
        tokens.push(token);
    }
    for (run, token) in tokens.iter().enumerate().take(RUNS - 1) {
        let (status, body) = qd.post(&format!("/v1/jobs/{id}/ack"), &json!({ "token": token }));
        assert_eq!(
            status, 409,
            "run {run}'s worker acked over the live lease: {body}"
        );
    }
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/ack"),
        &json!({ "token": tokens[RUNS - 1] }),
    );
    assert_eq!(status, 200, "{body}");
}

/// Sets the `runs` row of the stopped daemon's store: `None` removes it, leaving the
/// store as the version before the count of opens left it (same schema, no such
/// row); `Some(0)` makes the next start count 1 open and skip one token, as that
/// version did at every start.
fn set_runs(qd: &Qd, runs: Option<i64>) {
    let db = qd.dir.path().join("data/qd.db");
    let conn = rusqlite::Connection::open(&db).expect("open the stopped daemon's store");
    match runs {
        None => conn.execute("DELETE FROM meta WHERE key = 'runs'", []),
        Some(n) => conn.execute(
            "INSERT INTO meta (key, value) VALUES ('runs', ?1) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [n],
        ),
    }
    .expect("set the runs row");
}

/// Fencing across an upgrade: the version before the count of opens skipped one
/// token per start, so its run after a crash (or a stop with a lease out) handed
/// out `lease_seq + 2`. The first start of this version on that store must not hand
/// `lease_seq + 2` out again: the old run's worker, still busy, could ack over its
/// successor's lease.
#[test]
fn after_an_upgrade_from_a_store_without_a_run_count_no_token_is_reused() {
    let mut qd = Qd::start(EXTERNAL);
    let id = qd.enqueue("ext", "upgrade");
    qd.kill9();
    // A run of the earlier version: one token skipped, no count of opens left.
    set_runs(&qd, Some(0));
    qd.spawn(&[]);
    let old = common::lease_one(&qd, "ext", "old", "10s").expect("the old run leases the job");
    qd.kill9();
    set_runs(&qd, None);
    // The upgrade.
    qd.spawn(&[]);
    let new = common::lease_one(&qd, "ext", "new", "10s").expect("the new run leases the job");
    assert_eq!(new["id"], json!(id));
    assert_ne!(
        new["token"], old["token"],
        "the upgraded run handed out the earlier version's token again"
    );
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/ack"),
        &json!({ "token": old["token"] }),
    );
    assert_eq!(
        status, 409,
        "the earlier version's worker acked over the live lease: {body}"
    );
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/ack"),
        &json!({ "token": new["token"] }),
    );
    assert_eq!(status, 200, "{body}");
}
