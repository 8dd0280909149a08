//! The durable store: every job, its payload, its attempt history and the runtime
//! overrides, in one embedded SQLite database (or, with `[daemon] database_url`, a
//! PostgreSQL database) written by one dedicated OS thread.
//!
//! # Shape
//! The broker (an actor) never blocks on disk. It hands an operation and a completion
//! callback to [`Store::submit`] (or awaits [`Store::run`]); the writer thread runs
//! operations in **group commit**: it blocks for the first request, drains up to
//! [`MAX_BATCH`] more without waiting, opens one transaction (`BEGIN IMMEDIATE`), runs
//! each operation in its own `SAVEPOINT` (one failing or panicking operation does not
//! poison the batch), commits once (one fsync), and only then calls every completion.
//! Reads go through the same thread, so a caller always reads its own writes.
//!
//! Operations see the database through the [`Backend`] trait, shaped by intent
//! (enqueue, claim, complete, redrive, cancel, purge, prune, reads) with batches as
//! the unit, so several nodes may share one database. Takes no messages: actors
//! call [`Store`], whose writer calls the engine.
//!
//! # Layers
//! - **The contract**, engine-neutral: the [`Backend`] and [`SharedStore`] traits
//!   (this file); [`contract`], the stored states each intent applies to and its
//!   lease rule, stated once as data with the SQL spelling every engine uses;
//!   [`history`], the history cap; [`prune`], which queues a prune pass covers.
//! - **The writer** (`store/writer.rs`, [`Store`]): group commit, one savepoint
//!   per operation, completions after the commit.
//! - **The engines**, one folder each: [`memory::MemoryBackend`] (the model, with
//!   local leases or, [`memory::MemoryBackend::shared`], as a shared store);
//!   [`sqlite::SqliteBackend`] (`store/sqlite.rs` with `store/sqlite/`: edges,
//!   prune, schedules; the production default); [`postgres::PgBackend`]
//!   (`store/postgres.rs`, the connection and the trait implementations, with
//!   `store/postgres/`: schema, jobs, claim, cluster, limiter, dependencies,
//!   tenants' depths and heads, schedules; leases stored in the row, see its
//!   module doc for what differs). The two SQL engines share `store/sql_filter.rs`
//!   (job listings); `store/space.rs` is SQLite's file space.
//! - **The conformance suite** (`store/tests/conformance.rs`) holds every engine
//!   to the contract, asking an engine which lease rule it keeps
//!   ([`Backend::leases_are_local`]) where engines legitimately differ; the model
//!   tests (`store/tests/model.rs`) compare SQLite and PostgreSQL with the model
//!   under random operations.
//!
//! # Invariants
//! - **An accepted job is never lost**: a completion runs only after its transaction
//!   committed with `synchronous=FULL` (the WAL is fsynced), so a producer answered
//!   from the completion holds a durable promise. If the commit fails, every operation
//!   of the batch is rolled back and answered with the commit's error.
//! - Every completion is called exactly once: with the operation's result, the batch's
//!   commit error, or [`StoreError::Closed`] if the writer is gone (never a hang).
//! - A job costs two durable writes in its life: its enqueue (row + payload) and the
//!   end of each attempt (row + one history line). Leases and heartbeats are not
//!   durable: a lease dies with the process, and its job, still `ready`/`delayed` on
//!   disk, is redelivered by the next run.
//! - Every change of an existing job is conditioned on its expected stored state
//!   (the states of its [`contract::Intent`]) and
//!   answered per item (applied or not); nothing assumes a single writer.
//! - At most one stored job per `(queue, idempotency_key)` (a unique index); a key is
//!   freed when its job is pruned or purged.
//! - A job's history is appended to (`seq` 1, 2, ...) and deleted with its job; the
//!   history cap ([`history`]) deletes the entries between the first `keep_first`
//!   and the last `keep_last`, and bounds each entry's error text. The newest entry
//!   is always kept, so `seq` never restarts and its gaps count what was elided.
//! - Finished jobs are pruned per queue by the Pruner in bounded batches
//!   ([`prune`]); the file gives free pages back in bounded steps (`auto_vacuum =
//!   INCREMENTAL`, converted once at open) and the WAL is truncated back to
//!   `journal_size_limit` (64 MiB) after checkpoints (`store/space.rs`).
//! - Ids are UUIDv7 stored as 16 big-endian bytes, so byte order is creation order and
//!   "ordered by id" means "oldest first".
//!
//! # On-disk format (schema version 3, kept in `PRAGMA user_version`)
//! ```text
//! jobs(id BLOB(16) PK, queue TEXT, tenant TEXT, idempotency_key TEXT NULL,
//!      state TEXT in (delayed ready succeeded dead cancelled),
//!      attempts, budget_start, max_attempts, lease_seq INTEGER,
//!      created_at, ready_at, updated_at INTEGER (Unix ms),
//!      last_error TEXT NULL)                            STRICT, WITHOUT ROWID
//!   UNIQUE (queue, idempotency_key) WHERE idempotency_key IS NOT NULL
//!   INDEX (queue, state, updated_at) WHERE state NOT IN (ready delayed)
//!                                      -- prune, DLQ views, list_jobs of those states;
//!                                      -- an enqueue writes no entry, an ack one
//! payloads(job_id BLOB(16) PK, body BLOB)              STRICT, WITHOUT ROWID
//!                                      -- written once at enqueue, read at claim
//! history(job_id BLOB, seq INTEGER, attempt INTEGER, outcome TEXT, worker TEXT NULL,
//!         started_at INTEGER NULL, ended_at INTEGER, error TEXT NULL)
//!                                               PK (job_id, seq)    STRICT, WITHOUT ROWID
//! overrides(scope TEXT, name TEXT, key TEXT, value TEXT)
//!                                               PK (scope, name, key) STRICT, WITHOUT ROWID
//! meta(key TEXT PK, value INTEGER)     -- "probe": last write probe (Unix ms)
//! sqs_queues(name TEXT PK, attributes TEXT, tags TEXT, created_at INTEGER,
//!            modified_at INTEGER)       STRICT, WITHOUT ROWID
//!                                      -- queues created by SQS CreateQueue (api/sqs)
//! temp.leases(id BLOB PK, token INTEGER, worker TEXT, leased_at INTEGER)
//!                                      -- per connection, in memory, never on disk
//! ```
//! Version 1 kept everything, payload included, in one wide `jobs` row rewritten on
//! every transition, and stored leases; migration 2 splits it (a stored lease becomes
//! `ready`: its holder was an earlier run); migration 3 narrows the state index to
//! ended and dead jobs (listing `ready` or `delayed` jobs of a queue scans the
//! table) and copies `jobs` once to respell its `state` CHECK (see `V3` in
//! `store/sqlite.rs`). Payloads and history rows are deleted with
//! their job by the same statement batch (no foreign keys).
//!
//! Pragmas on every open: `journal_mode=WAL`, `synchronous=FULL`, `temp_store=MEMORY`,
//! `busy_timeout=5s`, `journal_size_limit=64MiB`, `wal_autocheckpoint=1000`, and
//! `auto_vacuum=INCREMENTAL` (set by a one-time `VACUUM` at open after the
//! migrations, see `store/space.rs`). Schema changes are migrations appended to one list in
//! `store/sqlite.rs`, applied in order, each in its own transaction that also bumps
//! `user_version`; a database with a newer version than this build knows is refused
//! ([`StoreError::TooNew`]) rather than misread.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::job::{HistoryEntry, Job, JobId, State, Token, Transition, UnixMillis};

pub mod contract;
pub mod history;
pub mod memory;
pub mod postgres;
pub mod prune;
pub mod schedules;
mod space;
mod sql_filter;
pub mod sqlite;
mod writer;

pub use history::HistoryLimits;
pub use prune::PruneScope;
pub use schedules::{Advance, ScheduleRow};

use writer::{OpTask, Queue, Task};

/// The most requests one transaction takes (the first one plus up to this many minus one
/// queued behind it). Bounds the latency a batch adds to its first caller.
pub const MAX_BATCH: usize = 1024;

