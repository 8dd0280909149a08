//! Typed admin responses: the `"ok"` object of a response frame, tagged by `"kind"`
//! (`{"kind":"status","version":"0.1.0",...}`).
//!
//! Units: times are Unix milliseconds (`i64`, fields ending in `_at`), ages and
//! uptimes are seconds (`f64`, fields ending in `_secs`), sizes are bytes (`u64`).
//! Field names are stable within a protocol version; new fields may be added.

use serde::{Deserialize, Serialize};

/// Bytes of payload shown in [`JobDetail::payload_preview`].
pub const PREVIEW_BYTES: usize = 1024;

/// A successful answer; which variant answers which request is listed on
/// [`crate::Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// Answer to `status`.
    Status(StatusInfo),
    /// Answer to `queues`, sorted by queue name.
    Queues {
        /// One entry per configured queue.
        queues: Vec<QueueInfo>,
    },
    /// Answer to `jobs_list` and `dlq_list`.
    Jobs {
        /// The matching jobs, at most `limit`.
        jobs: Vec<JobSummary>,
        /// The cursor of the next page (pass it as `after`); `null` on the last page.
        #[serde(default)]
        next_after: Option<String>,
    },
    /// Answer to `jobs_show` and `dlq_show` (boxed: by far the largest answer).
    Job(Box<JobDetail>),
    /// Answer to `jobs_cancel`.
    Cancelled {
        /// The cancelled job.
        id: String,
        /// The state it was cancelled from (`ready`, `delayed` or `dead`).
        previous_state: String,
        /// Its unfinished transitive dependents cancelled with it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        dependents: Vec<String>,
    },
    /// Answer to `enqueue`.
    Enqueued(Enqueued),
    /// Answer to `enqueue_batch`: one entry per job, in request order.
    EnqueuedBatch {
        /// The jobs' ids (the earlier job's for a duplicate).
        jobs: Vec<Enqueued>,
    },
    /// Answer to `dlq_redrive`.
    Redrive(RedriveResult),
    /// Answer to `dlq_purge`.
    Purge(PurgeResult),
    /// Answer to `limits_show` and to every limit, worker or pause change (the view
    /// after the change).
    Limits(LimitsView),
    /// Answer to `jobs_payload`.
    Payload(JobPayload),
    /// Answer to `jobs_result`.
    JobResult(JobResult),
    /// Answer to `dlq_export`.
    Export {
        /// The page's dead jobs, whole.
        jobs: Vec<ExportedJob>,
        /// The cursor of the next page (pass it as `after`); `null` on the last page.
        #[serde(default)]
        next_after: Option<String>,
    },
    /// Answer to `jobs_release`.
    Released {
        /// The released job.
        id: String,
        /// Its state before (`blocked`).
        previous_state: String,
        /// Its state after: `waiting` (other parents not final yet), `ready` or
        /// `delayed`.
        state: String,
        /// The parents whose broken edges now count as met.
        parents: Vec<String>,
    },
    /// Answer to `jobs_tree`.
    Tree(JobTree),
    /// Answer to `top`.
    Top(TopInfo),
    /// Answer to `backup`.
    Backup(BackupInfo),
    /// Answer to `reload`.
    Reloaded(ReloadInfo),
    /// Answer to `schedules_list`, `schedules_pause` and `schedules_resume`, sorted
    /// by name.
    Schedules {
        /// Every configured schedule.
        schedules: Vec<ScheduleInfo>,
    },
}

/// One configured schedule and its stored state (`qctl schedules list`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// `cron EXPR` or `every DURATION`.
    pub spec: String,
    /// The time zone of a cron expression (`UTC` by default); `null` for `every`.
    #[serde(default)]
    pub timezone: Option<String>,
    /// When it fires next, Unix ms (its tick plus jitter); `null` while paused or
    /// not yet computed.
    #[serde(default)]
    pub next_fire_at: Option<i64>,
    /// The tick of its last run (a trigger's time for a manual run), Unix ms.
    #[serde(default)]
    pub last_fire_at: Option<i64>,
    /// The job of its last run.
    #[serde(default)]
    pub last_job: Option<String>,
    /// That job's state now (`null` when it was pruned or there is none).
    #[serde(default)]
    pub last_job_state: Option<String>,
    /// Paused by an operator.
    pub paused: bool,
}

