//! The PostgreSQL engine: the same [`Backend`] contract as SQLite over a database that
//! several qd nodes may share. Owns the PostgreSQL schema ([`MIGRATIONS`]), the
//! connection of the writer thread and the SQL of every operation. It takes no
//! messages: the writer thread (`store/writer.rs`) calls it.
//!
//! # Shape
//! The writer thread is a plain OS thread with a synchronous [`Backend`]. This engine
//! owns a current-thread tokio runtime, created on that thread, and drives a
//! `tokio_postgres` client with `block_on`, one call per statement. The client comes
//! from a one-connection `deadpool_postgres` pool, taken at the start of each batch:
//! the pool keeps the statement cache and replaces a connection it finds closed, so a
//! database that went away and came back is reconnected at the next batch. The
//! synchronous `postgres` crate would wrap the same client in its own runtime;
//! deadpool (reconnects, statement cache) and the cluster's parts on the daemon's
//! runtime (LISTEN/NOTIFY, the node heartbeat in `cluster.rs`) build on
//! `tokio-postgres` directly, so one client library serves both.
//!
//! # Differences from SQLite (same contract, see [`Backend`])
//! - **Leases are stored in the row** (`lease_token`, `worker`, `leased_at`,
//!   `lease_deadline`, `lease_node`), so every node sees them. The deadline is the
//!   **database's** clock, `now()` (the transaction's start) plus the longer of the
//!   lease's length and `node_timeout`, never a node's; the holder's heartbeat
//!   ([`SharedStore::beat`], every `node_timeout / 5`) keeps it at least
//!   `node_timeout` ahead. So the stored deadline never passes while the holder
//!   heartbeats, however short the lease: a live node's leases expire by its own
//!   memory (which keeps the lease's length), and the leader ends only those of a
//!   node silent for `node_timeout`. An external worker's lease also stores its
//!   own end (`lease_end`), which its heartbeats on any node move
//!   ([`SharedStore::extend_lease`]): its node ends it only once that end passed
//!   ([`SharedStore::end_if_due`]), and the leader ends it for a silent node
//!   only then too, since the worker may report to any other node. A claim applies to a ready or delayed job with
//!   no lease, and only with a token above every token the job had (`lease_seq <
//!   token`): a node with a stale copy of a job cannot reuse a token another node
//!   handed out. A claim also stores `lease_seq = token`, so the next token is above
//!   it, and no write takes `lease_seq` back (a change planned on a stale copy keeps
//!   the stored one when it is higher).
//! - Ending a lease ([`Backend::complete`]) is fenced by the token: a lease past its
//!   deadline can still be ended by its holder until the leader ended it
//!   ([`SharedStore::expire`], fenced by the leader's epoch as well).
//! - A node that opens the store ends the leases its earlier run held (its name in
//!   `lease_node`), uncharged, as a restart on SQLite does, except external
//!   workers' leases whose `lease_end` has not passed: those lose their node and
//!   the leader ends them once it passes. It may take its name only
//!   if it is the same node (its id) or the name's holder is silent. A node whose
//!   name was taken over claims nothing (every claim applies only while `qd_nodes`
//!   holds its name with its id), and its heartbeat is refused
//!   ([`StoreError::Replaced`]).
//! - Batches are set-based: one `UPDATE ... FROM unnest($1, $2, ...)` per call
//!   (conditioned per row on state and token, answered per item from `RETURNING`),
//!   one `INSERT ... ON CONFLICT DO NOTHING` per enqueue batch. A batch naming the same
//!   job twice runs item by item instead, so it answers exactly as a sequence would.
//! - [`Backend::release_space`] answers 0: autovacuum reclaims space (its settings
//!   for the hot table are part of the schema).
//! - Durability: `COMMIT` returns after the WAL is flushed when `synchronous_commit`
//!   is `on` (PostgreSQL's default); a session finding it `off` sets it `on`, since a
//!   `202` promises the job is on disk. What a standby adds is the operator's choice
//!   (`remote_apply`, `remote_write` are kept).
//!
//! - **Tenants' concurrency caps hold across nodes** ([`SharedStore::claim_capped`]):
//!   a claim of a capped tenant first takes a transaction-scoped advisory lock on
//!   its queue and tenant (`pg_try_advisory_xact_lock`, never waited for: a tenant
//!   another node is claiming for gets nothing this time), then counts the
//!   tenant's live leases in `qd_jobs` in the next statement (so it sees every
//!   claim committed before the lock was free) and claims at most what the cap
//!   leaves. Claims of tenants without a cap take no lock and no extra statement.
//!
//! - **`max_depth` counts every node's jobs**: triggers keep each queue's depth in
//!   `qd_queue_depths` (one row per queue and writing node), and an enqueue takes
//!   the queue's depth lock and sums the rows in its own transaction
//!   ([`SharedStore::queue_depth`]). The writer takes a batch's depth locks up
//!   front, sorted by key, before anything else ([`Engine::lock_depths`]), so two
//!   nodes' batches never hold one queue's lock each while wanting the other's.
//!   A tenant's `max_depth` is the same with a counter and a lock per queue and
//!   tenant (`postgres/tenant_depth.rs`); both kinds of lock are taken up front
//!   in one key order.
//!
//! # Schema (version 6, in `qd_migrations`)
//! ```text
//! qd_jobs(id uuid PK, queue, tenant, idempotency_key NULL, state text COLLATE "C"
//!         in (delayed ready succeeded dead cancelled), attempts, budget_start,
//!         max_attempts, lease_seq bigint, lease_token bigint NULL, worker text NULL,
//!         leased_at bigint NULL (Unix ms, the claimer's clock), lease_deadline
//!         timestamptz NULL (the database's clock), created_at, ready_at, updated_at
//!         bigint (Unix ms), last_error text NULL)
//!   UNIQUE (queue, idempotency_key) WHERE idempotency_key IS NOT NULL
//!   INDEX (queue, state, updated_at, id)       -- prune, listings, DLQ views
//!   INDEX (queue, ready_at, id) WHERE state IN ('ready', 'delayed')  -- claim_next
//!   INDEX (lease_deadline) WHERE lease_token IS NOT NULL  -- expired-lease sweeps
//! qd_payloads(job_id uuid PK, body bytea)     -- written once at enqueue
//! qd_history(job_id uuid, seq bigint, attempt bigint, outcome text, worker text NULL,
//!            started_at bigint NULL, ended_at bigint, error text NULL) PK (job_id, seq)
//! qd_overrides(scope, name, key, value text)  PK (scope, name, key)
//! qd_meta(key text PK, value bigint)          -- "probe"
//! -- version 2: several nodes
//! qd_jobs.lease_node text NULL                -- the node holding the lease
//! qd_nodes(name PK, node_id uuid, started_at, heartbeat_at timestamptz)
//! qd_leader(id = 1 PK, node text NULL, epoch bigint, expires_at timestamptz)
//! -- version 3: rate limiters shared by the nodes
//! qd_rate_limiters(name PK, tokens float8, updated_at timestamptz, per_second,
//!                  burst float8)      -- settings changed: the bucket starts full
//! -- version 4: tenants' caps across nodes
//!   INDEX (queue, tenant) WHERE lease_token IS NOT NULL  -- a tenant's live leases
//! -- version 5: external leases outlive their node
//! qd_jobs.lease_end timestamptz NULL          -- an external lease's own end
//! -- version 6: queue depths across the cluster
//! qd_queue_depths(queue, shard, depth bigint) PK (queue, shard)
//!   -- statement triggers on qd_jobs keep sum(depth) = its ready/delayed rows
//! -- SQS-created queues
//! qd_sqs_queues(name PK, attributes text, tags text, created_at, modified_at bigint)
//! -- RESULTS: what a job handed back
//! qd_jobs.result bytea NULL           -- set by the ack's fenced UPDATE, NULL on redrive
//! -- PRIORITY: a job's priority within its tenant
//! qd_jobs.priority_ms bigint NOT NULL DEFAULT 0
//!   INDEX (queue, (ready_at - priority_ms), id) WHERE state IN ('ready', 'delayed')
//!                                   -- claim_next, claimable: the priority order
//! -- TENANT_DEPTHS: tenants' depths across the cluster
//! qd_tenant_depths(queue, tenant, shard, depth bigint) PK (queue, tenant, shard)
//!   -- kept by the same statement triggers as qd_queue_depths
//! -- LIMITER_PAUSES: a throttled result pauses a limiter on every node
//! qd_rate_limiters.paused_until timestamptz NULL  -- the database's clock
//! -- TENANT_CLAIM_ORDER: each tenant's claimable jobs beyond the look's window
//!   INDEX (queue, tenant, (ready_at - priority_ms), id) WHERE state IN ('ready', 'delayed')
//! -- DEPENDENCIES: job dependencies (`after`, see `store/postgres/deps.rs`)
//! qd_jobs.state also in (waiting blocked)  -- counted toward max_depth, never claimed
//! qd_jobs.after_policy text NULL, deps_unmet, deps_broken integer  -- a child's counters
//! qd_job_edges(parent uuid, child uuid, state text in (open met broken))
//!   PK (parent, child), INDEX (child)
//! ```
//! Text that is compared or ordered is `COLLATE "C"` (byte order, ASCII-only case
//! folding, like SQLite), whatever the database's locale. Tables are prefixed `qd_` so
//! the database may be shared with other applications. Migrations are applied by the
//! first node that starts, in one transaction under `pg_advisory_xact_lock`, so nodes
//! starting together apply them once; a database whose newest migration is newer than
//! this build knows is refused ([`StoreError::TooNew`]).
//!
//! PostgreSQL text cannot hold NUL characters: a job whose queue, tenant, key or error
//! contains one is refused by the database ([`StoreError::Other`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use super::sql_filter::{self, Arg, Dialect};
use super::{
    Backend, Claim, DepthLock, Engine, HistoryLimits, Inserted, JobDetail, JobFilter, LeaseCheck,
    LeaseKind, NewClaim, NewRecord, NodeInfo, Override, ParentView, PruneScope, SharedStore,
    SqsQueueRecord, StoreError, TenantCap, Tokens, history, sort_counts,
};
use crate::job::{HistoryEntry, Job, JobId, State, Token, Transition, UnixMillis};

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

