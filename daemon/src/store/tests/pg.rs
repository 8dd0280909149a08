//! The throw-away PostgreSQL cluster of the integration tests
//! (`daemon/tests/common/pg.rs`), included by path, for the store's own tests.

#[allow(dead_code)]
#[path = "../../../tests/common/tools.rs"]
mod tools;

#[allow(dead_code)]
#[path = "../../../tests/common/pg.rs"]
mod cluster;

pub(super) use cluster::{Database, database};
