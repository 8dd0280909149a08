//! The limits of a job's result: what an ack, a command's `$QD_RESULT_FILE` or a
//! webhook's response body hands back, stored on the job's row by the ack's own
//! write ([`crate::job::Transition::result`]); and the JSON form in which a
//! child's attempt sees its parents and their results (a lease's `parents`,
//! `$QD_PARENTS_FILE`, a webhook's envelope). Pure; no messages.

use base64::Engine;
use serde::Serialize;

use crate::job::{JobId, State};
use crate::store::ParentView;

pub use crate::config::{DEFAULT_MAX_RESULT, MAX_RESULT_LIMIT};

/// Refuses a result larger than `max` bytes, naming its size: the text an attempt
/// that produced it fails with (permanent), or an external ack's 400.
pub fn check_result(len: usize, max: usize) -> Result<(), String> {
    if len > max {
        return Err(format!(
            "result of {len} bytes is larger than the queue's max_result of {max} bytes"
        ));
    }
    Ok(())
}

/// One parent as a child's attempt sees it: `{"id", "state", "result" |
/// "result_b64", "last_error"}`. The result is `result` when it is UTF-8 text,
/// else `result_b64`, and absent when the parent handed none back (as
/// `GET /v1/jobs/{id}` shows it); `last_error` is `null` when the last attempt
/// did not fail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ParentBody {
    id: JobId,
    state: State,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result_b64: Option<String>,
    last_error: Option<String>,
}

impl ParentBody {
    /// The JSON form of `parent`.
    pub fn of(parent: ParentView) -> ParentBody {
        let (result, result_b64) = match parent.result.map(String::from_utf8) {
            None => (None, None),
            Some(Ok(text)) => (Some(text), None),
            Some(Err(bytes)) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(bytes.as_bytes())),
            ),
        };
        ParentBody {
            id: parent.id,
            state: parent.state,
            result,
            result_b64,
            last_error: parent.last_error,
        }
    }

    /// The JSON list of `parents`, in the order given.
    pub fn list(parents: Vec<ParentView>) -> Vec<ParentBody> {
        parents.into_iter().map(ParentBody::of).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_shows_text_as_result_bytes_as_result_b64_and_none_as_neither() {
        let id: JobId = "0190f1c2-0000-7000-8000-000000000001".parse().expect("id");
        let view = |result: Option<&[u8]>, error: Option<&str>| ParentView {
            id,
            state: State::Succeeded,
            result: result.map(<[u8]>::to_vec),
            last_error: error.map(str::to_owned),
        };
        let json = |v| serde_json::to_value(ParentBody::of(v)).expect("json");
        assert_eq!(
            json(view(Some(b"done"), None)),
            serde_json::json!({"id": id, "state": "succeeded", "result": "done", "last_error": null})
        );
        assert_eq!(
            json(view(Some(&[0, 255]), None)),
            serde_json::json!({"id": id, "state": "succeeded", "result_b64": "AP8=", "last_error": null})
        );
        assert_eq!(
            json(view(None, Some("boom"))),
            serde_json::json!({"id": id, "state": "succeeded", "last_error": "boom"})
        );
    }

    #[test]
    fn a_result_over_the_limit_is_refused_naming_its_size() {
        assert_eq!(check_result(10, 10), Ok(()));
        let err = check_result(11, 10).expect_err("over");
        assert!(
            err.contains("11 bytes") && err.contains("10 bytes"),
            "{err}"
        );
    }
}
