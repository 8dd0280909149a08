//! Queue actions: GetQueueUrl, ListQueues, CreateQueue (of a configured queue),
//! GetQueueAttributes, PurgeQueue. SQS queues are qd's configured queues; their
//! attributes are read from the queue's config and the Broker's and Scheduler's
//! counts.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ractor::ActorRef;
use serde_json::{Map, Value, json};
use tracing::{info, warn};

use super::error::{ErrorKind, SqsError};
use super::params::{opt_int, opt_str, req_str, str_list, str_map};
use super::{BROKER_TIMEOUT, Ctx};
use crate::api::auth::Role;
use crate::broker::{self, BrokerMsg};
use crate::job::State as JobState;
use crate::scheduler::{self, SchedulerMsg};
use crate::store::JobFilter;

/// SQS's largest message, in bytes (qd's `max_payload` when that is smaller).
pub const SQS_MAX_MESSAGE: usize = 1 << 20;

/// SQS's longest retention, reported as `MessageRetentionPeriod`: qd never drops a
/// message nobody received (its `retention` is for finished jobs).
const RETENTION_REPORTED: u64 = 14 * 24 * 3600;

/// How long a PurgeQueue waits for its cancels before answering (the rest go on).
const PURGE_ANSWER_WAIT: Duration = Duration::from_secs(10);

/// The queue attributes GetQueueAttributes knows.
const QUEUE_ATTRIBUTES: &[&str] = &[
    "All",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "VisibilityTimeout",
    "DelaySeconds",
    "MessageRetentionPeriod",
    "MaximumMessageSize",
    "ReceiveMessageWaitTimeSeconds",
    "QueueArn",
    "SqsManagedSseEnabled",
    "Policy",
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "DeduplicationScope",
    "FifoThroughputLimit",
];

/// Whether `name` is a queue attribute name (ReceiveMessage accepts these in
/// `AttributeNames` too).
pub fn is_queue_attribute(name: &str) -> bool {
    QUEUE_ATTRIBUTES.contains(&name)
}

/// The largest message this qd takes through SQS.
pub fn max_message(ctx: &Ctx) -> usize {
    SQS_MAX_MESSAGE.min(ctx.config.daemon.max_payload)
}

/// GetQueueUrl: `QueueName` (and the optional `QueueOwnerAWSAccountId`) to its URL.
pub fn get_queue_url(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = req_str(&ctx.params, "QueueName")?;
    if let Some(owner) = opt_str(&ctx.params, "QueueOwnerAWSAccountId")?
        && owner != ctx.config.sqs.account_id
    {
        return Err(SqsError::no_queue(name));
    }
    if !ctx.config.queues.contains_key(name) {
        return Err(SqsError::no_queue(name));
    }
    ctx.allow(None, name)?;
    Ok(json!({ "QueueUrl": ctx.queue_url(name) }))
}

/// ListQueues: the caller's queues in name order, by `QueueNamePrefix`, in pages of
/// `MaxResults` (1 to 1,000) continued with `NextToken`.
pub fn list_queues(ctx: &Ctx) -> Result<Value, SqsError> {
    let prefix = opt_str(&ctx.params, "QueueNamePrefix")?.unwrap_or("");
    let max = opt_int(&ctx.params, "MaxResults", 1, 1000)?;
    let after = match opt_str(&ctx.params, "NextToken")? {
        None => None,
        Some(token) => Some(
            URL_SAFE_NO_PAD
                .decode(token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| SqsError::invalid("Invalid or expired next token."))?,
        ),
    };
    let names: Vec<&String> = ctx
        .config
        .queues
        .keys()
        .filter(|n| n.starts_with(prefix))
        .filter(|n| after.as_ref().is_none_or(|a| *n > a))
        .filter(|n| ctx.caller.allow_queue(n).is_ok())
        .collect();
    let limit = max.map_or(1000, |m| m as usize);
    let page: Vec<String> = names.iter().take(limit).map(|n| ctx.queue_url(n)).collect();
    let mut out = Map::new();
    if !page.is_empty() {
        out.insert("QueueUrls".into(), json!(page));
    }
    if max.is_some() && names.len() > limit {
        let last = names[limit - 1];
        out.insert("NextToken".into(), json!(URL_SAFE_NO_PAD.encode(last)));
    }
    Ok(Value::Object(out))
}

/// CreateQueue of a queue the config defines answers its URL (SQS's CreateQueue
/// is idempotent); attributes that differ from the queue's are `QueueAlreadyExists`.
/// A name the config does not define is refused: qd's queues come from its config.
pub fn create_queue(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = req_str(&ctx.params, "QueueName")?;
    let valid = !name.is_empty()
        && name.len() <= 80
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err(SqsError::invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ));
    }
    if !ctx.config.queues.contains_key(name) {
        return Err(SqsError::new(
            ErrorKind::UnsupportedOperation,
            format!(
                "qd has no queue {name:?} and does not create queues through SQS; add [queues.{name}] with executor = {{ kind = \"external\" }} to the config and reload"
            ),
        ));
    }
    ctx.allow(None, name)?;
    let current = attributes(ctx, name, None);
    let mut given = str_map(&ctx.params, "Attributes")?;
    given.extend(
        str_map(&ctx.params, "tags")?
            .into_iter()
            .map(|(k, _)| (format!("tag:{k}"), String::new())),
    );
    for (key, value) in given {
        match current.get(&key).and_then(Value::as_str) {
            Some(have) if have == value => {}
            _ => {
                return Err(SqsError::new(
                    ErrorKind::QueueNameExists,
                    format!(
                        "A queue already exists with the same name and a different value for attribute {key}"
                    ),
                ));
            }
        }
    }
    Ok(json!({ "QueueUrl": ctx.queue_url(name) }))
}

