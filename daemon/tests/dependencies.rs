//! Job dependencies (`"after"`) through the real `qd` and `qctl` binaries: a chain
//! runs in order, a fan-in's finisher runs once after its last parent, a dead
//! parent blocks its child until a redrive, a waiting child survives `kill -9`
//! between its parent's ack and its own lease, and bad input changes nothing.
//! On SQLite here; `dependencies_postgres.rs` runs the same tests on PostgreSQL.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Qd, ack, lease_one, ok, wait_for};
use serde_json::{Value, json};

/// An external-worker queue: jobs stay ready until leased over HTTP.
const EXTERNAL: &str =
    "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_attempts = 1\nlease = \"60s\"\n";

fn enqueue_after(qd: &Qd, payload: &str, after: &[&str]) -> String {
    qd.enqueue_json("ext", json!({ "payload": payload, "after": after }))
}

fn state(qd: &Qd, id: &str) -> String {
    qd.job(id)["state"].as_str().expect("state").to_owned()
}

/// Leases the next job, which must be `want` (by payload).
fn lease_expecting(qd: &Qd, want: &str) -> Value {
    let job =
        lease_one(qd, "ext", "w", "10s").unwrap_or_else(|| panic!("{want} was not handed out"));
    let payload = job["payload"].as_str().unwrap_or_default().to_owned();
    assert_eq!(payload, want, "{job}");
    job
}

fn nothing_leasable(qd: &Qd) {
    let got = lease_one(qd, "ext", "w", "1s");
    assert!(got.is_none(), "nothing should be leasable, got {got:?}");
}

#[test]
fn a_chain_runs_in_order_each_child_ready_only_after_its_parent_succeeded() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let c = enqueue_after(&qd, "c", &[&b]);
    assert_eq!(state(&qd, &b), "waiting");
    assert_eq!(state(&qd, &c), "waiting");

    let job = lease_expecting(&qd, "a");
    nothing_leasable(&qd);
    ack(&qd, &job);
    assert_eq!(state(&qd, &b), "ready", "b is ready in a's ack commit");
    assert_eq!(state(&qd, &c), "waiting");
    let job = lease_expecting(&qd, "b");
    ack(&qd, &job);
    let job = lease_expecting(&qd, "c");
    ack(&qd, &job);
    assert_eq!(state(&qd, &c), "succeeded");

    // A parent already final counts at once.
    let d = enqueue_after(&qd, "d", &[&a, &c]);
    assert_eq!(state(&qd, &d), "ready");
    let scrape = qd.scrape();
    assert!(
        common::metric(
            &scrape,
            "qd_dependencies_released_total",
            &[("queue", "ext")]
        ) >= 2.0,
        "{scrape}"
    );
}

#[test]
fn a_fan_in_finisher_runs_once_after_the_last_of_its_parents_acked_by_several_workers() {
    const PARENTS: usize = 200;
    let qd = Qd::start(EXTERNAL);
    let body = json!({
        "jobs": (0..PARENTS).map(|i| json!({ "payload": format!("p{i}") })).collect::<Vec<_>>()
    });
    let (status, resp) = qd.post("/v1/queues/ext/jobs/batch", &body);
    assert_eq!(status, 202, "{resp}");
    let parents: Vec<String> = resp["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(parents.len(), PARENTS);
    let refs: Vec<&str> = parents.iter().map(String::as_str).collect();
    let finisher = enqueue_after(&qd, "finisher", &refs);
    assert_eq!(state(&qd, &finisher), "waiting");

    // Four workers lease and ack everything they get; the finisher must come
    // after every parent's ack, and once.
    let qd = Arc::new(qd);
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (qd, seen) = (qd.clone(), seen.clone());
            std::thread::spawn(move || {
                loop {
                    let Some(job) = lease_one(&qd, "ext", &format!("w{w}"), "3s") else {
                        return;
                    };
                    seen.lock()
                        .expect("lock")
                        .push(job["payload"].as_str().unwrap_or_default().to_owned());
                    ack(&qd, &job);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), PARENTS + 1, "every job once: {seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("finisher"));
    let distinct: HashSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), PARENTS + 1);
    assert_eq!(state(&qd, &finisher), "succeeded");
}

#[test]
fn a_dead_parent_blocks_its_child_until_a_redrive_then_the_child_runs() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let job = lease_expecting(&qd, "a");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{a}/nack"),
        &json!({ "token": job["token"], "error": "boom", "kind": "permanent" }),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(state(&qd, &a), "dead");
    let child = qd.job(&b);
    assert_eq!(child["state"], "blocked", "{child}");
    let history = child["history"].to_string();
    assert!(
        history.contains(&a),
        "the history names the parent: {history}"
    );
    nothing_leasable(&qd);

    ok(&qd, &["dlq", "redrive", &a]);
    assert_eq!(
        state(&qd, &b),
        "waiting",
        "back to waiting in the redrive's commit"
    );
    let job = lease_expecting(&qd, "a");
    ack(&qd, &job);
    let job = lease_expecting(&qd, "b");
    ack(&qd, &job);
    assert_eq!(state(&qd, &b), "succeeded");
}