/// The operations a storage engine offers, shaped by intent and taking batches, run
/// on the writer thread inside its transaction. Each submitted operation runs in its
/// own `SAVEPOINT`: if it returns `Err` (or panics), all its writes are undone.
///
/// No operation assumes it is the only writer: every change of an existing job is
/// conditioned on the state the caller expects the store to hold (`UPDATE ... WHERE
/// id = ? AND state IN (...)`) and reports per item whether it applied, so a second
/// node (or a stale caller) can never overwrite a newer state. Dedupe rests on the
/// unique `(queue, idempotency_key)` index, not on a read before the insert.
///
/// Leases: a job's *durable* states are delayed, ready, succeeded, dead and
/// cancelled. A lease lives in the backend's memory only (SQLite: a `TEMP` table,
/// never written to the database file): claim writes nothing to disk, and the leases of an earlier process are
/// simply absent, so those jobs are still `ready`/`delayed` and are redelivered.
/// Reads show a live lease over the stored row, so `GET /v1/jobs/{id}` says
/// `leased`. A backend shared by several nodes (PostgreSQL) stores the lease in the
/// row instead; the contract below is the same.
pub trait Backend: Send {
    /// Stores new jobs with their payloads (bytes, opaque; written once, never
    /// rewritten), answering per item in order.
    ///
    /// Dedupe per item: if a stored job of the same queue (including one earlier in
    /// this batch) has the same idempotency key, nothing is written for the item and
    /// [`Inserted::Duplicate`] names the holder, saying whether its payload is
    /// byte-identical. Errors: [`StoreError::Full`] when the disk is full; an id
    /// already stored is [`StoreError::Other`].
    fn enqueue(&mut self, batch: &[NewRecord]) -> Result<Vec<Inserted>, StoreError>;

    /// [`Backend::enqueue`] for a batch that is accepted whole or not at all (the
    /// batch enqueue endpoint): if any item's key is held by a job with a different
    /// payload (a stored one, or one earlier in this batch), fails with
    /// [`StoreError::KeyConflict`] naming the first such item. Run as one operation
    /// ([`Store::submit`]), whose savepoint undoes the items already written; a
    /// duplicate with the same payload is answered as by [`Backend::enqueue`].
    fn enqueue_all(&mut self, batch: &[NewRecord]) -> Result<Vec<Inserted>, StoreError> {
        let answers = self.enqueue(batch)?;
        let conflict = answers
            .iter()
            .enumerate()
            .find_map(|(index, answer)| match answer {
                Inserted::Duplicate {
                    id,
                    same_payload: false,
                } => Some((index, *id)),
                _ => None,
            });
        match conflict {
            Some((index, id)) => Err(StoreError::KeyConflict { index, id }),
            None => Ok(answers),
        }
    }

    /// [`Backend::enqueue`] (or, with `all`, [`Backend::enqueue_all`]) for jobs
    /// that may name parents: `after[i]` is item `i`'s (no parents: stored as by
    /// `enqueue`). Each parent must be a stored job (one earlier in the batch
    /// counts); a parent already final counts at once (`deps::edge_after`), and an
    /// item with an edge not met is stored `waiting` or `blocked`
    /// (`deps::child_state`) with its edges and counters. Answers per item, in
    /// order, the insert's outcome and the state stored. A duplicate key whose
    /// holder names other parents is answered as a different payload (a key
    /// conflict). Errors: [`StoreError::After`] for an unknown parent; otherwise
    /// as `enqueue`. A backend without dependencies refuses any parent.
    fn enqueue_after(
        &mut self,
        batch: &[NewRecord],
        after: &[crate::deps::After],
        all: bool,
    ) -> Result<Vec<(Inserted, State)>, StoreError> {
        if after.iter().any(|a| !a.parents.is_empty()) {
            return Err(StoreError::Other(
                "this store engine does not support job dependencies (after)".into(),
            ));
        }
        let answers = if all {
            self.enqueue_all(batch)?
        } else {
            self.enqueue(batch)?
        };
        Ok(answers
            .into_iter()
            .zip(batch)
            .map(|(a, r)| (a, r.job.state))
            .collect())
    }

    /// Moves the edges of jobs this operation just changed (`changed`: each job's
    /// id and new state, written and applied already) and settles their children,
    /// at wall time `now`, in the same transaction: the children's counters change
    /// under their row locks, then each child whose counters call for it changes
    /// state (`deps::settle_child`). Answers the children's new records, in id
    /// order. Called by the Broker after every write of job states.
    fn move_edges(
        &mut self,
        changed: &[(JobId, State)],
        now: UnixMillis,
    ) -> Result<Vec<Job>, StoreError> {
        let _ = (changed, now);
        Ok(Vec::new())
    }

    /// Counts `child`'s broken edges as met (an operator's release) and settles
    /// it at `now`: answers its new record if it changed state, and the parents
    /// released; `None` for an unknown job or one with no broken edge.
    fn release_edges(
        &mut self,
        child: JobId,
        now: UnixMillis,
    ) -> Result<Option<Released>, StoreError> {
        let _ = (child, now);
        Ok(None)
    }

    /// [`Backend::release_edges`] with the operator `by` named in the child's
    /// history line (`released by uid N (parents ...)`). Only a `blocked` child is
    /// released; any other state answers `None`. The default ignores `by`.
    fn release_edges_by(
        &mut self,
        child: JobId,
        by: &str,
        now: UnixMillis,
    ) -> Result<Option<Released>, StoreError> {
        let _ = by;
        self.release_edges(child, now)
    }

    /// The records of `ids` (no payload, no history), in order; `None` for a job
    /// not stored (never enqueued, or purged or pruned). The default reads each
    /// job whole.
    fn job_records(&mut self, ids: &[JobId]) -> Result<Vec<Option<Job>>, StoreError> {
        ids.iter()
            .map(|id| Ok(self.job(*id)?.map(|d| d.job)))
            .collect()
    }

    /// The unfinished direct children `parent` holds back: those whose edge from it
    /// is not met (a dead parent's broken edges), in id order. A purge of `parent`
    /// would leave them waiting for a job that no longer exists. A store shared by
    /// several nodes locks `parent`'s row first, so the answer holds until the
    /// transaction ends (callers check several parents in id order). The default
    /// reads [`Backend::edges`] and each child's state.
    fn blocked_by(&mut self, parent: JobId) -> Result<Vec<JobId>, StoreError> {
        let edges = self.edges(parent)?;
        let mut held = Vec::new();
        for (child, edge) in edges.children {
            if edge == crate::deps::Edge::Met {
                continue;
            }
            if self.job(child)?.is_some_and(|d| !d.job.state.is_final()) {
                held.push(child);
            }
        }
        Ok(held)
    }

    /// How many jobs `parent` holds back: its direct ones ([`Backend::blocked_by`])
    /// and, transitively, every unfinished job below them reached over edges that
    /// are not met (each job once).
    fn blocked_counts(&mut self, parent: JobId) -> Result<BlockedCounts, StoreError> {
        let direct = self.blocked_by(parent)?;
        let mut seen: std::collections::BTreeSet<JobId> = direct.iter().copied().collect();
        let mut todo = direct.clone();
        while let Some(id) = todo.pop() {
            for child in self.blocked_by(id)? {
                if seen.insert(child) {
                    todo.push(child);
                }
            }
        }
        Ok(BlockedCounts {
            direct: direct.len() as u64,
            transitive: seen.len() as u64,
        })
    }

    /// Counts every edge from `parent` to an unfinished child that is not met as
    /// met (a purge with `--release`), and settles those children at `now` with a
    /// history line naming `by`; answers the children whose state changed. A
    /// backend without dependencies has nothing to release; one that holds edges
    /// but cannot release them refuses.
    fn release_parent(
        &mut self,
        parent: JobId,
        by: &str,
        now: UnixMillis,
    ) -> Result<Vec<Job>, StoreError> {
        let _ = (by, now);
        if self.blocked_by(parent)?.is_empty() {
            Ok(Vec::new())
        } else {
            Err(StoreError::Other(
                "this store engine cannot release dependency edges".into(),
            ))
        }
    }

    /// The edges of `id`: its parents and its direct children, each with the edge's
    /// state, in id order.
    fn edges(&mut self, id: JobId) -> Result<Edges, StoreError> {
        let _ = id;
        Ok(Edges::default())
    }

