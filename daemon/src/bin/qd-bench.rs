//! `qd-bench`: measures the real `qd` binary under load over its HTTP API, side
//! by side with beanstalkd (when it is on the PATH) driven by the same client.
//!
//! Usage: `cargo build --release -p qd && target/release/qd-bench [--mode
//! single,batch,paced,executor,soak,cluster,sqs|all] [--jobs N] [--producers P]
//! [--consumers C] [--rate R] [--duration D] [--database-url URL] [--qd PATH]
//! [--json] [--smoke]`. Each mode starts its servers on loopback on fresh temp
//! dirs, runs bounded phases (every phase ends by `--max-time`) and stops them;
//! the report is a table on stdout (or JSON with `--json`). Without `--qd`, the
//! `qd` built beside this binary is used. The modes are described in
//! `qd-bench/modes.rs`, `qd-bench/cluster.rs` and `qd-bench/sqs.rs`, the client in
//! `qd-bench/load.rs`.

#[path = "qd-bench/beanstalk.rs"]
mod beanstalk;
#[path = "qd-bench/cluster.rs"]
mod cluster;
#[path = "qd-bench/latency.rs"]
mod latency;
#[path = "qd-bench/load.rs"]
mod load;
#[path = "qd-bench/modes.rs"]
mod modes;
#[path = "shared/postgres.rs"]
mod postgres;
#[path = "qd-bench/probe.rs"]
mod probe;
#[path = "qd-bench/qd_http.rs"]
mod qd_http;
#[path = "qd-bench/report.rs"]
mod report;
#[path = "shared/scratch.rs"]
mod scratch;
#[path = "qd-bench/servers.rs"]
mod servers;
#[path = "qd-bench/sqs.rs"]
mod sqs;
#[path = "qd-bench/targets.rs"]
mod targets;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};

use load::Plan;
use modes::Settings;
use report::Report;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// 1 job per enqueue, 1 per lease, one ack per job; qd and beanstalkd.
    Single,
    /// qd's batch endpoints: enqueues of 100, leases of 100, one ack request per lease.
    Batch,
    /// A fixed rate for a duration; latency percentiles; qd and beanstalkd.
    Paced,
    /// Command jobs through qd's worker pool against `xargs -P N`.
    Executor,
    /// A steady rate for a duration; store, WAL and RSS over time.
    Soak,
    /// qd on PostgreSQL: SQLite beside PostgreSQL, then 1 and 2 nodes on one
    /// PostgreSQL (50 ms command jobs, no-op jobs).
    Cluster,
    /// qd's SQS API (SendMessageBatch / ReceiveMessage / DeleteMessageBatch of 10,
    /// SigV4-signed) beside its native batch API, on one qd with a token file.
    Sqs,
    /// Every mode above but soak and cluster.
    All,
}

/// Benchmarks qd (and beanstalkd, when installed) on loopback.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Modes to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "single,batch,paced"
    )]
    mode: Vec<Mode>,
    /// Jobs per phase of the single and batch modes.
    #[arg(long, default_value_t = 20_000)]
    jobs: u64,
    /// Producer connections.
    #[arg(long, default_value_t = 2)]
    producers: usize,
    /// Consumer connections.
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// Enqueues per second of the paced and soak modes.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// How long the paced and soak modes run (e.g. "10s", "10m").
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    duration: Duration,
    /// Payload size in bytes (at least 17: the enqueue timestamp).
    #[arg(long, default_value_t = 100)]
    payload: usize,
    /// Jobs of the executor mode, and 50 ms command jobs of the cluster mode.
    #[arg(long, default_value_t = 2_000)]
    exec_jobs: u64,
    /// Workers of the executor mode (qd's pool, `xargs -P`), and of each node in the
    /// cluster mode.
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Time limit of each phase.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "120s")]
    max_time: Duration,
    /// The cluster mode's PostgreSQL database (a libpq key=value string or a
    /// `postgresql://` URL, no password: use PGPASSWORD), a scratch database every
    /// phase fills with jobs. Default: a throw-away PostgreSQL started by the bench
    /// (needs initdb: the Debian package postgresql).
    #[arg(long)]
    database_url: Option<String>,
    /// The qd binary (default: the `qd` beside this binary).
    #[arg(long)]
    qd: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// A short run of every mode (a few seconds, small N), for CI.
    #[arg(long)]
    smoke: bool,
}

