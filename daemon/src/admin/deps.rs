//! The operator's side of job dependencies (`after`, see `deps.rs`): a job's
//! parents and dependents in `jobs_show` / `dlq_show` (with the counts of jobs a
//! dead one holds back), `jobs_tree`, `jobs_release`, and `dlq_purge`'s refusal of
//! a job that holds back unfinished jobs unless `cascade` or `release` is given.
//! Reads go to the store; every change goes through the Broker (`Release`,
//! `Purge`, `PurgeReleasing`, `Cancel`), which writes it in one commit.

use std::collections::BTreeSet;

use qd_proto::{
    DlqSelection, EdgeInfo, ErrorBody, ErrorCode, JobTree, MAX_DEPENDENTS_SHOWN, MAX_TREE_DEPTH,
    MAX_TREE_NODES, PurgeResult, Refusal, Response, TreeNode,
};

use super::{Author, CALL, Handler, audit, err, parse_id, selection_of, views};
use crate::broker::{self, BatchOutcome, BrokerError, BrokerMsg};
use crate::deps::Edge;
use crate::dlq::DlqMsg;
use crate::job::{Job, JobId, State};
use crate::store::{Backend, BlockedCounts, StoreError};

/// `jobs_tree`'s bounds when the request gives none.
const DEFAULT_TREE_DEPTH: u32 = 10;
const DEFAULT_TREE_NODES: u32 = 200;
/// Jobs per purge write: each batch is one commit.
const PURGE_BATCH: usize = 100;

/// One edge's far end as the protocol shows it.
fn edge_info(id: JobId, edge: Edge, job: Option<&Job>) -> EdgeInfo {
    EdgeInfo {
        id: id.to_string(),
        edge: edge.to_string(),
        state: job.map(|j| j.shown_state(crate::clock::wall_ms()).to_string()),
        queue: job.map(|j| j.queue.to_string()),
    }
}

/// A job's parents and its first [`MAX_DEPENDENTS_SHOWN`] dependents with their
/// records ([`crate::store::edge_records`]), and how many dependents it has.
fn edges_of(
    b: &mut dyn Backend,
    id: JobId,
) -> Result<(Vec<EdgeInfo>, Vec<EdgeInfo>, u64), StoreError> {
    let found = crate::store::edge_records(b, id, MAX_DEPENDENTS_SHOWN)?;
    let infos = |list: &[crate::store::EdgeRecord]| -> Vec<EdgeInfo> {
        list.iter()
            .map(|(i, e, j)| edge_info(*i, *e, j.as_ref()))
            .collect()
    };
    Ok((
        infos(&found.parents),
        infos(&found.dependents),
        found.dependents_total,
    ))
}

/// Walks a dependency tree depth first, within its bounds.
struct Walk<'a> {
    b: &'a mut dyn Backend,
    up: bool,
    max_depth: u32,
    max_nodes: u64,
    nodes: u64,
    depth: u32,
    truncated: bool,
    seen: BTreeSet<JobId>,
}

impl Walk<'_> {
    fn node(&mut self, id: JobId, edge: Option<Edge>, level: u32) -> Result<TreeNode, StoreError> {
        self.nodes += 1;
        self.depth = self.depth.max(level);
        let job = self.b.job_records(&[id])?.pop().flatten();
        let mut node = TreeNode {
            id: id.to_string(),
            state: job
                .as_ref()
                .map(|j| j.shown_state(crate::clock::wall_ms()).to_string()),
            queue: job.as_ref().map(|j| j.queue.to_string()),
            edge: edge.map(|e| e.to_string()),
            repeated: false,
            more: 0,
            children: Vec::new(),
        };
        if !self.seen.insert(id) {
            node.repeated = true;
            return Ok(node);
        }
        let edges = self.b.edges(id)?;
        let next = if self.up {
            edges.parents
        } else {
            edges.children
        };
        for (child, edge) in next {
            if level >= self.max_depth || self.nodes >= self.max_nodes {
                node.more += 1;
                self.truncated = true;
                continue;
            }
            node.children.push(self.node(child, Some(edge), level + 1)?);
        }
        Ok(node)
    }
}

/// A bound from a request: `default` when absent, else 1 to `max`.
fn bound(name: &str, value: Option<u32>, default: u32, max: u32) -> Result<u32, ErrorBody> {
    match value {
        None => Ok(default),
        Some(v) if (1..=max).contains(&v) => Ok(v),
        Some(v) => Err(err(
            ErrorCode::BadRequest,
            format!("{name} must be between 1 and {max}, got {v}"),
        )),
    }
}

