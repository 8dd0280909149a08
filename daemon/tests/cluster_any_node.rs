//! Several qd nodes on one PostgreSQL database behind a round-robin load balancer:
//! every request goes to the next node in turn, so an external worker's heartbeats,
//! acks and nacks land on nodes other than the one that leased its job. Any node
//! answers any lease, fenced by its token; a lease heartbeated elsewhere does not
//! expire on the node that leased it; a node killed by `SIGKILL` mid-run loses
//! nothing (its external workers' leases stay theirs); `max_depth` and weighted
//! fairness hold for the cluster as a whole.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::pg::{self, Database};
use common::{Qd, metric, wait_for};
use serde_json::{Value, json};

/// `[daemon]` keys of node `i`: a dead node is noticed within 2 s.
fn node_keys(i: usize) -> String {
    format!("node_name = \"node-{i}\"\nnode_timeout = \"2s\"\npoll_interval = \"200ms\"\n")
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

/// A round-robin balancer over `nodes`: each request goes to the next live node.
struct Balancer {
    nodes: Vec<Qd>,
    next: AtomicUsize,
    dead: Vec<AtomicBool>,
    agent: ureq::Agent,
}

/// A balanced request's answer.
struct Answer {
    node: usize,
    status: u16,
    body: Value,
    /// An earlier try reached a node that died before answering: the request
    /// may have applied there (a late ack is then answered stale).
    retried: bool,
}

impl Balancer {
    fn new(nodes: Vec<Qd>) -> Self {
        let dead = nodes.iter().map(|_| AtomicBool::new(false)).collect();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Balancer {
            nodes,
            next: AtomicUsize::new(0),
            dead,
            agent,
        }
    }

    /// POSTs to the next live node; a request the node could not answer (it was
    /// killed meanwhile) goes to the next one, as a balancer retries a refused
    /// connection.
    fn post(&self, path: &str, body: &Value) -> Answer {
        let mut retried = false;
        for _ in 0..100 {
            let n = self.next.fetch_add(1, Ordering::Relaxed) % self.nodes.len();
            if self.dead[n].load(Ordering::Relaxed) {
                continue;
            }
            let qd = &self.nodes[n];
            let answer = self.agent.post(format!("{}{path}", qd.api)).send_json(body);
            match answer {
                Ok(mut resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.body_mut().read_to_string().unwrap_or_default();
                    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    return Answer {
                        node: n,
                        status,
                        body,
                        retried,
                    };
                }
                Err(_) => retried = true,
            }
        }
        panic!("no node answered {path}");
    }
}

/// Jobs per stored state, from the database itself.
fn stored_states(db: &Database) -> HashMap<String, usize> {
    db.psql("SELECT state || ' ' || count(*) FROM qd_jobs GROUP BY state")
        .lines()
        .filter_map(|l| {
            let (state, n) = l.trim().split_once(' ')?;
            Some((state.to_owned(), n.parse().ok()?))
        })
        .collect()
}

/// Outcomes in the database's history, counted.
fn stored_outcomes(db: &Database) -> HashMap<String, usize> {
    db.psql("SELECT outcome || ' ' || count(*) FROM qd_history GROUP BY outcome")
        .lines()
        .filter_map(|l| {
            let (outcome, n) = l.trim().split_once(' ')?;
            Some((outcome.to_owned(), n.parse().ok()?))
        })
        .collect()
}

#[test]
fn reports_to_any_node_apply_fenced_by_their_token_and_never_show_the_current_one() {
    let Some(db) = pg::database() else { return };
    let body = "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"60s\"\n";
    let nodes = start_cluster(&db, 2, body);
    let id = nodes[0].enqueue("ext", "one");
    let job = common::lease_one(&nodes[1], "ext", "w", "5s").expect("a lease on node 1");
    assert_eq!(job["id"], id.as_str(), "{job}");
    let token = job["token"].as_u64().expect("token");
    // A stale token sent to the node that did not lease the job: 409 with the
    // job's state, and the live lease's token appears nowhere in the answer.
    let (status, answer) = nodes[0].post(
        &format!("/v1/jobs/{id}/heartbeat"),
        &json!({"token": token + 7}),
    );
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "stale_token", "{answer}");
    assert_eq!(answer["error"]["state"], "leased", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !message.contains(&format!("lease is {token}")) && !message.contains("is 1,"),
        "{answer}"
    );
    // The right token on the other node: the heartbeat renews the stored lease.
    let (status, answer) = nodes[0].post(
        &format!("/v1/jobs/{id}/heartbeat"),
        &json!({"token": token, "extend": "90s"}),
    );
    assert_eq!(status, 200, "{answer}");
    let stored_left: f64 = db
        .psql(&format!(
            "SELECT extract(epoch FROM lease_end - now()) FROM qd_jobs WHERE id = '{id}'"
        ))
        .trim()
        .parse()
        .expect("a stored lease end");
    assert!(
        stored_left > 75.0,
        "the stored end moved by 90s: {stored_left}"
    );
    // The ack on the other node applies once; the node that leased it is late.
    let (status, answer) = nodes[0].post(&format!("/v1/jobs/{id}/ack"), &json!({"token": token}));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = nodes[1].post(&format!("/v1/jobs/{id}/ack"), &json!({"token": token}));
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["state"], "succeeded", "{answer}");
    assert_eq!(stored_states(&db).get("succeeded"), Some(&1));
    // A batch of acks sent to either node is answered per item there.
    let ids: Vec<String> = (0..4)
        .map(|i| nodes[1].enqueue("ext", &format!("b{i}")))
        .collect();
    let mut leased = Vec::new();
    while leased.len() < ids.len() {
        leased.extend(common::lease_one(&nodes[1], "ext", "w", "5s"));
    }
    let mut acks: Vec<Value> = leased
        .iter()
        .map(|j| json!({"id": j["id"], "token": j["token"]}))
        .collect();
    acks.push(json!({"id": leased[0]["id"], "token": 999}));
    let (status, answer) = nodes[0].post("/v1/acks", &json!({"acks": acks[1..]}));
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert!(results[..3].iter().all(|r| r["ok"] == true), "{answer}");
    assert_eq!(results[3]["error"], "stale_token", "{answer}");
    assert_eq!(results[3]["state"], "leased", "{answer}");
    let (status, answer) = nodes[1].post("/v1/acks", &json!({"acks": [acks[0], acks[1]]}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][0]["ok"], true, "{answer}");
    assert_eq!(answer["results"][1]["state"], "succeeded", "{answer}");
    assert_eq!(stored_states(&db).get("succeeded"), Some(&5));
    // A nack on the node that did not lease the job goes through the retry policy.
    let id = nodes[0].enqueue("ext", "to nack");
    let job = common::lease_one(&nodes[0], "ext", "w", "5s").expect("a lease on node 0");
    assert_eq!(job["id"], id.as_str());
    let (status, answer) = nodes[1].post(
        &format!("/v1/jobs/{id}/nack"),
        &json!({"token": job["token"], "error": "boom", "kind": "permanent"}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(nodes[0].job(&id)["state"], "dead");
}

/// A lease taken on node 0 and heartbeated only through node 1 outlives its own
/// length: node 0's timer asks the store, which node 1's heartbeats moved. Once
/// acked on node 1, node 0 frees its tenant's slot (`max_concurrency = 1`) at its
/// next sweep, so its next lease request gets the tenant's next job.
#[test]
fn a_lease_heartbeated_on_another_node_does_not_expire_and_its_ack_there_frees_the_slot() {
    let Some(db) = pg::database() else { return };
    let body = "[tenants.t]\n\n[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"2s\"\n\
                heartbeat = \"500ms\"\ntenants.t = { max_concurrency = 1 }\n";
    let nodes = start_cluster(&db, 2, body);
    let first = nodes[0].enqueue_json("ext", json!({"payload": "1", "tenant": "t"}));
    let second = nodes[0].enqueue_json("ext", json!({"payload": "2", "tenant": "t"}));
    let job = common::lease_one(&nodes[0], "ext", "w", "5s").expect("a lease on node 0");
    assert_eq!(job["id"], first.as_str(), "{job}");
    let token = job["token"].clone();
    // Three lease lengths, heartbeating through node 1 only.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        let (status, answer) = nodes[1].post(
            &format!("/v1/jobs/{first}/heartbeat"),
            &json!({"token": token}),
        );
        assert_eq!(status, 200, "after {:?}: {answer}", start.elapsed());
        thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(nodes[0].job(&first)["state"], "leased");
    let (status, answer) =
        nodes[1].post(&format!("/v1/jobs/{first}/ack"), &json!({"token": token}));
    assert_eq!(status, 200, "{answer}");
    let asked = Instant::now();
    let next = common::lease_one(&nodes[0], "ext", "w", "10s").expect("the tenant's next job");
    assert_eq!(next["id"], second.as_str(), "{next}");
    assert!(
        asked.elapsed() < Duration::from_secs(8),
        "node 0 freed the slot at a sweep: {:?}",
        asked.elapsed()
    );
    let history = common::outcomes(&nodes[1].job(&first))
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert_eq!(history, ["succeeded"], "no lease expiry was charged");
}

