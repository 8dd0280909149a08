//! The SQS-compatible API against unmodified AWS clients: the Python suite
//! `daemon/tests/sqs/sqs_suite.py` runs with current boto3/botocore (the AWS JSON
//! 1.0 protocol) and with botocore 1.34.89 (the query protocol) against a real qd.
//!
//! The clients live in virtual environments `.ci/run` creates: `.ci/venv` and
//! `.ci/venv-query`. Without them the tests fail under `CI=true` and skip visibly
//! elsewhere (`common::tool_missing`).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Qd, tool_missing};
use serde_json::json;

const CONFIG: &str = r#"
[sqs]
enabled = true

[queues.jobs]
executor = { kind = "external" }
lease = "30s"
max_attempts = 100
backoff = { base = "10ms", max = "10ms" }

[queues.other]
executor = { kind = "external" }

[queues.celery]
executor = { kind = "external" }
lease = "10s"
heartbeat = "3s"
max_attempts = 100
backoff = { base = "10ms", max = "100ms" }

[queues.cmd]
executor = { kind = "command", program = "/bin/true" }
"#;

/// The Python of the virtual environment `.ci/<name>`, if `.ci/run` made it; if
/// not, the test fails under `CI=true` and says it skips elsewhere.
fn venv_python(name: &str) -> Option<PathBuf> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.ci")
        .join(name)
        .join("bin/python");
    if python.exists() {
        return Some(python);
    }
    tool_missing(
        &format!(".ci/{name}"),
        "run .ci/run, or create the venv with the pip install it does",
    );
    None
}

/// Runs `daemon/tests/sqs/<script>` with the venv's Python against `qd`, with
/// `env`; panics with its output and qd's log if it fails.
fn run_python(python: &PathBuf, script: &str, qd: &Qd, env: &[(&str, &str)]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sqs")
        .join(script);
    let mut cmd = Command::new(python);
    cmd.arg(path)
        .env("QD_SQS_ENDPOINT", &qd.api)
        .env("AWS_EC2_METADATA_DISABLED", "true");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run python");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{script} failed:\n{text}\n--- qd log ---\n{}",
        qd.logs()
    );
    assert!(text.contains("OK"), "{text}");
}

fn suite(venv: &str, protocol: &str) {
    let Some(python) = venv_python(venv) else {
        return;
    };
    let qd = Qd::start(CONFIG);
    run_python(
        &python,
        "sqs_suite.py",
        &qd,
        &[("QD_SQS_PROTOCOL", protocol)],
    );
}

#[test]
fn boto3_over_the_json_protocol_passes_the_sqs_suite() {
    suite("venv", "json");
}

#[test]
fn botocore_1_34_89_over_the_query_protocol_passes_the_sqs_suite() {
    suite("venv-query", "query");
}

#[test]
fn a_queue_made_by_create_queue_survives_kill_9_with_its_attributes() {
    let Some(python) = venv_python("venv") else {
        return;
    };
    let mut qd = Qd::start(CONFIG);
    run_python(
        &python,
        "created_restart.py",
        &qd,
        &[("QD_PHASE", "create")],
    );
    qd.kill9();
    qd.spawn(&[]);
    run_python(&python, "created_restart.py", &qd, &[("QD_PHASE", "check")]);
    let queues = common::ok(&qd, &["queues"]);
    assert!(
        queues.lines().any(|l| l.starts_with("durable ")),
        "qctl queues lists the created queue:\n{queues}"
    );
}

