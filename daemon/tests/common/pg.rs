//! A throw-away PostgreSQL cluster for tests: one per test binary, started on first
//! use, a fresh database per test ([`database`]), so tests stay independent and fast.
//!
//! The cluster lives in a temp directory: `initdb` (trust authentication, UTF-8, C
//! locale), then `postgres` listening on a Unix socket in that directory only
//! (`listen_addresses=''`), fsync on. Run as root (CI), both run as the `postgres`
//! user through `runuser`, on a directory owned by it. A shell wrapper waits on a
//! pipe from this process: when the test binary exits, however it exits, the pipe
//! closes and the wrapper stops the server (immediate shutdown) and removes the
//! directory.
//!
//! The binaries come from the PATH (`initdb`, resolved to its real directory) or from
//! Debian's `/usr/lib/postgresql/<version>/bin`. Missing: [`database`] reports it
//! through [`tools::tool_missing`] (fails under `CI=true`, skips visibly elsewhere)
//! and answers `None`. Used by `daemon/tests/*` and, included by path, by the crate's
//! store tests.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::tools;

/// How long the cluster may take to start on a busy machine.
const START_WITHIN: Duration = Duration::from_secs(120);

/// A running cluster (see the module doc).
pub struct Cluster {
    /// The directory of the socket, the data and the server log.
    dir: PathBuf,
    /// Where `psql` is.
    bin: PathBuf,
    /// The wrapper's stdin: closed when this process exits, which stops the server.
    _lifeline: Mutex<ChildStdin>,
    _wrapper: Mutex<Child>,
}

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
        self.cluster.psql(&self.name, sql)
    }
}

/// A fresh database on this test binary's cluster, started on first use; `None`
/// (after a visible skip, or a failure under `CI=true`) when PostgreSQL is not
/// installed. Panics if it is installed but does not start.
pub fn database() -> Option<Database> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let Some(cluster) = CLUSTER.get_or_init(Cluster::start).as_ref() else {
        tools::tool_missing(
            "PostgreSQL (initdb, postgres)",
            "install the Debian package postgresql",
        );
        return None;
    };
    let name = format!(
        "qd_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    cluster.psql("postgres", &format!("CREATE DATABASE {name}"));
    Some(Database {
        url: format!(
            "host={} port=5432 user=postgres dbname={name}",
            cluster.dir.display()
        ),
        name,
        cluster,
    })
}

/// The directory holding `initdb`, `postgres` and `psql`, if installed.
fn binaries() -> Option<PathBuf> {
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
    fn start() -> Option<Cluster> {
        let bin = binaries()?;
        let root = nix::unistd::Uid::effective().is_root();
        let dir = tempfile::Builder::new()
            .prefix("qd-pg-")
            .tempdir()
            .expect("temp dir for the cluster")
            .keep();
        let run_as: Vec<String> = if root {
            let user = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .expect("running as root: the postgres user must exist to run the cluster");
            std::os::unix::fs::chown(&dir, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .expect("chown the cluster dir to postgres");
            ["runuser", "-u", "postgres", "--"]
                .map(String::from)
                .to_vec()
        } else {
            Vec::new()
        };
        let script = format!(
            "set -e\n\
             '{bin}/initdb' -D '{dir}/data' -U postgres -A trust -E UTF8 --locale=C --no-sync \
               > '{dir}/initdb.log' 2>&1\n\
             '{bin}/postgres' -D '{dir}/data' -c listen_addresses= -k '{dir}' -c port=5432 \
               -c max_connections=200 -c shared_buffers=32MB > '{dir}/server.log' 2>&1 &\n\
             pid=$!\n\
             read _ || true\n\
             kill -QUIT $pid 2>/dev/null || true\n\
             wait $pid || true\n\
             rm -rf '{dir}'\n",
            bin = bin.display(),
            dir = dir.display(),
        );
        let mut command = match run_as.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg("sh");
                c
            }
            None => Command::new("sh"),
        };
        let mut wrapper = command
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the PostgreSQL wrapper");
        let lifeline = wrapper.stdin.take().expect("piped stdin");
        let cluster = Cluster {
            dir,
            bin,
            _lifeline: Mutex::new(lifeline),
            _wrapper: Mutex::new(wrapper),
        };
        cluster.wait_ready();
        Some(cluster)
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        loop {
            let ready = self
                .psql_command("postgres", "SELECT 1")
                .output()
                .is_ok_and(|o| o.status.success());
            if ready {
                return;
            }
            if started.elapsed() > START_WITHIN {
                let log =
                    |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
                panic!(
                    "PostgreSQL did not start within {START_WITHIN:?} in {}\ninitdb:\n{}\nserver:\n{}",
                    self.dir.display(),
                    log("initdb.log"),
                    log("server.log")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn psql_command(&self, dbname: &str, sql: &str) -> Command {
        let mut c = Command::new(self.bin.join("psql"));
        c.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args(["-p", "5432", "-U", "postgres", "-d", dbname, "-c", sql])
            .stdin(Stdio::null());
        c
    }

    fn psql(&self, dbname: &str, sql: &str) -> String {
        let out = self.psql_command(dbname, sql).output().expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}
