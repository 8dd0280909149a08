//! Webhooks, external workers and API authentication, through the real `qd` binary.
//!
//! A loopback downstream (a std `TcpListener`, one thread per connection) plays the
//! webhook receiver and records what it was sent and when; external workers are the
//! test itself talking HTTP, and the example workers in `config/examples/`.

mod common;
#[path = "http/support.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Qd, free_port, free_ports, have, history, script, tool_missing, wait_for};
use serde_json::json;
use support::{Client, Downstream, response, run_to_exit};

const LONG: Duration = Duration::from_secs(30);

fn webhook_answers(body: &str, nth: usize) -> Option<String> {
    Some(match body {
        "throttle" if nth < 2 => response("503 Service Unavailable", "retry-after: 1\r\n", ""),
        "bad" => response("400 Bad Request", "", "invalid widget: colour must be red"),
        "hang" => return None,
        _ => response("200 OK", "", "thanks"),
    })
}

#[test]
fn webhooks_are_classified_by_status_throttling_is_free_and_timeouts_count() {
    let down = Downstream::start(webhook_answers);
    let refused = format!("http://127.0.0.1:{}/hook", free_port());
    let qd = Qd::start(&format!(
        r#"[queues.hook]
executor = {{ kind = "http", url = "{}" }}
timeout = "1s"
max_attempts = 2
backoff = {{ base = "100ms", max = "200ms" }}
workers = {{ min = 4, max = 4 }}

[queues.refused]
executor = {{ kind = "http", url = "{refused}" }}
max_attempts = 2
backoff = {{ base = "100ms", max = "200ms" }}
"#,
        down.url
    ));
    let ok = qd.enqueue_json(
        "hook",
        json!({"payload": "ok", "tenant": "acme", "idempotency_key": "order-42"}),
    );
    let throttle = qd.enqueue("hook", "throttle");
    let bad = qd.enqueue("hook", "bad");
    let hang = qd.enqueue("hook", "hang");
    let conn = qd.enqueue("refused", "anything");

    let job = qd.wait_final(&ok, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    let hits = down.hits_of("ok");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].header("idempotency-key"), Some("order-42"));
    assert_eq!(hits[0].header("qd-job-id"), Some(ok.as_str()));
    assert_eq!(hits[0].header("qd-attempt"), Some("1"));
    assert_eq!(hits[0].header("qd-tenant"), Some("acme"));

    let job = qd.wait_final(&throttle, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(history(&job), ["throttled", "throttled", "succeeded"]);
    assert_eq!(
        job["attempts"], 1,
        "throttled results are not charged: {job}"
    );
    let times: Vec<Instant> = down.hits_of("throttle").iter().map(|h| h.at).collect();
    assert_eq!(times.len(), 3);
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        let hits: Vec<Duration> = times.iter().map(|t| *t - times[0]).collect();
        assert!(
            gap >= Duration::from_secs(1),
            "retried after {gap:?}, before Retry-After: 1 (hits at {hits:?}): {job}"
        );
    }

    let job = qd.wait_final(&bad, LONG);
    assert_eq!(job["state"], "dead", "{job}");
    assert_eq!(history(&job), ["permanent"]);
    assert_eq!(job["attempts"], 1);
    let error = job["history"][0]["error"].as_str().expect("error");
    assert!(
        error.contains("400") && error.contains("colour must be red"),
        "{error}"
    );

    let job = qd.wait_final(&conn, LONG);
    assert_eq!(job["state"], "dead", "{job}");
    assert_eq!(
        history(&job),
        ["failed", "failed"],
        "refused is transient: {job}"
    );

    let job = qd.wait_final(&hang, LONG);
    assert_eq!(job["state"], "dead", "{job}");
    assert_eq!(history(&job), ["timed_out", "timed_out"]);
    assert_eq!(job["attempts"], 2, "timeouts are charged: {job}");
    assert_eq!(down.hits_of("hang").len(), 2);
}

const EXTERNAL: &str = r#"[queues.ext]
executor = { kind = "external" }
lease = "1s"
heartbeat = "300ms"
max_attempts = 5
backoff = { base = "50ms", max = "100ms" }

[queues.batch]
executor = { kind = "external" }
backoff = { base = "50ms", max = "100ms" }

[queues.cmd]
executor = { kind = "command", program = "/bin/true" }
"#;

