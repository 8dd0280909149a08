//! Fairness: tenant A enqueues 500 jobs, tenant B 10 jobs just after, 5 workers.
//! FIFO-equivalent: every job under one tenant, so qd's per-tenant queue is a single
//! FIFO. Fair: A's jobs as tenant `a`, B's as tenant `b`, equal weights (qd's weighted
//! deficit round robin). Time scale 1:10: jobs sleep 100 ms (the seed's 1 s) and B
//! arrives 100 ms after A's last enqueue (the seed's 1 s).
//!
//! On a cluster the 5 workers are 3 on node 0 and 2 on node 1, both tenants enqueue
//! through both nodes, and node 1 is SIGKILLed once 170 jobs (a third) succeeded.

use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};

use crate::Row;
use crate::daemon::{first_start_ms, last_end_ms, percentile};
use crate::fleet::{Fleet, Killed, Setup};
use crate::scratch::Scratch;

/// Notes printed under the table.
pub const NOTE: &str = "Fairness: time scale 1:10 (100 ms jobs, B 100 ms after A), 5 workers; wait = first start - enqueue, \
    shown measured and x10. FIFO-equivalent = all jobs in one tenant (qd keeps one FIFO per tenant).";

const SCALE: f64 = 10.0;

/// (B's p95 wait s, A's completion s, the kill) for one run.
async fn run_once(setup: &Setup, fair: bool) -> Result<(f64, f64, Option<Killed>)> {
    let dir = Scratch::new("fairness")?;
    let prog = dir.script("job.sh", "cat >/dev/null; sleep 0.1")?;
    let fleet = Fleet::start(setup, &dir.0, |node| {
        let w = setup.share(5, node);
        format!(
            "[queues.f]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = {w}, max = {w} }}\n",
            prog.display()
        )
    })
    .await?;
    let daemon = fleet.api();
    let (ta, tb) = if fair {
        ("a", "b")
    } else {
        ("default", "default")
    };
    let a = fleet
        .enqueue_all("f", vec![json!({ "tenant": ta, "payload": "A" }); 500])
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = fleet
        .enqueue_all("f", vec![json!({ "tenant": tb, "payload": "B" }); 10])
        .await?;
    let kill = fleet.kill_later(170)?;
    let a_jobs = daemon.wait_final(&a, Duration::from_secs(300)).await?;
    let b_jobs = daemon.wait_final(&b, Duration::from_secs(300)).await?;
    let mut waits: Vec<f64> = b_jobs
        .iter()
        .filter_map(|j| Some((first_start_ms(j)? - j["created_at"].as_i64()?) as f64 / 1000.0))
        .collect();
    let created = a_jobs
        .iter()
        .filter_map(|j: &Value| j["created_at"].as_i64())
        .min()
        .unwrap_or(0);
    let finished = a_jobs.iter().filter_map(last_end_ms).max().unwrap_or(0);
    Ok((
        percentile(&mut waits, 95.0),
        (finished - created) as f64 / 1000.0,
        kill.finish().await?,
    ))
}

/// Runs the fairness experiments and returns their rows.
pub async fn run(setup: &Setup) -> Result<Vec<Row>> {
    let (fifo_p95, fifo_a, fifo_kill) = run_once(setup, false).await?;
    let (fair_p95, fair_a, fair_kill) = run_once(setup, true).await?;
    let kills = match (&fifo_kill, &fair_kill) {
        (Some(fifo), Some(fair)) => {
            format!("; FIFO: {}; fair: {}", fifo.sentence(), fair.sentence())
        }
        _ => String::new(),
    };
    Ok(vec![
        Row::new(
            "Tenant B p95, FIFO vs fair",
            "101 s vs 4 s",
            format!(
                "{fifo_p95:.2} s vs {fair_p95:.2} s (x10 = {:.0} s vs {:.0} s)",
                fifo_p95 * SCALE,
                fair_p95 * SCALE
            ),
        ),
        Row::new(
            "Tenant A completion, FIFO vs fair",
            "96 s vs 98 s",
            format!(
                "{fifo_a:.1} s vs {fair_a:.1} s (x10 = {:.0} s vs {:.0} s){kills}",
                fifo_a * SCALE,
                fair_a * SCALE
            ),
        ),
    ])
}