    /// The parents of each of `children` as the child's attempt sees them (a
    /// lease's `parents`, `$QD_PARENTS_FILE`, a webhook's envelope): each parent's
    /// id, state, result and last error, in parent id order, one list per child in
    /// the order given (empty for a job without parents). One read. An engine
    /// without dependencies answers empty lists (it refuses `after`).
    fn parents_of(&mut self, children: &[JobId]) -> Result<Vec<Vec<ParentView>>, StoreError> {
        Ok(vec![Vec::new(); children.len()])
    }

    /// The queue of each of `ids`, in order; `None` for an unknown job (the check
    /// that a token may use the queues of the parents it names).
    fn queues_of(&mut self, ids: &[JobId]) -> Result<Vec<Option<Arc<str>>>, StoreError> {
        ids.iter()
            .map(|id| Ok(self.job(*id)?.map(|d| d.job.queue)))
            .collect()
    }

    /// Every unfinished job that depends on `root`, directly or not, in id order.
    fn dependents(&mut self, root: JobId) -> Result<Vec<JobId>, StoreError> {
        let _ = root;
        Ok(Vec::new())
    }

    /// Takes leases: each of `leased` is the job's record after the lease (state
    /// leased, `lease_seq` = the new token, `worker`, `leased_at`). A claim applies only
    /// if the stored job is ready or delayed and not leased; answers, per item in
    /// order, its payload, or `None` if the claim did not apply (unknown job, or not
    /// claimable). Writes nothing durable.
    fn claim(&mut self, leased: &[Job]) -> Result<Vec<Option<Vec<u8>>>, StoreError>;

    /// [`Backend::claim`] without reading the payloads (the caller holds them):
    /// answers per item whether the lease was recorded.
    fn record_leases(&mut self, leased: &[Job]) -> Result<Vec<bool>, StoreError> {
        Ok(self.claim(leased)?.iter().map(Option::is_some).collect())
    }

    /// [`Backend::claim`] for leases of `lease` (their visibility timeout). A backend
    /// shared by several nodes stores each lease's deadline, `lease` (at least the
    /// node's `node_timeout`, which its heartbeat renews) after the claim by the
    /// database's clock, after which another node may claim the job; a backend
    /// whose leases live in this process (the default: `claim`) leaves the timing to
    /// the broker, since such a lease dies with the process anyway.
    fn claim_for(
        &mut self,
        leased: &[Job],
        lease: std::time::Duration,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let _ = lease;
        self.claim(leased)
    }

    /// Whether leases live in this process only (SQLite: one node, guarded by the data
    /// directory's lock; the model). Then the process's Broker is the one owner of
    /// leases, [`Backend::claim`] only records a lease for readers, and a caller may
    /// hand a job out before its claim ran, provided it submits the claim before any
    /// later change of that job (the writer runs operations in order;
    /// [`Store::record_leases_later`] writes the records first in the next batch). A backend
    /// shared by several nodes answers `false`: its claim is the lease.
    fn leases_are_local(&self) -> bool;

    /// How far past its stored `lease_seq` the token of a job loaded at start-up
    /// must jump (at least 1): a job's next lease then gets a token above every
    /// token an earlier process handed out for it. Every lease that ended was
    /// written with its token; what the store cannot know is a lease live at a
    /// crash, and with leases local ([`Backend::leases_are_local`]) one such lease
    /// per earlier run whose process wrote nothing about the job (a crash loop).
    /// A backend with local leases therefore answers a count of its opens that
    /// grows by at least 1 at every open and is durable before the open returns,
    /// so the skip of this run exceeds the skip of any earlier run; a backend whose
    /// claim is written before its lease is handed out (PostgreSQL) and one that
    /// does not outlive its process answer 1, the default.
    fn token_skip(&self) -> Token {
        1
    }

    /// Ends attempts (ack, nack, lease expiry, a lost worker, an operator's cancel of
    /// a running job): each transition's
    /// `job` is the new record and its `entry` the attempt's history line, written
    /// once, now. Applies only if the stored job is ready or delayed with a token
    /// older than `job.lease_seq` and no other token's lease is recorded for it (the
    /// ending lease's own record, if any, is removed); answers per item whether it
    /// applied.
    fn complete(&mut self, ends: &[Transition]) -> Result<Vec<bool>, StoreError>;

