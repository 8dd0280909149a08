//! The web console in a real browser: headless Chromium driven by Selenium
//! (`daemon/tests/browser/console_browser.py`, in the venv `.ci/run` makes at
//! `.ci/venv`) against the real qd. It logs in, sees the overview change live when
//! jobs are enqueued, checks that a `<script>` payload is shown as text and never
//! runs, redrives dead jobs by filter, pauses a queue (and qctl agrees), and loads
//! an attacker page on another site that auto-submits a form to the console: 403,
//! and the queue stays paused. Screenshots are saved in the test's temp dir.
//! Missing Chromium, chromedriver or the venv: fails under `CI=true`, else skips
//! visibly.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Qd, free_port, json_of, tool_missing, wait_for};

const TOKEN: &str = "browser-secret-0123456789";

fn venv_python() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/venv/bin/python")
}

#[test]
fn the_console_works_in_a_real_browser_and_an_attacker_page_changes_nothing() {
    let python = venv_python();
    for (tool, present) in [
        (
            "/usr/bin/chromium",
            PathBuf::from("/usr/bin/chromium").exists(),
        ),
        (
            "/usr/bin/chromedriver",
            PathBuf::from("/usr/bin/chromedriver").exists(),
        ),
        (".ci/venv with selenium", python.exists()),
    ] {
        if !present {
            tool_missing(
                tool,
                "apt-get install chromium chromium-driver; .ci/run makes .ci/venv with selenium",
            );
            return;
        }
    }
    let port = free_port();
    let mut qd = Qd::configure_with_tokens(
        &format!(
            "[[tokens]]\nname = \"browser\"\ntoken = \"{TOKEN}\"\nroles = [\"produce\", \"work\", \"read\", \"admin\"]\nqueues = [\"*\"]\n"
        ),
        &format!(
            "[console]\nlisten = \"127.0.0.1:{port}\"\npath_prefix = \"/qd\"\n\n[queues.ext]\nexecutor = {{ kind = \"external\" }}\n"
        ),
    );
    qd.spawn(&[]);
    let console = qd.console_addr().expect("console listen");
    wait_for("the console", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&console).ok()
    });
    let shots = qd.dir.path().join("screenshots");
    let profile = qd.dir.path().join("chromium-profile");
    std::fs::create_dir_all(&shots).expect("shots dir");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser/console_browser.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("CONSOLE", format!("http://{console}/qd"))
        .env("API", &qd.api)
        .env("TOKEN", TOKEN)
        .env("SHOTS", &shots)
        .env("PROFILE", &profile)
        .output()
        .expect("run the browser script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "browser script failed:\n{stdout}\n{stderr}\nqd log:\n{}",
        qd.logs()
    );
    // qctl agrees the queue is paused: the attacker's resume changed nothing.
    let queues = json_of(&qd, &["queues"]);
    let ext = queues["queues"]
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["name"] == "ext"))
        .expect("ext listed");
    assert_eq!(ext["paused"], true, "{queues}");
    let logs = qd.logs();
    assert!(
        logs.contains("Console refused a cross-site request"),
        "{logs}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains("op=\"queue_pause\"") && l.contains("by=\"console:browser\"")),
        "{logs}"
    );
    for name in [
        "overview",
        "overview-live",
        "job",
        "dlq",
        "redrive-confirm",
        "queue-paused",
        "attacker-refused",
        "jobs",
        "limits",
        "queue",
    ] {
        let png = shots.join(format!("{name}.png"));
        let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        assert!(size > 1000, "screenshot {name} missing or empty");
    }
    eprintln!("screenshots in {}", shots.display());
}
