//! The `qd` binary: parses the command line, loads the config, opens the store,
//! starts telemetry and the supervisor, and maps the outcome to an exit code:
//! 0 after a clean shutdown, 1 on a runtime failure (store, listener, restart
//! intensity exceeded), 64 (EX_USAGE) on a config error (including an unusable
//! `daemon.api_tokens_file`: unreadable, group/other-readable, or invalid).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, Subcommand};
use qd::api::auth::{LiveTokens, Tokens};
use qd::config::Config;
use qd::daemon::{Control, Controls, Daemon};
use qd::data_lock::DataDirLock;
use qd::executor::Executors;
use qd::executor::command::{self as command_executor, watchdog};
use qd::limits::Limits;
use qd::rate_limit::Limiters;
use qd::store::postgres::PgOptions;
use qd::store::{SqliteOptions, Store};
use qd::supervisor::{self, Supervisor, SupervisorMsg};
use ractor::{Actor, ActorRef};
use tokio::signal::unix::{Signal, SignalKind, signal};
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
    /// Internal: lead one command attempt's process group and stop it when the qd
    /// that started it dies or freezes (see `executor::command::watchdog`).
    #[command(name = "__watchdog", hide = true)]
    Watchdog {
        /// Time between SIGTERM and SIGKILL of the group once qd is gone.
        #[arg(long)]
        grace_ms: u64,
        /// Longest silence of qd before it is taken for frozen.
        #[arg(long)]
        stall_ms: u64,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
}

const EX_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Watchdog {
        grace_ms,
        stall_ms,
        command,
    } = cli.command
    {
        // No logging set up: the watchdog's stderr is the job's.
        return watchdog::run(watchdog::Orders {
            grace: Duration::from_millis(grace_ms),
            stall: Duration::from_millis(stall_ms),
            command,
        });
    }
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
        Command::Watchdog { .. } => unreachable!("handled before logging starts"),
        Command::Run { config: path } => {
            // The runtime and the signal handlers come first, before the config is
            // read (building HTTP executors takes a while): a SIGHUP from then on is
            // queued for the supervisor instead of killing qd.
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
            runtime.block_on(async {
                let signals = match Signals::install() {
                    Ok(signals) => signals,
                    Err(e) => {
                        eprintln!("qd: cannot install signal handlers: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                match load(&path) {
                    Ok(config) => run(Arc::new(config), signals).await,
                    Err(problems) => {
                        eprintln!("{problems}");
                        ExitCode::from(EX_CONFIG)
                    }
                }
            })
        }
    }
}

