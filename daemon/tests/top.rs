//! `qctl top` in a real terminal: tmux runs it against the real `qd`, the test reads
//! the screen with `capture-pane`, moves the selection, presses `q` and checks that
//! the terminal is back to normal (alternate screen left, canonical mode on).
//! Without tmux the test fails under `CI=true` and prints a visible skip elsewhere.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Qd, fails, wait_for};
use serde_json::json;

const QUEUES: &str = "[queues.ext]\nexecutor = { kind = \"external\" }\n\n[queues.other]\nexecutor = { kind = \"external\" }\n";

fn tmux_available() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `tmux -S socket args...`; panics unless it succeeds.
fn tmux(socket: &Path, args: &[&str]) -> String {
    let out = Command::new("tmux")
        .arg("-S")
        .arg(socket)
        .args(args)
        .output()
        .expect("run tmux");
    assert!(out.status.success(), "tmux {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stops the private tmux server however the test ends.
struct Server<'a>(&'a Path);

impl Drop for Server<'_> {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(self.0)
            .arg("kill-server")
            .output();
    }
}

#[test]
fn top_shows_queues_counts_and_tenants_live_and_q_restores_the_terminal() {
    if !tmux_available() {
        common::tool_missing("tmux", "apt-get install tmux; .ci/run installs it");
        return;
    }
    let qd = Qd::start(QUEUES);
    for n in 0..3 {
        qd.enqueue_json("ext", json!({"tenant": "acme", "payload": format!("p{n}")}));
    }
    qd.enqueue_json("ext", json!({"tenant": "zeta", "payload": "z"}));

    let out = fails(&qd, &["top"], 2);
    assert!(out.contains("needs a terminal"), "{out}");

    let socket = qd.dir.path().join("tmux.sock");
    let _server = Server(&socket);
    let command = format!(
        "{} --socket {} top; echo QCTL-EXIT=$?; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-*icanon'; sleep 120",
        common::qctl_bin().display(),
        qd.socket.display()
    );
    tmux(
        &socket,
        &[
            "new-session",
            "-d",
            "-x",
            "120",
            "-y",
            "30",
            "-s",
            "top",
            &command,
        ],
    );
    let screen = || tmux(&socket, &["capture-pane", "-p", "-t", "top"]);
    let long = Duration::from_secs(30);
    let first = wait_for("the top screen", long, || {
        let s = screen();
        (s.contains("qd top") && s.contains("tenants of ext") && s.contains("zeta")).then_some(s)
    });
    let row = first
        .lines()
        .find(|l| l.contains("> ext"))
        .unwrap_or_else(|| panic!("ext is selected:\n{first}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert!(cells.contains(&"4"), "4 ready jobs in ext: {row}\n{first}");
    let acme = first
        .lines()
        .find(|l| l.contains("acme"))
        .unwrap_or_else(|| panic!("acme row:\n{first}"));
    assert!(acme.split_whitespace().any(|c| c == "3"), "{acme}");
    assert!(first.contains("other"), "{first}");

    qd.enqueue_json("ext", json!({"tenant": "acme", "payload": "live"}));
    wait_for("the refreshed count", long, || {
        let s = screen();
        s.lines()
            .find(|l| l.contains("> ext"))
            .is_some_and(|l| l.split_whitespace().any(|c| c == "5"))
            .then_some(())
    });

    tmux(&socket, &["send-keys", "-t", "top", "Down"]);
    wait_for("the other queue selected", long, || {
        let s = screen();
        (s.contains("> other") && s.contains("tenants of other") && !s.contains("acme"))
            .then_some(())
    });

    tmux(&socket, &["send-keys", "-t", "top", "q"]);
    let after = wait_for("qctl to exit and stty to report", long, || {
        let s = screen();
        (s.contains("QCTL-EXIT=") && s.lines().any(|l| l.trim().ends_with("icanon"))).then_some(s)
    });
    assert!(after.contains("QCTL-EXIT=0"), "{after}");
    assert!(
        !after.contains("qd top"),
        "the alternate screen is left:\n{after}"
    );
    assert!(
        after.lines().any(|l| l.trim() == "icanon"),
        "canonical mode is back (raw mode off):\n{after}"
    );
}
