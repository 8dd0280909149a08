//! Batch enqueue through the real `qd`: `POST /v1/queues/{queue}/jobs/batch` (all
//! or nothing in one commit, errors naming the item, keys per item, backpressure
//! for the whole batch, roles and grants, durability across `kill -9`) and
//! `qctl enqueue --ndjson` over the admin socket.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Qd, json_of, qctl_bin, text};
use serde_json::{Value, json};

const EXTERNAL: &str = r#"[queues.ext]
executor = { kind = "external" }
max_depth = 100000
"#;

fn batch(qd: &Qd, queue: &str, jobs: Vec<Value>) -> (u16, Option<String>, Value) {
    qd.post_as(
        &format!("/v1/queues/{queue}/jobs/batch"),
        &json!({ "jobs": jobs }),
        None,
    )
}

/// The answer's `(id, duplicate)` pairs, asserting a 202.
fn accepted(answer: (u16, Option<String>, Value)) -> Vec<(String, bool)> {
    let (status, _, body) = answer;
    assert_eq!(status, 202, "{body}");
    body["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| {
            let id = j["id"].as_str().expect("id").to_string();
            (id, j["duplicate"].as_bool().expect("duplicate"))
        })
        .collect()
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

/// Unfinished jobs of `queue` that count against its depth (ready + delayed + leased).
fn depth(qd: &Qd, queue: &str) -> u64 {
    let queues = json_of(qd, &["queues"]);
    let q = queues["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["name"] == queue)
        .cloned()
        .expect("the queue is listed");
    ["ready", "delayed", "leased"]
        .iter()
        .map(|k| q[k].as_u64().unwrap_or(0))
        .sum()
}

fn job(payload: &str) -> Value {
    json!({ "payload": payload })
}

fn keyed(key: &str, payload: &str) -> Value {
    json!({ "payload": payload, "idempotency_key": key })
}

#[test]
fn a_bad_item_is_named_by_its_index_and_nothing_of_the_batch_is_enqueued() {
    let qd = Qd::start(EXTERNAL);
    let bad_items = [
        (
            json!({"payload": "x", "max_attempts": 0}),
            400,
            "max_attempts",
        ),
        (
            json!({"tenant": "t"}),
            400,
            "payload or payload_b64 is required",
        ),
        (
            json!({"payload": "x", "colour": "red"}),
            400,
            "unknown field",
        ),
        (json!("just a string"), 400, "must be a job object"),
        (json!({"payload": "x", "delay": "soon"}), 400, "delay"),
        (
            json!({"payload": "x", "tenant": "no spaces"}),
            400,
            "tenant",
        ),
        (
            json!({"payload": "x".repeat(1_100_000)}),
            413,
            "max_payload",
        ),
    ];
    for (item, status, needle) in bad_items {
        let mut jobs: Vec<Value> = (0..5).map(|n| job(&format!("ok {n}"))).collect();
        jobs.insert(3, item.clone());
        let (got, _, body) = batch(&qd, "ext", jobs);
        assert_eq!(got, status, "{item}: {body}");
        let msg = message(&body);
        assert!(msg.starts_with("jobs[3]: "), "{msg}");
        assert!(msg.contains(needle), "{needle:?} in {msg}");
        assert_eq!(depth(&qd, "ext"), 0, "nothing enqueued after {item}");
    }
    let (status, _, body) = batch(&qd, "ext", Vec::new());
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).contains("1 to 1000"), "{body}");
    let (status, _, body) = batch(&qd, "ext", (0..1001).map(|_| job("x")).collect());
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).contains("got 1001"), "{body}");
    let (status, _, body) = batch(&qd, "nope", vec![job("x")]);
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (404, json!("unknown_queue"))
    );
    let (status, _, body) = qd.post_as("/v1/queues/ext/jobs/batch", &json!([job("x")]), None);
    assert_eq!(status, 400, "{body}");
    assert_eq!(depth(&qd, "ext"), 0);

    let ids = accepted(batch(
        &qd,
        "ext",
        (0..1000).map(|n| job(&n.to_string())).collect(),
    ));
    assert_eq!(ids.len(), 1000);
    assert_eq!(depth(&qd, "ext"), 1000, "a full batch of 1,000 is accepted");
    let first = qd.job(&ids[0].0);
    assert_eq!(
        (first["state"].clone(), first["payload_bytes"].clone()),
        (json!("ready"), json!(1))
    );
}

