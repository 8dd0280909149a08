//! The SQLite engine: opening (pragmas, migrations, error mapping that names the
//! path) and the [`Backend`] operations as SQL. The schema and its invariants are
//! documented in the parent module; [`MIGRATIONS`] is the one place it changes.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::types::Value;
use rusqlite::{
    CachedStatement, Connection, ErrorCode, OpenFlags, OptionalExtension, Row, params,
    params_from_iter,
};
use uuid::Uuid;

use super::contract::{self, Intent, UNFINISHED};
use super::sql_filter::{self, Arg, Dialect};
use super::{
    Backend, Edges, Engine, HistoryLimits, Inserted, JobDetail, JobFilter, NewRecord, Override,
    ParentView, PruneScope, SqliteOptions, SqsQueueRecord, StoreError, history, sort_counts, space,
};
use crate::deps::{self, After, AfterError, AfterPolicy, Counts, Edge};
use crate::job::{HistoryEntry, Job, JobId, State, Token, Transition, UnixMillis};

mod edges;
mod prune;
mod schedules;

/// Schema migrations, applied in order: `MIGRATIONS[i]` takes a database from
/// `user_version` `i` to `i + 1`. Append only; never edit a released entry.
const MIGRATIONS: &[&str] = &[
    V1,
    V2,
    V3,
    SCHEDULES,
    DEPENDENCIES,
    SQS_QUEUES,
    RESULTS,
    PRIORITY,
];

/// Version 1: jobs (payload inline, leases stored), history, overrides.
pub(super) const V1: &str = "
CREATE TABLE jobs (
    id              BLOB    PRIMARY KEY NOT NULL CHECK (length(id) = 16),
    queue           TEXT    NOT NULL,
    tenant          TEXT    NOT NULL,
    idempotency_key TEXT,
    state           TEXT    NOT NULL CHECK (state IN
                        ('delayed', 'ready', 'leased', 'succeeded', 'dead', 'cancelled')),
    attempts        INTEGER NOT NULL CHECK (attempts >= 0),
    budget_start    INTEGER NOT NULL CHECK (budget_start >= 0),
    max_attempts    INTEGER NOT NULL CHECK (max_attempts >= 0),
    lease_seq       INTEGER NOT NULL CHECK (lease_seq >= 0),
    worker          TEXT,
    leased_at       INTEGER,
    created_at      INTEGER NOT NULL,
    ready_at        INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    last_error      TEXT,
    payload         BLOB    NOT NULL
) STRICT;
CREATE UNIQUE INDEX jobs_queue_key ON jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_state_updated ON jobs (state, updated_at);
CREATE INDEX jobs_queue_state_updated ON jobs (queue, state, updated_at);
CREATE TABLE history (
    job_id     BLOB    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    outcome    TEXT    NOT NULL,
    worker     TEXT,
    started_at INTEGER,
    ended_at   INTEGER NOT NULL,
    error      TEXT,
    PRIMARY KEY (job_id, seq)
) STRICT, WITHOUT ROWID;
CREATE TABLE overrides (
    scope TEXT NOT NULL,
    name  TEXT NOT NULL,
    key   TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (scope, name, key)
) STRICT, WITHOUT ROWID;
";

/// Version 2: a narrow `jobs` row (no payload, no lease), payloads in their own
/// table written once, history without a foreign key (deleted with its job by the
/// same statements). A lease stored by version 1 was held by an earlier run: its job
/// becomes `ready` (redelivered), keeping its `lease_seq` so old tokens stay stale.
pub(super) const V2: &str = "
CREATE TABLE jobs_v2 (
    id              BLOB    PRIMARY KEY NOT NULL CHECK (length(id) = 16),
    queue           TEXT    NOT NULL,
    tenant          TEXT    NOT NULL,
    idempotency_key TEXT,
    state           TEXT    NOT NULL CHECK (state IN
                        ('delayed', 'ready', 'succeeded', 'dead', 'cancelled')),
    attempts        INTEGER NOT NULL CHECK (attempts >= 0),
    budget_start    INTEGER NOT NULL CHECK (budget_start >= 0),
    max_attempts    INTEGER NOT NULL CHECK (max_attempts >= 0),
    lease_seq       INTEGER NOT NULL CHECK (lease_seq >= 0),
    created_at      INTEGER NOT NULL,
    ready_at        INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    last_error      TEXT
) STRICT, WITHOUT ROWID;
INSERT INTO jobs_v2 SELECT id, queue, tenant, idempotency_key,
    CASE state WHEN 'leased' THEN 'ready' ELSE state END,
    attempts, budget_start, max_attempts, lease_seq, created_at, ready_at, updated_at,
    last_error FROM jobs;
CREATE TABLE payloads (
    job_id BLOB PRIMARY KEY NOT NULL,
    body   BLOB NOT NULL
) STRICT, WITHOUT ROWID;
INSERT INTO payloads SELECT id, payload FROM jobs;
CREATE TABLE history_v2 (
    job_id     BLOB    NOT NULL,
    seq        INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    outcome    TEXT    NOT NULL,
    worker     TEXT,
    started_at INTEGER,
    ended_at   INTEGER NOT NULL,
    error      TEXT,
    PRIMARY KEY (job_id, seq)
) STRICT, WITHOUT ROWID;
INSERT INTO history_v2 SELECT * FROM history;
DROP TABLE history;
DROP TABLE jobs;
ALTER TABLE jobs_v2 RENAME TO jobs;
ALTER TABLE history_v2 RENAME TO history;
CREATE UNIQUE INDEX jobs_queue_key ON jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_queue_state_updated ON jobs (queue, state, updated_at);
CREATE TABLE meta (
    key   TEXT    PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
";

/// Version 3: cheaper writes of a job, no new facts.
/// - The index by (queue, state, updated_at) keeps only jobs that have ended
///   (succeeded, cancelled) or died: the ones the Pruner deletes and the DLQ views
///   list. A job entering `ready` at its enqueue and leaving it at its ack no longer
///   moves an index entry twice: 2 of the ~8 pages each job wrote. Listing `ready` or
///   `delayed` jobs by queue scans the table instead.
/// - The `state` CHECK is spelled as equalities: SQLite codes an `IN` list of three
///   or more constants as a temporary index built at every run of a statement, so
///   the old CHECK cost every insert and update of a job one (the table is copied
///   once to change it, as version 2 did).
const V3: &str = "
CREATE TABLE jobs_v3 (
    id              BLOB    PRIMARY KEY NOT NULL CHECK (length(id) = 16),
    queue           TEXT    NOT NULL,
    tenant          TEXT    NOT NULL,
    idempotency_key TEXT,
    state           TEXT    NOT NULL CHECK (state = 'delayed' OR state = 'ready'
                        OR state = 'succeeded' OR state = 'dead' OR state = 'cancelled'),
    attempts        INTEGER NOT NULL CHECK (attempts >= 0),
    budget_start    INTEGER NOT NULL CHECK (budget_start >= 0),
    max_attempts    INTEGER NOT NULL CHECK (max_attempts >= 0),
    lease_seq       INTEGER NOT NULL CHECK (lease_seq >= 0),
    created_at      INTEGER NOT NULL,
    ready_at        INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    last_error      TEXT
) STRICT, WITHOUT ROWID;
INSERT INTO jobs_v3 SELECT id, queue, tenant, idempotency_key, state, attempts,
    budget_start, max_attempts, lease_seq, created_at, ready_at, updated_at, last_error
    FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v3 RENAME TO jobs;
CREATE UNIQUE INDEX jobs_queue_key ON jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_queue_ended ON jobs (queue, state, updated_at)
    WHERE state NOT IN ('ready', 'delayed');
";

/// The queues created through the SQS API (`CreateQueue`), with their SQS
/// attributes and tags as JSON text: they are queues of qd's config in force beside
/// the config file's, so they must survive a restart.
const SQS_QUEUES: &str = "
CREATE TABLE sqs_queues (
    name        TEXT    PRIMARY KEY NOT NULL,
    attributes  TEXT    NOT NULL,
    tags        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    modified_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
";

/// Schedules' stored state: next tick, last run, pause ([`super::schedules`]).
const SCHEDULES: &str = "
CREATE TABLE schedules (
    name       TEXT    PRIMARY KEY NOT NULL,
    spec       TEXT    NOT NULL,
    next_tick  INTEGER,
    last_tick  INTEGER,
    last_job   BLOB    CHECK (last_job IS NULL OR length(last_job) = 16),
    paused     INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    updated_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
";

/// Job dependencies (`deps.rs`): the states `waiting` and `blocked`, each child's
/// policy and counters of unmet and broken edges, and the edges themselves.
/// SQLite cannot change a CHECK in place: the `state` column is renamed, a new one
/// with the wider CHECK added, copied, and the old one dropped (the partial index
/// on it goes and comes back). Columns other migrations add to `jobs` are kept.
const DEPENDENCIES: &str = "
DROP INDEX jobs_queue_ended;
ALTER TABLE jobs RENAME COLUMN state TO state_before_dependencies;
ALTER TABLE jobs ADD COLUMN state TEXT NOT NULL DEFAULT 'ready' CHECK (state = 'delayed'
    OR state = 'ready' OR state = 'succeeded' OR state = 'dead' OR state = 'cancelled'
    OR state = 'waiting' OR state = 'blocked');
UPDATE jobs SET state = state_before_dependencies;
ALTER TABLE jobs DROP COLUMN state_before_dependencies;
CREATE INDEX jobs_queue_ended ON jobs (queue, state, updated_at)
    WHERE state NOT IN ('ready', 'delayed');
ALTER TABLE jobs ADD COLUMN after_policy TEXT;
ALTER TABLE jobs ADD COLUMN deps_unmet INTEGER NOT NULL DEFAULT 0 CHECK (deps_unmet >= 0);
ALTER TABLE jobs ADD COLUMN deps_broken INTEGER NOT NULL DEFAULT 0 CHECK (deps_broken >= 0);
CREATE TABLE job_edges (
    parent BLOB NOT NULL,
    child  BLOB NOT NULL,
    state  TEXT NOT NULL CHECK (state = 'open' OR state = 'met' OR state = 'broken'),
    PRIMARY KEY (parent, child)
) STRICT, WITHOUT ROWID;
CREATE INDEX job_edges_child ON job_edges (child);
";

/// A job's priority within its tenant (milliseconds; 0 for jobs stored before).
const PRIORITY: &str = "
ALTER TABLE jobs ADD COLUMN priority_ms INTEGER NOT NULL DEFAULT 0;
";

/// Results, in their own table as payloads are: at most 1 MiB each, kept off the
/// narrow `jobs` rows that every listing and start-up read scans.
const RESULTS: &str = "
CREATE TABLE results (
    job_id BLOB PRIMARY KEY NOT NULL,
    body   BLOB NOT NULL
) STRICT;
";

/// The condition of the `jobs_queue_ended` index (migration 3): succeeded,
/// cancelled or dead, spelled as the two states it leaves out because SQLite codes
/// an `IN` list of three or more constants as a temporary index built at every
/// run of a statement, which every write of a job would pay to check the index's
/// condition. SQLite uses a partial index only for a query whose `WHERE` contains
/// the index's condition as a term, so every query meant to use it repeats this
/// term (see [`ENDED`]) before its own `state = ?`.
macro_rules! ended_condition {
    () => {
        "state NOT IN ('ready', 'delayed')"
    };
}

/// [`ended_condition!`] as a term over the unaliased `jobs` table.
const ENDED: &str = ended_condition!();

/// The live leases of this process: a `TEMP` table, kept in memory by
/// `temp_store=MEMORY` and never written to the database file or its WAL.
const LEASES: &str = "
CREATE TEMP TABLE IF NOT EXISTS leases (
    id        BLOB    PRIMARY KEY NOT NULL,
    token     INTEGER NOT NULL,
    worker    TEXT    NOT NULL,
    leased_at INTEGER NOT NULL
) WITHOUT ROWID;
";

/// The newest schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// How long a statement waits for a lock held by another connection (a backup tool,
/// `sqlite3` in a shell) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The columns of a [`Job`] as seen through a live lease, in the order
/// [`job_from_row`] reads them, over `jobs j LEFT JOIN temp.leases l` ([`JOINED`]).
const JOB_COLUMNS: &str = "j.id, j.queue, j.tenant, j.idempotency_key, \
     CASE WHEN l.id IS NULL THEN j.state ELSE 'leased' END, j.attempts, j.budget_start, \
     j.max_attempts, COALESCE(l.token, j.lease_seq), l.worker, l.leased_at, j.created_at, \
     j.ready_at, j.updated_at, j.last_error, j.priority_ms";

/// A job's state as readers see it: `leased` while this process holds a lease.
const EFFECTIVE_STATE: &str = "CASE WHEN l.id IS NULL THEN j.state ELSE 'leased' END";

/// The unfinished stored jobs ([`UNFINISHED`]), in the columns of [`JOB_COLUMNS`]
/// without the lease's (laid over from `temp.leases` in memory by
/// [`Backend::load_unfinished_chunks`]), as [`stored_job`] reads them; completed by
/// a [`Range`].
static LOAD_UNFINISHED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT id, queue, tenant, idempotency_key, state, attempts, budget_start, \
         max_attempts, lease_seq, created_at, ready_at, updated_at, last_error, priority_ms \
         FROM jobs WHERE {}",
        contract::any_of("state", UNFINISHED)
    )
});

