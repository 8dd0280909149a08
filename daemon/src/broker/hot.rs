//! Hot payloads: the payloads of jobs accepted recently and not yet leased, kept by
//! the Broker so that the lease that follows an enqueue hands the job out without a
//! store round trip (the common case of a queue that keeps up).
//!
//! Bounded by bytes ([`HotPayloads::new`]): the oldest entries are dropped first, and a
//! dropped payload is simply read from the store when its job is leased. An entry is
//! taken (removed) by the job's first lease; a job leased again (a retry) reads the
//! store. The cache never decides anything: the store keeps every payload durably,
//! so losing an entry costs a read, never a job. Pure data, no actor.

use std::collections::{HashMap, VecDeque};

use crate::job::JobId;

/// Payload bytes by job, oldest first, at most `budget` bytes in all.
pub struct HotPayloads {
    budget: usize,
    bytes: usize,
    payloads: HashMap<JobId, Vec<u8>>,
    /// Insertion order; ids already taken are skipped lazily when evicting.
    order: VecDeque<JobId>,
}

/// What one entry costs against the budget beyond its bytes (map and queue slots).
const ENTRY_OVERHEAD: usize = 64;

impl HotPayloads {
    /// An empty cache holding at most `budget` bytes (payload bytes plus a fixed
    /// per-entry overhead). A payload larger than the budget is never kept.
    pub fn new(budget: usize) -> Self {
        HotPayloads {
            budget,
            bytes: 0,
            payloads: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Keeps `payload` for job `id`, dropping the oldest entries to stay in budget.
    pub fn insert(&mut self, id: JobId, payload: Vec<u8>) {
        let cost = payload.len() + ENTRY_OVERHEAD;
        if cost > self.budget {
            return;
        }
        while self.bytes + cost > self.budget {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.drop_entry(oldest);
        }
        if let Some(old) = self.payloads.insert(id, payload) {
            self.bytes -= old.len() + ENTRY_OVERHEAD;
        } else {
            self.order.push_back(id);
        }
        self.bytes += cost;
    }

    /// Whether job `id`'s payload is kept.
    pub fn contains(&self, id: JobId) -> bool {
        self.payloads.contains_key(&id)
    }

    /// Removes and returns job `id`'s payload, if kept.
    pub fn take(&mut self, id: JobId) -> Option<Vec<u8>> {
        let payload = self.payloads.remove(&id)?;
        self.bytes -= payload.len() + ENTRY_OVERHEAD;
        if self.payloads.is_empty() {
            self.order.clear();
        } else if self.order.len() > 2 * self.payloads.len() + 64 {
            // Taken ids are skipped lazily; compact before they outnumber the live ones.
            let payloads = &self.payloads;
            self.order.retain(|id| payloads.contains_key(id));
        }
        Some(payload)
    }

    /// Forgets job `id`'s payload (the job was cancelled or changed).
    pub fn forget(&mut self, id: JobId) {
        self.take(id);
    }

    fn drop_entry(&mut self, id: JobId) {
        if let Some(payload) = self.payloads.remove(&id) {
            self.bytes -= payload.len() + ENTRY_OVERHEAD;
        }
    }

    /// Bytes counted against the budget.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(n: u128) -> JobId {
        JobId(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn a_taken_payload_is_gone_and_the_oldest_is_dropped_first() {
        let mut hot = HotPayloads::new(3 * (10 + ENTRY_OVERHEAD));
        for n in 1..=3 {
            hot.insert(id(n), vec![n as u8; 10]);
        }
        assert_eq!(hot.take(id(2)), Some(vec![2; 10]));
        assert_eq!(hot.take(id(2)), None);
        hot.insert(id(4), vec![4; 10]);
        hot.insert(id(5), vec![5; 10]);
        assert!(!hot.contains(id(1)), "the oldest went first");
        assert!(hot.contains(id(3)) && hot.contains(id(4)) && hot.contains(id(5)));
    }

    #[test]
    fn a_payload_over_the_budget_is_not_kept() {
        let mut hot = HotPayloads::new(100);
        hot.insert(id(1), vec![0; 100]);
        assert!(!hot.contains(id(1)));
        assert_eq!(hot.bytes(), 0);
    }

    proptest! {
        /// Whatever the sequence, the budget holds, the byte count matches the kept
        /// entries, and a kept payload is the last one inserted for its id.
        #[test]
        fn the_budget_holds_and_the_count_matches(
            ops in proptest::collection::vec((0u128..20, 0usize..300, any::<bool>()), 0..200)
        ) {
            let budget = 1_000;
            let mut hot = HotPayloads::new(budget);
            let mut last = HashMap::new();
            for (n, len, take) in ops {
                if take {
                    let got = hot.take(id(n));
                    if let Some(got) = got {
                        prop_assert_eq!(Some(&got), last.get(&n));
                    }
                    last.remove(&n);
                } else {
                    hot.insert(id(n), vec![len as u8; len]);
                    last.insert(n, vec![len as u8; len]);
                }
                prop_assert!(hot.bytes() <= budget);
                let counted: usize = hot.payloads.values().map(|p| p.len() + ENTRY_OVERHEAD).sum();
                prop_assert_eq!(hot.bytes(), counted);
            }
        }
    }
}
