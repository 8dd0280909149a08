//! Property tests of priority within a tenant: a tenant's jobs come out by
//! `ready_at - priority`, the queue's age stays the oldest real `ready_at`, and
//! priorities never change which tenant is served.

use proptest::prelude::*;

use super::tests::id;
use super::*;

const TENANTS: [&str; 3] = ["a", "b", "c"];
const DAY: i64 = 86_400_000;

#[derive(Clone, Debug)]
enum Op {
    Push {
        tenant: usize,
        ready_at: i64,
        priority: i64,
    },
    Pop,
    /// Remove the k-th queued job (mod count), if any.
    Remove(usize),
    /// A popped job (the k-th running one, mod count) comes back uncharged
    /// ([`FairQueue::at_cap`]), keeping its priority.
    AtCap(usize),
}

fn priority() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        2 => -600_000i64..=600_000,
        1 => prop_oneof![Just(-DAY), Just(DAY)],
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..TENANTS.len(), 0i64..1_000, priority())
            .prop_map(|(tenant, ready_at, priority)| Op::Push { tenant, ready_at, priority }),
        5 => Just(Op::Pop),
        1 => any::<usize>().prop_map(Op::Remove),
        1 => any::<usize>().prop_map(Op::AtCap),
    ]
}

/// A job as the test knows it: tenant, ready_at, priority, id.
type Known = (usize, i64, i64, JobId);

fn key(&(_, ready_at, priority, id): &Known) -> (i64, JobId) {
    (ready_at - priority, id)
}

/// Applies `op` to `queue`, or (with `plain`) the same op with every priority 0;
/// keeps `queued` and `running` as the model. Returns the popped job, if any.
fn apply(
    queue: &mut FairQueue,
    op: &Op,
    plain: bool,
    n: &mut u64,
    queued: &mut Vec<Known>,
    running: &mut Vec<Known>,
) -> Option<Known> {
    let p = |priority: i64| if plain { 0 } else { priority };
    match *op {
        Op::Push {
            tenant,
            ready_at,
            priority,
        } => {
            *n += 1;
            let job = (tenant, ready_at, p(priority), id(*n));
            queue.push_prioritized(TENANTS[tenant].into(), job.3, ready_at, job.2);
            queued.push(job);
            None
        }
        Op::Pop => {
            let (name, popped) = queue.pop()?;
            let at = queued
                .iter()
                .position(|j| j.3 == popped)
                .expect("popped a queued job");
            let job = queued.remove(at);
            assert_eq!(&*name, TENANTS[job.0], "popped under its tenant");
            running.push(job);
            Some(job)
        }
        Op::Remove(k) => {
            if !queued.is_empty() {
                let job = queued.remove(k % queued.len());
                assert!(
                    queue.remove(TENANTS[job.0], job.3, job.1),
                    "removed {job:?}"
                );
            }
            None
        }
        Op::AtCap(k) => {
            if !running.is_empty() {
                let job = running.remove(k % running.len());
                queue.at_cap_prioritized(TENANTS[job.0].into(), job.3, job.1, job.2);
                queued.push(job);
            }
            None
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every pop hands out its tenant's first job by `(ready_at - priority, id)`,
    /// and the queue's age is always the oldest real `ready_at` queued.
    #[test]
    fn a_tenants_jobs_come_out_by_ready_at_minus_priority(ops in prop::collection::vec(op(), 1..200)) {
        let mut queue = FairQueue::new(Fairness::Jobs);
        let (mut n, mut queued, mut running) = (0, Vec::new(), Vec::new());
        for op in &ops {
            let before: Vec<Known> = queued.clone();
            if let Some(job) = apply(&mut queue, op, false, &mut n, &mut queued, &mut running) {
                let first = before
                    .iter()
                    .filter(|j| j.0 == job.0)
                    .min_by_key(|j| key(j))
                    .expect("its tenant had jobs");
                prop_assert_eq!(first.3, job.3, "tenant {} out of priority order", job.0);
            }
            prop_assert_eq!(queue.len(), queued.len());
            prop_assert_eq!(
                queue.oldest_ready_at(),
                queued.iter().map(|j| j.1).min(),
                "the queue age is the real wait"
            );
        }
    }

    /// The same operations with and without priorities serve the same tenants in
    /// the same order: a priority only reorders its own tenant's jobs.
    #[test]
    fn priorities_never_change_which_tenant_is_served(
        ops in prop::collection::vec(op(), 1..300),
        weights in prop::collection::vec(1u32..=4, TENANTS.len()),
    ) {
        let mut with = FairQueue::new(Fairness::Jobs);
        let mut without = FairQueue::new(Fairness::Jobs);
        for (t, &weight) in weights.iter().enumerate() {
            let limits = TenantLimits { weight, max_concurrency: None };
            with.set_limits(TENANTS[t], limits);
            without.set_limits(TENANTS[t], limits);
        }
        let (mut n1, mut q1, mut r1) = (0, Vec::new(), Vec::new());
        let (mut n2, mut q2, mut r2) = (0, Vec::new(), Vec::new());
        for op in &ops {
            // Removes and at-caps pick jobs by position, and the two queues hold
            // their tenants' jobs in different orders: here they are pops.
            let op = match *op {
                Op::Remove(_) | Op::AtCap(_) => Op::Pop,
                ref other => other.clone(),
            };
            let a = apply(&mut with, &op, false, &mut n1, &mut q1, &mut r1).map(|j| j.0);
            let b = apply(&mut without, &op, true, &mut n2, &mut q2, &mut r2).map(|j| j.0);
            prop_assert_eq!(a, b, "a priority changed which tenant was served");
            if let Some(t) = a {
                with.finish(TENANTS[t], Duration::ZERO);
                without.finish(TENANTS[t], Duration::ZERO);
            }
        }
    }
}

#[test]
fn a_prioritized_job_overtakes_its_tenants_older_jobs_and_not_another_tenants_turn() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.push("a".into(), id(1), 1_000);
    queue.push("a".into(), id(2), 2_000);
    queue.push("b".into(), id(3), 5_000);
    queue.push_prioritized("a".into(), id(4), 9_000, 10 * 60_000);
    assert_eq!(queue.oldest_ready_at(), Some(1_000), "the real wait");
    let order: Vec<(Arc<str>, JobId)> = std::iter::from_fn(|| {
        let next = queue.pop()?;
        queue.finish(&next.0, Duration::ZERO);
        Some(next)
    })
    .collect();
    let ids: Vec<JobId> = order.iter().map(|(_, id)| *id).collect();
    // a's first turn goes to its prioritized job; b keeps its turn in between.
    assert_eq!(ids, vec![id(4), id(3), id(1), id(2)]);
    assert_eq!(queue.oldest_ready_at(), None);
}

#[test]
fn a_negative_priority_lets_the_tenants_later_jobs_pass() {
    let mut queue = FairQueue::new(Fairness::Jobs);
    queue.push_prioritized("a".into(), id(1), 1_000, -5 * 60_000);
    queue.push("a".into(), id(2), 2_000);
    assert_eq!(queue.pop().map(|(_, id)| id), Some(id(2)));
    assert_eq!(queue.oldest_ready_at(), Some(1_000));
    assert!(
        queue.remove("a", id(1), 1_000),
        "removed by its real ready_at"
    );
    assert!(queue.is_empty());
    assert_eq!(queue.oldest_ready_at(), None);
}
