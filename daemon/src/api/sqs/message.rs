//! An SQS message as qd stores it: the body and its message attributes, checked
//! against SQS's rules, with the MD5 digests SDKs verify.
//!
//! A job's payload is the body's bytes as sent when the message has no
//! attributes, so qd's own workers and the native HTTP API see exactly the body.
//! With attributes, the payload is [`MAGIC`], the attributes as one line of JSON
//! (the JSON protocol's shape), a newline, then the body. SQS bodies cannot hold
//! a NUL character, so no body sent through SQS is mistaken for that envelope.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use md5::{Digest, Md5};
use serde_json::{Map, Value, json};

use super::error::{ErrorKind, SqsError};

/// The start of a payload that carries message attributes.
const MAGIC: &[u8] = b"\0qd-sqs/1\n";

/// SQS's most message attributes per message.
pub const MAX_ATTRIBUTES: usize = 10;

/// One message attribute's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttrValue {
    /// `String` and `Number` types (and their custom subtypes).
    Text(String),
    /// `Binary` types.
    Bytes(Vec<u8>),
}

/// One message attribute: its data type (`String`, `Number.int`, `Binary.gz`,
/// ...) and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The data type as sent.
    pub data_type: String,
    /// The value.
    pub value: AttrValue,
}

/// Message attributes by name (sorted, as the MD5 needs them).
pub type Attrs = BTreeMap<String, Attr>;

/// A message's body: SQS's characters (`#x9 | #xA | #xD | #x20-#xD7FF |
/// #xE000-#xFFFD | #x10000-#x10FFFF`), at least one.
///
/// Errors: `MissingParameter` for an empty body, `InvalidMessageContents` naming
/// the first character outside the set.
pub fn check_body(body: &str) -> Result<(), SqsError> {
    if body.is_empty() {
        return Err(SqsError::missing("MessageBody"));
    }
    match body.chars().find(|&c| !allowed(c)) {
        None => Ok(()),
        Some(c) => Err(SqsError::new(
            ErrorKind::InvalidMessageContents,
            format!(
                "Invalid binary character '#x{:X}' was found in the message body, the set of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF",
                u32::from(c)
            ),
        )),
    }
}

