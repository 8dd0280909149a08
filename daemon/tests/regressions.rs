//! Regression tests for defects found by breaking qd on purpose, through the real
//! binary. Each test names the behaviour that used to fail:
//! - an external worker's throttled nack with a huge `retry_after` crashed the Broker
//!   (a `Duration` overflow) or paused the shared rate limiter for centuries;
//! - `qctl enqueue --delay` skipped the 365-day bound the HTTP API enforces, so a
//!   typo like `500000000000y` parked a job at the end of time;
//! - a scale-down followed at once by a scale-up (`qctl workers set` twice) started
//!   a worker under the name of one still finishing its long poll: the WorkerPool
//!   crashed, its running job was killed and charged `lease_expired`.

mod common;

use std::time::Duration;

use common::{Qd, lease_one, ok, script, wait_for};
use serde_json::json;

#[test]
fn a_huge_throttled_retry_after_is_clamped_to_a_day_and_does_not_crash_the_broker() {
    let qd = Qd::start(
        "[rate_limiters.shared]\nper_second = 100\nburst = 10\n\n\
         [queues.a]\nexecutor = { kind = \"external\" }\nrate_limiter = \"shared\"\n",
    );
    let id = qd.enqueue("a", "x");
    let job = lease_one(&qd, "a", "w", "5s").expect("lease");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/nack"),
        &json!({ "token": job["token"], "kind": "throttled", "retry_after": 1.5e19 }),
    );
    assert_eq!(status, 200, "nack: {body}");
    let job = qd.job(&id);
    let field = |k: &str| job[k].as_i64().expect("a time in ms");
    let wait_ms = field("ready_at") - field("updated_at");
    assert!(
        (86_400_000..=2 * 86_400_000).contains(&wait_ms),
        "retry_after is clamped to one day (plus jitter): {job}"
    );
    assert_eq!(
        job["attempts"], 0,
        "a throttled attempt is not charged: {job}"
    );
    assert!(!qd.logs().contains("panicked"), "{}", qd.logs());
    let (status, body) = qd.post("/v1/queues/a/jobs", &json!({ "payload": "y" }));
    assert_eq!(status, 202, "the broker still answers: {body}");
}

#[test]
fn qctl_enqueue_refuses_a_delay_past_a_year_like_the_http_api() {
    let qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    let out = qd.qctl(&[
        "enqueue",
        "ext",
        "--payload",
        "x",
        "--delay",
        "500000000000y",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("delay must be at most 365 days"),
        "{stderr}"
    );
    let out = qd.qctl(&["enqueue", "ext", "--payload", "x", "--delay", "1h"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn shrinking_and_regrowing_a_pool_at_once_keeps_its_running_job_and_the_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = script(dir.path(), "slow.sh", "cat > /dev/null\nsleep 3\n");
    // One attempt only: a job charged for the pool's crash would be dead at once.
    let qd = Qd::start(&format!(
        "[queues.pool]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         workers = {{ min = 2, max = 2 }}\nmax_attempts = 1\nlease = \"4s\"\nheartbeat = \"1s\"\n",
        prog.display()
    ));
    let id = qd.enqueue("pool", "x");
    wait_for("the job to run", Duration::from_secs(10), || {
        (qd.job(&id)["state"] == "leased").then_some(())
    });
    // The idle worker is in its long poll when told to stop; the new one must not
    // take its place before it has.
    ok(&qd, &["workers", "set", "pool", "--min", "1", "--max", "1"]);
    ok(&qd, &["workers", "set", "pool", "--min", "2", "--max", "2"]);
    let job = qd.wait_final(&id, Duration::from_secs(30));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(common::outcomes(&job), ["succeeded"], "{job}");
    let logs = qd.logs();
    assert!(!logs.contains("already registered"), "{logs}");
    let status = ok(&qd, &["status"]);
    let pool = status
        .lines()
        .find(|l| l.starts_with("worker_pool"))
        .unwrap_or_default();
    assert!(pool.ends_with(" 0"), "no pool restart: {status}");
    // The pool works on at its new size.
    let next = qd.enqueue("pool", "y");
    assert_eq!(
        qd.wait_final(&next, Duration::from_secs(30))["state"],
        "succeeded"
    );
}