impl Response {
    /// This response's `kind` name (for error messages about unexpected answers).
    pub fn kind(&self) -> &'static str {
        match self {
            Response::Status(_) => "status",
            Response::Queues { .. } => "queues",
            Response::Jobs { .. } => "jobs",
            Response::Job(_) => "job",
            Response::Cancelled { .. } => "cancelled",
            Response::Enqueued(_) => "enqueued",
            Response::EnqueuedBatch { .. } => "enqueued_batch",
            Response::Redrive(_) => "redrive",
            Response::Purge(_) => "purge",
            Response::Limits(_) => "limits",
            Response::Payload(_) => "payload",
            Response::JobResult(_) => "job_result",
            Response::Export { .. } => "export",
            Response::Released { .. } => "released",
            Response::Tree(_) => "tree",
            Response::Top(_) => "top",
            Response::Backup(_) => "backup",
            Response::Reloaded(_) => "reloaded",
            Response::Schedules { .. } => "schedules",
        }
    }
}

/// The daemon at a glance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusInfo {
    /// qd's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_secs: f64,
    /// Path of the SQLite database.
    pub store_path: String,
    /// Size of the database files (main + WAL), bytes.
    pub store_bytes: u64,
    /// Supervised actors, in supervision order.
    pub actors: Vec<ActorInfo>,
    /// On a store shared by several nodes, every node that joined, by name (empty
    /// on SQLite, or when the database could not be read).
    #[serde(default)]
    pub nodes: Vec<NodeStatus>,
}

/// One node of a cluster sharing one database.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Its `node_name`.
    pub name: String,
    /// Milliseconds since its last heartbeat (database clock).
    pub heartbeat_age_ms: u64,
    /// Whether its heartbeat is younger than `node_timeout` (the leader ends the
    /// leases of a node that is not alive).
    pub alive: bool,
    /// Whether it holds the leader lease.
    pub leader: bool,
    /// The leader lease's epoch, on the leader.
    pub epoch: Option<u64>,
    /// Whether it is the node that answered.
    pub this: bool,
}

/// One supervised actor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorInfo {
    /// The actor's name (`broker`, `worker_pool/email`, ...).
    pub name: String,
    /// Times the supervisor restarted it since the daemon started.
    pub restarts: u64,
}

/// One queue's depths and workers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueInfo {
    /// Queue name.
    pub name: String,
    /// Jobs waiting for a worker.
    pub ready: u64,
    /// Jobs waiting for their `ready_at` (delay or retry backoff).
    pub delayed: u64,
    /// Jobs held by a worker under a lease.
    pub leased: u64,
    /// Jobs in the dead-letter queue.
    pub dead: u64,
    /// Age of the oldest ready job, seconds; `null` when none is ready.
    pub oldest_ready_age_secs: Option<f64>,
    /// Workers running a job now.
    pub workers_busy: u32,
    /// Workers alive now.
    pub workers_total: u32,
    /// Effective lower bound of the pool.
    pub workers_min: u32,
    /// Effective upper bound of the pool.
    pub workers_max: u32,
    /// True when leasing is paused.
    pub paused: bool,
    /// Jobs waiting for a parent named in `after` (0 from older servers).
    #[serde(default)]
    pub waiting: u64,
    /// Jobs blocked by a dead or cancelled parent (0 from older servers).
    #[serde(default)]
    pub blocked: u64,
}

