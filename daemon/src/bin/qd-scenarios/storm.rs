//! Retry storm: the seed's 1,000 clients retrying after an outage against a service
//! that accepts 50 requests per second. 1,000 jobs become ready at the same instant
//! (enqueued with delays that end together) and POST, through qd's `http` executor,
//! to a loopback downstream served by this runner. The downstream is down until it
//! has refused every job once (the outage: all jobs fail together, as the seed's
//! clients start); from then on it accepts [`CAPACITY_PER_SEC`] × the window's
//! length requests per window and refuses the rest with 503, which qd classifies as
//! transient (backoff with jitter). Three runs: backoff without jitter, full jitter,
//! and full jitter behind a shared `[rate_limiters]` bucket under the downstream's
//! capacity.
//!
//! Time scale 1:4 against the seed, on every axis: windows of 250 ms (the seed's
//! 1 s) holding 50 requests, backoff base 500 ms and max 16 s (the seed's first
//! window of 2 s and its 64 s cap: its 9,500 rejections and 962 s to clear are 19
//! rounds of 50 with delays 2, 4, …, 64, 64 s). The window must scale with the
//! backoff: with 1 s windows and a 500 ms base, the first two rounds of retries land
//! in the window of the first wave, jittered or not, and jitter cannot show.
//!
//! The queue's pool has `workers` (default 1,000, one per job, within qd's
//! `MAX_WORKERS`) so that each job is a client of its own and the backoff schedule,
//! not the pool, decides when requests are sent. On a cluster both nodes run the
//! whole pool (so node 0 alone still can), the jobs are enqueued through both, and
//! node 1 is SIGKILLed once 300 jobs succeeded.
//!
//! A 429 would be classified "throttled" and retried after its `Retry-After` (plus up
//! to as much again), not charged, so it would not exercise the backoff this
//! experiment compares.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::json;

use crate::Row;
use crate::fleet::{Fleet, Killed, Setup};
use crate::scratch::Scratch;

const JOBS: usize = 1_000;
const SCALE: f64 = 4.0;
/// The downstream's capacity per second: the seed's 50/s at 1:4.
const CAPACITY_PER_SEC: u32 = 200;
const RUN_LIMIT: Duration = Duration::from_secs(480);

/// How the storm is run (the CLI's `--storm-*` options).
#[derive(Clone, Copy)]
pub struct Options {
    /// Workers of the queue on each node.
    pub workers: u32,
    /// The downstream's accounting window.
    pub window: Duration,
}

impl Options {
    fn capacity(&self) -> u32 {
        (f64::from(CAPACITY_PER_SEC) * self.window.as_secs_f64()).round() as u32
    }
}

/// Notes printed under the table.
pub fn note(o: &Options) -> String {
    format!(
        "Retry storm: time scale 1:4 on every axis (windows of {w} ms holding {c} requests for the seed's 1 s and 50, \
         backoff base 500 ms, max 16 s for the seed's 2 s and 64 s), {workers} workers per node. The downstream is down \
         until it refused every job once (the outage, not counted below); then peak is requests in the busiest window, \
         rejected counts its 503s, time to clear runs from the outage's end to the last success, shown measured and x4. \
         503 is transient (backoff with jitter); qd treats 429 as throttled (Retry-After, not charged).",
        w = o.window.as_millis(),
        c = o.capacity(),
        workers = o.workers
    )
}

/// What the downstream saw.
#[derive(Default)]
struct Seen {
    capacity: u32,
    window: Duration,
    /// Jobs refused during the outage.
    down_for: HashSet<String>,
    outage_refusals: u32,
    first_refusal: Option<Instant>,
    /// When the outage ended: every job had been refused once.
    up_at: Option<Instant>,
    per_window: Vec<u32>,
    accepted: u32,
    rejected: u32,
    last_ok: Duration,
}

