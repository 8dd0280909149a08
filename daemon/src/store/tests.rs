//! Tests of the store: group commit and durability, error mapping on open, disk full,
//! panics and closing. The model test (SQLite against memory) is in `tests/model.rs`;
//! what every engine shares, in the conformance suite (`tests/conformance.rs`).

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use uuid::Uuid;

use super::*;
use crate::job::{Outcome, Token};

mod conformance;
mod dependencies_pg;
mod edges;
mod model;
mod pg;
mod pg_cluster_facts;
mod postgres;
mod schedules;
mod upkeep;

const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// A ready job of `queue` with a fixed id `n` (ids sort like `n`).
fn job(n: u128, queue: &str, key: Option<&str>) -> Job {
    Job {
        id: JobId(Uuid::from_u128(n)),
        queue: queue.into(),
        tenant: "default".into(),
        idempotency_key: key.map(str::to_owned),
        state: State::Ready,
        attempts: 0,
        budget_start: 0,
        max_attempts: 3,
        lease_seq: 0,
        worker: None,
        leased_at: None,
        created_at: 1_000,
        ready_at: 1_000,
        updated_at: 1_000,
        last_error: None,
        priority_ms: 0,
    }
}

/// Enqueues one job through the batch interface and returns its one answer.
fn insert(b: &mut dyn Backend, job: &Job, payload: &[u8]) -> Result<Inserted, StoreError> {
    let record = NewRecord {
        job: job.clone(),
        payload: payload.to_vec(),
    };
    Ok(b.enqueue(&[record])?.remove(0))
}

/// `job` leased under `token` by worker `w/1` at 1_500.
fn leased(job: &Job, token: Token) -> Job {
    Job {
        state: State::Leased,
        lease_seq: token,
        worker: Some("w/1".into()),
        leased_at: Some(1_500),
        ..job.clone()
    }
}

/// Submits `op` and waits for its completion.
fn block<R, Op>(store: &Store, op: Op) -> Result<R, StoreError>
where
    R: Send + 'static,
    Op: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    store.submit(op, move |result| {
        let _ = tx.send(result);
    });
    rx.recv_timeout(ANSWER_WITHIN)
        .expect("store answers every submit")
}

/// Holds the writer thread inside an operation until the returned sender is used (or
/// dropped), so everything submitted meanwhile lands in the next batch.
fn hold_writer(store: &Store) -> mpsc::Sender<()> {
    let (release, held) = mpsc::channel::<()>();
    let (started_tx, started) = mpsc::channel();
    store.submit(
        move |_| {
            let _ = started_tx.send(());
            let _ = held.recv();
            Ok(())
        },
        |_| {},
    );
    started
        .recv_timeout(ANSWER_WITHIN)
        .expect("writer picks up the gate");
    release
}

fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("qd.db");
    (dir, path)
}

fn open(path: &Path) -> Store {
    Store::open_sqlite(path).expect("open store")
}

#[test]
fn concurrent_inserts_are_durable_and_share_few_commits() {
    const THREADS: u128 = 8;
    const PER_THREAD: u128 = 125;
    let (_dir, path) = temp_db();
    let store = open(&path);
    let reader = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("second, read-only connection");
    let reader = Arc::new(Mutex::new(reader));
    let answered_before_visible = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = mpsc::channel();
    let release = hold_writer(&store);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (store, reader, early, done_tx) = (
                store.clone(),
                Arc::clone(&reader),
                Arc::clone(&answered_before_visible),
                done_tx.clone(),
            );
            scope.spawn(move || {
                for i in 0..PER_THREAD {
                    let job = job(1 + t * PER_THREAD + i, "email", None);
                    let id = job.id;
                    let (reader, early, done_tx) =
                        (Arc::clone(&reader), Arc::clone(&early), done_tx.clone());
                    store.submit(
                        move |b| insert(b, &job, &[7; 200]),
                        move |result| {
                            let visible: i64 = reader
                                .lock()
                                .expect("reader lock")
                                .query_row(
                                    "SELECT COUNT(*) FROM jobs WHERE id = ?1",
                                    [id.0.as_bytes()],
                                    |r| r.get(0),
                                )
                                .expect("read through the second connection");
                            if visible != 1 {
                                early.fetch_add(1, Ordering::SeqCst);
                            }
                            let _ = done_tx.send(result);
                        },
                    );
                }
            });
        }
    });
    drop(release);
    for _ in 0..THREADS * PER_THREAD {
        let result = done_rx
            .recv_timeout(ANSWER_WITHIN)
            .expect("every insert answered");
        assert_eq!(result, Ok(Inserted::New));
    }
    assert_eq!(answered_before_visible.load(Ordering::SeqCst), 0);
    let stats = store.stats();
    assert!(stats.commits <= 10, "group commit: {stats:?}");
    assert_eq!(stats.ops, 1 + 1000);
    assert!(stats.size_bytes > 200 * 1000, "{stats:?}");
    drop(store);

    let store = open(&path);
    let jobs = block(&store, |b| b.load_unfinished()).expect("load");
    let ids: Vec<u128> = jobs.iter().map(|j| j.id.0.as_u128()).collect();
    assert_eq!(ids, (1..=1000).collect::<Vec<_>>());
    let counts = block(&store, |b| b.counts()).expect("counts");
    assert_eq!(counts, vec![("email".to_owned(), State::Ready, 1000)]);
}

