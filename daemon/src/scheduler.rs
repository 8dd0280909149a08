//! The pure ordering cores behind each queue's dispatch
//! ([`crate::broker::dispatch`], owned by the Broker): [`fair::FairQueue`] (weighted
//! deficit round robin between tenants, per-tenant caps, priorities) and
//! [`delayed::DelayedJobs`] (jobs by due time). No actor, no clock, no I/O; no
//! messages.

pub mod delayed;
pub mod fair;
