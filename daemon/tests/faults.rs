//! Resource, start-up and clock faults, through the real `qd` binary:
//! - disk full (a data dir on a 2 MiB tmpfs): enqueue fails with 507 `store_full`
//!   (or 503) and a clear message, accepted jobs stay intact, and qd recovers once the
//!   tmpfs is grown;
//! - an unusable data dir and a corrupt database make qd refuse to start, non-zero,
//!   with a message naming the problem;
//! - wall-clock jumps of a live daemon (`QD_TEST_WALL_OFFSET_FILE`, see `clock.rs`),
//!   forward and back, neither expire live leases nor freeze delayed jobs;
//! - a full disk never charges a job: with workers running and jobs ready on a full
//!   8 MiB tmpfs, acks wait (the lease kept), leasing stops, `qd_store_writable` is 0,
//!   and once space returns every job succeeds at its first attempt;
//! - jobs picked for a lease request that waits out a full disk still count as
//!   ready (`qctl queues`, `qd_queue_depth`, the oldest ready age);
//! - random request bodies never get a 5xx and never bring qd down.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Qd, qd_bin, script};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

/// A tmpfs mounted on a directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a `size` tmpfs on `dir`; `None` (with the reason) when we may not mount.
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(Tmpfs(dir.to_path_buf()))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn resize(&self, size: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "remount {} to {size}", self.0.display());
    }
}

impl Drop for Tmpfs {
    /// Unmounts, then removes the temp dir the mount point is in: the test's `Qd`,
    /// dropped first, could not remove it while the tmpfs was mounted inside.
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

/// Enqueues `size`-byte jobs into `queue` until one is refused; returns the ids
/// accepted and the refusal. More than `most` accepted means the disk never filled.
fn fill(qd: &Qd, queue: &str, size: usize, most: usize) -> (Vec<String>, (u16, Value)) {
    let payload = "x".repeat(size);
    let mut accepted = Vec::new();
    loop {
        let (status, body) = qd.post(
            &format!("/v1/queues/{queue}/jobs"),
            &json!({ "payload": payload }),
        );
        if status != 202 {
            return (accepted, (status, body));
        }
        accepted.push(body["id"].as_str().expect("id").to_string());
        assert!(
            accepted.len() < most,
            "the tmpfs took {most} jobs of {size} bytes"
        );
    }
}

fn lease_all(qd: &Qd, queue: &str, n: usize) -> Vec<Value> {
    let mut jobs = Vec::new();
    while jobs.len() < n {
        let (status, body) = qd.post(
            &format!("/v1/queues/{queue}/leases"),
            &json!({ "worker_id": "w", "max_jobs": 100, "wait": "5s" }),
        );
        assert_eq!(status, 200, "{body}");
        let got = body["jobs"].as_array().expect("jobs").clone();
        assert!(!got.is_empty(), "only {} of {n} jobs leasable", jobs.len());
        jobs.extend(got);
    }
    jobs
}

#[test]
fn a_full_disk_refuses_enqueues_clearly_keeps_accepted_jobs_and_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let Some(tmpfs) = tmpfs_or_skip(&data, "2m") else {
        return;
    };
    let mut qd = Qd::configure(
        dir,
        "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_depth = 100000\n",
        "5s",
    );
    qd.spawn(&[]);
    let (mut accepted, (status, body)) = fill(&qd, "ext", 60 * 1024, 200);
    println!("disk full after {} jobs: {status} {body}", accepted.len());
    assert!(status == 507 || status == 503, "{status} {body}");
    if status == 507 {
        assert_eq!(body["error"]["code"], "store_full", "{body}");
    }
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("full"), "{body}");
    assert!(!accepted.is_empty(), "nothing fitted on the tmpfs");
    for id in &accepted {
        assert_eq!(qd.job(id)["state"], "ready", "accepted job damaged");
    }

    tmpfs.resize("64m");
    let later = common::wait_for("enqueue to succeed again", LONG, || {
        let (status, body) = qd.post("/v1/queues/ext/jobs", &json!({ "payload": "after" }));
        (status == 202).then(|| body["id"].as_str().expect("id").to_string())
    });
    accepted.push(later);
    for job in lease_all(&qd, "ext", accepted.len()) {
        let (status, body) = qd.post(
            &format!("/v1/jobs/{}/ack", job["id"].as_str().expect("id")),
            &json!({ "token": job["token"] }),
        );
        assert_eq!(status, 200, "{body}");
    }
    for id in &accepted {
        assert_eq!(qd.job(id)["state"], "succeeded");
    }
    qd.kill9();
}

