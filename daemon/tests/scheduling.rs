//! Fair scheduling, concurrency caps, backpressure and shared rate limits, tested
//! through the real `qd` binary (issue 4). Jobs measure themselves: command jobs
//! append `TENANT JOB_ID START_NS END_NS` (from `date +%s%N`) to a file, and
//! concurrency is counted by the jobs with a `flock`-protected counter file.
//!
//! The tests take one lock so they never run at the same time: on a 2-core machine
//! two daemons running jobs side by side would disturb each other's timings.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Qd, ack, metric, percentile, script, wait_for};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs the tests of this file one at a time (see the module docs).
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wall clock in nanoseconds, the same clock as the jobs' `date +%s%N`.
fn now_ns() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(d.as_nanos()).expect("fits i64")
}

fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
}

/// A job that records `TENANT JOB_ID START_NS END_NS PAYLOAD` after sleeping `sleep`.
fn recorder(dir: &Path, sleep: &str) -> (PathBuf, PathBuf) {
    let out = dir.join("runs");
    let prog = script(
        dir,
        "record.sh",
        &format!(
            "p=$(cat)\ns=$(date +%s%N)\nsleep {sleep}\ne=$(date +%s%N)\necho \"$QD_TENANT $QD_JOB_ID $s $e $p\" >> {}",
            out.display()
        ),
    );
    (prog, out)
}

/// A job that counts itself in `DIR/TENANT.PAYLOAD.count` under `flock` while it
/// sleeps `sleep`, appending every count it reaches to `DIR/TENANT.PAYLOAD.seen`.
fn counter(dir: &Path, sleep: &str) -> PathBuf {
    let d = dir.display();
    script(
        dir,
        "count.sh",
        &format!(
            r#"p=$(cat)
c={d}/$QD_TENANT.$p.count
bump() {{ flock 9; n=$(( $(cat "$c" 2>/dev/null || echo 0) + $1 )); echo "$n" > "$c"; }}
( bump 1; echo "$n" >> {d}/$QD_TENANT.$p.seen ) 9>>"$c.lock"
sleep {sleep}
( bump -1 ) 9>>"$c.lock""#
        ),
    )
}

/// The highest count the jobs of `tenant` with `payload` saw, and how many started.
fn seen(dir: &Path, tenant: &str, payload: &str) -> (u32, usize) {
    let text =
        std::fs::read_to_string(dir.join(format!("{tenant}.{payload}.seen"))).unwrap_or_default();
    let counts: Vec<u32> = text
        .lines()
        .map(|l| l.trim().parse().expect("count"))
        .collect();
    (counts.iter().copied().max().unwrap_or(0), counts.len())
}

/// One recorded run of a job.
#[derive(Clone, Debug)]
struct Run {
    tenant: String,
    id: String,
    start: i64,
    end: i64,
}

fn runs(out: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Run {
                tenant: f[0].into(),
                id: f[1].into(),
                start: f[2].parse().expect("start ns"),
                end: f[3].parse().expect("end ns"),
            }
        })
        .collect()
}

/// Waits until `out` records `n` runs; returns them.
fn wait_runs(out: &Path, n: usize, timeout: Duration) -> Vec<Run> {
    wait_for(&format!("{n} recorded runs"), timeout, || {
        let r = runs(out);
        (r.len() >= n).then_some(r)
    })
}

