//! Enqueue throughput of the durable store with group commit, on a real file.
//!
//! Two shapes: 64 concurrent submitters each awaiting its insert (producers behind the
//! HTTP API), and one submitter firing inserts with completions (the broker actor).
//! Run with `cargo bench -p qd --bench store`; prints ops/s, commits and the mean
//! batch size. `QD_BENCH_DIR` picks the directory (default: cargo's target tmp dir).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use qd::job::{Job, NewJob};
use qd::store::{NewRecord, Store, StoreStats};

const JOBS: usize = 20_000;
const SUBMITTERS: usize = 64;
const PAYLOAD: [u8; 200] = [b'x'; 200];

/// One job to enqueue, as a one-item batch.
fn record(n: usize) -> Vec<NewRecord> {
    vec![NewRecord {
        job: new_job(n),
        payload: PAYLOAD.to_vec(),
    }]
}

fn new_job(n: usize) -> Job {
    let new = NewJob {
        queue: Arc::from("email"),
        tenant: Arc::from(if n.is_multiple_of(2) {
            "acme"
        } else {
            "default"
        }),
        idempotency_key: Some(format!("key-{n}")),
        delay: Duration::ZERO,
        max_attempts: 5,
        priority_ms: 0,
    };
    Job::new(new, 1_700_000_000_000)
}

/// `SUBMITTERS` tokio tasks, each inserting its share and awaiting every answer.
async fn concurrent_awaiting(store: &Store) {
    let mut tasks = Vec::with_capacity(SUBMITTERS);
    for s in 0..SUBMITTERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for n in (s..JOBS).step_by(SUBMITTERS) {
                let batch = record(n);
                store.run(move |b| b.enqueue(&batch)).await.expect("insert");
            }
        }));
    }
    for task in tasks {
        task.await.expect("submitter task");
    }
}

/// One thread submitting every insert at once, answered through completions.
fn single_firing(store: &Store) {
    let (tx, rx) = mpsc::channel();
    for n in 0..JOBS {
        let batch = record(JOBS + n);
        let tx = tx.clone();
        store.submit(
            move |b| b.enqueue(&batch),
            move |r| {
                let _ = tx.send(r);
            },
        );
    }
    for _ in 0..JOBS {
        rx.recv().expect("answer").expect("insert");
    }
}

fn report(name: &str, elapsed: Duration, before: &StoreStats, after: &StoreStats) {
    let commits = after.commits - before.commits;
    let ops = after.ops - before.ops;
    println!(
        "{name}: {JOBS} inserts of {} B in {:.2?}: {:.0} ops/s, {commits} commits, \
         mean batch {:.1} ops, db+wal {} KiB",
        PAYLOAD.len(),
        elapsed,
        JOBS as f64 / elapsed.as_secs_f64(),
        ops as f64 / commits.max(1) as f64,
        after.size_bytes / 1024,
    );
}

fn main() {
    let base = std::env::var_os("QD_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).expect("bench dir");
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    let store = Store::open_sqlite(&dir.path().join("qd.db")).expect("open store");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");

    let before = store.stats();
    let start = Instant::now();
    runtime.block_on(concurrent_awaiting(&store));
    let middle = store.stats();
    report("64 awaiting submitters", start.elapsed(), &before, &middle);

    let start = Instant::now();
    single_firing(&store);
    report(
        "1 firing submitter   ",
        start.elapsed(),
        &middle,
        &store.stats(),
    );
    store.close();
}
