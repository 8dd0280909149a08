//! qd: a durable job queue and its supervised worker fleet in one daemon.
//!
//! The pure core ([`job`], [`backoff`], [`scheduler::fair`]) holds the job life
//! cycle and the fair-share decision; the actors ([`supervisor`], [`broker`],
//! [`scheduler`], [`lease_reaper`], [`dlq`], [`worker_pool`]) translate between that
//! core, the durable [`store`] and the outside world ([`api`], [`admin_server`]).

pub mod admin_server;
pub mod backoff;
pub mod clock;
pub mod config;
pub mod executor;
pub mod job;
pub mod metrics;
pub mod notify;
pub mod scheduler;
pub mod store;
