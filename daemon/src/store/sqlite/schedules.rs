//! SQLite statements of the `schedules` table ([`crate::store::schedules`]).

use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use crate::job::{JobId, UnixMillis};
use crate::store::{Advance, ScheduleRow};

/// Every row, by name.
pub(super) fn all(conn: &Connection) -> rusqlite::Result<Vec<ScheduleRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT name, spec, next_tick, last_tick, last_job, paused, updated_at \
         FROM schedules ORDER BY name",
    )?;
    stmt.query_map([], |r| {
        let job: Option<Vec<u8>> = r.get(4)?;
        Ok(ScheduleRow {
            name: r.get(0)?,
            spec: r.get(1)?,
            next_tick: r.get(2)?,
            last_tick: r.get(3)?,
            last_job: job
                .and_then(|b| <[u8; 16]>::try_from(b.as_slice()).ok())
                .map(|b| JobId(Uuid::from_bytes(b))),
            paused: r.get::<_, i64>(5)? != 0,
            updated_at: r.get(6)?,
        })
    })?
    .collect()
}

/// The compare-and-set of the next tick; a missing row is created when `expect`
/// is `None`. A paused schedule does not advance.
pub(super) fn advance(conn: &Connection, a: &Advance) -> rusqlite::Result<bool> {
    let changed = match a.expect {
        None => conn
            .prepare_cached(
                "INSERT INTO schedules (name, spec, next_tick, updated_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, \
                 next_tick = excluded.next_tick, updated_at = excluded.updated_at \
                 WHERE schedules.next_tick IS NULL AND schedules.paused = 0",
            )?
            .execute(params![a.name, a.spec, a.next, a.now])?,
        Some(expect) => conn
            .prepare_cached(
                "UPDATE schedules SET spec = ?2, next_tick = ?3, updated_at = ?4 \
                 WHERE name = ?1 AND next_tick = ?5 AND paused = 0",
            )?
            .execute(params![a.name, a.spec, a.next, a.now, expect])?,
    };
    Ok(changed == 1)
}

/// Records a run (creating the row if missing).
pub(super) fn record_run(
    conn: &Connection,
    name: &str,
    tick: UnixMillis,
    job: [u8; 16],
    now: UnixMillis,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO schedules (name, spec, last_tick, last_job, updated_at) \
         VALUES (?1, '', ?2, ?3, ?4) ON CONFLICT (name) DO UPDATE SET \
         last_tick = excluded.last_tick, last_job = excluded.last_job, \
         updated_at = excluded.updated_at",
    )?
    .execute(params![name, tick, job, now])?;
    Ok(())
}

/// Pauses or resumes (a resume clears the next tick; creating the row if missing).
pub(super) fn set_paused(
    conn: &Connection,
    name: &str,
    paused: bool,
    now: UnixMillis,
) -> rusqlite::Result<()> {
    let was: Option<i64> = conn
        .prepare_cached("SELECT paused FROM schedules WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?;
    conn.prepare_cached(
        "INSERT INTO schedules (name, spec, paused, updated_at) VALUES (?1, '', ?2, ?3) \
         ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, \
         updated_at = excluded.updated_at, \
         next_tick = CASE WHEN ?4 THEN NULL ELSE schedules.next_tick END",
    )?
    .execute(params![
        name,
        i64::from(paused),
        now,
        was == Some(1) && !paused
    ])?;
    Ok(())
}
