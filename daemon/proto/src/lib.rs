//! The qd admin protocol, shared by the daemon's admin socket and `qctl`.
//!
//! Frames are newline-delimited JSON (one object per line, at most [`MAX_FRAME`]
//! bytes before the newline). Each request frame gets exactly one response frame:
//!
//! ```text
//! -> {"v":1,"id":7,"req":{"op":"dlq_redrive","selection":{"ids":["..."]}}}
//! <- {"v":1,"id":7,"ok":{"kind":"redrive","matched":1,"moved":1,...}}
//! <- {"v":1,"id":7,"err":{"code":"conflict","message":"job ... is ready, not dead"}}
//! ```
//!
//! This crate owns the frame types, the stable [`ErrorCode`]s and the codec. It has
//! no async runtime dependency, so any client can use it. The full spec, with every
//! request, response and error code, is `daemon/docs/admin-protocol.md`. The framing
//! follows beanstalkd's line protocol and JSON-RPC 2.0's id echo.

mod request;
mod response;

pub use request::{
    DlqSelection, JOB_STATES, MAX_REDRIVE_BATCH, MAX_REDRIVE_RATE, MAX_TREE_DEPTH, MAX_TREE_NODES,
    MIN_REDRIVE_RATE, Payload, Request, check_pace,
};
pub use response::{
    ActorInfo, BackupInfo, EdgeInfo, Enqueued, ExportedJob, HistoryItem, JobDetail, JobPayload,
    JobResult, JobSummary, JobTree, LimitsView, MAX_DEPENDENTS_SHOWN, NodeStatus, PREVIEW_BYTES,
    PurgeResult, QueueInfo, QueueLimits, RedriveResult, Refusal, ReloadInfo, Response,
    ScheduleInfo, Source, StateCount, StatusInfo, TenantCounts, TenantLimits, TopInfo, TopQueue,
    TreeNode, Valued,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest frame accepted, in bytes, not counting the newline (2 MiB). Sized so that
/// a request carrying a payload of the daemon's default `max_payload` (1 MiB) fits
/// however the payload's bytes are: [`Payload::from_bytes`] never spends more than
/// base64's 4 bytes per 3 (1 398 104 bytes for 1 MiB), and the request's other fields
/// (names of at most 64 bytes, a key of at most 255) leave room to spare. Payloads up
/// to about 1.5 MiB fit; larger ones (a `max_payload` raised past that) go over HTTP.
pub const MAX_FRAME: usize = 2 << 20;

/// The protocol version this crate speaks (the `"v"` of every frame).
pub const VERSION: u32 = 1;

/// A request: `{"v":1,"id":7,"req":{...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestFrame {
    /// Protocol version; must equal [`VERSION`].
    pub v: u32,
    /// Chosen by the client, echoed in the response.
    pub id: u64,
    /// What is asked.
    pub req: Request,
}

/// A response: `{"v":1,"id":7,"ok":{...}}` or `{"v":1,"id":7,"err":{...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResponseFrame {
    /// Protocol version of the answer ([`VERSION`]).
    pub v: u32,
    /// The request's id; `null` when the request was too broken to read one.
    pub id: Option<u64>,
    /// The answer.
    #[serde(flatten)]
    pub reply: Reply,
}

/// The body of a response frame: the `"ok"` or the `"err"` member.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Success.
    Ok(Response),
    /// Failure.
    Err(ErrorBody),
}

/// Stable error codes. Clients branch on these, never on the message text. Codes may
/// be added in later versions; a client reads unknown codes as [`ErrorCode::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The line is not a JSON object with `v`, `id` and `req` (`req` with an `op`).
    BadFrame,
    /// The line is longer than [`MAX_FRAME`]; the server closes the connection after
    /// answering, since it cannot find the next frame boundary.
    FrameTooLarge,
    /// `v` is not a version the server speaks.
    UnsupportedVersion,
    /// `req.op` is not a known operation.
    UnknownOp,
    /// The op is known but its fields are wrong (missing, mistyped, out of range).
    BadRequest,
    /// A named job, queue or tenant does not exist.
    NotFound,
    /// The request conflicts with current state (e.g. cancel a leased job).
    Conflict,
    /// The peer's uid is neither root, the daemon's uid, nor in the admin group.
    PermissionDenied,
    /// The daemon is shutting down or a needed actor is restarting; retry later.
    Unavailable,
    /// A bug or a store failure; see the daemon's log.
    Internal,
    /// A code this client does not know (sent by a newer server).
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// The wire name (`"not_found"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::Other => "other",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answer: `{"code":"not_found","message":"no job 0190..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ErrorBody {
    /// What kind of failure.
    pub code: ErrorCode,
    /// Human explanation naming the offending input.
    pub message: String,
    /// For a batch request (`enqueue_batch`), the item the error is about (0-based);
    /// absent when it is about the whole request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
}

