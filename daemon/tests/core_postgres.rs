//! The core delivery contract (`core.rs`) with qd on PostgreSQL: the same tests,
//! run by the harness against a fresh database of the run's throw-away cluster
//! (`common::on_postgres` picks the backend from this binary's name).

#[path = "core.rs"]
mod core;