impl Handler {
    /// `jobs_show` (`dead_only` false) or `dlq_show`: the job with its parents and
    /// dependents; a dead job also with the counts of jobs it holds back.
    pub(super) async fn show(&self, id: &str, dead_only: bool) -> Result<Response, ErrorBody> {
        let detail = self.stored(id).await?;
        let job = &detail.job;
        if dead_only && job.state != State::Dead {
            return Err(err(
                ErrorCode::Conflict,
                format!(
                    "job {} is {}, not dead; see `qctl jobs show {}`",
                    job.id, job.state, job.id
                ),
            ));
        }
        let (id, dead) = (job.id, job.state == State::Dead);
        let (parents, dependents, total, blocks) = self
            .daemon
            .store
            .run(move |b| {
                let (parents, dependents, total) = edges_of(b, id)?;
                let blocks = if dead {
                    Some(b.blocked_counts(id)?)
                } else {
                    None
                };
                Ok((parents, dependents, total, blocks))
            })
            .await
            .map_err(BrokerError::from)?;
        let mut view = views::detail(&detail);
        view.parents = parents;
        view.dependents = dependents;
        view.dependents_total = total;
        if let Some(BlockedCounts { direct, transitive }) = blocks {
            view.summary.blocks = Some(direct);
            view.blocks_transitive = Some(transitive);
        }
        Ok(Response::Job(Box::new(view)))
    }

    /// Fills `blocks` of a DLQ page: the unfinished jobs each dead job holds back.
    pub(super) async fn with_blocks(
        &self,
        mut jobs: Vec<qd_proto::JobSummary>,
    ) -> Result<Vec<qd_proto::JobSummary>, ErrorBody> {
        let ids = jobs
            .iter()
            .map(|j| parse_id(&j.id))
            .collect::<Result<Vec<_>, _>>()?;
        // In id order: on PostgreSQL each check locks its job's row (see
        // `Backend::blocked_by`), and every transaction locks parents by id.
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let counts: std::collections::HashMap<JobId, u64> = self
            .daemon
            .store
            .run(move |b| {
                sorted
                    .into_iter()
                    .map(|id| Ok((id, b.blocked_by(id)?.len() as u64)))
                    .collect()
            })
            .await
            .map_err(BrokerError::from)?;
        for (job, id) in jobs.iter_mut().zip(&ids) {
            job.blocks = counts.get(id).copied();
        }
        Ok(jobs)
    }

    /// `jobs_tree`: the bounded tree of `id`'s dependents (or parents).
    pub(super) async fn tree(
        &self,
        id: &str,
        up: bool,
        max_depth: Option<u32>,
        max_nodes: Option<u32>,
    ) -> Result<Response, ErrorBody> {
        let max_depth = bound("max_depth", max_depth, DEFAULT_TREE_DEPTH, MAX_TREE_DEPTH)?;
        let max_nodes = bound("max_nodes", max_nodes, DEFAULT_TREE_NODES, MAX_TREE_NODES)?;
        let root = self.stored(id).await?.job.id;
        let tree = self
            .daemon
            .store
            .run(move |b| {
                let mut walk = Walk {
                    b,
                    up,
                    max_depth,
                    max_nodes: u64::from(max_nodes),
                    nodes: 0,
                    depth: 0,
                    truncated: false,
                    seen: BTreeSet::new(),
                };
                let root = walk.node(root, None, 0)?;
                Ok(JobTree {
                    direction: if up { "parents" } else { "dependents" }.into(),
                    max_depth,
                    max_nodes,
                    nodes: walk.nodes,
                    depth: walk.depth,
                    truncated: walk.truncated,
                    root,
                })
            })
            .await
            .map_err(BrokerError::from)?;
        Ok(Response::Tree(tree))
    }

    /// `jobs_release`: a blocked job's broken edges count as met; audited.
    pub(super) async fn release(
        &self,
        id: &str,
        author: &Author,
        op: &str,
    ) -> Result<Response, ErrorBody> {
        let detail = self.stored(id).await?;
        let id = detail.job.id;
        let not_blocked = |state: State| {
            err(
                ErrorCode::Conflict,
                format!(
                    "job {id} is {state}, not blocked; only a job blocked by a dead or \
                     cancelled parent can be released"
                ),
            )
        };
        if detail.job.state != State::Blocked {
            return Err(not_blocked(detail.job.state));
        }
        let by = author.to_string();
        let released = match broker::request(|tx| BrokerMsg::Release(id, by, tx), CALL).await? {
            Err(BrokerError::UnknownJob(_)) => {
                return Err(err(
                    ErrorCode::Conflict,
                    format!("job {id} is not held by this node's broker; retry"),
                ));
            }
            other => other?,
        };
        let Some((job, parents)) = released else {
            let now = self.stored(&id.to_string()).await?.job.state;
            return Err(not_blocked(now));
        };
        let state = job.map_or(State::Blocked, |j| j.state);
        audit::change(
            author,
            op,
            &format!("job {id}"),
            "blocked",
            &format!("{state} (released edges from {})", ids_text(&parents)),
        );
        Ok(Response::Released {
            id: id.to_string(),
            previous_state: State::Blocked.to_string(),
            state: state.to_string(),
            parents: parents.iter().map(JobId::to_string).collect(),
        })
    }

