//! The store's conformance suite: the engine-neutral contract (`store/contract.rs`,
//! the [`Backend`] docs) written once and run against every engine through the
//! writer ([`Store`]): the memory model with local leases and its shared-store
//! twin, SQLite, and PostgreSQL on a fresh database of the test run's throw-away
//! cluster (`pg.rs`; missing PostgreSQL fails under `CI=true` and is skipped
//! visibly elsewhere). Where the engines legitimately differ (leases local to the
//! process, or stored with the row), a case asks the engine
//! ([`Store::leases_are_local`]) which rule it keeps rather than skipping it.
//!
//! Waiting and blocked jobs come only from `after`, which the memory engine
//! refuses; the dependency tests (`edges.rs`, `dependencies_pg.rs`) hold SQLite
//! and PostgreSQL to those states.

use super::pg::{Database, database};
use super::postgres::open_pg;
use super::*;
use crate::store::contract::{Intent, LeaseRule, STORED, UNFINISHED};
use crate::store::postgres::PgOptions;

/// One fresh, empty store of each engine, by name, and what keeps them alive.
struct Engines {
    stores: Vec<(&'static str, Store)>,
    _dir: tempfile::TempDir,
    _db: Option<Database>,
}

/// [`Engines`] with the history cap `history`.
fn engines(history: HistoryLimits) -> Engines {
    let (dir, path) = temp_db();
    let options = SqliteOptions {
        history,
        ..SqliteOptions::default()
    };
    let shared_model =
        Store::start(memory::MemoryBackend::shared(history), None).expect("start the shared model");
    let mut stores = vec![
        ("memory", Store::open_memory_with(history)),
        ("memory, shared", shared_model),
        (
            "sqlite",
            Store::open_sqlite_with(&path, &options).expect("open SQLite"),
        ),
    ];
    let db = database();
    if let Some(db) = &db {
        let options = PgOptions {
            history,
            ..PgOptions::default()
        };
        stores.push(("postgres", open_pg(&db.url, &options)));
    }
    Engines {
        stores,
        _dir: dir,
        _db: db,
    }
}

/// Runs `case` on a fresh store of every engine.
fn on_every_engine(case: impl Fn(&str, &Store)) {
    on_every_engine_with(HistoryLimits::default(), case);
}

/// [`on_every_engine`] with the history cap `history`.
fn on_every_engine_with(history: HistoryLimits, case: impl Fn(&str, &Store)) {
    let engines = engines(history);
    for (name, store) in &engines.stores {
        case(name, store);
    }
}

/// `job` with the state `state` (and, once finished, ended at `updated_at`).
fn stored_as(job: Job, state: State, updated_at: UnixMillis) -> Job {
    Job {
        state,
        updated_at,
        ..job
    }
}

/// A transition of `job` to `state` under token `token`, with no history line.
fn to(job: &Job, state: State, token: Token) -> Transition {
    Transition {
        job: Job {
            state,
            lease_seq: token,
            ..job.clone()
        },
        entry: None,
        result: None,
    }
}

#[test]
fn every_change_is_conditioned_on_the_stored_state_and_answered_per_item() {
    on_every_engine(|_, store| conditioned_per_item(store));
}

/// Every change of an existing job applies only over the stored state it expects,
/// answered per item; `store` is empty.
fn conditioned_per_item(store: &Store) {
    let (a, b_job) = (job(1, "q", None), job(2, "q", None));
    let batch = vec![
        NewRecord {
            job: a.clone(),
            payload: b"a".to_vec(),
        },
        NewRecord {
            job: b_job.clone(),
            payload: b"b".to_vec(),
        },
    ];
    assert_eq!(
        block(store, move |b| b.enqueue(&batch)),
        Ok(vec![Inserted::New, Inserted::New])
    );
    let (first, second) = (leased(&a, 1), leased(&a, 2));
    let claims = block(store, move |b| b.claim(&[first, second])).expect("claim");
    assert_eq!(
        claims,
        vec![Some(b"a".to_vec()), None],
        "one lease at a time"
    );
    let (cancel_a, cancel_b) = (to(&a, State::Cancelled, 0), to(&b_job, State::Cancelled, 0));
    let cancelled = block(store, move |b| b.cancel(&[cancel_a, cancel_b])).expect("cancel");
    assert_eq!(
        cancelled,
        vec![false, true],
        "a leased job is not cancelled"
    );
    let done = |token| Transition {
        job: Job {
            state: State::Succeeded,
            attempts: 1,
            lease_seq: token,
            ..a.clone()
        },
        entry: None,
        result: None,
    };
    let (stale, current) = (done(7), done(1));
    let ends = block(store, move |b| b.complete(&[stale, current])).expect("complete");
    assert_eq!(ends, vec![false, true], "a stale token changes nothing");
    let redrive = to(&a, State::Ready, 0);
    assert_eq!(
        block(store, move |b| b.redrive(&[redrive])),
        Ok(vec![false])
    );
    let ids = [a.id, b_job.id];
    assert_eq!(block(store, move |b| b.purge(&ids)), Ok(vec![false, false]));
    let counts = block(store, |b| b.counts()).expect("counts");
    assert_eq!(
        counts,
        vec![
            ("q".to_owned(), State::Succeeded, 1),
            ("q".to_owned(), State::Cancelled, 1)
        ]
    );
}

/// Each intent, tried on an unleased job of every stored state it can be tried
/// on, applies exactly where the contract says; those that want no lease refuse
/// a leased (ready) job.
#[test]
fn each_intent_applies_to_exactly_the_stored_states_of_the_contract() {
    let states: Vec<State> = STORED
        .into_iter()
        .filter(|s| !matches!(s, State::Waiting | State::Blocked))
        .collect();
    on_every_engine(|engine, store| {
        let mut n = 0u128;
        for intent in Intent::ALL.into_iter().filter(|i| *i != Intent::Settle) {
            for state in &states {
                n += 1;
                let queue = format!("{intent:?}-{state:?}");
                let stored = stored_as(job(n, &queue, None), *state, 1_000);
                let applied = try_intent(store, intent, &stored, false);
                assert_eq!(
                    applied,
                    intent.applies_to(*state),
                    "{engine}: {intent:?} on a {state:?} job"
                );
            }
            if intent.lease() == LeaseRule::Unleased && intent.applies_to(State::Ready) {
                n += 1;
                let stored = job(n, "leased", None);
                assert!(
                    !try_intent(store, intent, &stored, true),
                    "{engine}: {intent:?} on a leased job"
                );
            }
        }
    });
}

/// Stores `stored`, leased under token 1 if `lease`, then tries `intent` on it;
/// answers whether it applied. An attempt's end comes under its own lease: the
/// claim is tried first, and the end applies only where it held.
fn try_intent(store: &Store, intent: Intent, stored: &Job, lease: bool) -> bool {
    let (job, id) = (stored.clone(), stored.id);
    block(store, move |b| insert(b, &job, b"p")).expect("insert");
    if lease {
        let claim = leased(stored, 1);
        let payloads = block(store, move |b| b.claim(&[claim])).expect("claim");
        assert!(payloads[0].is_some(), "{stored:?} claimed");
    }
    let one = |answers: Vec<bool>| answers[0];
    match intent {
        Intent::Claim => {
            let claim = leased(stored, 2);
            block(store, move |b| b.claim(&[claim])).expect("claim")[0].is_some()
        }
        Intent::Complete => {
            let claim = leased(stored, 1);
            block(store, move |b| b.claim(&[claim])).expect("claim");
            let end = to(stored, State::Succeeded, 1);
            one(block(store, move |b| b.complete(&[end])).expect("complete"))
        }
        Intent::Redrive => {
            let change = to(stored, State::Ready, 0);
            one(block(store, move |b| b.redrive(&[change])).expect("redrive"))
        }
        Intent::Cancel => {
            let change = to(stored, State::Cancelled, 0);
            one(block(store, move |b| b.cancel(&[change])).expect("cancel"))
        }
        Intent::Purge => one(block(store, move |b| b.purge(&[id])).expect("purge")),
        Intent::Prune => {
            let scope = PruneScope::Queue(stored.queue.to_string());
            block(store, move |b| b.prune_finished(&scope, 2_000, 10)).expect("prune") == 1
        }
        Intent::Settle => unreachable!("settle needs dependencies"),
    }
}

/// The start-up load reads every job that may still run, in id order, a live
/// lease shown over its stored row, and no finished one.
#[test]
fn the_start_up_load_reads_exactly_the_unfinished_jobs() {
    on_every_engine(|engine, store| {
        let jobs: Vec<Job> = (1u128..)
            .zip(
                STORED
                    .into_iter()
                    .filter(|s| !matches!(s, State::Waiting | State::Blocked)),
            )
            .map(|(n, state)| stored_as(job(n, "q", None), state, 1_000))
            .collect();
        let records = NewRecord::batch(jobs.clone(), b"p");
        block(store, move |b| b.enqueue(&records)).expect("insert");
        let claim = leased(&jobs[1], 1);
        block(store, move |b| b.claim(&[claim])).expect("claim");
        let loaded = block(store, |b| b.load_unfinished()).expect("load");
        let want: Vec<(JobId, State)> = jobs
            .iter()
            .filter(|j| UNFINISHED.contains(&j.state))
            .map(|j| {
                let shown = if j.id == jobs[1].id {
                    State::Leased
                } else {
                    j.state
                };
                (j.id, shown)
            })
            .collect();
        let got: Vec<(JobId, State)> = loaded.iter().map(|j| (j.id, j.state)).collect();
        assert_eq!(got, want, "{engine}");
    });
}

#[test]
fn pruning_takes_succeeded_jobs_first_each_oldest_first_and_frees_their_keys() {
    on_every_engine(|engine, store| {
        let jobs = vec![
            stored_as(job(1, "q", Some("a")), State::Cancelled, 100),
            stored_as(job(2, "q", Some("b")), State::Succeeded, 300),
            stored_as(job(3, "q", Some("c")), State::Succeeded, 200),
            stored_as(job(4, "q", Some("d")), State::Dead, 100),
            stored_as(job(5, "q", Some("e")), State::Succeeded, 5_000),
            stored_as(job(6, "other", Some("f")), State::Succeeded, 100),
        ];
        let records = NewRecord::batch(jobs, b"p");
        block(store, move |b| b.enqueue(&records)).expect("insert");
        let scope = PruneScope::Queue("q".into());
        let oldest = scope.clone();
        assert_eq!(
            block(store, move |b| b.oldest_finished(&oldest)),
            Ok(Some(100)),
            "{engine}"
        );
        let first = scope.clone();
        assert_eq!(
            block(store, move |b| b.prune_finished(&first, 1_000, 2)),
            Ok(2),
            "{engine}"
        );
        let ids = [1u128, 2, 3].map(|n| JobId(Uuid::from_u128(n)));
        let kept = block(store, move |b| b.job_records(&ids)).expect("read");
        assert_eq!(
            kept.iter().map(Option::is_some).collect::<Vec<_>>(),
            [true, false, false],
            "{engine}: both succeeded jobs before the older cancelled one"
        );
        assert_eq!(
            block(store, move |b| b.prune_finished(&scope, 1_000, 10)),
            Ok(1),
            "{engine}: the dead job, the newer one and the other queue's stay"
        );
        let unconfigured = PruneScope::Unconfigured(vec!["q".into()]);
        assert_eq!(
            block(store, move |b| b.prune_finished(&unconfigured, 1_000, 10)),
            Ok(1),
            "{engine}: a queue no longer configured"
        );
        let again = job(7, "q", Some("b"));
        assert_eq!(
            block(store, move |b| insert(b, &again, b"p")),
            Ok(Inserted::New),
            "{engine}: a pruned job's key is free again"
        );
    });
}

#[test]
fn enqueue_dedupes_by_key_inside_one_batch_and_across_batches() {
    on_every_engine(|_, store| dedupes_by_key(store));
}

/// Idempotency keys dedupe inside one batch and across batches, per queue; `store`
/// is empty.
fn dedupes_by_key(store: &Store) {
    let batch = vec![
        NewRecord {
            job: job(1, "q", Some("k")),
            payload: b"p".to_vec(),
        },
        NewRecord {
            job: job(2, "q", Some("k")),
            payload: b"p".to_vec(),
        },
        NewRecord {
            job: job(3, "q", Some("k")),
            payload: b"other".to_vec(),
        },
        NewRecord {
            job: job(4, "r", Some("k")),
            payload: b"p".to_vec(),
        },
    ];
    let again = batch[1..2].to_vec();
    let holder = JobId(Uuid::from_u128(1));
    assert_eq!(
        block(store, move |b| b.enqueue(&batch)),
        Ok(vec![
            Inserted::New,
            Inserted::Duplicate {
                id: holder,
                same_payload: true
            },
            Inserted::Duplicate {
                id: holder,
                same_payload: false
            },
            Inserted::New,
        ])
    );
    assert_eq!(
        block(store, move |b| b.enqueue(&again)),
        Ok(vec![Inserted::Duplicate {
            id: holder,
            same_payload: true
        }])
    );
}

/// An attempt ends only under its own lease's token. With local leases the
/// Broker may end a lease whose claim the store has not recorded, so a newer
/// token than the stored one ends a job no lease is recorded for; a store whose
/// claim is the lease ends only the stored lease. Either way, a token that is
/// not the recorded lease's changes nothing.
#[test]
fn an_attempt_ends_only_under_its_own_leases_token() {
    on_every_engine(|engine, store| {
        let local = store.leases_are_local();
        let stored = job(1, "q", None);
        let inserted = stored.clone();
        block(store, move |b| insert(b, &inserted, b"p")).expect("insert");
        let end = |token| {
            let t = to(&stored, State::Ready, token);
            Transition {
                job: Job {
                    attempts: 1,
                    ..t.job
                },
                ..t
            }
        };
        let complete = |token| {
            let t = end(token);
            block(store, move |b| b.complete(&[t])).expect("complete")[0]
        };
        assert_eq!(
            complete(1),
            local,
            "{engine}: no lease recorded, newer token"
        );
        if local {
            assert!(!complete(1), "{engine}: the same token again");
            assert!(!complete(0), "{engine}: an older token");
        }
        let claim = leased(&stored, 3);
        let claimed = block(store, move |b| b.claim(&[claim])).expect("claim");
        assert!(claimed[0].is_some(), "{engine}: claimed");
        assert!(!complete(2), "{engine}: another lease is recorded");
        assert!(complete(3), "{engine}: the recorded lease's own");
    });
}

#[test]
fn history_is_capped_and_counted_alike_by_every_engine() {
    let limits = HistoryLimits {
        keep_first: 2,
        keep_last: 3,
        max_error: 100,
    };
    let kept = std::sync::Mutex::new(Vec::new());
    on_every_engine_with(limits, |engine, store| {
        let mut stored = job(1, "q", None);
        let first = stored.clone();
        block(store, move |b| insert(b, &first, b"p")).expect("insert");
        for attempt in 1..=40 {
            stored.attempts = attempt;
            stored.lease_seq = u64::from(attempt);
            let entry = HistoryEntry {
                attempt,
                outcome: Outcome::Failed,
                worker: Some("q/0".into()),
                started_at: Some(1_000),
                ended_at: 1_001,
                error: Some(format!("attempt {attempt}: {}", "e".repeat(5_000))),
            };
            let claim = leased(&stored, stored.lease_seq);
            let end = Transition {
                job: stored.clone(),
                entry: Some(entry),
                result: None,
            };
            block(store, move |b| b.claim(&[claim])).expect("claim");
            let applied = block(store, move |b| b.complete(&[end])).expect("complete");
            assert_eq!(applied, [true], "{engine}: attempt {attempt} ended");
        }
        let read = block(store, |b| b.job(JobId(Uuid::from_u128(1)))).expect("read");
        let d = read.expect("stored");
        let attempts: Vec<u32> = d.history.iter().map(|h| h.attempt).collect();
        assert_eq!(attempts, [1, 2, 38, 39, 40], "{engine}");
        assert_eq!((d.history_elided, d.history_elided_at), (35, 2), "{engine}");
        for h in &d.history {
            let error = h.error.as_deref().expect("error");
            assert!(error.len() <= 100, "{engine}: {} bytes", error.len());
            assert!(
                error.starts_with(&format!("attempt {}", h.attempt)),
                "{engine}: {error}"
            );
        }
        kept.lock()
            .expect("lock")
            .push((engine.to_owned(), d.history));
    });
    let kept = kept.into_inner().expect("lock");
    for (engine, history) in &kept[1..] {
        assert_eq!(
            history, &kept[0].1,
            "{engine} keeps what {} keeps",
            kept[0].0
        );
    }
}

#[test]
fn redrive_with_payload_replaces_the_payload_only_of_a_dead_job_and_notes_both_digests() {
    on_every_engine(|engine, store| {
        let dead = stored_as(job(1, "q", Some("k")), State::Dead, 1_000);
        let ready = job(2, "q", None);
        for stored in [dead.clone(), ready.clone()] {
            block(store, move |b| insert(b, &stored, b"old")).expect("insert");
        }
        let redrive = |j: &Job| Transition {
            entry: Some(HistoryEntry {
                attempt: 0,
                outcome: Outcome::Redriven,
                worker: None,
                started_at: None,
                ended_at: 5,
                error: Some("redriven by uid 7".into()),
            }),
            ..to(j, State::Ready, 0)
        };
        let (fix_dead, fix_ready) = (redrive(&dead), redrive(&ready));
        let applied = block(store, move |b| {
            Ok((
                b.redrive_with_payload(&fix_dead, b"new")?,
                b.redrive_with_payload(&fix_ready, b"new")?,
            ))
        });
        assert_eq!(applied, Ok((true, false)), "{engine}");

        let (dead_id, ready_id) = (dead.id, ready.id);
        let fixed = block(store, move |b| b.job(dead_id))
            .expect("read")
            .expect("kept");
        assert_eq!(fixed.payload, b"new", "{engine}");
        assert_eq!(fixed.job.state, State::Ready, "{engine}");
        assert_eq!(fixed.job.idempotency_key.as_deref(), Some("k"), "{engine}");
        let note = fixed.history.last().and_then(|e| e.error.clone());
        let expected = format!("redriven by uid 7; {}", payload_change(b"old", b"new"));
        assert_eq!(note.as_deref(), Some(expected.as_str()), "{engine}");
        assert!(expected.contains(
            "3 bytes (sha256 11507a0e2f5e69d5dfa40a62a1bd7b6ee57e6bcd85c67c9b8431b36fff21c437)"
        ));

        let untouched = block(store, move |b| b.job(ready_id))
            .expect("read")
            .expect("kept");
        assert_eq!(
            untouched.payload, b"old",
            "{engine}: nothing written for a job that is not dead"
        );
        assert!(untouched.history.is_empty(), "{engine}");
    });
}
