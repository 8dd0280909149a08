//! Results and priority through the real `qd` binary: an ack's result shown by
//! `GET /v1/jobs/{id}` and `qctl jobs result`, a command's `$QD_RESULT_FILE`, a
//! webhook's body with `store_result`, a result over `max_result` failing, and a
//! tenant's jobs leased by `ready_at - priority` while tenants keep their turns.
//! `results_postgres.rs` runs the same tests on PostgreSQL.

mod common;
#[path = "http/support.rs"]
#[allow(dead_code)]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use base64::Engine;
use common::{Qd, fails, lease_one, ok, script, wait_for};
use serde_json::{Value, json};
use support::{Downstream, response};

const LONG: Duration = Duration::from_secs(30);

const EXTERNAL: &str = r#"
[queues.ext]
executor = { kind = "external" }
max_result = "16B"
"#;

fn ack_with(qd: &Qd, job: &Value, extra: Value) -> (u16, Value) {
    let id = job["id"].as_str().expect("id");
    let mut body = json!({ "token": job["token"] });
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    qd.post(&format!("/v1/jobs/{id}/ack"), &body)
}

fn leased(qd: &Qd, queue: &str) -> Value {
    lease_one(qd, queue, "w1", "10s").expect("a job to lease")
}

#[test]
fn an_acks_result_is_shown_by_the_job_and_by_qctl_and_each_step_passes_it_on() {
    let qd = Qd::start(EXTERNAL);
    // A chain: each step's result is the next step's payload.
    let mut payload = "seed".to_string();
    for step in 0..3 {
        let id = qd.enqueue("ext", &payload);
        let job = leased(&qd, "ext");
        assert_eq!(job["id"], id.as_str());
        let result = format!("{}+{step}", job["payload"].as_str().expect("text payload"));
        let (status, body) = ack_with(&qd, &job, json!({ "result": result }));
        assert_eq!(status, 200, "{body}");
        let shown = qd.job(&id);
        assert_eq!(shown["state"], "succeeded");
        assert_eq!(shown["result"], result.as_str(), "{shown}");
        assert_eq!(shown["result_bytes"], result.len());
        assert_eq!(ok(&qd, &["jobs", "result", &id]), result);
        payload = result;
    }
    assert_eq!(payload, "seed+0+1+2");

    // Bytes that are not text travel as base64 both ways, and to a private file.
    let id = qd.enqueue("ext", "binary");
    let job = leased(&qd, "ext");
    let bytes = [0u8, 159, 146, 150, 255];
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    let (status, body) = ack_with(&qd, &job, json!({ "result_b64": b64 }));
    assert_eq!(status, 200, "{body}");
    let shown = qd.job(&id);
    assert_eq!(shown["result_b64"], b64.as_str(), "{shown}");
    assert!(shown.get("result").is_none(), "{shown}");
    let file = qd.dir.path().join("result.bin");
    ok(
        &qd,
        &[
            "jobs",
            "result",
            &id,
            "--output",
            file.to_str().expect("path"),
        ],
    );
    assert_eq!(std::fs::read(&file).expect("written"), bytes);
    let mode = std::fs::metadata(&file).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the result file is private");
    let shown = ok(&qd, &["jobs", "show", &id]);
    assert!(shown.contains("result   5 B"), "{shown}");

    // A job without a result: qctl says so and exits 1.
    let id = qd.enqueue("ext", "plain");
    let job = leased(&qd, "ext");
    let (status, _) = ack_with(&qd, &job, json!({}));
    assert_eq!(status, 200);
    assert!(qd.job(&id).get("result").is_none());
    let err = fails(&qd, &["jobs", "result", &id], 1);
    assert!(err.contains("has no result"), "{err}");
}

#[test]
fn a_result_over_max_result_is_refused_naming_its_size_and_changes_nothing() {
    let qd = Qd::start(EXTERNAL);
    let id = qd.enqueue("ext", "big");
    let job = leased(&qd, "ext");
    let (status, body) = ack_with(&qd, &job, json!({ "result": "x".repeat(17) }));
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("17 bytes") && message.contains("16 bytes"),
        "{body}"
    );
    let shown = qd.job(&id);
    assert_eq!(shown["state"], "leased", "nothing changed: {shown}");
    assert_eq!(shown["attempts"], 0);
    for bad in [
        json!({ "result": "a", "result_b64": "YQ==" }),
        json!({ "result_b64": "not base64!" }),
        json!({ "result": 7 }),
    ] {
        let (status, body) = ack_with(&qd, &job, bad.clone());
        assert_eq!(status, 400, "{bad}: {body}");
    }
    assert_eq!(qd.job(&id)["state"], "leased");
    let (status, body) = ack_with(&qd, &job, json!({ "result": "x".repeat(16) }));
    assert_eq!(status, 200, "{body}");
    assert_eq!(qd.job(&id)["result_bytes"], 16);
}

