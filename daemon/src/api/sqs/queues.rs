//! Queue actions: GetQueueUrl, ListQueues, CreateQueue, DeleteQueue,
//! GetQueueAttributes, SetQueueAttributes, PurgeQueue, TagQueue, UntagQueue,
//! ListQueueTags, ListDeadLetterSourceQueues. SQS queues are qd's queues: those of
//! the config file (read-only over SQS) and those created through SQS (stored in
//! the store, `created.rs`; changed here, put in force by the Supervisor). Counts
//! come from the Broker (the queue's counts and dispatch); a dead-letter queue's include
//! its sources' dead jobs (`dead.rs`).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ractor::ActorRef;
use serde_json::{Map, Value, json};
use tracing::{info, warn};

use super::created::{self, CreatedQueue};
use super::error::{ErrorKind, SqsError};
use super::params::{opt_int, opt_str, req_str, str_list, str_map};
use super::{BROKER_TIMEOUT, Ctx};
use crate::api::auth::Role;
use crate::broker::{self, BrokerMsg};
use crate::config::Config;
use crate::dlq::{self, DlqMsg, Selection};
use crate::job::State as JobState;
use crate::reload::ReloadError;
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

/// The largest message this qd takes through SQS into `queue`: 1 MiB, qd's
/// `max_payload`, or a created queue's `MaximumMessageSize`, whichever is least.
pub fn max_message(ctx: &Ctx, queue: &str) -> usize {
    let limit = SQS_MAX_MESSAGE.min(ctx.config.daemon.max_payload);
    match ctx.config.sqs.created.get(queue) {
        Some(q) => limit.min(usize::try_from(q.int("MaximumMessageSize")).unwrap_or(limit)),
        None => limit,
    }
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
    let after = next_token(ctx)?;
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

/// CreateQueue. A new name is created as an SQS queue of qd, stored durably with
/// its attributes and tags (`created.rs`) and started at once. An existing queue
/// answers its URL when every attribute given has the queue's value (SQS's
/// CreateQueue is idempotent), else `QueueAlreadyExists`; tags are not compared.
pub async fn create_queue(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = req_str(&ctx.params, "QueueName")?;
    created::check_name(name)?;
    let given = str_map(&ctx.params, "Attributes")?;
    // The JSON protocol names CreateQueue's tags `tags`; the query protocol's
    // `Tag.N.Key` fold into `Tags`.
    let mut tags = str_map(&ctx.params, "tags")?;
    tags.extend(str_map(&ctx.params, "Tags")?);
    let tags = created::check_tags(&tags)?;
    let config = ctx.args.config();
    if config.queues.contains_key(name) && !config.sqs.created.contains_key(name) {
        ctx.allow(None, name)?;
        let current = attributes(ctx, &config, name, None);
        for (key, value) in given {
            if current.get(&key).and_then(Value::as_str) != Some(value.as_str()) {
                return Err(name_exists(&key));
            }
        }
        return Ok(json!({ "QueueUrl": ctx.queue_url(name) }));
    }
    ctx.allow(Some(Role::Produce), name)?;
    let given = created::check_attributes(&given, |arn| ctx.queue_of_arn(&config, arn).is_some())?;
    let _writing = ctx.state.queue_writes.lock().await;
    let config = ctx.args.config();
    check_redrive_allowed(ctx, &config, name, &given)?;
    if let Some(existing) = config.sqs.created.get(name) {
        for (key, value) in &given {
            let have = existing.attributes.get(key).map_or("", String::as_str);
            if have != value {
                return Err(name_exists(key));
            }
        }
        return Ok(json!({ "QueueUrl": ctx.queue_url(name) }));
    }
    let queue = CreatedQueue::new(given, tags);
    write_record(ctx, name, Some(&queue)).await?;
    if let Err(err) = apply_queues(ctx).await {
        let _ = write_record(ctx, name, None).await;
        return Err(err.into_sqs("CreateQueue"));
    }
    info!(queue = %name, "SQS CreateQueue created a queue.");
    Ok(json!({ "QueueUrl": ctx.queue_url(name) }))
}

/// [`created::check_redrive_allowed`] for queue `name` against the queues of `config`.
fn check_redrive_allowed(
    ctx: &Ctx,
    config: &Config,
    name: &str,
    given: &std::collections::BTreeMap<String, String>,
) -> Result<(), SqsError> {
    created::check_redrive_allowed(given, &ctx.arn(name), |arn| {
        config.sqs.created.get(&ctx.queue_of_arn(config, arn)?)
    })
}

fn name_exists(key: &str) -> SqsError {
    SqsError::new(
        ErrorKind::QueueNameExists,
        format!(
            "A queue already exists with the same name and a different value for attribute {key}"
        ),
    )
}

/// Writes (`Some`) or deletes (`None`) a created queue's row in the store.
async fn write_record(ctx: &Ctx, name: &str, queue: Option<&CreatedQueue>) -> Result<(), SqsError> {
    let name = name.to_string();
    let record = queue.map(|q| q.record(&name));
    ctx.args
        .store
        .run(move |b| b.set_sqs_queue(&name, record.as_ref()))
        .await?;
    Ok(())
}

/// Why the Supervisor did not apply the store's SQS queues.
enum ApplyError {
    /// The change was refused (a removed queue still holds jobs).
    Refused(String),
    /// No answer, or the store failed.
    Unavailable(String),
}

impl ApplyError {
    fn into_sqs(self, action: &str) -> SqsError {
        let (ApplyError::Refused(why) | ApplyError::Unavailable(why)) = self;
        SqsError::new(
            ErrorKind::ServiceUnavailable,
            format!("{action} was not applied: {why}"),
        )
    }
}

/// Asks the Supervisor to put the store's SQS queues in force (start added queues,
/// stop deleted ones, apply changed attributes) after this node changed them.
async fn apply_queues(ctx: &Ctx) -> Result<(), ApplyError> {
    sync_queues(ctx, true).await
}

/// Asks the Supervisor to put the store's SQS queues in force; `here`: this
/// node's SQS API changed them (see [`Control::SqsQueuesChanged`](crate::daemon::Control::SqsQueuesChanged)).
async fn sync_queues(ctx: &Ctx, here: bool) -> Result<(), ApplyError> {
    match ctx
        .args
        .control
        .sqs_queues_changed(here, BROKER_TIMEOUT)
        .await
    {
        Ok(_) => Ok(()),
        Err(ReloadError::Refused(why)) => Err(ApplyError::Refused(why.join("; "))),
        Err(err) => Err(ApplyError::Unavailable(err.to_string())),
    }
}

/// On a store shared by several nodes, brings this node's SQS queues up to the
/// store's, for a request that named a queue not in force here: another node may
/// have created it a moment ago, before its announcement arrived. Misses that
/// come together share one read of the store. Returns whether the queues in
/// force may have changed (the caller then looks again); always `false` on a
/// store of this node alone.
pub async fn catch_up(ctx: &Ctx) -> bool {
    if ctx.config.daemon.database.is_none() {
        return false;
    }
    let asked = tokio::time::Instant::now();
    let mut last = ctx.state.caught_up.lock().await;
    if last.is_some_and(|at| at >= asked) {
        return true;
    }
    if let Err(err) = sync_queues(ctx, false).await {
        let (ApplyError::Refused(why) | ApplyError::Unavailable(why)) = err;
        warn!(error = %why, "Reading the SQS queues other nodes created failed.");
        return false;
    }
    *last = Some(tokio::time::Instant::now());
    true
}

/// The SQS-created queue `name`, or the error for a queue the config file defines
/// (its settings come from the file).
fn created_queue<'c>(
    config: &'c Config,
    name: &str,
    action: &str,
) -> Result<&'c CreatedQueue, SqsError> {
    config.sqs.created.get(name).ok_or_else(|| {
        SqsError::new(
            ErrorKind::UnsupportedOperation,
            format!(
                "queue {name:?} is defined in qd's config file, so {action} cannot change it; edit [queues.{name}] in the file and reload"
            ),
        )
    })
}

