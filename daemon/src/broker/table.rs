//! The Broker's table of unfinished jobs: one compact record per job, kept in a slab
//! and found through a hash table of slab positions.
//!
//! The Broker holds every unfinished job, so its per-job cost is qd's memory per
//! queued job. A [`Job`] is ~184 bytes with four inline optional strings, and a
//! `HashMap<JobId, Job>` runs at 44-87% load: ~400 MiB at 1,000,000 jobs. Here a
//! record is 80 bytes: queue and tenant are indexes into a table of names (each name
//! stored once), and the fields most jobs leave empty (idempotency key, last error,
//! lease holder, lease start and priority) sit behind one optional box. The hash table holds
//! 4-byte slab positions, so its empty buckets cost 5 bytes each, and the slab is
//! filled front to back (freed slots are reused), so its unused capacity is never
//! touched and costs no resident memory.
//!
//! Records convert to and from [`Job`] at the edges, where `job::apply`, the store
//! and the queues' dispatches need one. Owned by `BrokerState`; no messages.
//! Costs: `get`, `insert` and `remove` are O(1) expected (one hash of the id, with
//! foldhash's randomly seeded fast hasher).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use crate::job::{Job, JobId, State, Token, UnixMillis};

/// The unfinished jobs by id. See the module docs for the layout.
#[derive(Default)]
pub(super) struct JobTable {
    /// Slab positions, hashed by the id of the record they point to.
    index: HashTable<u32>,
    slots: Vec<Option<Record>>,
    /// Vacant slab positions, reused before the slab grows.
    free: Vec<u32>,
    /// Queue and tenant names by index; a vacant index holds `vacant`.
    names: Vec<Arc<str>>,
    /// How many records name each index; an index no record names is vacant.
    name_refs: Vec<u32>,
    /// Vacant name indexes, reused before `names` grows, so the table holds the
    /// names of unfinished jobs only, however many tenants came and went.
    free_names: Vec<u32>,
    /// What a vacant index of `names` holds (the empty string).
    vacant: Arc<str>,
    name_ids: HashMap<Arc<str>, u32>,
    /// The names found last (indexes into `names`), checked by address before
    /// `name_ids` is hashed: a job's queue and tenant mostly repeat the last ones.
    recent: [Option<u32>; 2],
    hasher: RandomState,
}

/// One job without the fields most jobs leave empty (80 bytes).
struct Record {
    id: JobId,
    lease_seq: Token,
    created_at: UnixMillis,
    ready_at: UnixMillis,
    updated_at: UnixMillis,
    attempts: u32,
    budget_start: u32,
    max_attempts: u32,
    /// Index into `JobTable::names`.
    queue: u32,
    /// Index into `JobTable::names`.
    tenant: u32,
    state: State,
    rare: Option<Box<Rare>>,
}

/// The fields of a [`Job`] that most jobs leave empty.
#[derive(Default)]
struct Rare {
    idempotency_key: Option<Box<str>>,
    last_error: Option<Box<str>>,
    worker: Option<Box<str>>,
    leased_at: Option<UnixMillis>,
    priority_ms: i64,
}

/// What a queue's dispatch needs of a job ([`JobTable::in_queue`]).
pub(super) struct Brief<'a> {
    pub id: JobId,
    pub tenant: &'a Arc<str>,
    pub state: State,
    pub ready_at: UnixMillis,
    pub priority_ms: i64,
}

impl JobTable {
    /// Number of jobs held.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// The job `id`, or `None`.
    pub(super) fn get(&self, id: JobId) -> Option<Job> {
        self.position(id).map(|at| self.job_at(at))
    }

    /// Puts `job` in place of the record with its id (if any); returns that record.
    pub(super) fn insert(&mut self, job: Job) -> Option<Job> {
        let record = self.record_of(job);
        if let Some(at) = self.position(record.id) {
            let old = self.job_at(at);
            if let Some(replaced) = self.slots[at as usize].replace(record) {
                self.release(&replaced);
            }
            return Some(old);
        }
        self.file(record);
        None
    }

    /// Stores a record whose id is not held yet: in a vacant slot, and in the index.
    fn file(&mut self, record: Record) {
        let at = match self.free.pop() {
            Some(at) => {
                self.slots[at as usize] = Some(record);
                at
            }
            None => {
                let at = u32::try_from(self.slots.len())
                    .expect("invariant: fewer than 2^32 unfinished jobs");
                self.slots.push(Some(record));
                at
            }
        };
        let (hasher, slots) = (&self.hasher, &self.slots);
        let hash = hasher.hash_one(self.id_at(at));
        self.index
            .insert_unique(hash, at, |&p| hasher.hash_one(id_in(slots, p)));
    }

