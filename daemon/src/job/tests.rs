//! Unit and property tests of the job state machine.

use super::*;
use crate::backoff::Jitter;
use proptest::prelude::*;

fn backoff() -> Backoff {
    Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(60),
        jitter: Jitter::Full,
    }
}

fn job(max_attempts: u32) -> Job {
    Job::new(
        NewJob {
            queue: "q".into(),
            tenant: "t".into(),
            idempotency_key: None,
            delay: Duration::ZERO,
            max_attempts,
            priority_ms: 0,
        },
        1_000,
    )
}

fn step(job: &Job, event: Event) -> Result<Job, TransitionError> {
    apply(job, event, &backoff(), 2_000).map(|t| t.job)
}

fn lease(job: &Job) -> Job {
    step(job, Event::Lease { worker: "w".into() }).expect("ready job leases")
}

fn transient() -> Failure {
    Failure::Transient {
        error: "boom".into(),
        retry_after: None,
    }
}

#[test]
fn a_delayed_job_starts_delayed_and_promotes_to_ready() {
    let mut new = job(3);
    new.state = State::Delayed;
    let promoted = step(&new, Event::Promote).expect("promote");
    assert_eq!(promoted.state, State::Ready);
}

#[test]
fn lease_then_ack_succeeds_with_one_attempt_and_one_history_line() {
    let leased = lease(&job(3));
    assert_eq!(leased.lease_seq, 1);
    let t = apply(&leased, Event::Ack { token: 1 }, &backoff(), 3_000).expect("ack");
    assert_eq!(t.job.state, State::Succeeded);
    assert_eq!(t.job.attempts, 1);
    let entry = t.entry.expect("history");
    assert_eq!(
        (entry.attempt, entry.outcome, entry.started_at),
        (1, Outcome::Succeeded, Some(2_000))
    );
}

#[test]
fn a_stale_token_is_refused_and_changes_nothing() {
    let leased = lease(&job(3));
    let err = step(&leased, Event::Ack { token: 7 }).expect_err("stale");
    assert!(matches!(
        err,
        TransitionError::StaleToken {
            given: 7,
            current: 1,
            ..
        }
    ));
    let failed = step(
        &leased,
        Event::Fail {
            token: 1,
            failure: transient(),
            jitter: 0.5,
        },
    )
    .expect("fail");
    let late = step(&failed, Event::Ack { token: 1 }).expect_err("stale");
    assert!(matches!(late, TransitionError::StaleToken { .. }));
    // Its last token is no lease: the message says the lease ended, not that the
    // late worker's own token is current.
    assert!(
        !err.to_string().contains("lease is 1"),
        "the live token is not shown"
    );
    let text = late.to_string();
    assert!(
        text.ends_with(&format!("(its lease ended; job is {})", failed.state)),
        "{text}"
    );
    assert!(
        err.to_string()
            .ends_with("(a newer lease holds it, job is leased)"),
        "{err}"
    );
}

#[test]
fn illegal_transitions_are_refused() {
    let ready = job(3);
    assert!(matches!(
        step(&ready, Event::Redrive { by: "op".into() }),
        Err(TransitionError::IllegalState {
            state: State::Ready,
            event: "redrive",
            ..
        })
    ));
    let leased = lease(&ready);
    assert!(
        step(
            &leased,
            Event::Lease {
                worker: "w2".into()
            }
        )
        .is_err()
    );
    let cancelled = step(&cancelled_of(&leased), Event::Cancel { by: "op".into() });
    assert!(
        cancelled.is_err(),
        "a cancelled job cannot be cancelled again"
    );
}

fn cancelled_of(leased: &Job) -> Job {
    step(leased, Event::Cancel { by: "op".into() }).expect("cancel")
}

#[test]
fn cancel_of_a_leased_job_ends_its_attempt_uncharged_and_revokes_the_lease() {
    let leased = lease(&job(3));
    let t = apply(
        &leased,
        Event::Cancel { by: "uid 7".into() },
        &backoff(),
        10,
    )
    .expect("cancel");
    assert_eq!(t.job.state, State::Cancelled);
    assert_eq!(t.job.attempts, leased.attempts, "not charged");
    assert_eq!(t.job.worker, None);
    let entry = t.entry.expect("the attempt's line");
    assert_eq!(entry.outcome, Outcome::Cancelled);
    assert_eq!(entry.worker, leased.worker);
    assert_eq!(entry.started_at, leased.leased_at);
    assert!(entry.error.is_some_and(|e| e.contains("uid 7")));
    let late_ack = step(
        &t.job,
        Event::Ack {
            token: leased.lease_seq,
        },
    );
    assert!(matches!(late_ack, Err(TransitionError::StaleToken { .. })));
}

#[test]
fn transient_failures_retry_with_backoff_until_the_budget_is_spent() {
    let mut j = job(3);
    for n in 1..=3u32 {
        let leased = lease(&j);
        j = step(
            &leased,
            Event::Fail {
                token: leased.lease_seq,
                failure: transient(),
                jitter: 0.99,
            },
        )
        .expect("fail");
        assert_eq!(j.attempts, n);
        if n < 3 {
            assert_eq!(j.state, State::Delayed);
            let delay = j.ready_at - 2_000;
            let cap = 1_000 * (1 << (n - 1));
            assert!(delay > 0 && delay <= cap, "delay {delay} cap {cap}");
            j = step(&j, Event::Promote).expect("promote");
        }
    }
    assert_eq!(j.state, State::Dead);
    assert_eq!(j.last_error.as_deref(), Some("boom"));
}

