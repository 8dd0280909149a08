//! Operational safety, through the real `qd` and `qctl` binaries:
//! - one daemon per data directory: a second `qd` on the same `data_dir` (or the
//!   same admin socket) exits 1 at once with one line, and the first daemon's running
//!   job runs exactly once;
//! - SIGHUP and `qctl reload`: a bad file (syntax, unknown key, invalid value,
//!   unreadable) changes nothing and qd keeps serving; a good one adds a queue and
//!   changes a weight live;
//! - `qctl backup`: a snapshot taken under load, restored into a fresh `data_dir`,
//!   holds every job accepted before it.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Qd, alive, history, qd_bin, script, wait_for};

const LONG: Duration = Duration::from_secs(60);

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A config for a second daemon: `data_dir` and `admin_socket` as given, fresh ports.
fn second_config(dir: &Path, data_dir: &Path, socket: &Path, body: &str) -> std::path::PathBuf {
    let path = dir.join("second.toml");
    let text = format!(
        "[daemon]\ndata_dir = \"{}\"\nadmin_socket = \"{}\"\napi_listen = \"127.0.0.1:{}\"\nmetrics_listen = \"127.0.0.1:{}\"\n\n{body}",
        data_dir.display(),
        socket.display(),
        common::free_port(),
        common::free_port(),
    );
    std::fs::write(&path, text).expect("write second config");
    path
}

/// Runs `qd run` to completion with a bound; returns its output.
fn run_to_exit(config: &Path) -> Output {
    let mut child = Command::new(qd_bin())
        .args(["run", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn second qd");
    let pid = child.id() as i32;
    wait_for("the second qd to exit", LONG, || (!alive(pid)).then_some(()));
    let _ = child.try_wait();
    child.wait_with_output().expect("second qd output")
}

#[test]
fn a_second_daemon_on_the_same_data_dir_is_refused_and_the_running_job_runs_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let runs = tmp.path().join("runs");
    let job = script(
        tmp.path(),
        "slow.sh",
        &format!("echo run >> {}\nsleep 3", runs.display()),
    );
    let body = format!(
        "[queues.slow]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = 1, max = 1 }}\nlease = \"2s\"\nheartbeat = \"500ms\"\n",
        job.display()
    );
    let qd = Qd::start(&body);
    let id = qd.enqueue("slow", "x");
    wait_for("the job to be leased", LONG, || {
        (qd.job(&id)["state"] == "leased").then_some(())
    });

    let data_dir = qd.dir.path().join("data");
    let other_socket = tmp.path().join("other.sock");
    let config = second_config(tmp.path(), &data_dir, &other_socket, &body);
    let out = run_to_exit(&config);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains(&data_dir.display().to_string())
            && lines[0].contains(&format!("pid {}", qd.pid())),
        "names the directory and the holder: {stderr}"
    );

    let done = qd.wait_final(&id, LONG);
    assert_eq!(history(&done), ["succeeded"], "{done}");
    let count = std::fs::read_to_string(&runs).expect("runs").lines().count();
    assert_eq!(count, 1, "the job ran exactly once");
}

#[test]
fn a_second_daemon_on_the_same_admin_socket_is_refused_with_one_clean_line() {
    let qd = Qd::start("[queues.q]\nexecutor = { kind = \"external\" }\n");
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = second_config(
        tmp.path(),
        &tmp.path().join("data"),
        &qd.socket,
        "[queues.q]\nexecutor = { kind = \"external\" }\n",
    );
    let out = run_to_exit(&config);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("another qd is serving the admin socket"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(qd.qctl(&["status"]).status.success(), "the first one serves on");
}
