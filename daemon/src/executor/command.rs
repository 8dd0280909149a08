//! The `command` executor: one child process per attempt.
//!
//! The program gets the payload on stdin (then EOF), the job's identity in `QD_JOB_ID`,
//! `QD_IDEMPOTENCY_KEY`, `QD_ATTEMPT`, `QD_QUEUE` and `QD_TENANT`, the attempt's
//! fencing value in `QD_LEASE_TOKEN`, and for a job a schedule enqueued
//! `QD_SCHEDULE` and `QD_SCHEDULE_TICK` (these win over the queue's `env`), and runs
//! in its own process group ([`group`]) so the whole tree is stopped together.
//!
//! In the daemon ([`use_watchdog`]) the group is led by the attempt [`watchdog`],
//! which stops the group when qd dies or freezes, and the group is recorded in
//! `data_dir` so the next start can stop what a crash left ([`crate::attempt_groups`]). Past `timeout`, or when an operator cancels the job, the group
//! gets SIGTERM, and SIGKILL `kill_grace` later. The exit status is classified by the queue's [`ExitCodes`] (sysexits.h
//! conventions: 75 transient, 64/65 permanent); the last [`OUTPUT_LIMIT`] bytes of
//! stderr go into the error text and those of stdout into the success detail. What
//! the child writes to the file named by `QD_RESULT_FILE` is the job's result
//! ([`super::result_file`]), read after it exited 0; its parents and their results
//! are in the file named by `QD_PARENTS_FILE` ([`super::parents_file`]).
//!
//! Pipes are drained concurrently with the wait, keeping only a bounded tail, so a
//! chatty child never blocks on a full pipe and a silent one never blocks our stdin
//! write past its exit.

mod group;
pub mod watchdog;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::group::ProcessGroup;
use super::parents_file::{self, ParentsFile};
use super::result_file::{self, ResultFile};
use super::{
    CommandSpec, ErrorClass, ExecResult, ExecutorError, ExitCodes, JobRun, OUTPUT_LIMIT,
    output_text, with_output,
};
use crate::attempt_groups::{self, Record};
use crate::job::Failure;

/// Shortest silence of qd after which a watchdog takes it for frozen: a busy host
/// must not stop attempts for a hiccup.
const MIN_STALL: Duration = Duration::from_secs(5);

/// How command attempts are started in this process: through the watchdog, and
/// where their groups are recorded. Unset (tests of this module): the program is
/// the group's leader and nothing is recorded.
static WATCHDOG: OnceLock<Launch> = OnceLock::new();

#[derive(Debug)]
struct Launch {
    /// The `qd` binary, run as `qd __watchdog`.
    exe: PathBuf,
    /// `data_dir/attempts`.
    records: PathBuf,
}

/// Makes every command attempt of this process run under the attempt watchdog
/// (`exe __watchdog ...`, `exe` being the `qd` binary) and record its process group
/// in `records`. Called once by `qd run`; later calls are ignored.
pub fn use_watchdog(exe: PathBuf, records: PathBuf) {
    let _ = WATCHDOG.set(Launch { exe, records });
}

/// How long the pipes may stay open after the process group is gone (a descendant
/// that escaped the group with `setsid` can hold them); then the tails are taken as is.
const PIPE_DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Runs a program per attempt. Built from a validated [`CommandSpec`].
#[derive(Debug)]
pub struct CommandExecutor {
    spec: CommandSpec,
}

/// How the supervision of the child ended, before its exit status is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// The program exited (or was killed) on its own.
    Exited,
    /// Past `timeout`; `sigkill` says whether SIGTERM was ignored for `kill_grace`.
    TimedOut { sigkill: bool },
    /// The worker cancelled the attempt.
    Cancelled,
    /// An operator cancelled the job; `sigkill` as for `TimedOut`.
    Revoked { sigkill: bool },
}

