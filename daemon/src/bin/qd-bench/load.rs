//! The load generator, written once for every server: P producer tasks and C
//! consumer tasks, each with its own keep-alive connection, driving a [`Target`].
//!
//! A phase is `Enqueue` (producers only), `Drain` (consumers take what is queued
//! until the server says it is empty) or `Mixed` (both at once; the end-to-end
//! rate is jobs divided by the time to the last ack). Producers claim jobs from a
//! shared counter, so exactly `jobs` are sent; with a rate they are paced (open
//! loop: each producer keeps its own schedule and catches up when late).
//! Every loop is bounded by the phase deadline and by a run of consecutive errors.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::latency::{self, Percentiles};

/// A job a consumer holds: enough to acknowledge it, and its enqueue stamp.
#[derive(Clone, Debug)]
pub struct Taken {
    /// The server's job id (qd: a UUID; beanstalkd: a number).
    pub id: String,
    /// qd's fencing token (0 for beanstalkd).
    pub token: u64,
    /// When it was enqueued (µs since the epoch), from the payload.
    pub stamp_us: Option<u64>,
}

/// One connection to a server, used by one producer or consumer task.
pub trait Conn: Send + 'static {
    /// Enqueues every payload (one request, or one per payload, as the target
    /// does it); returns how many the server accepted.
    fn put(&mut self, payloads: Vec<Vec<u8>>) -> impl Future<Output = Result<u64>> + Send;
    /// Takes (leases / reserves) up to `max` jobs, waiting up to `wait` for one.
    fn take(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Taken>>> + Send;
    /// Acknowledges (acks / deletes) `jobs`; returns how many the server confirmed.
    fn finish(&mut self, jobs: &[Taken]) -> impl Future<Output = Result<u64>> + Send;
}

/// A server under load: opens connections.
pub trait Target: Send + Sync + 'static {
    /// Its connection type.
    type Conn: Conn;
    /// Opens one keep-alive connection.
    fn connect(&self) -> impl Future<Output = Result<Self::Conn>> + Send;
}

/// Several servers as one target: each new connection goes to the next server in
/// turn, so the producers and consumers of a phase spread evenly over them (the
/// nodes of a cluster).
pub struct Spread<T> {
    targets: Vec<T>,
    next: AtomicUsize,
}

impl<T> Spread<T> {
    /// The servers, in turn from the first; at least one.
    pub fn new(targets: Vec<T>) -> Spread<T> {
        assert!(!targets.is_empty(), "a spread over no server");
        Spread {
            targets,
            next: AtomicUsize::new(0),
        }
    }
}

impl<T: Target> Target for Spread<T> {
    type Conn = T::Conn;

    async fn connect(&self) -> Result<T::Conn> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.targets.len();
        self.targets[i].connect().await
    }
}

/// What a phase does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Producers only.
    Enqueue,
    /// Consumers only, until the queue is empty.
    Drain,
    /// Producers and consumers together.
    Mixed,
}

/// The shape of a load: how many jobs, by whom, in what units.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Jobs to enqueue (and to consume).
    pub jobs: u64,
    /// Producer connections.
    pub producers: usize,
    /// Consumer connections.
    pub consumers: usize,
    /// Jobs per put request and per take (1 = request/reply).
    pub batch: usize,
    /// Total enqueues per second across producers; 0 = as fast as they go.
    pub rate: f64,
    /// Payload size in bytes.
    pub payload: usize,
    /// The phase ends by this time whatever happened.
    pub max_time: Duration,
}

/// What a phase measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Jobs the server accepted.
    pub enqueued: u64,
    /// Jobs acknowledged.
    pub done: u64,
    /// Seconds from the start to the last accepted put.
    pub enqueue_secs: f64,
    /// Seconds from the start to the last ack.
    pub done_secs: f64,
    /// Put sent → its acceptance received (`202`, or beanstalkd's `INSERTED`), µs:
    /// the durable write's round trip alone.
    pub to_accept: Percentiles,
    /// Lease sent → its jobs received, µs, counting only leases whose jobs' puts
    /// had all been answered when the lease was sent (so no wait for a put, nor a
    /// long poll, is included).
    pub lease_rtt: Percentiles,
    /// Ack sent → its confirmation received, µs (per request; with one job per
    /// lease a consumer's cycle is this plus the lease's round trip).
    pub ack_rtt: Percentiles,
    /// Enqueue → lease reply, µs.
    pub to_lease: Percentiles,
    /// Enqueue → ack reply, µs.
    pub to_ack: Percentiles,
    /// Errors seen (failed requests, refused acks).
    pub errors: u64,
    /// The first error, for the report.
    pub first_error: Option<String>,
    /// True when the phase hit `max_time`.
    pub timed_out: bool,
}

