//! The settings of a queue's executor, as the config compiler builds them and the
//! executors read them. Plain values: this module imports nothing of the daemon, so
//! `config` can name them without depending on the executors.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How an exit code (command executor) is classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Retry with backoff, charged to the budget.
    Transient,
    /// Dead-letter at once.
    Permanent,
    /// The downstream is overloaded: pause the rate limiter, retry later, not charged.
    Throttled,
}

/// Exit-code classification for the command executor. Exit 0 is always success;
/// a kill by timeout or signal is always transient.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitCodes {
    /// Codes that mean "retry" (default `[75]`, EX_TEMPFAIL from sysexits.h).
    pub transient: Vec<i32>,
    /// Codes that mean "never retry" (default `[64, 65]`, EX_USAGE and EX_DATAERR).
    pub permanent: Vec<i32>,
    /// Codes that mean "throttled" (default none).
    pub throttled: Vec<i32>,
    /// The class of any other non-zero code (default transient).
    pub other: ErrorClass,
    /// How long a throttled exit pauses the rate limiter and delays the job (default 1 s).
    pub throttle_delay: Duration,
}

/// Settings of the `command` executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandSpec {
    /// Absolute path of the program (checked to exist and be executable at config load).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables (the `QD_*` ones are always set and win).
    pub env: BTreeMap<String, String>,
    /// Working directory, if not the daemon's.
    pub cwd: Option<PathBuf>,
    /// Exit-code classification.
    pub exit_codes: ExitCodes,
    /// Wall-time limit of one attempt; past it the process group gets SIGTERM.
    pub timeout: Duration,
    /// Time between SIGTERM and SIGKILL of the process group (default 5 s).
    pub kill_grace: Duration,
}

/// Settings of the `http` (webhook) executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpSpec {
    /// The URL the payload is POSTed to (http or https).
    pub url: String,
    /// Extra request headers.
    pub headers: BTreeMap<String, String>,
    /// Wall-time limit of one request, connect to last body byte.
    pub timeout: Duration,
    /// Keep a successful response's body as the job's result (`store_result`).
    pub store_result: bool,
    /// POST a JSON envelope `{"payload" | "payload_b64", "parents"}` in place of
    /// the bare payload (`send_parents`).
    pub send_parents: bool,
}

/// A queue's executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecutorSpec {
    /// Run a program per attempt.
    Command(CommandSpec),
    /// POST to a URL per attempt.
    Http(HttpSpec),
    /// No in-process pool: external workers lease over the HTTP API.
    External,
}
