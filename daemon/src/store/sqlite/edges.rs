//! SQLite statements of the operator's side of dependencies (`job_edges`): which
//! unfinished jobs a job holds back ([`crate::store::Backend::blocked_by`],
//! [`crate::store::Backend::blocked_counts`]) and releasing a purged parent's edges
//! ([`crate::store::Backend::release_parent`]). Each runs inside the caller's
//! store operation, so a purge's check, release and delete are one commit.

use rusqlite::params;
use uuid::Uuid;

use rusqlite::OptionalExtension;

use super::{JOB_COLUMNS, JOINED, SqliteBackend, id_bytes, job_from_row, parse};
use crate::deps::{Counts, Edge};
use crate::job::{Job, JobId, UnixMillis};
use crate::store::BlockedCounts;

/// The unfinished children of `?1` whose edge from it is not met.
const HELD_CHILDREN: &str = "SELECT e.child FROM job_edges e JOIN jobs c ON c.id = e.child \
     WHERE e.parent = ?1 AND e.state <> 'met' \
     AND c.state NOT IN ('succeeded', 'cancelled', 'dead')";

impl SqliteBackend {
    /// [`crate::store::Backend::job_records`]: one primary-key read each.
    pub(super) fn job_records_of(&self, ids: &[JobId]) -> rusqlite::Result<Vec<Option<Job>>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM {JOINED} WHERE j.id = ?1");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        ids.iter()
            .map(|id| stmt.query_row([id_bytes(*id)], job_from_row).optional())
            .collect()
    }

    /// [`crate::store::Backend::blocked_by`] as one indexed query.
    pub(super) fn blocked_by_of(&self, parent: JobId) -> rusqlite::Result<Vec<JobId>> {
        let sql = format!("{HELD_CHILDREN} ORDER BY e.child");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        stmt.query_map([id_bytes(parent)], |r| {
            Ok(JobId(Uuid::from_bytes(r.get(0)?)))
        })?
        .collect()
    }

    /// [`crate::store::Backend::blocked_counts`]: the direct count, and a recursive
    /// walk over edges that are not met to unfinished jobs (`UNION` keeps each job
    /// once).
    pub(super) fn blocked_counts_of(&self, parent: JobId) -> rusqlite::Result<BlockedCounts> {
        let direct: i64 = self
            .conn
            .prepare_cached(&format!("SELECT count(*) FROM ({HELD_CHILDREN})"))?
            .query_row([id_bytes(parent)], |r| r.get(0))?;
        if direct == 0 {
            return Ok(BlockedCounts::default());
        }
        let transitive: i64 = self
            .conn
            .prepare_cached(
                "WITH RECURSIVE down(id) AS ( \
                     SELECT e.child FROM job_edges e JOIN jobs c ON c.id = e.child \
                     WHERE e.parent = ?1 AND e.state <> 'met' \
                     AND c.state NOT IN ('succeeded', 'cancelled', 'dead') \
                     UNION \
                     SELECT e.child FROM down d JOIN job_edges e ON e.parent = d.id \
                     JOIN jobs c ON c.id = e.child \
                     WHERE e.state <> 'met' \
                     AND c.state NOT IN ('succeeded', 'cancelled', 'dead')) \
                 SELECT count(*) FROM down",
            )?
            .query_row([id_bytes(parent)], |r| r.get(0))?;
        Ok(BlockedCounts {
            direct: direct.unsigned_abs(),
            transitive: transitive.unsigned_abs(),
        })
    }

    /// [`crate::store::Backend::release_parent`]: every edge from `parent` that is
    /// not met, to a waiting or blocked child, becomes met; the child's counters
    /// follow and it settles (`released by BY`).
    pub(super) fn release_parent_of(
        &self,
        parent: JobId,
        by: &str,
        now: UnixMillis,
    ) -> rusqlite::Result<Vec<Job>> {
        let rows: Vec<(JobId, Edge, Counts)> = self
            .conn
            .prepare_cached(
                "SELECT e.child, e.state, c.deps_unmet, c.deps_broken \
                 FROM job_edges e JOIN jobs c ON c.id = e.child \
                 WHERE e.parent = ?1 AND e.state <> 'met' \
                 AND c.state IN ('waiting', 'blocked') ORDER BY e.child",
            )?
            .query_map([id_bytes(parent)], |r| {
                Ok((
                    JobId(Uuid::from_bytes(r.get(0)?)),
                    parse(r, 1)?,
                    Counts {
                        unmet: r.get(2)?,
                        broken: r.get(3)?,
                    },
                ))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut set_edge = self.conn.prepare_cached(
            "UPDATE job_edges SET state = 'met' WHERE parent = ?1 AND child = ?2",
        )?;
        let mut set_counts = self
            .conn
            .prepare_cached("UPDATE jobs SET deps_unmet = ?2, deps_broken = ?3 WHERE id = ?1")?;
        let by = format!("{by} (purge of parent {parent})");
        let mut moved = Vec::new();
        for (child, edge, counts) in rows {
            let counts = counts.moved(edge, Edge::Met);
            set_edge.execute(params![id_bytes(parent), id_bytes(child)])?;
            set_counts.execute(params![id_bytes(child), counts.unmet, counts.broken])?;
            if let Some(next) = self.settle_held(child, counts, now, None, Some(&by))? {
                moved.push(next);
            }
        }
        Ok(moved)
    }
}
