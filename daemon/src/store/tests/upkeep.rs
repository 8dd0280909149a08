//! Pruning through the SQLite engine at scale: per-queue scopes in bounded
//! batches, and the pages they free given back. The engines' shared rules of
//! pruning and the history cap are in the conformance suite (`conformance.rs`).

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
