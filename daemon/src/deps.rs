//! Job dependencies (`"after"`): the pure rules every store engine applies.
//!
//! A child job names its parents at enqueue; each (parent, child) pair is an
//! *edge*, `open` until its parent reaches a final state, then `met` or, under the
//! default policy, `broken` by a parent that died or was cancelled. Each child keeps
//! two counters, unmet (open) and broken edges, changed only in the transaction
//! that changes a parent's state, after that change applied. A child is `waiting`
//! while an edge is open, `blocked` while one is broken, and becomes `ready` (or
//! `delayed`, if its own delay has not passed) in the commit that meets its last
//! edge. A redrive of a dead parent reopens its broken edges; an operator's release
//! counts a child's broken edges as met.
//!
//! This module owns no I/O and takes no messages: [`Graph`] is the in-memory form
//! the memory engine uses and the property tests check (`deps/tests.rs`); the SQL
//! engines apply [`edge_after`] and [`child_state`] in their statements.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobId, Outcome, State, UnixMillis};

/// The most parents one job may name.
pub const MAX_PARENTS: usize = 1000;

/// When an edge counts as met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterPolicy {
    /// Only a parent that succeeded meets the edge; a dead or cancelled parent
    /// blocks the child.
    #[default]
    Succeeded,
    /// Any final outcome of the parent meets the edge.
    Finished,
}

impl AfterPolicy {
    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            AfterPolicy::Succeeded => "succeeded",
            AfterPolicy::Finished => "finished",
        }
    }
}

impl FromStr for AfterPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "succeeded" => Ok(AfterPolicy::Succeeded),
            "finished" => Ok(AfterPolicy::Finished),
            _ => Err(format!(
                "unknown after_policy {s:?} (expected \"succeeded\" or \"finished\")"
            )),
        }
    }
}

/// One edge's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Edge {
    /// The parent is not final yet.
    Open,
    /// Counts as done: the parent succeeded (or finished, under
    /// [`AfterPolicy::Finished`]), or an operator released it.
    Met,
    /// The parent died or was cancelled under [`AfterPolicy::Succeeded`].
    Broken,
}

impl Edge {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Edge::Open => "open",
            Edge::Met => "met",
            Edge::Broken => "broken",
        }
    }
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Edge {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(Edge::Open),
            "met" => Ok(Edge::Met),
            "broken" => Ok(Edge::Broken),
            _ => Err(format!("unknown edge state {s:?}")),
        }
    }
}

/// The state of an edge of `policy` in state `edge` once its parent is in state
/// `parent`. A met edge stays met (a final outcome counts once, so a job run twice
/// or redriven after it met an edge cannot count twice); a broken edge opens again
/// when its parent leaves the dead-letter queue (a redrive).
pub fn edge_after(policy: AfterPolicy, edge: Edge, parent: State) -> Edge {
    match (edge, parent) {
        (Edge::Met, _) => Edge::Met,
        (_, State::Succeeded) => Edge::Met,
        (_, State::Dead | State::Cancelled) => match policy {
            AfterPolicy::Finished => Edge::Met,
            AfterPolicy::Succeeded => Edge::Broken,
        },
        (Edge::Broken | Edge::Open, _) => Edge::Open,
    }
}

/// A child's counters of unmet (open) and broken edges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Open edges.
    pub unmet: u32,
    /// Broken edges.
    pub broken: u32,
}

impl Counts {
    /// The counters of `edges`.
    pub fn of(edges: impl IntoIterator<Item = Edge>) -> Counts {
        let mut c = Counts::default();
        for e in edges {
            c.add(e, 1);
        }
        c
    }

    /// Moves one edge from `old` to `new`.
    pub fn moved(mut self, old: Edge, new: Edge) -> Counts {
        self.add(old, -1);
        self.add(new, 1);
        self
    }

    fn add(&mut self, e: Edge, n: i32) {
        let slot = match e {
            Edge::Open => &mut self.unmet,
            Edge::Broken => &mut self.broken,
            Edge::Met => return,
        };
        *slot = slot.saturating_add_signed(n);
    }
}

/// The state a not-yet-released child is in with `counts`: `blocked` while an edge
/// is broken, `waiting` while one is open, `None` once every edge is met.
pub fn child_state(counts: Counts) -> Option<State> {
    if counts.broken > 0 {
        Some(State::Blocked)
    } else if counts.unmet > 0 {
        Some(State::Waiting)
    } else {
        None
    }
}

