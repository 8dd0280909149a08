//! Message move tasks: StartMessageMoveTask, ListMessageMoveTasks,
//! CancelMessageMoveTask, on qd's redrive.
//!
//! In SQS a dead-letter queue holds the messages its source queues gave up on, and
//! a move task sends them back. In qd those messages are dead jobs of their source
//! queue (kept with their history, `qctl dlq list`); a move task from a
//! dead-letter queue's ARN is qd's redrive (through the Dlq actor) of the dead
//! jobs of every queue whose `RedrivePolicy` names it, each back to its own queue
//! with a fresh attempt budget; one in flight through the dead-letter queue
//! (`dead.rs`) stays. `MaxNumberOfMessagesPerSecond` paces the redrive to that
//! many jobs per write, one write a second. Tasks are kept in memory (the last
//! [`KEPT_PER_SOURCE`] per source queue) for ListMessageMoveTasks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ractor::ActorRef;
use serde_json::{Map, Value, json};
use tracing::info;

use super::dead::{DeadLeases, dead_ids, dead_letter_sources};
use super::error::{ErrorKind, SqsError};
use super::params::{opt_int, opt_str, req_str};
use super::{BROKER_TIMEOUT, Ctx};
use crate::api::auth::Role;
use crate::broker::{self, BrokerMsg};
use crate::dlq::{self, DlqMsg, Selection};
use crate::job::JobId;
use crate::store::Store;

/// Tasks ListMessageMoveTasks can show per source queue (SQS shows the last 10).
const KEPT_PER_SOURCE: usize = 10;

/// One move task.
#[derive(Clone, Debug)]
struct Task {
    handle: String,
    source_arn: String,
    destination_arn: Option<String>,
    max_per_second: Option<i64>,
    status: &'static str,
    moved: u64,
    to_move: u64,
    failure: Option<String>,
    started_ms: i64,
}

/// The move tasks of this node, by source ARN, newest last.
#[derive(Default)]
pub struct MoveTasks {
    by_source: Mutex<HashMap<String, Vec<Task>>>,
}

impl MoveTasks {
    fn update(&self, source: &str, handle: &str, change: impl FnOnce(&mut Task)) {
        let mut map = self.by_source.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = map
            .get_mut(source)
            .and_then(|tasks| tasks.iter_mut().find(|t| t.handle == handle))
        {
            change(task);
        }
    }
}

/// StartMessageMoveTask: `SourceArn` must be a dead-letter queue (named by some
/// queue's redrive policy); its source queues' dead messages are redriven. A
/// `DestinationArn` other than the single source queue is `UnsupportedOperation`:
/// qd's redrive returns a message to the queue it died in.
pub async fn start(ctx: &Ctx) -> Result<Value, SqsError> {
    let source_arn = req_str(&ctx.params, "SourceArn")?.to_string();
    let destination_arn = opt_str(&ctx.params, "DestinationArn")?.map(str::to_string);
    let max_per_second = opt_int(&ctx.params, "MaxNumberOfMessagesPerSecond", 1, 500)?;
    let dlq_name = ctx
        .queue_of_arn(&ctx.config, &source_arn)
        .ok_or_else(|| {
            SqsError::new(
                ErrorKind::ResourceNotFound,
                format!("The resource that you specified for the SourceArn parameter doesn't exist: {source_arn}"),
            )
        })?;
    ctx.allow(Some(Role::Work), &dlq_name)?;
    let sources = dead_letter_sources(ctx, &dlq_name);
    if sources.is_empty() {
        return Err(SqsError::invalid(format!(
            "Source queue {dlq_name} must be configured as a dead-letter queue: no queue's RedrivePolicy names {source_arn}."
        )));
    }
    for source in &sources {
        ctx.allow(Some(Role::Work), source)?;
    }
    if let Some(dest) = &destination_arn {
        let single = sources.len() == 1 && *dest == ctx.arn(&sources[0]);
        if !single {
            return Err(SqsError::new(
                ErrorKind::UnsupportedOperation,
                format!(
                    "qd moves a dead message back to the queue it died in; leave DestinationArn out (the sources of {dlq_name} are {})",
                    sources.join(", ")
                ),
            ));
        }
    }
    let tasks = ctx.state.moves.clone();
    {
        let map = tasks.by_source.lock().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&source_arn)
            .is_some_and(|ts| ts.iter().any(|t| t.status == "RUNNING"))
        {
            return Err(SqsError::new(
                ErrorKind::UnsupportedOperation,
                format!("A message move task is already running for {source_arn}."),
            ));
        }
    }
    let in_flight = ctx.state.dead.in_flight(&dlq_name, crate::clock::wall_ms());
    let to_move = dead_count(&sources).await?.saturating_sub(in_flight);
    let handle = uuid::Uuid::now_v7().to_string();
    let task = Task {
        handle: handle.clone(),
        source_arn: source_arn.clone(),
        destination_arn,
        max_per_second,
        status: "RUNNING",
        moved: 0,
        to_move,
        failure: None,
        started_ms: crate::clock::wall_ms(),
    };
    {
        let mut map = tasks.by_source.lock().unwrap_or_else(|e| e.into_inner());
        let list = map.entry(source_arn.clone()).or_default();
        list.push(task);
        if list.len() > KEPT_PER_SOURCE {
            list.remove(0);
        }
    }
    let dead = ctx.state.dead.clone();
    let store = ctx.args.store.clone();
    tokio::spawn(run(
        tasks,
        dead,
        store,
        source_arn,
        handle.clone(),
        sources,
        max_per_second,
    ));
    Ok(json!({ "TaskHandle": handle }))
}