#[test]
fn a_batch_body_may_pass_the_single_enqueue_limit_up_to_its_own() {
    let qd = Qd::start(EXTERNAL);
    // 8 jobs of 900 KB: a 7.2 MB body, over a single enqueue's 6 MiB + 64 KiB.
    let big = "x".repeat(900_000);
    let ids = accepted(batch(&qd, "ext", (0..8).map(|_| job(&big)).collect()));
    assert_eq!(ids.len(), 8);
    assert_eq!(qd.job(&ids[7].0)["payload_bytes"], 900_000);
    // A body declared over the batch limit of 16 MiB is refused before it is sent.
    let answer = declared_only(&qd, "/v1/queues/ext/jobs/batch", 17_000_000);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("batch limit of 16777216 bytes"), "{answer}");
    assert_eq!(depth(&qd, "ext"), 8);
}

/// Sends only the head of a POST declaring `length` body bytes; the answer's text.
fn declared_only(qd: &Qd, path: &str, length: u64) -> String {
    use std::io::Read;
    let addr = qd.api.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).expect("write");
    // Read until the JSON error body is complete (it ends with "}}") or the
    // server closes the connection.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.ends_with(b"}}") {
        let n = stream
            .read(&mut buf)
            .expect("the answer comes without the body being sent");
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer).to_string()
}

#[test]
fn keys_dedupe_inside_a_batch_and_across_batches_and_a_conflict_refuses_the_batch() {
    let qd = Qd::start(EXTERNAL);
    let first = accepted(batch(
        &qd,
        "ext",
        vec![
            keyed("k1", "a"),
            keyed("k2", "b"),
            keyed("k1", "a"),
            job("plain"),
        ],
    ));
    assert_eq!(
        first[2],
        (first[0].0.clone(), true),
        "a repeat inside the batch"
    );
    assert!(!first[0].1 && !first[1].1 && !first[3].1, "{first:?}");
    assert_eq!(depth(&qd, "ext"), 3);

    let second = accepted(batch(&qd, "ext", vec![keyed("k3", "c"), keyed("k2", "b")]));
    assert_eq!(
        second[1],
        (first[1].0.clone(), true),
        "a repeat of an earlier batch"
    );
    assert!(!second[0].1);
    assert_eq!(depth(&qd, "ext"), 4);

    // A known key with another payload: 409 naming the item, nothing of the batch.
    let (status, _, body) = batch(
        &qd,
        "ext",
        vec![keyed("k4", "d"), job("e"), keyed("k1", "DIFFERENT")],
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "idempotency_conflict");
    assert!(message(&body).starts_with("jobs[2]: "), "{body}");
    assert!(
        message(&body).contains(&first[0].0),
        "names the holder: {body}"
    );
    // The same inside one batch.
    let (status, _, body) = batch(&qd, "ext", vec![keyed("k5", "x"), keyed("k5", "y")]);
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "idempotency_conflict");
    assert_eq!(
        message(&body),
        "jobs[1]: idempotency key \"k5\" is also given to jobs[0] of this batch, \
         with a different payload",
        "names the earlier item, not the id it would have had: {body}"
    );
    assert_eq!(depth(&qd, "ext"), 4, "neither refused batch left a job");
    // k4 and k5 were rolled back with their batches: free for any payload now.
    let again = accepted(batch(
        &qd,
        "ext",
        vec![keyed("k4", "other"), keyed("k5", "y")],
    ));
    assert!(!again[0].1 && !again[1].1, "{again:?}");
    assert_eq!(depth(&qd, "ext"), 6);
}

#[test]
fn a_batch_over_max_depth_is_refused_whole_with_retry_after() {
    let qd = Qd::start(
        r#"[queues.small]
executor = { kind = "external" }
max_depth = 10

[tenants.acme]
max_depth = 3
"#,
    );
    accepted(batch(
        &qd,
        "small",
        (0..5).map(|n| job(&n.to_string())).collect(),
    ));
    let (status, retry, body) = batch(&qd, "small", (0..6).map(|_| job("x")).collect());
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    assert!(retry.is_some(), "Retry-After is set");
    assert!(message(&body).contains("jobs[5]"), "{body}");
    assert_eq!(depth(&qd, "small"), 5, "nothing of the refused batch");

    let acme = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|_| json!({"payload": "a", "tenant": "acme"}))
            .collect()
    };
    let (status, retry, body) = batch(&qd, "small", acme(4));
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (429, json!("tenant_full")),
        "{body}"
    );
    assert!(retry.is_some());
    assert_eq!(depth(&qd, "small"), 5);
    accepted(batch(&qd, "small", acme(3)));
    accepted(batch(&qd, "small", vec![job("y"), job("z")]));
    assert_eq!(depth(&qd, "small"), 10, "exactly max_depth fits");
    let (status, _, _) = batch(&qd, "small", vec![job("one more")]);
    assert_eq!(status, 429);
}