/// A job without payload or history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSummary {
    /// Job id (UUIDv7 text).
    pub id: String,
    /// Queue name.
    pub queue: String,
    /// Tenant name.
    pub tenant: String,
    /// One of [`crate::JOB_STATES`].
    pub state: String,
    /// Charged attempts so far (never decreases, also across redrives).
    pub attempts: u32,
    /// Charged attempts since enqueue or the last redrive: the part of
    /// `max_attempts` spent (equals `attempts` until a redrive). Absent from
    /// older servers, read as 0.
    #[serde(default)]
    pub budget_used: u32,
    /// Retry budget per life in the queue (per enqueue or redrive).
    pub max_attempts: u32,
    /// Enqueue time, Unix ms.
    pub created_at: i64,
    /// Last state change, Unix ms (for a dead job: when it died).
    pub updated_at: i64,
    /// When a delayed job (a `delay` or a retry's backoff) becomes ready, Unix ms;
    /// `None` in every other state. Absent from older servers, read as `None`.
    #[serde(default)]
    pub ready_at: Option<i64>,
    /// Error of the latest failed attempt, if any.
    pub last_error: Option<String>,
    /// In `dlq_list` and `dlq_show`: how many unfinished jobs this dead job holds
    /// back directly (children whose edge from it is not met). Absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u64>,
}

/// A job with payload preview and its history (as kept by the history cap).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDetail {
    /// The summary fields, inlined in the JSON object.
    #[serde(flatten)]
    pub summary: JobSummary,
    /// The producer's idempotency key.
    pub idempotency_key: Option<String>,
    /// The first [`PREVIEW_BYTES`] of the payload, invalid UTF-8 replaced by U+FFFD.
    pub payload_preview: String,
    /// Full payload size, bytes.
    pub payload_bytes: u64,
    /// Attempts and operator events (redrive, cancel), oldest first: the first and
    /// the last ones when the history outgrew the daemon's cap.
    pub history: Vec<HistoryItem>,
    /// How many entries the history cap deleted (0 when none; absent from older
    /// servers, read as 0).
    #[serde(default)]
    pub history_elided: u64,
    /// Where they were: the number of entries of `history` older than them.
    #[serde(default)]
    pub history_elided_at: u64,
    /// Priority within the tenant, milliseconds (0 when absent: older servers).
    #[serde(default)]
    pub priority_ms: i64,
    /// The stored result's size, bytes; `None` without a result (or from older
    /// servers).
    #[serde(default)]
    pub result_bytes: Option<u64>,
    /// The jobs it names in `after`, in id order, with the edge's state and theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<EdgeInfo>,
    /// The jobs that name it in `after` (the first [`MAX_DEPENDENTS_SHOWN`], in id
    /// order), with the edge's state and theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependents: Vec<EdgeInfo>,
    /// How many jobs name it in `after` (more than `dependents` lists when over
    /// [`MAX_DEPENDENTS_SHOWN`]).
    #[serde(default)]
    pub dependents_total: u64,
    /// The unfinished jobs it holds back directly (the summary's `blocks`) and
    /// every unfinished job below them, each once; `dlq_show` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks_transitive: Option<u64>,
}

/// The most dependents a job's detail lists.
pub const MAX_DEPENDENTS_SHOWN: usize = 1000;

/// One end of a dependency edge, as a job's detail lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeInfo {
    /// The other job's id.
    pub id: String,
    /// The edge: `open` (the parent is not final yet), `met` or `broken` (a dead or
    /// cancelled parent under `after_policy` `succeeded`).
    pub edge: String,
    /// The other job's state; `null` once it was purged or pruned.
    pub state: Option<String>,
    /// The other job's queue; `null` once it was purged or pruned.
    pub queue: Option<String>,
}

/// A bounded dependency tree (`jobs_tree`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTree {
    /// `dependents` (down from the root) or `parents` (up).
    pub direction: String,
    /// The depth bound used.
    pub max_depth: u32,
    /// The size bound used.
    pub max_nodes: u32,
    /// Jobs in the tree, root included (a job reached twice counts each time).
    pub nodes: u64,
    /// The deepest level shown (0: the root alone).
    pub depth: u32,
    /// True when a bound cut the tree: some node's `more` is not 0.
    pub truncated: bool,
    /// The root.
    pub root: TreeNode,
}

