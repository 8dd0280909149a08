//! Weighted fair choice between tenants within one queue: the pure data structure
//! behind each queue's dispatch (`broker/dispatch.rs`; no async, no clock, no I/O).
//!
//! [`FairQueue`] holds the order of the queue's *ready* jobs (ids and ready times
//! only, no payloads), per tenant, oldest `ready_at` first, and decides which job a
//! free worker gets next. The jobs' states belong to the Broker, which hands each
//! ready job here once and refuses a lease of a job that is no longer ready, so this
//! keeps no index of ids: a removal names the job's tenant and ready time. Tenants are
//! served by **weighted deficit round robin** (M. Shreedhar and G. Varghese,
//! "Efficient Fair Queuing using Deficit Round Robin", SIGCOMM 1995): every round a
//! backlogged tenant earns `quantum × weight` of credit (its *deficit* counter) and is
//! served while its credit covers the cost of a job. With `Fairness::Jobs` a job costs
//! 1 and the quantum is 1, so each turn serves exactly `weight` jobs.
//!
//! Rounds are *virtual*: the active tenants sit in a calendar keyed by `(round of
//! their next turn, order of arrival)`. A tenant whose credit is short (in
//! `Fairness::Runtime`, after a 10-minute job was charged) is put `k` rounds ahead at
//! once with `k` quanta of credit, instead of being visited `k` times. This is the same
//! schedule DRR produces, but skipping empty visits costs one O(log tenants) calendar
//! move, so a pop is O(log tenants) and never depends on the number of queued jobs.
//!
//! Guarantees (tested in `fair/tests.rs` and `fair/proptests.rs`):
//! - **Work-conserving**: `pop` returns `None` with jobs queued only when every
//!   backlogged tenant is at its `max_concurrency`. A tenant in debt is still served
//!   when nobody else can be (its rounds are skipped forward).
//! - **No credit while idle**: a tenant whose backlog empties leaves the calendar and
//!   keeps no positive credit; on return it earns one quantum, so no burst. A Runtime
//!   debt is kept but forgiven at one quantum × weight per round that passed meanwhile.
//! - **Caps**: a tenant at its cap is *parked* (out of the calendar, credit kept) and
//!   rejoins at the end of the current round when a job of its ends or its cap is raised.
//!   On a store shared by several nodes the cap counts every node's leases, which
//!   only the store knows: a job the store refused for its tenant's cap comes back
//!   ([`FairQueue::at_cap`]) and the tenant is *held* (parked as if at its cap) until
//!   a job of its ends here, its limits change, or [`FairQueue::reopen`] (the
//!   cluster's poll), so a tenant capped elsewhere is not picked again and again.
//! - **Priority within a tenant**: a job pushed with a priority
//!   ([`FairQueue::push_prioritized`]) ranks among its tenant's jobs by
//!   `ready_at - priority` instead of `ready_at` (a tenant's jobs come out in
//!   `(order key, id)` order); which tenant is served is decided as before, so a
//!   priority never takes a turn from another tenant. Prioritized jobs wait in a
//!   second backlog per tenant; the queue age ([`FairQueue::oldest_ready_at`])
//!   stays the oldest real `ready_at`.
//! - **Runtime fairness**: in `Fairness::Runtime` a pop pre-charges an estimate (the
//!   tenant's moving average run time); `finish` refunds it and charges the measured
//!   run time, so the long-run charge is exactly the run time.
//!
//! Costs: `push` and `pop` are O(1) hash work (of the tenant name) plus
//! O(log tenants), plus O(log m) for the m jobs of a tenant pushed out of `ready_at`
//! order; `remove` adds O(log m + k) for the k jobs of the tenant ready in the same
//! millisecond. `extend` of a sorted list into an idle tenant is O(1) per tenant
//! (the list becomes its deque). `len` and `running` are O(1); `oldest_ready_at` is
//! O(log tenants); `tenant_stats` is O(tenants log tenants), meant for a
//! once-a-second metrics or `qctl` call. Memory per queued job: one 24-byte deque
//! entry plus deque slack (at most twice that while a drained deque has not shrunk).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::job::{JobId, UnixMillis};

