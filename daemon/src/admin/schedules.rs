//! `qctl schedules`: list, pause, resume and trigger. A pause or resume is
//! written to the store (so it survives restarts and reaches every node), audited,
//! and announced to the Periodic actor; a trigger enqueues one run through the
//! Broker ([`BrokerMsg::Fire`] without an advance), keyed by the trigger time.

use qd_proto::{ErrorBody, ErrorCode, Response, ScheduleInfo};

use super::audit::{self, Author};
use super::{CALL, err};
use crate::broker::{self, BrokerError, BrokerMsg, Fire, Fired};
use crate::clock::wall_ms;
use crate::config::ScheduleConfig;
use crate::daemon::Daemon;
use crate::periodic;
use crate::schedule::{self, Spec};
use crate::store::ScheduleRow;

/// Every configured schedule with its stored state, by name.
pub(super) async fn list(d: &Daemon) -> Result<Response, ErrorBody> {
    let rows = d
        .store
        .run(|b| {
            let rows = b.schedules()?;
            let mut states = Vec::with_capacity(rows.len());
            for row in &rows {
                let state = match row.last_job {
                    Some(id) => b.job(id)?.map(|j| j.job.state.as_str().to_owned()),
                    None => None,
                };
                states.push(state);
            }
            Ok(rows.into_iter().zip(states).collect::<Vec<_>>())
        })
        .await
        .map_err(BrokerError::from)?;
    let config = d.config();
    let schedules = config
        .schedules
        .values()
        .map(|sched| {
            let stored = rows.iter().find(|(r, _)| r.name == sched.name);
            info(sched, stored.map(|(r, s)| (r, s.clone())))
        })
        .collect();
    Ok(Response::Schedules { schedules })
}

fn info(sched: &ScheduleConfig, stored: Option<(&ScheduleRow, Option<String>)>) -> ScheduleInfo {
    let (spec, timezone) = match &sched.timing.spec {
        Spec::Cron(cron) => (
            format!("cron {}", cron.pattern),
            Some(sched.timing.tz.name().to_owned()),
        ),
        Spec::Every(every) => (
            format!("every {}", humantime::format_duration(*every)),
            None,
        ),
    };
    let row = stored.as_ref().map(|(r, _)| *r);
    let paused = row.is_some_and(|r| r.paused);
    let current = row.is_some_and(|r| r.spec == sched.timing.describe());
    ScheduleInfo {
        name: sched.name.clone(),
        queue: sched.queue.clone(),
        spec,
        timezone,
        next_fire_at: row
            .filter(|_| current && !paused)
            .and_then(|r| r.next_tick)
            .map(|t| sched.timing.fire_at(&sched.name, t)),
        last_fire_at: row.and_then(|r| r.last_tick),
        last_job: row.and_then(|r| r.last_job).map(|id| id.to_string()),
        last_job_state: stored.and_then(|(_, s)| s),
        paused,
    }
}

/// The configured schedule `name`, or `not_found` listing the known ones.
fn configured(d: &Daemon, name: &str) -> Result<ScheduleConfig, ErrorBody> {
    let config = d.config();
    if let Some(sched) = config.schedules.get(name) {
        return Ok(sched.clone());
    }
    let known: Vec<&str> = config.schedules.keys().map(String::as_str).collect();
    let known = if known.is_empty() {
        "none configured".to_owned()
    } else {
        format!("known: {}", known.join(", "))
    };
    Err(err(
        ErrorCode::NotFound,
        format!("unknown schedule {name:?} ({known})"),
    ))
}

/// Pauses (`paused`) or resumes schedule `name`, audited with its state before and after.
pub(super) async fn set_paused(
    d: &Daemon,
    by: &Author,
    op: &str,
    name: &str,
    paused: bool,
) -> Result<Response, ErrorBody> {
    configured(d, name)?;
    let key = name.to_owned();
    let before = d
        .store
        .run(move |b| {
            let was = b
                .schedules()?
                .into_iter()
                .any(|r| r.name == key && r.paused);
            b.set_schedule_paused(&key, paused, wall_ms())?;
            Ok(was)
        })
        .await
        .map_err(BrokerError::from)?;
    let word = |p: bool| if p { "paused=yes" } else { "paused=no" };
    audit::change(
        by,
        op,
        &format!("schedule {name}"),
        word(before),
        word(paused),
    );
    periodic::reread();
    list(d).await
}

/// One run of schedule `name` now, keyed by the trigger time.
pub(super) async fn trigger(
    d: &Daemon,
    by: &Author,
    op: &str,
    name: &str,
) -> Result<Response, ErrorBody> {
    let sched = configured(d, name)?;
    let now = wall_ms();
    let fire = Fire {
        req: periodic::request(&sched, now),
        schedule: sched.name.clone(),
        tick: now,
        advance: None,
        unless_running: None,
    };
    let fired = broker::request(|reply| BrokerMsg::Fire(Box::new(fire), reply), CALL)
        .await
        .and_then(|answer| answer)?;
    let Fired::Enqueued(enqueued) = fired else {
        return Err(err(
            ErrorCode::Internal,
            "the trigger was not enqueued (the Broker answered without a job)",
        ));
    };
    audit::change(
        by,
        op,
        &format!("schedule {name}"),
        "-",
        &format!(
            "job {} enqueued for {}",
            enqueued.id,
            schedule::tick_text(now)
        ),
    );
    periodic::reread();
    Ok(Response::Enqueued(qd_proto::Enqueued {
        id: enqueued.id.to_string(),
        duplicate: enqueued.duplicate,
    }))
}
