//! The `qctl` command line (clap derive): every command, its flags and its help.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use qd_proto::{DlqSelection, JOB_STATES};

use crate::format::parse_rate;

const AFTER_HELP: &str = "\
The socket is --socket, else $QD_SOCKET, else [daemon] admin_socket from --config FILE,
else /run/qd/qctl.sock. Exit codes: 0 ok, 1 the daemon refused or failed (or is
unreachable), 2 usage error.

Examples:
  qctl queues
  qctl dlq list --queue email --since 1h
  qctl dlq redrive --queue email --error timeout --rate 20/s --dry-run
  echo '{\"to\":\"a@b.c\"}' | qctl enqueue email --tenant acme --key order-17
  qctl enqueue email --ndjson jobs.ndjson   # one {\"payload\": ...} per line";

/// Administer a running qd daemon over its admin Unix socket.
#[derive(Debug, Parser)]
#[command(name = "qctl", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Admin socket path (overrides QD_SOCKET and --config).
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// qd config file to read [daemon] admin_socket from.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the daemon's answer as JSON (stable field names) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Give up on an answer after this long (e.g. 30s, 2m).
    #[arg(long, global = true, value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    pub timeout: Duration,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Daemon version, uptime, store path and size, and each actor's restart count.
    Status,
    /// Per queue: ready, delayed, leased and dead counts, oldest ready age, workers, paused.
    Queues,
    /// List, show or cancel jobs.
    #[command(subcommand)]
    Jobs(JobsCmd),
    /// Enqueue one job (the payload comes from --payload or stdin), or many with
    /// --ndjson FILE. Prints the job id (one per job).
    Enqueue(EnqueueArgs),
    /// Inspect, redrive or purge the dead-letter queue.
    #[command(subcommand)]
    Dlq(DlqCmd),
    /// Show or change tenant limits (runtime overrides are stored until reset).
    #[command(subcommand)]
    Limits(LimitsCmd),
    /// Change a queue's worker pool bounds.
    #[command(subcommand)]
    Workers(WorkersCmd),
    /// Pause or resume leasing from a queue.
    #[command(subcommand)]
    Queue(QueueCmd),
    /// List, pause, resume or trigger the schedules (periodic jobs) of the config.
    #[command(subcommand)]
    Schedules(SchedulesCmd),
    /// Write a consistent snapshot of the store to PATH while qd keeps serving, and
    /// print its size and job counts. The daemon writes the file (as its own user).
    Backup(BackupArgs),
    /// Re-read the config file and apply it live, as SIGHUP does; prints what changed,
    /// or every problem (exit 1) with nothing changed.
    Reload,
    /// Live full-screen view: per queue depths, oldest ready age, completed and failed
    /// per second, workers, DLQ; per tenant for the selected queue. Up/Down select a
    /// queue, q quits. Needs a terminal.
    Top {
        /// Refresh every this long.
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_positive_duration)]
        interval: Duration,
    },
    /// Print a shell completion script (e.g. `qctl completions bash > /etc/bash_completion.d/qctl`).
    Completions {
        /// Target shell.
        shell: clap_complete::Shell,
    },
}

/// `qctl backup ...`
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The snapshot file to write (made absolute against the current directory).
    pub path: PathBuf,
    /// Replace an existing file (never the running daemon's own store, WAL, lock or
    /// admin socket).
    #[arg(long)]
    pub force: bool,
}

