//! The Periodic actor: the one owner of firing schedules (`[schedules.NAME]`).
//!
//! It holds each configured schedule's stored state ([`ScheduleRow`]: next tick,
//! last run, pause) and arms **one timer**, for the soonest fire time among them;
//! it never polls. When the timer goes off it asks [`schedule::plan`] what is due
//! and sends each run to the Broker as [`BrokerMsg::Fire`], which enqueues the
//! tick's job (key `schedule:NAME:TICK`) and advances the stored next tick by
//! compare-and-set in the same commit: a `kill -9` at any moment neither loses nor
//! repeats a tick. Ticks left out by the schedule's `catch_up` are advanced over
//! in one store write and counted `missed`.
//!
//! On a store shared by several nodes only the leader fires (as of its last
//! heartbeat, [`ClusterView::leader_epoch`]); the Cluster actor sends
//! [`PeriodicMsg::Beat`] after each heartbeat, at which the leader rereads the
//! stored state (a pause set on another node, the advances of an earlier
//! leader). A deposed leader's late fire finds the next tick advanced and writes
//! nothing ([`Fired::Stale`]); the key would make it a duplicate anyway.
//!
//! Messages ([`PeriodicMsg`]): its own `Tick`; `Beat` (Cluster actor); `Reread`
//! (after a reload, or an admin's pause, resume or trigger). Supervised by the
//! Supervisor; on (re)start it reads the stored state, so nothing is lost.

use std::collections::HashMap;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::broker::{self, BrokerError, BrokerMsg, EnqueueRequest, Fire, Fired};
use crate::clock::wall_ms;
use crate::config::ScheduleConfig;
use crate::daemon::ClusterView;
use crate::daemon::Daemon;
use crate::job::UnixMillis;
use crate::metrics::{self, ScheduleResult};
use crate::schedule::{self, FireKind, Overlap};
use crate::store::{Advance, ScheduleRow, StoreError};

/// The registered name of the Periodic actor.
pub const NAME: &str = "periodic";

/// How long a fire waits for the Broker.
const CALL: Duration = Duration::from_secs(10);

/// How soon a fire the Broker or store could not take is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// The longest sleep of the timer: a wall-clock jump (the fire times are wall
/// time, the timer is monotonic) is noticed within it.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// Messages the Periodic actor takes.
#[derive(Debug)]
pub enum PeriodicMsg {
    /// Its timer: fire what is due, then arm for the next.
    Tick,
    /// From the Cluster actor after each heartbeat: leadership may have changed.
    Beat,
    /// Reread the config and the stored state (a reload, an admin's change).
    Reread,
}

/// Asks the Periodic actor to reread the config and the stored state; nothing if
/// it is not running (it reads both when it starts).
pub fn reread() {
    if let Some(actor) = ActorRef::<PeriodicMsg>::where_is(NAME) {
        let _ = actor.cast(PeriodicMsg::Reread);
    }
}

/// Tells the Periodic actor that a heartbeat was written (leadership may have
/// changed); nothing if it is not running.
pub fn beat() {
    if let Some(actor) = ActorRef::<PeriodicMsg>::where_is(NAME) {
        let _ = actor.cast(PeriodicMsg::Beat);
    }
}

/// The Periodic actor (its state is [`PeriodicState`]).
pub struct Periodic;

/// The Periodic actor's state.
pub struct PeriodicState {
    daemon: Daemon,
    /// Stored state by schedule name (rows of schedules no longer configured too).
    rows: HashMap<String, ScheduleRow>,
    /// Whether this node fires (always on a store only it writes).
    firing: bool,
    /// The armed timer's `Tick`.
    timer: Option<tokio::task::JoinHandle<Result<(), ractor::MessagingErr<PeriodicMsg>>>>,
}

impl Actor for Periodic {
    type Msg = PeriodicMsg;
    type State = PeriodicState;
    type Arguments = Daemon;

