//! Several qd nodes on one PostgreSQL database (the run's throw-away cluster): they
//! share the work without ever leasing one job twice, find the jobs other nodes
//! accepted, list each other in `qctl status`, and when nodes die (`SIGKILL`) — a
//! follower, then the leader — the survivors take the leader lease, end the dead
//! nodes' leases and finish every job: none lost, no effect applied twice, and no job
//! ran on two nodes at once before a kill.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::pg::{self, Database};
use common::{Qd, script, wait_for};
use serde_json::json;

/// `[daemon]` keys of node `i`: short timeouts so a dead node is noticed within
/// seconds (2 s; heartbeats every 400 ms).
fn node_keys(i: usize) -> String {
    format!("node_name = \"node-{i}\"\nnode_timeout = \"2s\"\npoll_interval = \"200ms\"\n")
}

/// Starts `n` nodes on `db`, node `i` with the queues `body(i)`.
fn start_cluster(db: &Database, n: usize, body: impl Fn(usize) -> String) -> Vec<Qd> {
    (0..n)
        .map(|i| {
            let mut qd = Qd::configure_node(db, &node_keys(i), &body(i));
            qd.spawn(&[]);
            qd
        })
        .collect()
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

/// The name of the node holding the leader lease, once one does.
fn leader(db: &Database) -> String {
    wait_for("a leader", Duration::from_secs(30), || {
        let name = db.psql("SELECT node FROM qd_leader WHERE expires_at > now()");
        Some(name.trim().to_owned()).filter(|n| !n.is_empty())
    })
}

#[test]
fn two_nodes_share_one_queue_find_each_others_jobs_and_never_lease_a_job_twice() {
    const JOBS: usize = 300;
    let Some(db) = pg::database() else { return };
    let body = |_| "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"60s\"\n".to_owned();
    let nodes = Arc::new(start_cluster(&db, 2, body));
    // Every job is enqueued on node 0: node 1 has only what it finds in the store.
    for i in 0..JOBS {
        nodes[0].enqueue("ext", &format!("job {i}"));
    }
    let leased: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (nodes, leased, acked) = (nodes.clone(), leased.clone(), acked.clone());
            thread::spawn(move || {
                let node = w % 2;
                let qd = &nodes[node];
                let start = Instant::now();
                while acked.load(Ordering::Relaxed) < JOBS
                    && start.elapsed() < Duration::from_secs(120)
                {
                    let worker = format!("w{w}");
                    let (status, body) = qd.post(
                        "/v1/queues/ext/leases",
                        &json!({"worker_id": worker, "max_jobs": 4, "wait": "1s"}),
                    );
                    assert_eq!(status, 200, "{body}");
                    for job in body["jobs"].as_array().expect("jobs") {
                        let id = job["id"].as_str().expect("id").to_owned();
                        leased.lock().expect("lock").push((id.clone(), node));
                        let (status, answer) = qd.post(
                            &format!("/v1/jobs/{id}/ack"),
                            &json!({"token": job["token"]}),
                        );
                        assert_eq!(status, 200, "ack of {id} on node {node}: {answer}");
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let leased = leased.lock().expect("lock").clone();
    let distinct: HashSet<&String> = leased.iter().map(|(id, _)| id).collect();
    assert_eq!(
        distinct.len(),
        leased.len(),
        "a job was leased twice (no lease ended without an ack)"
    );
    assert_eq!(leased.len(), JOBS, "every job leased once");
    let on_node1 = leased.iter().filter(|(_, n)| *n == 1).count();
    assert!(
        on_node1 > 0,
        "node 1 never found a job node 0 accepted ({} leases on node 0)",
        JOBS - on_node1
    );
    assert_eq!(stored_states(&db).get("succeeded"), Some(&JOBS));
    let status = nodes[1].qctl(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{text}");
    for name in ["node-0", "node-1 (this node)"] {
        assert!(text.contains(name), "qctl status lists {name}:\n{text}");
    }
    assert_eq!(text.matches("yes (epoch").count(), 1, "one leader:\n{text}");
}

/// The job of the chaos tests: logs its start and end with the node that ran it
/// and applies its effect once per key (`mkdir` is atomic and fails if it exists).
fn chaos_script(dir: &Path) -> std::path::PathBuf {
    script(
        dir,
        "job.sh",
        &format!(
            "K=$QD_IDEMPOTENCY_KEY; N=$1; D={dir}\n\
             echo \"start $K $N $(date +%s%N)\" >> $D/exec.log\n\
             sleep 0.5\n\
             if mkdir $D/effects/$K 2>/dev/null; then echo $K >> $D/applied.log; fi\n\
             echo \"end $K $N $(date +%s%N)\" >> $D/exec.log\n",
            dir = dir.display()
        ),
    )
}

/// Runs `jobs` command jobs on `n` nodes, SIGKILLs the nodes `kill` picks (in
/// order, 1.5 s apart, each given the cluster's nodes and the current leader), and
/// checks the contract on the survivors.
fn chaos(n: usize, jobs: usize, kills: &[fn(&[usize], &str) -> usize]) {
    let Some(db) = pg::database() else { return };
    let work = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(work.path().join("effects")).expect("effects dir");
    let job = chaos_script(work.path());
    let body = |i: usize| {
        format!(
            "[queues.chaos]\nexecutor = {{ kind = \"command\", program = \"{}\", args = [\"node-{i}\"] }}\n\
             workers = {{ min = 4, max = 4 }}\nlease = \"3s\"\nheartbeat = \"1s\"\nmax_attempts = 10\n\
             backoff = {{ base = \"100ms\", max = \"1s\" }}\n",
            job.display()
        )
    };
    let mut nodes = start_cluster(&db, n, body);
    // One batch per node, so every job is accepted before the first kill.
    for (i, qd) in nodes.iter().enumerate() {
        let batch: Vec<_> = (i..jobs)
            .step_by(n)
            .map(|k| json!({"payload": "x", "idempotency_key": format!("k-{k}")}))
            .collect();
        let (status, body) = qd.post("/v1/queues/chaos/jobs/batch", &json!({"jobs": batch}));
        assert_eq!(status, 202, "{body}");
    }
    let mut alive: Vec<usize> = (0..n).collect();
    let mut killed_at = Vec::new();
    for pick in kills {
        thread::sleep(Duration::from_millis(1500));
        let lead = leader(&db);
        let victim = pick(&alive, &lead);
        nodes[victim].kill9();
        killed_at.push(now_ns());
        alive.retain(|i| *i != victim);
    }
    wait_for("every job to succeed", Duration::from_secs(120), || {
        let states = stored_states(&db);
        (states.get("succeeded") == Some(&jobs)).then_some(())
    });
    // Every effect applied exactly once.
    let applied = std::fs::read_to_string(work.path().join("applied.log")).unwrap_or_default();
    let mut seen = HashSet::new();
    for key in applied.lines() {
        assert!(seen.insert(key), "effect of {key} applied twice");
    }
    assert_eq!(seen.len(), jobs, "every job's effect applied");
    // No job ran on two nodes at once before the first kill.
    let log = std::fs::read_to_string(work.path().join("exec.log")).unwrap_or_default();
    let mut runs: HashMap<(String, String), (u128, u128)> = HashMap::new();
    for line in log.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let [what, key, node, at] = parts[..] else {
            continue;
        };
        let at: u128 = at.parse().unwrap_or(0);
        let run = runs
            .entry((key.to_owned(), node.to_owned()))
            .or_insert((at, u128::MAX));
        if what == "end" {
            run.1 = at;
        }
    }
    let first_kill = killed_at[0];
    let mut by_key: HashMap<&str, Vec<(u128, u128, &str)>> = HashMap::new();
    for ((key, node), (start, end)) in &runs {
        by_key.entry(key).or_default().push((*start, *end, node));
    }
    for (key, runs) in by_key {
        for a in &runs {
            for b in &runs {
                let overlap = a.2 != b.2 && a.0 < b.1 && b.0 < a.1;
                let before_kill = a.0 < first_kill && b.0 < first_kill;
                assert!(
                    !(overlap && before_kill),
                    "{key} ran on {} and {} at once before a kill",
                    a.2,
                    b.2
                );
            }
        }
    }
    let survivor = &nodes[alive[0]];
    let status = survivor.qctl(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("dead"),
        "qctl status shows the killed nodes dead:\n{text}"
    );
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

/// The node index of `name` (`node-<i>`).
fn index(name: &str) -> usize {
    name.trim_start_matches("node-").parse().expect("node name")
}

fn the_leader(_: &[usize], leader: &str) -> usize {
    index(leader)
}

fn a_follower(alive: &[usize], leader: &str) -> usize {
    *alive
        .iter()
        .find(|i| **i != index(leader))
        .expect("a follower")
}

#[test]
fn two_nodes_lose_the_leader_and_the_survivor_finishes_every_job_once() {
    chaos(2, 120, &[the_leader]);
}

#[test]
fn three_nodes_lose_a_follower_then_the_leader_and_the_survivor_finishes_every_job_once() {
    chaos(3, 180, &[a_follower, the_leader]);
}