mod backlog;
#[cfg(test)]
mod priority_tests;
#[cfg(test)]
mod proptests;
mod tenant;
#[cfg(test)]
mod tests;

use tenant::{Place, Tenant, Turn};

/// What a tenant's share is measured in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fairness {
    /// Each dispatched job costs 1.
    #[default]
    Jobs,
    /// Each job costs its measured run time, charged when it ends.
    Runtime,
}

/// A tenant's scheduling limits (config `[tenants.NAME]`, `qctl limits set`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    /// Share relative to other tenants (>= 1; a 0 is read as 1 so no tenant is starved
    /// by a typo and no division by zero can happen).
    pub weight: u32,
    /// Most jobs of this tenant running at once in this queue; `None` = unlimited,
    /// `Some(0)` = hold the tenant's jobs.
    pub max_concurrency: Option<u32>,
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            weight: 1,
            max_concurrency: None,
        }
    }
}

/// One tenant's counters, as reported by [`FairQueue::tenant_stats`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantStats {
    /// Tenant name.
    pub tenant: Arc<str>,
    /// Ready jobs queued here.
    pub ready: usize,
    /// Jobs counted as running (popped or `start_running`, not yet finished).
    pub running: u32,
    /// Effective weight.
    pub weight: u32,
    /// Effective concurrency cap.
    pub max_concurrency: Option<u32>,
}

/// What a prioritized job's order key is shifted by in its backlog, which keeps
/// keys non-negative: the largest priority (one day, ms), so `ready_at - priority +
/// PRIORITY_SHIFT >= ready_at >= 0`.
const PRIORITY_SHIFT: UnixMillis = 86_400_000;

/// Credit per weight unit per round with `Fairness::Jobs`: one job.
const JOBS_QUANTUM: i64 = 1;
/// Credit per weight unit per round with `Fairness::Runtime`: 1 ms, in microseconds.
/// Small, so tenants interleave finely; rounds are virtual, so it costs nothing.
const RUNTIME_QUANTUM_US: i64 = 1_000;
/// Longest run time charged for one job (1 day, µs), so a bogus duration cannot
/// overflow the arithmetic.
const MAX_CHARGE_US: i64 = 86_400 * 1_000_000;

/// The ready jobs of one queue, handed out by weighted deficit round robin between
/// tenants. See the module docs for guarantees and costs.
#[derive(Debug)]
pub struct FairQueue {
    fairness: Fairness,
    default_limits: TenantLimits,
    /// Limits set explicitly per tenant; survive `clear` and idle tenants.
    limits: HashMap<Arc<str>, TenantLimits>,
    /// Tenant table; slots of dropped tenants are reused through `free`.
    tenants: Vec<Tenant>,
    free: Vec<u32>,
    by_name: HashMap<Arc<str>, u32>,
    /// Ready jobs queued, over all tenants.
    len: usize,
    /// Backlogged, uncapped tenants by their next turn.
    calendar: BTreeMap<Turn, u32>,
    /// Each backlogged tenant's oldest ready time among its jobs without a priority.
    oldest: BTreeSet<(UnixMillis, u32)>,
    /// Each queued job with a priority: its `ready_at` and its shifted order key
    /// (its place in its tenant's `boosted` backlog).
    boosts: HashMap<JobId, (UnixMillis, UnixMillis)>,
    /// The ready times of the queued jobs with a priority, for the queue's age.
    boost_ages: BTreeSet<(UnixMillis, JobId)>,
    /// The round of the turn served last.
    round: u64,
    next_seq: u64,
    /// Whether some tenant may be held at its cap across the cluster (so
    /// [`Self::reopen`] has work to do).
    holding: bool,
    /// Runtime mode: queue-wide moving average run time (µs), the estimate for a
    /// tenant not measured yet.
    avg_run_us: Option<i64>,
}

