//! The Broker actor: the owner of job state; every change of an unfinished job
//! reaches the [`Store`] through it.
//!
//! It keeps every unfinished job (delayed, ready, leased, dead) in memory *without
//! its payload*, plans life-cycle events through [`job::apply`], writes them to the
//! store, and applies them to memory only once the write committed (a failed write
//! changes nothing and is never charged to a job). Durable writes are the enqueue and
//! the end of each attempt; a lease is a claim in the store's memory, not on disk.
//! Callers are answered only after their write is durable (group commit): a producer
//! hears "accepted" only once its job survives `kill -9`.
//!
//! It also owns each configured queue's dispatch ([`dispatch::Dispatch`]): the ready
//! jobs in weighted fair order per tenant, the delayed jobs, the lessees waiting in a
//! long poll, the rate limiter's tokens, pause and drain. A job's state and its place
//! in the dispatch change in the same step, so no other actor keeps a copy in step
//! by messages; after every message the waiting lessees are served from it. One
//! timer serves both: the soonest lease deadline, delayed job, poll end or limiter
//! token. An external worker's job (HTTP enqueue, lease, ack) costs five Broker
//! messages: `Enqueue`, `Inserted`, `Lease`, `Ack`, `Settle`.
//!
//! Messages: [`BrokerMsg`] — enqueue and batch enqueue (from the API and the admin
//! socket), lease (from Workers, the HTTP lease API and SQS receive, through
//! [`lease`]), heartbeat/ack/nack (from workers), its timer's tick, worker-lost (from
//! a WorkerPool), redrive, cancel and purge (from the Dlq and admin), counts and
//! dispatch stats (Gauges, admin, pools, SQS), limits-changed (admin, reload),
//! reopen (Cluster), stop-intake, release-leases and flush (from the Supervisor's
//! shutdown), and its own settle/probe messages. Supervised by the Supervisor; on
//! (re)start it reloads from the store (after a daemon start no job is leased: the
//! leases of an earlier run died with it) and builds each queue's dispatch from the
//! jobs it loaded.
//!
//! The broker never awaits the store inside `handle`: its state ([`BrokerState`])
//! returns each message's store operations, with their completions, as effects
//! (`broker/effects.rs`), which the actor submits to the writer thread; a completion
//! comes back as a message, so one slow fsync never stalls the mailbox.

mod deadlines;
pub(crate) mod dispatch;
mod effects;
mod events;
mod hot;
mod lease;
mod state;
mod table;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use crate::clock::wall_ms;
use crate::job::{Failure, Job, JobId, State, Token, TransitionError, UnixMillis};
use crate::limits::Limits;
use crate::store::{Inserted, Store, StoreError};

use effects::Effects;
pub use lease::{DispatchStats, LeaseRequest, MAX_WAIT, dispatch_stats, lease};
use state::BrokerState;
pub(crate) use state::MAX_EXTEND;
pub use state::{DlqStats, FireWrite, QueueCounts, Settle};

/// The registered actor name of the broker.
pub const NAME: &str = "broker";

/// A producer's request to add a job.
#[derive(Clone, Debug)]
pub struct EnqueueRequest {
    /// Target queue (must be configured).
    pub queue: String,
    /// Tenant; `None` means `"default"`.
    pub tenant: Option<String>,
    /// Opaque payload bytes (size already checked against `max_payload` by the caller).
    pub payload: Vec<u8>,
    /// Idempotency key, unique per queue within `retention`.
    pub idempotency_key: Option<String>,
    /// Do not run before this delay has passed.
    pub delay: Duration,
    /// Override of the queue's `max_attempts`.
    pub max_attempts: Option<u32>,
    /// Priority within the tenant, milliseconds ([`crate::job::Job::priority_ms`]).
    pub priority_ms: i64,
    /// Parents the job waits for (`deps.rs`), and when their edges count as met.
    pub after: crate::deps::After,
}

/// A schedule's tick to enqueue ([`BrokerMsg::Fire`]).
#[derive(Clone, Debug)]
pub struct Fire {
    /// The job; its idempotency key is `schedule:NAME:TICK`
    /// ([`crate::schedule::idempotency_key`]).
    pub req: EnqueueRequest,
    /// The schedule's name.
    pub schedule: String,
    /// The tick (a trigger's time for a manual run), recorded as its last run.
    pub tick: UnixMillis,
    /// The compare-and-set of the schedule's next tick, in the same commit as the
    /// job (`None` for a manual trigger, which leaves the next tick alone).
    pub advance: Option<crate::store::Advance>,
    /// `overlap = "skip"`: the previous run's job; while it is unfinished, only the
    /// schedule advances.
    pub unless_running: Option<JobId>,
}

