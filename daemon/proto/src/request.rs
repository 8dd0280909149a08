//! Typed admin requests: one variant of [`Request`] per `qctl` command.
//!
//! On the wire a request is the `"req"` object of a request frame, tagged by `"op"`:
//! `{"op":"jobs_list","queue":"email","limit":20}`. Optional fields may be omitted or
//! `null`. Durations carry their unit in the field name (`delay_ms`, `since_secs`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

/// Job states as qd stores and shows them (`qd::job::State::as_str`), in life-cycle
/// order. A `state` filter must be one of these; the daemon refuses others with
/// `bad_request`.
pub const JOB_STATES: [&str; 8] = [
    "delayed",
    "ready",
    "leased",
    "succeeded",
    "dead",
    "cancelled",
    "waiting",
    "blocked",
];

/// An admin request. The `op` tag names it on the wire; see `daemon/docs/admin-protocol.md`.
/// Unknown fields are refused (`bad_request`), so a newer client's filter is never
/// silently ignored; field-less ops are empty struct variants for that reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Daemon version, uptime, store and actors. Answered with [`crate::Response::Status`].
    Status {},
    /// Per-queue depths, oldest ready age, workers, paused. Answered with
    /// [`crate::Response::Queues`].
    Queues {},
    /// Jobs matching every given filter, newest first. Answered with [`crate::Response::Jobs`].
    JobsList {
        /// Only jobs of this queue.
        #[serde(default)]
        queue: Option<String>,
        /// Only jobs of this tenant.
        #[serde(default)]
        tenant: Option<String>,
        /// Only jobs in this state (one of [`JOB_STATES`]).
        #[serde(default)]
        state: Option<String>,
        /// Only jobs whose last error contains this text: the filter of
        /// [`DlqSelection::error_contains`], over jobs in any state.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_contains: Option<String>,
        /// Only jobs changed (enqueued, leased, ended, ...) within the last
        /// this-many seconds: the filter of [`DlqSelection::since_secs`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since_secs: Option<u64>,
        /// At most this many jobs (the daemon picks a default when absent).
        #[serde(default)]
        limit: Option<u32>,
        /// Only jobs after this id in the listing's order: the `next_after` of the
        /// previous page.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
    /// One job with payload preview and full history. Answered with [`crate::Response::Job`].
    JobsShow {
        /// The job id (UUIDv7 text).
        id: String,
    },
    /// Cancels a ready, delayed or dead job; any other state is refused with `conflict`.
    /// Answered with [`crate::Response::Cancelled`].
    JobsCancel {
        /// The job id.
        id: String,
        /// Leave the job's unfinished transitive dependents (`after`) alone: they
        /// stay blocked. By default they are cancelled too.
        #[serde(default)]
        keep_dependents: bool,
    },
    /// Counts a blocked job's broken edges (to dead or cancelled parents) as met,
    /// so it waits only for its other parents or runs. Answered with
    /// [`crate::Response::Released`]. A job that is not blocked is a `conflict`.
    JobsRelease {
        /// The job id.
        id: String,
    },
    /// A job's dependency tree: its dependents (or, with `parents`, its parents),
    /// level by level, bounded in depth and size. Answered with
    /// [`crate::Response::Tree`].
    JobsTree {
        /// The root job's id.
        id: String,
        /// Walk up to the parents instead of down to the dependents.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        parents: bool,
        /// Levels below the root to show, 1 to [`MAX_TREE_DEPTH`] (default 10).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_depth: Option<u32>,
        /// Jobs to show at most, root included, 1 to [`MAX_TREE_NODES`] (default
        /// 200).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_nodes: Option<u32>,
    },
    /// Enqueues one job. Answered with [`crate::Response::Enqueued`].
    Enqueue {
        /// Target queue (must be configured).
        queue: String,
        /// Tenant; the daemon uses `"default"` when absent.
        #[serde(default)]
        tenant: Option<String>,
        /// Idempotency key: a second enqueue with the same key in the same queue within
        /// `retention` returns the first job's id with `duplicate: true`.
        #[serde(default)]
        key: Option<String>,
        /// Delay before the job becomes ready, in milliseconds.
        #[serde(default)]
        delay_ms: Option<u64>,
        /// Retry budget for this job; the queue's `max_attempts` when absent.
        #[serde(default)]
        max_attempts: Option<u32>,
        /// Priority within the tenant: a signed duration (`"10m"`, `"-5m"`, -1 day to
        /// +1 day) the job ranks ahead by; 0 when absent. Parsed by the daemon.
        #[serde(default)]
        priority: Option<String>,
        /// The payload bytes.
        payload: Payload,
        /// Parent job ids the job waits for (1 to 1,000; none when empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        after: Vec<String>,
        /// `succeeded` (the default) or `finished`: when an edge counts as met.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_policy: Option<String>,
    },
    /// Enqueues 1 to 1,000 jobs all or nothing, in one commit (what `qctl enqueue
    /// --ndjson` sends). Each job is an object of the HTTP single enqueue's shape
    /// (`{"tenant"?, "payload" | "payload_b64", "idempotency_key"?, "delay"?,
    /// "max_attempts"?}`, see `daemon/docs/http-api.md`). Answered with
    /// [`crate::Response::EnqueuedBatch`]; a refusal names the job in
    /// [`crate::ErrorBody::index`] and nothing of the batch is enqueued. The jobs come
    /// as objects (`jobs`) or, to keep each as written, as JSON texts (`job_texts`);
    /// one of the two.
    EnqueueBatch {
        /// Target queue (must be configured).
        queue: String,
        /// The job objects, in order. A payload given as a JSON value is re-read by
        /// the frame's parse (big integers round to floats, keys are sorted).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        jobs: Vec<serde_json::Value>,
        /// The job objects as JSON texts, in order: each is parsed as the HTTP API
        /// parses a body, so a payload's numbers and key order are kept as written
        /// (what `qctl enqueue --ndjson` sends).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        job_texts: Vec<String>,
    },
    /// Dead jobs matching the selection, most recently dead first. Answered with
    /// [`crate::Response::Jobs`]; for dead jobs `updated_at` is when the job died.
    DlqList {
        /// Filters; an empty selection lists every dead job.
        #[serde(default)]
        selection: DlqSelection,
        /// At most this many jobs (the daemon picks a default when absent).
        #[serde(default)]
        limit: Option<u32>,
        /// Only jobs after this id in the listing's order: the `next_after` of the
        /// previous page.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
    /// One dead job with payload preview and every attempt with its error. Answered
    /// with [`crate::Response::Job`].
    DlqShow {
        /// The job id.
        id: String,
    },
    /// Moves dead jobs back to ready with a fresh attempt budget. Answered with
    /// [`crate::Response::Redrive`].
    DlqRedrive {
        /// Which jobs; must not be empty (see [`DlqSelection::check_mutation`]).
        selection: DlqSelection,
        /// Resolve the selection and report what would move, moving nothing.
        #[serde(default)]
        dry_run: bool,
        /// Jobs moved per store transaction (each batch is atomic); daemon default 100.
        #[serde(default)]
        batch_size: Option<u32>,
        /// Upper bound on jobs moved per second across batches; unlimited when absent.
        #[serde(default)]
        rate_per_sec: Option<f64>,
        /// A new payload for the job (an operator fixed the data): the selection must
        /// be exactly one id and `dry_run` false; the payload is replaced in the same
        /// commit as the redrive, and at most `max_payload` bytes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<Payload>,
    },
    /// Deletes dead jobs for good. Answered with [`crate::Response::Purge`].
    DlqPurge {
        /// Which jobs; must not be empty (see [`DlqSelection::check_mutation`]).
        selection: DlqSelection,
        /// Resolve the selection and report what would be purged, deleting nothing.
        #[serde(default)]
        dry_run: bool,
        /// Cancel the unfinished transitive dependents of each job first; without
        /// this or `release`, a job that holds back unfinished jobs is refused.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cascade: bool,
        /// Count each job's edges to the unfinished jobs it holds back as met, in
        /// the purge's commit.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        release: bool,
    },
    /// Tenant and queue limits with their sources. Answered with [`crate::Response::Limits`].
    LimitsShow {},
    /// Sets runtime overrides for one tenant; absent fields are left alone. Stored, so
    /// they survive restarts until reset. Answered with [`crate::Response::Limits`].
    LimitsSet {
        /// The tenant whose overrides to set (any valid name, configured or not).
        tenant: String,
        /// Scheduling weight (≥ 1).
        #[serde(default)]
        weight: Option<u32>,
        /// Jobs of this tenant leased at once, per queue.
        #[serde(default)]
        max_concurrency: Option<u32>,
        /// Jobs of this tenant waiting (ready + delayed) per queue before enqueue is refused.
        #[serde(default)]
        max_depth: Option<u64>,
    },
    /// Drops every runtime override of one tenant, one queue (workers and pause) or
    /// one rate limiter, so the config values apply again. Exactly one of the three
    /// must be given. Answered with [`crate::Response::Limits`].
    LimitsReset {
        /// The tenant whose overrides to drop.
        #[serde(default)]
        tenant: Option<String>,
        /// The queue whose overrides to drop.
        #[serde(default)]
        queue: Option<String>,
        /// The `[rate_limiters.NAME]` whose overrides to drop.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limiter: Option<String>,
    },
    /// Sets runtime overrides of a configured shared rate limiter; absent fields are
    /// left alone. Applies at once to every queue naming it (the bucket restarts
    /// full) and is stored, so it survives restarts until reset. Answered with
    /// [`crate::Response::Limits`].
    LimiterSet {
        /// The `[rate_limiters.NAME]`.
        limiter: String,
        /// Sustained rate, jobs per second (≥ 1).
        #[serde(default)]
        per_second: Option<u32>,
        /// Jobs allowed at once after a quiet spell (≥ 1).
        #[serde(default)]
        burst: Option<u32>,
    },
    /// Overrides a queue's worker pool bounds (`min ≤ max`). Answered with
    /// [`crate::Response::Limits`].
    WorkersSet {
        /// A configured queue with an in-process pool.
        queue: String,
        /// Fewest workers kept running.
        min: u32,
        /// Most workers the pool grows to.
        max: u32,
    },
    /// Stops leasing from a queue (enqueue still works). Answered with [`crate::Response::Limits`].
    QueuePause {
        /// A configured queue.
        queue: String,
    },
    /// Resumes leasing from a paused queue. Answered with [`crate::Response::Limits`].
    QueueResume {
        /// A configured queue.
        queue: String,
    },
    /// The whole payload of any retained job, as base64. Answered with
    /// [`crate::Response::Payload`].
    JobsPayload {
        /// The job id.
        id: String,
    },
    /// What a job handed back (its ack's result), as base64. Answered with
    /// [`crate::Response::JobResult`], or `not_found` when the job has no result.
    JobsResult {
        /// The job id.
        id: String,
    },
    /// Dead jobs with their whole payload and history, a page at a time, most recently
    /// dead first. Answered with [`crate::Response::Export`].
    DlqExport {
        /// Filters (`ids` and `all` are not used); an empty selection exports every
        /// dead job.
        #[serde(default)]
        selection: DlqSelection,
        /// Jobs per page (the daemon picks a default when absent).
        #[serde(default)]
        limit: Option<u32>,
        /// The `next_after` of the previous page.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
    /// Live numbers for `qctl top`: every queue with cumulative completed and failed
    /// attempt counters, and one queue's per-tenant breakdown. Answered with
    /// [`crate::Response::Top`].
    Top {
        /// The queue whose tenants to break down; none when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenants_of: Option<String>,
    },
    /// Writes a consistent snapshot of the store to `path` while qd serves, fsynced.
    /// An existing file is refused with `conflict` unless `force`. Answered with
    /// [`crate::Response::Backup`].
    Backup {
        /// Absolute path of the snapshot file, as seen by the daemon (it writes it).
        path: String,
        /// Replace an existing file.
        #[serde(default)]
        force: bool,
    },
    /// Re-reads and validates the config file and applies it live (as SIGHUP does).
    /// An invalid file is refused with `bad_request` (every problem, one per line),
    /// a change that cannot apply live with `conflict`; either way nothing changes.
    /// Answered with [`crate::Response::Reloaded`].
    Reload {},
    /// Every configured schedule with its stored state. Answered with
    /// [`crate::Response::Schedules`].
    SchedulesList {},
    /// Pauses a schedule: no tick fires until it is resumed (stored, on every
    /// node). Answered with [`crate::Response::Schedules`].
    SchedulesPause {
        /// The schedule.
        name: String,
    },
    /// Resumes a paused schedule from its next tick after now (the ticks that came
    /// while it was paused are not caught up). Answered with
    /// [`crate::Response::Schedules`].
    SchedulesResume {
        /// The schedule.
        name: String,
    },
    /// One run of a schedule now, keyed by the trigger time (also while paused);
    /// the schedule's next tick is unchanged. Answered with
    /// [`crate::Response::Enqueued`].
    SchedulesTrigger {
        /// The schedule.
        name: String,
    },
}

impl Request {
    /// Every `op` name, in declaration order. `decode_request` answers `unknown_op` for
    /// any other name.
    pub const OPS: [&'static str; 30] = [
        "status",
        "queues",
        "jobs_list",
        "jobs_show",
        "jobs_cancel",
        "jobs_release",
        "jobs_tree",
        "enqueue",
        "enqueue_batch",
        "dlq_list",
        "dlq_show",
        "dlq_redrive",
        "dlq_purge",
        "limits_show",
        "limits_set",
        "limits_reset",
        "workers_set",
        "queue_pause",
        "queue_resume",
        "limiter_set",
        "jobs_payload",
        "jobs_result",
        "dlq_export",
        "top",
        "backup",
        "reload",
        "schedules_list",
        "schedules_pause",
        "schedules_resume",
        "schedules_trigger",
    ];

    /// This request's `op` name (for logs and metrics labels).
    pub fn op(&self) -> &'static str {
        match self {
            Request::Status {} => "status",
            Request::Queues {} => "queues",
            Request::JobsList { .. } => "jobs_list",
            Request::JobsShow { .. } => "jobs_show",
            Request::JobsCancel { .. } => "jobs_cancel",
            Request::JobsRelease { .. } => "jobs_release",
            Request::JobsTree { .. } => "jobs_tree",
            Request::Enqueue { .. } => "enqueue",
            Request::EnqueueBatch { .. } => "enqueue_batch",
            Request::DlqList { .. } => "dlq_list",
            Request::DlqShow { .. } => "dlq_show",
            Request::DlqRedrive { .. } => "dlq_redrive",
            Request::DlqPurge { .. } => "dlq_purge",
            Request::LimitsShow {} => "limits_show",
            Request::LimitsSet { .. } => "limits_set",
            Request::LimitsReset { .. } => "limits_reset",
            Request::WorkersSet { .. } => "workers_set",
            Request::QueuePause { .. } => "queue_pause",
            Request::QueueResume { .. } => "queue_resume",
            Request::LimiterSet { .. } => "limiter_set",
            Request::JobsPayload { .. } => "jobs_payload",
            Request::JobsResult { .. } => "jobs_result",
            Request::DlqExport { .. } => "dlq_export",
            Request::Top { .. } => "top",
            Request::Backup { .. } => "backup",
            Request::Reload {} => "reload",
            Request::SchedulesList {} => "schedules_list",
            Request::SchedulesPause { .. } => "schedules_pause",
            Request::SchedulesResume { .. } => "schedules_resume",
            Request::SchedulesTrigger { .. } => "schedules_trigger",
        }
    }

    /// True if `name` is a known `op`.
    pub fn is_known_op(name: &str) -> bool {
        Self::OPS.contains(&name)
    }
}

/// The deepest a `jobs_tree` walks below its root.
pub const MAX_TREE_DEPTH: u32 = 100;
/// The most jobs a `jobs_tree` answer holds.
pub const MAX_TREE_NODES: u32 = 10_000;

/// The most jobs a bulk redrive moves per store transaction (`batch_size`).
pub const MAX_REDRIVE_BATCH: u32 = 10_000;
/// The slowest pace a bulk redrive takes, jobs per second (one every 1,000 s).
pub const MIN_REDRIVE_RATE: f64 = 0.001;
/// The fastest pace a bulk redrive may be given, jobs per second.
pub const MAX_REDRIVE_RATE: f64 = 1_000_000.0;

/// Checks a redrive's pace: `batch_size` from 1 to [`MAX_REDRIVE_BATCH`] jobs per
/// transaction, `rate_per_sec` from [`MIN_REDRIVE_RATE`] to [`MAX_REDRIVE_RATE`] jobs
/// per second (absent: the daemon's default batch, no rate limit). The error text
/// names the value and is suitable for a `bad_request` message.
pub fn check_pace(batch_size: Option<u32>, rate_per_sec: Option<f64>) -> Result<(), String> {
    if let Some(batch) = batch_size
        && !(1..=MAX_REDRIVE_BATCH).contains(&batch)
    {
        return Err(format!(
            "batch_size must be between 1 and {MAX_REDRIVE_BATCH}, got {batch}"
        ));
    }
    if let Some(rate) = rate_per_sec
        && !(MIN_REDRIVE_RATE..=MAX_REDRIVE_RATE).contains(&rate)
    {
        return Err(format!(
            "rate_per_sec must be between {MIN_REDRIVE_RATE} and {MAX_REDRIVE_RATE} jobs per second, got {rate}"
        ));
    }
    Ok(())
}

/// Which dead jobs a DLQ request is about. With `ids` non-empty the request is about
/// exactly those jobs and the filters must be absent; otherwise a job matches when it
/// passes every given filter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlqSelection {
    /// Exact job ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
    /// Only jobs of this queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Only jobs of this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Only jobs whose last error contains this text (case-sensitive substring).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_contains: Option<String>,
    /// Only jobs that died within the last this-many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_secs: Option<u64>,
    /// Every dead job (combinable with the filters, which then narrow it). Required for
    /// a redrive or purge that names neither ids nor a filter.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

impl DlqSelection {
    /// A selection of exactly these ids.
    pub fn of_ids(ids: Vec<String>) -> Self {
        DlqSelection {
            ids,
            ..Self::default()
        }
    }

    /// True when some filter (queue, tenant, error, since) is set.
    pub fn has_filter(&self) -> bool {
        self.queue.is_some()
            || self.tenant.is_some()
            || self.error_contains.is_some()
            || self.since_secs.is_some()
    }

    /// Checks a selection for redrive or purge: ids and filters/`all` are exclusive,
    /// and an empty selection must say `all`, so a forgotten flag never empties the
    /// whole DLQ; an empty `error_contains` (it would match every dead job, as from
    /// `--error "$UNSET"`) is refused for the same reason. The error text is
    /// suitable for a `bad_request` message.
    pub fn check_mutation(&self) -> Result<(), String> {
        if self.error_contains.as_deref() == Some("") {
            return Err("error_contains is empty, which matches every dead job; give the text to look for, or leave it out".into());
        }
        if !self.ids.is_empty() && (self.has_filter() || self.all) {
            return Err("give either job ids or a filter (queue, tenant, error_contains, since_secs, all), not both".into());
        }
        if self.ids.is_empty() && !self.has_filter() && !self.all {
            return Err("empty selection: name job ids, a filter, or set all".into());
        }
        Ok(())
    }
}

/// Job payload bytes on the wire: UTF-8 text as is, anything else in standard base64.
/// Serialized as `{"text":"..."}` or `{"base64":"..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Payload {
    /// UTF-8 text.
    Text(String),
    /// Arbitrary bytes, standard base64 with padding (RFC 4648 §4).
    Base64(String),
}

