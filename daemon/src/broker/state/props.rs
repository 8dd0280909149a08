//! Property tests of the Broker's state, driven message by message through
//! [`BrokerState::take`] with no actor running it: random enqueues, lease requests
//! (answered from the queue's dispatch), acks (current and stale tokens), nacks, lease
//! expiries, lost workers, cancels, redrives and purges, against the in-memory store.
//! Some steps start an outage (a full disk) lasting one to four steps: every write
//! of those steps is refused, the probe the Broker's timer sends after some steps
//! too until the outage ends, and nothing is handed out meanwhile (a lessee asking
//! then is answered empty at the end of its poll). Some lessees go away before
//! their answer (the lease must be handed back). The state's effects are performed (or refused) by the harness;
//! the store's completions come back through a forwarding actor and are fed to the
//! state in order, so every step is settled before the invariants are checked:
//!
//! - no job is ever handed to two lessees at once, and only the current token acks
//!   (a refused ack or nack is answered with an error and its lease stands);
//! - every leased job is held by the lessee it was answered to, but for a lease whose
//!   lessee left while the store refused writes: that one is ended, uncharged, once
//!   the store accepts them; every lease request is answered, and waits only while
//!   the store refuses;
//! - the derived indexes (counts, tenant depths, deadlines, leases per worker, DLQ)
//!   match the jobs, and nothing is left waiting for a write;
//! - the queue's dispatch holds every ready or delayed job once, and counts as
//!   running for each tenant exactly its leased jobs;
//! - the store holds exactly the unfinished jobs memory holds, in the same states,
//!   tokens and attempt counts (a refused write charges nothing), and every accepted
//!   job is in the store until it is purged.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use proptest::prelude::*;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::broker::LeaseRequest;
use crate::store::Store;

/// Forwards every message the store's completions send to the Broker to the test.
struct Forward;

impl Actor for Forward {
    type Msg = BrokerMsg;
    type State = mpsc::UnboundedSender<BrokerMsg>;
    type Arguments = mpsc::UnboundedSender<BrokerMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<BrokerMsg>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle(
        &self,
        _myself: ActorRef<BrokerMsg>,
        msg: BrokerMsg,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = tx.send(msg);
        Ok(())
    }
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue {
        tenant: u8,
        key: Option<u8>,
    },
    /// `gone`: the lessee stops waiting before it is answered.
    Lease {
        n: u32,
        worker: u8,
        gone: bool,
    },
    Ack {
        pick: usize,
        stale: bool,
    },
    Nack {
        pick: usize,
        permanent: bool,
    },
    Expire,
    WorkerLost {
        worker: u8,
    },
    Cancel {
        pick: usize,
    },
    Redrive {
        pick: usize,
    },
    Purge {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, proptest::option::of(0u8..4))
            .prop_map(|(tenant, key)| Op::Enqueue { tenant, key }),
        3 => (1u32..4, 0u8..3, proptest::bool::weighted(0.1))
            .prop_map(|(n, worker, gone)| Op::Lease { n, worker, gone }),
        3 => (any::<usize>(), proptest::bool::weighted(0.2))
            .prop_map(|(pick, stale)| Op::Ack { pick, stale }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, permanent)| Op::Nack { pick, permanent }),
        1 => Just(Op::Expire),
        1 => (0u8..3).prop_map(|worker| Op::WorkerLost { worker }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Redrive { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Purge { pick }),
    ]
}

/// How many steps (this one included) an outage starting at a step lasts; 0: none.
fn outage() -> impl Strategy<Value = u8> {
    prop_oneof![85 => Just(0u8), 15 => 1u8..5]
}

const QUEUE: &str = "q";