/// What became of a [`Fire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fired {
    /// The tick's job is stored (or was already: `duplicate`).
    Enqueued(Enqueued),
    /// The previous run is unfinished (`overlap = "skip"`); the schedule advanced.
    SkippedOverlap,
    /// The stored next tick was not the one expected, or the schedule is paused:
    /// nothing was written; reread the schedule's state.
    Stale,
}

/// A successful enqueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id (the original job's, for a duplicate).
    pub id: JobId,
    /// True when the idempotency key matched an existing job and nothing was added.
    pub duplicate: bool,
}

/// Why a batch enqueue ([`BrokerMsg::EnqueueBatch`]) was refused. Nothing of the
/// batch was enqueued.
#[derive(Clone, Debug, thiserror::Error)]
pub struct BatchError {
    /// The item the refusal is about (0-based), or `None` when it is about the whole
    /// batch (its size, shutdown, a failed write).
    pub index: Option<usize>,
    /// The reason, as a single enqueue of that item would get it; for a depth limit
    /// the depth counts the items before `index` in the batch.
    pub error: BrokerError,
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(index) = self.index else {
            return write!(f, "{}", self.error);
        };
        let counting = match (&self.error, index) {
            (BrokerError::QueueFull { .. }, 1) => "the 1 job".to_owned(),
            (BrokerError::QueueFull { .. }, n) => format!("the {n} jobs"),
            (BrokerError::TenantFull { .. }, _) => "this tenant's jobs".to_owned(),
            _ => return write!(f, "jobs[{index}]: {}", self.error),
        };
        write!(
            f,
            "the batch does not fit: at jobs[{index}], {} (counting {counting} before it \
             in this batch); nothing of the batch was enqueued",
            self.error
        )
    }
}

impl BatchError {
    /// A refusal of the whole batch, not of one item.
    pub fn whole(error: BrokerError) -> Self {
        BatchError { index: None, error }
    }
}

/// A job handed to a worker under a lease.
#[derive(Clone, Debug)]
pub struct LeasedJob {
    /// The job's id.
    pub id: JobId,
    /// Its queue (interned).
    pub queue: Arc<str>,
    /// Its tenant (interned), `QD_TENANT` for a command.
    pub tenant: Arc<str>,
    /// The attempt number this lease runs (1-based).
    pub attempt: u32,
    /// The fencing token to present on heartbeat, ack and nack.
    pub token: Token,
    /// `QD_IDEMPOTENCY_KEY`: the producer's key, else the job id.
    pub idempotency_key: String,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// The lease (visibility timeout) length; renew with heartbeats before it passes.
    pub lease: Duration,
    /// The lease deadline as wall time (Unix ms), for external workers.
    pub deadline_ms: UnixMillis,
}

/// A live lease after a heartbeat.
#[derive(Clone, Copy, Debug)]
pub struct LeaseInfo {
    /// New deadline, wall time (Unix ms).
    pub deadline_ms: UnixMillis,
}

