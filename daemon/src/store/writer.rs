//! The writer thread and its group commit: block for the first request, drain up to
//! [`MAX_BATCH`] without waiting, run them all in one transaction (first the lease
//! records waiting for a batch, then each request in its own savepoint), commit once,
//! then answer every caller.
//!
//! Requests are type-erased [`Task`]s. A task answers its caller exactly once: after
//! the commit, or with the batch's error, or [`StoreError::Closed`] when it is dropped
//! unanswered (the writer died, or the store was closed before it was queued).

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::{self, JoinHandle};

use super::{Backend, DepthLock, Engine, MAX_BATCH, StoreError, WriterState};
use crate::job::Job;

/// The sending side of the writer's queue.
pub(crate) type Queue = Sender<Box<dyn Task>>;

/// One queued operation with its completion.
pub(crate) trait Task: Send {
    /// Runs the operation (once), turning a panic into an error. Returns its error, if
    /// any: then its savepoint is rolled back.
    fn run(&mut self, backend: &mut dyn Backend) -> Result<(), StoreError>;
    /// Answers the caller: with the operation's own result if the batch committed,
    /// else with the batch's error.
    fn answer(self: Box<Self>, commit: Result<(), StoreError>);
    /// The `max_depth` locks this operation takes inside the batch
    /// ([`super::SharedStore::queue_depth`], [`super::SharedStore::tenant_depth`]):
    /// the writer takes every such lock of a batch up front, in one order
    /// ([`Engine::lock_depths`]).
    fn depth_locks(&self) -> &[DepthLock] {
        &[]
    }
}

/// A [`Task`] made of a typed operation and its completion.
pub(crate) struct OpTask<R, Op, Done>
where
    Done: FnOnce(Result<R, StoreError>),
{
    op: Option<Op>,
    result: Option<Result<R, StoreError>>,
    done: Option<Done>,
    depth_locks: Vec<DepthLock>,
}

impl<R, Op, Done> OpTask<R, Op, Done>
where
    Done: FnOnce(Result<R, StoreError>),
{
    pub(crate) fn new(op: Op, done: Done) -> Self {
        OpTask {
            op: Some(op),
            result: None,
            done: Some(done),
            depth_locks: Vec::new(),
        }
    }

    /// Declares the depth locks the operation takes ([`Task::depth_locks`]).
    pub(crate) fn locking_depth(mut self, locks: Vec<DepthLock>) -> Self {
        self.depth_locks = locks;
        self
    }

    /// Calls the completion if it has not been called yet. A panicking completion is
    /// logged and contained: it must not take the writer (and every later caller) down.
    fn reply(&mut self, result: Result<R, StoreError>) {
        if let Some(done) = self.done.take()
            && panic::catch_unwind(AssertUnwindSafe(|| done(result))).is_err()
        {
            tracing::error!("Store completion panicked; the writer keeps serving.");
        }
    }
}

impl<R, Op, Done> Task for OpTask<R, Op, Done>
where
    R: Send,
    Op: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send,
    Done: FnOnce(Result<R, StoreError>) + Send,
{
    fn run(&mut self, backend: &mut dyn Backend) -> Result<(), StoreError> {
        let op = self
            .op
            .take()
            .expect("invariant: the writer runs each task once");
        let result = panic::catch_unwind(AssertUnwindSafe(|| op(backend))).unwrap_or_else(|p| {
            Err(StoreError::Other(format!(
                "store operation panicked: {}",
                panic_message(p.as_ref())
            )))
        });
        let outcome = result.as_ref().map(drop).map_err(StoreError::clone);
        self.result = Some(result);
        outcome
    }

    fn answer(mut self: Box<Self>, commit: Result<(), StoreError>) {
        let result = match commit {
            Ok(()) => self
                .result
                .take()
                .expect("invariant: a batch commits only after all its tasks ran"),
            Err(err) => Err(err),
        };
        self.reply(result);
    }

    fn depth_locks(&self) -> &[DepthLock] {
        &self.depth_locks
    }
}

impl<R, Op, Done> Drop for OpTask<R, Op, Done>
where
    Done: FnOnce(Result<R, StoreError>),
{
    fn drop(&mut self) {
        self.reply(Err(StoreError::Closed));
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-text panic payload")
}

/// Starts the writer thread over `engine`. It runs until every sender is dropped and
/// the queue is drained, then shuts the engine down.
pub(crate) fn spawn<E: Engine + 'static>(
    engine: E,
    counters: Arc<WriterState>,
) -> Result<(Queue, JoinHandle<()>), StoreError> {
    spawn_with(move || Ok(engine), counters)
}

