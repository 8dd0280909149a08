//! The operator's side of job dependencies through the real `qd` and `qctl`
//! binaries, on SQLite and (`dependencies_ops_postgres.rs`) on PostgreSQL:
//! `jobs release` makes a blocked child run, `dlq purge`
//! refuses a dead job that blocks others (naming them) unless `--cascade` or
//! `--release`, the blocked counts of `dlq list` / `dlq show`, parents and
//! dependents in `jobs show`, `jobs tree`, the waiting and blocked counts `top`
//! reads, and bad input that changes nothing.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use common::{Qd, ack, fails, json_of, lease_one, ok};
use serde_json::{Value, json};

/// An external-worker queue: jobs stay ready until leased over HTTP.
const EXTERNAL: &str =
    "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_attempts = 1\nlease = \"60s\"\n";

/// An id no job has.
const UNKNOWN: &str = "0190f1c2-0000-7000-8000-000000000000";

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
    assert_eq!(job["payload"].as_str().unwrap_or_default(), want, "{job}");
    job
}

fn nothing_leasable(qd: &Qd) {
    let got = lease_one(qd, "ext", "w", "1s");
    assert!(got.is_none(), "nothing should be leasable, got {got:?}");
}

/// Leases the ready job `payload` and nacks it as permanent: it dies at once.
fn kill(qd: &Qd, payload: &str) {
    let job = lease_expecting(qd, payload);
    let id = job["id"].as_str().expect("id");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/nack"),
        &json!({ "token": job["token"], "error": "boom", "kind": "permanent" }),
    );
    assert_eq!(status, 200, "{body}");
}

/// Whether the store still holds `id`.
fn exists(qd: &Qd, id: &str) -> bool {
    let (status, _) = qd.get(&format!("/v1/jobs/{id}"));
    status == 200
}

/// One admin request over the socket, answered as JSON.
fn admin(qd: &Qd, req: Value) -> Value {
    let stream = UnixStream::connect(&qd.socket).expect("connect to the admin socket");
    let mut conn = BufReader::new(stream);
    let mut line = serde_json::to_vec(&json!({ "v": 1, "id": 1, "req": req })).expect("json");
    line.push(b'\n');
    conn.get_mut().write_all(&line).expect("send");
    let mut answer = String::new();
    conn.read_line(&mut answer).expect("answer");
    serde_json::from_str(&answer).expect("a JSON frame")
}

#[test]
fn release_makes_a_blocked_child_run_and_is_audited_in_log_and_history() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    kill(&qd, "a");
    assert_eq!(state(&qd, &b), "blocked");
    nothing_leasable(&qd);

    let out = ok(&qd, &["jobs", "release", &b]);
    assert!(
        out.contains(&format!("released {b}")) && out.contains(&a),
        "{out}"
    );
    assert!(out.contains("now ready"), "{out}");
    let child = qd.job(&b);
    assert_eq!(child["state"], "ready", "{child}");
    let history = child["history"].to_string();
    assert!(
        history.contains("released by uid") && history.contains(&a),
        "the history names who released it and the parent: {history}"
    );
    let logs = qd.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("qd::audit") && l.contains("jobs_release") && l.contains(&b)),
        "an audit line names the job: {logs}"
    );
    let job = lease_expecting(&qd, "b");
    ack(&qd, &job);
    assert_eq!(state(&qd, &b), "succeeded");
    assert_eq!(state(&qd, &a), "dead", "the parent is left as it was");
}

#[test]
fn a_released_child_with_another_open_parent_waits_for_it() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    kill(&qd, "a");
    let x = qd.enqueue("ext", "x");
    let c = enqueue_after(&qd, "c", &[&a, &x]);
    assert_eq!(state(&qd, &c), "blocked");
    let answer = json_of(&qd, &["jobs", "release", &c]);
    assert_eq!(answer["kind"], "released", "{answer}");
    assert_eq!(answer["state"], "waiting", "{answer}");
    assert_eq!(answer["previous_state"], "blocked", "{answer}");
    assert_eq!(answer["parents"], json!([a]), "{answer}");
    let job = lease_expecting(&qd, "x");
    ack(&qd, &job);
    assert_eq!(state(&qd, &c), "ready", "ready in x's ack commit");
    lease_expecting(&qd, "c");
}

