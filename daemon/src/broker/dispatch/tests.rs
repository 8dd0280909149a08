//! Unit and property tests of [`Dispatch`], driven with injected wall and monotonic
//! times: no actor, no sleep.

use std::collections::HashMap;

use proptest::prelude::*;
use tokio::sync::oneshot;

use super::*;
use crate::config::Config;

const WALL: UnixMillis = 1_000_000;

fn request(worker: &str, max_jobs: u32, wait: Duration) -> LeaseRequest {
    LeaseRequest {
        worker: worker.into(),
        max_jobs,
        wait,
    }
}

/// Enlists a lessee; its receiver gets the answer if Dispatch sends one itself.
fn enlist(
    d: &mut Dispatch,
    max_jobs: u32,
    wait: Duration,
    now: Instant,
) -> oneshot::Receiver<Vec<LeasedJob>> {
    let (tx, rx) = oneshot::channel();
    d.enlist(request("w", max_jobs, wait), tx.into(), now);
    rx
}

fn picked(grants: &[Grant]) -> Vec<JobId> {
    grants
        .iter()
        .flat_map(|g| g.picks.iter().map(|(_, id)| *id))
        .collect()
}

fn limits(text: &str) -> Limits {
    let config = Config::parse(text, std::path::Path::new("/tmp/qd.toml")).expect("config");
    Limits::new(Arc::new(config), Vec::new())
}

#[test]
fn a_ready_job_goes_to_the_waiting_lessee_and_counts_as_running() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let t: Arc<str> = Arc::from("t");
    let (a, b) = (JobId::new(), JobId::new());
    d.ready(t.clone(), a, WALL - 10, 0, WALL, now);
    d.ready(t.clone(), b, WALL - 5, 0, WALL, now);
    assert!(d.grants(now).is_empty(), "nobody waits: nothing is picked");
    let _rx = enlist(&mut d, 5, Duration::from_secs(1), now);
    let grants = d.grants(now);
    assert_eq!(picked(&grants), vec![a, b], "oldest first, up to max_jobs");
    assert_eq!(grants[0].worker, "w");
    assert_eq!(d.running("t"), 2);
    assert_eq!(d.stats().ready, 0);
    d.finish("t", Duration::ZERO);
    assert_eq!(d.running("t"), 1);
}

#[test]
fn a_delayed_job_waits_for_its_due_time_and_keeps_its_priority() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let t: Arc<str> = Arc::from("t");
    let (plain, boosted) = (JobId::new(), JobId::new());
    d.ready(t.clone(), plain, WALL - 1, 0, WALL, now);
    d.ready(t.clone(), boosted, WALL + 100, 60_000, WALL, now);
    let s = d.stats();
    assert_eq!((s.ready, s.delayed), (1, 1));
    assert_eq!(d.soonest(), Some(now + Duration::from_millis(100)));
    let _rx = enlist(&mut d, 1, Duration::from_secs(10), now);
    let later = now + Duration::from_millis(100);
    let grants = d.grants(later);
    assert_eq!(
        picked(&grants),
        vec![boosted],
        "once due, its priority ranks it before the older plain job"
    );
}

#[test]
fn a_job_is_removed_from_where_it_waits_by_the_ready_time_it_came_with() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let t: Arc<str> = Arc::from("t");
    let (ready, delayed) = (JobId::new(), JobId::new());
    d.ready(t.clone(), ready, WALL - 1, 0, WALL, now);
    d.ready(t.clone(), delayed, WALL + 100, 5, WALL, now);
    d.remove("t", delayed, WALL + 100);
    d.remove("t", ready, WALL - 1);
    let s = d.stats();
    assert_eq!((s.ready, s.delayed, s.oldest_ready_at), (0, 0, None));
    assert_eq!(d.soonest(), None);
    // A delayed job that became ready is found in the fair queue by the same time.
    let later = JobId::new();
    d.ready(t.clone(), later, WALL + 50, 0, WALL, now);
    assert!(d.grants(now + Duration::from_millis(50)).is_empty());
    assert_eq!(d.stats().ready, 1);
    assert_eq!(d.stats().oldest_ready_at, Some(WALL + 50));
    d.remove("t", later, WALL + 50);
    assert_eq!(d.stats().ready, 0);
}

#[test]
fn a_long_poll_ends_empty_at_its_deadline_and_a_closed_one_is_dropped() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let mut rx = enlist(&mut d, 1, Duration::from_secs(2), now);
    let gone = enlist(&mut d, 1, Duration::from_secs(1), now);
    drop(gone);
    assert!(d.grants(now).is_empty());
    assert_eq!(
        d.stats().waiting_lessees,
        1,
        "the lessee that left is dropped"
    );
    assert_eq!(d.soonest(), Some(now + Duration::from_secs(2)));
    d.expire(now + Duration::from_secs(1));
    assert!(rx.try_recv().is_err(), "not yet");
    d.expire(now + Duration::from_secs(2));
    assert_eq!(rx.try_recv().expect("answered").len(), 0);
    assert_eq!(d.soonest(), None);
    // A wait above the maximum is cut to it.
    let _rx = enlist(&mut d, 1, Duration::from_secs(3600), now);
    assert_eq!(d.soonest(), Some(now + MAX_WAIT));
}

