//! A tenant's `max_depth` across the cluster: the tenant depth counters
//! (`qd_tenant_depths`, kept by the same statement triggers as the queue depths)
//! and the tenant depth locks, taken with the queue depth locks in one key order.
//!
//! Why a second table rather than a tenant column in `qd_queue_depths`: the queue
//! depth is read by every enqueue and must stay a sum over one row per node; with
//! a tenant column it would become a sum over one row per node *and tenant*, so
//! every enqueue would pay for the number of tenants. Kept apart, each enqueue
//! reads only the rows it needs (one per node), and the triggers stay one
//! statement each: the per-(queue, tenant) changes are computed once from the
//! transition tables and summed per queue from that, so the only added work per
//! write statement is one upsert per (queue, tenant) whose depth changed (none
//! for a heartbeat or a lease, which change no depth).
//!
//! Takes no messages: the writer thread calls it through [`super::PgBackend`].

use std::time::Duration;

use tokio_postgres::types::ToSql;

use super::{DEPTH_LOCK_SEED, DEPTH_LOCK_TRIES, PgBackend};
use crate::store::{DepthLock, StoreError};

/// The tenants' depths beside the queues': `qd_tenant_depths` holds one row per
/// queue, tenant and writing node, seeded from the jobs with writes to `qd_jobs`
/// locked out (as `QUEUE_DEPTHS` was), and the queue depth trigger function now
/// keeps both tables in one statement per write.
pub(super) const TENANT_DEPTHS: &str = r#"
CREATE TABLE qd_tenant_depths (
    queue  text   COLLATE "C" NOT NULL,
    tenant text   COLLATE "C" NOT NULL,
    shard  text   COLLATE "C" NOT NULL,
    depth  bigint NOT NULL,
    PRIMARY KEY (queue, tenant, shard)
);
LOCK TABLE qd_jobs IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO qd_tenant_depths (queue, tenant, shard, depth)
    SELECT queue, tenant, '', count(*) FROM qd_jobs WHERE state IN ('ready', 'delayed')
    GROUP BY queue, tenant;
CREATE OR REPLACE FUNCTION qd_count_depths() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE
    node text := COALESCE(current_setting('qd.node', true), '');
