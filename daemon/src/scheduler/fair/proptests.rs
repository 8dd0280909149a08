//! Property tests of the weighted fair queue against a brute-force model.

use proptest::prelude::*;

use super::tests::id;
use super::*;

const TENANTS: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Clone, Debug)]
enum Op {
    Push {
        tenant: usize,
        ready_at: i64,
    },
    /// Remove the k-th queued job (mod count) under a wrong tenant or ready time:
    /// must change nothing.
    RemoveMisnamed(usize, bool),
    Pop,
    Finish {
        tenant: usize,
        run_ms: u64,
    },
    /// Remove the k-th queued job (mod count), or an unknown id when none is queued.
    Remove(usize),
    SetLimits {
        tenant: usize,
        weight: u32,
        cap: Option<u32>,
    },
    StartRunning(usize),
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    let tenant = 0..TENANTS.len();
    prop_oneof![
        6 => (tenant.clone(), 0i64..50).prop_map(|(tenant, ready_at)| Op::Push { tenant, ready_at }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(k, tenant)| Op::RemoveMisnamed(k, tenant)),
        6 => Just(Op::Pop),
        4 => (tenant.clone(), 0u64..5_000).prop_map(|(tenant, run_ms)| Op::Finish { tenant, run_ms }),
        2 => any::<usize>().prop_map(Op::Remove),
        2 => (tenant.clone(), 0u32..4, prop::option::of(0u32..4))
            .prop_map(|(tenant, weight, cap)| Op::SetLimits { tenant, weight, cap }),
        1 => tenant.prop_map(Op::StartRunning),
        1 => Just(Op::Clear),
    ]
}

/// What the queue should hold: queued jobs (tenant, ready_at, push order, id),
/// running counts and caps per tenant.
#[derive(Default)]
struct Model {
    queued: Vec<(usize, i64, u64, JobId)>,
    running: [u32; 4],
    caps: [Option<u32>; 4],
    pushes: u64,
}

impl Model {
    fn capped(&self, t: usize) -> bool {
        self.caps[t].is_some_and(|cap| self.running[t] >= cap)
    }

    fn oldest_of(&self, t: usize) -> Option<(i64, u64, JobId)> {
        self.queued
            .iter()
            .filter(|q| q.0 == t)
            .map(|q| (q.1, q.2, q.3))
            .min()
    }
}

fn tenant_index(name: &str) -> usize {
    TENANTS
        .iter()
        .position(|t| *t == name)
        .expect("a tenant the test pushed")
}

/// Applies `op` to both and checks the queue's answer against the model.
fn step(queue: &mut FairQueue, model: &mut Model, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::Push { tenant, ready_at } => {
            model.pushes += 1;
            let job = id(model.pushes);
            queue.push(TENANTS[tenant].into(), job, ready_at);
            model.queued.push((tenant, ready_at, model.pushes, job));
        }
        Op::RemoveMisnamed(k, wrong_tenant) if !model.queued.is_empty() => {
            let (t, at, _, job) = model.queued[k % model.queued.len()];
            let removed = if wrong_tenant {
                queue.remove(TENANTS[(t + 1) % TENANTS.len()], job, at)
            } else {
                queue.remove(TENANTS[t], job, at + 1)
            };
            prop_assert!(!removed, "removed under a wrong name");
        }
        Op::RemoveMisnamed(..) => {}
        Op::Pop => match queue.pop() {
            Some((name, job)) => {
                let t = tenant_index(&name);
                prop_assert!(!model.capped(t), "cap of {} exceeded", name);
                let oldest = model.oldest_of(t).map(|o| o.2);
                prop_assert_eq!(oldest, Some(job), "not the tenant's oldest");
                model.queued.retain(|q| q.3 != job);
                model.running[t] += 1;
            }
            None => {
                for q in &model.queued {
                    prop_assert!(model.capped(q.0), "idle with uncapped work: {:?}", q);
                }
            }
        },
        Op::Finish { tenant, run_ms } if model.running[tenant] > 0 => {
            queue.finish(TENANTS[tenant], Duration::from_millis(run_ms));
            model.running[tenant] -= 1;
        }
        Op::Finish { .. } => {}
        Op::Remove(k) if !model.queued.is_empty() => {
            let (t, at, _, job) = model.queued.remove(k % model.queued.len());
            prop_assert!(queue.remove(TENANTS[t], job, at));
        }
        Op::Remove(_) => prop_assert!(!queue.remove("a", id(u64::MAX), 0)),
        Op::SetLimits {
            tenant,
            weight,
            cap,
        } => {
            queue.set_limits(
                TENANTS[tenant],
                TenantLimits {
                    weight,
                    max_concurrency: cap,
                },
            );
            model.caps[tenant] = cap;
        }
        Op::StartRunning(tenant) => {
            queue.start_running(TENANTS[tenant]);
            model.running[tenant] += 1;
        }
        Op::Clear => {
            queue.clear();
            model.queued.clear();
            model.running = [0; 4];
        }
    }
    check_counts(queue, model)
}

fn check_counts(queue: &FairQueue, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(queue.len(), model.queued.len());
    prop_assert_eq!(queue.is_empty(), model.queued.is_empty());
    prop_assert_eq!(
        queue.oldest_ready_at(),
        model.queued.iter().map(|q| q.1).min()
    );
    let stats = queue.tenant_stats();
    for (t, name) in TENANTS.iter().enumerate() {
        prop_assert_eq!(queue.running(name), model.running[t]);
        let ready = stats
            .iter()
            .find(|s| &*s.tenant == *name)
            .map_or(0, |s| s.ready);
        prop_assert_eq!(ready, model.queued.iter().filter(|q| q.0 == t).count());
    }
    Ok(())
}