#[test]
fn release_of_an_unknown_malformed_or_unblocked_job_is_refused_and_changes_nothing() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);

    let out = fails(&qd, &["jobs", "release", UNKNOWN], 1);
    assert!(out.contains("not_found") && out.contains(UNKNOWN), "{out}");
    let out = fails(&qd, &["jobs", "release", "not-an-id"], 1);
    assert!(
        out.contains("bad_request") && out.contains("not-an-id"),
        "{out}"
    );
    let out = fails(&qd, &["jobs", "release", &b], 1);
    assert!(
        out.contains("conflict") && out.contains("waiting, not blocked"),
        "{out}"
    );
    let out = fails(&qd, &["jobs", "release", &a], 1);
    assert!(out.contains("ready, not blocked"), "{out}");
    let json = qd.qctl(&["--json", "jobs", "release", &b]);
    assert_eq!(json.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&json.stdout).expect("a JSON error");
    assert_eq!(err["error"]["code"], "conflict", "{err}");

    assert_eq!(state(&qd, &b), "waiting");
    assert!(
        !qd.job(&b)["history"].to_string().contains("released"),
        "no history line was written"
    );
    let logs = qd.logs();
    assert!(
        !logs
            .lines()
            .any(|l| l.contains("qd::audit") && l.contains("jobs_release")),
        "a refused release writes no audit line: {logs}"
    );
    let job = lease_expecting(&qd, "a");
    ack(&qd, &job);
    lease_expecting(&qd, "b");
}

#[test]
fn purge_of_a_dead_job_that_blocks_others_is_refused_naming_them() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let z = qd.enqueue("ext", "z");
    kill(&qd, "a");
    kill(&qd, "z");

    let out = fails(&qd, &["dlq", "purge", &a, "--yes"], 1);
    assert!(
        out.contains(&format!("refused {a}")) && out.contains(&b),
        "names the blocked job: {out}"
    );
    assert!(
        out.contains("--cascade") && out.contains("--release"),
        "{out}"
    );
    assert!(out.contains("purged 0 of 1"), "{out}");
    assert!(exists(&qd, &a), "nothing was deleted");

    // A dry run says the same and deletes nothing.
    let out = fails(&qd, &["dlq", "purge", &a, "--dry-run"], 1);
    assert!(out.contains(&format!("refused {a}")), "{out}");

    // By filter: the free dead job goes, the blocking one is refused by name.
    let answer = qd.qctl(&["--json", "dlq", "purge", "--queue", "ext", "--yes"]);
    assert_eq!(answer.status.code(), Some(1), "{}", common::text(&answer));
    let answer: Value = serde_json::from_slice(&answer.stdout).expect("json");
    assert_eq!(answer["matched"], 2, "{answer}");
    assert_eq!(answer["purged"], 1, "{answer}");
    assert_eq!(answer["ids"], json!([z]), "{answer}");
    let refused = &answer["refused"][0];
    assert_eq!(refused["id"], a.as_str(), "{answer}");
    assert!(
        refused["reason"].as_str().unwrap_or_default().contains(&b),
        "{answer}"
    );
    assert!(!exists(&qd, &z) && exists(&qd, &a));
    assert_eq!(state(&qd, &b), "blocked");
}

#[test]
fn purge_with_release_counts_the_edges_as_met_and_the_child_runs() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    kill(&qd, "a");

    let out = ok(&qd, &["dlq", "purge", &a, "--release", "--dry-run"]);
    assert!(out.contains(&format!("would release {b}")), "{out}");
    assert!(exists(&qd, &a) && state(&qd, &b) == "blocked");

    let out = ok(&qd, &["dlq", "purge", &a, "--release", "--yes"]);
    assert!(
        out.contains("purged 1 of 1") && out.contains(&format!("released {b}")),
        "{out}"
    );
    assert!(!exists(&qd, &a));
    let child = qd.job(&b);
    assert_eq!(child["state"], "ready", "{child}");
    assert!(
        child["history"].to_string().contains("purge of parent"),
        "{child}"
    );
    let shown = json_of(&qd, &["jobs", "show", &b]);
    assert_eq!(shown["parents"][0]["id"], a.as_str(), "{shown}");
    assert_eq!(shown["parents"][0]["edge"], "met", "{shown}");
    assert_eq!(shown["parents"][0]["state"], Value::Null, "purged: {shown}");
    assert_eq!(
        qd.job(&b)["parents"],
        json!([{ "id": a, "edge": "met", "state": null, "queue": null }]),
        "GET /v1/jobs/{{id}} shows the purged parent too"
    );
    lease_expecting(&qd, "b");
}

