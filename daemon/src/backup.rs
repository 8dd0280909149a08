//! Online backup: a consistent snapshot of the SQLite store while qd keeps serving
//! (`qctl backup PATH`).
//!
//! Why a separate connection and not the writer thread: the store runs in WAL
//! mode, where a reader never blocks the writer. The snapshot is taken with
//! SQLite's online backup API (`sqlite3_backup_step(-1)`) from a read-only
//! connection of its own, in one read transaction, so it is the database as of one
//! commit; group commit goes on meanwhile (only WAL checkpoints wait for it to
//! finish). Stepping in small chunks instead would restart the copy after every
//! commit of the busy writer and might never finish under load.
//!
//! The copy goes to a hidden temporary file beside `dest` (mode 0600: payloads may
//! be sensitive), is switched to a rollback journal so it is one self-contained
//! file, checked (`PRAGMA quick_check`), counted, fsynced, then renamed over `dest`
//! and the directory fsynced: `dest` is either absent, the old file, or the whole
//! snapshot, never half of one.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use crate::job::State;

/// How long the copy retries while the source is briefly busy (e.g. a checkpoint).
const BUSY_RETRY: Duration = Duration::from_secs(30);

/// A finished snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The snapshot file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Jobs in it per state, every state in life-cycle order (zeros included).
    pub jobs: Vec<(State, u64)>,
}

/// Why no snapshot was written. `dest` is unchanged in every case.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The destination path is relative (the daemon's working directory is not the
    /// operator's).
    #[error("backup path {0} is not absolute")]
    NotAbsolute(PathBuf),
    /// A file exists at the destination and `force` was not given.
    #[error("{0} exists; pass --force to replace it")]
    Exists(PathBuf),
    /// The destination is one of the running daemon's own files (its database, WAL,
    /// lock or admin socket): replacing it would lose every later commit or break
    /// the one-daemon lock. Refused with or without `force`.
    #[error(
        "{0} is a file of the running qd (its store, lock or admin socket); write the backup elsewhere"
    )]
    LiveFile(PathBuf),
    /// The destination's directory does not exist (or is not a directory) as the
    /// daemon sees it.
    #[error(
        "{0} is not a directory qd can write in; create it first (qd writes the backup itself, as its own user)"
    )]
    NoDirectory(PathBuf),
    /// A file-system call failed.
    #[error("backup to {path}: cannot {action}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What was attempted.
        action: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// SQLite failed to read the store or write the copy.
    #[error("backup of {db}: {message}")]
    Sqlite {
        /// The store's database file.
        db: PathBuf,
        /// SQLite's message.
        message: String,
    },
}

