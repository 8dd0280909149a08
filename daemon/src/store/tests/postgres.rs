//! The PostgreSQL engine's own tests, each on a fresh database of the test run's
//! throw-away cluster (`pg.rs`): the engine-generic checks shared with SQLite, the
//! schema's migration lock and version check, and what only a shared database
//! has: leases stored with a deadline by the database clock, fenced tokens across
//! two stores (two nodes) on one database, and `claim_next`'s `SKIP LOCKED`.

use std::str::FromStr;

use super::pg::database;
use super::*;
use crate::store::postgres::{PgBackend, PgOptions, SCHEMA_VERSION};

/// Opens a store on the database `url` (a libpq key=value string).
/// The options of a node named `name` (its id derived from the name).
fn node(name: &str) -> PgOptions {
    PgOptions {
        node: name.to_owned(),
        node_id: uuid::Uuid::from_u128(u128::from(name.as_bytes()[0])),
        ..PgOptions::default()
    }
}

pub(super) fn open_pg(url: &str, options: &PgOptions) -> Store {
    let config = tokio_postgres::Config::from_str(url).expect("test url parses");
    Store::open_postgres(&config, options).expect("open PostgreSQL store")
}

fn config(url: &str) -> tokio_postgres::Config {
    tokio_postgres::Config::from_str(url).expect("test url parses")
}

#[test]
fn postgres_changes_are_conditioned_per_item() {
    let Some(db) = database() else { return };
    conditioned_per_item(&open_pg(&db.url, &PgOptions::default()));
}

#[test]
fn postgres_dedupes_by_key_inside_one_batch_and_across_batches() {
    let Some(db) = database() else { return };
    dedupes_by_key(&open_pg(&db.url, &PgOptions::default()));
}

#[test]
fn postgres_refuses_a_newer_schema_and_migrates_once() {
    let Some(db) = database() else { return };
    // Two nodes opening an empty database at once: the advisory lock makes one
    // migrate and the other find the schema done.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| open_pg(&db.url, &PgOptions::default()));
        let b = s.spawn(|| open_pg(&db.url, &PgOptions::default()));
        (a.join().expect("node a"), b.join().expect("node b"))
    });
    a.close();
    b.close();
    assert_eq!(
        db.psql("SELECT count(*), max(version) FROM qd_migrations"),
        format!("{SCHEMA_VERSION}|{SCHEMA_VERSION}")
    );
    db.psql(&format!(
        "INSERT INTO qd_migrations (version) VALUES ({})",
        SCHEMA_VERSION + 1
    ));
    match Store::open_postgres(&config(&db.url), &PgOptions::default()) {
        Err(StoreError::TooNew { found, supported }) => {
            assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("expected TooNew, got {:?}", other.map(|_| "a store")),
    }
}