/// Writes a changed created queue to the store and puts it in force.
async fn store_and_apply(
    ctx: &Ctx,
    name: &str,
    queue: &CreatedQueue,
    action: &str,
) -> Result<(), SqsError> {
    write_record(ctx, name, Some(queue)).await?;
    apply_queues(ctx).await.map_err(|e| e.into_sqs(action))
}

/// SetQueueAttributes of an SQS-created queue: checked as CreateQueue checks them,
/// stored, and in force at once (a new visibility timeout for the next receive, a
/// redrive policy's `maxReceiveCount` for messages sent from then on).
pub async fn set_queue_attributes(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = ctx.queue()?;
    ctx.allow(Some(Role::Produce), &name)?;
    let given = str_map(&ctx.params, "Attributes")?;
    if given.is_empty() {
        return Err(SqsError::missing("Attributes"));
    }
    let _writing = ctx.state.queue_writes.lock().await;
    let config = ctx.args.config();
    let mut queue = created_queue(&config, &name, "SetQueueAttributes")?.clone();
    let given = created::check_attributes(&given, |arn| ctx.queue_of_arn(&config, arn).is_some())?;
    check_redrive_allowed(ctx, &config, &name, &given)?;
    queue.set(given);
    store_and_apply(ctx, &name, &queue, "SetQueueAttributes").await?;
    Ok(json!({}))
}

