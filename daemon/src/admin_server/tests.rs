//! Protocol-level tests of the admin socket with a fake handler, read like the spec:
//! send lines, expect lines.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use qd_proto::{ErrorBody, ErrorCode, Reply, Request, Response, ResponseFrame, StatusInfo};
use ractor::{Actor, ActorRef};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::*;

/// Answers `status` at once, sleeps on `jobs_show "slow"`, says `not_found` otherwise.
struct Fake;

impl AdminHandler for Fake {
    async fn handle(&self, req: Request, peer: Peer) -> Result<Response, ErrorBody> {
        match req {
            Request::Status {} => Ok(Response::Status(StatusInfo {
                version: format!("uid {}", peer.uid),
                uptime_secs: 1.5,
                store_path: "/tmp/qd.db".into(),
                store_bytes: 4096,
                actors: vec![],
                nodes: vec![],
            })),
            Request::JobsShow { id } if id == "slow" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Err(ErrorBody::new(ErrorCode::Internal, "unreachable in tests"))
            }
            other => Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("fake: {}", other.op()),
            )),
        }
    }
}

const WAIT: Duration = Duration::from_secs(10);
const STATUS: &str = r#"{"v":1,"id":5,"req":{"op":"status"}}"#;

fn args(path: &Path, idle: Duration) -> AdminServerArgs<Fake> {
    AdminServerArgs {
        socket_path: path.to_path_buf(),
        socket_mode: 0o660,
        admin_group: None,
        idle_timeout: idle,
        handler: Arc::new(Fake),
    }
}

async fn start(idle: Duration) -> (tempfile::TempDir, PathBuf, ActorRef<AdminServerMsg>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("qctl.sock");
    let (actor, _) = Actor::spawn(None, AdminServer::<Fake>::new(), args(&path, idle))
        .await
        .expect("admin server starts");
    (dir, path, actor)
}

struct Client {
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

impl Client {
    async fn connect(path: &Path) -> Self {
        let (read, write) = UnixStream::connect(path)
            .await
            .expect("connect")
            .into_split();
        Client {
            read: BufReader::new(read),
            write,
        }
    }

    async fn send(&mut self, line: &str) -> ResponseFrame {
        self.write.write_all(line.as_bytes()).await.expect("write");
        self.write.write_all(b"\n").await.expect("write");
        self.recv().await.expect("a response line")
    }