#[test]
fn heartbeats_keep_a_lease_past_its_deadline_and_a_silent_worker_loses_its_job() {
    let qd = Qd::start(EXTERNAL);
    let api = Client::new(&qd, None);

    // A worker that heartbeats keeps its job for 2.5 lease lengths, then acks.
    let kept = qd.enqueue("ext", "kept");
    let job = api.lease("ext", "w1", 1, "5s").remove(0);
    assert_eq!(job["id"], kept.as_str());
    assert_eq!(job["payload"], "kept");
    let token = job["token"].clone();
    let first_deadline = job["deadline"].as_i64().expect("deadline");
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        std::thread::sleep(Duration::from_millis(300));
        let r = api.report(&job, "heartbeat", json!({"token": token}));
        assert_eq!(r.status, 200, "heartbeat: {}", r.body);
    }
    let r = api.report(&job, "heartbeat", json!({"token": token}));
    assert!(r.body["deadline"].as_i64().expect("deadline") > first_deadline + 2000);
    // An extension of nothing or of more than 12 h is refused, and the lease stands;
    // `null` is the queue's lease, as when the field is left out.
    for extend in [json!("0s"), json!(0), json!("13h")] {
        let r = api.report(&job, "heartbeat", json!({"token": token, "extend": extend}));
        assert_eq!(r.status, 400, "extend {extend}: {}", r.body);
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("extend must be more than 0s")),
            "{}",
            r.body
        );
    }
    let r = api.report(&job, "heartbeat", json!({"token": token, "extend": null}));
    assert_eq!(r.status, 200, "extend null: {}", r.body);
    let r = api.report(&job, "ack", json!({"token": token}));
    assert_eq!((r.status, &r.body["state"]), (200, &json!("succeeded")));
    let done = qd.job(&kept);
    assert_eq!(
        (&done["state"], &done["attempts"]),
        (&json!("succeeded"), &json!(1))
    );

    // A worker that goes silent loses the job to a second worker.
    let lost = qd.enqueue("ext", "lost");
    let old = api.lease("ext", "silent", 1, "5s").remove(0);
    let new = api.lease("ext", "second", 1, "10s").remove(0);
    assert_eq!(new["id"], lost.as_str());
    assert_eq!(new["attempt"], 2);
    assert_ne!(new["token"], old["token"]);
    for what in ["ack", "heartbeat"] {
        let r = api.report(&old, what, json!({"token": old["token"]}));
        assert_eq!(r.status, 409, "late {what}: {}", r.body);
        assert_eq!(r.body["error"]["code"], "stale_token");
        assert_eq!(r.body["error"]["state"], "leased");
    }
    let r = api.report(&new, "ack", json!({"token": new["token"]}));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = api.report(&old, "ack", json!({"token": old["token"]}));
    assert_eq!(r.status, 409, "ack after the job finished: {}", r.body);
    assert_eq!(r.body["error"]["state"], "succeeded");
    let job = qd.job(&lost);
    assert_eq!(history(&job), ["lease_expired", "succeeded"]);
}

