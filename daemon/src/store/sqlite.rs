//! The SQLite engine: opening (pragmas, migrations, error mapping that names the
//! path) and the [`Backend`] operations as SQL. The schema and its invariants are
//! documented in the parent module; [`MIGRATIONS`] is the one place it changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Row, params, params_from_iter,
};
use uuid::Uuid;

use super::{
    Backend, Engine, HistoryLimits, Inserted, JobDetail, JobFilter, JobOrder, Override, PruneScope,
    SqliteOptions, StoreError, history, prune, sort_counts, space,
};
use crate::job::{HistoryEntry, Job, JobId, State, UnixMillis};

/// Schema migrations, applied in order: `MIGRATIONS[i]` takes a database from
/// `user_version` `i` to `i + 1`. Append only; never edit a released entry.
const MIGRATIONS: &[&str] = &[V1];

/// Version 1: jobs, history, overrides (see the parent module for the invariants).
const V1: &str = "
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

/// The newest schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// How long a statement waits for a lock held by another connection (a backup tool,
/// `sqlite3` in a shell) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The columns of a [`Job`], in the order [`job_from_row`] reads them.
const JOB_COLUMNS: &str = "id, queue, tenant, idempotency_key, state, attempts, budget_start, \
     max_attempts, lease_seq, worker, leased_at, created_at, ready_at, updated_at, last_error";

/// The production [`Backend`]: one SQLite connection in WAL mode with `synchronous=FULL`,
/// owned by the writer thread.
pub struct SqliteBackend {
    conn: Connection,
    path: PathBuf,
    history: HistoryLimits,
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
    /// Opens or creates the database at `path`, sets the pragmas and migrates the
    /// schema to [`SCHEMA_VERSION`]. The parent directory must exist.
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
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| map_err(path, e))?;
        let mut backend = SqliteBackend {
            conn,
            path: path.to_path_buf(),
            history: options.history,
        };
        backend.configure(options).map_err(|e| backend.err(e))?;
        space::adopt(&backend.conn, path).map_err(|e| backend.err(e))?;
        backend.migrate()?;
        Ok(backend)
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
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        if let Some(pages) = options.max_page_count {
            self.conn.pragma_update(None, "max_page_count", pages)?;
        }
        self.conn.set_prepared_statement_cache_capacity(32);
        Ok(())
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

    fn payload_of(&self, id: JobId) -> rusqlite::Result<Option<Vec<u8>>> {
        self.conn
            .prepare_cached("SELECT payload FROM jobs WHERE id = ?1")?
            .query_row([id_bytes(id)], |r| r.get(0))
            .optional()
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
    let lease_seq: i64 = r.get(8)?;
    Ok(Job {
        id: JobId(Uuid::from_bytes(r.get(0)?)),
        queue: r.get::<_, Arc<str>>(1)?,
        tenant: r.get::<_, Arc<str>>(2)?,
        idempotency_key: r.get(3)?,
        state: parse(r, 4)?,
        attempts: r.get(5)?,
        budget_start: r.get(6)?,
        max_attempts: r.get(7)?,
        lease_seq: u64::try_from(lease_seq)
            .map_err(|_| rusqlite::Error::IntegralValueOutOfRange(8, lease_seq))?,
        worker: r.get(9)?,
        leased_at: r.get(10)?,
        created_at: r.get(11)?,
        ready_at: r.get(12)?,
        updated_at: r.get(13)?,
        last_error: r.get(14)?,
    })
}

/// The stored form of `lease_seq` (SQLite integers are signed 64-bit).
fn lease_seq(job: &Job) -> Result<i64, StoreError> {
    i64::try_from(job.lease_seq).map_err(|_| {
        StoreError::Other(format!(
            "job {}: lease_seq {} out of range",
            job.id, job.lease_seq
        ))
    })
}

