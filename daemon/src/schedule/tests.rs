//! The pure core with an injected clock: every instant is given, nothing waits.

use std::time::Duration;

use chrono::{TimeZone, Utc};
use proptest::prelude::*;

use super::*;

fn utc(text: &str) -> UnixMillis {
    chrono::DateTime::parse_from_rfc3339(text)
        .expect("test instant")
        .timestamp_millis()
}

fn cron(expr: &str, tz: &str) -> Timing {
    Timing {
        spec: Spec::Cron(Box::new(parse_cron(expr).expect("test expression"))),
        tz: parse_timezone(tz).expect("test zone"),
        jitter: Duration::ZERO,
    }
}

fn every(secs: u64) -> Timing {
    Timing {
        spec: Spec::Every(Duration::from_secs(secs)),
        tz: chrono_tz::UTC,
        jitter: Duration::ZERO,
    }
}

fn ticks(timing: &Timing, from: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = utc(from);
    for _ in 0..n {
        at = timing.next_tick(at).expect("a next tick");
        out.push(tick_text(at));
    }
    out
}

#[test]
fn a_five_field_expression_ticks_on_minutes_in_its_zone() {
    let t = cron("0 3 * * *", "Europe/Berlin");
    // 03:00 in Berlin is 02:00Z in winter (CET, +1).
    assert_eq!(
        ticks(&t, "2026-01-10T12:00:00Z", 2),
        ["2026-01-11T02:00:00Z", "2026-01-12T02:00:00Z"]
    );
    let t = cron("*/15 * * * *", "UTC");
    assert_eq!(
        ticks(&t, "2026-01-10T12:07:30Z", 3),
        [
            "2026-01-10T12:15:00Z",
            "2026-01-10T12:30:00Z",
            "2026-01-10T12:45:00Z"
        ]
    );
}

#[test]
fn a_six_field_expression_has_seconds_first() {
    let t = cron("*/20 * * * * *", "UTC");
    assert_eq!(
        ticks(&t, "2026-01-10T12:00:05.250Z", 3),
        [
            "2026-01-10T12:00:20Z",
            "2026-01-10T12:00:40Z",
            "2026-01-10T12:01:00Z"
        ]
    );
    // A tick is strictly after the instant given, also inside its second.
    let at = utc("2026-01-10T12:00:20.500Z");
    assert_eq!(t.next_tick(at), Some(utc("2026-01-10T12:00:40Z")));
}

#[test]
fn bad_expressions_and_zones_are_refused_with_the_reason() {
    for bad in [
        "",
        "* * * *",
        "* * * * * * *",
        "61 * * * *",
        "* * 32 * *",
        "nonsense x y z w",
    ] {
        let err = parse_cron(bad).expect_err(bad);
        assert!(err.contains(&format!("{bad:?}")), "{err}");
    }
    let err = parse_timezone("Europe/Berln").expect_err("typo");
    assert!(err.contains("unknown time zone \"Europe/Berln\""), "{err}");
    assert!(parse_timezone("UTC").is_ok());
}

#[test]
fn every_ticks_on_multiples_of_its_interval_since_the_epoch() {
    let t = every(15 * 60);
    assert_eq!(
        ticks(&t, "2026-01-10T12:07:30Z", 2),
        ["2026-01-10T12:15:00Z", "2026-01-10T12:30:00Z"]
    );
    // At a tick exactly, the next one is an interval later.
    assert_eq!(
        t.next_tick(utc("2026-01-10T12:15:00Z")),
        Some(utc("2026-01-10T12:30:00Z"))
    );
    assert_eq!(every(1).next_tick(1_500), Some(2_000));
}

#[test]
fn a_fixed_time_in_the_spring_gap_fires_once_right_after_it() {
    // 2026-03-29 in Berlin: 02:00 CET jumps to 03:00 CEST; 02:30 never happens.
    let t = cron("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        ticks(&t, "2026-03-28T12:00:00Z", 3),
        [
            "2026-03-29T01:00:00Z", // 03:00 CEST, right after the gap, once
            "2026-03-30T00:30:00Z", // 02:30 CEST
            "2026-03-31T00:30:00Z",
        ]
    );
}

#[test]
fn a_fixed_time_in_the_repeated_autumn_hour_fires_once() {
    // 2026-10-25 in Berlin: 03:00 CEST falls back to 02:00 CET; 02:30 comes twice.
    let t = cron("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        ticks(&t, "2026-10-24T12:00:00Z", 2),
        [
            "2026-10-25T00:30:00Z", // 02:30 CEST, the first pass only
            "2026-10-26T01:30:00Z", // 02:30 CET the next day
        ]
    );
}

#[test]
fn jitter_stays_in_range_and_is_the_same_for_the_same_tick() {
    let jitter = Duration::from_secs(30);
    let mut seen = std::collections::BTreeSet::new();
    for tick in (0..2_000).map(|n| 1_767_225_600_000 + n * 60_000) {
        let offset = jitter_offset("nightly", tick, jitter);
        assert!((0..30_000).contains(&offset), "{offset}");
        assert_eq!(offset, jitter_offset("nightly", tick, jitter), "stable");
        seen.insert(offset / 1000);
    }
    // Spread over the range, not stuck at one end.
    assert!(seen.len() > 25, "{seen:?}");
    assert_ne!(
        jitter_offset("a", 1_767_225_600_000, jitter),
        jitter_offset("b", 1_767_225_600_000, jitter),
        "another schedule gets another offset for the same tick"
    );
    assert_eq!(jitter_offset("a", 5, Duration::ZERO), 0);
    let mut t = every(60);
    t.jitter = jitter;
    let tick = 1_767_225_600_000;
    assert_eq!(
        t.fire_at("a", tick),
        tick + jitter_offset("a", tick, jitter)
    );
}

