//! Tests of the config compiler: inheritance, each kind of problem, reporting
//! every problem at once, the fixtures under `daemon/tests/fixtures/config`,
//! the example configs under `config/`, and never panicking.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;

use super::HistoryLimits;
use super::*;
use crate::backoff::Jitter;
use crate::executor::{ErrorClass, ExecutorSpec};
use crate::scheduler::fair::Fairness;

const SOURCE: &str = "/etc/qd/qd.toml";
const QUEUE: &str = r#"
[queues.demo]
executor = { kind = "command", program = "/bin/sh", args = ["-c", "exit 0"] }
"#;

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(text, Path::new(SOURCE))
}

fn errors(text: &str) -> Vec<ConfigError> {
    match parse(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.errors,
    }
}

fn error_at<'e>(errors: &'e [ConfigError], path: &str) -> &'e ConfigError {
    errors
        .iter()
        .find(|e| e.path == path)
        .unwrap_or_else(|| panic!("no error at {path}: {errors:#?}"))
}

fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("daemon/ has a parent")
        .to_path_buf()
}

const GOOD: &str = r#"
[daemon]
data_dir = "state"
admin_socket_mode = "0600"
max_payload = "512KiB"
restart = { max_restarts = 3 }

[defaults]
lease = "1m"
heartbeat = "15s"
max_attempts = 7
backoff = { base = "2s", max = "5m" }
workers = { min = 2, max = 8, target_age = "3s" }
fairness = "runtime"

[queues.email]
executor = { kind = "command", program = "/bin/sh", args = ["-c", "cat"], env = { A = "1" } }
max_attempts = 3
workers = { max = 16 }
backoff = { jitter = "none" }
rate_limiter = "smtp"
tenants.acme = { max_concurrency = 2 }

[queues.hooks]
executor = { kind = "http", url = "https://example.com/hook", headers = { X-Token = "t" } }
lease = "2m"

[queues.pull]
executor = { kind = "external" }

[rate_limiters.smtp]
per_second = 50

[tenants.acme]
weight = 3
max_concurrency = 10
"#;

#[test]
fn a_good_config_compiles_with_queue_overrides_winning_over_defaults() {
    let config = parse(GOOD).expect("good config");
    let email = &config.queues["email"];
    assert_eq!(email.max_attempts, 3, "queue override wins");
    assert_eq!(
        email.lease,
        Duration::from_secs(60),
        "inherited from [defaults]"
    );
    assert_eq!(email.timeout, Duration::from_secs(300), "built-in default");
    assert_eq!(email.fairness, Fairness::Runtime);
    assert_eq!(email.rate_limiter.as_deref(), Some("smtp"));
    assert_eq!(email.tenant_caps.get("acme"), Some(&2));
    assert_eq!(config.queues["hooks"].lease, Duration::from_secs(120));
    assert_eq!(config.queues["hooks"].max_attempts, 7);
    let ExecutorSpec::Command(command) = &email.executor else {
        panic!("email runs a command")
    };
    assert_eq!(
        command.timeout, email.timeout,
        "executor gets the queue's timeout"
    );
    assert_eq!(command.kill_grace, Duration::from_secs(5));
    assert_eq!(command.exit_codes.transient, [75]);
    assert_eq!(command.exit_codes.other, ErrorClass::Transient);
}

#[test]
fn partial_tables_keep_the_other_inherited_keys() {
    let config = parse(GOOD).expect("good config");
    let workers = config.queues["email"].workers;
    assert_eq!((workers.min, workers.max), (2, 16));
    assert_eq!(workers.target_age, Duration::from_secs(3));
    assert_eq!(workers.idle_cooldown, Duration::from_secs(30));
    let backoff = config.queues["email"].backoff;
    assert_eq!(backoff.base, Duration::from_secs(2));
    assert_eq!(backoff.max, Duration::from_secs(300));
    assert_eq!(backoff.jitter, Jitter::None);
    assert_eq!(config.queues["hooks"].backoff.jitter, Jitter::Full);
}