#[test]
fn jobs_history_and_overrides_survive_reopen() {
    let (_dir, path) = temp_db();
    let store = open(&path);
    let mut stored = job(1, "email", Some("k"));
    let inserted = stored.clone();
    block(&store, move |b| insert(b, &inserted, b"hello")).expect("insert");
    stored.state = State::Dead;
    stored.attempts = 3;
    stored.lease_seq = 3;
    stored.last_error = Some("exit 75".into());
    let entry = HistoryEntry {
        attempt: 3,
        outcome: Outcome::Failed,
        worker: Some("email/1".into()),
        started_at: Some(1_500),
        ended_at: 1_600,
        error: Some("exit 75".into()),
    };
    let end = Transition {
        job: stored.clone(),
        entry: Some(entry.clone()),
        result: None,
    };
    let claim = leased(&stored, 3);
    let claimed = block(&store, move |b| b.claim(&[claim])).expect("claim");
    assert_eq!(claimed, vec![Some(b"hello".to_vec())]);
    let applied = block(&store, move |b| b.complete(&[end])).expect("complete");
    assert_eq!(applied, vec![true]);
    block(&store, |b| {
        b.set_override("tenant", "acme", "weight", Some("5"))
    })
    .expect("set");
    store.close();

    let store = open(&path);
    let id = stored.id;
    let detail = block(&store, move |b| b.job(id)).expect("read");
    assert_eq!(
        detail,
        Some(JobDetail {
            job: stored,
            payload: b"hello".to_vec(),
            result: None,
            history: vec![entry],
            history_elided: 0,
            history_elided_at: 1,
        })
    );
    let overrides = block(&store, |b| b.overrides()).expect("overrides");
    assert_eq!(overrides.len(), 1);
    assert_eq!(overrides[0].value, "5");
}

