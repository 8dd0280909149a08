//! The floor: the least a durable HTTP/JSON job queue can cost on this machine, as a
//! yardstick for qd's request/reply figures (issue 10's "≤ 150 µs of server CPU per
//! job" and "≥ 2× beanstalkd `-f 0`"). Not part of qd: no store, no index, no
//! history, no tenants, no metrics, no auth, no recovery.
//!
//! It serves the three endpoints the load generator of `../shared/bench` calls, with
//! qd's shapes, on the same stack qd uses (axum on a multi-thread tokio runtime):
//! - `POST /v1/queues/{queue}/jobs` `{"payload": "…"}` → `202 {"id": "N"}` once the
//!   enqueue's log record is on disk;
//! - `POST /v1/queues/{queue}/leases` `{"max_jobs": B}` → `200 {"jobs": [{"id",
//!   "token", "payload"}]}`, waiting up to 1 s for a job (one FIFO for every queue);
//! - `POST /v1/jobs/{id}/ack` → `200 {"id", "state": "succeeded"}` once the ack's
//!   record is on disk.
//!
//! Durability is a group commit: one writer thread appends every record queued since
//! its last commit to a log file (`$TMPDIR/qd-floor-<pid>/floor.log`, 64 MiB written
//! with zeros at start so that no commit allocates blocks, overwritten in a ring) with
//! one `pwrite` and one `fdatasync`, then answers them all. `FLOOR_FSYNC=0` skips the
//! `fdatasync` (the cost of HTTP and the queue alone).
//!
//! Run: `cargo run --release -p qd --example floor -- 127.0.0.1:17581`, or
//! `daemon/benches/floor.sh`, which drives it with the load generator and prints its
//! CPU per job beside qd's.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

/// Size of the log ring, bytes.
const LOG_BYTES: u64 = 64 << 20;

/// A record to make durable and the caller waiting for it.
type Record = (Vec<u8>, oneshot::Sender<()>);

/// The queue: the last id given out and the jobs not yet leased (id, payload).
#[derive(Default)]
struct Jobs {
    last_id: u64,
    ready: VecDeque<(u64, String)>,
}

struct Floor {
    jobs: Mutex<Jobs>,
    /// Wakes one waiting lease per enqueued job.
    arrived: Notify,
    log: mpsc::Sender<Record>,
}

impl Floor {
    fn jobs(&self) -> std::sync::MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once `record` is written (and synced, unless `FLOOR_FSYNC=0`).
    async fn durable(&self, record: String) -> Result<(), StatusCode> {
        let (done, written) = oneshot::channel();
        self.log
            .send((record.into_bytes(), done))
            .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
        written.await.map_err(|_| StatusCode::SERVICE_UNAVAILABLE)
    }
}

/// The writer thread: one `pwrite` and one `fdatasync` per batch of records.
fn write_log(file: &File, records: &mpsc::Receiver<Record>, sync: bool) -> std::io::Result<()> {
    let mut offset = 0;
    let mut buf = Vec::new();
    while let Ok(first) = records.recv() {
        let batch: Vec<Record> = std::iter::once(first).chain(records.try_iter()).collect();
        buf.clear();
        batch.iter().for_each(|(record, _)| buf.extend(record));
        if offset + buf.len() as u64 > LOG_BYTES {
            offset = 0;
        }
        file.write_all_at(&buf, offset)?;
        offset += buf.len() as u64;
        if sync {
            file.sync_data()?;
        }
        for (_, done) in batch {
            let _ = done.send(());
        }
    }
    Ok(())
}

async fn enqueue(
    State(floor): State<Arc<Floor>>,
    Path(_queue): Path<String>,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Value>), StatusCode> {
    let payload = body["payload"].as_str().unwrap_or_default().to_owned();
    let id = {
        let mut jobs = floor.jobs();
        jobs.last_id += 1;
        jobs.last_id
    };
    floor.durable(format!("E {id} {payload}\n")).await?;
    floor.jobs().ready.push_back((id, payload));
    floor.arrived.notify_one();
    Ok((StatusCode::ACCEPTED, Json(json!({ "id": id.to_string() }))))
}

async fn lease(
    State(floor): State<Arc<Floor>>,
    Path(_queue): Path<String>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let max = usize::try_from(body["max_jobs"].as_u64().unwrap_or(1))
        .unwrap_or(1)
        .max(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let arrived = floor.arrived.notified();
        {
            let mut jobs = floor.jobs();
            let n = jobs.ready.len().min(max);
            if n > 0 {
                let leased: Vec<Value> = jobs
                    .ready
                    .drain(..n)
                    .map(|(id, payload)| json!({ "id": id.to_string(), "token": id, "payload": payload }))
                    .collect();
                if !jobs.ready.is_empty() {
                    floor.arrived.notify_one();
                }
                return Json(json!({ "jobs": leased }));
            }
        }
        if tokio::time::timeout_at(deadline, arrived).await.is_err() {
            return Json(json!({ "jobs": [] }));
        }
    }
}

async fn ack(
    State(floor): State<Arc<Floor>>,
    Path(id): Path<String>,
    Json(_body): Json<Value>,
) -> Result<Json<Value>, StatusCode> {
    floor.durable(format!("A {id}\n")).await?;
    Ok(Json(json!({ "id": id, "state": "succeeded" })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:17581".into());
    let sync = std::env::var("FLOOR_FSYNC").map_or(true, |v| v != "0");
    let dir = std::env::temp_dir().join(format!("qd-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = File::create(dir.join("floor.log"))?;
    let zeros = vec![0u8; 1 << 20];
    for chunk in 0..LOG_BYTES / zeros.len() as u64 {
        file.write_all_at(&zeros, chunk * zeros.len() as u64)?;
    }
    file.sync_all()?;
    let (log, records) = mpsc::channel();
    std::thread::Builder::new()
        .name("floor-writer".into())
        .spawn(move || {
            if let Err(err) = write_log(&file, &records, sync) {
                eprintln!("floor: the log write failed: {err}");
                std::process::exit(1);
            }
        })?;
    let floor = Arc::new(Floor {
        jobs: Mutex::default(),
        arrived: Notify::new(),
        log,
    });
    let app = Router::new()
        .route("/v1/queues/{queue}/jobs", post(enqueue))
        .route("/v1/queues/{queue}/leases", post(lease))
        .route("/v1/jobs/{id}/ack", post(ack))
        .with_state(floor);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!("floor: listening on {listen}, log in {}", dir.display());
    axum::serve(listener, app).await?;
    Ok(())
}