/// Runs `qd run` on `config` and returns (exit code, stderr+stdout).
fn run_expecting_failure(config: &Path) -> (i32, String) {
    let mut child = Command::new(qd_bin())
        .args(["run", "--config"])
        .arg(config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn qd");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("qd started although it should have refused");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (out.status.code().unwrap_or(-1), text)
}

const ANY_QUEUE: &str = "[queues.q]\nexecutor = { kind = \"external\" }\n";

#[test]
fn qd_refuses_to_start_on_an_unusable_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A file where the data directory should be.
    std::fs::write(dir.path().join("data"), "not a directory").expect("file");
    let qd = Qd::configure(dir, ANY_QUEUE, "1s");
    let (code, text) = run_expecting_failure(&qd.config);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("data"),
        "message does not name the data dir: {text}"
    );

    // A data dir under /proc, where nothing can be created.
    let dir = tempfile::tempdir().expect("tempdir");
    let qd = Qd::configure(dir, ANY_QUEUE, "1s");
    let config = std::fs::read_to_string(&qd.config).expect("config");
    let data_line = config
        .lines()
        .find(|l| l.starts_with("data_dir"))
        .expect("data_dir");
    let config = config.replace(data_line, "data_dir = \"/proc/self/qd-data\"");
    std::fs::write(&qd.config, config).expect("rewrite");
    let (code, text) = run_expecting_failure(&qd.config);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("/proc/self/qd-data"),
        "message does not name the path: {text}"
    );
}

#[test]
fn qd_refuses_to_start_on_a_corrupt_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let garbage: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(data.join("qd.db"), garbage).expect("garbage db");
    let qd = Qd::configure(dir, ANY_QUEUE, "1s");
    let (code, text) = run_expecting_failure(&qd.config);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("qd.db"),
        "message does not name the database: {text}"
    );
}

#[test]
fn wall_clock_jumps_neither_expire_live_leases_nor_freeze_delayed_jobs() {
    let work = tempfile::tempdir().expect("tempdir");
    let offset = work.path().join("wall-offset-ms");
    std::fs::write(&offset, "0").expect("offset");
    let prog = script(work.path(), "sleep2.sh", "cat >/dev/null; sleep 2");
    let offset_env = offset.display().to_string();
    let qd = Qd::start_with(
        &format!(
            "[queues.run]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
             lease = \"2s\"\nheartbeat = \"500ms\"\nworkers = {{ min = 1, max = 1 }}\n\
             [queues.ext]\nexecutor = {{ kind = \"external\" }}\nlease = \"3s\"\nheartbeat = \"1s\"\n",
            prog.display()
        ),
        &[("QD_TEST_WALL_OFFSET_FILE", &offset_env)],
    );
    let hour = 3_600_000i64;
    // A live lease (external, no heartbeat) taken before the jumps.
    let held = qd.enqueue("ext", "held");
    let (_, body) = qd.post(
        "/v1/queues/ext/leases",
        &json!({ "worker_id": "w", "wait": "5s" }),
    );
    let lease = body["jobs"][0].clone();
    assert_eq!(lease["id"], held.as_str(), "{body}");
    // A running command job with heartbeats, and two delayed jobs.
    let running = qd.enqueue("run", "r");
    let soon = qd.enqueue_json("run", json!({ "payload": "soon", "delay": "1s" }));
    let later = qd.enqueue_json("ext", json!({ "payload": "later", "delay": "2s" }));
    common::wait_for("the command job to start", LONG, || {
        (qd.job(&running)["state"] == "leased").then_some(())
    });

    std::fs::write(&offset, (10 * hour).to_string()).expect("jump forward");
    std::thread::sleep(Duration::from_millis(600));
    std::fs::write(&offset, (-10 * hour).to_string()).expect("jump back");
    std::thread::sleep(Duration::from_millis(600));
    // The daemon's wall clock really did jump: a job created now is stamped 10 h back.
    let probe = qd.enqueue_json("ext", json!({ "payload": "probe", "delay": "1h" }));
    let stamped = qd.job(&probe)["created_at"].as_i64().expect("created_at");
    let before = qd.job(&held)["created_at"].as_i64().expect("created_at");
    assert!(
        before - stamped > 9 * hour,
        "the offset file was not honoured"
    );

    // 1.2 s in, both jumps done: the 3 s lease is still live and acks.
    let (status, body) = qd.post(
        &format!("/v1/jobs/{held}/ack"),
        &json!({ "token": lease["token"] }),
    );
    assert_eq!(status, 200, "a wall jump expired a live lease: {body}");
    // Delayed jobs become due on time although wall time went back 10 h.
    let job = qd.wait_final(&soon, Duration::from_secs(20));
    assert_eq!(job["history"].as_array().map(Vec::len), Some(1), "{job}");
    let (_, body) = qd.post(
        "/v1/queues/ext/leases",
        &json!({ "worker_id": "w", "wait": "10s" }),
    );
    assert_eq!(
        body["jobs"][0]["id"],
        later.as_str(),
        "delayed job frozen: {body}"
    );
    let job = qd.wait_final(&running, Duration::from_secs(20));
    assert_eq!(job["state"], "succeeded", "{job}");
    let outcomes = common::outcomes(&job);
    assert_eq!(
        outcomes,
        ["succeeded"],
        "the running job's lease expired: {job}"
    );
}