/// Which ids a start-up read covers: all, those below a key, or those from it on.
#[derive(Clone, Copy)]
enum Range {
    All,
    Below([u8; 16]),
    From([u8; 16]),
}

/// Reads the unfinished jobs of `range` on `conn` in key order, handed to `each` in
/// pieces of `chunk`; stops when `each` answers `false`.
fn read_range(
    conn: &Connection,
    range: Range,
    chunk: usize,
    each: &mut dyn FnMut(Vec<Job>) -> bool,
) -> rusqlite::Result<()> {
    let (bound, key) = match range {
        Range::All => ("", None),
        Range::Below(key) => (" AND id < ?1", Some(key)),
        Range::From(key) => (" AND id >= ?1", Some(key)),
    };
    let mut stmt = conn.prepare_cached(&format!("{}{bound} ORDER BY id", *LOAD_UNFINISHED))?;
    let mut rows = match key {
        Some(key) => stmt.query([key])?,
        None => stmt.query([])?,
    };
    let mut names = Names::default();
    let mut part = Vec::with_capacity(chunk);
    while let Some(row) = rows.next()? {
        part.push(stored_job(row, &mut names, 9)?);
        if part.len() == chunk {
            // Fresh name allocations per piece: the caller drops the piece's names
            // on another thread, and a count that both threads change per row makes
            // its cache line bounce between cores.
            names = Names::default();
            if !each(std::mem::replace(&mut part, Vec::with_capacity(chunk))) {
                return Ok(());
            }
        }
    }
    if !part.is_empty() {
        each(part);
    }
    Ok(())
}

/// The stored jobs with this process's leases laid over them.
const JOINED: &str = "jobs j LEFT JOIN temp.leases l ON l.id = j.id";

/// How [`sql_filter`] spells a job filter for SQLite (leases in `temp.leases`).
const DIALECT: Dialect = Dialect {
    placeholder: |n| format!("?{n}"),
    unleased: "l.id IS NULL",
    leased: "l.id IS NOT NULL",
    contains: |p| format!("instr(lower(j.last_error), lower({p})) > 0"),
    jobs: "jobs",
    ended: Some(concat!("j.", ended_condition!())),
};

/// The `UPDATE jobs` statement of [`SqliteBackend::change_each`] under `condition`
/// (SQL over the stored row; `?5` is the transition's token).
fn change_sql(condition: &str) -> String {
    format!(
        "UPDATE jobs SET state = ?2, attempts = ?3, budget_start = ?4, lease_seq = ?5, \
         ready_at = ?6, updated_at = ?7, last_error = ?8 WHERE id = ?1 AND {condition} \
         AND id NOT IN (SELECT id FROM temp.leases)"
    )
}

// The statements of the intents, their conditions taken from the contract and
// spelled once per process, so the statement cache is hit without formatting a
// string per job.

/// [`Backend::complete`]: over a claimable row with an older token and no other
/// lease recorded.
static COMPLETE: LazyLock<String> = LazyLock::new(|| {
    change_sql(&format!(
        "{} AND lease_seq < ?5",
        Intent::Complete.sql("state")
    ))
});

/// [`Backend::redrive`].
static REDRIVE: LazyLock<String> = LazyLock::new(|| change_sql(&Intent::Redrive.sql("state")));

/// [`Backend::cancel`].
static CANCEL: LazyLock<String> = LazyLock::new(|| change_sql(&Intent::Cancel.sql("state")));

/// [`Backend::purge`] of job `?1`.
static PURGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM jobs WHERE id = ?1 AND {}",
        Intent::Purge.sql("state")
    )
});

/// [`Backend::prune_finished`] of job `?1`, picked by [`prune::finished_ids`].
static PRUNE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM jobs WHERE id = ?1 AND {}",
        Intent::Prune.sql("state")
    )
});

/// [`SqliteBackend::settle_held`]: child `?1` takes state `?2`, ready at `?3`,
/// updated at `?4`.
static SETTLE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE jobs SET state = ?2, ready_at = ?3, updated_at = ?4 WHERE id = ?1 AND {}",
        Intent::Settle.sql("state")
    )
});

/// The production [`Backend`]: one SQLite connection in WAL mode with `synchronous=FULL`,
/// owned by the writer thread.
pub struct SqliteBackend {
    conn: Connection,
    path: PathBuf,
    history: HistoryLimits,
    /// The connection's count of changed rows when the open transaction began: the
    /// same count later means nothing is written but not yet committed.
    changes_at_begin: u64,
    /// The count of the database's opens, this open included, plus one for the
    /// runs before opens were counted (`meta` row `runs`, committed by
    /// [`SqliteBackend::open`]): [`Backend::token_skip`].
    runs: u64,
}

