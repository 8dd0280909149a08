//! The delivery contract of qd's core, tested through the real `qd` binary:
//! jobs run, retry with backoff, dead-letter with their history, survive
//! `kill -9`, and a graceful shutdown never spends a job's budget.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Qd, alive, history, metric, script, wait_for};
use serde_json::json;

const LONG: Duration = Duration::from_secs(60);

/// A command queue running `program`, with fast retries.
fn queue(name: &str, program: &std::path::Path, extra: &str) -> String {
    format!(
        "[queues.{name}]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nbackoff = {{ base = \"200ms\", max = \"1s\" }}\n{extra}\n",
        program.display()
    )
}

#[test]
fn two_hundred_jobs_each_run_exactly_once() {
    let work = tempfile::tempdir().expect("tempdir");
    let out = work.path().join("out");
    let prog = script(
        work.path(),
        "append.sh",
        &format!("echo \"$QD_JOB_ID\" >> {}", out.display()),
    );
    let qd = Qd::start(&queue("append", &prog, "workers = { min = 4, max = 4 }"));
    let ids: Vec<String> = (0..200)
        .map(|i| qd.enqueue("append", &format!("job {i}")))
        .collect();
    for id in &ids {
        let job = qd.wait_final(id, LONG);
        assert_eq!(job["state"], "succeeded", "{job}");
    }
    let text = std::fs::read_to_string(&out).expect("output");
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for line in text.lines() {
        *seen.entry(line).or_default() += 1;
    }
    for id in &ids {
        assert_eq!(
            seen.get(id.as_str()),
            Some(&1),
            "job {id} ran {:?} times",
            seen.get(id.as_str())
        );
    }
    assert_eq!(seen.len(), 200);
}

const FLAKY: &str = r#"p=$(cat)
case "$p" in
  flaky) if [ "$QD_ATTEMPT" -le 2 ]; then echo "flaky attempt $QD_ATTEMPT" >&2; exit 75; fi ;;
  bad) echo "cannot parse the payload" >&2; exit 65 ;;
  fail) echo "downstream said no (attempt $QD_ATTEMPT)" >&2; exit 1 ;;
esac
exit 0"#;

#[test]
fn transient_errors_retry_permanent_ones_dead_letter_and_the_budget_is_enforced() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "flaky.sh", FLAKY);
    let qd = Qd::start(&queue(
        "q",
        &prog,
        "max_attempts = 3\nworkers = { min = 2, max = 2 }",
    ));
    let flaky = qd.enqueue("q", "flaky");
    let bad = qd.enqueue("q", "bad");
    let fail = qd.enqueue("q", "fail");

    let job = qd.wait_final(&flaky, LONG);
    assert_eq!(
        (job["state"].as_str(), job["attempts"].as_u64()),
        (Some("succeeded"), Some(3)),
        "{job}"
    );
    assert_eq!(history(&job), ["failed", "failed", "succeeded"]);

    let job = qd.wait_final(&bad, LONG);
    assert_eq!(
        (job["state"].as_str(), job["attempts"].as_u64()),
        (Some("dead"), Some(1)),
        "{job}"
    );
    assert_eq!(history(&job), ["permanent"]);
    assert!(
        job["last_error"]
            .as_str()
            .expect("error")
            .contains("cannot parse the payload")
    );

    let job = qd.wait_final(&fail, LONG);
    assert_eq!(
        (job["state"].as_str(), job["attempts"].as_u64()),
        (Some("dead"), Some(3)),
        "{job}"
    );
    assert_eq!(history(&job), ["failed", "failed", "failed"]);
    assert!(
        job["last_error"]
            .as_str()
            .expect("error")
            .contains("downstream said no (attempt 3)")
    );

    // Full jitter: the n-th retry waits at most min(max, base * 2^(n-1)) (+ dispatch slack).
    let h = job["history"].as_array().expect("history");
    for (n, pair) in h.windows(2).enumerate() {
        let gap = pair[1]["started_at"].as_i64().expect("start")
            - pair[0]["ended_at"].as_i64().expect("end");
        let cap = 200 * (1 << n);
        assert!(
            (0..=cap + 1_000).contains(&gap),
            "retry {} waited {gap} ms, cap {cap} ms",
            n + 1
        );
    }
}