    /// Moves dead jobs back to ready (`job` is the new record, `entry` the redrive
    /// event). Applies only to a stored job that is dead; per-item answer as
    /// [`Backend::complete`].
    fn redrive(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError>;

    /// Replaces a job's payload bytes; answers whether the job exists. Payloads are
    /// written once and never rewritten, except by [`Backend::redrive_with_payload`],
    /// inside its transaction.
    fn set_payload(&mut self, id: JobId, payload: &[u8]) -> Result<bool, StoreError>;

    /// Redrives one dead job with a new payload (an operator fixed the data): the
    /// payload is replaced and the job moved in the same transaction, and the
    /// redrive's history entry gains the old and new size and SHA-256
    /// ([`payload_change`]). Applies only to a stored dead job; answers whether it
    /// applied (if not, nothing was written).
    fn redrive_with_payload(
        &mut self,
        change: &Transition,
        payload: &[u8],
    ) -> Result<bool, StoreError> {
        let Some(old) = self.job(change.job.id)? else {
            return Ok(false);
        };
        let mut change = change.clone();
        let note = payload_change(&old.payload, payload);
        if let Some(entry) = &mut change.entry {
            entry.error = Some(match entry.error.take() {
                Some(detail) => format!("{detail}; {note}"),
                None => note,
            });
        }
        if self.redrive(std::slice::from_ref(&change))? != [true] {
            return Ok(false);
        }
        self.set_payload(change.job.id, payload)
    }

    /// Cancels jobs (`job` is the new, cancelled record, `entry` the event). Applies
    /// only to a stored job that is ready, delayed or dead and not leased; per-item
    /// answer as [`Backend::complete`].
    fn cancel(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError>;

    /// Deletes dead jobs with their payloads and history (DLQ purge). Answers per id
    /// whether it was deleted (unknown or not dead: `false`).
    fn purge(&mut self, ids: &[JobId]) -> Result<Vec<bool>, StoreError>;

    /// Every job in state delayed, ready, leased or dead, ordered by id (oldest first):
    /// what the broker rebuilds its in-memory state from at start-up.
    fn load_unfinished(&mut self) -> Result<Vec<Job>, StoreError>;

    /// [`Backend::load_unfinished`] handed to `each` in pieces of at most `chunk`
    /// jobs (at least 1), each piece in id order (the pieces themselves may come in
    /// any order: a backend may read parts of the key range at once), so that a
    /// caller streaming a large store never holds the whole list; stops early,
    /// without error, once `each` answers `false`. Errors as
    /// [`Backend::load_unfinished`]. The default reads the whole list first; a
    /// backend overrides it to read row by row.
    fn load_unfinished_chunks(
        &mut self,
        chunk: usize,
        each: &mut dyn FnMut(Vec<Job>) -> bool,
    ) -> Result<(), StoreError> {
        let mut jobs = self.load_unfinished()?.into_iter();
        loop {
            let part: Vec<Job> = jobs.by_ref().take(chunk.max(1)).collect();
            if part.is_empty() || !each(part) {
                return Ok(());
            }
        }
    }

    /// One job with its payload and history (oldest entry first), or `None`.
    fn job(&mut self, id: JobId) -> Result<Option<JobDetail>, StoreError>;

    /// Jobs matching every set field of `filter`, in `filter.order`, at most
    /// `filter.limit`. Page with `after` = the last id of the previous page. A live
    /// lease shows as state leased, but `filter.state` matches the stored state.
    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>, StoreError>;

    /// Deletes at most `limit` succeeded or cancelled jobs of `scope` whose
    /// `updated_at` is before `finished_before` (Unix ms), with their payloads and
    /// history, freeing their idempotency keys: succeeded jobs first, each state
    /// oldest first (`updated_at`, then id). Returns how many were deleted; fewer
    /// than `limit` means none is left.
    fn prune_finished(
        &mut self,
        scope: &PruneScope,
        finished_before: UnixMillis,
        limit: u32,
    ) -> Result<u64, StoreError>;

    /// The oldest `updated_at` (Unix ms) of a succeeded or cancelled job of `scope`,
    /// or `None`: how far behind pruning is.
    fn oldest_finished(&mut self, scope: &PruneScope) -> Result<Option<UnixMillis>, StoreError>;

    /// Gives free pages beyond `keep_free` back to the file system, at most
    /// `max_pages` per call (4 KiB each). Returns how many were released; engines
    /// that manage their own space answer 0.
    fn release_space(&mut self, keep_free: u32, max_pages: u32) -> Result<u32, StoreError>;

    /// Sets (`Some`) or deletes (`None`) one runtime override, e.g.
    /// `("tenant", "acme", "weight", Some("5"))`. Overrides survive restarts and win
    /// over the config file.
    fn set_override(
        &mut self,
        scope: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Every override, ordered by (scope, name, key).
    fn overrides(&mut self) -> Result<Vec<Override>, StoreError>;

    /// Every queue created through the SQS API, in name order.
    fn sqs_queues(&mut self) -> Result<Vec<SqsQueueRecord>, StoreError>;

    /// Creates or replaces (`Some`) or deletes (`None`) the SQS-created queue
    /// `name`; answers whether a row of that name was there before.
    fn set_sqs_queue(
        &mut self,
        name: &str,
        record: Option<&SqsQueueRecord>,
    ) -> Result<bool, StoreError>;

    /// Writes one small row (the time `now`, Unix ms) to learn whether the store
    /// accepts writes again after refusing one (disk full, I/O error).
    fn probe(&mut self, now: UnixMillis) -> Result<(), StoreError>;

    /// Jobs per (queue, state), a live lease counted as leased, ordered by queue then
    /// life-cycle order of the state; only non-zero counts. For tests and `qctl status`.
    fn counts(&mut self) -> Result<Vec<(String, State, u64)>, StoreError>;

    /// Jobs of `queue` per (tenant, state) for the states delayed, ready, leased and
    /// dead, ordered by tenant then life-cycle order; only non-zero counts. For the
    /// per-tenant view of `qctl top`.
    fn tenant_counts(&mut self, queue: &str) -> Result<Vec<(String, State, u64)>, StoreError>;

    /// Every stored schedule state ([`schedules`]), ordered by name.
    fn schedules(&mut self) -> Result<Vec<ScheduleRow>, StoreError>;

    /// Sets a schedule's next tick and spec if its stored next tick is still
    /// `advance.expect` (a missing row counts as no next tick and is created);
    /// answers whether it applied. Run in the same operation as the enqueue of the
    /// tick's job, so both commit or neither does.
    fn advance_schedule(&mut self, advance: &Advance) -> Result<bool, StoreError>;

    /// Records a schedule's run: its tick and job (the row is created if missing).
    fn record_schedule_run(
        &mut self,
        name: &str,
        tick: UnixMillis,
        job: JobId,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Pauses or resumes a schedule (the row is created if missing). A resume
    /// clears the next tick, so the firing node computes it from the time of the
    /// resume: ticks that came while paused are not caught up.
    fn set_schedule_paused(
        &mut self,
        name: &str,
        paused: bool,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// The operations of a store shared by several nodes ([`SharedStore`]), or `None` for
    /// a store only this process writes (SQLite, the model).
    fn shared(&mut self) -> Option<&mut dyn SharedStore> {
        None
    }
}

/// What only a store shared by several nodes (PostgreSQL) offers: how a node learns
/// what the others changed, keeps its leases alive, and how one node at a time (the
/// leader, fenced by an epoch) ends the leases of dead nodes. Times are the
/// database's clock, never a node's. The node's name and id are the backend's own
/// (given when it was opened); every lease it claims is stored with its name.
pub trait SharedStore {
    /// Jobs of `queues` that any node may claim (ready or delayed, no lease), at most
    /// `per_queue` of each queue, oldest `ready_at` first: how a node finds the jobs
    /// other nodes enqueued, redrove or gave back.
    fn claimable(&mut self, queues: &[String], per_queue: u32) -> Result<Vec<Job>, StoreError>;

    /// The oldest claimable jobs of each tenant with unfinished jobs in each of
    /// `queues`: `per_tenant` of each, fewer when more than `most / per_tenant`
    /// tenants share a queue (at least one each). What a node reads when
    /// [`Self::claimable`]'s window did not hold a queue whole, so that every
    /// backlogged tenant is seen by every node.
    fn tenant_heads(
        &mut self,
        queues: &[String],
        per_tenant: u32,
        most: u32,
    ) -> Result<Vec<Job>, StoreError>;

    /// Claims up to `next.limit` jobs of `next.queue` (of `next.tenant` only, if
    /// given) that no node holds and whose `ready_at` is at most `next.now`, oldest
    /// first, skipping rows another node is claiming at this moment (`FOR UPDATE
    /// SKIP LOCKED`): each gets the token `lease_seq + 1` and a deadline
    /// `next.lease` (at least `node_timeout`) from now by the database's clock.
    /// Answers each claimed job's leased record with its payload, in claim order.
    /// How a node that lost a claim to another node takes other work instead.
    fn claim_next(&mut self, next: &NewClaim<'_>) -> Result<Vec<(Job, Vec<u8>)>, StoreError> {
        self.claim_next_as(next, LeaseKind::InProcess)
    }

    /// [`Backend::claim_for`] within tenants' concurrency caps across every node:
    /// while any node's claim of a capped tenant is in flight, and once its
    /// leases are counted, at most `cap.max` jobs of that queue and tenant are leased
    /// at once cluster-wide. `caps` names each capped (queue, tenant) once (the
    /// first entry counts); the jobs of a tenant it does not name are claimed as
    /// [`Backend::claim_for`] does, at no extra cost (with no cap that applies, this
    /// is one statement, as `claim_for`). Answers per item in order: leased with its
    /// payload, [`Claim::Lost`] (not claimable, as `claim_for`'s `None`), or
    /// [`Claim::AtCap`] (claimable, but its tenant has no free slot at this moment,
    /// or another node is claiming for that tenant: the job is unchanged in the
    /// store). A tenant's picks are granted in the order given.
    fn claim_capped(
        &mut self,
        leased: &[Job],
        lease: Duration,
        caps: &[TenantCap],
    ) -> Result<Vec<Claim>, StoreError> {
        self.claim_capped_as(leased, lease, caps, LeaseKind::InProcess)
    }

    /// [`SharedStore::claim_capped`] for leases of `kind`: an
    /// [`LeaseKind::External`] lease also stores its own end (`lease` from now by
    /// the database's clock), which heartbeats on any node move and by which the
    /// lease expires (see [`SharedStore::extend_lease`], [`SharedStore::end_if_due`]).
    fn claim_capped_as(
        &mut self,
        leased: &[Job],
        lease: Duration,
        caps: &[TenantCap],
        kind: LeaseKind,
    ) -> Result<Vec<Claim>, StoreError>;

    /// [`SharedStore::claim_next`] for leases of `kind` (see
    /// [`SharedStore::claim_capped_as`]).
    fn claim_next_as(
        &mut self,
        next: &NewClaim<'_>,
        kind: LeaseKind,
    ) -> Result<Vec<(Job, Vec<u8>)>, StoreError>;

    /// A heartbeat of an external lease, on any node: the stored lease of job `id`
    /// with token `token` ends `extend` from now (database clock) instead, and
    /// outlives its node by as much. Answers the new end (Unix ms, database
    /// clock), or `None` when the job holds no lease with that token (it ended, or
    /// a newer lease holds it): nothing was changed then.
    fn extend_lease(
        &mut self,
        id: JobId,
        token: Token,
        extend: Duration,
    ) -> Result<Option<UnixMillis>, StoreError>;

    /// Ends external leases whose stored end passed, each as [`Backend::complete`]
    /// would, fenced by its token in the same statement: what the node holding a
    /// lease does when its own timer fires, since heartbeats may have reached
    /// other nodes. Answers per item: ended, still live (a heartbeat elsewhere
    /// moved its end: for how much longer) or gone (acked, nacked, cancelled or
    /// ended elsewhere, or a newer lease holds the job).
    fn end_if_due(&mut self, ends: &[Transition]) -> Result<Vec<LeaseCheck>, StoreError>;

    /// How many jobs of `queue` count against its `max_depth` across every node
    /// (ready, delayed and leased), once no other node is deciding an enqueue to
    /// it: takes the queue's transaction-scoped depth lock, so the count and the
    /// caller's insert are one step for every other node's enqueue. `None` when
    /// the lock stayed held by another node for too long to wait inside a group
    /// commit (the enqueue is refused as unavailable; retry).
    fn queue_depth(&mut self, queue: &str) -> Result<Option<u64>, StoreError>;

    /// How many jobs of `tenant` in `queue` count against the tenant's `max_depth`
    /// across every node (ready, delayed and leased), once no other node is
    /// deciding an enqueue of that tenant to that queue: [`Self::queue_depth`] for
    /// the tenant's own depth lock ([`DepthLock::Tenant`]).
    fn tenant_depth(&mut self, queue: &str, tenant: &str) -> Result<Option<u64>, StoreError>;

    /// The stored records of `ids` (unknown ids are absent), a lease showing as
    /// state leased with its token: what a node reads before an operator's change
    /// of jobs another node may have changed.
    fn reload(&mut self, ids: &[JobId]) -> Result<Vec<Job>, StoreError>;

    /// This node's heartbeat, every fifth of its `node_timeout`: records it alive,
    /// renews its stored leases to at least `node_timeout` from now, and takes or
    /// keeps the leader lease (`node_timeout` long). Answers the leader epoch when
    /// this node is the leader. Errors: [`StoreError::Replaced`] when this node's row
    /// names another node id (a node of the same name replaced it).
    fn beat(&mut self) -> Result<Option<u64>, StoreError>;

    /// The leases this node holds in the store, as leased records: what its Broker
    /// checks against its memory, so no lease of this node outlives its holder. None
    /// once another node took this node's name (those leases are the new holder's).
    fn own_leases(&mut self) -> Result<Vec<Job>, StoreError>;

    /// For the leader: at most `limit` leases held by other nodes that ended without
    /// their holder (their deadline passed, or their node's heartbeat is older than
    /// `node_timeout`), soonest deadline first, as leased records.
    fn expired_leases(&mut self, limit: u32) -> Result<Vec<Job>, StoreError>;

    /// Ends leases found by [`SharedStore::expired_leases`] as [`Backend::complete`]
    /// does, but only while this node is still the leader of `epoch` and each lease
    /// is still expired (a deposed leader, or a holder that came back, changes
    /// nothing); answers per item whether it applied.
    fn expire(&mut self, ends: &[Transition], epoch: u64) -> Result<Vec<bool>, StoreError>;

    /// Takes up to `want` tokens from the shared bucket of rate limiter `name`
    /// (created full at its first use, and full again when its settings changed, as
    /// a live retune of a local bucket does; it refills at `settings.per_second` by
    /// the database's clock and holds at most `settings.burst`, or the rate when 0);
    /// answers how many were taken (0 also when another node's transaction holds the
    /// bucket), or, while a pause stored by [`Self::pause_limiter`] is in force,
    /// none and what is left of the pause. Tokens are never given back.
    fn take_tokens(
        &mut self,
        name: &str,
        want: u32,
        settings: &crate::config::RateLimiterConfig,
    ) -> Result<Tokens, StoreError>;

    /// Pauses rate limiter `name` for every node: its bucket hands out no token
    /// until `for_at_least` from now by the database's clock (a later stored end
    /// stays), and every node is told (`NOTIFY`). Answers what is left of the
    /// pause in force. [`StoreError::Busy`] when other nodes' refills held the
    /// limiter's row through every try (the pause is then this node's only).
    fn pause_limiter(
        &mut self,
        name: &str,
        for_at_least: Duration,
        settings: &crate::config::RateLimiterConfig,
    ) -> Result<Duration, StoreError>;

    /// Every rate limiter whose stored pause is in force, with what is left of it
    /// by the database's clock.
    fn limiter_pauses(&mut self) -> Result<Vec<(String, Duration)>, StoreError>;

    /// Jobs per (queue, state) for the unfinished states, across the cluster, at
    /// `now` (Unix ms): a lease counts as leased, a delayed job whose `ready_at` has
    /// come as ready; only non-zero counts. The leader's cluster gauges.
    fn depths(&mut self, now: UnixMillis) -> Result<Vec<(String, State, u64)>, StoreError>;

    /// Jobs per (queue, state) held back by their parents (waiting, blocked)
    /// across the cluster; only non-zero counts. What `qctl queues` and `top`
    /// show for them, since no node's memory holds such jobs on a shared store.
    fn held_depths(&mut self) -> Result<Vec<(String, State, u64)>, StoreError>;

    /// Every node that joined, by name, with its last heartbeat and whether it is
    /// the leader.
    fn nodes(&mut self) -> Result<Vec<NodeInfo>, StoreError>;
}

/// What [`SharedStore::claim_next`] claims.
#[derive(Clone, Copy, Debug)]
pub struct NewClaim<'a> {
    /// The queue to claim from.
    pub queue: &'a str,
    /// Only this tenant's jobs, if given.
    pub tenant: Option<&'a str>,
    /// The most jobs to claim.
    pub limit: u32,
    /// The lessee, recorded with each lease.
    pub worker: &'a str,
    /// Now, Unix ms (the caller's clock): the lease's start, and the latest
    /// `ready_at` claimed.
    pub now: UnixMillis,
    /// The lease's length.
    pub lease: Duration,
    /// The tenant's `max_concurrency` in this queue, if it has one: the claim takes
    /// at most as many as leave the tenant's leases, across every node, at this cap
    /// (none while another node is claiming for the tenant). Only with `tenant`:
    /// a cap without one is refused ([`StoreError::Other`]).
    pub cap: Option<u32>,
}

/// One tenant's concurrency cap in one queue, for [`SharedStore::claim_capped`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantCap {
    /// The queue the cap applies in.
    pub queue: Arc<str>,
    /// The capped tenant.
    pub tenant: Arc<str>,
    /// The most of its jobs of this queue leased at once across every node (0
    /// holds them all).
    pub max: u32,
}

/// A `max_depth` lock an enqueue takes in a shared store until its transaction
/// ends ([`SharedStore::queue_depth`], [`SharedStore::tenant_depth`]): the
/// writer takes every such lock of a batch up front ([`Engine::lock_depths`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DepthLock {
    /// A queue's `max_depth`.
    Queue(String),
    /// A tenant's `max_depth` in a queue: (queue, tenant).
    Tenant(String, String),
}

/// What [`SharedStore::take_tokens`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// Tokens taken (0 when the bucket is empty or another node holds it).
    Taken(u32),
    /// None: the limiter is paused for every node, for this much longer.
    Paused(Duration),
}

/// Whose lease a claim takes on a shared store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseKind {
    /// A worker of this node's pool: the lease lives and dies with its node.
    #[default]
    InProcess,
    /// An external worker over HTTP, which may report to any node: the lease has
    /// its own stored end.
    External,
}