#[test]
fn daemon_settings_are_typed_and_relative_paths_follow_the_config_file() {
    let config = parse(GOOD).expect("good config");
    let daemon = &config.daemon;
    assert_eq!(daemon.data_dir, Path::new("/etc/qd/state"));
    assert_eq!(config.db_path(), Path::new("/etc/qd/state/qd.db"));
    assert_eq!(daemon.admin_socket, Path::new("/run/qd/qctl.sock"));
    assert_eq!(daemon.admin_socket_mode, 0o600);
    assert_eq!(daemon.max_payload, 512 * 1024);
    assert_eq!(daemon.api_listen.to_string(), "127.0.0.1:7070");
    assert_eq!(daemon.restart.max_restarts, 3);
    assert_eq!(daemon.restart.window, Duration::from_secs(60));
    assert_eq!(
        config.rate_limiters["smtp"].burst, 50,
        "burst defaults to per_second"
    );
}

#[test]
fn the_default_tenant_always_exists_and_unknown_tenants_get_weight_one() {
    let config = parse(GOOD).expect("good config");
    assert_eq!(config.tenants["default"], TenantConfig::default());
    assert_eq!(config.tenant("acme").weight, 3);
    assert_eq!(config.tenant("acme").max_concurrency, Some(10));
    assert_eq!(config.tenant("nobody"), TenantConfig::default());
}

#[test]
fn external_queues_have_no_pool() {
    let config = parse(GOOD).expect("good config");
    let pull = &config.queues["pull"];
    assert_eq!(pull.executor, ExecutorSpec::External);
    assert_eq!((pull.workers.min, pull.workers.max), (0, 0));
    let text = format!(
        "{QUEUE}\n[queues.ext]\nexecutor = {{ kind = \"external\" }}\nworkers = {{ max = 3 }}\n"
    );
    error_at(&errors(&text), "queues.ext.workers");
}

#[test]
fn the_summary_names_queues_and_counts_tenants_and_limiters() {
    let config = parse(GOOD).expect("good config");
    assert_eq!(
        config.summary(),
        "config OK: 3 queues (email, hooks, pull), 2 tenants, 1 rate limiter; store: SQLite /etc/qd/state/qd.db"
    );
}

/// (what is broken, a line appended to a valid queue, the key path of the error)
const BROKEN: &[(&str, &str, &str)] = &[
    (
        "unknown key",
        "lease_time = \"5s\"",
        "queues.demo.lease_time",
    ),
    (
        "wrong type",
        "max_attempts = \"5\"",
        "queues.demo.max_attempts",
    ),
    (
        "lease <= heartbeat",
        "lease = \"5s\"\nheartbeat = \"5s\"",
        "queues.demo.lease",
    ),
    (
        "min > max workers",
        "workers = { min = 5, max = 2 }",
        "queues.demo.workers.min",
    ),
    (
        "unknown rate_limiter",
        "rate_limiter = \"nope\"",
        "queues.demo.rate_limiter",
    ),
    (
        "bad duration",
        "timeout = \"forever\"",
        "queues.demo.timeout",
    ),
    (
        "zero attempts",
        "max_attempts = 0",
        "queues.demo.max_attempts",
    ),
    ("zero timeout", "timeout = \"0s\"", "queues.demo.timeout"),
    (
        "unknown jitter",
        "backoff = { jitter = \"some\" }",
        "queues.demo.backoff.jitter",
    ),
    (
        "unknown tenant cap",
        "tenants.ghost = { max_concurrency = 1 }",
        "queues.demo.tenants.ghost",
    ),
];

#[test]
fn each_broken_queue_setting_is_reported_at_its_key_with_line_and_column() {
    for (what, line, path) in BROKEN {
        let text = format!("{QUEUE}{line}\n");
        let errors = errors(&text);
        let error = error_at(&errors, path);
        assert_eq!(errors.len(), 1, "{what}: exactly one error: {errors:#?}");
        let expected_line = text
            .lines()
            .position(|l| l == line.lines().next().unwrap_or_default());
        assert_eq!(error.line, expected_line.map(|i| i + 1), "{what}: {error}");
        assert!(error.column.is_some(), "{what}");
    }
}

#[test]
fn a_missing_program_and_a_non_executable_program_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("job.sh");
    std::fs::write(&script, "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let source = dir.path().join("qd.toml");
    let text = "[queues.a]\nexecutor = { kind = \"command\", program = \"job.sh\" }\n\
                [queues.b]\nexecutor = { kind = \"command\", program = \"missing.sh\" }\n";
    let errors = Config::parse(text, &source)
        .expect_err("both broken")
        .errors;
    let a = error_at(&errors, "queues.a.executor.program");
    assert!(a.message.contains("not executable (mode 0644)"), "{a}");
    let b = error_at(&errors, "queues.b.executor.program");
    assert!(b.message.contains("does not exist"), "{b}");

    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let text = "[queues.a]\nexecutor = { kind = \"command\", program = \"job.sh\" }\n";
    let config = Config::parse(text, &source).expect("executable now");
    let ExecutorSpec::Command(command) = &config.queues["a"].executor else {
        panic!("command")
    };
    assert_eq!(
        command.program, script,
        "resolved against the config's directory"
    );
}