#[test]
fn a_command_job_hands_back_what_it_wrote_to_qd_result_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let writer = script(
        dir.path(),
        "writer.sh",
        "#!/bin/sh\nprintf 'done:%s' \"$(cat)\" > \"$QD_RESULT_FILE\"\n",
    );
    let quiet = script(dir.path(), "quiet.sh", "#!/bin/sh\ncat >/dev/null\n");
    let qd = Qd::start(&format!(
        r#"[queues.cmd]
executor = {{ kind = "command", program = "{writer}" }}
workers = {{ min = 1, max = 1 }}

[queues.small]
executor = {{ kind = "command", program = "{writer}" }}
workers = {{ min = 1, max = 1 }}
max_result = "8B"
max_attempts = 3

[queues.quiet]
executor = {{ kind = "command", program = "{quiet}" }}
workers = {{ min = 1, max = 1 }}
"#,
        writer = writer.display(),
        quiet = quiet.display(),
    ));
    let id = qd.enqueue("cmd", "hello");
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"], "done:hello", "{job}");

    let id = qd.enqueue("small", "too long");
    let job = qd.wait_final(&id, LONG);
    assert_eq!(
        job["state"], "dead",
        "a result over max_result is permanent: {job}"
    );
    assert_eq!(job["attempts"], 1, "not retried: {job}");
    let error = job["last_error"].as_str().expect("error");
    assert!(
        error.contains("13 bytes") && error.contains("8 bytes"),
        "{job}"
    );
    assert!(job.get("result").is_none());

    let id = qd.enqueue("quiet", "x");
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        job.get("result").is_none(),
        "an empty file is no result: {job}"
    );
}

fn echo_back(body: &str, _nth: usize) -> Option<String> {
    Some(match body {
        "large" => response("200 OK", "", &"L".repeat(40)),
        _ => response("200 OK", "", &format!("receipt for {body}")),
    })
}

#[test]
fn a_webhook_queue_with_store_result_keeps_the_response_body() {
    let down = Downstream::start(echo_back);
    let qd = Qd::start(&format!(
        r#"[queues.keep]
executor = {{ kind = "http", url = "{url}", store_result = true }}
max_result = "32B"
max_attempts = 3

[queues.drop]
executor = {{ kind = "http", url = "{url}" }}
"#,
        url = down.url
    ));
    let kept = qd.enqueue("keep", "order-1");
    let large = qd.enqueue("keep", "large");
    let dropped = qd.enqueue("drop", "order-2");
    let job = qd.wait_final(&kept, LONG);
    assert_eq!(job["result"], "receipt for order-1", "{job}");
    let job = qd.wait_final(&large, LONG);
    assert_eq!(job["state"], "dead", "{job}");
    assert_eq!(job["attempts"], 1, "{job}");
    assert!(
        job["last_error"]
            .as_str()
            .expect("error")
            .contains("40 bytes"),
        "{job}"
    );
    let job = qd.wait_final(&dropped, LONG);
    assert_eq!(job["state"], "succeeded");
    assert!(job.get("result").is_none(), "{job}");
}

#[test]
fn a_result_setting_out_of_range_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (body, needle) in [
        (
            "[queues.q]\nexecutor = { kind = \"external\" }\nmax_result = \"2MiB\"\n",
            "max_result",
        ),
        (
            "[queues.q]\nexecutor = { kind = \"external\" }\nmax_result = 0\n",
            "max_result",
        ),
        (
            "[queues.q]\nexecutor = { kind = \"command\", program = \"/bin/true\", store_result = true }\n",
            "store_result",
        ),
    ] {
        let (code, text) = common::check_config(
            dir.path(),
            &format!("[daemon]\ndata_dir = \"{}\"\n{body}", dir.path().display()),
        );
        assert_eq!(code, Some(1), "{body}: {text}");
        assert!(text.contains(needle), "{body}: {text}");
    }
}

