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
    // Another node (or this one restarted) sees the lease: it is in the row, with a
    // deadline ten minutes ahead by the database's clock.
    let store = open_pg(&db.url, &PgOptions::default());
    let seen = block(&store, |b| b.load_unfinished()).expect("load");
    assert_eq!(seen, vec![leased(&stored, 1)]);
    let left: f64 = db
        .psql("SELECT extract(epoch FROM lease_deadline - now()) FROM qd_jobs")
        .parse()
        .expect("seconds");
    assert!((500.0..=600.0).contains(&left), "{left}");
    let end = Transition {
        job: Job {
            state: State::Succeeded,
            attempts: 1,
            lease_seq: 1,
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
fn two_nodes_never_hold_one_job_and_an_expired_lease_is_fenced() {
    let Some(db) = database() else { return };
    let (a, b) = (
        open_pg(&db.url, &PgOptions::default()),
        open_pg(&db.url, &PgOptions::default()),
    );
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
    // The deadline passes (by the database's clock): node b may take the job, but
    // only with a newer token than any it had.
    let stale = leased(&stored, 1);
    db.psql("UPDATE qd_jobs SET lease_deadline = now() - interval '1 second'");
    assert_eq!(
        block(&b, move |s| s.claim_for(&[stale], long)),
        Ok(vec![None]),
        "an expired lease is not taken with a token already used"
    );
    let fresh = leased(&stored, 2);
    assert_eq!(
        block(&b, move |s| s.claim_for(&[fresh], long)),
        Ok(vec![Some(b"p".to_vec())]),
        "an expired lease is taken with a newer token"
    );
    // Node a's ack under its old token is fenced off; node b's applies.
    let ack = |token| Transition {
        job: Job {
            state: State::Succeeded,
            attempts: 1,
            lease_seq: token,
            ..stored.clone()
        },
        entry: None,
    };
    let (old, new) = (ack(1), ack(2));
    assert_eq!(block(&a, move |s| s.complete(&[old])), Ok(vec![false]));
    assert_eq!(block(&b, move |s| s.complete(&[new])), Ok(vec![true]));
    let counts = block(&a, |s| s.counts()).expect("counts");
    assert_eq!(counts, vec![("q".to_owned(), State::Succeeded, 1)]);
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
