//! SendMessage and SendMessageBatch: each message is checked as SQS checks it
//! (body characters, size, delay, attributes, group and deduplication ids) and
//! enqueued as a job: `MessageGroupId` is its tenant, `MessageDeduplicationId` its
//! idempotency key (a second send with the same id answers the first message's id
//! and enqueues nothing).

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::error::{ErrorKind, SqsError};
use super::message::{self, Attrs};
use super::params::{batch_entries, opt_int, opt_str, req_str};
use super::queues::max_message;
use super::{BROKER_TIMEOUT, Ctx};
use crate::api::auth::Role;
use crate::broker::{self, BatchError, BrokerMsg, EnqueueRequest};

/// SQS's longest `DelaySeconds`.
const MAX_DELAY_SECONDS: i64 = 900;

/// One checked message, ready for the Broker.
struct Outgoing {
    request: EnqueueRequest,
    md5_body: String,
    md5_attrs: Option<String>,
    size: usize,
}

/// Reads one message's parameters (a SendMessage request, or one batch entry).
fn read_message(ctx: &Ctx, queue: &str, p: &Map<String, Value>) -> Result<Outgoing, SqsError> {
    let body = req_str(p, "MessageBody")?;
    message::check_body(body)?;
    let queue_delay = ctx
        .config
        .sqs
        .created
        .get(queue)
        .map_or(0, |q| q.int("DelaySeconds"));
    let delay = opt_int(p, "DelaySeconds", 0, MAX_DELAY_SECONDS)?.unwrap_or(queue_delay);
    let attrs: Attrs = message::read_attributes(p.get("MessageAttributes"))?;
    let size = message::size(body, &attrs);
    let max = max_message(ctx, queue);
    if size > max {
        return Err(SqsError::invalid(format!(
            "One or more parameters are invalid. Reason: Message must be shorter than {max} bytes (body and attributes are {size})."
        )));
    }
    let tenant = match opt_str(p, "MessageGroupId")? {
        None => None,
        Some(group) => {
            if !crate::config::is_valid_name(group) {
                return Err(SqsError::invalid(format!(
                    "Value {group} for parameter MessageGroupId is invalid. Reason: qd uses it as the tenant, so it must be 1 to 64 of A-Z a-z 0-9 _ . -"
                )));
            }
            Some(group.to_string())
        }
    };
    let key = match opt_str(p, "MessageDeduplicationId")? {
        None => None,
        Some(id) => {
            let ok = !id.is_empty()
                && id.len() <= 128
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation());
            if !ok {
                return Err(SqsError::invalid(format!(
                    "Value {id} for parameter MessageDeduplicationId is invalid. Reason: must be 1 to 128 alphanumeric or punctuation characters."
                )));
            }
            Some(id.to_string())
        }
    };
    let payload = message::encode(body, &attrs);
    let max_payload = ctx.config.daemon.max_payload;
    if payload.len() > max_payload {
        return Err(SqsError::invalid(format!(
            "One or more parameters are invalid. Reason: the message with its attributes takes {} bytes as a job, over qd's max_payload of {max_payload} bytes.",
            payload.len()
        )));
    }
    let request = EnqueueRequest {
        queue: queue.to_string(),
        tenant,
        payload,
        idempotency_key: key,
        delay: Duration::from_secs(delay.unsigned_abs()),
        max_attempts: None,
        priority_ms: 0,
        after: Default::default(),
    };
    broker::validate(&request, max_payload)?;
    Ok(Outgoing {
        request,
        md5_body: message::md5_of_body(body),
        md5_attrs: message::md5_of_attributes(&attrs),
        size,
    })
}

fn sent_json(id: &str, out: &Outgoing) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("MessageId".into(), json!(id));
    m.insert("MD5OfMessageBody".into(), json!(out.md5_body));
    if let Some(md5) = &out.md5_attrs {
        m.insert("MD5OfMessageAttributes".into(), json!(md5));
    }
    m
}

/// SendMessage.
pub async fn send_message(ctx: &Ctx) -> Result<Value, SqsError> {
    let queue = ctx.queue()?;
    ctx.allow(Some(Role::Produce), &queue)?;
    let out = read_message(ctx, &queue, &ctx.params)?;
    let request = out.request.clone();
    let done = broker::request(|tx| BrokerMsg::Enqueue(request, tx), BROKER_TIMEOUT).await??;
    Ok(Value::Object(sent_json(&done.id.to_string(), &out)))
}

/// A batch entry's failure as SQS lists it.
pub fn failed(id: &str, err: &SqsError) -> Value {
    json!({
        "Id": id,
        "SenderFault": !err.kind.status().is_server_error(),
        "Code": err.kind.code(),
        "Message": err.message,
    })
}

/// SendMessageBatch: up to 10 entries, each answered on its own. The entries that
/// pass the checks go to the Broker as one batch (one commit); an entry the Broker
/// refuses (e.g. a deduplication id held by a different message) is listed as
/// failed and the rest are sent again without it.
pub async fn send_message_batch(ctx: &Ctx) -> Result<Value, SqsError> {
    let queue = ctx.queue()?;
    ctx.allow(Some(Role::Produce), &queue)?;
    let entries = batch_entries(&ctx.params)?;
    let mut failures = Vec::new();
    let mut ready: Vec<(String, Outgoing)> = Vec::new();
    for (id, p) in &entries {
        match read_message(ctx, &queue, p) {
            Ok(out) => ready.push((id.clone(), out)),
            Err(err) => failures.push(failed(id, &err)),
        }
    }
    let total: usize = ready.iter().map(|(_, o)| o.size).sum();
    let max = max_message(ctx, &queue);
    if total > max {
        return Err(SqsError::new(
            ErrorKind::BatchRequestTooLong,
            format!(
                "Batch requests cannot be longer than {max} bytes. You have sent {total} bytes."
            ),
        ));
    }
    let mut successes = Vec::new();
    while !ready.is_empty() {
        let requests: Vec<EnqueueRequest> = ready.iter().map(|(_, o)| o.request.clone()).collect();
        match broker::request(|tx| BrokerMsg::EnqueueBatch(requests, tx), BROKER_TIMEOUT).await? {
            Ok(done) => {
                for ((id, out), enq) in ready.iter().zip(done) {
                    let mut m = sent_json(&enq.id.to_string(), out);
                    m.insert("Id".into(), json!(id));
                    successes.push(Value::Object(m));
                }
                break;
            }
            Err(BatchError {
                index: Some(n),
                error,
            }) if n < ready.len() => {
                let (id, _) = ready.remove(n);
                failures.push(failed(&id, &SqsError::from(error)));
            }
            Err(BatchError { error, .. }) => return Err(error.into()),
        }
    }
    Ok(json!({ "Successful": successes, "Failed": failures }))
}
