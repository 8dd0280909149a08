//! Attempts an earlier run of qd was running when it died: each is written into its
//! job's history as an interrupted attempt before anything is dispatched, so an
//! operator sees both the run that was cut off and the one that follows.
//!
//! Taken from [`crate::broker::BrokerMsg::LeftBehind`], sent by the Supervisor right
//! after the Broker's first start, when the start-up sweep
//! ([`crate::attempt_groups::sweep`]) has already stopped the attempts' processes.

use tracing::info;

use super::BrokerState;
use crate::job::{Failure, JobId, State, UnixMillis};

/// The lessee named in the history for an attempt of an earlier run.
const EARLIER_RUN: &str = "qd (earlier run)";

impl BrokerState {
    /// Records each `(job, reason)` as an uncharged, interrupted attempt: the job,
    /// ready again after the restart, is leased and failed in memory, and the end is
    /// written like any other. A job that is no longer ready (finished, cancelled,
    /// purged) is left alone. On a shared store the leases of a node that died are
    /// ended by the leader, which writes their history, so nothing is done here.
    pub(in crate::broker) fn left_behind(
        &mut self,
        attempts: Vec<(JobId, String)>,
        now: UnixMillis,
    ) {
        if self.shared() {
            return;
        }
        for (id, reason) in attempts {
            let waiting = self
                .jobs
                .get(id)
                .filter(|j| matches!(j.state, State::Ready | State::Delayed))
                .map(|j| (j.queue.clone(), j.tenant.clone(), j.ready_at));
            let Some((queue, tenant, ready_at)) = waiting else {
                info!(job = %id, "The job of an attempt an earlier run left is no longer waiting; no history entry added.");
                continue;
            };
            match self.lease_one(id, EARLIER_RUN, now) {
                Ok((_, leased)) => {
                    // Leased outside a pick: out of the ready order and running, so
                    // the end of this attempt puts it back once, with its slot.
                    if let Some(d) = self.dispatches.get_mut(&queue) {
                        d.take(&tenant, id, ready_at);
                    }
                    let failure = Failure::Interrupted { reason };
                    self.fail(id, leased.lease_seq, failure, None, now);
                }
                Err(err) => {
                    info!(job = %id, error = %err, "Cannot record the interrupted attempt of an earlier run.");
                }
            }
        }
    }
}
