//! The LeaseReaper actor: expires leases (visibility timeouts) whose deadline passed.
//!
//! It keeps the deadline of every live lease in a min-heap on the monotonic clock and
//! arms one timer for the soonest, like beanstalkd's core loop; it never polls. A
//! heartbeat re-tracks a lease with a later deadline; the earlier heap entry is
//! skipped lazily. When a deadline passes it sends `Expire(id, token)` to the Broker,
//! which re-checks the lease and sends the job through the retry policy.
//!
//! Messages ([`ReaperMsg`]): `Track`, `Untrack`, `Reset` (from the Broker) and its own
//! `Tick`. Supervised by the Supervisor; on start it asks the Broker for every live
//! lease, so a restart loses no deadline.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::broker::{self, BrokerMsg, Resync};
use crate::job::{JobId, Token};

/// The registered actor name of the reaper.
pub const NAME: &str = "lease_reaper";

/// Messages the reaper takes.
pub enum ReaperMsg {
    /// Watch this lease; a later call for the same job replaces the deadline.
    Track(JobId, Token, Instant),
    /// The lease ended (ack, nack): stop watching.
    Untrack(JobId),
    /// Forget everything (a resync follows).
    Reset,
    /// Timer.
    Tick,
}

/// Pure deadline bookkeeping: which leases are due at a given instant.
#[derive(Default)]
pub struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, JobId, Token)>>,
    current: HashMap<JobId, (Token, Instant)>,
}

impl Deadlines {
    /// Watches (or re-times) a lease.
    pub fn track(&mut self, id: JobId, token: Token, deadline: Instant) {
        self.current.insert(id, (token, deadline));
        self.heap.push(Reverse((deadline, id, token)));
    }

    /// Stops watching a lease.
    pub fn untrack(&mut self, id: JobId) {
        self.current.remove(&id);
    }

    /// Removes and returns every lease whose current deadline is `<= now`.
    pub fn pop_due(&mut self, now: Instant) -> Vec<(JobId, Token)> {
        let mut due = Vec::new();
        while let Some(Reverse((deadline, id, token))) = self.heap.peek().copied() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            if self.current.get(&id) == Some(&(token, deadline)) {
                self.current.remove(&id);
                due.push((id, token));
            }
        }
        if self.heap.len() > 64 && self.heap.len() > 4 * self.current.len() {
            self.compact();
        }
        due
    }

    /// The soonest live deadline, skipping stale heap entries.
    pub fn soonest(&mut self) -> Option<Instant> {
        while let Some(Reverse((deadline, id, token))) = self.heap.peek().copied() {
            if self.current.get(&id) == Some(&(token, deadline)) {
                return Some(deadline);
            }
            self.heap.pop();
        }
        None
    }

    /// Number of live leases watched.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// True when no lease is watched.
    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    fn compact(&mut self) {
        self.heap = self
            .current
            .iter()
            .map(|(id, (token, deadline))| Reverse((*deadline, *id, *token)))
            .collect();
    }
}

/// The pending `Tick` of the armed timer.
type Timer = JoinHandle<Result<(), ractor::MessagingErr<ReaperMsg>>>;

/// The reaper's state.
pub struct ReaperState {
    deadlines: Deadlines,
    timer: Option<(Instant, Timer)>,
}

/// The reaper actor.
pub struct LeaseReaper;

impl Actor for LeaseReaper {
    type Msg = ReaperMsg;
    type State = ReaperState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<ReaperMsg>,
        _: (),
    ) -> Result<ReaperState, ActorProcessingErr> {
        broker::cast(BrokerMsg::Resync(Resync::Reaper));
        Ok(ReaperState {
            deadlines: Deadlines::default(),
            timer: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ReaperMsg>,
        msg: ReaperMsg,
        state: &mut ReaperState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReaperMsg::Track(id, token, deadline) => state.deadlines.track(id, token, deadline),
            ReaperMsg::Untrack(id) => state.deadlines.untrack(id),
            ReaperMsg::Reset => state.deadlines = Deadlines::default(),
            ReaperMsg::Tick => {
                state.timer = None;
                let due = state.deadlines.pop_due(Instant::now());
                if let Some(broker) = ActorRef::<BrokerMsg>::where_is(broker::NAME) {
                    for (id, token) in due {
                        broker.cast(BrokerMsg::Expire(id, token))?;
                    }
                }
            }
        }
        state.arm(&myself);
        Ok(())
    }
}

impl ReaperState {
    fn arm(&mut self, myself: &ActorRef<ReaperMsg>) {
        let Some(next) = self.deadlines.soonest() else {
            return;
        };
        if let Some((armed, _)) = &self.timer
            && *armed <= next
        {
            return;
        }
        if let Some((_, old)) = self.timer.take() {
            old.abort();
        }
        let delay = next.saturating_duration_since(Instant::now());
        self.timer = Some((next, myself.send_after(delay, || ReaperMsg::Tick)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_current_deadlines_that_passed_are_due() {
        let t0 = Instant::now();
        let (a, b) = (JobId::new(), JobId::new());
        let mut d = Deadlines::default();
        d.track(a, 1, t0 + Duration::from_secs(1));
        d.track(b, 1, t0 + Duration::from_secs(2));
        // A heartbeat moves a's deadline later: the old entry must not fire.
        d.track(a, 1, t0 + Duration::from_secs(10));
        assert_eq!(d.soonest(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(d.pop_due(t0 + Duration::from_secs(3)), vec![(b, 1)]);
        d.untrack(a);
        assert_eq!(d.pop_due(t0 + Duration::from_secs(60)), vec![]);
        assert!(d.is_empty());
        assert_eq!(d.soonest(), None);
    }

    #[test]
    fn a_new_lease_token_replaces_the_old_one() {
        let t0 = Instant::now();
        let a = JobId::new();
        let mut d = Deadlines::default();
        d.track(a, 1, t0 + Duration::from_secs(1));
        d.track(a, 2, t0 + Duration::from_secs(1));
        assert_eq!(d.pop_due(t0 + Duration::from_secs(1)), vec![(a, 2)]);
    }
}
