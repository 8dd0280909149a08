//! SQS's two wire protocols, chosen per request as Amazon SQS and ElasticMQ do.
//!
//! * **AWS JSON 1.0**: `X-Amz-Target: AmazonSQS.<Action>` and a JSON object body;
//!   answers are JSON (`application/x-amz-json-1.0`).
//! * **Query**: a form (`Action=...&Version=2012-11-05&...`, in the body or the URL's
//!   query string), POSTed to `/` or to a queue URL; answers are XML documents
//!   `<ActionResponse><ActionResult>...</ActionResult><ResponseMetadata>...`.
//!
//! Both are read into one JSON shape (the JSON protocol's), so each action parses
//! its parameters once: the query protocol's flattened names
//! (`SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.StringValue`) are
//! folded into the JSON protocol's (`Entries[1].MessageAttributes.<name>.StringValue`)
//! by [`query_to_json`], after botocore's query serializer. Answers go the other
//! way in [`answer`]: the action's JSON answer, or the same rendered as XML by the
//! query protocol's naming rules.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use serde_json::{Map, Value};

use super::error::{ErrorKind, SqsError};

/// The query protocol's XML namespace.
const XMLNS: &str = "http://queue.amazonaws.com/doc/2012-11-05/";

/// Which protocol a request came in, and so which its answer goes out in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// AWS JSON 1.0.
    Json,
    /// The query protocol (form in, XML out).
    Query,
}

/// One parsed request: its protocol, action and parameters (in the JSON shape).
#[derive(Debug)]
pub struct Request {
    /// How to answer.
    pub protocol: Protocol,
    /// `SendMessage`, `ReceiveMessage`, ...
    pub action: String,
    /// The parameters, in the JSON protocol's shape.
    pub params: Map<String, Value>,
}

/// Reads a request: JSON when `X-Amz-Target` names an SQS action, else the query
/// protocol from the URL's query string and the form body.
///
/// Errors (in the protocol the request was recognised as): `InvalidAction` for a
/// target that is not `AmazonSQS.*` or a form without `Action`,
/// `InvalidParameterValue` for a body that is not a JSON object or a form.
pub fn read(
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
) -> Result<Request, (Protocol, SqsError)> {
    if let Some(target) = headers.get("x-amz-target") {
        let fail = |e| (Protocol::Json, e);
        let target = target.to_str().map_err(|_| {
            fail(SqsError::new(
                ErrorKind::InvalidAction,
                "X-Amz-Target is not ASCII",
            ))
        })?;
        let action = target.strip_prefix("AmazonSQS.").ok_or_else(|| {
            fail(SqsError::new(
                ErrorKind::InvalidAction,
                format!("X-Amz-Target {target:?} is not an SQS operation (AmazonSQS.<Action>)"),
            ))
        })?;
        let params = if body.iter().all(u8::is_ascii_whitespace) {
            Map::new()
        } else {
            match serde_json::from_slice::<Value>(body) {
                Ok(Value::Object(map)) => map,
                Ok(_) => {
                    return Err(fail(SqsError::invalid(
                        "the request body must be a JSON object",
                    )));
                }
                Err(e) => {
                    return Err(fail(SqsError::invalid(format!(
                        "the request body is not valid JSON: {e}"
                    ))));
                }
            }
        };
        return Ok(Request {
            protocol: Protocol::Json,
            action: action.to_string(),
            params,
        });
    }
    let fail = |e| (Protocol::Query, e);
    let mut pairs: Vec<(String, String)> = Vec::new();
    if let Some(q) = query {
        pairs.extend(
            serde_urlencoded::from_str::<Vec<(String, String)>>(q).map_err(|e| {
                fail(SqsError::invalid(format!(
                    "the query string is not a form: {e}"
                )))
            })?,
        );
    }
    pairs.extend(
        serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).map_err(|e| {
            fail(SqsError::invalid(format!(
                "the body is neither an AWS JSON request (no X-Amz-Target) nor a form: {e}"
            )))
        })?,
    );
    let mut action = None;
    let mut rest = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        match k.as_str() {
            "Action" => action = Some(v),
            "Version" => {}
            _ => rest.push((k, v)),
        }
    }
    let action = action.ok_or_else(|| {
        fail(SqsError::new(
            ErrorKind::InvalidAction,
            "no Action: send X-Amz-Target: AmazonSQS.<Action> with a JSON body, or a form with Action=<Action>",
        ))
    })?;
    Ok(Request {
        protocol: Protocol::Query,
        action,
        params: query_to_json(rest),
    })
}

