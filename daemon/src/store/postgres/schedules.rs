//! PostgreSQL statements of the `qd_schedules` table ([`crate::store::schedules`]).
//! The compare-and-set of the next tick takes the row's lock until the batch's
//! transaction ends, so two nodes firing the same tick serialize and the second
//! one's expectation no longer holds.

use deadpool_postgres::ClientWrapper;
use uuid::Uuid;

use crate::job::{JobId, UnixMillis};
use crate::store::{Advance, ScheduleRow};

/// Every row, by name.
pub(super) async fn all(c: &ClientWrapper) -> Result<Vec<ScheduleRow>, tokio_postgres::Error> {
    let stmt = c
        .prepare_cached(
            "SELECT name, spec, next_tick, last_tick, last_job, paused, updated_at \
             FROM qd_schedules ORDER BY name",
        )
        .await?;
    let rows = c.query(&stmt, &[]).await?;
    rows.iter()
        .map(|r| {
            Ok(ScheduleRow {
                name: r.try_get(0)?,
                spec: r.try_get(1)?,
                next_tick: r.try_get(2)?,
                last_tick: r.try_get(3)?,
                last_job: r.try_get::<_, Option<Uuid>>(4)?.map(JobId),
                paused: r.try_get(5)?,
                updated_at: r.try_get(6)?,
            })
        })
        .collect()
}

/// The compare-and-set of the next tick; a missing row is created when `expect`
/// is `None`. A paused schedule does not advance.
pub(super) async fn advance(c: &ClientWrapper, a: &Advance) -> Result<bool, tokio_postgres::Error> {
    let changed = match a.expect {
        None => {
            let stmt = c
                .prepare_cached(
                    "INSERT INTO qd_schedules (name, spec, next_tick, updated_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO UPDATE SET \
                     spec = excluded.spec, next_tick = excluded.next_tick, \
                     updated_at = excluded.updated_at \
                     WHERE qd_schedules.next_tick IS NULL AND NOT qd_schedules.paused",
                )
                .await?;
            c.execute(&stmt, &[&a.name, &a.spec, &a.next, &a.now])
                .await?
        }
        Some(expect) => {
            let stmt = c
                .prepare_cached(
                    "UPDATE qd_schedules SET spec = $2, next_tick = $3, updated_at = $4 \
                     WHERE name = $1 AND next_tick = $5 AND NOT paused",
                )
                .await?;
            c.execute(&stmt, &[&a.name, &a.spec, &a.next, &a.now, &expect])
                .await?
        }
    };
    Ok(changed == 1)
}

/// Records a run (creating the row if missing).
pub(super) async fn record_run(
    c: &ClientWrapper,
    name: &str,
    tick: UnixMillis,
    job: Uuid,
    now: UnixMillis,
) -> Result<(), tokio_postgres::Error> {
    let stmt = c
        .prepare_cached(
            "INSERT INTO qd_schedules (name, spec, last_tick, last_job, updated_at) \
             VALUES ($1, '', $2, $3, $4) ON CONFLICT (name) DO UPDATE SET \
             last_tick = excluded.last_tick, last_job = excluded.last_job, \
             updated_at = excluded.updated_at",
        )
        .await?;
    c.execute(&stmt, &[&name, &tick, &job, &now]).await?;
    Ok(())
}

/// Pauses or resumes (a resume clears the next tick; creating the row if missing).
pub(super) async fn set_paused(
    c: &ClientWrapper,
    name: &str,
    paused: bool,
    now: UnixMillis,
) -> Result<(), tokio_postgres::Error> {
    let stmt = c
        .prepare_cached(
            "INSERT INTO qd_schedules (name, spec, paused, updated_at) VALUES ($1, '', $2, $3) \
             ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, \
             updated_at = excluded.updated_at, \
             next_tick = CASE WHEN qd_schedules.paused AND NOT excluded.paused \
                 THEN NULL ELSE qd_schedules.next_tick END",
        )
        .await?;
    c.execute(&stmt, &[&name, &paused, &now]).await?;
    Ok(())
}
