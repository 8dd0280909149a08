//! Delayed jobs of one queue by due time: a pure min-heap, so the Broker can arm
//! ONE timer for the soonest deadline instead of polling (as beanstalkd's core
//! loop does).
//!
//! The deadline type `D` is chosen by the caller (`D: Ord + Copy`): the actor may pass
//! `tokio::time::Instant`s, or a `Duration` since an epoch it picked; tests pass plain
//! integers. Nothing here reads a clock.
//!
//! Removal (cancel) is lazy: the job leaves the id index at once, its heap entry
//! becomes garbage and is skipped. Garbage is popped off the top after every change,
//! so [`DelayedJobs::next_due`] is exact, and the heap is rebuilt once garbage
//! outnumbers live entries, so memory stays within about twice the live count.
//! Costs: `push`, `remove` and each due job of `pop_due` are O(log n) amortised;
//! `next_due` and `len` are O(1).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use crate::job::{JobId, UnixMillis};

/// A heap entry: due time, then push order (equal deadlines come out first-in,
/// first-out), then the job and its `ready_at` (Unix ms), handed back when due.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry<D> {
    due: D,
    seq: u64,
    id: JobId,
    tenant: Arc<str>,
    ready_at: UnixMillis,
}

/// Garbage entries are compacted once there are more of them than this and than
/// live entries.
const COMPACT_MIN_GARBAGE: usize = 64;

/// Delayed jobs ordered by due time `D`. See the module docs.
#[derive(Debug)]
pub struct DelayedJobs<D> {
    heap: BinaryHeap<Reverse<Entry<D>>>,
    /// Live jobs: id -> the `seq` of their current heap entry.
    live: HashMap<JobId, u64>,
    next_seq: u64,
}

impl<D: Ord + Copy> Default for DelayedJobs<D> {
    fn default() -> Self {
        Self::new()
    }
}

impl<D: Ord + Copy> DelayedJobs<D> {
    /// An empty heap.
    pub fn new() -> Self {
        DelayedJobs {
            heap: BinaryHeap::new(),
            live: HashMap::new(),
            next_seq: 0,
        }
    }

    /// Schedules job `id` of `tenant`, ready at `ready_at` (Unix ms), to become ready
    /// at `due`. If `id` is already here, the new due time replaces the old one and
    /// `false` is returned.
    pub fn push(&mut self, due: D, tenant: Arc<str>, id: JobId, ready_at: UnixMillis) -> bool {
        let seq = self.next_seq;
        self.next_seq += 1;
        let fresh = self.live.insert(id, seq).is_none();
        self.heap.push(Reverse(Entry {
            due,
            seq,
            id,
            tenant,
            ready_at,
        }));
        if !fresh {
            self.tidy();
        }
        fresh
    }

    /// Drops job `id` (cancelled). Returns false if it is not here.
    pub fn remove(&mut self, id: JobId) -> bool {
        let found = self.live.remove(&id).is_some();
        if found {
            self.tidy();
        }
        found
    }

    /// Removes and returns every job due at or before `now` as `(tenant, id,
    /// ready_at)`, soonest first (equal deadlines in push order).
    pub fn pop_due(&mut self, now: D) -> Vec<(Arc<str>, JobId, UnixMillis)> {
        let mut due = Vec::new();
        while let Some(Reverse(top)) = self.heap.peek() {
            if top.due > now {
                break;
            }
            let Some(Reverse(entry)) = self.heap.pop() else {
                break;
            };
            if self.live.get(&entry.id) == Some(&entry.seq) {
                self.live.remove(&entry.id);
                due.push((entry.tenant, entry.id, entry.ready_at));
            }
        }
        self.tidy();
        due
    }

    /// The soonest due time, if any job is waiting: when to arm the timer. O(1).
    pub fn next_due(&self) -> Option<D> {
        self.heap.peek().map(|Reverse(top)| top.due)
    }

    /// Number of delayed jobs (exact; garbage is not counted).
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True when no job is delayed.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Drops everything (resync).
    pub fn clear(&mut self) {
        self.heap.clear();
        self.live.clear();
    }