#[test]
fn a_long_poll_answers_soon_after_an_enqueue() {
    let qd = Arc::new(Qd::start(EXTERNAL));
    let mut figures = Vec::new();
    for round in 0..3 {
        let poller = {
            let qd = qd.clone();
            std::thread::spawn(move || {
                let jobs = Client::new(&qd, None).lease("batch", "poller", 1, "20s");
                (Instant::now(), jobs)
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        let sent = Instant::now();
        let id = qd.enqueue("batch", &format!("poll {round}"));
        let (answered, jobs) = poller.join().expect("poller");
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0]["id"], id.as_str());
        figures.push(answered.saturating_duration_since(sent));
    }
    println!("long poll answered {figures:?} after the enqueue was sent");
    for latency in figures {
        assert!(latency < Duration::from_millis(500), "took {latency:?}");
    }
}

#[test]
fn a_batch_is_capped_at_max_jobs_and_one_failure_is_not_charged_to_the_others() {
    let qd = Qd::start(EXTERNAL);
    let api = Client::new(&qd, None);
    let ids: Vec<String> = (0..25)
        .map(|i| qd.enqueue("batch", &format!("b{i}")))
        .collect();
    let first = api.lease("batch", "w", 10, "0s");
    assert_eq!(first.len(), 10, "a batch is capped at max_jobs");
    let (failed, rest) = first.split_first().expect("a job");
    let r = api.report(
        failed,
        "nack",
        json!({"token": failed["token"], "kind": "permanent", "error": "cannot parse"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    for job in rest {
        let r = api.report(job, "ack", json!({"token": job["token"]}));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let mut leased = first.len();
    while leased < ids.len() {
        let batch = api.lease("batch", "w", 10, "1s");
        assert!(
            !batch.is_empty() && batch.len() <= 10,
            "batch of {}",
            batch.len()
        );
        for job in &batch {
            assert_eq!(
                api.report(job, "ack", json!({"token": job["token"]}))
                    .status,
                200
            );
        }
        leased += batch.len();
    }
    assert_eq!(leased, 25);
    let failed_id = failed["id"].as_str().expect("id");
    for id in &ids {
        let job = qd.job(id);
        let want = if id == failed_id {
            ["permanent"]
        } else {
            ["succeeded"]
        };
        assert_eq!(history(&job), want, "{job}");
        assert_eq!(job["attempts"], 1);
    }
}

/// Every error has the documented JSON body, also for a path segment that is not
/// UTF-8 once decoded; a nack's error is kept to at most 4 KiB of bytes, however
/// many bytes its characters take.
#[test]
fn odd_paths_get_the_json_error_body_and_a_nack_error_is_cut_to_4_kib() {
    let qd = Qd::start(EXTERNAL);
    for (status, body) in [
        qd.post_raw("/v1/queues/%FF/jobs", br#"{"payload":"x"}"#),
        qd.get("/v1/jobs/%FF%FE"),
    ] {
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
    }
    let api = Client::new(&qd, None);
    let id = qd.enqueue("batch", "x");
    let job = api.lease("batch", "w", 1, "5s").remove(0);
    let error = "\u{1F600}".repeat(5000);
    let r = api.report(&job, "nack", json!({"token": job["token"], "error": error}));
    assert_eq!(r.status, 200, "{}", r.body);
    let kept = qd.job(&id)["last_error"]
        .as_str()
        .expect("last_error")
        .to_owned();
    assert!(
        kept.len() <= 4096 && kept.len() > 4090,
        "{} bytes",
        kept.len()
    );
    assert!(
        kept.chars().all(|c| c == '\u{1F600}'),
        "cut at a character boundary"
    );
}

#[test]
fn unknown_tokens_conflict_and_only_external_queues_lease() {
    let qd = Qd::start(EXTERNAL);
    let api = Client::new(&qd, None);
    qd.enqueue("batch", "x");
    let job = api.lease("batch", "w", 1, "5s").remove(0);
    let wrong = job["token"].as_u64().expect("token") + 100;
    let r = api.report(&job, "ack", json!({"token": wrong}));
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "stale_token");
    assert_eq!(r.body["error"]["state"], "leased");
    let nobody = json!({"id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"});
    assert_eq!(api.report(&nobody, "ack", json!({"token": 1})).status, 404);
    let r = api.post(
        "/v1/queues/cmd/leases",
        json!({"worker_id": "w", "max_jobs": 1}),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "not_external");
}

// ---- authentication --------------------------------------------------------------

const PRODUCER: &str = "producer-0123456789abcdef";
const WORKER_A: &str = "worker-a-0123456789abcdef";
const READER_B: &str = "reader-b-0123456789abcdef";

fn token_file(dir: &Path, mode: u32) -> PathBuf {
    let path = dir.join("tokens.toml");
    let text = format!(
        r#"[[tokens]]
name = "producer"
token = "{PRODUCER}"
roles = ["produce", "read"]
queues = ["*"]

[[tokens]]
name = "worker-a"
token = "{WORKER_A}"
roles = ["work"]
queues = ["a"]

[[tokens]]
name = "reader-b"
token = "{READER_B}"
roles = ["read"]
queues = ["b"]
"#
    );
    std::fs::write(&path, text).expect("write tokens");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

const AUTH_QUEUES: &str = r#"api_tokens_file = "tokens.toml"

[queues.a]
executor = { kind = "external" }

[queues.b]
executor = { kind = "external" }
"#;

#[test]
fn tokens_gate_each_endpoint_by_role_and_queue() {
    let mut qd = Qd::configure(tempfile::tempdir().expect("tempdir"), AUTH_QUEUES, "5s");
    token_file(qd.dir.path(), 0o600);
    qd.spawn(&[]);
    let (anon, producer) = (Client::new(&qd, None), Client::new(&qd, Some(PRODUCER)));
    let (worker, reader) = (
        Client::new(&qd, Some(WORKER_A)),
        Client::new(&qd, Some(READER_B)),
    );
    let stranger = Client::new(&qd, Some("not-a-token-0123456789"));
    let enqueue =
        |c: &Client, q: &str| c.post(&format!("/v1/queues/{q}/jobs"), json!({"payload": "p"}));

    let r = enqueue(&anon, "a");
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(
        r.challenge
            .as_deref()
            .is_some_and(|c| c.starts_with("Bearer")),
        "{:?}",
        r.challenge
    );
    assert_eq!(enqueue(&stranger, "a").status, 401);
    assert_eq!(anon.get("/healthz").status, 200, "/healthz stays open");

    let r = enqueue(&producer, "a");
    assert_eq!(r.status, 202, "{}", r.body);
    let in_a = r.body["id"].as_str().expect("id").to_string();
    let in_b = enqueue(&producer, "b").body["id"]
        .as_str()
        .expect("id")
        .to_string();
    let r = enqueue(&worker, "a");
    assert_eq!(r.status, 403, "no produce role: {}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("produce")
    );
    let lease = json!({"worker_id": "w", "max_jobs": 1, "wait": "5s"});
    assert_eq!(
        producer.post("/v1/queues/a/leases", lease.clone()).status,
        403
    );
    let r = worker.post("/v1/queues/b/leases", lease.clone());
    assert_eq!(r.status, 403, "queue b is not worker-a's: {}", r.body);

    let job = worker.lease("a", "w", 1, "5s").remove(0);
    assert_eq!(job["id"], in_a.as_str());
    let r = worker.post(&format!("/v1/jobs/{in_b}/ack"), json!({"token": 1}));
    assert_eq!(r.status, 403, "a job of queue b: {}", r.body);
    let r = worker.report(&job, "ack", json!({"token": job["token"]}));
    assert_eq!(r.status, 200, "{}", r.body);

    assert_eq!(
        worker.get(&format!("/v1/jobs/{in_a}")).status,
        403,
        "no read role"
    );
    assert_eq!(reader.get(&format!("/v1/jobs/{in_b}")).status, 200);
    assert_eq!(
        reader.get(&format!("/v1/jobs/{in_a}")).status,
        403,
        "queue a"
    );
    let r = producer.get(&format!("/v1/jobs/{in_a}"));
    assert_eq!(r.body["state"], "succeeded", "{}", r.body);
    assert!(!qd.logs().contains(WORKER_A), "a token was logged");
}

#[test]
fn a_token_file_others_can_read_stops_qd_from_starting() {
    let qd = Qd::configure(tempfile::tempdir().expect("tempdir"), AUTH_QUEUES, "5s");
    let path = token_file(qd.dir.path(), 0o644);
    let out = run_to_exit(&qd.config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(
        stderr.contains("0644") && stderr.contains("chmod 600"),
        "{stderr}"
    );
}

#[test]
fn a_public_api_listen_without_tokens_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("qd.toml");
    let ports: [u16; 2] = free_ports();
    let text = format!(
        "[daemon]\ndata_dir = \"data\"\nadmin_socket = \"qctl.sock\"\napi_listen = \"0.0.0.0:{}\"\nmetrics_listen = \"127.0.0.1:{}\"\n\n[queues.a]\nexecutor = {{ kind = \"external\" }}\n",
        ports[0], ports[1]
    );
    std::fs::write(&config, text).expect("config");
    let out = run_to_exit(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("is not loopback; set daemon.api_tokens_file"),
        "{stderr}"
    );
}

// ---- the example workers ---------------------------------------------------------

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config/examples")
        .join(name)
}

/// Runs an example worker (with a token) against a real qd: one job succeeds with
/// its payload delivered, one whose handler exits 65 is dead-lettered at once.
fn example_worker_works_a_queue(interpreter: &str, file: &str) {
    let mut qd = Qd::configure(tempfile::tempdir().expect("tempdir"), AUTH_QUEUES, "5s");
    token_file(qd.dir.path(), 0o600);
    qd.spawn(&[]);
    let out = qd.dir.path().join("handled");
    let handler = script(
        qd.dir.path(),
        "handler.sh",
        &format!(
            "p=$(cat)\n[ \"$p\" = bad ] && {{ echo 'bad payload' >&2; exit 65; }}\nprintf '%s\\n' \"$p\" >> {}",
            out.display()
        ),
    );
    let mut worker = Command::new(interpreter)
        .arg(example(file))
        .arg(&handler)
        .env("QD_URL", &qd.api)
        .env("QD_QUEUE", "a")
        .env("QD_TOKEN", WORKER_A)
        .env("QD_WAIT", "1s")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn worker");
    let producer = Client::new(&qd, Some(PRODUCER));
    let enqueue = |payload: &str| {
        let r = producer.post("/v1/queues/a/jobs", json!({"payload": payload}));
        assert_eq!(r.status, 202, "{}", r.body);
        r.body["id"].as_str().expect("id").to_string()
    };
    let (good, bad) = (enqueue("hello from qd"), enqueue("bad"));
    let state = |id: &str| {
        wait_for("the example worker to finish the job", LONG, || {
            let job = producer.get(&format!("/v1/jobs/{id}")).body;
            matches!(job["state"].as_str(), Some("succeeded" | "dead")).then_some(job)
        })
    };
    let (good, bad) = (state(&good), state(&bad));
    let _ = worker.kill();
    let output = worker.wait_with_output().expect("worker output");
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(good["state"], "succeeded", "{good}\n{log}");
    assert_eq!(
        std::fs::read_to_string(&out).expect("handled"),
        "hello from qd\n"
    );
    assert_eq!(bad["state"], "dead", "{bad}\n{log}");
    assert_eq!(history(&bad), ["permanent"]);
}

#[test]
fn the_shell_example_worker_completes_jobs() {
    if !(have("curl") && have("jq")) {
        tool_missing("curl or jq", "config/examples/worker.sh needs both");
        return;
    }
    example_worker_works_a_queue("sh", "worker.sh");
}

#[test]
fn the_python_example_worker_completes_jobs() {
    if !have("python3") {
        tool_missing("python3", "config/examples/worker.py needs it");
        return;
    }
    example_worker_works_a_queue("python3", "worker.py");
}

#[test]
fn batch_acks_answer_each_item_in_order_and_only_valid_tokens_succeed() {
    let qd = Qd::start(EXTERNAL);
    let api = Client::new(&qd, None);
    for i in 0..3 {
        qd.enqueue("batch", &format!("{i}"));
    }
    let jobs = api.lease("batch", "w1", 1000, "5s");
    assert_eq!(jobs.len(), 3, "max_jobs 1000 is accepted");
    let (a, b, c) = (&jobs[0], &jobs[1], &jobs[2]);
    let unknown = "01900000-0000-7000-8000-000000000000";
    let body = json!({"acks": [
        {"id": a["id"], "token": a["token"]},
        {"id": b["id"], "token": 999},
        {"id": c["id"], "token": c["token"]},
        {"id": unknown, "token": 1},
        {"id": a["id"], "token": a["token"]},
    ]});
    let r = api.post("/v1/acks", body.clone());
    assert_eq!(r.status, 200, "{}", r.body);
    let results = r.body["results"].as_array().expect("results");
    assert_eq!(results.len(), 5, "{}", r.body);
    let ok: Vec<bool> = results.iter().map(|x| x["ok"] == true).collect();
    assert_eq!(ok, [true, false, true, false, false], "{}", r.body);
    let unknown_id = json!(unknown);
    let order = [&a["id"], &b["id"], &c["id"], &unknown_id, &a["id"]];
    for (result, expected) in results.iter().zip(order) {
        assert_eq!(&result["id"], expected, "in request order: {}", r.body);
    }
    assert_eq!(results[1]["error"], "stale_token", "{}", r.body);
    assert_eq!(results[1]["state"], "leased", "{}", r.body);
    assert_eq!(results[3]["error"], "not_found", "{}", r.body);
    for (job, state) in [(a, "succeeded"), (b, "leased"), (c, "succeeded")] {
        let stored = qd.job(job["id"].as_str().expect("id"));
        assert_eq!(stored["state"], state, "{stored}");
    }
    // The same acks again: the finished jobs answer stale_token with their state.
    let r = api.post("/v1/acks", body);
    assert_eq!(r.body["results"][0]["error"], "stale_token", "{}", r.body);
    assert_eq!(r.body["results"][0]["state"], "succeeded", "{}", r.body);

    let r = api.post("/v1/acks", json!({"acks": [{"id": "nope", "token": 1}]}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("acks[0]")
    );
    let r = api.post("/v1/acks", json!({"acks": []}));
    assert_eq!(r.status, 400, "{}", r.body);
    let r = api.post(
        "/v1/queues/batch/leases",
        json!({"worker_id": "w", "max_jobs": 1001}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
}
