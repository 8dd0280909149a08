//! Executors: how a Worker runs one attempt of a job.
//!
//! The settings shapes the config compiler builds ([`ExecutorSpec`] and friends)
//! are in [`spec`], which imports nothing of the daemon. This file owns the input of one attempt ([`JobRun`]),
//! its result ([`ExecResult`]) and the dispatching [`Executor`]. The behaviour lives
//! in [`command`] (a child process per attempt, in its own process group) and
//! [`http`] (a webhook POST per attempt). A job's parents reach a command through
//! [`parents_file`] and a webhook through its envelope (`send_parents`).
//!
//! An executor never decides retries: it classifies how the attempt ended into a
//! [`Failure`] and the broker applies the job's budget and backoff.

pub mod command;
pub mod http;
pub mod parents_file;
pub mod result_file;
pub mod spec;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::job::{Failure, JobId};

pub use spec::{CommandSpec, ErrorClass, ExecutorSpec, ExitCodes, HttpSpec};

/// Most bytes of a child's stderr/stdout tail or of a response-body head that go
/// into an attempt's error or detail text (4 KiB, the size `HistoryEntry::error` allows).
pub const OUTPUT_LIMIT: usize = 4096;

/// One attempt of a job, as handed to an executor by a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRun {
    /// The job's id (`QD_JOB_ID` / `Qd-Job-Id`).
    pub id: JobId,
    /// Its queue (`QD_QUEUE` / `Qd-Queue`).
    pub queue: Arc<str>,
    /// Its tenant (`QD_TENANT` / `Qd-Tenant`).
    pub tenant: Arc<str>,
    /// This attempt's number, 1-based (`QD_ATTEMPT` / `Qd-Attempt`).
    pub attempt: u32,
    /// The key a downstream uses to make a repeated attempt harmless
    /// (`QD_IDEMPOTENCY_KEY` / `Idempotency-Key`): the producer's key, or one qd derived.
    pub idempotency_key: String,
    /// The opaque payload (command stdin / HTTP request body).
    pub payload: Vec<u8>,
    /// The largest result the attempt may hand back (the queue's `max_result`).
    pub max_result: usize,
    /// This attempt's lease token (`QD_LEASE_TOKEN` / `Qd-Lease-Token`): a fencing
    /// value that grows with every lease of the job, so a downstream can refuse the
    /// writes of an attempt older than one it has seen.
    pub token: crate::job::Token,
    /// The lease length: how long qd may be silent before the attempt's watchdog
    /// takes it for frozen (at least 5 s).
    pub lease: Duration,
    /// The job's parents with their results, read for an executor that hands them
    /// on ([`Executor::wants_parents`]): `$QD_PARENTS_FILE`, a webhook's envelope.
    /// `None` when not read.
    pub parents: Option<Vec<crate::results::ParentBody>>,
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq)]
pub enum ExecResult {
    /// The work is done; the worker acks the job.
    Success {
        /// What the work said (stdout tail or `HTTP 200 OK: <body head>`), at most
        /// [`OUTPUT_LIMIT`] bytes of output; `None` when there was nothing to say.
        detail: Option<String>,
        /// What the job handed back (`$QD_RESULT_FILE`, a webhook's body with
        /// `store_result`), at most the queue's `max_result`; stored with the ack.
        result: Option<Vec<u8>>,
    },
    /// The attempt failed; the broker decides retry, delay or dead-letter.
    Failure(Failure),
}

/// A settings problem found when an executor is built: the config is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// A setting is unusable; `key` is its path inside the executor table
    /// (`url`, `headers.X-Token`, `env.FOO`, `args[2]`).
    #[error("executor.{key}: {reason}")]
    Invalid {
        /// Where the problem is, relative to the queue's `executor` table.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built (e.g. the TLS backend failed to load).
    #[error("executor: cannot build the HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
}

impl ExecutorError {
    /// Shorthand for [`ExecutorError::Invalid`].
    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ExecutorError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// A queue's built executor: validated settings plus what is reused across attempts
/// (the HTTP connection pool). Cheap to share behind an `Arc` between a pool's workers.
#[derive(Debug)]
pub enum Executor {
    /// Runs a program per attempt.
    Command(command::CommandExecutor),
    /// POSTs to a URL per attempt.
    Http(http::HttpExecutor),
}

impl Executor {
    /// Builds the executor for `spec`; `Ok(None)` for [`ExecutorSpec::External`],
    /// which has no in-process workers.
    ///
    /// # Errors
    /// [`ExecutorError`] when a setting cannot be used (bad URL or header, an env
    /// name with `=`, a NUL byte in an argument) or the HTTP client cannot be built.
    pub fn new(spec: &ExecutorSpec) -> Result<Option<Executor>, ExecutorError> {
        Ok(match spec {
            ExecutorSpec::Command(c) => {
                Some(Executor::Command(command::CommandExecutor::new(c.clone())?))
            }
            ExecutorSpec::Http(h) => Some(Executor::Http(http::HttpExecutor::new(h)?)),
            ExecutorSpec::External => None,
        })
    }