#[test]
fn bad_sizes_and_a_public_api_without_tokens_are_daemon_errors() {
    let text = format!("[daemon]\nmax_payload = \"lots\"\napi_listen = \"0.0.0.0:7070\"\n{QUEUE}");
    let errors = errors(&text);
    let size = error_at(&errors, "daemon.max_payload");
    assert_eq!((size.line, size.column), (Some(2), Some(15)));
    let api = error_at(&errors, "daemon.api_listen");
    assert_eq!(
        api.message,
        "api_listen 0.0.0.0:7070 is not loopback; set daemon.api_tokens_file"
    );
    let with_tokens =
        format!("[daemon]\napi_listen = \"0.0.0.0:7070\"\napi_tokens_file = \"tokens\"\n{QUEUE}");
    let config = parse(&with_tokens).expect("tokens file given");
    assert_eq!(
        config.daemon.api_tokens_file.as_deref(),
        Some(Path::new("/etc/qd/tokens"))
    );
}

#[test]
fn the_history_cap_defaults_and_refuses_values_that_cannot_work() {
    let config = parse(QUEUE).expect("no [daemon] history");
    assert_eq!(config.daemon.history, HistoryLimits::default());
    let given = format!(
        "[daemon]\nhistory = {{ keep_first = 0, keep_last = 3, max_error = \"512B\" }}\n{QUEUE}"
    );
    let history = parse(&given).expect("valid cap").daemon.history;
    assert_eq!(
        (history.keep_first, history.keep_last, history.max_error),
        (0, 3, 512)
    );
    let bad = format!("[daemon]\nhistory = {{ keep_last = 0, max_error = 10 }}\n{QUEUE}");
    let found = errors(&bad);
    assert!(
        error_at(&found, "daemon.history.keep_last")
            .message
            .contains("at least 1"),
        "{found:#?}"
    );
    assert_eq!(
        error_at(&found, "daemon.history.max_error").message,
        "must be at least 64 bytes (got 10)"
    );
    let typo = errors(&format!("[daemon]\nhistory = {{ keep = 3 }}\n{QUEUE}"));
    assert!(
        error_at(&typo, "daemon.history.keep")
            .message
            .contains("unknown field"),
        "{typo:#?}"
    );
    let negative = errors(&format!(
        "[daemon]\nhistory = {{ keep_first = -1 }}\n{QUEUE}"
    ));
    assert!(!negative.is_empty());
}

#[test]
fn every_problem_in_a_file_is_reported_at_once_in_file_order() {
    let text = r#"
[daemon]
max_payload = "huge"
bogus = 1

[defaults]
lease = "1s"

[queues.a]
executor = { kind = "command", program = "/bin/sh", colour = "red" }
max_attempts = "x"
timeout = "y"

[queues.b]
executor = { kind = "http", url = "not a url" }
rate_limiter = "nope"

[tenants.t]
weight = 0
"#;
    let errors = errors(text);
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "daemon.max_payload",
            "daemon.bogus",
            "defaults.lease", // 1s <= the built-in heartbeat 10s: once, not per queue
            "queues.a.executor.colour",
            "queues.a.max_attempts",
            "queues.a.timeout",
            "queues.b.executor.url",
            "queues.b.rate_limiter",
            "tenants.t.weight",
        ],
        "{errors:#?}"
    );
    let lines: Vec<Option<usize>> = errors.iter().map(|e| e.line).collect();
    let expected = [3, 4, 7, 10, 11, 12, 15, 16, 19].map(Some);
    assert_eq!(lines, expected);
}

#[test]
fn a_bad_value_does_not_also_fail_the_checks_that_compare_against_it() {
    // heartbeat is unreadable, so "lease > heartbeat" cannot be judged: one error.
    let errors = errors(&format!("{QUEUE}lease = \"5s\"\nheartbeat = \"often\"\n"));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    error_at(&errors, "queues.demo.heartbeat");
}