/// Why the broker refused a request. Nothing was changed when an error is returned.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BrokerError {
    /// No such queue in the config.
    #[error("unknown queue {0:?}")]
    UnknownQueue(String),
    /// No such job (or it already finished and was pruned).
    #[error("unknown job {0}")]
    UnknownJob(JobId),
    /// The queue holds `max_depth` unfinished jobs (backpressure).
    #[error("queue {queue:?} is full ({depth} jobs, max_depth {max}); retry later")]
    QueueFull {
        /// The queue that is full.
        queue: String,
        /// Current depth.
        depth: u64,
        /// Its limit.
        max: u64,
    },
    /// The tenant holds its `max_depth` of unfinished jobs in this queue.
    #[error(
        "tenant {tenant:?} is full in queue {queue:?} ({depth} jobs, max_depth {max}); retry later"
    )]
    TenantFull {
        /// The queue the tenant is full in.
        queue: String,
        /// The tenant that is full.
        tenant: String,
        /// Current depth.
        depth: u64,
        /// Its limit.
        max: u64,
    },
    /// The idempotency key is taken by a job with a different payload.
    #[error(
        "idempotency key {key:?} already used in queue {queue:?} by job {id} with a different payload"
    )]
    KeyConflict {
        /// The queue the key is unique in.
        queue: String,
        /// The idempotency key the producer gave.
        key: String,
        /// The job holding it.
        id: JobId,
    },
    /// An item of a batch gives the key an earlier item of the same batch gives
    /// with a different payload (nothing of the batch was stored).
    #[error(
        "idempotency key {key:?} is also given to jobs[{earlier}] of this batch, with a different payload"
    )]
    KeyConflictInBatch {
        /// The idempotency key both items give.
        key: String,
        /// The index of the earlier item giving it.
        earlier: usize,
    },
    /// The daemon is shutting down and takes no new work.
    #[error("qd is shutting down")]
    ShuttingDown,
    /// The broker is not running or did not answer in time (it may be restarting).
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The request itself is malformed (bad name, out-of-range value).
    #[error("{0}")]
    Invalid(String),
    /// A parent named in `after` is not a stored job.
    #[error("unknown_dependency: job {0} does not exist")]
    UnknownDependency(JobId),
    /// The payload is larger than `daemon.max_payload`.
    #[error("payload is {size} bytes; max_payload is {max} bytes")]
    PayloadTooLarge {
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The event does not apply to the job (stale token, wrong state).
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// The durable write failed; nothing was accepted.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// Result of a redrive or purge batch.
#[derive(Clone, Debug, Default)]
pub struct BatchOutcome {
    /// Jobs that moved (redriven or purged).
    pub moved: Vec<JobId>,
    /// Jobs that were refused, with the reason (e.g. "job X is ready; cannot redrive").
    pub refused: Vec<(JobId, String)>,
}

/// Messages the broker takes.
pub enum BrokerMsg {
    /// Add a job; answered after it is durable.
    Enqueue(EnqueueRequest, RpcReplyPort<Result<Enqueued, BrokerError>>),
    /// Internal: an enqueue's store write finished (with the payload back, for the
    /// hot-payload cache).
    Inserted(
        Box<Job>,
        Result<(Inserted, Vec<u8>), StoreError>,
        RpcReplyPort<Result<Enqueued, BrokerError>>,
    ),
    /// Add 1 to [`MAX_BATCH_JOBS`] jobs all or nothing, in one store commit; answered
    /// in request order after it is durable. Every item is admitted first (as
    /// [`BrokerMsg::Enqueue`] would, and counted against `max_depth` with the items
    /// before it); any refusal, or a key held by a job with a different payload,
    /// refuses the whole batch ([`BatchError`]).
    EnqueueBatch(
        Vec<EnqueueRequest>,
        RpcReplyPort<Result<Vec<Enqueued>, BatchError>>,
    ),
    /// Internal: a batch enqueue's store write finished (with each payload back, for
    /// the hot-payload cache).
    InsertedBatch(
        Vec<Job>,
        Result<Vec<(Inserted, Vec<u8>)>, StoreError>,
        RpcReplyPort<Result<Vec<Enqueued>, BatchError>>,
    ),
    /// Enqueue a schedule's tick and advance the schedule in one commit (from the
    /// Periodic actor and `qctl schedules trigger`); answered after it is durable.
    Fire(Box<Fire>, RpcReplyPort<Result<Fired, BrokerError>>),
    /// Internal: a fire's store write finished (with the payload back).
    FireWritten(
        Box<Job>,
        Result<(FireWrite, Vec<u8>), StoreError>,
        RpcReplyPort<Result<Fired, BrokerError>>,
    ),
    /// A lessee asks for up to `max_jobs` jobs of the queue, waiting up to its long
    /// poll ([`lease`]). Its queue's [`Dispatch`](dispatch::Dispatch) picks them at
    /// once or when they become ready; the reply goes straight to the lessee once
    /// the store recorded the claims and read the payloads (nothing is written to
    /// disk), or empty when its long poll ends first. While the store refuses
    /// writes nothing is picked.
    Lease(String, LeaseRequest, RpcReplyPort<Vec<LeasedJob>>),
    /// A queue's dispatch counts ([`dispatch_stats`]); `UnknownQueue` for a queue
    /// that is not configured.
    DispatchStats(String, RpcReplyPort<Result<DispatchStats, BrokerError>>),
    /// Weights, caps, pauses or rate limiters changed (an operator's override or a
    /// reload): every queue's dispatch rereads them from [`Limits`].
    LimitsChanged,
    /// Other nodes may have ended leases (the cluster's poll or heartbeat): tenants
    /// held at their cap across the cluster are tried again.
    Reopen,
    /// Internal: the store did not record these leases (a failed or refused claim);
    /// each is given as the job's record before the lease and the lease planned, and
    /// returns to the first uncharged.
    Unclaimed(Vec<(Job, Job)>),
    /// Internal (shared store): the store refused these leases because their
    /// tenant is at its `max_concurrency` across the cluster; each is given as the
    /// job's record before the lease and the lease planned, returns to the first
    /// uncharged and goes back to its queue's dispatch, which holds the tenant at
    /// its cap.
    AtCap(Vec<(Job, Job)>),
    /// Internal (shared store): a lease request got the second list's jobs in place
    /// of the first list's picks (each the record before the lease and the lease
    /// planned), which another node took.
    Substituted(Vec<(Job, Job)>, Vec<Job>),
    /// Internal: a lessee went away before receiving its jobs; return them uncharged.
    Abandoned(Vec<(JobId, Token)>),
    /// From the Supervisor at the first start: attempts an earlier run of qd was
    /// running when it died, with the reason to record for each (see
    /// [`crate::attempt_groups`]).
    LeftBehind(Vec<(JobId, String)>),
    /// Renew a lease for `extend` (default: the queue's lease).
    Heartbeat(
        JobId,
        Token,
        Option<Duration>,
        RpcReplyPort<Result<LeaseInfo, BrokerError>>,
    ),
    /// The attempt succeeded; answered after the ack is durable.
    Ack(JobId, Token, RpcReplyPort<Result<(), BrokerError>>),
    /// The attempt succeeded and handed back this result, stored with the ack in
    /// its commit; refused (`Invalid`, naming the size, nothing changed) when larger
    /// than the queue's `max_result`. Answered after the ack is durable.
    AckResult(
        JobId,
        Token,
        Arc<[u8]>,
        RpcReplyPort<Result<(), BrokerError>>,
    ),
    /// Many acks in one commit; answered per item, in order, after it is durable
    /// (an `Err` for the whole batch only if the write failed).
    AckBatch(
        Vec<(JobId, Token)>,
        RpcReplyPort<Result<Vec<Result<(), BrokerError>>, BrokerError>>,
    ),
    /// The attempt failed; answered after the write is durable.
    Nack(JobId, Token, Failure, RpcReplyPort<Result<(), BrokerError>>),
    /// Timer: the soonest lease deadline passed; expire every lease that is due.
    Tick,
    /// From a pool: this worker crashed; fail whatever it held.
    WorkerLost(String, String),
    /// Move dead jobs back to ready with a fresh budget (one atomic write).
    Redrive(
        Vec<JobId>,
        String,
        RpcReplyPort<Result<BatchOutcome, BrokerError>>,
    ),
    /// Move one dead job back to ready with a new payload (the operator fixed the
    /// data): payload and state change in one commit; the history entry records old
    /// and new size and SHA-256. The idempotency key stays. Answers after it is
    /// durable; a job that is not dead is refused ([`BrokerError::Transition`]) and
    /// a payload over `max_payload` is [`BrokerError::PayloadTooLarge`], with
    /// nothing changed.
    RedriveWithPayload(
        JobId,
        Vec<u8>,
        String,
        RpcReplyPort<Result<(), BrokerError>>,
    ),
    /// Delete dead jobs (one atomic write). A job that holds back unfinished
    /// jobs (children whose edge from it is not met) is refused, naming them.
    Purge(Vec<JobId>, RpcReplyPort<Result<BatchOutcome, BrokerError>>),
    /// Delete dead jobs as [`BrokerMsg::Purge`] does, but count each one's edges
    /// to the unfinished jobs it holds back as met first, in the same commit (a
    /// purge with `--release`, by the operator named). Answers the outcome and
    /// the dependents whose state a released edge changed.
    PurgeReleasing(
        Vec<JobId>,
        String,
        RpcReplyPort<Result<(BatchOutcome, Vec<JobId>), BrokerError>>,
    ),
    /// Count a blocked job's broken edges as met (an operator's release, by the
    /// operator named) and settle it; answers after the commit: the job's new
    /// record if its state changed and the parents released, or `None` when it
    /// is not blocked (nothing written). An unknown job is
    /// [`BrokerError::UnknownJob`].
    Release(
        JobId,
        String,
        RpcReplyPort<Result<Option<crate::store::Released>, BrokerError>>,
    ),
    /// Cancel a job; a leased one loses its lease and its attempt ends `cancelled`
    /// (the lessee learns it from its next heartbeat or report, or sooner from its
    /// pool: see [`crate::worker_pool::PoolMsg::Revoke`]; on a shared store a job
    /// another node runs is cancelled in the store, and that node stops its worker
    /// at its next heartbeat). Answers the state it was cancelled from.
    Cancel(JobId, String, RpcReplyPort<Result<State, BrokerError>>),
    /// Per-queue counts of unfinished jobs.
    Counts(RpcReplyPort<HashMap<Arc<str>, QueueCounts>>),
    /// One queue's unfinished jobs this Broker holds, counted per tenant and state
    /// (ready, delayed, leased, dead), rows ordered as [`crate::store::sort_counts`]
    /// orders them; empty for an unknown queue. The whole truth only where this
    /// node is the store's one writer (SQLite); `qctl top` asks the store otherwise.
    TenantCounts(String, RpcReplyPort<Vec<(String, State, u64)>>),
    /// Per-queue DLQ depth and oldest death (queues with no dead job are absent).
    DlqStats(RpcReplyPort<HashMap<Arc<str>, DlqStats>>),
    /// Stop taking enqueues and stop handing out jobs: waiting lessees are
    /// answered empty, later ones at once (graceful shutdown).
    StopIntake,
    /// Graceful shutdown, once the pools drained: on a shared store, end every lease
    /// this node still holds (external workers'), uncharged.
    ReleaseLeases,
    /// Answer once every write queued so far is durable.
    Flush(RpcReplyPort<()>),
    /// Internal: a store write answered; apply its effect on memory.
    Settle(Settle),
    /// Timer: while the store refuses writes, try a small write.
    Probe,
    /// A shared store: look for jobs other nodes enqueued, redrove or gave back
    /// (from the Cluster actor on a notification or its poll interval).
    Refresh,
    /// Internal: a look for other nodes' jobs answered with claimable jobs.
    Refreshed(Result<Vec<Job>, StoreError>),
    /// Internal: a shared store's current records of the jobs an operator's change
    /// names were read; the change (the boxed message) runs on them.
    Reloaded(Result<Vec<Job>, StoreError>, Box<BrokerMsg>),
    /// From the Cluster actor at each heartbeat: check this node's leases in the
    /// store against memory, and, on the leader of this epoch, end the leases of dead
    /// or silent nodes.
    Sweep(Option<u64>),
    /// Internal: the sweep read this node's leases and the expired ones (leased
    /// records); the list is the leases memory held when the sweep asked (job,
    /// token, leased at, Unix ms).
    Swept(
        Option<u64>,
        Vec<(JobId, Token, UnixMillis)>,
        Result<(Vec<Job>, Vec<Job>), StoreError>,
    ),
}

/// What the broker is started with.
pub struct BrokerArgs {
    /// The durable store.
    pub store: Store,
    /// Live limits (tenant max_depth) and the owner of the config in force.
    pub limits: Arc<Limits>,
    /// The shared rate limiters, by name; a queue's dispatch takes a token of its
    /// queue's limiter per job it picks.
    pub limiters: Arc<crate::rate_limit::Limiters>,
    /// True when the supervisor restarts the Broker inside a running daemon: leases
    /// in the store may still be held by live workers, so they are kept (with a
    /// fresh deadline) instead of being expired as an earlier run's.
    pub restarted: bool,
}

/// Jobs per piece of the start-up load ([`crate::store::Backend::load_unfinished_chunks`]).
const LOAD_CHUNK: usize = 4096;
/// Pieces the store may read ahead of the Broker at start-up.
const LOAD_AHEAD: usize = 4;

pub use crate::config::MAX_ATTEMPTS_LIMIT;
/// The longest idempotency key, in bytes.
pub const MAX_KEY_BYTES: usize = 255;
/// The longest delay a producer may ask for (HTTP API and `qctl enqueue` alike).
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 86_400);