#[test]
fn batch_enqueue_needs_the_produce_role_on_the_queue() {
    const PRODUCER_A: &str = "producer-a-0123456789abcdef";
    const WORKER: &str = "worker-0123456789abcdef0123";
    let mut qd = Qd::configure(
        tempfile::tempdir().expect("tempdir"),
        "api_tokens_file = \"tokens.toml\"\n\n[queues.a]\nexecutor = { kind = \"external\" }\n\n[queues.b]\nexecutor = { kind = \"external\" }\n",
        "5s",
    );
    let tokens = qd.dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\nname = \"pa\"\ntoken = \"{PRODUCER_A}\"\nroles = [\"produce\"]\nqueues = [\"a\"]\n\n\
             [[tokens]]\nname = \"w\"\ntoken = \"{WORKER}\"\nroles = [\"work\"]\nqueues = [\"*\"]\n"
        ),
    )
    .expect("write tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    qd.spawn(&[]);
    let body = json!({ "jobs": [job("x")] });
    let status = |queue: &str, token: Option<&str>| {
        qd.post_as(&format!("/v1/queues/{queue}/jobs/batch"), &body, token)
            .0
    };
    assert_eq!(status("a", None), 401);
    assert_eq!(status("a", Some(WORKER)), 403, "no produce role");
    assert_eq!(status("b", Some(PRODUCER_A)), 403, "queue b is not granted");
    assert_eq!(status("a", Some(PRODUCER_A)), 202);
}

#[test]
fn kill_9_right_after_a_202_loses_none_of_the_batch() {
    let mut qd = Qd::start(EXTERNAL);
    let jobs: Vec<Value> = (0..1000).map(|n| job(&format!("job {n}"))).collect();
    let ids = accepted(batch(&qd, "ext", jobs));
    qd.kill9();
    qd.spawn(&[]);
    assert_eq!(depth(&qd, "ext"), 1000);
    for (n, (id, _)) in ids.iter().enumerate() {
        let stored = qd.job(id);
        assert_eq!(stored["state"], "ready", "job {n}: {stored}");
        assert_eq!(stored["payload_bytes"], format!("job {n}").len(), "job {n}");
    }
}

