//! `AdminServer`: the actor that owns the admin Unix socket used by `qctl`.
//!
//! `pre_start` binds the socket (replacing a stale file, refusing if another qd
//! answers on it), sets its mode and group, and spawns a tokio accept task. The
//! actor itself never awaits `accept`, so it always processes Stop. Each accepted
//! connection gets its own task ([`conn`]); the peer's credentials (`SO_PEERCRED`)
//! decide access ([`access`]); decoded requests go to an [`AdminHandler`], which the
//! daemon wires to its broker. The wire protocol lives in `qd_proto` and is specified
//! in `daemon/docs/admin-protocol.md`.
//!
//! Messages: [`AdminServerMsg::AcceptFailed`] (from its own accept task; the actor
//! then fails so its supervisor restarts it). Supervised by the Supervisor.
//! `post_stop` aborts the accept task (dropping every connection task) and removes
//! the socket file; the same happens if the state is dropped after a panic.

mod access;
mod conn;
mod socket;

pub use access::{Peer, allowed};
pub use socket::{AdminSocketError, ensure_not_served, resolve_group};

use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use qd_proto::{ErrorBody, Request, Response};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};

use conn::ConnConfig;

/// Answers admin requests. Implemented by the daemon's glue to its actors, and by
/// fakes in tests. `peer` is the caller's kernel-reported identity (record it for
/// audit entries such as "redriven by uid N at T"). Errors carry a stable
/// [`qd_proto::ErrorCode`].
pub trait AdminHandler: Send + Sync + 'static {
    /// Handles one request.
    fn handle(
        &self,
        req: Request,
        peer: Peer,
    ) -> impl Future<Output = Result<Response, ErrorBody>> + Send;
}

/// Default idle timeout: a connection with no complete frame for this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How the admin socket is set up (from `[daemon] admin_socket`, `admin_socket_mode`,
/// `admin_group`).
pub struct AdminServerArgs<H> {
    /// Where the socket file is bound (`[daemon] admin_socket`).
    pub socket_path: PathBuf,
    /// File mode bits of the socket, e.g. `0o660`.
    pub socket_mode: u32,
    /// Group that owns the socket and whose members may use it; `None` leaves the
    /// group as created and admits only root and the daemon's uid.
    pub admin_group: Option<String>,
    /// Idle timeout per connection (see [`DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// The request handler.
    pub handler: Arc<H>,
}

/// Messages the actor takes.
#[derive(Debug)]
pub enum AdminServerMsg {
    /// The accept loop hit a non-transient error and stopped (the reason).
    AcceptFailed(String),
}

/// The admin socket actor, generic over its request handler.
pub struct AdminServer<H>(PhantomData<fn() -> H>);

impl<H> AdminServer<H> {
    /// The actor value to spawn.
    pub fn new() -> Self {
        AdminServer(PhantomData)
    }
}

impl<H> Default for AdminServer<H> {
    fn default() -> Self {
        Self::new()
    }
}

/// The actor's state: the running accept task and the socket file it owns.
pub struct AdminServerState {
    accept: JoinHandle<()>,
    _socket: socket::SocketGuard,
}

impl Drop for AdminServerState {
    fn drop(&mut self) {
        // Aborting drops the accept task's JoinSet, which aborts every connection.
        self.accept.abort();
    }
}

/// Who may connect: the daemon's uid and the admin group's gid.
#[derive(Clone, Copy)]
struct AccessRule {
    daemon_uid: u32,
    admin_gid: Option<u32>,
}

impl<H: AdminHandler> Actor for AdminServer<H> {
    type Msg = AdminServerMsg;
    type State = AdminServerState;
    type Arguments = AdminServerArgs<H>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let admin_gid = args
            .admin_group
            .as_deref()
            .map(socket::resolve_group)
            .transpose()?;
        let (listener, guard) =
            socket::bind(&args.socket_path, args.socket_mode, admin_gid).await?;
        tracing::info!(path = %args.socket_path.display(), mode = format!("{:04o}", args.socket_mode), "Admin socket listening.");
        let rule = AccessRule {
            daemon_uid: nix::unistd::Uid::effective().as_raw(),
            admin_gid,
        };
        let cfg = Arc::new(ConnConfig {
            handler: args.handler,
            idle_timeout: args.idle_timeout,
        });
        let accept = tokio::spawn(accept_loop(listener, rule, cfg, myself));
        Ok(AdminServerState {
            accept,
            _socket: guard,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            AdminServerMsg::AcceptFailed(reason) => {
                Err(format!("admin socket accept loop stopped: {reason}").into())
            }
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.accept.abort();
        Ok(())
    }
}

/// Accepts connections until aborted; each gets its own task in `conns`, so dropping
/// this future ends them all.
async fn accept_loop<H: AdminHandler>(
    listener: UnixListener,
    rule: AccessRule,
    cfg: Arc<ConnConfig<H>>,
    server: ActorRef<AdminServerMsg>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(connection(stream, rule, Arc::clone(&cfg)));
                }
                Err(e) if is_transient(&e) => {
                    tracing::warn!(error = %e, "Admin socket accept failed; retrying shortly.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    // If the actor is already gone there is nobody left to tell.
                    let _ = server.cast(AdminServerMsg::AcceptFailed(e.to_string()));
                    return;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Errors after which accepting again can succeed (out of descriptors or memory, an
/// aborted handshake).
fn is_transient(e: &io::Error) -> bool {
    use nix::errno::Errno;
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
    ) || e.raw_os_error().is_some_and(|code| {
        [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM]
            .contains(&Errno::from_raw(code))
    })
}

/// Reads the peer's credentials, decides access, then serves the connection.
async fn connection<H: AdminHandler>(
    stream: UnixStream,
    rule: AccessRule,
    cfg: Arc<ConnConfig<H>>,
) {
    let peer = match stream.peer_cred() {
        Ok(cred) => Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid(),
        },
        Err(e) => {
            tracing::warn!(error = %e, "Admin connection without peer credentials; closing it.");
            return;
        }
    };
    let ok = tokio::task::spawn_blocking(move || {
        access::check_peer(&peer, rule.daemon_uid, rule.admin_gid)
    })
    .await
    .unwrap_or(false);
    if !ok {
        tracing::warn!(uid = peer.uid, gid = peer.gid, pid = ?peer.pid, "Admin connection refused: permission denied.");
    }
    conn::serve(stream, peer, ok, cfg).await;
}

#[cfg(test)]
mod tests;
