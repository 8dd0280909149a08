//! Model test: random sequences of operations applied to the SQLite store (on a temp
//! dir) and to the in-memory store give identical observable results.
//!
//! Each case submits all its operations at once, so they share batches and exercise
//! per-operation savepoints (including operations that write and then fail). Most
//! conditional writes are refused (random states rarely match): both engines must
//! refuse the same ones. Before the database is reopened every lease taken is ended,
//! since leases do not survive a reopen.

use proptest::prelude::*;
use proptest::sample::Index;

use proptest::test_runner::TestCaseError;

use super::*;
use crate::store::memory::MemoryBackend;
use crate::store::postgres::PgOptions;

const QUEUES: [&str; 2] = ["email", "thumbs"];
const TENANTS: [&str; 2] = ["default", "acme"];
const KEYS: [&str; 3] = ["k1", "k2", "k3"];
const PAYLOADS: [&[u8]; 4] = [b"", b"a", b"bb", b"a\0b"];
const ERRORS: [&str; 3] = [
    "Timeout talking to SMTP",
    "exit 75",
    "HTTP 503 from api: <html><body>Service Unavailable; the upstream is being deployed</body></html>",
];
const NEEDLES: [&str; 3] = ["timeout", "EXIT", "zzz"];
const MAX_STEPS: usize = 60;
/// A history cap small enough for a case's few updates to reach it, and for the
/// long error text to be cut.
const TINY_CAP: HistoryLimits = HistoryLimits {
    keep_first: 1,
    keep_last: 2,
    max_error: history::MIN_MAX_ERROR,
};
const STEP_MS: i64 = 3;

/// A generated step; job references are indexes into the jobs made so far.
#[derive(Clone, Debug)]
enum Step {
    /// New jobs; `true`: all or nothing ([`Backend::enqueue_all`]).
    Insert(Vec<NewSpec>, bool),
    InsertThenFail {
        queue: usize,
        key: Option<usize>,
    },
    Change {
        kind: usize,
        job: Index,
        state: usize,
        attempts: u32,
        error: Option<usize>,
        entry: Option<(usize, bool)>,
    },
    Purge(Vec<Index>),
    Claim(Vec<Index>),
    LoadUnfinished,
    Show(Index),
    List(ListSpec),
    Prune {
        scope: Option<usize>,
        back: i64,
        limit: u32,
    },
    OldestFinished(Option<usize>),
    SetOverride {
        name: usize,
        key: usize,
        value: Option<u8>,
    },
    Overrides,
    Counts,
    TenantCounts(usize),
}

#[derive(Clone, Debug)]
struct NewSpec {
    queue: usize,
    tenant: usize,
    key: Option<usize>,
    payload: usize,
    delay: bool,
}

/// The durable states a write may store (a lease is never stored).
const STORED: [State; 5] = [
    State::Delayed,
    State::Ready,
    State::Succeeded,
    State::Dead,
    State::Cancelled,
];

#[derive(Clone, Debug)]
struct ListSpec {
    queue: Option<usize>,
    tenant: Option<usize>,
    state: Option<usize>,
    needle: Option<usize>,
    since_back: Option<i64>,
    after: Option<Index>,
    order: usize,
    limit: u32,
}

/// A concrete operation, applied identically to both stores.
#[derive(Clone, Debug)]
enum Action {
    Insert(Vec<NewRecord>, bool),
    InsertThenFail(Job),
    Complete(Transition),
    Redrive(Transition),
    Cancel(Transition),
    Purge(Vec<JobId>),
    Claim(Vec<Job>),
    LoadUnfinished,
    Show(JobId),
    List(JobFilter),
    Prune(PruneScope, UnixMillis, u32),
    OldestFinished(PruneScope),
    SetOverride(String, String, Option<String>),
    Overrides,
    Counts,
    TenantCounts(String),
}