/// What [`SharedStore::end_if_due`] found of one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseCheck {
    /// Its end passed: the transition was written.
    Ended,
    /// A heartbeat (on any node) moved its end: it has this much left.
    Live(Duration),
    /// The store holds no lease with that token any more.
    Gone,
}

/// The answer of [`SharedStore::claim_capped`] for one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The lease is stored; the job's payload.
    Leased(Vec<u8>),
    /// Not claimable: unknown, finished, leased, or changed by another node.
    Lost,
    /// Claimable, but its tenant is at its cap across the cluster (or another
    /// node is claiming for that tenant at this moment): nothing was changed.
    AtCap,
}

impl From<Option<Vec<u8>>> for Claim {
    /// A [`Backend::claim`] answer: a payload is a lease, `None` a lost claim.
    fn from(payload: Option<Vec<u8>>) -> Claim {
        payload.map_or(Claim::Lost, Claim::Leased)
    }
}

/// A node of a cluster sharing one database, as `qctl status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    /// Its `node_name`.
    pub name: String,
    /// When it (last) joined, Unix ms by the database's clock.
    pub started_at: UnixMillis,
    /// Milliseconds since its last heartbeat, by the database's clock.
    pub heartbeat_age_ms: u64,
    /// Whether it holds the leader lease now.
    pub leader: bool,
    /// The leader lease's epoch, when it is the leader (raised at each change of leader).
    pub epoch: Option<u64>,
}

/// How a payload changed, for history: `payload replaced: 12 bytes (sha256 9f86…)
/// -> 10 bytes (sha256 2c26…)`, with the full hex digests.
pub fn payload_change(old: &[u8], new: &[u8]) -> String {
    format!(
        "payload replaced: {} -> {}",
        payload_summary(old),
        payload_summary(new)
    )
}