#[test]
fn priority_orders_a_tenants_jobs_and_never_takes_another_tenants_turn() {
    let qd = Qd::start(
        r#"[queues.ext]
executor = { kind = "external" }
"#,
    );
    let enqueue = |tenant: &str, name: &str, priority: Option<&str>| {
        let mut body = json!({ "payload": name, "tenant": tenant });
        if let Some(p) = priority {
            body["priority"] = json!(p);
        }
        qd.enqueue_json("ext", body);
    };
    enqueue("a", "a1", None);
    enqueue("a", "a2", Some("0s"));
    enqueue("a", "a3", Some("10m"));
    enqueue("a", "a4", Some("-5m"));
    enqueue("b", "b1", Some("1d"));
    enqueue("b", "b2", Some("1d"));
    let mut order = Vec::new();
    while let Some(job) = lease_one(&qd, "ext", "w1", "0s") {
        order.push(job["payload"].as_str().expect("payload").to_string());
        common::ack(&qd, &job);
    }
    let of = |t: char| -> Vec<&str> {
        order
            .iter()
            .map(String::as_str)
            .filter(|p| p.starts_with(t))
            .collect()
    };
    assert_eq!(of('a'), ["a3", "a1", "a2", "a4"], "a's order: {order:?}");
    assert_eq!(of('b'), ["b1", "b2"], "{order:?}");
    let first_four: Vec<char> = order[..4].iter().map(|p| p.as_bytes()[0] as char).collect();
    assert_eq!(
        first_four.iter().filter(|&&t| t == 'b').count(),
        2,
        "b's priority of a day takes no turn of a's: {order:?}"
    );

    // Bad priorities are refused, naming the field, and enqueue nothing.
    for bad in [json!("25h"), json!("-1day 1s"), json!("soon"), json!(600)] {
        let (status, body) = qd.post(
            "/v1/queues/ext/jobs",
            &json!({ "payload": "x", "priority": bad }),
        );
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .expect("message")
                .contains("priority"),
            "{body}"
        );
    }
    let (status, body) = qd.post(
        "/v1/queues/ext/jobs/batch",
        &json!({ "jobs": [{ "payload": "ok" }, { "payload": "x", "priority": "2d" }] }),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        lease_one(&qd, "ext", "w1", "0s").is_none(),
        "nothing was enqueued"
    );
}

#[test]
fn priority_is_kept_by_retries_shown_everywhere_and_leaves_the_queue_age_real() {
    let qd = Qd::start(
        r#"[queues.ext]
executor = { kind = "external" }
backoff = { base = "10ms", max = "10ms" }
"#,
    );
    let out = ok(
        &qd,
        &["enqueue", "ext", "--payload", "p", "--priority", "-5m"],
    );
    let id = out.trim().to_string();
    let shown = qd.job(&id);
    assert_eq!(shown["priority"], "-5m", "{shown}");
    assert_eq!(shown["priority_ms"], -300_000);
    let text = ok(&qd, &["jobs", "show", &id]);
    assert!(text.contains("priority -5m"), "{text}");
    let err = fails(
        &qd,
        &["enqueue", "ext", "--payload", "p", "--priority", "2d"],
        1,
    );
    assert!(err.contains("priority"), "{err}");

    // A retried job keeps its priority.
    let boosted = qd.enqueue_json("ext", json!({ "payload": "boosted", "priority": "1d" }));
    let job = lease_one(&qd, "ext", "w1", "5s").expect("lease");
    assert_eq!(job["id"], boosted.as_str(), "the boosted job goes first");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{boosted}/nack"),
        &json!({ "token": job["token"], "error": "again" }),
    );
    assert_eq!(status, 200, "{body}");
    wait_for("the retry to be ready", LONG, || {
        (qd.job(&boosted)["state"] == "ready").then_some(())
    });
    let job = lease_one(&qd, "ext", "w1", "5s").expect("lease");
    assert_eq!(job["id"], boosted.as_str(), "still first after its retry");
    assert_eq!(qd.job(&boosted)["priority"], "1day");

    // The queue's age is the real wait (seconds), not a day ahead.
    wait_for("the age gauge", LONG, || {
        let age = common::metric(
            &qd.scrape(),
            "qd_queue_oldest_ready_age_seconds",
            &[("queue", "ext")],
        );
        (age > 0.0).then_some(age)
    });
    let age = common::metric(
        &qd.scrape(),
        "qd_queue_oldest_ready_age_seconds",
        &[("queue", "ext")],
    );
    assert!(
        age < 600.0,
        "the age is the wait, not the ordering key: {age}"
    );
}