/// Calls `f` with `job`'s column values as `?1..?15` in [`JOB_COLUMNS`] order, then
/// `extra` (the payload of an insert) as `?16`: the one place that order is spelled.
fn with_job_params<R>(
    job: &Job,
    extra: Option<&dyn rusqlite::ToSql>,
    f: impl FnOnce(&[&dyn rusqlite::ToSql]) -> R,
) -> Result<R, StoreError> {
    let (id, seq, state) = (id_bytes(job.id), lease_seq(job)?, job.state.as_str());
    let mut values: Vec<&dyn rusqlite::ToSql> = vec![
        &id,
        &job.queue,
        &job.tenant,
        &job.idempotency_key,
        &state,
        &job.attempts,
        &job.budget_start,
        &job.max_attempts,
        &seq,
        &job.worker,
        &job.leased_at,
        &job.created_at,
        &job.ready_at,
        &job.updated_at,
        &job.last_error,
    ];
    values.extend(extra);
    Ok(f(&values))
}

impl Backend for SqliteBackend {
    fn insert_job(&mut self, job: &Job, payload: &[u8]) -> Result<Inserted, StoreError> {
        if let Some(key) = &job.idempotency_key {
            let hit: Option<([u8; 16], bool)> = self
                .conn
                .prepare_cached(
                    "SELECT id, payload = ?3 FROM jobs WHERE queue = ?1 AND idempotency_key = ?2",
                )
                .and_then(|mut s| {
                    s.query_row(params![&*job.queue, key, payload], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                })
                .map_err(|e| self.err(e))?;
            if let Some((id, same_payload)) = hit {
                let id = JobId(Uuid::from_bytes(id));
                return Ok(Inserted::Duplicate { id, same_payload });
            }
        }
        let sql = format!(
            "INSERT INTO jobs ({JOB_COLUMNS}, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
        );
        with_job_params(job, Some(&payload), |p| {
            self.conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.execute(p))
        })?
        .map_err(|e| self.err(e))?;
        Ok(Inserted::New)
    }

    fn update_job(&mut self, job: &Job, entry: Option<&HistoryEntry>) -> Result<(), StoreError> {
        let changed = with_job_params(job, None, |p| {
            self.conn
                .prepare_cached(
                    "UPDATE jobs SET queue = ?2, tenant = ?3, idempotency_key = ?4, state = ?5, \
                     attempts = ?6, budget_start = ?7, max_attempts = ?8, lease_seq = ?9, \
                     worker = ?10, leased_at = ?11, created_at = ?12, ready_at = ?13, \
                     updated_at = ?14, last_error = ?15 WHERE id = ?1",
                )
                .and_then(|mut s| s.execute(p))
        })?
        .map_err(|e| self.err(e))?;
        if changed == 0 {
            return Err(StoreError::Other(format!(
                "update of unknown job {}",
                job.id
            )));
        }
        let Some(entry) = entry.map(|e| history::bounded(e, &self.history)) else {
            return Ok(());
        };
        self.conn
            .prepare_cached(
                "INSERT INTO history (job_id, seq, attempt, outcome, worker, started_at, \
                 ended_at, error) SELECT ?1, COALESCE(MAX(seq), 0) + 1, ?2, ?3, ?4, ?5, ?6, ?7 \
                 FROM history WHERE job_id = ?1",
            )
            .and_then(|mut s| {
                s.execute(params![
                    id_bytes(job.id),
                    entry.attempt,
                    entry.outcome.as_str(),
                    entry.worker,
                    entry.started_at,
                    entry.ended_at,
                    entry.error,
                ])
            })
            .map_err(|e| self.err(e))?;
        history::cap_history(&self.conn, &id_bytes(job.id), &self.history)
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn delete_jobs(&mut self, ids: &[JobId]) -> Result<u64, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("DELETE FROM jobs WHERE id = ?1")
            .map_err(|e| map_err(&self.path, e))?;
        let mut deleted = 0;
        for id in ids {
            deleted += stmt
                .execute([id_bytes(*id)])
                .map_err(|e| map_err(&self.path, e))? as u64;
        }
        Ok(deleted)
    }

    fn payloads(&mut self, ids: &[JobId]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        ids.iter()
            .map(|id| self.payload_of(*id).map_err(|e| self.err(e)))
            .collect()
    }

