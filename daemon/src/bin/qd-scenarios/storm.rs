//! Retry storm: 1,000 jobs become ready at the same instant (enqueued with delays that
//! end together) and POST, through qd's `http` executor on 100 workers, to a loopback
//! downstream served by this runner that accepts `CAPACITY` requests per one-second
//! window and refuses the rest. Three runs: backoff without jitter, full jitter, and
//! full jitter behind a shared `[rate_limiters]` bucket at the downstream's capacity.
//!
//! Time scale 1:4 against the seed: capacity 200/s (seed 50/s), backoff base 500 ms,
//! max 15 s (the seed's 2 s first window and ~60 s cap). Times are printed as measured
//! and ×4 (seed-equivalent).
//!
//! The downstream refuses with 503 without `Retry-After`, which qd classifies as
//! transient (backoff with jitter). A 429 is classified "throttled" and retried after
//! its `Retry-After` (1 s when absent) without jitter, so it would not exercise the
//! backoff switch this experiment compares.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::json;

use crate::Row;
use crate::daemon::Daemon;
use crate::scratch::Scratch;

const JOBS: usize = 1_000;
const SCALE: f64 = 4.0;
const CAPACITY: u32 = 200;
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// Notes printed under the table.
pub const NOTE: &str = "Retry storm: time scale 1:4 (capacity 200 req/s for the seed's 50, backoff base 500 ms, max 15 s); \
    peak is requests in the busiest 1 s window, time to clear is first request to last success, shown measured and x4. \
    The downstream refuses with 503 (transient, backoff with jitter); qd treats 429 as throttled (flat Retry-After, no jitter).";

/// What the downstream saw.
#[derive(Default)]
struct Seen {
    start: Option<Instant>,
    per_second: Vec<u32>,
    accepted: u32,
    rejected: u32,
    last_ok: Duration,
}

async fn hook(State(seen): State<Arc<Mutex<Seen>>>) -> StatusCode {
    let mut s = seen.lock().expect("invariant: the lock is never poisoned");
    let now = Instant::now();
    let start = *s.start.get_or_insert(now);
    let elapsed = now - start;
    let second = usize::try_from(elapsed.as_secs()).unwrap_or(usize::MAX - 1);
    if s.per_second.len() <= second {
        s.per_second.resize(second + 1, 0);
    }
    s.per_second[second] += 1;
    if s.per_second[second] <= CAPACITY {
        s.accepted += 1;
        s.last_ok = elapsed;
        StatusCode::OK
    } else {
        s.rejected += 1;
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// Serves the downstream on a free loopback port.
async fn downstream() -> Result<(SocketAddr, Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>)> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, seen, server))
}

/// One run; returns (peak req/s, rejected, seconds to clear or None).
async fn run_once(queue_extra: &str, limiter: &str) -> Result<(u32, u32, Option<f64>)> {
    let dir = Scratch::new("storm")?;
    let (addr, seen, server) = downstream().await?;
    let daemon = Daemon::start(
        &dir.0,
        &format!(
            "[queues.storm]\nexecutor = {{ kind = \"http\", url = \"http://{addr}/hook\" }}\n\
             workers = {{ min = 100, max = 100 }}\nmax_attempts = 1000\n{queue_extra}\n{limiter}"
        ),
    )
    .await?;
    // Every job becomes ready at the same instant: start + 4 s.
    let start = Instant::now();
    let due = start + Duration::from_secs(4);
    let mut ids = Vec::new();
    for chunk in (0..JOBS).collect::<Vec<_>>().chunks(100) {
        let delay = due.saturating_duration_since(Instant::now()).as_secs_f64();
        let bodies = chunk
            .iter()
            .map(|i| json!({ "payload": format!("{i}"), "delay": delay }))
            .collect();
        ids.extend(daemon.enqueue_all("storm", bodies).await?);
    }
    let done = daemon.wait_final(&ids, RUN_LIMIT).await?;
    server.abort();
    let s = seen.lock().expect("invariant: the lock is never poisoned");
    let peak = s.per_second.iter().copied().max().unwrap_or(0);
    let cleared =
        (done.len() == JOBS && s.accepted as usize >= JOBS).then(|| s.last_ok.as_secs_f64());
    Ok((peak, s.rejected, cleared))
}

fn outcome(peak: u32, rejected: u32, cleared: Option<f64>) -> String {
    let clear = match cleared {
        Some(t) => format!("{t:.1} s to clear (x4 = {:.0} s)", t * SCALE),
        None => format!("not cleared within {} s", RUN_LIMIT.as_secs()),
    };
    format!("peak {peak}/s (capacity {CAPACITY}/s), {rejected} rejected, {clear}")
}

/// Runs the three storm experiments and returns their rows.
pub async fn run() -> Result<Vec<Row>> {
    let backoff = |jitter: &str| {
        format!("backoff = {{ base = \"500ms\", max = \"15s\", jitter = \"{jitter}\" }}")
    };
    let (p, r, c) = run_once(&backoff("none"), "").await?;
    let mut rows = vec![Row::new(
        "1000 retries, no jitter",
        "peak 1000/s, 9,500 rejected, 962 s to clear",
        outcome(p, r, c),
    )];
    let (p, r, c) = run_once(&backoff("full"), "").await?;
    rows.push(Row::new(
        "1000 retries, full jitter",
        "peak 720/s, 2,283 rejected, 69 s to clear",
        outcome(p, r, c),
    ));
    let limited = format!("{}\nrate_limiter = \"downstream\"", backoff("full"));
    let bucket = format!("[rate_limiters.downstream]\nper_second = {CAPACITY}\nburst = 20\n");
    let (p, r, c) = run_once(&limited, &bucket).await?;
    rows.push(Row::new(
        "1000 retries, full jitter + shared rate limiter",
        "(not simulated; target ~0 rejected, ~20 s)",
        outcome(p, r, c),
    ));
    Ok(rows)
}