/// One job of a [`JobTree`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeNode {
    /// Job id.
    pub id: String,
    /// Its state; `null` once it was purged or pruned.
    pub state: Option<String>,
    /// Its queue; `null` once it was purged or pruned.
    pub queue: Option<String>,
    /// The edge between it and the node above it (`null` for the root).
    pub edge: Option<String>,
    /// Shown already higher in the tree: its own children are not repeated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repeated: bool,
    /// Its children the bounds left out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: u64,
    /// Its children (dependents, or parents when walking up), in id order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<TreeNode>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl JobDetail {
    /// The preview of `payload` as the protocol defines it: its first [`PREVIEW_BYTES`]
    /// bytes, decoded lossily as UTF-8.
    pub fn preview(payload: &[u8]) -> String {
        let head = &payload[..payload.len().min(PREVIEW_BYTES)];
        String::from_utf8_lossy(head).into_owned()
    }
}

/// One attempt or operator event of a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryItem {
    /// Attempt number (1-based); for events, the job's attempt count at the time.
    pub attempt: u32,
    /// How it ended (`succeeded`, `failed`, `permanent`, `timed_out`, `lease_expired`,
    /// `worker_crashed`, `interrupted`, `throttled`, `redriven`, `cancelled`).
    pub outcome: String,
    /// The worker that held the lease, if any.
    pub worker: Option<String>,
    /// Lease time, Unix ms; `null` for events.
    pub started_at: Option<i64>,
    /// End time, Unix ms.
    pub ended_at: i64,
    /// The error, or an event's detail (`"redriven by uid 1000 at 2025-..."`).
    pub error: Option<String>,
}

/// Result of an enqueue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enqueued {
    /// The job's id (the earlier job's id for a duplicate).
    pub id: String,
    /// True when the idempotency key matched an earlier job and nothing was enqueued.
    pub duplicate: bool,
}

/// Result of a redrive (or, with `dry_run`, what it would do).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveResult {
    /// For an id selection, the number of ids named (refused ones included); for a
    /// filter selection, the dead jobs it matched.
    pub matched: u64,
    /// Jobs moved to ready (0 on a dry run).
    pub moved: u64,
    /// Moved ids, or on a dry run the ids that would move.
    pub ids: Vec<String>,
    /// Named ids that were not moved, with why.
    pub refused: Vec<Refusal>,
    /// Echo of the request's `dry_run`.
    pub dry_run: bool,
}

/// Why one named job was not redriven or purged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The job id as given.
    pub id: String,
    /// Human reason naming the job's state (`"job is ready, not dead"`, `"no such job"`).
    pub reason: String,
}

/// Result of a purge (or, with `dry_run`, what it would do).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeResult {
    /// Counted as for [`RedriveResult::matched`].
    pub matched: u64,
    /// Jobs deleted (0 on a dry run).
    pub purged: u64,
    /// Purged ids, or on a dry run the ids that would be purged.
    pub ids: Vec<String>,
    /// Named ids that were not purged, with why.
    pub refused: Vec<Refusal>,
    /// Echo of the request's `dry_run`.
    pub dry_run: bool,
    /// With `cascade`: the dependents cancelled (on a dry run, those that would be).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cancelled: Vec<String>,
    /// With `release`: the dependents whose state the released edges changed
    /// (on a dry run, the jobs whose edges would be released).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<String>,
}

/// Where an effective value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The config file (or its defaults).
    Config,
    /// A stored runtime override (`qctl limits set`, `workers set`, `queue pause`).
    Override,
}

impl Source {
    /// `"config"` or `"override"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Override => "override",
        }
    }
}

/// An effective value with its [`Source`]: `{"value":3,"source":"override"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Valued<T> {
    /// The value in effect.
    pub value: T,
    /// Where it comes from.
    pub source: Source,
}

/// Every tenant and queue limit in effect.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LimitsView {
    /// Per tenant, sorted by name.
    pub tenants: Vec<TenantLimits>,
    /// Per queue, sorted by name.
    pub queues: Vec<QueueLimits>,
}

/// One tenant's limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLimits {
    /// Tenant name.
    pub tenant: String,
    /// Scheduling weight (share of a queue's workers under contention).
    pub weight: Valued<u32>,
    /// Jobs leased at once per queue; `null` means unlimited.
    pub max_concurrency: Valued<Option<u32>>,
    /// Waiting jobs per queue before enqueue is refused; `null` means the queue default.
    pub max_depth: Valued<Option<u64>>,
}

