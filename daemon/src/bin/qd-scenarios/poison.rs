//! Poison jobs: 4 jobs that always fail (enqueued first, so FIFO favours them) plus
//! 40 good ones on 2 workers. Runs: no poison; poison with `max_attempts = 3`
//! (dead-lettered with their history); poison with `max_attempts = 1000` (qd's
//! ceiling, "retry forever"). Time scale 1:10: a good job sleeps 100 ms (the seed's
//! 1 s), backoff base 100 ms, max 1 s.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use crate::Row;
use crate::fleet::{Fleet, Killed, Setup};
use crate::scratch::Scratch;

/// Notes printed under the table.
pub const NOTE: &str = "Poison: time scale 1:10 (good jobs 100 ms for the seed's 1 s, backoff 100 ms..1 s), 2 workers; \
    times are measured and x10. Poison jobs exit 1 (transient) every time.";

const SCALE: f64 = 10.0;
const SCRIPT: &str =
    "p=$(cat)\n[ \"$p\" = poison ] && { echo \"poisoned\" >&2; exit 1; }\nsleep 0.1";

/// What one run measured.
struct Outcome {
    /// Seconds until all 40 good jobs succeeded, if they did within the limit.
    good_done: Option<f64>,
    /// Poison jobs dead with a history of `max_attempts` entries.
    parked: usize,
    /// Attempts of the poison jobs so far.
    attempts: u64,
    killed: Option<Killed>,
}

async fn run_once(setup: &Setup, poison: usize, max_attempts: u32) -> Result<Outcome> {
    let dir = Scratch::new("poison")?;
    let prog = dir.script("job.sh", SCRIPT)?;
    let fleet = Fleet::start(setup, &dir.0, |node| {
        let w = setup.share(2, node);
        format!(
            "[queues.p]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\n\
             workers = {{ min = {w}, max = {w} }}\nmax_attempts = {max_attempts}\nbackoff = {{ base = \"100ms\", max = \"1s\" }}\n",
            prog.display()
        )
    })
    .await?;
    let daemon = fleet.api();
    let start = Instant::now();
    let mut bodies = vec![json!({ "payload": "poison" }); poison];
    bodies.extend(vec![json!({ "payload": "good" }); 40]);
    let mut ids = fleet.enqueue_all("p", bodies).await?;
    let good = ids.split_off(poison);
    let bad = ids;
    let kill = fleet.kill_later(15)?;
    let done = daemon.wait_final(&good, Duration::from_secs(120)).await?;
    let secs = start.elapsed().as_secs_f64();
    let all_good = done.len() == 40 && done.iter().all(|j| j["state"] == "succeeded");
    if max_attempts <= 3 {
        // A bounded budget: the poison jobs reach the dead-letter queue soon after.
        daemon.wait_final(&bad, Duration::from_secs(60)).await?;
    }
    let mut parked = 0;
    let mut attempts = 0;
    for id in &bad {
        let job = daemon.job(id).await?;
        attempts += job["attempts"].as_u64().unwrap_or(0);
        let history = job["history"].as_array().map_or(0, Vec::len);
        if job["state"] == "dead" && history == max_attempts as usize {
            parked += 1;
        }
    }
    Ok(Outcome {
        good_done: all_good.then_some(secs),
        parked,
        attempts,
        killed: kill.finish().await?,
    })
}

fn done_by(secs: Option<f64>) -> String {
    match secs {
        Some(s) => format!("40 of 40 done by {s:.1} s (x10 = {:.0} s)", s * SCALE),
        None => "good jobs not all done within 120 s".to_string(),
    }
}

/// Runs the poison experiments and returns their rows.
pub async fn run(setup: &Setup) -> Result<Vec<Row>> {
    let base = run_once(setup, 0, 3).await?;
    let mut rows = vec![Row::new(
        "No poison jobs (baseline)",
        "40 of 40 done by 20 s",
        format!(
            "{}{}",
            done_by(base.good_done),
            Killed::describe(base.killed.as_ref())
        ),
    )];
    let forever = run_once(setup, 4, 1000).await?;
    rows.push(Row::new(
        "Poison jobs, retry forever (max_attempts = 1000)",
        "0 of 40 good jobs done in 2000 s",
        format!(
            "{}; poison attempts so far {}{}",
            done_by(forever.good_done),
            forever.attempts,
            Killed::describe(forever.killed.as_ref())
        ),
    ));
    let dlq = run_once(setup, 4, 3).await?;
    rows.push(Row::new(
        "Poison jobs, DLQ after 3",
        "40 of 40 done by 26 s; 4 parked",
        format!(
            "{}; {} dead with 3-attempt history{}",
            done_by(dlq.good_done),
            dlq.parked,
            Killed::describe(dlq.killed.as_ref())
        ),
    ));
    Ok(rows)
}