impl Cli {
    /// `--smoke` replaces the sizes with small ones and runs every mode.
    fn apply_smoke(&mut self) {
        if self.smoke {
            self.mode = vec![Mode::All, Mode::Soak, Mode::Cluster];
            self.jobs = 30;
            self.rate = 50.0;
            self.duration = Duration::from_secs(2);
            self.exec_jobs = 20;
            self.workers = 4;
            self.max_time = Duration::from_secs(20);
        }
    }

    fn wants(&self, mode: Mode) -> bool {
        self.mode.contains(&mode)
            || (!matches!(mode, Mode::Soak | Mode::Cluster) && self.mode.contains(&Mode::All))
    }

    fn settings(&self) -> Result<Settings> {
        if self.producers == 0 || self.consumers == 0 || self.jobs == 0 {
            bail!("--jobs, --producers and --consumers must be at least 1");
        }
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            bail!("--rate must be a positive number of jobs per second");
        }
        if self.payload < latency::STAMP_LEN {
            bail!("--payload must be at least {} bytes", latency::STAMP_LEN);
        }
        let qd = match &self.qd {
            Some(path) => path.clone(),
            None => std::env::current_exe()?.with_file_name("qd"),
        };
        if !qd.is_file() {
            bail!(
                "no qd binary at {} (build it: cargo build --release -p qd, or pass --qd PATH)",
                qd.display()
            );
        }
        Ok(Settings {
            qd,
            plan: Plan {
                jobs: self.jobs,
                producers: self.producers,
                consumers: self.consumers,
                batch: 1,
                rate: 0.0,
                payload: self.payload,
                max_time: self.max_time,
            },
            rate: self.rate,
            duration: self.duration,
            exec_jobs: self.exec_jobs,
            workers: self.workers.max(1),
            sample_every: (self.duration / 20)
                .clamp(Duration::from_secs(1), Duration::from_secs(30)),
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut cli = Cli::parse();
    cli.apply_smoke();
    let settings = cli.settings()?;
    let mut report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        ..Report::default()
    };
    if servers::on_path("beanstalkd").is_none() {
        report
            .notes
            .push("beanstalkd is not on the PATH: qd only (apt-get install beanstalkd)".into());
    }
    let modes = [
        Mode::Single,
        Mode::Batch,
        Mode::Paced,
        Mode::Executor,
        Mode::Soak,
        Mode::Cluster,
        Mode::Sqs,
    ];
    for mode in modes.into_iter().filter(|m| cli.wants(*m)) {
        eprintln!("qd-bench: running {mode:?}");
        let done = match mode {
            Mode::Single => modes::single(&settings, &mut report).await,
            Mode::Batch => modes::batch(&settings, &mut report).await,
            Mode::Paced => modes::paced(&settings, &mut report).await,
            Mode::Executor => modes::executor(&settings, &mut report).await,
            Mode::Soak => modes::soak(&settings, &mut report).await,
            Mode::Cluster => {
                cluster::cluster(&settings, cli.database_url.as_deref(), &mut report).await
            }
            Mode::Sqs => sqs::sqs(&settings, &mut report).await,
            Mode::All => Ok(()),
        };
        if let Err(e) = done {
            report.notes.push(format!("{mode:?} failed: {e:#}"));
        }
    }
    report.targets = targets::check(&report, settings.rate);
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report).context("JSON")?);
    } else {
        print!("{}", report.table());
    }
    if report.measurements.iter().all(|m| m.mode != "single") && cli.wants(Mode::Single) {
        bail!("the single mode measured nothing");
    }
    // The smoke run goes on without PostgreSQL (its test decides what that means).
    let clustered = report
        .measurements
        .iter()
        .any(|m| m.mode.starts_with("cluster"));
    if !clustered && cli.wants(Mode::Cluster) && !cli.smoke {
        bail!("the cluster mode measured nothing (see the notes)");
    }
    Ok(())
}