/// [`spawn`] for an engine that must be opened on the writer thread itself (the
/// PostgreSQL engine owns a current-thread async runtime, which cannot be driven from
/// inside the caller's runtime). Blocks until `open` returned, and answers its error
/// (then no thread keeps running).
pub(crate) fn spawn_with<E, Open>(
    open: Open,
    counters: Arc<WriterState>,
) -> Result<(Queue, JoinHandle<()>), StoreError>
where
    E: Engine + 'static,
    Open: FnOnce() -> Result<E, StoreError> + Send + 'static,
{
    let (sender, receiver) = mpsc::channel();
    let (opened_tx, opened) = mpsc::sync_channel(1);
    let handle = thread::Builder::new()
        .name("qd-store".into())
        .spawn(move || match open() {
            Ok(engine) => {
                let _ = opened_tx.send(Ok(()));
                writer_loop(engine, &receiver, &counters);
            }
            Err(err) => {
                let _ = opened_tx.send(Err(err));
            }
        })
        .map_err(|err| StoreError::Other(format!("cannot start the store writer thread: {err}")))?;
    match opened.recv() {
        Ok(Ok(())) => Ok((sender, handle)),
        Ok(Err(err)) => {
            let _ = handle.join();
            Err(err)
        }
        Err(_) => {
            let _ = handle.join();
            Err(StoreError::Other(
                "the store writer thread died while opening the store".into(),
            ))
        }
    }
}

fn writer_loop<E: Engine>(
    mut engine: E,
    receiver: &Receiver<Box<dyn Task>>,
    counters: &WriterState,
) {
    while let Ok(first) = receiver.recv() {
        let mut batch = Vec::with_capacity(64);
        batch.push(first);
        batch.extend(receiver.try_iter().take(MAX_BATCH - 1));
        run_batch(&mut engine, batch, counters);
    }
    engine.shutdown();
}

/// One transaction: every task runs, one commit, then every task is answered. The
/// lease records a failed batch took are put back for the next one: the rollback
/// undid them, and their leases stand.
fn run_batch<E: Engine>(engine: &mut E, mut batch: Vec<Box<dyn Task>>, counters: &WriterState) {
    counters.batches.fetch_add(1, Ordering::Relaxed);
    let started = std::time::Instant::now();
    let mut leases = Vec::new();
    let outcome = engine
        .begin()
        .and_then(|()| lock_depths(engine, &batch))
        .and_then(|()| {
            leases = std::mem::take(&mut *counters.unrecorded());
            record(engine, &leases)
        })
        .and_then(|()| run_all(engine, &mut batch, counters))
        .and_then(|()| engine.commit());
    match &outcome {
        Ok(()) => {
            counters.commits.fetch_add(1, Ordering::Relaxed);
        }
        Err(err) => {
            static LOG: crate::log_every::Every =
                crate::log_every::Every::new(crate::log_every::STORE_ERRORS);
            if let Some(left_out) = LOG.due() {
                tracing::error!(%err, ops = batch.len(), earlier_not_logged = left_out, "Store batch rolled back; its callers get the error (logged at most every 10 s).");
            }
            engine.rollback();
            put_back(counters, leases);
        }
    }
    crate::metrics::store_batch(started.elapsed());
    for task in batch {
        task.answer(outcome.clone());
    }
}

/// Takes the depth locks the batch's operations declare, before the batch holds
/// any other lock (see [`Engine::lock_depths`]).
fn lock_depths<E: Engine>(engine: &mut E, batch: &[Box<dyn Task>]) -> Result<(), StoreError> {
    let mut locks: Vec<&DepthLock> = batch.iter().flat_map(|t| t.depth_locks()).collect();
    if locks.is_empty() {
        return Ok(());
    }
    locks.sort_unstable();
    locks.dedup();
    engine.lock_depths(&locks)
}

/// Puts `leases` back ahead of any handed over since they were taken.
fn put_back(counters: &WriterState, leases: Vec<Job>) {
    if leases.is_empty() {
        return;
    }
    let mut pending = counters.unrecorded();
    let later = std::mem::replace(&mut *pending, leases);
    pending.extend(later);
}

/// Writes lease records before the batch's ops, in their own savepoint: a refusal
/// is logged and rolled back, never the batch's failure.
fn record<E: Engine>(engine: &mut E, leases: &[Job]) -> Result<(), StoreError> {
    if leases.is_empty() {
        return Ok(());
    }
    engine.savepoint()?;
    match engine.record_leases(leases) {
        Ok(recorded) => {
            if !recorded.iter().all(|r| *r) {
                tracing::error!(
                    "A local lease was not recorded for readers: its job was not claimable in the store."
                );
            }
            engine.release()
        }
        Err(err) => {
            tracing::warn!(%err, "Local leases were not recorded for readers; they stand.");
            // As in `run_all`: when SQLite abandoned the transaction (SQLITE_FULL,
            // IOERR) the savepoint is gone too, and the batch's callers are told the
            // cause, not the failed rollback.
            engine.rollback_to().map_err(|_| err)
        }
    }
}

fn run_all<E: Engine>(
    engine: &mut E,
    batch: &mut [Box<dyn Task>],
    counters: &WriterState,
) -> Result<(), StoreError> {
    for task in batch {
        engine.savepoint()?;
        counters.ops.fetch_add(1, Ordering::Relaxed);
        match task.run(engine) {
            Ok(()) => engine.release()?,
            // SQLite abandons the whole transaction on some errors (SQLITE_FULL, IOERR,
            // NOMEM): then the savepoint is gone, the batch is lost, and the op's error
            // is the cause every caller of the batch is told.
            Err(op_error) => engine.rollback_to().map_err(|_| op_error)?,
        }
    }
    Ok(())
}
