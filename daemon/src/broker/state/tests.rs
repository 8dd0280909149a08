//! Tests of the broker's state, message by message, with its effects performed
//! (or refused) by the test.

use std::path::Path;

use tokio::sync::oneshot;

use super::*;
use crate::broker::LeaseRequest;
use crate::job::NewJob;
use crate::rate_limit::Limiters;
use crate::store::Store;

fn state(queue: &str) -> BrokerState {
    state_on(queue, Store::open_memory())
}

/// A state of one external queue whose effects are meant for `store`.
fn state_on(queue: &str, store: Store) -> BrokerState {
    let text = format!("[queues.{queue}]\nexecutor = {{ kind = \"external\" }}\n");
    state_of(&text, store)
}

/// A state of the config `text` whose effects are meant for `store`.
fn state_of(text: &str, store: Store) -> BrokerState {
    let config = Arc::new(Config::parse(text, Path::new("/tmp/qd.toml")).expect("config"));
    let limits = Arc::new(Limits::new(config, Vec::new()));
    let args = BrokerArgs {
        limiters: Arc::new(Limiters::build(&limits, None)),
        limits,
        store,
        restarted: false,
    };
    BrokerState::new(args, rand::SeedableRng::seed_from_u64(7))
}

/// Loads `jobs` as at a start: memory first, then each queue's dispatch from it.
fn load(state: &mut BrokerState, jobs: Vec<Job>) {
    state.recover(jobs, None);
    state.sync_dispatches(2_000, Instant::now());
}

/// A lessee's request for one job of `queue`, waiting up to `wait`.
fn lease_request(queue: &str, wait: Duration, reply: oneshot::Sender<Vec<LeasedJob>>) -> BrokerMsg {
    let request = LeaseRequest {
        worker: "w".into(),
        max_jobs: 1,
        wait,
    };
    BrokerMsg::Lease(queue.into(), request, reply.into())
}

fn ready_job(queue: &str) -> Job {
    let new = NewJob {
        queue: queue.into(),
        tenant: "acme".into(),
        idempotency_key: None,
        delay: Duration::ZERO,
        max_attempts: 3,
        priority_ms: 0,
    };
    Job::new(new, 1_000)
}

#[tokio::test]
async fn a_pick_whose_job_has_a_write_in_flight_goes_back_with_its_tenants_slot() {
    let store = Store::open_memory();
    let mut state = state_on("q", store.clone());
    let id = hot_job(&store, &mut state).await;
    // An operator's cancel is planned; its write has not committed yet.
    let _cancel = state.take(cancel_of(id), 2_000, Instant::now());
    assert!(state.writing.contains(&id));

    let (tx, answer) = oneshot::channel();
    let lease = lease_request("q", Duration::from_secs(5), tx);
    let effects = state.take(lease, 2_000, Instant::now());
    let d = state.dispatches.get("q").expect("dispatch");
    assert_eq!(d.running("acme"), 0, "the pick's slot is given back");
    assert_eq!(
        d.stats().ready,
        1,
        "the job waits in the dispatch until its write settles"
    );
    effects.perform(&store, &(Arc::new(|_| {}) as Back));
    assert!(answer.await.expect("answered").is_empty(), "nothing leased");
}

/// A job as the store holds it while a worker runs it.
fn leased_job(queue: &str) -> Job {
    let job = ready_job(queue);
    let event = Event::Lease {
        worker: "w/0".into(),
    };
    job::apply(&job, event, &FALLBACK_BACKOFF, 1_500)
        .expect("lease")
        .job
}

