//! `MessageRetentionPeriod` of SQS-created queues: a message older than its
//! queue's period (60 s to 14 days, counted from `SentTimestamp`, as SQS counts
//! it) is never received and leaves the queue.
//!
//! Two places apply it:
//! - ReceiveMessage ([`is_expired`], `receive.rs`): a leased message past its
//!   period is not answered but expired, so none is ever delivered late, however
//!   long since the last sweep;
//! - a sweep ([`Sweeper`], every [`SWEEP_EVERY`]) expires the ready, delayed and
//!   in-flight messages past their period, oldest first, so the queue's counts
//!   drop and nobody has to receive them for that.
//!
//! Expiring is `BrokerMsg::Cancel` by [`EXPIRED_BY`]: the job ends `cancelled`
//! with that line in its history (an operator sees why; the queue's `retention`
//! prunes it later), while over SQS the message is simply gone, as in SQS. A
//! receipt handle of an expired in-flight message deletes nothing and succeeds.
//! Queues of the config file keep every message (they report the longest period).
//!
//! Takes no messages; the sweep is a task of the SQS routes, stopped with them.

use std::time::Duration;

use tracing::{debug, info};

use super::BROKER_TIMEOUT;
use crate::broker::{self, BrokerMsg};
use crate::job::{JobId, State as JobState, UnixMillis};
use crate::limits::Limits;
use crate::store::{JobFilter, Store};

/// Who cancelled an expired message, in its history.
pub const EXPIRED_BY: &str = "sqs MessageRetentionPeriod passed";

/// How often the sweep looks for expired messages.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How many of a queue's oldest messages one look reads per state.
const PAGE: u32 = 200;

/// When the message was sent (Unix ms): the time of its id, a UUID v7, which is
/// also its `SentTimestamp`.
fn sent_ms(id: JobId) -> Option<UnixMillis> {
    let (secs, nanos) = id.0.get_timestamp()?.to_unix();
    let ms = secs.checked_mul(1000)? + u64::from(nanos / 1_000_000);
    i64::try_from(ms).ok()
}

/// Whether a message sent with `id` is past a retention of `period_s` seconds at
/// `now` (Unix ms).
pub fn is_expired(id: JobId, period_s: i64, now: UnixMillis) -> bool {
    sent_ms(id).is_some_and(|sent| sent.saturating_add(period_s.saturating_mul(1000)) <= now)
}

/// Expires one message (a cancel by [`EXPIRED_BY`]); whether it was expired now
/// (not when it had ended meanwhile).
pub async fn expire(id: JobId) -> bool {
    let by = EXPIRED_BY.to_string();
    matches!(
        broker::request(|tx| BrokerMsg::Cancel(id, by, tx), BROKER_TIMEOUT).await,
        Ok(Ok(_))
    )
}

/// The sweep's task; aborted when dropped (with the SQS routes).
pub struct Sweeper(tokio::task::JoinHandle<()>);

impl Sweeper {
    /// Starts the sweep of the SQS-created queues of the config in force.
    pub fn start(store: Store, limits: std::sync::Arc<Limits>) -> Self {
        Sweeper(tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let config = limits.config();
                for (queue, created) in &config.sqs.created {
                    let period = created.int("MessageRetentionPeriod");
                    let expired = sweep(&store, queue, period).await;
                    if expired > 0 {
                        info!(queue = %queue, expired, "SQS messages past the queue's MessageRetentionPeriod expired.");
                    }
                }
            }
        }))
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Expires the messages of `queue` past `period_s`, oldest first; how many.
async fn sweep(store: &Store, queue: &str, period_s: i64) -> u64 {
    let mut expired = 0;
    for state in [JobState::Ready, JobState::Delayed, JobState::Leased] {
        let mut after = None;
        loop {
            let now = crate::clock::wall_ms();
            let filter = JobFilter {
                queue: Some(queue.to_string()),
                state: Some(state),
                after,
                limit: PAGE,
                now,
                ..JobFilter::default()
            };
            let page = match store.run(move |b| b.list_jobs(&filter)).await {
                Ok(page) => page,
                Err(err) => {
                    debug!(queue = %queue, error = %err, "Looking for expired SQS messages failed; the next sweep tries again.");
                    return expired;
                }
            };
            let full = page.len() == PAGE as usize;
            // Ids are in send order: the first message within its period ends the look.
            let old: Vec<JobId> = page
                .iter()
                .map(|job| job.id)
                .take_while(|id| is_expired(*id, period_s, now))
                .collect();
            let all_old = old.len() == page.len();
            after = old.last().copied();
            for id in old {
                if expire(id).await {
                    expired += 1;
                }
            }
            if !(full && all_old) {
                break;
            }
        }
    }
    expired
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_expires_once_its_period_from_sending_has_passed() {
        let id = JobId::new();
        let sent = sent_ms(id).expect("a v7 id has a time");
        assert!(!is_expired(id, 60, sent + 59_999));
        assert!(is_expired(id, 60, sent + 60_000));
        assert!(is_expired(id, 1_209_600, sent + 1_209_600_000));
        assert!(!is_expired(id, i64::MAX, i64::MAX - 1), "no overflow");
    }
}