#[test]
fn a_webhook_url_that_does_not_parse_is_one_error() {
    // Checked like `qd check-config`: the machine checks build each executor too,
    // and must not report the url a second time.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("qd.toml");
    std::fs::write(
        &path,
        "[queues.hook]\nexecutor = { kind = \"http\", url = \"not a url\" }\n",
    )
    .expect("write config");
    let errors = Config::load_checked(&path, &crate::machine::Machine)
        .expect_err("a bad url")
        .errors;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        error_at(&errors, "queues.hook.executor.url")
            .message
            .starts_with("invalid url \"not a url\""),
        "{errors:#?}"
    );
}

#[test]
fn a_section_of_the_wrong_shape_is_one_error_in_plain_words() {
    let not_a_table = errors("queues = 5\n");
    assert_eq!(not_a_table.len(), 1, "{not_a_table:#?}");
    assert_eq!(not_a_table[0].path, "queues");
    let number = errors(&format!("{QUEUE}workers = 4\n"));
    let workers = error_at(&number, "queues.demo.workers");
    assert!(
        workers.message.contains("expected a table like { min = 1"),
        "{workers}"
    );
}

#[test]
fn syntax_errors_have_line_and_column() {
    let errors = errors("[queues.a]\nlease = \"30s\nheartbeat = 5\n");
    assert!(!errors.is_empty());
    assert_eq!(errors[0].line, Some(2), "{errors:#?}");
    assert!(errors[0].column.is_some());
}

#[test]
fn the_display_is_file_line_column_path_message_one_per_line() {
    let err = parse(&format!("{QUEUE}leese = 1\nmax_attempts = 0\n")).expect_err("broken");
    let shown = err.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "{shown}");
    assert!(
        lines[0].starts_with("/etc/qd/qd.toml:4:1: queues.demo.leese: unknown field `leese`"),
        "{shown}"
    );
    assert_eq!(
        lines[1],
        "/etc/qd/qd.toml:5:16: queues.demo.max_attempts: must be at least 1"
    );
}

#[test]
fn an_explicit_exit_code_list_takes_codes_from_the_defaulted_lists() {
    let text = "[queues.a]\nexecutor = { kind = \"command\", program = \"/bin/sh\", \
                exit_codes = { transient = [75, 64], other = \"permanent\" } }\n";
    let config = parse(text).expect("valid");
    let ExecutorSpec::Command(command) = &config.queues["a"].executor else {
        panic!("command")
    };
    assert_eq!(command.exit_codes.transient, [75, 64]);
    assert_eq!(command.exit_codes.permanent, [65]);
    assert_eq!(command.exit_codes.other, ErrorClass::Permanent);
    let clash = "[queues.a]\nexecutor = { kind = \"command\", program = \"/bin/sh\", \
                 exit_codes = { transient = [3], permanent = [3, 0] } }\n";
    let errors = errors(clash);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    error_at(&errors, "queues.a.executor.exit_codes.transient");
    error_at(&errors, "queues.a.executor.exit_codes.permanent");
}

#[test]
fn keys_of_another_executor_kind_and_queue_only_keys_in_defaults_are_refused() {
    let text = "[defaults]\nrate_limiter = \"x\"\n[queues.a]\n\
                executor = { kind = \"external\", program = \"/bin/sh\" }\n";
    let errors = errors(text);
    error_at(&errors, "defaults.rate_limiter");
    error_at(&errors, "queues.a.executor.program");
    assert_eq!(errors.len(), 2, "{errors:#?}");
}

/// The `# expect: PATH -- why` comment on line 1 of a fixture (`-` for no path).
fn expected_path(text: &str) -> &str {
    let first = text.lines().next().unwrap_or_default();
    let spec = first
        .strip_prefix("# expect: ")
        .expect("fixture starts with # expect:");
    let path = spec.split(" -- ").next().unwrap_or_default().trim();
    if path == "-" { "" } else { path }
}

#[test]
fn every_fixture_fails_with_exactly_the_error_its_first_line_names() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("fixtures dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read fixture");
        let err = Config::load(&path).expect_err(&path.display().to_string());
        let want = expected_path(&text);
        assert_eq!(err.errors.len(), 1, "{}: {err}", path.display());
        assert_eq!(err.errors[0].path, want, "{}: {err}", path.display());
        assert!(err.errors[0].line.is_some() || want == "queues", "{err}");
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} fixtures");
}