/// An HTTP client that also shows response headers (the harness's does not).
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// Enqueues `n` jobs of `tenant` on `queue` from 4 threads (so the store's group
/// commit batches them); returns the ids.
fn enqueue_many(qd: &Qd, queue: &str, tenant: &str, payload: &str, n: usize) -> Vec<String> {
    let url = format!("{}/v1/queues/{queue}/jobs", qd.api);
    let threads = 4;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let url = url.clone();
                s.spawn(move || {
                    let agent = agent();
                    (t..n)
                        .step_by(threads)
                        .map(|_| {
                            let mut resp = agent
                                .post(&url)
                                .send_json(json!({ "tenant": tenant, "payload": payload }))
                                .expect("enqueue");
                            let body: Value = resp.body_mut().read_json().expect("json");
                            assert_eq!(resp.status().as_u16(), 202, "enqueue: {body}");
                            body["id"].as_str().expect("id").to_string()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("enqueue thread"))
            .collect()
    })
}

/// Enqueues one job; returns (status, Retry-After header, body).
fn try_enqueue(qd: &Qd, queue: &str, tenant: &str) -> (u16, Option<String>, Value) {
    let body = json!({ "tenant": tenant, "payload": "x" });
    qd.post_as(&format!("/v1/queues/{queue}/jobs"), &body, None)
}

/// Leases up to `max` jobs from an external queue without waiting.
fn lease(qd: &Qd, queue: &str, max: u32) -> Vec<Value> {
    lease_waiting(qd, queue, max, "0s")
}

/// Leases up to `max` jobs of `queue`, waiting up to a second for the first.
fn lease_within(qd: &Qd, queue: &str, max: u32) -> Vec<Value> {
    lease_waiting(qd, queue, max, "1s")
}

/// Leases up to `max` jobs of `queue`, waiting up to `wait` for the first.
fn lease_waiting(qd: &Qd, queue: &str, max: u32, wait: &str) -> Vec<Value> {
    let (status, body) = qd.post(
        &format!("/v1/queues/{queue}/leases"),
        &json!({ "worker_id": "test", "max_jobs": max, "wait": wait }),
    );
    assert_eq!(status, 200, "lease: {body}");
    body["jobs"].as_array().expect("jobs").clone()
}

/// Runs qctl and insists it succeeded.
fn qctl_ok(qd: &Qd, args: &[&str]) -> Output {
    let out = qd.qctl(args);
    assert!(
        out.status.success(),
        "qctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// `qctl queues --json`: the named queue's row.
fn queue_info(qd: &Qd, queue: &str) -> Value {
    queue_row(&qctl_ok(qd, &["queues", "--json"]).stdout, queue)
}

/// The named queue's row of `qctl queues --json`'s output.
fn queue_row(json: &[u8], queue: &str) -> Value {
    let v: Value = serde_json::from_slice(json).expect("qctl json");
    let list = v["queues"].as_array().or(v.as_array()).expect("queue list");
    list.iter()
        .find(|q| q["name"] == queue)
        .cloned()
        .expect("queue listed")
}

/// Waits until `queue` has `n` workers. A `qctl queues` that fails meanwhile (on a
/// machine so busy that the daemon does not answer in time) is asked again, and
/// the last failure is shown if the wait times out.
fn wait_workers(qd: &Qd, queue: &str, n: u64) {
    let mut last = String::new();
    let start = Instant::now();
    while start.elapsed() < LONG {
        let out = qd.qctl(&["queues", "--json"]);
        if out.status.success() {
            if queue_row(&out.stdout, queue)["workers_total"].as_u64() == Some(n) {
                return;
            }
        } else {
            last = String::from_utf8_lossy(&out.stdout).into_owned();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {n} workers on {queue}; last qctl failure: {last}");
}

/// What one seed-scenario run measured.
struct Seed {
    /// From resuming the queue to the end of A's last job, seconds.
    a_completion: f64,
    /// B's waits (enqueue → its job's own start), seconds.
    b_waits: Vec<f64>,
    /// The median run time of one job in this run, seconds.
    job_secs: f64,
}

/// The seed scenario, time-scaled 1 s → 100 ms: A's 500 jobs of 100 ms are queued,
/// and 100 ms after the queue starts B enqueues 10 (if `with_b`); 5 workers.
fn seed_run(with_b: bool) -> Seed {
    let work = tempfile::tempdir().expect("tempdir");
    let (prog, out) = recorder(work.path(), "0.1");
    let qd = Qd::start(&format!(
        "[queues.seed]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = 5, max = 5 }}\n",
        prog.display()
    ));
    wait_workers(&qd, "seed", 5);
    qctl_ok(&qd, &["queue", "pause", "seed"]);
    enqueue_many(&qd, "seed", "a", "a", 500);
    let t0 = now_ns();
    qctl_ok(&qd, &["queue", "resume", "seed"]);
    let mut enqueued = HashMap::new();
    if with_b {
        std::thread::sleep(Duration::from_millis(100));
        for _ in 0..10 {
            let at = now_ns();
            enqueued.insert(
                qd.enqueue_json("seed", json!({"tenant": "b", "payload": "b"})),
                at,
            );
        }
    }
    let all = wait_runs(&out, 500 + enqueued.len(), LONG);
    let a_end = all.iter().filter(|r| r.tenant == "a").map(|r| r.end).max();
    let b_waits = all
        .iter()
        .filter(|r| r.tenant == "b")
        .map(|r| secs(r.start - enqueued[&r.id]))
        .collect();
    let durations: Vec<f64> = all.iter().map(|r| secs(r.end - r.start)).collect();
    Seed {
        a_completion: secs(a_end.expect("A ran") - t0),
        b_waits,
        job_secs: percentile(&durations, 0.5),
    }
}

#[test]
fn a_small_tenant_waits_a_few_job_durations_behind_a_big_backlog_and_costs_it_little() {
    let _serial = serial();
    let alone = seed_run(false);
    let shared = seed_run(true);
    let b_p95 = percentile(&shared.b_waits, 0.95);
    let b_max = percentile(&shared.b_waits, 1.0);
    let slowdown = shared.a_completion / alone.a_completion - 1.0;
    println!(
        "seed scenario (1 s -> 100 ms, 5 workers): B wait p50 {:.3} s, p95 {:.3} s, max {:.3} s; \
         A completion alone {:.2} s, with B {:.2} s ({:+.1}%)",
        percentile(&shared.b_waits, 0.5),
        b_p95,
        b_max,
        alone.a_completion,
        shared.a_completion,
        slowdown * 100.0
    );
    assert_eq!(shared.b_waits.len(), 10);
    // Measured in job durations of the same run, so a busy machine (slower jobs,
    // slower start-up) scales both sides. FIFO would make B wait behind all of A:
    // ~100 job durations (500 jobs / 5 workers). Round robin between two tenants
    // serves B every other slot: its 10th job starts after ~4.5 job durations.
    let b_in_jobs = b_p95 / shared.job_secs;
    assert!(
        b_in_jobs <= 15.0,
        "B's p95 wait is {b_in_jobs:.1} job durations ({b_p95:.3} s)"
    );
    // B adds 10 x 100 ms of work to A's 500 x 100 ms (2%). Quiet 2-core runs
    // measured +4% and +7%; two runs on a loaded machine differ by more than that
    // on their own (+41% once on PostgreSQL with two CPU hogs beside the suite:
    // 16.2 s alone, 22.9 s with B), so the bound is 60%: a scheduler that leaves
    // workers idle for fairness idles them for most of A's backlog (+100% and more).
    assert!(slowdown <= 0.60, "A slowed by {:.1}%", slowdown * 100.0);
}

/// The tenants of the next `n` jobs leased (100 at a time) from an external queue,
/// in dispatch order; each lease is acked.
fn dispatch_order(qd: &Qd, queue: &str, n: usize) -> Vec<String> {
    let mut order = Vec::new();
    while order.len() < n {
        let want = u32::try_from((n - order.len()).min(100)).expect("small");
        let jobs = lease(qd, queue, want);
        assert!(!jobs.is_empty(), "{queue} ran dry after {}", order.len());
        std::thread::scope(|s| {
            for chunk in jobs.chunks(25) {
                s.spawn(move || chunk.iter().for_each(|j| ack(qd, j)));
            }
        });
        order.extend(
            jobs.iter()
                .map(|j| j["tenant"].as_str().expect("tenant").to_string()),
        );
    }
    order
}

fn share(order: &[String], tenant: &str) -> f64 {
    order.iter().filter(|t| *t == tenant).count() as f64 / order.len() as f64
}

#[test]
fn backlogged_tenants_get_shares_in_proportion_to_their_weights_even_after_a_live_change() {
    let _serial = serial();
    let qd = Qd::start(
        "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"10m\"\n\
         [tenants.heavy]\nweight = 3\n[tenants.light]\nweight = 1\n",
    );
    enqueue_many(&qd, "ext", "heavy", "h", 1_700);
    enqueue_many(&qd, "ext", "light", "l", 700);
    // 2,000 dispatches at 3:1 take 1,500 heavy and 500 light: both stay backlogged.
    let order = dispatch_order(&qd, "ext", 2_000);
    let heavy = share(&order, "heavy");
    println!(
        "weights 3:1 over 2000 dispatches: heavy {:.1}%",
        heavy * 100.0
    );
    assert!((heavy - 0.75).abs() <= 0.03, "heavy share {heavy:.3}");

    qctl_ok(
        &qd,
        &["limits", "set", "--tenant", "light", "--weight", "3"],
    );
    // 400 more at 3:3 take 200 of each: both still backlogged (200 left of each).
    let order = dispatch_order(&qd, "ext", 400);
    let heavy = share(&order, "heavy");
    println!(
        "weights 3:3 (live) over 400 dispatches: heavy {:.1}%",
        heavy * 100.0
    );
    assert!(
        (heavy - 0.5).abs() <= 0.05,
        "heavy share after the change {heavy:.3}"
    );
}

#[test]
fn a_capped_tenant_never_exceeds_its_cap_while_others_use_the_free_workers() {
    let _serial = serial();
    let work = tempfile::tempdir().expect("tempdir");
    let prog = counter(work.path(), "0.3");
    let qd = Qd::start(&format!(
        "[queues.capq]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         workers = {{ min = 4, max = 4 }}\n[tenants.capped]\nmax_concurrency = 2\n",
        prog.display()
    ));
    wait_workers(&qd, "capq", 4);
    let mut ids = enqueue_many(&qd, "capq", "capped", "p", 10);
    ids.extend(enqueue_many(&qd, "capq", "free", "p", 10));
    for id in &ids {
        assert_eq!(qd.wait_final(id, LONG)["state"], "succeeded");
    }
    let (capped_max, capped_runs) = seen(work.path(), "capped", "p");
    let (free_max, free_runs) = seen(work.path(), "free", "p");
    println!("cap 2 with 4 workers: capped tenant peaked at {capped_max}, the other at {free_max}");
    assert_eq!((capped_runs, free_runs), (10, 10));
    assert!(capped_max <= 2, "capped tenant ran {capped_max} at once");
    assert_eq!(capped_max, 2, "the capped tenant did use its 2 slots");
    assert!(
        free_max >= 2,
        "the other tenant used only {free_max} workers"
    );
}

#[test]
fn a_cap_set_live_with_qctl_applies_without_a_restart() {
    let _serial = serial();
    let work = tempfile::tempdir().expect("tempdir");
    let prog = counter(work.path(), "0.3");
    let qd = Qd::start(&format!(
        "[queues.live]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
         workers = {{ min = 4, max = 4 }}\n",
        prog.display()
    ));
    wait_workers(&qd, "live", 4);
    for id in enqueue_many(&qd, "live", "t", "before", 8) {
        qd.wait_final(&id, LONG);
    }
    let (before, _) = seen(work.path(), "t", "before");
    assert!(
        before >= 3,
        "uncapped, the tenant ran only {before} at once"
    );

    qctl_ok(
        &qd,
        &["limits", "set", "--tenant", "t", "--max-concurrency", "1"],
    );
    let shown = qctl_ok(&qd, &["limits", "show"]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("override"));
    for id in enqueue_many(&qd, "live", "t", "after", 6) {
        assert_eq!(qd.wait_final(&id, LONG)["state"], "succeeded");
    }
    let (after, runs) = seen(work.path(), "t", "after");
    println!(
        "live cap: {before} at once before, {after} after `qctl limits set --max-concurrency 1`"
    );
    assert_eq!((after, runs), (1, 6));
}

#[test]
fn enqueues_beyond_max_depth_get_429_with_retry_after_and_store_nothing() {
    let _serial = serial();
    let qd = Qd::start(
        "[queues.bp]\nexecutor = { kind = \"external\" }\nmax_depth = 5\n\
         [queues.bpt]\nexecutor = { kind = \"external\" }\n[tenants.small]\nmax_depth = 2\n",
    );
    let full = |text: &str| {
        metric(
            text,
            "qd_enqueue_rejected_total",
            &[("queue", "bp"), ("reason", "queue_full")],
        )
    };
    let before = full(&qd.scrape());
    enqueue_many(&qd, "bp", "default", "x", 5);
    let (status, retry, body) = try_enqueue(&qd, "bp", "default");
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    let retry: u64 = retry.expect("Retry-After").parse().expect("seconds");
    assert!(retry >= 1);
    assert_eq!(
        queue_info(&qd, "bp")["ready"],
        5,
        "the refused job was not stored"
    );
    assert_eq!(full(&qd.scrape()), before + 1.0);

    for job in lease(&qd, "bp", 5) {
        ack(&qd, &job);
    }
    assert_eq!(
        try_enqueue(&qd, "bp", "default").0,
        202,
        "drained: accepted again"
    );

    enqueue_many(&qd, "bpt", "small", "x", 2);
    let (status, retry, body) = try_enqueue(&qd, "bpt", "small");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("tenant_full")),
        "{body}"
    );
    assert!(retry.is_some());
    assert_eq!(
        try_enqueue(&qd, "bpt", "other").0,
        202,
        "other tenants are not refused"
    );
    assert_eq!(queue_info(&qd, "bpt")["ready"], 3);
    let rejected = metric(
        &qd.scrape(),
        "qd_enqueue_rejected_total",
        &[("queue", "bpt"), ("reason", "tenant_full")],
    );
    assert_eq!(rejected, 1.0);
    for job in lease(&qd, "bpt", 10) {
        ack(&qd, &job);
    }
    assert_eq!(try_enqueue(&qd, "bpt", "small").0, 202);
}

#[test]
fn a_shared_rate_limiter_holds_across_two_queues_and_sixteen_workers() {
    let _serial = serial();
    let work = tempfile::tempdir().expect("tempdir");
    let (prog, out) = recorder(work.path(), "0");
    let queue = |name: &str| {
        format!(
            "[queues.{name}]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
             workers = {{ min = 8, max = 8 }}\nrate_limiter = \"shared\"\n",
            prog.display()
        )
    };
    let qd = Qd::start(&format!(
        "{}{}[rate_limiters.shared]\nper_second = 20\nburst = 5\n",
        queue("rl1"),
        queue("rl2")
    ));
    wait_workers(&qd, "rl1", 8);
    wait_workers(&qd, "rl2", 8);
    let ids: Vec<String> = std::thread::scope(|s| {
        let a = s.spawn(|| enqueue_many(&qd, "rl1", "a", "x", 100));
        let b = s.spawn(|| enqueue_many(&qd, "rl2", "b", "x", 100));
        [a, b]
            .into_iter()
            .flat_map(|h| h.join().expect("enqueue thread"))
            .collect()
    });
    wait_runs(&out, 200, LONG);
    // When each job was leased, as the daemon recorded it (Unix ms): the moment the
    // scheduler spent a token. The jobs' own clock readings would add the variable
    // process start-up delay of a busy machine, which bunches starts together.
    let mut leased: Vec<i64> = ids
        .iter()
        .map(|id| {
            let job = qd.job(id);
            job["history"][0]["started_at"]
                .as_i64()
                .unwrap_or_else(|| panic!("lease time of {job}"))
        })
        .collect();
    leased.sort_unstable();
    let span = (leased[199] - leased[0]) as f64 / 1000.0;
    let busiest = |window_ms: i64| {
        leased
            .iter()
            .map(|&t| {
                leased
                    .iter()
                    .filter(|&&l| l >= t && l < t + window_ms)
                    .count()
            })
            .max()
            .expect("leases")
    };
    let (one, two) = (busiest(1_000), busiest(2_000));
    println!(
        "shared limiter 20/s burst 5: 200 leases over {span:.2} s, busiest 1-s window {one}, 2-s window {two}"
    );
    // Tokens alone allow 5 at once, then one per 50 ms: 195 more take 9.75 s. A busy
    // machine can only make this longer.
    assert!(span >= 9.5, "200 jobs leased within {span:.2} s");
    // At most 2 x 20 + burst 5 = 45 tokens in any 2 s. A stalled daemon can hand out
    // the leases of a stall together, so allow 10 more; without the limiter the 16
    // workers lease all 200 in well under 2 s.
    assert!(
        two <= 55,
        "{two} jobs leased within two seconds (busiest second {one})"
    );
}

#[test]
fn a_throttled_result_pauses_the_shared_limiter_and_spends_no_attempt() {
    let _serial = serial();
    let work = tempfile::tempdir().expect("tempdir");
    let d = work.path().display();
    let prog = script(
        work.path(),
        "throttle.sh",
        &format!(
            r#"p=$(cat)
now=$(date +%s%N)
if [ "$p" = throttle ] && [ ! -e {d}/throttled ]; then echo "$now" > {d}/throttled; echo "slow down" >&2; exit 75; fi
echo "$QD_QUEUE $QD_JOB_ID $now $now" >> {d}/runs"#
        ),
    );
    let queue = |name: &str| {
        format!(
            "[queues.{name}]\nexecutor = {{ kind = \"command\", program = \"{}\", \
             exit_codes = {{ throttled = [75], throttle_delay = \"2s\" }} }}\n\
             workers = {{ min = 2, max = 2 }}\nrate_limiter = \"api\"\n",
            prog.display()
        )
    };
    let qd = Qd::start(&format!(
        "{}{}[rate_limiters.api]\nper_second = 50\nburst = 5\n",
        queue("t1"),
        queue("t2")
    ));
    let id = qd.enqueue("t1", "throttle");
    wait_for("the throttled result to be recorded", LONG, || {
        let job = qd.job(&id);
        job["history"]
            .as_array()
            .is_some_and(|h| h.iter().any(|e| e["outcome"] == "throttled"))
            .then_some(())
    });
    let throttled_at: i64 = std::fs::read_to_string(work.path().join("throttled"))
        .expect("marker")
        .trim()
        .parse()
        .expect("ns");
    let others: Vec<String> = (0..3).map(|_| qd.enqueue("t2", "ok")).collect();
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(
        job["attempts"], 1,
        "a throttled result spends no attempt: {job}"
    );
    for other in &others {
        qd.wait_final(other, LONG);
    }
    let all = runs(&work.path().join("runs"));
    let first = all.iter().map(|r| r.start).min().expect("runs");
    let paused = secs(first - throttled_at);
    println!("throttled (2 s): the next job on the shared limiter started {paused:.2} s later");
    assert_eq!(all.len(), 4);
    assert!(
        paused >= 1.8,
        "the limiter handed out a token {paused:.2} s after the throttle"
    );
}

#[test]
fn a_queue_full_of_slow_jobs_never_delays_another_queue() {
    let _serial = serial();
    let work = tempfile::tempdir().expect("tempdir");
    let slow = script(work.path(), "slow.sh", "sleep 3");
    let (fast, out) = recorder(work.path(), "0.05");
    let qd = Qd::start(&format!(
        "[queues.slow]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = 2, max = 2 }}\n\
         [queues.fast]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = 2, max = 2 }}\n",
        slow.display(),
        fast.display()
    ));
    wait_workers(&qd, "fast", 2);
    enqueue_many(&qd, "slow", "default", "x", 20);
    let enqueued: HashMap<String, i64> = (0..10)
        .map(|_| {
            let at = now_ns();
            (qd.enqueue("fast", "x"), at)
        })
        .collect();
    let runs = wait_runs(&out, 10, LONG);
    let worst = runs
        .iter()
        .map(|r| secs(r.start - enqueued[&r.id]))
        .fold(0.0, f64::max);
    let slow_ready = queue_info(&qd, "slow")["ready"].as_u64().expect("ready");
    println!(
        "fast queue beside a slow backlog: worst wait {worst:.3} s ({slow_ready} slow jobs still queued)"
    );
    assert!(slow_ready >= 10, "the slow queue was still backlogged");
    assert!(worst < 2.0, "a fast job waited {worst:.3} s");
}

#[test]
fn a_limiter_retuned_live_applies_at_once_and_an_external_throttle_pauses_it() {
    let _serial = serial();
    let qd = Qd::start(
        "[queues.lim]\nexecutor = { kind = \"external\" }\nrate_limiter = \"l\"\n\
         [rate_limiters.l]\nper_second = 1\nburst = 1\n",
    );
    enqueue_many(&qd, "lim", "default", "x", 80);
    // Waits a moment: on PostgreSQL the tokens come from the database's bucket.
    assert_eq!(lease_within(&qd, "lim", 50).len(), 1, "burst 1");
    assert!(lease(&qd, "lim", 50).is_empty(), "1/s: no second token yet");

    qctl_ok(
        &qd,
        &[
            "limits",
            "set-limiter",
            "l",
            "--per-second",
            "1000",
            "--burst",
            "50",
        ],
    );
    let asked = Instant::now();
    let leased = lease_within(&qd, "lim", 60).len();
    // At 1000/s a token comes back every millisecond while the request is served:
    // on a busy machine (or through PostgreSQL's bucket) that adds a few. More
    // than that would be a second bucket, or the old 1/s rate still in force.
    let refilled = usize::try_from(asked.elapsed().as_millis()).unwrap_or(usize::MAX);
    assert!(
        (50..=53usize.saturating_add(refilled)).contains(&leased),
        "a full bucket of 50 (+ {refilled} ms of refill), got {leased}"
    );
    let shown = String::from_utf8_lossy(&qctl_ok(&qd, &["limits", "show"]).stdout).to_string();
    assert!(shown.contains("l: 1000/s burst 50 (override)"), "{shown}");

    // An external worker's throttled nack pauses the limiter for its retry_after.
    std::thread::sleep(Duration::from_millis(20));
    let job = lease_within(&qd, "lim", 1)
        .pop()
        .expect("a token after 20 ms at 1000/s");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{}/nack", job["id"].as_str().expect("id")),
        &json!({ "token": job["token"], "kind": "throttled", "retry_after": "2s" }),
    );
    assert_eq!(status, 200, "{body}");
    let paused_at = Instant::now();
    assert!(lease(&qd, "lim", 10).is_empty(), "paused");
    let (status, body) = qd.post(
        "/v1/queues/lim/leases",
        &json!({ "worker_id": "test", "max_jobs": 1, "wait": "10s" }),
    );
    let waited = paused_at.elapsed();
    assert_eq!(
        (status, body["jobs"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{body}"
    );
    assert!(
        waited >= Duration::from_millis(1800),
        "paused only {waited:?}"
    );
    assert_eq!(qd.job(job["id"].as_str().expect("id"))["attempts"], 0);

    qctl_ok(&qd, &["limits", "reset", "--limiter", "l"]);
    let shown = String::from_utf8_lossy(&qctl_ok(&qd, &["limits", "show"]).stdout).to_string();
    assert!(shown.contains("l: 1/s burst 1"), "{shown}");
}

#[test]
fn a_reset_override_of_a_tenant_not_in_the_config_no_longer_applies() {
    let _serial = serial();
    let qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"10m\"\n");
    qctl_ok(
        &qd,
        &[
            "limits",
            "set",
            "--tenant",
            "ghost",
            "--max-concurrency",
            "1",
        ],
    );
    enqueue_many(&qd, "ext", "ghost", "g", 3);
    assert_eq!(
        lease(&qd, "ext", 3).len(),
        1,
        "the override caps ghost at 1"
    );

    // Back to the config: [tenants.default] sets no cap, so ghost's other jobs go.
    qctl_ok(&qd, &["limits", "reset", "--tenant", "ghost"]);
    let shown = String::from_utf8_lossy(&qctl_ok(&qd, &["limits", "show"]).stdout).to_string();
    assert!(!shown.contains("ghost"), "{shown}");
    assert_eq!(
        lease(&qd, "ext", 3).len(),
        2,
        "the reset cap still holds ghost's jobs"
    );
}

#[test]
fn a_weight_override_keeps_the_cap_an_unlisted_tenant_inherits_in_its_queue() {
    let _serial = serial();
    let qd = Qd::start(
        "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"10m\"\n\
         tenants.default = { max_concurrency = 1 }\n",
    );
    enqueue_many(&qd, "ext", "x", "x", 3);
    enqueue_many(&qd, "ext", "y", "y", 3);
    let mut tenants: Vec<String> = lease(&qd, "ext", 10)
        .iter()
        .map(|j| j["tenant"].as_str().expect("tenant").to_string())
        .collect();
    tenants.sort();
    assert_eq!(tenants, ["x", "y"], "one each: the queue's default cap");

    // A weight says nothing about the cap: y is still held at 1 in this queue.
    qctl_ok(&qd, &["limits", "set", "--tenant", "y", "--weight", "2"]);
    let leased = lease(&qd, "ext", 10);
    assert!(
        leased.is_empty(),
        "over the cap after a weight change: {leased:?}"
    );
}

#[test]
fn a_depth_override_of_the_default_tenant_bounds_every_unlisted_tenant() {
    let _serial = serial();
    let qd = Qd::start(
        "[queues.ext]\nexecutor = { kind = \"external\" }\n[tenants.listed]\nweight = 1\n",
    );
    qctl_ok(
        &qd,
        &["limits", "set", "--tenant", "default", "--max-depth", "2"],
    );
    enqueue_many(&qd, "ext", "unlisted", "u", 2);
    let (status, retry, body) = try_enqueue(&qd, "ext", "unlisted");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("tenant_full")),
        "{body}"
    );
    assert!(retry.is_some());
    // A tenant with its own table does not inherit [tenants.default].
    enqueue_many(&qd, "ext", "listed", "l", 3);
}

#[test]
fn a_weight_lowered_live_applies_to_the_next_dispatch_not_after_the_old_turn() {
    let _serial = serial();
    let qd = Qd::start(
        "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"10m\"\n\
         [tenants.heavy]\nweight = 1000\n[tenants.light]\nweight = 1\n",
    );
    enqueue_many(&qd, "ext", "heavy", "h", 300);
    enqueue_many(&qd, "ext", "light", "l", 100);
    // heavy's turn starts: 1,000 jobs of credit at weight 1000.
    assert_eq!(dispatch_order(&qd, "ext", 1), ["heavy"]);
    qctl_ok(
        &qd,
        &["limits", "set", "--tenant", "heavy", "--weight", "1"],
    );
    let order = dispatch_order(&qd, "ext", 100);
    let light = share(&order, "light");
    println!(
        "weight 1000 -> 1 mid-turn: light {:.0}% of the next 100",
        light * 100.0
    );
    assert!((light - 0.5).abs() <= 0.05, "light share {light:.2}");
}

#[test]
fn a_throttled_nack_of_a_capped_tenant_lets_no_job_through_the_pause() {
    let _serial = serial();
    let qd = Qd::start(
        "[queues.lim]\nexecutor = { kind = \"external\" }\nlease = \"10m\"\n\
         rate_limiter = \"l\"\n[rate_limiters.l]\nper_second = 1000\nburst = 50\n\
         [tenants.capped]\nmax_concurrency = 1\n",
    );
    enqueue_many(&qd, "lim", "capped", "c", 5);
    // One job: the tenant is then at its cap, so the rest of the request stops there.
    let jobs = lease_within(&qd, "lim", 5);
    assert_eq!(jobs.len(), 1, "capped at 1");
    let job = &jobs[0];
    let (status, body) = qd.post(
        &format!("/v1/jobs/{}/nack", job["id"].as_str().expect("id")),
        &json!({ "token": job["token"], "kind": "throttled", "retry_after": "5s" }),
    );
    assert_eq!(status, 200, "{body}");
    // The cap's slot is free again, but the limiter is paused for 5 s.
    let leased = lease(&qd, "lim", 5);
    assert!(leased.is_empty(), "a job through the pause: {leased:?}");
}