/// What an operation let the caller see. Errors compare by kind only: the two
/// engines word their messages differently.
#[derive(Debug, PartialEq)]
enum Seen {
    Inserted(Vec<Inserted>),
    Done,
    Count(u64),
    Applied(Vec<bool>),
    Oldest(Option<UnixMillis>),
    Payloads(Vec<Option<Vec<u8>>>),
    Jobs(Vec<Job>),
    Detail(Option<Box<JobDetail>>),
    Overrides(Vec<Override>),
    Counts(Vec<(String, State, u64)>),
    Failed(&'static str),
}

fn kind(err: &StoreError) -> &'static str {
    match err {
        StoreError::Full(_) => "full",
        StoreError::Corrupt(_) => "corrupt",
        StoreError::Permission(_) => "permission",
        StoreError::TooNew { .. } => "too new",
        StoreError::Closed => "closed",
        StoreError::Replaced(_) => "replaced",
        StoreError::Other(_) => "other",
        StoreError::KeyConflict { .. } => "key conflict",
        StoreError::QueueFull { .. } => "queue full",
        StoreError::TenantFull { .. } => "tenant full",
        StoreError::Busy(_) => "busy",
        StoreError::After { .. } => "after",
    }
}

fn apply(action: &Action, b: &mut dyn Backend) -> Result<Seen, StoreError> {
    Ok(match action {
        Action::Insert(batch, false) => Seen::Inserted(b.enqueue(batch)?),
        Action::Insert(batch, true) => Seen::Inserted(b.enqueue_all(batch)?),
        Action::InsertThenFail(job) => {
            let record = NewRecord {
                job: job.clone(),
                payload: b"doomed".to_vec(),
            };
            b.enqueue(&[record])?;
            return Err(StoreError::Other("deliberate failure after a write".into()));
        }
        Action::Complete(t) => Seen::Applied(b.complete(std::slice::from_ref(t))?),
        Action::Redrive(t) => Seen::Applied(b.redrive(std::slice::from_ref(t))?),
        Action::Cancel(t) => Seen::Applied(b.cancel(std::slice::from_ref(t))?),
        Action::Purge(ids) => Seen::Applied(b.purge(ids)?),
        Action::Claim(jobs) => Seen::Payloads(b.claim(jobs)?),
        Action::LoadUnfinished => Seen::Jobs(b.load_unfinished()?),
        Action::Show(id) => Seen::Detail(b.job(*id)?.map(Box::new)),
        Action::List(filter) => Seen::Jobs(b.list_jobs(filter)?),
        Action::Prune(scope, before, limit) => {
            Seen::Count(b.prune_finished(scope, *before, *limit)?)
        }
        Action::OldestFinished(scope) => Seen::Oldest(b.oldest_finished(scope)?),
        Action::SetOverride(name, key, value) => {
            b.set_override("tenant", name, key, value.as_deref())?;
            Seen::Done
        }
        Action::Overrides => Seen::Overrides(b.overrides()?),
        Action::Counts => Seen::Counts(b.counts()?),
        Action::TenantCounts(queue) => Seen::Counts(b.tenant_counts(queue)?),
    })
}

/// Turns steps into actions, keeping the latest version of every job it made.
#[derive(Default)]
struct Driver {
    jobs: Vec<Job>,
    made: u128,
    /// Every lease offered to the stores, as its record (some were refused).
    claims: Vec<Job>,
}