mod deps;

/// The seed of a queue's depth lock key (`hashtextextended(queue, DEPTH_LOCK_SEED)`,
/// "qddepth" in ASCII), taken by every enqueue to the queue until its transaction
/// ends ([`SharedStore::queue_depth`]).
const DEPTH_LOCK_SEED: i64 = 0x0071_6464_6570_7468;

/// How many times an enqueue tries a queue's depth lock (about 2 ms apart) before
/// it is refused as unavailable, when the writer did not take it up front
/// ([`Engine::lock_depths`] gave up after [`DEPTH_LOCK_WAIT`]). Inside an
/// operation the lock is tried, never waited for: the group commit may then hold
/// row locks another node's transaction waits on, and a wait could close a cycle
/// PostgreSQL would break by failing a statement.
const DEPTH_LOCK_TRIES: u32 = 100;

/// How long a group commit waits for its depth locks, taken first thing in the
/// transaction in key order ([`Engine::lock_depths`]). The holder is another
/// node's group commit that took its depth locks the same way and holds them
/// until its commit, so the wait is short and cannot be part of a cycle.
const DEPTH_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Schedules' stored state: next tick, last run, pause ([`super::schedules`]).
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

pub mod limiter_pause;
mod schedules;
mod tenant_depth;
mod tenant_heads;

/// How often at most one queue's new jobs are announced to idle nodes
/// (`NOTIFY qd_jobs`); jobs enqueued in between are found by the notified nodes'
/// next look or by polling.
const NOTIFY_EVERY: Duration = Duration::from_millis(25);

/// The channel on which enqueues and redrives announce a queue's new jobs (the
/// payload is the queue's name).
pub const NOTIFY_CHANNEL: &str = "qd_jobs";

/// The newest schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The key of the advisory lock that serialises migrations across nodes ("qd" +
/// "migrate" in ASCII, so it is recognisable in `pg_locks`).
const MIGRATION_LOCK: i64 = 0x7164_6d69_6772_7465;

/// The seed of the advisory lock keys of tenants' caps: a (queue, tenant)'s key is
/// `hashtextextended(queue || chr(1) || tenant, CAP_LOCK_SEED)`. Two pairs that
/// share a key only serialise each other's claims. ("qdcap" in ASCII.)
const CAP_LOCK_SEED: i64 = 0x0071_6463_6170;

/// The call deadline of the schema migrations at start-up ([`PgOptions::call_timeout`]
/// is for everyday calls).
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long opening a connection may take before the store reports the database
/// unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The columns of a [`Job`], in the order [`job_from_row`] reads them (`j` =
/// `qd_jobs`); a stored lease shows as state leased with its token.
const JOB_COLUMNS: &str = "j.id, j.queue, j.tenant, j.idempotency_key, \
     CASE WHEN j.lease_token IS NULL THEN j.state ELSE 'leased' END, j.attempts, \
     j.budget_start, j.max_attempts, COALESCE(j.lease_token, j.lease_seq), j.worker, \
     j.leased_at, j.created_at, j.ready_at, j.updated_at, j.last_error, j.priority_ms";

/// A job's state as readers see it.
const EFFECTIVE_STATE: &str = "CASE WHEN j.lease_token IS NULL THEN j.state ELSE 'leased' END";

/// Open-time settings of the PostgreSQL store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgOptions {
    /// The history cap applied on every append.
    pub history: HistoryLimits,
    /// The length of a lease taken through [`Backend::claim`], which does not name
    /// one (default 5 minutes); [`Backend::claim_for`] names its own.
    pub default_lease: Duration,
    /// This node's name (`[daemon] node_name`): stored with its leases and in
    /// `qd_nodes` (`A-Za-z0-9_.-`, checked by the config).
    pub node: String,
    /// This node's id, kept in its data directory: a restart of the same node keeps
    /// it, so it may take its name back at once; another node may take a name only
    /// once its holder's heartbeat is older than `node_timeout`.
    pub node_id: Uuid,
    /// A node whose heartbeat is older than this is dead (`[daemon] node_timeout`).
    pub node_timeout: Duration,
    /// How much longer the leader waits before it ends a silent node's leases, so
    /// that node has stopped its attempts by then (`[daemon] fence_wait`; see
    /// `daemon/docs/cluster.md`). A name held by a silent node is taken over only
    /// after the same wait.
    pub fence_wait: Duration,
    /// The deadline of each call to the database (a statement, a pipelined group
    /// of them, a connection): past it the connection is dropped and the call
    /// answers an error, so a hung database or network holds no caller longer. The
    /// server's `statement_timeout` is set to it as well, and TCP connections get
    /// keepalives and `tcp_user_timeout` near it.
    pub call_timeout: Duration,
}

impl PgOptions {
    /// The call deadline of a node with this `node_timeout`: half of it, between
    /// 2 s and 5 s, so a hung call fails well before the node is fenced and a
    /// caller waits a few seconds at most.
    pub fn call_timeout_for(node_timeout: Duration) -> Duration {
        (node_timeout / 2).clamp(Duration::from_secs(2), Duration::from_secs(5))
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            history: HistoryLimits::default(),
            default_lease: Duration::from_secs(300),
            node: "qd".to_owned(),
            node_id: Uuid::nil(),
            node_timeout: Duration::from_secs(10),
            fence_wait: Duration::ZERO,
            call_timeout: Duration::from_secs(5),
        }
    }
}

/// The PostgreSQL [`Backend`], owned by the writer thread. See the module doc.
pub struct PgBackend {
    /// Drives the client; current-thread, owned by the writer thread.
    rt: tokio::runtime::Runtime,
    pool: Pool,
    /// The connection of the open batch (kept between batches while it is healthy).
    client: Option<Object>,
    /// Where the database is, for messages; never holds the password.
    target: String,
    options: PgOptions,
    /// When each queue's new jobs were last announced ([`NOTIFY_EVERY`]).
    notified: HashMap<String, std::time::Instant>,
    /// The leader epoch this node held at its last heartbeat that could look (see
    /// [`SharedStore::beat`]).
    epoch: Option<u64>,
}

pub use crate::config::describe_postgres as describe;

