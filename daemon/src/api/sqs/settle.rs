//! DeleteMessage(+Batch) and ChangeMessageVisibility(+Batch): a receipt handle's
//! lease is acked, extended, or returned, fenced by its token.
//!
//! A delete with a handle whose lease is over (the message was received again,
//! already deleted, or its visibility timeout passed) succeeds, as in SQS, but
//! changes nothing: the Broker refuses the old token, so it never deletes a
//! message another receiver holds. A visibility change on such a handle is
//! `MessageNotInflight`.
//!
//! A handle a dead-letter queue gave for a dead job (`dead.rs`) is settled there:
//! a delete purges the dead job, a visibility change moves its deadline.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::dead::{self, Settled};
use super::error::{ErrorKind, SqsError};
use super::handle::ReceiptHandle;
use super::params::{batch_entries, int_value, req_str};
use super::send::failed;
use super::{BROKER_TIMEOUT, Ctx};
use crate::api::auth::Role;
use crate::broker::{self, BrokerError, BrokerMsg, MAX_EXTEND};
use crate::job::{Failure, JobId, Token};

/// True for a refusal that means "this lease is over" (stale token, job gone or
/// in another state), which a delete treats as done.
fn lease_over(err: &BrokerError) -> bool {
    matches!(err, BrokerError::Transition(_) | BrokerError::UnknownJob(_))
}

fn handle_of(ctx: &Ctx, queue: &str, p: &Map<String, Value>) -> Result<ReceiptHandle, SqsError> {
    let text = req_str(p, "ReceiptHandle")?;
    let _ = ctx;
    ReceiptHandle::decode(text, queue)
}

/// DeleteMessage.
pub async fn delete_message(ctx: &Ctx) -> Result<Value, SqsError> {
    let queue = ctx.queue()?;
    ctx.allow(Some(Role::Work), &queue)?;
    let h = handle_of(ctx, &queue, &ctx.params)?;
    let settled = dead::delete(ctx, &queue, std::slice::from_ref(&h)).await?;
    if matches!(settled.first(), Some(Settled::Done)) {
        return Ok(json!({}));
    }
    match broker::request(|tx| BrokerMsg::Ack(h.id, h.token, tx), BROKER_TIMEOUT).await? {
        Ok(()) => Ok(json!({})),
        Err(err) if lease_over(&err) => Ok(json!({})),
        Err(err) => Err(err.into()),
    }
}

/// DeleteMessageBatch: up to 10 handles acked in one commit, each answered.
pub async fn delete_message_batch(ctx: &Ctx) -> Result<Value, SqsError> {
    let queue = ctx.queue()?;
    ctx.allow(Some(Role::Work), &queue)?;
    let entries = batch_entries(&ctx.params)?;
    let mut failures = Vec::new();
    let mut acks: Vec<(String, JobId, Token)> = Vec::new();
    let mut successes = Vec::new();
    let mut handles = Vec::new();
    for (id, p) in &entries {
        match handle_of(ctx, &queue, p) {
            Ok(h) => handles.push((id, h)),
            Err(err) => failures.push(failed(id, &err)),
        }
    }
    let only: Vec<ReceiptHandle> = handles.iter().map(|(_, h)| h.clone()).collect();
    let settled = match dead::delete(ctx, &queue, &only).await {
        Ok(settled) => settled,
        Err(err) => {
            for (id, _) in &handles {
                failures.push(failed(id, &err));
            }
            return Ok(json!({ "Successful": successes, "Failed": failures }));
        }
    };
    for ((id, h), settled) in handles.into_iter().zip(settled) {
        match settled {
            Settled::Done => successes.push(json!({ "Id": id })),
            // The same message twice in one batch: the Broker refuses the second
            // ack; both entries name a deleted message, so both succeed.
            Settled::NotDead if acks.iter().any(|(_, j, t)| *j == h.id && *t == h.token) => {
                successes.push(json!({ "Id": id }));
            }
            Settled::NotDead => acks.push((id.clone(), h.id, h.token)),
        }
    }
    if !acks.is_empty() {
        let items: Vec<(JobId, Token)> = acks.iter().map(|(_, j, t)| (*j, *t)).collect();
        let answers =
            broker::request(|tx| BrokerMsg::AckBatch(items, tx), BROKER_TIMEOUT).await??;
        for ((id, _, _), answer) in acks.iter().zip(answers) {
            match answer {
                Ok(()) => successes.push(json!({ "Id": id })),
                Err(err) if lease_over(&err) => successes.push(json!({ "Id": id })),
                Err(BrokerError::Invalid(_)) => successes.push(json!({ "Id": id })),
                Err(err) => failures.push(failed(id, &err.into())),
            }
        }
    }
    Ok(json!({ "Successful": successes, "Failed": failures }))
}

