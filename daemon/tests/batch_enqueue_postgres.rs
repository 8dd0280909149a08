//! `batch_enqueue.rs` with qd on PostgreSQL (the harness picks the backend from this binary's
//! name: `common::on_postgres`).

#[path = "batch_enqueue.rs"]
mod batch_enqueue;
