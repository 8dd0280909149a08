//! The benchmark's modes. Each starts fresh servers, runs its phases through
//! [`load::run`] and records figures in the [`Report`]:
//!
//! - `single`: request/reply (1 job per enqueue, 1 per lease, one ack per job):
//!   enqueue only, drain, end to end (enqueue and consume at once), server and
//!   client CPU per end-to-end job; qd and each beanstalkd.
//! - `batch`: qd's batch endpoints (enqueues of 100, leases of 100, one ack
//!   request per lease); beanstalkd has no batch commands.
//! - `paced`: a fixed enqueue rate for a duration, end to end: jobs done per
//!   second and enqueue→lease / enqueue→ack percentiles; qd and each beanstalkd.
//! - `executor`: command jobs through qd's own worker pool against `xargs -P N` of
//!   the same script.
//! - `soak`: qd at a steady rate for a duration, sampling store size, WAL size
//!   and RSS.
//!
//! The `cluster` mode (qd on PostgreSQL, 1 and 2 nodes) is in `cluster.rs`, the
//! `sqs` mode (qd's SQS API beside its batch API) in `sqs.rs`; both use the phases
//! and helpers here.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::beanstalk::BeanstalkTarget;
use crate::load::{self, Outcome, Phase, Plan, Progress, Target};
use crate::probe;
use crate::qd_http::{Api, QdTarget};
use crate::report::{Report, SERVERS, SoakSample};
use crate::scratch::Scratch;
use crate::servers::{self, COMMAND_QUEUE, EXTERNAL_QUEUE, Fsync, Node, QdSetup, Server};

/// What every mode needs to know.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `qd` binary under test.
    pub qd: PathBuf,
    /// The shape of the unpaced loads (jobs, producers, consumers, payload, time limit).
    pub plan: Plan,
    /// Enqueues per second of the paced and soak modes.
    pub rate: f64,
    /// How long the paced and soak modes run.
    pub duration: Duration,
    /// Jobs of the executor mode.
    pub exec_jobs: u64,
    /// Workers of the executor mode (qd's pool size and `xargs -P`).
    pub workers: u32,
    /// Time between soak samples.
    pub sample_every: Duration,
}

/// The beanstalkd configurations qd is compared with, and their column names.
const BEANSTALKDS: [(Fsync, &str); 2] = [(Fsync::Always, SERVERS[1]), (Fsync::Default, SERVERS[2])];

/// `defaults.retention` of the qd under test: short, so the soak shows pruning.
const RETENTION: &str = "1m";

impl Settings {
    /// Starts the qd under test, with a command queue running `script`, on SQLite
    /// or as `node` of a cluster.
    pub async fn start_qd(
        &self,
        script: &std::path::Path,
        node: Option<Node<'_>>,
    ) -> Result<Server> {
        servers::start_qd(&QdSetup {
            binary: &self.qd,
            workers: self.workers,
            script,
            retention: RETENTION,
            node,
            sqs_tokens: None,
        })
        .await
    }

    /// Request/reply at `rate` for `duration` (the paced and soak modes).
    fn steady_plan(&self) -> Plan {
        Plan {
            batch: 1,
            rate: self.rate,
            jobs: (self.rate * self.duration.as_secs_f64()).ceil() as u64,
            max_time: self.duration + self.plan.max_time,
            ..self.plan.clone()
        }
    }

    /// Starts qd with a command queue that does nothing (for the HTTP modes).
    async fn start_qd_for_http(&self) -> Result<(Server, Scratch)> {
        let scripts = Scratch::new("scripts")?;
        let script = scripts.script("noop.sh", "cat >/dev/null")?;
        Ok((self.start_qd(&script, None).await?, scripts))
    }
}

/// `server`'s external queue, through `api`.
pub fn qd_target(server: &Server, api: Api) -> Arc<QdTarget> {
    Arc::new(QdTarget {
        base: format!("http://{}", server.addr),
        queue: EXTERNAL_QUEUE.to_string(),
        api,
        bearer: None,
    })
}