#[tokio::test]
async fn a_daemon_start_skips_an_earlier_runs_token_and_a_broker_restart_keeps_leases() {
    let queue = "restart";

    // Cold start: leases are not stored, so the job is ready, uncharged; the token an
    // earlier run's lease may hold (stored + 1) is never handed out again.
    let mut cold = state(queue);
    let stored = ready_job(queue);
    cold.recover(vec![stored.clone()], None);
    let after = &cold.jobs.get(stored.id).expect("recovered");
    assert_eq!((after.state, after.attempts), (State::Ready, 0));
    let (_, leased) = cold.lease_one(stored.id, "w/1", 2_000).expect("lease");
    assert_eq!(leased.lease_seq, stored.lease_seq + 2);
    let job = leased_job(queue);

    // Broker-only restart: the worker may still be running it; the lease is kept with
    // a fresh deadline and its token still works.
    let mut warm = state(queue);
    let now = Instant::now();
    warm.recover(vec![job.clone()], Some(now));
    let kept = &warm.jobs.get(job.id).expect("recovered");
    assert_eq!((kept.state, kept.attempts), (State::Leased, 0));
    assert!(warm.deadlines.get(job.id).is_some_and(|d| d > now));
    let beat = warm.heartbeat(job.id, job.lease_seq, None, 2_100, now);
    assert!(beat.is_ok(), "{beat:?}");
}

fn request(queue: &str, tenant: Option<&str>) -> EnqueueRequest {
    EnqueueRequest {
        queue: queue.into(),
        tenant: tenant.map(str::to_owned),
        payload: b"p".to_vec(),
        idempotency_key: None,
        delay: Duration::ZERO,
        max_attempts: None,
        priority_ms: 0,
        after: Default::default(),
    }
}