#[test]
fn a_timeout_kills_the_whole_process_group_and_the_job_is_retried() {
    let work = tempfile::tempdir().expect("tempdir");
    let pids = work.path().join("pids");
    let body = format!("sleep 1000 & echo $! >> {}\nsleep 1000", pids.display());
    let prog = script(work.path(), "hang.sh", &body);
    let extra = "timeout = \"1s\"\nkill_grace = \"1s\"\nmax_attempts = 2";
    let qd = Qd::start(&queue("slow", &prog, extra));
    let id = qd.enqueue("slow", "x");
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "dead", "{job}");
    assert_eq!(history(&job), ["timed_out", "timed_out"]);
    let text = std::fs::read_to_string(&pids).expect("pids");
    let grandchildren: Vec<i32> = text
        .lines()
        .map(|l| l.trim().parse().expect("pid"))
        .collect();
    assert_eq!(grandchildren.len(), 2, "one grandchild per attempt");
    for pid in grandchildren {
        wait_for(
            &format!("grandchild {pid} to be gone"),
            Duration::from_secs(10),
            || (!alive(pid)).then_some(()),
        );
    }
}

#[test]
fn a_panicking_worker_is_restarted_and_its_job_is_retried_not_lost() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "ok.sh", "cat > /dev/null; exit 0");
    let qd = Qd::start_with(
        &queue("q", &prog, "workers = { min = 1, max = 1 }"),
        &[("QD_TEST_HOOKS", "1")],
    );
    let id = qd.enqueue("q", "qd-test:panic-on-attempt:1");
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(history(&job), ["worker_crashed", "succeeded"]);
    // The restarted worker keeps serving.
    let next = qd.enqueue("q", "plain");
    assert_eq!(qd.wait_final(&next, LONG)["state"], "succeeded");
    assert!(qd.logs().contains("Worker crashed"), "{}", qd.logs());
}

#[test]
fn kill_dash_nine_loses_no_accepted_job() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "work.sh", "cat > /dev/null; sleep 0.05");
    let mut qd = Qd::start(&queue(
        "q",
        &prog,
        "workers = { min = 4, max = 4 }\nlease = \"3s\"\nheartbeat = \"1s\"",
    ));
    let ids: Vec<String> = (0..500).map(|i| qd.enqueue("q", &format!("{i}"))).collect();
    // Kill while jobs are queued and some are running.
    wait_for("some jobs to finish", LONG, || {
        let done = ids
            .iter()
            .take(50)
            .filter(|id| qd.job(id)["state"] == "succeeded")
            .count();
        (done > 5).then_some(())
    });
    qd.kill9();
    qd.spawn(&[]);
    let mut states: HashMap<String, usize> = HashMap::new();
    for id in &ids {
        let job = qd.wait_final(id, Duration::from_secs(120));
        *states
            .entry(job["state"].as_str().expect("state").to_string())
            .or_default() += 1;
    }
    let total: usize = states.values().sum();
    assert_eq!(total, 500, "{states:?}");
    assert_eq!(states.get("succeeded"), Some(&500), "{states:?}");
    assert!(
        qd.logs().contains("recovered"),
        "restart should log recovery"
    );
}