/// The queue's attributes from its config alone; with `counts`, the message counts
/// too (ready, leased, delayed).
fn attributes(ctx: &Ctx, name: &str, counts: Option<(u64, u64, u64)>) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(q) = ctx.config.queues.get(name) else {
        return out;
    };
    let mut put = |k: &str, v: String| {
        out.insert(k.to_string(), Value::String(v));
    };
    if let Some((ready, leased, delayed)) = counts {
        put("ApproximateNumberOfMessages", ready.to_string());
        put("ApproximateNumberOfMessagesNotVisible", leased.to_string());
        put("ApproximateNumberOfMessagesDelayed", delayed.to_string());
    }
    let created = (ctx.state.started_at / 1000).to_string();
    put("CreatedTimestamp", created.clone());
    put("LastModifiedTimestamp", created);
    put("VisibilityTimeout", q.lease.as_secs().to_string());
    put("DelaySeconds", "0".into());
    put("MessageRetentionPeriod", RETENTION_REPORTED.to_string());
    put("MaximumMessageSize", max_message(ctx).to_string());
    put("ReceiveMessageWaitTimeSeconds", "0".into());
    put("QueueArn", ctx.arn(name));
    put("SqsManagedSseEnabled", "false".into());
    out
}

/// GetQueueAttributes: the attributes named in `AttributeNames` (`All` for every
/// one); an unknown name is `InvalidAttributeName`.
pub async fn get_queue_attributes(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = ctx.queue()?;
    ctx.allow(None, &name)?;
    let wanted = str_list(&ctx.params, "AttributeNames")?;
    if let Some(bad) = wanted
        .iter()
        .find(|w| !QUEUE_ATTRIBUTES.contains(&w.as_str()))
    {
        return Err(SqsError::new(
            ErrorKind::InvalidAttributeName,
            format!("Unknown Attribute {bad}."),
        ));
    }
    if wanted.is_empty() {
        return Ok(json!({}));
    }
    let all = wanted.iter().any(|w| w == "All");
    let counted = all || wanted.iter().any(|w| w.starts_with("ApproximateNumberOf"));
    let counts = if counted {
        Some(counts(&name).await?)
    } else {
        None
    };
    let attrs: Map<String, Value> = attributes(ctx, &name, counts)
        .into_iter()
        .filter(|(k, _)| all || wanted.contains(k))
        .collect();
    Ok(json!({ "Attributes": attrs }))
}

/// `(ready, leased, delayed)` of a queue: the Scheduler's ready and delayed counts
/// and the Broker's leased count.
async fn counts(queue: &str) -> Result<(u64, u64, u64), SqsError> {
    let scheduler =
        ActorRef::<SchedulerMsg>::where_is(scheduler::name(queue)).ok_or_else(|| {
            SqsError::new(
                ErrorKind::ServiceUnavailable,
                "the queue's scheduler is restarting",
            )
        })?;
    let stats = match scheduler
        .call(SchedulerMsg::Stats, Some(BROKER_TIMEOUT))
        .await
    {
        Ok(ractor::rpc::CallResult::Success(s)) => s,
        _ => {
            return Err(SqsError::new(
                ErrorKind::ServiceUnavailable,
                "the queue's scheduler did not answer",
            ));
        }
    };
    let all = broker::request(BrokerMsg::Counts, BROKER_TIMEOUT).await?;
    let leased = all.get(queue).map_or(0, |c| c.leased);
    Ok((stats.ready, leased, stats.delayed))
}

/// PurgeQueue: cancels every message of the queue (ready, delayed and in flight)
/// as `qctl cancel` would; one purge per queue per 60 seconds, as SQS allows
/// (`PurgeQueueInProgress`). Answers once the cancels are done or after 10 s,
/// while a large queue's go on.
pub async fn purge_queue(ctx: &Ctx) -> Result<Value, SqsError> {
    let queue = ctx.queue()?;
    ctx.allow(Some(Role::Work), &queue)?;
    {
        let mut purges = ctx.state.purges.lock().unwrap_or_else(|e| e.into_inner());
        let now = tokio::time::Instant::now();
        if let Some(last) = purges.get(&queue)
            && now.duration_since(*last) < Duration::from_secs(60)
        {
            return Err(SqsError::new(
                ErrorKind::PurgeQueueInProgress,
                format!("Only one PurgeQueue operation on {queue} is allowed every 60 seconds."),
            ));
        }
        purges.insert(queue.clone(), now);
    }
    let store = ctx.args.store.clone();
    let task = tokio::spawn(purge(store, queue));
    let _ = tokio::time::timeout(PURGE_ANSWER_WAIT, task).await;
    Ok(json!({}))
}

/// Cancels the queue's unfinished jobs, oldest first, a page at a time.
async fn purge(store: crate::store::Store, queue: String) {
    let mut cancelled = 0u64;
    for state in [JobState::Ready, JobState::Delayed, JobState::Leased] {
        let mut after = None;
        loop {
            let filter = JobFilter {
                queue: Some(queue.clone()),
                state: Some(state),
                after,
                limit: 500,
                ..JobFilter::default()
            };
            let page = match store.run(move |b| b.list_jobs(&filter)).await {
                Ok(page) => page,
                Err(err) => {
                    warn!(queue = %queue, error = %err, "PurgeQueue could not list the queue's jobs; it stopped.");
                    return;
                }
            };
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            for job in page {
                let id = job.id;
                let by = "sqs PurgeQueue".to_string();
                if let Ok(Ok(_)) =
                    broker::request(|tx| BrokerMsg::Cancel(id, by, tx), BROKER_TIMEOUT).await
                {
                    cancelled += 1;
                }
            }
        }
    }
    info!(queue = %queue, cancelled, "SQS PurgeQueue done.");
}
