//! The PostgreSQL schema: its migrations ([`MIGRATIONS`], append only), the
//! version this build reads and writes ([`SCHEMA_VERSION`]) and applying the
//! missing ones at open, once across nodes starting together (under
//! `pg_advisory_xact_lock`). What each version holds is listed in the parent
//! module's doc. Takes no messages: [`PgBackend::open`] calls it.

use std::time::Duration;

use super::{PgBackend, limiter_pause, tenant_depth, tenant_heads};
use crate::store::{Engine, StoreError};

/// Schema migrations, applied in order: `MIGRATIONS[i]` takes a database from version
/// `i` to `i + 1` (recorded as a row of `qd_migrations`). Append only.
const MIGRATIONS: &[&str] = &[
    V1,
    V2,
    V3,
    V4,
    LEASE_END,
    QUEUE_DEPTHS,
    SCHEDULES,
    SQS_QUEUES,
    RESULTS,
    PRIORITY,
    tenant_depth::TENANT_DEPTHS,
    limiter_pause::LIMITER_PAUSES,
    tenant_heads::TENANT_CLAIM_ORDER,
    DEPENDENCIES,
];

/// Version 1: the schema of SQLite's version 2 with leases in the row.
const V1: &str = r#"
CREATE TABLE qd_jobs (
    id              uuid    PRIMARY KEY,
    queue           text    COLLATE "C" NOT NULL,
    tenant          text    COLLATE "C" NOT NULL,
    idempotency_key text    COLLATE "C",
    state           text    COLLATE "C" NOT NULL CHECK (state IN
                        ('delayed', 'ready', 'succeeded', 'dead', 'cancelled')),
    attempts        bigint  NOT NULL CHECK (attempts >= 0),
    budget_start    bigint  NOT NULL CHECK (budget_start >= 0),
    max_attempts    bigint  NOT NULL CHECK (max_attempts >= 0),
    lease_seq       bigint  NOT NULL CHECK (lease_seq >= 0),
    lease_token     bigint,
    worker          text,
    leased_at       bigint,
    lease_deadline  timestamptz,
    created_at      bigint  NOT NULL,
    ready_at        bigint  NOT NULL,
    updated_at      bigint  NOT NULL,
    last_error      text    COLLATE "C",
    CHECK ((lease_token IS NULL) = (lease_deadline IS NULL))
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);
CREATE UNIQUE INDEX qd_jobs_queue_key ON qd_jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX qd_jobs_queue_state_updated ON qd_jobs (queue, state, updated_at, id);
CREATE INDEX qd_jobs_claimable ON qd_jobs (queue, ready_at, id)
    WHERE state IN ('ready', 'delayed');
CREATE INDEX qd_jobs_lease_deadline ON qd_jobs (lease_deadline)
    WHERE lease_token IS NOT NULL;
CREATE TABLE qd_payloads (
    job_id uuid  PRIMARY KEY,
    body   bytea NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.02);
CREATE TABLE qd_history (
    job_id     uuid   NOT NULL,
    seq        bigint NOT NULL,
    attempt    bigint NOT NULL,
    outcome    text   NOT NULL,
    worker     text,
    started_at bigint,
    ended_at   bigint NOT NULL,
    error      text,
    PRIMARY KEY (job_id, seq)
) WITH (autovacuum_vacuum_scale_factor = 0.02);
CREATE TABLE qd_overrides (
    scope text COLLATE "C" NOT NULL,
    name  text COLLATE "C" NOT NULL,
    key   text COLLATE "C" NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (scope, name, key)
);
CREATE TABLE qd_meta (
    key   text   PRIMARY KEY,
    value bigint NOT NULL
);
"#;

