//! What the Broker's state asks for while it handles one message, performed by the
//! Broker actor afterwards: store operations (each with the completion that turns
//! the store's answer into messages back to the Broker), local lease records, the
//! Scheduler notifications ([`Outbox`]) and a new time for the lease timer. [`super::state::BrokerState::take`]
//! returns them instead of doing any of it, so the state machine can be driven
//! message by message and its I/O run (or held back, or reordered) by whoever
//! drives it: the actor ([`Effects::perform`]) or a test.
//!
//! Replies to the message being handled still go straight to its reply port.

use std::marker::PhantomData;
use std::sync::Arc;

use super::BrokerMsg;
use super::events::Outbox;
use crate::job::Job;
use crate::store::{Backend, Store, StoreError};

/// Where a completion sends its messages: the Broker's mailbox (a test's channel).
pub(crate) type Back = Arc<dyn Fn(BrokerMsg) + Send + Sync>;

/// Everything one Broker message asks for, in the order it was asked.
#[derive(Default)]
#[must_use = "a Broker message's store writes and notifications happen only when performed"]
pub(crate) struct Effects {
    /// Store effects, submitted in this order (the writer runs them in this order).
    pub(crate) store: Vec<StoreEffect>,
    /// Scheduler notifications, sent after the store effects were submitted.
    pub(crate) notify: Outbox,
    /// Arm the lease timer to send `Tick` at this instant, replacing the armed one
    /// (kept by the actor; [`Effects::perform`] leaves it to the caller).
    pub(crate) timer: Option<tokio::time::Instant>,
}

impl Effects {
    /// Submits the store effects to `store` (completions answer through `back`),
    /// then sends the Scheduler notifications, one actor message per queue.
    pub(crate) fn perform(mut self, store: &Store, back: &Back) {
        for effect in self.store {
            match effect {
                StoreEffect::Write(write) => write.submit(store, Arc::clone(back)),
                StoreEffect::RecordLeases(jobs) => store.record_leases_later(jobs),
            }
        }
        self.notify.flush();
    }

    /// [`Self::perform`] as it goes when the store refuses this message's writes (a
    /// full disk): no operation runs, each completion gets `err`. Lease records are
    /// kept (they live in the store's memory, not on its disk).
    #[cfg(test)]
    pub(crate) fn perform_refused(mut self, store: &Store, back: &Back, err: &StoreError) {
        for effect in self.store {
            match effect {
                StoreEffect::Write(write) => write.refuse(err.clone(), back),
                StoreEffect::RecordLeases(jobs) => store.record_leases_later(jobs),
            }
        }
        self.notify.flush();
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
        StoreEffect::Write(Box::new(Op {
            run,
            done,
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
    answer: PhantomData<fn() -> R>,
}

impl<R, Run, Done> Write for Op<R, Run, Done>
where
    R: Send + 'static,
    Run: FnOnce(&mut dyn Backend) -> Result<R, StoreError> + Send + 'static,
    Done: FnOnce(Result<R, StoreError>, &Back) + Send + 'static,
{
    fn submit(self: Box<Self>, store: &Store, back: Back) {
        let Op { run, done, .. } = *self;
        store.submit(run, move |result| done(result, &back));
    }

    #[cfg(test)]
    fn refuse(self: Box<Self>, err: StoreError, back: &Back) {
        (self.done)(Err(err), back);
    }
}
