//! The PostgreSQL engine's cluster facts beside the queue depth: tenants' depths
//! (counted by the depth triggers, decided under a tenant depth lock taken with
//! the queue's in one key order) and rate limiters' pauses stored with their
//! bucket for every node.

use std::str::FromStr;

use super::pg::database;
use super::*;
use crate::config::RateLimiterConfig;
use crate::store::postgres::{PgBackend, PgOptions};
use crate::store::{DepthLock, LeaseKind, SharedStore, Tokens};

fn config(url: &str) -> tokio_postgres::Config {
    tokio_postgres::Config::from_str(url).expect("test url parses")
}

/// The options of a node named `name` (its id derived from the name).
fn node(name: &str) -> PgOptions {
    PgOptions {
        node: name.to_owned(),
        node_id: uuid::Uuid::from_u128(u128::from(name.as_bytes()[0])),
        ..PgOptions::default()
    }
}

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

/// Each tenant's counter (summed over nodes) and its rows, as psql prints them.
fn counted_and_rows(db: &super::pg::Database) -> (String, String) {
    let counted = db.psql(
        "SELECT string_agg(tenant || '=' || n, ',' ORDER BY tenant) FROM \
         (SELECT tenant, sum(depth) AS n FROM qd_tenant_depths WHERE queue = 'q' \
          GROUP BY tenant HAVING sum(depth) <> 0) t",
    );
    let rows = db.psql(
        "SELECT string_agg(tenant || '=' || n, ',' ORDER BY tenant) FROM \
         (SELECT tenant, count(*) AS n FROM qd_jobs WHERE queue = 'q' \
          AND state IN ('ready', 'delayed') GROUP BY tenant) t",
    );
    (counted, rows)
}

/// The tenants' counters follow inserts, leases, acks and deletes on either
/// node or by hand, and the queue's counter stays their sum; a tenant's depth
/// lock, taken up front with the queue's, keeps another node's enqueue of that
/// tenant from deciding (refused, never blocked) but not another tenant's.
#[test]
fn tenant_depths_follow_every_write_and_their_lock_holds_one_tenant_only() {
    let Some(db) = database() else { return };
    let open = |name| PgBackend::open(&config(&db.url), &node(name)).expect("open");
    let (mut a, mut b) = (open("a"), open("b"));
    let acme: Vec<Job> = (1..=3).map(|n| of(n, "acme")).collect();
    let zed: Vec<Job> = (4..=5).map(|n| of(n, "zed")).collect();
    a.begin().expect("begin");
    a.lock_depths(&[
        &DepthLock::Queue("q".into()),
        &DepthLock::Tenant("q".into(), "acme".into()),
    ])
    .expect("locks up front");
    a.enqueue(&NewRecord::batch(acme.clone(), b"p"))
        .expect("enqueue");
    assert_eq!(
        a.tenant_depth("q", "acme"),
        Ok(Some(3)),
        "held: granted again"
    );
    b.begin().expect("begin b");
    assert_eq!(b.tenant_depth("q", "acme"), Ok(None), "held by a");
    assert_eq!(
        b.tenant_depth("q", "zed"),
        Ok(Some(0)),
        "another tenant's lock"
    );
    b.enqueue(&NewRecord::batch(zed.clone(), b"p"))
        .expect("enqueue b");
    b.commit().expect("commit b");
    a.commit().expect("commit");
    b.begin().expect("begin b");
    assert_eq!(b.tenant_depth("q", "acme"), Ok(Some(3)));
    assert_eq!(b.tenant_depth("q", "zed"), Ok(Some(2)));
    b.rollback();
    let expected = ("acme=3,zed=2".to_owned(), "acme=3,zed=2".to_owned());
    assert_eq!(counted_and_rows(&db), expected);

    // A lease counts; its ack on the other node does not any more.
    a.begin().expect("begin");
    a.claim_capped_as(
        &[leased(&acme[0], 1)],
        Duration::from_secs(60),
        &[],
        LeaseKind::External,
    )
    .expect("claim");
    a.commit().expect("commit");
    assert_eq!(counted_and_rows(&db), expected, "a lease still counts");
    b.begin().expect("begin b");
    assert_eq!(b.complete(&[ack_first(&acme[0])]), Ok(vec![true]));
    b.commit().expect("commit b");
    let expected = ("acme=2,zed=2".to_owned(), "acme=2,zed=2".to_owned());
    assert_eq!(counted_and_rows(&db), expected);

    // Deleted and inserted by hand (another session, no node name).
    db.psql(&format!("DELETE FROM qd_jobs WHERE id = '{}'", zed[0].id.0));
    db.psql(&format!(
        "UPDATE qd_jobs SET state = 'dead' WHERE id = '{}'",
        acme[1].id.0
    ));
    let expected = ("acme=1,zed=1".to_owned(), "acme=1,zed=1".to_owned());
    assert_eq!(counted_and_rows(&db), expected);
    let queue = db.psql("SELECT sum(depth) FROM qd_queue_depths WHERE queue = 'q'");
    assert_eq!(queue, "2", "the queue's counter is the tenants' sum");
}

