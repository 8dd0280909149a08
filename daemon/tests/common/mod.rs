//! Test harness: starts the real `qd` binary on a temp dir with a generated config
//! and talks to it over HTTP and through `qctl`, as a user would.
//!
//! Ports are taken from the kernel (bind to port 0, then release), the data dir is
//! a `TempDir`, and every wait is a bounded poll, never a bare sleep.
#![allow(dead_code, missing_docs)]

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tempfile::TempDir;

pub mod pg;
mod tools;

#[allow(unused_imports)]
pub use tools::{have, tool_missing};

/// The `qd` binary under test.
pub fn qd_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_qd"))
}

/// Writes `text` as `dir/qd.toml` and runs `qd check-config` on it: answers the
/// exit code and what it printed (stderr, then stdout).
pub fn check_config(dir: &Path, text: &str) -> (Option<i32>, String) {
    let config = dir.join("qd.toml");
    std::fs::write(&config, text).expect("write the config");
    let out = Command::new(qd_bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("run qd check-config");
    let printed =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.code(), printed)
}

/// The `qctl` binary, built beside `qd` in the same target dir.
pub fn qctl_bin() -> PathBuf {
    let qd = qd_bin();
    qd.with_file_name("qctl")
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    let [port] = free_ports();
    port
}

/// `N` distinct free TCP ports on loopback. Each is held until all are picked: two
/// picks one after the other may get the same port back, and a daemon whose API
/// and metrics ports are equal cannot start.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("free port"))
        .collect();
    std::array::from_fn(|i| held[i].local_addr().expect("bound port").port())
}

/// Writes an executable shell script into `dir` and returns its path.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create script");
    writeln!(f, "#!/bin/sh\n{body}").expect("write script");
    drop(f);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Polls `check` every 50 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The store the harness runs qd on. A test binary whose name ends in `_postgres`
/// (e.g. `core_postgres.rs`, which includes `core.rs`) runs on PostgreSQL, a fresh
/// database of the run's throw-away cluster per daemon ([`pg`]); `QD_TEST_BACKEND=
/// postgres` or `sqlite` overrides it. Everything else runs on SQLite in `data_dir`.
pub fn on_postgres() -> bool {
    match std::env::var("QD_TEST_BACKEND").as_deref() {
        Ok("postgres") => true,
        Ok("sqlite") => false,
        _ => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.file_name()?.to_str().map(str::to_owned))
            .is_some_and(|name| name.split('-').next().unwrap_or("").ends_with("_postgres")),
    }
}

/// A running (or stopped) qd with its own temp dir.
pub struct Qd {
    pub dir: TempDir,
    /// The PostgreSQL database it runs on ([`on_postgres`]), else `None` (SQLite).
    pub database: Option<pg::Database>,
    pub config: PathBuf,
    pub api: String,
    pub metrics: String,
    pub socket: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    agent: ureq::Agent,
}

impl Qd {
    /// Starts qd with `[daemon]` filled in and `body` (queues, tenants, ...) appended.
    pub fn start(body: &str) -> Qd {
        Self::start_with(body, &[])
    }

    /// Like [`Qd::start`], with extra environment variables for the daemon.
    pub fn start_with(body: &str, env: &[(&str, &str)]) -> Qd {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut qd = Self::configure(dir, body, "5s");
        qd.spawn(env);
        qd
    }

    /// Writes the config without starting the daemon.
    pub fn configure(dir: TempDir, body: &str, grace: &str) -> Qd {
        let database = if on_postgres() { pg::database() } else { None };
        Self::configure_on(dir, body, grace, database, "")
    }

