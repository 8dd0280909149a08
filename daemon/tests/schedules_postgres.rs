//! A schedule on a cluster of qd nodes sharing one PostgreSQL database (the run's
//! throw-away cluster): each tick runs once in the whole cluster, only the leader
//! fires, and after the firing node is killed by `SIGKILL` another node goes on
//! from the stored next tick within `node_timeout` plus a tick.

mod common;

use std::time::Duration;

use common::pg::{self, Database};
use common::{Qd, metric, wait_for};

const NODE_TIMEOUT_MS: i64 = 2_000;

fn body() -> String {
    "[queues.ext]\nexecutor = { kind = \"external\" }\n\n\
     [schedules.s]\nqueue = \"ext\"\nevery = \"1s\"\n"
        .to_owned()
}

fn start(db: &Database, i: usize) -> Qd {
    let keys =
        format!("node_name = \"node-{i}\"\nnode_timeout = \"2s\"\npoll_interval = \"200ms\"\n");
    let mut qd = Qd::configure_node(db, &keys, &body());
    qd.spawn(&[]);
    qd
}

/// The ticks of the schedule's jobs (Unix ms), from the database, sorted.
fn ticks(db: &Database) -> Vec<i64> {
    let keys = db.psql(
        "SELECT idempotency_key FROM qd_jobs WHERE idempotency_key LIKE 'schedule:s:%' \
         ORDER BY idempotency_key",
    );
    keys.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|k| {
            let text = k.strip_prefix("schedule:s:").expect("prefix");
            let at = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{k}: {e}"));
            let ms = at
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after the epoch")
                .as_millis();
            i64::try_from(ms).expect("fits")
        })
        .collect()
}

fn leader(db: &Database) -> usize {
    let name = wait_for("a leader", Duration::from_secs(30), || {
        let name = db.psql("SELECT node FROM qd_leader WHERE expires_at > now()");
        Some(name.trim().to_owned()).filter(|n| !n.is_empty())
    });
    name.strip_prefix("node-")
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("leader {name:?}"))
}

fn fired(qd: &Qd) -> f64 {
    let text = qd.scrape();
    ["fired", "caught_up"]
        .iter()
        .map(|r| {
            metric(
                &text,
                "qd_schedule_fires_total",
                &[("schedule", "s"), ("result", r)],
            )
        })
        .sum()
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch");
    i64::try_from(since.as_millis()).expect("fits")
}

fn runs_once_per_tick_and_survives_the_firing_node(n: usize) {
    let Some(db) = pg::database() else { return };
    let mut nodes: Vec<Qd> = (0..n).map(|i| start(&db, i)).collect();
    wait_for("four ticks", Duration::from_secs(60), || {
        (ticks(&db).len() >= 4).then_some(())
    });
    let lead = leader(&db);
    let seen = ticks(&db).len();
    // Every run was enqueued by exactly one node's fire: the leader's.
    let counts: Vec<f64> = nodes.iter().map(fired).collect();
    let total: f64 = counts.iter().sum();
    assert!(
        total >= seen as f64 && counts.iter().filter(|c| **c > 0.0).count() == 1,
        "fires per node {counts:?} for {seen} runs"
    );

    let killed_at = now_ms();
    nodes[lead].kill9();
    let after = wait_for(
        "a run fired by another node",
        Duration::from_secs(60),
        || {
            let t = ticks(&db);
            (t.last().is_some_and(|last| *last > killed_at + 1_000)).then_some(t)
        },
    );
    let first_new = after
        .iter()
        .find(|t| **t > killed_at)
        .copied()
        .expect("a tick after the kill");
    // The new leader's first run is at most node_timeout plus a tick after the
    // kill (its tick is when it fired, catch_up = "latest"), with 3 s for a busy
    // machine's heartbeats and start-up.
    assert!(
        first_new - killed_at <= NODE_TIMEOUT_MS + 1_000 + 3_000,
        "first run {} ms after the kill: {after:?}",
        first_new - killed_at
    );
    let new_lead = leader(&db);
    assert_ne!(new_lead, lead);
    wait_for("runs on time again", Duration::from_secs(30), || {
        (ticks(&db).len() >= after.len() + 2).then_some(())
    });
    let all = ticks(&db);
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "a tick ran twice: {all:?}"
    );
    let survivors: Vec<f64> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != lead)
        .map(|(_, qd)| fired(qd))
        .collect();
    assert_eq!(
        survivors.iter().filter(|c| **c > 0.0).count(),
        1,
        "one survivor fires: {survivors:?}"
    );
}

#[test]
fn two_nodes_run_each_tick_once_and_go_on_after_the_firing_node_is_killed() {
    runs_once_per_tick_and_survives_the_firing_node(2);
}

#[test]
fn three_nodes_run_each_tick_once_and_go_on_after_the_firing_node_is_killed() {
    runs_once_per_tick_and_survives_the_firing_node(3);
}