impl CommandExecutor {
    /// Checks `spec` for values the OS would refuse at spawn time.
    ///
    /// # Errors
    /// [`ExecutorError::Invalid`] for an empty program, a NUL byte in the program, an
    /// argument, an env name or value, an env name that is empty or contains `=`, or a
    /// zero `timeout`.
    pub fn new(spec: CommandSpec) -> Result<CommandExecutor, ExecutorError> {
        let program = spec.program.as_os_str().as_encoded_bytes();
        if program.is_empty() || program.contains(&0) {
            return Err(ExecutorError::invalid(
                "program",
                "must be a non-empty path without NUL bytes",
            ));
        }
        if let Some(i) = spec.args.iter().position(|a| a.contains('\0')) {
            return Err(ExecutorError::invalid(
                format!("args[{i}]"),
                "contains a NUL byte",
            ));
        }
        for (name, value) in &spec.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(ExecutorError::invalid(
                    format!("env.{name}"),
                    "names must be non-empty without '=' or NUL, values without NUL",
                ));
            }
        }
        if spec.timeout.is_zero() {
            return Err(ExecutorError::invalid(
                "timeout",
                "must be greater than zero",
            ));
        }
        Ok(CommandExecutor { spec })
    }

    /// Runs one attempt: spawn, feed stdin, drain stdout/stderr, enforce the timeout,
    /// reap exactly once, classify. `cancel` SIGKILLs the group at once; `revoked`
    /// stops it like a timeout (SIGTERM, SIGKILL after `kill_grace`). Never leaves a
    /// process of the group running, even when this future is dropped.
    pub async fn run(
        &self,
        job: &JobRun,
        cancel: &CancellationToken,
        revoked: &CancellationToken,
    ) -> ExecResult {
        let result_file = match ResultFile::create() {
            Ok(file) => file,
            Err(e) => {
                return ExecResult::Failure(Failure::Transient {
                    error: format!("cannot create the result file: {e}"),
                    retry_after: None,
                });
            }
        };
        let parents_file = match job.parents.as_deref().map(ParentsFile::create).transpose() {
            Ok(file) => file,
            Err(e) => {
                return ExecResult::Failure(Failure::Transient {
                    error: format!("cannot create the parents file: {e}"),
                    retry_after: None,
                });
            }
        };
        let launch = WATCHDOG.get();
        let record = launch.map(|l| {
            let record = Record {
                v: 1,
                job: job.id,
                queue: job.queue.to_string(),
                attempt: job.attempt,
                token: job.token,
                boot: attempt_groups::boot_id(),
            };
            (l.records.as_path(), record)
        });
        let command = &mut self.command(job, launch.map(|l| l.exe.as_path()));
        command.env(result_file::ENV, result_file.path());
        if let Some(file) = &parents_file {
            command.env(parents_file::ENV, file.path());
        }
        let mut group = match ProcessGroup::spawn(command, record) {
            Ok(group) => group,
            Err(e) => {
                return ExecResult::Failure(Failure::Transient {
                    error: format!("cannot start {}: {e}", self.spec.program.display()),
                    retry_after: None,
                });
            }
        };
        let child = group.child_mut();
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (mut out, mut err) = (Tail::default(), Tail::default());
        // Through the watchdog, stdin is its lifeline (payload, then a beat until the
        // attempt ends); otherwise it carries the payload to the program.
        let (direct, lifeline) = match launch {
            Some(_) => (None, stdin),
            None => (stdin, None),
        };
        let io = async {
            tokio::join!(
                feed(direct, &job.payload),
                out.read_from(stdout),
                err.read_from(stderr)
            )
        };
        let supervise = self.supervise(&group, cancel, revoked);
        let ending = drive(supervise, io, keep_alive(lifeline, &job.payload)).await;
        let status = group.reap().await;
        match (ending, status) {
            (Ending::Exited, Ok(status)) => {
                match classify(&self.spec.exit_codes, status, &err.text(), out.text()) {
                    ExecResult::Success { detail, .. } => match result_file.take(job.max_result) {
                        Ok(result) => ExecResult::Success { detail, result },
                        Err(failure) => ExecResult::Failure(failure),
                    },
                    failed => failed,
                }
            }
            (Ending::Exited, Err(e)) => ExecResult::Failure(Failure::Transient {
                error: format!("cannot wait for {}: {e}", self.spec.program.display()),
                retry_after: None,
            }),
            (Ending::TimedOut { sigkill }, _) => ExecResult::Failure(Failure::TimedOut {
                error: with_output(self.timeout_text(sigkill), &err.text()),
            }),
            (Ending::Cancelled, _) => ExecResult::Failure(Failure::Interrupted {
                reason: "cancelled by the worker (shutdown or lost lease); process group killed"
                    .to_owned(),
            }),
            (Ending::Revoked { sigkill }, _) => ExecResult::Failure(Failure::Interrupted {
                reason: with_output(
                    format!("cancelled by an operator; {}", self.stop_text(sigkill)),
                    &err.text(),
                ),
            }),
        }
    }

    /// The command for one attempt: program, args, cwd, env, piped stdio; run by the
    /// watchdog `exe` when given.
    fn command(&self, job: &JobRun, watchdog: Option<&Path>) -> Command {
        let spec = &self.spec;
        let mut cmd = match watchdog {
            Some(exe) => {
                let mut cmd = Command::new(exe);
                let stall = job.lease.max(MIN_STALL);
                cmd.arg("__watchdog")
                    .arg(format!("--grace-ms={}", spec.kill_grace.as_millis()))
                    .arg(format!("--stall-ms={}", stall.as_millis()))
                    .arg("--")
                    .arg(&spec.program);
                cmd
            }
            None => Command::new(&spec.program),
        };
        cmd.args(&spec.args)
            .envs(&spec.env)
            .env("QD_JOB_ID", job.id.to_string())
            .env("QD_IDEMPOTENCY_KEY", &job.idempotency_key)
            .env("QD_ATTEMPT", job.attempt.to_string())
            .env("QD_QUEUE", &*job.queue)
            .env("QD_TENANT", &*job.tenant)
            .env("QD_LEASE_TOKEN", job.token.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(schedule) = crate::schedule::JobSchedule::of_key(&job.idempotency_key) {
            cmd.env("QD_SCHEDULE", schedule.name)
                .env("QD_SCHEDULE_TICK", schedule.tick);
        }
        if let Some(cwd) = &spec.cwd {
            cmd.current_dir(cwd);
        }
        cmd
    }

    /// Waits for the leader to exit, stopping the group on timeout, revoke or cancel;
    /// then SIGKILLs whatever is left of the group while the leader's pid is still pinned.
    async fn supervise(
        &self,
        group: &ProcessGroup,
        cancel: &CancellationToken,
        revoked: &CancellationToken,
    ) -> Ending {
        let mut exited = group.leader_exit();
        let ending = tokio::select! {
            _ = &mut exited => Ending::Exited,
            () = cancel.cancelled() => {
                group.signal(Signal::SIGKILL);
                Ending::Cancelled
            }
            () = revoked.cancelled() => Ending::Revoked {
                sigkill: self.terminate(group, &mut exited, cancel).await,
            },
            () = tokio::time::sleep(self.spec.timeout) => Ending::TimedOut {
                sigkill: self.terminate(group, &mut exited, cancel).await,
            },
        };
        if !exited.is_finished() {
            let _ = exited.await;
        }
        group.signal(Signal::SIGKILL);
        ending
    }

    /// SIGTERM to the group, then SIGKILL once the leader exited or `kill_grace`
    /// passed (at once on `cancel`); true if the leader outlived the grace.
    async fn terminate(
        &self,
        group: &ProcessGroup,
        exited: &mut JoinHandle<()>,
        cancel: &CancellationToken,
    ) -> bool {
        group.signal(Signal::SIGTERM);
        let sigkill = tokio::select! {
            _ = exited => false,
            () = cancel.cancelled() => true,
            () = tokio::time::sleep(self.spec.kill_grace) => true,
        };
        group.signal(Signal::SIGKILL);
        sigkill
    }

    fn timeout_text(&self, sigkill: bool) -> String {
        let limit = humantime::format_duration(self.spec.timeout);
        format!("timed out after {limit}; {}", self.stop_text(sigkill))
    }

    /// How [`CommandExecutor::terminate`] ended the group.
    fn stop_text(&self, sigkill: bool) -> String {
        if sigkill {
            let grace = humantime::format_duration(self.spec.kill_grace);
            format!("still running {grace} after SIGTERM, so SIGKILLed")
        } else {
            "stopped by SIGTERM".to_owned()
        }
    }
}

