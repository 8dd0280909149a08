//! Job dependencies (`deps.rs`) on PostgreSQL, shared by several nodes: the SQL of
//! [`crate::store::Backend::enqueue_after`], `move_edges`, `edges`, `dependents`,
//! `parents_of`, and the operator's side: `blocked_by` and `blocked_counts` (what a
//! dead job holds back), `release_edges_by` (`qctl jobs release`) and
//! `release_parent` (`qctl dlq purge --release`). Takes no messages: the writer
//! thread calls it through [`PgBackend`].
//!
//! Exactness rests on row locks, taken in one order everywhere (parents by id,
//! then children by id), so two nodes' transactions never wait on each other in a
//! cycle of their own making:
//! - **Edges move only in the transaction that changed their parent's state,**
//!   after its fenced `UPDATE` applied: that `UPDATE` holds the parent's row lock
//!   until the commit, so no other transaction moves the same edges meanwhile.
//! - **A child's counters change under the child's row lock:** the children are
//!   locked by id (`FOR UPDATE`), then read and updated in later statements, whose
//!   snapshots show every change committed before the lock was granted. Two
//!   parents of one child finishing at once on two nodes are therefore counted one
//!   after the other; neither can read the counters the other is about to change
//!   (the lost wake-up of "delete my edge, then promote if none is left").
//! - **An enqueue locks its parents `FOR SHARE`, by id, before reading their
//!   states:** a parent's final transition waits for that enqueue's commit (its
//!   `UPDATE` needs the row), and its edge move then sees the new edge; or the
//!   transition committed first and the enqueue reads the final state and counts
//!   it at once. A child enqueued while its parent finishes is never missed.

use std::collections::{BTreeMap, HashMap, HashSet};

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{JOB_COLUMNS, PgBackend, job_from_row_offset};
use crate::deps::{self, After, AfterError, AfterPolicy, Counts, Edge};
use crate::job::{HistoryEntry, Job, JobId, State, UnixMillis};
use crate::store::{
    Backend, BlockedCounts, Edges, Inserted, NewRecord, ParentView, Released, StoreError,
};

/// The unfinished children of `$1` whose edge from it is not met.
const HELD_CHILDREN: &str = "SELECT e.child FROM qd_job_edges e JOIN qd_jobs c ON c.id = e.child \
     WHERE e.parent = $1 AND e.state <> 'met' \
     AND c.state NOT IN ('succeeded', 'cancelled', 'dead')";

/// One edge whose parent changed, read after its child's lock, with the child's
/// record, policy and counters.
struct Held {
    parent: JobId,
    child: Job,
    edge: Edge,
    policy: AfterPolicy,
    counts: Counts,
}