    /// Adds `job`, whose id the table does not hold (the caller knows: a start-up
    /// load of unique rows), without looking for an earlier record.
    pub(super) fn insert_new(&mut self, job: Job) {
        debug_assert!(self.position(job.id).is_none(), "job {} is new", job.id);
        let record = self.record_of(job);
        self.file(record);
    }

    /// Takes job `id` out; returns it, or `None` if it was not held.
    pub(super) fn remove(&mut self, id: JobId) -> Option<Job> {
        let hash = self.hasher.hash_one(id);
        let slots = &self.slots;
        let entry = self
            .index
            .find_entry(hash, |&p| id_in(slots, p) == id)
            .ok()?;
        let (at, _) = entry.remove();
        let job = self.job_at(at);
        if let Some(removed) = self.slots[at as usize].take() {
            self.release(&removed);
        }
        self.free.push(at);
        Some(job)
    }

    /// Every job, in no particular order.
    #[cfg(test)]
    pub(super) fn values(&self) -> impl Iterator<Item = Job> + '_ {
        self.index.iter().map(|&at| self.job_at(at))
    }

    /// The jobs of `queue`, in no particular order, without building [`Job`]s.
    pub(super) fn in_queue<'a>(&'a self, queue: &str) -> impl Iterator<Item = Brief<'a>> + 'a {
        let queue = self.name_ids.get(queue).copied();
        self.slots
            .iter()
            .flatten()
            .filter(move |r| Some(r.queue) == queue)
            .map(|r| Brief {
                id: r.id,
                tenant: &self.names[r.tenant as usize],
                state: r.state,
                ready_at: r.ready_at,
                priority_ms: r.rare.as_ref().map_or(0, |x| x.priority_ms),
            })
    }

    fn position(&self, id: JobId) -> Option<u32> {
        let hash = self.hasher.hash_one(id);
        self.index
            .find(hash, |&p| id_in(&self.slots, p) == id)
            .copied()
    }

    fn id_at(&self, at: u32) -> JobId {
        id_in(&self.slots, at)
    }

    /// The index of `name` for one more record that names it.
    fn name(&mut self, name: &Arc<str>) -> u32 {
        let names = &self.names;
        let seen = |n: &u32| Arc::ptr_eq(&names[*n as usize], name);
        if let Some(n) = self.recent.iter().flatten().copied().find(seen) {
            self.name_refs[n as usize] += 1;
            return n;
        }
        let n = match self.name_ids.get(name) {
            Some(&n) => n,
            None => {
                let n = match self.free_names.pop() {
                    Some(n) => {
                        self.names[n as usize] = name.clone();
                        n
                    }
                    None => {
                        let n =
                            u32::try_from(names.len()).expect("invariant: fewer than 2^32 names");
                        self.names.push(name.clone());
                        self.name_refs.push(0);
                        n
                    }
                };
                self.name_ids.insert(name.clone(), n);
                n
            }
        };
        self.name_refs[n as usize] += 1;
        self.recent = [Some(n), self.recent[0]];
        n
    }

    /// `record` left the table: its queue and tenant are named by one record less,
    /// and a name no record holds any more is let go.
    fn release(&mut self, record: &Record) {
        for n in [record.queue, record.tenant] {
            let refs = &mut self.name_refs[n as usize];
            *refs -= 1;
            if *refs == 0 {
                let name = std::mem::replace(&mut self.names[n as usize], self.vacant.clone());
                self.name_ids.remove(&name);
                self.free_names.push(n);
                for recent in &mut self.recent {
                    if *recent == Some(n) {
                        *recent = None;
                    }
                }
            }
        }
    }

    /// Names held (for tests: vacant indexes are not counted).
    #[cfg(test)]
    pub(super) fn names_held(&self) -> usize {
        self.name_ids.len()
    }

    fn record_of(&mut self, job: Job) -> Record {
        let rare = Rare {
            idempotency_key: job.idempotency_key.map(String::into_boxed_str),
            last_error: job.last_error.map(String::into_boxed_str),
            worker: job.worker.map(String::into_boxed_str),
            leased_at: job.leased_at,
            priority_ms: job.priority_ms,
        };
        let empty = rare.idempotency_key.is_none()
            && rare.last_error.is_none()
            && rare.worker.is_none()
            && rare.leased_at.is_none()
            && rare.priority_ms == 0;
        Record {
            id: job.id,
            lease_seq: job.lease_seq,
            created_at: job.created_at,
            ready_at: job.ready_at,
            updated_at: job.updated_at,
            attempts: job.attempts,
            budget_start: job.budget_start,
            max_attempts: job.max_attempts,
            queue: self.name(&job.queue),
            tenant: self.name(&job.tenant),
            state: job.state,
            rare: (!empty).then(|| Box::new(rare)),
        }
    }

    fn job_at(&self, at: u32) -> Job {
        let r = self.slots[at as usize]
            .as_ref()
            .expect("invariant: the index points at occupied slots");
        let rare = r.rare.as_deref();
        let text = |f: fn(&Rare) -> &Option<Box<str>>| {
            rare.and_then(|x| f(x).as_deref().map(String::from))
        };
        Job {
            id: r.id,
            queue: self.names[r.queue as usize].clone(),
            tenant: self.names[r.tenant as usize].clone(),
            idempotency_key: text(|x| &x.idempotency_key),
            state: r.state,
            attempts: r.attempts,
            budget_start: r.budget_start,
            max_attempts: r.max_attempts,
            lease_seq: r.lease_seq,
            worker: text(|x| &x.worker),
            leased_at: rare.and_then(|x| x.leased_at),
            created_at: r.created_at,
            ready_at: r.ready_at,
            updated_at: r.updated_at,
            last_error: text(|x| &x.last_error),
            priority_ms: rare.map_or(0, |x| x.priority_ms),
        }
    }
}