fn allowed(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

/// Reads `MessageAttributes` (the JSON shape: name -> `{DataType, StringValue |
/// BinaryValue}`), checking SQS's rules: at most 10, names of 1 to 256 of
/// `A-Za-z0-9_-.` not starting with `AWS.` or `Amazon.` and without `..` or a
/// period at either end, a known data type, a non-empty value of that type.
///
/// Errors: `InvalidParameterValue` naming the attribute and the rule.
pub fn read_attributes(value: Option<&Value>) -> Result<Attrs, SqsError> {
    let mut attrs = Attrs::new();
    let Some(value) = value else { return Ok(attrs) };
    let Value::Object(map) = value else {
        return Err(SqsError::invalid(
            "MessageAttributes must be a map of name to value",
        ));
    };
    if map.len() > MAX_ATTRIBUTES {
        return Err(SqsError::invalid(format!(
            "Number of message attributes [{}] exceeds the allowed maximum [{MAX_ATTRIBUTES}].",
            map.len()
        )));
    }
    for (name, v) in map {
        check_attr_name(name)?;
        attrs.insert(name.clone(), read_attr(name, v)?);
    }
    Ok(attrs)
}

fn check_attr_name(name: &str) -> Result<(), SqsError> {
    let lower = name.to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.");
    if ok {
        Ok(())
    } else {
        Err(SqsError::invalid(format!(
            "Message attribute name '{name}' is invalid: use 1 to 256 of A-Z a-z 0-9 _ - . (no leading, trailing or double period; not starting with AWS. or Amazon.)"
        )))
    }
}

fn read_attr(name: &str, v: &Value) -> Result<Attr, SqsError> {
    let field = |f: &str| v.get(f).and_then(Value::as_str);
    let data_type = field("DataType").ok_or_else(|| {
        SqsError::invalid(format!(
            "The message attribute '{name}' must contain a DataType."
        ))
    })?;
    let base = data_type.split('.').next().unwrap_or_default();
    let custom_ok = data_type.len() <= 256
        && data_type
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !custom_ok || !matches!(base, "String" | "Number" | "Binary") {
        return Err(SqsError::invalid(format!(
            "The type of message (user) attribute '{name}' is invalid. You must use only the following supported type prefixes: Binary, Number, String."
        )));
    }
    let empty = || {
        SqsError::invalid(format!(
            "Message (user) attribute '{name}' must contain a non-empty value of type '{base}'."
        ))
    };
    let value = if base == "Binary" {
        let b64 = field("BinaryValue").ok_or_else(empty)?;
        let bytes = STANDARD.decode(b64).map_err(|_| {
            SqsError::invalid(format!(
                "Message (user) attribute '{name}': BinaryValue is not base64."
            ))
        })?;
        if bytes.is_empty() {
            return Err(empty());
        }
        AttrValue::Bytes(bytes)
    } else {
        let text = field("StringValue")
            .filter(|s| !s.is_empty())
            .ok_or_else(empty)?;
        if text.chars().any(|c| !allowed(c)) {
            return Err(SqsError::invalid(format!(
                "Message (user) attribute '{name}' holds a character outside SQS's character set."
            )));
        }
        if base == "Number" && !is_number(text) {
            return Err(SqsError::invalid(format!(
                "Can't cast the value of message (user) attribute '{name}' to a number."
            )));
        }
        AttrValue::Text(text.to_string())
    };
    Ok(Attr {
        data_type: data_type.to_string(),
        value,
    })
}

/// A decimal number as SQS takes it: sign, digits, fraction, exponent (no
/// `inf`, `NaN` or hex), at most 38 significant digits.
fn is_number(text: &str) -> bool {
    let digits = text.bytes().filter(u8::is_ascii_digit).count();
    digits > 0
        && digits <= 38 + 5
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E'))
        && text.parse::<f64>().is_ok_and(f64::is_finite)
}

/// SQS's size of a message: body bytes plus each attribute's name, data type
/// and value bytes.
pub fn size(body: &str, attrs: &Attrs) -> usize {
    body.len()
        + attrs
            .iter()
            .map(|(name, a)| {
                name.len()
                    + a.data_type.len()
                    + match &a.value {
                        AttrValue::Text(t) => t.len(),
                        AttrValue::Bytes(b) => b.len(),
                    }
            })
            .sum::<usize>()
}

/// The hex MD5 of the body (`MD5OfMessageBody`, `MD5OfBody`).
pub fn md5_of_body(body: &str) -> String {
    hex::encode(Md5::digest(body.as_bytes()))
}

/// The hex MD5 of the attributes as SQS computes it (`MD5OfMessageAttributes`):
/// for each attribute in name order, the name, the data type (each as a 4-byte
/// big-endian length and UTF-8 bytes), a transport byte (1 for String and
/// Number, 2 for Binary) and the value (length and bytes). `None` when there are
/// none (the field is then absent).
pub fn md5_of_attributes(attrs: &Attrs) -> Option<String> {
    if attrs.is_empty() {
        return None;
    }
    fn framed(md5: &mut Md5, bytes: &[u8]) {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        md5.update(len.to_be_bytes());
        md5.update(bytes);
    }
    let mut md5 = Md5::new();
    for (name, attr) in attrs {
        framed(&mut md5, name.as_bytes());
        framed(&mut md5, attr.data_type.as_bytes());
        match &attr.value {
            AttrValue::Text(t) => {
                md5.update([1u8]);
                framed(&mut md5, t.as_bytes());
            }
            AttrValue::Bytes(b) => {
                md5.update([2u8]);
                framed(&mut md5, b);
            }
        }
    }
    Some(hex::encode(md5.finalize()))
}

/// The attributes in the JSON protocol's shape.
pub fn attributes_json(attrs: &Attrs) -> Map<String, Value> {
    attrs
        .iter()
        .map(|(name, a)| {
            let v = match &a.value {
                AttrValue::Text(t) => json!({"DataType": a.data_type, "StringValue": t}),
                AttrValue::Bytes(b) => {
                    json!({"DataType": a.data_type, "BinaryValue": STANDARD.encode(b)})
                }
            };
            (name.clone(), v)
        })
        .collect()
}

/// The job payload of a message (see the module doc).
pub fn encode(body: &str, attrs: &Attrs) -> Vec<u8> {
    if attrs.is_empty() {
        return body.as_bytes().to_vec();
    }
    let header = Value::Object(attributes_json(attrs)).to_string();
    let mut out = Vec::with_capacity(MAGIC.len() + header.len() + 1 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(header.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(body.as_bytes());
    out
}

/// A job payload as a message: the envelope's body and attributes, or the whole
/// payload as the body (a job enqueued by other means; bytes that are not UTF-8
/// are replaced by U+FFFD, as SQS bodies are text).
pub fn decode(payload: Vec<u8>) -> (String, Attrs) {
    if let Some(rest) = payload.strip_prefix(MAGIC)
        && let Some(nl) = rest.iter().position(|&b| b == b'\n')
        && let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(&rest[..nl])
    {
        let attrs = map
            .iter()
            .filter_map(|(name, v)| read_attr(name, v).ok().map(|a| (name.clone(), a)))
            .collect();
        return (String::from_utf8_lossy(&rest[nl + 1..]).into_owned(), attrs);
    }
    let body = match String::from_utf8(payload) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    (body, Attrs::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(data_type: &str, v: &str) -> Attr {
        Attr {
            data_type: data_type.into(),
            value: AttrValue::Text(v.into()),
        }
    }

    /// A `Number` and a `Binary` attribute.
    fn number_and_binary() -> Attrs {
        let mut attrs = Attrs::new();
        attrs.insert("n".into(), text("Number", "12.5"));
        attrs.insert(
            "bin".into(),
            Attr {
                data_type: "Binary".into(),
                value: AttrValue::Bytes(vec![0, 1, 2]),
            },
        );
        attrs
    }

    #[test]
    fn digests_match_the_ones_sqs_documents() {
        // Expected values from an independent implementation of the documented
        // algorithm (hashlib and struct.pack("!I", len) in Python).
        assert_eq!(md5_of_body("hello"), "5d41402abc4b2a76b9719d911017c592");
        let mut attrs = Attrs::new();
        attrs.insert("a".into(), text("String", "b"));
        assert_eq!(
            md5_of_attributes(&attrs).as_deref(),
            Some("bef8bf215374a0a228d67533b1a488be")
        );
        let attrs = number_and_binary();
        assert_eq!(
            md5_of_attributes(&attrs).as_deref(),
            Some("c99f48909038fdd5c7f8a98c4cbbeead")
        );
        assert_eq!(md5_of_attributes(&Attrs::new()), None);
    }

    #[test]
    fn the_payload_envelope_round_trips_and_plain_payloads_are_the_body() {
        let attrs = number_and_binary();
        let payload = encode("body\nline", &attrs);
        assert_eq!(decode(payload), ("body\nline".to_string(), attrs));
        assert_eq!(encode("plain", &Attrs::new()), b"plain");
        assert_eq!(
            decode(b"plain".to_vec()),
            ("plain".to_string(), Attrs::new())
        );
    }

    #[test]
    fn bodies_outside_the_sqs_character_set_are_refused() {
        assert!(check_body("ok \t\r\n é 🙂").is_ok());
        assert_eq!(
            check_body("").expect_err("empty").kind,
            ErrorKind::MissingParameter
        );
        let err = check_body("a\u{0}b").expect_err("nul");
        assert_eq!(err.kind, ErrorKind::InvalidMessageContents);
        assert!(err.message.contains("#x0"), "{}", err.message);
        assert!(check_body("\u{FFFF}").is_err());
    }

    #[test]
    fn attribute_rules_name_the_attribute() {
        let read = |v: Value| read_attributes(Some(&v));
        assert!(read(json!({"k": {"DataType": "String", "StringValue": "v"}})).is_ok());
        for bad in [
            json!({"AWS.x": {"DataType": "String", "StringValue": "v"}}),
            json!({"a..b": {"DataType": "String", "StringValue": "v"}}),
            json!({"k": {"DataType": "Text", "StringValue": "v"}}),
            json!({"k": {"DataType": "String", "StringValue": ""}}),
            json!({"k": {"DataType": "Number", "StringValue": "NaN"}}),
            json!({"k": {"DataType": "Binary", "BinaryValue": "!!"}}),
        ] {
            let err = read(bad.clone()).expect_err("refused");
            assert_eq!(err.kind, ErrorKind::InvalidParameterValue, "{bad}");
        }
        let many: Map<String, Value> = (0..11)
            .map(|i| {
                (
                    format!("k{i}"),
                    json!({"DataType": "String", "StringValue": "v"}),
                )
            })
            .collect();
        assert!(read(Value::Object(many)).is_err());
    }
}