#[tokio::test]
async fn a_batch_is_admitted_whole_or_not_at_all_and_a_refusal_frees_its_reservations() {
    let text = "[queues.q]\nexecutor = { kind = \"external\" }\nmax_depth = 4\n\n\
                [tenants.acme]\nmax_depth = 2\n";
    let config = Arc::new(Config::parse(text, Path::new("/tmp/qd.toml")).expect("config"));
    let limits = Arc::new(Limits::new(config, Vec::new()));
    let args = BrokerArgs {
        limiters: Arc::new(Limiters::build(&limits, None)),
        limits,
        store: Store::open_memory(),
        restarted: false,
    };
    let mut state = BrokerState::new(args, rand::SeedableRng::seed_from_u64(7));
    let pending = |s: &BrokerState| s.counts.get("q").map_or(0, |c| c.pending);

    let mut bad = vec![request("q", None); 3];
    bad[1].max_attempts = Some(0);
    let err = state.admit_all(bad, 1_000).expect_err("an invalid item");
    assert_eq!(err.index, Some(1));
    assert!(matches!(err.error, BrokerError::Invalid(_)), "{err}");
    assert_eq!(pending(&state), 0, "the first item's reservation is freed");

    let acme = vec![request("q", Some("acme")); 3];
    let err = state
        .admit_all(acme, 1_000)
        .expect_err("over the tenant's depth");
    assert_eq!(err.index, Some(2));
    assert!(
        matches!(err.error, BrokerError::TenantFull { depth: 2, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("(counting this tenant's jobs before it in this batch)"),
        "{err}"
    );
    assert_eq!(pending(&state), 0);

    let err = state
        .admit_all(vec![request("q", None); 5], 1_000)
        .expect_err("over the queue's depth");
    assert_eq!(err.index, Some(4));
    assert!(
        matches!(err.error, BrokerError::QueueFull { depth: 4, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("(counting the 4 jobs before it in this batch)"),
        "{err}"
    );

    let err = state.admit_all(Vec::new(), 1_000).expect_err("empty");
    assert_eq!(err.index, None);
    let err = state
        .admit_all(vec![request("nope", None)], 1_000)
        .expect_err("unknown queue");
    assert_eq!(err.index, None, "about the whole batch: {err}");

    let records = state
        .admit_all(vec![request("q", None); 4], 1_000)
        .expect("exactly max_depth fits");
    assert_eq!(records.len(), 4);
    assert_eq!(
        pending(&state),
        4,
        "counted as pending until the write answers"
    );
    let err = state
        .admit_all(vec![request("q", None)], 1_000)
        .expect_err("the pending jobs count");
    assert_eq!(err.index, Some(0));
    for record in &records {
        state.unreserve(&record.job);
    }
    assert_eq!(pending(&state), 0);
}

#[tokio::test]
async fn recovery_in_runs_counts_interns_and_snapshots_as_one_job_at_a_time() {
    // Runs of shared names (as the store hands them out), names allocated per job,
    // interleaved tenants, a second queue, delayed and dead jobs, over chunk edges.
    let shared: [Arc<str>; 3] = ["a".into(), "b".into(), "c".into()];
    let mut jobs = Vec::new();
    for n in 0..200u32 {
        let mut job = ready_job(if n % 50 < 40 { "runs" } else { "other" });
        job.tenant = match n % 7 {
            0..=2 => shared[0].clone(),
            3 => Arc::from("b"),
            4 => shared[1].clone(),
            _ => shared[usize::try_from(n % 3).expect("small")].clone(),
        };
        job.ready_at = i64::from(n % 9);
        if n % 11 == 0 {
            job.state = State::Delayed;
        }
        if n % 13 == 0 {
            job.state = State::Dead;
        }
        jobs.push(job);
    }
    let mut state = state("runs");
    for chunk in jobs.chunks(64) {
        state.recover(chunk.to_vec(), None);
    }

    let mut counts: HashMap<Arc<str>, QueueCounts> = HashMap::new();
    let mut depth: HashMap<(Arc<str>, Arc<str>), u64> = HashMap::new();
    for job in &jobs {
        let c = counts.entry(job.queue.clone()).or_default();
        if job.state == State::Dead {
            c.dead += 1;
        } else {
            c.waiting += 1;
            *depth
                .entry((job.queue.clone(), job.tenant.clone()))
                .or_default() += 1;
        }
    }
    for (queue, want) in &counts {
        assert_eq!(state.counts.get(queue), Some(want), "queue {queue}");
    }
    assert_eq!(state.tenant_depth, depth);
    assert_eq!(state.jobs.len(), jobs.len());
    for job in &jobs {
        let held = state.jobs.get(job.id).expect("recovered");
        assert_eq!(held.lease_seq, job.lease_seq + 1);
        assert!(Arc::ptr_eq(&held.tenant, &state.intern(&job.tenant)));
    }

    // What the queue's dispatch is built from: every waiting job, per tenant, sorted.
    let snapshot = state.snapshot("runs");
    let mut seen: Vec<(Arc<str>, Waiting)> = Vec::new();
    for (tenant, waiting) in &snapshot.jobs {
        assert!(
            waiting.is_sorted_by_key(|&(id, at)| (at, id)),
            "{tenant} sorted"
        );
        seen.extend(waiting.iter().map(|w| (tenant.clone(), *w)));
    }
    let names: HashSet<_> = snapshot.jobs.iter().map(|(t, _)| t.clone()).collect();
    assert_eq!(names.len(), snapshot.jobs.len(), "each tenant named once");
    let mut want: Vec<(Arc<str>, Waiting)> = jobs
        .iter()
        .filter(|j| &*j.queue == "runs" && j.state != State::Dead)
        .map(|j| (j.tenant.clone(), (j.id, j.ready_at)))
        .collect();
    seen.sort();
    want.sort();
    assert_eq!(seen, want);
}

#[tokio::test]
async fn a_queues_tenant_counts_come_from_memory_per_tenant_and_state() {
    let mut jobs = Vec::new();
    for (queue, tenant, held) in [
        ("q", "zeta", State::Dead),
        ("q", "acme", State::Ready),
        ("q", "acme", State::Ready),
        ("q", "acme", State::Delayed),
        ("q", "zeta", State::Ready),
        ("other", "acme", State::Ready),
    ] {
        let mut job = ready_job(queue);
        job.tenant = tenant.into();
        job.state = held;
        jobs.push(job);
    }
    let mut state = state("q");
    state.recover(jobs.clone(), None);
    state.lease_one(jobs[2].id, "w/1", 2_000).expect("lease");

    let row = |tenant: &str, held: State, n: u64| (tenant.to_owned(), held, n);
    assert_eq!(
        state.tenant_counts("q"),
        vec![
            row("acme", State::Delayed, 1),
            row("acme", State::Ready, 1),
            row("acme", State::Leased, 1),
            row("zeta", State::Ready, 1),
            row("zeta", State::Dead, 1),
        ],
        "tenants in name order, states in State::ALL order; the other queue's job apart"
    );
    assert!(state.tenant_counts("unknown").is_empty());
}

/// Leases a job of `queue` through [`BrokerState::take`] at monotonic `mono`; the
/// claim's store write is left unperformed.
fn lease_at(state: &mut BrokerState, queue: &str, mono: Instant) -> Effects {
    let (tx, _rx) = oneshot::channel();
    state.take(lease_request(queue, Duration::ZERO, tx), 2_000, mono)
}

#[tokio::test]
async fn the_lease_timer_is_asked_for_only_when_the_soonest_deadline_moves_earlier() {
    let mut state = state("q");
    let lease = state.config.queues["q"].lease;
    let (a, b) = (ready_job("q"), ready_job("q"));
    load(&mut state, vec![a, b]);
    let start = Instant::now();

    let first = lease_at(&mut state, "q", start);
    assert_eq!(
        first.timer,
        Some(start + lease),
        "armed for the first deadline"
    );
    let later = lease_at(&mut state, "q", start + Duration::from_secs(1));
    assert_eq!(later.timer, None, "the armed timer fires sooner");
    assert_eq!(
        later.store.len(),
        1,
        "the claim is asked for, not performed"
    );

    let tick = state.take(BrokerMsg::Tick, 2_000, start + lease);
    assert_eq!(
        tick.timer,
        Some(start + Duration::from_secs(1) + lease),
        "re-armed for the remaining lease"
    );
}

/// A ready job of queue `q` in `store` and in `state`'s memory, its payload still
/// held (its first lease is answered from memory); returns its id.
async fn hot_job(store: &Store, state: &mut BrokerState) -> JobId {
    let job = ready_job("q");
    let id = job.id;
    let stored = NewRecord {
        job: job.clone(),
        payload: b"p".to_vec(),
    };
    store
        .run(move |b| b.enqueue(&[stored]))
        .await
        .expect("stored");
    load(state, vec![job]);
    state.hot.insert(id, b"p".to_vec());
    id
}

#[tokio::test]
async fn a_lease_answered_from_memory_is_answered_only_after_its_record_is_handed_over() {
    let store = Store::open_memory();
    let mut state = state_on("q", store.clone());
    let id = hot_job(&store, &mut state).await;

    let (tx, mut answer) = oneshot::channel();
    let effects = state.take(
        lease_request("q", Duration::ZERO, tx),
        2_000,
        Instant::now(),
    );
    assert!(answer.try_recv().is_err(), "answered before its effects");
    let back: Back = Arc::new(|_| {});
    effects.perform(&store, &back);
    let leased = answer.await.expect("answered");
    assert_eq!(leased.len(), 1);
    let seen = store.run(move |b| b.job(id)).await.expect("read");
    let seen = seen.expect("stored").job;
    assert_eq!(
        (seen.state, seen.lease_seq),
        (State::Leased, leased[0].token),
        "a reader after the answer finds the lease"
    );
}

/// Performs `msg`'s effects on `store` (refused as a full disk refuses them, with
/// `refuse`), then takes every message their completions sent back until none is
/// left; those follow-ups' writes are refused alike.
async fn drive(state: &mut BrokerState, store: &Store, msg: BrokerMsg, refuse: bool) {
    let (back, rx) = channel_back();
    let full = StoreError::Full("test: the disk is full".into());
    let mut next = vec![msg];
    while !next.is_empty() {
        for msg in next {
            let effects = state.take(msg, 3_000, Instant::now());
            if refuse {
                effects.perform_refused(store, &back, &full);
            } else {
                effects.perform(store, &back);
            }
        }
        store.run(|_| Ok(())).await.expect("store barrier");
        next = rx.try_iter().collect();
    }
}

#[tokio::test]
async fn a_lease_whose_lessee_left_during_a_full_disk_is_ended_uncharged_once_writes_resume() {
    // The lessee is gone before its answer, and the disk is full: the lease's end
    // cannot be written, so the job stays leased for now.
    let (store, mut state, id) = abandoned_during_outage().await;
    assert_eq!(state.jobs.get(id).expect("kept").state, State::Leased);

    // The disk has room again: the probe's success ends the lease, uncharged.
    drive(&mut state, &store, BrokerMsg::Probe, false).await;
    let job = state.jobs.get(id).expect("kept");
    assert_eq!((job.state, job.attempts), (State::Ready, 0));
    let seen = store.run(move |b| b.job(id)).await.expect("read");
    let seen = seen.expect("stored").job;
    assert_eq!(
        (seen.state, seen.attempts),
        (State::Ready, 0),
        "stored alike"
    );
}

/// Takes `msg`, checks `answer` is still empty, performs the effects and returns the
/// answer they sent.
async fn answered_after_effects<T>(
    state: &mut BrokerState,
    store: &Store,
    msg: BrokerMsg,
    mut answer: tokio::sync::oneshot::Receiver<T>,
) -> T {
    let effects = state.take(msg, 2_000, Instant::now());
    assert!(
        answer.try_recv().is_err(),
        "a reply was sent while its message was handled"
    );
    effects.perform(store, &(Arc::new(|_| {}) as Back));
    answer
        .await
        .expect("answered once the effects were performed")
}

#[tokio::test]
async fn every_reply_waits_until_its_message_effects_are_performed() {
    let store = Store::open_memory();
    let mut state = state_on("q", store.clone());
    let job = ready_job("q");
    load(&mut state, vec![job.clone()]);

    let (tx, rx) = oneshot::channel();
    let counts = BrokerMsg::Counts(tx.into());
    let counts = answered_after_effects(&mut state, &store, counts, rx).await;
    assert_eq!(counts["q"].waiting, 1);

    let (tx, rx) = oneshot::channel();
    let beat = BrokerMsg::Heartbeat(job.id, 99, None, tx.into());
    let beat = answered_after_effects(&mut state, &store, beat, rx).await;
    assert!(beat.is_err(), "not leased");

    let (tx, rx) = oneshot::channel();
    let unknown_queue = EnqueueRequest {
        queue: "nope".into(),
        tenant: None,
        payload: b"x".to_vec(),
        idempotency_key: None,
        delay: Duration::ZERO,
        max_attempts: None,
        priority_ms: 0,
        after: Default::default(),
    };
    let enqueue = BrokerMsg::Enqueue(unknown_queue, tx.into());
    let enqueue = answered_after_effects(&mut state, &store, enqueue, rx).await;
    assert!(enqueue.is_err(), "unknown queue");

    let (tx, rx) = oneshot::channel();
    let lease = lease_request("nope", Duration::from_secs(1), tx);
    let lease = answered_after_effects(&mut state, &store, lease, rx).await;
    assert!(lease.is_empty(), "unknown queue");

    let (tx, rx) = oneshot::channel();
    let acks = BrokerMsg::AckBatch(vec![(job.id, 99)], tx.into());
    let acks = answered_after_effects(&mut state, &store, acks, rx).await;
    assert!(acks.expect("answered per item")[0].is_err(), "not leased");
}

#[tokio::test]
async fn once_intake_stopped_lessees_are_answered_empty_and_nothing_starts() {
    let store = Store::open_memory();
    let mut state = state_on("q", store.clone());
    let id = hot_job(&store, &mut state).await;
    drive(&mut state, &store, BrokerMsg::StopIntake, false).await;
    let (tx, answer) = oneshot::channel();
    drive(&mut state, &store, lease_of(tx), false).await;
    assert!(answer.await.expect("answered").is_empty(), "nothing leased");
    assert_eq!(state.jobs.get(id).expect("held").state, State::Ready);
}

/// A state on a memory store whose one hot job was leased to a lessee that left
/// before its answer, while the disk was full: an uncharged end is left to write.
async fn abandoned_during_outage() -> (Store, BrokerState, JobId) {
    let store = Store::open_memory();
    let mut state = state_on("q", store.clone());
    let id = hot_job(&store, &mut state).await;
    let (tx, rx) = oneshot::channel();
    let effects = state.take(lease_of(tx), 3_000, Instant::now());
    drop(rx);
    let (back, returned) = channel_back();
    let full = StoreError::Full("test: the disk is full".into());
    effects.perform_refused(&store, &back, &full);
    store.run(|_| Ok(())).await.expect("store barrier");
    for msg in returned.try_iter().collect::<Vec<_>>() {
        drive(&mut state, &store, msg, true).await;
    }
    assert!(!state.store_writable);
    assert_eq!(state.uncharged_ends.len(), 1);
    (store, state, id)
}

/// An operator's cancel of `id`, its answer dropped.
fn cancel_of(id: JobId) -> BrokerMsg {
    let (tx, _answer) = tokio::sync::oneshot::channel();
    BrokerMsg::Cancel(id, "op".into(), tx.into())
}

/// A [`Back`] whose messages the test takes from the returned receiver.
fn channel_back() -> (Back, std::sync::mpsc::Receiver<BrokerMsg>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let back: Back = Arc::new(move |msg| {
        let _ = tx.send(msg);
    });
    (back, rx)
}

/// Takes (and performs) every message the store's completions sent back so far.
fn take_returned(
    state: &mut BrokerState,
    store: &Store,
    back: &Back,
    rx: &std::sync::mpsc::Receiver<BrokerMsg>,
    mono: Instant,
) {
    for msg in rx.try_iter().collect::<Vec<_>>() {
        state.take(msg, 3_000, mono).perform(store, back);
    }
}

/// A lessee's request for one job of queue `q`, waiting up to 5 s, answered to
/// `reply`.
fn lease_of(reply: oneshot::Sender<Vec<LeasedJob>>) -> BrokerMsg {
    lease_request("q", Duration::from_secs(5), reply)
}

#[tokio::test]
async fn an_uncharged_end_is_not_written_again_once_a_cancel_of_its_job_committed() {
    let (store, mut state, id) = abandoned_during_outage().await;

    // The disk has room again; the first write that reaches it is an operator's
    // cancel of that very job.
    let (back, rx) = channel_back();
    let cancel = state.take(cancel_of(id), 3_000, Instant::now());
    cancel.perform(&store, &back);
    store.run(|_| Ok(())).await.expect("barrier");
    let settle = rx.try_recv().expect("the cancel's settle");
    let after = state.take(settle, 3_000, Instant::now());
    assert!(state.jobs.get(id).is_none(), "cancelled, gone from memory");
    assert!(
        after.store.is_empty() && !state.writing.contains(&id),
        "a second end of the cancelled job's lease was planned from stale memory ({} store effects, writing: {})",
        after.store.len(),
        state.writing.contains(&id)
    );
}

#[tokio::test]
async fn an_uncharged_end_waiting_behind_a_refused_write_of_its_job_is_still_written_uncharged() {
    let (store, mut state, id) = abandoned_during_outage().await;

    // The probe goes first and succeeds; an operator's cancel of the job is
    // submitted right after it, in the next batch, which the (flapping) disk refuses.
    let (back, rx) = channel_back();
    let probe = state.take(BrokerMsg::Probe, 3_000, Instant::now());
    let cancel = state.take(cancel_of(id), 3_000, Instant::now());
    probe.perform(&store, &back);
    store
        .run(|_| Ok(()))
        .await
        .expect("barrier: the probe's batch ran first");
    let full = StoreError::Full("test: the disk is full".into());
    cancel.perform_refused(&store, &back, &full);
    // Settles in the writer's order: the probe's (ok), then the cancel's (refused).
    take_returned(&mut state, &store, &back, &rx, Instant::now());
    store.run(|_| Ok(())).await.expect("barrier");
    take_returned(&mut state, &store, &back, &rx, Instant::now());
    // The disk settles down: the next probe succeeds.
    drive(&mut state, &store, BrokerMsg::Probe, false).await;
    assert!(state.store_writable, "writes resumed");
    let job = state.jobs.get(id).expect("kept");
    assert_eq!(
        (job.state, job.attempts),
        (State::Ready, 0),
        "ended, uncharged"
    );

    // Nobody holds the lease; it expires.
    let lease = state.config.queues["q"].lease;
    let tick = state.take(BrokerMsg::Tick, 9_000, Instant::now() + 3 * lease);
    tick.perform(&store, &back);
    store.run(|_| Ok(())).await.expect("barrier");
    take_returned(&mut state, &store, &back, &rx, Instant::now());
    let job = state.jobs.get(id).expect("kept");
    assert_eq!(
        (job.state, job.attempts),
        (State::Ready, 0),
        "the lease of an attempt that never ran was charged"
    );
}

#[tokio::test]
async fn a_lessee_waiting_through_an_outage_is_not_handed_a_job_cancelled_as_writes_resume() {
    let store = Store::open_memory();
    let mut state = state_on("q", store.clone());
    let id = hot_job(&store, &mut state).await;
    // The disk is full: an unrelated enqueue is refused, so leasing stops.
    let (tx, _enq) = tokio::sync::oneshot::channel();
    drive(
        &mut state,
        &store,
        BrokerMsg::Enqueue(request("q", None), tx.into()),
        true,
    )
    .await;
    assert!(!state.store_writable);
    // A lessee asks for a job: nothing is picked while the store refuses writes.
    let (tx, mut leased) = oneshot::channel();
    let effects = state.take(lease_of(tx), 3_000, Instant::now());
    let (back, rx) = channel_back();
    effects.perform(&store, &back);
    assert!(leased.try_recv().is_err(), "waits");
    // The disk has room again; the first write is the operator's cancel of that job.
    let cancel = state.take(cancel_of(id), 3_000, Instant::now());
    cancel.perform(&store, &back);
    store.run(|_| Ok(())).await.expect("barrier");
    take_returned(&mut state, &store, &back, &rx, Instant::now());
    store.run(|_| Ok(())).await.expect("barrier");
    let seen = store
        .run(move |b| b.job(id))
        .await
        .expect("read")
        .expect("stored")
        .job;
    let handed = leased.try_recv().unwrap_or_default();
    assert!(
        handed.is_empty(),
        "the cancelled job (stored: {}) was handed to a lessee: {:?}",
        seen.state,
        handed.iter().map(|l| l.id).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn tenants_whose_jobs_all_finished_cost_no_memory() {
    let mut state = state("q");
    let queue = state.intern("q");
    for n in 0..10_000 {
        let tenant = state.intern(&format!("t{n}"));
        state.tally(&queue, &tenant, State::Ready, 1);
        state.tally(&queue, &tenant, State::Ready, -1);
    }
    assert!(state.tenant_depth.is_empty(), "no depth of 0 is kept");
    assert!(
        state.names.len() <= 128,
        "{} names kept for 1 queue and no job",
        state.names.len()
    );
    let held = state.intern("held");
    state.tally(&queue, &held, State::Leased, 1);
    for n in 0..1_000 {
        state.intern(&format!("u{n}"));
    }
    assert!(
        Arc::ptr_eq(&held, &state.intern("held")),
        "a name in use stays"
    );
    assert_eq!(state.tenant_depth.len(), 1);
}

#[tokio::test]
async fn a_throttled_nack_pauses_the_limiter_before_its_write_is_answered() {
    let store = Store::open_memory();
    let text = "[queues.q]\nexecutor = { kind = \"external\" }\nrate_limiter = \"r\"\n\n\
                [rate_limiters.r]\nper_second = 1000\n";
    let mut state = state_of(text, store.clone());
    let limiter = state.limiters.get("r").expect("limiter");
    let id = hot_job(&store, &mut state).await;
    let (tx, answer) = oneshot::channel();
    let back: Back = Arc::new(|_| {});
    state
        .take(lease_of(tx), 2_000, Instant::now())
        .perform(&store, &back);
    let token = answer.await.expect("leased")[0].token;

    let (tx, _nacked) = oneshot::channel();
    let failure = Failure::Throttled {
        retry_after: Duration::from_secs(2),
        error: "429".into(),
    };
    let effects = state.take(
        BrokerMsg::Nack(id, token, failure, tx.into()),
        3_000,
        Instant::now(),
    );
    // The nack's answer comes from its write's completion: the limiter paused
    // before that write is even handed over.
    let paused = limiter.paused_until(Instant::now());
    let until = paused.expect("paused");
    assert!(
        until >= Instant::now() + Duration::from_secs(1),
        "{until:?}"
    );
    let (back, rx) = channel_back();
    effects.perform(&store, &back);
    store.run(|_| Ok(())).await.expect("store barrier");
    for msg in rx.try_iter().collect::<Vec<_>>() {
        state
            .take(msg, 3_100, Instant::now())
            .perform(&store, &back);
    }
    assert_eq!(
        limiter.paused_until(Instant::now()),
        paused,
        "paused once, not again when the write settles"
    );
    assert_eq!(state.jobs.get(id).expect("kept").attempts, 0, "not charged");
}

#[test]
fn a_batch_past_the_clusters_depth_names_its_first_item_past_the_limit() {
    let index = |depth, max, len| {
        let jobs: Vec<Job> = (0..len).map(|_| ready_job("q")).collect();
        let refused = super::batch_past_depth(&jobs, "q".into(), depth, max);
        match refused.error {
            BrokerError::QueueFull { depth, .. } => (refused.index, depth),
            other => panic!("{other}"),
        }
    };
    // 98 of 100 held: items 0 and 1 fit, item 2 does not, at depth 100.
    assert_eq!(index(98, 100, 5), (Some(2), 100));
    // Full already: the first item, at the cluster's depth.
    assert_eq!(index(100, 100, 5), (Some(0), 100));
    // Over the limit (max_depth lowered by a reload): still the first item.
    assert_eq!(index(120, 100, 3), (Some(0), 120));
    // A store that counted room for all of them is answered at the last item.
    assert_eq!(index(10, 100, 3), (Some(2), 12));
    // A batch across queues counts only the full queue's items: with room for
    // one more in p, its second item (jobs[3]) is the first past the limit.
    let jobs: Vec<Job> = ["q", "p", "q", "p", "p"].map(ready_job).into();
    let refused = super::batch_past_depth(&jobs, "p".into(), 9, 10);
    assert_eq!(refused.index, Some(3), "{refused}");
    assert!(
        matches!(refused.error, BrokerError::QueueFull { depth: 10, .. }),
        "{refused}"
    );
}

/// Handles `msg` and every message its effects' completions send back, until
/// none is left; answers how many Broker messages that was.
async fn count_messages(state: &mut BrokerState, store: &Store, msg: BrokerMsg) -> usize {
    let (back, rx) = channel_back();
    let mut next = vec![msg];
    let mut taken = 0;
    while !next.is_empty() {
        for msg in next {
            taken += 1;
            state.take(msg, 3_000, Instant::now()).perform(store, &back);
        }
        store.run(|_| Ok(())).await.expect("store barrier");
        next = rx.try_iter().collect();
    }
    taken
}

#[tokio::test]
async fn one_external_job_costs_five_broker_messages() {
    let store = Store::open_memory();
    let mut state = state_on("q", store.clone());
    load(&mut state, Vec::new());

    let (tx, enqueued) = oneshot::channel();
    let enqueue = BrokerMsg::Enqueue(request("q", Some("acme")), tx.into());
    let n_enqueue = count_messages(&mut state, &store, enqueue).await;
    let id = enqueued.await.expect("answered").expect("accepted").id;

    let (tx, leased) = oneshot::channel();
    let n_lease = count_messages(&mut state, &store, lease_of(tx)).await;
    let leased = leased.await.expect("answered");
    assert_eq!(leased.len(), 1, "the job is leased at once");
    let token = leased[0].token;

    let (tx, acked) = oneshot::channel();
    let ack = BrokerMsg::Ack(id, token, tx.into());
    let n_ack = count_messages(&mut state, &store, ack).await;
    acked.await.expect("answered").expect("acked");

    // Enqueue + Inserted, Lease (answered from memory: the payload is hot), Ack +
    // Settle; the dispatch is the Broker's own state, so no other actor hears of it.
    assert_eq!((n_enqueue, n_lease, n_ack), (2, 1, 2));
    let d = state.dispatches.get("q").expect("dispatch");
    assert_eq!((d.stats().ready, d.running("acme")), (0, 0));
    assert!(state.jobs.get(id).is_none(), "finished");
}
