//! One tenant's place in the fair queue: its backlog, counters, limits and DRR
//! deficit. Plain data; the rules that move it live in `fair.rs`.

use std::sync::Arc;

use super::TenantLimits;
use super::backlog::Backlog;
use crate::job::{JobId, UnixMillis};

/// Calendar key: (round of the turn, arrival order within the round).
pub(super) type Turn = (u64, u64);

/// Where a tenant stands in the round robin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// No ready jobs.
    Idle,
    /// Backlogged and waiting for (or having) its turn.
    Turn(Turn),
    /// Backlogged but at its concurrency cap (here, or across the cluster: `held`).
    Parked,
}

/// One known tenant (backlogged, running work, or owing Runtime debt).
#[derive(Debug)]
pub(super) struct Tenant {
    pub(super) name: Arc<str>,
    pub(super) limits: TenantLimits,
    pub(super) backlog: Backlog,
    /// Its ready jobs with a priority, by order key (`ready_at - priority`, shifted
    /// by [`super::PRIORITY_SHIFT`] so it is never negative).
    pub(super) boosted: Backlog,
    pub(super) running: u32,
    /// At its cap across the cluster: the store refused a claim because other
    /// nodes hold the rest of its slots. Counts as capped (if it has a cap) until
    /// one of its jobs finishes here, its limits change, or a reopen.
    pub(super) held: bool,
    /// DRR deficit counter, in cost units (jobs, or µs of run time).
    pub(super) deficit: i64,
    pub(super) place: Place,
    /// The round at which the backlog last emptied (for debt forgiveness).
    pub(super) idle_round: u64,
    /// This tenant's key in `FairQueue::oldest`.
    pub(super) oldest: Option<UnixMillis>,
    /// Runtime mode: estimates pre-charged for jobs still running (µs).
    pub(super) outstanding: i64,
    /// Runtime mode: moving average of this tenant's run time (µs).
    pub(super) avg_run_us: Option<i64>,
}

impl Tenant {
    /// A tenant with nothing queued or running.
    pub(super) fn new(name: Arc<str>, limits: TenantLimits) -> Self {
        Tenant {
            name,
            limits,
            backlog: Backlog::default(),
            boosted: Backlog::default(),
            running: 0,
            held: false,
            deficit: 0,
            place: Place::Idle,
            idle_round: 0,
            oldest: None,
            outstanding: 0,
            avg_run_us: None,
        }
    }

    /// True when running work has reached `max_concurrency`, or the tenant is held
    /// at its cap across the cluster.
    pub(super) fn capped(&self) -> bool {
        self.limits
            .max_concurrency
            .is_some_and(|cap| self.held || self.running >= cap)
    }

    /// Ready jobs queued, with and without a priority.
    pub(super) fn queued(&self) -> usize {
        self.backlog.len() + self.boosted.len()
    }

    /// True when no ready job is queued.
    pub(super) fn is_drained(&self) -> bool {
        self.backlog.is_empty() && self.boosted.is_empty()
    }

    /// Removes the job that comes first in the tenant's order, `(order key, id)`:
    /// the older of the two backlogs' heads, a prioritized job's key being its
    /// `ready_at - priority`. Returns it and whether it had a priority.
    pub(super) fn take_first(&mut self) -> Option<(JobId, bool)> {
        let plain = self.backlog.head();
        let boosted = self
            .boosted
            .head()
            .map(|(key, id)| (key - super::PRIORITY_SHIFT, id));
        let from_boosted = match (plain, boosted) {
            (Some(p), Some(b)) => b < p,
            (p, b) => p.is_none() && b.is_some(),
        };
        if from_boosted {
            self.boosted.take_head().map(|id| (id, true))
        } else {
            self.backlog.take_head().map(|id| (id, false))
        }
    }

    /// Effective weight (>= 1) as a cost multiplier.
    pub(super) fn weight(&self) -> i64 {
        i64::from(self.limits.weight.max(1))
    }
}
