//! The Broker on a store shared by several nodes (PostgreSQL): its memory is a view
//! of the store that other nodes change too, so the store decides and memory
//! follows.
//!
//! - **Finding work**: jobs other nodes enqueued, redrove or gave back are found by
//!   a look at the store's claimable jobs ([`BrokerMsg::Refresh`], sent by the
//!   Cluster actor when a notification arrives or its poll interval passes, and by
//!   the Broker itself after a look that found something or a lost claim). A look
//!   that read a queue whole also drops the waiting jobs it no longer offers: other
//!   nodes leased, finished, cancelled or purged them.
//!   A queue whose backlog the look did not read whole is read again per tenant
//!   (the oldest few jobs of each backlogged tenant), so every node sees every
//!   backlogged tenant and weighted fairness holds across nodes.
//! - **Claiming**: a lease is a conditional claim in the store; one that does not
//!   apply (another node took the job or changed it) drops the job from memory, and
//!   the lessee gets the next unclaimed job of the same tenant instead, if any
//!   ([`claim_others`], `SKIP LOCKED`). Any other change the store refused drops the
//!   job too: memory had a stale copy.
//! - **Tenants' caps across nodes**: a claim carries the `max_concurrency` of each
//!   capped tenant it names ([`ClaimRequest::caps`], from [`crate::limits::Limits`]),
//!   and the store grants at most what the cap leaves across every node
//!   ([`crate::store::SharedStore::claim_capped`]). A pick refused for its cap is
//!   not stale: it returns to its record before the lease, uncharged, and to its
//!   queue's dispatch, which holds the tenant at its cap until one of its leases ends here
//!   or the Cluster actor's next poll or heartbeat ([`BrokerMsg::AtCap`]).
//! - **Lessees' reports** (heartbeat, ack, nack, batch acks) of a lease memory does
//!   not hold are read from the store first, as operators' changes are, and
//!   applied to the stored lease, fenced by its token (`state/elsewhere.rs`).
//! - **Operators' changes** (redrive, purge, cancel) of jobs another node may have
//!   changed run on the store's current records: the jobs are read first
//!   ([`BrokerMsg::Reloaded`]). A cancel of a job another node runs ends its
//!   attempt in the store, conditioned on that lease's token.
//! - **Leases ended elsewhere**: at each heartbeat's sweep the Broker compares the
//!   leases it held when it asked with the store's: one the store no longer gives
//!   this node (cancelled on another node, or ended by the leader while this node
//!   was silent) is let go, and the queue's pool stops its attempt.
//! - **Leases of dead nodes**: the leader (see `cluster.rs`) asks its Broker to end
//!   them ([`BrokerMsg::Sweep`]); each is charged as an expired lease through the
//!   retry policy, in a write fenced by the leader's epoch.
//! - **Graceful shutdown**: once the pools drained, the leases this node still holds
//!   (external workers') are ended uncharged ([`BrokerMsg::ReleaseLeases`]), so a
//!   node that does not come back never gets them charged as expired.

use rand::Rng;
use tracing::{debug, error, warn};

use std::time::Duration;

use tokio::time::Instant;

use super::settle::Intent;
use super::{BrokerState, MAX_EXTEND, events};
use crate::broker::{BrokerError, BrokerMsg};
use crate::job::{self, Event, Failure, Job, JobId, State, Token, UnixMillis};
use crate::worker_pool::{self, PoolMsg};
use ractor::{ActorRef, RpcReplyPort};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::store::{Backend, Claim, DepthLock, LeaseKind, NewClaim, StoreError, TenantCap};

/// Claimable jobs a look at the store reads per queue, oldest first.
const REFRESH_WINDOW: u32 = 1000;

/// Claimable jobs a look reads of each backlogged tenant of a queue whose oldest
/// [`REFRESH_WINDOW`] did not hold it whole (fewer each when more tenants share
/// [`REFRESH_WINDOW`], at least one), so that a tenant whose jobs are all newer
/// than the window is still seen here and served at its weight.
const TENANT_HEADS: u32 = 100;

/// Expired leases the leader ends per sweep.
const SWEEP_BATCH: u32 = 500;

/// A pick the store did not claim: the job's record before the lease, and the
/// lease planned.
pub(in crate::broker) type Pick = (Job, Job);

