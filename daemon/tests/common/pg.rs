//! A throw-away PostgreSQL cluster for tests: one per test binary, started on first
//! use, a fresh database per test ([`database`]), so tests stay independent and fast.
//!
//! The cluster itself (initdb on a temp dir, a Unix socket only, fsync on, run as
//! the `postgres` user when root, stopped and removed when this process exits) is
//! `daemon/src/bin/shared/postgres.rs`, shared with `qd-bench --mode cluster`.
//! Missing binaries: [`database`] reports it through [`tools::tool_missing`] (fails
//! under `CI=true`, skips visibly elsewhere) and answers `None`. Used by
//! `daemon/tests/*` and, included by path, by the crate's store tests.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::tools;

#[allow(dead_code)]
#[path = "../../src/bin/shared/postgres.rs"]
mod postgres;

use postgres::Cluster;

/// How long the cluster may take to start on a busy machine.
const START_WITHIN: Duration = Duration::from_secs(120);

/// Server settings of the tests' cluster: many daemons at once, little memory.
const SETTINGS: [&str; 2] = ["max_connections=200", "shared_buffers=32MB"];

/// A fresh, empty database of the test run's cluster.
#[derive(Clone)]
pub struct Database {
    /// Its name (`qd_test_<pid>_<n>`).
    pub name: String,
    /// A libpq key=value connection string: `host=<socket dir> port=5432
    /// user=postgres dbname=<name>`.
    pub url: String,
    cluster: &'static Cluster,
}

impl Database {
    /// Runs SQL through `psql` against this database; panics with its output on
    /// failure. Returns what psql printed (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> String {
        self.cluster
            .psql(&self.name, sql)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Runs SQL through `psql` against the cluster's `postgres` database (for
    /// statements about this database, e.g. refusing connections to it).
    pub fn psql_admin(&self, sql: &str) -> String {
        self.cluster
            .psql("postgres", sql)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }
}

/// A fresh database on this test binary's cluster, started on first use; `None`
/// (after a visible skip, or a failure under `CI=true`) when PostgreSQL is not
/// installed. Panics if it is installed but does not start.
pub fn database() -> Option<Database> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let started = CLUSTER.get_or_init(|| {
        let bin = postgres::binaries()?;
        Some(Cluster::start(&bin, &SETTINGS, START_WITHIN).unwrap_or_else(|e| panic!("{e:#}")))
    });
    let Some(cluster) = started.as_ref() else {
        tools::tool_missing("PostgreSQL (initdb, postgres)", postgres::INSTALL_HINT);
        return None;
    };
    let name = format!(
        "qd_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    cluster
        .psql("postgres", &format!("CREATE DATABASE {name}"))
        .unwrap_or_else(|e| panic!("{e:#}"));
    Some(Database {
        url: cluster.url(&name),
        name,
        cluster,
    })
}