#[test]
fn one_due_tick_fires_on_time_whatever_the_catch_up_mode() {
    let t = every(60);
    let from = 600_000;
    for mode in [CatchUp::Latest, CatchUp::None, CatchUp::All { max: 10 }] {
        let plan = plan(&t, "s", mode, from, from + 5_000);
        assert_eq!(plan.fire, [(from, FireKind::OnTime)], "{mode:?}");
        assert_eq!(plan.missed, 0);
        assert_eq!(plan.next, Some(from + 60_000));
    }
    let early = plan(&t, "s", CatchUp::Latest, from, from - 1);
    assert_eq!(early.fire, []);
    assert_eq!((early.missed, early.next), (0, Some(from)));
}

#[test]
fn latest_runs_once_for_the_missed_ticks_and_counts_the_rest() {
    let t = every(60);
    let from = 600_000;
    // Down from before `from` until 4.5 ticks later: 5 ticks due.
    let plan = plan(&t, "s", CatchUp::Latest, from, from + 270_000);
    assert_eq!(plan.fire, [(from + 240_000, FireKind::CaughtUp)]);
    assert_eq!(plan.missed, 4);
    assert_eq!(plan.next, Some(from + 300_000));
}

#[test]
fn none_runs_nothing_for_the_missed_ticks() {
    let t = every(60);
    let from = 600_000;
    let plan = plan(&t, "s", CatchUp::None, from, from + 270_000);
    assert_eq!(plan.fire, []);
    assert_eq!(plan.missed, 5);
    assert_eq!(plan.next, Some(from + 300_000));
}

#[test]
fn all_runs_each_missed_tick_up_to_max_catch_up_newest_kept() {
    let t = every(60);
    let from = 600_000;
    let few = plan(&t, "s", CatchUp::All { max: 10 }, from, from + 150_000);
    let at = |n: i64| (from + n * 60_000, FireKind::CaughtUp);
    assert_eq!(few.fire, [at(0), at(1), at(2)]);
    assert_eq!(few.missed, 0);
    let many = plan(&t, "s", CatchUp::All { max: 2 }, from, from + 270_000);
    assert_eq!(many.fire, [at(3), at(4)]);
    assert_eq!(many.missed, 3);
    assert_eq!(many.next, Some(from + 300_000));
}

#[test]
fn a_long_outage_of_a_fast_schedule_is_counted_without_walking_each_tick() {
    let t = every(1);
    let from = 1_000;
    let now = from + 3 * 86_400_000; // three days of per-second ticks
    let plan = plan(&t, "s", CatchUp::Latest, from, now);
    assert_eq!(plan.fire.len(), 1);
    assert_eq!(plan.missed + 1, 3 * 86_400 + 1);
    assert_eq!(plan.next, Some(now + 1_000));
}

#[test]
fn jitter_delays_when_a_tick_is_due() {
    let mut t = every(60);
    t.jitter = Duration::from_secs(30);
    let from = 1_767_225_600_000;
    let fire = t.fire_at("s", from);
    assert!(
        plan(&t, "s", CatchUp::Latest, from, fire - 1)
            .fire
            .is_empty()
    );
    assert_eq!(
        plan(&t, "s", CatchUp::Latest, from, fire).fire,
        [(from, FireKind::OnTime)]
    );
}

#[test]
fn overlap_skip_holds_a_run_while_the_previous_is_unfinished() {
    assert!(Overlap::Allow.allows(true));
    assert!(Overlap::Allow.allows(false));
    assert!(!Overlap::Skip.allows(true));
    assert!(Overlap::Skip.allows(false));
}

#[test]
fn the_key_names_schedule_and_tick_and_reads_back() {
    let tick = utc("2026-03-29T01:00:00Z");
    let key = idempotency_key("nightly-report", tick);
    assert_eq!(key, "schedule:nightly-report:2026-03-29T01:00:00Z");
    assert_eq!(
        from_key(&key),
        Some(("nightly-report", "2026-03-29T01:00:00Z"))
    );
    assert_eq!(from_key("order-17"), None);
    assert_eq!(tick_text(1_500), "1970-01-01T00:00:01.500Z");
    assert_eq!(
        Utc.timestamp_millis_opt(tick)
            .single()
            .map(|d| d.to_rfc3339()),
        Some("2026-03-29T01:00:00+00:00".to_owned())
    );
}

proptest! {
    /// Whatever the outage, a plan fires at most what its mode allows, counts
    /// every due tick exactly once (fired or missed), and moves past `now`.
    #[test]
    fn a_plan_accounts_for_every_due_tick(
        step in 1u64..600,
        ticks_late in 0i64..300,
        extra in 0i64..1_000,
        mode in 0u8..3,
        max in 1u32..20,
    ) {
        let t = every(step);
        let step_ms = i64::try_from(step).expect("small") * 1000;
        let from = step_ms * 1_000;
        let now = from + ticks_late * step_ms + extra % step_ms;
        let catch_up = match mode {
            0 => CatchUp::Latest,
            1 => CatchUp::None,
            _ => CatchUp::All { max },
        };
        let plan = plan(&t, "p", catch_up, from, now);
        let due = u64::try_from(ticks_late + 1).expect("positive");
        prop_assert_eq!(plan.fire.len() as u64 + plan.missed, due);
        let cap = match catch_up {
            CatchUp::Latest => 1,
            CatchUp::None => if due == 1 { 1 } else { 0 },
            CatchUp::All { max } => u64::from(max).max(1),
        };
        prop_assert!(plan.fire.len() as u64 <= cap);
        prop_assert!(plan.next.expect("intervals never end") > now);
        prop_assert!(plan.fire.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
