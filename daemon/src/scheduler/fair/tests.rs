//! Unit tests of the weighted fair queue: scenarios in dispatch terms, driven by a
//! small discrete-event simulation of workers with fixed job durations.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::*;

pub(super) fn id(n: u64) -> JobId {
    JobId(uuid::Uuid::from_u128(u128::from(n)))
}

fn limits(weight: u32, max_concurrency: Option<u32>) -> TenantLimits {
    TenantLimits {
        weight,
        max_concurrency,
    }
}

/// What the simulation drives: the fair queue, or a FIFO baseline.
trait Dispatch {
    fn push(&mut self, tenant: &str, id: JobId);
    fn pop(&mut self) -> Option<(Arc<str>, JobId)>;
    fn finish(&mut self, tenant: &str, run_time: Duration);
}

impl Dispatch for FairQueue {
    fn push(&mut self, tenant: &str, id: JobId) {
        FairQueue::push(self, tenant.into(), id, 0);
    }
    fn pop(&mut self) -> Option<(Arc<str>, JobId)> {
        FairQueue::pop(self)
    }
    fn finish(&mut self, tenant: &str, run_time: Duration) {
        FairQueue::finish(self, tenant, run_time);
    }
}

/// One queue for everybody: what qd did before tenants were scheduled.
#[derive(Default)]
struct Fifo(VecDeque<(Arc<str>, JobId)>);

impl Dispatch for Fifo {
    fn push(&mut self, tenant: &str, id: JobId) {
        self.0.push_back((tenant.into(), id));
    }
    fn pop(&mut self) -> Option<(Arc<str>, JobId)> {
        self.0.pop_front()
    }
    fn finish(&mut self, _: &str, _: Duration) {}
}

/// A dispatch the simulation made: who, which job, when (simulated ms).
struct Dispatched {
    tenant: Arc<str>,
    id: JobId,
    at_ms: u64,
}

/// Runs `workers` workers until nothing is left or `until_ms` passes. A job of
/// tenant T runs `run_ms(T)`. `after_pop(n, queue)` runs after the n-th dispatch
/// (1-based) and may push more work.
fn simulate<Q: Dispatch>(
    queue: &mut Q,
    workers: usize,
    until_ms: u64,
    run_ms: impl Fn(&str) -> u64,
    mut after_pop: impl FnMut(usize, &mut Q),
) -> Vec<Dispatched> {
    let mut log = Vec::new();
    let mut busy: BinaryHeap<Reverse<(u64, usize, Arc<str>)>> = BinaryHeap::new();
    let mut now = 0;
    while now <= until_ms {
        while busy.len() < workers {
            let Some((tenant, id)) = queue.pop() else {
                break;
            };
            busy.push(Reverse((now + run_ms(&tenant), log.len(), tenant.clone())));
            log.push(Dispatched {
                tenant,
                id,
                at_ms: now,
            });
            after_pop(log.len(), queue);
        }
        let Some(Reverse((end, _, tenant))) = busy.pop() else {
            break;
        };
        now = end;
        queue.finish(&tenant, Duration::from_millis(run_ms(&tenant)));
    }
    log
}

/// The seed scenario: A floods 500 jobs; B's 10 arrive after 5 of A's were taken;
/// 5 workers, 1 s jobs. Returns B's longest wait (ms) and the dispatch log.
fn flood_scenario<Q: Dispatch>(queue: &mut Q) -> (u64, Vec<Dispatched>) {
    for n in 0..500 {
        queue.push("A", id(n));
    }
    let log = simulate(
        queue,
        5,
        u64::MAX,
        |_| 1_000,
        |n, queue| {
            if n == 5 {
                for n in 0..10 {
                    queue.push("B", id(1_000 + n));
                }
            }
        },
    );
    let b_wait = log
        .iter()
        .filter(|d| &*d.tenant == "B")
        .map(|d| d.at_ms)
        .max()
        .expect("B ran");
    (b_wait, log)
}