#[test]
fn sqs_queues_are_written_replaced_deleted_and_survive_reopen() {
    let record = |name: &str, vt: &str| super::SqsQueueRecord {
        name: name.into(),
        attributes: format!(r#"{{"VisibilityTimeout":"{vt}"}}"#),
        tags: "{}".into(),
        created_at: 1_000,
        modified_at: 2_000,
    };
    let (_dir, path) = temp_db();
    for store in [open(&path), Store::open_memory()] {
        let (a, b2) = (record("a", "30"), record("b", "5"));
        let existed = block(&store, move |b| {
            Ok((
                b.set_sqs_queue("b", Some(&b2))?,
                b.set_sqs_queue("a", Some(&a))?,
            ))
        })
        .expect("create");
        assert_eq!(existed, (false, false));
        let replaced = record("a", "60");
        let r = replaced.clone();
        assert!(block(&store, move |b| b.set_sqs_queue("a", Some(&r))).expect("replace"));
        assert!(block(&store, |b| b.set_sqs_queue("b", None)).expect("delete"));
        assert!(!block(&store, |b| b.set_sqs_queue("b", None)).expect("delete again"));
        assert_eq!(
            block(&store, |b| b.sqs_queues()).expect("read"),
            vec![replaced]
        );
        store.close();
    }
    let store = open(&path);
    assert_eq!(
        block(&store, |b| b.sqs_queues()).expect("read after reopen"),
        vec![record("a", "60")]
    );
}

#[test]
fn full_disk_fails_inserts_with_full_and_keeps_earlier_rows() {
    let (_dir, path) = temp_db();
    let small = SqliteOptions {
        max_page_count: Some(64),
        ..SqliteOptions::default()
    };
    let store = Store::open_sqlite_with(&path, &small).expect("open small store");
    let mut stored = 0u128;
    let error = loop {
        assert!(stored < 200, "64 pages never filled");
        let next = job(stored + 1, "q", None);
        match block(&store, move |b| insert(b, &next, &[1; 4096])) {
            Ok(_) => stored += 1,
            Err(err) => break err,
        }
    };
    assert!(
        matches!(&error, StoreError::Full(m) if m.contains(&path.display().to_string())),
        "{error:?}"
    );
    let counts = block(&store, |b| b.counts()).expect("reads still work");
    assert_eq!(counts, vec![("q".to_owned(), State::Ready, stored as u64)]);
    drop(store);

    let roomy = SqliteOptions {
        max_page_count: Some(4096),
        ..SqliteOptions::default()
    };
    let store = Store::open_sqlite_with(&path, &roomy).expect("reopen with room");
    let next = job(stored + 1, "q", None);
    assert_eq!(
        block(&store, move |b| insert(b, &next, &[1; 4096])),
        Ok(Inserted::New)
    );
    let unfinished = block(&store, |b| b.load_unfinished()).expect("load");
    assert_eq!(unfinished.len() as u128, stored + 1);
}

#[test]
fn garbage_file_is_refused_as_corrupt_naming_the_path() {
    let (_dir, path) = temp_db();
    std::fs::write(
        &path,
        b"this is not a database, just some text ".repeat(200),
    )
    .expect("write");
    match Store::open_sqlite(&path) {
        Err(StoreError::Corrupt(message)) => {
            assert!(message.contains(&path.display().to_string()), "{message}");
        }
        other => panic!("expected Corrupt, got {:?}", other.map(|_| "a store")),
    }
}

#[test]
fn missing_directory_is_refused_naming_it() {
    let (dir, _) = temp_db();
    let path = dir.path().join("absent").join("qd.db");
    match Store::open_sqlite(&path) {
        Err(StoreError::Permission(message)) => {
            assert!(message.contains(&path.display().to_string()), "{message}");
        }
        other => panic!("expected Permission, got {:?}", other.map(|_| "a store")),
    }
}

/// `/proc/self` is a directory no one, not even root, can create files in.
#[cfg(target_os = "linux")]
#[test]
fn unwritable_directory_is_refused_as_permission() {
    let path = Path::new("/proc/self/qd.db");
    match Store::open_sqlite(path) {
        Err(StoreError::Permission(message)) => {
            assert!(message.contains("/proc/self/qd.db"), "{message}");
        }
        other => panic!("expected Permission, got {:?}", other.map(|_| "a store")),
    }
}

#[test]
fn newer_schema_is_refused_as_too_new() {
    let (_dir, path) = temp_db();
    open(&path).close();
    let raw = Connection::open(&path).expect("raw connection");
    raw.pragma_update(None, "user_version", sqlite::SCHEMA_VERSION + 1)
        .expect("bump version");
    drop(raw);
    match Store::open_sqlite(&path) {
        Err(StoreError::TooNew { found, supported }) => {
            assert_eq!(
                (found, supported),
                (sqlite::SCHEMA_VERSION + 1, sqlite::SCHEMA_VERSION)
            );
        }
        other => panic!("expected TooNew, got {:?}", other.map(|_| "a store")),
    }
}

#[test]
fn panicking_op_is_answered_and_its_batch_still_commits() {
    let (_dir, path) = temp_db();
    let store = open(&path);
    let release = hold_writer(&store);
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    store.submit(
        |b| {
            insert(b, &job(1, "q", None), b"lost")?;
            panic!("op exploded");
        },
        move |r: Result<(), StoreError>| {
            let _ = tx.send(("panicked", r.map(drop)));
        },
    );
    store.submit(
        |b| insert(b, &job(2, "q", None), b"kept"),
        move |r| {
            let _ = tx2.send(("next", r.map(drop)));
        },
    );
    drop(release);
    let (_, panicked) = rx.recv_timeout(ANSWER_WITHIN).expect("answer");
    assert!(
        matches!(&panicked, Err(StoreError::Other(m)) if m.contains("op exploded")),
        "{panicked:?}"
    );
    assert_eq!(
        rx.recv_timeout(ANSWER_WITHIN).expect("answer"),
        ("next", Ok(()))
    );
    let payloads = block(&store, |b| {
        let mut found = Vec::new();
        for n in [1, 2] {
            found.push(b.job(JobId(Uuid::from_u128(n)))?.map(|d| d.payload));
        }
        Ok(found)
    });
    assert_eq!(payloads, Ok(vec![None, Some(b"kept".to_vec())]));
}

#[test]
fn panicking_completion_does_not_stop_the_writer() {
    let store = Store::open_memory();
    store.submit(|_| Ok(()), |_| panic!("completion exploded"));
    assert_eq!(block(&store, |b| b.counts()), Ok(Vec::new()));
}

#[test]
fn failing_op_is_rolled_back_alone() {
    let (_dir, path) = temp_db();
    let store = open(&path);
    let release = hold_writer(&store);
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    store.submit(
        |b| {
            insert(b, &job(1, "q", Some("k")), b"undone")?;
            Err::<(), _>(StoreError::Other("refused".into()))
        },
        move |r| {
            let _ = tx.send(r);
        },
    );
    store.submit(
        |b| insert(b, &job(2, "q", Some("k")), b"kept").map(drop),
        move |r| {
            let _ = tx2.send(r);
        },
    );
    drop(release);
    assert_eq!(
        rx.recv_timeout(ANSWER_WITHIN),
        Ok(Err(StoreError::Other("refused".into())))
    );
    assert_eq!(rx.recv_timeout(ANSWER_WITHIN), Ok(Ok(())));
    let counts = block(&store, |b| b.counts());
    assert_eq!(counts, Ok(vec![("q".to_owned(), State::Ready, 1)]));
}

/// `enqueue_all` on both backends: a key conflict anywhere undoes the whole batch;
/// same-payload duplicates (stored or earlier in the batch) are answered, not refused.
#[test]
fn enqueue_all_is_all_or_nothing_on_a_key_conflict() {
    let (_dir, path) = temp_db();
    for store in [open(&path), Store::open_memory()] {
        let stored = block(&store, |b| insert(b, &job(1, "q", Some("k1")), b"one"));
        assert_eq!(stored, Ok(Inserted::New));
        let records = |items: &[(u128, Option<&str>, &[u8])]| -> Vec<NewRecord> {
            items
                .iter()
                .map(|(n, key, payload)| NewRecord {
                    job: job(*n, "q", *key),
                    payload: payload.to_vec(),
                })
                .collect()
        };
        let refused = records(&[
            (2, None, b"a"),
            (3, Some("k3"), b"b"),
            (4, Some("k1"), b"x"),
        ]);
        let err = block(&store, move |b| b.enqueue_all(&refused));
        assert_eq!(
            err,
            Err(StoreError::KeyConflict {
                index: 2,
                id: job(1, "q", None).id
            })
        );
        let inside = records(&[(5, Some("k5"), b"a"), (6, Some("k5"), b"b")]);
        let err = block(&store, move |b| b.enqueue_all(&inside));
        assert_eq!(
            err,
            Err(StoreError::KeyConflict {
                index: 1,
                id: job(5, "q", None).id
            })
        );
        let counts = block(&store, |b| b.counts());
        assert_eq!(
            counts,
            Ok(vec![("q".to_owned(), State::Ready, 1)]),
            "nothing of either batch"
        );
        let fine = records(&[
            (7, Some("k1"), b"one"),
            (8, Some("k8"), b"c"),
            (9, Some("k8"), b"c"),
        ]);
        let answers = block(&store, move |b| b.enqueue_all(&fine));
        let dup = |n: u128| Inserted::Duplicate {
            id: job(n, "q", None).id,
            same_payload: true,
        };
        assert_eq!(answers, Ok(vec![dup(1), Inserted::New, dup(8)]));
        store.close();
    }
}

#[test]
fn close_finishes_queued_work_then_answers_closed_at_once() {
    let store = Store::open_memory();
    let answered = Arc::new(AtomicUsize::new(0));
    for n in 0..100 {
        let answered = Arc::clone(&answered);
        store.submit(
            move |b| insert(b, &job(n, "q", None), b""),
            move |r| {
                assert_eq!(r, Ok(Inserted::New));
                answered.fetch_add(1, Ordering::SeqCst);
            },
        );
    }
    store.close();
    assert_eq!(answered.load(Ordering::SeqCst), 100);
    let closed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&closed);
    store.submit(
        |b| b.counts(),
        move |r| flag.store(r == Err(StoreError::Closed), Ordering::SeqCst),
    );
    assert!(
        closed.load(Ordering::SeqCst),
        "answered Closed before submit returned"
    );
}

