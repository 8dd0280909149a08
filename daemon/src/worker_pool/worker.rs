//! A Worker actor: lease → run the executor (heartbeating) → ack or nack, repeat.
//!
//! It asks for one job of its queue with a long poll ([`broker::lease`]), runs it with the
//! queue's executor while renewing the lease every `heartbeat`, and reports the
//! result to the Broker only after the executor finished — ack after the effect.
//! If a heartbeat is refused (the lease was lost to expiry), the attempt is cut
//! short: its result could not be accepted anyway. If the result cannot be written
//! (the store refuses writes: disk full, I/O error), the worker keeps the lease alive
//! with heartbeats and retries the report every `heartbeat` (at most every
//! [`REPORT_RETRY`]) until it is written
//! or the lease is lost: qd's own store failure is never charged to the job.
//!
//! On a cluster node that is fenced (`fence.rs`: no heartbeat written for
//! `node_timeout`) the worker stops its running attempt as an operator's cancel
//! does (SIGTERM, SIGKILL after `kill_grace`; a webhook request is aborted) and
//! reports it as interrupted, uncharged: the leader may hand the job to another
//! node, and the store refuses the report as stale if it did. It leases nothing
//! until the fence is lifted.
//!
//! Messages ([`WorkerMsg`]): only `Next`, sent to itself, so each lease→run→report
//! cycle is one message and a `stop()` (scale-down) takes effect between jobs.
//! Supervised by its WorkerPool, which restarts it after a panic and tells the
//! Broker to fail whatever it held.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::PoolMsg;
use crate::broker::{self, BrokerError, BrokerMsg, LeaseRequest, LeasedJob};
use crate::executor::{ExecResult, Executors, JobRun};
use crate::fence;
use crate::job::Failure;
use crate::limits::Limits;

/// How long a worker waits in one long poll for a job.
const POLL: Duration = Duration::from_secs(5);
/// How long an ack, nack or heartbeat may take to be answered.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a result the store could not write is reported again.
const REPORT_RETRY: Duration = Duration::from_secs(1);

/// What a worker is started with.
#[derive(Clone)]
pub struct WorkerArgs {
    /// Its id, `"QUEUE/N"`; recorded as the lease holder.
    pub id: String,
    /// The queue it leases from.
    pub queue: Arc<str>,
    /// Every queue's executor; this worker looks its queue's up for each attempt, so
    /// a reload applies to the next attempt.
    pub executors: Arc<Executors>,
    /// Owner of the config in force (the queue's heartbeat interval).
    pub limits: Arc<Limits>,
    /// Its pool, told when the worker is busy or idle.
    pub pool: ActorRef<PoolMsg>,
    /// Cancelled when the pool drains: take no new job.
    pub draining: CancellationToken,
    /// Cancelled when the shutdown grace ran out: interrupt the running job.
    pub interrupt: CancellationToken,
    /// Test hook (`QD_TEST_HOOKS=1`): panic on a job whose payload asks for it.
    pub test_hooks: bool,
    /// The store, read for a job's parents when the executor hands them on.
    pub store: crate::store::Store,
}

/// Messages a worker takes.
pub enum WorkerMsg {
    /// Lease and run the next job.
    Next,
}

/// The worker actor.
pub struct Worker;

impl Actor for Worker {
    type Msg = WorkerMsg;
    type State = WorkerArgs;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<WorkerMsg>,
        args: WorkerArgs,
    ) -> Result<WorkerArgs, ActorProcessingErr> {
        myself.cast(WorkerMsg::Next)?;
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<WorkerMsg>,
        _msg: WorkerMsg,
        state: &mut WorkerArgs,
    ) -> Result<(), ActorProcessingErr> {
        if state.draining.is_cancelled() {
            myself.stop(Some("pool draining".into()));
            return Ok(());
        }
        if fence::is_fenced() {
            // No lease while fenced: wait for the fence to lift (or the pool to drain).
            tokio::select! {
                () = tokio::time::sleep(fence::CHECK_EVERY * 2) => {}
                () = state.draining.cancelled() => {}
            }
        } else if let Some(job) = lease(state).await {
            let revoked = CancellationToken::new();
            let running = Some((job.id, revoked.clone()));
            let _ = state.pool.cast(PoolMsg::Busy(state.id.clone(), running));
            let result = run(state, &job, &revoked).await;
            report(state, &job, result).await;
            let _ = state.pool.cast(PoolMsg::Busy(state.id.clone(), None));
        }
        myself.cast(WorkerMsg::Next)?;
        Ok(())
    }
}