#[test]
fn paused_hands_out_nothing_and_draining_answers_everyone_empty() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let t: Arc<str> = Arc::from("t");
    d.ready(t, JobId::new(), WALL, 0, WALL, now);
    let mut first = enlist(&mut d, 1, Duration::from_secs(5), now);
    let l = limits("[queues.q]\nexecutor = { kind = \"external\" }\n");
    l.set("queue", "q", "paused", Some("true".into()));
    d.configure("q", &l);
    assert!(d.grants(now).is_empty());
    assert!(d.stats().paused);
    l.set("queue", "q", "paused", None);
    d.configure("q", &l);
    assert_eq!(d.grants(now).len(), 1);
    let mut second = enlist(&mut d, 1, Duration::from_secs(5), now);
    d.drain();
    assert_eq!(second.try_recv().expect("answered at drain").len(), 0);
    let mut late = enlist(&mut d, 1, Duration::from_secs(5), now);
    assert_eq!(late.try_recv().expect("answered at once").len(), 0);
    assert!(
        first.try_recv().is_err(),
        "a granted lessee is the Broker's to answer"
    );
}

#[test]
fn a_pick_refused_at_the_cluster_cap_returns_uncharged_and_holds_its_tenant() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let l = limits(
        "[queues.q]\nexecutor = { kind = \"external\" }\ntenants.t = { max_concurrency = 2 }\n\n[tenants.t]\n",
    );
    d.configure("q", &l);
    let t: Arc<str> = Arc::from("t");
    let (a, b) = (JobId::new(), JobId::new());
    d.ready(t.clone(), a, WALL - 2, 0, WALL, now);
    d.ready(t.clone(), b, WALL - 1, 0, WALL, now);
    let _rx = enlist(&mut d, 1, Duration::from_secs(5), now);
    assert_eq!(picked(&d.grants(now)), vec![a]);
    d.at_cap(t.clone(), a, WALL - 2, 0);
    assert_eq!(d.running("t"), 0, "uncharged");
    assert_eq!(d.stats().ready, 2);
    let _rx = enlist(&mut d, 1, Duration::from_secs(5), now);
    assert!(
        d.grants(now).is_empty(),
        "held at its cap across the cluster"
    );
    d.reopen();
    assert_eq!(picked(&d.grants(now)), vec![a], "tried again, in its place");
}

#[test]
fn a_restore_takes_the_brokers_jobs_and_running_counts() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let l = limits(
        "[queues.q]\nexecutor = { kind = \"external\" }\ntenants.t = { max_concurrency = 2 }\n\n[tenants.t]\n",
    );
    d.configure("q", &l);
    d.ready(Arc::from("stale"), JobId::new(), WALL, 0, WALL, now);
    let (a, b, c) = (JobId::new(), JobId::new(), JobId::new());
    let snapshot = Snapshot {
        jobs: vec![(
            Arc::from("t"),
            vec![(a, WALL - 3), (b, WALL - 2), (c, WALL + 1_000)],
        )],
        running: vec![(Arc::from("t"), 1)],
        priorities: HashMap::from([(b, 10)]),
    };
    d.restore(snapshot, WALL, now);
    let s = d.stats();
    assert_eq!(
        (s.ready, s.delayed, s.oldest_ready_at),
        (2, 1, Some(WALL - 3))
    );
    assert_eq!(d.running("t"), 1);
    let _rx = enlist(&mut d, 5, Duration::from_secs(5), now);
    assert_eq!(
        picked(&d.grants(now)),
        vec![b],
        "the priority first; then the cap of 2, one slot already running"
    );
}

/// One step of the property test.
#[derive(Clone, Debug)]
enum Op {
    /// A job of tenant k becomes ready, due after this many ms (0: now).
    Ready(usize, u64),
    /// The k-th waiting job (mod count) is cancelled.
    Remove(usize),
    /// A lessee asks for up to n jobs.
    Lease(u32),
    /// The k-th leased job (mod count) ends.
    Finish(usize),
    /// The k-th leased job (mod count) is refused at the cluster's cap.
    AtCap(usize),
    /// Time passes.
    Advance(u64),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, prop_oneof![Just(0u64), 1..200u64]).prop_map(|(t, d)| Op::Ready(t, d)),
        2 => any::<usize>().prop_map(Op::Remove),
        4 => (1..4u32).prop_map(Op::Lease),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::AtCap),
        3 => (1..150u64).prop_map(Op::Advance),
        1 => Just(Op::Reopen),
    ]
}

const TENANTS: [&str; 3] = ["a", "b", "c"];