#[test]
fn small_tenant_is_not_stuck_behind_a_flood_unlike_fifo() {
    let (fair_wait, log) = flood_scenario(&mut FairQueue::new(Fairness::Jobs));
    let (fifo_wait, fifo_log) = flood_scenario(&mut Fifo::default());
    for log in [&log, &fifo_log] {
        let unique: std::collections::HashSet<JobId> = log.iter().map(|d| d.id).collect();
        assert_eq!(unique.len(), 510, "every job dispatched exactly once");
        assert_eq!(log.len(), 510);
    }
    // Fair: B alternates with A, so its 10 jobs go within the next 20 dispatches.
    let b_positions: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, d)| &*d.tenant == "B")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(b_positions.len(), 10);
    assert!(
        b_positions.iter().all(|&i| (5..25).contains(&i)),
        "{b_positions:?}"
    );
    assert!(fair_wait <= 4_000, "fair wait {fair_wait} ms");
    // FIFO: B waits for the whole flood (~99 s with 5 workers).
    assert!(fifo_wait >= 90_000, "fifo wait {fifo_wait} ms");
}

/// Pops `n` jobs, finishing each at once; returns jobs per tenant.
fn pop_counts(queue: &mut FairQueue, n: usize) -> HashMap<Arc<str>, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n {
        let (tenant, _) = queue.pop().expect("backlogged");
        queue.finish(&tenant, Duration::ZERO);
        *counts.entry(tenant).or_default() += 1;
    }
    counts
}

#[test]
fn weights_three_to_one_give_three_quarters_and_one_quarter() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("heavy", limits(3, None));
    for n in 0..2_000 {
        queue.push("heavy".into(), id(n), 0);
        queue.push("light".into(), id(10_000 + n), 0);
    }
    let counts = pop_counts(&mut queue, 2_000);
    // DRR with unit cost is exact per round of 4 jobs.
    assert_eq!(counts["heavy"], 1_500);
    assert_eq!(counts["light"], 500);
}

#[test]
fn capped_tenant_never_exceeds_its_cap_and_others_use_free_capacity() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("capped", limits(5, Some(2)));
    for n in 0..10 {
        queue.push("capped".into(), id(n), 0);
        queue.push("free".into(), id(100 + n), 0);
    }
    let mut popped = Vec::new();
    while let Some((tenant, _)) = queue.pop() {
        assert!(queue.running("capped") <= 2);
        popped.push(tenant);
    }
    assert_eq!(popped.iter().filter(|t| &***t == "capped").count(), 2);
    assert_eq!(popped.iter().filter(|t| &***t == "free").count(), 10);
    // None with work queued only because the one backlogged tenant is capped.
    assert_eq!(queue.len(), 8);
    queue.finish("capped", Duration::ZERO);
    assert_eq!(queue.pop().map(|(t, _)| t), Some("capped".into()));
    assert_eq!(queue.pop(), None);
    // Raising the cap takes effect at the next pop.
    queue.set_limits("capped", limits(5, Some(4)));
    assert!(queue.pop().is_some() && queue.pop().is_some());
    assert_eq!(queue.pop(), None);
    assert_eq!(queue.running("capped"), 4);
}

#[test]
fn a_job_refused_at_the_cluster_cap_waits_again_uncharged_and_its_tenant_is_held() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("capped", limits(1, Some(3)));
    for n in 1..=3 {
        queue.push("capped".into(), id(n), i64::try_from(n).expect("small"));
    }
    queue.push("free".into(), id(10), 100);
    let (tenant, first) = queue.pop().expect("a job");
    assert_eq!((&*tenant, first), ("capped", id(1)));
    // Other nodes hold the tenant's other slots: the store refused the job.
    queue.at_cap(tenant, first, 1);
    assert_eq!(queue.running("capped"), 0, "its slot is free again");
    assert_eq!(queue.len(), 4, "the job waits again");
    assert_eq!(queue.oldest_ready_at(), Some(1), "at its place");
    // Held: the other tenant is served, then nothing, though the cap of 3 is far.
    assert_eq!(queue.pop(), Some(("free".into(), id(10))));
    assert_eq!(
        queue.pop(),
        None,
        "a held tenant is not picked again and again"
    );
    // The cluster's poll tries it again, oldest first.
    queue.reopen();
    assert_eq!(queue.pop(), Some(("capped".into(), id(1))));
    queue.at_cap("capped".into(), id(1), 1);
    assert_eq!(queue.pop(), None);
    // A job of it ending here frees a slot across the cluster too.
    queue.start_running("capped");
    queue.finish("capped", Duration::ZERO);
    assert_eq!(queue.pop(), Some(("capped".into(), id(1))));
    queue.at_cap("capped".into(), id(1), 1);
    // So does a change of its cap; and a tenant without a cap is never held.
    queue.set_limits("capped", limits(1, Some(4)));
    assert_eq!(queue.pop(), Some(("capped".into(), id(1))));
    queue.set_limits("capped", limits(1, None));
    queue.at_cap("capped".into(), id(1), 1);
    assert_eq!(queue.pop(), Some(("capped".into(), id(1))));
}

