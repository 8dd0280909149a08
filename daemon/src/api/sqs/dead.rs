//! Dead-letter queues over SQS: the dead jobs of the queues whose `RedrivePolicy`
//! names a queue D are received, deleted, made visible again, counted and purged
//! through D, as SQS users expect of a dead-letter queue.
//!
//! A dead message stays a **dead job of the queue it died in** (`qctl dlq list`
//! shows it with its history, `qctl dlq redrive` and StartMessageMoveTask bring it
//! back). A receive through D leases it *in place*: this node notes, in memory, a
//! visibility deadline, a fencing token and how often D handed it out, and the job
//! does not change state. DeleteMessage with the handle of the latest such receive
//! purges the dead job (one Broker write, dead jobs only), so it leaves qd's DLQ;
//! ChangeMessageVisibility moves the deadline. A dead job that is not in flight
//! through D is visible there and is what a move task moves back.
//!
//! Takes no messages of its own: `receive.rs`, `settle.rs`, `queues.rs` and
//! `moves.rs` call it for a queue that some redrive policy names.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::broker::{self, BrokerMsg};
use crate::job::{JobId, State, Token};
use crate::store::{JobFilter, JobOrder, Store};

use super::error::{ErrorKind, SqsError};
use super::handle::ReceiptHandle;
use super::{BROKER_TIMEOUT, Ctx};
use crate::api::auth::Role;

/// The most dead jobs one listing of a source queue reads.
const LIST_LIMIT: u32 = 10_000;

/// One dead job handed out through a dead-letter queue.
#[derive(Clone, Debug)]
struct DeadLease {
    /// The dead-letter queue it was received through.
    dlq: String,
    /// The queue it died in.
    source: String,
    /// The token of the latest receive's handle.
    token: Token,
    /// Invisible through the dead-letter queue until then (Unix ms).
    visible_at: i64,
    /// Receives through the dead-letter queue on this node.
    receives: u32,
    /// When it was first received through the dead-letter queue (Unix ms).
    first_ms: i64,
}

/// The dead jobs this node handed out through dead-letter queues.
pub struct DeadLeases {
    leases: Mutex<HashMap<JobId, DeadLease>>,
    /// Tokens continue from the start time in microseconds, so a handle from before
    /// a restart never matches a receive after it.
    next_token: AtomicU64,
}

impl Default for DeadLeases {
    fn default() -> Self {
        let start = u64::try_from(crate::clock::wall_ms()).unwrap_or(0) * 1000;
        DeadLeases {
            leases: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(start),
        }
    }
}

/// A dead job received through a dead-letter queue, for `receive.rs` to render.
pub struct DeadReceived {
    /// The job.
    pub id: JobId,
    /// The queue it died in.
    pub source: String,
    /// Its handle's token.
    pub token: Token,
    /// Its tenant.
    pub tenant: String,
    /// Its idempotency key, if the producer gave one.
    pub idempotency_key: Option<String>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Receives in all: the attempts it died with plus receives through the DLQ.
    pub receive_count: u32,
    /// Its first receive (Unix ms): the start of its first attempt.
    pub first_receive: i64,
}

/// What a handle presented to a dead-letter queue names.
pub enum Settled {
    /// Not a dead job handed out here: the ordinary lease path decides.
    NotDead,
    /// Done (deleted, or nothing to do for a stale handle).
    Done,
}