#[test]
fn sigterm_lets_running_jobs_finish_and_interrupts_long_ones_without_charging_them() {
    let work = tempfile::tempdir().expect("tempdir");
    let marker = work.path().join("long-ran");
    let body = format!(
        r#"p=$(cat)
if [ "$p" = "short" ]; then sleep 1; exit 0; fi
if [ -e {m} ]; then exit 0; fi
touch {m}; sleep 60"#,
        m = marker.display()
    );
    let prog = script(work.path(), "job.sh", &body);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut qd = Qd::configure(
        dir,
        &queue(
            "q",
            &prog,
            "max_attempts = 1\nworkers = { min = 2, max = 2 }",
        ),
        "3s",
    );
    qd.spawn(&[]);
    let long = qd.enqueue("q", "long");
    wait_for("the long job to start", LONG, || {
        marker.exists().then_some(())
    });
    let short = qd.enqueue("q", "short");
    wait_for("the short job to be leased", LONG, || {
        (qd.job(&short)["state"] == "leased").then_some(())
    });
    let started = Instant::now();
    let status = qd.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit {status}:\n{}", qd.logs());
    assert!(started.elapsed() < Duration::from_secs(20));

    qd.spawn(&[]);
    let job = qd.wait_final(&short, LONG);
    assert_eq!(
        (job["state"].as_str(), job["attempts"].as_u64()),
        (Some("succeeded"), Some(1)),
        "{job}"
    );
    // max_attempts = 1: an interruption that charged the budget would dead-letter it.
    let job = qd.wait_final(&long, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(history(&job), ["interrupted", "succeeded"]);
}

#[test]
fn an_idempotency_key_makes_one_job_and_a_different_payload_conflicts() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "ok.sh", "cat > /dev/null");
    let qd = Qd::start(&queue("q", &prog, ""));
    let body = json!({ "payload": "charge 42", "idempotency_key": "order-42" });
    let (s1, first) = qd.post("/v1/queues/q/jobs", &body);
    let (s2, second) = qd.post("/v1/queues/q/jobs", &body);
    let (s3, third) = qd.post("/v1/queues/q/jobs", &body);
    assert_eq!((s1, s2, s3), (202, 200, 200), "{first} {second} {third}");
    assert_eq!(first["id"], second["id"]);
    assert_eq!(first["id"], third["id"]);
    assert_eq!(second["duplicate"], true);
    let (status, err) = qd.post(
        "/v1/queues/q/jobs",
        &json!({ "payload": "charge 43", "idempotency_key": "order-42" }),
    );
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"]["code"], "idempotency_conflict");
    let id = first["id"].as_str().expect("id");
    assert_eq!(qd.wait_final(id, LONG)["attempts"], 1);
    // The key still dedupes after the job finished (within retention).
    let (s4, fourth) = qd.post("/v1/queues/q/jobs", &body);
    assert_eq!((s4, &fourth["id"]), (200, &first["id"]));
}

#[test]
fn bad_requests_get_clear_errors_and_change_nothing() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "ok.sh", "cat > /dev/null");
    let qd = Qd::start(&format!(
        "max_payload = \"1KiB\"\n{}",
        queue("q", &prog, "")
    ));
    let (status, err) = qd.post_raw("/v1/queues/q/jobs", b"{\"payload\": ");
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("invalid JSON"),
        "{err}"
    );
    let (status, err) = qd.post("/v1/queues/nope/jobs", &json!({ "payload": "x" }));
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (404, Some("unknown_queue")),
        "{err}"
    );
    let (status, err) = qd.post("/v1/queues/q/jobs", &json!({ "payload": "x".repeat(2000) }));
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (413, Some("payload_too_large")),
        "{err}"
    );
    // A body declared far over the limit is refused before it is uploaded.
    let head = format!(
        "POST /v1/queues/q/jobs HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 5242880\r\n\r\n",
        qd.api.trim_start_matches("http://")
    );
    let status_line = raw_request(&qd.api, head.as_bytes());
    assert!(status_line.starts_with("HTTP/1.1 413"), "{status_line}");
    let (status, err) = qd.get("/v1/jobs/not-a-uuid");
    assert_eq!(status, 400, "{err}");
    let (status, _) = qd.get("/v1/jobs/01939a4e-0000-7000-8000-000000000000");
    assert_eq!(status, 404);
    let metrics = qd.scrape();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("qd_jobs_enqueued_total{") && !l.ends_with(" 0")),
        "a refused request enqueued something:\n{metrics}"
    );
    // Each refused enqueue counts once, by what refused it: the malformed body, the
    // unknown queue (as `unknown`), the payload over max_payload and the body
    // declared over the limit.
    let rejected = |queue: &str, reason: &str| {
        metric(
            &metrics,
            "qd_enqueue_rejected_total",
            &[("queue", queue), ("reason", reason)],
        )
    };
    assert_eq!(
        (
            rejected("q", "bad_request"),
            rejected("unknown", "bad_request"),
            rejected("q", "payload_too_large"),
        ),
        (1.0, 1.0, 2.0),
        "{metrics}"
    );
}

