//! A schedule's tick through the Broker ([`BrokerMsg::Fire`]): admitted and
//! counted as an enqueue is (`max_depth`, metrics, the hot payload), written in
//! one store operation with the schedule's compare-and-set of its next tick, the
//! overlap check and the record of the run, so the tick's job and the schedule's
//! advance commit together or not at all.

use ractor::RpcReplyPort;

use super::{BrokerMsg, BrokerState, first, reject_reason};
use crate::broker::{BrokerError, Fire, Fired};
use crate::job::{Job, State, UnixMillis};
use crate::metrics;
use crate::store::{Inserted, StoreError};

/// What the store operation of a fire did.
#[derive(Debug)]
pub enum FireWrite {
    /// The job was offered to the store (new, or a duplicate of the tick's job).
    Inserted(Inserted),
    /// `overlap = "skip"` and the previous run's job is unfinished: only the
    /// schedule advanced.
    SkippedOverlap,
    /// The stored next tick was not the one expected (another node, or a stale
    /// view): nothing was written.
    Stale,
}

impl BrokerState {
    pub(in crate::broker) fn fire(
        &mut self,
        fire: Fire,
        reply: RpcReplyPort<Result<Fired, BrokerError>>,
        now: UnixMillis,
    ) {
        let Fire {
            mut req,
            schedule,
            tick,
            advance,
            unless_running,
        } = fire;
        // The key carries the reserved `schedule:` prefix a producer may not use.
        let key = req.idempotency_key.take();
        let new = self.admit(&req).map(|mut new| {
            new.idempotency_key = key;
            new
        });
        let new = match new {
            Ok(new) => new,
            Err(err) => {
                metrics::enqueue_rejected(self.known_queue(&req.queue), reject_reason(&err));
                self.answer(reply, Err(err));
                return;
            }
        };
        let record = self.reserve(new, req.payload, now);
        let job = record.job.clone();
        let depth = self.depth_check([&job]);
        let check = depth.clone();
        self.write_enqueue(
            check.as_ref(),
            move |b| {
                if let Some(advance) = &advance
                    && !b.advance_schedule(advance)?
                {
                    return Ok((FireWrite::Stale, record.payload));
                }
                if let Some(previous) = unless_running
                    && let Some(detail) = b.job(previous)?
                    && matches!(
                        detail.job.state,
                        State::Delayed | State::Ready | State::Leased
                    )
                {
                    return Ok((FireWrite::SkippedOverlap, record.payload));
                }
                if let Some(depth) = &depth {
                    depth.check(b)?;
                }
                let inserted = b.enqueue(std::slice::from_ref(&record)).map(first)?;
                let id = match &inserted {
                    Inserted::New => record.job.id,
                    Inserted::Duplicate { id, .. } => *id,
                };
                b.record_schedule_run(&schedule, tick, id, now)?;
                Ok((FireWrite::Inserted(inserted), record.payload))
            },
            move |result, back| back(BrokerMsg::FireWritten(Box::new(job), result, reply)),
        );
    }

    pub(in crate::broker) fn fire_written(
        &mut self,
        job: Job,
        result: Result<(FireWrite, Vec<u8>), StoreError>,
        reply: RpcReplyPort<Result<Fired, BrokerError>>,
        now: UnixMillis,
    ) {
        self.unreserve(&job);
        match &result {
            Ok(_)
            | Err(
                StoreError::QueueFull { .. } | StoreError::TenantFull { .. } | StoreError::Busy(_),
            ) => self.store_accepted(now),
            Err(err) => self.store_refused(err),
        }
        let answer = match result {
            Ok((FireWrite::Inserted(inserted), payload)) => self
                .accept(job, Ok((inserted, payload)))
                .map(Fired::Enqueued),
            Ok((FireWrite::SkippedOverlap, _)) => Ok(Fired::SkippedOverlap),
            Ok((FireWrite::Stale, _)) => Ok(Fired::Stale),
            Err(err) => self.accept(job, Err(err)).map(Fired::Enqueued),
        };
        self.answer(reply, answer);
    }
}
