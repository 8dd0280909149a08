//! The `cluster` mode: qd on PostgreSQL. It starts a throw-away PostgreSQL
//! (`shared/postgres.rs`: initdb on a temp dir, a Unix socket only, fsync on) or
//! uses the database of `--database-url`, then measures:
//!
//! - `cluster single`, `cluster batch`: one qd on SQLite beside one qd on
//!   PostgreSQL, the phases of the `single` and `batch` modes (enqueue only, drain,
//!   end to end, server CPU per job: qd's, plus PostgreSQL's processes when the
//!   bench started the server).
//! - `cluster nodes`: 1 node, then 2 nodes on one PostgreSQL, each node with its
//!   own pool of `workers`: `exec_jobs` command jobs that sleep 50 ms (enqueued in
//!   batches through every node; done when the script appended its line to a
//!   shared file), then no-op jobs through external consumers (P producers and C
//!   consumers per node, spread over the nodes), in batches of [`BATCH`] and request
//!   per job: the database's ceiling.
//!
//! Each phase gets a fresh database on the bench's own server (the nodes of one
//! phase share it); with `--database-url` every phase uses that database.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::load::{self, Phase, Plan, Spread};
use crate::modes::{BATCH, Settings, line_count, note_errors, phases, qd_target, wait_lines};
use crate::postgres::{self, Cluster};
use crate::probe;
use crate::qd_http::{Api, QdTarget};
use crate::report::{NODES, Report, STORES};
use crate::scratch::Scratch;
use crate::servers::{COMMAND_QUEUE, EXTERNAL_QUEUE, Node, Server};

/// How long the bench's PostgreSQL may take to start on a busy machine.
const START_WITHIN: Duration = Duration::from_secs(60);

/// How long a command job sleeps.
const JOB_SLEEP: &str = "0.05";

/// The PostgreSQL the cluster mode runs on.
pub enum Postgres {
    /// Started by the bench; a fresh database per phase.
    Own(Cluster),
    /// `--database-url`: every phase on that database.
    Given(String),
}

impl Postgres {
    /// Uses `given`, or starts a throw-away server. Errors: PostgreSQL is not
    /// installed (naming what to install), or it did not start (with its logs).
    pub async fn open(given: Option<&str>) -> Result<Postgres> {
        if let Some(url) = given {
            return Ok(Postgres::Given(url.to_owned()));
        }
        let bin = postgres::binaries().with_context(|| {
            format!(
                "PostgreSQL is not installed (no initdb on the PATH or in \
                 /usr/lib/postgresql/*/bin): {}, or pass --database-url",
                postgres::INSTALL_HINT
            )
        })?;
        let cluster =
            tokio::task::spawn_blocking(move || Cluster::start(&bin, &[], START_WITHIN)).await??;
        Ok(Postgres::Own(cluster))
    }

    /// The connection string of a database for one phase: a fresh one on the
    /// bench's server, else the given one.
    fn database(&self) -> Result<String> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        match self {
            Postgres::Given(url) => Ok(url.clone()),
            Postgres::Own(cluster) => {
                let name = format!("qd_bench_{}", NEXT.fetch_add(1, Ordering::Relaxed));
                cluster.psql("postgres", &format!("CREATE DATABASE {name}"))?;
                Ok(cluster.url(&name))
            }
        }
    }

    /// CPU seconds the bench's server (postmaster and backends) has used; 0 with
    /// `--database-url` (not measurable from here).
    fn cpu_secs(&self) -> f64 {
        let Postgres::Own(cluster) = self else {
            return 0.0;
        };
        std::fs::read_to_string(cluster.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse().ok())
            .and_then(probe::tree_cpu_secs)
            .unwrap_or(0.0)
    }

    /// What the report says about the server.
    fn describe(&self) -> String {
        match self {
            Postgres::Given(_) => "the database of --database-url (server CPU is qd's only; \
                 every phase shares it)"
                .into(),
            Postgres::Own(cluster) => {
                let version = cluster
                    .psql("postgres", "SHOW server_version")
                    .unwrap_or_else(|_| "?".into());
                format!(
                    "a throw-away PostgreSQL {version} on this machine (Unix socket, fsync on, \
                     default settings; server CPU counts qd and PostgreSQL's processes)"
                )
            }
        }
    }
}