/// Runs `qctl [--json] enqueue QUEUE --ndjson -` with `input` on stdin.
fn ndjson(qd: &Qd, json: bool, input: &str) -> std::process::Output {
    let mut cmd = Command::new(qctl_bin());
    cmd.arg("--socket").arg(&qd.socket);
    if json {
        cmd.arg("--json");
    }
    let mut child = cmd
        .args(["enqueue", "ext", "--ndjson", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run qctl");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("write stdin");
    drop(stdin);
    child.wait_with_output().expect("qctl output")
}

#[test]
fn qctl_enqueue_ndjson_prints_an_id_per_line_and_stops_at_a_bad_line() {
    let qd = Qd::start(EXTERNAL);
    // 2,500 jobs: three batches; a blank line and a repeated key among them.
    let mut input = String::new();
    for n in 0..2500 {
        input.push_str(&format!("{}\n", json!({"payload": {"n": n}})));
        if n == 10 {
            input.push('\n');
        }
    }
    input.push_str(&format!("{}\n", keyed("k", "same")));
    input.push_str(&format!("{}\n", keyed("k", "same")));
    let out = ndjson(&qd, false, &input);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let ids: Vec<String> = String::from_utf8(out.stdout.clone())
        .expect("utf-8")
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 2502, "one id per job line");
    assert_eq!(
        ids[2500], ids[2501],
        "the repeated key answers the first id"
    );
    let distinct: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 2501);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("enqueued 2502 jobs"),
        "{}",
        text(&out)
    );
    assert_eq!(depth(&qd, "ext"), 2501);
    let last = qd.job(&ids[2499]);
    assert_eq!(last["payload_bytes"], json!({"n": 2499}).to_string().len());

    // --json: one object per job line, with its line number.
    let out = ndjson(
        &qd,
        true,
        &format!("{}\n\n{}\n", job("j1"), keyed("k", "same")),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lines: Vec<Value> = String::from_utf8(out.stdout.clone())
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        (lines[0]["line"].clone(), lines[0]["duplicate"].clone()),
        (json!(1), json!(false))
    );
    assert_eq!(
        (
            lines[1]["line"].clone(),
            lines[1]["id"].clone(),
            lines[1]["duplicate"].clone()
        ),
        (json!(3), json!(ids[2500]), json!(true))
    );
    assert_eq!(depth(&qd, "ext"), 2502);

    // A line that is not JSON: the lines before it are accepted, then exit 2.
    let out = ndjson(
        &qd,
        false,
        &format!("{}\n{}\n{{oops\n{}\n", job("a"), job("b"), job("c")),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("line 3: not JSON"), "{err}");
    assert!(
        err.contains("2 jobs from the lines before line 3 were accepted"),
        "{err}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    assert_eq!(depth(&qd, "ext"), 2504);

    // A job the daemon refuses: its batch is not enqueued, exit 1 naming the line.
    let out = ndjson(
        &qd,
        false,
        &format!(
            "{}\n{}\n",
            job("d"),
            json!({"payload": "e", "max_attempts": 0})
        ),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("line 2: max_attempts"), "{err}");
    assert!(!err.contains("jobs["), "lines, not batch indexes: {err}");
    assert!(
        err.contains("0 jobs from the lines before line 1 were accepted"),
        "{err}"
    );
    assert_eq!(depth(&qd, "ext"), 2504, "nothing of the refused batch");
}

#[test]
fn qctl_enqueue_ndjson_refuses_input_without_a_job_line_as_a_single_enqueue_does() {
    let qd = Qd::start(EXTERNAL);
    for input in ["", "\n  \n"] {
        let out = ndjson(&qd, false, input);
        assert_eq!(out.status.code(), Some(2), "{input:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.contains("stdin holds no job lines"), "{err}");
        assert!(out.stdout.is_empty(), "{}", text(&out));
    }
    let out = ndjson(&qd, true, "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let body: Value = serde_json::from_slice(&out.stdout).expect("a JSON error");
    assert_eq!(body["error"]["code"], "usage", "{body}");
    assert_eq!(depth(&qd, "ext"), 0);
}

#[test]
fn qctl_enqueue_ndjson_words_name_lines_and_say_each_thing_once() {
    let qd = Qd::start(EXTERNAL);
    let out = ndjson(&qd, false, &format!("{}\n{{oops\n", job("one")));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains("1 job from the lines before line 2 was accepted"),
        "{err}"
    );
    let out = ndjson(&qd, false, &format!("{}\n", job("two")));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("qctl: enqueued 1 job from stdin"), "{err}");

    // Backpressure: 2 jobs wait, room for 2 more; line 4 holds the batch's third.
    common::ok(
        &qd,
        &["limits", "set", "--tenant", "default", "--max-depth", "4"],
    );
    let input = format!("{}\n{}\n\n{}\n", job("a"), job("b"), job("c"));
    let out = ndjson(&qd, false, &input);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("at line 4, "), "{err}");
    assert!(!err.contains("jobs["), "lines, not batch indexes: {err}");
    assert_eq!(
        err.matches("nothing of the batch").count(),
        1,
        "said once: {err}"
    );
    assert!(
        err.contains("nothing of the batch from line 1 was enqueued"),
        "{err}"
    );
    assert_eq!(depth(&qd, "ext"), 2);
}

/// `qctl enqueue --ndjson` keeps a JSON payload as written, as the HTTP enqueue
/// does (a big integer not rounded to a float, keys not reordered): the same line
/// sent over HTTP and through qctl stores the same bytes.
#[test]
fn qctl_enqueue_ndjson_keeps_a_json_payload_as_written() {
    let qd = Qd::start(EXTERNAL);
    let sent = r#"{"order":18446744073709551617,"b":1,"a":2}"#;
    let out = ndjson(&qd, false, &format!("{{\"payload\": {sent}}}\n"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let job = common::lease_one(&qd, "ext", "w", "5s").expect("a lease");
    assert_eq!(job["payload"].as_str(), Some(sent), "{job}");
}