#[test]
fn purge_with_cascade_cancels_the_transitive_dependents_then_purges() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let c = enqueue_after(&qd, "c", &[&b]);
    let other = qd.enqueue("ext", "other");
    kill(&qd, "a");

    let out = ok(&qd, &["dlq", "purge", &a, "--cascade", "--dry-run"]);
    assert!(
        out.contains(&format!("would cancel {b}")) && out.contains(&format!("would cancel {c}")),
        "{out}"
    );
    assert_eq!(state(&qd, &b), "blocked", "a dry run changes nothing");

    let out = ok(&qd, &["dlq", "purge", &a, "--cascade", "--yes"]);
    assert!(
        out.contains(&format!("cancelled {b}")) && out.contains(&format!("cancelled {c}")),
        "{out}"
    );
    assert!(out.contains("purged 1 of 1"), "{out}");
    assert!(!exists(&qd, &a));
    assert_eq!(state(&qd, &b), "cancelled");
    assert_eq!(state(&qd, &c), "cancelled");
    assert_eq!(state(&qd, &other), "ready", "unrelated jobs are left alone");
    let both = fails(
        &qd,
        &["dlq", "purge", &a, "--cascade", "--release", "--yes"],
        2,
    );
    assert!(
        both.contains("--release") || both.contains("--cascade"),
        "{both}"
    );
}

#[test]
fn dlq_list_and_show_count_the_jobs_a_dead_job_blocks() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let _c = enqueue_after(&qd, "c", &[&a]);
    let _d = enqueue_after(&qd, "d", &[&b]);
    let z = qd.enqueue("ext", "z");
    kill(&qd, "a");
    kill(&qd, "z");

    let list = json_of(&qd, &["dlq", "list"]);
    let jobs = list["jobs"].as_array().expect("jobs");
    let blocks = |id: &str| {
        jobs.iter()
            .find(|j| j["id"] == id)
            .map(|j| j["blocks"].clone())
    };
    assert_eq!(blocks(&a), Some(json!(2)), "{list}");
    assert_eq!(blocks(&z), Some(json!(0)), "{list}");
    let table = ok(&qd, &["dlq", "list"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(header.contains("BLOCKS"), "{table}");
    let col = header.find("BLOCKS").expect("column");
    let row = table.lines().find(|l| l.starts_with(&a)).expect("a's row");
    assert!(row[col..].starts_with('2'), "{table}");

    let shown = json_of(&qd, &["dlq", "show", &a]);
    assert_eq!(shown["blocks"], 2, "{shown}");
    assert_eq!(shown["blocks_transitive"], 3, "b, c and d: {shown}");
    let text = ok(&qd, &["dlq", "show", &a]);
    assert!(
        text.contains("blocks   2 job(s) directly, 3 in all"),
        "{text}"
    );
}

#[test]
fn jobs_show_lists_parents_and_dependents_and_jobs_tree_draws_them_bounded() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let c = enqueue_after(&qd, "c", &[&a]);
    let d = enqueue_after(&qd, "d", &[&b, &c]);
    let job = lease_expecting(&qd, "a");
    ack(&qd, &job);

    let shown = json_of(&qd, &["jobs", "show", &d]);
    let parents = shown["parents"].as_array().expect("parents");
    assert_eq!(parents.len(), 2, "{shown}");
    assert_eq!(parents[0]["id"], b.as_str());
    assert_eq!(parents[0]["edge"], "open");
    assert_eq!(parents[0]["state"], "ready");
    let shown = json_of(&qd, &["jobs", "show", &a]);
    assert_eq!(shown["dependents_total"], 2, "{shown}");
    assert_eq!(shown["dependents"][0]["edge"], "met", "{shown}");
    let text = ok(&qd, &["jobs", "show", &a]);
    assert!(
        text.contains("dependents (2):") && text.contains(&b) && text.contains(&c),
        "{text}"
    );
    // GET /v1/jobs/{id} lists the same.
    let (status, got) = qd.get(&format!("/v1/jobs/{d}"));
    assert_eq!(status, 200, "{got}");
    let edge = |id: &str, edge: &str, state: &str| json!({ "id": id, "edge": edge, "state": state, "queue": "ext" });
    assert_eq!(
        got["parents"],
        json!([edge(&b, "open", "ready"), edge(&c, "open", "ready")]),
        "{got}"
    );
    assert_eq!(got["dependents"], json!([]), "{got}");
    assert_eq!(got["dependents_total"], 0, "{got}");
    let (_, got) = qd.get(&format!("/v1/jobs/{a}"));
    assert_eq!(got["parents"], json!([]), "{got}");
    assert_eq!(got["dependents_total"], 2, "{got}");
    assert_eq!(
        got["dependents"],
        json!([edge(&b, "met", "ready"), edge(&c, "met", "ready")]),
        "{got}"
    );

    let tree = ok(&qd, &["jobs", "tree", &a]);
    let lines: Vec<&str> = tree.lines().collect();
    assert!(
        lines[0].starts_with(&a) && lines[0].contains("succeeded"),
        "{tree}"
    );
    assert!(lines[1].contains(&format!("[met] {b}")), "{tree}");
    assert!(lines[2].contains(&format!("[open] {d}")), "{tree}");
    assert!(
        lines[4].contains(&d) && lines[4].contains("(shown above)"),
        "{tree}"
    );
    assert!(
        tree.contains("5 job(s) of dependents, 2 level(s)"),
        "{tree}"
    );
    assert!(!tree.contains("truncated"), "{tree}");

    let cut = ok(&qd, &["jobs", "tree", &a, "--depth", "1"]);
    assert!(
        cut.contains("(+1 not shown)") && cut.contains("truncated"),
        "{cut}"
    );
    let cut = json_of(&qd, &["jobs", "tree", &a, "--limit", "2"]);
    assert_eq!(cut["truncated"], true, "{cut}");
    assert_eq!(cut["nodes"], 2, "{cut}");
    assert_eq!(cut["root"]["more"], 1, "{cut}");

    let up = json_of(&qd, &["jobs", "tree", &d, "--parents"]);
    assert_eq!(up["direction"], "parents", "{up}");
    assert_eq!(up["root"]["children"][0]["id"], b.as_str(), "{up}");
    assert_eq!(
        up["root"]["children"][0]["children"][0]["id"],
        a.as_str(),
        "{up}"
    );

    let out = fails(&qd, &["jobs", "tree", UNKNOWN], 1);
    assert!(out.contains("not_found"), "{out}");
    let out = fails(&qd, &["jobs", "tree", "nope"], 1);
    assert!(out.contains("bad_request"), "{out}");
    fails(&qd, &["jobs", "tree", &a, "--depth", "0"], 2);
    let raw = admin(&qd, json!({ "op": "jobs_tree", "id": a, "max_nodes": 0 }));
    assert_eq!(raw["err"]["code"], "bad_request", "{raw}");
}