    /// [`Qd::configure`] with API tokens: `tokens` (the TOML of a tokens file) is
    /// written owner-only into the temp dir and named by `daemon.api_tokens_file`.
    pub fn configure_with_tokens(tokens: &str, body: &str) -> Qd {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, tokens).expect("tokens");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("mode");
        let qd = Self::configure(dir, body, "5s");
        let text = std::fs::read_to_string(&qd.config).expect("config");
        let text = text.replacen(
            "[daemon]\n",
            &format!("[daemon]\napi_tokens_file = \"{}\"\n", path.display()),
            1,
        );
        std::fs::write(&qd.config, text).expect("config");
        qd
    }

    /// Writes the config of one node of a cluster on `database` (shared by every
    /// node given the same), with `daemon` (more `[daemon]` keys, e.g. `node_name`)
    /// and `body`, without starting it.
    pub fn configure_node(database: &pg::Database, daemon: &str, body: &str) -> Qd {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::configure_on(dir, body, "5s", Some(database.clone()), daemon)
    }

    fn configure_on(
        dir: TempDir,
        body: &str,
        grace: &str,
        database: Option<pg::Database>,
        daemon: &str,
    ) -> Qd {
        let [api_port, metrics_port] = free_ports();
        let socket = dir.path().join("qctl.sock");
        let config = dir.path().join("qd.toml");
        let store = database
            .as_ref()
            .map(|db| format!("database_url = \"{}\"\n{daemon}", db.url))
            .unwrap_or_default();
        let text = format!(
            "[daemon]\n{store}data_dir = \"{data}\"\nadmin_socket = \"{sock}\"\napi_listen = \"127.0.0.1:{api_port}\"\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\nshutdown_grace = \"{grace}\"\n\n{body}",
            data = dir.path().join("data").display(),
            sock = socket.display(),
        );
        std::fs::write(&config, text).expect("write config");
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Qd {
            api: format!("http://127.0.0.1:{api_port}"),
            metrics: format!("http://127.0.0.1:{metrics_port}/metrics"),
            log: dir.path().join("qd.log"),
            socket,
            config,
            dir,
            database,
            child: None,
            agent,
        }
    }

    /// Starts the daemon process and waits until its API answers and its admin socket
    /// listens. The daemon counts as up only once its own log (since this start) says
    /// its API listener is bound and the Supervisor started every child: a port picked
    /// by [`free_port`] can be taken by another process before qd binds it, and then
    /// another test's daemon would answer `/healthz`. If qd could not bind a port, it
    /// is started again on fresh ports (a few times).
    pub fn spawn(&mut self, env: &[(&str, &str)]) {
        for _ in 0..PORT_TRIES {
            let from = self.logs().len();
            self.spawn_once(env);
            if self.wait_up(from) {
                return;
            }
            self.kill9();
            self.move_ports();
        }
        panic!(
            "qd could not bind its ports in {PORT_TRIES} tries:\n{}",
            self.logs()
        );
    }

    fn spawn_once(&mut self, env: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut cmd = Command::new(qd_bin());
        cmd.args(["run", "--config"])
            .arg(&self.config)
            .env("QD_LOG", "info,qd=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn qd"));
    }

    /// Waits until the daemon started at log offset `from` serves its API (true) or
    /// failed to bind a port (false); panics if it exits or stays down for 30 s.
    fn wait_up(&mut self, from: usize) -> bool {
        let url = format!("{}/healthz", self.api);
        let agent = self.agent.clone();
        let start = Instant::now();
        loop {
            // Exit status first, then the log: a daemon that exits has logged why.
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            let log = self.logs().get(from..).unwrap_or_default().to_owned();
            if BIND_FAILURES.iter().any(|failure| log.contains(failure)) {
                return false;
            }
            if let Some(status) = exited {
                panic!("qd exited during start-up with {status}:\n{}", self.logs());
            }
            if log.contains(API_BOUND)
                && log.contains(UP)
                && agent.get(&url).call().is_ok_and(|r| r.status() == 200)
            {
                let on = if self.database.is_some() {
                    "PostgreSQL database"
                } else {
                    "SQLite"
                };
                assert!(log.contains(on), "qd is not on {on}:\n{log}");
                return true;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "qd did not come up:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Rewrites the config onto fresh API and metrics ports: the `api_listen` and
    /// `metrics_listen` lines are replaced whole, whatever ports they held.
    fn move_ports(&mut self) {
        let [api, metrics, console] = free_ports();
        let text: String = std::fs::read_to_string(&self.config)
            .expect("read config")
            .lines()
            .map(|line| {
                if line.starts_with("listen = \"127.0.0.1:") {
                    // `[console] listen`: the only other `listen` key.
                    format!("listen = \"127.0.0.1:{console}\"\n")
                } else if line.starts_with("api_listen = ") {
                    format!("api_listen = \"127.0.0.1:{api}\"\n")
                } else if line.starts_with("metrics_listen = ") {
                    format!("metrics_listen = \"127.0.0.1:{metrics}\"\n")
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        std::fs::write(&self.config, text).expect("write config");
        self.api = format!("http://127.0.0.1:{api}");
        self.metrics = format!("http://127.0.0.1:{metrics}/metrics");
    }

    /// The `[console] listen` address in the config (it moves when a start finds
    /// its port taken), if there is one.
    pub fn console_addr(&self) -> Option<String> {
        std::fs::read_to_string(&self.config)
            .ok()?
            .lines()
            .find_map(|l| {
                l.strip_prefix("listen = \"")?
                    .strip_suffix('"')
                    .map(str::to_string)
            })
    }

    /// The daemon's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .map(|c| c.id() as i32)
            .expect("qd running")
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (up to `within`) for the exit status.
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        signal(self.pid(), "TERM");
        self.wait_exit(within)
    }

    /// Waits (up to `within`, else kills it and panics) for the daemon to exit; its
    /// exit status.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("qd running");
        let start = Instant::now();
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                return status;
            }
            if start.elapsed() > within {
                let _ = c.kill();
                panic!("qd did not exit within {within:?}:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// POSTs `body` with an optional bearer token; returns (status, `Retry-After`,
    /// body).
    pub fn post_as(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> (u16, Option<String>, Value) {
        let mut req = self.agent.post(format!("{}{path}", self.api));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let mut resp = req.send_json(body).expect("POST");
        let status = resp.status().as_u16();
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, retry, body)
    }

    /// POST JSON; returns (status, body).
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let mut resp = self
            .agent
            .post(format!("{}{path}", self.api))
            .send_json(body)
            .expect("POST");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POST raw bytes as JSON content; returns (status, body).
    pub fn post_raw(&self, path: &str, body: &[u8]) -> (u16, Value) {
        let mut resp = self
            .agent
            .post(format!("{}{path}", self.api))
            .header("content-type", "application/json")
            .send(body)
            .expect("POST");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// One SQS request in AWS JSON 1.0, unsigned (for a qd without a token file):
    /// `(status, answer)`.
    pub fn sqs(&self, action: &str, params: Value) -> (u16, Value) {
        let mut resp = self
            .agent
            .post(format!("{}/", self.api))
            .header("x-amz-target", format!("AmazonSQS.{action}"))
            .header("content-type", "application/x-amz-json-1.0")
            .send(params.to_string())
            .expect("SQS request");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// GET; returns (status, body).
    pub fn get(&self, path: &str) -> (u16, Value) {
        self.get_as(path, None)
    }

    /// GET with a bearer `token` (none: no `Authorization` header); returns
    /// (status, body).
    pub fn get_as(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut req = self.agent.get(format!("{}{path}", self.api));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let mut resp = req.call().expect("GET");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// GET the Prometheus exposition text.
    pub fn scrape(&self) -> String {
        let mut resp = self.agent.get(&self.metrics).call().expect("scrape");
        resp.body_mut().read_to_string().expect("metrics body")
    }

    /// Enqueues `payload` (a string) on `queue`; returns the job id. Panics unless 202.
    pub fn enqueue(&self, queue: &str, payload: &str) -> String {
        self.enqueue_json(queue, json!({ "payload": payload }))
    }

    /// Enqueues with a full body; returns the job id. Panics unless 202.
    pub fn enqueue_json(&self, queue: &str, body: Value) -> String {
        let (status, resp) = self.post(&format!("/v1/queues/{queue}/jobs"), &body);
        assert_eq!(status, 202, "enqueue answered {status}: {resp}");
        resp["id"].as_str().expect("id").to_string()
    }

    /// The job's status document.
    pub fn job(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/jobs/{id}"));
        assert_eq!(status, 200, "GET job {id}: {body}");
        body
    }

    /// Waits until the job is in a final state (succeeded, dead, cancelled).
    pub fn wait_final(&self, id: &str, timeout: Duration) -> Value {
        wait_for(&format!("job {id} to finish"), timeout, || {
            let job = self.job(id);
            matches!(
                job["state"].as_str(),
                Some("succeeded" | "dead" | "cancelled")
            )
            .then_some(job)
        })
    }

    /// Runs qctl against this daemon's socket.
    pub fn qctl(&self, args: &[&str]) -> Output {
        Command::new(qctl_bin())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run qctl")
    }
}

impl Drop for Qd {
    /// Kills the daemon; when the test is failing, prints the end of its log first
    /// (the temp dir holding it is removed right after).
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            let log = self.logs();
            let tail: Vec<&str> = log.lines().rev().take(LOG_TAIL_LINES).collect();
            eprintln!(
                "--- the last {} lines of qd's log ({}) ---",
                tail.len(),
                self.log.display()
            );
            tail.iter().rev().for_each(|line| eprintln!("{line}"));
        }
    }
}

/// How many times [`Qd::spawn`] starts a daemon that could not bind its ports.
const PORT_TRIES: usize = 3;
/// What qd logs once its HTTP API listener is bound (`api.rs`).
const API_BOUND: &str = "HTTP API listening.";
/// What the Supervisor logs once every child started, the admin socket's listener
/// (bound after the API's) included.
const UP: &str = "qd is up.";
/// What qd logs when it cannot bind the API or the metrics port.
const BIND_FAILURES: [&str; 3] = [
    "cannot listen on api_listen",
    "cannot listen for Prometheus scrapes",
    "cannot listen on console.listen",
];

/// How much of a daemon's log a failing test prints.
const LOG_TAIL_LINES: usize = 60;

/// The outcomes of a job's history, in order (`["failed", "succeeded"]`).
pub fn history(job: &Value) -> Vec<&str> {
    job["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|h| h["outcome"].as_str().expect("outcome"))
        .collect()
}

/// Leases one job from `queue` for `worker` over the HTTP pull API, long-polling up
/// to `wait`; `None` when nothing came.
pub fn lease_one(qd: &Qd, queue: &str, worker: &str, wait: &str) -> Option<Value> {
    let (status, body) = qd.post(
        &format!("/v1/queues/{queue}/leases"),
        &json!({ "worker_id": worker, "wait": wait }),
    );
    assert_eq!(status, 200, "lease: {body}");
    body["jobs"].as_array().expect("jobs").first().cloned()
}

/// Acks a job leased over the HTTP pull API (`job` as `lease_one` returns it);
/// panics unless 200.
pub fn ack(qd: &Qd, job: &Value) {
    let id = job["id"].as_str().expect("id");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/ack"),
        &json!({ "token": job["token"] }),
    );
    assert_eq!(status, 200, "ack: {body}");
}

/// The outcomes of a job's history (`GET /v1/jobs/{id}`'s `history`), oldest first.
pub fn outcomes(job: &Value) -> Vec<&str> {
    job["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| h["outcome"].as_str())
        .collect()
}

/// The value of one sample of `name` whose labels contain every `labels` pair, from
/// Prometheus exposition `text`; 0 when there is none.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Nearest-rank percentile `p` (0..=1) of `xs`.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Sends a signal by name with kill(1) (tests avoid unsafe libc calls).
pub fn signal(pid: i32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// True while a process with this pid exists.
pub fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
}

/// A qctl run as text for assertion messages: exit code, stdout, stderr.
pub fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs qctl, asserts exit 0, returns stdout.
pub fn ok(qd: &Qd, args: &[&str]) -> String {
    let out = qd.qctl(args);
    assert_eq!(out.status.code(), Some(0), "qctl {args:?}: {}", text(&out));
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Runs `qctl --json ...`, asserts exit 0, parses stdout.
pub fn json_of(qd: &Qd, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let stdout = ok(qd, &all);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("qctl {args:?}: {e}: {stdout}"))
}

/// Runs qctl expecting exit `code`; returns stdout and stderr.
pub fn fails(qd: &Qd, args: &[&str], code: i32) -> String {
    let out = qd.qctl(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "qctl {args:?}: {}",
        text(&out)
    );
    text(&out)
}

/// Leases every ready job of the external queue `ext` and nacks it as permanent with
/// `error` + its payload, so it dies at once. Callers have just made a job ready (an
/// enqueue, a redrive); the lease waits up to 5 s for it, since its Scheduler may
/// hear of it a moment after the caller's answer (a busy machine).
pub fn kill_all(qd: &Qd, error: &str) {
    let (status, body) = qd.post(
        "/v1/queues/ext/leases",
        &json!({"worker_id": "t", "max_jobs": 100, "wait": "5s"}),
    );
    assert_eq!(status, 200, "{body}");
    for job in body["jobs"].as_array().expect("jobs") {
        let id = job["id"].as_str().expect("id");
        let msg = format!("{error} {}", job["payload"].as_str().unwrap_or(""));
        let (status, body) = qd.post(
            &format!("/v1/jobs/{id}/nack"),
            &json!({"token": job["token"], "error": msg, "kind": "permanent"}),
        );
        assert_eq!(status, 200, "{body}");
    }
}

/// The shape of an SQS error answer's `__type` (`QueueDoesNotExist`, ...).
pub fn sqs_error(answer: &Value) -> &str {
    answer["__type"]
        .as_str()
        .and_then(|t| t.rsplit('#').next())
        .unwrap_or_default()
}
