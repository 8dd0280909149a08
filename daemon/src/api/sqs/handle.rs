//! Receipt handles: opaque to clients, they name the queue, the job and the lease
//! (its fencing token) a receive handed out.
//!
//! Layout before base64url (no padding): version byte `1`, the job id (16 bytes),
//! the token (8 bytes, big-endian), the queue name (the rest, UTF-8). A delete or
//! visibility change presents the token to the Broker, so a handle from an earlier
//! receive can never end a later lease of the same message (the Broker refuses its
//! token as stale).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::error::{ErrorKind, SqsError};
use crate::job::{JobId, Token};

const VERSION: u8 = 1;
/// Version, job id and token.
const FIXED: usize = 1 + 16 + 8;

/// A decoded receipt handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiptHandle {
    /// The queue the message was received from.
    pub queue: String,
    /// The job.
    pub id: JobId,
    /// The lease's fencing token.
    pub token: Token,
}

impl ReceiptHandle {
    /// The handle's text.
    pub fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(FIXED + self.queue.len());
        bytes.push(VERSION);
        bytes.extend_from_slice(self.id.0.as_bytes());
        bytes.extend_from_slice(&self.token.to_be_bytes());
        bytes.extend_from_slice(self.queue.as_bytes());
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Reads a handle given for `queue`.
    ///
    /// Errors: `ReceiptHandleIsInvalid` when it is not one qd made, or was made for
    /// another queue.
    pub fn decode(text: &str, queue: &str) -> Result<Self, SqsError> {
        let invalid = || {
            SqsError::new(
                ErrorKind::ReceiptHandleIsInvalid,
                format!(
                    "The input receipt handle \"{}\" is not a valid receipt handle.",
                    cut(text)
                ),
            )
        };
        let bytes = URL_SAFE_NO_PAD
            .decode(text.as_bytes())
            .map_err(|_| invalid())?;
        if bytes.len() <= FIXED || bytes[0] != VERSION {
            return Err(invalid());
        }
        let id: [u8; 16] = bytes[1..17].try_into().map_err(|_| invalid())?;
        let token: [u8; 8] = bytes[17..FIXED].try_into().map_err(|_| invalid())?;
        let handle_queue = std::str::from_utf8(&bytes[FIXED..]).map_err(|_| invalid())?;
        if handle_queue != queue {
            return Err(invalid());
        }
        Ok(ReceiptHandle {
            queue: handle_queue.to_string(),
            id: JobId(uuid::Uuid::from_bytes(id)),
            token: Token::from_be_bytes(token),
        })
    }
}

/// At most 64 characters of a presented handle, for an error message.
fn cut(text: &str) -> &str {
    match text.char_indices().nth(64) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_reads_back_for_its_queue_only() {
        let h = ReceiptHandle {
            queue: "emails".into(),
            id: JobId::new(),
            token: 42,
        };
        let text = h.encode();
        assert_eq!(ReceiptHandle::decode(&text, "emails").expect("valid"), h);
        let err = ReceiptHandle::decode(&text, "other").expect_err("other queue");
        assert_eq!(err.kind, ErrorKind::ReceiptHandleIsInvalid);
    }

    #[test]
    fn malformed_handles_are_receipt_handle_is_invalid() {
        for bad in ["", "not a handle", "AAAA", "%%%", &"A".repeat(5000)] {
            let err = ReceiptHandle::decode(bad, "q").expect_err(bad);
            assert_eq!(err.kind, ErrorKind::ReceiptHandleIsInvalid);
        }
    }
}