BEGIN
    IF TG_OP = 'INSERT' THEN
        WITH x AS (
            SELECT n.queue, n.tenant, count(*) AS delta FROM qd_new_rows n
            WHERE n.state IN ('ready', 'delayed') GROUP BY n.queue, n.tenant
        ), t AS (
            INSERT INTO qd_tenant_depths AS d (queue, tenant, shard, depth)
            SELECT x.queue, x.tenant, node, x.delta FROM x
            ON CONFLICT (queue, tenant, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth
        )
        INSERT INTO qd_queue_depths AS d (queue, shard, depth)
        SELECT x.queue, node, sum(x.delta)::int8 FROM x GROUP BY x.queue
        ON CONFLICT (queue, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth;
    ELSIF TG_OP = 'UPDATE' THEN
        WITH x AS (
            SELECT u.queue, u.tenant, sum(u.delta)::int8 AS delta
            FROM (SELECT n.queue, n.tenant, 1 AS delta FROM qd_new_rows n
                    WHERE n.state IN ('ready', 'delayed')
                  UNION ALL
                  SELECT o.queue, o.tenant, -1 FROM qd_old_rows o
                    WHERE o.state IN ('ready', 'delayed')) u
            GROUP BY u.queue, u.tenant HAVING sum(u.delta) <> 0
        ), t AS (
            INSERT INTO qd_tenant_depths AS d (queue, tenant, shard, depth)
            SELECT x.queue, x.tenant, node, x.delta FROM x
            ON CONFLICT (queue, tenant, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth
        )
        INSERT INTO qd_queue_depths AS d (queue, shard, depth)
        SELECT x.queue, node, sum(x.delta)::int8 FROM x GROUP BY x.queue
        HAVING sum(x.delta) <> 0
        ON CONFLICT (queue, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth;
    ELSE
        WITH x AS (
            SELECT o.queue, o.tenant, -count(*) AS delta FROM qd_old_rows o
            WHERE o.state IN ('ready', 'delayed') GROUP BY o.queue, o.tenant
        ), t AS (
            INSERT INTO qd_tenant_depths AS d (queue, tenant, shard, depth)
            SELECT x.queue, x.tenant, node, x.delta FROM x
            ON CONFLICT (queue, tenant, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth
        )
        INSERT INTO qd_queue_depths AS d (queue, shard, depth)
        SELECT x.queue, node, sum(x.delta)::int8 FROM x GROUP BY x.queue
        ON CONFLICT (queue, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth;
    END IF;
    RETURN NULL;
END
$f$;
"#;

/// The seed of a tenant's depth lock key in a queue:
/// `hashtextextended(queue || chr(1) || tenant, TENANT_DEPTH_LOCK_SEED)` ("qdtdepth"
/// in ASCII). Two pairs (or a pair and a queue) that share a key only serialise
/// each other's enqueues.
const TENANT_DEPTH_LOCK_SEED: i64 = 0x7164_7464_6570_7468;

/// The SQL expression of a tenant's depth lock key from `$1` (queue) and `$2`
/// (tenant), or from any two text expressions put in their place.
fn tenant_key(queue: &str, tenant: &str) -> String {
    format!("hashtextextended({queue} || chr(1) || {tenant}, {TENANT_DEPTH_LOCK_SEED})")
}

/// Every distinct key of `locks`, queue and tenant locks alike, in ascending
/// order: the one order in which every node takes them.
pub(super) fn sorted_keys(
    pg: &mut PgBackend,
    locks: &[&DepthLock],
) -> Result<Result<Vec<i64>, tokio_postgres::Error>, StoreError> {
    let mut queues: Vec<&str> = Vec::new();
    let (mut tenant_queues, mut tenants): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    for lock in locks {
        match lock {
            DepthLock::Queue(queue) => queues.push(queue),
            DepthLock::Tenant(queue, tenant) => {
                tenant_queues.push(queue);
                tenants.push(tenant);
            }
        }
    }
    let sql = format!(
        "SELECT k FROM (\
           SELECT hashtextextended(q, {DEPTH_LOCK_SEED}) AS k FROM unnest($1::text[]) AS q \
           UNION \
           SELECT {} FROM unnest($2::text[], $3::text[]) AS t(tq, tt)) keys ORDER BY k",
        tenant_key("tq", "tt")
    );
    pg.block_raw(async |c| {
        let stmt = c.prepare_cached(&sql).await?;
        let rows = c.query(&stmt, &[&queues, &tenant_queues, &tenants]).await?;
        Ok(rows.iter().map(|r| r.get::<_, i64>(0)).collect())
    })
}

/// [`crate::store::SharedStore::tenant_depth`]: tries the tenant's depth lock
/// (held already when the writer took the batch's locks up front: then it is
/// granted at once) and sums the tenant's counter rows, pipelined so the count's
/// snapshot follows the lock.
pub(super) fn tenant_depth(
    pg: &mut PgBackend,
    queue: &str,
    tenant: &str,
) -> Result<Option<u64>, StoreError> {
    let lock_sql = format!(
        "SELECT pg_try_advisory_xact_lock({})",
        tenant_key("$1", "$2")
    );
    for _ in 0..DEPTH_LOCK_TRIES {
        let (locked, depth) = pg.block(async |c| {
            let lock = c.prepare_cached(&lock_sql).await?;
            let count = c
                .prepare_cached(
                    "SELECT COALESCE(sum(depth), 0)::int8 FROM qd_tenant_depths \
                     WHERE queue = $1 AND tenant = $2",
                )
                .await?;
            let args: [&(dyn ToSql + Sync); 2] = [&queue, &tenant];
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
