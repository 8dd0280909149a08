//! Talking to qd: find the admin socket, connect, send one request frame per call
//! and read its response line. Errors say which socket was tried and why.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use qd_proto::{ErrorBody, ErrorCode, MAX_FRAME, Reply, Request, RequestFrame, Response, VERSION};
use serde::Deserialize;

/// Where qd listens when nothing else says.
pub const DEFAULT_SOCKET: &str = "/run/qd/qctl.sock";

/// Everything that makes qctl fail, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line or a file it names is wrong (exit 2).
    #[error("{0}")]
    Usage(String),
    /// No daemon could be reached at `path` (exit 1).
    #[error("cannot reach qd at {path}: {reason}")]
    Unreachable {
        /// The socket tried.
        path: PathBuf,
        /// "no such file", "permission denied", "connection refused", ...
        reason: String,
    },
    /// The daemon answered with an error (exit 1).
    #[error("qd refused ({}): {}", .0.code, .0.message)]
    Daemon(ErrorBody),
    /// The conversation broke (timeout, bad answer) (exit 1).
    #[error("{0}")]
    Protocol(String),
    /// The request does not fit in one admin frame ([`MAX_FRAME`]); refused before
    /// anything is sent, with the words of [`over_frame`] (exit 1).
    #[error("{0}")]
    TooLarge(String),
}

impl CliError {
    /// The process exit code: 2 for usage, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            _ => 1,
        }
    }

    /// The stable code of `--json` errors: the daemon's [`qd_proto::ErrorCode`], or
    /// `usage`, `unreachable`, `protocol` for failures on qctl's side, and
    /// `frame_too_large` for a request qctl did not send because it is too large.
    pub fn code(&self) -> &'static str {
        match self {
            CliError::Usage(_) => "usage",
            CliError::Unreachable { .. } => "unreachable",
            CliError::Daemon(body) => body.code.as_str(),
            CliError::Protocol(_) => "protocol",
            CliError::TooLarge(_) => ErrorCode::FrameTooLarge.as_str(),
        }
    }

    /// The message of `--json` errors: the daemon's own words for its refusals.
    pub fn message(&self) -> String {
        match self {
            CliError::Daemon(body) => body.message.clone(),
            other => other.to_string(),
        }
    }
}

#[derive(Deserialize)]
struct ConfigFile {
    daemon: Option<DaemonSection>,
}

#[derive(Deserialize)]
struct DaemonSection {
    admin_socket: Option<PathBuf>,
}

/// The socket path: `flag`, else `env` (`QD_SOCKET`), else `[daemon] admin_socket`
/// of the `config` file (relative paths are taken from the file's directory), else
/// [`DEFAULT_SOCKET`]. Errors (usage) when the config file cannot be read or parsed.
pub fn resolve_socket(
    flag: Option<&Path>,
    env: Option<OsString>,
    config: Option<&Path>,
) -> Result<PathBuf, CliError> {
    if let Some(path) = flag {
        return Ok(path.to_path_buf());
    }
    if let Some(path) = env.filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let Some(file) = config else {
        return Ok(PathBuf::from(DEFAULT_SOCKET));
    };
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::Usage(format!("cannot read config {}: {e}", file.display())))?;
    let parsed: ConfigFile = toml::from_str(&text)
        .map_err(|e| CliError::Usage(format!("cannot parse config {}: {e}", file.display())))?;
    let socket = parsed.daemon.and_then(|d| d.admin_socket);
    Ok(match socket {
        Some(p) if p.is_relative() => file.parent().unwrap_or(Path::new(".")).join(p),
        Some(p) => p,
        None => PathBuf::from(DEFAULT_SOCKET),
    })
}

/// An open admin connection.
pub struct Client {
    reader: BufReader<UnixStream>,
    next_id: u64,
    /// The socket connected to, named when the connection breaks.
    path: PathBuf,
}

impl Client {
    /// Connects to `path`; every read and write gives up after `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, CliError> {
        let unreachable = |e: io::Error| CliError::Unreachable {
            path: path.to_path_buf(),
            reason: reason(&e),
        };
        let stream = UnixStream::connect(path).map_err(|e| {
            // A regular file (a typo'd --socket, a log file) refuses the connection
            // like a stale socket would; say what it really is.
            match std::fs::metadata(path) {
                Ok(meta) if e.kind() == io::ErrorKind::ConnectionRefused && !is_socket(&meta) => {
                    CliError::Unreachable {
                        path: path.to_path_buf(),
                        reason: "not a socket (is --socket or QD_SOCKET the admin socket of qd?)"
                            .into(),
                    }
                }
                _ => unreachable(e),
            }
        })?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(unreachable)?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(unreachable)?;
        Ok(Client {
            reader: BufReader::new(stream),
            next_id: 1,
            path: path.to_path_buf(),
        })
    }

    /// Sends `req` and returns the daemon's answer; an error answer becomes
    /// [`CliError::Daemon`]. A request whose frame would be over [`MAX_FRAME`] bytes
    /// is not sent: [`CliError::TooLarge`] names its size and its payload's (the
    /// daemon would only close the connection on it, mid-write).
    pub fn call(&mut self, req: Request) -> Result<Response, CliError> {
        let id = self.next_id;
        self.next_id += 1;
        let what = match &req {
            Request::Enqueue { payload, .. }
            | Request::DlqRedrive {
                payload: Some(payload),
                ..
            } => format!("the request (a payload of {} bytes)", payload.size()),
            other => format!("the {} request", other.op()),
        };
        let line = qd_proto::encode_request(&RequestFrame {
            v: VERSION,
            id,
            req,
        });
        let size = line.len() - 1; // the newline is not counted
        if size > MAX_FRAME {
            return Err(CliError::TooLarge(over_frame(&what, size, MAX_FRAME)));
        }
        let path = self.path.display().to_string();
        let broken = |e: io::Error| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => CliError::Protocol(format!(
                "qd at {path} did not answer: {} (see --timeout)",
                reason(&e)
            )),
            _ => CliError::Protocol(format!(
                "the admin connection to qd at {path} broke: {} (did qd stop or restart?)",
                reason(&e)
            )),
        };
        self.reader.get_mut().write_all(&line).map_err(broken)?;
        let mut answer = Vec::new();
        let n = self.reader.read_until(b'\n', &mut answer).map_err(broken)?;
        if n == 0 {
            return Err(CliError::Protocol(format!(
                "qd at {path} closed the connection without answering (did qd stop or restart?)"
            )));
        }
        let frame = qd_proto::decode_response(&answer)
            .map_err(|e| CliError::Protocol(format!("unreadable answer from qd: {e}")))?;
        match frame.reply {
            // Errors for unreadable frames carry no id; trust them regardless.
            Reply::Err(err) => Err(CliError::Daemon(err)),
            Reply::Ok(_) if frame.id != Some(id) => Err(CliError::Protocol(format!(
                "answer for request {:?} arrived while waiting for {id}",
                frame.id
            ))),
            Reply::Ok(resp) => Ok(resp),
        }
    }
}