/// Size and SHA-256 of a payload: `12 bytes (sha256 9f86…)`, the digest in full hex.
pub fn payload_summary(bytes: &[u8]) -> String {
    let digest: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{} bytes (sha256 {digest})", bytes.len())
}

/// A new job and its payload, as [`Backend::enqueue`] takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRecord {
    /// The job's record (state ready or delayed, no lease).
    pub job: Job,
    /// Its payload bytes.
    pub payload: Vec<u8>,
}

impl NewRecord {
    /// Each of `jobs` with a copy of `payload`, in order: one batch for
    /// [`Backend::enqueue`] (tests and benches seed stores with it).
    pub fn batch(jobs: impl IntoIterator<Item = Job>, payload: &[u8]) -> Vec<NewRecord> {
        jobs.into_iter()
            .map(|job| NewRecord {
                job,
                payload: payload.to_vec(),
            })
            .collect()
    }
}

/// Transaction control of a storage engine: what the writer loop needs beyond
/// [`Backend`]. Savepoints do not nest across operations: the writer opens one, runs
/// one operation, then releases or rolls it back.
pub(crate) trait Engine: Backend {
    /// Opens the batch's transaction (`BEGIN IMMEDIATE`).
    fn begin(&mut self) -> Result<(), StoreError>;
    /// Opens the savepoint of one operation.
    fn savepoint(&mut self) -> Result<(), StoreError>;
    /// Keeps the operation's writes (`RELEASE`).
    fn release(&mut self) -> Result<(), StoreError>;
    /// Undoes the operation's writes (`ROLLBACK TO` + `RELEASE`).
    fn rollback_to(&mut self) -> Result<(), StoreError>;
    /// Commits the batch (one fsync).
    fn commit(&mut self) -> Result<(), StoreError>;
    /// Undoes the whole batch after a failed commit or savepoint; never fails loudly.
    fn rollback(&mut self);
    /// Called once when the writer stops: checkpoint the WAL and close.
    fn shutdown(&mut self);
    /// Takes, right after [`Engine::begin`], the `max_depth` locks (distinct)
    /// that operations of the batch will ask for ([`SharedStore::queue_depth`],
    /// [`SharedStore::tenant_depth`]): all at once, in one order every node uses,
    /// before the batch holds any other lock, so two nodes' batches wait for each
    /// other at most briefly and never in a cycle. A lock not taken here is left to
    /// the operation, which then tries it. Engines without such locks do nothing.
    fn lock_depths(&mut self, _locks: &[&DepthLock]) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The outcome of one item of [`Backend::enqueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// The job was stored.
    New,
    /// A stored job of the same queue already has this idempotency key; nothing was
    /// written. `same_payload` says whether its payload is byte-identical, so the API
    /// can answer "already accepted" or "key reused with a different payload".
    Duplicate {
        /// The stored job's id.
        id: JobId,
        /// Whether the stored payload equals the one just offered.
        same_payload: bool,
    },
}

/// What [`Backend::release_edges`] did: the child's new record if it changed
/// state, and the parents whose broken edges now count as met.
pub type Released = (Option<Job>, Vec<JobId>);

/// How many unfinished jobs one job holds back ([`Backend::blocked_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockedCounts {
    /// Its direct children whose edge from it is not met.
    pub direct: u64,
    /// Those and every unfinished job below them, each once.
    pub transitive: u64,
}

/// The edges of one job ([`Backend::edges`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edges {
    /// Its parents, with the edge's state.
    pub parents: Vec<(JobId, crate::deps::Edge)>,
    /// Its direct children, with the edge's state.
    pub children: Vec<(JobId, crate::deps::Edge)>,
}

/// One end of a job's edge with the record of the job there (`None` once purged
/// or pruned): the job's id, the edge's state, the record.
pub type EdgeRecord = (JobId, crate::deps::Edge, Option<Job>);

/// A job's edges with the records at their far ends ([`edge_records`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EdgeRecords {
    /// Its parents, in id order.
    pub parents: Vec<EdgeRecord>,
    /// Its first direct dependents, in id order.
    pub dependents: Vec<EdgeRecord>,
    /// How many direct dependents it has in all.
    pub dependents_total: u64,
}

/// The edges of `id` with the records of its parents and of its first
/// `max_dependents` direct dependents: what `qctl jobs show`, the console's job
/// page and `GET /v1/jobs/{id}` list. Three reads: the edges, then each side's
/// records.
pub fn edge_records(
    b: &mut dyn Backend,
    id: JobId,
    max_dependents: usize,
) -> Result<EdgeRecords, StoreError> {
    let edges = b.edges(id)?;
    let dependents_total = edges.children.len() as u64;
    let mut records = |list: &[(JobId, crate::deps::Edge)]| -> Result<Vec<EdgeRecord>, StoreError> {
        let ids: Vec<JobId> = list.iter().map(|(i, _)| *i).collect();
        let jobs = if ids.is_empty() {
            Vec::new()
        } else {
            b.job_records(&ids)?
        };
        Ok(list
            .iter()
            .zip(jobs)
            .map(|((i, e), j)| (*i, *e, j))
            .collect())
    };
    let parents = records(&edges.parents)?;
    let shown = edges.children.len().min(max_dependents);
    let dependents = records(&edges.children[..shown])?;
    Ok(EdgeRecords {
        parents,
        dependents,
        dependents_total,
    })
}

/// Whether a local store (SQLite) of this process ever held a dependency edge:
/// set when one opens with edges stored or stores one (before that commit, so
/// before any lease of the child), never cleared. Until then no job has parents
/// and a lease skips the read of them.
static LOCAL_EDGES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks that a local store holds a dependency edge ([`LOCAL_EDGES`]).
pub(crate) fn note_local_edges() {
    LOCAL_EDGES.store(true, Ordering::SeqCst);
}

/// One parent of a job, as [`Backend::parents_of`] answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentView {
    /// The parent's id.
    pub id: JobId,
    /// Its state now (final, unless an operator released a broken edge and the
    /// parent was redriven since).
    pub state: State,
    /// What its successful attempt handed back, if anything.
    pub result: Option<Vec<u8>>,
    /// Its last attempt's error, if that attempt failed.
    pub last_error: Option<String>,
}

/// A job with everything the store holds about it: what `qctl jobs show` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobDetail {
    /// The job record.
    pub job: Job,
    /// Its payload bytes.
    pub payload: Vec<u8>,
    /// What its successful attempt handed back (an ack's result), if anything.
    pub result: Option<Vec<u8>>,
    /// Its attempts and operator events, oldest first, as kept by the history cap.
    pub history: Vec<HistoryEntry>,
    /// How many entries the history cap deleted (0 when none).
    pub history_elided: u64,
    /// Where they were: the number of entries of `history` older than them.
    pub history_elided_at: usize,
}

/// Which jobs [`Backend::list_jobs`] returns. `None` fields match everything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this state.
    pub state: Option<State>,
    /// Only jobs whose `last_error` contains this text (ASCII case-insensitive, like
    /// SQLite's `lower()`); jobs without an error never match.
    pub error_contains: Option<String>,
    /// Only jobs with `updated_at >= updated_since` (Unix ms).
    pub updated_since: Option<UnixMillis>,
    /// Only jobs strictly after this one in `order` (the cursor of the next page).
    /// For [`JobOrder::RecentlyUpdated`] the cursor job's `(updated_at, id)` is the
    /// bound, so a cursor naming no stored job ends the listing (an empty page).
    pub after: Option<JobId>,
    /// The order of the answer (and the direction `after` pages in).
    pub order: JobOrder,
    /// At most this many jobs (0 returns none).
    pub limit: u32,
    /// The wall-clock time (Unix ms) a `ready` or `delayed` state filter is read at:
    /// a delayed job whose `ready_at` is at or before it matches `ready`, not
    /// `delayed`, as every view of a job shows it.
    pub now: UnixMillis,
}