#[test]
fn a_tenant_refused_at_the_cluster_cap_again_and_again_gains_no_credit() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("capped", limits(1, Some(5)));
    for n in 1..=5 {
        queue.push("capped".into(), id(n), 1);
    }
    // Alone in the queue, refused ten times over (ten polls of the cluster).
    for _ in 0..10 {
        queue.reopen();
        let (tenant, job) = queue.pop().expect("a job");
        queue.at_cap(tenant, job, 1);
    }
    for n in 6..=10 {
        queue.push("other".into(), id(n), 2);
    }
    queue.reopen();
    let served: Vec<String> = (0..6)
        .map(|_| queue.pop().expect("a job").0.to_string())
        .collect();
    let twice = served
        .windows(2)
        .any(|w| w[0] == "capped" && w[1] == "capped");
    assert!(!twice, "weights 1:1 alternate: {served:?}");
}

#[test]
fn zero_cap_holds_a_tenant_and_start_running_counts_against_the_cap() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("held", limits(1, Some(0)));
    queue.push("held".into(), id(1), 0);
    assert_eq!(queue.pop(), None);
    queue.set_limits("held", limits(1, Some(1)));
    queue.start_running("held");
    assert_eq!(queue.pop(), None);
    queue.finish("held", Duration::ZERO);
    assert_eq!(queue.pop(), Some(("held".into(), id(1))));
}

#[test]
fn tenant_returning_from_idle_gets_no_burst_beyond_its_weight() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("b", limits(2, None));
    queue.push("b".into(), id(0), 0);
    assert_eq!(queue.pop(), Some(("b".into(), id(0))));
    queue.finish("b", Duration::ZERO);
    // b is idle while a is served 1,000 times.
    for n in 1..=2_000 {
        queue.push("a".into(), id(n), 0);
    }
    pop_counts(&mut queue, 1_000);
    for n in 0..100 {
        queue.push("b".into(), id(10_000 + n), 0);
    }
    let order: String = (0..30)
        .map(|_| {
            let (tenant, _) = queue.pop().expect("backlogged");
            queue.finish(&tenant, Duration::ZERO);
            tenant.to_string()
        })
        .collect();
    assert!(!order.contains("bbb"), "burst: {order}");
    assert_eq!(order.matches('b').count(), 20, "{order}");
}

/// Totals (jobs, run ms) per tenant after `until_ms` of 5 workers on two
/// backlogged equal-weight tenants, "long" with 10 s jobs and "short" with 1 s jobs.
fn long_and_short(fairness: Fairness) -> HashMap<Arc<str>, (u64, u64)> {
    let mut queue = FairQueue::new(fairness);
    for n in 0..20_000 {
        queue.push("long".into(), id(n), 0);
        queue.push("short".into(), id(100_000 + n), 0);
    }
    let run_ms = |tenant: &str| if tenant == "long" { 10_000 } else { 1_000 };
    let mut totals: HashMap<Arc<str>, (u64, u64)> = HashMap::new();
    for d in simulate(&mut queue, 5, 2_000_000, run_ms, |_, _| ()) {
        let entry = totals.entry(d.tenant.clone()).or_default();
        entry.0 += 1;
        entry.1 += run_ms(&d.tenant);
    }
    totals
}

#[test]
fn runtime_fairness_equalises_run_time_not_job_counts() {
    let totals = long_and_short(Fairness::Runtime);
    let (long_jobs, long_ms) = totals["long"];
    let (short_jobs, short_ms) = totals["short"];
    let ratio = long_ms as f64 / short_ms as f64;
    assert!((0.9..=1.1).contains(&ratio), "run time ratio {ratio}");
    assert!(short_jobs > 8 * long_jobs, "{short_jobs} vs {long_jobs}");
    // The same load by job count gives the long tenant ~10x the run time.
    let totals = long_and_short(Fairness::Jobs);
    let ratio = totals["long"].1 as f64 / totals["short"].1 as f64;
    assert!(ratio > 8.0, "jobs-mode run time ratio {ratio}");
}

