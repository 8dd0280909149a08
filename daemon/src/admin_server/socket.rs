//! The admin socket file: replace a stale one, refuse to steal a live one, bind,
//! then set mode and group. The listener's [`SocketGuard`] removes the file again.

use std::fs::Permissions;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, chown};
use tokio::net::{UnixListener, UnixStream};

/// Why the admin socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AdminSocketError {
    /// A live process (another qd) accepted a connection on the path.
    #[error("another qd is serving the admin socket {path}; refusing to start")]
    AlreadyServing {
        /// The socket path.
        path: PathBuf,
    },
    /// Something that is not a socket sits at the path; qd will not delete it.
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket {
        /// The offending path.
        path: PathBuf,
    },
    /// `admin_group` names no group in the group database.
    #[error("admin_group {0:?} is not a known group")]
    UnknownGroup(String),
    /// A file-system or socket call failed.
    #[error("admin socket {path}: cannot {action}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What was attempted ("bind", "set mode 0660 on", ...).
        action: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path, action: impl Into<String>) -> impl FnOnce(io::Error) -> AdminSocketError {
    let path = path.to_path_buf();
    let action = action.into();
    move |source| AdminSocketError::Io {
        path,
        action,
        source,
    }
}

/// Resolves a group name to its gid.
pub fn resolve_group(name: &str) -> Result<u32, AdminSocketError> {
    match nix::unistd::Group::from_name(name) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        _ => Err(AdminSocketError::UnknownGroup(name.to_owned())),
    }
}

/// Removes the file at the guarded path when dropped (the socket was ours).
#[derive(Debug)]
pub struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "Could not remove the admin socket file.");
        }
    }
}

/// Binds the admin socket at `path` with file mode `mode` (e.g. `0o660`) and, when
/// given, group `gid`. A leftover socket file nobody answers on is replaced; a live
/// one fails with [`AdminSocketError::AlreadyServing`]. The parent directory is
/// created if missing.
pub async fn bind(
    path: &Path,
    mode: u32,
    gid: Option<u32>,
) -> Result<(UnixListener, SocketGuard), AdminSocketError> {
    clear_stale(path).await?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err(dir, "create the directory"))?;
    }
    let listener = UnixListener::bind(path).map_err(io_err(path, "bind"))?;
    let guard = SocketGuard(path.to_path_buf());
    std::fs::set_permissions(path, Permissions::from_mode(mode))
        .map_err(io_err(path, format!("set mode {mode:04o} on")))?;
    if let Some(gid) = gid {
        chown(path, None, Some(Gid::from_raw(gid)))
            .map_err(|e| io_err(path, format!("set group {gid} on"))(e.into()))?;
    }
    Ok((listener, guard))
}

/// Checks, before anything else starts, that no live process answers on the admin
/// socket `path` and that nothing but a socket sits there. `main` calls it so a
/// second daemon stops with one clear line before it opens the store.
///
/// Errors: [`AdminSocketError::AlreadyServing`], [`AdminSocketError::NotASocket`],
/// or [`AdminSocketError::Io`] when the path cannot be inspected.
pub async fn ensure_not_served(path: &Path) -> Result<(), AdminSocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path, "inspect")(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(AdminSocketError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    if UnixStream::connect(path).await.is_ok() {
        return Err(AdminSocketError::AlreadyServing {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Deletes a socket file left by a crashed run; errors if it is live or not a socket.
async fn clear_stale(path: &Path) -> Result<(), AdminSocketError> {
    ensure_not_served(path).await?;
    if !path.exists() {
        return Ok(());
    }
    tracing::info!(path = %path.display(), "Replacing a stale admin socket file.");
    std::fs::remove_file(path).map_err(io_err(path, "remove the stale socket"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_file_is_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("qctl.sock");
        // A bound-then-dropped std listener leaves a socket file nobody answers on.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        let (_listener, _guard) = bind(&path, 0o660, None).await.expect("stale file replaced");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o660);
    }

    #[tokio::test]
    async fn a_live_socket_is_not_stolen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("qctl.sock");
        let (_live, _guard) = bind(&path, 0o600, None).await.expect("first bind");
        let err = bind(&path, 0o600, None)
            .await
            .expect_err("second bind refused");
        assert!(
            matches!(err, AdminSocketError::AlreadyServing { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("another qd is serving"));
    }

    #[tokio::test]
    async fn a_regular_file_at_the_path_is_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("qctl.sock");
        std::fs::write(&path, b"precious").expect("write");
        let err = bind(&path, 0o660, None).await.expect_err("refused");
        assert!(matches!(err, AdminSocketError::NotASocket { .. }));
        assert_eq!(std::fs::read(&path).expect("still there"), b"precious");
    }

    #[tokio::test]
    async fn the_guard_removes_the_socket_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("qctl.sock");
        let (listener, guard) = bind(&path, 0o660, None).await.expect("bind");
        assert!(path.exists());
        drop(listener);
        drop(guard);
        assert!(!path.exists());
    }

    #[test]
    fn an_unknown_group_is_named_in_the_error() {
        let err = resolve_group("no-such-group-qd-test").expect_err("unknown");
        assert!(err.to_string().contains("no-such-group-qd-test"));
    }
}