/// The most jobs one batch enqueue may carry (HTTP and admin socket alike).
pub const MAX_BATCH_JOBS: usize = 1000;

/// Checks a batch enqueue's size: 1 to [`MAX_BATCH_JOBS`] jobs.
///
/// Errors: [`BrokerError::Invalid`] naming the count.
pub fn check_batch_len(n: usize) -> Result<(), BrokerError> {
    if (1..=MAX_BATCH_JOBS).contains(&n) {
        Ok(())
    } else {
        Err(BrokerError::Invalid(format!(
            "jobs must hold 1 to {MAX_BATCH_JOBS} items, got {n}"
        )))
    }
}

/// Checks a tenant name: 1 to 64 of `A-Z a-z 0-9 _ . -`.
///
/// Errors: [`BrokerError::Invalid`] naming `what` and the value.
pub fn check_name(what: &str, name: &str) -> Result<(), BrokerError> {
    if crate::config::is_valid_name(name) {
        Ok(())
    } else {
        Err(BrokerError::Invalid(format!(
            "{what} {name:?} must be 1 to 64 characters of A-Z a-z 0-9 _ . -"
        )))
    }
}

/// Checks an enqueue's own fields (not the queue's state): tenant name, key length,
/// delay (at most [`MAX_DELAY`]), retry budget and payload size against
/// `max_payload` bytes.
pub fn validate(req: &EnqueueRequest, max_payload: usize) -> Result<(), BrokerError> {
    if let Some(tenant) = &req.tenant {
        check_name("tenant", tenant)?;
    }
    if let Some(key) = &req.idempotency_key
        && (key.is_empty() || key.len() > MAX_KEY_BYTES)
    {
        return Err(BrokerError::Invalid(format!(
            "idempotency_key must be 1 to {MAX_KEY_BYTES} bytes"
        )));
    }
    if let Some(key) = &req.idempotency_key
        && key.starts_with(crate::schedule::KEY_PREFIX)
    {
        return Err(BrokerError::Invalid(format!(
            "idempotency_key may not start with {:?}: it is reserved for the jobs of schedules",
            crate::schedule::KEY_PREFIX
        )));
    }
    if req.delay > MAX_DELAY {
        return Err(BrokerError::Invalid(
            "delay must be at most 365 days".to_string(),
        ));
    }
    if !crate::job::PRIORITY_RANGE_MS.contains(&req.priority_ms) {
        return Err(BrokerError::Invalid(format!(
            "priority must be between -1d and 1d, got {} ms",
            req.priority_ms
        )));
    }
    if let Some(n) = req.max_attempts
        && (n == 0 || n > MAX_ATTEMPTS_LIMIT)
    {
        return Err(BrokerError::Invalid(format!(
            "max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {n}"
        )));
    }
    crate::deps::check_after(&req.after.parents)
        .map_err(|e| BrokerError::Invalid(e.to_string()))?;
    if req.payload.len() > max_payload {
        return Err(BrokerError::PayloadTooLarge {
            size: req.payload.len(),
            max: max_payload,
        });
    }
    Ok(())
}