/// External workers behind a round-robin balancer over three nodes: leases,
/// heartbeats, acks, nacks and batch acks each go to the next node. One node is
/// killed by `SIGKILL` mid-run; the workers' leases taken from it stay theirs.
/// Every job succeeds exactly once, no job is held by two workers at once, and
/// every report of a live lease is accepted wherever it lands.
#[test]
fn round_robin_workers_finish_every_job_once_across_a_node_killed_mid_run() {
    const JOBS: usize = 150;
    const WORKERS: usize = 4;
    let Some(db) = pg::database() else { return };
    let body = "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"3s\"\n\
                heartbeat = \"1s\"\nbackoff = { base = \"100ms\", max = \"200ms\" }\n";
    let lb = Arc::new(Balancer::new(start_cluster(&db, 3, body)));
    for i in 0..JOBS {
        let a = lb.post("/v1/queues/ext/jobs", &json!({"payload": format!("{i}")}));
        assert_eq!(a.status, 202, "{}", a.body);
    }
    // Per job: who holds it now (worker, token), and the acks accepted.
    let holding: Arc<Mutex<HashMap<String, (usize, u64)>>> = Arc::default();
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let nacked = Arc::new(Mutex::new(HashSet::<String>::new()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (lb, holding, acked) = (lb.clone(), holding.clone(), acked.clone());
            let (violations, nacked) = (violations.clone(), nacked.clone());
            thread::spawn(move || {
                let mut batch: Vec<Value> = Vec::new();
                // This worker's unreported leases, all heartbeated while it works.
                let mut mine: Vec<(String, Value)> = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(240);
                while acked.lock().expect("lock").len() < JOBS && Instant::now() < deadline {
                    let answer = lb.post(
                        "/v1/queues/ext/leases",
                        &json!({"worker_id": format!("w{w}"), "max_jobs": 2, "wait": "1s"}),
                    );
                    assert_eq!(answer.status, 200, "{}", answer.body);
                    let jobs = answer.body["jobs"].as_array().cloned().unwrap_or_default();
                    for job in &jobs {
                        let id = job["id"].as_str().expect("id").to_owned();
                        let token = job["token"].as_u64().expect("token");
                        mine.push((id.clone(), job["token"].clone()));
                        if let Some((other, t)) =
                            holding.lock().expect("lock").insert(id.clone(), (w, token))
                        {
                            violations.lock().expect("lock").push(format!(
                                "{id}: leased to w{w} (token {token}) while w{other} held token {t}"
                            ));
                        }
                    }
                    for job in jobs {
                        let id = job["id"].as_str().expect("id").to_owned();
                        let token = job["token"].clone();
                        let n: usize = job["payload"]
                            .as_str()
                            .and_then(|p| p.parse().ok())
                            .unwrap_or(0);
                        // Every 10th job outlives its 3 s lease on heartbeats alone
                        // (of every lease the worker holds meanwhile).
                        if n.is_multiple_of(10) {
                            for _ in 0..6 {
                                for (held, token) in &mine {
                                    let a = lb.post(
                                        &format!("/v1/jobs/{held}/heartbeat"),
                                        &json!({"token": token}),
                                    );
                                    assert_eq!(
                                        a.status, 200,
                                        "heartbeat on node {}: {}",
                                        a.node, a.body
                                    );
                                }
                                thread::sleep(Duration::from_millis(700));
                            }
                        }
                        if !n.is_multiple_of(3)
                            || (n.is_multiple_of(7) && !nacked.lock().expect("lock").contains(&id))
                        {
                            mine.retain(|(held, _)| *held != id);
                        }
                        let release = |holding: &Mutex<HashMap<String, (usize, u64)>>| {
                            holding.lock().expect("lock").remove(&id);
                        };
                        // Every 7th job fails its first attempt.
                        if n.is_multiple_of(7) && nacked.lock().expect("lock").insert(id.clone()) {
                            release(&holding);
                            let a = lb.post(
                                &format!("/v1/jobs/{id}/nack"),
                                &json!({"token": token, "error": "first try fails"}),
                            );
                            assert!(
                                a.status == 200 || (a.retried && a.status == 409),
                                "nack on node {}: {}",
                                a.node,
                                a.body
                            );
                            continue;
                        }
                        if n.is_multiple_of(3) {
                            batch.push(json!({"id": id, "token": token}));
                            continue;
                        }
                        release(&holding);
                        let a = lb.post(&format!("/v1/jobs/{id}/ack"), &json!({"token": token}));
                        assert!(
                            a.status == 200 || (a.retried && a.status == 409),
                            "ack on node {}: {}",
                            a.node,
                            a.body
                        );
                        acked.lock().expect("lock").push(id);
                    }
                    if batch.len() >= 3 || (!batch.is_empty() && answer.body["jobs"] == json!([])) {
                        for item in &batch {
                            holding
                                .lock()
                                .expect("lock")
                                .remove(item["id"].as_str().expect("id"));
                        }
                        let a = lb.post("/v1/acks", &json!({"acks": batch}));
                        assert_eq!(a.status, 200, "batch on node {}: {}", a.node, a.body);
                        let results = a.body["results"].as_array().expect("results");
                        for (item, result) in batch.iter().zip(results) {
                            assert!(
                                result["ok"] == true || a.retried,
                                "batch item on node {}: {result}",
                                a.node
                            );
                            acked
                                .lock()
                                .expect("lock")
                                .push(item["id"].as_str().expect("id").to_owned());
                        }
                        batch.clear();
                        mine.clear();
                    }
                }
            })
        })
        .collect();
    wait_for(
        "a third of the jobs acked",
        Duration::from_secs(120),
        || (acked.lock().expect("lock").len() >= JOBS / 3).then_some(()),
    );
    lb.dead[1].store(true, Ordering::Relaxed);
    common::signal(lb.nodes[1].pid(), "KILL");
    for w in workers {
        w.join().expect("worker");
    }
    let acked = acked.lock().expect("lock").clone();
    let unique: HashSet<&String> = acked.iter().collect();
    assert_eq!(unique.len(), acked.len(), "an ack accepted twice");
    assert_eq!(acked.len(), JOBS, "every job acked once");
    assert_eq!(
        stored_states(&db).get("succeeded"),
        Some(&JOBS),
        "nothing lost"
    );
    let violations = violations.lock().expect("lock").clone();
    assert!(
        violations.is_empty(),
        "leased twice at once: {violations:?}"
    );
    let outcomes = stored_outcomes(&db);
    assert_eq!(outcomes.get("succeeded"), Some(&JOBS), "{outcomes:?}");
    // A lease answered by the killed node as it died never reached its worker and
    // expires by its stored end: at most one per worker.
    let expired = outcomes.get("lease_expired").copied().unwrap_or(0);
    assert!(expired <= WORKERS, "{outcomes:?}");
}

