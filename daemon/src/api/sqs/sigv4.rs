//! AWS Signature Version 4 for the SQS API, checked when `daemon.api_tokens_file`
//! is set: the `Authorization: AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/sqs/aws4_request,
//! SignedHeaders=..., Signature=...` header is recomputed with the secret access
//! key of the token whose `access_key_id` it names, and that token's roles and
//! queues apply. The request's `X-Amz-Date` must be within 15 minutes of qd's
//! clock, as AWS requires. Presigned URLs (the signature in the query string) are
//! not taken.
//!
//! Errors as SQS answers them: no `Authorization` is `MissingAuthenticationToken`,
//! a header that does not parse `IncompleteSignature`, an unknown access key
//! `InvalidClientTokenId`, a wrong signature `SignatureDoesNotMatch`, a date too
//! far off `RequestExpired`.

use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, Method, Uri};
use hmac::{Hmac, KeyInit, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::{ErrorKind, SqsError};
use crate::api::auth::{Caller, Tokens, aws_credentials_of};

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// The most a request's date may differ from qd's clock.
const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// Characters SigV4 leaves unencoded: `A-Za-z0-9-_.~`.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The request, as SigV4 reads it.
pub struct Signed<'a> {
    /// Its method.
    pub method: &'a Method,
    /// Its URI (path and query string as sent).
    pub uri: &'a Uri,
    /// Its headers.
    pub headers: &'a HeaderMap,
    /// Its body.
    pub body: &'a [u8],
}

/// The parts of an `Authorization` header.
struct Authorization<'a> {
    key: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn incomplete(message: impl Into<String>) -> SqsError {
    SqsError::new(ErrorKind::IncompleteSignature, message)
}

fn parse_authorization(value: &str) -> Result<Authorization<'_>, SqsError> {
    let rest = value.strip_prefix(ALGORITHM).ok_or_else(|| {
        incomplete(format!(
            "Authorization must use {ALGORITHM} (AWS Signature Version 4)"
        ))
    })?;
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("Credential=") {
            credential = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed = Some(v);
        } else if let Some(v) = part.strip_prefix("Signature=") {
            signature = Some(v);
        }
    }
    let (credential, signed, signature) = match (credential, signed, signature) {
        (Some(c), Some(h), Some(s)) => (c, h, s),
        _ => {
            return Err(incomplete(
                "Authorization must hold Credential=, SignedHeaders= and Signature=",
            ));
        }
    };
    let mut scope = credential.split('/');
    let (Some(key), Some(date), Some(region), Some(service), Some("aws4_request"), None) = (
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
    ) else {
        return Err(incomplete(
            "Credential must be ACCESS_KEY/YYYYMMDD/REGION/sqs/aws4_request",
        ));
    };
    Ok(Authorization {
        key,
        date,
        region,
        service,
        signed_headers: signed.split(';').collect(),
        signature,
    })
}