impl Default for FairQueue {
    fn default() -> Self {
        FairQueue::new(Fairness::default())
    }
}

impl FairQueue {
    /// An empty queue measuring shares in `fairness`.
    pub fn new(fairness: Fairness) -> Self {
        FairQueue {
            fairness,
            default_limits: TenantLimits::default(),
            limits: HashMap::new(),
            tenants: Vec::new(),
            free: Vec::new(),
            by_name: HashMap::new(),
            len: 0,
            calendar: BTreeMap::new(),
            oldest: BTreeSet::new(),
            boosts: HashMap::new(),
            boost_ages: BTreeSet::new(),
            round: 0,
            next_seq: 0,
            holding: false,
            avg_run_us: None,
        }
    }

    /// Switches between job-count and run-time fairness. All credit and debt is reset
    /// (the units differ); backlogged tenants keep their order. O(tenants).
    pub fn set_fairness(&mut self, fairness: Fairness) {
        if fairness == self.fairness {
            return;
        }
        self.fairness = fairness;
        let order: Vec<u32> = self.calendar.values().copied().collect();
        self.calendar.clear();
        let known: Vec<u32> = self.by_name.values().copied().collect();
        for t in known {
            let tenant = &mut self.tenants[t as usize];
            tenant.deficit = 0;
            tenant.outstanding = 0;
            if tenant.place == Place::Idle {
                self.drop_if_unused(t);
            }
        }
        for t in order {
            self.enqueue_turn(t);
        }
    }

    /// Sets one tenant's weight and cap; they apply from the next `pop`. A weight of 0
    /// is read as 1.
    pub fn set_limits(&mut self, tenant: &str, limits: TenantLimits) {
        let limits = normalized(limits);
        let name: Arc<str> = Arc::from(tenant);
        self.limits.insert(name, limits);
        if let Some(&t) = self.by_name.get(tenant) {
            self.apply_limits(t, limits);
        }
    }

    /// Drops the explicit limits of every tenant for which `keep` is false (their
    /// override was reset, or the tenant left the config): they get the default
    /// limits again from the next `pop`. O(tenants with explicit limits).
    pub fn retain_limits(&mut self, keep: impl Fn(&str) -> bool) {
        let dropped: Vec<Arc<str>> = self
            .limits
            .keys()
            .filter(|name| !keep(name))
            .cloned()
            .collect();
        for name in dropped {
            self.limits.remove(&name);
            if let Some(&t) = self.by_name.get(&name) {
                self.apply_limits(t, self.default_limits);
            }
        }
    }

    /// Sets the limits of every tenant without explicit ones (initially weight 1, no
    /// cap). O(tenants).
    pub fn set_default_limits(&mut self, limits: TenantLimits) {
        self.default_limits = normalized(limits);
        let implicit: Vec<u32> = self
            .by_name
            .iter()
            .filter(|(name, _)| !self.limits.contains_key(*name))
            .map(|(_, &t)| t)
            .collect();
        for t in implicit {
            self.apply_limits(t, self.default_limits);
        }
    }

    /// A job of `tenant` became ready at `ready_at` (Unix ms). The caller hands each
    /// job once (a job pushed twice would be popped twice; the Broker refuses the
    /// second lease and releases its slot).
    pub fn push(&mut self, tenant: Arc<str>, id: JobId, ready_at: UnixMillis) {
        let t = self.tenant_slot(tenant);
        self.tenants[t as usize].backlog.push(id, ready_at);
        self.queued(t, 1);
    }