/// 150 enqueues alternating between two nodes with `max_depth = 100`: exactly 100
/// accepted, the rest refused `429 queue_full`; then the same from two producers at
/// once. Jobs finished on one node make room on the other.
#[test]
fn max_depth_holds_for_the_cluster_under_alternating_and_concurrent_enqueues() {
    let Some(db) = pg::database() else { return };
    let body = "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_depth = 100\n\n\
                [queues.other]\nexecutor = { kind = \"external\" }\nmax_depth = 100\n";
    let nodes = Arc::new(start_cluster(&db, 2, body));
    let mut accepted = 0;
    for i in 0..150 {
        let (status, answer) =
            nodes[i % 2].post("/v1/queues/ext/jobs", &json!({"payload": format!("{i}")}));
        match status {
            202 => accepted += 1,
            429 => assert_eq!(answer["error"]["code"], "queue_full", "{answer}"),
            _ => panic!("enqueue {i}: {status} {answer}"),
        }
    }
    assert_eq!(accepted, 100);
    // A batch that does not fit is refused whole, naming the first item past it.
    let (status, answer) = nodes[1].post(
        "/v1/queues/ext/jobs/batch",
        &json!({"jobs": [{"payload": "x"}]}),
    );
    assert_eq!(status, 429, "{answer}");
    // Two producers at once on the other queue, one per node.
    let producers: Vec<_> = (0..2)
        .map(|n| {
            let nodes = nodes.clone();
            thread::spawn(move || {
                (0..75)
                    .filter(|i| {
                        let (status, answer) = nodes[n].post(
                            "/v1/queues/other/jobs",
                            &json!({"payload": format!("{n}.{i}")}),
                        );
                        assert!(matches!(status, 202 | 429 | 503), "{status} {answer}");
                        status == 202
                    })
                    .count()
            })
        })
        .collect();
    let both: usize = producers
        .into_iter()
        .map(|p| p.join().expect("producer"))
        .sum();
    assert_eq!(both, 100, "two producers at once");
    let depth: i64 = db
        .psql("SELECT sum(depth) FROM qd_queue_depths WHERE queue = 'other'")
        .trim()
        .parse()
        .expect("the stored depth");
    assert_eq!(depth, 100, "the counter matches the rows");
    // Ten jobs finished through node 0 leave room for ten on node 1.
    for _ in 0..10 {
        let job = common::lease_one(&nodes[0], "ext", "w", "5s").expect("a job");
        common::ack(&nodes[0], &job);
    }
    let more = (0..12)
        .filter(|i| {
            nodes[1]
                .post(
                    "/v1/queues/ext/jobs",
                    &json!({"payload": format!("more {i}")}),
                )
                .0
                == 202
        })
        .count();
    assert_eq!(more, 10);
}