impl Outcome {
    /// Accepted puts per second.
    pub fn enqueue_rate(&self) -> f64 {
        per_sec(self.enqueued, self.enqueue_secs)
    }

    /// Acknowledged jobs per second.
    pub fn done_rate(&self) -> f64 {
        per_sec(self.done, self.done_secs)
    }
}

fn per_sec(n: u64, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// Consecutive failed requests after which a task gives up.
const MAX_CONSECUTIVE_ERRORS: u32 = 10;
/// How long a consumer's take waits for a job in a mixed phase.
const TAKE_WAIT: Duration = Duration::from_secs(1);

/// Jobs accepted and acknowledged so far in a phase, readable while it runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Jobs the server accepted.
    pub enqueued: AtomicU64,
    /// Jobs acknowledged.
    pub done: AtomicU64,
}

/// Counters shared by the tasks of one phase.
struct Shared {
    start: Instant,
    deadline: Instant,
    jobs: u64,
    claimed: AtomicU64,
    progress: Arc<Progress>,
    producers_done: AtomicBool,
    drained: AtomicBool,
    last_put_us: AtomicU64,
    last_ack_us: AtomicU64,
    /// Per producer: when its put in flight was sent (µs since the epoch, before
    /// its payloads were stamped), `u64::MAX` while none is.
    puts_in_flight: Vec<AtomicU64>,
}

impl Shared {
    /// A stamp before which every put has been answered: a job stamped earlier was
    /// accepted (or refused), none is still on its way in.
    fn answered_before(&self) -> u64 {
        let sent = self
            .puts_in_flight
            .iter()
            .map(|p| p.load(Ordering::Acquire));
        sent.min().unwrap_or(u64::MAX)
    }