    /// Keeps the top live (so `next_due` is exact) and garbage bounded.
    fn tidy(&mut self) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.live.get(&top.id) == Some(&top.seq) {
                break;
            }
            self.heap.pop();
        }
        let garbage = self.heap.len() - self.live.len();
        if garbage > COMPACT_MIN_GARBAGE && garbage > self.live.len() {
            let live = &self.live;
            self.heap
                .retain(|Reverse(entry)| live.get(&entry.id) == Some(&entry.seq));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(n: u128) -> JobId {
        JobId(uuid::Uuid::from_u128(n))
    }

    fn ids(popped: Vec<(Arc<str>, JobId, UnixMillis)>) -> Vec<JobId> {
        popped.into_iter().map(|(_, id, _)| id).collect()
    }

    #[test]
    fn jobs_come_out_in_due_order_and_only_when_due() {
        let mut heap = DelayedJobs::new();
        heap.push(30u64, "a".into(), id(3), 300);
        heap.push(10, "b".into(), id(1), 0);
        heap.push(20, "a".into(), id(2), 0);
        assert_eq!(heap.next_due(), Some(10));
        assert!(heap.pop_due(9).is_empty());
        assert_eq!(ids(heap.pop_due(25)), vec![id(1), id(2)]);
        assert_eq!(heap.next_due(), Some(30));
        assert_eq!(heap.len(), 1);
        let last = heap.pop_due(30);
        assert_eq!(
            last,
            vec![(Arc::from("a"), id(3), 300)],
            "with its ready_at"
        );
        assert_eq!(heap.next_due(), None);
        assert!(heap.is_empty());
    }

    #[test]
    fn equal_deadlines_come_out_in_push_order() {
        let mut heap = DelayedJobs::new();
        for n in [5u128, 1, 9, 3] {
            heap.push(7u64, "t".into(), id(n), 0);
        }
        assert_eq!(ids(heap.pop_due(7)), vec![id(5), id(1), id(9), id(3)]);
    }

    #[test]
    fn removed_job_is_never_due_and_next_due_skips_it() {
        let mut heap = DelayedJobs::new();
        heap.push(1u64, "t".into(), id(1), 0);
        heap.push(2, "t".into(), id(2), 0);
        assert!(heap.remove(id(1)));
        assert!(!heap.remove(id(1)));
        assert_eq!(heap.next_due(), Some(2));
        assert_eq!(heap.len(), 1);
        assert_eq!(ids(heap.pop_due(10)), vec![id(2)]);
    }

    #[test]
    fn push_again_replaces_the_due_time() {
        let mut heap = DelayedJobs::new();
        assert!(heap.push(5u64, "t".into(), id(1), 0));
        assert!(!heap.push(50, "t".into(), id(1), 0));
        assert_eq!(heap.next_due(), Some(50));
        assert!(heap.pop_due(10).is_empty());
        assert_eq!(ids(heap.pop_due(50)), vec![id(1)]);
        assert!(heap.is_empty());
    }

    #[test]
    fn garbage_is_compacted_after_many_removals() {
        let mut heap = DelayedJobs::new();
        for n in 0..1_000u128 {
            heap.push(u64::try_from(n).expect("small"), "t".into(), id(n), 0);
        }
        for n in 1..1_000u128 {
            heap.remove(id(n));
        }
        assert_eq!(heap.len(), 1);
        assert!(heap.heap.len() <= 2 * COMPACT_MIN_GARBAGE + 2);
        assert_eq!(ids(heap.pop_due(u64::MAX)), vec![id(0)]);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(u8, u8),
        Remove(u8),
        PopDue(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..40, 0u8..100).prop_map(|(i, d)| Op::Push(i, d)),
            (0u8..40).prop_map(Op::Remove),
            (0u8..100).prop_map(Op::PopDue),
        ]
    }

    proptest! {
        /// The heap behaves like a brute-force list of (due, push order, id).
        #[test]
        fn matches_a_sorted_list_model(ops in prop::collection::vec(op(), 1..200)) {
            let mut heap = DelayedJobs::new();
            let mut model: Vec<(u8, u64, JobId)> = Vec::new();
            let mut seq = 0u64;
            for op in ops {
                match op {
                    Op::Push(i, due) => {
                        let job = id(u128::from(i));
                        let had = model.iter().any(|e| e.2 == job);
                        model.retain(|e| e.2 != job);
                        model.push((due, seq, job));
                        seq += 1;
                        prop_assert_eq!(heap.push(due, "t".into(), job, 0), !had);
                    }
                    Op::Remove(i) => {
                        let job = id(u128::from(i));
                        let had = model.iter().any(|e| e.2 == job);
                        model.retain(|e| e.2 != job);
                        prop_assert_eq!(heap.remove(job), had);
                    }
                    Op::PopDue(now) => {
                        model.sort();
                        let expected: Vec<JobId> =
                            model.iter().filter(|e| e.0 <= now).map(|e| e.2).collect();
                        model.retain(|e| e.0 > now);
                        prop_assert_eq!(ids(heap.pop_due(now)), expected);
                    }
                }
                prop_assert_eq!(heap.len(), model.len());
                prop_assert_eq!(heap.next_due(), model.iter().map(|e| e.0).min());
            }
        }
    }
}