/// Bytes the database at `path` takes on disk: the file plus its `-wal` (0 if absent).
pub fn size_on_disk(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    [path.as_os_str(), wal.as_os_str()]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

impl SqliteBackend {
    /// Opens or creates the database at `path`, sets the pragmas, migrates the
    /// schema to [`SCHEMA_VERSION`] and counts this open (one committed write, so
    /// a disk too full for it refuses the open: see [`Backend::token_skip`]). The
    /// parent directory must exist.
    ///
    /// Errors name `path`: [`StoreError::Permission`], [`StoreError::Corrupt`],
    /// [`StoreError::TooNew`], [`StoreError::Full`], [`StoreError::Other`].
    pub fn open(path: &Path, options: &SqliteOptions) -> Result<SqliteBackend, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(StoreError::Permission(format!(
                "cannot open database {}: {} is not an existing directory",
                path.display(),
                dir.display()
            )));
        }
        // A new store holds every payload: create it 0600 whatever the umask (SQLite
        // would make it 0644), and SQLite gives its -wal and -shm the same mode. An
        // existing file keeps its mode; a failure here (e.g. a read-only directory)
        // is reported by the open below, in SQLite's words.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| map_err(path, e))?;
        let mut backend = SqliteBackend {
            conn,
            path: path.to_path_buf(),
            history: options.history,
            changes_at_begin: 0,
            runs: 0,
        };
        // Before WAL mode, which writes the header of a new file with auto-vacuum off.
        space::start_incremental(&backend.conn).map_err(|e| backend.err(e))?;
        backend.configure(options).map_err(|e| backend.err(e))?;
        backend.migrate()?;
        // After the migrations: `VACUUM` cannot run inside their transactions, and a
        // migrated file is rewritten once, compacted, in its final schema.
        space::adopt(&backend.conn, path).map_err(|e| backend.err(e))?;
        backend.runs = backend.count_run().map_err(|e| backend.err(e))?;
        let edges: bool = backend
            .conn
            .query_row("SELECT EXISTS (SELECT 1 FROM job_edges)", [], |r| r.get(0))
            .map_err(|e| backend.err(e))?;
        if edges {
            super::note_local_edges();
        }
        Ok(backend)
    }

    /// Adds this open to the `runs` row of `meta` and answers the new count,
    /// committed and fsynced before it returns (autocommit, `synchronous=FULL`), so
    /// no lease of this run is handed out before it is durable
    /// ([`Backend::token_skip`]).
    ///
    /// A missing row starts at 2, not 1: a store without it may come from a version
    /// that did not count its opens and skipped one token at every start, so any
    /// number of its runs handed out tokens up to `lease_seq + 2` without writing
    /// them. The first counted run must skip past that too (on a new store there is
    /// nothing to skip, and the extra one costs nothing).
    fn count_run(&self) -> rusqlite::Result<u64> {
        let runs: i64 = self.conn.query_row(
            "INSERT INTO meta (key, value) VALUES ('runs', 2) \
             ON CONFLICT (key) DO UPDATE SET value = value + 1 RETURNING value",
            [],
            |r| r.get(0),
        )?;
        u64::try_from(runs).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(0, runs))
    }

    fn configure(&self, options: &SqliteOptions) -> rusqlite::Result<()> {
        self.conn.busy_timeout(BUSY_TIMEOUT)?;
        // Reading the journal mode reads the header: a non-database fails here.
        let mode: String = self
            .conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(format!("journal_mode WAL refused (got {mode})")),
            ));
        }
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        self.conn.pragma_update(None, "temp_store", "MEMORY")?;
        if let Some(pages) = options.max_page_count {
            self.conn.pragma_update(None, "max_page_count", pages)?;
        }
        self.conn.set_prepared_statement_cache_capacity(64);
        // Plans must not depend on bound values: otherwise SQLite re-prepares a
        // statement whenever a binding changes (every history append, every job id),
        // which cost about a tenth of the writer thread's time.
        self.conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        self.conn.execute_batch(LEASES)
    }

    /// SQLite's plan for `sql` with `args`, one `; `-separated line per step: for
    /// tests that check which index a query walks.
    #[cfg(test)]
    pub(crate) fn query_plan(&self, sql: &str, args: impl rusqlite::Params) -> String {
        let plan: Vec<String> = self
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("plan")
            .query_map(args, |r| r.get::<_, String>(3))
            .expect("rows")
            .collect::<rusqlite::Result<_>>()
            .expect("plan rows");
        plan.join("; ")
    }

    /// Applies the missing migrations, each in its own transaction with its version bump.
    fn migrate(&mut self) -> Result<(), StoreError> {
        let found: u32 = self
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| self.err(e))?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        for (from, sql) in (found..).zip(&MIGRATIONS[found as usize..]) {
            let tx = self
                .conn
                .transaction()
                .map_err(|e| map_err(&self.path, e))?;
            tx.execute_batch(sql)
                .and_then(|()| tx.pragma_update(None, "user_version", from + 1))
                .and_then(|()| tx.commit())
                .map_err(|e| map_err(&self.path, e))?;
            tracing::info!(path = %self.path.display(), version = from + 1, "Store schema migrated.");
        }
        Ok(())
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        map_err(&self.path, e)
    }

    /// Runs one row-less statement, prepared once (transaction control runs per op).
    fn exec(&self, sql: &str) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| s.execute([]))
            .map(drop)
            .map_err(|e| self.err(e))
    }

    fn history_of(&self, id: JobId) -> rusqlite::Result<Vec<HistoryEntry>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT attempt, outcome, worker, started_at, ended_at, error \
             FROM history WHERE job_id = ?1 ORDER BY seq",
        )?;
        stmt.query_map([id_bytes(id)], |r| {
            Ok(HistoryEntry {
                attempt: r.get(0)?,
                outcome: parse(r, 1)?,
                worker: r.get(2)?,
                started_at: r.get(3)?,
                ended_at: r.get(4)?,
                error: r.get(5)?,
            })
        })?
        .collect()
    }

    fn query_jobs(&self, sql: &str, args: Vec<Value>) -> Result<Vec<Job>, StoreError> {
        let run = || {
            let mut stmt = self.conn.prepare_cached(sql)?;
            stmt.query_map(params_from_iter(args), job_from_row)?
                .collect::<rusqlite::Result<Vec<Job>>>()
        };
        run().map_err(|e| self.err(e))
    }

    /// One item of [`Backend::enqueue_after`]: reads its parents' states, stores
    /// the job in the state its edges call for, then its edges and counters.
    /// Answers the insert's outcome (`None`: the id is taken) and the state stored,
    /// or why its `after` was refused (nothing written).
    #[allow(clippy::type_complexity)]
    fn enqueue_one_after(
        &self,
        record: &NewRecord,
        after: &After,
    ) -> rusqlite::Result<Result<(Option<Inserted>, State), AfterError>> {
        if after.parents.is_empty() {
            let answer = self.enqueue_each(std::slice::from_ref(record))?;
            let answer = self.same_parents(answer.into_iter().next().flatten(), after)?;
            return Ok(Ok((answer, record.job.state)));
        }
        if let Err(e) = deps::check_after(&after.parents) {
            return Ok(Err(e));
        }
        let mut parents = Vec::with_capacity(after.parents.len());
        {
            let mut state_of = self
                .conn
                .prepare_cached("SELECT state FROM jobs WHERE id = ?1")?;
            for p in &after.parents {
                let state: Option<State> = state_of
                    .query_row([id_bytes(*p)], |r| parse(r, 0))
                    .optional()?;
                match state {
                    Some(state) => parents.push((*p, state)),
                    None => return Ok(Err(AfterError::Unknown(*p))),
                }
            }
        }
        let mut graph = deps::Graph::default();
        let counts = graph.add_child(record.job.id, after.policy, &parents);
        let mut record = record.clone();
        if let Some(held) = deps::child_state(counts) {
            record.job.state = held;
        }
        let answer = self.enqueue_each(std::slice::from_ref(&record))?;
        let answer = answer.into_iter().next().flatten();
        match answer {
            Some(Inserted::New) => {
                super::note_local_edges();
                let mut edge = self.conn.prepare_cached(
                    "INSERT INTO job_edges (parent, child, state) VALUES (?1, ?2, ?3)",
                )?;
                for (p, e) in graph.parents(record.job.id) {
                    edge.execute(params![id_bytes(p), id_bytes(record.job.id), e.as_str()])?;
                }
                self.conn
                    .prepare_cached(
                        "UPDATE jobs SET after_policy = ?2, deps_unmet = ?3, deps_broken = ?4 \
                         WHERE id = ?1",
                    )?
                    .execute(params![
                        id_bytes(record.job.id),
                        after.policy.as_str(),
                        counts.unmet,
                        counts.broken
                    ])?;
            }
            Some(Inserted::Duplicate { .. }) => {
                return Ok(Ok((self.same_parents(answer, after)?, record.job.state)));
            }
            _ => {}
        }
        Ok(Ok((answer, record.job.state)))
    }

    /// A duplicate `answer` whose holder names other parents, or the same parents
    /// under another policy, than `after` (none included) turned into a key
    /// conflict: the same key with another `after` is another request.
    fn same_parents(
        &self,
        answer: Option<Inserted>,
        after: &After,
    ) -> rusqlite::Result<Option<Inserted>> {
        let Some(Inserted::Duplicate {
            id,
            same_payload: true,
        }) = answer
        else {
            return Ok(answer);
        };
        let held: std::collections::BTreeSet<[u8; 16]> = self
            .conn
            .prepare_cached("SELECT parent FROM job_edges WHERE child = ?1")?
            .query_map([id_bytes(id)], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let asked: std::collections::BTreeSet<[u8; 16]> =
            after.parents.iter().map(|p| id_bytes(*p)).collect();
        let policy: Option<String> = self
            .conn
            .prepare_cached("SELECT after_policy FROM jobs WHERE id = ?1")?
            .query_row([id_bytes(id)], |r| r.get(0))
            .optional()?
            .flatten();
        let same_policy = held.is_empty() || policy.as_deref() == Some(after.policy.as_str());
        if held == asked && same_policy {
            return Ok(answer);
        }
        Ok(Some(Inserted::Duplicate {
            id,
            same_payload: false,
        }))
    }

    /// [`Backend::move_edges`]: per changed parent (in id order), its edges to
    /// children, each moved by [`deps::edge_after`], the child's counters, and the
    /// child's state if its counters call for a change.
    fn move_edges_of(
        &self,
        changed: &[(JobId, State)],
        now: UnixMillis,
    ) -> rusqlite::Result<Vec<Job>> {
        let mut changed = changed.to_vec();
        changed.sort_by_key(|(id, _)| *id);
        let mut edges = self.conn.prepare_cached(
            "SELECT e.child, e.state, c.after_policy, c.deps_unmet, c.deps_broken \
             FROM job_edges e JOIN jobs c ON c.id = e.child WHERE e.parent = ?1 \
             ORDER BY e.child",
        )?;
        let mut set_edge = self
            .conn
            .prepare_cached("UPDATE job_edges SET state = ?3 WHERE parent = ?1 AND child = ?2")?;
        let mut set_counts = self
            .conn
            .prepare_cached("UPDATE jobs SET deps_unmet = ?2, deps_broken = ?3 WHERE id = ?1")?;
        let mut settled: Vec<(JobId, Counts, Option<JobId>)> = Vec::new();
        for (parent, state) in changed {
            let rows: Vec<(JobId, Edge, AfterPolicy, Counts)> = edges
                .query_map([id_bytes(parent)], |r| {
                    let policy: Option<String> = r.get(2)?;
                    Ok((
                        JobId(Uuid::from_bytes(r.get(0)?)),
                        parse(r, 1)?,
                        policy.and_then(|p| p.parse().ok()).unwrap_or_default(),
                        Counts {
                            unmet: r.get(3)?,
                            broken: r.get(4)?,
                        },
                    ))
                })?
                .collect::<rusqlite::Result<_>>()?;
            for (child, edge, policy, counts) in rows {
                let new = deps::edge_after(policy, edge, state);
                if new == edge {
                    continue;
                }
                let counts = counts.moved(edge, new);
                set_edge.execute(params![id_bytes(parent), id_bytes(child), new.as_str()])?;
                set_counts.execute(params![id_bytes(child), counts.unmet, counts.broken])?;
                let blamed = (new == Edge::Broken).then_some(parent);
                match settled.iter_mut().find(|(c, _, _)| *c == child) {
                    Some(s) => {
                        s.1 = counts;
                        s.2 = s.2.or(blamed);
                    }
                    None => settled.push((child, counts, blamed)),
                }
            }
        }
        settled.sort_by_key(|(c, _, _)| *c);
        let mut out = Vec::new();
        for (child, counts, blamed) in settled {
            if let Some(next) = self.settle_held(child, counts, now, blamed, None)? {
                out.push(next);
            }
        }
        Ok(out)
    }

    /// Moves a waiting or blocked `child` to the state `counts` call for, with a
    /// history line when it becomes blocked (naming `blamed`) or is released by
    /// `released_by`; answers its new record if it changed.
    fn settle_held(
        &self,
        child: JobId,
        counts: Counts,
        now: UnixMillis,
        blamed: Option<JobId>,
        released_by: Option<&str>,
    ) -> rusqlite::Result<Option<Job>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM {JOINED} WHERE j.id = ?1");
        let job = self
            .conn
            .prepare_cached(&sql)?
            .query_row([id_bytes(child)], job_from_row)
            .optional()?;
        let Some(job) = job else { return Ok(None) };
        let Some(next) = deps::settle_child(&job, counts, now) else {
            return Ok(None);
        };
        let applied = self.conn.prepare_cached(&SETTLE)?.execute(params![
            id_bytes(child),
            next.state.as_str(),
            next.ready_at,
            next.updated_at
        ])?;
        if applied != 1 {
            return Ok(None);
        }
        if let Some((outcome, detail)) = crate::deps::settle_note(next.state, blamed, released_by) {
            let entry = HistoryEntry {
                attempt: job.attempts,
                outcome,
                worker: None,
                started_at: None,
                ended_at: now,
                error: Some(detail),
            };
            let mut append = (
                self.conn.prepare_cached(NEXT_HISTORY_SEQ)?,
                self.conn.prepare_cached(INSERT_HISTORY)?,
            );
            self.append_history(&mut append, child, &entry)?;
        }
        Ok(Some(next))
    }

    /// [`Backend::release_edges`].
    fn release_edges_of(
        &self,
        child: JobId,
        by: &str,
        now: UnixMillis,
    ) -> rusqlite::Result<Option<super::Released>> {
        // Only a blocked job is released: a finished one keeps its edges as they
        // were, and a waiting one has no broken edge.
        let state: Option<String> = self
            .conn
            .prepare_cached("SELECT state FROM jobs WHERE id = ?1")?
            .query_row([id_bytes(child)], |r| r.get(0))
            .optional()?;
        if state.as_deref() != Some(State::Blocked.as_str()) {
            return Ok(None);
        }
        let released: Vec<JobId> = self
            .conn
            .prepare_cached(
                "SELECT parent FROM job_edges WHERE child = ?1 AND state = 'broken' \
                 ORDER BY parent",
            )?
            .query_map([id_bytes(child)], |r| {
                Ok(JobId(Uuid::from_bytes(r.get(0)?)))
            })?
            .collect::<rusqlite::Result<_>>()?;
        if released.is_empty() {
            return Ok(None);
        }
        self.conn
            .prepare_cached(
                "UPDATE job_edges SET state = 'met' WHERE child = ?1 AND state = 'broken'",
            )?
            .execute([id_bytes(child)])?;
        let counts: Counts = self
            .conn
            .prepare_cached(
                "UPDATE jobs SET deps_broken = 0 WHERE id = ?1 \
                 RETURNING deps_unmet, deps_broken",
            )?
            .query_row([id_bytes(child)], |r| {
                Ok(Counts {
                    unmet: r.get(0)?,
                    broken: r.get(1)?,
                })
            })?;
        let by = format!("{by} (parents {})", display_ids(&released));
        let next = self.settle_held(child, counts, now, None, Some(&by))?;
        Ok(Some((next, released)))
    }

    /// Inserts each new job and its payload, or names the holder of its key; the
    /// statements are taken from the cache once for the whole batch.
    fn enqueue_each(&self, batch: &[NewRecord]) -> rusqlite::Result<Vec<Option<Inserted>>> {
        let mut insert_job = self.conn.prepare_cached(
            "INSERT INTO jobs (id, queue, tenant, idempotency_key, state, attempts, \
             budget_start, max_attempts, lease_seq, created_at, ready_at, updated_at, \
             last_error, priority_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
             ON CONFLICT DO NOTHING",
        )?;
        let mut insert_payload = self
            .conn
            .prepare_cached("INSERT INTO payloads (job_id, body) VALUES (?1, ?2)")?;
        let mut answers = Vec::with_capacity(batch.len());
        for record in batch {
            let job = &record.job;
            let inserted = insert_job.execute(params![
                id_bytes(job.id),
                &*job.queue,
                &*job.tenant,
                job.idempotency_key,
                job.state.as_str(),
                job.attempts,
                job.budget_start,
                job.max_attempts,
                stored_seq(job.lease_seq),
                job.created_at,
                job.ready_at,
                job.updated_at,
                job.last_error,
                job.priority_ms,
            ])?;
            answers.push(if inserted == 1 {
                insert_payload.execute(params![id_bytes(job.id), record.payload])?;
                Some(Inserted::New)
            } else {
                self.holder_of_key(record)?
            });
        }
        Ok(answers)
    }

    /// The job holding `record`'s idempotency key in its queue, and whether its
    /// payload is `record`'s; `None` without a key or holder.
    fn holder_of_key(&self, record: &NewRecord) -> rusqlite::Result<Option<Inserted>> {
        let job = &record.job;
        let Some(key) = &job.idempotency_key else {
            return Ok(None);
        };
        self.conn
            .prepare_cached(
                "SELECT j.id, p.body = ?3 FROM jobs j JOIN payloads p ON p.job_id = j.id \
                 WHERE j.queue = ?1 AND j.idempotency_key = ?2",
            )?
            .query_row(params![&*job.queue, key, record.payload], |r| {
                Ok(Inserted::Duplicate {
                    id: JobId(Uuid::from_bytes(r.get(0)?)),
                    same_payload: r.get(1)?,
                })
            })
            .optional()
    }

    /// A key splitting the stored jobs into two halves of the key range (job ids
    /// are time-ordered, so about half the jobs each), or `None` when there are
    /// fewer than two. Two index lookups.
    fn key_split(&self) -> rusqlite::Result<Option<[u8; 16]>> {
        let ends: (Option<[u8; 16]>, Option<[u8; 16]>) = self
            .conn
            .prepare_cached("SELECT min(id), max(id) FROM jobs")?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let (Some(low), Some(high)) = ends else {
            return Ok(None);
        };
        let (low, high) = (u128::from_be_bytes(low), u128::from_be_bytes(high));
        Ok((high > low).then(|| (low + (high - low) / 2 + 1).to_be_bytes()))
    }

    /// The leases in `temp.leases`, by job (empty after a daemon start).
    fn live_leases(&self) -> rusqlite::Result<HashMap<JobId, LiveLease>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, token, worker, leased_at FROM temp.leases")?;
        let rows = stmt.query_map([], |r| {
            let token: i64 = r.get(1)?;
            let lease = LiveLease {
                token: u64::try_from(token)
                    .map_err(|_| rusqlite::Error::IntegralValueOutOfRange(1, token))?,
                worker: r.get(2)?,
                leased_at: r.get(3)?,
            };
            Ok((JobId(Uuid::from_bytes(r.get(0)?)), lease))
        })?;
        rows.collect()
    }

    /// Records each lease in `temp.leases` if its stored job is claimable and not
    /// leased; answers whether it did, per lease.
    fn record_each(&self, leased: &[Job]) -> rusqlite::Result<Vec<bool>> {
        let mut record = self.conn.prepare_cached(&RECORD_LEASE)?;
        leased
            .iter()
            .map(|job| record_lease(&mut record, job))
            .collect()
    }

    /// [`record_lease`] for each job, then its payload if the lease was recorded.
    fn claim_each(&self, leased: &[Job]) -> rusqlite::Result<Vec<Option<Vec<u8>>>> {
        let mut record = self.conn.prepare_cached(&RECORD_LEASE)?;
        let mut payload = self
            .conn
            .prepare_cached("SELECT body FROM payloads WHERE job_id = ?1")?;
        let mut claimed = Vec::with_capacity(leased.len());
        for job in leased {
            claimed.push(if record_lease(&mut record, job)? {
                payload
                    .query_row([id_bytes(job.id)], |r| r.get(0))
                    .optional()?
            } else {
                None
            });
        }
        Ok(claimed)
    }

    /// Writes each transition's mutable columns and its history line with `update`,
    /// one of the `UPDATE jobs` statements made by [`change_sql`] (each conditions
    /// the change on the stored row and on no lease being recorded for the job).
    /// With `end_leases`, first ends the lease each transition's token names. The
    /// statements are taken from the cache once for the whole batch.
    fn change_each(
        &self,
        changes: &[Transition],
        update: &str,
        end_leases: bool,
    ) -> rusqlite::Result<Vec<bool>> {
        let mut end_lease = end_leases
            .then(|| {
                self.conn
                    .prepare_cached("DELETE FROM temp.leases WHERE id = ?1 AND token = ?2")
            })
            .transpose()?;
        let mut update = self.conn.prepare_cached(update)?;
        let mut append = (
            self.conn.prepare_cached(NEXT_HISTORY_SEQ)?,
            self.conn.prepare_cached(INSERT_HISTORY)?,
        );
        let mut set_result = self.conn.prepare_cached(
            "INSERT INTO results (job_id, body) VALUES (?1, ?2) \
             ON CONFLICT (job_id) DO UPDATE SET body = excluded.body",
        )?;
        let mut changed = Vec::with_capacity(changes.len());
        for t in changes {
            let job = &t.job;
            if let Some(end_lease) = &mut end_lease {
                end_lease.execute(params![id_bytes(job.id), stored_seq(job.lease_seq)])?;
            }
            let applied = update.execute(params![
                id_bytes(job.id),
                job.state.as_str(),
                job.attempts,
                job.budget_start,
                stored_seq(job.lease_seq),
                job.ready_at,
                job.updated_at,
                job.last_error,
            ])? == 1;
            if applied && let Some(entry) = &t.entry {
                self.append_history(&mut append, job.id, &history::bounded(entry, &self.history))?;
            }
            if applied && let Some(body) = &t.result {
                set_result.execute(params![id_bytes(job.id), &**body])?;
            }
            changed.push(applied);
        }
        Ok(changed)
    }

    /// Deletes the stored result of each of `changes` that `applied` (a redrive:
    /// the job's life starts over, and so does what it hands back).
    fn clear_results(&self, changes: &[Transition], applied: &[bool]) -> rusqlite::Result<()> {
        let mut clear = self
            .conn
            .prepare_cached("DELETE FROM results WHERE job_id = ?1")?;
        for (t, _) in changes.iter().zip(applied).filter(|(_, a)| **a) {
            clear.execute([id_bytes(t.job.id)])?;
        }
        Ok(())
    }

    /// Appends one history line after the job's newest with `append` (the prepared
    /// [`NEXT_HISTORY_SEQ`] and [`INSERT_HISTORY`]), then applies the history cap
    /// once the job has more entries than the cap keeps.
    fn append_history(
        &self,
        (next_seq, insert): &mut (CachedStatement<'_>, CachedStatement<'_>),
        id: JobId,
        entry: &HistoryEntry,
    ) -> rusqlite::Result<()> {
        let id = id_bytes(id);
        let seq: i64 = next_seq.query_row([id], |r| r.get(0))?;
        insert.execute(params![
            id,
            seq,
            entry.attempt,
            entry.outcome.as_str(),
            entry.worker,
            entry.started_at,
            entry.ended_at,
            entry.error,
        ])?;
        let kept = i64::from(self.history.keep_first) + i64::from(self.history.keep_last.max(1));
        if seq > kept {
            cap_history(&self.conn, &id, &self.history)?;
        }
        Ok(())
    }

    /// Deletes one job with its payload and history; `delete` is the `DELETE FROM jobs`
    /// statement that conditions it on the stored state ([`PURGE`], [`PRUNE`]).
    fn delete_one(&self, id: JobId, delete: &str) -> rusqlite::Result<bool> {
        let deleted = self.conn.prepare_cached(delete)?.execute([id_bytes(id)])?;
        if deleted == 0 {
            return Ok(false);
        }
        for sql in [
            "DELETE FROM payloads WHERE job_id = ?1",
            "DELETE FROM history WHERE job_id = ?1",
            "DELETE FROM results WHERE job_id = ?1",
            "DELETE FROM job_edges WHERE child = ?1",
        ] {
            self.conn.prepare_cached(sql)?.execute([id_bytes(id)])?;
        }
        Ok(true)
    }

    /// Runs `one` over every item, mapping errors to [`StoreError`].
    fn each<T, R>(
        &self,
        items: &[T],
        one: impl Fn(&Self, &T) -> rusqlite::Result<R>,
    ) -> Result<Vec<R>, StoreError> {
        items
            .iter()
            .map(|item| one(self, item).map_err(|e| self.err(e)))
            .collect()
    }
}

