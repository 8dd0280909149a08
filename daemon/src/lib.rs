//! qd: a durable job queue and its supervised worker fleet in one daemon.
//!
//! The pure core ([`job`], [`backoff`], [`scheduler::fair`]) holds the job life
//! cycle and the fair-share decision; the actors ([`supervisor`], [`broker`],
//! [`dlq`], [`worker_pool`], [`pruner`]) translate between that
//! core, the durable [`store`] and the outside world ([`api`], [`admin`]).

pub mod admin;
pub mod admin_server;
pub mod api;
pub mod attempt_groups;
pub mod backoff;
pub mod backup;
pub mod broker;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod console;
pub mod daemon;
pub mod data_lock;
pub mod deps;
pub mod dlq;
pub mod executor;
pub mod fence;
pub mod gauges;
pub mod job;
pub mod limits;
pub mod log_every;
pub mod machine;
pub mod metrics;
pub mod notify;
pub mod periodic;
pub mod priority;
pub mod pruner;
pub mod rate_limit;
pub mod reload;
pub mod results;
pub mod schedule;
pub mod scheduler;
pub mod store;
pub mod supervisor;
pub mod worker_pool;