/// The parents of job `id` as its attempt sees them (one store read). A store
/// that cannot be read is qd's failure, not the job's: the attempt is given back
/// uncharged (interrupted) before it starts.
async fn parents_of(
    state: &WorkerArgs,
    id: crate::job::JobId,
) -> Result<Vec<crate::results::ParentBody>, Failure> {
    if !state.store.may_hold_parents() {
        return Ok(Vec::new());
    }
    match state.store.run(move |b| b.parents_of(&[id])).await {
        Ok(mut lists) => Ok(crate::results::ParentBody::list(
            lists.pop().unwrap_or_default(),
        )),
        Err(e) => Err(Failure::Interrupted {
            reason: format!("the job's parents could not be read: {e}"),
        }),
    }
}

/// One long poll for a job of the worker's queue; `None` when nothing came.
async fn lease(state: &WorkerArgs) -> Option<LeasedJob> {
    let request = LeaseRequest {
        worker: state.id.clone(),
        max_jobs: 1,
        wait: POLL,
    };
    tokio::select! {
        answer = broker::lease(&state.queue, request) => match answer {
            Ok(jobs) => jobs.into_iter().next(),
            Err(_) => {
                // Restarting: ask again shortly rather than spin.
                tokio::time::sleep(Duration::from_millis(200)).await;
                None
            }
        },
        _ = state.draining.cancelled() => None,
    }
}

/// The queue's heartbeat interval in the config in force (read at each use, so a
/// reload reaches the next beat); 10 s if the queue left the config.
fn heartbeat_every(state: &WorkerArgs) -> Duration {
    state
        .limits
        .config()
        .queues
        .get(&*state.queue)
        .map_or(Duration::from_secs(10), |q| q.heartbeat)
}

/// Runs the executor, heartbeating; a refused heartbeat interrupts the attempt, and
/// `revoked` (an operator's cancel, from the pool) stops it gracefully.
async fn run(state: &WorkerArgs, job: &LeasedJob, revoked: &CancellationToken) -> ExecResult {
    if state.test_hooks {
        test_hook(job);
    }
    let run = JobRun {
        id: job.id,
        queue: job.queue.clone(),
        tenant: job.tenant.clone(),
        attempt: job.attempt,
        idempotency_key: job.idempotency_key.clone(),
        payload: job.payload.clone(),
        max_result: state
            .limits
            .config()
            .queues
            .get(&*state.queue)
            .map_or(crate::results::DEFAULT_MAX_RESULT, |q| q.max_result),
        token: job.token,
        lease: job.lease,
        parents: None,
    };
    let Some(executor) = state.executors.get(&state.queue) else {
        return ExecResult::Failure(Failure::Interrupted {
            reason: "the queue no longer has in-process workers (config reloaded)".into(),
        });
    };
    let mut run = run;
    if executor.wants_parents() {
        match parents_of(state, job.id).await {
            Ok(parents) => run.parents = Some(parents),
            Err(failure) => return ExecResult::Failure(failure),
        }
    }
    if fence::is_fenced() {
        return fenced_result();
    }
    let every = heartbeat_every(state);
    let cancel = state.interrupt.child_token();
    // Fencing stops the attempt as an operator's cancel does (graceful).
    let stop = revoked.child_token();
    let exec = executor.run(&run, &cancel, &stop);
    tokio::pin!(exec);
    let start = tokio::time::Instant::now() + every;
    let mut beats = tokio::time::interval_at(start, every);
    let mut fenced = false;
    loop {
        tokio::select! {
            result = &mut exec => return if fenced { fenced_result() } else { result },
            _ = beats.tick() => heartbeat(job, &cancel).await,
            () = fence::fenced(), if !fenced => {
                fenced = true;
                warn!(queue = %job.queue, job = %job.id, "This node is fenced; stopping the attempt.");
                stop.cancel();
            }
        }
    }
}