#[tokio::test]
async fn run_resolves_after_commit_and_closed_after_close() {
    let store = Store::open_memory();
    let inserted = store
        .run(|b| insert(b, &job(1, "q", Some("k")), b"p"))
        .await;
    assert_eq!(inserted, Ok(Inserted::New));
    let again = store
        .run(|b| insert(b, &job(2, "q", Some("k")), b"other"))
        .await;
    let id = JobId(Uuid::from_u128(1));
    assert_eq!(
        again,
        Ok(Inserted::Duplicate {
            id,
            same_payload: false
        })
    );
    store.close();
    assert_eq!(store.run(|b| b.counts()).await, Err(StoreError::Closed));
}

/// A memory engine whose commits fail while the first flag is set, to see how a
/// failed batch is answered; while the second is set, claims (lease records) fail
/// as SQLite's SQLITE_FULL does, abandoning the transaction, so the savepoint is
/// gone too and a rollback to it fails.
struct FailingCommit(memory::MemoryBackend, Arc<AtomicBool>, Arc<AtomicBool>);

impl Backend for FailingCommit {
    fn enqueue(&mut self, batch: &[NewRecord]) -> Result<Vec<Inserted>, StoreError> {
        self.0.enqueue(batch)
    }
    fn claim(&mut self, leased: &[Job]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if self.2.load(Ordering::SeqCst) {
            return Err(StoreError::Full("claim refused".into()));
        }
        self.0.claim(leased)
    }
    fn leases_are_local(&self) -> bool {
        self.0.leases_are_local()
    }
    fn complete(&mut self, ends: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.0.complete(ends)
    }
    fn redrive(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.0.redrive(changes)
    }
    fn set_payload(&mut self, id: JobId, payload: &[u8]) -> Result<bool, StoreError> {
        self.0.set_payload(id, payload)
    }
    fn cancel(&mut self, changes: &[Transition]) -> Result<Vec<bool>, StoreError> {
        self.0.cancel(changes)
    }
    fn purge(&mut self, ids: &[JobId]) -> Result<Vec<bool>, StoreError> {
        self.0.purge(ids)
    }
    fn load_unfinished(&mut self) -> Result<Vec<Job>, StoreError> {
        self.0.load_unfinished()
    }
    fn job(&mut self, id: JobId) -> Result<Option<JobDetail>, StoreError> {
        self.0.job(id)
    }
    fn list_jobs(&mut self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        self.0.list_jobs(filter)
    }
    fn prune_finished(
        &mut self,
        scope: &PruneScope,
        before: UnixMillis,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.0.prune_finished(scope, before, limit)
    }
    fn oldest_finished(&mut self, scope: &PruneScope) -> Result<Option<UnixMillis>, StoreError> {
        self.0.oldest_finished(scope)
    }
    fn release_space(&mut self, keep_free: u32, max_pages: u32) -> Result<u32, StoreError> {
        self.0.release_space(keep_free, max_pages)
    }
    fn set_override(
        &mut self,
        scope: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        self.0.set_override(scope, name, key, value)
    }
    fn overrides(&mut self) -> Result<Vec<Override>, StoreError> {
        self.0.overrides()
    }
    fn sqs_queues(&mut self) -> Result<Vec<super::SqsQueueRecord>, StoreError> {
        self.0.sqs_queues()
    }
    fn set_sqs_queue(
        &mut self,
        name: &str,
        record: Option<&super::SqsQueueRecord>,
    ) -> Result<bool, StoreError> {
        self.0.set_sqs_queue(name, record)
    }
    fn schedules(&mut self) -> Result<Vec<ScheduleRow>, StoreError> {
        self.0.schedules()
    }
    fn advance_schedule(&mut self, advance: &Advance) -> Result<bool, StoreError> {
        self.0.advance_schedule(advance)
    }
    fn record_schedule_run(
        &mut self,
        name: &str,
        tick: UnixMillis,
        job: JobId,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.0.record_schedule_run(name, tick, job, now)
    }
    fn set_schedule_paused(
        &mut self,
        name: &str,
        paused: bool,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.0.set_schedule_paused(name, paused, now)
    }
    fn probe(&mut self, now: UnixMillis) -> Result<(), StoreError> {
        self.0.probe(now)
    }
    fn counts(&mut self) -> Result<Vec<(String, State, u64)>, StoreError> {
        self.0.counts()
    }
    fn tenant_counts(&mut self, queue: &str) -> Result<Vec<(String, State, u64)>, StoreError> {
        self.0.tenant_counts(queue)
    }
}

