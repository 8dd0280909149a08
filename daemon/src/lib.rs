//! qd: a durable job queue and its supervised worker fleet in one daemon.
//!
//! The pure core ([`job`], [`backoff`]) holds the job life cycle; the actors
//! (supervisor, broker, scheduler, lease reaper, DLQ, worker pools) translate
//! between that core, the durable [`store`] and the outside world.

pub mod backoff;
pub mod clock;
pub mod executor;
pub mod job;
pub mod scheduler;
pub mod store;