/// Runs `supervise`, the pipe I/O and the watchdog's lifeline together; once
/// supervision ends, gives the pipes [`PIPE_DRAIN_LIMIT`] to reach EOF.
async fn drive(
    supervise: impl Future<Output = Ending>,
    io: impl Future,
    lifeline: impl Future,
) -> Ending {
    tokio::pin!(supervise, io, lifeline);
    let (mut io_done, mut lifeline_done) = (false, false);
    let ending = loop {
        tokio::select! {
            ending = &mut supervise => break ending,
            _ = &mut io, if !io_done => io_done = true,
            _ = &mut lifeline, if !lifeline_done => lifeline_done = true,
        }
    };
    if !io_done && tokio::time::timeout(PIPE_DRAIN_LIMIT, io).await.is_err() {
        tracing::warn!(
            "The job's stdout/stderr stayed open after its process group was killed \
             (a descendant left the group); using the output read so far."
        );
    }
    ending
}

/// Writes the payload to the child's stdin, then closes it. A child that exits or
/// closes stdin without reading it is fine (EPIPE is ignored): only its exit counts.
async fn feed(stdin: Option<ChildStdin>, payload: &[u8]) {
    let Some(mut stdin) = stdin else { return };
    if let Err(e) = stdin.write_all(payload).await
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        tracing::debug!(error = %e, "Cannot write the payload to the job's stdin.");
    }
}