/// Why `size` bytes of JSON cannot be sent in one admin frame that has room for
/// `room` bytes of them: `"{what} is {size} bytes of JSON; the admin socket carries at
/// most {room} per frame (use the HTTP API for larger payloads)"`. `what` names what
/// was to be sent (`"the job"`, `"the request (a payload of N bytes)"`).
pub fn over_frame(what: &str, size: usize, room: usize) -> String {
    format!(
        "{what} is {size} bytes of JSON; the admin socket carries at most {room} per frame (use the HTTP API for larger payloads)"
    )
}

/// A short reason for an I/O error, as operators know them.
fn reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => {
            "no such file (is qd running? try --socket, QD_SOCKET or --config)".into()
        }
        io::ErrorKind::PermissionDenied => {
            "permission denied (are you in qd's admin group?)".into()
        }
        io::ErrorKind::ConnectionRefused => {
            "connection refused (nothing listens there; stale socket?)".into()
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "timed out waiting for qd".into(),
        _ => e.to_string(),
    }
}

fn is_socket(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    meta.file_type().is_socket()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connecting_to_a_regular_file_says_it_is_not_a_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("qd.log");
        std::fs::write(&file, "not a socket").expect("write");
        let err = Client::connect(&file, Duration::from_secs(1))
            .err()
            .expect("unreachable");
        let text = err.to_string();
        assert!(text.contains("not a socket"), "{text}");
        assert!(!text.contains("stale socket"), "{text}");
    }

    #[test]
    fn flag_beats_env_beats_config_beats_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("qd.toml");
        std::fs::write(&cfg, "[daemon]\nadmin_socket = \"/srv/qd.sock\"\n").expect("write");
        let flag = Path::new("/flag.sock");
        let env = Some(OsString::from("/env.sock"));
        assert_eq!(
            resolve_socket(Some(flag), env.clone(), Some(&cfg)).expect("ok"),
            flag
        );
        assert_eq!(
            resolve_socket(None, env, Some(&cfg)).expect("ok"),
            Path::new("/env.sock")
        );
        assert_eq!(
            resolve_socket(None, None, Some(&cfg)).expect("ok"),
            Path::new("/srv/qd.sock")
        );
        assert_eq!(
            resolve_socket(None, Some(OsString::new()), None).expect("ok"),
            Path::new(DEFAULT_SOCKET)
        );
    }

    #[test]
    fn a_relative_socket_in_the_config_is_taken_from_the_config_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("qd.toml");
        std::fs::write(&cfg, "[daemon]\ndata_dir = \"var\"\nadmin_socket = \"var/qctl.sock\"\n[queues.email]\nmax_attempts = 3\n").expect("write");
        assert_eq!(
            resolve_socket(None, None, Some(&cfg)).expect("ok"),
            dir.path().join("var/qctl.sock")
        );
    }

    #[test]
    fn a_config_without_the_key_falls_back_to_the_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("qd.toml");
        std::fs::write(&cfg, "[defaults]\nlease = \"30s\"\n").expect("write");
        assert_eq!(
            resolve_socket(None, None, Some(&cfg)).expect("ok"),
            Path::new(DEFAULT_SOCKET)
        );
    }

    #[test]
    fn an_unreadable_config_is_a_usage_error_naming_the_file() {
        let err =
            resolve_socket(None, None, Some(Path::new("/nonexistent/qd.toml"))).expect_err("fails");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("/nonexistent/qd.toml"));
    }

    #[test]
    fn connecting_to_a_missing_socket_names_the_path_and_reason() {
        let err = Client::connect(Path::new("/nonexistent/qctl.sock"), Duration::from_secs(1))
            .err()
            .expect("unreachable");
        let text = err.to_string();
        assert!(
            text.contains("/nonexistent/qctl.sock") && text.contains("no such file"),
            "{text}"
        );
        assert_eq!(err.exit_code(), 1);
    }
}
