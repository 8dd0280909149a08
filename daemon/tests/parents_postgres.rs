//! Children seeing their parents (`parents.rs`) with qd on PostgreSQL: the same
//! tests, run against a fresh database of the run's throw-away cluster
//! (`common::on_postgres` picks the backend from this binary's name).

#[path = "parents.rs"]
mod parents;