/// Feeds the watchdog's lifeline: the payload's length and bytes, then a beat
/// every [`watchdog::BEAT`] (carrying the node's fencing deadline on a cluster,
/// [`crate::fence::remaining`]) until the attempt ends (this future is dropped, closing
/// it). Ends early only if the watchdog is gone.
async fn keep_alive(lifeline: Option<ChildStdin>, payload: &[u8]) {
    let Some(mut lifeline) = lifeline else { return };
    let len = u64::try_from(payload.len())
        .unwrap_or(u64::MAX)
        .to_be_bytes();
    if lifeline.write_all(&len).await.is_err() || lifeline.write_all(payload).await.is_err() {
        return;
    }
    let mut beats = tokio::time::interval(watchdog::BEAT);
    loop {
        beats.tick().await;
        let beat = watchdog::beat(crate::fence::remaining());
        if lifeline.write_all(&beat).await.is_err() || lifeline.flush().await.is_err() {
            return;
        }
    }
}

/// Classifies a reaped exit status not caused by qd.
fn classify(codes: &ExitCodes, status: ExitStatus, stderr: &str, stdout: String) -> ExecResult {
    let class = match status.code() {
        Some(0) => {
            let detail = Some(stdout).filter(|s| !s.is_empty());
            return ExecResult::Success {
                detail,
                result: None,
            };
        }
        Some(code) if codes.transient.contains(&code) => ErrorClass::Transient,
        Some(code) if codes.permanent.contains(&code) => ErrorClass::Permanent,
        Some(code) if codes.throttled.contains(&code) => ErrorClass::Throttled,
        Some(_) => codes.other,
        None => ErrorClass::Transient,
    };
    let what = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => format!("killed by signal {}", signal_name(sig)),
        (None, None) => format!("ended with {status}"),
    };
    let error = with_output(what, stderr);
    ExecResult::Failure(match class {
        ErrorClass::Transient => Failure::Transient {
            error,
            retry_after: None,
        },
        ErrorClass::Permanent => Failure::Permanent { error },
        ErrorClass::Throttled => Failure::Throttled {
            retry_after: codes.throttle_delay,
            error,
        },
    })
}

fn signal_name(sig: i32) -> String {
    Signal::try_from(sig).map_or_else(|_| format!("{sig}"), |s| s.as_str().to_owned())
}

/// The last [`OUTPUT_LIMIT`] bytes of a stream; memory stays bounded however much
/// the child writes.
#[derive(Debug, Default)]
struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        let keep_new = chunk.len().min(OUTPUT_LIMIT);
        let drop_old = (self.buf.len() + keep_new).saturating_sub(OUTPUT_LIMIT);
        self.buf.drain(..drop_old);
        self.buf.extend_from_slice(&chunk[chunk.len() - keep_new..]);
    }

    /// Reads `reader` to EOF (or a read error), keeping the tail.
    async fn read_from(&mut self, reader: Option<impl AsyncRead + Unpin>) {
        let Some(mut reader) = reader else { return };
        let mut chunk = vec![0_u8; 8 * 1024];
        while let Ok(n @ 1..) = reader.read(&mut chunk).await {
            self.push(&chunk[..n]);
        }
    }

    fn text(&self) -> String {
        output_text(&self.buf)
    }
}

#[cfg(test)]
mod tests;