impl PgBackend {
    /// Connects to the database `config` names, makes sure commits are durable
    /// (`synchronous_commit` not `off`) and migrates the schema to [`SCHEMA_VERSION`].
    /// Call it on the thread that will use the backend (it builds its own runtime);
    /// [`super::Store::open_postgres`] does.
    ///
    /// Errors name the database (never the password): [`StoreError::Permission`]
    /// (authentication or privileges refused), [`StoreError::TooNew`],
    /// [`StoreError::Other`] (unreachable, timed out, anything else).
    pub fn open(
        config: &tokio_postgres::Config,
        options: &PgOptions,
    ) -> Result<PgBackend, StoreError> {
        let target = describe(config);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Other(format!("{target}: cannot start a runtime: {e}")))?;
        let mut config = config.clone();
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT.min(options.call_timeout));
        }
        // A peer that vanished without a reset (a partition, a dead host) is found
        // by TCP itself as well as by the call deadline: probes after 5 s idle, and
        // unacknowledged data gives up after the call deadline. (Unix sockets
        // ignore both.)
        if !config.get_keepalives() || config.get_keepalives_idle() > Duration::from_secs(5) {
            config
                .keepalives(true)
                .keepalives_idle(Duration::from_secs(5))
                .keepalives_interval(Duration::from_secs(1))
                .keepalives_retries(3);
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(options.call_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("qd");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(1)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT.min(options.call_timeout) * 2))
            .build()
            .map_err(|e| StoreError::Other(format!("{target}: {e}")))?;
        let mut backend = PgBackend {
            rt,
            pool,
            client: None,
            target,
            options: options.clone(),
            notified: HashMap::new(),
            epoch: None,
        };
        backend.connect()?;
        backend.migrate()?;
        backend.join()?;
        Ok(backend)
    }

    /// Takes a healthy connection from the pool unless the current one is healthy.
    fn connect(&mut self) -> Result<(), StoreError> {
        if self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        // Back to the pool, which drops it at the next `get` if it is closed.
        self.client = None;
        let pool = self.pool.clone();
        let deadline = self.options.call_timeout;
        let got = self
            .rt
            .block_on(async { tokio::time::timeout(deadline, pool.get()).await })
            .map_err(|_| {
                StoreError::Other(format!(
                    "{}: cannot connect: no answer within {}",
                    self.target,
                    humantime::format_duration(deadline)
                ))
            })?;
        let client = got.map_err(|e| {
            let detail = match &e {
                deadpool_postgres::PoolError::Backend(pg) => {
                    return map_err(&format!("{}: cannot connect", self.target), pg);
                }
                deadpool_postgres::PoolError::Timeout(_) => "timed out connecting".to_owned(),
                other => other.to_string(),
            };
            StoreError::Other(format!("{}: cannot connect: {detail}", self.target))
        })?;
        self.client = Some(client);
        let configured = self.configure_session();
        if configured.is_err() {
            // Never used half set up: the next batch opens another connection.
            self.client = None;
        }
        configured
    }

    /// Sets up a new connection's session: durable commits, the node's name for
    /// the depth counters (see QUEUE_DEPTHS; checked by the config, no quote can
    /// occur in it) and the call deadline as the server's `statement_timeout`.
    fn configure_session(&mut self) -> Result<(), StoreError> {
        let mode: String = self
            .block(async |c| c.query_one("SHOW synchronous_commit", &[]).await)?
            .get(0);
        if mode == "off" {
            tracing::warn!(target = %self.target, "synchronous_commit is off for qd's session; setting it on, since an accepted job must be on disk.");
            self.exec("SET synchronous_commit = on")?;
        }
        // A session whose client vanished inside a transaction (a partition)
        // would hold its row locks, the leader row's among them, until the
        // server's TCP keepalive notices (hours by default): the server ends it
        // after twice the call deadline (at least 10 s) of idling in it.
        let idle = (self.options.call_timeout * 2).max(Duration::from_secs(10));
        self.exec(&format!(
            "SET qd.node = '{}'; SET statement_timeout = {}; \
             SET idle_in_transaction_session_timeout = {}",
            self.options.node,
            millis(self.options.call_timeout),
            millis(idle)
        ))?;
        // A node killed mid-transaction leaves its backend holding row locks
        // while it waits on another lock (e.g. a child's, for job dependencies),
        // and a retried report on another node would wait for it into a deadlock:
        // the server checks every quarter second that the client is still there
        // and ends the statement if not (PostgreSQL 14 and later; older servers
        // lack the setting and keep their own behaviour).
        if let Err(err) = self.exec("SET client_connection_check_interval = 250") {
            tracing::debug!(%err, "client_connection_check_interval not set.");
        }
        Ok(())
    }

    /// Applies the missing migrations in one transaction under the migration lock.
    fn migrate(&mut self) -> Result<(), StoreError> {
        // A migration may scan a large table or wait for another node's: it gets
        // its own, long deadline.
        let call_timeout = std::mem::replace(&mut self.options.call_timeout, MIGRATION_TIMEOUT);
        let migrated = self.migrate_now();
        self.options.call_timeout = call_timeout;
        migrated
    }

    fn migrate_now(&mut self) -> Result<(), StoreError> {
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

    /// Records this node in `qd_nodes` and ends the leases an earlier run of it
    /// held (uncharged, as a restart on SQLite does: their holder died with it). A
    /// name held by another node id whose heartbeat is younger than `node_timeout`
    /// is refused.
    fn join(&mut self) -> Result<(), StoreError> {
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

    /// Announces new jobs of `queues` to idle nodes (`NOTIFY`, sent at commit), each
    /// queue at most once per [`NOTIFY_EVERY`].
    fn notify<'q>(&mut self, queues: impl IntoIterator<Item = &'q str>) -> Result<(), StoreError> {
        let now = std::time::Instant::now();
        let mut due: Vec<&str> = Vec::new();
        for queue in queues {
            if due.contains(&queue) {
                continue;
            }
            let last = self.notified.get(queue);
            if last.is_none_or(|at| now.duration_since(*at) >= NOTIFY_EVERY) {
                self.notified.insert(queue.to_owned(), now);
                due.push(queue);
            }
        }
        if due.is_empty() {
            return Ok(());
        }
        self.block(async |c| {
            let stmt = c
                .prepare_cached("SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q")
                .await?;
            c.execute(&stmt, &[&NOTIFY_CHANNEL, &due]).await
        })?;
        Ok(())
    }

    /// The SQL condition (over `j`, a row of `qd_jobs`) of a lease that ended
    /// without its holder: held by another node, and past its deadline by
    /// `fence_wait` or its node's heartbeat older than `node_timeout + fence_wait`
    /// (the silent node stops its attempts within that wait: self-fencing). The
    /// node name is checked by the config (no quote can occur in it).
    fn lease_lost(&self) -> String {
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

    /// Runs `op` against the current connection, mapping its error.
    fn block<T>(
        &mut self,
        op: impl AsyncFnOnce(&ClientWrapper) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, StoreError> {
        let result = self.block_raw(op)?;
        result.map_err(|e| map_err(&self.target, &e))
    }

    /// Runs `op` against the current connection and answers PostgreSQL's error as
    /// it is (for callers that act on its code); the outer error is the store's
    /// own (no connection).
    fn block_raw<T>(
        &mut self,
        op: impl AsyncFnOnce(&ClientWrapper) -> Result<T, tokio_postgres::Error>,
    ) -> Result<Result<T, tokio_postgres::Error>, StoreError> {
        let Some(client) = self.client.as_deref() else {
            return Err(StoreError::Other(format!("{}: not connected", self.target)));
        };
        let deadline = self.options.call_timeout;
        // The timer is made inside the runtime, which owns the time driver.
        let answer = self
            .rt
            .block_on(async { tokio::time::timeout(deadline, op(client)).await });
        match answer {
            Ok(answer) => Ok(answer),
            Err(_) => {
                // The connection may be anywhere in a statement: never reuse it. Taken
                // out of the pool, so the next batch opens a new one.
                if let Some(hung) = self.client.take() {
                    drop(Object::take(hung));
                }
                Err(StoreError::Other(format!(
                    "{}: no answer within {} (the database or the network to it hangs); \
                     connection dropped",
                    self.target,
                    humantime::format_duration(deadline)
                )))
            }
        }
    }

    /// How many more jobs each of `caps` (queue, tenant, cap) may have leased now,
    /// across every node, inside the open transaction: 0 for a pair another
    /// transaction holds the advisory lock of (it is claiming for that tenant; not
    /// waited for, so two nodes' group commits never wait on each other). The
    /// lock, once taken, is held until this transaction ends, so no other node
    /// claims for the pair meanwhile. The count is a statement of its own, after
    /// the lock's: its snapshot then shows every claim committed before the lock
    /// was free (one statement's snapshot would predate its lock). The two are
    /// pipelined: one round trip.
    fn allowances(&mut self, caps: &[(&str, &str, u32)]) -> Result<Vec<u32>, StoreError> {
        if caps.is_empty() {
            return Ok(Vec::new());
        }
        let queues: Vec<&str> = caps.iter().map(|c| c.0).collect();
        let tenants: Vec<&str> = caps.iter().map(|c| c.1).collect();
        let (locked, counts) = self.block(async |c| {
            let lock = c
                .prepare_cached(&format!(
                    "SELECT pg_try_advisory_xact_lock(\
                       hashtextextended(p.queue || chr(1) || p.tenant, {CAP_LOCK_SEED})) \
                     FROM unnest($1::text[], $2::text[]) WITH ORDINALITY \
                       AS p(queue, tenant, n) ORDER BY p.n"
                ))
                .await?;
            let count = c
                .prepare_cached(
                    "SELECT (SELECT count(*) FROM qd_jobs j WHERE j.queue = p.queue \
                       AND j.tenant = p.tenant AND j.lease_token IS NOT NULL) \
                     FROM unnest($1::text[], $2::text[]) WITH ORDINALITY \
                       AS p(queue, tenant, n) ORDER BY p.n",
                )
                .await?;
            let args: [&(dyn ToSql + Sync); 2] = [&queues, &tenants];
            tokio::try_join!(c.query(&lock, &args), c.query(&count, &args))
        })?;
        Ok(caps
            .iter()
            .zip(locked.iter().zip(&counts))
            .map(|(cap, (locked, count))| {
                if !locked.get::<_, bool>(0) {
                    return 0;
                }
                let leased = u64::try_from(count.get::<_, i64>(0)).unwrap_or(0);
                u32::try_from(u64::from(cap.2).saturating_sub(leased)).unwrap_or(0)
            })
            .collect())
    }

    /// Takes leases stored until `lease` or `node_timeout` from now by the database
    /// clock, whichever is later (see the module doc); see [`Backend::claim`].
    /// Rows another transaction holds are skipped, not waited for (`FOR UPDATE SKIP
    /// LOCKED`): a claim never waits on another node, so two nodes' batches cannot
    /// deadlock on each other's claims; a skipped job is answered as not claimed.
    fn claim_until(
        &mut self,
        leased: &[Job],
        lease: Duration,
        kind: LeaseKind,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if leased.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<JobId> = leased.iter().map(|j| j.id).collect();
        if has_duplicates(&ids) {
            return leased
                .iter()
                .map(|job| {
                    Ok(self
                        .claim_until(std::slice::from_ref(job), lease, kind)?
                        .remove(0))
                })
                .collect();
        }
        let uuids = uuids(&ids);
        let tokens: Vec<i64> = leased.iter().map(|j| stored_seq(j.lease_seq)).collect();
        let workers: Vec<String> = leased
            .iter()
            .map(|j| j.worker.clone().unwrap_or_default())
            .collect();
        let at: Vec<i64> = leased
            .iter()
            .map(|j| j.leased_at.unwrap_or(j.updated_at))
            .collect();
        let lease_ms = millis(lease.max(self.options.node_timeout));
        let end_ms = (kind == LeaseKind::External).then(|| millis(lease));
        let (node, id) = (self.options.node.clone(), self.options.node_id);
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "WITH c AS (\
                       SELECT * FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::int8[]) \
                         AS c(id, token, worker, leased_at)), \
                     locked AS (\
                       SELECT j.id FROM qd_jobs j JOIN c ON j.id = c.id \
                       WHERE j.state IN ('ready', 'delayed') \
                         AND j.lease_token IS NULL AND j.lease_seq < c.token \
                         AND EXISTS (SELECT 1 FROM qd_nodes n \
                           WHERE n.name = $6 AND n.node_id = $7) \
                       ORDER BY j.id FOR UPDATE OF j SKIP LOCKED), \
                     claimed AS (\
                       UPDATE qd_jobs j SET lease_seq = c.token, lease_token = c.token, \
                         worker = c.worker, leased_at = c.leased_at, lease_node = $6, \
                         lease_deadline = now() + $5::int8 * interval '1 millisecond', \
                         lease_end = now() + $8::int8 * interval '1 millisecond' \
                       FROM c WHERE j.id = c.id AND j.id IN (SELECT id FROM locked) \
                       RETURNING j.id) \
                     SELECT p.job_id, p.body FROM claimed JOIN qd_payloads p \
                       ON p.job_id = claimed.id",
                )
                .await?;
            c.query(
                &stmt,
                &[
                    &uuids, &tokens, &workers, &at, &lease_ms, &node, &id, &end_ms,
                ],
            )
            .await
        })?;
        let mut bodies: HashMap<Uuid, Vec<u8>> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        Ok(uuids.iter().map(|id| bodies.remove(id)).collect())
    }

    /// Writes each transition whose stored row satisfies `condition` (SQL over `j` =
    /// the row and `t` = the transition, whose `t.lease_seq` is the token), clears
    /// its lease, and appends its history line; answers per item whether it applied.
    /// The stored `lease_seq` only grows: a change planned on a stale copy (a redrive
    /// from a node that has not seen a later lease) keeps the higher stored one.
    fn change(&mut self, changes: &[Transition], condition: &str) -> Result<Vec<bool>, StoreError> {
        self.change_result(changes, condition, "COALESCE(t.result, j.result)")
    }

    /// [`Self::change`] setting the stored result to `result` (SQL over `j` and `t`,
    /// whose `t.result` is the transition's own): kept unless the transition brings
    /// one, or cleared by a redrive.
    fn change_result(
        &mut self,
        changes: &[Transition],
        condition: &str,
        result: &str,
    ) -> Result<Vec<bool>, StoreError> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<JobId> = changes.iter().map(|t| t.job.id).collect();
        if has_duplicates(&ids) {
            return changes
                .iter()
                .map(|t| Ok(self.change_result(std::slice::from_ref(t), condition, result)?[0]))
                .collect();
        }
        let uuids = uuids(&ids);
        let jobs: Vec<&Job> = changes.iter().map(|t| &t.job).collect();
        let states: Vec<&str> = jobs.iter().map(|j| j.state.as_str()).collect();
        let attempts: Vec<i64> = jobs.iter().map(|j| i64::from(j.attempts)).collect();
        let budget: Vec<i64> = jobs.iter().map(|j| i64::from(j.budget_start)).collect();
        let seqs: Vec<i64> = jobs.iter().map(|j| stored_seq(j.lease_seq)).collect();
        let ready: Vec<i64> = jobs.iter().map(|j| j.ready_at).collect();
        let updated: Vec<i64> = jobs.iter().map(|j| j.updated_at).collect();
        let errors: Vec<Option<&str>> = jobs.iter().map(|j| j.last_error.as_deref()).collect();
        let results: Vec<Option<&[u8]>> = changes.iter().map(|t| t.result.as_deref()).collect();
        let sql = format!(
            "UPDATE qd_jobs j SET state = t.state, attempts = t.attempts, \
               budget_start = t.budget_start, \
               lease_seq = GREATEST(j.lease_seq, t.lease_seq), ready_at = t.ready_at, \
               updated_at = t.updated_at, last_error = t.last_error, lease_token = NULL, \
               worker = NULL, leased_at = NULL, lease_deadline = NULL, lease_node = NULL, \
               lease_end = NULL, result = {result} \
             FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::int8[], $5::int8[], \
               $6::int8[], $7::int8[], $8::text[], $9::bytea[]) \
               AS t(id, state, attempts, budget_start, lease_seq, ready_at, updated_at, \
               last_error, result) \
             WHERE j.id = t.id AND {condition} RETURNING j.id"
        );
        let rows = self.block(async |c| {
            let stmt = c.prepare_cached(&sql).await?;
            c.query(
                &stmt,
                &[
                    &uuids, &states, &attempts, &budget, &seqs, &ready, &updated, &errors, &results,
                ],
            )
            .await
        })?;
        let applied: HashSet<Uuid> = rows.iter().map(|r| r.get(0)).collect();
        let entries: Vec<(Uuid, HistoryEntry)> = changes
            .iter()
            .filter(|t| applied.contains(&t.job.id.0))
            .filter_map(|t| {
                let entry = t.entry.as_ref()?;
                Some((
                    t.job.id.0,
                    history::bounded(entry, &self.options.history).into_owned(),
                ))
            })
            .collect();
        self.append_history(&entries)?;
        Ok(uuids.iter().map(|id| applied.contains(id)).collect())
    }

    /// Appends one history line to each job (ids distinct), then applies the cap.
    fn append_history(&mut self, entries: &[(Uuid, HistoryEntry)]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = entries.iter().map(|(id, _)| *id).collect();
        let attempts: Vec<i64> = entries.iter().map(|(_, e)| i64::from(e.attempt)).collect();
        let outcomes: Vec<&str> = entries.iter().map(|(_, e)| e.outcome.as_str()).collect();
        let workers: Vec<Option<&str>> = entries.iter().map(|(_, e)| e.worker.as_deref()).collect();
        let started: Vec<Option<i64>> = entries.iter().map(|(_, e)| e.started_at).collect();
        let ended: Vec<i64> = entries.iter().map(|(_, e)| e.ended_at).collect();
        let errors: Vec<Option<&str>> = entries.iter().map(|(_, e)| e.error.as_deref()).collect();
        let keep_first = i64::from(self.options.history.keep_first);
        let keep_last = i64::from(self.options.history.keep_last.max(1));
        self.block(async |c| {
            let insert = c
                .prepare_cached(
                    "INSERT INTO qd_history (job_id, seq, attempt, outcome, worker, started_at, \
                       ended_at, error) \
                     SELECT e.id, COALESCE((SELECT MAX(h.seq) FROM qd_history h \
                       WHERE h.job_id = e.id), 0) + 1, e.attempt, e.outcome, e.worker, \
                       e.started_at, e.ended_at, e.error \
                     FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::int8[], \
                       $6::int8[], $7::text[]) \
                       AS e(id, attempt, outcome, worker, started_at, ended_at, error)",
                )
                .await?;
            c.execute(
                &insert,
                &[
                    &ids, &attempts, &outcomes, &workers, &started, &ended, &errors,
                ],
            )
            .await?;
            let cap = c
                .prepare_cached(
                    "DELETE FROM qd_history h USING (SELECT job_id, MAX(seq) AS newest \
                       FROM qd_history WHERE job_id = ANY($1) GROUP BY job_id) m \
                     WHERE h.job_id = m.job_id AND h.seq > $2 AND h.seq <= m.newest - $3",
                )
                .await?;
            c.execute(&cap, &[&ids, &keep_first, &keep_last]).await
        })?;
        Ok(())
    }

    /// Deletes the jobs of `ids` whose stored state is in `states`, with their
    /// payloads and history; answers per id whether it was deleted (a repeated id:
    /// its first occurrence).
    fn delete(&mut self, ids: &[JobId], states: &[State]) -> Result<Vec<bool>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let uuids = uuids(ids);
        let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "WITH gone AS (DELETE FROM qd_jobs WHERE id = ANY($1) \
                       AND state = ANY($2::text[]) RETURNING id), \
                     p AS (DELETE FROM qd_payloads WHERE job_id IN (SELECT id FROM gone)), \
                     h AS (DELETE FROM qd_history WHERE job_id IN (SELECT id FROM gone)), \
                     e AS (DELETE FROM qd_job_edges WHERE child IN (SELECT id FROM gone)) \
                     SELECT id FROM gone",
                )
                .await?;
            c.query(&stmt, &[&uuids, &states]).await
        })?;
        let mut gone: HashSet<Uuid> = rows.iter().map(|r| r.get(0)).collect();
        Ok(uuids.iter().map(|id| gone.remove(id)).collect())
    }

    fn query_jobs(
        &mut self,
        sql: &str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Job>, StoreError> {
        let rows = self.block(async |c| {
            let stmt = c.prepare_cached(sql).await?;
            c.query(&stmt, args).await
        })?;
        rows.iter().map(|r| job_from_row(r, &self.target)).collect()
    }

    fn count_rows(
        &mut self,
        sql: &str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<(String, State, u64)>, StoreError> {
        let rows = self.block(async |c| {
            let stmt = c.prepare_cached(sql).await?;
            c.query(&stmt, args).await
        })?;
        let mut counts = rows
            .iter()
            .map(|r| {
                let state: String = r.get(1);
                let state = state.parse().map_err(|e: String| self.corrupt(e))?;
                Ok((
                    r.get(0),
                    state,
                    u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
                ))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        sort_counts(&mut counts);
        Ok(counts)
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt(format!("{}: {detail}", self.target))
    }

    /// Runs one row-less statement.
    fn exec(&mut self, sql: &str) -> Result<(), StoreError> {
        self.block(async |c| c.batch_execute(sql).await)
    }
}

/// Maps a PostgreSQL error to a [`StoreError`] naming the database (never the
/// password: the client's errors do not carry it).
fn map_err(target: &str, e: &tokio_postgres::Error) -> StoreError {
    let detail = match e.as_db_error() {
        Some(db) => db.to_string(),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                let cause = cause.to_string();
                if !text.contains(&cause) {
                    text.push_str(": ");
                    text.push_str(&cause);
                }
                source = cause_source(source);
            }
            text
        }
    };
    let what = format!("{target}: {detail}");
    match e.code() {
        Some(code) if *code == SqlState::DISK_FULL => StoreError::Full(what),
        Some(code) if *code == SqlState::DATA_CORRUPTED || *code == SqlState::INDEX_CORRUPTED => {
            StoreError::Corrupt(what)
        }
        Some(code)
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                || *code == SqlState::INSUFFICIENT_PRIVILEGE
                || *code == SqlState::READ_ONLY_SQL_TRANSACTION =>
        {
            StoreError::Permission(what)
        }
        _ => StoreError::Other(what),
    }
}

fn cause_source<'a>(
    source: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a (dyn std::error::Error + 'static)> {
    source.and_then(std::error::Error::source)
}

/// `d` in whole milliseconds, for SQL intervals (`$n::int8 * interval '1 millisecond'`).
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)
}

