//! Where a scenario runs: one qd on SQLite, or (`--cluster`) two qd nodes sharing a
//! fresh database on one throw-away PostgreSQL (`shared/postgres.rs`), node 1
//! SIGKILLed mid-run.
//!
//! A [`Fleet`] starts the nodes with the same queues (workers split between them by
//! the scenario), spreads enqueues over them ([`Fleet::enqueue_all`]: producers on
//! both) and answers reads from node 0, the survivor. [`Fleet::kill_later`] watches
//! the database and, once enough jobs succeeded, SIGKILLs node 1, then times how long
//! the jobs it held stay leased: their leases end only when the leader (node 0, or
//! node 0 once it took the leader lease) finds node 1 silent for `node_timeout`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::daemon::{Api, Daemon};
use crate::postgres::{self, Cluster};

/// How long the throw-away PostgreSQL may take to start on a busy machine.
const START_WITHIN: Duration = Duration::from_secs(120);

/// The nodes' `node_timeout`: a silent node's leases end this long after its last
/// heartbeat (nodes heartbeat every fifth of it).
pub const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// The node that is killed.
const VICTIM: usize = 1;

/// One qd, or two nodes on PostgreSQL.
#[derive(Clone)]
pub enum Setup {
    /// One qd on its own SQLite store.
    One,
    /// Two nodes on a fresh database of this server per run.
    Cluster(Arc<Cluster>),
}

impl Setup {
    /// `cluster`: starts the throw-away PostgreSQL. Errors: PostgreSQL is not
    /// installed (naming what to install) or did not start (with its logs).
    pub async fn new(cluster: bool) -> Result<Setup> {
        if !cluster {
            return Ok(Setup::One);
        }
        let bin = postgres::binaries().with_context(|| {
            format!(
                "--cluster needs PostgreSQL (no initdb on the PATH or in \
                 /usr/lib/postgresql/*/bin): {}",
                postgres::INSTALL_HINT
            )
        })?;
        let settings = ["max_connections=200"];
        let server =
            tokio::task::spawn_blocking(move || Cluster::start(&bin, &settings, START_WITHIN))
                .await??;
        Ok(Setup::Cluster(Arc::new(server)))
    }

    /// How many nodes a fleet of this setup has.
    pub fn nodes(&self) -> usize {
        match self {
            Setup::One => 1,
            Setup::Cluster(_) => 2,
        }
    }

    /// `total` split over the nodes, node 0 taking the remainder (at least 1 each).
    pub fn share(&self, total: u32, node: usize) -> u32 {
        let n = self.nodes() as u32;
        let base = total / n;
        let extra = if node == 0 { total % n } else { 0 };
        (base + extra).max(1)
    }
}

/// The running nodes of one scenario run.
pub struct Fleet {
    nodes: Vec<Daemon>,
    db: Option<Db>,
}

/// A fresh database of the setup's server, shared by a fleet's nodes.
#[derive(Clone)]
struct Db {
    server: Arc<Cluster>,
    name: String,
}

impl Db {
    /// Runs `sql` on this database off the runtime's threads.
    async fn psql(&self, sql: &str) -> Result<String> {
        let db = self.clone();
        let sql = sql.to_owned();
        tokio::task::spawn_blocking(move || db.server.psql(&db.name, &sql)).await?
    }

    async fn count(&self, sql: &str) -> Result<usize> {
        let text = self.psql(sql).await?;
        text.parse()
            .with_context(|| format!("{sql:?} answered {text:?}"))
    }
}

/// What [`Fleet::kill_later`] saw.
pub struct Killed {
    /// Seconds from the watch's start to the kill.
    pub at: f64,
    /// Jobs the killed node held leased at the kill.
    pub leases: usize,
    /// Seconds from the kill until none of them was leased by it any more.
    pub ended_after: f64,
    /// Whether the killed node held the leader lease.
    pub was_leader: bool,
}

impl Killed {
    /// What happened, in a sentence.
    pub fn sentence(&self) -> String {
        format!(
            "node 1{} SIGKILLed at {:.1} s holding {} lease{}, ended by node 0's sweep {:.1} s later",
            if self.was_leader { " (the leader)" } else { "" },
            self.at,
            self.leases,
            if self.leases == 1 { "" } else { "s" },
            self.ended_after
        )
    }

    /// The sentence added to a row: `; ` and [`Killed::sentence`], or nothing.
    pub fn describe(killed: Option<&Killed>) -> String {
        killed
            .map(|k| format!("; {}", k.sentence()))
            .unwrap_or_default()
    }
}

/// A pending kill ([`Fleet::kill_later`]).
pub struct KillWatch(Option<(tokio::task::JoinHandle<Result<Killed>>, Arc<AtomicBool>)>);