/// Tenant a (weight 3) enqueues only on node 0 and tenant b (weight 1) only on
/// node 1, while external workers lease from both: the leases follow 3:1 within
/// ±10% (each node runs weighted fair queuing over every claimable job it sees,
/// whichever node accepted it).
#[test]
fn weights_hold_within_ten_percent_when_each_tenant_enqueues_on_its_own_node() {
    const PER_TENANT: usize = 400;
    const LEASES: usize = 400;
    let Some(db) = pg::database() else { return };
    let body = "[tenants.a]\nweight = 3\n\n[tenants.b]\nweight = 1\n\n\
                [queues.ext]\nexecutor = { kind = \"external\" }\n";
    let nodes = Arc::new(start_cluster(&db, 2, body));
    for (n, tenant) in ["a", "b"].into_iter().enumerate() {
        for chunk in 0..PER_TENANT / 200 {
            let batch: Vec<_> = (0..200)
                .map(|i| json!({"payload": format!("{tenant} {chunk}.{i}"), "tenant": tenant}))
                .collect();
            let (status, answer) =
                nodes[n].post("/v1/queues/ext/jobs/batch", &json!({"jobs": batch}));
            assert_eq!(status, 202, "{answer}");
        }
    }
    for qd in nodes.iter() {
        wait_for(
            "each node to see both tenants' jobs",
            Duration::from_secs(30),
            || {
                let ready = metric(
                    &qd.scrape(),
                    "qd_queue_depth",
                    &[("queue", "ext"), ("state", "ready")],
                );
                (ready >= (2 * PER_TENANT) as f64).then_some(())
            },
        );
    }
    let tenants: Arc<Mutex<Vec<String>>> = Arc::default();
    let consumers: Vec<_> = (0..4)
        .map(|c| {
            let (nodes, tenants) = (nodes.clone(), tenants.clone());
            thread::spawn(move || {
                let qd = &nodes[c % 2];
                while tenants.lock().expect("lock").len() < LEASES {
                    let (status, body) = qd.post(
                        "/v1/queues/ext/leases",
                        &json!({"worker_id": format!("c{c}"), "max_jobs": 1, "wait": "1s"}),
                    );
                    assert_eq!(status, 200, "{body}");
                    for job in body["jobs"].as_array().expect("jobs") {
                        tenants
                            .lock()
                            .expect("lock")
                            .push(job["tenant"].as_str().expect("tenant").to_owned());
                        let id = job["id"].as_str().expect("id");
                        qd.post(
                            &format!("/v1/jobs/{id}/ack"),
                            &json!({"token": job["token"]}),
                        );
                    }
                }
            })
        })
        .collect();
    for c in consumers {
        c.join().expect("consumer");
    }
    let tenants = tenants.lock().expect("lock").clone();
    let a = tenants[..LEASES].iter().filter(|t| *t == "a").count();
    let b = LEASES - a;
    let ratio = a as f64 / b.max(1) as f64;
    eprintln!("first {LEASES} leases: a {a}, b {b} (weights 3:1, ratio {ratio:.2})");
    assert!(
        (2.7..=3.3).contains(&ratio),
        "a {a} : b {b} (ratio {ratio:.2})"
    );
}
