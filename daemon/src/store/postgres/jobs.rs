//! The PostgreSQL statements of jobs' life outside claims: enqueue (with the
//! announcement of new jobs to idle nodes), the fenced transitions (complete,
//! redrive, cancel; one `UPDATE ... FROM unnest` per batch), purge and prune,
//! the reads (a job, listings, counts) and the small tables (overrides, SQS
//! queues, the write probe). The states each intent applies to come from
//! [`crate::store::contract`]. Takes no messages: the writer thread calls it
//! through [`PgBackend`]'s [`crate::store::Backend`] implementation.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{
    DIALECT, EFFECTIVE_STATE, JOB_COLUMNS, NOTIFY_CHANNEL, PgBackend, counter, has_duplicates,
    job_from_row, scope_clause, sqs_queues, stored_seq, uuids,
};
use crate::job::{HistoryEntry, Job, JobId, State, Transition, UnixMillis};
use crate::store::contract::{self, Intent};
use crate::store::sql_filter::{self, Arg};
use crate::store::{
    Inserted, JobDetail, JobFilter, NewRecord, Override, PruneScope, SqsQueueRecord, StoreError,
    history,
};

/// How often at most one queue's new jobs are announced to idle nodes
/// (`NOTIFY qd_jobs`); jobs enqueued in between are found by the notified nodes'
/// next look or by polling.
const NOTIFY_EVERY: Duration = Duration::from_millis(25);

