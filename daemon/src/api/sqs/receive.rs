//! ReceiveMessage: leases 1 to 10 jobs through [`crate::broker::lease`] (a long poll of
//! `WaitTimeSeconds`, 0 to 20), with `VisibilityTimeout` as the lease (the queue's
//! `lease` when not given), and answers each as an SQS message with the system and
//! message attributes asked for. A dead-letter queue (one a `RedrivePolicy`
//! names) also hands out its source queues' dead jobs (`dead.rs`). A message
//! past its queue's `MessageRetentionPeriod` is expired, not answered
//! (`retention.rs`).

use std::time::Duration;

use serde_json::{Map, Value, json};
use tracing::debug;

use super::dead;
use super::error::{ErrorKind, SqsError};
use super::handle::ReceiptHandle;
use super::message::{self, Attrs};
use super::params::{opt_int, str_list};
use super::retention;
use super::{BROKER_TIMEOUT, Ctx};
use crate::api::auth::Role;
use crate::broker::{self, BrokerMsg, LeaseRequest, LeasedJob, MAX_EXTEND};
use crate::config::DEFAULT_TENANT;
use crate::executor::ExecutorSpec;
use crate::job::Failure;

/// The lessee name in a job's history for a lease taken through SQS.
const WORKER: &str = "sqs";

/// The system attributes a receive can ask for (`AttributeNames`,
/// `MessageSystemAttributeNames`); the queue attribute names are accepted too, as
/// SQS accepts them in `AttributeNames`, and return nothing.
const SYSTEM_ATTRIBUTES: &[&str] = &[
    "All",
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SequenceNumber",
    "MessageDeduplicationId",
    "MessageGroupId",
    "AWSTraceHeader",
    "DeadLetterQueueSourceArn",
];

