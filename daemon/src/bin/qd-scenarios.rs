//! `qd-scenarios`: reruns the seeds' experiments (crashes, retry storm, poison jobs,
//! fairness) on the real `qd` binary and prints the seed's figure beside qd's.
//!
//! Usage: `cargo build --release -p qd --bins && target/release/qd-scenarios
//! [all|crashes|storm|poison|fairness] [--cluster]`. Each scenario starts `qd` (found
//! next to this executable) on its own temp dir and config. Time is scaled down per
//! scenario; the scale is printed with the table. The crash scenario needs the
//! `sqlite3` CLI.
//!
//! `--cluster` runs the same rows on two qd nodes sharing one throw-away PostgreSQL
//! (`shared/postgres.rs`; needs initdb), work spread over both, and node 1 SIGKILLed
//! mid-run in every run (`qd-scenarios/fleet.rs`).

#[path = "qd-scenarios/crashes.rs"]
mod crashes;
#[path = "qd-scenarios/daemon.rs"]
mod daemon;
#[path = "qd-scenarios/fairness.rs"]
mod fairness;
#[path = "qd-scenarios/fleet.rs"]
mod fleet;
#[path = "qd-scenarios/poison.rs"]
mod poison;
#[path = "shared/postgres.rs"]
mod postgres;
#[path = "shared/scratch.rs"]
mod scratch;
#[path = "qd-scenarios/storm.rs"]
mod storm;

use anyhow::Result;
use clap::{Parser, ValueEnum};

/// One row of the results table.
pub struct Row {
    scenario: String,
    seed: String,
    qd: String,
}

impl Row {
    /// A row: the scenario, the seed's (simulated) outcome, qd's measured outcome.
    pub fn new(scenario: &str, seed: &str, qd: String) -> Row {
        Row {
            scenario: scenario.to_string(),
            seed: seed.to_string(),
            qd,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Which {
    All,
    Crashes,
    Storm,
    Poison,
    Fairness,
}

/// Reruns the seeds' experiments on the real qd daemon.
#[derive(Parser)]
struct Cli {
    /// Which scenario to run.
    #[arg(value_enum, default_value = "all")]
    which: Which,
    /// Run on two qd nodes sharing one throw-away PostgreSQL, one of them SIGKILLed
    /// mid-run (needs PostgreSQL's initdb).
    #[arg(long)]
    cluster: bool,
    /// Workers of the storm's queue on each node (at least the 1,000 jobs, so the
    /// retry schedule shapes the load; at most qd's MAX_WORKERS).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=i64::from(qd::config::MAX_WORKERS)))]
    storm_workers: u32,
    /// The storm's downstream counts its capacity (200 requests/s) per window of
    /// this many milliseconds; 250 is the seed's 1 s at the storm's time scale.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(10..=10_000))]
    storm_window_ms: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let wants = |w: Which| cli.which == Which::All || cli.which == w;
    let setup = fleet::Setup::new(cli.cluster).await?;
    let storm = storm::Options {
        workers: cli.storm_workers,
        window: std::time::Duration::from_millis(cli.storm_window_ms),
    };
    let mut rows = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    if cli.cluster {
        notes.push(cluster_note());
    }
    if wants(Which::Crashes) {
        eprintln!("running: crashes (3 runs of 2,000 jobs)");
        rows.extend(crashes::run(&setup).await?);
        notes.push(crashes_note().into());
    }
    if wants(Which::Storm) {
        eprintln!("running: retry storm (3 runs of 1,000 jobs)");
        rows.extend(storm::run(&setup, &storm).await?);
        notes.push(storm::note(&storm));
    }
    if wants(Which::Poison) {
        eprintln!("running: poison jobs (3 runs)");
        rows.extend(poison::run(&setup).await?);
        notes.push(poison::NOTE.into());
    }
    if wants(Which::Fairness) {
        eprintln!("running: fairness (2 runs)");
        rows.extend(fairness::run(&setup).await?);
        notes.push(fairness::NOTE.into());
    }
    print_table(&rows);
    println!();
    for note in notes {
        println!("- {note}");
    }
    Ok(())
}

fn cluster_note() -> String {
    format!(
        "Cluster: every run starts two qd nodes on a fresh database of one throw-away PostgreSQL (node_timeout = {} s, \
         poll_interval = 200 ms), enqueues through both, splits the workers between them (the storm runs its whole pool \
         on each) and SIGKILLs node 1 once about a third of the jobs succeeded; node 0 answers every read. Each row says \
         when, how many leases node 1 held, and how long until node 0's leader sweep had ended them all.",
        fleet::NODE_TIMEOUT.as_secs()
    )
}

fn crashes_note() -> &'static str {
    "Crashes: no time scale (jobs are instant). Ack first is emulated by an external worker that acks, then runs \
     the job: qd offers no such mode because an ack is qd's durable promise that the work is done; acking first \
     turns every crash before the effect into a job reported succeeded that never happened, and no retry, lease \
     or dead-letter can find it again. Ack last plus an effect keyed by QD_IDEMPOTENCY_KEY gives 0 lost, 0 duplicates."
}

fn print_table(rows: &[Row]) {
    println!("| scenario | seed (simulated) | qd (measured) |");
    println!("|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} |", r.scenario, r.seed, r.qd);
    }
}