/// Deletes the entries of `job_id` the cap no longer keeps ([`history::doomed`]); call right after each
/// history insert (in the same transaction). Returns how many were deleted.
fn cap_history(
    conn: &Connection,
    job_id: &[u8; 16],
    limits: &HistoryLimits,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "DELETE FROM history WHERE job_id = ?1 AND seq > ?2 \
         AND seq <= (SELECT MAX(seq) FROM history WHERE job_id = ?1) - ?3",
    )?
    .execute(params![job_id, limits.keep_first, limits.keep_last.max(1)])
}

/// [`history::elided`] for the stored history of `job_id`.
fn elided_of(conn: &Connection, job_id: &[u8; 16]) -> rusqlite::Result<(u64, usize)> {
    let seqs = conn
        .prepare_cached("SELECT seq FROM history WHERE job_id = ?1 ORDER BY seq")?
        .query_map([job_id], |r| r.get::<_, i64>(0))?
        .map(|seq| seq.map(|s| u64::try_from(s).unwrap_or(0)))
        .collect::<rusqlite::Result<Vec<u64>>>()?;
    Ok(history::elided(&seqs))
}

/// Maps a SQLite error to a [`StoreError`] whose message names the database path.
fn map_err(path: &Path, e: rusqlite::Error) -> StoreError {
    let what = format!("database {}: {e}", path.display());
    match e.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => StoreError::Full(what),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreError::Corrupt(what),
        Some(
            ErrorCode::CannotOpen
            | ErrorCode::ReadOnly
            | ErrorCode::PermissionDenied
            | ErrorCode::AuthorizationForStatementDenied,
        ) => StoreError::Permission(what),
        _ => StoreError::Other(what),
    }
}