impl ErrorBody {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code,
            message: message.into(),
            index: None,
        }
    }
}

/// A request that could not be decoded, with the id to answer under (when one could
/// be read). Turn it into the wire answer with [`ErrorFrame::into_response`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorFrame {
    /// The request's id, if readable.
    pub id: Option<u64>,
    /// The error to send.
    pub err: ErrorBody,
}

impl ErrorFrame {
    fn new(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorFrame {
            id,
            err: ErrorBody::new(code, message),
        }
    }

    /// The response frame carrying this error.
    pub fn into_response(self) -> ResponseFrame {
        ResponseFrame::err(self.id, self.err)
    }
}

impl ResponseFrame {
    /// A success answer to request `id`.
    pub fn ok(id: u64, response: Response) -> Self {
        ResponseFrame {
            v: VERSION,
            id: Some(id),
            reply: Reply::Ok(response),
        }
    }

    /// An error answer to request `id` (`None` if unknown).
    pub fn err(id: Option<u64>, err: ErrorBody) -> Self {
        ResponseFrame {
            v: VERSION,
            id,
            reply: Reply::Err(err),
        }
    }
}

/// Decodes one request line (without or with its trailing `\n`). Never panics: every
/// malformed input becomes an [`ErrorFrame`] with `frame_too_large`, `bad_frame`,
/// `unsupported_version`, `unknown_op` or `bad_request`, checked in that order.
pub fn decode_request(line: &[u8]) -> Result<RequestFrame, ErrorFrame> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    if line.len() > MAX_FRAME {
        return Err(ErrorFrame::new(
            None,
            ErrorCode::FrameTooLarge,
            format!(
                "frame of {} bytes exceeds the limit of {MAX_FRAME} bytes",
                line.len()
            ),
        ));
    }
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| ErrorFrame::new(None, ErrorCode::BadFrame, format!("invalid JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(ErrorFrame::new(
            None,
            ErrorCode::BadFrame,
            "frame is not a JSON object",
        ));
    };
    let id = obj.get("id").and_then(Value::as_u64);
    let bad = |msg: &str| ErrorFrame::new(id, ErrorCode::BadFrame, msg);
    let v = obj
        .get("v")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("missing or non-integer \"v\" (protocol version)"))?;
    if v != u64::from(VERSION) {
        return Err(ErrorFrame::new(
            id,
            ErrorCode::UnsupportedVersion,
            format!("protocol version {v} is not supported; this server speaks {VERSION}"),
        ));
    }
    let id = id.ok_or_else(|| bad("missing or non-integer \"id\" (must be a u64)"))?;
    let req = obj
        .remove("req")
        .ok_or_else(|| bad("missing \"req\" object"))?;
    let op = req
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("\"req\" must be an object with a string \"op\""))?;
    if !Request::is_known_op(op) {
        return Err(ErrorFrame::new(
            Some(id),
            ErrorCode::UnknownOp,
            format!("unknown op {op:?}; known ops: {}", Request::OPS.join(", ")),
        ));
    }
    let req = serde_json::from_value(req)
        .map_err(|e| ErrorFrame::new(Some(id), ErrorCode::BadRequest, e.to_string()))?;
    Ok(RequestFrame {
        v: VERSION,
        id,
        req,
    })
}

/// Decodes one response line. Errors with serde's reason when it is not a valid frame.
pub fn decode_response(line: &[u8]) -> Result<ResponseFrame, serde_json::Error> {
    serde_json::from_slice(line.strip_suffix(b"\n").unwrap_or(line))
}

/// Encodes a request frame as one line, newline included.
pub fn encode_request(frame: &RequestFrame) -> Vec<u8> {
    encode_line(frame)
}

/// Encodes a response frame as one line, newline included.
pub fn encode_response(frame: &ResponseFrame) -> Vec<u8> {
    encode_line(frame)
}

fn encode_line<T: Serialize>(frame: &T) -> Vec<u8> {
    // Serializing these types cannot fail: every map key is a string and no
    // Serialize impl here returns an error.
    let mut out = serde_json::to_vec(frame).expect("invariant: protocol types serialize");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests;