/// `qctl jobs ...`
#[derive(Debug, Subcommand)]
pub enum JobsCmd {
    /// Jobs matching every given filter, newest first.
    List {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this state.
        #[arg(long, value_parser = JOB_STATES)]
        state: Option<String>,
        /// At most this many jobs.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Start after this job id: the cursor the previous page printed.
        #[arg(long, value_name = "ID")]
        after: Option<String>,
    },
    /// One job: payload preview and every attempt.
    Show {
        /// Job id.
        id: String,
    },
    /// Cancel a ready, delayed, leased (running: its attempt is stopped, not charged)
    /// or dead job. A succeeded or cancelled job is refused, naming its state.
    Cancel {
        /// Job id.
        id: String,
        /// Leave its unfinished dependents (jobs enqueued with --after it) blocked
        /// instead of cancelling them too.
        #[arg(long)]
        keep_dependents: bool,
    },
    /// Count a blocked job's broken edges (to dead or cancelled parents) as met:
    /// it then waits only for its other parents, or runs. Audited, and written in
    /// the job's history. A job that is not blocked is refused (exit 1).
    Release {
        /// Job id.
        id: String,
    },
    /// A job's dependency tree: the jobs that run after it (its dependents, down),
    /// or with --parents the jobs it runs after (up). Each line shows the edge
    /// (open, met or broken) and the job's state; a job reached twice is marked
    /// and not expanded again. Bounded by --depth and --limit; a cut is marked.
    Tree {
        /// Job id.
        id: String,
        /// Walk up to the parents instead of down to the dependents.
        #[arg(long)]
        parents: bool,
        /// Levels below the job to show, 1 to 100.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=i64::from(qd_proto::MAX_TREE_DEPTH)))]
        depth: u32,
        /// Jobs to show at most, the root included, 1 to 10,000.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=i64::from(qd_proto::MAX_TREE_NODES)))]
        limit: u32,
    },
    /// The exact bytes of a job's payload, to stdout or a file (with --json: base64
    /// in a JSON object).
    Payload {
        /// Job id.
        id: String,
        /// Write the payload to FILE instead of stdout.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// The exact bytes of a job's result (what its successful attempt handed
    /// back), to stdout or a file created with mode 0600 (with --json: base64 in a
    /// JSON object). A job without a result exits 1, naming its state.
    Result {
        /// Job id.
        id: String,
        /// Write the result to FILE (mode 0600) instead of stdout.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

/// `qctl enqueue ...`
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Target queue.
    pub queue: String,
    /// Tenant (the daemon uses "default" when absent).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Idempotency key: a repeat with the same key returns the first job's id.
    #[arg(long)]
    pub key: Option<String>,
    /// Delay before the job becomes ready (e.g. 10s, 5m).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub delay: Option<Duration>,
    /// Retry budget for this job, 1 to 1000 (default: the queue's max_attempts).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_attempts: Option<u32>,
    /// Rank the job among its tenant's jobs as if it had become ready this much
    /// earlier (e.g. 10m; negative like -5m ranks it later; -1d to 1d).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub priority: Option<String>,
    /// Payload text; without it the payload is read from stdin.
    #[arg(long)]
    pub payload: Option<String>,
    /// Accept an empty stdin as an empty payload (refused otherwise, since it is
    /// usually a forgotten pipe).
    #[arg(long)]
    pub allow_empty: bool,
    /// Run only after these jobs (1 to 1,000 ids); the job waits until they reach
    /// a final state as --after-policy says.
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub after: Vec<String>,
    /// When a parent counts as done: "succeeded" (default; a dead or cancelled
    /// parent blocks the job) or "finished" (any final state).
    #[arg(long, value_name = "POLICY", requires = "after")]
    pub after_policy: Option<String>,
    /// Enqueue many jobs from FILE ("-" for stdin): one JSON job object per line.
    ///
    /// Each line has the shape of the HTTP single enqueue body:
    /// {"payload": "text" | any JSON, or "payload_b64": "...", "tenant"?: "acme",
    /// "idempotency_key"?: "order-17", "delay"?: "10s" | seconds, "max_attempts"?: N,
    /// "priority"?: "10m"}.
    /// Blank lines are skipped; input with no job line at all (an empty file or
    /// stdin, usually a forgotten pipe) is refused (exit 2). Lines go in batches of up to 1,000 jobs, each batch
    /// all or nothing in one commit, in file order; one id is printed per job line
    /// (with --json, one {"line", "id", "duplicate"} object per line). A bad line
    /// or a refused batch stops qctl (exit 2 for a bad line, 1 for a refusal): the
    /// batches before stay accepted and the error says how many jobs were accepted
    /// and from which line to resume. Give jobs idempotency keys to make a rerun of
    /// the whole file harmless.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["tenant", "key", "delay", "max_attempts", "priority", "payload", "allow_empty", "after", "after_policy"])]
    pub ndjson: Option<PathBuf>,
}

/// Filters over dead jobs, shared by `dlq list`, `redrive` and `purge`.
#[derive(Debug, Args, Clone)]
pub struct DlqFilter {
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only jobs whose last error contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub error: Option<String>,
    /// Only jobs that died within this long (e.g. 1h, 30m).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
}

/// Ids or a filter selection, for `redrive` and `purge`.
#[derive(Debug, Args, Clone)]
pub struct DlqTarget {
    /// Job ids (instead of a filter).
    #[arg(value_name = "ID", conflicts_with_all = ["queue", "tenant", "error", "since", "all"])]
    pub ids: Vec<String>,
    /// The filter.
    #[command(flatten)]
    pub filter: DlqFilter,
    /// Every dead job (narrowed by any filter given).
    #[arg(long)]
    pub all: bool,
    /// List what would be affected and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Jobs per request, 1 to 10,000; each batch is atomic on the daemon.
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(qd_proto::MAX_REDRIVE_BATCH)))]
    pub batch: u32,
}