/// ReceiveMessage.
pub async fn receive_message(ctx: &Ctx) -> Result<Value, SqsError> {
    let queue = ctx.queue()?;
    ctx.allow(Some(Role::Work), &queue)?;
    let p = &ctx.params;
    let max = opt_int(p, "MaxNumberOfMessages", 1, 10)?.unwrap_or(1);
    let created = ctx.config.sqs.created.get(&queue);
    let wait = opt_int(p, "WaitTimeSeconds", 0, 20)?
        .or_else(|| created.map(|q| q.int("ReceiveMessageWaitTimeSeconds")))
        .unwrap_or(0);
    let max_visibility = i64::try_from(MAX_EXTEND.as_secs()).unwrap_or(43_200);
    // A created queue's VisibilityTimeout of 0 cannot be its lease; it is applied
    // per receive, as a receive asking for 0 is.
    let visibility = opt_int(p, "VisibilityTimeout", 0, max_visibility)?.or_else(|| {
        created
            .map(|q| q.int("VisibilityTimeout"))
            .filter(|v| *v == 0)
    });
    let mut system = str_list(p, "AttributeNames")?;
    system.extend(str_list(p, "MessageSystemAttributeNames")?);
    if let Some(bad) = system
        .iter()
        .find(|n| !SYSTEM_ATTRIBUTES.contains(&n.as_str()) && !super::queues::is_queue_attribute(n))
    {
        return Err(SqsError::new(
            ErrorKind::InvalidAttributeName,
            format!("Unknown Attribute {bad}."),
        ));
    }
    let wanted_attrs = str_list(p, "MessageAttributeNames")?;
    let qcfg = ctx
        .config
        .queues
        .get(&queue)
        .ok_or_else(|| SqsError::no_queue(&queue))?;
    if qcfg.executor != ExecutorSpec::External {
        return Err(SqsError::new(
            ErrorKind::UnsupportedOperation,
            format!(
                "queue {queue:?} is run by qd's own workers; only kind = \"external\" queues are received from"
            ),
        ));
    }
    // A dead-letter queue also hands out its sources' dead jobs (`dead.rs`), each
    // invisible for the receive's visibility timeout, else the queue's.
    let sources = dead::sources(ctx, &queue);
    let dead_visibility_ms = visibility
        .or_else(|| created.map(|q| q.int("VisibilityTimeout")))
        .unwrap_or_else(|| i64::try_from(qcfg.lease.as_secs()).unwrap_or(30))
        * 1000;
    let max = usize::try_from(max).unwrap_or(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait.unsigned_abs());
    let mut messages = Vec::with_capacity(max);
    let mut first = true;
    let retention = created.map(|q| q.int("MessageRetentionPeriod"));
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        // With dead-letter sources a long poll waits in slices, so a message that
        // dies meanwhile is found too; without, the lease's long poll is the wait.
        let slice = match (sources.is_empty(), first) {
            (true, _) => left,
            (false, true) => Duration::ZERO,
            (false, false) => left.min(DEAD_POLL),
        };
        first = false;
        let mut expired = false;
        // Messages already received are answered rather than lost to a later
        // slice's failure (they stay leased until their visibility timeout).
        let jobs = match lease(&queue, max - messages.len(), slice).await {
            Ok(jobs) => jobs,
            Err(e) if messages.is_empty() => return Err(e),
            Err(_) => break,
        };
        for job in jobs {
            let received_at = crate::clock::wall_ms();
            if retention.is_some_and(|period| retention::is_expired(job.id, period, received_at)) {
                retention::expire(job.id).await;
                expired = true;
                continue;
            }
            if let Some(v) = visibility {
                set_visibility(&job, v).await;
            }
            let first_receive =
                if job.attempt > 1 && wants(&system, "ApproximateFirstReceiveTimestamp") {
                    first_receive(ctx, &job).await
                } else {
                    None
                };
            let m = Received {
                handle: ReceiptHandle {
                    queue: job.queue.to_string(),
                    id: job.id,
                    token: job.token,
                },
                tenant: job.tenant.to_string(),
                idempotency_key: Some(job.idempotency_key.clone())
                    .filter(|k| *k != job.id.to_string()),
                payload: job.payload,
                receive_count: job.attempt,
                first_receive: first_receive.unwrap_or(received_at),
                dead_letter_source: None,
            };
            messages.push(render(&m, &system, &wanted_attrs));
        }
        if messages.len() < max && !sources.is_empty() {
            let dead = dead::receive(
                ctx,
                &queue,
                &sources,
                max - messages.len(),
                dead_visibility_ms,
            )
            .await?;
            for d in dead {
                let m = Received {
                    handle: ReceiptHandle {
                        queue: queue.clone(),
                        id: d.id,
                        token: d.token,
                    },
                    tenant: d.tenant,
                    idempotency_key: d.idempotency_key,
                    payload: d.payload,
                    receive_count: d.receive_count,
                    first_receive: d.first_receive,
                    dead_letter_source: Some(ctx.arn(&d.source)),
                };
                messages.push(render(&m, &system, &wanted_attrs));
            }
        }
        // Expired messages took places of this lease: lease again for them.
        if expired && messages.len() < max {
            continue;
        }
        if sources.is_empty() || !messages.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    let mut out = Map::new();
    if !messages.is_empty() {
        out.insert("Messages".into(), Value::Array(messages));
    }
    Ok(Value::Object(out))
}

/// How long one slice of a dead-letter queue's long poll waits for its own
/// messages before looking at its sources' dead jobs again.
const DEAD_POLL: Duration = Duration::from_millis(500);

/// Leases up to `max` jobs of `queue`, waiting up to `wait` for the first.
async fn lease(queue: &str, max: usize, wait: Duration) -> Result<Vec<LeasedJob>, SqsError> {
    let request = LeaseRequest {
        worker: WORKER.to_string(),
        max_jobs: u32::try_from(max).unwrap_or(1),
        wait,
    };
    Ok(broker::lease(queue, request).await?)
}

/// Gives a fresh lease the visibility timeout the receive asked for: a heartbeat
/// extending it, or for 0 an uncharged return (the message is visible again at
/// once, as in SQS). A refusal only means the lease already ended.
async fn set_visibility(job: &LeasedJob, seconds: i64) {
    let (id, token) = (job.id, job.token);
    let result = if seconds == 0 {
        let failure = Failure::Interrupted {
            reason: "received with VisibilityTimeout 0".into(),
        };
        broker::request(|tx| BrokerMsg::Nack(id, token, failure, tx), BROKER_TIMEOUT)
            .await
            .and_then(|r| r)
    } else {
        let extend = Duration::from_secs(seconds.unsigned_abs());
        broker::request(
            |tx| BrokerMsg::Heartbeat(id, token, Some(extend), tx),
            BROKER_TIMEOUT,
        )
        .await
        .and_then(|r| r.map(|_| ()))
    };
    if let Err(err) = result {
        debug!(job = %id, error = %err, "Visibility timeout of a received message not set.");
    }
}