/// Sends a request to the broker and waits up to `timeout` for its answer.
///
/// Errors: [`BrokerError::Unavailable`] when the broker is not running (restarting)
/// or does not answer within `timeout`.
pub async fn request<T: Send + 'static>(
    build: impl FnOnce(RpcReplyPort<T>) -> BrokerMsg,
    timeout: Duration,
) -> Result<T, BrokerError> {
    let broker = ActorRef::<BrokerMsg>::where_is(NAME)
        .ok_or_else(|| BrokerError::Unavailable("not running".into()))?;
    match broker.call(build, Some(timeout)).await {
        Ok(ractor::rpc::CallResult::Success(v)) => Ok(v),
        Ok(ractor::rpc::CallResult::Timeout) => Err(BrokerError::Unavailable(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        ))),
        Ok(ractor::rpc::CallResult::SenderError) | Err(_) => {
            Err(BrokerError::Unavailable("stopped while answering".into()))
        }
    }
}

/// Sends a message to the broker without waiting; dropped if it is not running.
pub fn cast(msg: BrokerMsg) {
    if let Some(broker) = ActorRef::<BrokerMsg>::where_is(NAME) {
        let _ = broker.cast(msg);
    }
}

/// The broker actor (stateless handle; its state is [`Running`]).
pub struct Broker;

