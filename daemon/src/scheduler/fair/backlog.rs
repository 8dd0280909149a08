//! One tenant's ready jobs, oldest first: FIFO by `(ready_at, push order)`.
//!
//! Jobs normally become ready in time order, so the common push is an O(1) append
//! to a `VecDeque` kept sorted by `(ready_at, seq)`. A push older than the newest
//! appended job (a resync, a wall-clock step back) goes to a small ordered side map
//! instead, so the deque stays sorted without an O(n) insert. The head is the smaller
//! of the two fronts, which makes the tenant's oldest ready time exact and O(1).
//!
//! Removal of a job in the middle (cancel, leased elsewhere) is lazy: the caller drops
//! the job from the shared [`Index`], which turns its deque entry into a tombstone.
//! Tombstones are trimmed from the front after every change (so the front is always
//! live) and compacted away once they outnumber the live entries, so memory stays
//! within about twice the live count. `len` counts live jobs only.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::job::{JobId, UnixMillis};

/// Where each queued job lives: the queue-wide map from job id to its slot. A deque
/// entry whose id is absent, or present with another `seq`, is a tombstone.
pub(super) type Index = HashMap<JobId, Slot>;

/// A queued job's bookkeeping in the [`Index`] (24 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Slot {
    /// The owning tenant's slot in the queue's tenant table.
    pub tenant: u32,
    /// Queue-wide push counter: unique per push, so a re-pushed id never revives
    /// an old tombstone.
    pub seq: u64,
    /// When the job became ready (Unix milliseconds).
    pub ready_at: UnixMillis,
}

/// Tombstones are compacted once there are more of them than this and than live jobs.
const COMPACT_MIN_TOMBSTONES: usize = 64;

/// One tenant's ready jobs. See the module docs for the layout.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// Sorted by `(ready_at, seq)`; may hold tombstones, never at the front.
    fifo: VecDeque<(JobId, u64)>,
    /// Jobs pushed out of time order, keyed `(ready_at, seq)`.
    late: BTreeMap<(UnixMillis, u64), JobId>,
    /// `ready_at` of the last job appended to `fifo` (meaningful while it is non-empty).
    watermark: UnixMillis,
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

    /// Adds a job; the caller has put `Slot { seq, ready_at, .. }` in the index.
    pub(super) fn push(&mut self, id: JobId, seq: u64, ready_at: UnixMillis) {
        if self.fifo.is_empty() || ready_at >= self.watermark {
            self.fifo.push_back((id, seq));
            self.watermark = ready_at;
        } else {
            self.late.insert((ready_at, seq), id);
        }
        self.live += 1;
    }

    /// The oldest live job as `(ready_at, seq, id)`.
    pub(super) fn head(&self, index: &Index) -> Option<(UnixMillis, u64, JobId)> {
        let fifo = self.fifo.front().map(|&(id, seq)| {
            let at = index
                .get(&id)
                .expect("invariant: the deque front is always live")
                .ready_at;
            (at, seq, id)
        });
        let late = self
            .late
            .first_key_value()
            .map(|(&(at, seq), &id)| (at, seq, id));
        match (fifo, late) {
            (Some(f), Some(l)) => Some(f.min(l)),
            (f, l) => f.or(l),
        }
    }

    /// Removes the oldest live job from the backlog and from `index`.
    pub(super) fn take_head(&mut self, index: &mut Index) -> Option<JobId> {
        let (at, seq, id) = self.head(index)?;
        if self.late.remove(&(at, seq)).is_none() {
            self.fifo.pop_front();
        }
        index.remove(&id);
        self.live -= 1;
        self.trim(index);
        Some(id)
    }

    /// Forgets a job the caller already removed from `index`.
    pub(super) fn forget(&mut self, slot: Slot, index: &Index) {
        self.live -= 1;
        if self.late.remove(&(slot.ready_at, slot.seq)).is_none() {
            self.tombstones += 1;
            self.trim(index);
            self.compact_if_sparse(index);
        }
    }

    /// Pops tombstones off the front, so the front is live (or the deque empty).
    fn trim(&mut self, index: &Index) {
        while let Some(&(id, seq)) = self.fifo.front() {
            if is_live(index, id, seq) {
                break;
            }
            self.fifo.pop_front();
            self.tombstones -= 1;
        }
        if self.fifo.is_empty() && self.fifo.capacity() > 1024 {
            // A drained burst should not pin its peak memory.
            self.fifo = VecDeque::new();
        }
    }

    fn compact_if_sparse(&mut self, index: &Index) {
        if self.tombstones > COMPACT_MIN_TOMBSTONES && self.tombstones > self.live {
            self.fifo.retain(|&(id, seq)| is_live(index, id, seq));
            self.tombstones = 0;
        }
    }
}

fn is_live(index: &Index, id: JobId, seq: u64) -> bool {
    index.get(&id).is_some_and(|slot| slot.seq == seq)
}