#[test]
fn the_example_configs_compile() {
    for name in ["config/qd.toml", "config/production.toml"] {
        let path = repo_dir().join(name);
        let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(config.queues.len() >= 2, "{name}");
    }
    let local = Config::load(&repo_dir().join("config/qd.toml")).expect("qd.toml");
    assert_eq!(
        local.daemon.data_dir,
        repo_dir().join("var/qd"),
        "no config/../ in the path"
    );
    assert_eq!(local.tenant("acme").weight, 3);
    assert_eq!(local.tenant("acme").max_concurrency, Some(4));
    let demo = &local.queues["demo"];
    assert_eq!(demo.max_attempts, 3);
    assert_eq!(demo.backoff.max, Duration::from_secs(10));
    let production = Config::load(&repo_dir().join("config/production.toml")).expect("production");
    assert_eq!(production.db_path(), Path::new("/var/lib/qd/qd.db"));
    assert_eq!(production.daemon.admin_group.as_deref(), Some("qd"));
    assert_eq!(
        production.queues["reports"].executor,
        ExecutorSpec::External
    );
}

#[test]
fn the_summary_names_queues_tenants_and_limiters_and_a_missing_file_is_an_error() {
    let config = Config::load(&repo_dir().join("config/qd.toml")).expect("qd.toml");
    let summary = config.summary();
    assert!(
        summary.starts_with("config OK: 3 queues (demo, echo, hooks), 2 tenants, 1 rate limiter"),
        "{summary}"
    );
    let err = Config::load(Path::new("/nonexistent/qd.toml")).expect_err("missing file");
    assert!(
        err.to_string()
            .starts_with("/nonexistent/qd.toml: cannot read config file: "),
        "a problem without a line reads FILE: MESSAGE: {err}"
    );
}

/// Lines that are TOML-ish: sections, known keys, odd values, broken syntax.
fn tomlish_line() -> impl Strategy<Value = String> {
    let section = prop::sample::select(vec![
        "[daemon]",
        "[defaults]",
        "[queues.a]",
        "[queues.b]",
        "[queues]",
        "[tenants.t]",
        "[rate_limiters.r]",
        "[[queues.c]]",
        "[queues.a.executor]",
        "[queues.a.workers]",
    ]);
    let key = prop::sample::select(vec![
        "lease",
        "heartbeat",
        "timeout",
        "max_attempts",
        "workers",
        "backoff",
        "executor",
        "rate_limiter",
        "tenants",
        "weight",
        "per_second",
        "burst",
        "max_payload",
        "api_listen",
        "data_dir",
        "kind",
        "program",
        "url",
        "min",
        "max",
        "restart",
        "a.b.c",
        "\"q.u\"",
    ]);
    let value = prop::sample::select(vec![
        "\"30s\"",
        "\"0s\"",
        "0",
        "-1",
        "18446744073709551615",
        "99999999999999999999",
        "\"1MiB\"",
        "\"x\"",
        "true",
        "[]",
        "[1, \"a\"]",
        "{}",
        "{ kind = \"command\" }",
        "{ kind = \"external\" }",
        "{ kind = \"http\", url = \"http://h\" }",
        "{ min = 9, max = 1 }",
        "1979-05-27T07:32:00Z",
        "nan",
        "\"0.0.0.0:1\"",
        "{ max = 0 }",
        "\"",
    ]);
    prop_oneof![
        section.prop_map(str::to_owned),
        (key, value).prop_map(|(k, v)| format!("{k} = {v}")),
        "[ -~]{0,20}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn parse_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
        let _ = parse(&text);
    }

    #[test]
    fn parse_never_panics_on_tomlish_documents(lines in prop::collection::vec(tomlish_line(), 0..12)) {
        let text = lines.join("\n");
        if let Err(e) = parse(&text) {
            prop_assert!(!e.errors.is_empty());
        }
    }
}

#[test]
fn machine_checks_are_reported_in_the_same_pass_as_file_problems() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, "[[tokens]]\nname = \"x\"\n").expect("write tokens");
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let text = format!(
        r#"
[daemon]
api_tokens_file = "{}"
admin_group = "no-such-group-qd-test"
bogus = 1

[queues.a]
executor = {{ kind = "http", url = "http://127.0.0.1:1/", headers = {{ "bad header" = "v" }} }}
lease = "soon"
"#,
        tokens.display()
    );
    let path = dir.path().join("qd.toml");
    std::fs::write(&path, &text).expect("write config");
    let errors = Config::load_checked(&path, &crate::machine::Machine)
        .expect_err("invalid")
        .errors;
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    for expected in [
        "daemon.api_tokens_file",
        "daemon.admin_group",
        "daemon.bogus",
        "queues.a.executor",
        "queues.a.lease",
    ] {
        assert!(paths.contains(&expected), "{expected} in {errors:#?}");
    }
    assert!(
        Config::load(&path).expect_err("still invalid").errors.len() < errors.len(),
        "Config::load leaves the machine alone"
    );
}

