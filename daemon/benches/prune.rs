//! How fast the Pruner clears a backlog of finished jobs, and what that does to
//! enqueue latency, on a real file.
//!
//! Seeds `BACKLOG` succeeded jobs (each with a history entry) an hour past a 1 s
//! retention, measures the insert latency of `SUBMITTERS` awaiting producers for
//! `QUIET` with nothing to prune, then runs one Pruner pass while the same producers
//! keep inserting. Prints rows pruned per second, insert p50/p99 before and during
//! the pass, and the file size before and after (free pages given back).
//! Run with `cargo bench -p qd --bench prune` (about 15 s in release).
//! `QD_BENCH_DIR` picks the directory (default: cargo's target tmp dir).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use qd::clock::wall_ms;
use qd::config::Config;
use qd::job::{HistoryEntry, Job, NewJob, Outcome, State, Transition};
use qd::pruner;
use qd::store::{Backend, Inserted, NewRecord, Store, StoreError};

const BACKLOG: usize = 100_000;
const SUBMITTERS: usize = 8;
const QUIET: Duration = Duration::from_secs(2);
const PAYLOAD: [u8; 200] = [b'x'; 200];

fn new_job(n: usize, now: i64) -> Job {
    let new = NewJob {
        queue: Arc::from("email"),
        tenant: Arc::from("default"),
        idempotency_key: Some(format!("key-{n}")),
        delay: Duration::ZERO,
        max_attempts: 5,
        priority_ms: 0,
    };
    Job::new(new, now)
}

/// Stores `job` with the bench payload.
fn insert(b: &mut dyn Backend, job: &Job) -> Result<Inserted, StoreError> {
    let record = NewRecord {
        job: job.clone(),
        payload: PAYLOAD.to_vec(),
    };
    Ok(b.enqueue(&[record])?.remove(0))
}

/// `BACKLOG` succeeded jobs, finished an hour ago, in batches of 1,000 per operation.
async fn seed(store: &Store, now: i64) {
    for chunk in (0..BACKLOG).collect::<Vec<_>>().chunks(1_000) {
        let chunk = chunk.to_vec();
        store
            .run(move |b| {
                for n in chunk {
                    let mut job = new_job(n, now - 3_600_000);
                    insert(b, &job)?;
                    job.lease_seq = 1;
                    let lease = Job {
                        state: State::Leased,
                        worker: Some("email/0".into()),
                        leased_at: Some(job.updated_at),
                        ..job.clone()
                    };
                    b.claim(&[lease])?;
                    (job.state, job.attempts) = (State::Succeeded, 1);
                    let entry = HistoryEntry {
                        attempt: 1,
                        outcome: Outcome::Succeeded,
                        worker: Some("email/0".into()),
                        started_at: Some(job.updated_at),
                        ended_at: job.updated_at,
                        error: None,
                    };
                    let end = Transition {
                        job,
                        entry: Some(entry),
                        result: None,
                    };
                    b.complete(&[end])?;
                }
                Ok(())
            })
            .await
            .expect("seed");
    }
}

/// Producers inserting (and awaiting) new jobs until `stop`; returns every latency.
async fn produce(store: &Store, stop: Arc<AtomicBool>, first: usize) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for s in 0..SUBMITTERS {
        let (store, stop) = (store.clone(), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = first + s * 10_000_000;
            while !stop.load(Ordering::SeqCst) {
                let job = new_job(n, wall_ms());
                let sent = Instant::now();
                store.run(move |b| insert(b, &job)).await.expect("insert");
                latencies.push(sent.elapsed());
                n += 1;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("producer"));
    }
    all.sort();
    all
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

fn main() {
    let base = std::env::var_os("QD_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).expect("bench dir");
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    let config = Config::parse(
        "[queues.email]\nexecutor = { kind = \"external\" }\nretention = \"1s\"\n",
        &dir.path().join("qd.toml"),
    )
    .expect("config");
    let store = Store::open_sqlite(&dir.path().join("qd.db")).expect("open store");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let now = wall_ms();
    runtime.block_on(seed(&store, now));
    let seeded = store.stats().size_bytes;

    let stop = Arc::new(AtomicBool::new(false));
    let quiet = runtime.block_on(async {
        let producers = produce(&store, Arc::clone(&stop), BACKLOG);
        let timer = async {
            tokio::time::sleep(QUIET).await;
            stop.store(true, Ordering::SeqCst);
        };
        tokio::join!(producers, timer).0
    });

    let stop = Arc::new(AtomicBool::new(false));
    let (busy, (pruned, took)) = runtime.block_on(async {
        let producers = produce(&store, Arc::clone(&stop), 2 * BACKLOG);
        let pass = async {
            let start = Instant::now();
            let mut batch = pruner::BatchSize::default();
            let pruned = pruner::pass(&config, &store, wall_ms(), &mut batch)
                .await
                .expect("pass");
            let took = start.elapsed();
            stop.store(true, Ordering::SeqCst);
            (pruned, took)
        };
        tokio::join!(producers, pass)
    });
    println!(
        "pruned {pruned} jobs in {took:.2?}: {:.0} jobs/s, batches sized to take {:?}",
        pruned as f64 / took.as_secs_f64(),
        pruner::BATCH_TIME
    );
    for (name, sorted) in [("no pruning    ", &quiet), ("during pruning", &busy)] {
        println!(
            "insert latency {name}: p50 {:.2?}, p99 {:.2?} ({} inserts, {SUBMITTERS} awaiting producers)",
            quantile(sorted, 0.5),
            quantile(sorted, 0.99),
            sorted.len()
        );
    }
    println!(
        "db+wal {} KiB seeded, {} KiB after the pass",
        seeded / 1024,
        store.stats().size_bytes / 1024
    );
    store.close();
}