/// Edges to write, and the children they move: each child's record, its
/// counters once every move applied, and the parent that broke an edge, if any.
#[derive(Default)]
struct Moves {
    edges: Vec<(Uuid, Uuid, &'static str)>,
    children: BTreeMap<JobId, (Job, Counts, Option<JobId>)>,
}

impl Moves {
    /// Moves `held`'s edge to `new` (nothing when it is there already).
    fn add(&mut self, held: Held, new: Edge, blamed: Option<JobId>) {
        if new == held.edge {
            return;
        }
        self.edges
            .push((held.parent.0, held.child.id.0, new.as_str()));
        let (_, counts, blame) = self
            .children
            .entry(held.child.id)
            .or_insert_with(|| (held.child, held.counts, None));
        *counts = counts.moved(held.edge, new);
        *blame = blame.or(blamed);
    }
}

impl PgBackend {
    /// [`crate::store::Backend::enqueue_after`]: see the module doc for the locks.
    pub(super) fn enqueue_with_parents(
        &mut self,
        batch: &[NewRecord],
        after: &[After],
        all: bool,
    ) -> Result<Vec<(Inserted, State)>, StoreError> {
        let after_of = |i: usize| after.get(i).filter(|a| !a.parents.is_empty());
        for (index, a) in after.iter().enumerate() {
            if !a.parents.is_empty() {
                deps::check_after(&a.parents)
                    .map_err(|error| StoreError::After { index, error })?;
            }
        }
        // An earlier item of this batch counts as a parent (not final: its edge is
        // open); every other parent is read from the store, locked first.
        let own: HashMap<JobId, usize> = batch
            .iter()
            .enumerate()
            .rev()
            .map(|(i, r)| (r.job.id, i))
            .collect();
        let mut wanted: Vec<Uuid> = (0..batch.len())
            .filter_map(after_of)
            .flat_map(|a| a.parents.iter())
            .filter(|p| !own.contains_key(p))
            .map(|p| p.0)
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let stored: HashMap<JobId, State> = if wanted.is_empty() {
            HashMap::new()
        } else {
            let rows = self.block(async |c| {
                let stmt = c
                    .prepare_cached(
                        "SELECT id, state FROM qd_jobs WHERE id = ANY($1::uuid[]) \
                         ORDER BY id FOR SHARE",
                    )
                    .await?;
                c.query(&stmt, &[&wanted]).await
            })?;
            rows.iter()
                .map(|r| {
                    let state: String = r.get(1);
                    let state = state.parse().map_err(|e: String| self.corrupt(e))?;
                    Ok((JobId(r.get(0)), state))
                })
                .collect::<Result<_, StoreError>>()?
        };
        // Each item's edges and the state they call for.
        let mut records = batch.to_vec();
        let mut edges: Vec<Vec<(JobId, Edge)>> = vec![Vec::new(); batch.len()];
        let mut counts = vec![Counts::default(); batch.len()];
        for (index, record) in records.iter_mut().enumerate() {
            let Some(a) = after_of(index) else { continue };
            for p in &a.parents {
                let state = match own.get(p) {
                    Some(&i) if i < index => State::Waiting,
                    _ => *stored.get(p).ok_or(StoreError::After {
                        index,
                        error: AfterError::Unknown(*p),
                    })?,
                };
                edges[index].push((*p, deps::edge_after(a.policy, Edge::Open, state)));
            }
            counts[index] = Counts::of(edges[index].iter().map(|(_, e)| *e));
            if let Some(held) = deps::child_state(counts[index]) {
                record.job.state = held;
            }
        }
        let mut answers = if all {
            self.enqueue_all(&records)?
        } else {
            self.enqueue(&records)?
        };
        // A parent that is an earlier item must have been stored by this batch.
        for (index, a) in (0..batch.len()).filter_map(|i| Some((i, after_of(i)?))) {
            for p in &a.parents {
                if let Some(&i) = own.get(p)
                    && i < index
                    && answers[i] != Inserted::New
                {
                    return Err(StoreError::After {
                        index,
                        error: AfterError::Unknown(*p),
                    });
                }
            }
        }
        self.store_edges(&records, &edges, &counts, &answers, after)?;
        self.compare_parents(&mut answers, after)?;
        if all
            && let Some((index, id)) = answers.iter().enumerate().find_map(|(index, a)| match a {
                Inserted::Duplicate {
                    id,
                    same_payload: false,
                } => Some((index, id.to_owned())),
                _ => None,
            })
        {
            return Err(StoreError::KeyConflict { index, id });
        }
        Ok(answers
            .into_iter()
            .zip(&records)
            .map(|(a, r)| (a, r.job.state))
            .collect())
    }