#[test]
fn an_unreachable_database_is_one_clear_error_naming_it() {
    let Some(db) = database() else { return };
    let url = format!("{} dbname=no_such_database", db.url);
    let err = match Store::open_postgres(&config(&url), &PgOptions::default()) {
        Err(err) => err.to_string(),
        Ok(_) => panic!("a missing database opened"),
    };
    assert!(err.contains("\"no_such_database\""), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    let dir = tempfile::tempdir().expect("tempdir");
    let nobody = format!("host={} user=postgres dbname=x", dir.path().display());
    let err = match Store::open_postgres(&config(&nobody), &PgOptions::default()) {
        Err(err) => err.to_string(),
        Ok(_) => panic!("a socket directory without a server opened"),
    };
    assert!(err.contains("cannot connect"), "{err}");
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
}

#[test]
fn jobs_leases_and_history_survive_reopen_with_the_lease_in_the_row() {
    let Some(db) = database() else { return };
    let store = open_pg(&db.url, &PgOptions::default());
    let stored = job(1, "email", Some("k"));
    let inserted = stored.clone();
    block(&store, move |b| insert(b, &inserted, b"hello")).expect("insert");
    let claim = leased(&stored, 1);
    let payloads = block(&store, move |b| {
        b.claim_for(&[claim], Duration::from_secs(600))
    });
    assert_eq!(payloads, Ok(vec![Some(b"hello".to_vec())]));
    store.close();
    // Another node sees the lease: it is in the row, with a deadline ten minutes
    // ahead by the database's clock, and it is not that node's to load.
    let other = open_pg(&db.url, &node("b"));
    let seen = block(&other, |b| b.load_unfinished()).expect("load");
    assert_eq!(seen, Vec::new(), "another node's lease is not loaded");
    let id = stored.id;
    let seen = block(&other, move |b| b.shared().expect("shared").reload(&[id])).expect("reload");
    assert_eq!(seen, vec![leased(&stored, 1)]);
    other.close();
    let left: f64 = db
        .psql("SELECT extract(epoch FROM lease_deadline - now()) FROM qd_jobs")
        .parse()
        .expect("seconds");
    assert!((500.0..=600.0).contains(&left), "{left}");
    // The node that held it comes back: its earlier run's lease ends, uncharged.
    let store = open_pg(&db.url, &PgOptions::default());
    let seen = block(&store, |b| b.load_unfinished()).expect("load");
    assert_eq!(
        seen,
        vec![Job {
            lease_seq: 1,
            ..stored.clone()
        }]
    );
    let claim = leased(&stored, 2);
    let payloads = block(&store, move |b| {
        b.claim_for(&[claim], Duration::from_secs(60))
    });
    assert_eq!(payloads, Ok(vec![Some(b"hello".to_vec())]));
    let end = Transition {
        job: Job {
            state: State::Succeeded,
            attempts: 1,
            lease_seq: 2,
            ..stored.clone()
        },
        entry: Some(HistoryEntry {
            attempt: 1,
            outcome: Outcome::Succeeded,
            worker: Some("w/1".into()),
            started_at: Some(1_500),
            ended_at: 1_600,
            error: None,
        }),
    };
    assert_eq!(block(&store, move |b| b.complete(&[end])), Ok(vec![true]));
    let id = stored.id;
    let detail = block(&store, move |b| b.job(id))
        .expect("read")
        .expect("stored");
    assert_eq!(detail.job.state, State::Succeeded);
    assert_eq!((detail.job.worker, detail.job.leased_at), (None, None));
    assert_eq!(detail.history.len(), 1);
    assert_eq!(
        db.psql("SELECT count(*) FROM qd_jobs WHERE lease_token IS NOT NULL"),
        "0"
    );
}

#[test]
fn two_nodes_never_hold_one_job_and_only_the_leader_ends_an_expired_lease() {
    let Some(db) = database() else { return };
    let (a, b) = (open_pg(&db.url, &node("a")), open_pg(&db.url, &node("b")));
    let stored = job(1, "q", None);
    let inserted = stored.clone();
    block(&a, move |s| insert(s, &inserted, b"p")).expect("insert");
    let long = Duration::from_secs(600);
    let claim = leased(&stored, 1);
    assert_eq!(
        block(&a, move |s| s.claim_for(&[claim], long)),
        Ok(vec![Some(b"p".to_vec())])
    );
    // Node b, with its own (stale or fresh) view, cannot take a live lease.
    for token in [1, 2] {
        let claim = leased(&stored, token);
        assert_eq!(
            block(&b, move |s| s.claim_for(&[claim], long)),
            Ok(vec![None]),
            "token {token} over a live lease"
        );
    }
    assert_eq!(
        block(&b, |s| s
            .shared()
            .expect("shared")
            .claimable(&["q".into()], 10)),
        Ok(Vec::new()),
        "a leased job is not claimable"
    );
    // The leader: b takes the lease first; a, beating later, is not the leader.
    let epoch = block(&b, |s| s.shared().expect("shared").beat())
        .expect("beat")
        .expect("b leads");
    assert_eq!(block(&a, |s| s.shared().expect("shared").beat()), Ok(None));
    // While a beats, its lease is not expired; once its deadline passes (by the
    // database's clock) and a is silent, the leader sees it and ends it: charged
    // through the retry policy, under the leader's epoch only.
    let expired = |s: &Store| block(s, |s| s.shared().expect("shared").expired_leases(10));
    assert_eq!(expired(&b), Ok(Vec::new()));
    db.psql("UPDATE qd_jobs SET lease_deadline = now() - interval '1 second'");
    assert_eq!(expired(&b), Ok(vec![leased(&stored, 1)]));
    assert_eq!(
        expired(&a),
        Ok(Vec::new()),
        "a node's own leases are its own to end"
    );
    let end = Transition {
        job: Job {
            state: State::Ready,
            attempts: 1,
            lease_seq: 1,
            ..stored.clone()
        },
        entry: None,
    };
    let stale = end.clone();
    assert_eq!(
        block(&b, move |s| s
            .shared()
            .expect("shared")
            .expire(&[stale], epoch + 1)),
        Ok(vec![false]),
        "a deposed leader's epoch changes nothing"
    );
    let (old, again) = (end.clone(), end.clone());
    assert_eq!(
        block(&b, move |s| s
            .shared()
            .expect("shared")
            .expire(&[end], epoch)),
        Ok(vec![true])
    );
    assert_eq!(
        block(&b, move |s| s
            .shared()
            .expect("shared")
            .expire(&[again], epoch)),
        Ok(vec![false]),
        "a lease ends once"
    );
    // Node a's ack under its old token is fenced off; the job runs again elsewhere.
    let ack = Transition {
        job: Job {
            state: State::Succeeded,
            attempts: 1,
            ..old.job.clone()
        },
        entry: None,
    };
    assert_eq!(block(&a, move |s| s.complete(&[ack])), Ok(vec![false]));
    let fresh = leased(
        &Job {
            attempts: 1,
            ..stored.clone()
        },
        2,
    );
    assert_eq!(
        block(&b, move |s| s.claim_for(&[fresh], long)),
        Ok(vec![Some(b"p".to_vec())]),
        "the job is claimable again, with a newer token"
    );
    let nodes = block(&a, |s| s.shared().expect("shared").nodes()).expect("nodes");
    let names: Vec<(&str, bool)> = nodes.iter().map(|n| (n.name.as_str(), n.leader)).collect();
    assert_eq!(names, vec![("a", false), ("b", true)]);
}

#[test]
fn a_live_node_name_is_refused_to_another_node() {
    let Some(db) = database() else { return };
    let first = open_pg(&db.url, &node("a"));
    let impostor = PgOptions {
        node_id: uuid::Uuid::from_u128(7),
        ..node("a")
    };
    let err = match Store::open_postgres(&config(&db.url), &impostor) {
        Err(err) => err.to_string(),
        Ok(_) => panic!("a second live node named a was let in"),
    };
    assert!(err.contains("another live node is named \"a\""), "{err}");
    first.close();
    // The same node (same id) comes back at once.
    let again = open_pg(&db.url, &node("a"));
    again.close();
}

#[test]
fn claim_next_skips_rows_another_node_is_claiming() {
    let Some(db) = database() else { return };
    let store = open_pg(&db.url, &PgOptions::default());
    let batch = NewRecord::batch((1..=5).map(|n| job(n, "q", None)), b"p");
    block(&store, move |s| s.enqueue(&batch)).expect("enqueue");
    store.close();
    let open = || PgBackend::open(&config(&db.url), &PgOptions::default()).expect("open");
    let (mut a, mut b) = (open(), open());
    let lease = Duration::from_secs(60);
    a.begin().expect("begin a");
    let first = a
        .claim_next("q", 2, "a/1", 2_000, 2_000, lease)
        .expect("claim a");
    // a's transaction is open and holds its two rows: b skips them, without waiting.
    b.begin().expect("begin b");
    let second = b
        .claim_next("q", 10, "b/1", 2_000, 2_000, lease)
        .expect("claim b");
    b.commit().expect("commit b");
    a.commit().expect("commit a");
    let ids = |claimed: &[(Job, Vec<u8>)]| -> Vec<u128> {
        claimed.iter().map(|(j, _)| j.id.0.as_u128()).collect()
    };
    assert_eq!(ids(&first), vec![1, 2]);
    assert_eq!(ids(&second), vec![3, 4, 5]);
    for (job, payload) in first.iter().chain(&second) {
        assert_eq!(job.state, State::Leased);
        assert_eq!(job.lease_seq, 1, "the first lease's token");
        assert_eq!(payload, b"p");
    }
    assert_eq!(first[0].0.worker.as_deref(), Some("a/1"));
    b.begin().expect("begin");
    let none = b
        .claim_next("q", 10, "b/1", 2_000, 2_000, lease)
        .expect("claim");
    b.commit().expect("commit");
    assert!(none.is_empty(), "every job is leased: {none:?}");
}

#[test]
fn a_lost_connection_fails_its_batch_and_the_next_batch_reconnects() {
    let Some(db) = database() else { return };
    let store = open_pg(&db.url, &PgOptions::default());
    let first = job(1, "q", None);
    block(&store, move |b| insert(b, &first, b"1")).expect("insert");
    let killed = db.psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = '{}' AND application_name = 'qd'",
        db.name
    ));
    assert_eq!(killed, "1", "the store's one connection");
    let second = job(2, "q", None);
    let lost = block(&store, move |b| insert(b, &second, b"2"));
    assert!(
        matches!(&lost, Err(StoreError::Other(m)) if m.contains("PostgreSQL database")),
        "{lost:?}"
    );
    let third = job(3, "q", None);
    assert_eq!(
        block(&store, move |b| insert(b, &third, b"3")),
        Ok(Inserted::New)
    );
    let ids: Vec<u128> = block(&store, |b| b.load_unfinished())
        .expect("load")
        .iter()
        .map(|j| j.id.0.as_u128())
        .collect();
    assert_eq!(ids, vec![1, 3], "the lost batch left nothing behind");
}