    fn load_unfinished(&mut self) -> Result<Vec<Job>, StoreError> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs \
             WHERE state IN ('delayed', 'ready', 'leased', 'dead') ORDER BY id"
        );
        self.query_jobs(&sql, Vec::new())
    }

    fn job(&mut self, id: JobId) -> Result<Option<JobDetail>, StoreError> {
        let sql = format!("SELECT {JOB_COLUMNS}, payload FROM jobs WHERE id = ?1");
        let read = || {
            let found = self
                .conn
                .prepare_cached(&sql)?
                .query_row([id_bytes(id)], |r| Ok((job_from_row(r)?, r.get(15)?)))
                .optional()?;
            let Some((job, payload)) = found else {
                return Ok(None);
            };
            let history = self.history_of(id)?;
            let (history_elided, history_elided_at) =
                history::elided_of(&self.conn, &id_bytes(id))?;
            Ok(Some(JobDetail {
                job,
                payload,
                history,
                history_elided,
                history_elided_at,
            }))
        };
        read().map_err(|e| self.err(e))
    }

    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        let mut clauses: Vec<String> = Vec::new();
        let mut args: Vec<Value> = Vec::new();
        // Binds `value` as the next parameter `?n` and adds the clause `make(n)`.
        let mut add = |make: &dyn Fn(usize) -> String, value: Value| {
            args.push(value);
            clauses.push(make(args.len()));
        };
        if let Some(queue) = &filter.queue {
            add(&|n| format!("queue = ?{n}"), Value::Text(queue.clone()));
        }
        if let Some(tenant) = &filter.tenant {
            add(&|n| format!("tenant = ?{n}"), Value::Text(tenant.clone()));
        }
        if let Some(state) = filter.state {
            add(
                &|n| format!("state = ?{n}"),
                Value::Text(state.as_str().into()),
            );
        }
        if let Some(text) = &filter.error_contains {
            let clause = |n| format!("instr(lower(last_error), lower(?{n})) > 0");
            add(&clause, Value::Text(text.clone()));
        }
        if let Some(since) = filter.updated_since {
            add(&|n| format!("updated_at >= ?{n}"), Value::Integer(since));
        }
        if let Some(after) = filter.after {
            let cursor = |n| match filter.order {
                JobOrder::OldestFirst => format!("id > ?{n}"),
                JobOrder::NewestFirst => format!("id < ?{n}"),
                JobOrder::RecentlyUpdated => {
                    format!("(updated_at, id) < (SELECT updated_at, id FROM jobs WHERE id = ?{n})")
                }
            };
            add(&cursor, Value::Blob(id_bytes(after).to_vec()));
        }
        let mut sql = format!("SELECT {JOB_COLUMNS} FROM jobs");
        if !clauses.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&clauses.join(" AND "));
        }
        args.push(Value::Integer(filter.limit.into()));
        let order = match filter.order {
            JobOrder::OldestFirst => "id",
            JobOrder::NewestFirst => "id DESC",
            JobOrder::RecentlyUpdated => "updated_at DESC, id DESC",
        };
        sql.push_str(&format!(" ORDER BY {order} LIMIT ?{}", args.len()));
        self.query_jobs(&sql, args)
    }

    fn prune_finished(
        &mut self,
        scope: &PruneScope,
        finished_before: UnixMillis,
        limit: u32,
    ) -> Result<u64, StoreError> {
        prune::prune_finished(&self.conn, scope, finished_before, limit).map_err(|e| self.err(e))
    }

    fn oldest_finished(&mut self, scope: &PruneScope) -> Result<Option<UnixMillis>, StoreError> {
        prune::oldest_finished(&self.conn, scope).map_err(|e| self.err(e))
    }

    fn release_space(&mut self, keep_free: u32, max_pages: u32) -> Result<u32, StoreError> {
        space::release(&self.conn, keep_free, max_pages).map_err(|e| self.err(e))
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

    fn counts(&mut self) -> Result<Vec<(String, State, u64)>, StoreError> {
        let sql = "SELECT queue, state, COUNT(*) FROM jobs GROUP BY queue, state";
        count_rows(&self.conn, sql, []).map_err(|e| self.err(e))
    }

    fn tenant_counts(&mut self, queue: &str) -> Result<Vec<(String, State, u64)>, StoreError> {
        let sql = "SELECT tenant, state, COUNT(*) FROM jobs WHERE queue = ?1 \
                   AND state IN ('delayed', 'ready', 'leased', 'dead') GROUP BY tenant, state";
        count_rows(&self.conn, sql, [queue]).map_err(|e| self.err(e))
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
        self.exec("BEGIN IMMEDIATE")
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