    /// A job of `tenant` became ready at `ready_at` (Unix ms) with a priority of
    /// `priority_ms` (clamped to ±1 day): it ranks among the tenant's jobs as if it
    /// had become ready `priority_ms` earlier. A zero priority is [`Self::push`].
    pub fn push_prioritized(
        &mut self,
        tenant: Arc<str>,
        id: JobId,
        ready_at: UnixMillis,
        priority_ms: i64,
    ) {
        if priority_ms == 0 {
            return self.push(tenant, id, ready_at);
        }
        let t = self.tenant_slot(tenant);
        self.file_boosted(t, id, ready_at, priority_ms);
        self.queued(t, 1);
    }

    /// Files a prioritized job in the `boosted` backlog of slot `t` and the indexes.
    fn file_boosted(&mut self, t: u32, id: JobId, ready_at: UnixMillis, priority_ms: i64) {
        let ready_at = ready_at.max(0);
        let priority = priority_ms.clamp(-PRIORITY_SHIFT, PRIORITY_SHIFT);
        let key = ready_at - priority + PRIORITY_SHIFT;
        self.tenants[t as usize].boosted.push(id, key);
        if let Some((old_at, _)) = self.boosts.insert(id, (ready_at, key)) {
            // Handed over twice (the caller's bug): keep the indexes consistent.
            self.boost_ages.remove(&(old_at, id));
        }
        self.boost_ages.insert((ready_at, id));
    }

    /// Forgets the prioritized job `id` (popped or removed); returns its entry.
    fn unfile_boosted(&mut self, id: JobId) -> Option<(UnixMillis, UnixMillis)> {
        let (ready_at, key) = self.boosts.remove(&id)?;
        self.boost_ages.remove(&(ready_at, id));
        Some((ready_at, key))
    }

    /// Many jobs of `tenant` became ready (a resync): the same as [`Self::push`] of
    /// each in order, with one tenant lookup for the lot. For `jobs` sorted by
    /// `ready_at` and a tenant with nothing queued (a resync) it is O(1): the list
    /// becomes the tenant's backlog without a copy.
    pub fn extend(&mut self, tenant: Arc<str>, jobs: Vec<(JobId, UnixMillis)>) {
        if jobs.is_empty() {
            return;
        }
        let n = jobs.len();
        let t = self.tenant_slot(tenant);
        self.tenants[t as usize].backlog.extend(jobs);
        self.queued(t, n);
    }

    /// `n` jobs were added to the backlog of tenant slot `t`: counts them, activates
    /// the tenant if it was idle and refreshes its oldest time.
    fn queued(&mut self, t: u32, n: usize) {
        self.len += n;
        if self.tenants[t as usize].place == Place::Idle {
            self.activate(t);
        }
        self.refresh_oldest(t);
    }

    /// Drops the queued job `id` of `tenant`, ready at `ready_at` (Unix ms) as it was
    /// pushed (cancelled). Returns false if it is not queued here (already popped, or
    /// never pushed). Does not touch running counts.
    pub fn remove(&mut self, tenant: &str, id: JobId, ready_at: UnixMillis) -> bool {
        let Some(&t) = self.by_name.get(tenant) else {
            return false;
        };
        let removed = match self.boosts.get(&id) {
            Some(&(_, key)) if self.tenants[t as usize].boosted.remove(id, key) => {
                self.unfile_boosted(id);
                true
            }
            _ => self.tenants[t as usize].backlog.remove(id, ready_at),
        };
        if !removed {
            return false;
        }
        self.len -= 1;
        self.refresh_oldest(t);
        if self.tenants[t as usize].is_drained() {
            self.go_idle(t);
        }
        true
    }

    /// The next job to run and its tenant, counted as running for that tenant; `None`
    /// when nothing is queued or every backlogged tenant is at its cap.
    pub fn pop(&mut self) -> Option<(Arc<str>, JobId)> {
        while let Some((&turn, &t)) = self.calendar.first_key_value() {
            // Calendar keys are never below `round`, so rounds only move forward.
            self.round = turn.0;
            let tenant = &self.tenants[t as usize];
            if tenant.capped() {
                // Its cap was lowered or `start_running` filled it since it was queued.
                self.leave_calendar(t);
                self.tenants[t as usize].place = Place::Parked;
            } else if tenant.deficit < 1 {
                // A Runtime charge landed since it was queued: move it on.
                self.leave_calendar(t);
                self.schedule(t);
            } else {
                return Some(self.serve(t));
            }
        }
        None
    }

