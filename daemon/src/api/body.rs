//! Request bodies: JSON whatever the `Content-Type` says.
//!
//! Producers and workers post from shells (`curl -d '{…}'` sends
//! `application/x-www-form-urlencoded`), scripts and SDKs; qd reads every body as
//! JSON and names the problem when it is not, instead of refusing on a header.
//! That is safe only because a browser's cross-site request never gets this far:
//! a page can send a `text/plain` body without a preflight, and
//! `api::browser_guard` refuses it by its `Sec-Fetch-Site`/`Origin`/`Host`.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::ApiError;

/// How deep arrays and objects may nest in a body (payload included). Many JSON
/// parsers downstream recurse per level and crash on deep input; serde_json's own
/// limit does not cover a payload kept as raw JSON.
pub const MAX_NESTING: usize = 128;

/// Parses a JSON body into `T`; a 400 naming the problem when it does not fit.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    expect_object(bytes)?;
    check_nesting(bytes, MAX_NESTING)?;
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// Every body qd takes is a JSON object. serde would read an array into a struct's
/// fields by position (`[1,2]` gives "invalid type: integer `1`, expected a
/// string"), so a body that is valid JSON but not an object is named as such.
fn expect_object(bytes: &[u8]) -> Result<(), ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    let kind = match first {
        Some(b'{') | None => return Ok(()),
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        Some(b'-' | b'0'..=b'9') => "a number",
        Some(_) => return Ok(()),
    };
    Err(ApiError::bad_request(format!(
        "the body must be a JSON object {{...}} with the fields in daemon/docs/http-api.md, not {kind}"
    )))
}

/// Refuses JSON text whose arrays and objects nest deeper than `max`, in one pass
/// over the bytes (brackets inside strings do not count).
fn check_nesting(bytes: &[u8], max: usize) -> Result<(), ApiError> {
    let (mut depth, mut in_string, mut escaped) = (0_usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return Err(ApiError::bad_request(format!(
                        "the JSON body nests arrays and objects deeper than {max} levels"
                    )));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// An extractor for a JSON body of any content type (see [`parse_json`]).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    e.body_text(),
                )
            } else {
                ApiError::bad_request(e.body_text())
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Body {
        tenant: Option<String>,
    }

    #[test]
    fn a_body_that_is_not_an_object_is_named_for_what_it_is() {
        for (body, kind) in [
            (&b"[1,2]"[..], "not an array"),
            (b" \"x\"", "not a string"),
            (b"7", "not a number"),
            (b"null", "not null"),
        ] {
            let err = parse_json::<Body>(body).expect_err("refused");
            assert!(err.message.contains(kind), "{}", err.message);
        }
        assert!(parse_json::<Body>(b"{\"tenant\":\"a\"}").is_ok());
        let err = parse_json::<Body>(b"{oops").expect_err("refused");
        assert!(
            err.message.starts_with("invalid JSON body"),
            "{}",
            err.message
        );
    }

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn nesting_up_to_the_limit_is_accepted_and_beyond_refused() {
        assert!(check_nesting(nested(128).as_bytes(), 128).is_ok());
        let err = check_nesting(nested(129).as_bytes(), 128).expect_err("too deep");
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("deeper than 128"), "{}", err.message);
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let text = format!(
            r#"{{"payload": "{}\"{}"}}"#,
            "[".repeat(500),
            "{".repeat(500)
        );
        assert!(check_nesting(text.as_bytes(), 2).is_ok());
    }

    #[test]
    fn a_deep_payload_in_an_enqueue_body_is_a_400() {
        let body = format!(r#"{{"payload": {}}}"#, nested(100_000));
        let err = parse_json::<serde_json::Value>(body.as_bytes()).expect_err("deep");
        assert_eq!(err.code, "bad_request");
    }
}