/// The record of a waiting or blocked `child` whose counters became `counts` at
/// wall time `now`, if its state changes: `blocked`/`waiting` as [`child_state`]
/// says, or, with every edge met, `ready` from `now` (or `delayed` until its own
/// `ready_at`, if that is later).
pub fn settle_child(child: &Job, counts: Counts, now: UnixMillis) -> Option<Job> {
    if !matches!(child.state, State::Waiting | State::Blocked) {
        return None;
    }
    let mut next = child.clone();
    match child_state(counts) {
        Some(s) => next.state = s,
        None if child.ready_at > now => next.state = State::Delayed,
        None => {
            next.state = State::Ready;
            next.ready_at = now;
        }
    }
    if next.state == child.state {
        return None;
    }
    next.updated_at = now;
    Some(next)
}

/// How many ids a refusal or a count names before it says "and N more".
pub const NAMED: usize = 10;

/// The refusal of a purge of `parent`, which holds back the unfinished jobs
/// `blocked`: names them (the first [`NAMED`], then how many more) and the ways
/// out.
pub fn holds_back(parent: JobId, blocked: &[JobId]) -> String {
    let mut names: Vec<String> = blocked.iter().take(NAMED).map(JobId::to_string).collect();
    if blocked.len() > NAMED {
        names.push(format!("and {} more", blocked.len() - NAMED));
    }
    format!(
        "job {parent} blocks {} unfinished job(s): {}; purge with --cascade to cancel its \
         dependents, or --release to count its edges as met",
        blocked.len(),
        names.join(", ")
    )
}

/// Why an enqueue's `after` was refused. Nothing is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AfterError {
    /// A parent id names no stored job.
    #[error("unknown_dependency: job {0} does not exist")]
    Unknown(JobId),
    /// Too many parents.
    #[error("a job may name at most {MAX_PARENTS} parents in after, got {0}")]
    TooMany(usize),
    /// A parent named twice.
    #[error("job {0} is named twice in after")]
    Duplicate(JobId),
}

/// Checks an `after` list's shape (1 to [`MAX_PARENTS`] distinct ids); existence is
/// the store's to check.
pub fn check_after(after: &[JobId]) -> Result<(), AfterError> {
    if after.len() > MAX_PARENTS {
        return Err(AfterError::TooMany(after.len()));
    }
    let mut seen = BTreeSet::new();
    for id in after {
        if !seen.insert(*id) {
            return Err(AfterError::Duplicate(*id));
        }
    }
    Ok(())
}

