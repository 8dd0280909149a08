//! The closed label-value sets of qd's metrics: each enum is every value one label
//! may take, with its exported spelling. Attempt outcomes reuse [`crate::job::Outcome`].

/// Final state of a job, the `outcome` label of `qd_jobs_completed_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Completion {
    /// Acked by a worker.
    Succeeded,
    /// Dead-lettered (budget spent or permanent error).
    Dead,
    /// Removed by an operator.
    Cancelled,
}

impl Completion {
    /// Every value, for tests and pre-registration.
    pub const ALL: [Completion; 3] = [
        Completion::Succeeded,
        Completion::Dead,
        Completion::Cancelled,
    ];

    /// The exported label value (`"succeeded"`, `"dead"`, `"cancelled"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Completion::Succeeded => "succeeded",
            Completion::Dead => "dead",
            Completion::Cancelled => "cancelled",
        }
    }
}

/// Which jobs a `qd_queue_depth` series counts, its `state` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DepthState {
    /// Waiting for a worker.
    Ready,
    /// Waiting for `ready_at` (requested delay or retry backoff).
    Delayed,
    /// Held by a worker under a lease.
    Leased,
    /// In the dead-letter queue.
    Dead,
    /// Waiting for a parent named in `after`.
    Waiting,
    /// Blocked by a dead or cancelled parent.
    Blocked,
}

impl DepthState {
    /// Every value, for tests and for callers that publish a full snapshot.
    pub const ALL: [DepthState; 6] = [
        DepthState::Ready,
        DepthState::Delayed,
        DepthState::Leased,
        DepthState::Dead,
        DepthState::Waiting,
        DepthState::Blocked,
    ];

    /// The exported label value (`"ready"`, `"delayed"`, `"leased"`, `"dead"`,
    /// `"waiting"`, `"blocked"`).
    pub fn as_str(self) -> &'static str {
        match self {
            DepthState::Ready => "ready",
            DepthState::Delayed => "delayed",
            DepthState::Leased => "leased",
            DepthState::Dead => "dead",
            DepthState::Waiting => "waiting",
            DepthState::Blocked => "blocked",
        }
    }
}

/// Why an enqueue was refused, the `reason` label of `qd_enqueue_rejected_total`.
/// Backpressure reasons first, then failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The queue is at its `max_depth`.
    QueueFull,
    /// The tenant is at its `max_depth` in this queue.
    TenantFull,
    /// The payload is larger than the configured limit.
    PayloadTooLarge,
    /// The daemon is draining and takes no new work.
    ShuttingDown,
    /// The durable write failed; the job was not accepted.
    StoreError,
    /// The request was malformed (unknown queue, bad tenant name, bad delay, ...).
    BadRequest,
}

impl RejectReason {
    /// Every value, used by [`super::register_queue`] to create the counters at 0.
    pub const ALL: [RejectReason; 6] = [
        RejectReason::QueueFull,
        RejectReason::TenantFull,
        RejectReason::PayloadTooLarge,
        RejectReason::ShuttingDown,
        RejectReason::StoreError,
        RejectReason::BadRequest,
    ];

    /// The exported label value (`"queue_full"`, `"tenant_full"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::QueueFull => "queue_full",
            RejectReason::TenantFull => "tenant_full",
            RejectReason::PayloadTooLarge => "payload_too_large",
            RejectReason::ShuttingDown => "shutting_down",
            RejectReason::StoreError => "store_error",
            RejectReason::BadRequest => "bad_request",
        }
    }
}