impl Driver {
    fn new_job(&mut self, queue: usize, tenant: usize, key: Option<usize>, now: i64) -> Job {
        self.made += 1;
        // Scrambled ids, so id order differs from insertion order.
        let id = JobId(Uuid::from_u128(
            self.made
                .wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835),
        ));
        let mut job = job(0, QUEUES[queue], key.map(|k| KEYS[k]));
        job.id = id;
        job.tenant = TENANTS[tenant].into();
        (job.created_at, job.ready_at, job.updated_at) = (now, now, now);
        self.jobs.push(job.clone());
        job
    }

    fn new_record(&mut self, spec: NewSpec, now: i64) -> NewRecord {
        let mut job = self.new_job(spec.queue, spec.tenant, spec.key, now);
        if spec.delay {
            job.state = State::Delayed;
            job.ready_at = now + 50;
            if let Some(last) = self.jobs.last_mut() {
                *last = job.clone();
            }
        }
        NewRecord {
            job,
            payload: PAYLOADS[spec.payload].to_vec(),
        }
    }

    /// Ends every lease offered (the ones that are live end; the rest are refused).
    fn end_claims(&self) -> Vec<Action> {
        self.claims
            .iter()
            .map(|claim| {
                let job = Job {
                    state: State::Ready,
                    worker: None,
                    leased_at: None,
                    ..claim.clone()
                };
                Action::Complete(Transition {
                    job,
                    entry: None,
                    result: None,
                })
            })
            .collect()
    }

    fn pick(&self, index: &Index) -> Option<&Job> {
        (!self.jobs.is_empty()).then(|| &self.jobs[index.index(self.jobs.len())])
    }

    fn ids(&self, indexes: &[Index]) -> Vec<JobId> {
        indexes
            .iter()
            .filter_map(|i| self.pick(i))
            .map(|j| j.id)
            .collect()
    }

    fn action(&mut self, step: Step, now: i64) -> Option<Action> {
        Some(match step {
            Step::Insert(specs, all) => Action::Insert(
                specs
                    .into_iter()
                    .map(|spec| self.new_record(spec, now))
                    .collect(),
                all,
            ),
            Step::InsertThenFail { queue, key } => {
                Action::InsertThenFail(self.new_job(queue, 0, key, now))
            }
            Step::Change {
                kind,
                job,
                state,
                attempts,
                error,
                entry,
            } => {
                let at = job.index(self.jobs.len().max(1));
                let job = self.jobs.get_mut(at)?;
                job.state = STORED[state];
                job.attempts = attempts;
                job.updated_at = now;
                job.last_error = error.map(|e| ERRORS[e].to_owned());
                (job.worker, job.leased_at) = (None, None);
                let entry = entry.map(|(outcome, with_worker)| HistoryEntry {
                    attempt: attempts,
                    outcome: Outcome::ALL[outcome],
                    worker: with_worker.then(|| "w/1".to_owned()),
                    started_at: with_worker.then_some(now - 1),
                    ended_at: now,
                    error: job.last_error.clone(),
                });
                let t = Transition {
                    job: job.clone(),
                    entry,
                    result: None,
                };
                [Action::Complete, Action::Redrive, Action::Cancel][kind](t)
            }
            Step::Purge(indexes) => Action::Purge(self.ids(&indexes)),
            Step::Claim(indexes) => {
                let mut leased = Vec::new();
                for id in self.ids(&indexes) {
                    let job = self.jobs.iter_mut().find(|j| j.id == id)?;
                    job.lease_seq += 1;
                    let claim = Job {
                        state: State::Leased,
                        worker: Some("w/2".into()),
                        leased_at: Some(now),
                        ..job.clone()
                    };
                    self.claims.push(claim.clone());
                    leased.push(claim);
                }
                Action::Claim(leased)
            }
            Step::LoadUnfinished => Action::LoadUnfinished,
            Step::Show(index) => Action::Show(self.pick(&index)?.id),
            Step::List(spec) => Action::List(JobFilter {
                queue: spec.queue.map(|q| QUEUES[q].to_owned()),
                tenant: spec.tenant.map(|t| TENANTS[t].to_owned()),
                state: spec.state.map(|s| State::ALL[s]),
                error_contains: spec.needle.map(|n| NEEDLES[n].to_owned()),
                updated_since: spec.since_back.map(|back| now - STEP_MS * back),
                after: spec.after.and_then(|i| self.pick(&i)).map(|j| j.id),
                order: [
                    JobOrder::OldestFirst,
                    JobOrder::NewestFirst,
                    JobOrder::RecentlyUpdated,
                ][spec.order],
                limit: spec.limit,
                now,
            }),
            Step::Prune { scope, back, limit } => {
                Action::Prune(prune_scope(scope), now - STEP_MS * back, limit)
            }
            Step::OldestFinished(scope) => Action::OldestFinished(prune_scope(scope)),
            Step::SetOverride { name, key, value } => Action::SetOverride(
                TENANTS[name].to_owned(),
                ["weight", "max_concurrency"][key].to_owned(),
                value.map(|v| v.to_string()),
            ),
            Step::Overrides => Action::Overrides,
            Step::Counts => Action::Counts,
            Step::TenantCounts(queue) => Action::TenantCounts(QUEUES[queue].to_owned()),
        })
    }
}

