//! `qctl`: the admin CLI for qd. Parses the command line, finds the admin socket,
//! runs the command and maps the outcome to an exit code (0 ok, 1 the daemon refused
//! or failed or is unreachable, 2 usage). With `--json`, errors too are JSON on
//! stdout: `{"error": {"code": "...", "message": "..."}}`. The protocol is `qd_proto`.

mod cli;
mod client;
mod commands;
mod exports;
mod format;
mod ndjson;
mod render;
mod top;

use std::io::Write;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command, DlqCmd, EnqueueArgs, JobsCmd};
use crate::client::{CliError, Client, resolve_socket};

/// Writes `bytes` to stdout. A reader that went away (`qctl ... | head`) is not an
/// error worth a panic: the output is simply cut short. Other write errors exit 1.
fn emit(bytes: &[u8]) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qctl: cannot write the output: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reports a failure: on stderr, or with `json` as the error object on stdout.
/// Returns the exit code.
fn fail(code: &str, message: &str, exit: u8, json: bool) -> ExitCode {
    if json {
        let body = serde_json::json!({ "error": { "code": code, "message": message } });
        emit(format!("{body}\n").as_bytes());
    } else {
        eprintln!("qctl: {message}");
    }
    ExitCode::from(exit)
}

/// Parses the command line. Help and version print as usual; with `--json`
/// anywhere on the line, a usage error is the JSON error object (code `usage`).
fn parse() -> Result<Cli, ExitCode> {
    Cli::try_parse().map_err(|e| {
        let json = std::env::args_os().any(|a| a == "--json");
        let shown = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
        if json && !shown {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            let message = first.strip_prefix("error: ").unwrap_or(first);
            fail("usage", message, 2, true)
        } else {
            let _ = e.print();
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
        }
    })
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if let Command::Completions { shell } = cli.command {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "qctl", &mut script);
        return emit(&script);
    }
    let json = cli.json;
    let env = std::env::var_os("QD_SOCKET");
    let outcome =
        resolve_socket(cli.socket.as_deref(), env, cli.config.as_deref()).and_then(|path| {
            let timeout = cli.timeout;
            let connect = || Client::connect(&path, timeout);
            match cli.command {
                Command::Top { interval } => top::run(interval, connect).map(|()| None),
                Command::Jobs(JobsCmd::Payload { id, output }) => {
                    exports::payload(id, output, json, connect).map(|()| None)
                }
                Command::Jobs(JobsCmd::Result { id, output }) => {
                    exports::result(id, output, json, connect).map(|()| None)
                }
                Command::Enqueue(EnqueueArgs {
                    queue,
                    ndjson: Some(file),
                    ..
                }) => ndjson::enqueue(queue, &file, json, connect).map(|()| None),
                Command::Dlq(DlqCmd::Export { filter, output }) => {
                    exports::dlq_export(&filter, output, connect).map(|()| None)
                }
                other => commands::run(other, connect).map(Some),
            }
        });
    match outcome {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(out)) => {
            let printed = if json {
                match serde_json::to_string_pretty(&out.response) {
                    Ok(text) => emit(format!("{text}\n").as_bytes()),
                    Err(e) => fail("protocol", &format!("cannot print JSON: {e}"), 1, false),
                }
            } else {
                emit(out.text.as_bytes())
            };
            if out.refused {
                ExitCode::FAILURE
            } else {
                printed
            }
        }
        Err(e) => report(&e, json),
    }
}

/// Reports a failed command: the daemon's own message with `--json` (the code is
/// beside it), else the full sentence with the code inside.
fn report(e: &CliError, json: bool) -> ExitCode {
    let message = if json { e.message() } else { e.to_string() };
    fail(e.code(), &message, e.exit_code(), json)
}