impl PgBackend {
    /// Announces new jobs of `queues` to idle nodes (`NOTIFY`, sent at commit), each
    /// queue at most once per [`NOTIFY_EVERY`].
    pub(super) fn notify<'q>(
        &mut self,
        queues: impl IntoIterator<Item = &'q str>,
    ) -> Result<(), StoreError> {
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

    /// Writes each transition whose stored row satisfies `condition` (SQL over `j` =
    /// the row and `t` = the transition, whose `t.lease_seq` is the token), clears
    /// its lease, and appends its history line; answers per item whether it applied.
    /// The stored `lease_seq` only grows: a change planned on a stale copy (a redrive
    /// from a node that has not seen a later lease) keeps the higher stored one.
    pub(super) fn change(
        &mut self,
        changes: &[Transition],
        condition: &str,
    ) -> Result<Vec<bool>, StoreError> {
        self.change_result(changes, condition, "COALESCE(t.result, j.result)")
    }

    /// [`Self::change`] setting the stored result to `result` (SQL over `j` and `t`,
    /// whose `t.result` is the transition's own): kept unless the transition brings
    /// one, or cleared by a redrive.
    pub(super) fn change_result(
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
    pub(super) fn append_history(
        &mut self,
        entries: &[(Uuid, HistoryEntry)],
    ) -> Result<(), StoreError> {
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
    pub(super) fn delete(
        &mut self,
        ids: &[JobId],
        states: &[State],
    ) -> Result<Vec<bool>, StoreError> {
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
}

pub(super) fn enqueue(
    pg: &mut PgBackend,
    batch: &[NewRecord],
) -> Result<Vec<Inserted>, StoreError> {
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
    let rows = pg.block(async |c| {
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
    let holders = pg.block(async |c| {
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
        pg.notify(queues.iter().copied())?;
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

pub(super) fn complete(pg: &mut PgBackend, ends: &[Transition]) -> Result<Vec<bool>, StoreError> {
    let condition = format!(
        "j.lease_token = t.lease_seq AND {}",
        Intent::Complete.sql("j.state")
    );
    pg.change(ends, &condition)
}

pub(super) fn redrive(pg: &mut PgBackend, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
    let condition = format!(
        "{} AND j.lease_token IS NULL",
        Intent::Redrive.sql("j.state")
    );
    let applied = pg.change_result(changes, &condition, "NULL")?;
    pg.notify(changes.iter().map(|t| &*t.job.queue))?;
    Ok(applied)
}

pub(super) fn set_payload(
    pg: &mut PgBackend,
    id: JobId,
    payload: &[u8],
) -> Result<bool, StoreError> {
    let changed = pg.block(async |c| {
        let stmt = c
            .prepare_cached("UPDATE qd_payloads SET body = $2 WHERE job_id = $1")
            .await?;
        c.execute(&stmt, &[&id.0, &payload]).await
    })?;
    Ok(changed == 1)
}

pub(super) fn cancel(pg: &mut PgBackend, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
    let condition = format!(
        "{} AND j.lease_token IS NULL",
        Intent::Cancel.sql("j.state")
    );
    pg.change(changes, &condition)
}

pub(super) fn purge(pg: &mut PgBackend, ids: &[JobId]) -> Result<Vec<bool>, StoreError> {
    pg.delete(ids, Intent::Purge.states())
}

pub(super) fn load_unfinished(pg: &mut PgBackend) -> Result<Vec<Job>, StoreError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM qd_jobs j \
         WHERE j.state IN ('delayed', 'ready', 'dead') \
           AND (j.lease_token IS NULL OR j.lease_node = $1) ORDER BY j.id"
    );
    let node = pg.options.node.clone();
    pg.query_jobs(&sql, &[&node])
}

pub(super) fn job(pg: &mut PgBackend, id: JobId) -> Result<Option<JobDetail>, StoreError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS}, p.body, j.result FROM qd_jobs j \
         JOIN qd_payloads p ON p.job_id = j.id WHERE j.id = $1"
    );
    let (found, lines) = pg.block(async |c| {
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
    let job = job_from_row(&found, &pg.target)?;
    let mut seqs = Vec::with_capacity(lines.len());
    let mut entries = Vec::with_capacity(lines.len());
    for r in &lines {
        seqs.push(u64::try_from(r.get::<_, i64>(0)).unwrap_or(0));
        let outcome: String = r.get(2);
        entries.push(HistoryEntry {
            attempt: counter(r.get(1), "attempt", &pg.target)?,
            outcome: outcome.parse().map_err(|e: String| pg.corrupt(e))?,
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

pub(super) fn list_jobs(pg: &mut PgBackend, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
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
    pg.query_jobs(&sql, &refs)
}

pub(super) fn prune_finished(
    pg: &mut PgBackend,
    scope: &PruneScope,
    finished_before: UnixMillis,
    limit: u32,
) -> Result<u64, StoreError> {
    let (clause, name) = scope_clause(scope, 4);
    let holding = contract::none_of("c.state", Intent::Prune.states());
    let sql = format!(
        "WITH doomed AS (SELECT id FROM qd_jobs WHERE state = $1 AND updated_at < $2 \
           AND {clause} \
           AND NOT EXISTS (SELECT 1 FROM qd_job_edges e JOIN qd_jobs c ON c.id = e.child \
             WHERE e.parent = qd_jobs.id AND {holding}) \
           ORDER BY updated_at, id LIMIT $3), \
         gone AS (DELETE FROM qd_jobs j USING doomed WHERE j.id = doomed.id \
           AND j.state = $1 RETURNING j.id), \
         p AS (DELETE FROM qd_payloads WHERE job_id IN (SELECT id FROM gone)), \
         h AS (DELETE FROM qd_history WHERE job_id IN (SELECT id FROM gone)), \
         e AS (DELETE FROM qd_job_edges WHERE child IN (SELECT id FROM gone)) \
         SELECT count(*) FROM gone"
    );
    let mut deleted = 0u64;
    for state in Intent::Prune.states() {
        let left = u64::from(limit) - deleted;
        if left == 0 {
            break;
        }
        let left = i64::try_from(left).unwrap_or(i64::MAX);
        let state = state.as_str();
        let name = name.as_ref();
        let count: i64 = pg.block(async |c| {
            let stmt = c.prepare_cached(&sql).await?;
            Ok(c.query_one(&stmt, &[&state, &finished_before, &left, name])
                .await?
                .get(0))
        })?;
        deleted += u64::try_from(count).unwrap_or(0);
    }
    Ok(deleted)
}

pub(super) fn oldest_finished(
    pg: &mut PgBackend,
    scope: &PruneScope,
) -> Result<Option<UnixMillis>, StoreError> {
    let (clause, name) = scope_clause(scope, 1);
    let sql = format!(
        "SELECT MIN(updated_at) FROM qd_jobs \
         WHERE {} AND {clause}",
        Intent::Prune.sql("state")
    );
    let name = name.as_ref();
    pg.block(async |c| {
        let stmt = c.prepare_cached(&sql).await?;
        Ok(c.query_one(&stmt, &[name]).await?.get(0))
    })
}

pub(super) fn set_override(
    pg: &mut PgBackend,
    scope: &str,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), StoreError> {
    pg.block(async |c| {
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

pub(super) fn overrides(pg: &mut PgBackend) -> Result<Vec<Override>, StoreError> {
    let rows = pg.block(async |c| {
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

pub(super) fn sqs_queues(pg: &mut PgBackend) -> Result<Vec<SqsQueueRecord>, StoreError> {
    let rows = pg.block(async |c| {
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

pub(super) fn set_sqs_queue(
    pg: &mut PgBackend,
    name: &str,
    record: Option<&SqsQueueRecord>,
) -> Result<bool, StoreError> {
    let node = pg.options.node.clone();
    pg.block(async |c| {
        sqs_queues::announce(c, &node).await?;
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

pub(super) fn probe(pg: &mut PgBackend, now: UnixMillis) -> Result<(), StoreError> {
    pg.block(async |c| {
        let stmt = c
            .prepare_cached(
                "INSERT INTO qd_meta (key, value) VALUES ('probe', $1) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )
            .await?;
        c.execute(&stmt, &[&now]).await.map(drop)
    })
}

pub(super) fn counts(pg: &mut PgBackend) -> Result<Vec<(String, State, u64)>, StoreError> {
    let sql = format!(
        "SELECT j.queue, {EFFECTIVE_STATE} AS s, COUNT(*) FROM qd_jobs j \
         GROUP BY j.queue, s"
    );
    pg.count_rows(&sql, &[])
}

pub(super) fn tenant_counts(
    pg: &mut PgBackend,
    queue: &str,
) -> Result<Vec<(String, State, u64)>, StoreError> {
    let sql = format!(
        "SELECT j.tenant, {EFFECTIVE_STATE} AS s, COUNT(*) FROM qd_jobs j \
         WHERE j.queue = $1 AND j.state IN ('delayed', 'ready', 'dead', 'waiting', 'blocked') \
         GROUP BY j.tenant, s"
    );
    pg.count_rows(&sql, &[&queue])
}
