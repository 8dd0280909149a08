//! Children see their parents, through the real `qd` binary on SQLite: an external
//! worker's lease carries `parents` with their results, a command job reads the
//! same list from `$QD_PARENTS_FILE`, a webhook queue with `send_parents` POSTs an
//! envelope; retention keeps a parent (and its result) until its children are
//! done; a token limited to some queues gets 403 for a parent elsewhere; a reused
//! idempotency key with other parents is a 409.

mod common;
#[path = "http/support.rs"]
#[allow(dead_code)]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{Qd, ack, lease_one, script, wait_for};
use serde_json::{Value, json};
use support::{Downstream, response};

const LONG: Duration = Duration::from_secs(30);

fn ack_with(qd: &Qd, job: &Value, extra: Value) {
    let id = job["id"].as_str().expect("id");
    let mut body = json!({ "token": job["token"] });
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    let (status, resp) = qd.post(&format!("/v1/jobs/{id}/ack"), &body);
    assert_eq!(status, 200, "ack: {resp}");
}

/// Leases the next job of `queue`, which must be the one with `payload`.
fn lease_expecting(qd: &Qd, queue: &str, payload: &str) -> Value {
    let job =
        lease_one(qd, queue, "w", "10s").unwrap_or_else(|| panic!("{payload} was not handed out"));
    assert_eq!(job["payload"], payload, "{job}");
    job
}

/// Enqueues `payload` on `queue` and runs it to success over the pull API,
/// acking with `extra` (a result); returns its id.
fn succeed(qd: &Qd, queue: &str, payload: &str, extra: Value) -> String {
    let id = qd.enqueue(queue, payload);
    let job = lease_expecting(qd, queue, payload);
    ack_with(qd, &job, extra);
    id
}

#[test]
fn an_external_child_sees_each_parents_state_result_and_error_in_its_lease() {
    let qd = Qd::start(
        "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_attempts = 1\nlease = \"60s\"\n",
    );
    let text = succeed(&qd, "ext", "a", json!({ "result": "alpha" }));
    let bytes = succeed(&qd, "ext", "b", json!({ "result_b64": "AP8=" }));
    let none = succeed(&qd, "ext", "c", json!({}));
    let child = qd.enqueue_json(
        "ext",
        json!({ "payload": "child", "after": [none, text, bytes] }),
    );
    let job = lease_expecting(&qd, "ext", "child");
    assert_eq!(job["id"], child.as_str());
    let parents = job["parents"].as_array().expect("parents");
    let want = [
        json!({ "id": text, "state": "succeeded", "result": "alpha", "last_error": null }),
        json!({ "id": bytes, "state": "succeeded", "result_b64": "AP8=", "last_error": null }),
        json!({ "id": none, "state": "succeeded", "last_error": null }),
    ];
    assert_eq!(parents, &want, "in id (enqueue) order: {job}");
    ack(&qd, &job);

    // Under `finished`, a dead parent is handed on with its error and no result.
    let dead = qd.enqueue("ext", "doomed");
    let job = lease_expecting(&qd, "ext", "doomed");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{dead}/nack"),
        &json!({ "token": job["token"], "error": "boom", "kind": "permanent" }),
    );
    assert_eq!(status, 200, "{body}");
    qd.enqueue_json(
        "ext",
        json!({ "payload": "cleanup", "after": [dead], "after_policy": "finished" }),
    );
    let job = lease_expecting(&qd, "ext", "cleanup");
    assert_eq!(
        job["parents"],
        json!([{ "id": dead, "state": "dead", "last_error": "boom" }]),
        "{job}"
    );
    ack(&qd, &job);

    // A job without parents has no `parents` field.
    qd.enqueue("ext", "lone");
    let job = lease_expecting(&qd, "ext", "lone");
    assert!(job.get("parents").is_none(), "{job}");
}

