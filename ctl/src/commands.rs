//! Runs one parsed command: validates what can be checked locally, talks to qd,
//! and returns the answer both as a protocol [`Response`] (for `--json`) and as
//! human text. Bulk DLQ operations are resolved to ids with a dry run first, then
//! sent in batches paced by `--rate`, so a redrive cannot become a retry storm.

use std::io::{IsTerminal, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use qd_proto::{DlqSelection, Payload, PurgeResult, RedriveResult, Refusal, Request, Response};

use crate::cli::{
    BackupArgs, Command, DlqCmd, DlqTarget, EnqueueArgs, JobsCmd, LimitsCmd, QueueCmd,
    SchedulesCmd, WorkersCmd,
};
use crate::client::{CliError, Client};
use crate::format::now_ms;
use crate::render;

/// What a command produced.
pub struct Output {
    /// The answer, printed as JSON with `--json`.
    pub response: Response,
    /// The human rendering.
    pub text: String,
    /// True when the daemon refused part of the request (exit 1).
    pub refused: bool,
}

impl Output {
    fn new(response: Response, text: String) -> Self {
        Output {
            response,
            text,
            refused: false,
        }
    }
}

/// Runs `cmd`, connecting with `connect` only once local checks have passed.
/// `Command::Completions` is handled by the caller.
pub fn run(
    cmd: Command,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<Output, CliError> {
    match cmd {
        Command::Dlq(DlqCmd::Redrive {
            target,
            payload_file: Some(file),
            ..
        }) => dlq_redrive_with_payload(&target, &file, connect),
        Command::Dlq(DlqCmd::Redrive { target, rate, .. }) => dlq_redrive(&target, rate, connect),
        Command::Dlq(DlqCmd::Purge {
            target,
            yes,
            cascade,
            release,
        }) => dlq_purge(&target, yes, (cascade, release), connect),
        Command::Enqueue(args) => {
            let req = enqueue_request(args)?;
            simple(&mut connect()?, req)
        }
        Command::Backup(args) => {
            let req = backup_request(args)?;
            simple(&mut connect()?, req)
        }
        Command::Completions { .. }
        | Command::Top { .. }
        | Command::Jobs(JobsCmd::Payload { .. })
        | Command::Jobs(JobsCmd::Result { .. })
        | Command::Dlq(DlqCmd::Export { .. }) => Err(CliError::Usage(
            "this command writes its own output; run it through main".into(),
        )),
        Command::Workers(WorkersCmd::Set { min, max, .. }) if min > max => Err(CliError::Usage(
            format!("--min {min} is more than --max {max}; need min <= max"),
        )),
        other => simple(&mut connect()?, request_for(other)),
    }
}

/// The one request of a single-round-trip command.
fn request_for(cmd: Command) -> Request {
    match cmd {
        Command::Status => Request::Status {},
        Command::Queues => Request::Queues {},
        Command::Jobs(JobsCmd::List {
            queue,
            tenant,
            state,
            limit,
            after,
        }) => Request::JobsList {
            queue,
            tenant,
            state,
            error_contains: None,
            since_secs: None,
            limit: Some(limit),
            after,
        },
        Command::Jobs(JobsCmd::Show { id }) => Request::JobsShow { id },
        Command::Jobs(JobsCmd::Cancel {
            id,
            keep_dependents,
        }) => Request::JobsCancel {
            id,
            keep_dependents,
        },
        Command::Jobs(JobsCmd::Release { id }) => Request::JobsRelease { id },
        Command::Jobs(JobsCmd::Tree {
            id,
            parents,
            depth,
            limit,
        }) => Request::JobsTree {
            id,
            parents,
            max_depth: Some(depth),
            max_nodes: Some(limit),
        },
        Command::Dlq(DlqCmd::List {
            filter,
            limit,
            after,
        }) => Request::DlqList {
            selection: filter.selection(),
            limit: Some(limit),
            after,
        },
        Command::Dlq(DlqCmd::Show { id }) => Request::DlqShow { id },
        Command::Limits(LimitsCmd::Show) => Request::LimitsShow {},
        Command::Limits(LimitsCmd::Set {
            tenant,
            weight,
            max_concurrency,
            max_depth,
        }) => Request::LimitsSet {
            tenant,
            weight,
            max_concurrency,
            max_depth,
        },
        Command::Limits(LimitsCmd::Reset {
            tenant,
            queue,
            limiter,
        }) => Request::LimitsReset {
            tenant,
            queue,
            limiter,
        },
        Command::Limits(LimitsCmd::SetLimiter {
            limiter,
            per_second,
            burst,
        }) => Request::LimiterSet {
            limiter,
            per_second,
            burst,
        },
        Command::Workers(WorkersCmd::Set { queue, min, max }) => {
            Request::WorkersSet { queue, min, max }
        }
        Command::Queue(QueueCmd::Pause { queue }) => Request::QueuePause { queue },
        Command::Queue(QueueCmd::Resume { queue }) => Request::QueueResume { queue },
        Command::Reload => Request::Reload {},
        Command::Schedules(SchedulesCmd::List) => Request::SchedulesList {},
        Command::Schedules(SchedulesCmd::Pause { name }) => Request::SchedulesPause { name },
        Command::Schedules(SchedulesCmd::Resume { name }) => Request::SchedulesResume { name },
        Command::Schedules(SchedulesCmd::Trigger { name }) => Request::SchedulesTrigger { name },
        Command::Enqueue(_)
        | Command::Completions { .. }
        | Command::Top { .. }
        | Command::Jobs(JobsCmd::Payload { .. })
        | Command::Jobs(JobsCmd::Result { .. })
        | Command::Dlq(_)
        | Command::Backup(_) => {
            unreachable!("invariant: handled in run()")
        }
    }
}

fn simple(client: &mut Client, req: Request) -> Result<Output, CliError> {
    let is_dlq = matches!(req, Request::DlqList { .. });
    let confirmation = render::confirmation(&req);
    let resp = client.call(req)?;
    if let Some(line) = confirmation {
        return Ok(Output::new(resp, line));
    }
    let text = match &resp {
        Response::Status(s) => render::status(s),
        Response::Queues { queues } => render::queues(queues),
        Response::Jobs { jobs, next_after } if is_dlq => {
            render::dead_jobs(jobs, now_ms()) + &render::next_page(next_after.as_deref())
        }
        Response::Jobs { jobs, next_after } => {
            render::jobs(jobs, now_ms()) + &render::next_page(next_after.as_deref())
        }
        Response::Job(d) => render::job(d, now_ms()),
        Response::Cancelled {
            id,
            previous_state,
            dependents,
        } => {
            let mut out = format!("cancelled {id} (was {previous_state})\n");
            for d in dependents {
                out.push_str(&format!("cancelled {d} (a dependent of {id})\n"));
            }
            out
        }
        Response::Enqueued(e) => {
            if e.duplicate {
                eprintln!(
                    "qctl: duplicate: the idempotency key matched job {}; nothing enqueued",
                    e.id
                );
            }
            format!("{}\n", e.id)
        }
        Response::Released {
            id,
            previous_state,
            state,
            parents,
        } => format!(
            "released {id} (was {previous_state}, now {state}): edges from {} count as met\n",
            parents.join(", ")
        ),
        Response::Tree(t) => render::tree(t),
        Response::Redrive(r) => render::redrive(r),
        Response::Purge(p) => render::purge(p),
        Response::Limits(l) => render::limits(l),
        Response::Backup(b) => render::backup(b),
        Response::Reloaded(r) => render::reloaded(r),
        Response::Schedules { schedules } => render::schedules(schedules),
        other @ (Response::Payload(_)
        | Response::JobResult(_)
        | Response::Export { .. }
        | Response::Top(_)
        | Response::EnqueuedBatch { .. }) => {
            return Err(unexpected(other, "single-answer"));
        }
    };
    Ok(Output::new(resp, text))
}

/// `backup PATH`: the daemon has its own working directory, so send it an absolute path.
fn backup_request(args: BackupArgs) -> Result<Request, CliError> {
    let path = std::path::absolute(&args.path)
        .map_err(|e| CliError::Usage(format!("cannot resolve {}: {e}", args.path.display())))?;
    Ok(Request::Backup {
        path: path.display().to_string(),
        force: args.force,
    })
}

fn enqueue_request(args: EnqueueArgs) -> Result<Request, CliError> {
    let payload = match args.payload {
        Some(text) => text.into_bytes(),
        None => read_stdin(args.allow_empty)?,
    };
    let delay_ms = args
        .delay
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(Request::Enqueue {
        queue: args.queue,
        tenant: args.tenant,
        key: args.key,
        delay_ms,
        max_attempts: args.max_attempts,
        priority: args.priority,
        payload: qd_proto::Payload::from_bytes(payload),
        after: args.after,
        after_policy: args.after_policy,
    })
}

/// The payload piped on stdin. An empty stdin (`< /dev/null`, a producer that
/// printed nothing) is refused unless `allow_empty`: an empty job is rarely meant.
fn read_stdin(allow_empty: bool) -> Result<Vec<u8>, CliError> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(CliError::Usage(
            "no payload: pipe it on stdin or pass --payload TEXT".into(),
        ));
    }
    let mut buf = Vec::new();
    stdin
        .read_to_end(&mut buf)
        .map_err(|e| CliError::Usage(format!("cannot read the payload from stdin: {e}")))?;
    if buf.is_empty() && !allow_empty {
        return Err(CliError::Usage(
            "stdin is empty: nothing to enqueue (pass --allow-empty to enqueue an empty payload)"
                .into(),
        ));
    }
    Ok(buf)
}

