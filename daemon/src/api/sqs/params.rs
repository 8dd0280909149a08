//! Reading an action's parameters from the JSON-shaped map `wire.rs` produced,
//! with SQS's errors: a missing one is `MissingParameter`, a value out of its range
//! `InvalidParameterValue` naming the parameter, the value and the range. Numbers
//! come as JSON numbers (JSON protocol) or strings (query protocol); both are read.

use serde_json::{Map, Value};

use super::error::SqsError;

/// A string parameter, if given (`null` counts as absent).
pub fn opt_str<'a>(
    params: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a str>, SqsError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(SqsError::invalid(format!(
            "Value {other} for parameter {name} is invalid. Reason: must be a string."
        ))),
    }
}

/// A required string parameter.
pub fn req_str<'a>(params: &'a Map<String, Value>, name: &str) -> Result<&'a str, SqsError> {
    opt_str(params, name)?.ok_or_else(|| SqsError::missing(name))
}

/// An integer parameter within `min..=max`, if given.
pub fn opt_int(
    params: &Map<String, Value>,
    name: &str,
    min: i64,
    max: i64,
) -> Result<Option<i64>, SqsError> {
    let value = match params.get(name) {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    int_value(value, name, min, max).map(Some)
}

/// `value` as an integer within `min..=max`, for the parameter `name`.
pub fn int_value(value: &Value, name: &str, min: i64, max: i64) -> Result<i64, SqsError> {
    let n = match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    let shown = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(SqsError::invalid(format!(
            "Value {shown} for parameter {name} is invalid. Reason: must be an integer from {min} to {max}."
        ))),
    }
}

/// A list of strings, if given.
pub fn str_list(params: &Map<String, Value>, name: &str) -> Result<Vec<String>, SqsError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(SqsError::invalid(format!(
                    "Value {other} in {name} is invalid. Reason: must be a string."
                ))),
            })
            .collect(),
        Some(other) => Err(SqsError::invalid(format!(
            "Value {other} for parameter {name} is invalid. Reason: must be a list of strings."
        ))),
    }
}

/// A map of strings to strings (queue attributes, tags), if given.
pub fn str_map(params: &Map<String, Value>, name: &str) -> Result<Vec<(String, String)>, SqsError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(SqsError::invalid(format!(
                    "Value {other} for {name}.{k} is invalid. Reason: must be a string."
                ))),
            })
            .collect(),
        Some(other) => Err(SqsError::invalid(format!(
            "Value {other} for parameter {name} is invalid. Reason: must be a map."
        ))),
    }
}

/// A batch entry: its `Id` and its parameters.
pub type Entry = (String, Map<String, Value>);

/// The entries of a batch action (`Entries`), each a JSON object, checked as SQS
/// does: 1 to 10 entries with distinct ids of 1 to 80 `A-Za-z0-9_-`.
///
/// Errors: `EmptyBatchRequest`, `TooManyEntriesInBatchRequest`,
/// `InvalidBatchEntryId`, `BatchEntryIdsNotDistinct`.
pub fn batch_entries(params: &Map<String, Value>) -> Result<Vec<Entry>, SqsError> {
    use super::error::ErrorKind;
    let entries = match params.get("Entries") {
        None | Some(Value::Null) => Vec::new(),
        // The query protocol sends an empty list as `Entries=`.
        Some(Value::String(s)) if s.is_empty() => Vec::new(),
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err(SqsError::invalid("Entries must be a list")),
    };
    if entries.is_empty() {
        return Err(SqsError::new(
            ErrorKind::EmptyBatchRequest,
            "There should be at least one entry in the request.",
        ));
    }
    if entries.len() > 10 {
        return Err(SqsError::new(
            ErrorKind::TooManyEntriesInBatchRequest,
            format!(
                "Maximum number of entries per request are 10. You have sent {}.",
                entries.len()
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Object(map) = entry else {
            return Err(SqsError::invalid("each entry of Entries must be an object"));
        };
        let id = req_str(&map, "Id")?.to_string();
        let id_ok = !id.is_empty()
            && id.len() <= 80
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !id_ok {
            return Err(SqsError::new(
                ErrorKind::InvalidBatchEntryId,
                format!(
                    "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long; got {id:?}."
                ),
            ));
        }
        if !seen.insert(id.clone()) {
            return Err(SqsError::new(
                ErrorKind::BatchEntryIdsNotDistinct,
                format!("Id {id} repeated."),
            ));
        }
        out.push((id, map));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::sqs::error::ErrorKind;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn integers_read_from_numbers_or_strings_within_their_range() {
        let p = map(json!({"A": 5, "B": "7", "C": 99, "D": "x", "E": 1.5}));
        assert_eq!(opt_int(&p, "A", 0, 10).expect("ok"), Some(5));
        assert_eq!(opt_int(&p, "B", 0, 10).expect("ok"), Some(7));
        assert_eq!(opt_int(&p, "Z", 0, 10).expect("ok"), None);
        for name in ["C", "D", "E"] {
            let err = opt_int(&p, name, 0, 10).expect_err(name);
            assert_eq!(err.kind, ErrorKind::InvalidParameterValue);
            assert!(err.message.contains(name), "{}", err.message);
        }
    }

    #[test]
    fn batch_entries_follow_sqs_rules() {
        let kind = |v: Value| batch_entries(&map(v)).expect_err("refused").kind;
        assert_eq!(kind(json!({"Entries": []})), ErrorKind::EmptyBatchRequest);
        assert_eq!(kind(json!({})), ErrorKind::EmptyBatchRequest);
        let eleven: Vec<Value> = (0..11).map(|i| json!({"Id": format!("e{i}")})).collect();
        assert_eq!(
            kind(json!({"Entries": eleven})),
            ErrorKind::TooManyEntriesInBatchRequest
        );
        assert_eq!(
            kind(json!({"Entries": [{"Id": "a"}, {"Id": "a"}]})),
            ErrorKind::BatchEntryIdsNotDistinct
        );
        assert_eq!(
            kind(json!({"Entries": [{"Id": "a b"}]})),
            ErrorKind::InvalidBatchEntryId
        );
        assert_eq!(kind(json!({"Entries": [{}]})), ErrorKind::MissingParameter);
        assert_eq!(
            batch_entries(&map(json!({"Entries": [{"Id": "a"}]})))
                .expect("ok")
                .len(),
            1
        );
    }
}