    async fn recv(&mut self) -> Option<ResponseFrame> {
        let mut line = String::new();
        let n = tokio::time::timeout(WAIT, self.read.read_line(&mut line))
            .await
            .expect("answer within the wait")
            .unwrap_or(0);
        (n > 0).then(|| qd_proto::decode_response(line.as_bytes()).expect("valid response"))
    }
}

fn err_code(frame: &ResponseFrame) -> Option<ErrorCode> {
    match &frame.reply {
        Reply::Err(e) => Some(e.code),
        Reply::Ok(_) => None,
    }
}

#[test]
fn protocol_job_states_match_the_core_states() {
    let core: Vec<&str> = crate::job::State::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(qd_proto::JOB_STATES.to_vec(), core);
}

#[tokio::test]
async fn malformed_frames_get_error_answers_and_the_connection_keeps_serving() {
    let (_dir, path, actor) = start(DEFAULT_IDLE_TIMEOUT).await;
    let mut c = Client::connect(&path).await;
    assert_eq!(
        err_code(&c.send("{not json").await),
        Some(ErrorCode::BadFrame)
    );
    let wrong_v = c.send(r#"{"v":9,"id":1,"req":{"op":"status"}}"#).await;
    assert_eq!(err_code(&wrong_v), Some(ErrorCode::UnsupportedVersion));
    assert_eq!(wrong_v.id, Some(1));
    let unknown = c.send(r#"{"v":1,"id":2,"req":{"op":"launch"}}"#).await;
    assert_eq!(err_code(&unknown), Some(ErrorCode::UnknownOp));
    let handler_err = c.send(r#"{"v":1,"id":3,"req":{"op":"queues"}}"#).await;
    assert_eq!(err_code(&handler_err), Some(ErrorCode::NotFound));
    let ok = c.send(STATUS).await;
    assert_eq!(ok.id, Some(5));
    assert!(matches!(ok.reply, Reply::Ok(Response::Status(_))), "{ok:?}");
    actor.stop(None);
}

#[tokio::test]
async fn an_oversized_frame_is_answered_then_the_connection_closes() {
    let (_dir, path, actor) = start(DEFAULT_IDLE_TIMEOUT).await;
    let Client { read, mut write } = Client::connect(&path).await;
    let big = vec![b'x'; qd_proto::MAX_FRAME + 100];
    // The server stops reading mid-frame, so this write may fail; only the answer matters.
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&big).await;
        write
    });
    let mut read = BufReader::new(read);
    let mut line = String::new();
    let n = tokio::time::timeout(WAIT, read.read_line(&mut line)).await;
    assert!(
        matches!(n, Ok(Ok(n)) if n > 0),
        "an answer before the close: {n:?}"
    );
    let answer = qd_proto::decode_response(line.as_bytes()).expect("valid response");
    assert_eq!(err_code(&answer), Some(ErrorCode::FrameTooLarge));
    drop(writer);
    let mut rest = String::new();
    let after = tokio::time::timeout(WAIT, read.read_line(&mut rest)).await;
    assert!(
        matches!(after, Ok(Ok(0)) | Ok(Err(_))),
        "connection closed: {after:?}"
    );
    let mut fresh = Client::connect(&path).await;
    assert!(
        err_code(&fresh.send(STATUS).await).is_none(),
        "server still serves"
    );
    actor.stop(None);
}

#[tokio::test]
async fn an_idle_client_or_a_slow_request_does_not_block_another_client() {
    let (_dir, path, actor) = start(DEFAULT_IDLE_TIMEOUT).await;
    let mut idle = Client::connect(&path).await;
    idle.write
        .write_all(br#"{"v":1,"id""#)
        .await
        .expect("half a frame");
    let mut slow = Client::connect(&path).await;
    slow.write
        .write_all(b"{\"v\":1,\"id\":1,\"req\":{\"op\":\"jobs_show\",\"id\":\"slow\"}}\n")
        .await
        .expect("write");
    let mut other = Client::connect(&path).await;
    let ok = other.send(STATUS).await;
    assert!(matches!(ok.reply, Reply::Ok(_)), "{ok:?}");
    actor.stop(None);
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let (_dir, path, actor) = start(Duration::from_millis(100)).await;
    let mut c = Client::connect(&path).await;
    assert!(c.recv().await.is_none(), "closed without an answer");
    actor.stop(None);
}

#[tokio::test]
async fn a_second_server_on_a_live_socket_refuses_to_start() {
    let (_dir, path, actor) = start(DEFAULT_IDLE_TIMEOUT).await;
    let second = Actor::spawn(
        None,
        AdminServer::<Fake>::new(),
        args(&path, DEFAULT_IDLE_TIMEOUT),
    )
    .await;
    let err = second.expect_err("second server refused");
    assert!(err.to_string().contains("another qd is serving"), "{err}");
    let mut c = Client::connect(&path).await;
    assert!(
        err_code(&c.send(STATUS).await).is_none(),
        "first server unharmed"
    );
    actor.stop(None);
}

#[tokio::test]
async fn stopping_the_server_removes_the_socket_file_and_a_restart_binds_again() {
    let (_dir, path, actor) = start(DEFAULT_IDLE_TIMEOUT).await;
    actor.stop_and_wait(None, Some(WAIT)).await.expect("stops");
    assert!(!path.exists(), "socket file removed");
    let (again, _) = Actor::spawn(
        None,
        AdminServer::<Fake>::new(),
        args(&path, DEFAULT_IDLE_TIMEOUT),
    )
    .await
    .expect("restart binds");
    again.stop(None);
}

#[tokio::test]
async fn a_refused_peer_gets_permission_denied_with_its_request_id_and_is_disconnected() {
    let (server, client) = UnixStream::pair().expect("pair");
    let peer = Peer {
        uid: 4321,
        gid: 4321,
        pid: None,
    };
    let cfg = Arc::new(ConnConfig {
        handler: Arc::new(Fake),
        idle_timeout: DEFAULT_IDLE_TIMEOUT,
    });
    tokio::spawn(conn::serve(server, peer, false, cfg));
    let (read, write) = client.into_split();
    let mut c = Client {
        read: BufReader::new(read),
        write,
    };
    let answer = c.send(STATUS).await;
    assert_eq!(answer.id, Some(5));
    match answer.reply {
        Reply::Err(e) => {
            assert_eq!(e.code, ErrorCode::PermissionDenied);
            assert!(e.message.contains("uid 4321"), "{}", e.message);
        }
        Reply::Ok(_) => panic!("refused peer was answered"),
    }
    assert!(c.recv().await.is_none(), "disconnected");
}