impl Payload {
    /// The most readable encoding of `bytes` that costs no more than base64: text
    /// when it is valid UTF-8 and its JSON string is no longer than the base64 (4
    /// bytes per 3), else base64. So a payload of N bytes never takes more than
    /// base64's 4 × ⌈N / 3⌉ bytes of a frame, while text escaped in JSON would take
    /// up to 6 per byte (`\u0000`).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        let base64_len = bytes.len().div_ceil(3) * 4;
        match String::from_utf8(bytes) {
            Ok(text) if json_string_len(&text) <= base64_len => Payload::Text(text),
            Ok(text) => Payload::Base64(BASE64.encode(text)),
            Err(e) => Payload::Base64(BASE64.encode(e.as_bytes())),
        }
    }

    /// The payload's size in bytes once decoded: the text's length, or 3 bytes per 4
    /// base64 characters less the padding (for valid base64).
    pub fn size(&self) -> usize {
        match self {
            Payload::Text(text) => text.len(),
            Payload::Base64(b64) => {
                let padding = b64.bytes().rev().take_while(|&b| b == b'=').count();
                (b64.len() / 4 * 3).saturating_sub(padding)
            }
        }
    }

    /// The payload bytes. Errors (with the decoder's reason) on invalid base64.
    pub fn into_bytes(self) -> Result<Vec<u8>, String> {
        match self {
            Payload::Text(text) => Ok(text.into_bytes()),
            Payload::Base64(b64) => BASE64
                .decode(b64.as_bytes())
                .map_err(|e| format!("payload is not valid base64: {e}")),
        }
    }
}

