//! Operations requests: `backup` (an online snapshot of the store) and `reload`
//! (re-read the config, as SIGHUP does). One function per request.

use std::path::PathBuf;
use std::time::Duration;

use qd_proto::{BackupInfo, ErrorBody, ErrorCode, ReloadInfo, Response, StateCount};
use tracing::{info, warn};

use crate::backup::{self, BackupError};
use crate::clock::wall_ms;
use crate::daemon::Daemon;
use crate::reload::ReloadError;

/// How long a reload may take (reading the file, stopping a removed queue's actors).
const RELOAD_WAIT: Duration = Duration::from_secs(60);

/// `backup`: writes a consistent snapshot of the store to `path` (absolute) while
/// qd serves. Errors: `bad_request` for a relative path, a directory that does not
/// exist or one of the running daemon's own files (store, WAL, lock, admin socket),
/// `conflict` for an existing
/// file without `force` or a PostgreSQL store (backed up by the database's own
/// tools), `internal` when the copy fails.
pub(super) async fn backup(
    daemon: &Daemon,
    path: String,
    force: bool,
    by: &str,
) -> Result<Response, ErrorBody> {
    if let Some(database) = &daemon.config().daemon.database {
        return Err(ErrorBody::new(
            ErrorCode::Conflict,
            format!(
                "the store is {}: back it up with pg_dump or the database's own backups \
                 (qctl backup copies the SQLite store only)",
                database.describe()
            ),
        ));
    }
    let config = daemon.config();
    let db = config.db_path();
    let live = backup::live_files(&db, &config.daemon.data_dir, &config.daemon.admin_socket);
    let dest = PathBuf::from(&path);
    let taken_at = wall_ms();
    let done = tokio::task::spawn_blocking(move || backup::snapshot(&db, &dest, force, &live))
        .await
        .map_err(|e| ErrorBody::new(ErrorCode::Internal, format!("backup task failed: {e}")))?;
    match done {
        Ok(snap) => {
            let jobs: u64 = snap.jobs.iter().map(|(_, n)| n).sum();
            info!(path = %snap.path.display(), bytes = snap.size_bytes, jobs, by, "Store backed up.");
            Ok(Response::Backup(BackupInfo {
                path: snap.path.display().to_string(),
                size_bytes: snap.size_bytes,
                jobs: snap
                    .jobs
                    .into_iter()
                    .map(|(state, count)| StateCount {
                        state: state.as_str().to_string(),
                        count,
                    })
                    .collect(),
                taken_at,
            }))
        }
        Err(e) => {
            warn!(path, error = %e, by, "Backup failed.");
            let code = match e {
                BackupError::NotAbsolute(_)
                | BackupError::LiveFile(_)
                | BackupError::NoDirectory(_) => ErrorCode::BadRequest,
                BackupError::Exists(_) => ErrorCode::Conflict,
                BackupError::Io { .. } | BackupError::Sqlite { .. } => ErrorCode::Internal,
            };
            Err(ErrorBody::new(code, e.to_string()))
        }
    }
}

/// `reload`: asks the Supervisor to reload the config and answers what changed.
/// Errors: `bad_request` with every problem of an invalid file, `conflict` for
/// changes that cannot apply live, `unavailable` when qd is shutting down.
pub(super) async fn reload(daemon: &Daemon, by: &str) -> Result<Response, ErrorBody> {
    info!(by, "Config reload requested.");
    match daemon.control.reload(RELOAD_WAIT).await {
        Ok(changes) => Ok(Response::Reloaded(ReloadInfo {
            path: daemon.config().source.display().to_string(),
            changes,
        })),
        Err(e) => {
            let code = match e {
                ReloadError::Invalid(_) => ErrorCode::BadRequest,
                ReloadError::Refused(_) => ErrorCode::Conflict,
                ReloadError::Unavailable(_) => ErrorCode::Unavailable,
            };
            Err(ErrorBody::new(code, e.to_string()))
        }
    }
}