/// A lease request's claim on a shared store: who claims, when, for how long, and
/// the caps of the capped tenants among its picks.
pub(in crate::broker) struct ClaimRequest {
    /// The queue of every pick.
    pub(in crate::broker) queue: Arc<str>,
    /// The lessee.
    pub(in crate::broker) worker: String,
    /// Now, Unix ms (the lease's start).
    pub(in crate::broker) now: UnixMillis,
    /// The lease's length.
    pub(in crate::broker) lease: Duration,
    /// The `max_concurrency` of each capped tenant among the picks (this queue's).
    pub(in crate::broker) caps: Vec<TenantCap>,
    /// Whose leases: an external worker's have their own stored end.
    pub(in crate::broker) kind: LeaseKind,
}

/// What a lease request's claim answered.
pub(in crate::broker) struct SharedClaim {
    /// Per pick, in order: its payload if the store leased it.
    pub(in crate::broker) payloads: Vec<Option<Vec<u8>>>,
    /// The picks refused because their tenant is at its cap across the cluster.
    pub(in crate::broker) at_cap: Vec<JobId>,
    /// Jobs claimed in place of picks another node took ([`claim_others`]).
    pub(in crate::broker) others: Vec<(Job, Vec<u8>)>,
}

impl SharedClaim {
    /// The answer of a store whose leases are local (no caps across nodes, no
    /// other node to lose a job to).
    pub(in crate::broker) fn local(payloads: Vec<Option<Vec<u8>>>) -> SharedClaim {
        SharedClaim {
            payloads,
            at_cap: Vec::new(),
            others: Vec::new(),
        }
    }
}

/// Claims `picks` (their leased records) within the caps of `request`, then, for
/// picks another node took first, other jobs of their tenants instead
/// ([`claim_others`]). Runs on the writer thread, in one transaction.
pub(in crate::broker) fn claim(
    b: &mut dyn Backend,
    request: &ClaimRequest,
    picks: &[Job],
) -> Result<SharedClaim, StoreError> {
    let shared = b.shared().ok_or_else(not_shared)?;
    let answers = shared.claim_capped_as(picks, request.lease, &request.caps, request.kind)?;
    let mut at_cap = Vec::new();
    let mut payloads = Vec::with_capacity(answers.len());
    for (job, answer) in picks.iter().zip(answers) {
        payloads.push(match answer {
            Claim::Leased(payload) => Some(payload),
            Claim::Lost => None,
            Claim::AtCap => {
                at_cap.push(job.id);
                None
            }
        });
    }
    let others = claim_others(b, request, picks, &payloads, &at_cap)?;
    Ok(SharedClaim {
        payloads,
        at_cap,
        others,
    })
}

/// For the picks the store did not claim (another node was first), claims as many
/// other jobs of the same queue and tenants instead, skipping rows another node is
/// claiming and keeping within each tenant's cap: a node that loses a race takes
/// the next job rather than an empty hand. A tenant with a pick refused for its cap
/// (`at_cap`) has no slot left: nothing more is claimed for it. Runs on the writer
/// thread, inside the claim's transaction.
fn claim_others(
    b: &mut dyn Backend,
    request: &ClaimRequest,
    picks: &[Job],
    claimed: &[Option<Vec<u8>>],
    at_cap: &[JobId],
) -> Result<Vec<(Job, Vec<u8>)>, StoreError> {
    let full: Vec<&str> = picks
        .iter()
        .filter(|j| at_cap.contains(&j.id))
        .map(|j| &*j.tenant)
        .collect();
    let mut lost: Vec<(&str, u32)> = Vec::new();
    for (job, _) in picks.iter().zip(claimed).filter(|(_, c)| c.is_none()) {
        if full.contains(&&*job.tenant) {
            continue;
        }
        match lost.iter_mut().find(|(t, _)| *t == &*job.tenant) {
            Some((_, n)) => *n += 1,
            None => lost.push((&job.tenant, 1)),
        }
    }
    let mut others = Vec::new();
    for (tenant, limit) in lost {
        let cap = request.caps.iter().find(|c| &*c.tenant == tenant);
        let next = NewClaim {
            queue: &request.queue,
            tenant: Some(tenant),
            limit,
            worker: &request.worker,
            now: request.now,
            lease: request.lease,
            cap: cap.map(|c| c.max),
        };
        others.extend(
            b.shared()
                .ok_or_else(not_shared)?
                .claim_next_as(&next, request.kind)?,
        );
    }
    Ok(others)
}