    /// Counts a job as running for `tenant` that was not popped here (recovery,
    /// resync, leased through another path).
    pub fn start_running(&mut self, tenant: &str) {
        let t = self.tenant_slot(Arc::from(tenant));
        let tenant = &mut self.tenants[t as usize];
        tenant.running = tenant.running.saturating_add(1);
    }

    /// A running job of `tenant` ended (ack, nack, lease expiry) after `run_time`.
    /// Frees a concurrency slot and, with `Fairness::Runtime`, charges the run time
    /// (capped at one day). Ignored for a tenant with nothing known here.
    pub fn finish(&mut self, tenant: &str, run_time: Duration) {
        let Some(&t) = self.by_name.get(tenant) else {
            return;
        };
        if self.fairness == Fairness::Runtime {
            self.charge(t, run_time);
        }
        let tenant = &mut self.tenants[t as usize];
        tenant.running = tenant.running.saturating_sub(1);
        // A slot of its cap is free across the cluster too.
        tenant.held = false;
        match tenant.place {
            Place::Parked if !tenant.capped() => self.enqueue_turn(t),
            Place::Idle => {
                tenant.deficit = tenant.deficit.min(0);
                self.drop_if_unused(t);
            }
            _ => {}
        }
    }

    /// A job popped here was not leased after all: the store refused it because its
    /// tenant is at its `max_concurrency` across the cluster (other nodes hold the
    /// rest of its slots). The job, ready at `ready_at` (Unix ms) as it was pushed,
    /// is queued again at its place, uncharged: its running slot is freed and the
    /// credit its pop cost given back (never more than one turn's worth), and the
    /// tenant is held: parked as if at its cap, so none of its jobs is popped until
    /// one of them finishes here ([`Self::finish`]), its limits change, or
    /// [`Self::reopen`]. A tenant without a cap (it was lifted meanwhile) is not held.
    pub fn at_cap(&mut self, tenant: Arc<str>, id: JobId, ready_at: UnixMillis) {
        self.at_cap_prioritized(tenant, id, ready_at, 0);
    }

    /// [`Self::at_cap`] of a job with a priority ([`Self::push_prioritized`]).
    pub fn at_cap_prioritized(
        &mut self,
        tenant: Arc<str>,
        id: JobId,
        ready_at: UnixMillis,
        priority_ms: i64,
    ) {
        let t = self.tenant_slot(tenant);
        let per_round = self
            .quantum()
            .saturating_mul(self.tenants[t as usize].weight());
        let fairness = self.fairness;
        let tenant = &mut self.tenants[t as usize];
        if tenant.running > 0 {
            let refund = match fairness {
                Fairness::Jobs => JOBS_QUANTUM,
                Fairness::Runtime => tenant.outstanding / i64::from(tenant.running),
            };
            tenant.outstanding -= refund.min(tenant.outstanding);
            let ceiling = per_round.max(tenant.deficit);
            tenant.deficit = tenant.deficit.saturating_add(refund).min(ceiling);
            tenant.running -= 1;
        }
        tenant.held = tenant.limits.max_concurrency.is_some();
        self.holding |= tenant.held;
        if priority_ms == 0 {
            tenant.backlog.push(id, ready_at);
        } else {
            self.file_boosted(t, id, ready_at, priority_ms);
        }
        self.queued(t, 1);
        let tenant = &self.tenants[t as usize];
        if tenant.capped() && matches!(tenant.place, Place::Turn(_)) {
            self.leave_calendar(t);
            self.tenants[t as usize].place = Place::Parked;
        }
    }