/// The bytes `text` takes as a JSON string, escapes included, quotes not.
fn json_string_len(text: &str) -> usize {
    // Serializing a string cannot fail.
    serde_json::to_string(text).map_or(usize::MAX, |quoted| quoted.len() - 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_op_names_are_not_known() {
        assert!(Request::is_known_op("dlq_redrive"));
        assert!(!Request::is_known_op(""));
        assert!(!Request::is_known_op("dlq_redrivez"));
    }

    #[test]
    fn payload_round_trips_text_and_binary() {
        let text = Payload::from_bytes(b"hello".to_vec());
        assert_eq!(text, Payload::Text("hello".into()));
        let bin = Payload::from_bytes(vec![0xff, 0x00, 0x10]);
        assert!(matches!(bin, Payload::Base64(_)));
        assert_eq!(bin.into_bytes(), Ok(vec![0xff, 0x00, 0x10]));
        assert!(Payload::Base64("***".into()).into_bytes().is_err());
    }

    #[test]
    fn text_that_escapes_to_more_than_base64_goes_as_base64() {
        let json = br#"{"to":"a@b.c"}"#.to_vec();
        assert_eq!(
            Payload::from_bytes(json),
            Payload::Text(r#"{"to":"a@b.c"}"#.into())
        );
        for bytes in [vec![0u8; 1 << 20], b"a\n".repeat(1000)] {
            let payload = Payload::from_bytes(bytes.clone());
            let Payload::Base64(b64) = &payload else {
                panic!("{} bytes as text", bytes.len());
            };
            assert_eq!(b64.len(), bytes.len().div_ceil(3) * 4);
            assert_eq!(payload.into_bytes(), Ok(bytes));
        }
    }

    #[test]
    fn size_counts_the_decoded_bytes() {
        for n in 0..7 {
            let bytes = vec![0xffu8; n];
            assert_eq!(
                Payload::from_bytes(bytes.clone()).size(),
                n,
                "{n} binary bytes"
            );
            assert_eq!(Payload::Text("é".repeat(n)).size(), 2 * n);
        }
    }

    #[test]
    fn empty_selection_is_refused_for_mutation_unless_all() {
        let empty = DlqSelection::default();
        assert!(empty.check_mutation().is_err());
        let all = DlqSelection {
            all: true,
            ..DlqSelection::default()
        };
        assert!(all.check_mutation().is_ok());
        let ids = DlqSelection::of_ids(vec!["a".into()]);
        assert!(ids.check_mutation().is_ok());
        let mixed = DlqSelection {
            queue: Some("email".into()),
            ..ids
        };
        assert!(mixed.check_mutation().is_err());
    }
}