proptest! {
    /// Under any sequence of operations: counts and the oldest ready time equal the
    /// model's, every pushed job is popped at most once and never after removal, a
    /// pop is its tenant's oldest job, caps are never exceeded, and `pop` is `None`
    /// only when every backlogged tenant is capped.
    #[test]
    fn queue_matches_a_brute_force_model(
        runtime in any::<bool>(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let fairness = if runtime { Fairness::Runtime } else { Fairness::Jobs };
        let mut queue = FairQueue::new(fairness);
        let mut model = Model::default();
        for op in ops {
            step(&mut queue, &mut model, op)?;
        }
        // Drain: every job still queued comes out exactly once once caps are lifted.
        for name in TENANTS {
            queue.set_limits(name, TenantLimits { weight: 1, max_concurrency: None });
        }
        while let Some((_, job)) = queue.pop() {
            let before = model.queued.len();
            model.queued.retain(|q| q.3 != job);
            prop_assert_eq!(model.queued.len() + 1, before, "unknown or repeated job");
        }
        prop_assert!(model.queued.is_empty());
    }

    /// Always-backlogged uncapped tenants (one arriving late): none waits more than
    /// the other tenants' weights in pops between two of its services, and the
    /// service per unit weight of any two tenants never drifts more than 2 apart,
    /// so shares converge to the weights.
    #[test]
    fn backlogged_tenants_are_served_by_weight_and_never_starved(
        weights in prop::collection::vec(1u32..=5, 2..=4),
        late_after in 0usize..100,
        pops in 100usize..600,
    ) {
        let mut queue = FairQueue::new(Fairness::Jobs);
        let n = weights.len();
        let late = n - 1;
        for (t, &weight) in weights.iter().enumerate() {
            queue.set_limits(TENANTS[t], TenantLimits { weight, max_concurrency: None });
        }
        let push_all = |queue: &mut FairQueue, t: usize| {
            for k in 0..1_000u64 {
                queue.push(TENANTS[t].into(), id(t as u64 * 10_000 + k), 0);
            }
        };
        for t in 0..late {
            push_all(&mut queue, t);
        }
        let total: u32 = weights.iter().sum();
        let mut waited = vec![0u32; n];
        let mut served_since_late = vec![0u32; n];
        for k in 0..pops {
            if k == late_after {
                push_all(&mut queue, late);
            }
            let active = if k >= late_after { n } else { late };
            let (name, _) = queue.pop().expect("backlogged");
            let t = tenant_index(&name);
            queue.finish(&name, Duration::ZERO);
            for other in 0..active {
                waited[other] = if other == t { 0 } else { waited[other] + 1 };
                prop_assert!(waited[other] <= total - weights[other], "tenant {} starved", other);
            }
            if k >= late_after {
                served_since_late[t] += 1;
                let norm: Vec<f64> = (0..n)
                    .map(|i| f64::from(served_since_late[i]) / f64::from(weights[i]))
                    .collect();
                let spread = norm.iter().cloned().fold(f64::MIN, f64::max)
                    - norm.iter().cloned().fold(f64::MAX, f64::min);
                prop_assert!(spread <= 2.0, "shares drifted: {:?}", norm);
            }
        }
    }
}

/// Pops everything (caps lifted, each pop finished at once), in order.
fn drain(queue: &mut FairQueue) -> Vec<(Arc<str>, JobId)> {
    for name in TENANTS {
        queue.set_limits(
            name,
            TenantLimits {
                weight: 1,
                max_concurrency: None,
            },
        );
    }
    let mut popped = Vec::new();
    while let Some((name, job)) = queue.pop() {
        queue.finish(&name, Duration::from_millis(1));
        popped.push((name, job));
    }
    popped
}

proptest! {
    /// A resync's bulk insert ([`FairQueue::extend`]) leaves the queue exactly as
    /// pushing each job in order would, from any earlier state, sorted or not: same
    /// counts, same oldest ready time, same tenant stats, and the same jobs popped in
    /// the same order afterwards.
    #[test]
    fn extend_is_a_push_of_each_job_in_order(
        runtime in any::<bool>(),
        before in prop::collection::vec(op(), 0..100),
        tenant in 0..TENANTS.len(),
        ready_ats in prop::collection::vec(0i64..60, 0..80),
        sorted in any::<bool>(),
    ) {
        let fairness = if runtime { Fairness::Runtime } else { Fairness::Jobs };
        let (mut pushed, mut extended) = (FairQueue::new(fairness), FairQueue::new(fairness));
        let (mut model_p, mut model_e) = (Model::default(), Model::default());
        for op in before {
            step(&mut pushed, &mut model_p, op.clone())?;
            step(&mut extended, &mut model_e, op)?;
        }
        let mut jobs: Vec<(JobId, i64)> = ready_ats
            .iter()
            .enumerate()
            .map(|(k, &at)| (id(1_000_000 + k as u64), at))
            .collect();
        if sorted {
            jobs.sort_by_key(|&(job, at)| (at, job));
        }
        for &(job, at) in &jobs {
            pushed.push(TENANTS[tenant].into(), job, at);
        }
        extended.extend(TENANTS[tenant].into(), jobs);
        prop_assert_eq!(pushed.len(), extended.len());
        prop_assert_eq!(pushed.oldest_ready_at(), extended.oldest_ready_at());
        prop_assert_eq!(pushed.tenant_stats(), extended.tenant_stats());
        prop_assert_eq!(drain(&mut pushed), drain(&mut extended));
    }
}
