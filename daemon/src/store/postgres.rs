//! The PostgreSQL engine: the same [`Backend`] contract as SQLite over a database that
//! several qd nodes may share. Owns the PostgreSQL schema (`postgres/schema.rs`),
//! the connection of the writer thread and the SQL of every operation (one file
//! per concern, see Layout below). It takes no messages: the writer thread
//! (`store/writer.rs`) calls it.
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
//!
//! # Layout
//! This file owns the connection (open, session settings, the call deadline,
//! error mapping), the row mapping and the [`Backend`], [`SharedStore`] and
//! `Engine` implementations, which hand each operation to the file that owns its
//! statements:
//! - `postgres/schema.rs`: the migrations and applying them;
//! - `postgres/jobs.rs`: enqueue, the fenced transitions, purge, prune, reads;
//! - `postgres/claim.rs`: claims, within tenants' caps;
//! - `postgres/cluster.rs`: nodes, heartbeat, leader, external leases, expiry,
//!   `max_depth` locks, cluster-wide reads;
//! - `postgres/limiter_pause.rs`: the shared rate limiters' buckets and pauses;
//! - `postgres/deps.rs`, `tenant_depth.rs`, `tenant_heads.rs`, `schedules.rs`,
//!   `sqs_queues.rs`: dependencies, tenants' depths, tenants' claim heads,
//!   schedules, the announcement of SQS-created queues.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use super::sql_filter::Dialect;
use super::{
    Backend, Claim, DepthLock, Engine, HistoryLimits, Inserted, JobDetail, JobFilter, LeaseCheck,
    LeaseKind, NewClaim, NewRecord, NodeInfo, Override, ParentView, PruneScope, SharedStore,
    SqsQueueRecord, StoreError, TenantCap, Tokens, sort_counts,
};
use crate::job::{Job, JobId, State, Token, Transition, UnixMillis};

mod claim;
mod cluster;
mod deps;
mod jobs;
pub mod limiter_pause;
mod schedules;
mod schema;
pub mod sqs_queues;
mod tenant_depth;
mod tenant_heads;

pub use schema::SCHEMA_VERSION;

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

/// The channel on which enqueues and redrives announce a queue's new jobs (the
/// payload is the queue's name).
pub const NOTIFY_CHANNEL: &str = "qd_jobs";

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
        jobs::enqueue(self, batch)
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
        jobs::complete(self, ends)
    }

    fn redrive(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        jobs::redrive(self, changes)
    }

    fn set_payload(&mut self, id: JobId, payload: &[u8]) -> Result<bool, StoreError> {
        jobs::set_payload(self, id, payload)
    }

    fn cancel(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        jobs::cancel(self, changes)
    }

    fn purge(&mut self, ids: &[JobId]) -> Result<Vec<bool>, StoreError> {
        jobs::purge(self, ids)
    }

    fn load_unfinished(&mut self) -> Result<Vec<Job>, StoreError> {
        jobs::load_unfinished(self)
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobDetail>, StoreError> {
        jobs::job(self, id)
    }

    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        jobs::list_jobs(self, filter)
    }

    fn prune_finished(
        &mut self,
        scope: &PruneScope,
        finished_before: UnixMillis,
        limit: u32,
    ) -> Result<u64, StoreError> {
        jobs::prune_finished(self, scope, finished_before, limit)
    }

    fn oldest_finished(&mut self, scope: &PruneScope) -> Result<Option<UnixMillis>, StoreError> {
        jobs::oldest_finished(self, scope)
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
        jobs::set_override(self, scope, name, key, value)
    }

    fn overrides(&mut self) -> Result<Vec<Override>, StoreError> {
        jobs::overrides(self)
    }

    fn sqs_queues(&mut self) -> Result<Vec<SqsQueueRecord>, StoreError> {
        jobs::sqs_queues(self)
    }

    fn set_sqs_queue(
        &mut self,
        name: &str,
        record: Option<&SqsQueueRecord>,
    ) -> Result<bool, StoreError> {
        jobs::set_sqs_queue(self, name, record)
    }

    fn probe(&mut self, now: UnixMillis) -> Result<(), StoreError> {
        jobs::probe(self, now)
    }

    fn counts(&mut self) -> Result<Vec<(String, State, u64)>, StoreError> {
        jobs::counts(self)
    }

    fn tenant_counts(&mut self, queue: &str) -> Result<Vec<(String, State, u64)>, StoreError> {
        jobs::tenant_counts(self, queue)
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
        cluster::lock_depths(self, locks)
    }
}

impl SharedStore for PgBackend {
    fn claimable(&mut self, queues: &[String], per_queue: u32) -> Result<Vec<Job>, StoreError> {
        claim::claimable(self, queues, per_queue)
    }

    fn claim_next_as(
        &mut self,
        next: &NewClaim<'_>,
        kind: LeaseKind,
    ) -> Result<Vec<(Job, Vec<u8>)>, StoreError> {
        claim::claim_next_as(self, next, kind)
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
        claim::claim_capped_as(self, leased, lease, caps, kind)
    }

    fn reload(&mut self, ids: &[JobId]) -> Result<Vec<Job>, StoreError> {
        cluster::reload(self, ids)
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
        cluster::beat(self)
    }

    fn own_leases(&mut self) -> Result<Vec<Job>, StoreError> {
        cluster::own_leases(self)
    }

    fn expired_leases(&mut self, limit: u32) -> Result<Vec<Job>, StoreError> {
        cluster::expired_leases(self, limit)
    }

    fn expire(&mut self, ends: &[Transition], epoch: u64) -> Result<Vec<bool>, StoreError> {
        cluster::expire(self, ends, epoch)
    }

    fn extend_lease(
        &mut self,
        id: JobId,
        token: Token,
        extend: Duration,
    ) -> Result<Option<UnixMillis>, StoreError> {
        cluster::extend_lease(self, id, token, extend)
    }

    fn end_if_due(&mut self, ends: &[Transition]) -> Result<Vec<LeaseCheck>, StoreError> {
        cluster::end_if_due(self, ends)
    }

    fn queue_depth(&mut self, queue: &str) -> Result<Option<u64>, StoreError> {
        cluster::queue_depth(self, queue)
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
        cluster::depths(self, now)
    }

    fn nodes(&mut self) -> Result<Vec<NodeInfo>, StoreError> {
        cluster::nodes(self)
    }
}