/// One queue's pool bounds, rate limiter and pause flag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueLimits {
    /// Queue name.
    pub queue: String,
    /// Fewest workers.
    pub workers_min: Valued<u32>,
    /// Most workers.
    pub workers_max: Valued<u32>,
    /// The named `[rate_limiters.X]` with its settings (`"smtp: 50/s burst 10"`), if any.
    pub rate_limiter: Option<String>,
    /// Whether leasing is paused.
    pub paused: Valued<bool>,
}

/// A snapshot written by `backup`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupInfo {
    /// The snapshot file.
    pub path: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Jobs in the snapshot per state (every state of [`crate::JOB_STATES`], zeros included).
    pub jobs: Vec<StateCount>,
    /// When the snapshot was taken (Unix ms).
    pub taken_at: i64,
}

/// How many jobs are in one state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCount {
    /// The state (one of [`crate::JOB_STATES`]).
    pub state: String,
    /// Jobs in it.
    pub count: u64,
}

/// What a successful `reload` changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadInfo {
    /// The config file read.
    pub path: String,
    /// One line per applied change, e.g. `queue "reports" added` or
    /// `tenants.acme.weight: 1 -> 3`; empty when the file changed nothing.
    pub changes: Vec<String>,
}

/// A job's whole payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPayload {
    /// The job id.
    pub id: String,
    /// Payload size, bytes.
    pub payload_bytes: u64,
    /// The payload, standard base64 with padding (RFC 4648 §4).
    pub payload_b64: String,
}

/// What a job handed back: its ack's result (or a command's `$QD_RESULT_FILE`, a
/// webhook's response body with `store_result`). A job without a result is
/// answered `not_found`, naming its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobResult {
    /// The job id.
    pub id: String,
    /// The job's state.
    pub state: String,
    /// Result size, bytes.
    pub result_bytes: u64,
    /// The result, standard base64 with padding (RFC 4648 §4).
    pub result_b64: String,
}

/// A dead job with everything needed to analyse or replay it: one line of
/// `qctl dlq export`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedJob {
    /// The summary fields (with `last_error`), inlined in the JSON object.
    #[serde(flatten)]
    pub summary: JobSummary,
    /// The producer's idempotency key.
    pub idempotency_key: Option<String>,
    /// Payload size, bytes.
    pub payload_bytes: u64,
    /// The payload, standard base64 with padding (RFC 4648 §4).
    pub payload_b64: String,
    /// Attempts and operator events, oldest first.
    pub history: Vec<HistoryItem>,
}

/// What `qctl top` shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopInfo {
    /// One entry per configured queue, sorted by name.
    pub queues: Vec<TopQueue>,
    /// Per-tenant counts of the queue named by the request's `tenants_of`, sorted by
    /// tenant; empty when none was named.
    pub tenants: Vec<TenantCounts>,
}

/// One queue's depths, workers and cumulative attempt counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopQueue {
    /// Depths, oldest ready age and workers, as `queues` answers them.
    #[serde(flatten)]
    pub info: QueueInfo,
    /// Attempts that succeeded since the daemon started (a counter: the client
    /// computes rates from two readings).
    pub completed_total: u64,
    /// Charged attempts that failed (failed, permanent, timed out, lease expired,
    /// worker crashed) since the daemon started.
    pub failed_total: u64,
}

/// One tenant's jobs in one queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantCounts {
    /// Tenant name.
    pub tenant: String,
    /// Ready jobs (including delayed jobs whose time has come).
    pub ready: u64,
    /// Delayed jobs.
    pub delayed: u64,
    /// Leased jobs.
    pub leased: u64,
    /// Dead jobs.
    pub dead: u64,
    /// Jobs waiting for a parent named in `after`.
    #[serde(default)]
    pub waiting: u64,
    /// Jobs blocked by a dead or cancelled parent.
    #[serde(default)]
    pub blocked: u64,
}