fn uuids(ids: &[JobId]) -> Vec<Uuid> {
    ids.iter().map(|id| id.0).collect()
}

fn has_duplicates(ids: &[JobId]) -> bool {
    let mut seen = HashSet::with_capacity(ids.len());
    !ids.iter().all(|id| seen.insert(*id))
}

/// The stored form of a lease token (a token never comes near `i64::MAX`).
fn stored_seq(seq: Token) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

fn counter(value: i64, column: &str, target: &str) -> Result<u32, StoreError> {
    u32::try_from(value)
        .map_err(|_| StoreError::Corrupt(format!("{target}: {column} {value} out of range")))
}

fn job_from_row(r: &Row, target: &str) -> Result<Job, StoreError> {
    job_from_row_offset(r, 0, target)
}

/// [`job_from_row`] for a row whose [`JOB_COLUMNS`] start at column `at`.
fn job_from_row_offset(r: &Row, at: usize, target: &str) -> Result<Job, StoreError> {
    let state: String = r.get(at + 4);
    let lease_seq: i64 = r.get(at + 8);
    Ok(Job {
        id: JobId(r.get(at)),
        queue: Arc::from(r.get::<_, &str>(at + 1)),
        tenant: Arc::from(r.get::<_, &str>(at + 2)),
        idempotency_key: r.get(at + 3),
        state: state
            .parse()
            .map_err(|e: String| StoreError::Corrupt(format!("{target}: {e}")))?,
        attempts: counter(r.get(at + 5), "attempts", target)?,
        budget_start: counter(r.get(at + 6), "budget_start", target)?,
        max_attempts: counter(r.get(at + 7), "max_attempts", target)?,
        lease_seq: u64::try_from(lease_seq).map_err(|_| {
            StoreError::Corrupt(format!("{target}: lease_seq {lease_seq} out of range"))
        })?,
        worker: r.get(at + 9),
        leased_at: r.get(at + 10),
        created_at: r.get(at + 11),
        ready_at: r.get(at + 12),
        updated_at: r.get(at + 13),
        last_error: r.get(at + 14),
        priority_ms: r.get(at + 15),
    })
}