#[test]
fn a_command_child_reads_its_parents_from_a_private_qd_parents_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The child hands back the file's mode, its path and its content as its
    // result, so the test sees exactly what the program saw.
    let reader = script(
        dir.path(),
        "reader.sh",
        "#!/bin/sh\ncat >/dev/null\n{ stat -c %a \"$QD_PARENTS_FILE\"; echo \"$QD_PARENTS_FILE\"; \
         cat \"$QD_PARENTS_FILE\"; } > \"$QD_RESULT_FILE\"\n",
    );
    let qd = Qd::start(&format!(
        "[queues.ext]\nexecutor = {{ kind = \"external\" }}\n\n\
         [queues.cmd]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         workers = {{ min = 1, max = 1 }}\n",
        reader.display()
    ));
    let parent = succeed(&qd, "ext", "a", json!({ "result": "alpha" }));
    let child = qd.enqueue_json("cmd", json!({ "payload": "c", "after": [parent] }));
    let job = qd.wait_final(&child, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    let seen = job["result"].as_str().expect("result").to_owned();
    let mut lines = seen.splitn(3, '\n');
    assert_eq!(lines.next(), Some("600"), "private file: {seen}");
    let path = lines.next().expect("path").to_owned();
    let list: Value = serde_json::from_str(lines.next().expect("content")).expect("JSON");
    assert_eq!(
        list,
        json!([{ "id": parent, "state": "succeeded", "result": "alpha", "last_error": null }])
    );
    assert!(
        !std::path::Path::new(&path).exists(),
        "{path} is removed when the attempt ends"
    );

    // The command child's result reaches its own child: a chain hands results on.
    let grandchild = qd.enqueue_json("ext", json!({ "payload": "g", "after": [child] }));
    let job = lease_expecting(&qd, "ext", "g");
    assert_eq!(job["id"], grandchild.as_str());
    assert_eq!(job["parents"][0]["result"], seen.as_str(), "{job}");

    // A command job without parents gets an empty list.
    let lone = qd.enqueue("cmd", "lone");
    let job = qd.wait_final(&lone, LONG);
    assert!(
        job["result"].as_str().expect("result").ends_with("\n[]"),
        "{job}"
    );
}

fn ok_hook(_body: &str, _nth: usize) -> Option<String> {
    Some(response("200 OK", "", "ok"))
}

#[test]
fn a_webhook_queue_with_send_parents_posts_the_payload_with_its_parents() {
    let down = Downstream::start(ok_hook);
    let qd = Qd::start(&format!(
        "[queues.ext]\nexecutor = {{ kind = \"external\" }}\n\n\
         [queues.hook]\nexecutor = {{ kind = \"http\", url = \"{url}\", send_parents = true }}\n\n\
         [queues.bare]\nexecutor = {{ kind = \"http\", url = \"{url}\" }}\n",
        url = down.url
    ));
    let parent = succeed(&qd, "ext", "a", json!({ "result": "alpha" }));
    let child = qd.enqueue_json("hook", json!({ "payload": "order-1", "after": [parent] }));
    assert_eq!(qd.wait_final(&child, LONG)["state"], "succeeded");
    let envelope = format!(
        r#"{{"payload":"order-1","parents":[{{"id":"{parent}","state":"succeeded","result":"alpha","last_error":null}}]}}"#
    );
    let hits = down.hits_of(&envelope);
    assert_eq!(hits.len(), 1, "the envelope was posted once");
    assert_eq!(hits[0].header("content-type"), Some("application/json"));

    // Bytes that are not text go as payload_b64; no parents is an empty list.
    let (status, body) = qd.post("/v1/queues/hook/jobs", &json!({ "payload_b64": "AP8=" }));
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().expect("id").to_owned();
    assert_eq!(qd.wait_final(&id, LONG)["state"], "succeeded");
    assert_eq!(
        down.hits_of(r#"{"payload_b64":"AP8=","parents":[]}"#).len(),
        1
    );

    // Without send_parents the payload is posted bare, parents or not.
    let bare = qd.enqueue_json("bare", json!({ "payload": "order-2", "after": [parent] }));
    assert_eq!(qd.wait_final(&bare, LONG)["state"], "succeeded");
    assert_eq!(down.hits_of("order-2").len(), 1);
}

#[test]
fn send_parents_on_a_queue_that_is_not_a_webhook_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for kind in [
        "{ kind = \"command\", program = \"/bin/true\", send_parents = true }",
        "{ kind = \"external\", send_parents = true }",
        "{ kind = \"http\", url = \"http://127.0.0.1:9/\", send_parents = \"yes\" }",
    ] {
        let config = dir.path().join("qd.toml");
        std::fs::write(
            &config,
            format!(
                "[daemon]\ndata_dir = \"{}\"\n[queues.q]\nexecutor = {kind}\n",
                dir.path().display()
            ),
        )
        .expect("write");
        let out = std::process::Command::new(common::qd_bin())
            .arg("check-config")
            .arg(&config)
            .output()
            .expect("run qd");
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{kind}: {text}");
        assert!(text.contains("send_parents"), "{kind}: {text}");
    }
}