/// Ids as a comma-separated list, for history lines.
fn display_ids(ids: &[JobId]) -> String {
    ids.iter()
        .map(JobId::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn id_bytes(id: JobId) -> [u8; 16] {
    *id.0.as_bytes()
}

fn parse<T: std::str::FromStr<Err = String>>(r: &Row<'_>, idx: usize) -> rusqlite::Result<T> {
    let text: String = r.get(idx)?;
    text.parse().map_err(|e: String| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, e.into())
    })
}

fn job_from_row(r: &Row<'_>) -> rusqlite::Result<Job> {
    let mut job = stored_job(r, &mut Names::default(), 11)?;
    job.worker = r.get(9)?;
    job.leased_at = r.get(10)?;
    Ok(job)
}

/// How many rows [`Backend::load_unfinished`] reads per piece.
const LOAD_CHUNK: usize = 4096;

/// A row of `temp.leases`: a lease this process holds.
struct LiveLease {
    token: Token,
    worker: String,
    leased_at: UnixMillis,
}

impl LiveLease {
    /// Shows `job` (as stored) as leased, as [`JOB_COLUMNS`] would read it.
    fn lay_over(self, job: &mut Job) {
        job.state = State::Leased;
        job.lease_seq = self.token;
        job.worker = Some(self.worker);
        job.leased_at = Some(self.leased_at);
    }
}