impl Engine for FailingCommit {
    fn begin(&mut self) -> Result<(), StoreError> {
        self.0.begin()
    }
    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.0.savepoint()
    }
    fn release(&mut self) -> Result<(), StoreError> {
        self.0.release()
    }
    fn rollback_to(&mut self) -> Result<(), StoreError> {
        if self.2.load(Ordering::SeqCst) {
            return Err(StoreError::Other("no such savepoint: op".into()));
        }
        self.0.rollback_to()
    }
    fn commit(&mut self) -> Result<(), StoreError> {
        if self.1.load(Ordering::SeqCst) {
            return Err(StoreError::Full("commit refused".into()));
        }
        self.0.commit()
    }
    fn rollback(&mut self) {
        self.0.rollback();
    }
    fn shutdown(&mut self) {}
}

#[test]
fn failed_commit_answers_every_op_with_its_error_and_keeps_nothing() {
    let fail = Arc::new(AtomicBool::new(true));
    let engine = FailingCommit(
        memory::MemoryBackend::default(),
        Arc::clone(&fail),
        Arc::default(),
    );
    let store = Store::start(engine, None).expect("start writer");
    let release = hold_writer(&store);
    let (tx, rx) = mpsc::channel();
    for n in 1..=3 {
        let tx = tx.clone();
        store.submit(
            move |b| insert(b, &job(n, "q", None), b"x"),
            move |r| {
                let _ = tx.send(r);
            },
        );
    }
    drop(release);
    for _ in 1..=3 {
        let answer = rx.recv_timeout(ANSWER_WITHIN).expect("answer");
        assert_eq!(answer, Err(StoreError::Full("commit refused".into())));
    }
    assert_eq!(store.stats().commits, 0);
    fail.store(false, Ordering::SeqCst);
    assert_eq!(block(&store, |b| b.counts()), Ok(Vec::new()), "rolled back");
    assert_eq!(store.stats().commits, 1);
}

