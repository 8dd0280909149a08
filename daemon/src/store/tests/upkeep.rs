//! Pruning and the history cap through the real engines: per-queue scopes, bounded
//! batches, and the same capped history from SQLite and memory.

use super::*;

fn finished(n: u128, queue: &str, state: State, updated_at: UnixMillis) -> Job {
    let mut job = job(n, queue, Some(&format!("key-{n}")));
    (job.state, job.updated_at) = (state, updated_at);
    job
}

#[test]
fn pruning_takes_each_queue_at_its_own_cutoff_in_bounded_batches() {
    let (_dir, path) = temp_db();
    let store = open(&path);
    let mut jobs = Vec::new();
    for n in 0..2_500u128 {
        let state = if n % 5 == 0 {
            State::Cancelled
        } else {
            State::Succeeded
        };
        jobs.push(finished(n, "short", state, 1_000 + n as i64));
    }
    jobs.extend((0..10u128).map(|n| finished(10_000 + n, "long", State::Succeeded, 1_000)));
    jobs.extend((0..7u128).map(|n| finished(20_000 + n, "removed", State::Succeeded, 1_000)));
    jobs.push(job(30_000, "short", None));
    let records = NewRecord::batch(jobs, b"x");
    block(&store, move |b| b.enqueue(&records)).expect("insert");

    let short = PruneScope::Queue("short".into());
    let scope = short.clone();
    assert_eq!(
        block(&store, move |b| b.oldest_finished(&scope)),
        Ok(Some(1_000))
    );
    let mut batches = Vec::new();
    loop {
        let scope = short.clone();
        let n = block(&store, move |b| b.prune_finished(&scope, 100_000, 1_000)).expect("prune");
        batches.push(n);
        if n < 1_000 {
            break;
        }
    }
    assert_eq!(batches, [1_000, 1_000, 500]);
    let scope = short.clone();
    assert_eq!(block(&store, move |b| b.oldest_finished(&scope)), Ok(None));

    let configured = PruneScope::Unconfigured(vec!["short".into(), "long".into()]);
    let scope = configured.clone();
    assert_eq!(
        block(&store, move |b| b.prune_finished(&scope, 100_000, 1_000)),
        Ok(7)
    );
    let counts = block(&store, |b| b.counts()).expect("counts");
    assert_eq!(
        counts,
        [
            ("long".to_string(), State::Succeeded, 10),
            ("short".to_string(), State::Ready, 1)
        ]
    );
    // The keys of pruned jobs are free again.
    let again = finished(40_000, "short", State::Ready, 200_000);
    assert_eq!(
        block(&store, move |b| insert(b, &again, b"y")),
        Ok(Inserted::New)
    );
    // A fresh file is incremental: the pruned pages can be given back.
    let released = block(&store, |b| b.release_space(0, 10_000)).expect("release");
    assert!(released > 0, "pruned pages were given back");
}

#[test]
fn history_is_capped_and_counted_alike_by_both_engines() {
    let limits = HistoryLimits {
        keep_first: 2,
        keep_last: 3,
        max_error: 100,
    };
    let (_dir, path) = temp_db();
    let options = SqliteOptions {
        history: limits,
        ..SqliteOptions::default()
    };
    let sqlite = Store::open_sqlite_with(&path, &options).expect("open");
    let memory = Store::open_memory_with(limits);
    let mut detail = Vec::new();
    for store in [&sqlite, &memory] {
        let mut stored = job(1, "q", None);
        let first = stored.clone();
        block(store, move |b| insert(b, &first, b"p")).expect("insert");
        for attempt in 1..=40 {
            stored.attempts = attempt;
            stored.lease_seq = u64::from(attempt);
            let entry = HistoryEntry {
                attempt,
                outcome: Outcome::Failed,
                worker: Some("q/0".into()),
                started_at: Some(1_000),
                ended_at: 1_001,
                error: Some(format!("attempt {attempt}: {}", "e".repeat(5_000))),
            };
            let claim = leased(&stored, stored.lease_seq);
            let end = Transition {
                job: stored.clone(),
                entry: Some(entry),
                result: None,
            };
            block(store, move |b| b.claim(&[claim])).expect("claim");
            let applied = block(store, move |b| b.complete(&[end])).expect("complete");
            assert_eq!(applied, [true], "attempt {attempt} ended");
        }
        let read = block(store, |b| b.job(JobId(Uuid::from_u128(1)))).expect("read");
        detail.push(read.expect("stored"));
    }
    assert_eq!(
        detail[0], detail[1],
        "SQLite and memory keep the same entries"
    );
    let d = &detail[0];
    let attempts: Vec<u32> = d.history.iter().map(|h| h.attempt).collect();
    assert_eq!(attempts, [1, 2, 38, 39, 40]);
    assert_eq!((d.history_elided, d.history_elided_at), (35, 2));
    for h in &d.history {
        let error = h.error.as_deref().expect("error");
        assert!(error.len() <= 100, "{} bytes", error.len());
        assert!(
            error.starts_with(&format!("attempt {}", h.attempt)),
            "{error}"
        );
    }
}