/// The SQL condition selecting `scope`'s rows (binding one parameter, `$n`) and its
/// value.
fn scope_clause(scope: &PruneScope, n: usize) -> (String, Box<dyn ToSql + Sync + Send>) {
    match scope {
        PruneScope::Queue(q) => (format!("queue = ${n}"), Box::new(q.clone())),
        PruneScope::Unconfigured(known) => (
            format!("queue <> ALL(${n}::text[])"),
            Box::new(known.clone()),
        ),
    }
}

/// How [`sql_filter`] spells a job filter for PostgreSQL (leases in the row).
const DIALECT: Dialect = Dialect {
    placeholder: |n| format!("${n}"),
    unleased: "j.lease_token IS NULL",
    leased: "j.lease_token IS NOT NULL",
    contains: |p| format!("strpos(lower(j.last_error), lower({p}::text COLLATE \"C\")) > 0"),
    jobs: "qd_jobs",
    ended: None,
};

impl Backend for PgBackend {
    fn enqueue_after(
        &mut self,
        batch: &[NewRecord],
        after: &[crate::deps::After],
        all: bool,
    ) -> Result<Vec<(Inserted, State)>, StoreError> {
        self.enqueue_with_parents(batch, after, all)
    }

    fn move_edges(
        &mut self,
        changed: &[(JobId, State)],
        now: UnixMillis,
    ) -> Result<Vec<Job>, StoreError> {
        self.move_edges_of(changed, now)
    }

    fn release_edges(
        &mut self,
        child: JobId,
        now: UnixMillis,
    ) -> Result<Option<super::Released>, StoreError> {
        self.release_edges_of(child, "operator", now)
    }

    fn release_edges_by(
        &mut self,
        child: JobId,
        by: &str,
        now: UnixMillis,
    ) -> Result<Option<super::Released>, StoreError> {
        self.release_edges_of(child, by, now)
    }

    fn job_records(&mut self, ids: &[JobId]) -> Result<Vec<Option<Job>>, StoreError> {
        self.job_records_of(ids)
    }

    fn blocked_by(&mut self, parent: JobId) -> Result<Vec<JobId>, StoreError> {
        self.blocked_by_of(parent)
    }

    fn blocked_counts(&mut self, parent: JobId) -> Result<super::BlockedCounts, StoreError> {
        self.blocked_counts_of(parent)
    }

    fn release_parent(
        &mut self,
        parent: JobId,
        by: &str,
        now: UnixMillis,
    ) -> Result<Vec<Job>, StoreError> {
        self.release_parent_of(parent, by, now)
    }

    fn edges(&mut self, id: JobId) -> Result<super::Edges, StoreError> {
        self.edges_of(id)
    }

    fn dependents(&mut self, root: JobId) -> Result<Vec<JobId>, StoreError> {
        self.dependents_of(root)
    }

    fn parents_of(&mut self, children: &[JobId]) -> Result<Vec<Vec<ParentView>>, StoreError> {
        self.parents_of_all(children)
    }