/// A form's keys as a tree: `A.1.B=x` is `A -> 1 -> B -> "x"`.
#[derive(Debug, Default)]
struct Tree {
    value: Option<String>,
    children: BTreeMap<String, Tree>,
}

impl Tree {
    fn insert(&mut self, key: &str, value: String) {
        let mut node = self;
        for part in key.split('.') {
            node = node.children.entry(part.to_string()).or_default();
        }
        node.value = Some(value);
    }

    /// The children keyed `1`, `2`, ... in number order (other keys are dropped).
    fn indexed(&self) -> Vec<&Tree> {
        let mut items: Vec<(u32, &Tree)> = self
            .children
            .iter()
            .filter_map(|(k, t)| k.parse::<u32>().ok().map(|n| (n, t)))
            .collect();
        items.sort_by_key(|(n, _)| *n);
        items.into_iter().map(|(_, t)| t).collect()
    }

    fn to_json(&self) -> Value {
        if self.children.is_empty() {
            return Value::String(self.value.clone().unwrap_or_default());
        }
        Value::Object(object(self))
    }
}

/// Folds a query request's flattened parameters into the JSON protocol's shape.
pub fn query_to_json(pairs: Vec<(String, String)>) -> Map<String, Value> {
    let mut root = Tree::default();
    for (k, v) in pairs {
        root.insert(&k, v);
    }
    object(&root)
}

/// The query protocol's flattened maps, read in requests and written in
/// answers: `(its element, the element naming each entry's key, the JSON
/// protocol's member)`; each entry's value is in `Value`.
const MAPS: &[(&str, &str, &str)] = &[
    ("Attribute", "Name", "Attributes"),
    ("MessageAttribute", "Name", "MessageAttributes"),
    ("MessageSystemAttribute", "Name", "MessageSystemAttributes"),
    ("Tag", "Key", "Tags"),
];

/// A tree's children as JSON fields, renaming the query protocol's flattened
/// lists and maps to the JSON protocol's members.
fn object(tree: &Tree) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, node) in &tree.children {
        if let Some((_, key_name, member)) = MAPS.iter().find(|(element, ..)| element == key) {
            out.insert(member.to_string(), map_of(node, key_name));
            continue;
        }
        let (name, value) = match key.as_str() {
            "AttributeName" => ("AttributeNames", list_of(node)),
            "MessageAttributeName" => ("MessageAttributeNames", list_of(node)),
            "MessageSystemAttributeName" => ("MessageSystemAttributeNames", list_of(node)),
            "TagKey" => ("TagKeys", list_of(node)),
            k if k.ends_with("BatchRequestEntry") => ("Entries", list_of(node)),
            k => (k, node.to_json()),
        };
        out.insert(name.to_string(), value);
    }
    out
}

fn list_of(node: &Tree) -> Value {
    Value::Array(node.indexed().into_iter().map(Tree::to_json).collect())
}

/// `X.N.<key_name>` / `X.N.Value` pairs as a JSON object.
fn map_of(node: &Tree, key_name: &str) -> Value {
    let mut out = Map::new();
    for item in node.indexed() {
        let Some(key) = item.children.get(key_name).and_then(|k| k.value.clone()) else {
            continue;
        };
        let value = item
            .children
            .get("Value")
            .map_or(Value::String(String::new()), Tree::to_json);
        out.insert(key, value);
    }
    Value::Object(out)
}

/// The answer to `action` with the JSON-shaped `result`, in `protocol`.
pub fn answer(protocol: Protocol, action: &str, request_id: &str, result: Value) -> Response {
    match protocol {
        Protocol::Json => {
            let body = serde_json::to_vec(&result).unwrap_or_else(|_| b"{}".to_vec());
            with_headers(
                StatusCode::OK,
                "application/x-amz-json-1.0",
                request_id,
                body,
            )
        }
        Protocol::Query => {
            let body = xml_answer(action, request_id, &result);
            with_headers(StatusCode::OK, "text/xml", request_id, body)
        }
    }
}