/// The selection of a redrive or purge; an empty one, or an empty `--error` (it
/// would match every dead job, as `--error "$UNSET"` does), is a usage error naming
/// the flags (clap already refuses ids mixed with filters).
fn checked_selection(target: &DlqTarget) -> Result<DlqSelection, CliError> {
    let selection = target.selection();
    if selection.check_mutation().is_err() {
        let problem = if selection.error_contains.as_deref() == Some("") {
            "--error is empty, which matches every dead job; give the text to look for, or leave --error out (--all for every dead job)"
        } else {
            "say which dead jobs: job ids, a filter (--queue, --tenant, --error, --since), or --all for every dead job"
        };
        return Err(CliError::Usage(problem.into()));
    }
    Ok(selection)
}

fn dlq_redrive(
    target: &DlqTarget,
    rate: Option<f64>,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<Output, CliError> {
    let selection = checked_selection(target)?;
    let mut client = connect()?;
    let mut call = |selection: DlqSelection, dry_run: bool, batch_size: Option<u32>| {
        let req = Request::DlqRedrive {
            selection,
            dry_run,
            batch_size,
            rate_per_sec: None,
            payload: None,
        };
        match client.call(req)? {
            Response::Redrive(r) => Ok(r),
            other => Err(unexpected(&other, "dlq_redrive")),
        }
    };
    let plan = call(selection, true, None)?;
    let result = if target.dry_run {
        plan
    } else {
        let done = in_batches(&plan.ids, batch_len(target.batch, rate), rate, |ids| {
            let n = u32::try_from(ids.len()).ok();
            call(DlqSelection::of_ids(ids), false, n).map(|r| (r.moved, r.ids, r.refused))
        })
        .map_err(|(e, moved)| stopped(e, "moving", moved, plan.matched))?;
        RedriveResult {
            matched: plan.matched,
            moved: done.count,
            ids: done.ids,
            refused: [plan.refused, done.refused].concat(),
            dry_run: false,
        }
    };
    let text = render::redrive(&result);
    Ok(Output {
        refused: !result.refused.is_empty(),
        response: Response::Redrive(result),
        text,
    })
}

/// `dlq redrive ID --payload-file FILE`: one dead job back to ready with FILE's bytes.
fn dlq_redrive_with_payload(
    target: &DlqTarget,
    file: &Path,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<Output, CliError> {
    let [id] = target.ids.as_slice() else {
        return Err(CliError::Usage(
            "--payload-file replaces the payload of exactly one dead job: name one job id".into(),
        ));
    };
    let bytes = std::fs::read(file)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", file.display())))?;
    let req = Request::DlqRedrive {
        selection: DlqSelection::of_ids(vec![id.clone()]),
        dry_run: false,
        batch_size: None,
        rate_per_sec: None,
        payload: Some(Payload::from_bytes(bytes)),
    };
    match connect()?.call(req)? {
        Response::Redrive(result) => Ok(Output {
            text: render::redrive(&result),
            refused: !result.refused.is_empty(),
            response: Response::Redrive(result),
        }),
        other => Err(unexpected(&other, "dlq_redrive")),
    }
}

fn dlq_purge(
    target: &DlqTarget,
    yes: bool,
    (cascade, release): (bool, bool),
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<Output, CliError> {
    let selection = checked_selection(target)?;
    if !yes && !target.dry_run {
        return Err(CliError::Usage(
            "purge deletes dead jobs for good: add --yes to confirm, or --dry-run to see what would go".into(),
        ));
    }
    let mut client = connect()?;
    let mut call =
        |selection: DlqSelection, dry_run: bool| match client.call(Request::DlqPurge {
            selection,
            dry_run,
            cascade,
            release,
        })? {
            Response::Purge(p) => Ok(p),
            other => Err(unexpected(&other, "dlq_purge")),
        };
    let plan = call(selection, true)?;
    let result = if target.dry_run {
        plan
    } else {
        // Dependents cancelled or released by each batch, gathered across batches.
        let mut cancelled = Vec::new();
        let mut released = Vec::new();
        let done = in_batches(&plan.ids, batch_len(target.batch, None), None, |ids| {
            call(DlqSelection::of_ids(ids), false).map(|p| {
                cancelled.extend(p.cancelled);
                released.extend(p.released);
                (p.purged, p.ids, p.refused)
            })
        })
        .map_err(|(e, purged)| stopped(e, "purging", purged, plan.matched))?;
        PurgeResult {
            matched: plan.matched,
            purged: done.count,
            ids: done.ids,
            refused: [plan.refused, done.refused].concat(),
            dry_run: false,
            cancelled,
            released,
        }
    };
    let text = render::purge(&result);
    Ok(Output {
        refused: !result.refused.is_empty(),
        response: Response::Purge(result),
        text,
    })
}

/// The error for an answer of the wrong kind to `op`.
pub fn unexpected(resp: &Response, op: &str) -> CliError {
    CliError::Protocol(format!("qd answered {:?} to a {op} request", resp.kind()))
}

/// Reports how far a bulk operation got before `err` stopped it.
fn stopped(err: CliError, verb: &str, done: u64, matched: u64) -> CliError {
    eprintln!("qctl: stopped {verb} after {done} of {matched}");
    err
}

/// Totals over all batches.
#[derive(Debug, Default, PartialEq)]
struct Totals {
    count: u64,
    ids: Vec<String>,
    refused: Vec<Refusal>,
}

/// Ids per request: `--batch`, but never more than one second's worth at `rate`.
fn batch_len(batch: u32, rate: Option<f64>) -> usize {
    let batch = usize::try_from(batch).unwrap_or(usize::MAX).max(1);
    match rate {
        Some(r) => batch.min((r.ceil() as usize).max(1)),
        None => batch,
    }
}

/// How long to wait before sending ids from index `sent` on, so that no more than
/// `rate` ids per second go out on average since the start (`elapsed` ago).
fn pace_wait(sent: usize, rate: Option<f64>, elapsed: Duration) -> Duration {
    let Some(rate) = rate else {
        return Duration::ZERO;
    };
    Duration::from_secs_f64(sent as f64 / rate).saturating_sub(elapsed)
}

/// Sends `ids` in chunks of `batch`, paced by `rate`, summing the answers. On error,
/// returns it with the count done so far.
fn in_batches(
    ids: &[String],
    batch: usize,
    rate: Option<f64>,
    mut send: impl FnMut(Vec<String>) -> Result<(u64, Vec<String>, Vec<Refusal>), CliError>,
) -> Result<Totals, (CliError, u64)> {
    let start = Instant::now();
    let mut totals = Totals::default();
    for (i, chunk) in ids.chunks(batch).enumerate() {
        std::thread::sleep(pace_wait(i * batch, rate, start.elapsed()));
        let (count, done, refused) = send(chunk.to_vec()).map_err(|e| (e, totals.count))?;
        totals.count += count;
        totals.ids.extend(done);
        totals.refused.extend(refused);
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qd_proto::{ErrorBody, ErrorCode};

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("j{i}")).collect()
    }

    #[test]
    fn batches_cover_every_id_once_and_sum_the_answers() {
        let mut seen = Vec::new();
        let totals = in_batches(&ids(250), 100, None, |chunk| {
            seen.push(chunk.len());
            Ok((chunk.len() as u64, chunk, vec![]))
        })
        .expect("ok");
        assert_eq!(seen, vec![100, 100, 50]);
        assert_eq!(totals.count, 250);
        assert_eq!(totals.ids, ids(250));
    }

    #[test]
    fn a_failed_batch_reports_how_many_were_done_before_it() {
        let mut calls = 0;
        let err = in_batches(&ids(30), 10, None, |chunk| {
            calls += 1;
            if calls == 3 {
                return Err(CliError::Daemon(ErrorBody::new(
                    ErrorCode::Unavailable,
                    "shutting down",
                )));
            }
            Ok((chunk.len() as u64, chunk, vec![]))
        })
        .expect_err("third batch fails");
        assert_eq!(err.1, 20);
    }

    #[test]
    fn pacing_keeps_the_average_under_the_rate() {
        assert_eq!(pace_wait(0, Some(10.0), Duration::ZERO), Duration::ZERO);
        assert_eq!(
            pace_wait(100, Some(20.0), Duration::from_secs(1)),
            Duration::from_secs(4)
        );
        assert_eq!(
            pace_wait(100, Some(20.0), Duration::from_secs(9)),
            Duration::ZERO
        );
        assert_eq!(pace_wait(100, None, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_low_rate_shrinks_the_batch_to_one_seconds_worth() {
        assert_eq!(batch_len(100, None), 100);
        assert_eq!(batch_len(100, Some(20.0)), 20);
        assert_eq!(batch_len(100, Some(0.5)), 1);
        assert_eq!(batch_len(10, Some(500.0)), 10);
    }

    #[test]
    fn purge_without_yes_is_refused_before_connecting() {
        let target = DlqTarget {
            ids: vec![],
            filter: crate::cli::DlqFilter {
                queue: None,
                tenant: None,
                error: None,
                since: None,
            },
            all: true,
            dry_run: false,
            batch: 100,
        };
        let err = dlq_purge(&target, false, (false, false), || {
            panic!("must not connect")
        })
        .err()
        .expect("refused");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--yes"));
    }

    #[test]
    fn an_empty_redrive_selection_is_a_usage_error() {
        let target = DlqTarget {
            ids: vec![],
            filter: crate::cli::DlqFilter {
                queue: None,
                tenant: None,
                error: None,
                since: None,
            },
            all: false,
            dry_run: true,
            batch: 100,
        };
        let err = dlq_redrive(&target, None, || panic!("must not connect"))
            .err()
            .expect("refused");
        assert_eq!(err.exit_code(), 2);
    }
}
