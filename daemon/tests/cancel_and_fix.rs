//! Stopping a running job and fixing a dead job's data, through the real `qd` and
//! `qctl` binaries: `qctl jobs cancel` of a leased job (a command's process group
//! gets SIGTERM, an external lessee's heartbeat and ack get 409 `cancelled`) and
//! `qctl dlq redrive ID --payload-file FILE`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Qd, alive, fails, history, json_of, lease_one, ok, script, wait_for};
use serde_json::{Value, json};

/// An external-worker queue: jobs stay ready until leased over HTTP.
const EXTERNAL: &str = "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_attempts = 3\n";

/// The uid qctl runs as, as the daemon names the operator (`uid N`).
fn my_uid() -> String {
    let out = std::process::Command::new("id")
        .arg("-u")
        .output()
        .expect("id -u");
    format!("uid {}", String::from_utf8_lossy(&out.stdout).trim())
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The last history entry of a job.
fn last_entry(job: &Value) -> &Value {
    job["history"]
        .as_array()
        .and_then(|h| h.last())
        .expect("a history entry")
}

#[test]
fn cancel_of_a_running_command_job_terminates_its_process_group_and_never_retries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marks = dir.path();
    // The program starts a `sleep` grandchild of qd, records both pids, and notes
    // SIGTERM when it arrives; the payload "quick" succeeds at once.
    let prog = script(
        marks,
        "runner.sh",
        &format!(
            "read p\nif [ \"$p\" = quick ]; then exit 0; fi\n\
             trap 'echo term > {m}/term; exit 143' TERM\n\
             sleep 300 &\necho $! > {m}/child.pid\necho $$ > {m}/leader.pid\nwait\n",
            m = marks.display()
        ),
    );
    // Heartbeats and the lease are far longer than the test: the stop comes from
    // the cancel, not from a lost lease.
    let qd = Qd::start(&format!(
        "[queues.cmd]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         workers = {{ min = 1, max = 1 }}\nheartbeat = \"60s\"\nlease = \"120s\"\n\
         kill_grace = \"5s\"\nmax_attempts = 5\n",
        prog.display()
    ));
    let id = qd.enqueue("cmd", "slow");
    let child = wait_for("the sleep grandchild", Duration::from_secs(30), || {
        read_pid(&marks.join("child.pid"))
    });
    let leader = wait_for("the script's pid", Duration::from_secs(10), || {
        read_pid(&marks.join("leader.pid"))
    });
    assert!(alive(child) && alive(leader));
    assert_eq!(qd.job(&id)["state"], "leased");

    let out = ok(&qd, &["jobs", "cancel", &id]);
    assert!(out.contains("leased"), "{out}");
    wait_for("the grandchild to be gone", Duration::from_secs(20), || {
        (!alive(child) && !alive(leader)).then_some(())
    });
    assert!(
        marks.join("term").exists(),
        "the group got SIGTERM first, not only SIGKILL"
    );

    let job = qd.wait_final(&id, Duration::from_secs(10));
    assert_eq!(job["state"], "cancelled", "{job}");
    assert_eq!(history(&job), ["cancelled"], "{job}");
    let entry = last_entry(&job);
    let worker = entry["worker"].as_str().unwrap_or_default();
    assert!(worker.starts_with("cmd/"), "{job}");
    let detail = entry["error"].as_str().unwrap_or_default();
    assert!(detail.contains(&my_uid()), "{job}");

    // The worker goes on to its next job, and the cancelled one never runs again.
    let next = qd.enqueue("cmd", "quick");
    assert_eq!(
        qd.wait_final(&next, Duration::from_secs(30))["state"],
        "succeeded"
    );
    let job = qd.job(&id);
    assert_eq!(job["state"], "cancelled");
    assert_eq!(history(&job), ["cancelled"], "no retry: {job}");
    let logs = qd.logs();
    assert!(
        logs.contains("jobs_cancel") && logs.contains(r#"before="leased""#),
        "audited: {logs}"
    );
}

#[test]
fn cancel_of_an_external_lease_answers_its_heartbeat_and_ack_409_cancelled() {
    let qd = Qd::start(EXTERNAL);
    let id = qd.enqueue("ext", "work");
    let leased = lease_one(&qd, "ext", "remote-1", "5s").expect("a lease");
    let token = leased["token"].clone();

    let answer = json_of(&qd, &["jobs", "cancel", &id]);
    assert_eq!(answer["previous_state"], "leased", "{answer}");

    for call in ["heartbeat", "ack"] {
        let (status, body) = qd.post(&format!("/v1/jobs/{id}/{call}"), &json!({ "token": token }));
        assert_eq!(status, 409, "{call}: {body}");
        assert_eq!(body["error"]["code"], "stale_token", "{call}: {body}");
        assert_eq!(body["error"]["state"], "cancelled", "{call}: {body}");
    }
    let job = qd.job(&id);
    assert_eq!(job["state"], "cancelled", "{job}");
    assert_eq!(history(&job), ["cancelled"], "{job}");
    assert_eq!(last_entry(&job)["worker"], "remote-1", "{job}");
    assert!(
        lease_one(&qd, "ext", "remote-1", "1s").is_none(),
        "no retry"
    );

    let err = fails(&qd, &["jobs", "cancel", &id], 1);
    assert!(err.contains("is cancelled"), "{err}");
}

/// `N bytes (sha256 HEX)`, as history and the audit log describe a payload.
fn summary(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{} bytes (sha256 {hex})", bytes.len())
}

/// A command queue `fix` whose program records each payload it ran in `ran` and
/// fails permanently (exit 65) unless the payload is `good`.
fn fixable(dir: &Path, extra: &str) -> Qd {
    let prog = script(
        dir,
        "picky.sh",
        &format!(
            "p=$(cat)\necho \"$p\" >> {ran}\nif [ \"$p\" = good ]; then exit 0; fi\n\
             echo \"bad data: $p\" >&2\nexit 65\n",
            ran = dir.join("ran").display()
        ),
    );
    Qd::start(&format!(
        "{extra}[queues.fix]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n",
        prog.display()
    ))
}

#[test]
fn a_dead_job_redriven_with_a_fixed_payload_runs_the_new_bytes_and_records_the_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let qd = fixable(dir.path(), "");
    let id = qd.enqueue_json(
        "fix",
        json!({ "payload": "bad", "idempotency_key": "order-7" }),
    );
    assert_eq!(qd.wait_final(&id, Duration::from_secs(30))["state"], "dead");

    let file = dir.path().join("fixed.txt");
    std::fs::write(&file, "good").expect("write the fix");
    let file_arg = file.to_str().expect("utf-8 path");
    let out = ok(&qd, &["dlq", "redrive", &id, "--payload-file", file_arg]);
    assert!(out.contains("moved 1 of 1"), "{out}");

    let job = qd.wait_final(&id, Duration::from_secs(30));
    assert_eq!(job["state"], "succeeded", "{job}");
    let ran = std::fs::read_to_string(dir.path().join("ran")).expect("ran");
    assert_eq!(ran, "bad\ngood\n", "the new bytes ran");
    assert_eq!(
        history(&job),
        ["permanent", "redriven", "succeeded"],
        "{job}"
    );
    let detail = job["history"][1]["error"].as_str().unwrap_or_default();
    for part in [my_uid(), summary(b"bad"), summary(b"good")] {
        assert!(detail.contains(&part), "{part} in {detail}");
    }
    assert_eq!(ok(&qd, &["jobs", "payload", &id]), "good");
    let shown = json_of(&qd, &["jobs", "show", &id]);
    assert_eq!(
        shown["idempotency_key"], "order-7",
        "the key stays: {shown}"
    );
    let logs = qd.logs();
    assert!(
        logs.contains("dlq_redrive") && logs.contains(&summary(b"good")),
        "audited: {logs}"
    );
}

