//! The PostgreSQL side of a cluster of nodes sharing the database: a node's
//! joining and heartbeat (`qd_nodes`), the leader lease and its epoch
//! (`qd_leader`), external leases' own ends (extend, end when due), the leader's
//! end of dead nodes' leases, the `max_depth` locks and counters, and the
//! cluster-wide reads (depths, nodes, reloads). Takes no messages: the writer
//! thread calls it through [`PgBackend`]'s [`crate::store::SharedStore`] and `Engine`
//! implementations.

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{
    DEPTH_LOCK_SEED, DEPTH_LOCK_TRIES, DEPTH_LOCK_WAIT, JOB_COLUMNS, PgBackend, map_err, millis,
    stored_seq, tenant_depth, uuids,
};
use crate::job::{Job, JobId, State, Token, Transition, UnixMillis};
use crate::store::contract::{self, Intent};
use crate::store::{DepthLock, LeaseCheck, NodeInfo, StoreError};

impl PgBackend {
    /// Records this node in `qd_nodes` and ends the leases an earlier run of it
    /// held (uncharged, as a restart on SQLite does: their holder died with it). A
    /// name held by another node id whose heartbeat is younger than `node_timeout`
    /// is refused.
    pub(super) fn join(&mut self) -> Result<(), StoreError> {
        let name = self.options.node.clone();
        let id = self.options.node_id;
        // The name's silent holder may still be stopping its attempts (fencing).
        let timeout_ms = millis(self.options.node_timeout + self.options.fence_wait);
        let (joined, released) = self.block(async |c| {
            let joined = c
                .query_opt(
                    "INSERT INTO qd_nodes (name, node_id, started_at, heartbeat_at) \
                     VALUES ($1, $2, now(), now()) \
                     ON CONFLICT (name) DO UPDATE SET node_id = EXCLUDED.node_id, \
                       started_at = now(), heartbeat_at = now() \
                     WHERE qd_nodes.node_id = EXCLUDED.node_id \
                       OR qd_nodes.heartbeat_at <= now() - $3::int8 * interval '1 millisecond' \
                     RETURNING 1",
                    &[&name, &id, &timeout_ms],
                )
                .await?
                .is_some();
            if !joined {
                return Ok((false, 0));
            }
            // An external worker's live lease is its worker's, not this run's: it
            // is let go of by this name (no node holds it) and kept until its
            // stored end, when the leader ends it as any dead node's lease.
            c.execute(
                "UPDATE qd_jobs SET lease_node = NULL, \
                   lease_deadline = GREATEST(lease_deadline, lease_end) \
                 WHERE lease_node = $1 AND lease_token IS NOT NULL AND lease_end > now()",
                &[&name],
            )
            .await?;
            let released = c
                .execute(
                    "UPDATE qd_jobs SET lease_token = NULL, worker = NULL, leased_at = NULL, \
                       lease_deadline = NULL, lease_node = NULL, lease_end = NULL \
                     WHERE lease_node = $1 AND lease_token IS NOT NULL",
                    &[&name],
                )
                .await?;
            Ok((true, released))
        })?;
        if !joined {
            return Err(StoreError::Other(format!(
                "{}: another live node is named {name:?} (its heartbeat is younger than \
                 node_timeout); give each node its own daemon.node_name",
                self.target
            )));
        }
        if released > 0 {
            tracing::info!(node = %name, released, "Leases held by this node's earlier run ended; their jobs are ready again.");
        }
        Ok(())
    }

    /// The SQL condition (over `j`, a row of `qd_jobs`) of a lease that ended
    /// without its holder: held by another node, and past its deadline by
    /// `fence_wait` or its node's heartbeat older than `node_timeout + fence_wait`
    /// (the silent node stops its attempts within that wait: self-fencing). The
    /// node name is checked by the config (no quote can occur in it).
    pub(super) fn lease_lost(&self) -> String {
        format!(
            "j.lease_token IS NOT NULL AND j.lease_node IS DISTINCT FROM '{node}' \
             AND (j.lease_deadline <= now() - {wait}::int8 * interval '1 millisecond' \
               OR (NOT EXISTS (SELECT 1 FROM qd_nodes n \
               WHERE n.name = j.lease_node \
                 AND n.heartbeat_at > now() - {timeout}::int8 * interval '1 millisecond') \
               AND (j.lease_end IS NULL OR j.lease_end <= now())))",
            node = self.options.node,
            wait = millis(self.options.fence_wait),
            timeout = millis(self.options.node_timeout + self.options.fence_wait),
        )
    }
}