/// The order of [`Backend::list_jobs`]. Ids are UUIDv7, so id order is creation order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JobOrder {
    /// Oldest first (id ascending): stable paging over everything.
    #[default]
    OldestFirst,
    /// Newest first (id descending): what `qctl jobs list` shows.
    NewestFirst,
    /// Most recently changed first (`updated_at` descending, then id descending): for
    /// dead jobs, `updated_at` is when they died, so this is "most recently dead
    /// first" for `qctl dlq list`. Served, for dead and ended jobs, by the SQLite
    /// index of those jobs by `(queue, state, updated_at)`.
    RecentlyUpdated,
}

impl JobFilter {
    /// The page size of [`JobFilter::default`].
    pub const DEFAULT_LIMIT: u32 = 100;
}

impl Default for JobFilter {
    /// Matches every job; pages of [`JobFilter::DEFAULT_LIMIT`]; states read at the
    /// current wall clock.
    fn default() -> Self {
        JobFilter {
            queue: None,
            tenant: None,
            state: None,
            error_contains: None,
            updated_since: None,
            after: None,
            order: JobOrder::OldestFirst,
            limit: Self::DEFAULT_LIMIT,
            now: crate::clock::wall_ms(),
        }
    }
}

/// One runtime override (set by `qctl limits set`, `qctl workers set`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// What kind of thing it overrides (`"tenant"`, `"queue"`).
    pub scope: String,
    /// Which one (`"acme"`, `"email"`).
    pub name: String,
    /// Which setting (`"weight"`, `"max_concurrency"`, `"paused"`).
    pub key: String,
    /// The value, as text; the owner of the setting parses it.
    pub value: String,
}

/// A queue created through the SQS API (`api/sqs/created.rs` owns its meaning;
/// the store keeps the text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqsQueueRecord {
    /// The queue's name.
    pub name: String,
    /// Its SQS attributes as a JSON object of strings (`{"VisibilityTimeout": "30"}`).
    pub attributes: String,
    /// Its tags as a JSON object of strings.
    pub tags: String,
    /// When it was created (Unix ms).
    pub created_at: UnixMillis,
    /// When its attributes last changed (Unix ms).
    pub modified_at: UnixMillis,
}

/// Why a store operation failed. Messages name the database path where there is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The disk (or SQLite's `max_page_count`) is full (`SQLITE_FULL`). The API maps it
    /// to HTTP 507; earlier data is intact and writes succeed again once space is freed.
    #[error("store full: {0}")]
    Full(String),
    /// The file is not a qd database or is malformed (`SQLITE_CORRUPT`,
    /// `SQLITE_NOTADB`). The daemon refuses to start rather than overwrite it.
    #[error("store corrupt: {0}")]
    Corrupt(String),
    /// The database or its directory cannot be opened or written (`SQLITE_CANTOPEN`,
    /// `SQLITE_READONLY`, `SQLITE_PERM`, `SQLITE_AUTH`): missing directory, read-only
    /// file system, wrong owner or mode.
    #[error("store not accessible: {0}")]
    Permission(String),
    /// The database was written by a newer qd (schema version `found`; this build knows
    /// up to `supported`). Upgrade qd or restore a backup; never downgrade in place.
    #[error("store schema version {found} is newer than this qd supports ({supported})")]
    TooNew {
        /// The database's schema version.
        found: u32,
        /// The newest version this build can read.
        supported: u32,
    },
    /// [`Backend::enqueue_all`] refused its batch: the idempotency key of item
    /// `index` (0-based) is held by job `id` with a different payload. Nothing of the
    /// batch was written; the store itself is fine.
    #[error("item {index}: its idempotency key is held by job {id} with a different payload")]
    KeyConflict {
        /// The item's position in the batch.
        index: usize,
        /// The job holding the key.
        id: JobId,
    },
    /// The writer thread is gone (closed or died); the operation did not run, or, if it
    /// was already queued when the writer died, its outcome is unknown.
    #[error("store closed")]
    Closed,
    /// An enqueue would take `queue` past its `max_depth` counted across every
    /// node of a shared store ([`SharedStore::queue_depth`]): nothing was written;
    /// the store itself is fine.
    #[error("queue {queue:?} is full ({depth} jobs, max_depth {max})")]
    QueueFull {
        /// The queue.
        queue: String,
        /// Its depth across the cluster.
        depth: u64,
        /// Its limit.
        max: u64,
    },
    /// An enqueue would take `tenant`'s jobs in `queue` past the tenant's
    /// `max_depth` counted across every node of a shared store
    /// ([`SharedStore::tenant_depth`]): nothing was written; the store itself is
    /// fine.
    #[error("tenant {tenant:?} is full in queue {queue:?} ({depth} jobs, max_depth {max})")]
    TenantFull {
        /// The queue.
        queue: String,
        /// The tenant.
        tenant: String,
        /// The tenant's depth in the queue across the cluster.
        depth: u64,
        /// Its limit.
        max: u64,
    },
    /// Another node held a queue's depth lock longer than an enqueue may wait
    /// inside a group commit ([`SharedStore::queue_depth`]): nothing was written;
    /// retry.
    #[error("busy: {0}")]
    Busy(String),
    /// This node's row in a shared store names another node id: a node of the same
    /// name took the name over after this one was silent longer than `node_timeout`
    /// ([`SharedStore::beat`]). Not transient: this process must stop, since the
    /// leases stored under its name are the new node's.
    #[error("node replaced: {0}")]
    Replaced(String),
    /// An enqueue's `after` (`deps.rs`) was refused: item `index` (0-based) names
    /// an unknown parent, too many or the same one twice. Nothing was written; the
    /// store itself is fine.
    #[error("item {index}: {error}")]
    After {
        /// The item's position in the batch.
        index: usize,
        /// What is wrong with its `after`.
        error: crate::deps::AfterError,
    },
    /// Anything else: a constraint violation, an unknown job, an I/O error, a
    /// panicking operation.
    #[error("store error: {0}")]
    Other(String),
}

/// WriterState and size of a store, for metrics and `qctl status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreStats {
    /// Transactions committed.
    pub commits: u64,
    /// Transactions attempted (`batches - commits` failed and were rolled back).
    pub batches: u64,
    /// Operations run (successful or not). `ops / batches` is the mean batch size.
    pub ops: u64,
    /// The database file, if the store is on disk.
    pub path: Option<PathBuf>,
    /// Bytes on disk: the database file plus its WAL (0 in memory).
    pub size_bytes: u64,
}

/// Open-time settings of the SQLite store. `Default` is what the daemon uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Caps the database at this many pages (`PRAGMA max_page_count`, 4 KiB pages), so
    /// tests can fill the "disk". `None` leaves SQLite's default (effectively no cap).
    pub max_page_count: Option<u32>,
    /// The history cap applied on every append.
    pub history: HistoryLimits,
}

/// A cheap-to-clone handle to the writer thread. The thread stops when [`Store::close`]
/// is called or the last handle is dropped (after finishing queued work).
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

/// What the handles and the writer thread share: counters, and the leases handed
/// out whose records wait for the writer's next batch ([`Store::record_leases_later`]).
#[derive(Default)]
pub(crate) struct WriterState {
    commits: AtomicU64,
    batches: AtomicU64,
    ops: AtomicU64,
    unrecorded: Mutex<Vec<Job>>,
}

impl WriterState {
    /// The lease records waiting for the writer's next batch, locked.
    fn unrecorded(&self) -> std::sync::MutexGuard<'_, Vec<Job>> {
        self.unrecorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

struct Shared {
    /// `None` once closed. Senders are `Sync`; the lock only guards `close`.
    sender: RwLock<Option<Queue>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    counters: Arc<WriterState>,
    path: Option<PathBuf>,
    /// [`Backend::leases_are_local`] of the engine, asked once at start.
    leases_are_local: bool,
    /// [`Backend::token_skip`] of the engine, asked once at start.
    token_skip: Token,
}

impl Store {
    /// Opens (creating if absent) the SQLite database at `path` (conventionally
    /// `<data_dir>/qd.db`) and starts its writer thread. The directory must exist.
    ///
    /// Errors, each naming the path: [`StoreError::Permission`] (missing or unwritable
    /// directory or file), [`StoreError::Corrupt`] (not a database),
    /// [`StoreError::TooNew`] (written by a newer qd), [`StoreError::Full`].
    pub fn open_sqlite(path: &Path) -> Result<Store, StoreError> {
        Self::open_sqlite_with(path, &SqliteOptions::default())
    }