#[test]
fn relative_paths_are_normalised() {
    let config = Config::parse(
        "[daemon]\ndata_dir = \"../var/./qd\"\n[queues.q]\nexecutor = { kind = \"external\" }\n",
        Path::new("/etc/qd/conf/qd.toml"),
    )
    .expect("config");
    assert_eq!(config.daemon.data_dir, Path::new("/etc/qd/var/qd"));
}

#[test]
fn database_url_selects_postgres_and_never_holds_or_shows_a_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("db.secret");
    std::fs::write(&secret, "s3cr3t-pw\n").expect("write password");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let text = format!(
        "[daemon]\ndatabase_url = \"postgresql://qd@db.internal:6543/jobs\"\n\
         database_password_file = \"{}\"\n{QUEUE}",
        secret.display()
    );
    let path = dir.path().join("qd.toml");
    std::fs::write(&path, &text).expect("write config");
    let config = Config::load_checked(&path, &crate::machine::Machine).expect("valid");
    let database = config.daemon.database.clone().expect("PostgreSQL store");
    let client = database.client_config().expect("client config");
    assert_eq!(client.get_password(), Some(&b"s3cr3t-pw"[..]));
    assert_eq!(client.get_dbname(), Some("jobs"));
    let summary = config.summary();
    assert!(
        summary.contains("PostgreSQL database \"jobs\" on db.internal:6543 as \"qd\""),
        "{summary}"
    );
    assert!(!summary.contains("s3cr3t"), "{summary}");
    assert!(!format!("{config:?}").contains("s3cr3t"));
    let sqlite = parse(QUEUE).expect("no database_url");
    assert_eq!(sqlite.daemon.database, None);
    assert!(sqlite.summary().contains("SQLite /var/lib/qd/qd.db"));
}

