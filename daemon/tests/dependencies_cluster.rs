//! Job dependencies (`after`) on several qd nodes sharing one PostgreSQL database:
//! a child released on one node is leased on another; two parents of one child
//! acked at the same moment on two nodes release it (no lost wake-up); and a
//! fan-in on three nodes, one of them killed with `SIGKILL` mid-run and started
//! again, runs its finisher exactly once, after every parent, and leaves nothing
//! waiting. The single-node scenarios run on PostgreSQL in
//! `dependencies_postgres.rs`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use common::pg::{self, Database};
use common::{Qd, ack, lease_one, wait_for};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

/// `[daemon]` keys of node `i`: a dead node is noticed within 2 s.
fn node_keys(i: usize) -> String {
    format!("node_name = \"node-{i}\"\nnode_timeout = \"2s\"\npoll_interval = \"500ms\"\n")
}

fn start_cluster(db: &Database, n: usize, body: &str) -> Vec<Qd> {
    (0..n)
        .map(|i| {
            let mut qd = Qd::configure_node(db, &node_keys(i), body);
            qd.spawn(&[]);
            qd
        })
        .collect()
}

/// An external-worker queue whose jobs run once (a failed one is dead).
const ONCE: &str =
    "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_attempts = 1\nlease = \"60s\"\n";

fn after(qd: &Qd, payload: &str, parents: &[&str]) -> String {
    qd.enqueue_json("ext", json!({ "payload": payload, "after": parents }))
}

fn state(qd: &Qd, id: &str) -> String {
    qd.job(id)["state"].as_str().unwrap_or_default().to_owned()
}

fn count(db: &Database, sql: &str) -> usize {
    db.psql(sql).trim().parse().expect("a count")
}

/// A lease on `qd` that must be the job with `payload`.
fn lease_expecting(qd: &Qd, payload: &str) -> Value {
    let job = wait_for(payload, LONG, || lease_one(qd, "ext", "w", "2s"));
    assert_eq!(job["payload"], payload, "{job}");
    job
}

#[test]
fn a_child_released_on_one_node_is_leased_on_another_and_on_the_releasing_node() {
    let Some(db) = pg::database() else { return };
    let nodes = start_cluster(&db, 2, ONCE);
    // Released on node 0 (its parent acked there), leased on node 1.
    let a = nodes[0].enqueue("ext", "a");
    let b = after(&nodes[0], "b", &[&a]);
    let job = lease_expecting(&nodes[0], "a");
    ack(&nodes[0], &job);
    assert_eq!(state(&nodes[1], &b), "ready", "ready in the ack's commit");
    let job = lease_expecting(&nodes[1], "b");
    ack(&nodes[1], &job);
    // Enqueued on node 1, released by an ack on node 0, leased on node 0.
    let c = nodes[1].enqueue("ext", "c");
    let d = after(&nodes[1], "d", &[&c]);
    let job = lease_expecting(&nodes[1], "c");
    ack(&nodes[0], &job);
    let job = lease_expecting(&nodes[0], "d");
    ack(&nodes[0], &job);
    assert_eq!(state(&nodes[1], &d), "succeeded");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM qd_jobs WHERE state <> 'succeeded'"
        ),
        0
    );
}