#[test]
fn retention_keeps_a_parent_and_its_result_until_its_ready_child_has_read_it() {
    let qd = Qd::start(
        "[queues.short]\nexecutor = { kind = \"external\" }\nretention = \"1s\"\n\n\
         [queues.long]\nexecutor = { kind = \"external\" }\nretention = \"1h\"\nlease = \"60s\"\n",
    );
    let parent = succeed(&qd, "short", "parent", json!({ "result": "keep me" }));
    let child = qd.enqueue_json("long", json!({ "payload": "child", "after": [parent] }));
    assert_eq!(qd.job(&child)["state"], "ready");
    // A job of the same queue finished after the parent and with no children:
    // once it is pruned, a pass has gone over the (older) parent too.
    let witness = succeed(&qd, "short", "witness", json!({}));
    wait_for("the witness to be pruned", LONG, || {
        (qd.get(&format!("/v1/jobs/{witness}")).0 == 404).then_some(())
    });
    assert_eq!(
        qd.job(&parent)["result"],
        "keep me",
        "kept for its ready child"
    );

    let job = lease_expecting(&qd, "long", "child");
    assert_eq!(job["parents"][0]["result"], "keep me", "{job}");
    let witness = succeed(&qd, "short", "witness 2", json!({}));
    wait_for("the second witness to be pruned", LONG, || {
        (qd.get(&format!("/v1/jobs/{witness}")).0 == 404).then_some(())
    });
    assert_eq!(
        qd.job(&parent)["state"],
        "succeeded",
        "kept for its leased child"
    );

    ack(&qd, &job);
    wait_for(
        "the parent to be pruned once its child is done",
        LONG,
        || (qd.get(&format!("/v1/jobs/{parent}")).0 == 404).then_some(()),
    );
}

const PRODUCER_A: &str = "producer-a-0123456789abcdef";
const ANY: &str = "any-queue-0123456789abcdefgh";
const READER_B: &str = "reader-b-0123456789abcdefgh";

/// A daemon with queues `a` and `b` (`max_depth` 2) and three tokens:
/// `PRODUCER_A` may produce on `a` only, `READER_B` may read `b` only, `ANY` may
/// produce, work and read on every queue.
fn with_tokens() -> Qd {
    let mut qd = Qd::configure(
        tempfile::tempdir().expect("tempdir"),
        "api_tokens_file = \"tokens.toml\"\n\n[queues.a]\nexecutor = { kind = \"external\" }\n\n\
         [queues.b]\nexecutor = { kind = \"external\" }\nmax_depth = 2\n",
        "5s",
    );
    let tokens = qd.dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\nname = \"pa\"\ntoken = \"{PRODUCER_A}\"\nroles = [\"produce\"]\nqueues = [\"a\"]\n\n\
             [[tokens]]\nname = \"any\"\ntoken = \"{ANY}\"\nroles = [\"produce\", \"work\", \"read\"]\nqueues = [\"*\"]\n\n\
             [[tokens]]\nname = \"rb\"\ntoken = \"{READER_B}\"\nroles = [\"read\"]\nqueues = [\"b\"]\n"
        ),
    )
    .expect("write tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    qd.spawn(&[]);
    qd
}