/// The running Broker: its state, and where that state's effects go.
pub struct Running {
    state: BrokerState,
    store: Store,
    /// Completions' messages to this actor.
    back: effects::Back,
    /// The pending `Tick` of the armed lease timer.
    timer: Option<tokio::task::JoinHandle<Result<(), ractor::MessagingErr<BrokerMsg>>>>,
}

impl Actor for Broker {
    type Msg = BrokerMsg;
    type State = Running;
    type Arguments = BrokerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<BrokerMsg>,
        args: BrokerArgs,
    ) -> Result<Running, ActorProcessingErr> {
        let keep_leases = args.restarted.then(Instant::now);
        let store = args.store.clone();
        let mut state = BrokerState::new(args, StdRng::from_os_rng());
        // The store reads the next rows while this task files the last ones.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Job>>(LOAD_AHEAD);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        store.submit(
            move |b| {
                b.load_unfinished_chunks(LOAD_CHUNK, &mut |part| tx.blocking_send(part).is_ok())
            },
            move |result| {
                let _ = done_tx.send(result);
            },
        );
        let mut kept = 0;
        while let Some(part) = rx.recv().await {
            kept += state.recover(part, keep_leases);
        }
        done_rx.await.unwrap_or(Err(StoreError::Closed))?;
        state.recovered(kept);
        crate::metrics::store_writable(true);
        state.sync_dispatches(wall_ms(), Instant::now());
        myself.send_interval(state::PROBE_EVERY, || BrokerMsg::Probe);
        let back: effects::Back = Arc::new(move |msg| {
            let _ = myself.cast(msg);
        });
        Ok(Running {
            state,
            store,
            back,
            timer: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<BrokerMsg>,
        msg: BrokerMsg,
        running: &mut Running,
    ) -> Result<(), ActorProcessingErr> {
        let mut effects = running.state.take(msg, wall_ms(), Instant::now());
        if let Some(at) = effects.timer.take() {
            if let Some(old) = running.timer.take() {
                old.abort();
            }
            let delay = at.saturating_duration_since(Instant::now());
            running.timer = Some(myself.send_after(delay, || BrokerMsg::Tick));
        }
        effects.perform(&running.store, &running.back);
        Ok(())
    }
}