#[test]
fn a_failed_batch_puts_its_lease_records_back_for_the_next_one() {
    let fail = Arc::new(AtomicBool::new(false));
    let engine = FailingCommit(
        memory::MemoryBackend::default(),
        Arc::clone(&fail),
        Arc::default(),
    );
    let store = Store::start(engine, None).expect("start writer");
    let one = job(1, "q", None);
    let stored = one.clone();
    block(&store, move |b| insert(b, &stored, b"p")).expect("insert");
    store.record_leases_later(vec![leased(&one, 1)]);
    fail.store(true, Ordering::SeqCst);
    assert!(block(&store, |b| b.counts()).is_err(), "the batch fails");
    fail.store(false, Ordering::SeqCst);
    assert_eq!(
        block(&store, |b| b.load_unfinished()),
        Ok(vec![leased(&one, 1)]),
        "the lease, still live in memory, is recorded by the next batch"
    );
}

#[test]
fn a_full_disk_while_lease_records_are_written_is_what_the_batch_answers() {
    let abandon = Arc::new(AtomicBool::new(false));
    let engine = FailingCommit(
        memory::MemoryBackend::default(),
        Arc::default(),
        Arc::clone(&abandon),
    );
    let store = Store::start(engine, None).expect("start writer");
    let one = job(1, "q", None);
    let stored = one.clone();
    block(&store, move |b| insert(b, &stored, b"p")).expect("insert");
    store.record_leases_later(vec![leased(&one, 1)]);
    abandon.store(true, Ordering::SeqCst);
    assert_eq!(
        block(&store, |b| b.counts()),
        Err(StoreError::Full("claim refused".into())),
        "the disk's refusal (a 507 to callers), not the failed rollback (a 503)"
    );
}

#[test]
fn a_lease_is_not_durable_and_its_job_is_ready_after_reopen() {
    let (_dir, path) = temp_db();
    let store = open(&path);
    let stored = job(1, "q", Some("k"));
    let inserted = stored.clone();
    block(&store, move |b| insert(b, &inserted, b"p")).expect("insert");
    let size = store.stats().size_bytes;
    let claim = leased(&stored, 1);
    block(&store, move |b| b.claim(&[claim])).expect("claim");
    assert_eq!(
        store.stats().size_bytes,
        size,
        "a claim writes nothing to disk"
    );
    let seen = block(&store, |b| b.load_unfinished()).expect("load");
    assert_eq!(seen, vec![leased(&stored, 1)], "reads show the live lease");
    store.close();
    let store = open(&path);
    assert_eq!(block(&store, |b| b.load_unfinished()), Ok(vec![stored]));
}