/// Queue and tenant names already read, so rows share one allocation per name.
#[derive(Default)]
struct Names {
    known: HashSet<Arc<str>>,
    /// The name returned last per column: rows in key order mostly repeat it, and a
    /// comparison is cheaper than a hash.
    last: [Option<Arc<str>>; 2],
}

impl Names {
    /// The shared copy of the text in column `idx` (1 or 2: queue or tenant).
    fn get(&mut self, r: &Row<'_>, idx: usize) -> rusqlite::Result<Arc<str>> {
        let text = r.get_ref(idx)?.as_str().map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, e.into())
        })?;
        let last = &mut self.last[idx % 2];
        if let Some(name) = last.as_ref().filter(|n| &***n == text) {
            return Ok(name.clone());
        }
        let name = match self.known.get(text) {
            Some(name) => name.clone(),
            None => {
                let name: Arc<str> = Arc::from(text);
                self.known.insert(name.clone());
                name
            }
        };
        *last = Some(name.clone());
        Ok(name)
    }
}

/// The [`State`] in column `idx`, read without copying its text.
fn state_of(r: &Row<'_>, idx: usize) -> rusqlite::Result<State> {
    let bad = |e: Box<dyn std::error::Error + Send + Sync>| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, e)
    };
    let text = r.get_ref(idx)?.as_str().map_err(|e| bad(e.into()))?;
    text.parse().map_err(|e: String| bad(e.into()))
}

/// A job without lease fields from columns 0-8 of [`JOB_COLUMNS`], then
/// `created_at, ready_at, updated_at, last_error, priority_ms` from column `rest` on, sharing
/// queue and tenant names through `names`.
fn stored_job(r: &Row<'_>, names: &mut Names, rest: usize) -> rusqlite::Result<Job> {
    let lease_seq: i64 = r.get(8)?;
    Ok(Job {
        id: JobId(Uuid::from_bytes(r.get(0)?)),
        queue: names.get(r, 1)?,
        tenant: names.get(r, 2)?,
        idempotency_key: r.get(3)?,
        state: state_of(r, 4)?,
        attempts: r.get(5)?,
        budget_start: r.get(6)?,
        max_attempts: r.get(7)?,
        lease_seq: u64::try_from(lease_seq)
            .map_err(|_| rusqlite::Error::IntegralValueOutOfRange(8, lease_seq))?,
        worker: None,
        leased_at: None,
        created_at: r.get(rest)?,
        ready_at: r.get(rest + 1)?,
        updated_at: r.get(rest + 2)?,
        last_error: r.get(rest + 3)?,
        priority_ms: r.get(rest + 4)?,
    })
}

/// The stored form of a lease token (SQLite integers are signed 64-bit; a token
/// never comes near `i64::MAX`, one per lease).
fn stored_seq(seq: Token) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// Records a lease in `temp.leases` if the stored job (`?1`) is claimable and
/// not leased: token `?2`, worker `?3`, leased at `?4`.
static RECORD_LEASE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO temp.leases (id, token, worker, leased_at) \
         SELECT id, ?2, ?3, ?4 FROM jobs WHERE id = ?1 AND {} ON CONFLICT DO NOTHING",
        Intent::Claim.sql("state")
    )
});

/// The `seq` of job `?1`'s next history line.
const NEXT_HISTORY_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) + 1 FROM history WHERE job_id = ?1";

/// Inserts a history line (an `INSERT ... SELECT ... RETURNING` in one statement
/// costs more: SQLite buffers `RETURNING` rows in a temporary table).
const INSERT_HISTORY: &str = "INSERT INTO history \
     (job_id, seq, attempt, outcome, worker, started_at, ended_at, error) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// The `list_jobs` query for `filter` and the values to bind to it.
fn list_sql(filter: &JobFilter) -> (String, Vec<Value>) {
    let (tail, args) = sql_filter::tail(filter, &DIALECT);
    let args = args
        .into_iter()
        .map(|arg| match arg {
            Arg::Text(text) => Value::Text(text),
            Arg::Int(n) => Value::Integer(n),
            Arg::Id(id) => Value::Blob(id_bytes(id).to_vec()),
        })
        .collect();
    (format!("SELECT {JOB_COLUMNS} FROM {JOINED}{tail}"), args)
}

/// Runs the prepared [`RECORD_LEASE`] for `job`; answers whether it recorded.
fn record_lease(record: &mut CachedStatement<'_>, job: &Job) -> rusqlite::Result<bool> {
    let claimed = record.execute(params![
        id_bytes(job.id),
        stored_seq(job.lease_seq),
        job.worker.as_deref().unwrap_or(""),
        job.leased_at.unwrap_or(job.updated_at),
    ])?;
    Ok(claimed == 1)
}

impl Backend for SqliteBackend {
    fn enqueue_after(
        &mut self,
        batch: &[NewRecord],
        after: &[After],
        all: bool,
    ) -> Result<Vec<(Inserted, State)>, StoreError> {
        let mut answers = Vec::with_capacity(batch.len());
        for (index, record) in batch.iter().enumerate() {
            let after = after.get(index).cloned().unwrap_or_default();
            let answer = self
                .enqueue_one_after(record, &after)
                .map_err(|e| self.err(e))?;
            let answer = match answer {
                Ok(answer) => answer,
                Err(error) => return Err(StoreError::After { index, error }),
            };
            match answer {
                (None, _) => {
                    return Err(StoreError::Other(format!(
                        "job {} already stored",
                        record.job.id
                    )));
                }
                (
                    Some(Inserted::Duplicate {
                        id,
                        same_payload: false,
                    }),
                    _,
                ) if all => {
                    return Err(StoreError::KeyConflict { index, id });
                }
                (Some(inserted), state) => answers.push((inserted, state)),
            }
        }
        Ok(answers)
    }

    fn move_edges(
        &mut self,
        changed: &[(JobId, State)],
        now: UnixMillis,
    ) -> Result<Vec<Job>, StoreError> {
        self.move_edges_of(changed, now).map_err(|e| self.err(e))
    }

    fn release_edges(
        &mut self,
        child: JobId,
        now: UnixMillis,
    ) -> Result<Option<super::Released>, StoreError> {
        self.release_edges_of(child, "operator", now)
            .map_err(|e| self.err(e))
    }

    fn release_edges_by(
        &mut self,
        child: JobId,
        by: &str,
        now: UnixMillis,
    ) -> Result<Option<super::Released>, StoreError> {
        self.release_edges_of(child, by, now)
            .map_err(|e| self.err(e))
    }

    fn job_records(&mut self, ids: &[JobId]) -> Result<Vec<Option<Job>>, StoreError> {
        self.job_records_of(ids).map_err(|e| self.err(e))
    }

    fn blocked_by(&mut self, parent: JobId) -> Result<Vec<JobId>, StoreError> {
        self.blocked_by_of(parent).map_err(|e| self.err(e))
    }

    fn blocked_counts(&mut self, parent: JobId) -> Result<super::BlockedCounts, StoreError> {
        self.blocked_counts_of(parent).map_err(|e| self.err(e))
    }

    fn release_parent(
        &mut self,
        parent: JobId,
        by: &str,
        now: UnixMillis,
    ) -> Result<Vec<Job>, StoreError> {
        self.release_parent_of(parent, by, now)
            .map_err(|e| self.err(e))
    }

    fn edges(&mut self, id: JobId) -> Result<Edges, StoreError> {
        let read = |sql: &str| -> rusqlite::Result<Vec<(JobId, Edge)>> {
            let mut stmt = self.conn.prepare_cached(sql)?;
            stmt.query_map([id_bytes(id)], |r| {
                Ok((JobId(Uuid::from_bytes(r.get(0)?)), parse(r, 1)?))
            })?
            .collect()
        };
        let parents = read("SELECT parent, state FROM job_edges WHERE child = ?1 ORDER BY parent");
        let children = read("SELECT child, state FROM job_edges WHERE parent = ?1 ORDER BY child");
        match (parents, children) {
            (Ok(parents), Ok(children)) => Ok(Edges { parents, children }),
            (Err(e), _) | (_, Err(e)) => Err(self.err(e)),
        }
    }