/// A JSON payload reaches the worker as the producer wrote it (a big integer is not
/// rounded to a float, keys keep their order), and so a different payload under the
/// same key is a conflict, not a duplicate.
#[test]
fn a_json_payload_is_neither_altered_nor_a_false_duplicate() {
    let qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    let sent = r#"{"order":18446744073709551617,"b":1,"a":2}"#;
    let body = |payload: &str| format!(r#"{{"payload": {payload}, "idempotency_key": "k"}}"#);
    let (status, answer) = qd.post_raw("/v1/queues/ext/jobs", body(sent).as_bytes());
    assert_eq!(status, 202, "{answer}");
    let job = common::lease_one(&qd, "ext", "w", "5s").expect("a lease");
    assert_eq!(job["payload"].as_str(), Some(sent), "{job}");
    let other = r#"{"order":18446744073709551618,"b":1,"a":2}"#;
    let (status, answer) = qd.post_raw("/v1/queues/ext/jobs", body(other).as_bytes());
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "idempotency_conflict", "{answer}");
}

#[test]
fn escaped_payloads_count_decoded_bytes_at_the_max_payload_boundary() {
    const MAX: usize = 64 * 1024;
    let qd = Qd::start("max_payload = \"64KiB\"\n[queues.q]\nexecutor = { kind = \"external\" }\n");
    // Each case: a JSON payload field of `n` decoded bytes, escaped as Python's
    // json.dumps does (`\u00e9`: 6 bytes for 2) or at worst (`\u0001`: 6 for 1).
    let e_acute = |n: usize| format!("\"{}\"", "\\u00e9".repeat(n / 2) + &"a".repeat(n % 2));
    let control = |n: usize| format!("\"{}\"", "\\u0001".repeat(n));
    let base64 = |n: usize| {
        use base64::Engine as _;
        format!(
            "\"{}\"",
            base64::engine::general_purpose::STANDARD.encode(vec![0xffu8; n])
        )
    };
    let cases: [(&str, &dyn Fn(usize) -> String); 3] = [
        ("payload", &e_acute),
        ("payload", &control),
        ("payload_b64", &base64),
    ];
    for (field, encode) in cases {
        let body = format!("{{\"{field}\":{}}}", encode(MAX));
        let (status, answer) = qd.post_raw("/v1/queues/q/jobs", body.as_bytes());
        assert_eq!(status, 202, "{} body bytes: {answer}", body.len());
        let id = answer["id"].as_str().expect("id");
        assert_eq!(qd.job(id)["payload_bytes"], MAX, "decoded size kept");

        let body = format!("{{\"{field}\":{}}}", encode(MAX + 1));
        let (status, answer) = qd.post_raw("/v1/queues/q/jobs", body.as_bytes());
        assert_eq!(status, 413, "{answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(
            message.contains(&(MAX + 1).to_string()) && message.contains(&MAX.to_string()),
            "names the payload size and max_payload: {message}"
        );
    }
}

