//! One tenant's ready jobs, oldest first: by `(ready_at, id)`.
//!
//! Jobs normally become ready in time order, so the common push is an O(1) append
//! to a `VecDeque` of `(id, ready_at)` kept sorted by `(ready_at, id)` (24 bytes a
//! job, and nothing else per job: no id index). A push that does not sort after the
//! newest appended job (a retry whose backoff ended, a wall-clock step back) goes to
//! a small ordered side set instead, so the deque stays sorted without an O(n)
//! insert. The head is the smaller of the two fronts, which makes the tenant's oldest
//! ready time exact and O(1). A resync hands over its sorted list, which becomes the
//! deque without a copy. Ready times before 1970 (negative) are read as 0.
//!
//! Removal of a job in the middle (cancel) names the job's `ready_at` as the caller
//! knows it: a binary search by `(ready_at, id)` finds its entry, which becomes a
//! tombstone (its `ready_at` with the sign bit set, so the deque stays sorted by the
//! key). Tombstones are trimmed from the front after every change (so the front is
//! always live) and compacted away once they outnumber the live entries, so memory
//! stays within about twice the live count. `len` counts live jobs only.

use std::collections::{BTreeSet, VecDeque};

use crate::job::{JobId, UnixMillis};

/// A queued job: its id and when it became ready (Unix ms).
pub(super) type Entry = (JobId, UnixMillis);

/// The mark of a removed entry: its `ready_at` (never negative) with the sign bit set.
const TOMBSTONE: UnixMillis = i64::MIN;

/// The order of an entry, live or not: `(ready_at, id)`.
fn key(&(id, at): &Entry) -> (UnixMillis, JobId) {
    (at & !TOMBSTONE, id)
}

fn is_live(&(_, at): &Entry) -> bool {
    at & TOMBSTONE == 0
}

/// Tombstones are compacted once there are more of them than this and than live jobs.
const COMPACT_MIN_TOMBSTONES: usize = 64;

/// One tenant's ready jobs. See the module docs for the layout.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// Sorted by [`key`], each key once; may hold tombstones, never at the front.
    fifo: VecDeque<Entry>,
    /// Jobs pushed that did not sort after the back of `fifo`, keyed `(ready_at, id)`.
    late: BTreeSet<(UnixMillis, JobId)>,
    /// Live jobs (excludes tombstones).
    live: usize,
    /// Dead entries still in `fifo`.
    tombstones: usize,
}

impl Backlog {
    /// Number of live jobs.
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// True when no live job is left.
    pub(super) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Adds job `id`, ready at `ready_at`; the caller hands each job once.
    pub(super) fn push(&mut self, id: JobId, ready_at: UnixMillis) {
        let entry = (id, ready_at.max(0));
        if self.fifo.back().is_none_or(|back| key(back) < key(&entry)) {
            self.fifo.push_back(entry);
        } else {
            self.late.insert(key(&entry));
        }
        self.live += 1;
    }

    /// Adds `jobs` as [`Self::push`] of each in order would. When they are sorted by
    /// `(ready_at, id)` and sort after the back of the deque (a resync's list, into an
    /// empty backlog), they are appended in one step, and an empty deque takes the
    /// list's buffer as its own.
    pub(super) fn extend(&mut self, jobs: Vec<Entry>) {
        let in_order = match (self.fifo.back(), jobs.first()) {
            (_, None) => true,
            (back, Some(first)) => {
                first.1 >= 0
                    && back.is_none_or(|back| key(back) < key(first))
                    && jobs.is_sorted_by(|a, b| key(a) < key(b))
            }
        };
        if !in_order {
            for (id, ready_at) in jobs {
                self.push(id, ready_at);
            }
            return;
        }
        self.live += jobs.len();
        if self.fifo.is_empty() {
            self.fifo = VecDeque::from(jobs);
        } else {
            self.fifo.extend(jobs);
        }
    }

    /// The oldest live job as `(ready_at, id)`.
    pub(super) fn head(&self) -> Option<(UnixMillis, JobId)> {
        let fifo = self.fifo.front().map(key);
        let late = self.late.first().copied();
        match (fifo, late) {
            (Some(f), Some(l)) => Some(f.min(l)),
            (f, l) => f.or(l),
        }
    }

    /// Removes the oldest live job and returns its id.
    pub(super) fn take_head(&mut self) -> Option<JobId> {
        let (at, id) = self.head()?;
        if !self.late.remove(&(at, id)) {
            self.fifo.pop_front();
        }
        self.live -= 1;
        self.trim();
        Some(id)
    }

    /// Removes job `id`, queued ready at `ready_at`. O(log n). Returns false if it is
    /// not queued here.
    pub(super) fn remove(&mut self, id: JobId, ready_at: UnixMillis) -> bool {
        let wanted = (ready_at.max(0), id);
        if self.late.remove(&wanted) {
            self.live -= 1;
            return true;
        }
        let Ok(at) = self.fifo.binary_search_by(|e| key(e).cmp(&wanted)) else {
            return false;
        };
        let entry = &mut self.fifo[at];
        if !is_live(entry) {
            return false;
        }
        entry.1 |= TOMBSTONE;
        self.live -= 1;
        self.tombstones += 1;
        self.trim();
        self.compact_if_sparse();
        true
    }

    /// The deque's two slices, for tests of its buffer.
    #[cfg(test)]
    pub(super) fn as_slices_for_test(&self) -> (&[Entry], &[Entry]) {
        self.fifo.as_slices()
    }

    /// Pops tombstones off the front, so the front is live (or the deque empty).
    fn trim(&mut self) {
        while self.fifo.front().is_some_and(|e| !is_live(e)) {
            self.fifo.pop_front();
            self.tombstones -= 1;
        }
        if self.fifo.is_empty() && self.fifo.capacity() > 1024 {
            // A drained burst should not pin its peak memory.
            self.fifo = VecDeque::new();
        }
    }

    fn compact_if_sparse(&mut self) {
        if self.tombstones > COMPACT_MIN_TOMBSTONES && self.tombstones > self.live {
            self.fifo.retain(is_live);
            self.tombstones = 0;
        }
    }
}