    fn enqueue(&mut self, batch: &[NewRecord]) -> Result<Vec<Inserted>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let jobs: Vec<&Job> = batch.iter().map(|r| &r.job).collect();
        let ids: Vec<Uuid> = jobs.iter().map(|j| j.id.0).collect();
        let queues: Vec<&str> = jobs.iter().map(|j| &*j.queue).collect();
        let tenants: Vec<&str> = jobs.iter().map(|j| &*j.tenant).collect();
        let keys: Vec<Option<&str>> = jobs.iter().map(|j| j.idempotency_key.as_deref()).collect();
        let states: Vec<&str> = jobs.iter().map(|j| j.state.as_str()).collect();
        let attempts: Vec<i64> = jobs.iter().map(|j| i64::from(j.attempts)).collect();
        let budget: Vec<i64> = jobs.iter().map(|j| i64::from(j.budget_start)).collect();
        let max: Vec<i64> = jobs.iter().map(|j| i64::from(j.max_attempts)).collect();
        let seqs: Vec<i64> = jobs.iter().map(|j| stored_seq(j.lease_seq)).collect();
        let created: Vec<i64> = jobs.iter().map(|j| j.created_at).collect();
        let ready: Vec<i64> = jobs.iter().map(|j| j.ready_at).collect();
        let updated: Vec<i64> = jobs.iter().map(|j| j.updated_at).collect();
        let errors: Vec<Option<&str>> = jobs.iter().map(|j| j.last_error.as_deref()).collect();
        let priorities: Vec<i64> = jobs.iter().map(|j| j.priority_ms).collect();
        // Rows are inserted in key order, not request order: an insert whose key
        // another node's open transaction holds waits for it, and two batches of
        // shared keys in different orders would each hold a key the other waits on
        // (`deadlock detected`, one of them refused). In one order the second only
        // waits. Items of one key keep their request order (`ord`), so the first wins.
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "INSERT INTO qd_jobs (id, queue, tenant, idempotency_key, state, attempts, \
                       budget_start, max_attempts, lease_seq, created_at, ready_at, updated_at, \
                       last_error, priority_ms) \
                     SELECT n.id, n.queue, n.tenant, n.idempotency_key, n.state, n.attempts, \
                       n.budget_start, n.max_attempts, n.lease_seq, n.created_at, n.ready_at, \
                       n.updated_at, n.last_error, n.priority_ms \
                     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], \
                       $6::int8[], $7::int8[], $8::int8[], $9::int8[], $10::int8[], \
                       $11::int8[], $12::int8[], $13::text[], $14::int8[]) WITH ORDINALITY \
                       AS n(id, queue, tenant, idempotency_key, state, attempts, budget_start, \
                       max_attempts, lease_seq, created_at, ready_at, updated_at, last_error, \
                       priority_ms, ord) \
                     ORDER BY n.queue COLLATE \"C\", n.idempotency_key COLLATE \"C\", n.ord \
                     ON CONFLICT DO NOTHING RETURNING id",
                )
                .await?;
            c.query(
                &stmt,
                &[
                    &ids,
                    &queues,
                    &tenants,
                    &keys,
                    &states,
                    &attempts,
                    &budget,
                    &max,
                    &seqs,
                    &created,
                    &ready,
                    &updated,
                    &errors,
                    &priorities,
                ],
            )
            .await
        })?;
        let inserted: HashSet<Uuid> = rows.iter().map(|r| r.get(0)).collect();
        // An id inserted once: its first item is the new one (a repeated id within
        // the batch conflicts with it).
        let mut first = HashSet::new();
        let new: Vec<bool> = ids
            .iter()
            .map(|id| inserted.contains(id) && first.insert(*id))
            .collect();
        let (new_ids, bodies): (Vec<Uuid>, Vec<&[u8]>) = batch
            .iter()
            .zip(&new)
            .filter(|(_, new)| **new)
            .map(|(r, _)| (r.job.id.0, r.payload.as_slice()))
            .unzip();
        let refused: Vec<(&str, &str)> = batch
            .iter()
            .zip(&new)
            .filter(|(_, new)| !**new)
            .filter_map(|(r, _)| Some((&*r.job.queue, r.job.idempotency_key.as_deref()?)))
            .collect();
        let (dup_queues, dup_keys): (Vec<&str>, Vec<&str>) = refused.iter().copied().unzip();
        let holders = self.block(async |c| {
            if !new_ids.is_empty() {
                let stmt = c
                    .prepare_cached(
                        "INSERT INTO qd_payloads (job_id, body) \
                         SELECT * FROM unnest($1::uuid[], $2::bytea[])",
                    )
                    .await?;
                c.execute(&stmt, &[&new_ids, &bodies]).await?;
            }
            if dup_queues.is_empty() {
                return Ok(Vec::new());
            }
            let stmt = c
                .prepare_cached(
                    "SELECT j.queue, j.idempotency_key, j.id, p.body \
                     FROM qd_jobs j JOIN qd_payloads p ON p.job_id = j.id \
                     WHERE (j.queue, j.idempotency_key) IN \
                       (SELECT * FROM unnest($1::text[], $2::text[]))",
                )
                .await?;
            c.query(&stmt, &[&dup_queues, &dup_keys]).await
        })?;
        let holders: HashMap<(String, String), (Uuid, Vec<u8>)> = holders
            .iter()
            .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3))))
            .collect();
        if !new_ids.is_empty() {
            self.notify(queues.iter().copied())?;
        }
        batch
            .iter()
            .zip(new)
            .map(|(record, new)| {
                if new {
                    return Ok(Inserted::New);
                }
                let job = &record.job;
                let holder = job
                    .idempotency_key
                    .as_ref()
                    .and_then(|key| holders.get(&(job.queue.to_string(), key.clone())));
                match holder {
                    Some((id, body)) => Ok(Inserted::Duplicate {
                        id: JobId(*id),
                        same_payload: *body == record.payload,
                    }),
                    None => Err(StoreError::Other(format!("job {} already stored", job.id))),
                }
            })
            .collect()
    }

    /// `false`: the lease is the row's, shared with every node; a claim must run
    /// (and apply) before its job is handed out.
    fn leases_are_local(&self) -> bool {
        false
    }

    fn shared(&mut self) -> Option<&mut dyn SharedStore> {
        Some(self)
    }

    fn claim(&mut self, leased: &[Job]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let lease = self.options.default_lease;
        self.claim_until(leased, lease, LeaseKind::InProcess)
    }

    fn claim_for(
        &mut self,
        leased: &[Job],
        lease: Duration,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.claim_until(leased, lease, LeaseKind::InProcess)
    }

    fn complete(&mut self, ends: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.change(
            ends,
            "j.lease_token = t.lease_seq AND j.state IN ('ready', 'delayed')",
        )
    }

    fn redrive(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        let applied = self.change_result(
            changes,
            "j.state = 'dead' AND j.lease_token IS NULL",
            "NULL",
        )?;
        self.notify(changes.iter().map(|t| &*t.job.queue))?;
        Ok(applied)
    }

    fn set_payload(&mut self, id: JobId, payload: &[u8]) -> Result<bool, StoreError> {
        let changed = self.block(async |c| {
            let stmt = c
                .prepare_cached("UPDATE qd_payloads SET body = $2 WHERE job_id = $1")
                .await?;
            c.execute(&stmt, &[&id.0, &payload]).await
        })?;
        Ok(changed == 1)
    }

    fn cancel(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.change(
            changes,
            "j.state IN ('ready', 'delayed', 'dead', 'waiting', 'blocked') \
             AND j.lease_token IS NULL",
        )
    }

    fn purge(&mut self, ids: &[JobId]) -> Result<Vec<bool>, StoreError> {
        self.delete(ids, &[State::Dead])
    }

    fn load_unfinished(&mut self) -> Result<Vec<Job>, StoreError> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM qd_jobs j \
             WHERE j.state IN ('delayed', 'ready', 'dead') \
               AND (j.lease_token IS NULL OR j.lease_node = $1) ORDER BY j.id"
        );
        let node = self.options.node.clone();
        self.query_jobs(&sql, &[&node])
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobDetail>, StoreError> {
        let sql = format!(
            "SELECT {JOB_COLUMNS}, p.body, j.result FROM qd_jobs j \
             JOIN qd_payloads p ON p.job_id = j.id WHERE j.id = $1"
        );
        let (found, lines) = self.block(async |c| {
            let stmt = c.prepare_cached(&sql).await?;
            let found = c.query_opt(&stmt, &[&id.0]).await?;
            let history = c
                .prepare_cached(
                    "SELECT seq, attempt, outcome, worker, started_at, ended_at, error \
                     FROM qd_history WHERE job_id = $1 ORDER BY seq",
                )
                .await?;
            let lines = c.query(&history, &[&id.0]).await?;
            Ok((found, lines))
        })?;
        let Some(found) = found else {
            return Ok(None);
        };
        let job = job_from_row(&found, &self.target)?;
        let mut seqs = Vec::with_capacity(lines.len());
        let mut entries = Vec::with_capacity(lines.len());
        for r in &lines {
            seqs.push(u64::try_from(r.get::<_, i64>(0)).unwrap_or(0));
            let outcome: String = r.get(2);
            entries.push(HistoryEntry {
                attempt: counter(r.get(1), "attempt", &self.target)?,
                outcome: outcome.parse().map_err(|e: String| self.corrupt(e))?,
                worker: r.get(3),
                started_at: r.get(4),
                ended_at: r.get(5),
                error: r.get(6),
            });
        }
        let (history_elided, history_elided_at) = history::elided(&seqs);
        Ok(Some(JobDetail {
            job,
            payload: found.get(16),
            result: found.get(17),
            history: entries,
            history_elided,
            history_elided_at,
        }))
    }

    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        let (tail, args) = sql_filter::tail(filter, &DIALECT);
        let args: Vec<Box<dyn ToSql + Sync + Send>> = args
            .into_iter()
            .map(|arg| -> Box<dyn ToSql + Sync + Send> {
                match arg {
                    Arg::Text(text) => Box::new(text),
                    Arg::Int(n) => Box::new(n),
                    Arg::Id(id) => Box::new(id.0),
                }
            })
            .collect();
        let refs: Vec<&(dyn ToSql + Sync)> = args
            .iter()
            .map(|a| a.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let sql = format!("SELECT {JOB_COLUMNS} FROM qd_jobs j{tail}");
        self.query_jobs(&sql, &refs)
    }

    fn prune_finished(
        &mut self,
        scope: &PruneScope,
        finished_before: UnixMillis,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let (clause, name) = scope_clause(scope, 4);
        let sql = format!(
            "WITH doomed AS (SELECT id FROM qd_jobs WHERE state = $1 AND updated_at < $2 \
               AND {clause} \
               AND NOT EXISTS (SELECT 1 FROM qd_job_edges e JOIN qd_jobs c ON c.id = e.child \
                 WHERE e.parent = qd_jobs.id AND c.state NOT IN ('succeeded', 'cancelled')) \
               ORDER BY updated_at, id LIMIT $3), \
             gone AS (DELETE FROM qd_jobs j USING doomed WHERE j.id = doomed.id \
               AND j.state = $1 RETURNING j.id), \
             p AS (DELETE FROM qd_payloads WHERE job_id IN (SELECT id FROM gone)), \
             h AS (DELETE FROM qd_history WHERE job_id IN (SELECT id FROM gone)), \
             e AS (DELETE FROM qd_job_edges WHERE child IN (SELECT id FROM gone)) \
             SELECT count(*) FROM gone"
        );
        let mut deleted = 0u64;
        for state in super::prune::FINISHED {
            let left = u64::from(limit) - deleted;
            if left == 0 {
                break;
            }
            let left = i64::try_from(left).unwrap_or(i64::MAX);
            let state = state.as_str();
            let name = name.as_ref();
            let count: i64 = self.block(async |c| {
                let stmt = c.prepare_cached(&sql).await?;
                Ok(c.query_one(&stmt, &[&state, &finished_before, &left, name])
                    .await?
                    .get(0))
            })?;
            deleted += u64::try_from(count).unwrap_or(0);
        }
        Ok(deleted)
    }

    fn oldest_finished(&mut self, scope: &PruneScope) -> Result<Option<UnixMillis>, StoreError> {
        let (clause, name) = scope_clause(scope, 1);
        let sql = format!(
            "SELECT MIN(updated_at) FROM qd_jobs \
             WHERE state IN ('succeeded', 'cancelled') AND {clause}"
        );
        let name = name.as_ref();
        self.block(async |c| {
            let stmt = c.prepare_cached(&sql).await?;
            Ok(c.query_one(&stmt, &[name]).await?.get(0))
        })
    }

    fn release_space(&mut self, _keep_free: u32, _max_pages: u32) -> Result<u32, StoreError> {
        Ok(0)
    }

    fn schedules(&mut self) -> Result<Vec<super::ScheduleRow>, StoreError> {
        self.block(async |c| schedules::all(c).await)
    }

    fn advance_schedule(&mut self, advance: &super::Advance) -> Result<bool, StoreError> {
        self.block(async |c| schedules::advance(c, advance).await)
    }

    fn record_schedule_run(
        &mut self,
        name: &str,
        tick: UnixMillis,
        job: JobId,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.block(async |c| schedules::record_run(c, name, tick, job.0, now).await)
    }

    fn set_schedule_paused(
        &mut self,
        name: &str,
        paused: bool,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.block(async |c| schedules::set_paused(c, name, paused, now).await)
    }

    fn set_override(
        &mut self,
        scope: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        self.block(async |c| {
            match value {
                Some(value) => {
                    let stmt = c
                        .prepare_cached(
                            "INSERT INTO qd_overrides (scope, name, key, value) \
                             VALUES ($1, $2, $3, $4) ON CONFLICT (scope, name, key) \
                             DO UPDATE SET value = excluded.value",
                        )
                        .await?;
                    c.execute(&stmt, &[&scope, &name, &key, &value]).await?
                }
                None => {
                    let stmt = c
                        .prepare_cached(
                            "DELETE FROM qd_overrides WHERE scope = $1 AND name = $2 \
                             AND key = $3",
                        )
                        .await?;
                    c.execute(&stmt, &[&scope, &name, &key]).await?
                }
            };
            Ok(())
        })
    }

    fn overrides(&mut self) -> Result<Vec<Override>, StoreError> {
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "SELECT scope, name, key, value FROM qd_overrides \
                     ORDER BY scope, name, key",
                )
                .await?;
            c.query(&stmt, &[]).await
        })?;
        Ok(rows
            .iter()
            .map(|r| Override {
                scope: r.get(0),
                name: r.get(1),
                key: r.get(2),
                value: r.get(3),
            })
            .collect())
    }

    fn sqs_queues(&mut self) -> Result<Vec<SqsQueueRecord>, StoreError> {
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "SELECT name, attributes, tags, created_at, modified_at \
                     FROM qd_sqs_queues ORDER BY name",
                )
                .await?;
            c.query(&stmt, &[]).await
        })?;
        Ok(rows
            .iter()
            .map(|r| SqsQueueRecord {
                name: r.get(0),
                attributes: r.get(1),
                tags: r.get(2),
                created_at: r.get(3),
                modified_at: r.get(4),
            })
            .collect())
    }

    fn set_sqs_queue(
        &mut self,
        name: &str,
        record: Option<&SqsQueueRecord>,
    ) -> Result<bool, StoreError> {
        self.block(async |c| {
            let delete = c
                .prepare_cached("DELETE FROM qd_sqs_queues WHERE name = $1")
                .await?;
            let existed = c.execute(&delete, &[&name]).await? > 0;
            if let Some(r) = record {
                let insert = c
                    .prepare_cached(
                        "INSERT INTO qd_sqs_queues \
                         (name, attributes, tags, created_at, modified_at) \
                         VALUES ($1, $2, $3, $4, $5)",
                    )
                    .await?;
                c.execute(
                    &insert,
                    &[&name, &r.attributes, &r.tags, &r.created_at, &r.modified_at],
                )
                .await?;
            }
            Ok(existed)
        })
    }

    fn probe(&mut self, now: UnixMillis) -> Result<(), StoreError> {
        self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "INSERT INTO qd_meta (key, value) VALUES ('probe', $1) \
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                )
                .await?;
            c.execute(&stmt, &[&now]).await.map(drop)
        })
    }

    fn counts(&mut self) -> Result<Vec<(String, State, u64)>, StoreError> {
        let sql = format!(
            "SELECT j.queue, {EFFECTIVE_STATE} AS s, COUNT(*) FROM qd_jobs j \
             GROUP BY j.queue, s"
        );
        self.count_rows(&sql, &[])
    }

    fn tenant_counts(&mut self, queue: &str) -> Result<Vec<(String, State, u64)>, StoreError> {
        let sql = format!(
            "SELECT j.tenant, {EFFECTIVE_STATE} AS s, COUNT(*) FROM qd_jobs j \
             WHERE j.queue = $1 AND j.state IN ('delayed', 'ready', 'dead', 'waiting', 'blocked') \
             GROUP BY j.tenant, s"
        );
        self.count_rows(&sql, &[&queue])
    }
}