impl DlqFilter {
    /// The protocol selection for these filters.
    pub fn selection(&self) -> DlqSelection {
        DlqSelection {
            queue: self.queue.clone(),
            tenant: self.tenant.clone(),
            error_contains: self.error.clone(),
            since_secs: self.since.map(|d| d.as_secs()),
            ..DlqSelection::default()
        }
    }
}

impl DlqTarget {
    /// The protocol selection: ids, or filters plus `all`.
    pub fn selection(&self) -> DlqSelection {
        DlqSelection {
            ids: self.ids.clone(),
            all: self.all,
            ..self.filter.selection()
        }
    }
}

/// `qctl dlq ...`
#[derive(Debug, Subcommand)]
pub enum DlqCmd {
    /// Dead jobs, one per line: id, queue, tenant, attempts, died at, age, last error.
    List {
        /// Filters.
        #[command(flatten)]
        filter: DlqFilter,
        /// At most this many jobs.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Start after this job id: the cursor the previous page printed.
        #[arg(long, value_name = "ID")]
        after: Option<String>,
    },
    /// Every matching dead job as one JSON line: the summary fields, `payload_b64`,
    /// `payload_bytes`, `last_error` and the whole `history`. Most recently dead first.
    Export {
        /// Filters.
        #[command(flatten)]
        filter: DlqFilter,
        /// Write the lines to FILE instead of stdout.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// One dead job: payload and every attempt with its error.
    Show {
        /// Job id.
        id: String,
    },
    /// Move dead jobs back to ready with a fresh attempt budget, in paced batches.
    /// Prints exactly how many moved.
    Redrive {
        /// Which jobs.
        #[command(flatten)]
        target: DlqTarget,
        /// At most N jobs per second (e.g. 20/s), so a redrive cannot become a retry storm.
        #[arg(long, value_name = "N/s", value_parser = parse_rate)]
        rate: Option<f64>,
        /// Fix the data: replace the payload of the one dead job named by ID with
        /// FILE's bytes, in the same commit as its redrive (at most max_payload; the
        /// idempotency key stays). Exactly one ID; no filter, --all, --dry-run or --rate.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["queue", "tenant", "error", "since", "all", "dry_run", "rate"])]
        payload_file: Option<PathBuf>,
    },
    /// Delete dead jobs for good (requires --yes unless --dry-run). A dead job
    /// that blocks unfinished jobs (enqueued with --after it) is refused, naming
    /// them (exit 1), unless --cascade or --release.
    Purge {
        /// Which jobs.
        #[command(flatten)]
        target: DlqTarget,
        /// Confirm the deletion.
        #[arg(long)]
        yes: bool,
        /// Cancel the unfinished jobs that depend on each purged job, directly or
        /// not (each is named and audited), then purge it.
        #[arg(long, conflicts_with = "release")]
        cascade: bool,
        /// Count each purged job's edges to the jobs it blocks as met, in the
        /// purge's commit: they wait only for their other parents, or run.
        #[arg(long)]
        release: bool,
    },
}

/// `qctl limits ...`
#[derive(Debug, Subcommand)]
pub enum LimitsCmd {
    /// Per tenant: weight, max concurrency, max depth; per queue: workers and rate
    /// limiter; each with its source (config or override).
    Show,
    /// Override a tenant's limits at runtime (stored; survives restarts until reset).
    #[command(group(ArgGroup::new("change").required(true).multiple(true).args(["weight", "max_concurrency", "max_depth"])))]
    Set {
        /// Tenant.
        #[arg(long)]
        tenant: String,
        /// Scheduling weight (≥ 1).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        weight: Option<u32>,
        /// Jobs of this tenant leased at once per queue; 0 lifts the cap (unlimited).
        #[arg(long, value_name = "N")]
        max_concurrency: Option<u32>,
        /// Waiting jobs of this tenant per queue before enqueue is refused; 0 lifts
        /// the bound (unlimited).
        #[arg(long, value_name = "N")]
        max_depth: Option<u64>,
    },
    /// Drop every runtime override of a tenant, a queue or a rate limiter; config
    /// values apply again.
    #[command(group(ArgGroup::new("target").required(true).args(["tenant", "queue", "limiter"])))]
    Reset {
        /// Tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Queue (workers bounds and pause).
        #[arg(long)]
        queue: Option<String>,
        /// Shared rate limiter (`[rate_limiters.NAME]`).
        #[arg(long)]
        limiter: Option<String>,
    },
    /// Override a shared rate limiter's rate and burst at runtime (applies at once to
    /// every queue naming it; stored; survives restarts until reset).
    #[command(group(ArgGroup::new("change").required(true).multiple(true).args(["per_second", "burst"])))]
    SetLimiter {
        /// The `[rate_limiters.NAME]`.
        limiter: String,
        /// Sustained rate, jobs per second (≥ 1).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        per_second: Option<u32>,
        /// Jobs allowed at once after a quiet spell (≥ 1).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        burst: Option<u32>,
    },
}

/// `qctl workers ...`
#[derive(Debug, Subcommand)]
pub enum WorkersCmd {
    /// Override a queue's worker pool bounds at runtime.
    Set {
        /// Queue.
        queue: String,
        /// Fewest workers (0 to --max).
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1024))]
        min: u32,
        /// Most workers (1 to 1024).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        max: u32,
    },
}