impl BrokerState {
    /// Handles one message at wall time `now` and monotonic `mono`, synchronously:
    /// what the actor does with each message, and what the property tests drive.
    /// Nothing is performed here: the store operations (whose completions answer
    /// the writes' callers and come back as messages), lease records, replies and
    /// the timer's new time are returned, for the
    /// caller to perform in order, before the next message ([`Effects::perform`]).
    pub(crate) fn take(&mut self, msg: BrokerMsg, now: UnixMillis, mono: Instant) -> Effects {
        debug_assert!(
            self.no_effects_pending(),
            "effects of an earlier call were not taken"
        );
        self.dispatches.at(now, mono);
        self.follow_config();
        match operator_targets(&msg).or_else(|| self.report_targets(&msg)) {
            Some(ids) if self.shared() => self.reload_then(ids, msg),
            _ => self.dispatch(msg, now, mono),
        }
        self.serve(now, mono);
        self.arm();
        self.effects()
    }

    /// Handles one message on memory as it is (see [`Self::take`]).
    fn dispatch(&mut self, msg: BrokerMsg, now: UnixMillis, mono: Instant) {
        let state = self;
        match msg {
            BrokerMsg::Enqueue(req, reply) => state.enqueue(req, reply, now),
            BrokerMsg::Inserted(job, result, reply) => state.inserted(*job, result, reply, now),
            BrokerMsg::EnqueueBatch(reqs, reply) => state.enqueue_batch(reqs, reply, now),
            BrokerMsg::InsertedBatch(jobs, result, reply) => {
                state.inserted_batch(jobs, result, reply, now)
            }
            BrokerMsg::Fire(fire, reply) => state.fire(*fire, reply, now),
            BrokerMsg::FireWritten(job, result, reply) => {
                state.fire_written(*job, result, reply, now)
            }
            BrokerMsg::Settle(settle) => settle.run(state, now, mono),
            BrokerMsg::Probe => state.probe(now),
            BrokerMsg::Lease(queue, request, reply) => match state.dispatches.get_mut(&queue) {
                Some(d) => d.enlist(request, reply, mono),
                None => state.answer(reply, Vec::new()),
            },
            BrokerMsg::DispatchStats(queue, reply) => {
                let answer = match state.dispatches.get(&queue) {
                    Some(d) => Ok(d.stats()),
                    None => Err(BrokerError::UnknownQueue(queue)),
                };
                state.answer(reply, answer);
            }
            BrokerMsg::LimitsChanged => state.sync_dispatches(now, mono),
            BrokerMsg::Reopen => {
                for (_, d) in state.dispatches.iter_mut() {
                    d.reopen();
                }
            }
            BrokerMsg::Unclaimed(before) => state.unclaimed(before, now),
            BrokerMsg::AtCap(refused) => state.at_cap(refused),
            BrokerMsg::Substituted(replaced, taken) => state.substituted(replaced, taken, mono),
            BrokerMsg::Abandoned(leases) => state.abandoned(leases, now),
            BrokerMsg::LeftBehind(attempts) => state.left_behind(attempts, now),
            BrokerMsg::Heartbeat(id, token, extend, reply) => {
                state.heartbeat_any((id, token), extend, &[], reply, now, mono)
            }
            BrokerMsg::Ack(id, token, reply) => state.ack(id, token, &[], reply, now),
            BrokerMsg::AckResult(id, token, result, reply) => {
                state.ack_result(id, token, Some(result), &[], reply, now)
            }
            BrokerMsg::AckBatch(acks, reply) => state.ack_batch(acks, &[], reply, now),
            BrokerMsg::Nack(id, token, failure, reply) => {
                state.fail(id, token, failure, Some(reply), now)
            }
            BrokerMsg::Tick => state.expire_due(now, mono),
            BrokerMsg::WorkerLost(worker, error) => state.worker_lost(&worker, &error, now),
            BrokerMsg::Redrive(ids, by, reply) => state.redrive(ids, &by, reply, now),
            BrokerMsg::RedriveWithPayload(id, payload, by, reply) => {
                state.redrive_with_payload(id, payload, &by, reply, now)
            }
            BrokerMsg::Purge(ids, reply) => {
                let done = move |r: Result<(BatchOutcome, Vec<JobId>), BrokerError>| {
                    let _ = reply.send(r.map(|(outcome, _)| outcome));
                };
                state.purge(ids, None, done, now)
            }
            BrokerMsg::PurgeReleasing(ids, by, reply) => {
                let done = move |r| {
                    let _ = reply.send(r);
                };
                state.purge(ids, Some(by), done, now)
            }
            BrokerMsg::Release(id, by, reply) => state.release(id, by, reply, now),
            BrokerMsg::Cancel(id, by, reply) => state.cancel(id, &by, reply, now),
            BrokerMsg::Counts(reply) => {
                let answer = state.counts();
                state.answer(reply, answer);
            }
            BrokerMsg::TenantCounts(queue, reply) => {
                let answer = state.tenant_counts(&queue);
                state.answer(reply, answer);
            }
            BrokerMsg::DlqStats(reply) => {
                let answer = state.dlq_stats();
                state.answer(reply, answer);
            }
            BrokerMsg::StopIntake => state.stop_intake(),
            BrokerMsg::ReleaseLeases => state.release_leases(now),
            BrokerMsg::Flush(reply) => state.write(
                |_| Ok(()),
                move |_, _| {
                    let _ = reply.send(());
                },
            ),
            BrokerMsg::Refresh => state.refresh(),
            BrokerMsg::Refreshed(result) => state.refreshed(result, now),
            BrokerMsg::Reloaded(result, then) => state.reloaded(result, *then, now, mono),
            BrokerMsg::Sweep(epoch) => state.sweep(epoch, now),
            BrokerMsg::Swept(epoch, held, result) => state.swept(epoch, held, result, now),
        }
    }
}