struct Harness {
    state: BrokerState,
    rx: mpsc::UnboundedReceiver<BrokerMsg>,
    me: ActorRef<BrokerMsg>,
    store: Store,
    now: UnixMillis,
    mono: Instant,
    /// Leases handed out and not known to have ended: job -> token.
    held: HashMap<JobId, Token>,
    /// Tokens of leases that ended, per job (stale from then on).
    ended: HashMap<JobId, Token>,
    accepted: HashSet<JobId>,
    purged: HashSet<JobId>,
    /// Steps, this one included, whose writes the store refuses (probes too).
    outage: u8,
    /// Lease requests not answered yet (their claim's write is in flight).
    waiting: Vec<oneshot::Receiver<Vec<LeasedJob>>>,
    /// Completions' messages, to the forwarder.
    back: Back,
}

impl Harness {
    async fn new() -> Harness {
        let text = format!(
            "[queues.{QUEUE}]\nexecutor = {{ kind = \"external\" }}\nmax_attempts = 2\n\
             backoff = {{ base = \"1s\", max = \"2s\" }}\n"
        );
        let config = Arc::new(Config::parse(&text, Path::new("/tmp/qd.toml")).expect("config"));
        let (tx, rx) = mpsc::unbounded_channel();
        let (me, _) = Actor::spawn(None, Forward, tx).await.expect("forwarder");
        let forwarder = me.clone();
        let store = Store::open_memory();
        let limits = Arc::new(Limits::new(config, Vec::new()));
        let args = BrokerArgs {
            limiters: Arc::new(crate::rate_limit::Limiters::build(&limits, None)),
            limits,
            store: store.clone(),
            restarted: false,
        };
        let mut state = BrokerState::new(args, rand::SeedableRng::seed_from_u64(11));
        state.sync_dispatches(1_700_000_000_000, Instant::now());
        Harness {
            state,
            rx,
            me,
            store,
            now: 1_700_000_000_000,
            mono: Instant::now(),
            held: HashMap::new(),
            ended: HashMap::new(),
            accepted: HashSet::new(),
            purged: HashSet::new(),
            outage: 0,
            waiting: Vec::new(),
            back: Arc::new(move |msg| {
                let _ = forwarder.cast(msg);
            }),
        }
    }

    /// Handles `msg` and performs its effects: store writes go to the memory store,
    /// whose completions come back through the forwarder.
    fn take(&mut self, msg: BrokerMsg) {
        let effects = self.state.take(msg, self.now, self.mono);
        self.perform(effects);
    }

    /// Performs `effects`, refused while an outage lasts.
    fn perform(&mut self, effects: Effects) {
        if self.outage > 0 {
            let full = StoreError::Full("test: the disk is full".into());
            effects.perform_refused(&self.store, &self.back, &full);
        } else {
            effects.perform(&self.store, &self.back);
        }
    }

    /// Feeds the store's answers back until nothing is in flight: a no-op write
    /// answers after everything submitted before it, and a marker cast after that
    /// arrives after every message those answers sent.
    async fn settle(&mut self) {
        loop {
            self.store.run(|_| Ok(())).await.expect("store barrier");
            self.me.cast(BrokerMsg::Probe).expect("marker");
            let mut fed = 0;
            loop {
                let msg = self.rx.recv().await.expect("forwarder open");
                if matches!(msg, BrokerMsg::Probe) {
                    break;
                }
                fed += 1;
                self.take(msg);
            }
            if fed == 0 {
                return;
            }
        }
    }

    /// Jobs in memory in `states`, by id (deterministic picks).
    fn pick(&self, states: &[State], pick: usize) -> Option<JobId> {
        let mut ids: Vec<JobId> = self
            .state
            .jobs
            .values()
            .filter(|j| states.contains(&j.state))
            .map(|j| j.id)
            .collect();
        ids.sort();
        (!ids.is_empty()).then(|| ids[pick % ids.len()])
    }

    fn held_pick(&self, pick: usize) -> Option<(JobId, Token)> {
        let mut held: Vec<(JobId, Token)> = self.held.iter().map(|(i, t)| (*i, *t)).collect();
        held.sort();
        (!held.is_empty()).then(|| held[pick % held.len()])
    }