    /// Writes the edges and counters of the items stored new that name parents.
    fn store_edges(
        &mut self,
        records: &[NewRecord],
        edges: &[Vec<(JobId, Edge)>],
        counts: &[Counts],
        answers: &[Inserted],
        after: &[After],
    ) -> Result<(), StoreError> {
        let new: Vec<usize> = (0..records.len())
            .filter(|&i| answers[i] == Inserted::New && !edges[i].is_empty())
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let (mut parents, mut children, mut states) = (Vec::new(), Vec::new(), Vec::new());
        for &i in &new {
            for (p, e) in &edges[i] {
                parents.push(p.0);
                children.push(records[i].job.id.0);
                states.push(e.as_str());
            }
        }
        let ids: Vec<Uuid> = new.iter().map(|&i| records[i].job.id.0).collect();
        let policies: Vec<&str> = new
            .iter()
            .map(|&i| after.get(i).map_or("succeeded", |a| a.policy.as_str()))
            .collect();
        let unmet: Vec<i32> = new.iter().map(|&i| count(counts[i].unmet)).collect();
        let broken: Vec<i32> = new.iter().map(|&i| count(counts[i].broken)).collect();
        self.block(async |c| {
            let edges = c
                .prepare_cached(
                    "INSERT INTO qd_job_edges (parent, child, state) \
                     SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[])",
                )
                .await?;
            let counters = c
                .prepare_cached(
                    "UPDATE qd_jobs j SET after_policy = u.policy, deps_unmet = u.unmet, \
                       deps_broken = u.broken \
                     FROM unnest($1::uuid[], $2::text[], $3::int4[], $4::int4[]) \
                       AS u(id, policy, unmet, broken) WHERE j.id = u.id",
                )
                .await?;
            let edge_args: [&(dyn ToSql + Sync); 3] = [&parents, &children, &states];
            let counter_args: [&(dyn ToSql + Sync); 4] = [&ids, &policies, &unmet, &broken];
            tokio::try_join!(
                c.execute(&edges, &edge_args),
                c.execute(&counters, &counter_args),
            )
        })?;
        Ok(())
    }

