//! `qctl`: the admin CLI for qd. Parses the command line, finds the admin socket,
//! runs the command and maps the outcome to an exit code (0 ok, 1 the daemon refused
//! or failed or is unreachable, 2 usage). The protocol is `qd_proto`.

mod cli;
mod client;
mod commands;
mod format;
mod render;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command};
use crate::client::{Client, resolve_socket};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "qctl", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let env = std::env::var_os("QD_SOCKET");
    let outcome =
        resolve_socket(cli.socket.as_deref(), env, cli.config.as_deref()).and_then(|path| {
            let timeout = cli.timeout;
            commands::run(cli.command, || Client::connect(&path, timeout))
        });
    match outcome {
        Ok(out) => {
            if cli.json {
                match serde_json::to_string_pretty(&out.response) {
                    Ok(json) => println!("{json}"),
                    Err(e) => eprintln!("qctl: cannot print JSON: {e}"),
                }
            } else {
                print!("{}", out.text);
            }
            ExitCode::from(u8::from(out.refused))
        }
        Err(e) => {
            eprintln!("qctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