/// The error answer for `err` in `protocol` (see the module doc of `error.rs`).
pub fn error(protocol: Protocol, request_id: &str, err: &SqsError) -> Response {
    let kind = err.kind;
    let mut response = match protocol {
        Protocol::Json => {
            let body = serde_json::json!({
                "__type": format!("com.amazonaws.sqs#{}", kind.shape()),
                "message": err.message,
            });
            let body = serde_json::to_vec(&body).unwrap_or_default();
            with_headers(
                kind.status(),
                "application/x-amz-json-1.0",
                request_id,
                body,
            )
        }
        Protocol::Query => {
            let body = xml_document(|w| {
                element(w, "ErrorResponse", |w| {
                    element(w, "Error", |w| {
                        text(w, "Type", kind.fault())?;
                        text(w, "Code", kind.code())?;
                        text(w, "Message", &err.message)?;
                        w.write_event(Event::Empty(BytesStart::new("Detail")))
                    })?;
                    text(w, "RequestId", request_id)
                })
            });
            with_headers(kind.status(), "text/xml", request_id, body)
        }
    };
    if let Ok(v) = HeaderValue::from_str(&format!("{};{}", kind.code(), kind.fault())) {
        response.headers_mut().insert("x-amzn-query-error", v);
    }
    response
}

fn with_headers(
    status: StatusCode,
    content_type: &'static str,
    request_id: &str,
    body: Vec<u8>,
) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(request_id) {
        headers.insert("x-amzn-requestid", v);
    }
    response
}

type XmlResult = std::io::Result<()>;
type W = Writer<Vec<u8>>;

fn xml_document(body: impl FnOnce(&mut W) -> XmlResult) -> Vec<u8> {
    let mut w = Writer::new(Vec::new());
    // Writing to a Vec cannot fail; a failure would only truncate the document.
    let _ = w
        .write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))
        .and_then(|()| body(&mut w));
    w.into_inner()
}

fn element(w: &mut W, name: &str, inner: impl FnOnce(&mut W) -> XmlResult) -> XmlResult {
    w.write_event(Event::Start(BytesStart::new(name)))?;
    inner(w)?;
    w.write_event(Event::End(BytesEnd::new(name)))
}

/// `<name>value</name>`. Besides the five XML entities, a carriage return is
/// written as `&#xD;`: an XML parser turns a literal CR LF into LF, which would
/// change a message body and fail its MD5 check.
fn text(w: &mut W, name: &str, value: &str) -> XmlResult {
    let escaped = quick_xml::escape::escape(value).replace('\r', "&#xD;");
    element(w, name, |w| {
        w.write_event(Event::Text(BytesText::from_escaped(escaped)))
    })
}

/// Actions whose answer has no result element (SQS models no output for them).
const NO_RESULT: &[&str] = &[
    "DeleteMessage",
    "ChangeMessageVisibility",
    "PurgeQueue",
    "DeleteQueue",
    "SetQueueAttributes",
    "TagQueue",
    "UntagQueue",
    "AddPermission",
    "RemovePermission",
];

/// `<ActionResponse xmlns=...><ActionResult>...</ActionResult><ResponseMetadata>...`.
fn xml_answer(action: &str, request_id: &str, result: &Value) -> Vec<u8> {
    let response = format!("{action}Response");
    xml_document(|w| {
        let mut start = BytesStart::new(response.as_str());
        start.push_attribute(("xmlns", XMLNS));
        w.write_event(Event::Start(start))?;
        if !NO_RESULT.contains(&action) {
            let empty = Map::new();
            let fields = result.as_object().unwrap_or(&empty);
            element(w, &format!("{action}Result"), |w| {
                xml_fields(w, action, fields)
            })?;
        }
        element(w, "ResponseMetadata", |w| text(w, "RequestId", request_id))?;
        w.write_event(Event::End(BytesEnd::new(response.as_str())))
    })
}

