//! Random DAGs with random outcomes, redrives, releases and cancels, driven through
//! [`Graph`] and [`settle_child`] as a store engine drives them, checked after every
//! step against an oracle that derives each edge from its parent's history alone.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::job::{Job, JobId, State};

#[derive(Clone, Debug)]
enum Op {
    Enqueue,
    Succeed(usize),
    Die(usize),
    Redrive(usize),
    Release(usize),
    Cancel { job: usize, cascade: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Enqueue),
        3 => (0..16usize).prop_map(Op::Succeed),
        2 => (0..16usize).prop_map(Op::Die),
        1 => (0..16usize).prop_map(Op::Redrive),
        1 => (0..16usize).prop_map(Op::Release),
        1 => (0..16usize, any::<bool>()).prop_map(|(job, cascade)| Op::Cancel { job, cascade }),
    ]
}

/// One planned job: its parents (indexes of earlier jobs) and policy.
#[derive(Clone, Debug)]
struct Spec {
    parents: Vec<usize>,
    policy: AfterPolicy,
}

fn specs() -> impl Strategy<Value = Vec<Spec>> {
    (2..16usize).prop_flat_map(|n| {
        (0..n)
            .map(|i| {
                (
                    proptest::collection::btree_set(0..i.max(1), 0..=i.min(4)),
                    any::<bool>(),
                )
                    .prop_map(move |(ps, finished)| Spec {
                        parents: if i == 0 {
                            vec![]
                        } else {
                            ps.into_iter().collect()
                        },
                        policy: if finished {
                            AfterPolicy::Finished
                        } else {
                            AfterPolicy::Succeeded
                        },
                    })
            })
            .collect::<Vec<_>>()
    })
}

/// What the oracle knows of one edge, from events alone.
#[derive(Clone, Copy, Default)]
struct Seen {
    parent_succeeded: bool,
    parent_final: bool,
    released: bool,
}

struct Model {
    specs: Vec<Spec>,
    ids: Vec<JobId>,
    jobs: Vec<Job>,
    graph: Graph,
    seen: BTreeMap<(usize, usize), Seen>,
    now: i64,
}

impl Model {
    fn new(specs: Vec<Spec>) -> Model {
        let ids = (0..specs.len())
            .map(|i| JobId(uuid::Uuid::from_u128(i as u128 + 1)))
            .collect();
        Model {
            specs,
            ids,
            jobs: Vec::new(),
            graph: Graph::default(),
            seen: BTreeMap::new(),
            now: 1_000,
        }
    }

    fn index(&self, id: JobId) -> usize {
        self.ids.iter().position(|i| *i == id).expect("known id")
    }

    fn enqueue(&mut self) {
        let i = self.jobs.len();
        if i == self.specs.len() {
            return;
        }
        let spec = self.specs[i].clone();
        let mut job = Job {
            id: self.ids[i],
            queue: Arc::from("q"),
            tenant: Arc::from("t"),
            idempotency_key: None,
            state: State::Ready,
            attempts: 0,
            budget_start: 0,
            max_attempts: 1,
            lease_seq: 0,
            worker: None,
            leased_at: None,
            created_at: self.now,
            ready_at: self.now,
            updated_at: self.now,
            last_error: None,
            priority_ms: 0,
        };
        let parents: Vec<(JobId, State)> = spec
            .parents
            .iter()
            .map(|p| (self.ids[*p], self.jobs[*p].state))
            .collect();
        for p in &spec.parents {
            let s = self.jobs[*p].state;
            self.seen.insert(
                (*p, i),
                Seen {
                    parent_succeeded: s == State::Succeeded,
                    parent_final: s.is_final(),
                    released: false,
                },
            );
        }
        if !parents.is_empty() {
            let counts = self.graph.add_child(job.id, spec.policy, &parents);
            if let Some(s) = child_state(counts) {
                job.state = s;
            }
        }
        self.jobs.push(job);
    }

    /// Job `i` reached `state`: move its edges, settle its children.
    fn changed(&mut self, i: usize, state: State) {
        self.now += 1;
        self.jobs[i].state = state;
        for ((p, _), seen) in self.seen.iter_mut().filter(|((p, _), _)| *p == i) {
            let _ = p;
            seen.parent_succeeded |= state == State::Succeeded;
            seen.parent_final |= state.is_final();
        }
        for (child, counts) in self.graph.parent_changed(self.ids[i], state) {
            let c = self.index(child);
            if let Some(next) = settle_child(&self.jobs[c], counts, self.now) {
                self.jobs[c] = next;
            }
        }
    }