/// The report of an attempt stopped because this node was fenced: uncharged.
fn fenced_result() -> ExecResult {
    ExecResult::Failure(Failure::Interrupted {
        reason: "this node wrote no heartbeat for node_timeout (cut off from the database \
                 or frozen) and stopped the attempt before another node may run the job"
            .to_owned(),
    })
}

async fn heartbeat(job: &LeasedJob, cancel: &CancellationToken) {
    let (id, token) = (job.id, job.token);
    match broker::request(
        |tx| BrokerMsg::Heartbeat(id, token, None, tx),
        REPORT_TIMEOUT,
    )
    .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => {
            warn!(queue = %job.queue, job = %id, error = %err, "Heartbeat refused; the lease was lost, stopping the attempt.");
            cancel.cancel();
        }
        Err(err) => {
            debug!(job = %id, error = %err, "Heartbeat not answered; retrying at the next beat.")
        }
    }
}

/// Acks or nacks (a throttled nack pauses the queue's rate limiter: see
/// `broker::events::throttled`), again and again while the store cannot write it.
async fn report(state: &WorkerArgs, job: &LeasedJob, result: ExecResult) {
    let (id, token) = (job.id, job.token);
    let lost = CancellationToken::new();
    loop {
        let answer = match &result {
            ExecResult::Success {
                result: Some(result),
                ..
            } => {
                let result: Arc<[u8]> = Arc::from(result.as_slice());
                broker::request(
                    |tx| BrokerMsg::AckResult(id, token, result, tx),
                    REPORT_TIMEOUT,
                )
                .await
            }
            ExecResult::Success { result: None, .. } => {
                broker::request(|tx| BrokerMsg::Ack(id, token, tx), REPORT_TIMEOUT).await
            }
            ExecResult::Failure(failure) => {
                let failure = failure.clone();
                broker::request(|tx| BrokerMsg::Nack(id, token, failure, tx), REPORT_TIMEOUT).await
            }
        };
        match answer {
            Ok(Ok(())) => return,
            Ok(Err(BrokerError::Store(err))) => {
                static LOG: crate::log_every::Every =
                    crate::log_every::Every::new(crate::log_every::STORE_ERRORS);
                if let Some(left_out) = LOG.due() {
                    warn!(job = %id, error = %err, earlier_not_logged = left_out, "Result not written (the store refuses writes); keeping the lease and retrying.")
                }
            }
            Ok(Err(err)) => {
                debug!(job = %id, error = %err, "Result refused (lease lost); another attempt owns the job.");
                return;
            }
            Err(err) => {
                warn!(job = %id, error = %err, "Result not recorded; the job is redelivered when its lease expires.");
                return;
            }
        }
        heartbeat(job, &lost).await;
        if lost.is_cancelled() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(heartbeat_every(state).min(REPORT_RETRY)) => {}
            _ = state.interrupt.cancelled() => return,
        }
    }
}

/// `QD_TEST_HOOKS=1` only: a payload `qd-test:panic-on-attempt:N` panics the worker
/// on attempt N, to test that a crashed worker's job is retried, not lost.
fn test_hook(job: &LeasedJob) {
    let payload = String::from_utf8_lossy(&job.payload);
    if let Some(n) = payload.trim().strip_prefix("qd-test:panic-on-attempt:")
        && n.parse::<u32>().ok() == Some(job.attempt)
    {
        panic!("test hook: worker panics on attempt {}", job.attempt);
    }
}