/// Version 2: several nodes. Each stored lease names its node (`lease_node`); nodes
/// record their heartbeats in `qd_nodes`; one row of `qd_leader` is the leader lease
/// with its epoch. A lease stored by version 1 names no node: the leader ends it.
const V2: &str = r#"
ALTER TABLE qd_jobs ADD COLUMN lease_node text COLLATE "C";
CREATE INDEX qd_jobs_lease_node ON qd_jobs (lease_node) WHERE lease_token IS NOT NULL;
CREATE TABLE qd_nodes (
    name         text COLLATE "C" PRIMARY KEY,
    node_id      uuid        NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL
);
CREATE TABLE qd_leader (
    id         integer PRIMARY KEY CHECK (id = 1),
    node       text COLLATE "C",
    epoch      bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
INSERT INTO qd_leader (id, node, epoch, expires_at) VALUES (1, NULL, 0, '-infinity');
"#;

/// Version 3: rate limiters shared by every node: one token bucket per limiter.
const V3: &str = r#"
CREATE TABLE qd_rate_limiters (
    name       text COLLATE "C" PRIMARY KEY,
    tokens     float8      NOT NULL,
    updated_at timestamptz NOT NULL,
    per_second float8      NOT NULL,
    burst      float8      NOT NULL
);
"#;

/// Version 4: a tenant's live leases are counted from a small index (only leased
/// rows are in it) before a claim within its concurrency cap.
const V4: &str = r#"
CREATE INDEX qd_jobs_tenant_leases ON qd_jobs (queue, tenant) WHERE lease_token IS NOT NULL;
"#;

/// An external worker's lease has its own stored end (`lease_end`, the database's
/// clock), set at its claim and moved by its heartbeats on any node; a lease of a
/// node's own worker leaves it NULL (it lives and dies with its node).
const LEASE_END: &str = r#"
ALTER TABLE qd_jobs ADD COLUMN lease_end timestamptz;
"#;

/// Each queue's depth (its ready, delayed and leased jobs) kept by the database
/// itself, so an enqueue on any node counts every node's jobs without a scan: one
/// row per queue and writing session (`qd.node`, set by each node's writer), so two
/// nodes never wait on each other's counter; the depth is the sum of a queue's
/// rows. Statement triggers add what each INSERT, UPDATE and DELETE of `qd_jobs`
/// changed, from its transition tables, whatever wrote it. The seed count and the
/// triggers are made with writes to `qd_jobs` locked out (readers go on): a job
/// written by a node of an older build between the count and the triggers would
/// otherwise never be counted.
const QUEUE_DEPTHS: &str = r#"
CREATE TABLE qd_queue_depths (
    queue text   COLLATE "C" NOT NULL,
    shard text   COLLATE "C" NOT NULL,
    depth bigint NOT NULL,
    PRIMARY KEY (queue, shard)
);
LOCK TABLE qd_jobs IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO qd_queue_depths (queue, shard, depth)
    SELECT queue, '', count(*) FROM qd_jobs WHERE state IN ('ready', 'delayed') GROUP BY queue;
CREATE FUNCTION qd_count_depths() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO qd_queue_depths AS d (queue, shard, depth)
        SELECT n.queue, COALESCE(current_setting('qd.node', true), ''), count(*)
        FROM qd_new_rows n WHERE n.state IN ('ready', 'delayed') GROUP BY n.queue
        ON CONFLICT (queue, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO qd_queue_depths AS d (queue, shard, depth)
        SELECT x.queue, COALESCE(current_setting('qd.node', true), ''), sum(x.delta)
        FROM (SELECT n.queue, 1 AS delta FROM qd_new_rows n
                WHERE n.state IN ('ready', 'delayed')
              UNION ALL
              SELECT o.queue, -1 FROM qd_old_rows o WHERE o.state IN ('ready', 'delayed')) x
        GROUP BY x.queue HAVING sum(x.delta) <> 0
        ON CONFLICT (queue, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth;
    ELSE
        INSERT INTO qd_queue_depths AS d (queue, shard, depth)
        SELECT o.queue, COALESCE(current_setting('qd.node', true), ''), -count(*)
        FROM qd_old_rows o WHERE o.state IN ('ready', 'delayed') GROUP BY o.queue
        ON CONFLICT (queue, shard) DO UPDATE SET depth = d.depth + EXCLUDED.depth;
    END IF;
    RETURN NULL;
END
$f$;
CREATE TRIGGER qd_jobs_depth_insert AFTER INSERT ON qd_jobs
    REFERENCING NEW TABLE AS qd_new_rows FOR EACH STATEMENT EXECUTE FUNCTION qd_count_depths();
CREATE TRIGGER qd_jobs_depth_update AFTER UPDATE ON qd_jobs
    REFERENCING OLD TABLE AS qd_old_rows NEW TABLE AS qd_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION qd_count_depths();
CREATE TRIGGER qd_jobs_depth_delete AFTER DELETE ON qd_jobs
    REFERENCING OLD TABLE AS qd_old_rows FOR EACH STATEMENT EXECUTE FUNCTION qd_count_depths();
"#;

/// The queues created through the SQS API (`CreateQueue`), with their SQS
/// attributes and tags as JSON text; every node adds them to its config in force.
const SQS_QUEUES: &str = r#"
CREATE TABLE qd_sqs_queues (
    name        text   COLLATE "C" PRIMARY KEY,
    attributes  text   NOT NULL,
    tags        text   NOT NULL,
    created_at  bigint NOT NULL,
    modified_at bigint NOT NULL
);
"#;

/// A job's priority within its tenant (milliseconds; 0 for jobs stored before). The
/// claims order a tenant's jobs by `ready_at - priority_ms`.
const PRIORITY: &str = r#"
ALTER TABLE qd_jobs ADD COLUMN priority_ms bigint NOT NULL DEFAULT 0;
CREATE INDEX qd_jobs_claim_order ON qd_jobs (queue, (ready_at - priority_ms), id)
    WHERE state IN ('ready', 'delayed');
"#;

/// What a job handed back (an ack's result, at most 1 MiB), written by the ack's
/// fenced `UPDATE` and cleared by a redrive; read by id only, never listed.
const RESULTS: &str = r#"
ALTER TABLE qd_jobs ADD COLUMN result bytea;
"#;

/// Job dependencies (`deps.rs`, `store/postgres/deps.rs`): the states `waiting`
/// and `blocked`, each child's policy and counters of unmet and broken edges, the
/// edges themselves (`qd_job_edges`, the same meaning as SQLite's `job_edges`) with
/// an index by child, and the depth triggers counting waiting and blocked jobs
/// toward the queues' and tenants' `max_depth` (no stored row is waiting or blocked
/// yet: nothing to recount).
/// Claims keep taking only ready and delayed rows.
const DEPENDENCIES: &str = r#"
ALTER TABLE qd_jobs DROP CONSTRAINT qd_jobs_state_check;
ALTER TABLE qd_jobs ADD CONSTRAINT qd_jobs_state_check CHECK (state IN
    ('delayed', 'ready', 'succeeded', 'dead', 'cancelled', 'waiting', 'blocked'));
ALTER TABLE qd_jobs ADD COLUMN after_policy text COLLATE "C",
    ADD COLUMN deps_unmet integer NOT NULL DEFAULT 0 CHECK (deps_unmet >= 0),
    ADD COLUMN deps_broken integer NOT NULL DEFAULT 0 CHECK (deps_broken >= 0);
CREATE TABLE qd_job_edges (
    parent uuid NOT NULL,
    child  uuid NOT NULL,
    state  text COLLATE "C" NOT NULL CHECK (state IN ('open', 'met', 'broken')),
    PRIMARY KEY (parent, child)
) WITH (autovacuum_vacuum_scale_factor = 0.02);
CREATE INDEX qd_job_edges_child ON qd_job_edges (child);
CREATE OR REPLACE FUNCTION qd_count_depths() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE
    node text := COALESCE(current_setting('qd.node', true), '');
BEGIN
    IF TG_OP = 'INSERT' THEN
        WITH x AS (
            SELECT n.queue, n.tenant, count(*) AS delta FROM qd_new_rows n
            WHERE n.state IN ('ready', 'delayed', 'waiting', 'blocked') GROUP BY n.queue, n.tenant
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
                    WHERE n.state IN ('ready', 'delayed', 'waiting', 'blocked')
                  UNION ALL
                  SELECT o.queue, o.tenant, -1 FROM qd_old_rows o
                    WHERE o.state IN ('ready', 'delayed', 'waiting', 'blocked')) u
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
            WHERE o.state IN ('ready', 'delayed', 'waiting', 'blocked') GROUP BY o.queue, o.tenant
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

/// Schedules' stored state: next tick, last run, pause ([`crate::store::schedules`]).
const SCHEDULES: &str = r#"
CREATE TABLE qd_schedules (
    name       text    COLLATE "C" PRIMARY KEY,
    spec       text    NOT NULL,
    next_tick  bigint,
    last_tick  bigint,
    last_job   uuid,
    paused     boolean NOT NULL DEFAULT false,
    updated_at bigint  NOT NULL
);
"#;

/// The newest schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The key of the advisory lock that serialises migrations across nodes ("qd" +
/// "migrate" in ASCII, so it is recognisable in `pg_locks`).
const MIGRATION_LOCK: i64 = 0x7164_6d69_6772_7465;

/// The call deadline of the schema migrations at start-up ([`PgOptions::call_timeout`]
/// is for everyday calls).
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(3600);

impl PgBackend {
    /// Applies the missing migrations in one transaction under the migration lock.
    pub(super) fn migrate(&mut self) -> Result<(), StoreError> {
        // A migration may scan a large table or wait for another node's: it gets
        // its own, long deadline.
        let call_timeout = std::mem::replace(&mut self.options.call_timeout, MIGRATION_TIMEOUT);
        let migrated = self.migrate_now();
        self.options.call_timeout = call_timeout;
        migrated
    }

    pub(super) fn migrate_now(&mut self) -> Result<(), StoreError> {
        let target = self.target.clone();
        let applied = self.block(async |c| {
            c.batch_execute(&format!(
                "BEGIN; SET LOCAL statement_timeout = 0; \
                 SELECT pg_advisory_xact_lock({MIGRATION_LOCK}); \
                 CREATE TABLE IF NOT EXISTS qd_migrations (\
                     version integer PRIMARY KEY, \
                     applied_at timestamptz NOT NULL DEFAULT now())"
            ))
            .await?;
            let found: i32 = c
                .query_one("SELECT COALESCE(MAX(version), 0) FROM qd_migrations", &[])
                .await?
                .get(0);
            let found = u32::try_from(found).unwrap_or(0);
            if found > SCHEMA_VERSION {
                c.batch_execute("ROLLBACK").await?;
                return Ok(Err(StoreError::TooNew {
                    found,
                    supported: SCHEMA_VERSION,
                }));
            }
            let mut applied = Vec::new();
            for (from, sql) in (found..).zip(&MIGRATIONS[found as usize..]) {
                c.batch_execute(sql).await?;
                let version = i32::try_from(from + 1).unwrap_or(i32::MAX);
                c.execute(
                    "INSERT INTO qd_migrations (version) VALUES ($1)",
                    &[&version],
                )
                .await?;
                applied.push(from + 1);
            }
            c.batch_execute("COMMIT").await?;
            Ok(Ok(applied))
        });
        let applied = match applied {
            Ok(result) => result?,
            Err(err) => {
                self.rollback();
                return Err(err);
            }
        };
        for version in applied {
            tracing::info!(target = %target, version, "Store schema migrated.");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::State;
    use crate::store::contract::{DEPTH, STORED};

    fn quoted(states: &[State]) -> String {
        let names: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
        names.join(", ")
    }

    /// The column contract: the row's `CHECK` allows exactly the contract's stored
    /// states, and every depth trigger counts exactly its `max_depth` states.
    #[test]
    fn the_schema_holds_the_contracts_states_and_counts_its_depth_states() {
        let check = format!("CHECK (state IN\n    ({}))", quoted(&STORED));
        assert!(DEPENDENCIES.contains(&check), "{check}");
        let lists: Vec<&str> = DEPENDENCIES
            .split(".state IN (")
            .skip(1)
            .map(|rest| &rest[..rest.find(')').expect("closed")])
            .collect();
        assert_eq!(lists.len(), 4, "the triggers' new and old rows");
        for list in lists {
            assert_eq!(list, quoted(DEPTH));
        }
    }
}