/// A created queue's `MessageRetentionPeriod` (60 s here) once qd's wall clock is
/// 61 s on (jumped through the `QD_TEST_WALL_OFFSET_FILE` hook, so nothing waits
/// a minute): a message sent before is never received and ends `cancelled` by the
/// retention, both when it waited and when it was in flight (its old handle then
/// deletes nothing and succeeds), while a queue of the default period (4 days)
/// keeps its message.
#[test]
fn a_message_past_its_queues_retention_period_is_never_received() {
    let work = tempfile::tempdir().expect("tempdir");
    let offset = work.path().join("wall-offset-ms");
    std::fs::write(&offset, "0").expect("offset");
    let qd = Qd::start_with(
        "[sqs]\nenabled = true\n\n[queues.probe]\nexecutor = { kind = \"external\" }\n",
        &[("QD_TEST_WALL_OFFSET_FILE", &offset.display().to_string())],
    );
    let create = |name: &str, attributes: serde_json::Value| {
        let (status, answer) = qd.sqs(
            "CreateQueue",
            json!({"QueueName": name, "Attributes": attributes}),
        );
        assert_eq!(status, 200, "{answer}");
        answer["QueueUrl"].clone()
    };
    let brief = create("brief", json!({"MessageRetentionPeriod": "60"}));
    let lasting = create("lasting", json!({}));
    let send = |url: &serde_json::Value, body: &str| {
        let (status, answer) = qd.sqs("SendMessage", json!({"QueueUrl": url, "MessageBody": body}));
        assert_eq!(status, 200, "{answer}");
        answer["MessageId"].as_str().expect("MessageId").to_string()
    };
    let receive = |url: &serde_json::Value, params: serde_json::Value| {
        let mut params = params;
        params["QueueUrl"] = url.clone();
        params["MaxNumberOfMessages"] = json!(10);
        let (status, answer) = qd.sqs("ReceiveMessage", params);
        assert_eq!(status, 200, "{answer}");
        answer["Messages"].as_array().cloned().unwrap_or_default()
    };
    let held = send(&brief, "held");
    let got = receive(
        &brief,
        json!({"WaitTimeSeconds": 10, "VisibilityTimeout": 600}),
    );
    assert_eq!(got[0]["MessageId"], held.as_str(), "{got:?}");
    let handle = got[0]["ReceiptHandle"].clone();
    let old = send(&brief, "old");
    let kept = send(&lasting, "kept");

    let before = qd.enqueue("probe", "before");
    let before_at = qd.job(&before)["created_at"].as_i64().expect("created_at");
    std::fs::write(&offset, "61000").expect("jump");
    common::wait_for("qd's wall clock to jump", Duration::from_secs(10), || {
        let probe = qd.enqueue("probe", "after");
        (qd.job(&probe)["created_at"].as_i64() >= Some(before_at + 61_000)).then_some(())
    });
    assert!(
        receive(&brief, json!({})).is_empty(),
        "a message past its period was received"
    );
    let got = receive(&lasting, json!({"WaitTimeSeconds": 10}));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["MessageId"], kept.as_str(), "{got:?}");
    for id in [&old, &held] {
        let job = common::wait_for(
            "the expired message to end",
            Duration::from_secs(20),
            || {
                let job = qd.job(id);
                (job["state"] == "cancelled").then_some(job)
            },
        );
        assert!(
            job.to_string()
                .contains("sqs MessageRetentionPeriod passed"),
            "{job}"
        );
    }
    let (status, answer) = qd.sqs(
        "DeleteMessage",
        json!({"QueueUrl": brief, "ReceiptHandle": handle}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(qd.job(&held)["state"], "cancelled");
    assert_eq!(qd.job(&kept)["state"], "leased");
}

const KEY: &str = "AKIDQDTESTFULL0001";
const SECRET: &str = "full-secret-0123456789abcdef";
const LIMITED_KEY: &str = "AKIDQDTESTLIMITED1";
const LIMITED_SECRET: &str = "limited-secret-0123456789abcdef";

#[test]
fn sigv4_with_a_token_file_accepts_good_signatures_and_refuses_the_rest() {
    let Some(python) = venv_python("venv") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            r#"
[[tokens]]
name = "all"
token = "bearer-secret-all-0123456789"
roles = ["produce", "work", "read"]
queues = ["*"]
access_key_id = "{KEY}"
secret_access_key = "{SECRET}"

[[tokens]]
name = "limited"
token = "bearer-secret-limited-0123456789"
roles = ["produce"]
queues = ["other"]
access_key_id = "{LIMITED_KEY}"
secret_access_key = "{LIMITED_SECRET}"
"#
        ),
    )
    .expect("write tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // The harness appends this to the [daemon] table it writes.
    let config = format!("api_tokens_file = \"{}\"\n{CONFIG}", tokens.display());
    let qd = Qd::start(&config);
    run_python(
        &python,
        "sigv4_suite.py",
        &qd,
        &[
            ("QD_KEY", KEY),
            ("QD_SECRET", SECRET),
            ("QD_LIMITED_KEY", LIMITED_KEY),
            ("QD_LIMITED_SECRET", LIMITED_SECRET),
        ],
    );
}