#[test]
fn payload_file_takes_exactly_one_id_and_at_most_max_payload_changing_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let qd = fixable(dir.path(), "max_payload = \"1KiB\"\n");
    let id = qd.enqueue("fix", "bad");
    let other = qd.enqueue("fix", "also bad");
    for job in [&id, &other] {
        assert_eq!(qd.wait_final(job, Duration::from_secs(30))["state"], "dead");
    }
    let file = dir.path().join("fix.txt");
    std::fs::write(&file, "good").expect("write");
    let file_arg = file.to_str().expect("utf-8 path");
    for args in [
        &["dlq", "redrive", &id, &other, "--payload-file", file_arg][..],
        &[
            "dlq",
            "redrive",
            "--queue",
            "fix",
            "--payload-file",
            file_arg,
        ],
        &["dlq", "redrive", "--all", "--payload-file", file_arg],
        &["dlq", "redrive", "--payload-file", file_arg],
    ] {
        fails(&qd, args, 2);
    }

    std::fs::write(&file, vec![b'x'; 2048]).expect("write");
    let err = fails(&qd, &["dlq", "redrive", &id, "--payload-file", file_arg], 1);
    assert!(
        err.contains("2048 bytes") && err.contains("max_payload"),
        "{err}"
    );

    for job in [&id, &other] {
        let job = qd.job(job);
        assert_eq!(job["state"], "dead", "{job}");
        assert_eq!(history(&job), ["permanent"], "{job}");
    }
    assert_eq!(ok(&qd, &["jobs", "payload", &id]), "bad");
    let ran = std::fs::read_to_string(dir.path().join("ran")).expect("ran");
    assert_eq!(ran.lines().count(), 2, "nothing ran again: {ran}");
}

#[test]
fn payload_file_on_a_finished_job_names_its_state_not_an_unknown_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let qd = fixable(dir.path(), "");
    let id = qd.enqueue("fix", "good");
    assert_eq!(
        qd.wait_final(&id, Duration::from_secs(30))["state"],
        "succeeded"
    );
    let file = dir.path().join("fix.txt");
    std::fs::write(&file, "other").expect("write");
    let file_arg = file.to_str().expect("utf-8 path");
    let err = fails(&qd, &["dlq", "redrive", &id, "--payload-file", file_arg], 1);
    assert!(
        err.contains("(conflict)") && err.contains("is succeeded, not dead"),
        "{err}"
    );
    let unknown = "01a2368a-f59e-700d-9b84-2671e10c7254";
    let err = fails(
        &qd,
        &["dlq", "redrive", unknown, "--payload-file", file_arg],
        1,
    );
    assert!(
        err.contains("(not_found)") && err.contains("unknown job"),
        "{err}"
    );
    assert_eq!(
        ok(&qd, &["jobs", "payload", &id]),
        "good",
        "nothing changed"
    );
}
