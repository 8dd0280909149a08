//! Job dependencies (`dependencies.rs`) with qd on PostgreSQL: the same tests, run
//! against a fresh database of the run's throw-away cluster (`common::on_postgres`
//! picks the backend from this binary's name). The cluster's own tests (several
//! nodes, `SIGKILL`s during a fan-in) are in `dependencies_cluster.rs`.

#[path = "dependencies.rs"]
mod dependencies;