pub(super) fn reload(pg: &mut PgBackend, ids: &[JobId]) -> Result<Vec<Job>, StoreError> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM qd_jobs j WHERE j.id = ANY($1::uuid[])");
    pg.query_jobs(&sql, &[&uuids(ids)])
}

/// The leases' deadlines are renewed on the rows no other transaction holds
/// (`SKIP LOCKED`): a row held elsewhere is being ended or changed by that
/// transaction (an ack on another node, which then waits on rows this batch
/// holds, e.g. a child's lock of job dependencies), and waiting for it could
/// close a cycle; it is renewed at the next heartbeat, four of which come
/// before its deadline. The leader row and a limiter's bucket are locked with
/// `SKIP LOCKED`, never waited for: they are taken inside the writer's group
/// commit beside other work, and two nodes' batches must not wait on each
/// other (a deadlock). A
/// leader lease not renewed because another node's transaction held the row is
/// renewed at the next heartbeat (it lasts five of them); meanwhile the answer is
/// the epoch of the last heartbeat that could look (its writes stay fenced by
/// the row itself).
pub(super) fn beat(pg: &mut PgBackend) -> Result<Option<u64>, StoreError> {
    let name = pg.options.node.clone();
    let id = pg.options.node_id;
    let timeout_ms = millis(pg.options.node_timeout);
    let (alive, led) = pg.block(async |c| {
        let stmt = c
            .prepare_cached(
                "WITH me AS (\
                   UPDATE qd_nodes SET heartbeat_at = now() \
                   WHERE name = $1 AND node_id = $2 RETURNING name), \
                 renewed AS (\
                   UPDATE qd_jobs SET lease_deadline = \
                     GREATEST(lease_deadline, now() + $3::int8 * interval '1 millisecond') \
                   WHERE id IN (SELECT id FROM qd_jobs \
                     WHERE lease_node = $1 AND lease_token IS NOT NULL \
                     FOR UPDATE SKIP LOCKED) \
                     AND EXISTS (SELECT 1 FROM me) RETURNING 1) \
                 SELECT (SELECT count(*) FROM me), (SELECT count(*) FROM renewed)",
            )
            .await?;
        let row = c.query_one(&stmt, &[&name, &id, &timeout_ms]).await?;
        if row.get::<_, i64>(0) == 0 {
            // No row of this node: taken over only if another node id holds the
            // name. A row that is simply gone (a restored or failed-over
            // database, an operator's cleanup) is written again.
            let stmt = c
                .prepare_cached(
                    "INSERT INTO qd_nodes (name, node_id, started_at, heartbeat_at) \
                     VALUES ($1, $2, now(), now()) ON CONFLICT (name) DO NOTHING RETURNING 1",
                )
                .await?;
            if c.query_opt(&stmt, &[&name, &id]).await?.is_none() {
                return Ok((false, None));
            }
            tracing::warn!(node = %name, "This node's row in qd_nodes was gone; written again.");
        }
        let stmt = c
            .prepare_cached("SELECT id FROM qd_leader WHERE id = 1 FOR UPDATE SKIP LOCKED")
            .await?;
        if c.query_opt(&stmt, &[]).await?.is_none() {
            // Another node's transaction holds the row: ask again next time.
            return Ok((true, None));
        }
        let stmt = c
            .prepare_cached(
                "UPDATE qd_leader SET node = $1, \
                   epoch = CASE WHEN node = $1 THEN epoch ELSE epoch + 1 END, \
                   expires_at = now() + $2::int8 * interval '1 millisecond' \
                 WHERE id = 1 AND (node = $1 OR expires_at <= now()) RETURNING epoch",
            )
            .await?;
        let epoch = c.query_opt(&stmt, &[&name, &timeout_ms]).await?;
        Ok((true, Some(epoch.map(|r| r.get::<_, i64>(0)))))
    })?;
    if !alive {
        return Err(StoreError::Replaced(format!(
            "{}: node {name:?} was replaced by another node of the same name; \
             give each node its own daemon.node_name",
            pg.target
        )));
    }
    if let Some(epoch) = led {
        pg.epoch = epoch.and_then(|e| u64::try_from(e).ok());
    }
    Ok(pg.epoch)
}

