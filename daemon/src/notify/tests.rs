//! The notify functions read the environment, and changing the environment of the
//! running test process needs `unsafe` (forbidden here). So each test re-runs this
//! test binary as a child with the environment it needs, filtered to one ignored
//! "child" test, and checks what arrives on a real datagram socket.

use std::os::unix::net::UnixDatagram;
use std::process::Command;

use super::*;

/// Names the scenario the child test plays; unset means "not started by a parent".
const CHILD_MODE: &str = "QD_NOTIFY_TEST_CHILD";

/// Runs `child_plays_scenario` in a fresh process with `env` applied on top of a
/// copy of ours minus every systemd variable; asserts the child passed.
fn run_child(mode: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "notify::tests::child_plays_scenario",
        "--ignored",
        "--test-threads=1",
    ])
    .env_remove("NOTIFY_SOCKET")
    .env_remove("WATCHDOG_USEC")
    .env_remove("WATCHDOG_PID")
    .env(CHILD_MODE, mode)
    .envs(env.iter().copied());
    let out = cmd.output().expect("spawn child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "child test did not run: {stdout}"
    );
}

#[test]
fn notifications_reach_the_socket_named_by_notify_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let path = path.to_str().expect("utf-8 temp path");
    run_child(
        "present",
        &[("NOTIFY_SOCKET", path), ("WATCHDOG_USEC", "30000000")],
    );
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    for _ in 0..4 {
        let n = socket.recv(&mut buf).expect("datagram from child");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert_eq!(
        got,
        [
            "READY=1\n",
            "STATUS=draining: 3 jobs left\n",
            "WATCHDOG=1\n",
            "STOPPING=1\n"
        ]
    );
}

#[test]
fn without_notify_socket_every_call_is_a_no_op() {
    run_child("absent", &[]);
}

#[test]
fn watchdog_meant_for_another_process_is_ignored() {
    // A job command inherits WATCHDOG_USEC from qd, with qd's pid in WATCHDOG_PID.
    run_child(
        "other_pid",
        &[("WATCHDOG_USEC", "30000000"), ("WATCHDOG_PID", "1")],
    );
}

/// Not a test on its own: the scenario a child process plays for the tests above.
/// Run directly (no `QD_NOTIFY_TEST_CHILD`), it does nothing.
#[test]
#[ignore = "run as a child process by the other notify tests"]
fn child_plays_scenario() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    match mode.as_str() {
        "present" => {
            assert_eq!(watchdog_interval(), Some(Duration::from_secs(30)));
            ready().expect("ready");
            status("draining:\n3 jobs left").expect("status");
            watchdog_ping().expect("watchdog");
            stopping().expect("stopping");
        }
        "absent" => {
            assert_eq!(watchdog_interval(), None);
            ready().expect("ready is a no-op");
            status("x").expect("status is a no-op");
            watchdog_ping().expect("watchdog is a no-op");
            stopping().expect("stopping is a no-op");
        }
        "other_pid" => assert_eq!(watchdog_interval(), None),
        other => panic!("unknown child mode {other:?}"),
    }
}