/// `qctl queue ...`
#[derive(Debug, Subcommand)]
pub enum QueueCmd {
    /// Stop leasing from QUEUE (enqueue still works).
    Pause {
        /// Queue.
        queue: String,
    },
    /// Resume leasing from QUEUE.
    Resume {
        /// Queue.
        queue: String,
    },
}

/// `qctl schedules ...`
#[derive(Debug, Subcommand)]
pub enum SchedulesCmd {
    /// Every schedule: queue, spec, time zone, next and last fire, last job and
    /// its state, paused.
    List,
    /// Stop NAME from firing until it is resumed (stored: survives restarts and
    /// holds on every node of a cluster).
    Pause {
        /// Schedule.
        name: String,
    },
    /// Let NAME fire again, from its next tick after now (ticks that came while it
    /// was paused are not caught up).
    Resume {
        /// Schedule.
        name: String,
    },
    /// Enqueue one run of NAME now, keyed by the trigger time (also while paused);
    /// prints the job id.
    Trigger {
        /// Schedule.
        name: String,
    },
}

/// `--timeout`, `--interval`: a humantime duration greater than zero.
fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be greater than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("qctl").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_work_after_the_subcommand() {
        let cli = parse(&["queues", "--json", "--socket", "/tmp/x.sock"]).expect("parses");
        assert!(cli.json);
        assert_eq!(cli.socket, Some(PathBuf::from("/tmp/x.sock")));
    }

    #[test]
    fn redrive_parses_a_selection_with_rate_and_since() {
        let cli = parse(&[
            "dlq", "redrive", "--queue", "email", "--since", "1h", "--rate", "20/s",
        ])
        .expect("parses");
        let Command::Dlq(DlqCmd::Redrive { target, rate, .. }) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(rate, Some(20.0));
        let sel = target.selection();
        assert_eq!(sel.queue.as_deref(), Some("email"));
        assert_eq!(sel.since_secs, Some(3600));
        assert_eq!(target.batch, 100);
    }

    #[test]
    fn ids_and_filters_conflict() {
        let err = parse(&["dlq", "redrive", "a", "--queue", "email"]).expect_err("conflict");
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            &["jobs", "list", "--state", "sleeping"][..],
            &["enqueue", "q", "--delay", "soon"],
            &["dlq", "redrive", "--all", "--rate", "-3/s"],
            &["limits", "set", "--tenant", "acme"],
            &["limits", "reset"],
            &["dlq", "purge", "--all", "--batch", "0"],
            &["enqueue", "q", "--max-attempts", "0"],
            &["enqueue", "q", "--max-attempts", "1001"],
            &["workers", "set", "q", "--min", "1", "--max", "0"],
            &["workers", "set", "q", "--min", "1", "--max", "1025"],
        ] {
            let err = parse(args).expect_err("usage error");
            assert_eq!(err.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn a_zero_timeout_is_a_usage_error() {
        assert!(parse_positive_duration("0s").is_err());
        assert_eq!(parse_positive_duration("2s"), Ok(Duration::from_secs(2)));
    }
}