async fn hook(State(seen): State<Arc<Mutex<Seen>>>, headers: HeaderMap) -> StatusCode {
    let mut s = seen.lock().expect("invariant: the lock is never poisoned");
    let now = Instant::now();
    let Some(up) = s.up_at else {
        s.first_refusal.get_or_insert(now);
        s.outage_refusals += 1;
        let job = headers
            .get("qd-job-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        s.down_for.insert(job);
        if s.down_for.len() >= JOBS {
            s.up_at = Some(now);
        }
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    let elapsed = now - up;
    let window =
        usize::try_from(elapsed.as_nanos() / s.window.as_nanos().max(1)).unwrap_or(usize::MAX - 1);
    if s.per_window.len() <= window {
        s.per_window.resize(window + 1, 0);
    }
    s.per_window[window] += 1;
    if s.per_window[window] <= s.capacity {
        s.accepted += 1;
        s.last_ok = elapsed;
        StatusCode::OK
    } else {
        s.rejected += 1;
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// Serves the downstream on a free loopback port.
async fn downstream(
    o: &Options,
) -> Result<(SocketAddr, Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>)> {
    let seen = Arc::new(Mutex::new(Seen {
        capacity: o.capacity(),
        window: o.window,
        ..Seen::default()
    }));
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

/// What one run measured.
struct Outcome {
    peak: u32,
    rejected: u32,
    /// Seconds from the outage's end to the last success, if every job succeeded.
    cleared: Option<f64>,
    outage_refusals: u32,
    /// Jobs that succeeded.
    succeeded: usize,
    /// Seconds from the first refusal to the outage's end: how long the first wave
    /// took to reach the downstream.
    outage_secs: f64,
    killed: Option<Killed>,
}

async fn run_once(setup: &Setup, o: &Options, queue_extra: &str, limiter: &str) -> Result<Outcome> {
    let dir = Scratch::new("storm")?;
    let (addr, seen, server) = downstream(o).await?;
    let workers = o.workers;
    let fleet = Fleet::start(setup, &dir.0, |_| {
        format!(
            "[queues.storm]\nexecutor = {{ kind = \"http\", url = \"http://{addr}/hook\" }}\n\
             workers = {{ min = {workers}, max = {workers} }}\nmax_attempts = 1000\n{queue_extra}\n{limiter}"
        )
    })
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
        ids.extend(fleet.enqueue_all("storm", bodies).await?);
    }
    let kill = fleet.kill_later(300)?;
    // Wait on the downstream's count, not by polling 1,000 jobs' documents, which
    // would load the nodes whose timing is measured; then read the jobs once.
    let accepted = || seen.lock().map_or(0, |s| s.accepted as usize);
    while accepted() < JOBS && start.elapsed() < RUN_LIMIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // On a cluster a request node 1 sent before its SIGKILL may be accepted and
    // sent again by node 0, so 1,000 acceptances need not be 1,000 final jobs.
    let left = RUN_LIMIT.saturating_sub(start.elapsed());
    let done = fleet
        .api()
        .wait_final(&ids, left.max(Duration::from_secs(60)))
        .await?;
    let killed = kill.finish().await?;
    server.abort();
    let s = seen.lock().expect("invariant: the lock is never poisoned");
    let head: Vec<String> = s.per_window.iter().take(24).map(u32::to_string).collect();
    eprintln!(
        "storm ({queue_extra:?}): requests in the first windows of {} ms: {}",
        o.window.as_millis(),
        head.join(" ")
    );
    let outage_secs = match (s.first_refusal, s.up_at) {
        (Some(first), Some(up)) => (up - first).as_secs_f64(),
        _ => 0.0,
    };
    Ok(Outcome {
        peak: s.per_window.iter().copied().max().unwrap_or(0),
        rejected: s.rejected,
        cleared: (done.len() == JOBS && done.iter().all(|j| j["state"] == "succeeded"))
            .then(|| s.last_ok.as_secs_f64()),
        outage_refusals: s.outage_refusals,
        succeeded: done.iter().filter(|j| j["state"] == "succeeded").count(),
        outage_secs,
        killed,
    })
}

fn describe(o: &Options, r: &Outcome) -> String {
    let clear = match r.cleared {
        Some(t) => format!("{t:.1} s to clear (x4 = {:.0} s)", t * SCALE),
        None => format!(
            "{} of {JOBS} jobs succeeded within {} s",
            r.succeeded,
            RUN_LIMIT.as_secs()
        ),
    };
    format!(
        "peak {peak} per {w} ms (capacity {c}), {rejected} rejected, {clear}; outage: {refusals} refused over {outage:.2} s{kill}",
        peak = r.peak,
        w = o.window.as_millis(),
        c = o.capacity(),
        rejected = r.rejected,
        refusals = r.outage_refusals,
        outage = r.outage_secs,
        kill = Killed::describe(r.killed.as_ref())
    )
}

/// Runs the three storm experiments and returns their rows.
pub async fn run(setup: &Setup, o: &Options) -> Result<Vec<Row>> {
    let backoff = |jitter: &str| {
        format!("backoff = {{ base = \"500ms\", max = \"16s\", jitter = \"{jitter}\" }}")
    };
    let none = run_once(setup, o, &backoff("none"), "").await?;
    let mut rows = vec![Row::new(
        "1000 retries, no jitter",
        "peak 1000/s, 9,500 rejected, 962 s to clear",
        describe(o, &none),
    )];
    let full = run_once(setup, o, &backoff("full"), "").await?;
    rows.push(Row::new(
        "1000 retries, full jitter",
        "peak 720/s, 2,283 rejected, 69 s to clear",
        describe(o, &full),
    ));
    // Under the capacity with room for the bucket's burst in any one window.
    let per_second = CAPACITY_PER_SEC * 9 / 10;
    let limited = format!("{}\nrate_limiter = \"downstream\"", backoff("full"));
    let bucket = format!("[rate_limiters.downstream]\nper_second = {per_second}\nburst = 5\n");
    let limited = run_once(setup, o, &limited, &bucket).await?;
    rows.push(Row::new(
        "1000 retries, full jitter + shared rate limiter",
        "(not simulated; target ~0 rejected, ~20 s)",
        describe(o, &limited),
    ));
    Ok(rows)
}