/// Notes the errors of a phase, if any.
pub fn note_errors(report: &mut Report, what: String, outcome: &Outcome) {
    if outcome.errors > 0 {
        report.notes.push(format!(
            "{what}: {} errors, the first: {}",
            outcome.errors,
            outcome.first_error.as_deref().unwrap_or("?")
        ));
    }
    if outcome.timed_out {
        report
            .notes
            .push(format!("{what}: stopped at the time limit"));
    }
}

/// Enqueue only, drain, then end to end, against one server; `server_cpu` reads
/// the CPU seconds the server has used so far.
pub async fn phases<T: Target>(
    mode: &'static str,
    name: &str,
    target: Arc<T>,
    server_cpu: &dyn Fn() -> f64,
    plan: &Plan,
    report: &mut Report,
) -> Result<()> {
    let enqueue = load::run(
        target.clone(),
        plan.clone(),
        Phase::Enqueue,
        Default::default(),
    )
    .await?;
    note_errors(report, format!("{mode} {name} enqueue"), &enqueue);
    if enqueue.enqueued == 0 {
        bail!("{name} accepted no job");
    }
    report.add(mode, name, "enqueue only", "jobs/s", enqueue.enqueue_rate());
    let drain = load::run(
        target.clone(),
        plan.clone(),
        Phase::Drain,
        Default::default(),
    )
    .await?;
    note_errors(report, format!("{mode} {name} drain"), &drain);
    report.add(mode, name, "drain", "jobs/s", drain.done_rate());
    let (server0, client0) = (server_cpu(), probe::own_cpu_secs().unwrap_or(0.0));
    let mixed = load::run(target, plan.clone(), Phase::Mixed, Default::default()).await?;
    let (server1, client1) = (server_cpu(), probe::own_cpu_secs().unwrap_or(0.0));
    note_errors(report, format!("{mode} {name} end to end"), &mixed);
    report.add(mode, name, "end to end", "jobs/s", mixed.done_rate());
    if mixed.done > 0 {
        let per_job = |secs: f64| secs * 1e6 / mixed.done as f64;
        report.add(
            mode,
            name,
            "server CPU",
            "µs/job",
            per_job(server1 - server0),
        );
        report.add(
            mode,
            name,
            "client CPU",
            "µs/job",
            per_job(client1 - client0),
        );
    }
    Ok(())
}

/// The `single` mode: qd, then each beanstalkd when it is installed.
pub async fn single(s: &Settings, report: &mut Report) -> Result<()> {
    let plan = Plan {
        batch: 1,
        rate: 0.0,
        ..s.plan.clone()
    };
    let (qd, _scripts) = s.start_qd_for_http().await?;
    phases(
        "single",
        SERVERS[0],
        qd_target(&qd, Api::Single),
        &|| qd.cpu_secs(),
        &plan,
        report,
    )
    .await?;
    qd.stop().await;
    for (fsync, name) in BEANSTALKDS {
        let Some(bs) = servers::start_beanstalkd(fsync).await? else {
            return Ok(());
        };
        let target = Arc::new(BeanstalkTarget { addr: bs.addr });
        phases("single", name, target, &|| bs.cpu_secs(), &plan, report).await?;
        bs.stop().await;
    }
    Ok(())
}

/// Jobs per enqueue request and per lease in the batch mode.
pub const BATCH: usize = 100;

/// The `batch` mode: qd's batch endpoints.
pub async fn batch(s: &Settings, report: &mut Report) -> Result<()> {
    let plan = Plan {
        batch: BATCH,
        rate: 0.0,
        ..s.plan.clone()
    };
    let (qd, _scripts) = s.start_qd_for_http().await?;
    let outcome = phases(
        "batch",
        SERVERS[0],
        qd_target(&qd, Api::Batch),
        &|| qd.cpu_secs(),
        &plan,
        report,
    )
    .await;
    qd.stop().await;
    outcome.context("batch mode (POST /v1/queues/{queue}/jobs/batch, POST /v1/acks)")?;
    report.notes.push(format!(
        "batch: enqueues of {BATCH} jobs, leases of {BATCH}, one ack request per lease; \
         beanstalkd has no batch commands, compare with its single rows"
    ));
    Ok(())
}