#[test]
fn top_and_queues_count_waiting_and_blocked_jobs() {
    let qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let x = qd.enqueue_json("ext", json!({ "payload": "x", "tenant": "acme" }));
    qd.enqueue_json(
        "ext",
        json!({ "payload": "b", "after": [a], "tenant": "acme" }),
    );
    qd.enqueue_json(
        "ext",
        json!({ "payload": "c", "after": [x], "tenant": "acme" }),
    );
    qd.enqueue_json("ext", json!({ "payload": "d", "after": [x] }));
    kill(&qd, "a");

    let top = admin(&qd, json!({ "op": "top", "tenants_of": "ext" }));
    let q = &top["ok"]["queues"][0];
    assert_eq!(q["name"], "ext", "{top}");
    assert_eq!(q["waiting"], 2, "{top}");
    assert_eq!(q["blocked"], 1, "{top}");
    let acme = top["ok"]["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .find(|t| t["tenant"] == "acme")
        .cloned()
        .expect("acme");
    assert_eq!(acme["waiting"], 1, "{top}");
    assert_eq!(acme["blocked"], 1, "{top}");
    let queues = json_of(&qd, &["queues"]);
    assert_eq!(queues["queues"][0]["blocked"], 1, "{queues}");
}

#[test]
fn a_release_and_a_releasing_purge_survive_kill_9() {
    let mut qd = Qd::start(EXTERNAL);
    let a = qd.enqueue("ext", "a");
    let b = enqueue_after(&qd, "b", &[&a]);
    let p = qd.enqueue("ext", "p");
    let c = enqueue_after(&qd, "c", &[&p]);
    kill(&qd, "a");
    kill(&qd, "p");
    ok(&qd, &["jobs", "release", &b]);
    ok(&qd, &["dlq", "purge", &p, "--release", "--yes"]);
    qd.kill9();
    qd.spawn(&[]);
    assert_eq!(state(&qd, &b), "ready", "the release was durable");
    assert_eq!(state(&qd, &c), "ready", "the purge's release was durable");
    assert!(!exists(&qd, &p));
    assert_eq!(state(&qd, &a), "dead");
    let first = lease_one(&qd, "ext", "w", "10s").expect("a released job");
    let second = lease_one(&qd, "ext", "w", "10s").expect("the other one");
    let mut got = [first["payload"].clone(), second["payload"].clone()];
    got.sort_by_key(|v| v.to_string());
    assert_eq!(got, [json!("b"), json!("c")]);
}
