//! A rate limiter's pause across the cluster: a throttled result on any node
//! stores the pause's end in the limiter's row (`qd_rate_limiters.paused_until`,
//! the database's clock) and announces it (`NOTIFY qd_limiters`); the bucket
//! hands out no token while it is in force, whichever node asks.
//!
//! How every node honours it:
//! - a node's refill from the bucket ([`take`]) is refused while the pause is in
//!   force and answers what is left of it, so a node that missed everything else
//!   stops at the latest when the tokens it already holds run out;
//! - the announcement carries what is left of the pause (`"<ms> <name>"`), so a
//!   listening node pauses within the notification's delivery time;
//! - each node heartbeat reads the pauses in force ([`pauses`]), for a node whose
//!   notification connection was down.
//!
//! Takes no messages: the writer thread calls it through [`super::PgBackend`].

use std::time::Duration;

use tokio_postgres::types::ToSql;

use super::{DEPTH_LOCK_TRIES, PgBackend};
use crate::config::RateLimiterConfig;
use crate::store::{StoreError, Tokens};

/// A limiter's row keeps the end of the pause in force (NULL: never paused).
pub(super) const LIMITER_PAUSES: &str = r#"
ALTER TABLE qd_rate_limiters ADD COLUMN paused_until timestamptz;
"#;

/// The channel on which a stored pause is announced; the payload is what is
/// left of it in milliseconds, a space, and the limiter's name.
pub const LIMITER_CHANNEL: &str = "qd_limiters";

/// What is left of a pause at the database's clock, in milliseconds, as SQL.
const LEFT_MS: &str = "(extract(epoch FROM paused_until - clock_timestamp()) * 1000)::int8";

/// The rate and the burst of `settings` as the bucket stores them (a 0 is read as 1
/// for the rate, and as the rate for the burst).
fn rate_and_burst(settings: &RateLimiterConfig) -> (f64, f64) {
    let rate = f64::from(settings.per_second.max(1));
    let burst = if settings.burst == 0 {
        rate
    } else {
        f64::from(settings.burst)
    };
    (rate, burst)
}

/// Creates limiter `name`'s row, full, unless it exists. An existing row is seen
/// in the statement's snapshot and left alone without touching its index entry,
/// so another node's transaction holding the row is not waited for (a plain
/// `ON CONFLICT DO NOTHING` would wait for it to end).
async fn ensure_row(
    c: &deadpool_postgres::ClientWrapper,
    name: &str,
    rate: f64,
    burst: f64,
) -> Result<(), tokio_postgres::Error> {
    let stmt = c
        .prepare_cached(
            "INSERT INTO qd_rate_limiters (name, tokens, updated_at, per_second, burst) \
             SELECT $1::text, $2::float8, clock_timestamp(), $3::float8, $2::float8 \
             WHERE NOT EXISTS (SELECT 1 FROM qd_rate_limiters WHERE name = $1) \
             ON CONFLICT (name) DO NOTHING",
        )
        .await?;
    c.execute(&stmt, &[&name, &burst, &rate]).await.map(drop)
}