impl Engine for PgBackend {
    fn begin(&mut self) -> Result<(), StoreError> {
        self.connect()?;
        self.exec("BEGIN")
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.exec("SAVEPOINT op")
    }

    fn release(&mut self) -> Result<(), StoreError> {
        self.exec("RELEASE SAVEPOINT op")
    }

    fn rollback_to(&mut self) -> Result<(), StoreError> {
        self.exec("ROLLBACK TO SAVEPOINT op; RELEASE SAVEPOINT op")
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.exec("COMMIT")
    }

    fn rollback(&mut self) {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
            return;
        }
        if self.client.is_some()
            && let Err(err) = self.exec("ROLLBACK")
        {
            tracing::error!(%err, "Store rollback failed; the connection is replaced.");
            self.client = None;
        }
    }

    fn shutdown(&mut self) {
        self.client = None;
        self.pool.close();
    }

    /// Waits for the depth locks of `queues`, sorted by lock key (the order every
    /// node uses), at most [`DEPTH_LOCK_WAIT`] in all. The batch holds nothing
    /// yet, and any other holder took its depth locks in the same order before
    /// anything else, so the waits cannot form a cycle. Given up after the wait
    /// (the savepoint undoes the locks taken), the operations try the locks
    /// themselves and answer busy as before.
    fn lock_depths(&mut self, locks: &[&DepthLock]) -> Result<(), StoreError> {
        self.exec(&format!(
            "SAVEPOINT depth_locks; SET LOCAL lock_timeout = {}",
            millis(DEPTH_LOCK_WAIT)
        ))?;
        let locked = match tenant_depth::sorted_keys(self, locks)? {
            Ok(keys) => self.block_raw(async |c| {
                let lock = c.prepare_cached("SELECT pg_advisory_xact_lock($1)").await?;
                for key in keys {
                    c.execute(&lock, &[&key]).await?;
                }
                Ok(())
            })?,
            Err(e) => Err(e),
        };
        match locked {
            Ok(()) => self.exec("SET LOCAL lock_timeout = DEFAULT; RELEASE SAVEPOINT depth_locks"),
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                tracing::debug!(
                    ?locks,
                    "Depth locks still held by another node; each enqueue tries its own."
                );
                self.exec("ROLLBACK TO SAVEPOINT depth_locks; RELEASE SAVEPOINT depth_locks")
            }
            Err(e) => Err(map_err(&self.target, &e)),
        }
    }
}