/// `YYYYMMDDTHHMMSSZ` as a time.
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &text[0..4],
        &text[4..6],
        &text[6..8],
        &text[9..11],
        &text[11..13],
        &text[13..15]
    );
    humantime::parse_rfc3339(&rfc3339).ok()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .expect("invariant: HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The query string in SigV4's canonical form: each name and value decoded, then
/// encoded with only the unreserved characters left as they are, sorted.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let enc = |s: &str| {
                let decoded = percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned();
                utf8_percent_encode(&decoded, UNRESERVED).to_string()
            };
            (enc(k), enc(v))
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Checks the request's signature against `tokens`; the caller is the token whose
/// access key signed it. `now` is qd's clock.
pub fn verify(request: &Signed<'_>, tokens: &Tokens, now: SystemTime) -> Result<Caller, SqsError> {
    let header = request
        .headers
        .get("authorization")
        .ok_or_else(|| {
            SqsError::new(
                ErrorKind::MissingAuthenticationToken,
                "Request is missing Authentication Token: this qd needs AWS Signature Version 4 with the access key of a token in its api_tokens_file",
            )
        })?
        .to_str()
        .map_err(|_| incomplete("Authorization is not ASCII"))?;
    let auth = parse_authorization(header)?;
    if auth.service != "sqs" {
        return Err(incomplete(format!(
            "Credential should be scoped to the service sqs, not {:?}",
            auth.service
        )));
    }
    let amz_date = request
        .headers
        .get("x-amz-date")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| incomplete("X-Amz-Date is missing"))?;
    let when = parse_amz_date(amz_date)
        .ok_or_else(|| incomplete(format!("X-Amz-Date {amz_date:?} is not YYYYMMDDTHHMMSSZ")))?;
    let skew = now.duration_since(when).unwrap_or_else(|e| e.duration());
    if skew > MAX_SKEW {
        return Err(SqsError::new(
            ErrorKind::RequestExpired,
            format!(
                "Request has expired: its X-Amz-Date {amz_date} is more than 15 minutes from qd's clock."
            ),
        ));
    }
    if !amz_date.starts_with(auth.date) {
        return Err(SqsError::new(
            ErrorKind::SignatureDoesNotMatch,
            "The Credential's date is not the day of X-Amz-Date.",
        ));
    }
    let (secret, grant) = aws_credentials_of(tokens, auth.key).ok_or_else(|| {
        SqsError::new(
            ErrorKind::InvalidClientTokenId,
            "The security token included in the request is invalid: no token has this access_key_id.",
        )
    })?;
    if !auth.signed_headers.contains(&"host") {
        return Err(incomplete("SignedHeaders must include host"));
    }
    let mut canonical_headers = String::new();
    for name in &auth.signed_headers {
        let values: Vec<&str> = request
            .headers
            .get_all(*name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if values.is_empty() {
            return Err(incomplete(format!(
                "signed header {name} is not in the request"
            )));
        }
        let joined = values
            .iter()
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join(",");
        canonical_headers.push_str(&format!("{name}:{joined}\n"));
    }
    let payload_hash = match request
        .headers
        .get("x-amz-content-sha256")
        .and_then(|v| v.to_str().ok())
    {
        Some(h) if h != "UNSIGNED-PAYLOAD" => h.to_string(),
        _ => hex::encode(Sha256::digest(request.body)),
    };
    let path = match request.uri.path() {
        "" => "/",
        p => p,
    };
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        request.method.as_str(),
        path,
        canonical_query(request.uri.query().unwrap_or("")),
        canonical_headers,
        auth.signed_headers.join(";"),
        payload_hash
    );
    let scope = format!(
        "{}/{}/{}/aws4_request",
        auth.date, auth.region, auth.service
    );
    let to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), auth.date.as_bytes());
    for part in [auth.region, auth.service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let expected = hex::encode(hmac(&key, to_sign.as_bytes()));
    if bool::from(expected.as_bytes().ct_eq(auth.signature.as_bytes())) {
        Ok(Caller::Token(grant))
    } else {
        Err(SqsError::new(
            ErrorKind::SignatureDoesNotMatch,
            "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method.",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canonical_query_sorts_and_reencodes() {
        assert_eq!(canonical_query("b=2&a=x%20y&c"), "a=x%20y&b=2&c=");
        assert_eq!(canonical_query("k=a+b~"), "k=a%20b~");
        assert_eq!(canonical_query(""), "");
    }

    #[test]
    fn amz_dates_parse_and_bad_ones_do_not() {
        let t = parse_amz_date("20150830T123600Z").expect("valid");
        assert_eq!(
            humantime::format_rfc3339(t).to_string(),
            "2015-08-30T12:36:00Z"
        );
        for bad in [
            "",
            "20150830",
            "20150830T123600",
            "2015x830T123600Z",
            "20151330T123600Z",
        ] {
            assert!(parse_amz_date(bad).is_none(), "{bad}");
        }
    }

    /// The example of AWS's SigV4 documentation ("Examples of the complete
    /// Signature Version 4 signing process"): its signing key and signature.
    #[test]
    fn the_signing_key_matches_the_aws_documentation_example() {
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        let mut key = hmac(format!("AWS4{secret}").as_bytes(), b"20150830");
        for part in ["us-east-1", "iam", "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        assert_eq!(
            hex::encode(&key),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
        let to_sign = "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/iam/aws4_request\nf536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59";
        assert_eq!(
            hex::encode(hmac(&key, to_sign.as_bytes())),
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }
}