fn id_in(slots: &[Option<Record>], at: u32) -> JobId {
    slots[at as usize]
        .as_ref()
        .expect("invariant: the index points at occupied slots")
        .id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::NewJob;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn a_record_is_80_bytes() {
        assert_eq!(std::mem::size_of::<Option<Record>>(), 80);
    }

    fn job(n: u8, key: bool, error: bool, leased: bool) -> Job {
        let new = NewJob {
            queue: Arc::from(["q", "r"][usize::from(n % 2)]),
            tenant: Arc::from(["a", "b", "c"][usize::from(n % 3)]),
            idempotency_key: key.then(|| format!("key-{n}")),
            delay: Duration::from_millis(u64::from(n)),
            max_attempts: 3 + u32::from(n),
            priority_ms: i64::from(n % 4) * 1_000 - 1_000,
        };
        let mut job = Job::new(new, 1_000 + i64::from(n));
        job.last_error = error.then(|| format!("error {n}"));
        if leased {
            job.state = State::Leased;
            job.worker = Some(format!("w{n}"));
            job.leased_at = Some(2_000);
            job.lease_seq = u64::from(n) + 1;
        }
        job
    }

    proptest! {
        /// Against a `HashMap<JobId, Job>`: every insert (checked or of a new id),
        /// replace and remove answers the same, and every job reads back field for
        /// field.
        #[test]
        fn the_table_holds_what_a_map_of_jobs_holds(
            ops in prop::collection::vec((0u8..40, any::<bool>(), any::<bool>(), any::<bool>(), 0u8..3), 1..300),
        ) {
            let mut table = JobTable::default();
            let mut model: HashMap<JobId, Job> = HashMap::new();
            let mut ids: Vec<JobId> = Vec::new();
            for (n, key, error, leased, action) in ops {
                match action {
                    0 => {
                        let job = job(n, key, error, leased);
                        ids.push(job.id);
                        if n % 2 == 0 {
                            prop_assert_eq!(model.insert(job.id, job.clone()), None);
                            table.insert_new(job);
                        } else {
                            prop_assert_eq!(table.insert(job.clone()), model.insert(job.id, job));
                        }
                    }
                    1 if !ids.is_empty() => {
                        let id = ids[usize::from(n) % ids.len()];
                        let mut job = job(n, key, error, leased);
                        job.id = id;
                        prop_assert_eq!(table.insert(job.clone()), model.insert(id, job));
                    }
                    _ if !ids.is_empty() => {
                        let id = ids[usize::from(n) % ids.len()];
                        prop_assert_eq!(table.remove(id), model.remove(&id));
                    }
                    _ => {}
                }
                prop_assert_eq!(table.len(), model.len());
                let named: std::collections::HashSet<&str> =
                    model.values().flat_map(|j| [&*j.queue, &*j.tenant]).collect();
                prop_assert_eq!(table.names_held(), named.len(), "the names of held jobs only");
            }
            for id in &ids {
                prop_assert_eq!(table.get(*id), model.get(id).cloned());
            }
            for queue in ["q", "r", "s"] {
                let mut seen: Vec<_> = table
                    .in_queue(queue)
                    .map(|b| (b.id, b.tenant.clone(), b.state, b.ready_at))
                    .collect();
                let mut want: Vec<_> = model
                    .values()
                    .filter(|j| &*j.queue == queue)
                    .map(|j| (j.id, j.tenant.clone(), j.state, j.ready_at))
                    .collect();
                seen.sort_by_key(|x| x.0);
                want.sort_by_key(|x| x.0);
                prop_assert_eq!(seen, want);
            }
        }
    }
}