/// [`crate::store::SharedStore::take_tokens_unless_paused`]: refills the bucket by
/// the database's clock and takes up to `want` tokens, or, while a pause is in
/// force, takes none and answers what is left of it. Nothing either when another
/// node's transaction holds the row (`SKIP LOCKED`).
pub(super) fn take(
    pg: &mut PgBackend,
    name: &str,
    want: u32,
    settings: &RateLimiterConfig,
) -> Result<Tokens, StoreError> {
    let (rate, burst) = rate_and_burst(settings);
    let want = f64::from(want);
    let sql = format!(
        "WITH cur AS (\
           SELECT CASE WHEN per_second = $4::float8 AND burst = $3::float8 \
             THEN LEAST($3::float8, tokens + $4::float8 * GREATEST(0, \
               extract(epoch FROM clock_timestamp() - updated_at)::float8)) \
             ELSE $3::float8 END AS avail, \
             COALESCE(paused_until > clock_timestamp(), false) AS paused, \
             {LEFT_MS} AS left_ms \
           FROM qd_rate_limiters WHERE name = $1 FOR UPDATE SKIP LOCKED), \
         upd AS (\
           UPDATE qd_rate_limiters l \
           SET tokens = cur.avail - LEAST($2::float8, floor(cur.avail)), \
             updated_at = clock_timestamp(), per_second = $4, burst = $3 \
           FROM cur WHERE l.name = $1 AND NOT cur.paused \
           RETURNING LEAST($2::float8, floor(cur.avail))::int8 AS taken) \
         SELECT (SELECT taken FROM upd), (SELECT left_ms FROM cur WHERE cur.paused)"
    );
    let (taken, left) = pg.block(async |c| {
        ensure_row(c, name, rate, burst).await?;
        let stmt = c.prepare_cached(&sql).await?;
        let args: [&(dyn ToSql + Sync); 4] = [&name, &want, &burst, &rate];
        let row = c.query_one(&stmt, &args).await?;
        Ok((row.get::<_, Option<i64>>(0), row.get::<_, Option<i64>>(1)))
    })?;
    Ok(match left {
        Some(ms) => Tokens::Paused(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        None => Tokens::Taken(taken.map_or(0, |n| u32::try_from(n).unwrap_or(0))),
    })
}

/// [`crate::store::SharedStore::pause_limiter`]: moves the stored pause's end to
/// `for_at_least` from now by the database's clock (a later end stays) and
/// announces what is left of it. The row is tried, never waited for (the group
/// commit may hold job rows another node's transaction waits on, and a wait could
/// close a cycle): [`StoreError::Busy`] if other nodes' refills kept it locked
/// through every try.
pub(super) fn pause(
    pg: &mut PgBackend,
    name: &str,
    for_at_least: Duration,
    settings: &RateLimiterConfig,
) -> Result<Duration, StoreError> {
    let (rate, burst) = rate_and_burst(settings);
    let millis = i64::try_from(for_at_least.as_millis()).unwrap_or(i64::MAX / 2);
    let sql = format!(
        "UPDATE qd_rate_limiters l \
         SET paused_until = GREATEST(COALESCE(l.paused_until, '-infinity'), \
           clock_timestamp() + $2::int8::float8 * interval '1 millisecond') \
         FROM (SELECT name FROM qd_rate_limiters WHERE name = $1 FOR UPDATE SKIP LOCKED) s \
         WHERE l.name = s.name RETURNING {LEFT_MS}"
    );
    for _ in 0..DEPTH_LOCK_TRIES {
        let left = pg.block(async |c| {
            ensure_row(c, name, rate, burst).await?;
            let stmt = c.prepare_cached(&sql).await?;
            let Some(row) = c.query_opt(&stmt, &[&name, &millis]).await? else {
                return Ok(None);
            };
            let left = row.get::<_, i64>(0).max(0);
            let notify = c.prepare_cached("SELECT pg_notify($1, $2)").await?;
            c.execute(&notify, &[&LIMITER_CHANNEL, &format!("{left} {name}")])
                .await?;
            Ok(Some(left))
        })?;
        if let Some(left) = left {
            return Ok(Duration::from_millis(u64::try_from(left).unwrap_or(0)));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Err(StoreError::Busy(format!(
        "rate limiter {name:?} stayed locked by other nodes' refills"
    )))
}

/// [`crate::store::SharedStore::limiter_pauses`]: every limiter whose pause is in
/// force, with what is left of it by the database's clock.
pub(super) fn pauses(pg: &mut PgBackend) -> Result<Vec<(String, Duration)>, StoreError> {
    let sql = format!(
        "SELECT name, {LEFT_MS} FROM qd_rate_limiters WHERE paused_until > clock_timestamp()"
    );
    let rows = pg.block(async |c| {
        let stmt = c.prepare_cached(&sql).await?;
        c.query(&stmt, &[]).await
    })?;
    Ok(rows
        .iter()
        .map(|r| {
            let left = u64::try_from(r.get::<_, i64>(1)).unwrap_or(0);
            (r.get::<_, String>(0), Duration::from_millis(left))
        })
        .collect())
}

/// The limiter and what is left of its pause, from a [`LIMITER_CHANNEL`]
/// payload; `None` for a payload of another shape.
pub fn parse_announcement(payload: &str) -> Option<(&str, Duration)> {
    let (ms, name) = payload.split_once(' ')?;
    Some((name, Duration::from_millis(ms.parse().ok()?)))
}