    /// `dlq_purge`: deletes dead jobs in batches of one commit each. A job that
    /// holds back unfinished jobs is refused naming them (also on a dry run),
    /// unless `cascade` (its unfinished transitive dependents are cancelled
    /// first, each audited) or `release` (its edges to them count as met in the
    /// purge's commit).
    pub(super) async fn purge(
        &self,
        selection: &DlqSelection,
        dry_run: bool,
        (cascade, release): (bool, bool),
        author: &Author,
        op: &'static str,
    ) -> Result<Response, ErrorBody> {
        selection
            .check_mutation()
            .map_err(|e| err(ErrorCode::BadRequest, e))?;
        if cascade && release {
            return Err(err(
                ErrorCode::BadRequest,
                "give cascade or release, not both",
            ));
        }
        self.queue_filter(selection.queue.as_deref())?;
        let sel = selection_of(selection)?;
        let resolved = super::dlq_call(|tx| DlqMsg::Purge(sel, true, tx)).await?;
        let mut ids = resolved.moved.clone();
        // In id order, as every transaction locks parents (`Backend::blocked_by`).
        ids.sort_unstable();
        let blocking: Vec<(JobId, Vec<JobId>)> = self
            .daemon
            .store
            .run(move |b| {
                let mut out = Vec::new();
                for id in ids {
                    let held = b.blocked_by(id)?;
                    if !held.is_empty() {
                        out.push((id, held));
                    }
                }
                Ok(out)
            })
            .await
            .map_err(BrokerError::from)?;
        let mut result = PurgeResult {
            matched: (resolved.moved.len() + resolved.refused.len()) as u64,
            dry_run,
            refused: refusals(&resolved.refused),
            ..PurgeResult::default()
        };
        let mut ids = resolved.moved;
        if !cascade && !release {
            for (id, held) in &blocking {
                ids.retain(|i| i != id);
                result.refused.push(Refusal {
                    id: id.to_string(),
                    reason: crate::deps::holds_back(*id, held),
                });
            }
        }
        if dry_run {
            result.ids = ids.iter().map(JobId::to_string).collect();
            if cascade {
                let roots: Vec<JobId> = blocking.iter().map(|(id, _)| *id).collect();
                result.cancelled = self.dependents_of(roots).await?;
            } else if release {
                let held: BTreeSet<JobId> = blocking.into_iter().flat_map(|(_, h)| h).collect();
                result.released = held.iter().map(JobId::to_string).collect();
            }
            return Ok(Response::Purge(result));
        }
        let by = author.to_string();
        for batch in ids.chunks(PURGE_BATCH) {
            if cascade {
                for (id, _) in blocking.iter().filter(|(id, _)| batch.contains(id)) {
                    let cancelled = self.cancel_dependents(*id, author, op).await?;
                    result.cancelled.extend(cancelled);
                }
            }
            let ids = batch.to_vec();
            let (outcome, moved): (BatchOutcome, Vec<JobId>) = if release {
                let by = by.clone();
                broker::request(|tx| BrokerMsg::PurgeReleasing(ids, by, tx), CALL).await??
            } else {
                let outcome = broker::request(|tx| BrokerMsg::Purge(ids, tx), CALL).await??;
                (outcome, Vec::new())
            };
            audit::jobs(author, op, &outcome.moved, "dead", "deleted");
            audit::jobs(
                author,
                op,
                &moved,
                "blocked",
                "released (its dead parent was purged with --release)",
            );
            result.purged += outcome.moved.len() as u64;
            result
                .ids
                .extend(outcome.moved.iter().map(JobId::to_string));
            result.refused.extend(refusals(&outcome.refused));
            result.released.extend(moved.iter().map(JobId::to_string));
        }
        Ok(Response::Purge(result))
    }

    /// The unfinished transitive dependents of `roots`, each once, in id order.
    async fn dependents_of(&self, roots: Vec<JobId>) -> Result<Vec<String>, ErrorBody> {
        let all: BTreeSet<JobId> = self
            .daemon
            .store
            .run(move |b| {
                let mut all = BTreeSet::new();
                for root in roots {
                    all.extend(b.dependents(root)?);
                }
                Ok(all)
            })
            .await
            .map_err(BrokerError::from)?;
        Ok(all.iter().map(JobId::to_string).collect())
    }
}

fn refusals(refused: &[(JobId, String)]) -> Vec<Refusal> {
    refused
        .iter()
        .map(|(id, reason)| Refusal {
            id: id.to_string(),
            reason: reason.clone(),
        })
        .collect()
}

/// Ids for a log line: the first ten, then how many more.
fn ids_text(ids: &[JobId]) -> String {
    let mut names: Vec<String> = ids
        .iter()
        .take(crate::deps::NAMED)
        .map(JobId::to_string)
        .collect();
    if ids.len() > crate::deps::NAMED {
        names.push(format!("and {} more", ids.len() - crate::deps::NAMED));
    }
    names.join(", ")
}