    /// Other nodes may have ended leases: every tenant held at its cap across the
    /// cluster ([`Self::at_cap`]) is tried again (it rejoins the round unless it is
    /// at its cap here). O(1) when none is held, else O(tenants).
    pub fn reopen(&mut self) {
        if !std::mem::take(&mut self.holding) {
            return;
        }
        let known: Vec<u32> = self.by_name.values().copied().collect();
        for t in known {
            let tenant = &mut self.tenants[t as usize];
            if std::mem::take(&mut tenant.held) && tenant.place == Place::Parked {
                self.enqueue_turn(t);
            }
        }
    }

    /// Drops every job, running count and credit (resync from the store). Limits and
    /// the fairness mode stay.
    pub fn clear(&mut self) {
        self.holding = false;
        self.tenants.clear();
        self.free.clear();
        self.by_name.clear();
        self.len = 0;
        self.calendar.clear();
        self.oldest.clear();
        self.boosts.clear();
        self.boost_ages.clear();
    }

    /// Number of ready jobs queued. O(1).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no job is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `ready_at` (Unix ms) of the oldest queued job, for
    /// `qd_queue_oldest_ready_age_seconds` and pool autoscaling: the real wait,
    /// whatever the jobs' priorities. O(log tenants + log prioritized jobs).
    pub fn oldest_ready_at(&self) -> Option<UnixMillis> {
        let plain = self.oldest.first().map(|&(at, _)| at);
        let boosted = self.boost_ages.first().map(|&(at, _)| at);
        match (plain, boosted) {
            (Some(p), Some(b)) => Some(p.min(b)),
            (p, b) => p.or(b),
        }
    }

    /// Counters of every tenant with jobs here or with explicit limits, sorted by
    /// name. O(tenants log tenants): call it about once a second, not per job.
    pub fn tenant_stats(&self) -> Vec<TenantStats> {
        let mut stats: Vec<TenantStats> = self
            .by_name
            .values()
            .map(|&t| {
                let tenant = &self.tenants[t as usize];
                stats_of(&tenant.name, tenant.limits, tenant.queued(), tenant.running)
            })
            .collect();
        for (name, &limits) in &self.limits {
            if !self.by_name.contains_key(name) {
                stats.push(stats_of(name, limits, 0, 0));
            }
        }
        stats.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        stats
    }

    /// Jobs counted as running for `tenant`. O(1).
    pub fn running(&self, tenant: &str) -> u32 {
        self.by_name
            .get(tenant)
            .map_or(0, |&t| self.tenants[t as usize].running)
    }

    /// Hands out the head job of `t`, which has its turn and credit.
    fn serve(&mut self, t: u32) -> (Arc<str>, JobId) {
        let cost = self.dispatch_cost(t);
        let tenant = &mut self.tenants[t as usize];
        let (id, boosted) = tenant
            .take_first()
            .expect("invariant: a tenant in the calendar has ready jobs");
        self.len -= 1;
        tenant.running = tenant.running.saturating_add(1);
        tenant.deficit = tenant.deficit.saturating_sub(cost);
        if self.fairness == Fairness::Runtime {
            tenant.outstanding = tenant.outstanding.saturating_add(cost);
        }
        let name = tenant.name.clone();
        if boosted {
            self.unfile_boosted(id);
        }
        self.refresh_oldest(t);
        let tenant = &self.tenants[t as usize];
        if tenant.is_drained() {
            self.go_idle(t);
        } else if tenant.capped() {
            self.leave_calendar(t);
            self.tenants[t as usize].place = Place::Parked;
        } else if tenant.deficit < 1 {
            self.leave_calendar(t);
            self.schedule(t);
        }
        (name, id)
    }

