//! A throw-away PostgreSQL cluster on a temp directory, for the programs and tests
//! that run qd on PostgreSQL without a database server of their own: `qd-bench
//! --mode cluster` and, included by path from `daemon/tests/common/pg.rs`, the
//! integration tests and the store's tests.
//!
//! [`Cluster::start`] runs `initdb` (trust authentication, UTF-8, C locale) and then
//! `postgres` listening on a Unix socket in that directory only
//! (`listen_addresses=''`, port 5432), fsync on. Run as root, both run as the
//! `postgres` user through `runuser`, on a directory owned by it. A shell wrapper
//! waits on a pipe from this process: when the pipe closes (the [`Cluster`] is
//! dropped, or this process exits however it exits) the wrapper stops the server
//! (immediate shutdown) and removes the directory.
//!
//! The binaries come from the PATH (`initdb`, resolved to its real directory) or
//! from Debian's `/usr/lib/postgresql/<version>/bin` ([`binaries`]).

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What to install when [`binaries`] finds nothing.
pub const INSTALL_HINT: &str = "install the Debian package postgresql";

/// A running throw-away cluster (see the module doc).
pub struct Cluster {
    /// The directory of the socket, the data and the logs (`initdb.log`, `server.log`).
    pub dir: PathBuf,
    /// Where `psql` is.
    bin: PathBuf,
    /// The wrapper's stdin: closing it stops the server and removes `dir`.
    lifeline: Option<ChildStdin>,
    wrapper: Child,
}

/// The directory holding `initdb`, `postgres` and `psql`, if PostgreSQL is installed:
/// the real directory of `initdb` on the PATH, else the newest
/// `/usr/lib/postgresql/<version>/bin`.
pub fn binaries() -> Option<PathBuf> {
    let on_path = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .and_then(|p| std::fs::canonicalize(p).ok())
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let debian = || {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|bin| bin.join("initdb").exists())
            .collect();
        versions.sort_by_key(|p| {
            p.parent()
                .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
        });
        versions.pop()
    };
    on_path
        .filter(|bin| bin.join("postgres").exists())
        .or_else(debian)
}

impl Cluster {
    /// Starts a cluster with the binaries in `bin` and the server settings
    /// `settings` (`name=value`, passed as `-c name=value`); returns once it answers
    /// `SELECT 1`, at most `within` after the start. Errors: no `postgres` user when
    /// running as root, a failed `initdb` or a server that does not answer in time
    /// (the error carries both logs).
    pub fn start(bin: &Path, settings: &[&str], within: Duration) -> Result<Cluster> {
        let root = nix::unistd::Uid::effective().is_root();
        let dir = std::env::temp_dir().join(format!("qd-pg-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        let run_as: &[&str] = if root {
            let user = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .context("running as root: the postgres user must exist to run PostgreSQL")?;
            std::os::unix::fs::chown(&dir, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .context("chown the cluster dir to postgres")?;
            &["runuser", "-u", "postgres", "--", "sh"]
        } else {
            &["sh"]
        };
        let settings: String = settings.iter().map(|s| format!(" -c '{s}'")).collect();
        let script = format!(
            "set -e\n\
             '{bin}/initdb' -D '{dir}/data' -U postgres -A trust -E UTF8 --locale=C --no-sync \
               > '{dir}/initdb.log' 2>&1\n\
             '{bin}/postgres' -D '{dir}/data' -c listen_addresses= -k '{dir}' -c port=5432\
               {settings} > '{dir}/server.log' 2>&1 &\n\
             pid=$!\n\
             read _ || true\n\
             kill -QUIT $pid 2>/dev/null || true\n\
             wait $pid || true\n\
             rm -rf '{dir}'\n",
            bin = bin.display(),
            dir = dir.display(),
        );
        let mut wrapper = Command::new(run_as[0])
            .args(&run_as[1..])
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start the PostgreSQL wrapper (sh)")?;
        let lifeline = wrapper.stdin.take();
        let mut cluster = Cluster {
            dir,
            bin: bin.to_path_buf(),
            lifeline,
            wrapper,
        };
        cluster.wait_ready(within)?;
        Ok(cluster)
    }

    /// Waits until the server answers; on failure (the wrapper ended, e.g. a failed
    /// `initdb`, or `within` passed) removes the directory and names the logs.
    fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            if self.psql("postgres", "SELECT 1").is_ok() {
                return Ok(());
            }
            let ended = self.wrapper.try_wait().ok().flatten();
            if ended.is_some() || started.elapsed() > within {
                let log =
                    |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
                let what = match ended {
                    Some(status) => format!("PostgreSQL's start-up script ended ({status})"),
                    None => format!("PostgreSQL did not start within {within:?}"),
                };
                let error = anyhow::anyhow!(
                    "{what} in {}\ninitdb:\n{}\nserver:\n{}",
                    self.dir.display(),
                    log("initdb.log"),
                    log("server.log")
                );
                let _ = std::fs::remove_dir_all(&self.dir);
                return Err(error);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A libpq key=value connection string for database `dbname`: `host=<socket
    /// dir> port=5432 user=postgres dbname=<dbname>`.
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "host={} port=5432 user=postgres dbname={dbname}",
            self.dir.display()
        )
    }

    /// Runs `sql` through `psql` on database `dbname`; what psql printed (unaligned,
    /// tuples only, trimmed). Errors: psql could not run or failed (its stderr).
    pub fn psql(&self, dbname: &str, sql: &str) -> Result<String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args(["-p", "5432", "-U", "postgres", "-d", dbname, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .context("run psql")?;
        if !out.status.success() {
            bail!(
                "psql {sql:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for Cluster {
    /// Closes the lifeline and waits for the wrapper: the server is stopped and its
    /// directory removed when this returns.
    fn drop(&mut self) {
        drop(self.lifeline.take());
        let _ = self.wrapper.wait();
    }
}