#[test]
fn broken_configs_are_refused_by_check_config_and_by_run() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&fixtures).expect("fixtures") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let first = std::fs::read_to_string(&path).expect("fixture");
        let expect = first
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .and_then(|l| l.split(" -- ").next())
            .expect("fixture names its expected key path")
            .trim()
            .to_string();
        let check = std::process::Command::new(common::qd_bin())
            .arg("check-config")
            .arg(&path)
            .output()
            .expect("check-config");
        let stderr = String::from_utf8_lossy(&check.stderr);
        assert_eq!(check.status.code(), Some(1), "{}: {stderr}", path.display());
        if expect != "-" {
            assert!(
                stderr.contains(&expect),
                "{}: expected {expect:?} in {stderr}",
                path.display()
            );
        }
        let run = std::process::Command::new(common::qd_bin())
            .args(["run", "--config"])
            .arg(&path)
            .output()
            .expect("run");
        assert_eq!(
            run.status.code(),
            Some(64),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&run.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} broken configs checked");
    let good = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/qd.toml");
    let ok = std::process::Command::new(common::qd_bin())
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("check");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// Sends raw bytes to the API and returns the response's status line (5 s bound).
fn raw_request(api: &str, bytes: &[u8]) -> String {
    use std::io::{Read, Write};
    let addr = api.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream.write_all(bytes).expect("write");
    let mut buf = [0u8; 256];
    let n = stream
        .read(&mut buf)
        .expect("the answer comes without the body being sent");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn json_bodies_are_read_whatever_their_content_type_as_curl_sends_them() {
    let qd = Qd::start("[queues.hooks]\nexecutor = { kind = \"external\" }\n");
    let id = qd.enqueue("hooks", "hello hook");
    let body = r#"{"worker_id": "w1", "max_jobs": 1}"#;
    let head = format!(
        "POST /v1/queues/hooks/leases HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        qd.api.trim_start_matches("http://"),
        body.len()
    );
    let status_line = raw_request(&qd.api, head.as_bytes());
    assert!(status_line.starts_with("HTTP/1.1 200"), "{status_line}");
    assert_eq!(qd.job(&id)["state"], "leased");
}

/// A daemon with one external queue `q`, configured and not started.
fn unstarted() -> Qd {
    let dir = tempfile::tempdir().expect("tempdir");
    Qd::configure(
        dir,
        "[queues.q]\nexecutor = { kind = \"external\" }\n",
        "3s",
    )
}

/// The port of a harness URL (`http://127.0.0.1:PORT[/path]`).
fn port_of(url: &str) -> u16 {
    let tail = url.trim_start_matches("http://127.0.0.1:");
    let port = tail.split('/').next().and_then(|p| p.parse().ok());
    port.expect("a port")
}

/// The first start of `qd` failed to bind its API and the retry serves.
fn assert_started_again(qd: &Qd) {
    assert!(
        qd.logs().contains("cannot listen on api_listen"),
        "the first start failed to bind:\n{}",
        qd.logs()
    );
    let id = qd.enqueue("q", "hello");
    assert_eq!(qd.job(&id)["state"], "ready");
}

/// The harness's own guard: a port taken between its pick and qd's bind makes qd
/// exit 1 ("cannot listen on api_listen"); the harness must not take another
/// process's answer on that port for this daemon's, and starts it on fresh ports.
#[test]
fn a_daemon_whose_api_port_was_taken_is_started_again_on_fresh_ports() {
    let mut qd = unstarted();
    let taken = qd.api.clone();
    let squatter =
        std::net::TcpListener::bind(("127.0.0.1", port_of(&taken))).expect("take the port");
    qd.spawn(&[]);
    assert_ne!(qd.api, taken, "the daemon moved to a fresh port");
    assert_started_again(&qd);
    drop(squatter);
}

/// Two port picks one after the other can return the same port: the metrics
/// exporter binds it first and the API cannot; the retry must give each its own.
#[test]
fn a_daemon_configured_with_one_port_for_api_and_metrics_is_moved_onto_two() {
    let mut qd = unstarted();
    let text = std::fs::read_to_string(&qd.config)
        .expect("config")
        .replace(
            &format!("127.0.0.1:{}\"", port_of(&qd.metrics)),
            &format!("127.0.0.1:{}\"", port_of(&qd.api)),
        );
    std::fs::write(&qd.config, text).expect("write config");
    qd.spawn(&[]);
    assert_ne!(port_of(&qd.api), port_of(&qd.metrics), "two ports now");
    assert_started_again(&qd);
    let scrape = ureq::get(&qd.metrics).call().expect("scrape");
    assert_eq!(scrape.status(), 200);
}