#[test]
fn two_parents_acked_at_the_same_moment_on_two_nodes_release_their_child() {
    const ROUNDS: usize = 15;
    let Some(db) = pg::database() else { return };
    let nodes = Arc::new(start_cluster(&db, 2, ONCE));
    for round in 0..ROUNDS {
        let p1 = nodes[0].enqueue("ext", "p1");
        let p2 = nodes[1].enqueue("ext", "p2");
        let child = after(&nodes[round % 2], "child", &[&p1, &p2]);
        let first = wait_for("a parent", LONG, || lease_one(&nodes[0], "ext", "w0", "2s"));
        let second = wait_for("the other parent", LONG, || {
            lease_one(&nodes[1], "ext", "w1", "2s")
        });
        let mut leased = [first["payload"].clone(), second["payload"].clone()];
        leased.sort_by_key(Value::to_string);
        assert_eq!(leased, [json!("p1"), json!("p2")], "round {round}");
        // Both acks leave at once, each to the node that leased its job or, in
        // odd rounds, to the other node (the any-node path).
        let barrier = Arc::new(Barrier::new(2));
        let acks: Vec<_> = [(0, first), (1, second)]
            .into_iter()
            .map(|(n, job)| {
                let (nodes, barrier) = (nodes.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    ack(&nodes[(n + round) % 2], &job);
                })
            })
            .collect();
        for a in acks {
            a.join().expect("ack");
        }
        let job = lease_expecting(&nodes[(round + 1) % 2], "child");
        assert_eq!(job["id"], child.as_str());
        ack(&nodes[round % 2], &job);
    }
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM qd_jobs WHERE state = 'succeeded'"
        ),
        ROUNDS * 3
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM qd_job_edges WHERE state <> 'met'"
        ),
        0
    );
}

/// Requests of the fan-in's workers: each goes to the next live node; a node
/// killed under a request sends it on to the next one, as a load balancer
/// retries a refused connection.
struct Nodes {
    apis: RwLock<Vec<String>>,
    dead: Vec<AtomicBool>,
    next: AtomicUsize,
    agent: ureq::Agent,
}

impl Nodes {
    fn new(nodes: &[Qd]) -> Self {
        Nodes {
            apis: RwLock::new(nodes.iter().map(|q| q.api.clone()).collect()),
            dead: nodes.iter().map(|_| AtomicBool::new(false)).collect(),
            next: AtomicUsize::new(0),
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(LONG))
                .build()
                .into(),
        }
    }

    /// The answer's status and body, and whether an earlier try reached a node
    /// that died before answering (the request may have applied there).
    fn post(&self, path: &str, body: &Value) -> (u16, Value, bool) {
        let mut retried = false;
        for _ in 0..1000 {
            let n = self.next.fetch_add(1, Ordering::Relaxed) % self.dead.len();
            if self.dead[n].load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(5));
                continue;
            }
            let api = self.apis.read().expect("apis")[n].clone();
            match self.agent.post(format!("{api}{path}")).send_json(body) {
                Ok(mut resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.body_mut().read_to_string().unwrap_or_default();
                    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    return (status, body, retried);
                }
                Err(_) => retried = true,
            }
        }
        panic!("no node answered {path}");
    }
}