/// One paced end-to-end phase against one server.
async fn paced_run<T: Target>(
    name: &str,
    target: Arc<T>,
    plan: &Plan,
    report: &mut Report,
) -> Result<()> {
    let outcome = load::run(target, plan.clone(), Phase::Mixed, Default::default()).await?;
    note_errors(report, format!("paced {name}"), &outcome);
    let ms = |us: u64| us as f64 / 1000.0;
    report.add("paced", name, "done", "jobs/s", outcome.done_rate());
    let rows = [
        ("enqueue→accepted p50", outcome.to_accept.p50),
        ("enqueue→accepted p99", outcome.to_accept.p99),
        ("lease round trip p50", outcome.lease_rtt.p50),
        ("lease round trip p99", outcome.lease_rtt.p99),
        ("ack round trip p50", outcome.ack_rtt.p50),
        ("ack round trip p99", outcome.ack_rtt.p99),
        ("enqueue→lease p50", outcome.to_lease.p50),
        ("enqueue→lease p99", outcome.to_lease.p99),
        ("enqueue→lease max", outcome.to_lease.max),
        ("enqueue→ack p50", outcome.to_ack.p50),
        ("enqueue→ack p99", outcome.to_ack.p99),
        ("enqueue→ack max", outcome.to_ack.max),
    ];
    for (metric, us) in rows {
        report.add("paced", name, metric, "ms", ms(us));
    }
    if outcome.done < plan.jobs {
        report.notes.push(format!(
            "paced {name}: fell behind, {} of {} jobs done in time",
            outcome.done, plan.jobs
        ));
    }
    Ok(())
}

/// The `paced` mode: `rate` jobs/s for `duration`, request/reply.
pub async fn paced(s: &Settings, report: &mut Report) -> Result<()> {
    let plan = s.steady_plan();
    let (qd, _scripts) = s.start_qd_for_http().await?;
    paced_run(SERVERS[0], qd_target(&qd, Api::Single), &plan, report).await?;
    qd.stop().await;
    for (fsync, name) in BEANSTALKDS {
        let Some(bs) = servers::start_beanstalkd(fsync).await? else {
            return Ok(());
        };
        paced_run(
            name,
            Arc::new(BeanstalkTarget { addr: bs.addr }),
            &plan,
            report,
        )
        .await?;
        bs.stop().await;
    }
    report.notes.push(format!(
        "paced: {} jobs/s for {:?}, P={} C={}, 1 job per lease; latencies include the enqueue round trip",
        s.rate, s.duration, plan.producers, plan.consumers
    ));
    Ok(())
}