    /// Runs `op` (starting an outage of `outage` steps unless one is under way), then,
    /// with `probe`, the probe the Broker's interval timer sends (refused while the
    /// outage lasts), then takes the answers of lease requests.
    async fn run(&mut self, op: Op, outage: u8, probe: bool) -> Result<(), TestCaseError> {
        self.now += 10;
        if self.outage == 0 {
            self.outage = outage;
        }
        let refused = self.outage > 0;
        match op {
            Op::Enqueue { tenant, key } => {
                let (tx, rx) = oneshot::channel();
                let req = EnqueueRequest {
                    queue: QUEUE.into(),
                    tenant: Some(format!("t{tenant}")),
                    payload: vec![tenant],
                    idempotency_key: key.map(|k| format!("k{k}")),
                    delay: Duration::ZERO,
                    max_attempts: None,
                    priority_ms: 0,
                    after: Default::default(),
                };
                self.take(BrokerMsg::Enqueue(req, tx.into()));
                self.settle().await;
                if let Ok(Ok(done)) = rx.await
                    && !done.duplicate
                {
                    self.accepted.insert(done.id);
                }
            }
            Op::Lease { n, worker, gone } => {
                let (tx, rx) = oneshot::channel();
                let request = LeaseRequest {
                    worker: format!("w{worker}"),
                    max_jobs: n,
                    wait: Duration::ZERO,
                };
                let msg = BrokerMsg::Lease(QUEUE.into(), request, tx.into());
                let effects = self.state.take(msg, self.now, self.mono);
                // Gone after the jobs were picked, before the answer.
                if gone {
                    drop(rx);
                } else {
                    self.waiting.push(rx);
                }
                self.perform(effects);
                self.settle().await;
            }
            Op::Ack { pick, stale } => {
                let target = if stale {
                    let mut ended: Vec<(JobId, Token)> =
                        self.ended.iter().map(|(i, t)| (*i, *t)).collect();
                    ended.sort();
                    (!ended.is_empty()).then(|| ended[pick % ended.len()])
                } else {
                    self.held_pick(pick)
                };
                let Some((id, token)) = target else {
                    return Ok(());
                };
                let (tx, rx) = oneshot::channel();
                self.take(BrokerMsg::Ack(id, token, tx.into()));
                self.settle().await;
                let acked = matches!(rx.await, Ok(Ok(())));
                let current = self.held.get(&id) == Some(&token);
                prop_assert_eq!(
                    acked,
                    current && !refused,
                    "ack of {} with token {} (store refusing: {})",
                    id,
                    token,
                    refused
                );
            }
            Op::Nack { pick, permanent } => {
                let Some((id, token)) = self.held_pick(pick) else {
                    return Ok(());
                };
                let failure = if permanent {
                    Failure::Permanent { error: "no".into() }
                } else {
                    Failure::Transient {
                        error: "later".into(),
                        retry_after: None,
                    }
                };
                let (tx, rx) = oneshot::channel();
                self.take(BrokerMsg::Nack(id, token, failure, tx.into()));
                self.settle().await;
                let nacked = matches!(rx.await, Ok(Ok(())));
                prop_assert_eq!(nacked, !refused, "nack of a held lease");
            }
            Op::Expire => {
                self.mono += Duration::from_secs(3_600);
                self.now += 3_600_000;
                self.take(BrokerMsg::Tick);
                self.settle().await;
            }
            Op::WorkerLost { worker } => {
                self.take(BrokerMsg::WorkerLost(format!("w{worker}"), "gone".into()));
                self.settle().await;
            }
            Op::Cancel { pick } => {
                let states = [State::Ready, State::Delayed, State::Leased, State::Dead];
                let Some(id) = self.pick(&states, pick) else {
                    return Ok(());
                };
                let (tx, _rx) = oneshot::channel();
                self.take(BrokerMsg::Cancel(id, "test".into(), tx.into()));
                self.settle().await;
            }
            Op::Redrive { pick } => {
                let Some(id) = self.pick(&[State::Dead], pick) else {
                    return Ok(());
                };
                let (tx, _rx) = oneshot::channel();
                self.take(BrokerMsg::Redrive(vec![id], "test".into(), tx.into()));
                self.settle().await;
            }
            Op::Purge { pick } => {
                let Some(id) = self.pick(&[State::Dead], pick) else {
                    return Ok(());
                };
                let (tx, rx) = oneshot::channel();
                self.take(BrokerMsg::Purge(vec![id], tx.into()));
                self.settle().await;
                if let Ok(Ok(outcome)) = rx.await {
                    self.purged.extend(outcome.moved);
                }
            }
        }
        self.outage = self.outage.saturating_sub(1);
        if probe {
            self.take(BrokerMsg::Probe);
            self.settle().await;
        }
        self.take_leases()?;
        self.forget_ended();
        self.check().await
    }