#[test]
fn the_aws_cli_sends_receives_and_deletes_a_message() {
    let Some(python) = venv_python("venv") else {
        return;
    };
    let bin = python.parent().expect("venv bin dir").to_path_buf();
    if !bin.join("aws").exists() {
        return tool_missing(
            ".ci/venv/bin/aws",
            "pip install awscli into .ci/venv (.ci/run does)",
        );
    }
    let qd = Qd::start(CONFIG);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sqs/awscli_check.sh");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .arg(script)
        .env("PATH", path)
        .env("QD_SQS_ENDPOINT", &qd.api)
        .output()
        .expect("run sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("OK: sent, received and deleted"),
        "{text}\n--- qd log ---\n{}",
        qd.logs()
    );
}

/// The tasks `celery_enqueue.py` sent that a run of `celery_tasks.record` recorded.
fn tasks_done(dir: &std::path::Path) -> std::collections::BTreeSet<u32> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    e.ok()?
                        .file_name()
                        .to_str()?
                        .split('.')
                        .next()?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_celery_worker_runs_delay_tasks_and_survives_kill_9_of_qd() {
    let Some(python) = venv_python("venv") else {
        return;
    };
    let bin = python.parent().expect("venv bin dir").to_path_buf();
    if !bin.join("celery").exists() {
        return tool_missing(
            ".ci/venv/bin/celery",
            "pip install 'celery[sqs]' pycurl into .ci/venv (.ci/run does)",
        );
    }
    let mut qd = Qd::start(CONFIG);
    let done = tempfile::tempdir().expect("tempdir");
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sqs");
    let env = |cmd: &mut Command, api: &str| {
        cmd.current_dir(&tests)
            .env("QD_SQS_ENDPOINT", api)
            .env("QD_DONE_DIR", done.path())
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("PYTHONPATH", &tests);
    };
    let enqueue = |api: &str, n: u32, first: u32| {
        let mut cmd = Command::new(&python);
        cmd.arg("celery_enqueue.py")
            .arg(n.to_string())
            .arg(first.to_string());
        env(&mut cmd, api);
        let out = cmd.output().expect("run celery_enqueue.py");
        assert!(
            out.status.success(),
            "enqueue failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    enqueue(&qd.api, 40, 0);
    let log = std::fs::File::create(qd.dir.path().join("celery-worker.log")).ok();
    let mut worker = Command::new(bin.join("celery"));
    worker.args([
        "-A",
        "celery_tasks",
        "worker",
        "--pool",
        "threads",
        "-c",
        "2",
        "--loglevel",
        "INFO",
    ]);
    env(&mut worker, &qd.api);
    if let Some(log) = log {
        worker.stdout(log.try_clone().expect("log")).stderr(log);
    }
    let mut worker = worker.spawn().expect("start celery worker");
    // Kill qd while the worker is part way through the first tasks.
    common::wait_for("the worker's first tasks", Duration::from_secs(60), || {
        (tasks_done(done.path()).len() >= 5).then_some(())
    });
    qd.kill9();
    qd.spawn(&[]);
    enqueue(&qd.api, 20, 40);
    let all: std::collections::BTreeSet<u32> = (0..60).collect();
    let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        common::wait_for("every task to run", Duration::from_secs(120), || {
            (tasks_done(done.path()) == all).then_some(())
        })
    }));
    let _ = worker.kill();
    let _ = worker.wait();
    if finished.is_err() {
        let missing: Vec<u32> = all.difference(&tasks_done(done.path())).copied().collect();
        let worker_log =
            std::fs::read_to_string(qd.dir.path().join("celery-worker.log")).unwrap_or_default();
        panic!(
            "tasks never ran: {missing:?}\n--- worker log ---\n{worker_log}\n--- qd log ---\n{}",
            qd.logs()
        );
    }
}
