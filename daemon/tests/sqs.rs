//! The SQS-compatible API against unmodified AWS clients: the Python suite
//! `daemon/tests/sqs/sqs_suite.py` runs with current boto3/botocore (the AWS JSON
//! 1.0 protocol) and with botocore 1.34.89 (the query protocol) against a real qd.
//!
//! The clients live in virtual environments `.ci/run` creates: `.ci/venv` and
//! `.ci/venv-query`. Without them the tests fail under `CI=true` and skip visibly
//! elsewhere (`common::tool_missing`).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{Qd, tool_missing};

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

[queues.cmd]
executor = { kind = "command", program = "/bin/true" }
"#;

/// The Python of the virtual environment `.ci/<name>`, if `.ci/run` made it.
fn venv_python(name: &str) -> Option<PathBuf> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.ci")
        .join(name)
        .join("bin/python");
    python.exists().then_some(python)
}

fn suite(venv: &str, protocol: &str) {
    let Some(python) = venv_python(venv) else {
        tool_missing(
            &format!(".ci/{venv}"),
            "run .ci/run, or create the venv with the pip install it does",
        );
        return;
    };
    let qd = Qd::start(CONFIG);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sqs/sqs_suite.py");
    let out = Command::new(python)
        .arg(script)
        .env("QD_SQS_ENDPOINT", &qd.api)
        .env("QD_SQS_PROTOCOL", protocol)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("run python");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the SQS suite failed ({protocol}):\n{text}\n--- qd log ---\n{}",
        qd.logs()
    );
    assert!(text.contains("OK"), "{text}");
}

#[test]
fn boto3_over_the_json_protocol_passes_the_sqs_suite() {
    suite("venv", "json");
}

#[test]
fn botocore_1_34_89_over_the_query_protocol_passes_the_sqs_suite() {
    suite("venv-query", "query");
}