/// Leases handed out before their record ([`Store::record_leases_later`]) cost no
/// write of their own: the next batch writes them before its ops, so a read or the
/// lease's end submitted afterwards sees them; a record the store refuses (the job
/// is not claimable) is logged and the batch's ops still commit.
#[test]
fn lease_records_ride_on_the_next_batch_before_its_ops() {
    let (_dir, path) = temp_db();
    let store = open(&path);
    let (one, two) = (job(1, "q", None), job(2, "q", None));
    let (a, b) = (one.clone(), two.clone());
    block(&store, move |s| {
        insert(s, &a, b"p")?;
        insert(s, &b, b"p")
    })
    .expect("insert");
    let commits = store.stats().commits;
    store.record_leases_later(vec![leased(&one, 1)]);
    assert_eq!(
        store.stats().commits,
        commits,
        "a record alone starts no batch"
    );
    let seen = block(&store, |s| s.load_unfinished()).expect("load");
    assert_eq!(
        seen,
        vec![leased(&one, 1), two.clone()],
        "the next op sees it"
    );
    let end = Transition {
        job: Job {
            state: State::Ready,
            attempts: 1,
            lease_seq: 1,
            ..two.clone()
        },
        entry: None,
        result: None,
    };
    store.record_leases_later(vec![leased(&two, 2)]);
    assert_eq!(
        block(&store, move |s| s.complete(&[end])),
        Ok(vec![false]),
        "the recorded lease (token 2) is not the one ending (token 1)"
    );
    store.record_leases_later(vec![leased(&job(3, "q", None), 1)]);
    let fresh = job(4, "q", None);
    let inserted = fresh.clone();
    block(&store, move |s| insert(s, &inserted, b"p")).expect("a refused record fails nothing");
    let seen = block(&store, |s| s.load_unfinished()).expect("load");
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[2], fresh);
}

#[test]
fn a_version_1_database_is_migrated_keeping_its_jobs_payloads_and_history() {
    let (_dir, path) = temp_db();
    let raw = Connection::open(&path).expect("raw connection");
    raw.execute_batch(sqlite::V1).expect("version 1 schema");
    raw.execute_batch(
        "PRAGMA user_version = 1;
         INSERT INTO jobs VALUES (x'00000000000000000000000000000001', 'q', 'acme', 'k',
             'leased', 1, 0, 5, 2, 'q/1', 1500, 1000, 1000, 1500, 'exit 75', x'6869');
         INSERT INTO jobs VALUES (x'00000000000000000000000000000002', 'q', 'default', NULL,
             'dead', 3, 0, 3, 3, NULL, NULL, 1000, 1000, 1600, 'boom', x'');
         INSERT INTO history VALUES (x'00000000000000000000000000000001', 1, 1, 'failed',
             'q/1', 1100, 1200, 'exit 75');",
    )
    .expect("version 1 rows");
    drop(raw);
    let store = open(&path);
    let first = JobId(Uuid::from_u128(1));
    let detail = block(&store, move |b| b.job(first))
        .expect("read")
        .expect("job 1 kept");
    assert_eq!(
        detail.job.state,
        State::Ready,
        "a stored lease was an earlier run's"
    );
    assert_eq!(
        (detail.job.lease_seq, detail.job.attempts, detail.job.worker),
        (2, 1, None)
    );
    assert_eq!(detail.payload, b"hi");
    assert_eq!(detail.history.len(), 1);
    assert_eq!(detail.history[0].outcome, Outcome::Failed);
    let counts = block(&store, |b| b.counts()).expect("counts");
    assert_eq!(
        counts,
        vec![
            ("q".to_owned(), State::Ready, 1),
            ("q".to_owned(), State::Dead, 1)
        ]
    );
    let again = job(9, "q", Some("k"));
    assert_eq!(
        block(&store, move |b| insert(b, &again, b"hi")),
        Ok(Inserted::Duplicate {
            id: first,
            same_payload: true
        }),
        "the key index survived"
    );
    assert_eq!(
        block(&store, |b| b.purge(&[JobId(Uuid::from_u128(2))])),
        Ok(vec![true])
    );
}

