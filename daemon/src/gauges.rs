//! The Gauges actor: keeps state gauges right and feeds the systemd watchdog.
//!
//! Every second (or half the watchdog timeout, if shorter) it asks the Broker (leased
//! and dead counts, DLQ depth and oldest death), each queue's dispatch (ready, delayed,
//! oldest ready job) and each WorkerPool
//! (busy/idle/desired), and sets `qd_queue_depth`, `qd_queue_oldest_ready_age_seconds`,
//! `qd_dlq_depth`, `qd_dlq_oldest_age_seconds` and `qd_workers*`. Because the values
//! are derived from the actors' state, they are right after a restart and return to
//! zero when a queue drains. When the Broker answered every question, it sends
//! `WATCHDOG=1`: a wedged tree stops the pings and systemd restarts qd.
//!
//! Messages: only its own `Tick`. Supervised by the Supervisor.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::broker::{self, BrokerMsg};
use crate::clock::wall_ms;
use crate::config::Config;
use crate::job::UnixMillis;
use crate::limits::Limits;
use crate::metrics::{self, DepthState};
use crate::worker_pool::{self, PoolMsg};

/// The registered name of the gauges actor.
pub const NAME: &str = "gauges";
/// How often gauges are refreshed (and the watchdog pinged) at most; see [`tick_every`].
pub const EVERY: Duration = Duration::from_secs(1);
/// The shortest tick, however short `WatchdogSec=` is.
const FASTEST: Duration = Duration::from_millis(100);
const ASK: Duration = Duration::from_millis(900);

/// What the gauges actor is started with.
pub struct GaugesArgs {
    /// Owner of the config in force (queue names, read at every tick).
    pub limits: Arc<Limits>,
}

/// Messages the gauges actor takes.
pub enum GaugesMsg {
    /// Its timer: refresh every gauge, then ping the watchdog if all answered.
    Tick,
}

/// The gauges actor.
pub struct Gauges;

impl Actor for Gauges {
    type Msg = GaugesMsg;
    type State = Arc<Limits>;
    type Arguments = GaugesArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<GaugesMsg>,
        args: GaugesArgs,
    ) -> Result<Arc<Limits>, ActorProcessingErr> {
        myself.send_interval(tick_every(crate::notify::watchdog_interval()), || {
            GaugesMsg::Tick
        });
        Ok(args.limits)
    }

    async fn handle(
        &self,
        _myself: ActorRef<GaugesMsg>,
        _msg: GaugesMsg,
        limits: &mut Arc<Limits>,
    ) -> Result<(), ActorProcessingErr> {
        if refresh(&limits.config()).await {
            let _ = crate::notify::watchdog_ping();
        }
        Ok(())
    }
}

/// The tick interval: [`EVERY`], or half the systemd watchdog timeout when that is
/// shorter (as `sd_watchdog_enabled(3)` advises), never below 100 ms. With the
/// shipped `WatchdogSec=30s` this is 1 s, fifteen pings per timeout.
pub fn tick_every(watchdog: Option<Duration>) -> Duration {
    watchdog.map_or(EVERY, |w| (w / 2).clamp(FASTEST, EVERY))
}

async fn ask<M: ractor::Message, T: Send + 'static>(
    name: String,
    build: impl FnOnce(ractor::RpcReplyPort<T>) -> M,
) -> Option<T> {
    let actor = ActorRef::<M>::where_is(name)?;
    match actor.call(build, Some(ASK)).await {
        Ok(ractor::rpc::CallResult::Success(v)) => Some(v),
        _ => None,
    }
}

fn age(at: Option<UnixMillis>, now: UnixMillis) -> Duration {
    at.map(|t| crate::clock::until(now, t)).unwrap_or_default()
}

/// Sets every state gauge; true when the Broker answered every question.
async fn refresh(config: &Config) -> bool {
    let now = wall_ms();
    let counts = ask(broker::NAME.into(), BrokerMsg::Counts).await;
    let dead = ask(broker::NAME.into(), BrokerMsg::DlqStats)
        .await
        .unwrap_or_default();
    let mut healthy = counts.is_some();
    for queue in config.queues.keys() {
        let sched = broker::dispatch_stats(queue, ASK).await.ok();
        healthy &= sched.is_some();
        let sched = sched.unwrap_or_default();
        let c = counts
            .as_ref()
            .and_then(|c| c.get(queue.as_str()).copied())
            .unwrap_or_default();
        metrics::set_queue_depth(queue, DepthState::Ready, sched.ready);
        metrics::set_queue_depth(queue, DepthState::Delayed, sched.delayed);
        metrics::set_queue_depth(queue, DepthState::Leased, c.leased);
        metrics::set_queue_depth(queue, DepthState::Dead, c.dead);
        metrics::set_queue_depth(queue, DepthState::Waiting, c.held_waiting);
        metrics::set_queue_depth(queue, DepthState::Blocked, c.held_blocked);
        let oldest = sched.oldest_ready_at;
        metrics::set_oldest_ready_age(queue, age(oldest, now));
        let d = dead.get(queue.as_str()).copied().unwrap_or_default();
        metrics::set_dlq(queue, d.depth, age(d.oldest_died_at, now));
        if let Some(p) = ask(worker_pool::name(queue), PoolMsg::Stats).await {
            metrics::set_workers(queue, p.busy, p.total - p.busy, p.desired);
        }
    }
    healthy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_every_second_or_at_half_a_shorter_watchdog_timeout() {
        assert_eq!(tick_every(None), EVERY);
        assert_eq!(tick_every(Some(Duration::from_secs(30))), EVERY);
        assert_eq!(
            tick_every(Some(Duration::from_millis(1200))),
            Duration::from_millis(600)
        );
        assert_eq!(tick_every(Some(Duration::from_millis(10))), FASTEST);
    }
}