#[test]
fn a_fan_in_on_three_nodes_with_one_killed_mid_run_runs_its_finisher_once_after_every_parent() {
    const PARENTS: usize = 300;
    const WORKERS: usize = 4;
    let Some(db) = pg::database() else { return };
    // A lease whose answer died with its node expires by its stored end (10 s)
    // and runs again: attempts enough for that, retried at once. Ten seconds is
    // far more than a lease waits for its ack on a busy machine.
    let body = "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"10s\"\nheartbeat = \"3s\"\n\
                max_attempts = 10\nbackoff = { base = \"100ms\", max = \"200ms\" }\n";
    let mut nodes = start_cluster(&db, 3, body);
    let batch = json!({
        "jobs": (0..PARENTS).map(|i| json!({ "payload": format!("p{i}") })).collect::<Vec<_>>()
    });
    let (status, resp) = nodes[0].post("/v1/queues/ext/jobs/batch", &batch);
    assert_eq!(status, 202, "{resp}");
    let parents: Vec<String> = resp["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["id"].as_str().expect("id").to_owned())
        .collect();
    let refs: Vec<&str> = parents.iter().map(String::as_str).collect();
    let finisher = after(&nodes[1], "finisher", &refs);
    assert_eq!(state(&nodes[2], &finisher), "waiting");

    let lb = Arc::new(Nodes::new(&nodes));
    let acked = Arc::new(AtomicUsize::new(0));
    // Each time a worker got the finisher: how many parents had succeeded then.
    let finisher_runs: Arc<Mutex<Vec<usize>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (lb, acked, runs, done) = (
                lb.clone(),
                acked.clone(),
                finisher_runs.clone(),
                done.clone(),
            );
            let (db, finisher, refused) = (db.clone(), finisher.clone(), refused.clone());
            thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(300);
                while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let (status, answer, _) = lb.post(
                        "/v1/queues/ext/leases",
                        &json!({"worker_id": format!("w{w}"), "max_jobs": 4, "wait": "1s"}),
                    );
                    if status != 200 {
                        // A node starting again may answer 503 for a moment.
                        thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    for job in answer["jobs"].as_array().cloned().unwrap_or_default() {
                        let id = job["id"].as_str().expect("id");
                        if id == finisher {
                            let succeeded = count(
                                &db,
                                &format!(
                                    "SELECT count(*) FROM qd_jobs WHERE state = 'succeeded' \
                                     AND id <> '{finisher}'"
                                ),
                            );
                            runs.lock().expect("lock").push(succeeded);
                        }
                        let ack = json!({"token": job["token"]});
                        let path = format!("/v1/jobs/{id}/ack");
                        let (mut status, mut body, mut retried) = lb.post(&path, &ack);
                        // The killed node's backend may still hold the job's row
                        // inside its unfinished transaction until PostgreSQL
                        // notices; an ack meeting it is refused and retried, as a
                        // client retries a 503.
                        while status == 503 && body["error"]["code"] == "store_error" {
                            refused.fetch_add(1, Ordering::Relaxed);
                            thread::sleep(Duration::from_millis(200));
                            let again = lb.post(&path, &ack);
                            (status, body) = (again.0, again.1);
                            retried |= again.2;
                        }
                        assert!(
                            status == 200 || (retried && status == 409),
                            "ack of {id}: {status} {body}"
                        );
                        if id == finisher {
                            done.store(true, Ordering::Relaxed);
                        } else {
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    wait_for("a third of the parents acked", LONG * 2, || {
        (acked.load(Ordering::Relaxed) >= PARENTS / 3).then_some(())
    });
    lb.dead[2].store(true, Ordering::Relaxed);
    nodes[2].kill9();
    let at_kill = acked.load(Ordering::Relaxed);
    wait_for("more acks through the other nodes", LONG * 2, || {
        (acked.load(Ordering::Relaxed) >= at_kill + PARENTS / 6).then_some(())
    });
    nodes[2].spawn(&[]);
    lb.apis.write().expect("apis")[2] = nodes[2].api.clone();
    lb.dead[2].store(false, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let runs = finisher_runs.lock().expect("lock").clone();
    // A refusal needs an ack racing a transaction the kill cut short: a few at
    // most, never a steady stream.
    let refused = refused.load(Ordering::Relaxed);
    assert!(refused <= WORKERS * 2, "{refused} acks refused 503");
    assert_eq!(
        runs,
        vec![PARENTS],
        "the finisher reached a worker once, after every parent succeeded"
    );
    assert_eq!(
        db.psql(&format!(
            "SELECT state || ' ' || deps_unmet || ' ' || deps_broken FROM qd_jobs \
             WHERE id = '{finisher}'"
        )),
        "succeeded 0 0"
    );
    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT count(*) FROM qd_history WHERE job_id = '{finisher}' \
                 AND outcome = 'succeeded'"
            )
        ),
        1,
        "the finisher succeeded once"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM qd_jobs WHERE state = 'succeeded'"
        ),
        PARENTS + 1
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM qd_jobs WHERE state IN ('waiting', 'blocked')"
        ),
        0,
        "nothing stays waiting"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM qd_job_edges WHERE state = 'met'"),
        PARENTS
    );
}
