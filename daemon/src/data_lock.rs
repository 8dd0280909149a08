//! One daemon per data directory: an exclusive `flock(2)` on `data_dir/qd.lock`.
//!
//! `main` takes the lock before it opens the store or binds anything, and holds
//! it until the process exits (the kernel releases it then, even after `kill -9`,
//! so a stale file never blocks a restart). The file holds the holder's pid, as
//! text, so a refused second daemon can name it. Two daemons on one store would
//! each take the other's live leases for an earlier run's and run jobs twice.
//! The lock is per node: with a shared database (PostgreSQL) it only guards the
//! local directory.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock file's name inside `data_dir`.
pub const LOCK_FILE: &str = "qd.lock";

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error(
        "data_dir {dir} is in use by another qd (pid {holder}, lock file {file}); refusing to start"
    )]
    Held {
        /// The data directory.
        dir: PathBuf,
        /// The lock file.
        file: PathBuf,
        /// The holder's pid as written in the file ("unknown" when unreadable).
        holder: String,
    },
    /// The lock file could not be opened, locked or written.
    #[error("cannot {action} lock file {file}: {source}")]
    Io {
        /// The lock file.
        file: PathBuf,
        /// What was attempted ("open", "lock", "write").
        action: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The held lock; dropping it (or exiting) releases it.
#[derive(Debug)]
pub struct DataDirLock {
    _file: Flock<File>,
}

impl DataDirLock {
    /// Takes the lock on `data_dir` (which must exist) without waiting, and writes
    /// this process's pid into the lock file.
    ///
    /// Errors: [`LockError::Held`] naming the holder's pid when another process
    /// holds it; [`LockError::Io`] when the file cannot be opened or written.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, LockError> {
        let path = data_dir.join(LOCK_FILE);
        let io = |action: &'static str| {
            let file = path.clone();
            move |source: io::Error| LockError::Io {
                file,
                action,
                source,
            }
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("open"))?;
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(LockError::Held {
                    dir: data_dir.to_path_buf(),
                    file: path.clone(),
                    holder: if holder.is_empty() {
                        "unknown".into()
                    } else {
                        holder.to_string()
                    },
                });
            }
            Err((_, errno)) => return Err(io("lock")(errno.into())),
        };
        file.set_len(0).map_err(io("write"))?;
        file.rewind().map_err(io("write"))?;
        writeln!(file, "{}", std::process::id()).map_err(io("write"))?;
        file.sync_all().map_err(io("write"))?;
        Ok(DataDirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_with_the_holders_pid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = DataDirLock::acquire(dir.path()).expect("first lock");
        let err = DataDirLock::acquire(dir.path()).expect_err("second refused");
        let text = err.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        drop(first);
        DataDirLock::acquire(dir.path()).expect("free again after release");
    }
}
