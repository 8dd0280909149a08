//! The operator's dependency operations on SQLite (`sqlite/edges.rs`) and, the
//! same scenarios in one transaction, on PostgreSQL (`postgres/deps.rs`): which
//! unfinished jobs a dead parent holds back, how many transitively, a release of
//! a purged parent's edges, and `release_edges_by` leaving a job that is not
//! blocked alone.

use super::pg::database;
use super::postgres::{node, open_pg};
use super::*;
use crate::deps::{After, AfterPolicy};

/// Runs `scenario` on a fresh SQLite store.
fn on_sqlite(scenario: fn(&mut dyn Backend)) {
    let (_dir, path) = temp_db();
    let mut b = sqlite::SqliteBackend::open(&path, &SqliteOptions::default()).expect("open");
    scenario(&mut b);
}

/// Runs `scenario` on a fresh PostgreSQL database, as one store operation (a
/// failed assertion there is that operation's error).
fn on_postgres(scenario: fn(&mut dyn Backend)) {
    let Some(db) = database() else { return };
    let store = open_pg(&db.url, &node("a"));
    block(&store, move |b| {
        scenario(b);
        Ok(())
    })
    .expect("the scenario passes on PostgreSQL");
}

fn id(n: u128) -> JobId {
    JobId(Uuid::from_u128(n))
}

/// Enqueues job `n` after `parents` under `policy`; answers the state stored.
fn child(b: &mut dyn Backend, n: u128, parents: &[u128], policy: AfterPolicy) -> State {
    let record = NewRecord {
        job: job(n, "q", None),
        payload: b"c".to_vec(),
    };
    let after = After {
        parents: parents.iter().map(|p| id(*p)).collect(),
        policy,
        refs: Vec::new(),
    };
    b.enqueue_after(&[record], &[after], true).expect("enqueue")[0].1
}

#[test]
fn a_dead_parent_holds_back_its_unfinished_children_and_a_release_lets_them_go() {
    on_sqlite(holds_back_and_releases);
}

#[test]
fn postgres_a_dead_parent_holds_back_its_unfinished_children_and_a_release_lets_them_go() {
    on_postgres(holds_back_and_releases);
}

fn holds_back_and_releases(b: &mut dyn Backend) {
    let dead = Job {
        state: State::Dead,
        ..job(1, "q", None)
    };
    insert(b, &dead, b"p").expect("dead parent");
    insert(b, &job(2, "q", None), b"q").expect("ready parent");
    assert_eq!(child(b, 10, &[1], AfterPolicy::Succeeded), State::Blocked);
    assert_eq!(
        child(b, 11, &[1, 2], AfterPolicy::Succeeded),
        State::Blocked
    );
    assert_eq!(child(b, 12, &[10], AfterPolicy::Succeeded), State::Waiting);
    assert_eq!(child(b, 13, &[1], AfterPolicy::Finished), State::Ready);

    assert_eq!(b.blocked_by(id(1)).expect("read"), vec![id(10), id(11)]);
    assert_eq!(
        b.blocked_counts(id(1)).expect("read"),
        BlockedCounts {
            direct: 2,
            transitive: 3
        },
        "10, 11 and 12 below 10; 13 met its edge"
    );
    assert_eq!(b.blocked_by(id(2)).expect("read"), vec![id(11)]);
    assert_eq!(
        b.blocked_counts(id(13)).expect("read"),
        BlockedCounts::default()
    );

    // Only a blocked job is released by release_edges_by.
    assert_eq!(
        b.release_edges_by(id(12), "uid 7", 2_000).expect("ok"),
        None
    );
    assert_eq!(b.release_edges_by(id(2), "uid 7", 2_000).expect("ok"), None);

    let moved = b.release_parent(id(1), "uid 7", 2_000).expect("release");
    let states: Vec<(JobId, State)> = moved.iter().map(|j| (j.id, j.state)).collect();
    assert_eq!(
        states,
        vec![(id(10), State::Ready), (id(11), State::Waiting)],
        "11 still waits for 2"
    );
    assert!(b.blocked_by(id(1)).expect("read").is_empty());
    let released = b.job(id(10)).expect("read").expect("stored");
    let last = released.history.last().expect("a history line");
    assert_eq!(last.outcome, Outcome::Released);
    let text = last.error.as_deref().unwrap_or_default();
    assert!(
        text.contains("uid 7") && text.contains(&id(1).to_string()),
        "{text}"
    );
    let records = b.job_records(&[id(11), id(99)]).expect("read");
    assert_eq!(records[0].as_ref().map(|j| j.state), Some(State::Waiting));
    assert_eq!(records[1], None, "an unknown job has no record");
}

#[test]
fn release_edges_by_meets_every_broken_edge_of_a_blocked_job_and_names_who() {
    on_sqlite(releases_a_blocked_job);
}

#[test]
fn postgres_release_edges_by_meets_every_broken_edge_of_a_blocked_job_and_names_who() {
    on_postgres(releases_a_blocked_job);
}

fn releases_a_blocked_job(b: &mut dyn Backend) {
    for n in [1, 2] {
        let dead = Job {
            state: State::Dead,
            ..job(n, "q", None)
        };
        insert(b, &dead, b"p").expect("dead parent");
    }
    insert(b, &job(3, "q", None), b"q").expect("ready parent");
    assert_eq!(
        child(b, 10, &[1, 2, 3], AfterPolicy::Succeeded),
        State::Blocked
    );
    let (next, parents) = b
        .release_edges_by(id(10), "uid 7", 2_000)
        .expect("ok")
        .expect("released");
    assert_eq!(parents, vec![id(1), id(2)]);
    assert_eq!(next.map(|j| j.state), Some(State::Waiting), "3 is open");
    assert!(b.blocked_by(id(1)).expect("read").is_empty());
    let edges = b.edges(id(10)).expect("read");
    assert_eq!(
        edges.parents,
        vec![
            (id(1), crate::deps::Edge::Met),
            (id(2), crate::deps::Edge::Met),
            (id(3), crate::deps::Edge::Open)
        ]
    );
    let history = b.job(id(10)).expect("read").expect("stored").history;
    let text = history
        .last()
        .and_then(|h| h.error.clone())
        .unwrap_or_default();
    assert!(text.starts_with("released by uid 7"), "{text}");
}