/// A received message, a leased job or a dead job handed out through a
/// dead-letter queue, as `render` answers it.
struct Received {
    handle: ReceiptHandle,
    tenant: String,
    /// The producer's idempotency key, if it gave one.
    idempotency_key: Option<String>,
    payload: Vec<u8>,
    receive_count: u32,
    /// Unix ms.
    first_receive: i64,
    /// The ARN of the queue a dead message died in.
    dead_letter_source: Option<String>,
}

/// Whether the system attribute `name` is asked for (by name or `All`).
fn wants(system: &[String], name: &str) -> bool {
    system.iter().any(|n| n == "All" || n == name)
}

/// One received message as SQS answers it.
fn render(r: &Received, system: &[String], wanted_attrs: &[String]) -> Value {
    let id = r.handle.id;
    let (body, attrs) = message::decode(r.payload.clone());
    let mut m = Map::new();
    m.insert("MessageId".into(), json!(id.to_string()));
    m.insert("ReceiptHandle".into(), json!(r.handle.encode()));
    m.insert("MD5OfBody".into(), json!(message::md5_of_body(&body)));
    m.insert("Body".into(), json!(body));
    let want = |n: &str| wants(system, n);
    let mut sys = Map::new();
    if want("SentTimestamp")
        && let Some(ts) = id.0.get_timestamp()
    {
        let (secs, nanos) = ts.to_unix();
        let ms = secs * 1000 + u64::from(nanos / 1_000_000);
        sys.insert("SentTimestamp".into(), json!(ms.to_string()));
    }
    if want("ApproximateReceiveCount") {
        sys.insert(
            "ApproximateReceiveCount".into(),
            json!(r.receive_count.to_string()),
        );
    }
    if want("ApproximateFirstReceiveTimestamp") {
        sys.insert(
            "ApproximateFirstReceiveTimestamp".into(),
            json!(r.first_receive.to_string()),
        );
    }
    if want("MessageGroupId") && r.tenant != DEFAULT_TENANT {
        sys.insert("MessageGroupId".into(), json!(r.tenant));
    }
    if want("MessageDeduplicationId")
        && let Some(key) = &r.idempotency_key
    {
        sys.insert("MessageDeduplicationId".into(), json!(key));
    }
    if want("DeadLetterQueueSourceArn")
        && let Some(arn) = &r.dead_letter_source
    {
        sys.insert("DeadLetterQueueSourceArn".into(), json!(arn));
    }
    if !sys.is_empty() {
        m.insert("Attributes".into(), Value::Object(sys));
    }
    let selected: Attrs = attrs
        .into_iter()
        .filter(|(name, _)| selects(wanted_attrs, name))
        .collect();
    if let Some(md5) = message::md5_of_attributes(&selected) {
        m.insert("MD5OfMessageAttributes".into(), json!(md5));
        m.insert(
            "MessageAttributes".into(),
            Value::Object(message::attributes_json(&selected)),
        );
    }
    Value::Object(m)
}

/// Whether `MessageAttributeNames` selects the attribute `name`: `All` or `.*`,
/// a `prefix.*`, or the name itself.
fn selects(wanted: &[String], name: &str) -> bool {
    wanted.iter().any(|w| {
        w == "All"
            || w == ".*"
            || w == name
            || w.strip_suffix(".*").is_some_and(|prefix| {
                name.strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('.'))
            })
    })
}

/// When the message was first received: the start of its first attempt in the
/// job's history (a store read, only for a message received before).
async fn first_receive(ctx: &Ctx, job: &LeasedJob) -> Option<i64> {
    if job.attempt <= 1 {
        return None;
    }
    let id = job.id;
    let detail = ctx.args.store.run(move |b| b.job(id)).await.ok()??;
    detail.history.iter().find_map(|h| h.started_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_attribute_names_select_by_name_prefix_or_all() {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(selects(&w(&["All"]), "x"));
        assert!(selects(&w(&[".*"]), "x"));
        assert!(selects(&w(&["x"]), "x"));
        assert!(selects(&w(&["bar.*"]), "bar.baz"));
        assert!(!selects(&w(&["bar.*"]), "barbaz"));
        assert!(!selects(&w(&["y"]), "x"));
        assert!(!selects(&[], "x"));
    }
}