#[test]
fn runtime_debtor_is_still_served_when_alone() {
    let mut queue = FairQueue::new(Fairness::Runtime);
    for n in 0..3 {
        queue.push("slow".into(), id(n), 0);
    }
    for _ in 0..3 {
        let (tenant, _) = queue.pop().expect("work-conserving");
        queue.finish(&tenant, Duration::from_secs(600));
    }
    assert!(queue.is_empty());
}

#[test]
fn fifo_within_a_tenant_is_by_ready_time_and_oldest_is_exact() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.push("t".into(), id(1), 100);
    queue.push("t".into(), id(2), 300);
    queue.push("t".into(), id(3), 50); // pushed late (resync)
    queue.push("t".into(), id(4), 300);
    queue.push("u".into(), id(5), 70);
    assert_eq!(queue.oldest_ready_at(), Some(50));
    assert!(!queue.remove("t", id(3), 100), "not at that ready time");
    assert!(!queue.remove("u", id(3), 50), "not of that tenant");
    assert!(queue.remove("t", id(3), 50));
    assert_eq!(queue.oldest_ready_at(), Some(70));
    let order: Vec<JobId> = std::iter::from_fn(|| queue.pop().map(|(_, id)| id))
        .filter(|&j| j != id(5))
        .collect();
    assert_eq!(order, vec![id(1), id(2), id(4)]);
    assert_eq!(queue.oldest_ready_at(), None);
}

#[test]
fn removed_jobs_are_never_popped_and_a_popped_job_is_not_removed() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.push("t".into(), id(1), 0);
    queue.push("t".into(), id(2), 0);
    queue.push("t".into(), id(3), 0);
    assert_eq!(queue.len(), 3);
    assert!(queue.remove("t", id(2), 0));
    assert!(!queue.remove("t", id(2), 0));
    assert_eq!(queue.len(), 2);
    assert_eq!(queue.pop(), Some(("t".into(), id(1))));
    assert!(
        !queue.remove("t", id(1), 0),
        "popped already (a lease in flight)"
    );
    assert_eq!(queue.pop(), Some(("t".into(), id(3))));
    assert_eq!(queue.pop(), None);
    // Re-pushing a removed id queues it again, once.
    queue.push("t".into(), id(2), 0);
    assert_eq!(queue.pop(), Some(("t".into(), id(2))));
    assert_eq!(queue.pop(), None);
    assert!(!queue.remove("nobody", id(9), 0));
}

#[test]
fn a_removal_finds_its_job_among_many_ready_in_the_same_millisecond() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    for n in 0..3_000 {
        queue.push("t".into(), id(n), i64::try_from(n / 1_000).expect("small"));
    }
    for n in [1_500, 1_000, 1_999, 2_000, 0] {
        let at = i64::try_from(n / 1_000).expect("small");
        assert!(queue.remove("t", id(n), at), "job {n}");
    }
    assert_eq!(queue.len(), 2_995);
    let popped: Vec<JobId> = std::iter::from_fn(|| queue.pop().map(|(_, id)| id)).collect();
    let want: Vec<JobId> = (0..3_000)
        .filter(|n| ![1_500, 1_000, 1_999, 2_000, 0].contains(n))
        .map(id)
        .collect();
    assert_eq!(popped, want);
}

#[test]
fn extend_of_a_sorted_list_into_an_idle_tenant_takes_the_list_without_a_copy() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    let jobs: Vec<(JobId, UnixMillis)> = (0..100).map(|n| (id(n), 7)).collect();
    let buffer = jobs.as_ptr();
    queue.extend("t".into(), jobs);
    let t = queue.by_name["t"] as usize;
    let (front, _) = queue.tenants[t].backlog.as_slices_for_test();
    assert_eq!(front.as_ptr(), buffer);
    assert_eq!(queue.len(), 100);
    assert_eq!(queue.oldest_ready_at(), Some(7));
}