/// A pause stored on one node refuses every node's refill with what is left of
/// it, is listed for heartbeats, keeps the later of two ends, and ends by the
/// database's clock; a pause is never waited for behind another node's refill.
#[test]
fn a_stored_limiter_pause_refuses_every_nodes_refill_until_it_ends() {
    let Some(db) = database() else { return };
    let open = |name| PgBackend::open(&config(&db.url), &node(name)).expect("open");
    let (mut a, mut b) = (open("a"), open("b"));
    let settings = RateLimiterConfig {
        per_second: 10,
        burst: 10,
    };
    a.begin().expect("begin");
    assert_eq!(a.take_tokens("api", 4, &settings), Ok(Tokens::Taken(4)));
    let left = a
        .pause_limiter("api", Duration::from_secs(30), &settings)
        .expect("pause");
    assert!(left > Duration::from_secs(29), "{left:?}");
    let left = a
        .pause_limiter("api", Duration::from_secs(5), &settings)
        .expect("a shorter pause");
    assert!(
        left > Duration::from_secs(29),
        "the later end stays: {left:?}"
    );
    a.commit().expect("commit");
    b.begin().expect("begin b");
    match b.take_tokens("api", 4, &settings) {
        Ok(Tokens::Paused(left)) if left > Duration::from_secs(25) => {}
        other => panic!("another node's refill is refused while paused: {other:?}"),
    }
    let pauses = b.limiter_pauses().expect("pauses");
    assert!(
        matches!(&pauses[..], [(name, left)] if name == "api" && *left > Duration::from_secs(25)),
        "{pauses:?}"
    );
    b.commit().expect("commit b");
    // Over by the database's clock: refills go on, nothing is listed.
    db.psql("UPDATE qd_rate_limiters SET paused_until = now() - interval '1 second'");
    b.begin().expect("begin b");
    assert!(matches!(b.take_tokens("api", 4, &settings), Ok(Tokens::Taken(n)) if n > 0));
    assert_eq!(b.limiter_pauses(), Ok(Vec::new()));
    // b's refill holds the row until it commits: a's pause is tried, not waited.
    a.begin().expect("begin");
    assert!(matches!(
        a.pause_limiter("api", Duration::from_secs(5), &settings),
        Err(StoreError::Busy(_))
    ));
    a.rollback();
    b.commit().expect("commit b");
}

/// Each backlogged tenant's oldest claimable jobs, in claim order, without the
/// leased ones; many tenants share the total, at least one job each.
#[test]
fn tenant_heads_show_every_backlogged_tenants_oldest_claimable_jobs() {
    let Some(db) = database() else { return };
    let mut a = PgBackend::open(&config(&db.url), &node("a")).expect("open");
    let mut jobs: Vec<Job> = (1..=5).map(|n| of(n, "acme")).collect();
    jobs.extend((6..=8).map(|n| of(n, "bee")));
    jobs.push(of(9, "cat"));
    a.begin().expect("begin");
    a.enqueue(&NewRecord::batch(jobs.clone(), b"p"))
        .expect("enqueue");
    a.claim_capped_as(
        &[leased(&jobs[5], 1)],
        Duration::from_secs(60),
        &[],
        LeaseKind::External,
    )
    .expect("claim bee's oldest");
    a.commit().expect("commit");
    let ids = |heads: Vec<Job>| -> Vec<u128> {
        let mut ids: Vec<u128> = heads.iter().map(|j| j.id.0.as_u128()).collect();
        ids.sort_unstable();
        ids
    };
    a.begin().expect("begin");
    let queues = ["q".to_owned()];
    assert_eq!(
        a.tenant_heads(&queues, 2, 100).map(ids),
        Ok(vec![1, 2, 7, 8, 9]),
        "two of each, the lease left out"
    );
    assert_eq!(
        a.tenant_heads(&queues, 2, 2).map(ids),
        Ok(vec![1, 7, 9]),
        "three tenants share two: one each"
    );
    a.commit().expect("commit");
}