/// Dead jobs of `queues`, from the Broker's counts.
async fn dead_count(queues: &[String]) -> Result<u64, SqsError> {
    let counts = broker::request(BrokerMsg::Counts, BROKER_TIMEOUT).await?;
    Ok(queues
        .iter()
        .filter_map(|q| counts.get(q.as_str()))
        .map(|c| c.dead)
        .sum())
}

/// Redrives each source queue's dead jobs in turn, until done or cancelled; a
/// dead job in flight through the dead-letter queue (received and neither deleted
/// nor visible again) stays, as SQS moves only visible messages. With
/// `MaxNumberOfMessagesPerSecond` = N, each write redrives at most N jobs and the
/// next starts a second after it; without, a source's jobs go in one write.
async fn run(
    tasks: Arc<MoveTasks>,
    dead: Arc<DeadLeases>,
    store: Store,
    source_arn: String,
    handle: String,
    sources: Vec<String>,
    max_per_second: Option<i64>,
) {
    let fail = |reason: String| {
        tasks.update(&source_arn, &handle, |t| {
            t.status = "FAILED";
            t.failure = Some(reason);
        });
    };
    let cancelled = || {
        let map = tasks.by_source.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&source_arn)
            .and_then(|ts| ts.iter().find(|t| t.handle == handle))
            .is_some_and(|t| t.status == "CANCELLING")
    };
    let mut next_write = tokio::time::Instant::now();
    for queue in sources {
        let ids = match dead_ids(&store, &queue).await {
            Ok((ids, _)) => {
                let now = crate::clock::wall_ms();
                ids.into_iter()
                    .filter(|id| !dead.is_in_flight(*id, now))
                    .collect::<Vec<_>>()
            }
            Err(err) => return fail(err.message),
        };
        let chunk = max_per_second.map_or(ids.len(), |n| usize::try_from(n).unwrap_or(1));
        for ids in ids.chunks(chunk.max(1)) {
            tokio::time::sleep_until(next_write).await;
            if cancelled() {
                tasks.update(&source_arn, &handle, |t| t.status = "CANCELLED");
                return;
            }
            if max_per_second.is_some() {
                next_write = tokio::time::Instant::now() + PACE;
            }
            match redrive(ids.to_vec()).await {
                Ok(moved) => {
                    dead.forget(&moved);
                    info!(queue = %queue, moved = moved.len(), "SQS message move task redrove dead jobs.");
                    tasks.update(&source_arn, &handle, |t| t.moved += moved.len() as u64);
                }
                Err(reason) => return fail(reason),
            }
        }
    }
    tasks.update(&source_arn, &handle, |t| {
        t.status = if t.status == "CANCELLING" {
            "CANCELLED"
        } else {
            "COMPLETED"
        };
    });
}