#[test]
fn many_cancellations_keep_counts_exact_and_memory_bounded() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    for n in 0..10_000 {
        queue.push("t".into(), id(n), i64::try_from(n).expect("small"));
    }
    for n in (1..10_000).filter(|n| n % 100 != 0) {
        assert!(queue.remove("t", id(n), i64::try_from(n).expect("small")));
    }
    assert_eq!(queue.len(), 100);
    assert_eq!(queue.oldest_ready_at(), Some(0));
    assert!(queue.remove("t", id(0), 0));
    assert_eq!(queue.oldest_ready_at(), Some(100));
    let slot = queue.by_name["t"];
    assert_eq!(queue.tenants[slot as usize].backlog.len(), 99);
    let (front, back) = queue.tenants[slot as usize].backlog.as_slices_for_test();
    assert!(
        front.len() + back.len() <= 2 * 99 + 65,
        "tombstones compacted"
    );
    let popped: Vec<JobId> = std::iter::from_fn(|| queue.pop().map(|(_, id)| id)).collect();
    assert_eq!(popped, (1..100).map(|k| id(k * 100)).collect::<Vec<_>>());
}

#[test]
fn weight_change_applies_from_the_next_turn() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("a", limits(10, None));
    for n in 0..1_000 {
        queue.push("a".into(), id(n), 0);
        queue.push("b".into(), id(10_000 + n), 0);
    }
    pop_counts(&mut queue, 11);
    queue.set_limits("a", limits(1, None));
    let counts = pop_counts(&mut queue, 100);
    assert!(counts["a"].abs_diff(50) <= 2, "{counts:?}");
}

#[test]
fn a_weight_lowered_in_the_middle_of_a_turn_applies_from_the_next_pop() {
    for parked in [true, false] {
        let mut queue = FairQueue::new(Fairness::Jobs);
        queue.set_limits("a", limits(1_000, None));
        for n in 0..2_000 {
            queue.push("a".into(), id(n), 0);
            queue.push("b".into(), id(10_000 + n), 0);
        }
        assert_eq!(queue.pop().map(|(t, _)| t), Some("a".into()));
        if parked {
            // At its cap while its credit lasts: it keeps the credit, parked.
            queue.set_limits("a", limits(1_000, Some(1)));
            assert_eq!(queue.pop().map(|(t, _)| t), Some("b".into()));
            queue.finish("b", Duration::ZERO);
        }
        queue.set_limits("a", limits(1, None));
        queue.finish("a", Duration::ZERO);
        let counts = pop_counts(&mut queue, 100);
        assert!(counts["a"].abs_diff(50) <= 2, "parked {parked}: {counts:?}");
    }
}

#[test]
fn default_limits_apply_to_tenants_without_their_own() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("own", limits(1, None));
    queue.push("own".into(), id(1), 0);
    queue.push("other".into(), id(2), 0);
    queue.push("other".into(), id(3), 0);
    queue.set_default_limits(limits(4, Some(1)));
    let stats = queue.tenant_stats();
    let by_name: HashMap<&str, &TenantStats> = stats.iter().map(|s| (&*s.tenant, s)).collect();
    assert_eq!(by_name["other"].weight, 4);
    assert_eq!(by_name["other"].max_concurrency, Some(1));
    assert_eq!(by_name["own"].weight, 1);
    while queue.pop().is_some() {}
    assert_eq!(queue.running("other"), 1);
    assert_eq!(queue.len(), 1);
}

#[test]
fn dropped_limits_give_way_to_the_defaults_queued_or_not() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_default_limits(limits(2, None));
    queue.set_limits("capped", limits(5, Some(1)));
    queue.set_limits("kept", limits(3, Some(1)));
    queue.set_limits("absent", limits(7, Some(1)));
    for n in 1..=3 {
        queue.push("capped".into(), id(n), 0);
    }
    assert!(queue.pop().is_some());
    assert_eq!(queue.pop(), None, "capped at 1");
    queue.retain_limits(|name| name == "kept");
    let stats = queue.tenant_stats();
    let names: Vec<&str> = stats.iter().map(|s| &*s.tenant).collect();
    assert_eq!(names, ["capped", "kept"], "absent is forgotten");
    assert_eq!((stats[0].weight, stats[0].max_concurrency), (2, None));
    assert_eq!((stats[1].weight, stats[1].max_concurrency), (3, Some(1)));
    assert!(queue.pop().is_some() && queue.pop().is_some(), "uncapped");
    assert_eq!(queue.running("capped"), 3);
}