    /// A duplicate key whose holder names other parents, or the same parents under
    /// another policy, than the item asks for (none included) is another request:
    /// answered as a different payload (a key conflict).
    fn compare_parents(
        &mut self,
        answers: &mut [Inserted],
        after: &[After],
    ) -> Result<(), StoreError> {
        let asked: Vec<(usize, JobId)> = answers
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                Inserted::Duplicate {
                    id,
                    same_payload: true,
                } => Some((i, *id)),
                _ => None,
            })
            .collect();
        if asked.is_empty() {
            return Ok(());
        }
        let holders: Vec<Uuid> = asked.iter().map(|(_, id)| id.0).collect();
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "SELECT j.id, j.after_policy, e.parent FROM qd_jobs j \
                     LEFT JOIN qd_job_edges e ON e.child = j.id \
                     WHERE j.id = ANY($1::uuid[])",
                )
                .await?;
            c.query(&stmt, &[&holders]).await
        })?;
        let mut held: HashMap<Uuid, (Option<String>, HashSet<Uuid>)> = HashMap::new();
        for r in &rows {
            let entry = held.entry(r.get(0)).or_default();
            entry.0 = r.get(1);
            if let Some(parent) = r.get::<_, Option<Uuid>>(2) {
                entry.1.insert(parent);
            }
        }
        for (i, id) in asked {
            let item = after.get(i).cloned().unwrap_or_default();
            let want: HashSet<Uuid> = item.parents.iter().map(|p| p.0).collect();
            let (policy, parents) = held.remove(&id.0).unwrap_or_default();
            let same_policy = parents.is_empty() || policy.as_deref() == Some(item.policy.as_str());
            if parents != want || !same_policy {
                answers[i] = Inserted::Duplicate {
                    id,
                    same_payload: false,
                };
            }
        }
        Ok(())
    }

    /// [`crate::store::Backend::move_edges`]: the changed parents' row locks are
    /// this transaction's already (their fenced updates applied); the children are
    /// locked by id, then their edges and counters read, moved by
    /// [`deps::edge_after`] and written, and each child whose counters call for
    /// it changes state ([`deps::settle_child`]), a blocked one with a history
    /// line naming its parent. Answers the children that changed state, in id
    /// order; idle nodes are told of the released ones.
    pub(super) fn move_edges_of(
        &mut self,
        changed: &[(JobId, State)],
        now: UnixMillis,
    ) -> Result<Vec<Job>, StoreError> {
        if changed.is_empty() {
            return Ok(Vec::new());
        }
        let mut parents: BTreeMap<JobId, State> = BTreeMap::new();
        for (id, state) in changed {
            parents.insert(*id, *state);
        }
        let ids: Vec<Uuid> = parents.keys().map(|id| id.0).collect();
        let held = self.held_edges(
            "SELECT id FROM qd_jobs WHERE id IN (SELECT child FROM qd_job_edges \
               WHERE parent = ANY($1::uuid[]) AND state <> 'met') \
             ORDER BY id FOR UPDATE",
            "e.parent = ANY($1::uuid[]) AND e.state <> 'met'",
            &ids,
        )?;
        let mut moves = Moves::default();
        for h in held {
            let Some(&state) = parents.get(&h.parent) else {
                continue;
            };
            let new = deps::edge_after(h.policy, h.edge, state);
            let blamed = (new == Edge::Broken).then_some(h.parent);
            moves.add(h, new, blamed);
        }
        self.write_moves(moves, now, None)
    }

    /// [`crate::store::Backend::blocked_by`]. The parent's row is locked first
    /// (`FOR UPDATE`, the file's order: parents, then children), so the answer
    /// holds until this transaction ends: an enqueue naming the parent locks it
    /// `FOR SHARE` and waits, and a purge's check and delete in one transaction
    /// never strand a child enqueued in between (it then finds no parent:
    /// `unknown_dependency`).
    pub(super) fn blocked_by_of(&mut self, parent: JobId) -> Result<Vec<JobId>, StoreError> {
        let read = format!("{HELD_CHILDREN} ORDER BY e.child");
        let (_, rows) = self.block(async |c| {
            let lock = c
                .prepare_cached("SELECT id FROM qd_jobs WHERE id = $1 FOR UPDATE")
                .await?;
            let read = c.prepare_cached(&read).await?;
            let args: [&(dyn ToSql + Sync); 1] = [&parent.0];
            tokio::try_join!(c.query(&lock, &args), c.query(&read, &args))
        })?;
        Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
    }

    /// [`crate::store::Backend::blocked_counts`]: the direct count, and a recursive
    /// walk over edges that are not met to unfinished jobs (`UNION` keeps each job
    /// once). A read: it locks nothing.
    pub(super) fn blocked_counts_of(&mut self, parent: JobId) -> Result<BlockedCounts, StoreError> {
        let direct = format!("SELECT count(*) FROM ({HELD_CHILDREN}) d");
        let (direct, transitive) = self.block(async |c| {
            let direct = c.prepare_cached(&direct).await?;
            let transitive = c
                .prepare_cached(
                    "WITH RECURSIVE down(id) AS ( \
                       SELECT e.child FROM qd_job_edges e JOIN qd_jobs c ON c.id = e.child \
                       WHERE e.parent = $1 AND e.state <> 'met' \
                         AND c.state NOT IN ('succeeded', 'cancelled', 'dead') \
                       UNION \
                       SELECT e.child FROM down d JOIN qd_job_edges e ON e.parent = d.id \
                       JOIN qd_jobs c ON c.id = e.child \
                       WHERE e.state <> 'met' \
                         AND c.state NOT IN ('succeeded', 'cancelled', 'dead')) \
                     SELECT count(*) FROM down",
                )
                .await?;
            let args: [&(dyn ToSql + Sync); 1] = [&parent.0];
            tokio::try_join!(c.query_one(&direct, &args), c.query_one(&transitive, &args))
        })?;
        let n = |r: &tokio_postgres::Row| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0);
        Ok(BlockedCounts {
            direct: n(&direct),
            transitive: n(&transitive),
        })
    }

    /// [`crate::store::Backend::release_parent`]: under the parent's row lock, then
    /// its children's (by id), every edge from `parent` that is not met, to a
    /// waiting or blocked child, becomes met; the child's counters follow and it
    /// settles, with the history line `released by BY (purge of parent ID)`.
    pub(super) fn release_parent_of(
        &mut self,
        parent: JobId,
        by: &str,
        now: UnixMillis,
    ) -> Result<Vec<Job>, StoreError> {
        self.block(async |c| {
            let lock = c
                .prepare_cached("SELECT id FROM qd_jobs WHERE id = $1 FOR UPDATE")
                .await?;
            c.query(&lock, &[&parent.0]).await
        })?;
        let held = self.held_edges(
            "SELECT id FROM qd_jobs WHERE id IN (SELECT child FROM qd_job_edges \
               WHERE parent = $1 AND state <> 'met') \
             ORDER BY id FOR UPDATE",
            "e.parent = $1 AND e.state <> 'met'",
            &parent.0,
        )?;
        let mut moves = Moves::default();
        for h in held.into_iter().filter(|h| h.child.state.is_held()) {
            moves.add(h, Edge::Met, None);
        }
        let by = format!("{by} (purge of parent {parent})");
        self.write_moves(moves, now, Some(&by))
    }

    /// [`crate::store::Backend::release_edges_by`]: under the child's row lock, a
    /// blocked child's broken edges count as met and it settles at `now`, with the
    /// history line `released by BY (parents ...)`. Any other state, or an unknown
    /// job, answers `None` and writes nothing.
    pub(super) fn release_edges_of(
        &mut self,
        child: JobId,
        by: &str,
        now: UnixMillis,
    ) -> Result<Option<Released>, StoreError> {
        let held = self.held_edges(
            "SELECT id FROM qd_jobs WHERE id = $1 FOR UPDATE",
            "e.child = $1 AND e.state = 'broken'",
            &child.0,
        )?;
        if held.first().is_none_or(|h| h.child.state != State::Blocked) {
            return Ok(None);
        }
        let mut moves = Moves::default();
        let mut released = Vec::with_capacity(held.len());
        for h in held {
            released.push(h.parent);
            moves.add(h, Edge::Met, None);
        }
        released.sort_unstable();
        let by = format!("{by} (parents {})", display_ids(&released));
        let next = self.write_moves(moves, now, Some(&by))?.pop();
        Ok(Some((next, released)))
    }

    /// The edges that `filter` picks (over `qd_job_edges e`), with their children's
    /// records, policies and counters, read after `lock` (taking the children's
    /// row locks by id) finished: pipelined in one round trip, the read's snapshot
    /// shows every change committed before the locks were granted. In child, then
    /// parent id order.
    fn held_edges(
        &mut self,
        lock: &str,
        filter: &str,
        arg: &(dyn ToSql + Sync),
    ) -> Result<Vec<Held>, StoreError> {
        let read = format!(
            "SELECT e.parent, e.state, j.after_policy, j.deps_unmet, j.deps_broken, \
               {JOB_COLUMNS} \
             FROM qd_job_edges e JOIN qd_jobs j ON j.id = e.child \
             WHERE {filter} ORDER BY e.child, e.parent"
        );
        let (_, rows) = self.block(async |c| {
            let lock = c.prepare_cached(lock).await?;
            let read = c.prepare_cached(&read).await?;
            let args: [&(dyn ToSql + Sync); 1] = [arg];
            tokio::try_join!(c.query(&lock, &args), c.query(&read, &args))
        })?;
        let mut held = Vec::with_capacity(rows.len());
        for r in &rows {
            let edge: String = r.get(1);
            let policy: Option<String> = r.get(2);
            held.push(Held {
                parent: JobId(r.get(0)),
                edge: edge.parse().map_err(|e: String| self.corrupt(e))?,
                policy: policy.and_then(|p| p.parse().ok()).unwrap_or_default(),
                counts: Counts {
                    unmet: stored_count(r.get(3)),
                    broken: stored_count(r.get(4)),
                },
                child: job_from_row_offset(r, 5, &self.target)?,
            });
        }
        Ok(held)
    }

    /// Writes `moves` (its children locked already): the edges, each child's
    /// counters, and the state of each child whose counters call for it, with a
    /// history line when it becomes blocked (naming the parent) or is released by
    /// `released_by`, as SQLite's `settle_held` writes them. Answers the children
    /// that changed state, in id order; idle nodes are told of the released ones.
    fn write_moves(
        &mut self,
        moves: Moves,
        now: UnixMillis,
        released_by: Option<&str>,
    ) -> Result<Vec<Job>, StoreError> {
        if moves.edges.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut history = Vec::new();
        let (mut ids, mut unmet, mut broken) = (Vec::new(), Vec::new(), Vec::new());
        let (mut states, mut ready, mut updated) = (Vec::new(), Vec::new(), Vec::new());
        for (id, (child, counts, blamed)) in moves.children {
            ids.push(id.0);
            unmet.push(count(counts.unmet));
            broken.push(count(counts.broken));
            let next = deps::settle_child(&child, counts, now);
            states.push(next.as_ref().map(|n| n.state.as_str()));
            ready.push(next.as_ref().map(|n| n.ready_at));
            updated.push(next.as_ref().map(|n| n.updated_at));
            let Some(next) = next else { continue };
            if let Some((outcome, detail)) = deps::settle_note(next.state, blamed, released_by) {
                history.push((
                    id.0,
                    HistoryEntry {
                        attempt: child.attempts,
                        outcome,
                        worker: None,
                        started_at: None,
                        ended_at: now,
                        error: Some(detail),
                    },
                ));
            }
            out.push(next);
        }
        let (parents, children, edge_states): (Vec<Uuid>, Vec<Uuid>, Vec<&str>) =
            moves.edges.into_iter().fold(
                (Vec::new(), Vec::new(), Vec::new()),
                |(mut p, mut c, mut s), (parent, child, state)| {
                    p.push(parent);
                    c.push(child);
                    s.push(state);
                    (p, c, s)
                },
            );
        self.block(async |c| {
            let edges = c
                .prepare_cached(
                    "UPDATE qd_job_edges e SET state = u.state \
                     FROM unnest($1::uuid[], $2::uuid[], $3::text[]) AS u(parent, child, state) \
                     WHERE e.parent = u.parent AND e.child = u.child",
                )
                .await?;
            // The state changes only for a child still held: under its lock,
            // nothing else changed it since the read.
            let counters = c
                .prepare_cached(
                    "UPDATE qd_jobs j SET deps_unmet = u.unmet, deps_broken = u.broken, \
                       state = CASE WHEN u.state IS NOT NULL \
                         AND j.state IN ('waiting', 'blocked') THEN u.state ELSE j.state END, \
                       ready_at = CASE WHEN u.state IS NOT NULL \
                         AND j.state IN ('waiting', 'blocked') THEN u.ready_at ELSE j.ready_at END, \
                       updated_at = CASE WHEN u.state IS NOT NULL \
                         AND j.state IN ('waiting', 'blocked') THEN u.updated_at \
                         ELSE j.updated_at END \
                     FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::text[], $5::int8[], \
                       $6::int8[]) AS u(id, unmet, broken, state, ready_at, updated_at) \
                     WHERE j.id = u.id",
                )
                .await?;
            let edge_args: [&(dyn ToSql + Sync); 3] = [&parents, &children, &edge_states];
            let counter_args: [&(dyn ToSql + Sync); 6] =
                [&ids, &unmet, &broken, &states, &ready, &updated];
            tokio::try_join!(
                c.execute(&edges, &edge_args),
                c.execute(&counters, &counter_args),
            )
        })?;
        let history: Vec<(Uuid, HistoryEntry)> = history
            .into_iter()
            .map(|(id, e)| {
                let e = crate::store::history::bounded(&e, &self.options.history).into_owned();
                (id, e)
            })
            .collect();
        self.append_history(&history)?;
        let released: Vec<String> = out
            .iter()
            .filter(|j| !j.state.is_held())
            .map(|j| j.queue.to_string())
            .collect();
        self.notify(released.iter().map(String::as_str))?;
        Ok(out)
    }

    /// [`crate::store::Backend::job_records`]: one read of every id.
    pub(super) fn job_records_of(&mut self, ids: &[JobId]) -> Result<Vec<Option<Job>>, StoreError> {
        let wanted: Vec<Uuid> = ids.iter().map(|id| id.0).collect();
        let sql = format!("SELECT {JOB_COLUMNS} FROM qd_jobs j WHERE j.id = ANY($1::uuid[])");
        let found: HashMap<JobId, Job> = self
            .query_jobs(&sql, &[&wanted])?
            .into_iter()
            .map(|j| (j.id, j))
            .collect();
        Ok(ids.iter().map(|id| found.get(id).cloned()).collect())
    }

    /// [`crate::store::SharedStore::held_depths`]: one read over the index by
    /// queue and state.
    pub(super) fn held_depths_of(&mut self) -> Result<Vec<(String, State, u64)>, StoreError> {
        self.count_rows(
            "SELECT queue, state, count(*) FROM qd_jobs \
             WHERE state IN ('waiting', 'blocked') GROUP BY queue, state",
            &[],
        )
    }

    /// [`crate::store::Backend::edges`].
    pub(super) fn edges_of(&mut self, id: JobId) -> Result<Edges, StoreError> {
        let (parents, children) = self.block(async |c| {
            let up = c
                .prepare_cached(
                    "SELECT parent, state FROM qd_job_edges WHERE child = $1 ORDER BY parent",
                )
                .await?;
            let down = c
                .prepare_cached(
                    "SELECT child, state FROM qd_job_edges WHERE parent = $1 ORDER BY child",
                )
                .await?;
            let args: [&(dyn ToSql + Sync); 1] = [&id.0];
            tokio::try_join!(c.query(&up, &args), c.query(&down, &args))
        })?;
        let read = |rows: &[tokio_postgres::Row]| -> Result<Vec<(JobId, Edge)>, StoreError> {
            rows.iter()
                .map(|r| {
                    let state: String = r.get(1);
                    Ok((
                        JobId(r.get(0)),
                        state.parse().map_err(|e: String| self.corrupt(e))?,
                    ))
                })
                .collect()
        };
        Ok(Edges {
            parents: read(&parents)?,
            children: read(&children)?,
        })
    }

    /// [`crate::store::Backend::parents_of`]: one query for all `children`, each
    /// parent's effective state (`leased` while a lease holds it), last error and
    /// result, in parent id order per child.
    pub(super) fn parents_of_all(
        &mut self,
        children: &[JobId],
    ) -> Result<Vec<Vec<ParentView>>, StoreError> {
        let ids: Vec<Uuid> = children.iter().map(|c| c.0).collect();
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "SELECT e.child, e.parent, \
                       CASE WHEN j.lease_token IS NULL THEN j.state ELSE 'leased' END, \
                       j.last_error, j.result \
                     FROM qd_job_edges e JOIN qd_jobs j ON j.id = e.parent \
                     WHERE e.child = ANY($1) ORDER BY e.child, e.parent",
                )
                .await?;
            c.query(&stmt, &[&ids]).await
        })?;
        let mut by_child: HashMap<JobId, Vec<ParentView>> = HashMap::new();
        for r in &rows {
            let state: String = r.get(2);
            by_child
                .entry(JobId(r.get(0)))
                .or_default()
                .push(ParentView {
                    id: JobId(r.get(1)),
                    state: state.parse().map_err(|e: String| self.corrupt(e))?,
                    last_error: r.get(3),
                    result: r.get(4),
                });
        }
        Ok(children
            .iter()
            .map(|c| by_child.remove(c).unwrap_or_default())
            .collect())
    }

    /// [`crate::store::Backend::dependents`].
    pub(super) fn dependents_of(&mut self, root: JobId) -> Result<Vec<JobId>, StoreError> {
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(
                    "WITH RECURSIVE down(id) AS ( \
                       SELECT child FROM qd_job_edges WHERE parent = $1 \
                       UNION SELECT e.child FROM qd_job_edges e JOIN down d ON e.parent = d.id) \
                     SELECT j.id FROM down d JOIN qd_jobs j ON j.id = d.id \
                     WHERE j.state NOT IN ('succeeded', 'cancelled', 'dead') ORDER BY j.id",
                )
                .await?;
            c.query(&stmt, &[&root.0]).await
        })?;
        Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
    }
}

/// Ids for a history line, comma-separated.
fn display_ids(ids: &[JobId]) -> String {
    ids.iter()
        .map(JobId::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A counter as stored (`integer`; at most [`deps::MAX_PARENTS`]).
fn count(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A stored counter (never negative: a CHECK holds it).
fn stored_count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}