    /// Records the leases answered so far; a request whose claim is still being
    /// written keeps waiting.
    fn take_leases(&mut self) -> Result<(), TestCaseError> {
        let mut still = Vec::new();
        for mut rx in std::mem::take(&mut self.waiting) {
            match rx.try_recv() {
                Ok(leased) => {
                    for job in leased {
                        prop_assert!(
                            !self.held.contains_key(&job.id),
                            "job {} leased twice",
                            job.id
                        );
                        let now = self.state.jobs.get(job.id).map(|j| (j.state, j.lease_seq));
                        prop_assert_eq!(
                            now,
                            Some((State::Leased, job.token)),
                            "job {} was answered to a lessee and is not leased under that token",
                            job.id
                        );
                        self.held.insert(job.id, job.token);
                    }
                }
                Err(oneshot::error::TryRecvError::Empty) => {
                    prop_assert!(!self.state.store_writable, "a lease request left waiting");
                    still.push(rx);
                }
                Err(oneshot::error::TryRecvError::Closed) => {
                    prop_assert!(false, "a lease request was dropped unanswered");
                }
            }
        }
        self.waiting = still;
        Ok(())
    }

    /// Leases whose job no longer holds them ended (ack, nack, expiry, cancel).
    fn forget_ended(&mut self) {
        let jobs = &self.state.jobs;
        let ended: Vec<(JobId, Token)> = self
            .held
            .iter()
            .filter(|(id, token)| {
                jobs.get(**id)
                    .is_none_or(|j| j.state != State::Leased || j.lease_seq != **token)
            })
            .map(|(id, token)| (*id, *token))
            .collect();
        for (id, token) in ended {
            self.held.remove(&id);
            self.ended.insert(id, token);
        }
    }