/// Pairs each job claimed instead ([`claim_others`]) with one unclaimed pick of
/// its tenant: answers (the picks replaced, the picks left unclaimed).
///
/// A job claimed instead may be one of the unclaimed picks itself (another node
/// let go of it between the two statements): it is paired with that pick first,
/// so the pick left unclaimed is never the job now leased.
pub(super) fn pair(unclaimed: Vec<Pick>, others: &[(Job, Vec<u8>)]) -> (Vec<Pick>, Vec<Pick>) {
    let mut left = unclaimed;
    let mut replaced = Vec::new();
    let mut rest: Vec<&Job> = Vec::new();
    for (other, _) in others {
        match left.iter().position(|(u, _)| u.id == other.id) {
            Some(pos) => replaced.push(left.remove(pos)),
            None => rest.push(other),
        }
    }
    for other in rest {
        if let Some(pos) = left.iter().position(|(u, _)| u.tenant == other.tenant) {
            replaced.push(left.remove(pos));
        }
    }
    (replaced, left)
}

/// Refuses, inside an enqueue's transaction, `adding` jobs to `queue` that would
/// take it past `max` jobs counted across every node ([`StoreError::QueueFull`]),
/// or when another node held the queue's depth lock too long
/// ([`StoreError::Busy`]). The queue's depth lock stays held until the
/// transaction ends, so no other node's enqueue is decided on a count without
/// these jobs. Runs on the writer thread.
pub(in crate::broker) fn within_depth(
    b: &mut dyn Backend,
    queue: &str,
    adding: u64,
    max: u64,
) -> Result<(), StoreError> {
    let depth = b.shared().ok_or_else(not_shared)?.queue_depth(queue)?;
    match depth {
        None => Err(StoreError::Busy(format!(
            "another node is deciding an enqueue to queue {queue:?}; retry"
        ))),
        Some(depth) if depth.saturating_add(adding) > max => Err(StoreError::QueueFull {
            queue: queue.to_owned(),
            depth,
            max,
        }),
        Some(_) => Ok(()),
    }
}

/// The `max_depth` checks of one enqueue (single, batch or a schedule's tick) on
/// a shared store, made in the enqueue's own transaction under the depth locks
/// ([`Self::locks`]) the writer takes up front: each queue's among the jobs (a
/// batch may span queues), then each tenant's that has a `max_depth`, in each of
/// its queues, counted across every node.
#[derive(Clone, Debug)]
pub(in crate::broker) struct DepthChecks {
    /// Each queue among the jobs: (queue, its jobs in this enqueue, its
    /// `max_depth`), in the order of first appearance.
    queues: Vec<(String, u64, u64)>,
    /// Each tenant among the jobs that has a `max_depth`, per queue: (queue,
    /// tenant, its jobs in that queue in this enqueue, its `max_depth`), in the
    /// order of first appearance.
    tenants: Vec<(String, String, u64, u64)>,
}

impl DepthChecks {
    /// The depth locks the checks take, for the writer to take first (it sorts
    /// every lock of its batch, so several queues are locked in one order too).
    pub(in crate::broker) fn locks(&self) -> Vec<DepthLock> {
        let queues = self
            .queues
            .iter()
            .map(|(queue, _, _)| DepthLock::Queue(queue.clone()));
        let tenants = self
            .tenants
            .iter()
            .map(|(queue, tenant, _, _)| DepthLock::Tenant(queue.clone(), tenant.clone()));
        queues.chain(tenants).collect()
    }

    /// Refuses, inside the enqueue's transaction, jobs past any of their queues'
    /// `max_depth` or any tenant's jobs past the tenant's ([`within_depth`],
    /// [`within_tenant_depth`]). Runs on the writer thread.
    pub(in crate::broker) fn check(&self, b: &mut dyn Backend) -> Result<(), StoreError> {
        for (queue, adding, max) in &self.queues {
            within_depth(b, queue, *adding, *max)?;
        }
        for (queue, tenant, adding, max) in &self.tenants {
            within_tenant_depth(b, queue, tenant, *adding, *max)?;
        }
        Ok(())
    }
}

/// [`within_depth`] for a tenant's `max_depth` in `queue`
/// ([`StoreError::TenantFull`]), under the tenant's own depth lock.
fn within_tenant_depth(
    b: &mut dyn Backend,
    queue: &str,
    tenant: &str,
    adding: u64,
    max: u64,
) -> Result<(), StoreError> {
    let depth = b
        .shared()
        .ok_or_else(not_shared)?
        .tenant_depth(queue, tenant)?;
    match depth {
        None => Err(StoreError::Busy(format!(
            "another node is deciding an enqueue of tenant {tenant:?} to queue {queue:?}; retry"
        ))),
        Some(depth) if depth.saturating_add(adding) > max => Err(StoreError::TenantFull {
            queue: queue.to_owned(),
            tenant: tenant.to_owned(),
            depth,
            max,
        }),
        Some(_) => Ok(()),
    }
}