    /// Whether this executor hands a job's parents on (a command's
    /// `$QD_PARENTS_FILE`; a webhook with `send_parents`), so the worker reads
    /// them before the attempt.
    pub fn wants_parents(&self) -> bool {
        match self {
            Executor::Command(_) => true,
            Executor::Http(h) => h.sends_parents(),
        }
    }

    /// Runs one attempt of `job` to its end and classifies the outcome.
    ///
    /// When `cancel` fires (shutdown grace spent, lease lost) the work is stopped at
    /// once and the result is [`Failure::Interrupted`]. When `revoked` fires (an
    /// operator cancelled the job) the work is stopped as on timeout: a command's
    /// process group gets SIGTERM, then SIGKILL after `kill_grace`; a webhook request
    /// is aborted; the result is again [`Failure::Interrupted`]. Dropping the returned
    /// future also stops the work (a command's whole process group is SIGKILLed).
    pub async fn run(
        &self,
        job: &JobRun,
        cancel: &CancellationToken,
        revoked: &CancellationToken,
    ) -> ExecResult {
        match self {
            Executor::Command(c) => c.run(job, cancel, revoked).await,
            Executor::Http(h) => tokio::select! {
                result = h.run(job, cancel) => result,
                () = revoked.cancelled() => ExecResult::Failure(Failure::Interrupted {
                    reason: "cancelled by an operator; request aborted".to_owned(),
                }),
            },
        }
    }
}

/// The executor of every queue with in-process workers, by queue name. Workers look
/// theirs up for each attempt, so a reload that changes a queue's executor (program,
/// URL, timeout, ...) applies to the next attempt while a running one finishes.
#[derive(Default)]
pub struct Executors {
    by_queue: RwLock<HashMap<String, Arc<Executor>>>,
}

impl Executors {
    /// Builds the executor of every queue of `config` (none for external queues).
    /// An executor whose spec is unchanged from `reuse`'s is shared rather than
    /// rebuilt, so an HTTP executor keeps its connection pool across a reload.
    ///
    /// Errors: one `queues.NAME.executor...: reason` line per queue that fails.
    pub fn build(
        config: &Config,
        reuse: Option<(&Config, &Executors)>,
    ) -> Result<HashMap<String, Arc<Executor>>, Vec<String>> {
        let mut built = HashMap::new();
        let mut errors = Vec::new();
        for (name, q) in &config.queues {
            let kept = reuse.and_then(|(old, current)| {
                let same = old
                    .queues
                    .get(name)
                    .is_some_and(|o| o.executor == q.executor);
                same.then(|| current.get(name)).flatten()
            });
            if let Some(exec) = kept {
                built.insert(name.clone(), exec);
                continue;
            }
            match Executor::new(&q.executor) {
                Ok(Some(exec)) => {
                    built.insert(name.clone(), Arc::new(exec));
                }
                Ok(None) => {}
                Err(e) => errors.push(format!("queues.{name}.{e}")),
            }
        }
        if errors.is_empty() {
            Ok(built)
        } else {
            Err(errors)
        }
    }

    /// A registry holding `executors`.
    pub fn new(executors: HashMap<String, Arc<Executor>>) -> Self {
        Executors {
            by_queue: RwLock::new(executors),
        }
    }

    /// The executor of `queue`, if it has in-process workers.
    pub fn get(&self, queue: &str) -> Option<Arc<Executor>> {
        let map = self.by_queue.read().unwrap_or_else(|e| e.into_inner());
        map.get(queue).cloned()
    }

    /// Whether `queue` has in-process workers.
    pub fn has(&self, queue: &str) -> bool {
        self.get(queue).is_some()
    }

    /// Puts a reloaded set in force.
    pub fn replace(&self, executors: HashMap<String, Arc<Executor>>) {
        *self.by_queue.write().unwrap_or_else(|e| e.into_inner()) = executors;
    }
}

/// `"<what>: <output>"`, or just `what` when the output is empty.
pub(crate) fn with_output(what: String, output: &str) -> String {
    if output.is_empty() {
        what
    } else {
        format!("{what}: {output}")
    }
}

/// Output bytes as trimmed text: invalid UTF-8 is replaced, and a character cut in
/// half at either end by a byte limit is dropped rather than shown as garbage.
pub(crate) fn output_text(bytes: &[u8]) -> String {
    let start = bytes
        .iter()
        .position(|b| b & 0b1100_0000 != 0b1000_0000)
        .unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[start..])
        .trim_end_matches('\u{FFFD}')
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_text_drops_characters_cut_by_the_limit() {
        let text = "é-ok-é".as_bytes();
        assert_eq!(output_text(&text[1..text.len() - 1]), "-ok-");
        assert_eq!(output_text(b"  plain\n"), "plain");
        assert_eq!(output_text(&[0x80, 0x80]), "");
    }

    #[test]
    fn with_output_omits_empty_output() {
        assert_eq!(with_output("exit 75".into(), ""), "exit 75");
        assert_eq!(with_output("exit 75".into(), "boom"), "exit 75: boom");
    }

    #[test]
    fn external_spec_builds_no_executor() {
        assert!(matches!(Executor::new(&ExecutorSpec::External), Ok(None)));
    }
}