/// The `cluster` mode (see the module doc).
pub async fn cluster(s: &Settings, given: Option<&str>, report: &mut Report) -> Result<()> {
    let pg = Postgres::open(given).await?;
    report.notes.push(format!("cluster: {}", pg.describe()));
    stores(s, &pg, report).await?;
    nodes(s, &pg, report).await
}

/// A node name no live node of the database holds.
fn node_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    format!(
        "qd-bench-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Starts `n` nodes on `url`, one after the other (the first migrates the schema).
async fn start_nodes(s: &Settings, url: &str, n: usize, script: &Path) -> Result<Vec<Server>> {
    let mut nodes = Vec::with_capacity(n);
    for _ in 0..n {
        let name = node_name();
        let node = Node {
            database_url: url,
            name: &name,
        };
        nodes.push(s.start_qd(script, Some(node)).await?);
    }
    Ok(nodes)
}

/// Every node's `queue`, one connection after the other on the next node.
fn spread(nodes: &[Server], queue: &str, api: Api) -> Arc<Spread<QdTarget>> {
    Arc::new(Spread::new(
        nodes
            .iter()
            .map(|n| QdTarget {
                base: format!("http://{}", n.addr),
                queue: queue.to_string(),
                api,
                bearer: None,
            })
            .collect(),
    ))
}

/// qd on SQLite, then on PostgreSQL, through the single and the batch endpoints.
async fn stores(s: &Settings, pg: &Postgres, report: &mut Report) -> Result<()> {
    let scripts = Scratch::new("scripts")?;
    let noop = scripts.script("noop.sh", "cat >/dev/null")?;
    for (mode, api, batch) in [
        ("cluster single", Api::Single, 1),
        ("cluster batch", Api::Batch, BATCH),
    ] {
        let plan = Plan {
            batch,
            rate: 0.0,
            ..s.plan.clone()
        };
        let qd = s.start_qd(&noop, None).await?;
        let cpu = || qd.cpu_secs();
        let measured = phases(mode, STORES[0], qd_target(&qd, api), &cpu, &plan, report).await;
        qd.stop().await;
        measured?;
        let url = pg.database()?;
        let name = node_name();
        let node = Node {
            database_url: &url,
            name: &name,
        };
        let qd = s.start_qd(&noop, Some(node)).await?;
        let cpu = || qd.cpu_secs() + pg.cpu_secs();
        let measured = phases(mode, STORES[1], qd_target(&qd, api), &cpu, &plan, report).await;
        qd.stop().await;
        measured?;
    }
    Ok(())
}

/// 1 node, then 2, on one PostgreSQL: 50 ms command jobs, then no-op jobs.
async fn nodes(s: &Settings, pg: &Postgres, report: &mut Report) -> Result<()> {
    let scripts = Scratch::new("cluster")?;
    let done_file = scripts.0.join("done");
    let script = scripts.script(
        "job.sh",
        &format!(
            "cat >/dev/null\nsleep {JOB_SLEEP}\necho x >> '{}'",
            done_file.display()
        ),
    )?;
    for (n, column) in [(1, NODES[0]), (2, NODES[1])] {
        let url = pg.database()?;
        let nodes = start_nodes(s, &url, n, &script).await?;
        let measured = on_nodes(s, pg, &nodes, column, &done_file, report).await;
        for node in nodes {
            node.stop().await;
        }
        measured?;
    }
    report.notes.push(format!(
        "cluster nodes: {} command jobs of `sleep {JOB_SLEEP}` (enqueued in batches of {BATCH} \
         through every node), {} workers per node; then {} no-op jobs through external \
         consumers, P={} C={} per node, spread over the nodes",
        s.exec_jobs, s.workers, s.plan.jobs, s.plan.producers, s.plan.consumers
    ));
    Ok(())
}

/// The phases of the node comparison against running `nodes`.
async fn on_nodes(
    s: &Settings,
    pg: &Postgres,
    nodes: &[Server],
    column: &str,
    done_file: &Path,
    report: &mut Report,
) -> Result<()> {
    let n = nodes.len();
    let mode = "cluster nodes";
    let what = |phase: &str| format!("{mode} {column} {phase}");
    let plan = Plan {
        jobs: s.exec_jobs,
        producers: n,
        batch: BATCH,
        rate: 0.0,
        ..s.plan.clone()
    };
    let before = line_count(done_file);
    let start = Instant::now();
    let target = spread(nodes, COMMAND_QUEUE, Api::Batch);
    let enqueued = load::run(target, plan, Phase::Enqueue, Default::default()).await?;
    note_errors(report, what("command jobs enqueue"), &enqueued);
    let took = wait_lines(done_file, before, enqueued.enqueued, start, s.plan.max_time).await;
    report.add(
        mode,
        column,
        "50 ms command jobs",
        "jobs/s",
        took.rate(enqueued.enqueued),
    );
    if took.0.is_none() {
        report.notes.push(format!(
            "{}: not all done in {:?}",
            what("command jobs"),
            s.plan.max_time
        ));
    }
    // A job run twice would show as an extra line; give a straggler time to write it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let extra = line_count(done_file).saturating_sub(before + enqueued.enqueued);
    if extra > 0 {
        report.notes.push(format!(
            "{}: {extra} more runs than jobs (a job ran twice)",
            what("command jobs")
        ));
    }
    for (metric, api, batch) in [
        ("no-op jobs, batches of 100", Api::Batch, BATCH),
        ("no-op jobs, 1 per request", Api::Single, 1),
    ] {
        let plan = Plan {
            batch,
            rate: 0.0,
            producers: s.plan.producers * n,
            consumers: s.plan.consumers * n,
            ..s.plan.clone()
        };
        let cpu = || nodes.iter().map(Server::cpu_secs).sum::<f64>() + pg.cpu_secs();
        let cpu0 = cpu();
        let target = spread(nodes, EXTERNAL_QUEUE, api);
        let mixed = load::run(target, plan, Phase::Mixed, Default::default()).await?;
        note_errors(report, what(metric), &mixed);
        report.add(mode, column, metric, "jobs/s", mixed.done_rate());
        if mixed.done > 0 {
            let metric = match api {
                Api::Batch => "server CPU, batches",
                Api::Single => "server CPU, 1 per request",
            };
            let per_job = (cpu() - cpu0) * 1e6 / mixed.done as f64;
            report.add(mode, column, metric, "µs/job", per_job);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_initdb_is_an_error_at_once_with_its_log_and_leaves_no_directory() {
        let fake = Scratch::new("fake-pg").expect("scratch");
        fake.script("initdb", "echo 'initdb: no space left' >&2\nexit 1")
            .expect("fake initdb");
        let started = Instant::now();
        let Err(e) = Cluster::start(&fake.0, &[], Duration::from_secs(60)) else {
            panic!("a cluster started with an initdb that fails");
        };
        let text = format!("{e:#}");
        if text.contains("the postgres user must exist") {
            // Root without the postgres user: what PostgreSQL's package creates.
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{text}");
            eprintln!("SKIPPED: {text} (install the Debian package postgresql)");
            return;
        }
        assert!(
            text.contains("start-up script ended") && text.contains("initdb: no space left"),
            "{text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        let dir = text
            .split(" in ")
            .nth(1)
            .and_then(|t| t.lines().next())
            .expect("dir");
        assert!(!Path::new(dir).exists(), "{dir} left behind");
    }
}