#[test]
fn zero_weight_is_read_as_one() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("z", limits(0, None));
    queue.push("z".into(), id(1), 0);
    assert_eq!(queue.pop(), Some(("z".into(), id(1))));
    assert_eq!(queue.tenant_stats()[0].weight, 1);
}

#[test]
fn tenant_stats_report_ready_running_and_configured_tenants() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("configured", limits(3, Some(7)));
    queue.push("busy".into(), id(1), 0);
    queue.push("busy".into(), id(2), 0);
    queue.pop();
    assert_eq!(
        queue.tenant_stats(),
        vec![
            TenantStats {
                tenant: "busy".into(),
                ready: 1,
                running: 1,
                weight: 1,
                max_concurrency: None,
            },
            TenantStats {
                tenant: "configured".into(),
                ready: 0,
                running: 0,
                weight: 3,
                max_concurrency: Some(7),
            },
        ]
    );
}

#[test]
fn idle_tenants_are_forgotten_but_their_limits_are_kept() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.set_limits("kept", limits(2, Some(1)));
    for n in 0..100 {
        let tenant: Arc<str> = format!("t{n}").into();
        queue.push(tenant.clone(), id(n), 0);
        queue.pop();
        queue.finish(&tenant, Duration::ZERO);
    }
    assert!(queue.by_name.is_empty());
    assert!(queue.tenants.len() <= 1);
    queue.push("kept".into(), id(1_000), 0);
    queue.push("kept".into(), id(1_001), 0);
    queue.pop();
    assert_eq!(queue.pop(), None);
}

#[test]
fn clear_drops_jobs_and_counts_but_keeps_limits_and_mode() {
    let mut queue = FairQueue::new(Fairness::Runtime);
    queue.set_limits("a", limits(2, Some(1)));
    queue.push("a".into(), id(1), 5);
    queue.push("a".into(), id(2), 6);
    queue.pop();
    queue.clear();
    assert!(queue.is_empty());
    assert_eq!(queue.oldest_ready_at(), None);
    assert_eq!(queue.running("a"), 0);
    queue.push("a".into(), id(1), 5);
    queue.push("a".into(), id(2), 6);
    assert!(queue.pop().is_some());
    assert_eq!(queue.pop(), None, "cap of 1 survived clear");
}

#[test]
fn switching_fairness_keeps_every_job_and_the_round_robin() {
    let mut queue = FairQueue::new(Fairness::Runtime);
    for n in 0..10 {
        queue.push("a".into(), id(n), 0);
        queue.push("b".into(), id(100 + n), 0);
    }
    let (tenant, _) = queue.pop().expect("backlogged");
    queue.finish(&tenant, Duration::from_secs(3_600));
    queue.set_fairness(Fairness::Jobs);
    let counts = pop_counts(&mut queue, 19);
    assert_eq!(counts.values().sum::<usize>(), 19);
    assert!(counts["a"].abs_diff(counts["b"]) <= 1, "{counts:?}");
    assert!(queue.is_empty());
}

#[test]
fn runtime_charge_replaces_the_estimate_with_the_measured_run_time() {
    let mut queue = FairQueue::new(Fairness::Runtime);
    for n in 0..4 {
        queue.push("t".into(), id(n), 0);
    }
    queue.pop();
    queue.pop();
    let t = queue.by_name["t"] as usize;
    // Nothing measured yet: each pop pre-charged one quantum (1 ms).
    assert_eq!(queue.tenants[t].outstanding, 2 * RUNTIME_QUANTUM_US);
    let before = queue.tenants[t].deficit;
    queue.finish("t", Duration::from_millis(3));
    assert_eq!(
        queue.tenants[t].deficit,
        before + RUNTIME_QUANTUM_US - 3_000
    );
    queue.finish("t", Duration::from_millis(1));
    assert_eq!(
        queue.tenants[t].deficit,
        before + 2 * RUNTIME_QUANTUM_US - 4_000
    );
    assert_eq!(queue.tenants[t].outstanding, 0);
    // The next pre-charge is the moving average of what was measured.
    assert_eq!(queue.dispatch_cost(t as u32), 3_000 + (1_000 - 3_000) / 8);
}
