//! Starts the real `qd` binary (the one built beside this runner) on a private temp
//! dir with a generated config, and talks to it over its HTTP API.

use crate::scratch::free_ports;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// A running qd; killed on drop. Derefs to its [`Api`].
pub struct Daemon {
    api: Api,
    child: Child,
    log: PathBuf,
}

/// How to end a running qd from another task: its process id.
#[derive(Clone, Copy)]
pub struct Pid(u32);

impl Pid {
    /// Sends `SIGKILL`: the node stops at once, with no shutdown of its own (its
    /// leases stay in the store for the cluster's leader to end). Errors: the
    /// process is gone already.
    pub fn kill9(self) -> Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
            .with_context(|| format!("SIGKILL qd (pid {})", self.0))
    }
}

/// A cheap-to-clone client of one qd's HTTP API.
#[derive(Clone)]
pub struct Api {
    /// Base URL, e.g. `http://127.0.0.1:7070`.
    pub base: String,
    http: reqwest::Client,
}

impl std::ops::Deref for Daemon {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Daemon {
    /// Writes `[daemon]` (data dir, socket, free ports) plus `body` into `dir/qd.toml`
    /// and starts qd; returns once `/healthz` answers.
    pub async fn start(dir: &Path, body: &str) -> Result<Daemon> {
        Daemon::start_with(dir, "", body).await
    }

    /// [`Daemon::start`] with more `[daemon]` keys (`daemon_keys`, one per line),
    /// e.g. a cluster node's `database_url` and `node_name`.
    pub async fn start_with(dir: &Path, daemon_keys: &str, body: &str) -> Result<Daemon> {
        let [api_port, metrics_port] = free_ports()?;
        let config = dir.join("qd.toml");
        let text = format!(
            "[daemon]\ndata_dir = \"{d}/data\"\nadmin_socket = \"{d}/qctl.sock\"\n\
             api_listen = \"127.0.0.1:{api_port}\"\nmetrics_listen = \"127.0.0.1:{m}\"\n\
             shutdown_grace = \"2s\"\n{daemon_keys}\n{body}",
            d = dir.display(),
            m = metrics_port
        );
        std::fs::write(&config, text)?;
        let qd = std::env::current_exe()?.with_file_name("qd");
        let log = dir.join("qd.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(&qd)
            .args(["run", "--config"])
            .arg(&config)
            .env("QD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "start {} (build it: cargo build --release -p qd)",
                    qd.display()
                )
            })?;
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .timeout(Duration::from_secs(60))
            .build()?;
        let api = Api {
            base: format!("http://127.0.0.1:{api_port}"),
            http,
        };
        let mut daemon = Daemon { api, child, log };
        daemon.wait_healthy().await?;
        Ok(daemon)
    }

    /// Its process id, to kill it from another task ([`Pid::kill9`]).
    pub fn pid(&self) -> Result<Pid> {
        self.child.id().map(Pid).context("qd has exited already")
    }

    async fn wait_healthy(&mut self) -> Result<()> {
        let start = Instant::now();
        loop {
            let url = format!("{}/healthz", self.api.base);
            if self
                .api
                .http
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "qd exited with {status}: {}",
                    std::fs::read_to_string(&self.log)?
                );
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("qd did not come up");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Api {
    /// POSTs `body` to `path`; returns (status, JSON answer).
    pub async fn post(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body)?)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// Enqueues `body` on `queue`; returns the job id.
    pub async fn enqueue(&self, queue: &str, body: Value) -> Result<String> {
        let (status, answer) = self
            .post(&format!("/v1/queues/{queue}/jobs"), &body)
            .await?;
        if status != 202 {
            bail!("enqueue answered {status}: {answer}");
        }
        answer["id"].as_str().map(str::to_string).context("no id")
    }

    /// Enqueues every body, 16 requests in flight; returns the ids in order.
    pub async fn enqueue_all(&self, queue: &str, bodies: Vec<Value>) -> Result<Vec<String>> {
        let queue: std::sync::Arc<str> = queue.into();
        self.each(bodies, move |api, body| {
            let queue = queue.clone();
            async move { api.enqueue(&queue, body).await }
        })
        .await
    }

    /// Runs `f` on every item, 16 at a time; outputs in input order.
    async fn each<T, O, F, Fut>(&self, items: Vec<T>, f: F) -> Result<Vec<O>>
    where
        T: Send + 'static,
        O: Send + 'static,
        F: Fn(Api, T) -> Fut,
        Fut: std::future::Future<Output = Result<O>> + Send + 'static,
    {
        let mut out = Vec::with_capacity(items.len());
        let mut items = items.into_iter().peekable();
        while items.peek().is_some() {
            let mut set = tokio::task::JoinSet::new();
            for (i, item) in items.by_ref().take(16).enumerate() {
                let fut = f(self.clone(), item);
                set.spawn(async move { (i, fut.await) });
            }
            let mut batch: Vec<(usize, O)> = Vec::new();
            while let Some(done) = set.join_next().await {
                let (i, result) = done?;
                batch.push((i, result?));
            }
            batch.sort_by_key(|(i, _)| *i);
            out.extend(batch.into_iter().map(|(_, o)| o));
        }
        Ok(out)
    }

    /// The job's status document.
    pub async fn job(&self, id: &str) -> Result<Value> {
        let resp = self
            .http
            .get(format!("{}/v1/jobs/{id}", self.base))
            .send()
            .await?;
        Ok(serde_json::from_slice(&resp.bytes().await?)?)
    }

    /// Waits until every job is final (succeeded, dead, cancelled) or `timeout` passes;
    /// returns the final documents (unfinished ones are left out).
    pub async fn wait_final(&self, ids: &[String], timeout: Duration) -> Result<Vec<Value>> {
        let start = Instant::now();
        let mut pending: Vec<String> = ids.to_vec();
        let mut done = Vec::new();
        while !pending.is_empty() && start.elapsed() < timeout {
            let docs = self
                .each(pending.clone(), |api, id| async move { api.job(&id).await })
                .await?;
            let mut still = Vec::new();
            for (id, doc) in pending.into_iter().zip(docs) {
                if matches!(
                    doc["state"].as_str(),
                    Some("succeeded" | "dead" | "cancelled")
                ) {
                    done.push(doc);
                } else {
                    still.push(id);
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(done)
    }

    /// Leases up to `max` jobs as external worker `worker` (long poll `wait` seconds).
    pub async fn lease(
        &self,
        queue: &str,
        worker: &str,
        max: u32,
        wait: f64,
    ) -> Result<Vec<Value>> {
        let body = json!({ "worker_id": worker, "max_jobs": max, "wait": wait });
        let (status, answer) = self
            .post(&format!("/v1/queues/{queue}/leases"), &body)
            .await?;
        if status != 200 {
            bail!("lease answered {status}: {answer}");
        }
        Ok(answer["jobs"].as_array().cloned().unwrap_or_default())
    }
}

/// When the job's first attempt started (Unix ms).
pub fn first_start_ms(job: &Value) -> Option<i64> {
    job["history"].as_array()?.first()?["started_at"].as_i64()
}

/// When the job's last attempt ended (Unix ms).
pub fn last_end_ms(job: &Value) -> Option<i64> {
    job["history"].as_array()?.last()?["ended_at"].as_i64()
}

/// The `p`-th percentile (0..=100, nearest rank) of `values`, or 0 when empty.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}