/// How often DeleteQueue cancels and retries before giving up.
const DELETE_TRIES: u32 = 5;

/// DeleteQueue of an SQS-created queue: its messages are cancelled (ready, delayed,
/// in flight) and its dead ones purged, then the queue is removed from the store
/// and stopped. A queue of the config file is refused.
pub async fn delete_queue(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = ctx.queue()?;
    ctx.allow(Some(Role::Work), &name)?;
    let _writing = ctx.state.queue_writes.lock().await;
    let config = ctx.args.config();
    let queue = created_queue(&config, &name, "DeleteQueue")?.clone();
    write_record(ctx, &name, None).await?;
    // A send racing the delete can leave a job behind the cancels; the Supervisor
    // refuses to stop a queue that holds jobs, so cancel again and retry.
    let mut last = ApplyError::Unavailable("not applied".into());
    for _ in 0..DELETE_TRIES {
        purge(ctx.args.store.clone(), name.clone()).await;
        purge_dead(&name).await;
        match apply_queues(ctx).await {
            Ok(()) => {
                // Another node's change applied here (a catch-up, a heartbeat) may
                // have stopped the queue before the purge's last page was read; a
                // message sent meanwhile is cancelled now, and none comes after.
                purge(ctx.args.store.clone(), name.clone()).await;
                ctx.state
                    .purges
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&name);
                info!(queue = %name, "SQS DeleteQueue deleted a queue.");
                return Ok(json!({}));
            }
            Err(err) => last = err,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = write_record(ctx, &name, Some(&queue)).await;
    Err(last.into_sqs("DeleteQueue"))
}

/// Purges the queue's dead jobs through the Dlq actor.
async fn purge_dead(queue: &str) {
    let Some(dlq) = ActorRef::<DlqMsg>::where_is(dlq::NAME) else {
        return;
    };
    let selection = Selection {
        queue: Some(queue.to_string()),
        ..Selection::default()
    };
    let _ = dlq
        .call(
            |tx| DlqMsg::Purge(selection, false, tx),
            Some(BROKER_TIMEOUT),
        )
        .await;
}

/// TagQueue: adds or replaces tags of an SQS-created queue (at most 50 in all).
pub async fn tag_queue(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = ctx.queue()?;
    ctx.allow(Some(Role::Produce), &name)?;
    let tags = created::check_tags(&str_map(&ctx.params, "Tags")?)?;
    if tags.is_empty() {
        return Err(SqsError::missing("Tags"));
    }
    let _writing = ctx.state.queue_writes.lock().await;
    let config = ctx.args.config();
    let mut queue = created_queue(&config, &name, "TagQueue")?.clone();
    queue.tags.extend(tags);
    if queue.tags.len() > created::MAX_TAGS {
        return Err(SqsError::invalid(format!(
            "Too many tags: a queue has at most {}.",
            created::MAX_TAGS
        )));
    }
    store_and_apply(ctx, &name, &queue, "TagQueue").await?;
    Ok(json!({}))
}

/// UntagQueue: removes the named tags (absent ones are ignored, as in SQS).
pub async fn untag_queue(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = ctx.queue()?;
    ctx.allow(Some(Role::Produce), &name)?;
    let keys = str_list(&ctx.params, "TagKeys")?;
    if keys.is_empty() {
        return Err(SqsError::missing("TagKeys"));
    }
    let _writing = ctx.state.queue_writes.lock().await;
    let config = ctx.args.config();
    let mut queue = created_queue(&config, &name, "UntagQueue")?.clone();
    for key in &keys {
        queue.tags.remove(key);
    }
    store_and_apply(ctx, &name, &queue, "UntagQueue").await?;
    Ok(json!({}))
}

/// ListQueueTags: an SQS-created queue's tags; a file queue has none.
pub fn list_queue_tags(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = ctx.queue()?;
    ctx.allow(None, &name)?;
    let tags = ctx
        .config
        .sqs
        .created
        .get(&name)
        .map(|q| q.tags.clone())
        .unwrap_or_default();
    if tags.is_empty() {
        return Ok(json!({}));
    }
    Ok(json!({ "Tags": tags }))
}

/// ListDeadLetterSourceQueues: the queues whose redrive policy targets this one,
/// in pages of `MaxResults` (1 to 1,000) continued with `NextToken`.
pub fn list_dead_letter_source_queues(ctx: &Ctx) -> Result<Value, SqsError> {
    let name = ctx.queue()?;
    ctx.allow(None, &name)?;
    let max = opt_int(&ctx.params, "MaxResults", 1, 1000)?;
    let after = next_token(ctx)?;
    let names: Vec<String> = super::dead::dead_letter_sources(ctx, &name)
        .into_iter()
        .filter(|n| after.as_ref().is_none_or(|a| n > a))
        .filter(|n| ctx.caller.allow_queue(n).is_ok())
        .collect();
    let limit = max.map_or(1000, |m| m.unsigned_abs() as usize);
    let page: Vec<String> = names.iter().take(limit).map(|n| ctx.queue_url(n)).collect();
    let mut out = Map::new();
    out.insert("queueUrls".into(), json!(page));
    if max.is_some() && names.len() > limit {
        out.insert(
            "NextToken".into(),
            json!(URL_SAFE_NO_PAD.encode(&names[limit - 1])),
        );
    }
    Ok(Value::Object(out))
}

/// The name a `NextToken` continues after.
fn next_token(ctx: &Ctx) -> Result<Option<String>, SqsError> {
    match opt_str(&ctx.params, "NextToken")? {
        None => Ok(None),
        Some(token) => URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .map(Some)
            .ok_or_else(|| SqsError::invalid("Invalid or expired next token.")),
    }
}

/// The queue's attributes; with `counts`, the message counts too (ready, leased,
/// delayed). A file queue's come from its config, a created queue's from what was
/// set on it.
fn attributes(
    ctx: &Ctx,
    config: &Config,
    name: &str,
    counts: Option<(u64, u64, u64)>,
) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(q) = config.queues.get(name) else {
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
    put("QueueArn", ctx.arn(name));
    put("SqsManagedSseEnabled", "false".into());
    put("MaximumMessageSize", max_message(ctx, name).to_string());
    if let Some(created) = config.sqs.created.get(name) {
        put("CreatedTimestamp", (created.created_at / 1000).to_string());
        put(
            "LastModifiedTimestamp",
            (created.modified_at / 1000).to_string(),
        );
        for (k, v) in &created.attributes {
            if k != "MaximumMessageSize" {
                put(k, v.clone());
            }
        }
        return out;
    }
    let started = (ctx.state.started_at / 1000).to_string();
    put("CreatedTimestamp", started.clone());
    put("LastModifiedTimestamp", started);
    put("VisibilityTimeout", q.lease.as_secs().to_string());
    put("DelaySeconds", "0".into());
    put("MessageRetentionPeriod", RETENTION_REPORTED.to_string());
    put("ReceiveMessageWaitTimeSeconds", "0".into());
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
        let (ready, leased, delayed) = counts(&name).await?;
        // A dead-letter queue's messages include its sources' dead jobs.
        let sources = super::dead::sources(ctx, &name);
        let (dead_visible, dead_in_flight) = super::dead::counts(ctx, &sources, &name).await?;
        Some((ready + dead_visible, leased + dead_in_flight, delayed))
    } else {
        None
    };
    let attrs: Map<String, Value> = attributes(ctx, &ctx.config, &name, counts)
        .into_iter()
        .filter(|(k, _)| all || wanted.contains(k))
        .collect();
    Ok(json!({ "Attributes": attrs }))
}

/// `(ready, leased, delayed)` of a queue: its dispatch ready and delayed counts
/// and the Broker's leased count.
async fn counts(queue: &str) -> Result<(u64, u64, u64), SqsError> {
    let stats = broker::dispatch_stats(queue, BROKER_TIMEOUT).await?;
    let all = broker::request(BrokerMsg::Counts, BROKER_TIMEOUT).await?;
    let leased = all.get(queue).map_or(0, |c| c.leased);
    Ok((stats.ready, leased, stats.delayed))
}

/// PurgeQueue: cancels every message of the queue (ready, delayed and in flight)
/// as `qctl cancel` would, and for a dead-letter queue purges its sources' dead
/// jobs; one purge per queue per 60 seconds, as SQS allows
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
    // A dead-letter queue's messages include its sources' dead jobs: purged from
    // qd's DLQ (their history goes with them).
    let sources = super::dead::sources(ctx, &queue);
    for source in &sources {
        purge_dead(source).await;
    }
    ctx.state.dead.forget_dlq(&queue);
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