impl DeadLeases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, DeadLease>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Dead jobs of `dlq` in flight now (handed out, visibility not passed).
    pub fn in_flight(&self, dlq: &str, now: i64) -> u64 {
        self.lock()
            .values()
            .filter(|l| l.dlq == dlq && l.visible_at > now)
            .count() as u64
    }

    /// Whether job `id` is in flight through a dead-letter queue now.
    pub fn is_in_flight(&self, id: JobId, now: i64) -> bool {
        self.lock().get(&id).is_some_and(|l| l.visible_at > now)
    }

    /// Forgets the jobs of `ids` (purged or moved back).
    pub fn forget(&self, ids: &[JobId]) {
        let mut map = self.lock();
        for id in ids {
            map.remove(id);
        }
    }

    /// Forgets every job handed out through `dlq`.
    pub fn forget_dlq(&self, dlq: &str) {
        self.lock().retain(|_, l| l.dlq != dlq);
    }

    /// Claims `id` for a receive through `dlq` unless it is in flight: the new
    /// token and the number of receives through the DLQ so far (this one included).
    fn claim(
        &self,
        id: JobId,
        dlq: &str,
        source: &str,
        now: i64,
        visibility_ms: i64,
    ) -> Option<(Token, u32, i64)> {
        let mut map = self.lock();
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let lease = map.entry(id).or_insert_with(|| DeadLease {
            dlq: dlq.to_string(),
            source: source.to_string(),
            token: 0,
            visible_at: 0,
            receives: 0,
            first_ms: now,
        });
        if lease.visible_at > now {
            return None;
        }
        lease.dlq = dlq.to_string();
        lease.token = token;
        lease.visible_at = now + visibility_ms;
        lease.receives += 1;
        Some((token, lease.receives, lease.first_ms))
    }

    /// Drops a claim whose job turned out not to be dead any more.
    fn drop_claim(&self, id: JobId, token: Token) {
        let mut map = self.lock();
        if map.get(&id).is_some_and(|l| l.token == token) {
            map.remove(&id);
        }
    }

    /// Forgets the leases of `source` whose job is not among `dead` (redriven or
    /// purged by an operator), when `dead` is the whole list.
    fn prune(&self, source: &str, dead: &[JobId]) {
        self.lock()
            .retain(|id, l| l.source != source || dead.contains(id));
    }

    /// The latest lease of `h` through `dlq`: `Some(true)` when the handle is the
    /// latest receive's, `Some(false)` when stale, `None` when this node handed the
    /// job out through no DLQ or through another one.
    fn matches(&self, h: &ReceiptHandle, dlq: &str) -> Option<bool> {
        self.lock()
            .get(&h.id)
            .filter(|l| l.dlq == dlq)
            .map(|l| l.token == h.token)
    }
}

