//! One admin connection: read a line, decode, check access, ask the handler, write
//! one response line; repeat until the client closes, idles past the timeout or
//! sends an oversized frame. Each connection runs in its own task, so a slow or idle
//! client never holds up another one or the accept loop.

use std::sync::Arc;
use std::time::Duration;

use qd_proto::{ErrorBody, ErrorCode, MAX_FRAME, ResponseFrame, decode_request, encode_response};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::AdminHandler;
use super::access::Peer;

/// Per-connection settings shared by all connection tasks.
pub(super) struct ConnConfig<H> {
    pub handler: Arc<H>,
    pub idle_timeout: Duration,
}

/// What the next read produced.
enum Frame {
    /// A full line (newline stripped), or the unterminated tail before EOF.
    Line(Vec<u8>),
    /// More than [`MAX_FRAME`] bytes without a newline.
    TooLarge,
    /// The client closed the connection or went idle.
    Closed,
}

/// Serves one connection until it ends. `allowed` is the access decision made from
/// the peer's credentials; a refused peer gets `permission_denied` for its request
/// and the connection is closed.
pub(super) async fn serve<H: AdminHandler>(
    stream: UnixStream,
    peer: Peer,
    allowed: bool,
    cfg: Arc<ConnConfig<H>>,
) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let (reply, close) = match next_frame(&mut reader, cfg.idle_timeout).await {
            Frame::Closed => return,
            Frame::TooLarge => (too_large(), true),
            Frame::Line(line) if !allowed => (refuse(&line, peer), true),
            Frame::Line(line) => (answer(&line, peer, cfg.handler.as_ref()).await, false),
        };
        if let Err(e) = write.write_all(&encode_response(&reply)).await {
            tracing::debug!(uid = peer.uid, error = %e, "Admin client went away before its answer.");
            return;
        }
        if close {
            return;
        }
    }
}

async fn next_frame<R: AsyncBufReadExt + Unpin>(reader: &mut R, idle: Duration) -> Frame {
    let mut buf = Vec::new();
    // One byte over the limit tells an oversized frame from one that just fits.
    let limit = u64::try_from(MAX_FRAME + 1).expect("invariant: MAX_FRAME fits in u64");
    let mut limited = reader.take(limit);
    match tokio::time::timeout(idle, limited.read_until(b'\n', &mut buf)).await {
        Err(_) | Ok(Err(_)) | Ok(Ok(0)) => Frame::Closed,
        Ok(Ok(_)) if buf.last() == Some(&b'\n') => {
            buf.pop();
            Frame::Line(buf)
        }
        Ok(Ok(n)) if n > MAX_FRAME => Frame::TooLarge,
        Ok(Ok(_)) => Frame::Line(buf),
    }
}

fn too_large() -> ResponseFrame {
    let msg = format!("frame exceeds the limit of {MAX_FRAME} bytes; closing the connection");
    ResponseFrame::err(None, ErrorBody::new(ErrorCode::FrameTooLarge, msg))
}

fn refuse(line: &[u8], peer: Peer) -> ResponseFrame {
    let id = decode_request(line).ok().map(|f| f.id);
    let msg = format!(
        "permission denied: uid {} is not root, the daemon's user, or in the admin group",
        peer.uid
    );
    ResponseFrame::err(id, ErrorBody::new(ErrorCode::PermissionDenied, msg))
}

async fn answer<H: AdminHandler>(line: &[u8], peer: Peer, handler: &H) -> ResponseFrame {
    let frame = match decode_request(line) {
        Ok(frame) => frame,
        Err(bad) => {
            tracing::debug!(uid = peer.uid, code = %bad.err.code, "Malformed admin frame.");
            return bad.into_response();
        }
    };
    let op = frame.req.op();
    tracing::debug!(uid = peer.uid, op, "Admin request.");
    match handler.handle(frame.req, peer).await {
        Ok(resp) => ResponseFrame::ok(frame.id, resp),
        Err(err) => {
            tracing::debug!(uid = peer.uid, op, code = %err.code, "Admin request failed.");
            ResponseFrame::err(Some(frame.id), err)
        }
    }
}