    fn elapsed_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn past_deadline(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Claims up to `n` puts; 0 once `jobs` have been handed out.
    fn claim(&self, n: u64) -> u64 {
        let before = self.claimed.fetch_add(n, Ordering::Relaxed);
        self.jobs.saturating_sub(before).min(n)
    }

    /// Consumers stop once everything enqueued is done, or the queue ran dry after
    /// the producers stopped.
    fn consumers_finished(&self) -> bool {
        let target = if self.producers_done.load(Ordering::Acquire) {
            self.progress.enqueued.load(Ordering::Relaxed)
        } else {
            self.jobs
        };
        self.drained.load(Ordering::Relaxed) || self.progress.done.load(Ordering::Relaxed) >= target
    }
}

/// What one task saw.
#[derive(Default)]
struct TaskLog {
    to_accept: Vec<u64>,
    lease_rtt: Vec<u64>,
    ack_rtt: Vec<u64>,
    to_lease: Vec<u64>,
    to_ack: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    consecutive: u32,
}

impl TaskLog {
    /// Records a failure; true when the task should give up.
    fn failed(&mut self, e: anyhow::Error) -> bool {
        self.errors += 1;
        self.first_error.get_or_insert_with(|| format!("{e:#}"));
        self.consecutive += 1;
        self.consecutive >= MAX_CONSECUTIVE_ERRORS
    }
}

/// Runs one phase of `plan` against `target`; `progress` counts as it goes.
pub async fn run<T: Target>(
    target: Arc<T>,
    plan: Plan,
    phase: Phase,
    progress: Arc<Progress>,
) -> Result<Outcome> {
    let producers = if phase == Phase::Drain {
        0
    } else {
        plan.producers
    };
    let consumers = if phase == Phase::Enqueue {
        0
    } else {
        plan.consumers
    };
    let mut pconns = Vec::with_capacity(producers);
    for _ in 0..producers {
        pconns.push(target.connect().await?);
    }
    let mut cconns = Vec::with_capacity(consumers);
    for _ in 0..consumers {
        cconns.push(target.connect().await?);
    }
    let start = Instant::now();
    let shared = Arc::new(Shared {
        start,
        deadline: start + plan.max_time,
        jobs: plan.jobs,
        claimed: AtomicU64::new(0),
        progress,
        producers_done: AtomicBool::new(false),
        drained: AtomicBool::new(false),
        last_put_us: AtomicU64::new(0),
        last_ack_us: AtomicU64::new(0),
        puts_in_flight: (0..producers).map(|_| AtomicU64::new(u64::MAX)).collect(),
    });
    if phase == Phase::Drain {
        // Nothing is enqueued in this phase: consume what the queue holds.
        shared.progress.enqueued.store(plan.jobs, Ordering::Relaxed);
        shared.producers_done.store(true, Ordering::Release);
    }
    let interval = (plan.rate > 0.0).then(|| Duration::from_secs_f64(producers as f64 / plan.rate));
    let take_wait = if phase == Phase::Drain {
        Duration::ZERO
    } else {
        TAKE_WAIT
    };
    let ptasks: Vec<_> = pconns
        .into_iter()
        .enumerate()
        .map(|(p, c)| tokio::spawn(produce(c, p, shared.clone(), plan.clone(), interval)))
        .collect();
    let ctasks: Vec<_> = cconns
        .into_iter()
        .map(|c| tokio::spawn(consume(c, shared.clone(), plan.batch, take_wait)))
        .collect();
    let mut logs = Vec::new();
    for t in ptasks {
        logs.push(t.await?);
    }
    shared.producers_done.store(true, Ordering::Release);
    for t in ctasks {
        logs.push(t.await?);
    }
    Ok(summarize(&shared, logs))
}

fn summarize(shared: &Shared, logs: Vec<TaskLog>) -> Outcome {
    let mut out = Outcome {
        enqueued: shared.progress.enqueued.load(Ordering::Relaxed),
        done: shared.progress.done.load(Ordering::Relaxed),
        enqueue_secs: shared.last_put_us.load(Ordering::Relaxed) as f64 / 1e6,
        done_secs: shared.last_ack_us.load(Ordering::Relaxed) as f64 / 1e6,
        timed_out: shared.past_deadline(),
        ..Outcome::default()
    };
    let (mut to_accept, mut lease_rtt, mut ack_rtt) = (Vec::new(), Vec::new(), Vec::new());
    let (mut to_lease, mut to_ack) = (Vec::new(), Vec::new());
    for log in logs {
        to_accept.extend(log.to_accept);
        lease_rtt.extend(log.lease_rtt);
        ack_rtt.extend(log.ack_rtt);
        to_lease.extend(log.to_lease);
        to_ack.extend(log.to_ack);
        out.errors += log.errors;
        if out.first_error.is_none() {
            out.first_error = log.first_error;
        }
    }
    out.to_accept = Percentiles::of(to_accept);
    out.lease_rtt = Percentiles::of(lease_rtt);
    out.ack_rtt = Percentiles::of(ack_rtt);
    out.to_lease = Percentiles::of(to_lease);
    out.to_ack = Percentiles::of(to_ack);
    out
}

/// Producer number `me`: puts until the plan's jobs are claimed or time is up.
async fn produce<C: Conn>(
    mut conn: C,
    me: usize,
    shared: Arc<Shared>,
    plan: Plan,
    interval: Option<Duration>,
) -> TaskLog {
    let mut log = TaskLog::default();
    let mut due = Instant::now();
    while !shared.past_deadline() {
        let n = shared.claim(plan.batch as u64);
        if n == 0 {
            break;
        }
        if let Some(every) = interval {
            tokio::time::sleep_until(due.min(shared.deadline).into()).await;
            due += every * n as u32;
        }
        let sent_at = latency::now_us();
        shared.puts_in_flight[me].store(sent_at, Ordering::Release);
        let payloads = (0..n)
            .map(|_| latency::stamped_payload(plan.payload, latency::now_us()))
            .collect();
        let sent = tokio::time::timeout_at(shared.deadline.into(), conn.put(payloads)).await;
        shared.puts_in_flight[me].store(u64::MAX, Ordering::Release);
        match sent {
            Err(_) => break,
            Ok(Ok(accepted)) => {
                log.to_accept
                    .push(latency::now_us().saturating_sub(sent_at));
                log.consecutive = 0;
                shared
                    .progress
                    .enqueued
                    .fetch_add(accepted, Ordering::Relaxed);
                shared
                    .last_put_us
                    .fetch_max(shared.elapsed_us(), Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                if log.failed(e) {
                    break;
                }
            }
        }
    }
    log
}

async fn consume<C: Conn>(
    mut conn: C,
    shared: Arc<Shared>,
    batch: usize,
    wait: Duration,
) -> TaskLog {
    let mut log = TaskLog::default();
    while !shared.consumers_finished() && !shared.past_deadline() {
        let sent_at = latency::now_us();
        let answered_before = shared.answered_before();
        let taken = tokio::time::timeout_at(shared.deadline.into(), conn.take(batch, wait)).await;
        let jobs = match taken {
            Err(_) => break,
            Ok(Ok(jobs)) => jobs,
            Ok(Err(e)) => {
                if log.failed(e) {
                    break;
                }
                continue;
            }
        };
        if jobs.is_empty() {
            if shared.producers_done.load(Ordering::Acquire) {
                shared.drained.store(true, Ordering::Relaxed);
            }
            continue;
        }
        let leased_at = latency::now_us();
        if jobs
            .iter()
            .all(|j| j.stamp_us.is_some_and(|s| s < answered_before))
        {
            log.lease_rtt.push(leased_at.saturating_sub(sent_at));
        }
        log.to_lease.extend(
            jobs.iter()
                .filter_map(|j| j.stamp_us)
                .map(|s| leased_at.saturating_sub(s)),
        );
        let finished = tokio::time::timeout_at(shared.deadline.into(), conn.finish(&jobs)).await;
        match finished {
            Err(_) => break,
            Ok(Ok(confirmed)) => {
                log.consecutive = 0;
                let acked_at = latency::now_us();
                log.ack_rtt.push(acked_at.saturating_sub(leased_at));
                log.to_ack.extend(
                    jobs.iter()
                        .filter_map(|j| j.stamp_us)
                        .map(|s| acked_at.saturating_sub(s)),
                );
                shared.progress.done.fetch_add(confirmed, Ordering::Relaxed);
                shared
                    .last_ack_us
                    .fetch_max(shared.elapsed_us(), Ordering::Relaxed);
                if confirmed < jobs.len() as u64 {
                    log.failed(anyhow::anyhow!(
                        "{} of {} acks refused",
                        jobs.len() as u64 - confirmed,
                        jobs.len()
                    ));
                }
            }
            Ok(Err(e)) => {
                if log.failed(e) {
                    break;
                }
            }
        }
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(in_flight: &[u64]) -> Shared {
        let start = Instant::now();
        Shared {
            start,
            deadline: start,
            jobs: 0,
            claimed: AtomicU64::new(0),
            progress: Arc::default(),
            producers_done: AtomicBool::new(false),
            drained: AtomicBool::new(false),
            last_put_us: AtomicU64::new(0),
            last_ack_us: AtomicU64::new(0),
            puts_in_flight: in_flight.iter().map(|&p| AtomicU64::new(p)).collect(),
        }
    }

    #[test]
    fn a_lease_counts_as_a_round_trip_only_for_jobs_older_than_every_put_in_flight() {
        // Producer 0 is idle; producers 1 and 2 sent puts at 500 and 300 µs: a job
        // stamped at 299 was answered, one stamped at 300 may still be on its way.
        assert_eq!(shared(&[u64::MAX, 500, 300]).answered_before(), 300);
        assert_eq!(shared(&[u64::MAX, u64::MAX]).answered_before(), u64::MAX);
        assert_eq!(
            shared(&[]).answered_before(),
            u64::MAX,
            "a drain has no puts"
        );
    }

    /// A server that only says which one it is.
    struct Named(usize);

    impl Conn for usize {
        async fn put(&mut self, _: Vec<Vec<u8>>) -> Result<u64> {
            Ok(0)
        }
        async fn take(&mut self, _: usize, _: Duration) -> Result<Vec<Taken>> {
            Ok(Vec::new())
        }
        async fn finish(&mut self, _: &[Taken]) -> Result<u64> {
            Ok(0)
        }
    }

    impl Target for Named {
        type Conn = usize;
        async fn connect(&self) -> Result<usize> {
            Ok(self.0)
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_spread_hands_out_connections_to_each_server_in_turn() {
        let spread = Spread::new(vec![Named(0), Named(1)]);
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(spread.connect().await.expect("connect"));
        }
        assert_eq!(got, [0, 1, 0, 1, 0]);
    }
}