    /// A tenant's backlog went from empty to non-empty.
    fn activate(&mut self, t: u32) {
        let quantum = self.quantum();
        let round = self.round;
        let tenant = &mut self.tenants[t as usize];
        // Debt (Runtime only) is forgiven at the rate credit would have been earned.
        let rounds = i64::try_from(round.saturating_sub(tenant.idle_round)).unwrap_or(i64::MAX);
        let earned = rounds.saturating_mul(quantum.saturating_mul(tenant.weight()));
        tenant.deficit = tenant.deficit.saturating_add(earned).min(0);
        self.enqueue_turn(t);
    }

    /// Puts a backlogged tenant that is not in the calendar into it, or parks it.
    fn enqueue_turn(&mut self, t: u32) {
        if self.tenants[t as usize].capped() {
            self.tenants[t as usize].place = Place::Parked;
        } else {
            self.schedule(t);
        }
    }

    /// Gives `t` its next turn: in this round if its credit covers a job, else `k`
    /// rounds ahead with `k` quanta of credit (DRR's visits, done in one step).
    fn schedule(&mut self, t: u32) {
        let quantum = self.quantum();
        let tenant = &mut self.tenants[t as usize];
        let per_round = quantum.saturating_mul(tenant.weight());
        let rounds = if tenant.deficit >= 1 {
            0
        } else {
            // ceil((1 - deficit) / per_round), with 1 - deficit >= 1.
            1i64.saturating_sub(tenant.deficit)
                .saturating_add(per_round - 1)
                / per_round
        };
        tenant.deficit = tenant
            .deficit
            .saturating_add(rounds.saturating_mul(per_round));
        let turn = (
            self.round
                .saturating_add(u64::try_from(rounds).unwrap_or(0)),
            self.next_seq,
        );
        self.next_seq += 1;
        tenant.place = Place::Turn(turn);
        self.calendar.insert(turn, t);
    }

    /// Takes `t` out of the calendar if it is there (its place is left to the caller).
    fn leave_calendar(&mut self, t: u32) {
        if let Place::Turn(turn) = self.tenants[t as usize].place {
            self.calendar.remove(&turn);
        }
    }

    /// The backlog of `t` emptied: it leaves the round robin with no positive credit.
    fn go_idle(&mut self, t: u32) {
        self.leave_calendar(t);
        let round = self.round;
        let tenant = &mut self.tenants[t as usize];
        tenant.place = Place::Idle;
        tenant.deficit = tenant.deficit.min(0);
        tenant.idle_round = round;
        self.drop_if_unused(t);
    }

    /// Frees the slot of a tenant with no jobs, no running work and no debt.
    fn drop_if_unused(&mut self, t: u32) {
        let tenant = &self.tenants[t as usize];
        if tenant.place == Place::Idle
            && tenant.running == 0
            && tenant.deficit == 0
            && tenant.outstanding == 0
        {
            self.by_name.remove(&tenant.name);
            self.free.push(t);
        }
    }

    /// Runtime mode: refunds the estimate pre-charged for one running job and
    /// charges the measured run time instead.
    fn charge(&mut self, t: u32, run_time: Duration) {
        let run_us = i64::try_from(run_time.as_micros())
            .unwrap_or(MAX_CHARGE_US)
            .min(MAX_CHARGE_US);
        let tenant = &mut self.tenants[t as usize];
        let refund = match tenant.running {
            0 => 0,
            n => tenant.outstanding / i64::from(n),
        };
        tenant.outstanding -= refund;
        tenant.deficit = tenant.deficit.saturating_add(refund).saturating_sub(run_us);
        tenant.avg_run_us = Some(moving_average(tenant.avg_run_us, run_us));
        self.avg_run_us = Some(moving_average(self.avg_run_us, run_us));
    }

    /// What a pop costs up front: 1 job, or the expected run time in µs.
    fn dispatch_cost(&self, t: u32) -> i64 {
        match self.fairness {
            Fairness::Jobs => JOBS_QUANTUM,
            Fairness::Runtime => self.tenants[t as usize]
                .avg_run_us
                .or(self.avg_run_us)
                .unwrap_or(RUNTIME_QUANTUM_US)
                .max(1),
        }
    }

