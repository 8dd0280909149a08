//! Leases under stress, through the real `qd` binary:
//! - a job that outlives its lease with no heartbeat (an external worker that never
//!   calls `/heartbeat`) is redelivered to another worker, and the first worker's late
//!   ack is refused with 409 `stale_token`;
//! - with heartbeats on (qd's own worker, lease 1 s, heartbeat 250 ms) a 3 s job is
//!   not redelivered even while busy-loop processes saturate every CPU;
//! - delayed jobs hold no lease: a delay three times the lease runs the job once.

mod common;

use std::process::{Child, Command};
use std::time::Duration;

use common::{Qd, lease_one, script};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

fn outcomes(job: &Value) -> Vec<&str> {
    job["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|h| h["outcome"].as_str().expect("outcome"))
        .collect()
}

#[test]
fn a_job_outliving_its_lease_without_heartbeats_is_redelivered_and_the_late_ack_is_refused() {
    let qd = Qd::start(
        "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"1s\"\nheartbeat = \"250ms\"\n",
    );
    let id = qd.enqueue("ext", "long work");
    let first = lease_one(&qd, "ext", "slow-worker", "5s").expect("first lease");
    assert_eq!(first["id"], id.as_str());
    assert_eq!(first["attempt"], 1);

    // slow-worker keeps "working" past its 1 s lease and never heartbeats; another
    // worker long-polls and gets the job once the lease has expired.
    let second = lease_one(&qd, "ext", "fast-worker", "10s").expect("redelivery");
    assert_eq!(second["id"], id.as_str());
    assert_eq!(second["attempt"], 2);
    assert_ne!(second["token"], first["token"], "a new fencing token");

    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/ack"),
        &json!({ "token": first["token"] }),
    );
    assert_eq!(status, 409, "the late ack must be refused: {body}");
    assert_eq!(body["error"]["code"], "stale_token", "{body}");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/heartbeat"),
        &json!({ "token": first["token"] }),
    );
    assert_eq!(status, 409, "a late heartbeat cannot steal it back: {body}");

    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/ack"),
        &json!({ "token": second["token"] }),
    );
    assert_eq!(status, 200, "{body}");
    let job = qd.job(&id);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(outcomes(&job), ["lease_expired", "succeeded"]);
}

/// Busy-loop processes, killed on drop.
struct CpuHogs(Vec<Child>);

impl CpuHogs {
    fn spawn(n: usize) -> CpuHogs {
        CpuHogs(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("spawn busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[test]
fn heartbeats_keep_a_long_job_leased_while_the_cpu_is_saturated() {
    let work = tempfile::tempdir().expect("tempdir");
    let runs = work.path().join("runs");
    let prog = script(
        work.path(),
        "long.sh",
        &format!(
            "cat >/dev/null; echo \"$QD_ATTEMPT\" >> {}; sleep 3",
            runs.display()
        ),
    );
    let qd = Qd::start(&format!(
        "[queues.long]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         lease = \"1s\"\nheartbeat = \"250ms\"\ntimeout = \"30s\"\nworkers = {{ min = 2, max = 2 }}\n",
        prog.display()
    ));
    let hogs = CpuHogs::spawn(2 * cpus());
    let ids: Vec<String> = (0..2)
        .map(|i| qd.enqueue("long", &format!("{i}")))
        .collect();
    let jobs: Vec<Value> = ids.iter().map(|id| qd.wait_final(id, LONG)).collect();
    drop(hogs);
    for job in &jobs {
        assert_eq!(job["state"], "succeeded", "{job}");
        assert_eq!(outcomes(job), ["succeeded"], "redelivered: {job}");
    }
    let text = std::fs::read_to_string(&runs).expect("runs");
    assert_eq!(text.lines().collect::<Vec<_>>(), ["1", "1"], "one run each");
    assert!(
        !qd.scrape()
            .lines()
            .any(|l| l.starts_with("qd_leases_expired_total") && !l.ends_with(" 0")),
        "a lease expired under CPU load"
    );
}

#[test]
fn a_delay_longer_than_the_lease_runs_the_job_once() {
    let work = tempfile::tempdir().expect("tempdir");
    let runs = work.path().join("runs");
    let prog = script(
        work.path(),
        "once.sh",
        &format!("cat >/dev/null; echo \"$QD_ATTEMPT\" >> {}", runs.display()),
    );
    let qd = Qd::start(&format!(
        "[queues.later]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         lease = \"1s\"\nheartbeat = \"250ms\"\n\
         [queues.ext]\nexecutor = {{ kind = \"external\" }}\nlease = \"1s\"\nheartbeat = \"250ms\"\n",
        prog.display()
    ));
    let id = qd.enqueue_json("later", json!({ "payload": "x", "delay": "3s" }));
    assert_eq!(qd.job(&id)["state"], "delayed");
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(outcomes(&job), ["succeeded"]);
    let waited = job["history"][0]["started_at"].as_i64().expect("start")
        - job["created_at"].as_i64().expect("created");
    assert!(
        waited >= 2_900,
        "ran {waited} ms after enqueue, before its delay"
    );
    let text = std::fs::read_to_string(&runs).expect("runs");
    assert_eq!(text.lines().count(), 1, "ran more than once: {text}");

    // The same over HTTP: nothing is leasable during the delay, then attempt 1.
    let id = qd.enqueue_json("ext", json!({ "payload": "y", "delay": "2500ms" }));
    assert!(
        lease_one(&qd, "ext", "w", "1s").is_none(),
        "leased while delayed"
    );
    let leased = lease_one(&qd, "ext", "w", "10s").expect("leased once due");
    assert_eq!(
        (leased["id"].as_str(), leased["attempt"].as_u64()),
        (Some(id.as_str()), Some(1))
    );
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/ack"),
        &json!({ "token": leased["token"] }),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(outcomes(&qd.job(&id)), ["succeeded"]);
}
