//! The `qd` binary: parses the command line, loads the config, opens the store,
//! starts telemetry and the supervisor, and maps the outcome to an exit code:
//! 0 after a clean shutdown, 1 on a runtime failure (store, listener, restart
//! intensity exceeded), 64 (EX_USAGE) on a config error (including an unusable
//! `daemon.api_tokens_file`: unreadable, group/other-readable, or invalid).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand};
use qd::config::Config;
use qd::executor::Executor;
use qd::limits::Limits;
use qd::store::{SqliteOptions, Store};
use qd::supervisor::{self, Daemon, Supervisor, SupervisorMsg};
use ractor::{Actor, ActorRef};
use tracing::{error, info};

/// qd: a durable job queue and its worker fleet in one daemon.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Run {
        /// The TOML config file.
        #[arg(long, short, default_value = "/etc/qd/qd.toml")]
        config: PathBuf,
    },
    /// Check a config file and exit 0 if it is valid, 1 with every problem if not.
    CheckConfig {
        /// The TOML config file.
        config: PathBuf,
    },
}

const EX_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::CheckConfig { config } => match load(&config) {
            Ok(config) => {
                println!("{}", config.summary());
                ExitCode::SUCCESS
            }
            Err(problems) => {
                eprintln!("{problems}");
                ExitCode::FAILURE
            }
        },
        Command::Run { config } => {
            let config = match load(&config) {
                Ok(c) => Arc::new(c),
                Err(problems) => {
                    eprintln!("{problems}");
                    return ExitCode::from(EX_CONFIG);
                }
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("qd: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            runtime.block_on(run(config))
        }
    }
}

/// Loads and checks everything `qd run` will need from the config before it starts:
/// the file itself (every problem at once), the API token file (exists, owner-only
/// mode, valid) and the admin group. `check-config` and `run` share it, so systemd's
/// `ExecStartPre` catches what would stop the daemon.
fn load(path: &std::path::Path) -> Result<Config, String> {
    let config = Config::load(path).map_err(|errors| errors.to_string())?;
    qd::api::auth::Tokens::from_config(&config).map_err(|e| format!("qd: {e}"))?;
    if let Some(group) = &config.daemon.admin_group {
        qd::admin_server::resolve_group(group).map_err(|e| {
            format!("qd: daemon.admin_group: {e}; create the group or change the key")
        })?;
    }
    Ok(config)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("QD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn run(config: Arc<Config>) -> ExitCode {
    match start(config).await {
        Ok(code) => code,
        Err(Failure::Config(msg)) => {
            error!("{msg}");
            ExitCode::from(EX_CONFIG)
        }
        Err(Failure::Runtime(msg)) => {
            error!("{msg}");
            ExitCode::FAILURE
        }
    }
}

enum Failure {
    Config(String),
    Runtime(String),
}

async fn start(config: Arc<Config>) -> Result<ExitCode, Failure> {
    let data_dir = &config.daemon.data_dir;
    std::fs::create_dir_all(data_dir).map_err(|e| {
        Failure::Runtime(format!(
            "cannot create data_dir {}: {e}",
            data_dir.display()
        ))
    })?;
    let options = SqliteOptions {
        history: config.daemon.history,
        ..SqliteOptions::default()
    };
    let store = Store::open_sqlite_with(&config.db_path(), &options)
        .map_err(|e| Failure::Runtime(format!("cannot open the store: {e}")))?;
    let overrides = store
        .run(|b| b.overrides())
        .await
        .map_err(|e| Failure::Runtime(format!("cannot read runtime overrides: {e}")))?;
    let mut executors = HashMap::new();
    for (name, q) in &config.queues {
        match Executor::new(&q.executor) {
            Ok(Some(exec)) => {
                executors.insert(name.clone(), Arc::new(exec));
            }
            Ok(None) => {}
            Err(e) => return Err(Failure::Config(format!("queues.{name}.executor: {e}"))),
        }
    }
    qd::metrics::install(config.daemon.metrics_listen)
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    let limits = Arc::new(Limits::new(config.clone(), overrides));
    let daemon = Daemon {
        limiters: qd::rate_limit::build(&limits),
        limits,
        executors,
        store: store.clone(),
        test_hooks: std::env::var("QD_TEST_HOOKS").is_ok_and(|v| v == "1"),
        started: tokio::time::Instant::now(),
        restarts: Default::default(),
        failure: Arc::new(Mutex::new(None)),
        config,
    };
    let failure = daemon.failure.clone();
    let serving = format!(
        "serving {} queues; API {}, metrics {}",
        daemon.config.queues.len(),
        daemon.config.daemon.api_listen,
        daemon.config.daemon.metrics_listen
    );
    let (root, handle) = Actor::spawn(Some(supervisor::NAME.into()), Supervisor, daemon)
        .await
        .map_err(|e| Failure::Runtime(format!("qd could not start: {}", root_cause(&e))))?;
    let _ = qd::notify::ready();
    let _ = qd::notify::status(&serving);
    tokio::spawn(forward_signals(root));
    let _ = handle.await;
    store.close();
    let failure = failure.lock().unwrap_or_else(|e| e.into_inner()).take();
    match failure {
        Some(reason) => Err(Failure::Runtime(reason)),
        None => {
            info!("qd stopped.");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The error and its sources, each once (ractor wraps a start-up failure in errors
/// that repeat their source's text).
fn root_cause(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg = format!("{msg}: {text}");
        }
        source = s.source();
    }
    msg
}

/// SIGTERM and SIGINT become one graceful shutdown of the supervisor.
async fn forward_signals(root: ActorRef<SupervisorMsg>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("Cannot install signal handlers; use qctl to stop qd.");
        return;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    info!(signal = name, "Signal received.");
    let _ = root.cast(SupervisorMsg::Shutdown(name.to_string()));
}