#[test]
fn a_password_in_the_url_or_a_readable_password_file_is_a_config_error() {
    for url in [
        "postgresql://qd:hunter2@db/qd",
        "host=db user=qd password=hunter2 dbname=qd",
    ] {
        let found = errors(&format!("[daemon]\ndatabase_url = \"{url}\"\n{QUEUE}"));
        let error = error_at(&found, "daemon.database_url");
        assert!(error.message.contains("holds a password"), "{error:?}");
        assert!(!error.message.contains("hunter2"), "{error:?}");
    }
    let found = errors(&format!(
        "[daemon]\ndatabase_url = \"host=db port=x\"\n{QUEUE}"
    ));
    let error = error_at(&found, "daemon.database_url");
    assert!(
        error.message.contains("not a libpq connection string"),
        "{error:?}"
    );
    let found = errors(&format!(
        "[daemon]\ndatabase_password_file = \"/etc/qd/pw\"\n{QUEUE}"
    ));
    let error = error_at(&found, "daemon.database_password_file");
    assert!(
        error.message.contains("without daemon.database_url"),
        "{error:?}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("db.secret");
    std::fs::write(&secret, "hunter2\n").expect("write password");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let path = dir.path().join("qd.toml");
    let text = format!(
        "[daemon]\ndatabase_url = \"host=/run/postgresql dbname=qd\"\n\
         database_password_file = \"db.secret\"\n{QUEUE}"
    );
    std::fs::write(&path, text).expect("write config");
    let found = Config::load_checked(&path, &crate::machine::Machine)
        .expect_err("group-readable")
        .errors;
    let error = error_at(&found, "daemon.database_password_file");
    assert!(
        error.message.contains(&secret.display().to_string()),
        "{error:?}"
    );
    assert!(error.message.contains("0640"), "{error:?}");
    assert!(!error.message.contains("hunter2"), "{error:?}");
}

#[test]
fn cluster_keys_need_a_database_and_sane_values() {
    let url = "[daemon]\ndatabase_url = \"host=/run/postgresql dbname=qd\"\n";
    let config = parse(&format!(
        "{url}node_name = \"qd-a\"\nnode_timeout = \"4s\"\npoll_interval = \"250ms\"\n{QUEUE}"
    ))
    .expect("valid cluster keys");
    let database = config.daemon.database.expect("PostgreSQL store");
    assert_eq!(database.node_name, "qd-a");
    assert_eq!(database.node_timeout, Duration::from_secs(4));
    assert_eq!(database.poll_interval, Duration::from_millis(250));
    let defaults = parse(&format!("{url}{QUEUE}")).expect("defaults");
    let database = defaults.daemon.database.expect("PostgreSQL store");
    assert!(!database.node_name.is_empty());
    assert_eq!(database.node_timeout, Duration::from_secs(10));
    assert_eq!(database.poll_interval, Duration::from_secs(1));
    for (key, value, says) in [
        (
            "node_name",
            "\"a b\"",
            "invalid node name \"a b\": use 1 to 64 characters",
        ),
        ("node_name", "\"\"", "use 1 to 64 characters"),
        ("node_timeout", "\"500ms\"", "at least 1s"),
        ("poll_interval", "\"5ms\"", "between 10ms and 60s"),
        ("poll_interval", "\"2m\"", "between 10ms and 60s"),
    ] {
        let found = errors(&format!("{url}{key} = {value}\n{QUEUE}"));
        let error = error_at(&found, &format!("daemon.{key}"));
        assert!(error.message.contains(says), "{key} = {value}: {error:?}");
    }
    for (key, value) in [
        ("node_name", "\"qd-a\""),
        ("node_timeout", "\"4s\""),
        ("poll_interval", "\"1s\""),
    ] {
        let found = errors(&format!("[daemon]\n{key} = {value}\n{QUEUE}"));
        let error = error_at(&found, &format!("daemon.{key}"));
        assert!(
            error.message.contains("without daemon.database_url"),
            "{key}: {error:?}"
        );
    }
}

#[test]
fn fence_wait_covers_every_command_queues_kill_grace() {
    let url = "[daemon]\ndatabase_url = \"host=/run/postgresql dbname=qd\"\n";
    let queue = |grace: &str| {
        format!(
            "[queues.work]\nexecutor = {{ kind = \"command\", program = \"/bin/true\" }}\n\
             kill_grace = \"{grace}\"\n"
        )
    };
    // Derived: the longest kill_grace plus the margin.
    let derived = parse(&format!("{url}{}", queue("30s"))).expect("derived fence_wait");
    assert_eq!(derived.fence_wait(), Some(Duration::from_secs(31)));
    // Written and long enough.
    let written = parse(&format!("{url}fence_wait = \"6s\"\n{}", queue("5s"))).expect("6s");
    assert_eq!(written.fence_wait(), Some(Duration::from_secs(6)));
    // Written too short: the error names both keys.
    let found = errors(&format!("{url}fence_wait = \"5s\"\n{}", queue("5s")));
    let error = error_at(&found, "queues.work.kill_grace");
    assert!(error.message.contains("daemon.fence_wait"), "{error:?}");
    assert!(error.message.contains("at least 6s"), "{error:?}");
    // One node on SQLite: no fencing, no such key.
    assert_eq!(parse(&queue("30s")).expect("sqlite").fence_wait(), None);
    let found = errors(&format!("[daemon]\nfence_wait = \"5s\"\n{}", queue("1s")));
    let error = error_at(&found, "daemon.fence_wait");
    assert!(
        error.message.contains("without daemon.database_url"),
        "{error:?}"
    );
}

#[test]
fn a_schedule_compiles_with_its_defaults_and_its_keys() {
    let text = format!(
        r#"{QUEUE}
[schedules.nightly]
queue = "demo"
cron = "0 3 * * *"
timezone = "Europe/Berlin"
payload = "{{}}"
tenant = "acme"
max_attempts = 3
jitter = "30s"
catch_up = "all"
max_catch_up = 4
overlap = "skip"

[schedules.often]
queue = "demo"
every = "15m"
payload_b64 = "aGk="
"#
    );
    let config = parse(&text).expect("valid");
    let nightly = &config.schedules["nightly"];
    assert_eq!(nightly.queue, "demo");
    assert_eq!(nightly.timing.tz, chrono_tz::Europe::Berlin);
    assert_eq!(nightly.timing.jitter, Duration::from_secs(30));
    assert_eq!(nightly.catch_up, crate::schedule::CatchUp::All { max: 4 });
    assert_eq!(nightly.overlap, crate::schedule::Overlap::Skip);
    assert_eq!(nightly.payload, b"{}");
    let often = &config.schedules["often"];
    assert_eq!(
        often.timing.spec,
        crate::schedule::Spec::Every(Duration::from_secs(900))
    );
    assert_eq!(often.catch_up, crate::schedule::CatchUp::Latest);
    assert_eq!(often.payload, b"hi");
}

#[test]
fn every_bad_schedule_key_is_reported_at_its_place_in_one_pass() {
    let text = format!(
        r#"{QUEUE}
[schedules.a]
queue = "demo"
cron = "61 * * * *"

[schedules.b]
queue = "demo"
cron = "0 3 * * *"
timezone = "Mars/Olympus"

[schedules.c]
queue = "nope"
every = "1m"

[schedules.d]
queue = "demo"
every = "1m"
colour = "red"

[schedules.e]
queue = "demo"
every = "1m"
catch_up = "sometimes"
jitter = "2m"

[schedules.f]
queue = "demo"

[schedules.g]
queue = "demo"
every = "1m"
timezone = "UTC"
payload = "x"
payload_b64 = "eA=="

[schedules.h]
queue = "demo"
every = "1m"
payload_b64 = "!!"
max_catch_up = 3

[schedules.i]
queue = "demo"
every = "1m"
cron = "* * * * *"

[schedules."bad name"]
queue = "demo"
every = "1m"
"#
    );
    let errors = errors(&text);
    let a = error_at(&errors, "schedules.a.cron");
    assert!(
        a.message.contains("invalid cron expression \"61 * * * *\""),
        "{a:?}"
    );
    assert_eq!(a.line, Some(7));
    let b = error_at(&errors, "schedules.b.timezone");
    assert!(
        b.message.contains("unknown time zone \"Mars/Olympus\""),
        "{b:?}"
    );
    let c = error_at(&errors, "schedules.c.queue");
    assert!(
        c.message.contains("unknown queue \"nope\" (known: demo)"),
        "{c:?}"
    );
    let d = error_at(&errors, "schedules.d.colour");
    assert!(d.message.contains("unknown field"), "{d:?}");
    let e = error_at(&errors, "schedules.e.catch_up");
    assert!(e.message.contains("sometimes"), "{e:?}");
    let jitter = error_at(&errors, "schedules.e.jitter");
    assert!(jitter.message.contains("shorter than every"), "{jitter:?}");
    let f = error_at(&errors, "schedules.f");
    assert!(f.message.contains("missing key `cron` or `every`"), "{f:?}");
    let g = error_at(&errors, "schedules.g.timezone");
    assert!(g.message.contains("only applies to cron"), "{g:?}");
    let g = error_at(&errors, "schedules.g.payload_b64");
    assert!(g.message.contains("either payload or payload_b64"), "{g:?}");
    let h = error_at(&errors, "schedules.h.payload_b64");
    assert!(h.message.contains("not valid base64"), "{h:?}");
    let h = error_at(&errors, "schedules.h.max_catch_up");
    assert!(
        h.message.contains("only applies with catch_up = \"all\""),
        "{h:?}"
    );
    let i = error_at(&errors, "schedules.i.every");
    assert!(i.message.contains("either cron or every"), "{i:?}");
    let j = error_at(&errors, "schedules.\"bad name\"");
    assert!(j.message.contains("invalid schedule name"), "{j:?}");
    assert!(f.message.contains("missing key `cron` or `every`"), "{f:?}");
    assert!(errors.iter().all(|e| e.line.is_some()), "{errors:#?}");
}

#[test]
fn api_allowed_hosts_are_host_names_and_a_url_is_refused_naming_the_key() {
    let ok = format!(
        "[daemon]\napi_allowed_hosts = [\"qd.internal\", \"qd.example.com:8443\"]\n{QUEUE}"
    );
    let config = parse(&ok).expect("valid");
    assert_eq!(
        config.daemon.api_allowed_hosts,
        ["qd.internal", "qd.example.com:8443"]
    );
    let bad = format!("[daemon]\napi_allowed_hosts = [\"https://qd.internal/\"]\n{QUEUE}");
    let errors = errors(&bad);
    let err = error_at(&errors, "daemon.api_allowed_hosts");
    assert!(err.message.contains("no scheme"), "{}", err.message);
}