impl KillWatch {
    /// What the kill saw, once the killed node's leases are ended; `None` on one
    /// node. Errors: the run ended before the kill (the watch is stopped), the
    /// leases were not ended in time, or the database could not be read.
    pub async fn finish(self) -> Result<Option<Killed>> {
        let Some((task, fired)) = self.0 else {
            return Ok(None);
        };
        if !fired.load(Ordering::SeqCst) {
            task.abort();
            bail!("the run ended before node 1 was killed: lower the kill's threshold");
        }
        Ok(Some(task.await??))
    }
}

fn node_name(node: usize) -> String {
    format!("node-{node}")
}

impl Fleet {
    /// Starts the setup's nodes in `dir` (node `i` in `dir/node-i`), node `i` with
    /// the queues `body(i)`; on a cluster the first node migrates the schema, then
    /// the second joins.
    pub async fn start(setup: &Setup, dir: &Path, body: impl Fn(usize) -> String) -> Result<Fleet> {
        let Setup::Cluster(server) = setup else {
            return Ok(Fleet {
                nodes: vec![Daemon::start(dir, &body(0)).await?],
                db: None,
            });
        };
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let name = format!(
            "qd_scenarios_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let db = Db {
            server: server.clone(),
            name: name.clone(),
        };
        {
            let server = server.clone();
            let create = format!("CREATE DATABASE {name}");
            tokio::task::spawn_blocking(move || server.psql("postgres", &create)).await??;
        }
        let mut nodes = Vec::new();
        for i in 0..setup.nodes() {
            let node_dir = dir.join(node_name(i));
            std::fs::create_dir_all(&node_dir)?;
            let keys = format!(
                "database_url = \"{url}\"\nnode_name = \"{node}\"\nnode_timeout = \"{t}s\"\n\
                 poll_interval = \"200ms\"\n",
                url = server.url(&name),
                node = node_name(i),
                t = NODE_TIMEOUT.as_secs()
            );
            nodes.push(Daemon::start_with(&node_dir, &keys, &body(i)).await?);
        }
        Ok(Fleet {
            nodes,
            db: Some(db),
        })
    }

    /// The survivor's API (node 0): reads and waits go there.
    pub fn api(&self) -> &Api {
        &self.nodes[0]
    }

    /// Every node's API, node 0 first.
    pub fn apis(&self) -> Vec<Api> {
        self.nodes.iter().map(|d| (**d).clone()).collect()
    }

    /// Whether `node` is the one [`Fleet::kill_later`] kills.
    pub fn is_victim(&self, node: usize) -> bool {
        self.db.is_some() && node == VICTIM
    }

    /// Enqueues `bodies` in chunks of 16, the chunks alternating between the nodes
    /// (in order, so FIFO order is kept); returns the ids in input order.
    pub async fn enqueue_all(&self, queue: &str, bodies: Vec<Value>) -> Result<Vec<String>> {
        let mut ids = Vec::with_capacity(bodies.len());
        for (k, chunk) in bodies.chunks(16).enumerate() {
            let node = &self.nodes[k % self.nodes.len()];
            ids.extend(node.enqueue_all(queue, chunk.to_vec()).await?);
        }
        Ok(ids)
    }

    /// On a cluster, a task that SIGKILLs node 1 once `succeeded` jobs succeeded,
    /// then waits until the database holds no lease of node 1 (ended by node 0's
    /// leader sweep). On one node, nothing.
    pub fn kill_later(&self, succeeded: usize) -> Result<KillWatch> {
        let Some(db) = self.db.clone() else {
            return Ok(KillWatch(None));
        };
        let pid = self.nodes[VICTIM].pid()?;
        let victim = node_name(VICTIM);
        let fired = Arc::new(AtomicBool::new(false));
        let fired_here = fired.clone();
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let done = "SELECT count(*) FROM qd_jobs WHERE state = 'succeeded'";
            while db.count(done).await? < succeeded {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            pid.kill9()?;
            fired_here.store(true, Ordering::SeqCst);
            let at = start.elapsed().as_secs_f64();
            let killed = Instant::now();
            let held = format!(
                "SELECT count(*) FROM qd_jobs WHERE lease_node = '{victim}' AND lease_token IS NOT NULL"
            );
            let leases = db.count(&held).await?;
            let was_leader = db
                .psql("SELECT node FROM qd_leader WHERE expires_at > now()")
                .await?
                .trim()
                == victim;
            loop {
                if db.count(&held).await? == 0 {
                    break;
                }
                if killed.elapsed() > Duration::from_secs(60) {
                    bail!("{victim}'s leases were not ended within 60 s of its SIGKILL");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Killed {
                at,
                leases,
                ended_after: killed.elapsed().as_secs_f64(),
                was_leader,
            })
        });
        Ok(KillWatch(Some((task, fired))))
    }
}
