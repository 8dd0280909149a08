//! Which external tools a test can use, and what a test does when one is missing.
//! Shared by the integration tests (`common`) and, included by path, by the crate's
//! own PostgreSQL-backed unit tests.

use std::io::Write;
use std::process::Command;

/// A test cannot run because `tool` is missing. Under `CI=true` that fails the test
/// (`.ci/run` installs every tool the tests use); elsewhere the test is skipped with
/// a line written straight to stderr, past the test harness's output capture, so the
/// skip shows in a plain `cargo test` run instead of passing as a silent `ok`.
pub fn tool_missing(tool: &str, hint: &str) {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{tool} is missing and CI=true: {hint}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {}: {tool} is missing ({hint})",
        std::thread::current().name().unwrap_or("test")
    );
}

/// True when `program` is on the PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}