fn id_of(status: u16, body: &Value) -> String {
    assert_eq!(status, 202, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

#[test]
fn a_parent_in_a_queue_the_token_may_not_use_is_403_and_writes_nothing() {
    let qd = with_tokens();
    let post = |path: &str, body: Value, token: &str| {
        let (status, _, body) = qd.post_as(path, &body, Some(token));
        (status, body)
    };
    let (s, b) = post("/v1/queues/b/jobs", json!({ "payload": "in b" }), ANY);
    let in_b = id_of(s, &b);
    let (s, b) = post(
        "/v1/queues/a/jobs",
        json!({ "payload": "in a" }),
        PRODUCER_A,
    );
    let in_a = id_of(s, &b);

    let child = json!({ "payload": "child", "idempotency_key": "child", "after": [in_a, in_b] });
    let (status, body) = post("/v1/queues/a/jobs", child.clone(), PRODUCER_A);
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden", "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains(&in_b) && message.contains("\"b\""),
        "{message}"
    );

    let batch = json!({ "jobs": [{ "payload": "x", "idempotency_key": "x" }, child] });
    let (status, body) = post("/v1/queues/a/jobs/batch", batch, PRODUCER_A);
    assert_eq!(status, 403, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.starts_with("jobs[1]: "), "{message}");

    // Nothing was written: both keys are still free.
    for key in ["child", "x"] {
        let (s, b) = post(
            "/v1/queues/a/jobs",
            json!({ "payload": key, "idempotency_key": key, "after": [in_a] }),
            PRODUCER_A,
        );
        assert_eq!(s, 202, "{key} was not taken: {b}");
    }
    // A token for every queue may name it.
    let (s, b) = post(
        "/v1/queues/a/jobs",
        json!({ "payload": "y", "after": [in_b] }),
        ANY,
    );
    id_of(s, &b);
}

#[test]
fn the_same_idempotency_key_with_other_parents_is_409_and_changes_nothing() {
    let qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    let one = qd.enqueue("ext", "one");
    let two = qd.enqueue("ext", "two");
    let body = |after: Value| json!({ "payload": "child", "idempotency_key": "k", "after": after });
    let child = qd.enqueue_json("ext", body(json!([one])));
    let (status, again) = qd.post("/v1/queues/ext/jobs", &body(json!([one])));
    assert_eq!((status, &again["id"]), (200, &json!(child)), "{again}");
    assert_eq!(again["duplicate"], true);
    for other in [json!([two]), json!([one, two])] {
        let (status, resp) = qd.post("/v1/queues/ext/jobs", &body(other.clone()));
        assert_eq!(status, 409, "{other}: {resp}");
        assert_eq!(resp["error"]["code"], "idempotency_conflict", "{resp}");
    }
    let (status, resp) = qd.post(
        "/v1/queues/ext/jobs",
        &json!({ "payload": "child", "idempotency_key": "k" }),
    );
    assert_eq!(status, 409, "no parents is other parents: {resp}");
    let mut finished = body(json!([one]));
    finished["after_policy"] = json!("finished");
    let (status, resp) = qd.post("/v1/queues/ext/jobs", &finished);
    assert_eq!(status, 409, "another policy is another request: {resp}");
    // A key held by a job without parents conflicts with one that names some.
    qd.enqueue_json("ext", json!({ "payload": "plain", "idempotency_key": "p" }));
    let (status, resp) = qd.post(
        "/v1/queues/ext/jobs",
        &json!({ "payload": "plain", "idempotency_key": "p", "after": [one] }),
    );
    assert_eq!(status, 409, "{resp}");
    let (status, resp) = qd.post(
        "/v1/queues/ext/jobs",
        &json!({ "payload": "plain", "idempotency_key": "p" }),
    );
    assert_eq!(
        status, 200,
        "the plain duplicate is still a duplicate: {resp}"
    );
    // The child still waits on `one` alone: `two` finishing does not release it.
    let job = lease_expecting(&qd, "ext", "one");
    assert_eq!(job["id"], one.as_str());
    let second = lease_expecting(&qd, "ext", "two");
    let plain = lease_expecting(&qd, "ext", "plain");
    ack(&qd, &plain);
    ack(&qd, &second);
    assert_eq!(qd.job(&child)["state"], "waiting");
    ack(&qd, &job);
    assert_eq!(qd.job(&child)["state"], "ready");
}

fn batch(qd: &Qd, path: &str, jobs: Value) -> (u16, Value) {
    qd.post(path, &json!({ "jobs": jobs }))
}

fn ids(resp: &Value) -> Vec<String> {
    resp["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["id"].as_str().expect("id").to_owned())
        .collect()
}

#[test]
fn a_batch_fans_out_and_its_finisher_names_the_members_by_ref_in_one_commit() {
    let qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"60s\"\n");
    let earlier = succeed(&qd, "ext", "earlier", json!({ "result": "e" }));
    let (status, resp) = batch(
        &qd,
        "/v1/queues/ext/jobs/batch",
        json!([
            { "payload": "m0", "ref": "m0" },
            { "payload": "m1", "ref": "m1" },
            { "payload": "finisher", "ref": "fin", "after": ["m1", earlier, "m0"] },
            { "payload": "report", "after": ["fin"], "after_policy": "finished" },
        ]),
    );
    assert_eq!(status, 202, "{resp}");
    let got = ids(&resp);
    assert_eq!(qd.job(&got[2])["state"], "waiting");
    assert_eq!(qd.job(&got[3])["state"], "waiting");
    for (n, member) in ["m0", "m1"].iter().enumerate() {
        let job = lease_expecting(&qd, "ext", member);
        assert_eq!(job["id"], got[n].as_str());
        ack_with(&qd, &job, json!({ "result": format!("r{n}") }));
    }
    let job = lease_expecting(&qd, "ext", "finisher");
    let mut want = vec![
        json!({ "id": earlier, "state": "succeeded", "result": "e", "last_error": null }),
        json!({ "id": got[0], "state": "succeeded", "result": "r0", "last_error": null }),
        json!({ "id": got[1], "state": "succeeded", "result": "r1", "last_error": null }),
    ];
    want.sort_by_key(|p| p["id"].as_str().expect("id").to_owned());
    assert_eq!(job["parents"], json!(want), "{job}");
    ack(&qd, &job);
    let job = lease_expecting(&qd, "ext", "report");
    assert_eq!(job["parents"][0]["id"], got[2].as_str(), "{job}");
}

#[test]
fn a_bad_ref_is_400_naming_it_and_nothing_of_the_batch_is_written() {
    let qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    let job = |key: &str, extra: Value| {
        let mut j = json!({ "payload": key, "idempotency_key": key });
        for (k, v) in extra.as_object().expect("object") {
            j[k] = v.clone();
        }
        j
    };
    let cases = [
        (
            json!([
                job("k0", json!({ "ref": "a" })),
                job("k1", json!({ "after": ["b"] }))
            ]),
            ["jobs[1]", "unknown ref \"b\""],
        ),
        (
            json!([
                job("k0", json!({ "after": ["b"] })),
                job("k1", json!({ "ref": "b" }))
            ]),
            ["jobs[0]", "forward ref"],
        ),
        (
            json!([
                job("k0", json!({ "ref": "a" })),
                job("k1", json!({ "ref": "a" }))
            ]),
            ["jobs[1]", "ref \"a\" is given twice"],
        ),
        (
            json!([
                job("k0", json!({ "ref": "a", "after": ["a"] })),
                job("k1", json!({}))
            ]),
            ["jobs[0]", "own ref \"a\""],
        ),
        (
            json!([
                job("k0", json!({ "ref": "a" })),
                job("k1", json!({ "after": ["a", "a"] }))
            ]),
            ["jobs[1]", "names ref \"a\" twice"],
        ),
        (
            json!([
                job(
                    "k0",
                    json!({ "ref": "0190f1c2-0000-7000-8000-000000000001" })
                ),
                job("k1", json!({}))
            ]),
            ["jobs[0]", "shaped like a job id"],
        ),
        (
            json!([job("k0", json!({ "ref": "" })), job("k1", json!({}))]),
            ["jobs[0]", "ref must be 1 to 128 bytes"],
        ),
        (
            json!([job("k0", json!({})), job("k1", json!({ "queue": "ext" }))]),
            ["jobs[1]", "queue is named by the path"],
        ),
    ];
    for (jobs, needles) in cases {
        let (status, resp) = batch(&qd, "/v1/queues/ext/jobs/batch", jobs.clone());
        assert_eq!(status, 400, "{jobs}: {resp}");
        let message = resp["error"]["message"].as_str().expect("message");
        for needle in needles {
            assert!(message.contains(needle), "{jobs}: {message}");
        }
    }
    let (status, resp) = qd.post(
        "/v1/queues/ext/jobs",
        &json!({ "payload": "x", "ref": "a" }),
    );
    assert_eq!(status, 400, "a single enqueue has no ref: {resp}");
    // Nothing was written: both keys are free.
    let (status, resp) = batch(
        &qd,
        "/v1/queues/ext/jobs/batch",
        json!([
            job("k0", json!({ "ref": "a" })),
            job("k1", json!({ "after": ["a"] }))
        ]),
    );
    assert_eq!(status, 202, "{resp}");
    for item in resp["jobs"].as_array().expect("jobs") {
        assert_eq!(item["duplicate"], false, "{resp}");
    }
}

#[test]
fn post_v1_jobs_batch_takes_a_queue_per_job_for_a_flow_across_queues() {
    let qd = with_tokens();
    let post = |body: Value, token: &str| {
        let (status, _, body) = qd.post_as("/v1/jobs/batch", &json!({ "jobs": body }), Some(token));
        (status, body)
    };
    let flow = json!([
        { "queue": "a", "payload": "extract", "ref": "x" },
        { "queue": "b", "payload": "load", "after": ["x"] },
    ]);
    let (status, resp) = post(flow.clone(), PRODUCER_A);
    assert_eq!(status, 403, "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .expect("message")
            .starts_with("jobs[1]: "),
        "{resp}"
    );
    let (status, resp) = post(json!([{ "queue": "nope", "payload": "p" }]), ANY);
    assert_eq!(status, 404, "{resp}");
    let (status, resp) = post(json!([{ "payload": "p" }]), ANY);
    assert_eq!(status, 400, "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .expect("message")
            .contains("queue is required")
    );

    // Each queue's max_depth holds for the batch (on PostgreSQL too, under
    // every queue's depth lock): three jobs for b (max_depth 2) refuse the
    // whole batch, naming b's first item past the limit; nothing is written.
    let (status, resp) = post(
        json!([
            { "queue": "a", "payload": "not written" },
            { "queue": "b", "payload": "b1" },
            { "queue": "b", "payload": "b2" },
            { "queue": "b", "payload": "b3" },
        ]),
        ANY,
    );
    assert_eq!(status, 429, "{resp}");
    assert_eq!(resp["error"]["code"], "queue_full", "{resp}");
    let message = resp["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("jobs[3]") && message.contains("queue \"b\""),
        "{resp}"
    );

    let (status, resp) = post(flow, ANY);
    assert_eq!(status, 202, "{resp}");
    let got = ids(&resp);
    // The child lists its parent; a token that may not read the parent's queue
    // sees its id and edge only.
    let (status, load) = qd.get_as(&format!("/v1/jobs/{}", got[1]), Some(ANY));
    assert_eq!(status, 200, "{load}");
    assert_eq!(
        load["parents"],
        json!([{ "id": got[0], "edge": "open", "state": "ready", "queue": "a" }]),
        "{load}"
    );
    let (status, load) = qd.get_as(&format!("/v1/jobs/{}", got[1]), Some(READER_B));
    assert_eq!(status, 200, "{load}");
    assert_eq!(
        load["parents"],
        json!([{ "id": got[0], "edge": "open", "state": null, "queue": null }]),
        "{load}"
    );
    let (status, extract) = qd.get_as(&format!("/v1/jobs/{}", got[0]), Some(READER_B));
    assert_eq!(status, 403, "{extract}");
    let (_, extract) = qd.get_as(&format!("/v1/jobs/{}", got[0]), Some(ANY));
    assert_eq!(extract["dependents_total"], 1, "{extract}");
    assert_eq!(extract["dependents"][0]["id"], got[1].as_str(), "{extract}");
    let (status, _, load) = qd.post_as(
        "/v1/queues/b/leases",
        &json!({ "worker_id": "w", "wait": "1s" }),
        Some(ANY),
    );
    assert_eq!(status, 200);
    assert_eq!(load["jobs"], json!([]), "load waits for extract");
    let (_, _, leased) = qd.post_as(
        "/v1/queues/a/leases",
        &json!({ "worker_id": "w", "wait": "5s" }),
        Some(ANY),
    );
    let extract = &leased["jobs"][0];
    assert_eq!(extract["id"], got[0].as_str(), "{leased}");
    let (status, _, body) = qd.post_as(
        &format!("/v1/jobs/{}/ack", got[0]),
        &json!({ "token": extract["token"], "result": "rows=3" }),
        Some(ANY),
    );
    assert_eq!(status, 200, "{body}");
    let (_, _, leased) = qd.post_as(
        "/v1/queues/b/leases",
        &json!({ "worker_id": "w", "wait": "5s" }),
        Some(ANY),
    );
    assert_eq!(leased["jobs"][0]["id"], got[1].as_str(), "{leased}");
    assert_eq!(
        leased["jobs"][0]["parents"][0]["result"], "rows=3",
        "{leased}"
    );
}

