//! Facts that hold for a cluster of qd nodes on one PostgreSQL database as a
//! whole, not per node: a tenant's `max_depth` counts every node's jobs of that
//! tenant, a throttled result's pause of a rate limiter holds on every node, and
//! an SQS queue created, changed or deleted on one node is so on every node.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::Qd;
use common::pg::{self, Database};
use serde_json::json;

/// `[daemon]` keys of node `i`.
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

/// One number `psql` printed.
fn number(db: &Database, sql: &str) -> i64 {
    db.psql(sql)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Tenant acme has `max_depth = 100` in queues whose own limit is far away: 150
/// enqueues of acme alternating between two nodes accept exactly 100, the rest
/// refused `429 tenant_full` naming acme, while another tenant still gets in; then
/// the same from two producers at once, one per node. A batch names its first item
/// past the tenant's limit. Jobs finished on one node make room on the other.
#[test]
fn a_tenants_max_depth_holds_for_the_cluster_under_alternating_and_concurrent_enqueues() {
    let Some(db) = pg::database() else { return };
    let body = "[tenants.acme]\nmax_depth = 100\n\n\
                [queues.ext]\nexecutor = { kind = \"external\" }\nmax_depth = 1000\n\n\
                [queues.other]\nexecutor = { kind = \"external\" }\nmax_depth = 1000\n";
    let nodes = Arc::new(start_cluster(&db, 2, body));
    let mut accepted = 0;
    for i in 0..150 {
        let (status, answer) = nodes[i % 2].post(
            "/v1/queues/ext/jobs",
            &json!({"payload": format!("{i}"), "tenant": "acme"}),
        );
        match status {
            202 => accepted += 1,
            429 => {
                assert_eq!(answer["error"]["code"], "tenant_full", "{answer}");
                let message = answer["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("\"acme\""), "{answer}");
            }
            _ => panic!("enqueue {i}: {status} {answer}"),
        }
    }
    assert_eq!(accepted, 100);
    // The tenant is full, the queue is not: another tenant gets in on both nodes.
    for qd in nodes.iter() {
        let (status, answer) = qd.post(
            "/v1/queues/ext/jobs",
            &json!({"payload": "other tenant", "tenant": "zed"}),
        );
        assert_eq!(status, 202, "{answer}");
    }
    // A batch: zed's item fits, acme's does not; refused whole, naming acme's item.
    let (status, answer) = nodes[1].post(
        "/v1/queues/ext/jobs/batch",
        &json!({"jobs": [{"payload": "z", "tenant": "zed"}, {"payload": "a", "tenant": "acme"}]}),
    );
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "tenant_full", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("at jobs[1], tenant \"acme\""), "{answer}");
    // Two producers at once on the other queue, one per node.
    let producers: Vec<_> = (0..2)
        .map(|n| {
            let nodes = nodes.clone();
            thread::spawn(move || {
                (0..75)
                    .filter(|i| {
                        let (status, answer) = nodes[n].post(
                            "/v1/queues/other/jobs",
                            &json!({"payload": format!("{n}.{i}"), "tenant": "acme"}),
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
    // The counters match the rows, for the tenant and for the queues.
    let counted = number(
        &db,
        "SELECT sum(depth) FROM qd_tenant_depths WHERE queue = 'other' AND tenant = 'acme'",
    );
    assert_eq!(counted, 100, "the tenant's counter matches the rows");
    for queue in ["ext", "other"] {
        let counted = number(
            &db,
            &format!("SELECT sum(depth) FROM qd_queue_depths WHERE queue = '{queue}'"),
        );
        let rows = number(
            &db,
            &format!(
                "SELECT count(*) FROM qd_jobs WHERE queue = '{queue}' \
                 AND state IN ('ready', 'delayed')"
            ),
        );
        assert_eq!(counted, rows, "queue {queue}'s counter matches its rows");
    }
    // Ten of acme's jobs finished through node 0 leave room for ten on node 1.
    let mut finished = 0;
    while finished < 10 {
        let job = common::lease_one(&nodes[0], "ext", "w", "5s").expect("a job");
        if job["tenant"] == "acme" {
            finished += 1;
        }
        common::ack(&nodes[0], &job);
    }
    let more = (0..12)
        .filter(|i| {
            nodes[1]
                .post(
                    "/v1/queues/ext/jobs",
                    &json!({"payload": format!("more {i}"), "tenant": "acme"}),
                )
                .0
                == 202
        })
        .count();
    assert_eq!(more, 10);
}

/// Leases up to one job of `queue` on `qd`, waiting up to `wait`.
fn lease(qd: &Qd, queue: &str, wait: &str) -> Option<serde_json::Value> {
    let (status, body) = qd.post(
        &format!("/v1/queues/{queue}/leases"),
        &json!({"worker_id": "w", "max_jobs": 1, "wait": wait}),
    );
    assert_eq!(status, 200, "{body}");
    body["jobs"].as_array().expect("jobs").first().cloned()
}

/// Two nodes share rate limiter api (with tokens to spare). An external worker's
/// throttled nack on node 0 pauses leasing of api's queue on node 1 too, for the
/// nack's `retry_after`; then both nodes lease again.
#[test]
fn a_throttled_nack_on_one_node_pauses_the_shared_limiter_on_every_node() {
    const PAUSE: Duration = Duration::from_secs(5);
    let Some(db) = pg::database() else { return };
    let body = "[rate_limiters.api]\nper_second = 200\nburst = 50\n\n\
                [queues.ext]\nexecutor = { kind = \"external\" }\nrate_limiter = \"api\"\n";
    let nodes = start_cluster(&db, 2, body);
    let batch: Vec<_> = (0..100)
        .map(|i| json!({"payload": format!("{i}")}))
        .collect();
    let (status, answer) = nodes[0].post("/v1/queues/ext/jobs/batch", &json!({"jobs": batch}));
    assert_eq!(status, 202, "{answer}");
    // Both nodes lease before the pause (node 1 holds tokens of its own then).
    let job = lease(&nodes[1], "ext", "10s").expect("node 1 leases before the pause");
    common::ack(&nodes[1], &job);
    let job = lease(&nodes[0], "ext", "10s").expect("node 0 leases before the pause");
    let (status, answer) = nodes[0].post(
        &format!("/v1/jobs/{}/nack", job["id"].as_str().expect("id")),
        &json!({"token": job["token"], "kind": "throttled", "retry_after": "5s"}),
    );
    assert_eq!(status, 200, "{answer}");
    let paused_at = Instant::now();
    // The pause is the database's, and node 1 honours it once announced.
    std::thread::sleep(Duration::from_secs(1));
    let stored = db.psql("SELECT paused_until > now() FROM qd_rate_limiters WHERE name = 'api'");
    assert_eq!(stored.trim(), "t", "the pause is stored with the limiter");
    while paused_at.elapsed() < PAUSE - Duration::from_secs(1) {
        for (n, qd) in nodes.iter().enumerate() {
            let job = lease(qd, "ext", "200ms");
            assert!(
                job.is_none() || paused_at.elapsed() >= PAUSE - Duration::from_millis(300),
                "node {n} leased {job:?} {:?} into a {PAUSE:?} pause",
                paused_at.elapsed()
            );
        }
    }
    // Then both resume.
    for (n, qd) in nodes.iter().enumerate() {
        let job = lease(qd, "ext", "20s").unwrap_or_else(|| panic!("node {n} resumes"));
        assert!(
            paused_at.elapsed() >= PAUSE - Duration::from_millis(300),
            "node {n} resumed after {:?}",
            paused_at.elapsed()
        );
        common::ack(qd, &job);
    }
}

/// Tenant a (weight 3) enqueues only on node 0 and tenant b (weight 1) only on
/// node 1, after a, with a backlog larger than a node's look at the oldest jobs
/// (1,000 per queue): node 0's look holds only a's jobs, and b's are seen there
/// through each backlogged tenant's oldest jobs. The leases of workers on both
/// nodes follow 3:1 within ±10%.
#[test]
fn weights_hold_across_nodes_with_a_backlog_larger_than_the_look_window() {
    const PER_TENANT: usize = 1600;
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
    // Node 0 holds its 1,600 and sees b's first jobs; node 1 holds b's 1,600 and
    // sees a's oldest 1,000.
    for (qd, least) in nodes.iter().zip([PER_TENANT + 1, 1000 + PER_TENANT]) {
        common::wait_for(
            "each node to see both tenants' jobs",
            Duration::from_secs(60),
            || {
                let ready = common::metric(
                    &qd.scrape(),
                    "qd_queue_depth",
                    &[("queue", "ext"), ("state", "ready")],
                );
                (ready >= least as f64).then_some(())
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
                    let Some(job) = lease(qd, "ext", "1s") else {
                        continue;
                    };
                    tenants
                        .lock()
                        .expect("lock")
                        .push(job["tenant"].as_str().expect("tenant").to_owned());
                    common::ack(qd, &job);
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

/// A schedule's ticks on PostgreSQL are checked against the queue's and the
/// tenant's `max_depth` in the database, as an enqueue is: once the queue or the
/// tenant holds its 2 jobs, the next ticks are missed and nothing more is stored.
#[test]
fn a_schedules_ticks_stop_at_max_depth_on_postgres() {
    let Some(db) = pg::database() else { return };
    let body = "[tenants.acme]\nmax_depth = 2\n\n\
                [queues.ext]\nexecutor = { kind = \"external\" }\n\n\
                [queues.small]\nexecutor = { kind = \"external\" }\nmax_depth = 2\n\n\
                [schedules.acme]\nqueue = \"ext\"\nevery = \"1s\"\ntenant = \"acme\"\n\n\
                [schedules.small]\nqueue = \"small\"\nevery = \"1s\"\n";
    let nodes = start_cluster(&db, 1, body);
    for schedule in ["acme", "small"] {
        common::wait_for("two missed ticks", Duration::from_secs(60), || {
            let missed = common::metric(
                &nodes[0].scrape(),
                "qd_schedule_fires_total",
                &[("schedule", schedule), ("result", "missed")],
            );
            (missed >= 2.0).then_some(())
        });
    }
    let stored = number(&db, "SELECT count(*) FROM qd_jobs WHERE tenant = 'acme'");
    assert_eq!(stored, 2, "ticks past the tenant's max_depth store nothing");
    let stored = number(&db, "SELECT count(*) FROM qd_jobs WHERE queue = 'small'");
    assert_eq!(stored, 2, "ticks past the queue's max_depth store nothing");
}

/// CreateQueue on node 0 is served by node 1 at once, without a reload: its
/// GetQueueUrl, SendMessage and ReceiveMessage of the same queue. SetQueueAttributes
/// and TagQueue on node 0 reach node 1 by the store's announcement, well before
/// the heartbeat that would also find them (every 12 s here); DeleteQueue on node
/// 0 makes node 1 answer `QueueDoesNotExist`.
#[test]
fn an_sqs_queue_created_changed_or_deleted_on_one_node_is_so_on_the_other() {
    const ANNOUNCED: Duration = Duration::from_secs(10);
    let Some(db) = pg::database() else { return };
    let nodes: Vec<Qd> = (0..2)
        .map(|i| {
            let keys = format!(
                "node_name = \"node-{i}\"\nnode_timeout = \"60s\"\npoll_interval = \"200ms\"\n"
            );
            let mut qd = Qd::configure_node(
                &db,
                &keys,
                "[sqs]\nenabled = true\n\n[queues.file]\nexecutor = { kind = \"external\" }\n",
            );
            qd.spawn(&[]);
            qd
        })
        .collect();
    let (a, b) = (&nodes[0], &nodes[1]);
    let (status, answer) = a.sqs(
        "CreateQueue",
        json!({"QueueName": "orders", "Attributes": {"VisibilityTimeout": "40"}}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = b.sqs("GetQueueUrl", json!({"QueueName": "orders"}));
    assert_eq!(status, 200, "node 1 knows the queue at once: {answer}");
    let url = answer["QueueUrl"].as_str().expect("QueueUrl").to_string();
    assert!(url.ends_with("/000000000000/orders"), "{url}");
    let (status, answer) = b.sqs(
        "SendMessage",
        json!({"QueueUrl": url, "MessageBody": "one"}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = b.sqs(
        "ReceiveMessage",
        json!({"QueueUrl": url, "WaitTimeSeconds": 10}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["Messages"][0]["Body"], "one", "{answer}");
    let handle = answer["Messages"][0]["ReceiptHandle"].clone();
    let (status, answer) = b.sqs(
        "DeleteMessage",
        json!({"QueueUrl": url, "ReceiptHandle": handle}),
    );
    assert_eq!(status, 200, "{answer}");

    let (status, answer) = a.sqs(
        "SetQueueAttributes",
        json!({"QueueUrl": url, "Attributes": {"VisibilityTimeout": "50"}}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = a.sqs(
        "TagQueue",
        json!({"QueueUrl": url, "Tags": {"team": "billing"}}),
    );
    assert_eq!(status, 200, "{answer}");
    common::wait_for("node 1 to apply node 0's changes", ANNOUNCED, || {
        let (_, attrs) = b.sqs(
            "GetQueueAttributes",
            json!({"QueueUrl": url, "AttributeNames": ["VisibilityTimeout"]}),
        );
        let (_, tags) = b.sqs("ListQueueTags", json!({"QueueUrl": url}));
        (attrs["Attributes"]["VisibilityTimeout"] == "50" && tags["Tags"]["team"] == "billing")
            .then_some(())
    });

    let (status, answer) = a.sqs("DeleteQueue", json!({"QueueUrl": url}));
    assert_eq!(status, 200, "{answer}");
    common::wait_for("node 1 to drop the deleted queue", ANNOUNCED, || {
        let (status, answer) = b.sqs("GetQueueUrl", json!({"QueueName": "orders"}));
        (status == 400 && common::sqs_error(&answer) == "QueueDoesNotExist").then_some(())
    });
    let (status, answer) = b.sqs(
        "SendMessage",
        json!({"QueueUrl": url, "MessageBody": "late"}),
    );
    assert_eq!(
        (status, common::sqs_error(&answer)),
        (400, "QueueDoesNotExist"),
        "{answer}"
    );
}