/// One queue's jobs (`Some(i)`), or those of queues other than the first.
fn prune_scope(scope: Option<usize>) -> PruneScope {
    match scope {
        Some(q) => PruneScope::Queue(QUEUES[q].to_owned()),
        None => PruneScope::Unconfigured(vec![QUEUES[0].to_owned()]),
    }
}

/// How many steps back a time filter looks: a time on the steps' clock (step n runs
/// at `STEP_MS * n`), near now, so filters hit their boundaries exactly and often.
fn steps_back() -> impl Strategy<Value = i64> {
    0..8i64
}

fn list_spec() -> impl Strategy<Value = ListSpec> {
    (
        proptest::option::of(0..2usize),
        proptest::option::of(0..2usize),
        proptest::option::of(0..6usize),
        proptest::option::of(0..3usize),
        proptest::option::of(steps_back()),
        proptest::option::of(any::<Index>()),
        0..3usize,
        0..6u32,
    )
        .prop_map(
            |(queue, tenant, state, needle, since_back, after, order, limit)| ListSpec {
                queue,
                tenant,
                state,
                needle,
                since_back,
                after,
                order,
                limit,
            },
        )
}

fn step() -> impl Strategy<Value = Step> {
    let spec = (
        0..2usize,
        0..2usize,
        proptest::option::of(0..3usize),
        0..4usize,
        any::<bool>(),
    )
        .prop_map(|(queue, tenant, key, payload, delay)| NewSpec {
            queue,
            tenant,
            key,
            payload,
            delay,
        });
    let insert = (proptest::collection::vec(spec, 1..4), any::<bool>())
        .prop_map(|(specs, all)| Step::Insert(specs, all));
    let fail = (0..2usize, proptest::option::of(0..3usize))
        .prop_map(|(queue, key)| Step::InsertThenFail { queue, key });
    let entry = proptest::option::of((0..Outcome::ALL.len(), any::<bool>()));
    let change = (
        0..3usize,
        any::<Index>(),
        0..STORED.len(),
        0..4u32,
        proptest::option::of(0..3usize),
        entry,
    )
        .prop_map(|(kind, job, state, attempts, error, entry)| Step::Change {
            kind,
            job,
            state,
            attempts,
            error,
            entry,
        });
    let ids = || proptest::collection::vec(any::<Index>(), 0..3);
    let set = (0..2usize, 0..2usize, proptest::option::of(any::<u8>()))
        .prop_map(|(name, key, value)| Step::SetOverride { name, key, value });
    prop_oneof![
        6 => insert,
        1 => fail,
        5 => change,
        1 => ids().prop_map(Step::Purge),
        3 => ids().prop_map(Step::Claim),
        1 => Just(Step::LoadUnfinished),
        1 => any::<Index>().prop_map(Step::Show),
        3 => list_spec().prop_map(Step::List),
        2 => (proptest::option::of(0..2usize), steps_back(), 0..4u32)
            .prop_map(|(scope, back, limit)| Step::Prune { scope, back, limit }),
        1 => proptest::option::of(0..2usize).prop_map(Step::OldestFinished),
        1 => set,
        1 => Just(Step::Overrides),
        1 => Just(Step::Counts),
        1 => (0..QUEUES.len()).prop_map(Step::TenantCounts),
    ]
}