/// The period `MaxNumberOfMessagesPerSecond` counts over.
const PACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Redrives `ids` (dead jobs) through the Dlq actor in one write; the ones moved.
async fn redrive(ids: Vec<JobId>) -> Result<Vec<JobId>, String> {
    let selection = Selection {
        ids,
        ..Selection::default()
    };
    let by = "sqs StartMessageMoveTask".to_string();
    let dlq = ActorRef::<DlqMsg>::where_is(dlq::NAME)
        .ok_or_else(|| "the Dlq actor is restarting".to_string())?;
    match dlq
        .call(
            |tx| DlqMsg::Redrive(selection, by, false, tx),
            Some(BROKER_TIMEOUT),
        )
        .await
    {
        Ok(ractor::rpc::CallResult::Success(Ok(outcome))) => Ok(outcome.moved),
        Ok(ractor::rpc::CallResult::Success(Err(e))) => Err(e.to_string()),
        _ => Err("the Dlq actor did not answer".to_string()),
    }
}

/// ListMessageMoveTasks: the newest `MaxResults` (1 to 10, default 1) tasks of
/// `SourceArn`.
pub fn list(ctx: &Ctx) -> Result<Value, SqsError> {
    let source_arn = req_str(&ctx.params, "SourceArn")?;
    let max = opt_int(&ctx.params, "MaxResults", 1, 10)?.unwrap_or(1);
    let dlq_name = ctx
        .queue_of_arn(&ctx.config, source_arn)
        .ok_or_else(|| {
            SqsError::new(
                ErrorKind::ResourceNotFound,
                format!("The resource that you specified for the SourceArn parameter doesn't exist: {source_arn}"),
            )
        })?;
    ctx.allow(None, &dlq_name)?;
    let map = ctx
        .state
        .moves
        .by_source
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let results: Vec<Value> = map
        .get(source_arn)
        .map(|tasks| {
            tasks
                .iter()
                .rev()
                .take(max.unsigned_abs() as usize)
                .map(entry)
                .collect()
        })
        .unwrap_or_default();
    Ok(json!({ "Results": results }))
}

fn entry(t: &Task) -> Value {
    let mut out = Map::new();
    if t.status == "RUNNING" {
        out.insert("TaskHandle".into(), json!(t.handle));
    }
    out.insert("Status".into(), json!(t.status));
    out.insert("SourceArn".into(), json!(t.source_arn));
    if let Some(d) = &t.destination_arn {
        out.insert("DestinationArn".into(), json!(d));
    }
    if let Some(n) = t.max_per_second {
        out.insert("MaxNumberOfMessagesPerSecond".into(), json!(n));
    }
    out.insert("ApproximateNumberOfMessagesMoved".into(), json!(t.moved));
    out.insert("ApproximateNumberOfMessagesToMove".into(), json!(t.to_move));
    if let Some(f) = &t.failure {
        out.insert("FailureReason".into(), json!(f));
    }
    out.insert("StartedTimestamp".into(), json!(t.started_ms));
    Value::Object(out)
}

/// CancelMessageMoveTask: a running task stops before its next write (a source
/// queue's, or with `MaxNumberOfMessagesPerSecond` its next second's; what a
/// write moved stays moved).
pub fn cancel(ctx: &Ctx) -> Result<Value, SqsError> {
    let handle = req_str(&ctx.params, "TaskHandle")?;
    let mut map = ctx
        .state
        .moves
        .by_source
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let task = map
        .values_mut()
        .flat_map(|ts| ts.iter_mut())
        .find(|t| t.handle == handle)
        .ok_or_else(|| {
            SqsError::new(
                ErrorKind::ResourceNotFound,
                format!("Task does not exist: {handle}"),
            )
        })?;
    let name = task
        .source_arn
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    ctx.allow(Some(Role::Work), &name)?;
    if task.status != "RUNNING" {
        return Err(SqsError::new(
            ErrorKind::UnsupportedOperation,
            format!(
                "Only a RUNNING task can be cancelled; this one is {}.",
                task.status
            ),
        ));
    }
    task.status = "CANCELLING";
    Ok(json!({ "ApproximateNumberOfMessagesMoved": task.moved }))
}