/// The error of a shared operation on a store that is not shared.
fn not_shared() -> StoreError {
    StoreError::Other("the store is not shared by several nodes".into())
}

impl BrokerState {
    /// Whether the store is shared by several nodes (its leases are not this
    /// process's alone).
    pub(in crate::broker) fn shared(&self) -> bool {
        !self.leases_are_local
    }

    /// On a shared store, what an enqueue of `jobs` is checked against in the
    /// store ([`DepthChecks`]): the `max_depth` of each of their queues and that of
    /// each tenant among them that has one. `None` elsewhere, or when no job's
    /// queue is configured (its enqueue is refused before it is written).
    pub(in crate::broker) fn depth_check<'a>(
        &self,
        jobs: impl IntoIterator<Item = &'a Job>,
    ) -> Option<DepthChecks> {
        if !self.shared() {
            return None;
        }
        let mut queues: Vec<(String, u64, u64)> = Vec::new();
        let mut tenants: Vec<(String, String, u64, u64)> = Vec::new();
        for job in jobs {
            let Some(config) = self.config.queues.get(&*job.queue) else {
                continue;
            };
            match queues.iter_mut().find(|(q, _, _)| **q == *job.queue) {
                Some(seen) => seen.1 += 1,
                None => queues.push((job.queue.to_string(), 1, config.max_depth)),
            }
            let seen = tenants
                .iter_mut()
                .find(|(q, t, _, _)| **q == *job.queue && **t == *job.tenant);
            if let Some(seen) = seen {
                seen.2 += 1;
            } else if let Some(max) = self.limits.tenant(&job.tenant).max_depth {
                tenants.push((job.queue.to_string(), job.tenant.to_string(), 1, max));
            }
        }
        (!queues.is_empty()).then_some(DepthChecks { queues, tenants })
    }

    /// The `max_concurrency` in `queue` of each capped tenant among `jobs`, as the
    /// store enforces it across the cluster ([`ClaimRequest::caps`]).
    pub(in crate::broker) fn caps(&self, queue: &Arc<str>, jobs: &[Job]) -> Vec<TenantCap> {
        let mut seen: Vec<&Arc<str>> = Vec::new();
        let mut caps = Vec::new();
        for job in jobs {
            if seen.contains(&&job.tenant) {
                continue;
            }
            seen.push(&job.tenant);
            if let Some(max) = self.limits.tenant_cap(queue, &job.tenant) {
                caps.push(TenantCap {
                    queue: queue.clone(),
                    tenant: job.tenant.clone(),
                    max,
                });
            }
        }
        caps
    }

    /// Takes back leases the store refused because their tenant is at its cap
    /// across the cluster, each given as the job's record before the lease and the
    /// lease planned. Unlike a lost claim the job is not stale (the store did not
    /// change it): each job memory still holds under that very lease returns to
    /// its earlier record uncharged and goes back to its queue's dispatch, which holds the
    /// tenant at its cap ([`events::at_cap`]).
    pub(in crate::broker) fn at_cap(&mut self, refused: Vec<(Job, Job)>) {
        for (job, planned) in refused {
            if self.jobs.get(job.id).is_none_or(|c| c != planned) {
                continue;
            }
            debug!(queue = %job.queue, tenant = %job.tenant, job = %job.id, "Lease refused: the tenant is at its max_concurrency across the cluster.");
            self.replace(job.clone());
            events::at_cap(&mut self.dispatches, &job);
        }
    }

    /// Looks for claimable jobs in the store, unless a look is under way (then one
    /// more follows it).
    pub(in crate::broker) fn refresh(&mut self) {
        if !self.shared() {
            return;
        }
        if self.refreshing {
            self.refresh_again = true;
            return;
        }
        self.refreshing = true;
        let queues: Vec<String> = self.config.queues.keys().cloned().collect();
        self.write(
            move |b| {
                let shared = b.shared().ok_or_else(not_shared)?;
                let mut jobs = shared.claimable(&queues, REFRESH_WINDOW)?;
                let mut read: HashMap<&str, usize> = HashMap::new();
                for job in &jobs {
                    *read.entry(&*job.queue).or_default() += 1;
                }
                let cut: Vec<String> = queues
                    .iter()
                    .filter(|q| {
                        read.get(q.as_str()).copied().unwrap_or(0) >= REFRESH_WINDOW as usize
                    })
                    .cloned()
                    .collect();
                if !cut.is_empty() {
                    let seen: HashSet<JobId> = jobs.iter().map(|j| j.id).collect();
                    let heads = shared.tenant_heads(&cut, TENANT_HEADS, REFRESH_WINDOW)?;
                    jobs.extend(heads.into_iter().filter(|j| !seen.contains(&j.id)));
                }
                Ok(jobs)
            },
            move |result, back| {
                back(BrokerMsg::Refreshed(result));
            },
        );
    }

    /// A look at the store answered: adopts the jobs memory did not know (or knew
    /// in an older state), and looks again at once if it found any.
    pub(in crate::broker) fn refreshed(
        &mut self,
        result: Result<Vec<Job>, StoreError>,
        now: UnixMillis,
    ) {
        self.refreshing = false;
        let found = match result {
            Ok(jobs) => {
                self.forget_gone(&jobs);
                jobs.into_iter()
                    .filter(|j| self.adopt(j.clone(), now))
                    .count()
            }
            Err(err) => {
                debug!(error = %err, "Looking for other nodes' jobs failed; the next poll tries again.");
                0
            }
        };
        if found > 0 || std::mem::take(&mut self.refresh_again) {
            self.refresh();
        }
    }

    /// Drops the ready and delayed jobs memory holds of each queue this look read
    /// whole (fewer rows than [`REFRESH_WINDOW`]) that the store no longer offers:
    /// another node leased, finished, cancelled or purged them, which sends no
    /// notification, and without this memory would count them for `max_depth`
    /// forever. A job with a write in flight is left to that write; a job this node
    /// wrote after the look was read cannot be missed by it, since the writer thread
    /// answers in order and the job enters memory only with its write's answer.
    fn forget_gone(&mut self, found: &[Job]) {
        let mut read: HashMap<&str, usize> = HashMap::new();
        for job in found {
            *read.entry(&*job.queue).or_default() += 1;
        }
        let offered: HashSet<JobId> = found.iter().map(|j| j.id).collect();
        let whole = |queue: &str| read.get(queue).copied().unwrap_or(0) < REFRESH_WINDOW as usize;
        let gone: Vec<JobId> = self
            .config
            .queues
            .keys()
            .filter(|queue| whole(queue))
            .flat_map(|queue| self.jobs.in_queue(queue))
            .filter(|b| matches!(b.state, State::Ready | State::Delayed))
            .map(|b| b.id)
            .filter(|id| !offered.contains(id) && !self.writing.contains(id))
            .collect();
        for id in gone {
            if let Some(job) = self.jobs.get(id) {
                self.drop_stale(&job);
            }
        }
    }

    /// Takes a stored record into memory unless memory holds this node's lease of
    /// it or a write of it is in flight; answers whether memory changed. A record
    /// leased by another node is not kept (that node owns it until its lease ends).
    fn adopt(&mut self, stored: Job, now: UnixMillis) -> bool {
        if self.writing.contains(&stored.id) {
            return false;
        }
        let known = self.jobs.get(stored.id);
        match &known {
            Some(k) if k.state == State::Leased => return false,
            Some(k) if k.state == stored.state && k.lease_seq == stored.lease_seq => return false,
            _ => {}
        }
        if stored.state == State::Leased || (stored.state.is_final() && stored.state != State::Dead)
        {
            if let Some(known) = known {
                self.drop_stale(&known);
            }
            return false;
        }
        let queue = self.intern(&stored.queue);
        let tenant = self.intern(&stored.tenant);
        let job = Job {
            queue,
            tenant,
            ..stored
        };
        self.replace(job.clone());
        match known {
            Some(old) => events::changed(&mut self.dispatches, &old, &job, now),
            None if matches!(job.state, State::Ready | State::Delayed) => {
                events::ready(&mut self.dispatches, &job)
            }
            None => {}
        }
        true
    }

    /// On a shared store, drops memory's copy of `id` if it is waiting or blocked:
    /// such a job is the database's alone (any node may release it), so a copy an
    /// operator's change read in ([`Self::reload_then`]) would go stale.
    pub(in crate::broker) fn forget_held(&mut self, id: JobId) {
        if !self.shared() {
            return;
        }
        if let Some(job) = self.jobs.get(id).filter(|j| j.state.is_held()) {
            self.drop_stale(&job);
        }
    }

    /// Drops a job memory held in a state the store no longer has (another node
    /// changed it): its queue's dispatch forgets it or, if it was leased here, frees its slot.
    pub(in crate::broker) fn drop_stale(&mut self, job: &Job) {
        debug!(queue = %job.queue, job = %job.id, state = %job.state, "Dropped a stale copy: another node changed the job.");
        if let Some(gone) = self.jobs.remove(job.id) {
            self.account(&gone, false);
        }
        self.hot.forget(job.id);
        events::dropped(&mut self.dispatches, job);
    }

    /// Reads the current records of `ids` before an operator's change, then handles
    /// `then` on them ([`BrokerMsg::Reloaded`]).
    pub(in crate::broker) fn reload_then(&mut self, ids: Vec<JobId>, then: BrokerMsg) {
        self.write(
            move |b| b.shared().ok_or_else(not_shared)?.reload(&ids),
            move |result, back| {
                back(BrokerMsg::Reloaded(result, Box::new(then)));
            },
        );
    }

    /// The records of an operator's change were read: memory takes them, then the
    /// change runs on them. A job leased by another node cannot be cancelled here.
    pub(in crate::broker) fn reloaded(
        &mut self,
        result: Result<Vec<Job>, StoreError>,
        then: BrokerMsg,
        now: UnixMillis,
        mono: tokio::time::Instant,
    ) {
        let jobs = match result {
            Ok(jobs) => jobs,
            Err(err) => {
                warn!(error = %err, "Reading jobs before an operator's change failed; it runs on memory's view.");
                Vec::new()
            }
        };
        let mut leased_elsewhere: Vec<Job> = jobs
            .iter()
            .filter(|j| j.state == State::Leased)
            .filter(|j| {
                self.jobs
                    .get(j.id)
                    .is_none_or(|k| k.state != State::Leased || k.lease_seq != j.lease_seq)
            })
            .cloned()
            .collect();
        for job in jobs {
            self.adopt(job, now);
        }
        match then {
            BrokerMsg::Cancel(id, by, reply) if leased_elsewhere.iter().any(|j| j.id == id) => {
                let at = leased_elsewhere.iter().position(|j| j.id == id);
                let lease = leased_elsewhere.swap_remove(at.unwrap_or_default());
                self.cancel_elsewhere(lease, &by, reply, now);
            }
            // A lessee's report of a lease memory did not hold: applied to the
            // stored lease (see `state/elsewhere.rs`).
            BrokerMsg::Heartbeat(id, token, extend, reply) => {
                self.heartbeat_any((id, token), extend, &leased_elsewhere, reply, now, mono)
            }
            BrokerMsg::Ack(id, token, reply) => self.ack(id, token, &leased_elsewhere, reply, now),
            BrokerMsg::AckResult(id, token, result, reply) => {
                self.ack_result(id, token, Some(result), &leased_elsewhere, reply, now)
            }
            BrokerMsg::AckBatch(acks, reply) => self.ack_batch(acks, &leased_elsewhere, reply, now),
            BrokerMsg::Nack(id, token, failure, reply) => {
                self.fail_on(id, token, failure, &leased_elsewhere, Some(reply), now)
            }
            then => self.dispatch(then, now, mono),
        }
    }

    /// An operator's cancel of a job another node runs: its attempt ends `cancelled`
    /// in the store, conditioned on that lease's token (a lease that ended meanwhile
    /// is left alone, and the cancel answers the store's refusal). The node running
    /// it lets go of the lease at its next heartbeat and stops its worker
    /// ([`Self::let_go`]). Answers [`State::Leased`], the state it was cancelled from.
    fn cancel_elsewhere(
        &mut self,
        lease: Job,
        by: &str,
        reply: RpcReplyPort<Result<State, BrokerError>>,
        now: UnixMillis,
    ) {
        let lease = Job {
            queue: self.intern(&lease.queue),
            tenant: self.intern(&lease.tenant),
            ..lease
        };
        let backoff = self
            .queue(&lease.queue)
            .map_or(super::FALLBACK_BACKOFF, |q| q.backoff);
        let event = Event::Cancel { by: by.to_string() };
        match job::apply(&lease, event, &backoff, now) {
            Ok(t) => self.commit(Intent::CancelElsewhere, vec![(lease, t)], move |r| {
                let _ = reply.send(r.map(|()| State::Leased).map_err(BrokerError::from));
            }),
            Err(err) => self.answer(reply, Err(err.into())),
        }
    }

    /// A lease request got other jobs in place of picks another node took first
    /// ([`claim_others`]): the picks leave memory, their dispatch slots pass to the
    /// jobs taken instead, which memory now holds as this node's leases.
    pub(in crate::broker) fn substituted(
        &mut self,
        replaced: Vec<(Job, Job)>,
        taken: Vec<Job>,
        mono: Instant,
    ) {
        for (pick, planned) in replaced {
            // Only the lease planned for this request: another request's lease of the
            // job (a job taken instead) stays.
            if self.jobs.get(pick.id).as_ref() == Some(&planned)
                && let Some(gone) = self.jobs.remove(pick.id)
            {
                self.account(&gone, false);
            }
        }
        for job in taken {
            let job = Job {
                queue: self.intern(&job.queue),
                tenant: self.intern(&job.tenant),
                ..job
            };
            if let Some(known) = self.jobs.get(job.id) {
                events::dropped(&mut self.dispatches, &known);
            }
            let lease = self.queue(&job.queue).map_or(MAX_EXTEND, |q| q.lease);
            self.deadlines.track(job.id, job.lease_seq, mono + lease);
            self.replace(job);
        }
    }

    /// At each heartbeat: reads this node's leases in the store (checked against
    /// memory) and, on the leader of `epoch`, the leases that ended without their
    /// holder.
    pub(in crate::broker) fn sweep(&mut self, epoch: Option<u64>, now: UnixMillis) {
        if !self.shared() || self.sweeping {
            return;
        }
        self.sweeping = true;
        // The leases memory holds now, planned before this message: their claims
        // were submitted before this read, so the read shows each one unless
        // something else ended it in the store. Each is named by its token and when
        // it was planned, since a lease taken back uncharged (e.g. refused for its
        // tenant's cap) and planned again carries the same token.
        let held: Vec<(JobId, Token, UnixMillis)> = self
            .deadlines
            .leases()
            .filter(|(id, _)| !self.writing.contains(id))
            .filter_map(|(id, token)| {
                let job = self.jobs.get(id)?;
                let at = job.leased_at?;
                (job.state == State::Leased && job.lease_seq == token && at < now)
                    .then_some((id, token, at))
            })
            .collect();
        self.write(
            move |b| {
                let shared = b.shared().ok_or_else(not_shared)?;
                let own = shared.own_leases()?;
                let expired = match epoch {
                    Some(_) => shared.expired_leases(SWEEP_BATCH)?,
                    None => Vec::new(),
                };
                Ok((own, expired))
            },
            move |result, back| {
                back(BrokerMsg::Swept(epoch, held, result));
            },
        );
    }

    /// Ends this node's leases the store holds and memory does not (their holder is
    /// gone: uncharged), then, on the leader, the expired leases of other nodes
    /// (charged as expired leases, in a write fenced by `epoch`).
    pub(in crate::broker) fn swept(
        &mut self,
        epoch: Option<u64>,
        held: Vec<(JobId, Token, UnixMillis)>,
        result: Result<(Vec<Job>, Vec<Job>), StoreError>,
        now: UnixMillis,
    ) {
        self.sweeping = false;
        let (own, expired) = match result {
            Ok(found) => found,
            Err(err) => {
                warn!(error = %err, "Checking leases in the store failed; the next heartbeat tries again.");
                return;
            }
        };
        let stored: HashSet<(JobId, Token)> = own.iter().map(|j| (j.id, j.lease_seq)).collect();
        self.let_go(held, &stored);
        let orphans: Vec<Job> = own
            .into_iter()
            .filter(|lease| {
                !self.writing.contains(&lease.id)
                    && self
                        .jobs
                        .get(lease.id)
                        .is_none_or(|j| j.state != State::Leased)
            })
            .collect();
        if !orphans.is_empty() {
            error!(
                leases = orphans.len(),
                "Leases of this node in the store that no worker of it holds; ending them uncharged."
            );
            let failure = |_: &Job| Failure::Interrupted {
                reason: "its lease was held in the store by no worker of its node".into(),
            };
            self.end_foreign(orphans, Intent::Orphan, failure, now);
        }
        if let Some(epoch) = epoch {
            let failure = |lease: &Job| Failure::LeaseExpired {
                reason: format!(
                    "lease held by {} ended without its node (the node stopped \
                     heartbeating or its lease passed)",
                    lease.worker.as_deref().unwrap_or("a worker")
                ),
            };
            self.end_foreign(expired, Intent::Expire(epoch), failure, now);
        }
    }

    /// Lets go of leases memory held when the sweep asked that the store no longer
    /// gives this node (`stored`): an operator on another node cancelled the job, or
    /// the leader ended the lease while this node was silent. Memory drops them
    /// (freeing their dispatch slots) and the queue's pool stops the attempt; an
    /// external lessee learns it from its next heartbeat or report.
    fn let_go(&mut self, held: Vec<(JobId, Token, UnixMillis)>, stored: &HashSet<(JobId, Token)>) {
        for (id, token, at) in held {
            if stored.contains(&(id, token)) || self.writing.contains(&id) {
                continue;
            }
            // The very lease the sweep saw, not one planned again since.
            let Some(job) = self.jobs.get(id).filter(|j| {
                j.state == State::Leased && j.lease_seq == token && j.leased_at == Some(at)
            }) else {
                continue;
            };
            warn!(queue = %job.queue, job = %id, worker = job.worker.as_deref().unwrap_or(""),
                "A lease of this node was ended in the store by another node (cancelled there, or expired while this node was silent); its attempt stops.");
            self.deadlines.untrack(id);
            self.drop_stale(&job);
            if let Some(pool) = ActorRef::<PoolMsg>::where_is(worker_pool::name(&job.queue)) {
                let _ = pool.cast(PoolMsg::Revoke(id));
            }
        }
    }

    /// At a graceful shutdown, once the pools drained: ends every lease memory holds
    /// without a write in flight as an interrupted attempt (uncharged, fenced by its
    /// token), so the leader never charges it as expired once this node is gone.
    /// Its lessee's next report is refused as stale. A no-op on a store only this
    /// node writes: its leases die with the process and are never charged.
    pub(in crate::broker) fn release_leases(&mut self, now: UnixMillis) {
        if !self.shared() {
            return;
        }
        let held: Vec<(JobId, Token)> = self
            .deadlines
            .leases()
            .filter(|(id, _)| !self.writing.contains(id))
            .collect();
        for (id, token) in held {
            let reason = "its node shut down while the lease was held".to_owned();
            self.fail(id, token, Failure::Interrupted { reason }, None, now);
        }
    }

    /// Ends leases memory does not hold (read from the store), each through the
    /// retry policy with `failure`, in one write of `intent`.
    fn end_foreign(
        &mut self,
        leases: Vec<Job>,
        intent: Intent,
        failure: impl Fn(&Job) -> Failure,
        now: UnixMillis,
    ) {
        let mut planned = Vec::new();
        for lease in leases {
            let lease = Job {
                queue: self.intern(&lease.queue),
                tenant: self.intern(&lease.tenant),
                ..lease
            };
            if self.writing.contains(&lease.id) {
                continue;
            }
            if let Some(known) = self.jobs.get(lease.id) {
                if known.state == State::Leased {
                    continue;
                }
                self.drop_stale(&known);
            }
            let backoff = self
                .queue(&lease.queue)
                .map_or(super::FALLBACK_BACKOFF, |q| q.backoff);
            let event = Event::Fail {
                token: lease.lease_seq,
                jitter: self.rng.random::<f64>(),
                failure: failure(&lease),
            };
            match job::apply(&lease, event, &backoff, now) {
                Ok(t) => planned.push((lease, t)),
                Err(err) => debug!(job = %lease.id, error = %err, "A lease could not be ended."),
            }
        }
        if planned.is_empty() {
            return;
        }
        let n = planned.len();
        self.commit_each(intent, planned, move |result| {
            if let Ok(applied) = result {
                let ended = applied.iter().filter(|a| **a).count();
                tracing::info!(found = n, ended, "Leases ended without their holder.");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::NewJob;

    fn job(tenant: &str) -> Job {
        let new = NewJob {
            queue: "q".into(),
            tenant: tenant.into(),
            idempotency_key: None,
            delay: Duration::ZERO,
            max_attempts: 3,
            priority_ms: 0,
        };
        Job::new(new, 1_000)
    }

    fn ids(jobs: &[(Job, Job)]) -> Vec<crate::job::JobId> {
        jobs.iter().map(|(j, _)| j.id).collect()
    }

    #[test]
    fn a_job_claimed_instead_replaces_its_own_pick_first_then_one_of_its_tenant() {
        let (x, y, z) = (job("a"), job("a"), job("b"));
        // y itself came back (another node let go of it), and a job w of tenant b.
        let w = job("b");
        let others = vec![(w.clone(), Vec::new()), (y.clone(), Vec::new())];
        let picks = |jobs: &[&Job]| -> Vec<(Job, Job)> {
            jobs.iter().map(|j| ((*j).clone(), (*j).clone())).collect()
        };
        let (replaced, left) = pair(picks(&[&x, &y, &z]), &others);
        assert_eq!(ids(&replaced), vec![y.id, z.id]);
        assert_eq!(
            ids(&left),
            vec![x.id],
            "the pick left unclaimed is never a job now leased"
        );
        // With nothing of its tenant left, a job claimed instead replaces nothing.
        let (replaced, left) = pair(picks(&[&x]), &[(w, Vec::new())]);
        assert!(replaced.is_empty());
        assert_eq!(ids(&left), vec![x.id]);
    }
}