/// Submits every action without waiting and returns what each caller saw, in order.
fn observe(store: &Store, actions: &[Action]) -> Vec<Seen> {
    let (tx, rx) = mpsc::channel();
    for (n, action) in actions.iter().cloned().enumerate() {
        let tx = tx.clone();
        store.submit(
            move |b| apply(&action, b),
            move |result| {
                let _ = tx.send((n, result.unwrap_or_else(|e| Seen::Failed(kind(&e)))));
            },
        );
    }
    let mut seen: Vec<(usize, Seen)> = (0..actions.len())
        .map(|_| {
            rx.recv_timeout(ANSWER_WITHIN)
                .expect("every action answered")
        })
        .collect();
    seen.sort_by_key(|(n, _)| *n);
    seen.into_iter().map(|(_, s)| s).collect()
}

/// The steps of one case, as actions: the steps in order, then the end of every
/// lease offered (leases are not compared across a reopen).
fn actions(steps: Vec<Step>) -> Vec<Action> {
    let mut driver = Driver::default();
    let mut actions: Vec<Action> = steps
        .into_iter()
        .enumerate()
        .filter_map(|(n, step)| driver.action(step, STEP_MS * n as i64))
        .collect();
    actions.extend(driver.end_claims());
    actions
}

/// Runs `actions` on `store` (empty) and on the in-memory model, asserting both saw
/// the same; then closes `store` and asserts that what `reopen` reads back is what
/// the model holds.
fn agree_with_memory(
    actions: &[Action],
    store: Store,
    reopen: impl FnOnce() -> Store,
) -> Result<(), TestCaseError> {
    // The model of the same lease contract: local leases (SQLite), or leases shared
    // by several nodes (PostgreSQL).
    let model = match store.leases_are_local() {
        true => MemoryBackend::new(TINY_CAP),
        false => MemoryBackend::shared(TINY_CAP),
    };
    let memory = Store::start(model, None).expect("model store");
    let from_store = observe(&store, actions);
    let from_memory = observe(&memory, actions);
    for (n, (s, m)) in from_store.iter().zip(&from_memory).enumerate() {
        prop_assert_eq!(s, m, "action {} = {:?}", n, &actions[n]);
    }
    // And what was committed is what a reopened database reads back.
    store.close();
    let reopened = reopen();
    let tail = [Action::LoadUnfinished, Action::Counts, Action::Overrides];
    prop_assert_eq!(observe(&reopened, &tail), observe(&memory, &tail));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn sqlite_and_memory_stores_agree(steps in proptest::collection::vec(step(), 1..MAX_STEPS)) {
        let (_dir, path) = temp_db();
        let options = SqliteOptions { history: TINY_CAP, ..SqliteOptions::default() };
        let sqlite = Store::open_sqlite_with(&path, &options).expect("open store");
        let reopen = || Store::open_sqlite_with(&path, &options).expect("reopen store");
        agree_with_memory(&actions(steps), sqlite, reopen)?;
    }
}

/// The same property against PostgreSQL, a fresh database per case (fewer cases:
/// each creates a database).
#[test]
fn postgres_and_memory_stores_agree() {
    let Some(first) = super::pg::database() else {
        return;
    };
    let options = PgOptions {
        history: TINY_CAP,
        ..PgOptions::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    let spare = Mutex::new(Some(first));
    let result = runner.run(&proptest::collection::vec(step(), 1..MAX_STEPS), |steps| {
        let first = spare.lock().expect("spare database").take();
        let db = first.or_else(super::pg::database).expect("database");
        let open = || super::postgres::open_pg(&db.url, &options);
        agree_with_memory(&actions(steps), open(), open)
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}
