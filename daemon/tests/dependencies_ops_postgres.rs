//! The operator's side of job dependencies (`dependencies_ops.rs`) with qd on
//! PostgreSQL: the same tests, run against a fresh database of the run's
//! throw-away cluster (`common::on_postgres` picks the backend from this
//! binary's name).

#[path = "dependencies_ops.rs"]
mod dependencies_ops;