    fn parents_of(&mut self, children: &[JobId]) -> Result<Vec<Vec<ParentView>>, StoreError> {
        let read = || -> rusqlite::Result<Vec<Vec<ParentView>>> {
            let mut stmt = self.conn.prepare_cached(
                "SELECT e.parent, CASE WHEN l.id IS NULL THEN j.state ELSE 'leased' END, \
                     j.last_error, r.body \
                 FROM job_edges e JOIN jobs j ON j.id = e.parent \
                 LEFT JOIN temp.leases l ON l.id = j.id \
                 LEFT JOIN results r ON r.job_id = e.parent \
                 WHERE e.child = ?1 ORDER BY e.parent",
            )?;
            children
                .iter()
                .map(|child| {
                    stmt.query_map([id_bytes(*child)], |r| {
                        Ok(ParentView {
                            id: JobId(Uuid::from_bytes(r.get(0)?)),
                            state: parse(r, 1)?,
                            last_error: r.get(2)?,
                            result: r.get(3)?,
                        })
                    })?
                    .collect()
                })
                .collect()
        };
        read().map_err(|e| self.err(e))
    }

    fn queues_of(&mut self, ids: &[JobId]) -> Result<Vec<Option<Arc<str>>>, StoreError> {
        let read = || -> rusqlite::Result<Vec<Option<Arc<str>>>> {
            let mut stmt = self
                .conn
                .prepare_cached("SELECT queue FROM jobs WHERE id = ?1")?;
            ids.iter()
                .map(|id| {
                    stmt.query_row([id_bytes(*id)], |r| r.get::<_, String>(0))
                        .optional()
                        .map(|q| q.map(Arc::from))
                })
                .collect()
        };
        read().map_err(|e| self.err(e))
    }

    fn dependents(&mut self, root: JobId) -> Result<Vec<JobId>, StoreError> {
        let run = || -> rusqlite::Result<Vec<JobId>> {
            let mut stmt = self.conn.prepare_cached(
                "WITH RECURSIVE down(id) AS ( \
                     SELECT child FROM job_edges WHERE parent = ?1 \
                     UNION SELECT e.child FROM job_edges e JOIN down d ON e.parent = d.id) \
                 SELECT j.id FROM down d JOIN jobs j ON j.id = d.id \
                 WHERE j.state NOT IN ('succeeded', 'cancelled', 'dead') ORDER BY j.id",
            )?;
            stmt.query_map([id_bytes(root)], |r| Ok(JobId(Uuid::from_bytes(r.get(0)?))))?
                .collect()
        };
        run().map_err(|e| self.err(e))
    }

    fn enqueue(&mut self, batch: &[NewRecord]) -> Result<Vec<Inserted>, StoreError> {
        let answers = self.enqueue_each(batch).map_err(|e| self.err(e))?;
        batch
            .iter()
            .zip(answers)
            .map(|(record, answer)| {
                answer.ok_or_else(|| {
                    StoreError::Other(format!("job {} already stored", record.job.id))
                })
            })
            .collect()
    }

    fn claim(&mut self, leased: &[Job]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.claim_each(leased).map_err(|e| self.err(e))
    }

    fn leases_are_local(&self) -> bool {
        true
    }

    fn token_skip(&self) -> Token {
        self.runs.max(1)
    }

    fn record_leases(&mut self, leased: &[Job]) -> Result<Vec<bool>, StoreError> {
        self.record_each(leased).map_err(|e| self.err(e))
    }

    /// Ends each lease its token names, then writes the transition if the stored job
    /// is ready or delayed with an older token and no other lease is recorded for it
    /// (the lease itself may not be recorded yet: see [`Backend::leases_are_local`]).
    fn complete(&mut self, ends: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.change_each(ends, &COMPLETE, true)
            .map_err(|e| self.err(e))
    }

    fn redrive(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        let run = || {
            let applied = self.change_each(changes, &REDRIVE, false)?;
            self.clear_results(changes, &applied)?;
            Ok(applied)
        };
        run().map_err(|e| self.err(e))
    }