pub(super) fn own_leases(pg: &mut PgBackend) -> Result<Vec<Job>, StoreError> {
    // Only while the name is still this node's: a node whose name was taken over
    // must not see (and end as orphans) the leases of the name's new holder.
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM qd_jobs j \
         WHERE j.lease_node = $1 AND j.lease_token IS NOT NULL \
           AND EXISTS (SELECT 1 FROM qd_nodes n WHERE n.name = $1 AND n.node_id = $2)"
    );
    let (node, id) = (pg.options.node.clone(), pg.options.node_id);
    pg.query_jobs(&sql, &[&node, &id])
}

pub(super) fn expired_leases(pg: &mut PgBackend, limit: u32) -> Result<Vec<Job>, StoreError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM qd_jobs j WHERE {} ORDER BY j.lease_deadline LIMIT $1",
        pg.lease_lost()
    );
    pg.query_jobs(&sql, &[&i64::from(limit)])
}

pub(super) fn expire(
    pg: &mut PgBackend,
    ends: &[Transition],
    epoch: u64,
) -> Result<Vec<bool>, StoreError> {
    let condition = format!(
        "j.lease_token = t.lease_seq AND {} AND {} \
         AND EXISTS (SELECT 1 FROM qd_leader l WHERE l.id = 1 AND l.node = '{}' \
           AND l.epoch = {epoch} AND l.expires_at > now())",
        Intent::Complete.sql("j.state"),
        pg.lease_lost(),
        pg.options.node,
    );
    pg.change(ends, &condition)
}

pub(super) fn extend_lease(
    pg: &mut PgBackend,
    id: JobId,
    token: Token,
    extend: Duration,
) -> Result<Option<UnixMillis>, StoreError> {
    let (uuid, token, extend) = (id.0, stored_seq(token), millis(extend));
    let row = pg.block(async |c| {
        let stmt = c
            .prepare_cached(
                "UPDATE qd_jobs SET \
                   lease_end = now() + $3::int8 * interval '1 millisecond', \
                   lease_deadline = GREATEST(lease_deadline, \
                     now() + $3::int8 * interval '1 millisecond') \
                 WHERE id = $1 AND lease_token = $2 \
                 RETURNING (extract(epoch FROM lease_end) * 1000)::int8",
            )
            .await?;
        c.query_opt(&stmt, &[&uuid, &token, &extend]).await
    })?;
    Ok(row.map(|r| r.get::<_, i64>(0)))
}

pub(super) fn end_if_due(
    pg: &mut PgBackend,
    ends: &[Transition],
) -> Result<Vec<LeaseCheck>, StoreError> {
    // A lease with no stored end (taken for a node's own worker) is due when
    // its holder's timer says so.
    let condition = format!(
        "j.lease_token = t.lease_seq AND {} \
         AND COALESCE(j.lease_end, '-infinity') <= now()",
        Intent::Complete.sql("j.state")
    );
    let applied = pg.change(ends, &condition)?;
    let open: Vec<Uuid> = ends
        .iter()
        .zip(&applied)
        .filter(|(_, a)| !**a)
        .map(|(t, _)| t.job.id.0)
        .collect();
    let live: HashMap<Uuid, (i64, i64)> = if open.is_empty() {
        HashMap::new()
    } else {
        let rows = pg.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "SELECT id, lease_token, \
                       GREATEST(0, extract(epoch FROM lease_end - now()) * 1000)::int8 \
                     FROM qd_jobs WHERE id = ANY($1::uuid[]) AND lease_token IS NOT NULL \
                       AND lease_end IS NOT NULL",
                )
                .await?;
            c.query(&stmt, &[&open]).await
        })?;
        rows.iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    };
    Ok(ends
        .iter()
        .zip(applied)
        .map(|(t, applied)| match live.get(&t.job.id.0) {
            _ if applied => LeaseCheck::Ended,
            Some((token, left)) if *token == stored_seq(t.job.lease_seq) => {
                LeaseCheck::Live(Duration::from_millis(u64::try_from(*left).unwrap_or(0)))
            }
            _ => LeaseCheck::Gone,
        })
        .collect())
}