#[test]
fn under_the_finished_policy_a_dead_parent_counts_as_done() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = qd.enqueue_json(
        "ext",
        json!({ "payload": "b", "after": [a], "after_policy": "finished" }),
    );
    let job = lease_expecting(&qd, "a");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{a}/nack"),
        &json!({ "token": job["token"], "error": "boom", "kind": "permanent" }),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(state(&qd, &b), "ready");
}

#[test]
fn cancelling_a_waiting_child_leaves_its_parent_alone() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    ok(&qd, &["jobs", "cancel", &b]);
    assert_eq!(state(&qd, &b), "cancelled");
    let job = lease_expecting(&qd, "a");
    ack(&qd, &job);
    assert_eq!(state(&qd, &b), "cancelled");
    nothing_leasable(&qd);
}

#[test]
fn bad_after_is_refused_with_its_reason_and_changes_nothing() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let unknown = "0190f1c2-0000-7000-8000-000000000000";
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({ "payload": "x", "after": [unknown] }),
            "unknown_dependency",
        ),
        (json!({ "payload": "x", "after": [a, a] }), "bad_request"),
        (
            json!({ "payload": "x", "after": ["not-an-id"] }),
            "bad_request",
        ),
        (json!({ "payload": "x", "after": [] }), "bad_request"),
        (json!({ "payload": "x", "after": 7 }), "bad_request"),
        (
            json!({ "payload": "x", "after": [a], "after_policy": "sometimes" }),
            "bad_request",
        ),
        (
            json!({ "payload": "x", "after": (0..1001).map(|_| a.clone()).collect::<Vec<_>>() }),
            "bad_request",
        ),
    ];
    for (body, code) in cases {
        let (status, resp) = qd.post("/v1/queues/ext/jobs", &body);
        assert_eq!(status, 400, "{body} -> {resp}");
        assert_eq!(resp["error"]["code"], code, "{resp}");
        if code == "unknown_dependency" {
            let msg = resp["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains(unknown), "names the id: {msg}");
        }
    }
    // A batch whose second item names an unknown parent stores nothing.
    let (status, resp) = qd.post(
        "/v1/queues/ext/jobs/batch",
        &json!({ "jobs": [{ "payload": "y" }, { "payload": "z", "after": [unknown] }] }),
    );
    assert_eq!(status, 400, "{resp}");
    let listed = common::json_of(&qd, &["jobs", "list", "--json"]);
    let n = listed
        .as_array()
        .or_else(|| listed["jobs"].as_array())
        .map(Vec::len);
    assert_eq!(n, Some(1), "only a is stored: {listed}");
    let job = lease_expecting(&qd, "a");
    ack(&qd, &job);
    nothing_leasable(&qd);
}

#[test]
fn kill_9_between_a_parents_ack_and_its_childs_lease_loses_nothing() {
    let mut qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let waiting = enqueue_after(&qd, "c", &[&b]);
    let job = lease_expecting(&qd, "a");
    ack(&qd, &job);
    qd.kill9();
    qd.spawn(&[]);
    assert_eq!(state(&qd, &b), "ready");
    assert_eq!(
        state(&qd, &waiting),
        "waiting",
        "a waiting job is reloaded as waiting"
    );
    let job = lease_expecting(&qd, "b");
    ack(&qd, &job);
    let job = wait_for("c after the restart", Duration::from_secs(20), || {
        lease_one(&qd, "ext", "w", "2s")
    });
    assert_eq!(job["payload"], "c");
}

#[test]
fn cancel_cascades_to_unfinished_dependents_unless_asked_to_keep_them() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let c = enqueue_after(&qd, "c", &[&b]);
    let out = ok(&qd, &["jobs", "cancel", &a]);
    assert!(
        out.contains(&b) && out.contains(&c),
        "names the dependents: {out}"
    );
    for id in [&a, &b, &c] {
        assert_eq!(state(&qd, id), "cancelled", "{id}");
    }

    let x = qd.enqueue("ext", "x");
    let y = enqueue_after(&qd, "y", &[&x]);
    ok(&qd, &["jobs", "cancel", "--keep-dependents", &x]);
    assert_eq!(
        state(&qd, &y),
        "blocked",
        "a cancelled parent blocks under the default policy"
    );
    nothing_leasable(&qd);
}

#[test]
fn qctl_enqueues_after_parents_and_lists_waiting_jobs() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = ok(&qd, &["enqueue", "ext", "--payload", "b", "--after", &a]);
    let b = b.trim().to_owned();
    assert_eq!(state(&qd, &b), "waiting");
    let listed = ok(&qd, &["jobs", "list", "--state", "waiting"]);
    assert!(listed.contains(&b) && !listed.contains(&a), "{listed}");
    let refused = common::fails(
        &qd,
        &[
            "enqueue",
            "ext",
            "--payload",
            "z",
            "--after",
            "0190f1c2-0000-7000-8000-000000000000",
        ],
        1,
    );
    assert!(refused.contains("unknown_dependency"), "{refused}");
}