fn body_strategy() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        Just("payload"),
        Just("payload_b64"),
        Just("tenant"),
        Just("idempotency_key"),
        Just("delay"),
        Just("max_attempts"),
        Just("worker_id"),
        Just("max_jobs"),
        Just("wait"),
        Just("token"),
        Just("extend"),
        Just("error"),
        Just("kind"),
        Just("retry_after"),
        Just("x"),
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| if f.is_finite() {
            format!("{f:e}")
        } else {
            "1e999".into()
        }),
        "[ -~]{0,12}".prop_map(|s| json!(s).to_string()),
        Just("null".to_string()),
        Just("[]".to_string()),
        Just("{\"a\":[1,{}]}".to_string()),
        Just("\"99999999999h\"".to_string()),
        Just("-1".to_string()),
    ];
    let object = prop::collection::vec((field, value), 0..5).prop_map(|kv| {
        let inner: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", inner.join(",")).into_bytes()
    });
    prop_oneof![object, prop::collection::vec(any::<u8>(), 0..64)]
}

#[test]
fn random_request_bodies_get_4xx_never_5xx_and_qd_stays_up() {
    let qd = Qd::start(
        "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"2s\"\nheartbeat = \"500ms\"\n",
    );
    let id = qd.enqueue("ext", "a job to ack and nack");
    let paths = [
        "/v1/queues/ext/jobs".to_string(),
        "/v1/queues/ext/leases".to_string(),
        format!("/v1/jobs/{id}/heartbeat"),
        format!("/v1/jobs/{id}/ack"),
        format!("/v1/jobs/{id}/nack"),
    ];
    let mut runner = TestRunner::new(PropConfig {
        cases: 300,
        ..PropConfig::default()
    });
    runner
        .run(&(0..paths.len(), body_strategy()), |(p, body)| {
            let (status, answer) = qd.post_raw(&paths[p], &body);
            prop_assert!(
                status < 500,
                "{} {:?} -> {status} {answer}",
                paths[p],
                String::from_utf8_lossy(&body)
            );
            Ok(())
        })
        .expect("no 5xx");
    let (status, _) = qd.get("/healthz");
    assert_eq!(status, 200);
}

/// A tmpfs of `size` on `dir`, or `None` after printing a visible skip; under
/// `CI=true` a tmpfs that cannot be mounted fails the test instead (CI runs as root).
fn tmpfs_or_skip(dir: &Path, size: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(dir, size) {
        Ok(t) => Some(t),
        Err(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("cannot mount a tmpfs under CI=true: {reason}")
        }
        Err(reason) => {
            // Written past the harness's capture, so the skip shows in a passing run.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {}: cannot mount a tmpfs (needs root): {reason}",
                std::thread::current().name().unwrap_or("test")
            );
            None
        }
    }
}

