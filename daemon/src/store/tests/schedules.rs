//! Schedules' stored state, one contract for every engine: the next tick advances
//! by compare-and-set (once per tick, never while paused), a run and a pause are
//! recorded, a resume clears the next tick, and an advance rolled back with its
//! operation leaves nothing.

use super::*;
use crate::store::{Advance, ScheduleRow};

fn advance(name: &str, expect: Option<UnixMillis>, next: Option<UnixMillis>) -> Advance {
    Advance {
        name: name.into(),
        spec: "every 1s".into(),
        expect,
        next,
        now: 5,
    }
}

fn rows(store: &Store) -> Vec<ScheduleRow> {
    block(store, |b| b.schedules()).expect("read schedules")
}

/// The contract, on one engine.
pub(super) fn schedules_advance_once_per_tick(store: &Store) {
    let adv = |e, n| {
        let a = advance("s", e, n);
        block(store, move |b| b.advance_schedule(&a)).expect("advance")
    };
    assert!(adv(None, Some(1_000)), "a missing row is created");
    assert!(!adv(None, Some(9_000)), "a computed next tick is not reset");
    assert!(adv(Some(1_000), Some(2_000)), "the tick read advances");
    assert!(
        !adv(Some(1_000), Some(2_000)),
        "a second fire of the same tick does not"
    );
    let row = &rows(store)[0];
    assert_eq!(
        (row.name.as_str(), row.spec.as_str(), row.next_tick),
        ("s", "every 1s", Some(2_000))
    );

    let id = JobId::new();
    block(store, move |b| b.record_schedule_run("s", 2_000, id, 7)).expect("run");
    block(store, |b| b.set_schedule_paused("s", true, 8)).expect("pause");
    let row = &rows(store)[0];
    assert_eq!(
        (row.last_tick, row.last_job, row.paused, row.next_tick),
        (Some(2_000), Some(id), true, Some(2_000))
    );
    assert!(
        !adv(Some(2_000), Some(3_000)),
        "a paused schedule does not advance"
    );
    block(store, |b| b.set_schedule_paused("s", false, 9)).expect("resume");
    let row = &rows(store)[0];
    assert_eq!(
        (row.paused, row.next_tick),
        (false, None),
        "recomputed after a resume"
    );

    // An advance whose operation fails is undone with it.
    let a = advance("t", None, Some(1));
    let failed = block(store, move |b| {
        b.advance_schedule(&a)?;
        Err::<(), _>(StoreError::Other("the enqueue failed".into()))
    });
    assert!(failed.is_err());
    assert!(rows(store).iter().all(|r| r.name != "t"), "rolled back");

    // A pause and a run create the row of a schedule never advanced.
    block(store, |b| b.set_schedule_paused("u", true, 1)).expect("pause new");
    let u = rows(store).into_iter().find(|r| r.name == "u").expect("u");
    assert!(u.paused && u.next_tick.is_none());
}

#[test]
fn sqlite_schedules_advance_once_per_tick() {
    let (_dir, path) = temp_db();
    schedules_advance_once_per_tick(&open(&path));
}

#[test]
fn memory_schedules_advance_once_per_tick() {
    schedules_advance_once_per_tick(&Store::open_memory());
}

#[test]
fn sqlite_schedules_survive_reopen() {
    let (_dir, path) = temp_db();
    {
        let store = open(&path);
        let a = advance("s", None, Some(42));
        block(&store, move |b| b.advance_schedule(&a)).expect("advance");
        store.close();
    }
    let store = open(&path);
    assert_eq!(rows(&store)[0].next_tick, Some(42));
}