proptest! {
    /// Every waiting job is in exactly one place (fair queue or delayed heap) until
    /// it is removed or picked, no job is picked twice, and the running count of
    /// each tenant is its picked jobs not yet ended.
    #[test]
    fn every_job_is_in_one_place_and_running_counts_match_leases(ops in prop::collection::vec(op(), 1..120)) {
        let start = Instant::now();
        let mut now = start;
        let mut wall = WALL;
        let mut d = Dispatch::new(Fairness::Jobs, None);
        let l = limits(
            "[queues.q]\nexecutor = { kind = \"external\" }\ntenants.a = { max_concurrency = 2 }\n\n[tenants.a]\n",
        );
        d.configure("q", &l);
        // The model: waiting jobs (tenant, id, ready_at, due) and leased ones.
        let mut waiting: Vec<(usize, JobId, UnixMillis)> = Vec::new();
        let mut leased: Vec<(usize, JobId, UnixMillis)> = Vec::new();
        let mut receivers = Vec::new();
        for op in ops {
            match op {
                Op::Ready(t, after) => {
                    let id = JobId::new();
                    let ready_at = wall + after as i64;
                    d.ready(Arc::from(TENANTS[t]), id, ready_at, 0, wall, now);
                    waiting.push((t, id, ready_at));
                }
                Op::Remove(k) if !waiting.is_empty() => {
                    let (t, id, ready_at) = waiting.remove(k % waiting.len());
                    d.remove(TENANTS[t], id, ready_at);
                }
                Op::Lease(n) => receivers.push(enlist(&mut d, n, Duration::from_secs(1), now)),
                Op::Finish(k) if !leased.is_empty() => {
                    let (t, _, _) = leased.remove(k % leased.len());
                    d.finish(TENANTS[t], Duration::ZERO);
                }
                Op::AtCap(k) if !leased.is_empty() => {
                    let (t, id, ready_at) = leased.remove(k % leased.len());
                    d.at_cap(Arc::from(TENANTS[t]), id, ready_at, 0);
                    waiting.push((t, id, ready_at));
                }
                Op::Advance(ms) => {
                    now += Duration::from_millis(ms);
                    wall += ms as i64;
                }
                Op::Reopen => d.reopen(),
                Op::Remove(_) | Op::Finish(_) | Op::AtCap(_) => {}
            }
            for grant in d.grants(now) {
                prop_assert!(!grant.picks.is_empty());
                for (tenant, id) in grant.picks {
                    let pos = waiting.iter().position(|&(_, w, _)| w == id);
                    prop_assert!(pos.is_some(), "picked {id}, which is not waiting (twice, or removed)");
                    let (t, _, ready_at) = waiting.remove(pos.expect("checked"));
                    prop_assert!(ready_at <= wall, "picked before its due time");
                    prop_assert_eq!(&*tenant, TENANTS[t]);
                    leased.push((t, id, ready_at));
                }
            }
            d.expire(now);
            let s = d.stats();
            prop_assert_eq!(s.ready + s.delayed, waiting.len() as u64);
            let due = waiting.iter().filter(|&&(_, _, at)| at <= wall).count() as u64;
            // Delayed jobs move to the fair queue at `grants`, which just ran.
            prop_assert_eq!(s.ready, due);
            for (t, name) in TENANTS.iter().enumerate() {
                let running = leased.iter().filter(|&&(lt, _, _)| lt == t).count() as u32;
                prop_assert_eq!(d.running(name), running, "tenant {}", name);
            }
            prop_assert!(d.running("a") <= 2, "tenant a's cap");
        }
    }
}

#[test]
fn while_the_store_refuses_writes_due_jobs_become_ready_and_no_passed_time_stays_due() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let t: Arc<str> = Arc::from("t");
    let id = JobId::new();
    d.ready(t.clone(), id, WALL + 100, 0, WALL, now);
    let _rx = enlist(&mut d, 1, Duration::from_secs(10), now);
    let later = now + Duration::from_millis(100);
    // The Broker holds instead of granting: the job is due, so it leaves the
    // delayed heap, and only the lessee's deadline is still ahead.
    d.hold(later);
    let s = d.stats();
    assert_eq!((s.ready, s.delayed), (1, 0));
    assert_eq!(d.soonest(), Some(now + Duration::from_secs(10)));
    assert!(d.soonest().is_some_and(|at| at > later));
    // Writes resume: the next pass grants it.
    assert_eq!(picked(&d.grants(later)), vec![id]);
}

#[test]
fn a_job_taken_outside_a_pick_leaves_the_order_and_holds_a_slot() {
    let now = Instant::now();
    let mut d = Dispatch::new(Fairness::Jobs, None);
    let t: Arc<str> = Arc::from("t");
    let id = JobId::new();
    d.ready(t.clone(), id, WALL - 10, 0, WALL, now);
    d.take("t", id, WALL - 10);
    assert_eq!((d.stats().ready, d.running("t")), (0, 1));
    let _rx = enlist(&mut d, 1, Duration::from_secs(1), now);
    assert!(d.grants(now).is_empty(), "it is in the order no more");
    // Its attempt ends (recorded as interrupted) and it is ready once again.
    d.finish("t", Duration::ZERO);
    d.ready(t, id, WALL, 0, WALL, now);
    assert_eq!(picked(&d.grants(now)), vec![id]);
}