/// Loads and checks everything `qd run` will need from the config before it starts
/// (the file, the API token file, the admin group, the executors: every problem in
/// one pass). `check-config`, `run` and a reload share it, so systemd's
/// `ExecStartPre` catches what would stop the daemon.
fn load(path: &std::path::Path) -> Result<Config, String> {
    Config::load_checked(path, &qd::machine::Machine).map_err(|errors| errors.to_string())
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

async fn run(config: Arc<Config>, signals: Signals) -> ExitCode {
    match start(config, signals).await {
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

async fn start(config: Arc<Config>, signals: Signals) -> Result<ExitCode, Failure> {
    let data_dir = &config.daemon.data_dir;
    std::fs::create_dir_all(data_dir).map_err(|e| {
        Failure::Runtime(format!(
            "cannot create data_dir {}: {e}",
            data_dir.display()
        ))
    })?;
    // Before the store is opened or anything bound: one daemon per data directory.
    let _lock = DataDirLock::acquire(data_dir).map_err(|e| Failure::Runtime(e.to_string()))?;
    qd::admin_server::ensure_not_served(&config.daemon.admin_socket)
        .await
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    // Under the lock, before anything is dispatched: stop what a crashed run left.
    let records = qd::attempt_groups::dir(data_dir);
    let left_behind = qd::attempt_groups::sweep(&records);
    let exe = std::env::current_exe().map_err(|e| {
        Failure::Runtime(format!(
            "cannot find the qd binary to run job watchdogs: {e}"
        ))
    })?;
    command_executor::use_watchdog(exe, records);
    let store = open_store(&config)?;
    let config = if config.sqs.enabled {
        let records = store
            .run(|b| b.sqs_queues())
            .await
            .map_err(|e| Failure::Runtime(format!("cannot read the SQS-created queues: {e}")))?;
        let mut config = Arc::unwrap_or_clone(config);
        qd::api::sqs::created::merge(&mut config, &records);
        Arc::new(config)
    } else {
        config
    };
    let overrides = store
        .run(|b| b.overrides())
        .await
        .map_err(|e| Failure::Runtime(format!("cannot read runtime overrides: {e}")))?;
    let executors =
        Executors::build(&config, None).map_err(|errors| Failure::Config(errors.join("\n")))?;
    let tokens = Tokens::from_config(&config).map_err(|e| Failure::Config(format!("qd: {e}")))?;
    qd::metrics::install(config.daemon.metrics_listen)
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    qd::metrics::config_loaded();
    let serving = format!(
        "serving {} queues; API {}, metrics {}",
        config.queues.len(),
        config.daemon.api_listen,
        config.daemon.metrics_listen
    );
    let limits = Arc::new(Limits::new(config, overrides));
    let (control, controls) = Controls::channel();
    let daemon = Daemon {
        limiters: Arc::new(Limiters::build(
            &limits,
            limits
                .config()
                .daemon
                .database
                .is_some()
                .then(|| store.clone()),
        )),
        limits,
        executors: Arc::new(Executors::new(executors)),
        tokens: Arc::new(LiveTokens::new(tokens)),
        store: store.clone(),
        test_hooks: std::env::var("QD_TEST_HOOKS").is_ok_and(|v| v == "1"),
        started: tokio::time::Instant::now(),
        restarts: Default::default(),
        failure: Arc::new(Mutex::new(None)),
        cluster: Default::default(),
        left_behind: Arc::new(Mutex::new(left_behind)),
        control,
    };
    let failure = daemon.failure.clone();
    let (root, handle) = Actor::spawn(
        Some(supervisor::NAME.into()),
        Supervisor,
        (daemon, controls),
    )
    .await
    .map_err(|e| Failure::Runtime(format!("qd could not start: {}", root_cause(&e))))?;
    let _ = qd::notify::ready();
    let _ = qd::notify::status(&serving);
    tokio::spawn(forward_signals(root, signals));
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

/// Opens the store the config names: PostgreSQL when `database_url` is set (one
/// line naming the database, never its password, if it cannot be reached), else
/// SQLite in `data_dir`.
fn open_store(config: &Config) -> Result<Store, Failure> {
    let (opened, store) = match &config.daemon.database {
        Some(database) => {
            let client = database.client_config().map_err(Failure::Config)?;
            let options = PgOptions {
                history: config.daemon.history,
                node: database.node_name.clone(),
                node_id: node_id(&config.daemon.data_dir)?,
                node_timeout: database.node_timeout,
                fence_wait: config.fence_wait().unwrap_or_default(),
                call_timeout: PgOptions::call_timeout_for(database.node_timeout),
                ..PgOptions::default()
            };
            let store = qd::store::postgres::describe(&client);
            (Store::open_postgres(&client, &options), store)
        }
        None => {
            let options = SqliteOptions {
                history: config.daemon.history,
                ..SqliteOptions::default()
            };
            let path = config.db_path();
            let store = format!("SQLite {}", path.display());
            (Store::open_sqlite_with(&path, &options), store)
        }
    };
    let opened = opened.map_err(|e| Failure::Runtime(format!("cannot open the store: {e}")))?;
    info!(%store, "Store opened.");
    Ok(opened)
}

/// This node's id in a cluster: a UUID kept in `data_dir/node-id`, created at the
/// first start. The data directory's lock makes it one process's at a time.
fn node_id(data_dir: &std::path::Path) -> Result<uuid::Uuid, Failure> {
    let path = data_dir.join("node-id");
    let failed = |e: std::io::Error| Failure::Runtime(format!("{}: {e}", path.display()));
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map_err(|e| {
            Failure::Runtime(format!(
                "{}: not a node id ({e}); remove the file to make a new one",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = uuid::Uuid::now_v7();
            std::fs::write(&path, format!("{id}\n")).map_err(failed)?;
            Ok(id)
        }
        Err(e) => Err(failed(e)),
    }
}

/// The error and its sources, each once, without ractor's start-up wrappers
/// ("Actor panicked during startup '…'" says nothing an operator can act on).
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut err = err;
    while let (Some(ractor::SpawnErr::StartupFailed(_)), Some(inner)) =
        (err.downcast_ref::<ractor::SpawnErr>(), err.source())
    {
        err = inner;
    }
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

/// The signals qd handles, installed as soon as the runtime exists, so a SIGHUP that
/// arrives while qd starts is queued for the supervisor instead of killing the
/// process (its default action).
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// SIGTERM and SIGINT become one graceful shutdown of the supervisor; SIGHUP a
/// config reload (never the default action, which would kill qd).
async fn forward_signals(root: ActorRef<SupervisorMsg>, signals: Signals) {
    let Signals {
        mut term,
        mut int,
        mut hup,
    } = signals;
    let name = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = hup.recv() => {
                info!(signal = "SIGHUP", "Signal received; reloading the config.");
                let _ = root.cast(SupervisorMsg::Control(Control::Reload(None)));
            }
        }
    };
    info!(signal = name, "Signal received.");
    let _ = root.cast(SupervisorMsg::Shutdown(name.to_string()));
    // A second SIGINT/SIGTERM during the grace means "now": qd exits at once, as
    // after a crash (every accepted job is durable; each running attempt's watchdog
    // stops its processes when qd is gone; the next start records them).
    let again = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::warn!(
        signal = again,
        "Second signal during the shutdown grace; exiting now without waiting for running attempts."
    );
    std::process::exit(i32::from(EX_FORCED));
}

/// Exit code of a shutdown forced by a second signal (128 + SIGINT, as a shell reports).
const EX_FORCED: u8 = 130;