/// The jobs an operator's change names (redrive, purge, cancel): on a shared store
/// they are read from it first.
fn operator_targets(msg: &BrokerMsg) -> Option<Vec<JobId>> {
    match msg {
        BrokerMsg::Redrive(ids, ..)
        | BrokerMsg::Purge(ids, _)
        | BrokerMsg::PurgeReleasing(ids, ..) => Some(ids.clone()),
        BrokerMsg::RedriveWithPayload(id, ..)
        | BrokerMsg::Cancel(id, ..)
        | BrokerMsg::Release(id, ..) => Some(vec![*id]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(delay: Duration) -> EnqueueRequest {
        EnqueueRequest {
            queue: "q".into(),
            tenant: None,
            payload: b"x".to_vec(),
            idempotency_key: None,
            delay,
            max_attempts: None,
            priority_ms: 0,
            after: Default::default(),
        }
    }

    #[test]
    fn a_batch_error_names_its_item_and_a_depth_refusal_says_the_batch_does_not_fit() {
        let invalid = BatchError {
            index: Some(3),
            error: BrokerError::Invalid("max_attempts must be between 1 and 1000, got 0".into()),
        };
        assert_eq!(
            invalid.to_string(),
            "jobs[3]: max_attempts must be between 1 and 1000, got 0"
        );
        let full = BatchError {
            index: Some(2),
            error: BrokerError::QueueFull {
                queue: "q".into(),
                depth: 10,
                max: 10,
            },
        };
        let text = full.to_string();
        assert!(
            text.starts_with("the batch does not fit: at jobs[2], queue \"q\" is full"),
            "{text}"
        );
        assert!(
            text.ends_with("nothing of the batch was enqueued"),
            "{text}"
        );
        assert_eq!(
            BatchError::whole(BrokerError::ShuttingDown).to_string(),
            "qd is shutting down"
        );
        assert!(check_batch_len(0).is_err());
        assert!(check_batch_len(1).is_ok() && check_batch_len(MAX_BATCH_JOBS).is_ok());
        let err = check_batch_len(MAX_BATCH_JOBS + 1).expect_err("too many");
        assert!(err.to_string().contains("got 1001"), "{err}");
    }

    #[test]
    fn validate_refuses_a_delay_past_a_year_from_every_entry_point() {
        assert!(validate(&request(MAX_DELAY), 16).is_ok());
        let err = validate(&request(MAX_DELAY + Duration::from_secs(1)), 16)
            .expect_err("a delay past 365 days");
        assert!(
            err.to_string().contains("delay must be at most 365 days"),
            "{err}"
        );
    }
}
