//! How a lessee asks for work and how a reader sees a queue's dispatch state: the
//! one entry point for in-process Workers, the HTTP lease API and the SQS receive,
//! and for `qctl queues`, the gauges, the autoscaler and SQS queue attributes.
//!
//! It owns no state: [`lease`] and [`dispatch_stats`] send the Broker, which owns
//! each queue's ready order ([`super::dispatch`]), its `Lease` and `DispatchStats`
//! messages and wait for the answer.

use std::time::Duration;

use super::{BrokerError, BrokerMsg, LeasedJob};
use crate::job::UnixMillis;

/// A lessee's request: up to `max_jobs`, waiting up to `wait` for the first one.
#[derive(Clone, Debug)]
pub struct LeaseRequest {
    /// The lessee's id (`"email/3"`, or an external worker's id).
    pub worker: String,
    /// At most this many jobs (>= 1).
    pub max_jobs: u32,
    /// Long-poll time, at most [`MAX_WAIT`]; zero answers at once.
    pub wait: Duration,
}

/// A snapshot of a queue's dispatch state.
#[derive(Clone, Debug, Default)]
pub struct DispatchStats {
    /// Jobs ready to run.
    pub ready: u64,
    /// Jobs waiting for their due time.
    pub delayed: u64,
    /// When the oldest ready job became ready (Unix ms).
    pub oldest_ready_at: Option<UnixMillis>,
    /// Lessees waiting in a long poll.
    pub waiting_lessees: usize,
    /// Whether an operator paused the queue.
    pub paused: bool,
}

/// The longest long poll a lessee may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// How much longer than its long poll a lease request may take to be answered
/// (the claim and the payload read) before the lessee gives up on it.
const ANSWER_GRACE: Duration = Duration::from_secs(30);

/// Leases up to `request.max_jobs` jobs of `queue`, waiting up to `request.wait`
/// (at most [`MAX_WAIT`]) for the first; empty when none came in time, the queue
/// is not configured, or qd is shutting down.
///
/// Errors: [`BrokerError::Unavailable`] when the Broker is not running
/// (restarting) or did not answer.
pub async fn lease(queue: &str, request: LeaseRequest) -> Result<Vec<LeasedJob>, BrokerError> {
    let timeout = request.wait.min(MAX_WAIT) + ANSWER_GRACE;
    let queue = queue.to_owned();
    super::request(|tx| BrokerMsg::Lease(queue, request, tx), timeout).await
}

/// The dispatch counts of `queue`, waiting up to `timeout` for them.
///
/// Errors: [`BrokerError::UnknownQueue`] for a queue that is not configured;
/// [`BrokerError::Unavailable`] when the Broker is not running or does not answer
/// within `timeout`.
pub async fn dispatch_stats(queue: &str, timeout: Duration) -> Result<DispatchStats, BrokerError> {
    let queue = queue.to_owned();
    super::request(|tx| BrokerMsg::DispatchStats(queue, tx), timeout).await?
}
