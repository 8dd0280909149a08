//! Starting the servers under test on loopback: `qd` on a private temp dir with a
//! config written here (its store SQLite in that dir, or a PostgreSQL database as
//! one node of a cluster), and `beanstalkd` with its binlog in such a dir. Each
//! server is killed (by its own pid) and its dir removed when its handle drops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

use crate::probe;
use crate::scratch::{Scratch, free_ports};

/// How long a server may take to open its port.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a server may take to exit after `SIGTERM` (qd's `shutdown_grace` is 2 s).
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// The name of qd's queue for HTTP load (`executor = { kind = "external" }`).
pub const EXTERNAL_QUEUE: &str = "bench";
/// The name of qd's queue run by its own worker pool (`kind = "command"`).
pub const COMMAND_QUEUE: &str = "exec";

/// A running server process; killed on drop (before its dir is removed).
pub struct Server {
    child: Child,
    /// Its process id, for `/proc` readings.
    pub pid: u32,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its scratch dir (data, config, log).
    pub dir: Scratch,
}

impl Server {
    /// CPU seconds the server has used so far (0 when it is gone).
    pub fn cpu_secs(&self) -> f64 {
        probe::cpu_secs(self.pid).unwrap_or(0.0)
    }

    /// Stops the server: `SIGTERM` (a qd node leaves the cluster cleanly: its
    /// leases and the leader lease are released), `SIGKILL` after [`STOP_WITHIN`];
    /// waits for it to exit.
    pub async fn stop(mut self) {
        let term = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        if term.is_ok()
            && tokio::time::timeout(STOP_WITHIN, self.child.wait())
                .await
                .is_ok()
        {
            return;
        }
        let _ = self.child.kill().await;
    }
}

/// Settings of the qd under test.
pub struct QdSetup<'a> {
    /// The `qd` binary.
    pub binary: &'a Path,
    /// Workers of the command queue (min = max).
    pub workers: u32,
    /// Script the command queue runs.
    pub script: &'a Path,
    /// `defaults.retention` (how long finished jobs are kept).
    pub retention: &'a str,
    /// `None`: the store is SQLite in the server's dir. Some: a node of a cluster.
    pub node: Option<Node<'a>>,
    /// Some: the SQS API is on and this is the text of qd's `api_tokens_file`, so
    /// every HTTP request needs a bearer token and every SQS request a valid
    /// SigV4 signature.
    pub sqs_tokens: Option<&'a str>,
}

/// One qd node of a cluster on a PostgreSQL database.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    /// `[daemon] database_url`, shared by every node of the cluster.
    pub database_url: &'a str,
    /// `[daemon] node_name`, unique among the live nodes.
    pub name: &'a str,
}

/// Starts qd on a fresh dir with an external queue and a command queue; returns
/// once its HTTP API accepts connections.
pub async fn start_qd(setup: &QdSetup<'_>) -> Result<Server> {
    let dir = Scratch::new("qd")?;
    let [api, metrics] = free_ports()?.map(|port| SocketAddr::from(([127, 0, 0, 1], port)));
    let d = dir.0.display();
    let store = setup.node.map_or(String::new(), |n| {
        format!(
            "database_url = {}\nnode_name = {}\n",
            toml::Value::from(n.database_url),
            toml::Value::from(n.name)
        )
    });
    let config = format!(
        "[daemon]\n{store}data_dir = \"{d}/data\"\nadmin_socket = \"{d}/qctl.sock\"\n\
         api_listen = \"{api}\"\nmetrics_listen = \"{metrics}\"\nshutdown_grace = \"2s\"\n\n\
         [defaults]\nmax_depth = 10000000\nretention = \"{retention}\"\n\n\
         [queues.{EXTERNAL_QUEUE}]\nexecutor = {{ kind = \"external\" }}\n\n\
         [queues.{COMMAND_QUEUE}]\nexecutor = {{ kind = \"command\", program = \"{script}\" }}\n\
         workers = {{ min = {n}, max = {n} }}\n",
        retention = setup.retention,
        script = setup.script.display(),
        n = setup.workers,
    );
    let config = match setup.sqs_tokens {
        None => config,
        Some(tokens) => {
            let file = dir.0.join("tokens.toml");
            std::fs::write(&file, tokens)?;
            // qd refuses a token file others can read.
            std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            let daemon = format!("[daemon]\napi_tokens_file = \"{}\"\n", file.display());
            format!(
                "{}\n[sqs]\nenabled = true\n",
                config.replacen("[daemon]\n", &daemon, 1)
            )
        }
    };
    let path = dir.0.join("qd.toml");
    std::fs::write(&path, config)?;
    let mut cmd = Command::new(setup.binary);
    cmd.args(["run", "--config"])
        .arg(&path)
        .env("QD_LOG", "warn");
    spawn(cmd, dir, api, "qd").await
}

/// How beanstalkd syncs its binlog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// `-f 0`: fsync after every write.
    Always,
    /// The default (`-f 50`): at most every 50 ms, so a crash may lose 50 ms.
    Default,
}

/// Starts beanstalkd with a binlog in a fresh dir; `None` when it is not on the PATH.
pub async fn start_beanstalkd(fsync: Fsync) -> Result<Option<Server>> {
    let Some(binary) = on_path("beanstalkd") else {
        return Ok(None);
    };
    let dir = Scratch::new("beanstalkd")?;
    let [port] = free_ports()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut cmd = Command::new(binary);
    cmd.args(["-l", "127.0.0.1", "-p", &addr.port().to_string(), "-b"])
        .arg(&dir.0);
    if fsync == Fsync::Always {
        cmd.args(["-f", "0"]);
    }
    spawn(cmd, dir, addr, "beanstalkd").await.map(Some)
}

/// The full path of `program` when it is on the PATH.
pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

async fn spawn(mut cmd: Command, dir: Scratch, addr: SocketAddr, what: &str) -> Result<Server> {
    let log = dir.0.join(format!("{what}.log"));
    let out = std::fs::File::create(&log)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {what}"))?;
    let pid = child.id().context("the server exited at once")?;
    let start = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if let Some(status) = child.try_wait()? {
            bail!(
                "{what} exited with {status}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if start.elapsed() > START_TIMEOUT {
            bail!("{what} did not open {addr} within {START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Server {
        child,
        pid,
        addr,
        dir,
    })
}
