//! `[daemon] database_url` and `database_password_file`: where the PostgreSQL store
//! is and how qd authenticates to it. Owns parsing the URL, refusing a password
//! written into it, checking the password file's mode, and building the client's
//! connection settings with the password from the file or `PGPASSWORD`.
//!
//! The password is never part of a message, a log line or `qd check-config`'s
//! output: errors name the file, never its content, and [`describe_postgres`] shows
//! hosts, database and user only.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::SslMode;

/// Where the PostgreSQL store is (`[daemon] database_url`). Absent: the SQLite store
/// in `data_dir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseConfig {
    /// The connection string as written: libpq key=value (`host=/run/postgresql
    /// dbname=qd user=qd`) or a URL (`postgresql://qd@db.internal:5432/qd`). Never
    /// holds a password (refused by [`DatabaseConfig::parse`]).
    pub url: String,
    /// A file holding the password (its first line), owner-only (mode 0600 or
    /// stricter). Without it, the password comes from `PGPASSWORD`, if set.
    pub password_file: Option<PathBuf>,
    /// How this node names itself in the cluster (`[daemon] node_name`, default the
    /// host name): stored with each lease it holds and in `qd_nodes`. Two live nodes
    /// may not share a name; a node that restarts under its name takes back (ends)
    /// the leases its earlier run held.
    pub node_name: String,
    /// A node whose heartbeat is older than this is dead: the leader ends its leases
    /// (default 10 s; nodes heartbeat every fifth of it, the leader's lease lasts it).
    pub node_timeout: Duration,
    /// How much longer than `node_timeout` the leader waits before it ends a
    /// silent node's leases, as written (`None`: derived from the queues, see
    /// [`crate::config::Config::fence_wait`]): the silent node stops its own
    /// attempts once its heartbeat is `node_timeout` old, SIGKILLing them
    /// `kill_grace` after SIGTERM, and this wait covers that stop
    /// (`daemon/docs/cluster.md`, self-fencing). Checked against every command
    /// queue's `kill_grace`.
    pub fence_wait: Option<Duration>,
    /// How often an idle node looks for jobs other nodes enqueued when no
    /// notification woke it (default 1 s; LISTEN/NOTIFY wakes it sooner).
    pub poll_interval: Duration,
}

/// The cluster settings' defaults.
pub(crate) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What `fence_wait` must leave beyond a queue's `kill_grace`: the fencing check's
/// tick (100 ms), the watchdog's tick (at most 250 ms), SIGKILL's delivery and the
/// reaping of the group, with room for a busy host.
pub const FENCE_MARGIN: Duration = Duration::from_secs(1);

/// This machine's host name (the default `node_name`), or `"qd"` if it has none.
pub(crate) fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| super::is_valid_name(h))
        .unwrap_or_else(|| "qd".to_owned())
}

/// The Unix socket directory used when the URL names no host (Debian's default, as
/// libpq's).
const DEFAULT_SOCKET_DIR: &str = "/run/postgresql";

impl DatabaseConfig {
    /// Checks `url` without touching the machine: it parses, names no password and
    /// does not require TLS (not supported yet). Errors are one sentence naming the
    /// problem, never echoing the URL.
    pub fn parse(url: &str, password_file: Option<PathBuf>) -> Result<DatabaseConfig, String> {
        let parsed = tokio_postgres::Config::from_str(url)
            .map_err(|e| format!("not a libpq connection string or postgresql:// URL: {e}"))?;
        if parsed.get_password().is_some() {
            return Err(
                "holds a password; put it in daemon.database_password_file (mode 0600) \
                 or PGPASSWORD instead, so it stays out of the config file"
                    .into(),
            );
        }
        if parsed.get_ssl_mode() == SslMode::Require {
            return Err(
                "sslmode=require: qd's PostgreSQL client does not support TLS yet; \
                 connect over a Unix socket or a trusted network"
                    .into(),
            );
        }
        Ok(DatabaseConfig {
            url: url.to_owned(),
            password_file,
            node_name: host_name(),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            fence_wait: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
        })
    }

    /// The client's connection settings: [`DatabaseConfig::settings`] plus the
    /// password (from the file, else `PGPASSWORD`).
    ///
    /// Errors name the problem and the file, never the password: the URL does not
    /// parse, the file cannot be read, or its mode lets group or others read it.
    pub fn client_config(&self) -> Result<tokio_postgres::Config, String> {
        let mut config = self.settings()?;
        let password = match &self.password_file {
            Some(path) => Some(read_password_file(path)?),
            None => std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()),
        };
        if let Some(password) = password {
            config.password(password);
        }
        Ok(config)
    }

    /// The URL's settings without a password, with libpq's defaults where it is
    /// silent: a Unix socket in `/run/postgresql` when no host is named, the current
    /// OS user when no user is.
    fn settings(&self) -> Result<tokio_postgres::Config, String> {
        let mut config = tokio_postgres::Config::from_str(&self.url)
            .map_err(|e| format!("daemon.database_url: {e}"))?;
        if config.get_hosts().is_empty() {
            config.host_path(DEFAULT_SOCKET_DIR);
        }
        if config.get_user().is_none()
            && let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::geteuid())
        {
            config.user(&user.name);
        }
        Ok(config)
    }

    /// Where the store is, for `qd check-config`, `qctl status` and logs: hosts,
    /// database and user, never the password.
    pub fn describe(&self) -> String {
        match self.settings() {
            Ok(config) => describe_postgres(&config),
            Err(e) => format!("PostgreSQL ({e})"),
        }
    }
}

/// Checks the password file: it exists and group and others have no access.
pub(crate) fn check_password_file(path: &Path) -> Result<(), String> {
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .permissions()
        .mode()
        & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {mode:04o}; a password file must be readable by its owner only \
             (chmod 600 {})",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

/// The password: the file's first line, without its line end.
fn read_password_file(path: &Path) -> Result<String, String> {
    check_password_file(path).map_err(|e| format!("daemon.database_password_file: {e}"))?;
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "daemon.database_password_file: cannot read {}: {e}",
            path.display()
        )
    })?;
    Ok(text.lines().next().unwrap_or("").to_owned())
}

/// Where `config` points, for messages and logs: hosts, ports, database and user,
/// never the password. E.g. `PostgreSQL database "qd" on /run/postgresql:5432 as "qd"`.
pub fn describe_postgres(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(n, host)| {
            let name = match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            let port = ports.get(n).or(ports.first()).copied().unwrap_or(5432);
            format!("{name}:{port}")
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "localhost:5432".to_owned()
    } else {
        hosts.join(",")
    };
    let user = config.get_user().unwrap_or("(no user)");
    let dbname = config.get_dbname().unwrap_or(user);
    format!("PostgreSQL database {dbname:?} on {hosts} as {user:?}")
}