/// The SQS-created queues whose redrive policy names `queue` as their dead-letter
/// queue, in name order.
pub fn dead_letter_sources(ctx: &Ctx, queue: &str) -> Vec<String> {
    let arn = ctx.arn(queue);
    ctx.config
        .sqs
        .created
        .iter()
        .filter(|(_, q)| {
            q.redrive_policy()
                .is_some_and(|p| p.dead_letter_target_arn == arn)
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// The queues whose redrive policy names `dlq` and whose dead jobs the caller may
/// work (`work` on the source queue).
pub fn sources(ctx: &Ctx, dlq: &str) -> Vec<String> {
    dead_letter_sources(ctx, dlq)
        .into_iter()
        .filter(|s| s != dlq && ctx.allow(Some(Role::Work), s).is_ok())
        .collect()
}

/// The dead jobs of `source`, oldest sent first (at most [`LIST_LIMIT`]), and
/// whether that is all of them.
pub async fn dead_ids(store: &Store, source: &str) -> Result<(Vec<JobId>, bool), SqsError> {
    let filter = JobFilter {
        queue: Some(source.to_string()),
        state: Some(State::Dead),
        order: JobOrder::OldestFirst,
        limit: LIST_LIMIT,
        ..JobFilter::default()
    };
    let jobs = store.run(move |b| b.list_jobs(&filter)).await?;
    let complete = jobs.len() < LIST_LIMIT as usize;
    Ok((jobs.into_iter().map(|j| j.id).collect(), complete))
}

/// Receives up to `max` dead jobs of `sources` through `dlq`, each invisible there
/// for `visibility_ms` (0: handed out and visible again at once).
pub async fn receive(
    ctx: &Ctx,
    dlq: &str,
    sources: &[String],
    max: usize,
    visibility_ms: i64,
) -> Result<Vec<DeadReceived>, SqsError> {
    let leases = &ctx.state.dead;
    let mut out = Vec::new();
    for source in sources {
        if out.len() >= max {
            break;
        }
        let (ids, complete) = dead_ids(&ctx.args.store, source).await?;
        if complete {
            leases.prune(source, &ids);
        }
        for id in ids {
            if out.len() >= max {
                break;
            }
            let now = crate::clock::wall_ms();
            let Some((token, receives, first_ms)) =
                leases.claim(id, dlq, source, now, visibility_ms)
            else {
                continue;
            };
            let detail = ctx.args.store.run(move |b| b.job(id)).await;
            let detail = match detail {
                Ok(Some(d)) if d.job.state == State::Dead => d,
                Ok(_) => {
                    leases.drop_claim(id, token);
                    continue;
                }
                Err(err) => {
                    leases.drop_claim(id, token);
                    return Err(err.into());
                }
            };
            let first_receive = detail
                .history
                .iter()
                .find_map(|h| h.started_at)
                .unwrap_or(first_ms);
            out.push(DeadReceived {
                id,
                source: source.clone(),
                token,
                tenant: detail.job.tenant.to_string(),
                idempotency_key: detail.job.idempotency_key.clone(),
                payload: detail.payload,
                receive_count: detail.job.attempts + receives,
                first_receive,
            });
        }
    }
    Ok(out)
}

/// The handles among `handles` that name dead jobs handed out through `dlq`:
/// those of the latest receive are purged from qd's DLQ in one Broker write;
/// stale ones are done with nothing changed. Answers, per handle, `NotDead` for
/// the ones the ordinary lease path decides.
pub async fn delete(
    ctx: &Ctx,
    dlq: &str,
    handles: &[ReceiptHandle],
) -> Result<Vec<Settled>, SqsError> {
    let leases = &ctx.state.dead;
    let mut answers = Vec::with_capacity(handles.len());
    let mut purge = Vec::new();
    for h in handles {
        match leases.matches(h, dlq) {
            None => answers.push(Settled::NotDead),
            Some(latest) => {
                if latest && !purge.contains(&h.id) {
                    purge.push(h.id);
                }
                answers.push(Settled::Done);
            }
        }
    }
    if purge.is_empty() {
        return Ok(answers);
    }
    let ids = purge.clone();
    let outcome = broker::request(|tx| BrokerMsg::Purge(ids, tx), BROKER_TIMEOUT).await??;
    // A job whose write is in flight was not purged: the client retries.
    if let Some((id, why)) = outcome
        .refused
        .iter()
        .find(|(_, why)| why.contains("in flight"))
    {
        leases.forget(&outcome.moved);
        return Err(SqsError::new(
            ErrorKind::ServiceUnavailable,
            format!("message {id} was not deleted: {why}"),
        ));
    }
    // Refused otherwise: no longer dead (an operator redrove it), so the handle is
    // stale, as for a lease that ended.
    leases.forget(&purge);
    Ok(answers)
}

/// ChangeMessageVisibility of a dead job handed out through `dlq`: `None` when the
/// handle names no such job (the ordinary lease path decides).
pub fn change_visibility(
    ctx: &Ctx,
    dlq: &str,
    h: &ReceiptHandle,
    seconds: i64,
) -> Option<Result<(), SqsError>> {
    let mut map = ctx.state.dead.lock();
    let lease = map.get_mut(&h.id).filter(|l| l.dlq == dlq)?;
    let now = crate::clock::wall_ms();
    if lease.token != h.token || lease.visible_at <= now {
        return Some(Err(SqsError::new(
            ErrorKind::MessageNotInflight,
            format!(
                "Message {} is not in flight under this receipt handle (it was deleted, received again, or its visibility timeout passed).",
                h.id
            ),
        )));
    }
    lease.visible_at = now + seconds * 1000;
    Some(Ok(()))
}

/// `(visible, in flight)` dead messages of `dlq`'s sources: the Broker's dead
/// counts less those handed out through `dlq` and not yet visible again.
pub async fn counts(ctx: &Ctx, sources: &[String], dlq: &str) -> Result<(u64, u64), SqsError> {
    if sources.is_empty() {
        return Ok((0, 0));
    }
    let all = broker::request(BrokerMsg::Counts, BROKER_TIMEOUT).await?;
    let dead: u64 = sources
        .iter()
        .filter_map(|s| all.get(s.as_str()))
        .map(|c| c.dead)
        .sum();
    let in_flight = ctx
        .state
        .dead
        .in_flight(dlq, crate::clock::wall_ms())
        .min(dead);
    Ok((dead - in_flight, in_flight))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(id: JobId, token: Token, queue: &str) -> ReceiptHandle {
        ReceiptHandle {
            queue: queue.into(),
            id,
            token,
        }
    }

    #[test]
    fn a_claimed_dead_job_is_invisible_until_its_deadline_and_counts_its_receives() {
        let leases = DeadLeases::default();
        let id = JobId::new();
        let (t1, n1, first) = leases.claim(id, "dlq", "src", 1_000, 5_000).expect("free");
        assert_eq!(n1, 1);
        assert_eq!(first, 1_000);
        assert!(leases.claim(id, "dlq", "src", 5_999, 5_000).is_none());
        assert!(leases.is_in_flight(id, 5_999));
        assert_eq!(leases.in_flight("dlq", 5_999), 1);
        let (t2, n2, first2) = leases
            .claim(id, "dlq", "src", 6_000, 5_000)
            .expect("visible");
        assert_ne!(t1, t2);
        assert_eq!(n2, 2);
        assert_eq!(first2, 1_000);
        assert_eq!(leases.matches(&handle(id, t1, "dlq"), "dlq"), Some(false));
        assert_eq!(leases.matches(&handle(id, t2, "dlq"), "dlq"), Some(true));
        assert_eq!(leases.matches(&handle(id, t2, "other"), "other"), None);
        assert_eq!(
            leases.matches(&handle(JobId::new(), t2, "dlq"), "dlq"),
            None
        );
    }

    #[test]
    fn visibility_zero_hands_out_and_leaves_visible() {
        let leases = DeadLeases::default();
        let id = JobId::new();
        leases.claim(id, "dlq", "src", 1_000, 0).expect("free");
        assert!(!leases.is_in_flight(id, 1_000));
        assert!(leases.claim(id, "dlq", "src", 1_000, 0).is_some());
    }

    #[test]
    fn prune_forgets_jobs_no_longer_dead_in_their_source_only() {
        let leases = DeadLeases::default();
        let (a, b, c) = (JobId::new(), JobId::new(), JobId::new());
        leases.claim(a, "dlq", "src", 0, 10).expect("a");
        leases.claim(b, "dlq", "src", 0, 10).expect("b");
        leases.claim(c, "dlq", "other", 0, 10).expect("c");
        leases.prune("src", &[a]);
        assert!(leases.is_in_flight(a, 1));
        assert!(!leases.is_in_flight(b, 1));
        assert!(leases.is_in_flight(c, 1));
        leases.forget_dlq("dlq");
        assert_eq!(leases.in_flight("dlq", 1), 0);
    }

    #[test]
    fn tokens_after_a_restart_do_not_repeat_earlier_ones() {
        let before = DeadLeases::default();
        let id = JobId::new();
        let (t, _, _) = before.claim(id, "dlq", "src", 0, 10).expect("free");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let after = DeadLeases::default();
        let (t2, _, _) = after.claim(id, "dlq", "src", 0, 10).expect("free");
        assert!(t2 > t);
    }
}