/// A JSON answer's fields as the query protocol names them: flattened lists with
/// their member names, maps as `<Attribute><Name/><Value/></Attribute>`.
fn xml_fields(w: &mut W, action: &str, fields: &Map<String, Value>) -> XmlResult {
    for (key, value) in fields {
        let flattened = MAPS.iter().find(|(.., member)| member == key);
        if let (Some((entry, key_name, _)), Value::Object(map)) = (flattened, value) {
            for (k, v) in map {
                element(w, entry, |w| {
                    text(w, key_name, k)?;
                    xml_value(w, action, "Value", v)
                })?;
            }
            continue;
        }
        match (key.as_str(), value) {
            (key, Value::Array(items)) => {
                let member = match key {
                    "Messages" => "Message".to_string(),
                    "QueueUrls" | "queueUrls" => "QueueUrl".to_string(),
                    "Successful" => format!("{action}ResultEntry"),
                    "Failed" => "BatchResultErrorEntry".to_string(),
                    "Results" => format!("{action}ResultEntry"),
                    other => other.to_string(),
                };
                for item in items {
                    xml_value(w, action, &member, item)?;
                }
            }
            (key, v) => xml_value(w, action, key, v)?,
        }
    }
    Ok(())
}

fn xml_value(w: &mut W, action: &str, name: &str, value: &Value) -> XmlResult {
    match value {
        Value::Null => Ok(()),
        Value::String(s) => text(w, name, s),
        Value::Bool(b) => text(w, name, if *b { "true" } else { "false" }),
        Value::Number(n) => text(w, name, &n.to_string()),
        Value::Object(fields) => element(w, name, |w| xml_fields(w, action, fields)),
        Value::Array(items) => {
            for item in items {
                xml_value(w, action, name, item)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn form(pairs: &[(&str, &str)]) -> Map<String, Value> {
        query_to_json(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn flattened_query_parameters_fold_into_the_json_shape() {
        let got = form(&[
            ("QueueUrl", "http://x/000000000000/q"),
            ("SendMessageBatchRequestEntry.2.Id", "b"),
            ("SendMessageBatchRequestEntry.2.MessageBody", "two"),
            ("SendMessageBatchRequestEntry.10.Id", "c"),
            ("SendMessageBatchRequestEntry.1.Id", "a"),
            (
                "SendMessageBatchRequestEntry.1.MessageAttribute.1.Name",
                "k",
            ),
            (
                "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType",
                "String",
            ),
            (
                "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue",
                "v",
            ),
            ("AttributeName.2", "B"),
            ("AttributeName.1", "A"),
        ]);
        assert_eq!(
            Value::Object(got),
            json!({
                "QueueUrl": "http://x/000000000000/q",
                "AttributeNames": ["A", "B"],
                "Entries": [
                    {"Id": "a", "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
                    {"Id": "b", "MessageBody": "two"},
                    {"Id": "c"},
                ],
            })
        );
    }

    #[test]
    fn query_maps_of_attributes_and_tags_read_as_objects() {
        let got = form(&[
            ("Attribute.1.Name", "VisibilityTimeout"),
            ("Attribute.1.Value", "40"),
            ("Tag.1.Key", "team"),
            ("Tag.1.Value", "core"),
        ]);
        assert_eq!(
            Value::Object(got),
            json!({"Attributes": {"VisibilityTimeout": "40"}, "Tags": {"team": "core"}})
        );
    }

    #[test]
    fn xml_answers_flatten_lists_and_keep_carriage_returns() {
        let result = json!({
            "Messages": [{
                "Body": "a\r\nb<",
                "Attributes": {"ApproximateReceiveCount": "1"},
            }],
        });
        let xml = String::from_utf8(xml_answer("ReceiveMessage", "rid", &result)).expect("utf-8");
        assert!(xml.contains("<ReceiveMessageResult><Message>"), "{xml}");
        assert!(xml.contains("<Body>a&#xD;\nb&lt;</Body>"), "{xml}");
        assert!(
            xml.contains(
                "<Attribute><Name>ApproximateReceiveCount</Name><Value>1</Value></Attribute>"
            ),
            "{xml}"
        );
        assert!(xml.contains("<RequestId>rid</RequestId>"), "{xml}");
    }

    #[test]
    fn a_request_without_target_or_action_is_invalid_action() {
        let (protocol, err) = read(&HeaderMap::new(), None, b"QueueName=x").expect_err("no action");
        assert_eq!(protocol, Protocol::Query);
        assert_eq!(err.kind, ErrorKind::InvalidAction);
    }
}