    async fn check(&mut self) -> Result<(), TestCaseError> {
        let s = &self.state;
        prop_assert!(s.writing.is_empty(), "a write is still in flight");
        prop_assert!(
            !s.store_writable || s.uncharged_ends.is_empty(),
            "an uncharged lease end left unwritten while the store accepts writes"
        );
        for (id, token, _) in &s.uncharged_ends {
            let held = s.jobs.get(*id).map(|j| (j.state, j.lease_seq));
            prop_assert_eq!(
                held,
                Some((State::Leased, *token)),
                "an uncharged end of a lease gone"
            );
        }
        let mut counts = QueueCounts::default();
        let mut tenants: HashMap<Arc<str>, u64> = HashMap::new();
        let mut leased = HashSet::new();
        for job in s.jobs.values() {
            match job.state {
                State::Ready | State::Delayed => counts.waiting += 1,
                State::Leased => {
                    counts.leased += 1;
                    leased.insert(job.id);
                    prop_assert!(
                        s.deadlines.get(job.id).is_some(),
                        "leased without a deadline"
                    );
                    let worker = job.worker.as_deref().unwrap_or_default();
                    prop_assert!(s.by_worker.get(worker).is_some_and(|h| h.contains(&job.id)));
                    let ending_later = s.uncharged_ends.iter().any(|(id, ..)| *id == job.id);
                    if !ending_later {
                        prop_assert_eq!(self.held.get(&job.id), Some(&job.lease_seq));
                    }
                }
                State::Dead => counts.dead += 1,
                State::Waiting => counts.held_waiting += 1,
                State::Blocked => counts.held_blocked += 1,
                State::Succeeded | State::Cancelled => prop_assert!(false, "a finished job kept"),
            }
            if matches!(job.state, State::Ready | State::Delayed | State::Leased) {
                *tenants.entry(job.tenant.clone()).or_default() += 1;
            }
        }
        prop_assert_eq!(s.counts.get(QUEUE).copied().unwrap_or_default(), counts);
        let d = s.dispatches.get(QUEUE).expect("the queue's dispatch");
        let stats = d.stats();
        prop_assert_eq!(
            stats.ready + stats.delayed,
            counts.waiting,
            "every waiting job is in the dispatch, once"
        );
        for tenant in ["t0", "t1", "t2"] {
            let leased_here = s
                .jobs
                .values()
                .filter(|j| j.state == State::Leased && &*j.tenant == tenant)
                .count();
            prop_assert_eq!(
                d.running(tenant) as usize,
                leased_here,
                "tenant {}'s running count is its leased jobs",
                tenant
            );
        }
        let by_worker: usize = s.by_worker.values().map(HashSet::len).sum();
        prop_assert_eq!(by_worker, leased.len(), "leases per worker match");
        let dead = s.dead.get(QUEUE).map_or(0, BTreeSet::len) as u64;
        prop_assert_eq!(dead, counts.dead);
        for ((_, tenant), depth) in &s.tenant_depth {
            prop_assert_eq!(*depth, tenants.get(tenant).copied().unwrap_or(0));
        }
        let memory: BTreeMap<JobId, (State, Token)> = s
            .jobs
            .values()
            .map(|j| (j.id, (j.state, j.lease_seq)))
            .collect();
        let stored_jobs = self.store.run(|b| b.load_unfinished()).await.expect("load");
        let stored: BTreeMap<JobId, (State, Token)> = stored_jobs
            .iter()
            .map(|j| (j.id, (j.state, j.lease_seq)))
            .collect();
        let memory_states: BTreeMap<JobId, State> =
            memory.iter().map(|(id, (st, _))| (*id, *st)).collect();
        let stored_states: BTreeMap<JobId, State> =
            stored.iter().map(|(id, (st, _))| (*id, *st)).collect();
        prop_assert_eq!(&memory_states, &stored_states, "store and memory agree");
        let memory_attempts: BTreeMap<JobId, u32> =
            s.jobs.values().map(|j| (j.id, j.attempts)).collect();
        let stored_attempts: BTreeMap<JobId, u32> =
            stored_jobs.iter().map(|j| (j.id, j.attempts)).collect();
        prop_assert_eq!(
            memory_attempts,
            stored_attempts,
            "attempts agree: a refused write charges nothing"
        );
        for (id, (state, token)) in &memory {
            if *state == State::Leased {
                prop_assert_eq!(stored[id].1, *token, "the recorded lease is the live one");
            }
        }
        for id in self.accepted.difference(&self.purged) {
            let id = *id;
            let found = self.store.run(move |b| b.job(id)).await.expect("read");
            prop_assert!(found.is_some(), "accepted job {} is not in the store", id);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn broker_state_never_double_leases_and_stays_in_step_with_the_store(
        ops in proptest::collection::vec((op(), outage(), proptest::bool::weighted(0.5)), 1..60)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut harness = Harness::new().await;
            for (op, outage, probe) in ops {
                harness.run(op, outage, probe).await?;
            }
            harness.me.stop(None);
            Ok::<(), TestCaseError>(())
        })?;
    }
}
