//! The PostgreSQL engine's own tests, each on a fresh database of the test run's
//! throw-away cluster (`pg.rs`): the schema's migration lock and version check,
//! and what only a shared database
//! has: leases stored with a deadline by the database clock, fenced tokens across
//! two stores (two nodes) on one database (a token sequence no stale copy takes
//! back), `claim_next`'s `SKIP LOCKED`, and tenants' concurrency caps held across
//! two nodes claiming at once. The checks every engine shares are the
//! conformance suite's (`conformance.rs`).

use std::str::FromStr;

use super::pg::database;
use super::*;
use crate::store::postgres::{PgBackend, PgOptions, SCHEMA_VERSION};
use crate::store::{Claim, LeaseCheck, LeaseKind, NewClaim, SharedStore, TenantCap};

/// Opens a store on the database `url` (a libpq key=value string).
/// The options of a node named `name` (its id derived from the name).
pub(super) fn node(name: &str) -> PgOptions {
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
fn postgres_schedules_advance_once_per_tick() {
    let Some(db) = database() else { return };
    super::schedules::schedules_advance_once_per_tick(&open_pg(&db.url, &PgOptions::default()));
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
        result: None,
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
        result: None,
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
        result: None,
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

/// A lease shorter than the holder's heartbeat period (`node_timeout / 5`) is
/// stored until `node_timeout` after the claim (both claim statements), so it is
/// not past its stored deadline before the holder's next heartbeat renews it:
/// another node (the leader) never ends a lease of a node that heartbeats. Once
/// the holder is silent for `node_timeout`, the leases are the leader's to end.
#[test]
fn a_short_lease_of_a_node_that_heartbeats_is_not_lost_to_another_node() {
    let Some(db) = database() else { return };
    let slow = |name| PgOptions {
        node_timeout: Duration::from_secs(60),
        ..node(name)
    };
    let (a, b) = (open_pg(&db.url, &slow("a")), open_pg(&db.url, &slow("b")));
    let (first, second) = (job(1, "q", None), job(2, "q", None));
    for stored in [first.clone(), second.clone()] {
        block(&a, move |s| insert(s, &stored, b"p")).expect("insert");
    }
    let short = Duration::from_secs(1);
    let claim = leased(&first, 1);
    assert_eq!(
        block(&a, move |s| s.claim_for(&[claim], short)),
        Ok(vec![Some(b"p".to_vec())])
    );
    let next = block(&a, move |s| {
        let next = NewClaim {
            queue: "q",
            tenant: None,
            limit: 1,
            worker: "w/1",
            now: 2_000,
            lease: short,
            cap: None,
        };
        s.shared().expect("shared").claim_next(&next)
    })
    .expect("claim_next");
    assert_eq!(next.len(), 1, "{next:?}");
    // Well past the lease's length; node a's heartbeat (at its open) is fresh.
    std::thread::sleep(Duration::from_millis(2_500));
    let expired = |s: &Store| block(s, |s| s.shared().expect("shared").expired_leases(10));
    assert_eq!(
        expired(&b),
        Ok(Vec::new()),
        "a lease of a node that heartbeats was lost"
    );
    db.psql("UPDATE qd_nodes SET heartbeat_at = now() - interval '61 seconds' WHERE name = 'a'");
    let lost = expired(&b).expect("expired leases");
    assert_eq!(lost.len(), 2, "a silent node's leases: {lost:?}");
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

/// A node whose name another node took over (this one was silent longer than
/// `node_timeout`) claims nothing under that name, by either claim statement, and
/// its heartbeat is refused as replaced, so it can stop.
#[test]
fn a_node_whose_name_was_taken_over_claims_nothing() {
    let Some(db) = database() else { return };
    let zombie = open_pg(&db.url, &node("a"));
    let stored = job(1, "q", None);
    let inserted = stored.clone();
    block(&zombie, move |s| insert(s, &inserted, b"p")).expect("insert");
    db.psql(
        "UPDATE qd_nodes SET node_id = '00000000-0000-0000-0000-000000000007' WHERE name = 'a'",
    );
    let claim = leased(&stored, 1);
    assert_eq!(
        block(&zombie, move |s| s
            .claim_for(&[claim], Duration::from_secs(60))),
        Ok(vec![None])
    );
    let next = block(&zombie, |s| {
        let next = NewClaim {
            queue: "q",
            tenant: None,
            limit: 1,
            worker: "w/1",
            now: 2_000,
            lease: Duration::from_secs(60),
            cap: None,
        };
        s.shared().expect("shared").claim_next(&next)
    });
    assert_eq!(next, Ok(Vec::new()));
    assert_eq!(
        db.psql("SELECT count(*) FROM qd_jobs WHERE lease_token IS NOT NULL"),
        "0"
    );
    let beat = block(&zombie, |s| s.shared().expect("shared").beat());
    assert!(matches!(beat, Err(StoreError::Replaced(_))), "{beat:?}");
    // The name's new holder leases the job: the zombie's sweep must not see that
    // lease as its own (it would end it as an orphan).
    db.psql(
        "UPDATE qd_jobs SET lease_seq = 1, lease_token = 1, worker = 'w/new', \
           lease_node = 'a', lease_deadline = now() + interval '1 minute'",
    );
    let own = block(&zombie, |s| s.shared().expect("shared").own_leases());
    assert_eq!(own.map(|jobs| jobs.len()), Ok(0));
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
    let next = |worker, limit, tenant| NewClaim {
        queue: "q",
        tenant,
        limit,
        worker,
        now: 2_000,
        lease: Duration::from_secs(60),
        cap: None,
    };
    a.begin().expect("begin a");
    let first = a.claim_next(&next("a/1", 2, None)).expect("claim a");
    // a's transaction is open and holds its two rows: b skips them, without waiting.
    b.begin().expect("begin b");
    let second = b.claim_next(&next("b/1", 10, None)).expect("claim b");
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
    let none = b.claim_next(&next("b/1", 10, None)).expect("claim");
    b.commit().expect("commit");
    assert!(none.is_empty(), "every job is leased: {none:?}");
    // A tenant's claim takes only that tenant's jobs.
    let other = Job {
        tenant: "t2".into(),
        ..job(6, "q", None)
    };
    b.begin().expect("begin");
    b.enqueue(&NewRecord::batch([other, job(7, "q", None)], b"p"))
        .expect("enqueue");
    let t2 = b.claim_next(&next("b/1", 10, Some("t2"))).expect("claim");
    b.commit().expect("commit");
    assert_eq!(ids(&t2), vec![6]);
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

/// A job of `tenant` in queue `q`.
fn of(n: u128, tenant: &str) -> Job {
    Job {
        tenant: tenant.into(),
        ..job(n, "q", None)
    }
}

/// The ack of a lease taken with token 1.
fn ack_first(job: &Job) -> Transition {
    Transition {
        job: Job {
            state: State::Succeeded,
            attempts: 1,
            lease_seq: 1,
            ..job.clone()
        },
        entry: None,
        result: None,
    }
}

/// Live leases of `tenant` in the database (one statement: a consistent view).
fn leases_of(db: &super::pg::Database, tenant: &str) -> usize {
    db.psql(&format!(
        "SELECT count(*) FROM qd_jobs WHERE tenant = '{tenant}' AND lease_token IS NOT NULL"
    ))
    .parse()
    .expect("a count")
}

#[test]
fn a_tenants_cap_holds_across_two_nodes_claiming_at_once_and_costs_others_nothing() {
    let Some(db) = database() else { return };
    let jobs: Vec<Job> = (1..=6)
        .map(|n| of(n, "capped"))
        .chain((7..=8).map(|n| of(n, "free")))
        .collect();
    let store = open_pg(&db.url, &PgOptions::default());
    let batch = NewRecord::batch(jobs.clone(), b"p");
    block(&store, move |s| s.enqueue(&batch)).expect("enqueue");
    store.close();
    let open = |name| PgBackend::open(&config(&db.url), &node(name)).expect("open");
    let (mut a, mut b) = (open("a"), open("b"));
    let caps = [TenantCap {
        queue: "q".into(),
        tenant: "capped".into(),
        max: 2,
    }];
    let lease = Duration::from_secs(60);
    let picks = |ns: &[usize]| -> Vec<Job> { ns.iter().map(|n| leased(&jobs[n - 1], 1)).collect() };
    let p = || Claim::Leased(b"p".to_vec());
    let advisory = || {
        db.psql(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
             WHERE l.locktype = 'advisory' AND d.datname = current_database()",
        )
    };

    // A claim naming no capped tenant takes no lock.
    a.begin().expect("begin");
    let free = a.claim_capped(&picks(&[7]), lease, &caps).expect("claim");
    assert_eq!(free, vec![p()]);
    assert_eq!(advisory(), "0", "an uncapped tenant's claim takes no lock");
    a.rollback();

    // Node a claims three of the capped tenant's jobs: two fit.
    a.begin().expect("begin a");
    let first = a
        .claim_capped(&picks(&[1, 2, 3, 7]), lease, &caps)
        .expect("claim a");
    assert_eq!(first, vec![p(), p(), Claim::AtCap, p()]);
    assert_eq!(
        advisory(),
        "1",
        "a holds the tenant's lock until it commits"
    );
    // While a's claim is not committed, b counts nothing of it: it must not claim
    // for the tenant at all (it does not wait either). Its uncapped job goes.
    b.begin().expect("begin b");
    let second = b
        .claim_capped(&picks(&[4, 8]), lease, &caps)
        .expect("claim b");
    assert_eq!(second, vec![Claim::AtCap, p()]);
    let next = NewClaim {
        queue: "q",
        tenant: Some("capped"),
        limit: 5,
        worker: "b/1",
        now: 2_000,
        lease,
        cap: Some(2),
    };
    assert_eq!(b.claim_next(&next).map(|c| c.len()), Ok(0));
    b.commit().expect("commit b");
    a.commit().expect("commit a");
    assert_eq!(leases_of(&db, "capped"), 2);

    // Committed, a's two leases are counted by b.
    b.begin().expect("begin b");
    assert_eq!(
        b.claim_capped(&picks(&[4]), lease, &caps),
        Ok(vec![Claim::AtCap])
    );
    assert_eq!(b.claim_next(&next).map(|c| c.len()), Ok(0));
    b.commit().expect("commit b");

    // One of a's leases ends: one slot, for one of b's two picks.
    a.begin().expect("begin a");
    assert_eq!(a.complete(&[ack_first(&jobs[0])]), Ok(vec![true]));
    a.commit().expect("commit a");
    b.begin().expect("begin b");
    assert_eq!(
        b.claim_capped(&picks(&[4, 5]), lease, &caps),
        Ok(vec![p(), Claim::AtCap])
    );
    b.commit().expect("commit b");
    assert_eq!(leases_of(&db, "capped"), 2);

    // claim_next keeps to the cap too: one slot freed, one job claimed of five asked.
    a.begin().expect("begin a");
    assert_eq!(a.complete(&[ack_first(&jobs[1])]), Ok(vec![true]));
    a.commit().expect("commit a");
    b.begin().expect("begin b");
    let taken = b.claim_next(&next).expect("claim next");
    let none = b.claim_next(&NewClaim {
        tenant: None,
        ..next
    });
    b.rollback();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert!(matches!(none, Err(StoreError::Other(_))), "{none:?}");

    // A cap of 0 holds every job of the tenant; a lifted cap (none given) holds none.
    let zero = [TenantCap {
        max: 0,
        ..caps[0].clone()
    }];
    b.begin().expect("begin b");
    assert_eq!(
        b.claim_capped(&picks(&[5]), lease, &zero),
        Ok(vec![Claim::AtCap])
    );
    assert_eq!(
        b.claim_capped(&picks(&[5, 6]), lease, &[]),
        Ok(vec![p(), p()])
    );
    b.rollback();
}

#[test]
fn two_nodes_claiming_one_capped_tenant_never_exceed_its_cap_together() {
    const JOBS: u128 = 120;
    const CAP: u32 = 3;
    let Some(db) = database() else { return };
    let store = open_pg(&db.url, &PgOptions::default());
    let batch = NewRecord::batch((1..=JOBS).map(|n| of(n, "capped")), b"p");
    block(&store, move |s| s.enqueue(&batch)).expect("enqueue");
    store.close();
    let caps = vec![TenantCap {
        queue: "q".into(),
        tenant: "capped".into(),
        max: CAP,
    }];
    let done = std::sync::Arc::new(AtomicUsize::new(0));
    let most = std::sync::Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for name in ["a", "b"] {
            let (caps, done, most, db) = (caps.clone(), done.clone(), most.clone(), &db);
            s.spawn(move || {
                let store = open_pg(&db.url, &node(name));
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                while done.load(std::sync::atomic::Ordering::SeqCst) < JOBS as usize {
                    assert!(std::time::Instant::now() < deadline, "node {name} stalled");
                    // Each node claims four of the tenant's oldest claimable jobs at a
                    // time, a in order and b from the back, as two nodes' Brokers would.
                    let caps = caps.clone();
                    let held = block(&store, move |st| {
                        let shared = st.shared().expect("shared");
                        let mut ready = shared.claimable(&["q".into()], 8)?;
                        if name == "b" {
                            ready.reverse();
                        }
                        let picks: Vec<Job> = ready.iter().take(4).map(|j| leased(j, 1)).collect();
                        let answers =
                            shared.claim_capped(&picks, Duration::from_secs(60), &caps)?;
                        Ok(picks
                            .into_iter()
                            .zip(answers)
                            .filter(|(_, a)| matches!(a, Claim::Leased(_)))
                            .map(|(j, _)| j)
                            .collect::<Vec<Job>>())
                    })
                    .expect("claim");
                    // Committed: what the database holds now never passes the cap.
                    let now = leases_of(db, "capped");
                    most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    assert!(
                        now <= CAP as usize,
                        "{now} leases of a tenant capped at {CAP}"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                    let acks: Vec<Transition> = held.iter().map(ack_first).collect();
                    let n = acks.len();
                    let acked = block(&store, move |st| st.complete(&acks)).expect("ack");
                    assert_eq!(acked, vec![true; n], "every lease taken is ours to end");
                    done.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                }
                store.close();
            });
        }
    });
    assert_eq!(leases_of(&db, "capped"), 0);
    assert_eq!(
        db.psql("SELECT count(*) FROM qd_jobs WHERE state = 'succeeded'"),
        JOBS.to_string()
    );
    assert!(
        most.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "the two nodes held leases at once at some point"
    );
}

/// Two operators redrive the same dead job from two nodes. Node a read the job
/// (dead, `lease_seq` 1) before node b redrove it, leased it under token 2 and saw
/// it die again. Node a's redrive, planned on its copy, then applies (the job is
/// dead and unleased) and must not take `lease_seq` back below 2: a token once
/// handed out is never handed out again, so the next claim must not get token 2.
#[test]
fn a_redrive_from_a_stale_copy_never_takes_the_token_sequence_back() {
    let Some(db) = database() else { return };
    let (a, b) = (open_pg(&db.url, &node("a")), open_pg(&db.url, &node("b")));
    let fresh = job(7, "q", None);
    let inserted = fresh.clone();
    block(&b, move |s| insert(s, &inserted, b"p")).expect("insert");
    let backoff = crate::backoff::Backoff {
        base: Duration::from_millis(1),
        max: Duration::from_millis(1),
        jitter: crate::backoff::Jitter::None,
    };
    // The job dies on its first attempt (token 1); both nodes read it dead.
    let dead_at = |copy: &Job, token: Token| {
        let leased = leased(copy, token);
        let fail = crate::job::Event::Fail {
            token,
            failure: crate::job::Failure::Permanent {
                error: "bad".into(),
            },
            jitter: 0.0,
        };
        crate::job::apply(&leased, fail, &backoff, 2_000).expect("fail")
    };
    let claim = leased(&fresh, 1);
    assert_eq!(
        block(&b, move |s| s.claim_for(&[claim], Duration::from_secs(60))),
        Ok(vec![Some(b"p".to_vec())])
    );
    let died = dead_at(&fresh, 1);
    assert_eq!(died.job.state, State::Dead);
    block(&b, move |s| s.complete(&[died])).expect("die");
    let id = fresh.id;
    let stale =
        block(&a, move |s| s.shared().expect("shared").reload(&[id])).expect("read")[0].clone();
    assert_eq!((stale.state, stale.lease_seq), (State::Dead, 1));
    // Node b: redrive, lease under token 2, dead again.
    let redrive = |copy: &Job| {
        crate::job::apply(
            copy,
            crate::job::Event::Redrive { by: "op".into() },
            &backoff,
            3_000,
        )
        .expect("redrive")
    };
    let on_b = redrive(&stale);
    let again = on_b.job.clone();
    assert_eq!(block(&b, move |s| s.redrive(&[on_b])), Ok(vec![true]));
    let claim = leased(&again, 2);
    assert_eq!(
        block(&b, move |s| s.claim_for(&[claim], Duration::from_secs(60))),
        Ok(vec![Some(b"p".to_vec())])
    );
    let died = dead_at(&again, 2);
    assert_eq!(block(&b, move |s| s.complete(&[died])), Ok(vec![true]));
    // Node a's redrive from its copy read before all that.
    let on_a = redrive(&stale);
    assert_eq!(block(&a, move |s| s.redrive(&[on_a])), Ok(vec![true]));
    let seq = db.psql(&format!(
        "SELECT lease_seq FROM qd_jobs WHERE id = '{}'",
        id.0
    ));
    assert_eq!(seq.trim(), "2", "the stored token sequence went back");
    // So a claim under token 2 (above the stored lease_seq 1) is granted again.
    let reused = leased(&stale, 2);
    assert_eq!(
        block(&a, move |s| s.claim_for(&[reused], Duration::from_secs(60))),
        Ok(vec![None]),
        "token 2 was handed out a second time"
    );
}

/// `beat` answers `Replaced` only when another node id holds this node's name. A
/// row that is merely gone (a database restored from a backup taken before the node
/// joined, a failover to a standby that missed the join) names no other node: it is
/// written again, and the node claims on.
#[test]
fn a_missing_node_row_is_written_again_not_taken_for_a_takeover() {
    let Some(db) = database() else { return };
    let node_a = open_pg(&db.url, &node("a"));
    db.psql("DELETE FROM qd_nodes WHERE name = 'a'");
    let beat = block(&node_a, |s| s.shared().expect("shared").beat());
    assert!(beat.is_ok(), "no other node holds the name, yet: {beat:?}");
    assert_eq!(
        db.psql("SELECT count(*) FROM qd_nodes WHERE name = 'a'"),
        "1"
    );
    let stored = job(1, "q", None);
    let inserted = stored.clone();
    block(&node_a, move |s| insert(s, &inserted, b"p")).expect("insert");
    let claim = leased(&stored, 1);
    assert_eq!(
        block(&node_a, move |s| s
            .claim_for(&[claim], Duration::from_secs(60))),
        Ok(vec![Some(b"p".to_vec())]),
        "claims go on under the rewritten row"
    );
}

/// The stored depth (`qd_queue_depths`, kept by triggers) follows every write of
/// `qd_jobs`, whoever makes it; an enqueue's depth lock keeps another node waiting
/// (then refused, never blocked) until its transaction ends; an external lease's
/// stored end moves with heartbeats, fenced by the token, and decides its expiry.
#[test]
fn the_stored_depth_follows_every_write_and_an_external_lease_ends_by_its_stored_end() {
    let Some(db) = database() else { return };
    let open = |name| PgBackend::open(&config(&db.url), &node(name)).expect("open");
    let (mut a, mut b) = (open("a"), open("b"));
    let jobs: Vec<Job> = (1..=4).map(|n| job(n, "q", None)).collect();
    let stored_depth = || db.psql("SELECT sum(depth) FROM qd_queue_depths WHERE queue = 'q'");
    let rows = || {
        db.psql("SELECT count(*) FROM qd_jobs WHERE queue = 'q' AND state IN ('ready', 'delayed')")
    };
    a.begin().expect("begin");
    a.enqueue(&NewRecord::batch(jobs.clone(), b"p"))
        .expect("enqueue");
    assert_eq!(
        a.queue_depth("q"),
        Ok(Some(4)),
        "its own uncommitted rows count"
    );
    // Another node's enqueue to the queue cannot decide until a commits.
    b.begin().expect("begin b");
    assert_eq!(b.queue_depth("q"), Ok(None), "the depth lock is held by a");
    b.rollback();
    a.commit().expect("commit");
    b.begin().expect("begin b");
    assert_eq!(b.queue_depth("q"), Ok(Some(4)));
    b.rollback();
    assert_eq!((stored_depth(), rows()), ("4".to_owned(), "4".to_owned()));

    // An external lease: claimed with its own end, moved by a heartbeat on b.
    let lease = Duration::from_secs(60);
    a.begin().expect("begin");
    let claimed = a
        .claim_capped_as(&[leased(&jobs[0], 1)], lease, &[], LeaseKind::External)
        .expect("claim");
    assert_eq!(claimed, vec![Claim::Leased(b"p".to_vec())]);
    a.commit().expect("commit");
    assert_eq!(stored_depth(), "4", "a lease still counts");
    b.begin().expect("begin b");
    let id = jobs[0].id;
    assert!(
        b.extend_lease(id, 1, Duration::from_secs(90))
            .expect("beat")
            .is_some()
    );
    assert_eq!(
        b.extend_lease(id, 2, Duration::from_secs(90)),
        Ok(None),
        "stale token"
    );
    b.commit().expect("commit b");
    a.begin().expect("begin");
    match a.end_if_due(&[ack_first(&jobs[0])]).expect("check") {
        checks if matches!(checks[..], [LeaseCheck::Live(left)] if left > Duration::from_secs(80)) =>
            {}
        other => panic!("a lease heartbeated elsewhere is live: {other:?}"),
    }
    a.commit().expect("commit");
    db.psql(&format!(
        "UPDATE qd_jobs SET lease_end = now() - interval '1 second' WHERE id = '{}'",
        id.0
    ));
    a.begin().expect("begin");
    assert_eq!(
        a.end_if_due(&[ack_first(&jobs[0])]),
        Ok(vec![LeaseCheck::Ended])
    );
    assert_eq!(
        a.end_if_due(&[ack_first(&jobs[0])]),
        Ok(vec![LeaseCheck::Gone])
    );
    a.commit().expect("commit");
    // Deleted by hand (another session, no node name): the sum still matches.
    db.psql(&format!(
        "DELETE FROM qd_jobs WHERE id = '{}'",
        jobs[1].id.0
    ));
    assert_eq!((stored_depth(), rows()), ("2".to_owned(), "2".to_owned()));
}