    async fn pre_start(
        &self,
        myself: ActorRef<PeriodicMsg>,
        daemon: Daemon,
    ) -> Result<PeriodicState, ActorProcessingErr> {
        for name in daemon.config().schedules.keys() {
            metrics::register_schedule(name);
        }
        let _ = myself.cast(PeriodicMsg::Reread);
        Ok(PeriodicState {
            daemon,
            rows: HashMap::new(),
            firing: false,
            timer: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<PeriodicMsg>,
        msg: PeriodicMsg,
        state: &mut PeriodicState,
    ) -> Result<(), ActorProcessingErr> {
        let firing = state.fires_here();
        let reread = match msg {
            PeriodicMsg::Tick => false,
            PeriodicMsg::Reread => true,
            // A leader rereads at each heartbeat: pauses and resumes set on other
            // nodes reach it within a fifth of `node_timeout`.
            PeriodicMsg::Beat => firing,
        };
        if firing != state.firing {
            info!(
                firing,
                "Schedules: this node {} fires them.",
                if firing { "now" } else { "no longer" }
            );
            state.firing = firing;
        }
        let mut retry = false;
        let configured = !state.daemon.config().schedules.is_empty();
        if reread || (firing && configured && state.rows.is_empty()) {
            retry |= state.reread().await.is_err();
        }
        if state.firing && !retry {
            retry |= state.sync(wall_ms()).await;
            retry |= state.fire_due(wall_ms()).await;
        }
        state.publish();
        state.arm(&myself, retry);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<PeriodicMsg>,
        state: &mut PeriodicState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(timer) = state.timer.take() {
            timer.abort();
        }
        Ok(())
    }
}

impl PeriodicState {
    /// Whether this node fires: on a store only it writes, always; else while it
    /// holds the leader lease.
    fn fires_here(&self) -> bool {
        let shared = self.daemon.config().daemon.database.is_some();
        ClusterView::prunes(shared.then_some(&*self.daemon.cluster))
    }

    /// Reads every stored schedule state. Errors are logged; the caller retries.
    async fn reread(&mut self) -> Result<(), StoreError> {
        match self.daemon.store.run(|b| b.schedules()).await {
            Ok(rows) => {
                self.rows = rows.into_iter().map(|r| (r.name.clone(), r)).collect();
                Ok(())
            }
            Err(err) => {
                warn!(error = %err, "Schedules: cannot read their stored state; retrying.");
                Err(err)
            }
        }
    }

    /// Gives each configured, unpaused schedule a next tick computed for its
    /// current spec: a new schedule, a changed spec, or a resume starts from
    /// `now` (nothing to catch up). Answers whether a write must be retried.
    async fn sync(&mut self, now: UnixMillis) -> bool {
        let config = self.daemon.config();
        let mut retry = false;
        for (name, sched) in &config.schedules {
            let row = self.rows.get(name);
            let spec = sched.timing.describe();
            let current = row.is_some_and(|r| r.spec == spec && r.next_tick.is_some());
            if current || row.is_some_and(|r| r.paused) {
                continue;
            }
            let advance = Advance {
                name: name.clone(),
                spec,
                expect: row.and_then(|r| r.next_tick),
                next: sched.timing.next_tick(now),
                now,
            };
            if row.is_some_and(|r| !r.spec.is_empty()) {
                info!(schedule = %name, spec = %advance.spec, "Schedule changed; its next tick is recomputed.");
            }
            let write = advance.clone();
            match self
                .daemon
                .store
                .run(move |b| b.advance_schedule(&write))
                .await
            {
                Ok(true) => self.advanced(&advance),
                Ok(false) => retry |= self.reread().await.is_err(),
                Err(err) => {
                    warn!(schedule = %name, error = %err, "Schedule: cannot store its next tick; retrying.");
                    retry = true;
                }
            }
        }
        retry
    }

    /// Applies a stored advance to memory.
    fn advanced(&mut self, advance: &Advance) {
        let row = self
            .rows
            .entry(advance.name.clone())
            .or_insert_with(|| ScheduleRow::new(&advance.name, advance.now));
        row.spec.clone_from(&advance.spec);
        row.next_tick = advance.next;
    }

    /// Fires every due tick of every schedule. Answers whether something must be
    /// retried soon (the Broker or the store could not take it).
    async fn fire_due(&mut self, now: UnixMillis) -> bool {
        let config = self.daemon.config();
        let mut retry = false;
        for (name, sched) in &config.schedules {
            let Some(row) = self.rows.get(name) else {
                continue;
            };
            if row.paused || row.spec != sched.timing.describe() {
                continue;
            }
            let Some(from) = row.next_tick else { continue };
            let plan = schedule::plan(&sched.timing, name, sched.catch_up, from, now);
            if plan.fire.is_empty() && plan.missed == 0 {
                continue;
            }
            retry |= self.run_plan(sched, from, plan, now).await;
        }
        retry
    }

    /// Carries out one schedule's plan, run by run, each advancing the stored next
    /// tick to the following run's tick (the last to `plan.next`).
    async fn run_plan(
        &mut self,
        sched: &ScheduleConfig,
        from: UnixMillis,
        plan: schedule::Plan,
        now: UnixMillis,
    ) -> bool {
        let name = &sched.name;
        let spec = sched.timing.describe();
        let mut expect = from;
        if plan.missed > 0 {
            warn!(schedule = %name, missed = plan.missed, runs = plan.fire.len(), "Schedule missed ticks while nobody fired them; catch_up decides what runs.");
        }
        if plan.fire.is_empty() {
            let advance = Advance {
                name: name.clone(),
                spec,
                expect: Some(expect),
                next: plan.next,
                now,
            };
            let write = advance.clone();
            return match self
                .daemon
                .store
                .run(move |b| b.advance_schedule(&write))
                .await
            {
                Ok(true) => {
                    metrics::schedule_ticks(name, ScheduleResult::Missed, plan.missed);
                    self.advanced(&advance);
                    false
                }
                Ok(false) => self.reread().await.is_err(),
                Err(err) => {
                    warn!(schedule = %name, error = %err, "Schedule: cannot store its next tick; retrying.");
                    true
                }
            };
        }
        let mut missed = plan.missed;
        let runs = plan.fire.len();
        for (i, (tick, kind)) in plan.fire.iter().copied().enumerate() {
            let next = plan.fire.get(i + 1).map_or(plan.next, |(t, _)| Some(*t));
            let advance = Advance {
                name: name.clone(),
                spec: spec.clone(),
                expect: Some(expect),
                next,
                now,
            };
            let unless_running = match sched.overlap {
                Overlap::Skip => self.rows.get(name).and_then(|r| r.last_job),
                Overlap::Allow => None,
            };
            let fire = Fire {
                req: request(sched, tick),
                schedule: name.clone(),
                tick,
                advance: Some(advance.clone()),
                unless_running,
            };
            let answer =
                broker::request(|reply| BrokerMsg::Fire(Box::new(fire), reply), CALL).await;
            let result = match answer {
                Ok(Ok(Fired::Enqueued(enqueued))) => {
                    debug!(schedule = %name, tick = %schedule::tick_text(tick), job = %enqueued.id, duplicate = enqueued.duplicate, "Schedule fired.");
                    self.advanced(&advance);
                    if let Some(row) = self.rows.get_mut(name) {
                        row.last_tick = Some(tick);
                        row.last_job = Some(enqueued.id);
                    }
                    metrics::schedule_last_fire(name, wall_ms());
                    match kind {
                        FireKind::OnTime => ScheduleResult::Fired,
                        FireKind::CaughtUp => ScheduleResult::CaughtUp,
                    }
                }
                Ok(Ok(Fired::SkippedOverlap)) => {
                    info!(schedule = %name, tick = %schedule::tick_text(tick), "Schedule skipped a tick: its previous run is unfinished (overlap = \"skip\").");
                    self.advanced(&advance);
                    ScheduleResult::SkippedOverlap
                }
                Ok(Ok(Fired::Stale)) => {
                    debug!(schedule = %name, "Schedule's stored next tick moved (another node, or paused); rereading.");
                    return self.reread().await.is_err();
                }
                Ok(Err(err)) if refused_for_good(&err) => {
                    warn!(schedule = %name, tick = %schedule::tick_text(tick), error = %err, "Schedule's job was refused; the tick is missed.");
                    // The tick is over; only the schedule advances.
                    let write = advance.clone();
                    match self
                        .daemon
                        .store
                        .run(move |b| b.advance_schedule(&write))
                        .await
                    {
                        Ok(true) => self.advanced(&advance),
                        Ok(false) => return self.reread().await.is_err(),
                        Err(_) => return true,
                    }
                    ScheduleResult::Missed
                }
                Ok(Err(BrokerError::ShuttingDown)) | Err(BrokerError::ShuttingDown) => {
                    // The tick stays stored; whichever run of qd comes next fires it.
                    debug!(schedule = %name, "Schedule not fired: qd is shutting down.");
                    return false;
                }
                Ok(Err(err)) | Err(err) => {
                    warn!(schedule = %name, tick = %schedule::tick_text(tick), error = %err, "Schedule could not fire; retrying.");
                    if i + 1 < runs {
                        debug!(schedule = %name, "Later runs of this catch-up wait for the retry.");
                    }
                    return true;
                }
            };
            if result == ScheduleResult::Missed {
                missed += 1;
            } else {
                metrics::schedule_ticks(name, result, 1);
            }
            if let Some(n) = next {
                expect = n;
            }
        }
        metrics::schedule_ticks(name, ScheduleResult::Missed, missed);
        false
    }

    /// Publishes each configured schedule's next fire on this node, and 0 for a
    /// stored schedule no longer configured (so no alert waits for it).
    fn publish(&self) {
        let config = self.daemon.config();
        for name in self
            .rows
            .keys()
            .filter(|n| !config.schedules.contains_key(*n))
        {
            metrics::schedule_next_fire(name, None);
        }
        for (name, sched) in &config.schedules {
            let next = self
                .rows
                .get(name)
                .filter(|r| self.firing && !r.paused && r.spec == sched.timing.describe())
                .and_then(|r| r.next_tick)
                .map(|t| sched.timing.fire_at(name, t));
            metrics::schedule_next_fire(name, next);
        }
    }

    /// Arms the one timer for the soonest fire (or a retry), at most
    /// [`MAX_SLEEP`] away; none when nothing fires here.
    fn arm(&mut self, myself: &ActorRef<PeriodicMsg>, retry: bool) {
        if let Some(old) = self.timer.take() {
            old.abort();
        }
        if !self.firing {
            return;
        }
        let config = self.daemon.config();
        let now = wall_ms();
        let soonest = config
            .schedules
            .iter()
            .filter_map(|(name, sched)| {
                let row = self.rows.get(name)?;
                if row.paused {
                    return None;
                }
                Some(sched.timing.fire_at(name, row.next_tick?))
            })
            .min();
        let mut sleep = match soonest {
            Some(at) => Duration::from_millis(u64::try_from(at.saturating_sub(now)).unwrap_or(0)),
            // Nothing to fire (no schedule, or all paused): sleep until a message.
            None if !retry => return,
            None => RETRY,
        };
        if retry {
            sleep = sleep.min(RETRY);
        }
        self.timer = Some(myself.send_after(sleep.min(MAX_SLEEP), || PeriodicMsg::Tick));
    }
}

/// The enqueue of `tick` of `sched`.
pub fn request(sched: &ScheduleConfig, tick: UnixMillis) -> EnqueueRequest {
    EnqueueRequest {
        queue: sched.queue.clone(),
        tenant: sched.tenant.clone(),
        payload: sched.payload.clone(),
        idempotency_key: Some(schedule::idempotency_key(&sched.name, tick)),
        delay: Duration::ZERO,
        max_attempts: sched.max_attempts,
        priority_ms: 0,
        after: Default::default(),
    }
}

/// Whether a refused fire will not succeed by retrying the same tick soon: its
/// queue is full or gone, or the job is invalid (the tick is then missed).
fn refused_for_good(err: &BrokerError) -> bool {
    matches!(
        err,
        BrokerError::QueueFull { .. }
            | BrokerError::TenantFull { .. }
            | BrokerError::UnknownQueue(_)
            | BrokerError::Invalid(_)
            | BrokerError::PayloadTooLarge { .. }
            | BrokerError::KeyConflict { .. }
    )
}
