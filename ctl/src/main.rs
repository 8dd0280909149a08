//! `qctl`: the admin CLI for qd. Parses the command line, finds the admin socket,
//! runs the command and maps the outcome to an exit code (0 ok, 1 the daemon refused
//! or failed or is unreachable, 2 usage). The protocol is `qd_proto`.

mod cli;
mod client;
mod commands;
mod format;
mod render;

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command};
use crate::client::{Client, resolve_socket};

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "qctl", &mut script);
        return emit(&script);
    }
    let env = std::env::var_os("QD_SOCKET");
    let outcome =
        resolve_socket(cli.socket.as_deref(), env, cli.config.as_deref()).and_then(|path| {
            let timeout = cli.timeout;
            commands::run(cli.command, || Client::connect(&path, timeout))
        });
    match outcome {
        Ok(out) => {
            let printed = if cli.json {
                match serde_json::to_string_pretty(&out.response) {
                    Ok(json) => emit(format!("{json}\n").as_bytes()),
                    Err(e) => {
                        eprintln!("qctl: cannot print JSON: {e}");
                        ExitCode::FAILURE
                    }
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
        Err(e) => {
            eprintln!("qctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