    fn quantum(&self) -> i64 {
        match self.fairness {
            Fairness::Jobs => JOBS_QUANTUM,
            Fairness::Runtime => RUNTIME_QUANTUM_US,
        }
    }

    fn apply_limits(&mut self, t: u32, limits: TenantLimits) {
        let old_weight = self.tenants[t as usize].weight();
        let tenant = &mut self.tenants[t as usize];
        if tenant.limits.max_concurrency != limits.max_concurrency {
            // A new cap is worth a try across the cluster.
            tenant.held = false;
        }
        tenant.limits = limits;
        let per_round = self.quantum().saturating_mul(limits.weight.max(1).into());
        let round = self.round;
        let tenant = &mut self.tenants[t as usize];
        let this_round = match tenant.place {
            Place::Turn((at, _)) => at <= round,
            Place::Parked => true,
            Place::Idle => false,
        };
        if this_round && tenant.weight() < old_weight && tenant.deficit > per_round {
            // A lowered weight applies from the next pop: the credit left of the
            // turn under way (or kept while parked) beyond one turn at the new
            // weight is taken back.
            tenant.deficit = per_round;
        }
        let tenant = &self.tenants[t as usize];
        match tenant.place {
            Place::Turn((round, _)) if round > self.round && tenant.weight() != old_weight => {
                // Take back the credit granted for rounds not yet reached, and grant
                // it again at the new weight.
                let unearned = i64::try_from(round - self.round)
                    .unwrap_or(i64::MAX)
                    .saturating_mul(self.quantum().saturating_mul(old_weight));
                self.leave_calendar(t);
                let tenant = &mut self.tenants[t as usize];
                tenant.deficit = tenant.deficit.saturating_sub(unearned);
                self.schedule(t);
            }
            Place::Parked if !tenant.capped() => self.enqueue_turn(t),
            // A newly capped tenant is parked lazily by `pop`.
            _ => {}
        }
    }

    /// The slot of `name`, created with its limits if unknown.
    fn tenant_slot(&mut self, name: Arc<str>) -> u32 {
        if let Some(&t) = self.by_name.get(&name) {
            return t;
        }
        let limits = self
            .limits
            .get(&name)
            .copied()
            .unwrap_or(self.default_limits);
        let tenant = Tenant::new(name.clone(), limits);
        let t = match self.free.pop() {
            Some(t) => {
                self.tenants[t as usize] = tenant;
                t
            }
            None => {
                self.tenants.push(tenant);
                u32::try_from(self.tenants.len() - 1).expect("invariant: fewer than 2^32 tenants")
            }
        };
        self.by_name.insert(name, t);
        t
    }

    /// Re-files `t` in the oldest-ready index after its head may have changed.
    fn refresh_oldest(&mut self, t: u32) {
        let tenant = &mut self.tenants[t as usize];
        let now = tenant.backlog.head().map(|(at, _)| at);
        if now != tenant.oldest {
            if let Some(at) = tenant.oldest {
                self.oldest.remove(&(at, t));
            }
            if let Some(at) = now {
                self.oldest.insert((at, t));
            }
            tenant.oldest = now;
        }
    }
}

fn normalized(limits: TenantLimits) -> TenantLimits {
    TenantLimits {
        weight: limits.weight.max(1),
        ..limits
    }
}

fn stats_of(name: &Arc<str>, limits: TenantLimits, ready: usize, running: u32) -> TenantStats {
    TenantStats {
        tenant: name.clone(),
        ready,
        running,
        weight: limits.weight,
        max_concurrency: limits.max_concurrency,
    }
}

/// Exponentially weighted moving average with alpha = 1/8 (as TCP's RTT estimator).
fn moving_average(previous: Option<i64>, sample: i64) -> i64 {
    match previous {
        None => sample,
        Some(avg) => avg + (sample - avg) / 8,
    }
}