/// The `after` and `after_policy` fields: 1 to [`MAX_PARENTS`]
/// distinct job ids (an empty list is refused: it would be a no-op that reads
/// as a dependency), and `"succeeded"` (the default) or `"finished"`.
pub fn parse_after(after: Option<Vec<String>>, policy: Option<String>) -> Result<After, String> {
    let policy = match policy {
        Some(p) => p.parse()?,
        None => AfterPolicy::default(),
    };
    let Some(after) = after else {
        return Ok(After {
            parents: Vec::new(),
            policy,
            refs: Vec::new(),
        });
    };
    if after.is_empty() {
        return Err("after must name at least one job id".into());
    }
    if after.len() > MAX_PARENTS {
        return Err(format!(
            "after names {} jobs; at most {MAX_PARENTS} are allowed",
            after.len()
        ));
    }
    let parents = after
        .iter()
        .enumerate()
        .map(|(i, id)| {
            id.parse::<JobId>()
                .map_err(|_| format!("after[{i}] is not a job id: {id:?}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_after(&parents).map_err(|e| e.to_string())?;
    Ok(After {
        parents,
        policy,
        refs: Vec::new(),
    })
}

/// The dependency part of one new job: its parents and policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct After {
    /// Parent ids, distinct.
    pub parents: Vec<JobId>,
    /// When an edge counts as met.
    pub policy: AfterPolicy,
    /// Parents that are earlier items of the same batch, by index (a batch item's
    /// `"ref"`): their ids are chosen by the Broker, which adds them to `parents`
    /// before the write.
    pub refs: Vec<usize>,
}

/// Edges and counters held in memory: the memory engine's tables, and the model
/// the property tests drive. Every change answers the children whose counters
/// moved, with their new counters, in id order.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    edges: BTreeMap<(JobId, JobId), Edge>,
    by_child: BTreeMap<JobId, BTreeSet<JobId>>,
    policy: BTreeMap<JobId, AfterPolicy>,
    counts: BTreeMap<JobId, Counts>,
}

impl Graph {
    /// Files `child`'s edges to `parents`, each given with its current state;
    /// answers the child's counters (a parent already final counts at once).
    pub fn add_child(
        &mut self,
        child: JobId,
        policy: AfterPolicy,
        parents: &[(JobId, State)],
    ) -> Counts {
        let mut counts = Counts::default();
        for &(parent, state) in parents {
            let edge = if state.is_final() {
                edge_after(policy, Edge::Open, state)
            } else {
                Edge::Open
            };
            self.edges.insert((parent, child), edge);
            self.by_child.entry(child).or_default().insert(parent);
            counts = counts.moved(Edge::Met, edge);
        }
        self.policy.insert(child, policy);
        self.counts.insert(child, counts);
        counts
    }

    /// Moves the edges of `parent`, now in state `state`; answers the children
    /// whose counters changed.
    pub fn parent_changed(&mut self, parent: JobId, state: State) -> Vec<(JobId, Counts)> {
        let lo = (parent, JobId(uuid::Uuid::nil()));
        let hi = (parent, JobId(uuid::Uuid::max()));
        let mut changed = Vec::new();
        for ((_, child), edge) in self.edges.range_mut(lo..=hi) {
            let policy = self.policy.get(child).copied().unwrap_or_default();
            let new = edge_after(policy, *edge, state);
            if new != *edge {
                let c = self.counts.entry(*child).or_default();
                *c = c.moved(*edge, new);
                *edge = new;
                changed.push((*child, *c));
            }
        }
        changed
    }

    /// Counts `child`'s broken edges as met (an operator's release); answers its
    /// counters and the parents released, or `None` when it has no broken edge.
    pub fn release(&mut self, child: JobId) -> Option<(Counts, Vec<JobId>)> {
        let parents = self.by_child.get(&child)?.clone();
        let mut released = Vec::new();
        for p in parents {
            if let Some(e) = self.edges.get_mut(&(p, child))
                && *e == Edge::Broken
            {
                *e = Edge::Met;
                released.push(p);
            }
        }
        if released.is_empty() {
            return None;
        }
        let c = self.counts.entry(child).or_default();
        c.broken = c.broken.saturating_sub(released.len() as u32);
        Some((*c, released))
    }

    /// `child`'s counters (zero for a job without parents).
    pub fn counts(&self, child: JobId) -> Counts {
        self.counts.get(&child).copied().unwrap_or_default()
    }

    /// `child`'s parents with their edges, in id order.
    pub fn parents(&self, child: JobId) -> Vec<(JobId, Edge)> {
        self.by_child
            .get(&child)
            .into_iter()
            .flatten()
            .filter_map(|p| self.edges.get(&(*p, child)).map(|e| (*p, *e)))
            .collect()
    }

    /// `parent`'s direct children with their edges, in id order.
    pub fn children(&self, parent: JobId) -> Vec<(JobId, Edge)> {
        let lo = (parent, JobId(uuid::Uuid::nil()));
        let hi = (parent, JobId(uuid::Uuid::max()));
        self.edges
            .range(lo..=hi)
            .map(|((_, c), e)| (*c, *e))
            .collect()
    }

    /// Every job that depends on `root`, directly or not, in id order.
    pub fn dependents(&self, root: JobId) -> Vec<JobId> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![root];
        while let Some(p) = todo.pop() {
            for (c, _) in self.children(p) {
                if seen.insert(c) {
                    todo.push(c);
                }
            }
        }
        seen.into_iter().collect()
    }

    /// Forgets every edge of `id` (a job deleted by a purge or a prune).
    pub fn forget(&mut self, id: JobId) {
        for (c, _) in self.children(id) {
            self.edges.remove(&(id, c));
            if let Some(ps) = self.by_child.get_mut(&c) {
                ps.remove(&id);
            }
        }
        for p in self.by_child.remove(&id).unwrap_or_default() {
            self.edges.remove(&(p, id));
        }
        self.policy.remove(&id);
        self.counts.remove(&id);
    }
}

/// The history line a child's settled change writes, the same on every engine:
/// blocked by the parent that died (`blamed`), or released by an operator
/// (`released_by`); `None` for a change that needs no line.
pub(crate) fn settle_note(
    next: State,
    blamed: Option<JobId>,
    released_by: Option<&str>,
) -> Option<(Outcome, String)> {
    match (next, blamed, released_by) {
        (State::Blocked, Some(parent), _) => Some((
            Outcome::Blocked,
            format!("blocked: parent job {parent} died or was cancelled"),
        )),
        (_, _, Some(by)) => Some((Outcome::Released, format!("released by {by}"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