    fn set_payload(&mut self, id: JobId, payload: &[u8]) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached("UPDATE payloads SET body = ?2 WHERE job_id = ?1")
            .and_then(|mut s| s.execute(params![id_bytes(id), payload]))
            .map(|n| n == 1)
            .map_err(|e| self.err(e))
    }

    fn cancel(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.change_each(changes, &CANCEL, false)
            .map_err(|e| self.err(e))
    }

    fn purge(&mut self, ids: &[JobId]) -> Result<Vec<bool>, StoreError> {
        self.each(ids, |b, id| b.delete_one(*id, &PURGE))
    }

    fn prune_finished(
        &mut self,
        scope: &PruneScope,
        finished_before: UnixMillis,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let doomed = prune::finished_ids(&self.conn, scope, finished_before, limit)
            .map_err(|e| self.err(e))?;
        let deleted = self.each(&doomed, |b, id| b.delete_one(*id, &PRUNE))?;
        Ok(deleted.into_iter().filter(|d| *d).count() as u64)
    }

    fn oldest_finished(&mut self, scope: &PruneScope) -> Result<Option<UnixMillis>, StoreError> {
        prune::oldest_finished(&self.conn, scope).map_err(|e| self.err(e))
    }

    fn release_space(&mut self, keep_free: u32, max_pages: u32) -> Result<u32, StoreError> {
        space::release(&self.conn, keep_free, max_pages).map_err(|e| self.err(e))
    }

    fn load_unfinished(&mut self) -> Result<Vec<Job>, StoreError> {
        let mut jobs = Vec::new();
        self.load_unfinished_chunks(LOAD_CHUNK, &mut |part| {
            jobs.extend(part);
            true
        })?;
        jobs.sort_unstable_by_key(|job| job.id);
        Ok(jobs)
    }

    /// Streams the stored rows in two halves of the key range at once: this
    /// connection reads the lower half while a read-only connection on a second
    /// thread reads the upper half, and their pieces are handed to `each` as they
    /// come (each piece in key order). Queue and tenant names are shared between rows
    /// (one allocation per distinct name and piece). The live leases (none after a
    /// daemon start) are read first and laid over their jobs in memory: a join with
    /// `temp.leases` costs an index probe per row, about half the time of reading a
    /// million rows.
    ///
    /// Both connections see the same rows: the load runs on the writer thread, so no
    /// write commits while it reads, and when an earlier operation of the same batch
    /// wrote rows that are not committed yet (which only this connection sees), this
    /// connection reads the whole range alone.
    fn load_unfinished_chunks(
        &mut self,
        chunk: usize,
        each: &mut dyn FnMut(Vec<Job>) -> bool,
    ) -> Result<(), StoreError> {
        let chunk = chunk.max(1);
        let mut leases = self.live_leases().map_err(|e| self.err(e))?;
        let mut deliver = |mut part: Vec<Job>| {
            if !leases.is_empty() {
                for job in &mut part {
                    if let Some(lease) = leases.remove(&job.id) {
                        lease.lay_over(job);
                    }
                }
            }
            each(part)
        };
        let uncommitted =
            !self.conn.is_autocommit() && self.conn.total_changes() != self.changes_at_begin;
        let split = if uncommitted {
            None
        } else {
            self.key_split().map_err(|e| self.err(e))?
        };
        let Some(split) = split else {
            return read_range(&self.conn, Range::All, chunk, &mut deliver)
                .map_err(|e| self.err(e));
        };
        let (path, conn) = (self.path.clone(), &self.conn);
        let (tx, rx) = std::sync::mpsc::sync_channel::<rusqlite::Result<Vec<Job>>>(2);
        let read = std::thread::scope(move |scope| {
            scope.spawn(move || {
                let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
                let upper = Connection::open_with_flags(&path, flags)
                    .and_then(|upper| upper.busy_timeout(BUSY_TIMEOUT).map(|()| upper));
                let read = upper.and_then(|upper| {
                    read_range(&upper, Range::From(split), chunk, &mut |part| {
                        tx.send(Ok(part)).is_ok()
                    })
                });
                if let Err(e) = read {
                    let _ = tx.send(Err(e));
                }
            });
            // Dropped (ending the upper reader) before the scope joins it.
            let rx = rx;
            let mut failed = None;
            let mut pass = |part: rusqlite::Result<Vec<Job>>| match part {
                Ok(part) => deliver(part),
                Err(e) => {
                    failed = Some(e);
                    false
                }
            };
            let mut go_on = true;
            read_range(conn, Range::Below(split), chunk, &mut |part| {
                go_on = pass(Ok(part));
                while go_on && let Ok(part) = rx.try_recv() {
                    go_on = pass(part);
                }
                go_on
            })?;
            while go_on && let Ok(part) = rx.recv() {
                go_on = pass(part);
            }
            failed.map_or(Ok(()), Err)
        });
        read.map_err(|e| self.err(e))
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobDetail>, StoreError> {
        let sql = format!(
            "SELECT {JOB_COLUMNS}, p.body FROM {JOINED} \
             JOIN payloads p ON p.job_id = j.id WHERE j.id = ?1"
        );
        let read = || {
            let found = self
                .conn
                .prepare_cached(&sql)?
                .query_row([id_bytes(id)], |r| Ok((job_from_row(r)?, r.get(16)?)))
                .optional()?;
            let Some((job, payload)) = found else {
                return Ok(None);
            };
            let result = self
                .conn
                .prepare_cached("SELECT body FROM results WHERE job_id = ?1")?
                .query_row([id_bytes(id)], |r| r.get(0))
                .optional()?;
            let history = self.history_of(id)?;
            let (history_elided, history_elided_at) = elided_of(&self.conn, &id_bytes(id))?;
            Ok(Some(JobDetail {
                job,
                payload,
                result,
                history,
                history_elided,
                history_elided_at,
            }))
        };
        read().map_err(|e| self.err(e))
    }

    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        let (sql, args) = list_sql(filter);
        self.query_jobs(&sql, args)
    }

    fn set_override(
        &mut self,
        scope: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        let result = match value {
            Some(value) => self.conn.execute(
                "INSERT INTO overrides (scope, name, key, value) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (scope, name, key) DO UPDATE SET value = excluded.value",
                params![scope, name, key, value],
            ),
            None => self.conn.execute(
                "DELETE FROM overrides WHERE scope = ?1 AND name = ?2 AND key = ?3",
                params![scope, name, key],
            ),
        };
        result.map(drop).map_err(|e| self.err(e))
    }

    fn schedules(&mut self) -> Result<Vec<super::ScheduleRow>, StoreError> {
        schedules::all(&self.conn).map_err(|e| self.err(e))
    }

    fn advance_schedule(&mut self, advance: &super::Advance) -> Result<bool, StoreError> {
        schedules::advance(&self.conn, advance).map_err(|e| self.err(e))
    }

    fn record_schedule_run(
        &mut self,
        name: &str,
        tick: UnixMillis,
        job: JobId,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        schedules::record_run(&self.conn, name, tick, id_bytes(job), now).map_err(|e| self.err(e))
    }

    fn set_schedule_paused(
        &mut self,
        name: &str,
        paused: bool,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        schedules::set_paused(&self.conn, name, paused, now).map_err(|e| self.err(e))
    }

    fn overrides(&mut self) -> Result<Vec<Override>, StoreError> {
        let read = || {
            let mut stmt = self.conn.prepare_cached(
                "SELECT scope, name, key, value FROM overrides ORDER BY scope, name, key",
            )?;
            stmt.query_map([], |r| {
                Ok(Override {
                    scope: r.get(0)?,
                    name: r.get(1)?,
                    key: r.get(2)?,
                    value: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        };
        read().map_err(|e| self.err(e))
    }

    fn sqs_queues(&mut self) -> Result<Vec<SqsQueueRecord>, StoreError> {
        let read = || {
            let mut stmt = self.conn.prepare_cached(
                "SELECT name, attributes, tags, created_at, modified_at FROM sqs_queues \
                 ORDER BY name",
            )?;
            stmt.query_map([], |r| {
                Ok(SqsQueueRecord {
                    name: r.get(0)?,
                    attributes: r.get(1)?,
                    tags: r.get(2)?,
                    created_at: r.get(3)?,
                    modified_at: r.get(4)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        };
        read().map_err(|e| self.err(e))
    }

    fn set_sqs_queue(
        &mut self,
        name: &str,
        record: Option<&SqsQueueRecord>,
    ) -> Result<bool, StoreError> {
        let write =
            || -> rusqlite::Result<bool> {
                let existed = self
                    .conn
                    .prepare_cached("DELETE FROM sqs_queues WHERE name = ?1")?
                    .execute([name])?
                    > 0;
                if let Some(r) = record {
                    self.conn
                    .prepare_cached(
                        "INSERT INTO sqs_queues (name, attributes, tags, created_at, modified_at) \
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?
                    .execute(params![name, r.attributes, r.tags, r.created_at, r.modified_at])?;
                }
                Ok(existed)
            };
        write().map_err(|e| self.err(e))
    }

    fn probe(&mut self, now: UnixMillis) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('probe', ?1) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut s| s.execute([now]))
            .map(drop)
            .map_err(|e| self.err(e))
    }

    fn counts(&mut self) -> Result<Vec<(String, State, u64)>, StoreError> {
        let sql = format!(
            "SELECT j.queue, {EFFECTIVE_STATE} AS s, COUNT(*) FROM {JOINED} GROUP BY j.queue, s"
        );
        count_rows(&self.conn, &sql, []).map_err(|e| self.err(e))
    }

    fn tenant_counts(&mut self, queue: &str) -> Result<Vec<(String, State, u64)>, StoreError> {
        let sql = format!(
            "SELECT j.tenant, {EFFECTIVE_STATE} AS s, COUNT(*) FROM {JOINED} WHERE j.queue = ?1 \
             AND j.state IN ('delayed', 'ready', 'dead') GROUP BY j.tenant, s"
        );
        count_rows(&self.conn, &sql, [queue]).map_err(|e| self.err(e))
    }
}

/// Runs a `SELECT name, state, COUNT(*) ... GROUP BY name, state` query; the rows
/// come ordered as [`sort_counts`] orders them.
fn count_rows(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<(String, State, u64)>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut counts = stmt
        .query_map(params, |r| {
            Ok((r.get(0)?, parse(r, 1)?, r.get::<_, i64>(2)? as u64))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    sort_counts(&mut counts);
    Ok(counts)
}

impl Engine for SqliteBackend {
    fn begin(&mut self) -> Result<(), StoreError> {
        self.exec("BEGIN IMMEDIATE")?;
        self.changes_at_begin = self.conn.total_changes();
        Ok(())
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.exec("SAVEPOINT op")
    }

    fn release(&mut self) -> Result<(), StoreError> {
        self.exec("RELEASE op")
    }

    fn rollback_to(&mut self) -> Result<(), StoreError> {
        self.exec("ROLLBACK TO op")?;
        self.exec("RELEASE op")
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.exec("COMMIT")
    }

    fn rollback(&mut self) {
        if !self.conn.is_autocommit()
            && let Err(err) = self.exec("ROLLBACK")
        {
            tracing::error!(%err, "Store rollback failed.");
        }
    }

    fn shutdown(&mut self) {
        let checkpoint = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
        if let Err(err) = checkpoint {
            tracing::warn!(%err, "Store checkpoint at close failed; the WAL is replayed at next open.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::JobOrder;

    fn backend() -> (tempfile::TempDir, SqliteBackend) {
        let dir = tempfile::tempdir().expect("tempdir");
        let backend = SqliteBackend::open(&dir.path().join("qd.db"), &SqliteOptions::default())
            .expect("open");
        (dir, backend)
    }

    #[test]
    fn listing_a_queues_dead_or_ended_jobs_walks_the_index_of_ended_jobs() {
        let (_dir, backend) = backend();
        for state in [State::Dead, State::Succeeded, State::Cancelled] {
            let filter = JobFilter {
                queue: Some("q".into()),
                state: Some(state),
                order: JobOrder::RecentlyUpdated,
                limit: 50,
                ..JobFilter::default()
            };
            let (sql, args) = list_sql(&filter);
            let plan = backend.query_plan(&sql, params_from_iter(args));
            assert!(plan.contains("INDEX jobs_queue_ended"), "{state:?}: {plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{state:?} sorts: {plan}");
        }
    }

    /// The column contract: the row's `CHECK` allows exactly the contract's stored
    /// states.
    #[test]
    fn the_schema_stores_exactly_the_contracts_states() {
        let check = &DEPENDENCIES[DEPENDENCIES.find("CHECK (").expect("check")..];
        let check = &check[..check.find(");").expect("end")];
        let states: Vec<&str> = check
            .split("state = '")
            .skip(1)
            .map(|rest| &rest[..rest.find('\'').expect("quoted")])
            .collect();
        assert_eq!(states, contract::STORED.map(State::as_str));
    }

    #[test]
    fn a_jobs_writes_build_no_temporary_index_and_one_index_by_state_holds_ended_jobs() {
        assert!(
            V3.contains(ENDED),
            "the index and the queries' term must agree"
        );
        let (_dir, backend) = backend();
        // Temporary indexes SQLite builds per run of a statement: neither the
        // index's condition nor the table's CHECKs may make a job's writes build one.
        for statement in [
            &*COMPLETE,
            &*REDRIVE,
            &*CANCEL,
            &*PURGE,
            &*PRUNE,
            &*SETTLE,
            &*RECORD_LEASE,
            "INSERT INTO jobs (id, queue, tenant, state, attempts, budget_start, \
             max_attempts, lease_seq, created_at, ready_at, updated_at) \
             VALUES (?1, 'q', 't', 'ready', 0, 0, 1, 0, 0, 0, 0)",
        ] {
            let mut explain = backend
                .conn
                .prepare(&format!("EXPLAIN {statement}"))
                .expect("explain");
            let unbound = vec![Value::Null; explain.parameter_count()];
            let program: Vec<String> = explain
                .query_map(params_from_iter(unbound), |r| r.get::<_, String>(1))
                .expect("rows")
                .collect::<rusqlite::Result<_>>()
                .expect("opcodes");
            assert!(
                !program.iter().any(|op| op == "OpenEphemeral"),
                "a temporary index per write: {statement}"
            );
        }
        let indexes: Vec<String> = backend
            .conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' AND sql IS NOT NULL ORDER BY name")
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("rows")
            .collect::<rusqlite::Result<_>>()
            .expect("names");
        assert_eq!(indexes, ["jobs_queue_ended", "jobs_queue_key"]);
    }
}