/// Sets a lease's visibility timeout: a heartbeat to `seconds` from now, or for 0 an
/// uncharged return. A lease that is over is `MessageNotInflight`.
async fn set_visibility(h: &ReceiptHandle, seconds: i64) -> Result<(), SqsError> {
    let (id, token) = (h.id, h.token);
    let answer = if seconds == 0 {
        let failure = Failure::Interrupted {
            reason: "ChangeMessageVisibility to 0".into(),
        };
        broker::request(|tx| BrokerMsg::Nack(id, token, failure, tx), BROKER_TIMEOUT).await?
    } else {
        let extend = Duration::from_secs(seconds.unsigned_abs());
        broker::request(
            |tx| BrokerMsg::Heartbeat(id, token, Some(extend), tx),
            BROKER_TIMEOUT,
        )
        .await?
        .map(|_| ())
    };
    answer.map_err(|err| {
        if lease_over(&err) {
            SqsError::new(
                ErrorKind::MessageNotInflight,
                format!("Message {id} is not in flight under this receipt handle (it was deleted, received again, or its visibility timeout passed)."),
            )
        } else {
            err.into()
        }
    })
}

fn visibility_of(p: &Map<String, Value>) -> Result<i64, SqsError> {
    let max = i64::try_from(MAX_EXTEND.as_secs()).unwrap_or(43_200);
    let value = p
        .get("VisibilityTimeout")
        .filter(|v| !v.is_null())
        .ok_or_else(|| SqsError::missing("VisibilityTimeout"))?;
    int_value(value, "VisibilityTimeout", 0, max)
}

/// ChangeMessageVisibility.
pub async fn change_visibility(ctx: &Ctx) -> Result<Value, SqsError> {
    let queue = ctx.queue()?;
    ctx.allow(Some(Role::Work), &queue)?;
    let h = handle_of(ctx, &queue, &ctx.params)?;
    let seconds = visibility_of(&ctx.params)?;
    if let Some(result) = dead::change_visibility(ctx, &queue, &h, seconds) {
        return result.map(|()| json!({}));
    }
    set_visibility(&h, seconds).await?;
    Ok(json!({}))
}

/// ChangeMessageVisibilityBatch: each entry on its own.
pub async fn change_visibility_batch(ctx: &Ctx) -> Result<Value, SqsError> {
    let queue = ctx.queue()?;
    ctx.allow(Some(Role::Work), &queue)?;
    let entries = batch_entries(&ctx.params)?;
    let mut failures = Vec::new();
    let mut successes = Vec::new();
    for (id, p) in &entries {
        let result = async {
            let h = handle_of(ctx, &queue, p)?;
            let seconds = visibility_of(p)?;
            if let Some(result) = dead::change_visibility(ctx, &queue, &h, seconds) {
                return result;
            }
            set_visibility(&h, seconds).await
        }
        .await;
        match result {
            Ok(()) => successes.push(json!({ "Id": id })),
            Err(err) => failures.push(failed(id, &err)),
        }
    }
    Ok(json!({ "Successful": successes, "Failed": failures }))
}
