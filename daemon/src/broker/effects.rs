//! What the Broker's state asks for while it handles one message, performed by the
//! Broker actor afterwards: store operations (each with the completion that turns
//! the store's answer into messages back to the Broker), local lease records, the
//! message's replies and a new time for the Broker's timer. [`super::state::BrokerState::take`] returns them
//! instead of doing any of it, so the state machine can be driven message by message
//! and its I/O run, or refused, by whoever drives it: the actor
//! ([`Effects::perform`]) or a test. They must be performed in order and before
//! the next message's: the completions' logic relies on the writer running store
//! operations in the order they were asked for.
//!
//! Every reply the message gives is an effect, sent after its store effects were
//! handed over, so none overtakes them (a lease answered from memory must not: its
//! record is what readers find). A reply that waits for a store write is given by
//! that write's completion instead, on the writer thread once the write is durable,
//! so its caller does not wait for the Broker's mailbox.

use std::marker::PhantomData;
use std::sync::Arc;

use super::BrokerMsg;
use crate::job::Job;
use crate::store::{Backend, DepthLock, Store, StoreError};

/// Where a completion sends its messages: the Broker's mailbox (a test's channel).
pub(crate) type Back = Arc<dyn Fn(BrokerMsg) + Send + Sync>;

/// A reply sent once the message's store effects were handed to the store; it may
/// send messages back (e.g. the lessee went away).
pub(crate) type Reply = Box<dyn FnOnce(&Back) + Send>;

/// Everything one Broker message asks for, in the order it is to be performed.
#[must_use = "a Broker message's store writes and notifications happen only when performed"]
pub(crate) struct Effects {
    /// Store effects, handed to the store in this order: operations run in this
    /// order, and lease records are written by the writer's next batch, before any
    /// operation handed over after them.
    pub(crate) store: Vec<StoreEffect>,
    /// Replies, sent after the store effects were handed over.
    pub(crate) replies: Vec<Reply>,
    /// Arm the Broker's timer to send `Tick` at this instant, replacing the armed one
    /// (kept by the actor; [`Effects::perform`] leaves it to the caller, and until
    /// some `Tick` arrives the state believes a timer armed for it).
    pub(crate) timer: Option<tokio::time::Instant>,
}

impl Effects {
    /// Hands the store effects to `store` (completions answer through `back`), then
    /// sends the replies.
    pub(crate) fn perform(self, store: &Store, back: &Back) {
        self.perform_with(store, back, |write| write.submit(store, Arc::clone(back)));
    }

    /// [`Self::perform`] as it goes when the store refuses the batch holding this
    /// message's operations (a full disk): no operation runs, each completion gets
    /// `err`. Lease records are handed over as usual: the writer puts back the records
    /// a failed batch took, for its next batch.
    #[cfg(test)]
    pub(crate) fn perform_refused(self, store: &Store, back: &Back, err: &StoreError) {
        self.perform_with(store, back, |write| write.refuse(err.clone(), back));
    }

    /// Performs everything in order, each store operation through `write`.
    fn perform_with(self, store: &Store, back: &Back, mut write: impl FnMut(Box<dyn Write>)) {
        for effect in self.store {
            match effect {
                StoreEffect::Write(op) => write(op),
                StoreEffect::RecordLeases(jobs) => store.record_leases_later(jobs),
            }
        }
        for reply in self.replies {
            reply(back);
        }
    }
}

/// One thing for the store.
pub(crate) enum StoreEffect {
    /// An operation for the writer thread ([`Store::submit`]) and its completion.
    Write(Box<dyn Write>),
    /// Leases handed out from memory, recorded by the writer's next batch before
    /// any operation in it ([`Store::record_leases_later`]).
    RecordLeases(Vec<Job>),
}

impl StoreEffect {
    /// `run` on the writer thread, then `done` with its result (or the batch's
    /// commit error), which sends what follows to the Broker through its `back`.
    pub(crate) fn write<R, Run, Done>(run: Run, done: Done) -> StoreEffect
    where
        R: Send + 'static,
        Run: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
        Done: FnOnce(Result<R, StoreError>, &Back) + Send + 'static,
    {
        Self::write_locking_depth(Vec::new(), run, done)
    }

    /// [`StoreEffect::write`] of an operation that takes the `max_depth` locks
    /// `locks` in the store ([`Store::submit_locking_depth`]).
    pub(crate) fn write_locking_depth<R, Run, Done>(
        locks: Vec<DepthLock>,
        run: Run,
        done: Done,
    ) -> StoreEffect
    where
        R: Send + 'static,
        Run: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
        Done: FnOnce(Result<R, StoreError>, &Back) + Send + 'static,
    {
        StoreEffect::Write(Box::new(Op {
            run,
            done,
            depth_locks: locks,
            answer: PhantomData,
        }))
    }
}

/// A store operation with its completion, its result type erased.
pub(crate) trait Write: Send {
    /// Queues the operation on `store`; its completion answers through `back`.
    fn submit(self: Box<Self>, store: &Store, back: Back);
    /// Answers the completion with `err` without running the operation.
    #[cfg(test)]
    fn refuse(self: Box<Self>, err: StoreError, back: &Back);
}

struct Op<R, Run, Done> {
    run: Run,
    done: Done,
    depth_locks: Vec<DepthLock>,
    answer: PhantomData<fn() -> R>,
}

impl<R, Run, Done> Write for Op<R, Run, Done>
where
    R: Send + 'static,
    Run: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
    Done: FnOnce(Result<R, StoreError>, &Back) + Send + 'static,
{
    fn submit(self: Box<Self>, store: &Store, back: Back) {
        let Op {
            run,
            done,
            depth_locks,
            ..
        } = *self;
        store.submit_locking_depth(depth_locks, run, move |result| done(result, &back));
    }

    #[cfg(test)]
    fn refuse(self: Box<Self>, err: StoreError, back: &Back) {
        (self.done)(Err(err), back);
    }
}