#[test]
fn a_permanent_error_dead_letters_at_once() {
    let leased = lease(&job(5));
    let dead = step(
        &leased,
        Event::Fail {
            token: 1,
            failure: Failure::Permanent {
                error: "bad input".into(),
            },
            jitter: 0.0,
        },
    )
    .expect("fail");
    assert_eq!((dead.state, dead.attempts), (State::Dead, 1));
}

#[test]
fn interrupted_and_throttled_attempts_are_not_charged() {
    let leased = lease(&job(1));
    let back = step(
        &leased,
        Event::Fail {
            token: 1,
            failure: Failure::Interrupted {
                reason: "shutdown".into(),
            },
            jitter: 0.0,
        },
    )
    .expect("interrupt");
    assert_eq!((back.state, back.attempts), (State::Ready, 0));
    let leased = lease(&back);
    let throttled = step(
        &leased,
        Event::Fail {
            token: 2,
            failure: Failure::Throttled {
                retry_after: Duration::from_secs(5),
                error: "429".into(),
            },
            jitter: 0.0,
        },
    )
    .expect("throttle");
    assert_eq!((throttled.state, throttled.attempts), (State::Delayed, 0));
    assert_eq!(throttled.ready_at, 2_000 + 5_000);
    // Jitter spreads throttled retries above the Retry-After floor, never below it.
    let spread = step(
        &leased,
        Event::Fail {
            token: 2,
            failure: Failure::Throttled {
                retry_after: Duration::from_secs(5),
                error: "429".into(),
            },
            jitter: 0.5,
        },
    )
    .expect("throttle");
    assert_eq!(spread.ready_at, 2_000 + 7_500);
}

#[test]
fn redrive_gives_a_fresh_budget_and_keeps_the_attempt_count() {
    let leased = lease(&job(1));
    let dead = step(
        &leased,
        Event::Fail {
            token: 1,
            failure: transient(),
            jitter: 0.0,
        },
    )
    .expect("fail");
    assert_eq!(dead.state, State::Dead);
    let t = apply(
        &dead,
        Event::Redrive { by: "uid 0".into() },
        &backoff(),
        5_000,
    )
    .expect("redrive");
    assert_eq!(
        (t.job.state, t.job.attempts, t.job.attempts_in_budget()),
        (State::Ready, 1, 0)
    );
    assert_eq!(t.entry.expect("entry").outcome, Outcome::Redriven);
    let again = lease(&t.job);
    assert_eq!(again.next_attempt(), 2);
}

fn arb_failure() -> impl Strategy<Value = Failure> {
    prop_oneof![
        Just(transient()),
        Just(Failure::Permanent { error: "p".into() }),
        Just(Failure::TimedOut { error: "t".into() }),
        Just(Failure::LeaseExpired { reason: "e".into() }),
        Just(Failure::WorkerCrashed { error: "c".into() }),
        Just(Failure::Throttled {
            retry_after: Duration::from_secs(1),
            error: "429".into()
        }),
        Just(Failure::Interrupted { reason: "i".into() }),
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        Just(Event::Promote),
        Just(Event::Lease { worker: "w".into() }),
        (0u64..6).prop_map(|token| Event::Ack { token }),
        (0u64..6, arb_failure(), 0.0f64..1.0).prop_map(|(token, failure, jitter)| Event::Fail {
            token,
            failure,
            jitter
        }),
        Just(Event::Redrive { by: "op".into() }),
        Just(Event::Cancel { by: "op".into() }),
    ]
}

proptest! {
    /// Random event sequences: refused events change nothing; attempts never decrease;
    /// a job is dead exactly when its budget is spent or its last failure was permanent;
    /// finished jobs hold no lease.
    #[test]
    fn the_state_machine_keeps_its_invariants(max in 1u32..5, events in prop::collection::vec(arb_event(), 1..60)) {
        let mut j = job(max);
        for event in events {
            let permanent = matches!(&event, Event::Fail { failure: Failure::Permanent { .. }, .. });
            match apply(&j, event, &backoff(), 2_000) {
                Err(_) => {}
                Ok(t) => {
                    prop_assert!(t.job.attempts >= j.attempts);
                    prop_assert!(t.job.lease_seq >= j.lease_seq);
                    prop_assert!(t.job.attempts_in_budget() <= t.job.max_attempts);
                    if t.job.state == State::Dead && j.state != State::Dead {
                        prop_assert!(permanent || t.job.attempts_in_budget() == t.job.max_attempts);
                    }
                    if matches!(t.job.state, State::Ready | State::Delayed) && j.state == State::Leased {
                        prop_assert!(!permanent);
                        prop_assert!(t.job.attempts_in_budget() < t.job.max_attempts);
                    }
                    if t.job.state != State::Leased {
                        prop_assert!(t.job.worker.is_none());
                    }
                    j = t.job;
                }
            }
        }
    }
}

#[test]
fn a_huge_throttled_retry_after_saturates_instead_of_panicking() {
    let leased = lease(&job(3));
    let t = step(
        &leased,
        Event::Fail {
            token: 1,
            failure: Failure::Throttled {
                retry_after: Duration::MAX,
                error: "429".into(),
            },
            jitter: 1.0,
        },
    )
    .expect("a throttled failure always applies");
    assert_eq!((t.state, t.attempts), (State::Delayed, 0));
    assert_eq!(t.ready_at, i64::MAX);
}