    /// [`Store::open_sqlite`] with explicit [`SqliteOptions`].
    pub fn open_sqlite_with(path: &Path, options: &SqliteOptions) -> Result<Store, StoreError> {
        let backend = sqlite::SqliteBackend::open(path, options)?;
        Self::start(backend, Some(path.to_path_buf()))
    }

    /// Connects to the PostgreSQL database `config` names ([`postgres::PgBackend`]),
    /// migrates its schema and starts the writer thread, which owns the connection.
    /// Blocks the caller until connected (at most about 20 s when the database does
    /// not answer); call it at start-up.
    ///
    /// Errors name the database, never its password: [`StoreError::Permission`]
    /// (authentication or privileges refused), [`StoreError::TooNew`] (schema written
    /// by a newer qd), [`StoreError::Other`] (unreachable, timed out, anything else).
    pub fn open_postgres(
        config: &tokio_postgres::Config,
        options: &postgres::PgOptions,
    ) -> Result<Store, StoreError> {
        let counters = Arc::new(WriterState::default());
        let (config, options) = (config.clone(), options.clone());
        let (sender, writer) = writer::spawn_with(
            move || postgres::PgBackend::open(&config, &options),
            Arc::clone(&counters),
        )?;
        Ok(Self::from_parts(
            Some(sender),
            Some(writer),
            counters,
            None,
            (false, 1),
        ))
    }

    /// A store kept in memory ([`memory::MemoryBackend`]) behind the same writer thread:
    /// same semantics, no durability. If the OS refuses a thread, the error is logged
    /// and every operation is answered [`StoreError::Closed`].
    pub fn open_memory() -> Store {
        Self::open_memory_with(HistoryLimits::default())
    }

    /// [`Store::open_memory`] with an explicit history cap.
    pub fn open_memory_with(history: HistoryLimits) -> Store {
        Self::start(memory::MemoryBackend::new(history), None).unwrap_or_else(|err| {
            tracing::error!(%err, "In-memory store has no writer thread; every operation fails.");
            Self::from_parts(None, None, Arc::default(), None, (false, 1))
        })
    }

    fn start<E: Engine + 'static>(engine: E, path: Option<PathBuf>) -> Result<Store, StoreError> {
        let counters = Arc::new(WriterState::default());
        let leases = (engine.leases_are_local(), engine.token_skip());
        let (sender, writer) = writer::spawn(engine, Arc::clone(&counters))?;
        Ok(Self::from_parts(
            Some(sender),
            Some(writer),
            counters,
            path,
            leases,
        ))
    }

    fn from_parts(
        sender: Option<Queue>,
        writer: Option<JoinHandle<()>>,
        counters: Arc<WriterState>,
        path: Option<PathBuf>,
        (leases_are_local, token_skip): (bool, Token),
    ) -> Store {
        Store {
            shared: Arc::new(Shared {
                sender: RwLock::new(sender),
                writer: Mutex::new(writer),
                counters,
                path,
                leases_are_local,
                token_skip,
            }),
        }
    }

    /// [`Backend::leases_are_local`] of the engine behind this store (`false` for a
    /// store without a writer thread).
    pub fn leases_are_local(&self) -> bool {
        self.shared.leases_are_local
    }

    /// Whether a job of this store may have parents, so an attempt's parents are
    /// worth a store read ([`Backend::parents_of`], a round trip through the
    /// writer): always on a shared store; on a local one (SQLite, memory) once a
    /// store of this process held an edge.
    pub fn may_hold_parents(&self) -> bool {
        !self.leases_are_local() || LOCAL_EDGES.load(Ordering::SeqCst)
    }

    /// [`Backend::token_skip`] of the engine behind this store (1 for a store
    /// without a writer thread).
    pub fn token_skip(&self) -> Token {
        self.shared.token_skip
    }

    /// Records leases of a backend whose leases are local ([`Backend::leases_are_local`])
    /// without a write of their own: the writer's next batch writes them
    /// ([`Backend::record_leases`]) before any op in it, so any op submitted after this
    /// call (the lease's ack, a reader's query) finds them. A record the store refuses
    /// is logged; the lease stands (memory owns it).
    pub fn record_leases_later(&self, leased: Vec<Job>) {
        self.shared.counters.unrecorded().extend(leased);
    }

    /// Queues `op` for the writer thread and returns at once (never blocks on disk).
    ///
    /// `op` runs inside the next batch's transaction, in its own savepoint; `done` runs
    /// on the writer thread **after** the batch committed, with `op`'s result, or with
    /// the commit's error if the commit failed (then `op`'s writes were rolled back). A
    /// panic in `op` is answered as [`StoreError::Other`]. When an op hits a full disk,
    /// SQLite abandons the whole transaction: every op of that batch is answered
    /// [`StoreError::Full`] and nothing of it is kept. If the store is closed,
    /// `done(Err(Closed))` runs at once on the calling thread. `done` must be quick (it
    /// delays the rest of the batch's answers): send a message, nothing more.
    pub fn submit<R, Op, Done>(&self, op: Op, done: Done)
    where
        R: Send + 'static,
        Op: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
        Done: FnOnce(Result<R, StoreError>) + Send + 'static,
    {
        self.submit_locking_depth(Vec::new(), op, done);
    }

    /// [`Store::submit`] for an operation that takes the `max_depth` locks
    /// `locks` ([`SharedStore::queue_depth`], [`SharedStore::tenant_depth`]): the
    /// writer takes them with the batch's other depth locks before any operation
    /// runs ([`Engine::lock_depths`]).
    pub fn submit_locking_depth<R, Op, Done>(&self, locks: Vec<DepthLock>, op: Op, done: Done)
    where
        R: Send + 'static,
        Op: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
        Done: FnOnce(Result<R, StoreError>) + Send + 'static,
    {
        let task: Box<dyn Task> = Box::new(OpTask::new(op, done).locking_depth(locks));
        let rejected = {
            let sender = self
                .shared
                .sender
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            match sender.as_ref() {
                Some(sender) => sender.send(task).err().map(|err| err.0),
                None => Some(task),
            }
        };
        // Dropping an unrun task answers `Closed`, outside the lock.
        drop(rejected);
    }

    /// [`Store::submit`] for async callers: resolves after the commit with `op`'s result.
    pub async fn run<R, Op>(&self, op: Op) -> Result<R, StoreError>
    where
        R: Send + 'static,
        Op: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(op, move |result| {
            // The receiver may have been dropped (caller cancelled); nothing to do then.
            let _ = tx.send(result);
        });
        rx.await.unwrap_or(Err(StoreError::Closed))
    }

    /// WriterState (commits, batches, ops) and the size on disk (database + WAL, bytes).
    pub fn stats(&self) -> StoreStats {
        let counters = &self.shared.counters;
        let path = self.shared.path.clone();
        let size_bytes = path.as_deref().map_or(0, sqlite::size_on_disk);
        StoreStats {
            commits: counters.commits.load(Ordering::Relaxed),
            batches: counters.batches.load(Ordering::Relaxed),
            ops: counters.ops.load(Ordering::Relaxed),
            path,
            size_bytes,
        }
    }

    /// Stops intake, lets the writer finish every queued operation (and answer it),
    /// checkpoints the WAL and waits for the thread to end. Later submits are answered
    /// [`StoreError::Closed`]. Blocks the caller until then (call it at shutdown, from
    /// a blocking context); idempotent. Called from a completion on the writer thread,
    /// it stops intake without waiting.
    pub fn close(&self) {
        self.shared.close();
    }
}

impl Shared {
    fn close(&self) {
        let sender = self
            .sender
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(sender);
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let on_writer = writer
            .as_ref()
            .is_some_and(|handle| handle.thread().id() == thread::current().id());
        if on_writer {
            return;
        }
        if let Some(handle) = writer.take()
            && handle.join().is_err()
        {
            tracing::error!(
                "Store writer thread panicked; queued operations were answered Closed."
            );
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.close();
    }
}

/// Sorts per-(queue, state) counts by queue, then life-cycle order of the state: the
/// one order both backends report.
pub(crate) fn sort_counts(counts: &mut [(String, State, u64)]) {
    let rank = |state: State| State::ALL.iter().position(|s| *s == state);
    counts.sort_by(|a, b| (&a.0, rank(a.1)).cmp(&(&b.0, rank(b.1))));
}

#[cfg(test)]
mod tests;
