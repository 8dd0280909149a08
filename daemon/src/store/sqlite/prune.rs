//! The SQLite statements of pruning: the ids of one bounded batch of finished
//! jobs of a [`PruneScope`], and how far behind pruning is. Called inside the
//! caller's store operation by [`super::SqliteBackend`]'s `prune_finished` and
//! `oldest_finished`; takes no messages.
//!
//! Each batch takes at most `limit` jobs, one state of [`Intent::Prune`] at a
//! time, oldest first with ties in id order (`updated_at, id`: exactly the order
//! of the `(queue, state, updated_at)` index of ended jobs, whose entries end with
//! the primary key of the `WITHOUT ROWID` table; each query repeats the index's
//! condition, [`ENDED`], so SQLite may use it), so for a configured queue SQLite
//! walks the index and stops after `limit` rows: no sort, however large the
//! backlog and however many jobs finished in the same millisecond. The schema has
//! no `(state, updated_at)` index (one index less to write per job), so a batch of
//! the [`PruneScope::Unconfigured`] queues (removed from the config: rare, and
//! shrinking) sorts the matching rows.

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params_from_iter};
use uuid::Uuid;

use super::ENDED;
use crate::job::{JobId, UnixMillis};
use crate::store::PruneScope;
use crate::store::contract::{self, Intent};

/// The SQL condition selecting `scope`'s rows, binding its names from `?first`,
/// and the values to bind.
fn scope_clause(scope: &PruneScope, first: usize) -> (String, Vec<Value>) {
    match scope {
        PruneScope::Queue(q) => (format!("queue = ?{first}"), vec![Value::Text(q.clone())]),
        PruneScope::Unconfigured(known) if known.is_empty() => ("1".into(), Vec::new()),
        PruneScope::Unconfigured(known) => {
            let marks: Vec<String> = (first..first + known.len())
                .map(|n| format!("?{n}"))
                .collect();
            let values = known.iter().cloned().map(Value::Text).collect();
            (format!("queue NOT IN ({})", marks.join(", ")), values)
        }
    }
}

/// [`finished_ids`]'s query: state `?1`, finished before `?2`, at most `?3` ids, the
/// scope's `clause` from `?4` on. A parent is kept (with its result) while any
/// child of it is not itself prunable: waiting or blocked for it, ready, delayed
/// or leased and about to read its result, or dead, since a redrive runs the
/// child again.
fn finished_ids_sql(clause: &str) -> String {
    format!(
        "SELECT id FROM jobs WHERE {ENDED} AND state = ?1 AND updated_at < ?2 AND {clause} \
         AND NOT EXISTS (SELECT 1 FROM job_edges e JOIN jobs c ON c.id = e.child \
             WHERE e.parent = jobs.id AND {}) \
         ORDER BY updated_at, id LIMIT ?3",
        contract::none_of("c.state", Intent::Prune.states())
    )
}

/// [`oldest_finished`]'s query: state `?1`, the scope's `clause` from `?2` on.
fn oldest_finished_sql(clause: &str) -> String {
    format!("SELECT MIN(updated_at) FROM jobs WHERE {ENDED} AND state = ?1 AND {clause}")
}

/// The ids of at most `limit` finished jobs of `scope` older than `before`, in the
/// order a prune deletes them; see `Backend::prune_finished`.
pub(super) fn finished_ids(
    conn: &Connection,
    scope: &PruneScope,
    before: UnixMillis,
    limit: u32,
) -> rusqlite::Result<Vec<JobId>> {
    let (clause, names) = scope_clause(scope, 4);
    let mut stmt = conn.prepare_cached(&finished_ids_sql(&clause))?;
    let mut ids = Vec::new();
    for state in Intent::Prune.states() {
        let left = u64::from(limit) - ids.len() as u64;
        if left == 0 {
            break;
        }
        let mut args = vec![
            Value::Text(state.as_str().into()),
            Value::Integer(before),
            Value::Integer(i64::try_from(left).unwrap_or(i64::MAX)),
        ];
        args.extend(names.iter().cloned());
        let batch = stmt
            .query_map(params_from_iter(args), |r| {
                Ok(JobId(Uuid::from_bytes(r.get(0)?)))
            })?
            .collect::<rusqlite::Result<Vec<JobId>>>()?;
        ids.extend(batch);
    }
    Ok(ids)
}

/// The oldest `updated_at` of a finished job of `scope`; see `Backend::oldest_finished`.
pub(super) fn oldest_finished(
    conn: &Connection,
    scope: &PruneScope,
) -> rusqlite::Result<Option<UnixMillis>> {
    let (clause, names) = scope_clause(scope, 2);
    let mut stmt = conn.prepare_cached(&oldest_finished_sql(&clause))?;
    let mut oldest: Option<UnixMillis> = None;
    for state in Intent::Prune.states() {
        let mut args = vec![Value::Text(state.as_str().into())];
        args.extend(names.iter().cloned());
        let min: Option<UnixMillis> = stmt
            .query_row(params_from_iter(args), |r| r.get(0))
            .optional()?
            .flatten();
        oldest = oldest.into_iter().chain(min).min();
    }
    Ok(oldest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The query plan of `sql` over a database at the newest schema.
    fn plan(sql: &str, args: impl rusqlite::Params) -> String {
        let dir = tempfile::tempdir().expect("tempdir");
        super::super::SqliteBackend::open(&dir.path().join("qd.db"), &Default::default())
            .expect("open")
            .query_plan(sql, args)
    }

    #[test]
    fn a_batch_walks_the_index_without_sorting_the_backlog() {
        let (clause, _) = scope_clause(&PruneScope::Queue("q".into()), 4);
        let plan = plan(
            &finished_ids_sql(&clause),
            rusqlite::params!["succeeded", 0, 10, "q"],
        );
        assert!(plan.contains("jobs_queue_ended"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "a sort per batch: {plan}");
    }

    #[test]
    fn the_oldest_finished_job_is_one_index_lookup() {
        let (clause, _) = scope_clause(&PruneScope::Queue("q".into()), 2);
        let plan = plan(
            &oldest_finished_sql(&clause),
            rusqlite::params!["succeeded", "q"],
        );
        assert!(plan.contains("COVERING INDEX jobs_queue_ended"), "{plan}");
    }
}