/// Runs `qctl enqueue ext --ndjson -` with `input` on stdin.
fn ndjson(qd: &Qd, input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(common::qctl_bin())
        .arg("--socket")
        .arg(&qd.socket)
        .args(["enqueue", "ext", "--ndjson", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run qctl");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("write stdin");
    drop(stdin);
    child.wait_with_output().expect("qctl output")
}

#[test]
fn qctl_enqueue_ndjson_resolves_refs_within_and_across_its_batches() {
    let qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    // 1,000 jobs fill the first batch; the finisher and its report go in the
    // second, naming a ref of the first (resolved by qctl) and of their own
    // batch (resolved by qd).
    let mut input = String::from("{\"payload\": {\"n\": 0}, \"ref\": \"first\"}\n");
    for n in 1..1000 {
        input.push_str(&format!("{{\"payload\": \"m{n}\", \"ref\": \"m{n}\"}}\n"));
    }
    input.push_str("{\"payload\": \"fin\", \"ref\": \"fin\", \"after\": [\"first\", \"m999\"]}\n");
    input.push_str("{\"payload\": \"report\", \"after\": [\"fin\"]}\n");
    let out = ndjson(&qd, &input);
    assert!(out.status.success(), "{}", common::text(&out));
    let printed = String::from_utf8(out.stdout).expect("utf-8");
    let got: Vec<&str> = printed.lines().collect();
    assert_eq!(got.len(), 1002, "an id per line");
    assert_eq!(qd.job(got[0])["state"], "ready");
    assert_eq!(qd.job(got[0])["payload_bytes"], 7, "the payload as written");
    assert_eq!(qd.job(got[1000])["state"], "waiting");
    assert_eq!(qd.job(got[1001])["state"], "waiting");

    // The finisher waits on exactly `first` and `m999`: once both are acked it
    // is released, and its lease lists them.
    let mut seen = 0;
    while let Some(job) = lease_one(&qd, "ext", "w", "2s") {
        if job["payload"] == "fin" {
            let parents: Vec<&str> = job["parents"]
                .as_array()
                .expect("parents")
                .iter()
                .map(|p| p["id"].as_str().expect("id"))
                .collect();
            assert_eq!(parents, vec![got[0], got[999]], "{job}");
            ack(&qd, &job);
            break;
        }
        ack(&qd, &job);
        seen += 1;
    }
    assert_eq!(seen, 1000, "the finisher came after the 1,000 members");

    // A ref given twice is refused naming its lines; the lines before are accepted.
    let out = ndjson(
        &qd,
        "{\"payload\": \"a\", \"ref\": \"dup\"}\n{\"payload\": \"b\", \"ref\": \"dup\"}\n",
    );
    assert!(!out.status.success());
    let err = common::text(&out);
    assert!(
        err.contains("line 2") && err.contains("given on line 1"),
        "{err}"
    );
}

#[test]
fn a_restarted_daemon_still_hands_on_the_parents_stored_before() {
    let mut qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    let parent = succeed(&qd, "ext", "a", json!({ "result": "alpha" }));
    let child = qd.enqueue_json("ext", json!({ "payload": "child", "after": [parent] }));
    // A new process has seen no enqueue with after: it must find the stored edges.
    qd.kill9();
    qd.spawn(&[]);
    let job = lease_expecting(&qd, "ext", "child");
    assert_eq!(job["id"], child.as_str());
    assert_eq!(
        job["parents"],
        json!([{ "id": parent, "state": "succeeded", "result": "alpha", "last_error": null }]),
        "{job}"
    );
}