/// The `executor` mode: `exec_jobs` command jobs through qd's pool of `workers`,
/// then the same script run as many times by `xargs -P workers`. A job counts as
/// done when its script has appended its line to a shared file.
pub async fn executor(s: &Settings, report: &mut Report) -> Result<()> {
    let scripts = Scratch::new("exec")?;
    let done_file = scripts.0.join("done");
    let script = scripts.script(
        "job.sh",
        &format!("cat >/dev/null\necho x >> '{}'", done_file.display()),
    )?;
    let limit = s.plan.max_time;
    let qd = s.start_qd(&script, None).await?;
    let plan = Plan {
        jobs: s.exec_jobs,
        batch: 1,
        rate: 0.0,
        ..s.plan.clone()
    };
    let target = Arc::new(QdTarget {
        base: format!("http://{}", qd.addr),
        queue: COMMAND_QUEUE.to_string(),
        api: Api::Single,
        bearer: None,
    });
    let start = Instant::now();
    let enqueued = load::run(target, plan.clone(), Phase::Enqueue, Default::default()).await?;
    note_errors(report, "executor qd enqueue".into(), &enqueued);
    let secs = wait_lines(&done_file, 0, enqueued.enqueued, start, limit).await;
    qd.stop().await;
    let workers = s.workers;
    report.add(
        "executor",
        SERVERS[0],
        "command jobs",
        "jobs/s",
        secs.rate(enqueued.enqueued),
    );
    let before = line_count(&done_file);
    let start = Instant::now();
    let xargs = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "seq {n} | xargs -P {workers} -n 1 '{script}'",
            n = s.exec_jobs,
            script = script.display()
        ))
        .status()
        .context("run xargs")?;
    if !xargs.success() {
        bail!("xargs -P {workers} exited with {xargs}");
    }
    let secs = wait_lines(&done_file, before, s.exec_jobs, start, limit).await;
    report.add(
        "executor",
        &format!("xargs -P {workers}"),
        "command jobs",
        "jobs/s",
        secs.rate(s.exec_jobs),
    );
    report.notes.push(format!(
        "executor: {} jobs of `cat >/dev/null; echo x >> FILE`, {workers} workers",
        s.exec_jobs
    ));
    Ok(())
}

/// Seconds until a count was reached, or `None` when it was not in time.
pub struct Took(pub Option<f64>);

impl Took {
    /// `jobs` per second; 0 when they were not done in time.
    pub fn rate(&self, jobs: u64) -> f64 {
        self.0.map_or(0.0, |secs| jobs as f64 / secs)
    }
}

/// Lines ("x\n") in the done file at `path` of the command jobs.
pub fn line_count(path: &std::path::Path) -> u64 {
    probe::file_bytes(path) / 2
}

/// Waits until `path` holds `before + n` lines ("x\n" each), at most `limit`.
pub async fn wait_lines(
    path: &std::path::Path,
    before: u64,
    n: u64,
    start: Instant,
    limit: Duration,
) -> Took {
    while start.elapsed() < limit {
        if line_count(path) >= before + n {
            return Took(Some(start.elapsed().as_secs_f64()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Took(None)
}

/// The `soak` mode: qd at `rate` jobs/s for `duration`, end to end, sampling the
/// store, its WAL and qd's RSS every `sample_every`.
pub async fn soak(s: &Settings, report: &mut Report) -> Result<()> {
    let plan = s.steady_plan();
    let (qd, _scripts) = s.start_qd_for_http().await?;
    let progress = Arc::new(Progress::default());
    let mut run = tokio::spawn(load::run(
        qd_target(&qd, Api::Single),
        plan.clone(),
        Phase::Mixed,
        progress.clone(),
    ));
    let data = qd.dir.0.join("data");
    let start = Instant::now();
    let sample = || SoakSample {
        at_secs: start.elapsed().as_secs_f64(),
        done: progress.done.load(Ordering::Relaxed),
        store_bytes: probe::file_bytes(&data.join("qd.db")),
        wal_bytes: probe::file_bytes(&data.join("qd.db-wal")),
        rss_bytes: probe::rss_bytes(qd.pid).unwrap_or(0),
    };
    report.soak.push(sample());
    let mut next = start + s.sample_every;
    let outcome = loop {
        tokio::select! {
            finished = &mut run => break finished??,
            () = tokio::time::sleep_until(next.into()) => {
                next += s.sample_every;
                report.soak.push(sample());
            }
        }
    };
    report.soak.push(sample());
    qd.stop().await;
    note_errors(report, "soak qd".into(), &outcome);
    report.add("soak", SERVERS[0], "done", "jobs/s", outcome.done_rate());
    report.notes.push(format!(
        "soak: {} jobs/s for {:?}, retention {RETENTION}, sampled every {:?}",
        s.rate, s.duration, s.sample_every
    ));
    Ok(())
}