#[test]
fn a_version_2_database_is_migrated_keeping_every_job_and_the_rules_on_its_rows() {
    let (_dir, path) = temp_db();
    let raw = Connection::open(&path).expect("raw connection");
    raw.execute_batch(sqlite::V1).expect("version 1 schema");
    raw.execute_batch(sqlite::V2).expect("version 2 schema");
    raw.execute_batch(
        "PRAGMA user_version = 2;
         INSERT INTO jobs VALUES (x'00000000000000000000000000000001', 'q', 'acme', 'k',
             'ready', 0, 0, 5, 1, 1000, 1000, 1000, NULL);
         INSERT INTO jobs VALUES (x'00000000000000000000000000000002', 'q', 'acme', NULL,
             'dead', 3, 0, 3, 3, 1000, 1000, 1600, 'boom');
         INSERT INTO jobs VALUES (x'00000000000000000000000000000003', 'q', 'zeta', NULL,
             'succeeded', 1, 0, 3, 1, 1000, 1000, 1700, NULL);
         INSERT INTO jobs VALUES (x'00000000000000000000000000000004', 'q', 'zeta', NULL,
             'delayed', 1, 0, 3, 1, 1000, 9000, 1800, 'exit 75');
         INSERT INTO payloads VALUES (x'00000000000000000000000000000001', x'6869');
         INSERT INTO payloads VALUES (x'00000000000000000000000000000002', x'');
         INSERT INTO payloads VALUES (x'00000000000000000000000000000003', x'');
         INSERT INTO payloads VALUES (x'00000000000000000000000000000004', x'');
         INSERT INTO history VALUES (x'00000000000000000000000000000002', 1, 1, 'failed',
             'q/1', 1100, 1200, 'boom');",
    )
    .expect("version 2 rows");
    drop(raw);
    let store = open(&path);

    let counts = block(&store, |b| b.counts()).expect("counts");
    assert_eq!(
        counts,
        vec![
            ("q".to_owned(), State::Delayed, 1),
            ("q".to_owned(), State::Ready, 1),
            ("q".to_owned(), State::Succeeded, 1),
            ("q".to_owned(), State::Dead, 1),
        ]
    );
    let dead = block(&store, |b| {
        b.list_jobs(&JobFilter {
            queue: Some("q".into()),
            state: Some(State::Dead),
            order: JobOrder::RecentlyUpdated,
            limit: 10,
            ..JobFilter::default()
        })
    })
    .expect("dead listing");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].last_error.as_deref(), Some("boom"));
    let second = JobId(Uuid::from_u128(2));
    let detail = block(&store, move |b| b.job(second))
        .expect("read")
        .expect("dead job kept");
    assert_eq!(detail.history.len(), 1);
    let again = job(9, "q", Some("k"));
    assert_eq!(
        block(&store, move |b| insert(b, &again, b"hi")),
        Ok(Inserted::Duplicate {
            id: JobId(Uuid::from_u128(1)),
            same_payload: true
        }),
        "the key index survived"
    );
    drop(store);
    let raw = Connection::open(&path).expect("raw connection");
    let version: u32 = raw
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, sqlite::SCHEMA_VERSION);
    let refused = raw.execute(
        "UPDATE jobs SET state = 'leased' WHERE id = x'00000000000000000000000000000001'",
        [],
    );
    assert!(refused.is_err(), "the state CHECK holds: {refused:?}");
}

#[test]
fn the_start_up_load_reads_both_halves_of_the_keys_once_with_live_leases_laid_over() {
    let (_dir, path) = temp_db();
    let store = open(&path);
    // Ids spread over the key range, so the two readers both get some; finished
    // jobs are skipped, leases show in either half.
    let mut stored: Vec<Job> = (0..300u128).map(|n| job(n << 118 | n, "q", None)).collect();
    stored[7].state = State::Dead;
    stored[11].state = State::Succeeded;
    stored[250].state = State::Delayed;
    let records: Vec<NewRecord> = stored
        .iter()
        .map(|j| NewRecord {
            job: j.clone(),
            payload: b"p".to_vec(),
        })
        .collect();
    block(&store, move |b| b.enqueue(&records)).expect("insert");
    let claims = vec![leased(&stored[3], 1), leased(&stored[290], 1)];
    block(&store, move |b| b.claim(&claims)).expect("claim");
    stored[3] = leased(&stored[3], 1);
    stored[290] = leased(&stored[290], 1);
    stored.remove(11);

    let pieces = block(&store, |b| {
        let mut pieces = Vec::new();
        b.load_unfinished_chunks(16, &mut |part| {
            pieces.push(part);
            true
        })?;
        Ok(pieces)
    })
    .expect("load");
    assert!(
        pieces
            .iter()
            .all(|p| p.len() <= 16 && p.is_sorted_by_key(|j| j.id))
    );
    let mut seen: Vec<Job> = pieces.into_iter().flatten().collect();
    seen.sort_by_key(|j| j.id);
    assert_eq!(seen, stored, "every unfinished job once, leases laid over");
    assert_eq!(block(&store, |b| b.load_unfinished()), Ok(stored.clone()));

    // A load after a write of the same transaction sees it (read on one connection:
    // a second one would not see what is not committed yet).
    let late = job(1 << 127, "q", None);
    let (inserted, mut want) = (late.clone(), stored);
    want.push(late);
    let seen = block(&store, move |b| {
        insert(b, &inserted, b"p")?;
        b.load_unfinished()
    });
    assert_eq!(seen, Ok(want));

    // A caller that stops early stops both readers.
    let taken = block(&store, |b| {
        let mut taken = 0;
        b.load_unfinished_chunks(16, &mut |part| {
            taken += part.len();
            false
        })?;
        Ok(taken)
    })
    .expect("load");
    assert_eq!(taken, 16);
}