impl SharedStore for PgBackend {
    fn claimable(&mut self, queues: &[String], per_queue: u32) -> Result<Vec<Job>, StoreError> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM unnest($1::text[]) AS q(name) CROSS JOIN LATERAL (\
               SELECT * FROM qd_jobs c WHERE c.queue = q.name \
                 AND c.state IN ('ready', 'delayed') AND c.lease_token IS NULL \
               ORDER BY c.ready_at - c.priority_ms, c.id LIMIT $2) j"
        );
        let limit = i64::from(per_queue);
        self.query_jobs(&sql, &[&queues, &limit])
    }

    fn claim_next_as(
        &mut self,
        next: &NewClaim<'_>,
        kind: LeaseKind,
    ) -> Result<Vec<(Job, Vec<u8>)>, StoreError> {
        let lease_ms = millis(next.lease.max(self.options.node_timeout));
        let end_ms = (kind == LeaseKind::External).then(|| millis(next.lease));
        let limit = match (next.cap, next.tenant) {
            (None, _) => next.limit,
            (Some(cap), Some(tenant)) => next
                .limit
                .min(self.allowances(&[(next.queue, tenant, cap)])?[0]),
            (Some(_), None) => {
                return Err(StoreError::Other(
                    "claim_next: a concurrency cap needs a tenant".into(),
                ));
            }
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::from(limit);
        let (node, id) = (self.options.node.clone(), self.options.node_id);
        let sql = format!(
            "WITH picked AS (\
               SELECT id FROM qd_jobs \
               WHERE queue = $1 AND state IN ('ready', 'delayed') AND ready_at <= $2 \
                 AND lease_token IS NULL AND ($8::text IS NULL OR tenant = $8) \
                 AND EXISTS (SELECT 1 FROM qd_nodes n WHERE n.name = $7 AND n.node_id = $9) \
               ORDER BY ready_at - priority_ms, id LIMIT $3 FOR UPDATE SKIP LOCKED), \
             claimed AS (\
               UPDATE qd_jobs j SET lease_seq = j.lease_seq + 1, lease_token = j.lease_seq + 1, \
                 worker = $4, leased_at = $5, lease_node = $7, \
                 lease_deadline = now() + $6::int8 * interval '1 millisecond', \
                 lease_end = now() + $10::int8 * interval '1 millisecond' \
               FROM picked WHERE j.id = picked.id RETURNING j.*) \
             SELECT {JOB_COLUMNS}, p.body FROM claimed j JOIN qd_payloads p ON p.job_id = j.id \
             ORDER BY j.ready_at - j.priority_ms, j.id"
        );
        let rows = self.block(async |c| {
            let stmt = c.prepare_cached(&sql).await?;
            c.query(
                &stmt,
                &[
                    &next.queue,
                    &next.now,
                    &limit,
                    &next.worker,
                    &next.now,
                    &lease_ms,
                    &node,
                    &next.tenant,
                    &id,
                    &end_ms,
                ],
            )
            .await
        })?;
        rows.iter()
            .map(|r| Ok((job_from_row(r, &self.target)?, r.get(16))))
            .collect()
    }

    /// See the trait and the module doc (tenants' caps). A job whose tenant has a
    /// cap counts against its allowance whether or not its claim then applies.
    fn claim_capped_as(
        &mut self,
        leased: &[Job],
        lease: Duration,
        caps: &[TenantCap],
        kind: LeaseKind,
    ) -> Result<Vec<Claim>, StoreError> {
        let cap_of = |job: &Job| {
            caps.iter()
                .position(|c| c.queue == job.queue && c.tenant == job.tenant)
        };
        // The caps that apply to these jobs, each once, in order of first use.
        let mut used: Vec<usize> = Vec::new();
        for k in leased.iter().filter_map(cap_of) {
            if !used.contains(&k) {
                used.push(k);
            }
        }
        if used.is_empty() {
            let claimed = self.claim_until(leased, lease, kind)?;
            return Ok(claimed.into_iter().map(Claim::from).collect());
        }
        let pairs: Vec<(&str, &str, u32)> = used
            .iter()
            .map(|&k| (&*caps[k].queue, &*caps[k].tenant, caps[k].max))
            .collect();
        let mut left = self.allowances(&pairs)?;
        let mut refused = vec![false; leased.len()];
        for (job, refused) in leased.iter().zip(&mut refused) {
            let Some(k) = cap_of(job) else { continue };
            let slot = used.iter().position(|u| *u == k).map(|i| &mut left[i]);
            match slot {
                Some(n) if *n > 0 => *n -= 1,
                _ => *refused = true,
            }
        }
        let granted: Vec<Job> = leased
            .iter()
            .zip(&refused)
            .filter(|(_, r)| !**r)
            .map(|(j, _)| j.clone())
            .collect();
        let mut claimed = self.claim_until(&granted, lease, kind)?.into_iter();
        Ok(refused
            .iter()
            .map(|refused| match refused {
                true => Claim::AtCap,
                false => claimed.next().map_or(Claim::Lost, Claim::from),
            })
            .collect())
    }

    fn reload(&mut self, ids: &[JobId]) -> Result<Vec<Job>, StoreError> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM qd_jobs j WHERE j.id = ANY($1::uuid[])");
        self.query_jobs(&sql, &[&uuids(ids)])
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
    fn beat(&mut self) -> Result<Option<u64>, StoreError> {
        let name = self.options.node.clone();
        let id = self.options.node_id;
        let timeout_ms = millis(self.options.node_timeout);
        let (alive, led) = self.block(async |c| {
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
                self.target
            )));
        }
        if let Some(epoch) = led {
            self.epoch = epoch.and_then(|e| u64::try_from(e).ok());
        }
        Ok(self.epoch)
    }

    fn own_leases(&mut self) -> Result<Vec<Job>, StoreError> {
        // Only while the name is still this node's: a node whose name was taken over
        // must not see (and end as orphans) the leases of the name's new holder.
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM qd_jobs j \
             WHERE j.lease_node = $1 AND j.lease_token IS NOT NULL \
               AND EXISTS (SELECT 1 FROM qd_nodes n WHERE n.name = $1 AND n.node_id = $2)"
        );
        let (node, id) = (self.options.node.clone(), self.options.node_id);
        self.query_jobs(&sql, &[&node, &id])
    }

    fn expired_leases(&mut self, limit: u32) -> Result<Vec<Job>, StoreError> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM qd_jobs j WHERE {} ORDER BY j.lease_deadline LIMIT $1",
            self.lease_lost()
        );
        self.query_jobs(&sql, &[&i64::from(limit)])
    }

    fn expire(&mut self, ends: &[Transition], epoch: u64) -> Result<Vec<bool>, StoreError> {
        let condition = format!(
            "j.lease_token = t.lease_seq AND j.state IN ('ready', 'delayed') AND {} \
             AND EXISTS (SELECT 1 FROM qd_leader l WHERE l.id = 1 AND l.node = '{}' \
               AND l.epoch = {epoch} AND l.expires_at > now())",
            self.lease_lost(),
            self.options.node,
        );
        self.change(ends, &condition)
    }

    fn extend_lease(
        &mut self,
        id: JobId,
        token: Token,
        extend: Duration,
    ) -> Result<Option<UnixMillis>, StoreError> {
        let (uuid, token, extend) = (id.0, stored_seq(token), millis(extend));
        let row = self.block(async |c| {
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

    fn end_if_due(&mut self, ends: &[Transition]) -> Result<Vec<LeaseCheck>, StoreError> {
        // A lease with no stored end (taken for a node's own worker) is due when
        // its holder's timer says so.
        let applied = self.change(
            ends,
            "j.lease_token = t.lease_seq AND j.state IN ('ready', 'delayed') \
             AND COALESCE(j.lease_end, '-infinity') <= now()",
        )?;
        let open: Vec<Uuid> = ends
            .iter()
            .zip(&applied)
            .filter(|(_, a)| !**a)
            .map(|(t, _)| t.job.id.0)
            .collect();
        let live: HashMap<Uuid, (i64, i64)> = if open.is_empty() {
            HashMap::new()
        } else {
            let rows = self.block(async |c| {
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

    fn queue_depth(&mut self, queue: &str) -> Result<Option<u64>, StoreError> {
        for _ in 0..DEPTH_LOCK_TRIES {
            // Pipelined: the count's snapshot is taken after the lock's statement
            // ran, so it shows every enqueue committed before the lock was free.
            let (locked, depth) = self.block(async |c| {
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

    fn tenant_heads(
        &mut self,
        queues: &[String],
        per_tenant: u32,
        most: u32,
    ) -> Result<Vec<Job>, StoreError> {
        tenant_heads::heads(self, queues, per_tenant, most)
    }

    fn tenant_depth(&mut self, queue: &str, tenant: &str) -> Result<Option<u64>, StoreError> {
        tenant_depth::tenant_depth(self, queue, tenant)
    }

    fn take_tokens(
        &mut self,
        name: &str,
        want: u32,
        settings: &crate::config::RateLimiterConfig,
    ) -> Result<Tokens, StoreError> {
        limiter_pause::take(self, name, want, settings)
    }

    fn pause_limiter(
        &mut self,
        name: &str,
        for_at_least: Duration,
        settings: &crate::config::RateLimiterConfig,
    ) -> Result<Duration, StoreError> {
        limiter_pause::pause(self, name, for_at_least, settings)
    }

    fn limiter_pauses(&mut self) -> Result<Vec<(String, Duration)>, StoreError> {
        limiter_pause::pauses(self)
    }

    fn held_depths(&mut self) -> Result<Vec<(String, State, u64)>, StoreError> {
        self.held_depths_of()
    }

    fn depths(&mut self, now: UnixMillis) -> Result<Vec<(String, State, u64)>, StoreError> {
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "SELECT queue, CASE WHEN lease_token IS NOT NULL THEN 'leased' \
                       WHEN state = 'delayed' AND ready_at <= $1 THEN 'ready' ELSE state END \
                       AS shown, count(*) \
                     FROM qd_jobs WHERE state IN ('ready', 'delayed', 'dead', 'waiting', \
                       'blocked') GROUP BY 1, 2",
                )
                .await?;
            c.query(&stmt, &[&now]).await
        })?;
        rows.iter()
            .map(|r| {
                let state: String = r.get(1);
                let state = state
                    .parse()
                    .map_err(|e: String| StoreError::Corrupt(format!("{}: {e}", self.target)))?;
                Ok((
                    r.get(0),
                    state,
                    u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
                ))
            })
            .collect()
    }

    fn nodes(&mut self) -> Result<Vec<NodeInfo>, StoreError> {
        let rows = self.block(async |c| {
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
}
