//! How a lessee asks for work and how a reader sees a queue's dispatch state: the
//! one entry point for in-process Workers, the HTTP lease API and the SQS receive,
//! and for `qctl queues`, the gauges, the autoscaler and SQS queue attributes.
//!
//! It owns no state; [`lease`] and [`dispatch_stats`] send the queue's dispatcher
//! its `Lease` and `Stats` messages and wait for the answer, so callers do not
//! depend on which actor orders a queue's ready jobs.

use std::time::Duration;

use ractor::ActorRef;

use super::{BrokerError, LeasedJob};
use crate::job::UnixMillis;
use crate::scheduler::{self, SchedulerMsg};

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
/// (at most [`MAX_WAIT`]) for the first; empty when none came in time or the queue
/// is draining.
///
/// Errors: [`BrokerError::Unavailable`] when the queue's dispatcher is not running
/// (restarting, or the queue is not configured) or did not answer.
pub async fn lease(queue: &str, request: LeaseRequest) -> Result<Vec<LeasedJob>, BrokerError> {
    let timeout = request.wait.min(MAX_WAIT) + ANSWER_GRACE;
    call(queue, |tx| SchedulerMsg::Lease(request, tx), timeout).await
}

/// The dispatch state of `queue`, waiting up to `timeout` for it.
///
/// Errors: [`BrokerError::Unavailable`] when the queue's dispatcher is not running
/// or does not answer within `timeout`.
pub async fn dispatch_stats(queue: &str, timeout: Duration) -> Result<DispatchStats, BrokerError> {
    call(queue, SchedulerMsg::Stats, timeout).await
}

async fn call<T: Send + 'static>(
    queue: &str,
    build: impl FnOnce(ractor::RpcReplyPort<T>) -> SchedulerMsg,
    timeout: Duration,
) -> Result<T, BrokerError> {
    let actor = ActorRef::<SchedulerMsg>::where_is(scheduler::name(queue)).ok_or_else(|| {
        BrokerError::Unavailable(format!("queue {queue:?} has no dispatcher running"))
    })?;
    match actor.call(build, Some(timeout)).await {
        Ok(ractor::rpc::CallResult::Success(v)) => Ok(v),
        Ok(ractor::rpc::CallResult::Timeout) => Err(BrokerError::Unavailable(format!(
            "queue {queue:?}: no answer within {}",
            humantime::format_duration(timeout)
        ))),
        Ok(ractor::rpc::CallResult::SenderError) | Err(_) => Err(BrokerError::Unavailable(
            format!("queue {queue:?}: its dispatcher stopped while answering"),
        )),
    }
}