pub(super) fn queue_depth(pg: &mut PgBackend, queue: &str) -> Result<Option<u64>, StoreError> {
    for _ in 0..DEPTH_LOCK_TRIES {
        // Pipelined: the count's snapshot is taken after the lock's statement
        // ran, so it shows every enqueue committed before the lock was free.
        let (locked, depth) = pg.block(async |c| {
            let lock = c
                .prepare_cached(&format!(
                    "SELECT pg_try_advisory_xact_lock(hashtextextended($1, {DEPTH_LOCK_SEED}))"
                ))
                .await?;
            let count = c
                .prepare_cached(
                    "SELECT COALESCE(sum(depth), 0)::int8 FROM qd_queue_depths \
                     WHERE queue = $1",
                )
                .await?;
            let args: [&(dyn ToSql + Sync); 1] = [&queue];
            let (locked, depth) =
                tokio::try_join!(c.query_one(&lock, &args), c.query_one(&count, &args))?;
            Ok((locked.get::<_, bool>(0), depth.get::<_, i64>(0)))
        })?;
        if locked {
            return Ok(Some(u64::try_from(depth).unwrap_or(0)));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(None)
}

pub(super) fn depths(
    pg: &mut PgBackend,
    now: UnixMillis,
) -> Result<Vec<(String, State, u64)>, StoreError> {
    let sql = format!(
        "SELECT queue, CASE WHEN lease_token IS NOT NULL THEN 'leased' \
           WHEN state = 'delayed' AND ready_at <= $1 THEN 'ready' ELSE state END \
           AS shown, count(*) \
         FROM qd_jobs WHERE {} GROUP BY 1, 2",
        contract::any_of("state", contract::UNFINISHED)
    );
    let rows = pg.block(async |c| {
        let stmt = c.prepare_cached(&sql).await?;
        c.query(&stmt, &[&now]).await
    })?;
    rows.iter()
        .map(|r| {
            let state: String = r.get(1);
            let state = state
                .parse()
                .map_err(|e: String| StoreError::Corrupt(format!("{}: {e}", pg.target)))?;
            Ok((
                r.get(0),
                state,
                u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
            ))
        })
        .collect()
}

pub(super) fn nodes(pg: &mut PgBackend) -> Result<Vec<NodeInfo>, StoreError> {
    let rows = pg.block(async |c| {
        c.query(
            "SELECT n.name, (extract(epoch FROM n.started_at) * 1000)::int8, \
               GREATEST(0, extract(epoch FROM now() - n.heartbeat_at) * 1000)::int8, \
               l.node IS NOT DISTINCT FROM n.name AND l.expires_at > now(), l.epoch \
             FROM qd_nodes n CROSS JOIN qd_leader l ORDER BY n.name",
            &[],
        )
        .await
    })?;
    Ok(rows
        .iter()
        .map(|r| {
            let leader: bool = r.get(3);
            NodeInfo {
                name: r.get(0),
                started_at: r.get(1),
                heartbeat_age_ms: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
                leader,
                epoch: leader.then(|| u64::try_from(r.get::<_, i64>(4)).unwrap_or(0)),
            }
        })
        .collect())
}

/// Waits for the depth locks of `queues`, sorted by lock key (the order every
/// node uses), at most [`DEPTH_LOCK_WAIT`] in all. The batch holds nothing
/// yet, and any other holder took its depth locks in the same order before
/// anything else, so the waits cannot form a cycle. Given up after the wait
/// (the savepoint undoes the locks taken), the operations try the locks
/// themselves and answer busy as before.
pub(super) fn lock_depths(pg: &mut PgBackend, locks: &[&DepthLock]) -> Result<(), StoreError> {
    pg.exec(&format!(
        "SAVEPOINT depth_locks; SET LOCAL lock_timeout = {}",
        millis(DEPTH_LOCK_WAIT)
    ))?;
    let locked = match tenant_depth::sorted_keys(pg, locks)? {
        Ok(keys) => pg.block_raw(async |c| {
            let lock = c.prepare_cached("SELECT pg_advisory_xact_lock($1)").await?;
            for key in keys {
                c.execute(&lock, &[&key]).await?;
            }
            Ok(())
        })?,
        Err(e) => Err(e),
    };
    match locked {
        Ok(()) => pg.exec("SET LOCAL lock_timeout = DEFAULT; RELEASE SAVEPOINT depth_locks"),
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            tracing::debug!(
                ?locks,
                "Depth locks still held by another node; each enqueue tries its own."
            );
            pg.exec("ROLLBACK TO SAVEPOINT depth_locks; RELEASE SAVEPOINT depth_locks")
        }
        Err(e) => Err(map_err(&pg.target, &e)),
    }
}
