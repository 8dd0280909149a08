//! Lease deadlines: the one home of every live lease's deadline, kept by the Broker.
//!
//! A min-heap on the monotonic clock plus the current deadline per job, so the
//! Broker arms one timer for the soonest deadline, like beanstalkd's core loop, and
//! never polls. A heartbeat re-tracks a lease with a later deadline; the earlier heap
//! entry is skipped lazily. Pure data, no actor: property- and unit-tested here.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use tokio::time::Instant;

use crate::job::{JobId, Token};

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

    /// The current deadline of `id`'s lease, if it is watched.
    pub fn get(&self, id: JobId) -> Option<Instant> {
        self.current.get(&id).map(|(_, deadline)| *deadline)
    }

    /// Every watched lease as (job, token), in no order.
    pub fn leases(&self) -> impl Iterator<Item = (JobId, Token)> + '_ {
        self.current.iter().map(|(id, (token, _))| (*id, *token))
    }

    fn compact(&mut self) {
        self.heap = self
            .current
            .iter()
            .map(|(id, (token, deadline))| Reverse((*deadline, *id, *token)))
            .collect();
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