/// Copies the database at `db` (the live store) to `dest`, replacing an existing
/// file only when `force`; never one of `live` (the daemon's own files: see
/// [`live_files`]), compared after resolving the directories' symlinks and by the
/// directory's identity (a bind mount of `data_dir` is the same directory). Blocking:
/// call it from a blocking thread.
///
/// Errors: see [`BackupError`]; a leftover temporary file is removed.
pub fn snapshot(
    db: &Path,
    dest: &Path,
    force: bool,
    live: &[PathBuf],
) -> Result<Snapshot, BackupError> {
    if !dest.is_absolute() {
        return Err(BackupError::NotAbsolute(dest.to_path_buf()));
    }
    let target = resolved(dest);
    let entry = dir_entry(dest);
    if live
        .iter()
        .any(|f| resolved(f) == target || entry.is_some() && dir_entry(f) == entry)
    {
        return Err(BackupError::LiveFile(dest.to_path_buf()));
    }
    if !force && std::fs::symlink_metadata(dest).is_ok() {
        return Err(BackupError::Exists(dest.to_path_buf()));
    }
    let dir = dest.parent().unwrap_or(Path::new("/"));
    if !dir.is_dir() {
        return Err(BackupError::NoDirectory(dir.to_path_buf()));
    }
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "qd-backup".into());
    let tmp = dir.join(format!(".{name}.partial-{}", std::process::id()));
    let result = copy_into(db, &tmp).and_then(|jobs| publish(&tmp, dest, dir).map(|s| (jobs, s)));
    match result {
        Ok((jobs, size_bytes)) => Ok(Snapshot {
            path: dest.to_path_buf(),
            size_bytes,
            jobs,
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The files a running daemon with the SQLite store `db` (in `data_dir`) and
/// `admin_socket` owns: the database, its WAL, shared-memory and journal files, the
/// data directory's lock file and the admin socket.
pub fn live_files(db: &Path, data_dir: &Path, admin_socket: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["", "-wal", "-shm", "-journal"]
        .iter()
        .map(|suffix| {
            let mut name = db.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        })
        .collect();
    files.push(data_dir.join(crate::data_lock::LOCK_FILE));
    files.push(admin_socket.to_path_buf());
    files
}

/// `path` with its directory's symlinks resolved (the last component kept as is:
/// a rename replaces that entry, not what it points to); as given when the
/// directory cannot be resolved.
fn resolved(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// The directory entry `path` names, as its directory's device and inode and its
/// own name: the same for every path to that directory, a bind mount's included,
/// which no resolution of symlinks sees. `None` if the directory cannot be read.
fn dir_entry(path: &Path) -> Option<(u64, u64, std::ffi::OsString)> {
    use std::os::unix::fs::MetadataExt;
    let name = path.file_name()?;
    let dir = std::fs::metadata(path.parent()?).ok()?;
    Some((dir.dev(), dir.ino(), name.to_owned()))
}

/// Writes the snapshot into `tmp` (created 0600) and returns its job counts.
fn copy_into(db: &Path, tmp: &Path) -> Result<Vec<(State, u64)>, BackupError> {
    let sql = |e: rusqlite::Error| BackupError::Sqlite {
        db: db.to_path_buf(),
        message: e.to_string(),
    };
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(tmp)
        .map_err(io_err(tmp, "create"))?;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let source = Connection::open_with_flags(db, flags).map_err(sql)?;
    source.busy_timeout(Duration::from_secs(5)).map_err(sql)?;
    let mut copy = Connection::open(tmp).map_err(sql)?;
    {
        let backup = Backup::new(&source, &mut copy).map_err(sql)?;
        let started = std::time::Instant::now();
        loop {
            match backup.step(-1).map_err(sql)? {
                StepResult::Done => break,
                StepResult::More => {}
                _ if started.elapsed() < BUSY_RETRY => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    return Err(BackupError::Sqlite {
                        db: db.to_path_buf(),
                        message: format!("the store stayed busy for {BUSY_RETRY:?}"),
                    });
                }
            }
        }
    }
    drop(source);
    copy.pragma_update(None, "journal_mode", "DELETE")
        .map_err(sql)?;
    let check: String = copy
        .pragma_query_value(None, "quick_check", |r| r.get(0))
        .map_err(sql)?;
    if check != "ok" {
        return Err(BackupError::Sqlite {
            db: db.to_path_buf(),
            message: format!("the copy failed its integrity check: {check}"),
        });
    }
    let jobs = count_jobs(&copy).map_err(sql)?;
    copy.close().map_err(|(_, e)| sql(e))?;
    Ok(jobs)
}

/// Jobs per state in the database behind `conn`, every state listed.
fn count_jobs(conn: &Connection) -> rusqlite::Result<Vec<(State, u64)>> {
    let mut stmt = conn.prepare("SELECT state, count(*) FROM jobs GROUP BY state")?;
    let found: Vec<(String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(State::ALL
        .iter()
        .map(|s| {
            let n = found
                .iter()
                .find(|(name, _)| name == s.as_str())
                .map_or(0, |(_, n)| u64::try_from(*n).unwrap_or(0));
            (*s, n)
        })
        .collect())
}

/// fsyncs `tmp`, renames it to `dest`, fsyncs the directory; returns the size.
fn publish(tmp: &Path, dest: &Path, dir: &Path) -> Result<u64, BackupError> {
    let file = File::open(tmp).map_err(io_err(tmp, "open"))?;
    file.sync_all().map_err(io_err(tmp, "fsync"))?;
    let size = file.metadata().map_err(io_err(tmp, "stat"))?.len();
    std::fs::rename(tmp, dest).map_err(io_err(dest, "rename the finished copy to"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir, "fsync the directory"))?;
    Ok(size)
}

fn io_err(path: &Path, action: &'static str) -> impl FnOnce(io::Error) -> BackupError {
    let path = path.to_path_buf();
    move |source| BackupError::Io {
        path,
        action,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn a_snapshot_refuses_an_existing_file_unless_forced_and_counts_jobs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("qd.db");
        let store = Store::open_sqlite(&db).expect("open");
        let dest = dir.path().join("backup.db");
        let snap = snapshot(&db, &dest, false, &[]).expect("snapshot");
        assert!(snap.size_bytes > 0);
        assert!(snap.jobs.iter().all(|(_, n)| *n == 0));
        assert_eq!(snap.jobs.len(), State::ALL.len());
        let err = snapshot(&db, &dest, false, &[]).expect_err("exists");
        assert!(matches!(err, BackupError::Exists(_)), "{err}");
        snapshot(&db, &dest, true, &[]).expect("forced");
        let relative = snapshot(&db, Path::new("b.db"), true, &[]).expect_err("relative");
        assert!(matches!(relative, BackupError::NotAbsolute(_)));
        let nowhere = dir.path().join("missing").join("b.db");
        let missing = snapshot(&db, &nowhere, false, &[]).expect_err("no directory");
        assert!(matches!(missing, BackupError::NoDirectory(_)), "{missing}");
        assert!(missing.to_string().contains("missing"), "{missing}");
        let leftovers = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains("partial"))
            .count();
        assert_eq!(leftovers, 0, "no temporary file left behind");
        store.close();
    }
}