fn store_writable(qd: &Qd) -> Option<f64> {
    qd.scrape()
        .lines()
        .find_map(|l| l.strip_prefix("qd_store_writable "))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_full_disk_charges_no_attempt_and_every_job_runs_once_space_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("work dir");
    let Some(tmpfs) = tmpfs_or_skip(&dir.path().join("data"), "8m") else {
        return;
    };
    let (go, runs) = (work.path().join("go"), work.path().join("runs"));
    let prog = script(
        work.path(),
        "wait.sh",
        &format!(
            "cat >/dev/null; echo \"$QD_JOB_ID\" >> {runs}; \
             while [ ! -e {go} ]; do sleep 0.05; done",
            runs = runs.display(),
            go = go.display()
        ),
    );
    let mut qd = Qd::configure(
        dir,
        &format!(
            "[queues.work]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
             workers = {{ min = 2, max = 2 }}\nlease = \"1s\"\nheartbeat = \"250ms\"\n\
             max_attempts = 2\nmax_depth = 100000\n",
            prog.display()
        ),
        "5s",
    );
    qd.spawn(&[]);
    let (accepted, (status, _)) = fill(&qd, "work", 8 * 1024, 2000);
    assert!(status == 507 || status == 503, "disk full answers {status}");
    assert!(
        accepted.len() > 2,
        "too few jobs fitted: {}",
        accepted.len()
    );
    assert_eq!(
        store_writable(&qd),
        Some(0.0),
        "the gauge shows the refusal"
    );

    // The running attempts finish while the disk is still full: their acks cannot be
    // written; nothing may be charged while several lease periods pass.
    std::fs::write(&go, b"").expect("release the workers");
    std::thread::sleep(Duration::from_secs(4));
    tmpfs.resize("64m");
    for id in &accepted {
        let job = qd.wait_final(id, LONG);
        assert_eq!(job["state"], "succeeded", "{job}");
        assert_eq!(job["attempts"], 1, "{job}");
        assert_eq!(common::history(&job), ["succeeded"], "{job}");
    }
    common::wait_for("qd_store_writable back to 1", LONG, || {
        (store_writable(&qd) == Some(1.0)).then_some(())
    });
    let started = std::fs::read_to_string(&runs).expect("runs");
    assert_eq!(started.lines().count(), accepted.len(), "each job ran once");
    let logs = qd.logs();
    assert!(
        logs.contains("keeping the lease and retrying"),
        "the acks met the full disk (else this test proved nothing)"
    );
    qd.kill9();
}

fn depth_gauge(qd: &Qd, queue: &str, state: &str) -> f64 {
    common::metric(
        &qd.scrape(),
        "qd_queue_depth",
        &[("queue", queue), ("state", state)],
    )
}

#[test]
fn jobs_picked_for_a_lease_parked_by_a_full_disk_still_count_as_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let Some(tmpfs) = tmpfs_or_skip(&data, "2m") else {
        return;
    };
    let mut qd = Qd::configure(
        dir,
        "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_depth = 100000\n",
        "5s",
    );
    qd.spawn(&[]);
    let mut accepted: Vec<String> = (0..20).map(|_| qd.enqueue("ext", "job")).collect();
    // Take every byte left (not even qd's probe write fits), then meet it.
    let mut filler = std::fs::File::create(data.join("filler")).expect("filler");
    while std::io::Write::write_all(&mut filler, &[0; 4096]).is_ok() {}
    let (more, (status, _)) = fill(&qd, "ext", 1024, 1000);
    assert!(status == 507 || status == 503, "disk full answers {status}");
    accepted.extend(more);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(store_writable(&qd), Some(0.0), "the store refuses writes");

    // A lessee asks for every job: the Scheduler picks them, the Broker parks the
    // request until the store takes writes again.
    let lessee = std::thread::scope(|s| {
        let lease = s.spawn(|| {
            qd.post(
                "/v1/queues/ext/leases",
                &json!({ "worker_id": "w", "max_jobs": 1000, "wait": "1s" }),
            )
        });
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !lease.is_finished(),
            "the lease waits for the store: {:?}",
            lease.is_finished().then(|| store_writable(&qd))
        );
        let n = accepted.len() as u64;
        common::wait_for(
            "the parked jobs in the ready gauge",
            Duration::from_secs(10),
            || (depth_gauge(&qd, "ext", "ready") == n as f64).then_some(()),
        );
        let queues = common::json_of(&qd, &["queues"]);
        let ext = &queues["queues"][0];
        assert_eq!(ext["ready"], n, "{queues}");
        let age = ext["oldest_ready_age_secs"].as_f64().unwrap_or(0.0);
        assert!(age >= 1.5, "the oldest parked job's age: {queues}");
        let age = common::metric(
            &qd.scrape(),
            "qd_queue_oldest_ready_age_seconds",
            &[("queue", "ext")],
        );
        assert!(age >= 1.5, "the oldest ready age gauge: {age}");
        tmpfs.resize("64m");
        lease.join().expect("lease thread")
    });
    let (status, body) = lessee;
    assert_eq!(status, 200, "{body}");
    qd.kill9();
}