    fn step(&mut self, op: Op) {
        let n = self.jobs.len();
        match op {
            Op::Enqueue => self.enqueue(),
            Op::Succeed(i) if i < n && self.jobs[i].state == State::Ready => {
                self.changed(i, State::Succeeded)
            }
            Op::Die(i) if i < n && self.jobs[i].state == State::Ready => {
                self.changed(i, State::Dead)
            }
            Op::Redrive(i) if i < n && self.jobs[i].state == State::Dead => {
                self.changed(i, State::Ready)
            }
            Op::Release(i) if i < n && self.jobs[i].state == State::Blocked => {
                if let Some((counts, released)) = self.graph.release(self.ids[i]) {
                    for p in released {
                        let p = self.index(p);
                        self.seen.get_mut(&(p, i)).expect("edge").released = true;
                    }
                    if let Some(next) = settle_child(&self.jobs[i], counts, self.now) {
                        self.jobs[i] = next;
                    }
                }
            }
            Op::Cancel { job: i, cascade } if i < n && !self.jobs[i].state.is_final() => {
                let mut victims = vec![i];
                if cascade {
                    victims.extend(
                        self.graph
                            .dependents(self.ids[i])
                            .into_iter()
                            .map(|id| self.index(id))
                            .filter(|c| !self.jobs[*c].state.is_final()),
                    );
                }
                for v in victims {
                    if !self.jobs[v].state.is_final() {
                        self.changed(v, State::Cancelled);
                    }
                }
            }
            _ => {}
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for (i, job) in self.jobs.iter().enumerate() {
            let spec = &self.specs[i];
            let edges = self.graph.parents(job.id);
            prop_assert_eq!(edges.len(), spec.parents.len());
            for &(pid, edge) in &edges {
                let p = self.index(pid);
                let seen = self.seen[&(p, i)];
                let met = seen.parent_succeeded
                    || seen.released
                    || (spec.policy == AfterPolicy::Finished && seen.parent_final);
                let parent_down = matches!(self.jobs[p].state, State::Dead | State::Cancelled);
                let want = if met {
                    Edge::Met
                } else if parent_down {
                    Edge::Broken
                } else {
                    Edge::Open
                };
                prop_assert_eq!(edge, want, "edge {} -> {}", p, i);
            }
            if job.state.is_final() {
                continue;
            }
            let counts = self.graph.counts(job.id);
            prop_assert_eq!(counts, Counts::of(edges.iter().map(|(_, e)| *e)));
            let should_wait = child_state(counts);
            match job.state {
                State::Waiting | State::Blocked => {
                    prop_assert_eq!(Some(job.state), should_wait, "job {}", i)
                }
                _ => prop_assert_eq!(None, should_wait, "job {} is {}", i, job.state),
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn counters_and_states_follow_the_edges(specs in specs(), ops in proptest::collection::vec(op(), 0..80)) {
        let mut m = Model::new(specs);
        m.check()?;
        for op in ops {
            m.step(op);
            m.check()?;
        }
    }
}

#[test]
fn a_child_of_final_parents_is_ready_at_once_or_waits_for_its_delay() {
    let mut g = Graph::default();
    let (a, b, c) = (JobId::new(), JobId::new(), JobId::new());
    let counts = g.add_child(
        c,
        AfterPolicy::Succeeded,
        &[(a, State::Succeeded), (b, State::Dead)],
    );
    assert_eq!(
        counts,
        Counts {
            unmet: 0,
            broken: 1
        }
    );
    assert_eq!(child_state(counts), Some(State::Blocked));
    let (counts, released) = g.release(c).expect("a broken edge");
    assert_eq!(released, vec![b]);
    assert_eq!(child_state(counts), None);
    let mut job = Job::new(
        crate::job::NewJob {
            queue: Arc::from("q"),
            tenant: Arc::from("t"),
            idempotency_key: None,
            delay: std::time::Duration::from_secs(10),
            max_attempts: 1,
            priority_ms: 0,
        },
        0,
    );
    job.state = State::Blocked;
    assert_eq!(
        settle_child(&job, counts, 5).map(|j| j.state),
        Some(State::Delayed)
    );
    let ready = settle_child(&job, counts, 20_000).expect("released");
    assert_eq!((ready.state, ready.ready_at), (State::Ready, 20_000));
}

#[test]
fn check_after_refuses_too_many_and_twice_named_parents() {
    let a = JobId::new();
    assert_eq!(check_after(&[a, a]), Err(AfterError::Duplicate(a)));
    let many: Vec<JobId> = (0..=MAX_PARENTS).map(|_| JobId::new()).collect();
    assert_eq!(
        check_after(&many),
        Err(AfterError::TooMany(MAX_PARENTS + 1))
    );
    assert_eq!(check_after(&many[..MAX_PARENTS]), Ok(()));
}
