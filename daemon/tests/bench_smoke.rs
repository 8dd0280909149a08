//! `qd-bench --smoke` against the qd built for the tests: it completes jobs end to
//! end (also through the batch endpoints) and prints the side-by-side table, with
//! beanstalkd's columns filled when beanstalkd is installed, and the cluster mode's
//! tables (SQLite beside PostgreSQL, 1 and 2 nodes) when PostgreSQL is installed
//! (each required under `CI=true`; a visible skip elsewhere), and the sqs mode's
//! table (the SQS API beside the native batch API on one qd).

use std::process::Command;
use std::time::Instant;

#[allow(dead_code)]
#[path = "../src/bin/shared/postgres.rs"]
mod postgres;

/// The table's cells: columns are separated by two or more spaces.
fn cells(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// A figure as the table prints it (`12,345`, `0.64`).
fn figure(cell: &str) -> f64 {
    cell.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("{cell:?} is not a figure"))
}

fn beanstalkd_installed() -> bool {
    Command::new("sh")
        .args(["-c", "command -v beanstalkd"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The row of `mode` and `metric` in `table`, as cells.
fn row_of(table: &str, mode: &str, metric: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.starts_with(mode) && l.contains(metric))
        .unwrap_or_else(|| panic!("no {mode} {metric} row:\n{table}"));
    cells(line).into_iter().map(str::to_string).collect()
}

/// The cluster mode's tables: both stores and both node counts completed jobs,
/// with a ratio, and no job ran twice.
fn check_cluster_tables(stdout: &str) {
    for header in [
        [
            "mode",
            "metric",
            "qd SQLite",
            "qd PostgreSQL",
            "PostgreSQL ÷ SQLite",
        ],
        ["mode", "metric", "1 node", "2 nodes", "2 nodes ÷ 1"],
    ] {
        assert!(
            stdout.lines().any(|l| cells(l) == header),
            "no table headed {header:?}:\n{stdout}"
        );
    }
    for (mode, metric) in [
        ("cluster single", "end to end (jobs/s)"),
        ("cluster batch", "end to end (jobs/s)"),
        ("cluster nodes", "50 ms command jobs (jobs/s)"),
        ("cluster nodes", "no-op jobs, batches of 100 (jobs/s)"),
        ("cluster nodes", "no-op jobs, 1 per request (jobs/s)"),
    ] {
        let row = row_of(stdout, mode, metric);
        assert!(
            figure(&row[2]) > 0.0 && figure(&row[3]) > 0.0 && row[4].ends_with('×'),
            "{row:?}\n{stdout}"
        );
    }
    assert!(!stdout.contains("ran twice"), "{stdout}");
}

/// The sqs mode's table: the native batch API and the SQS API (signed requests
/// qd verified against its token file) each completed jobs without an error, and
/// the target was checked.
fn check_sqs_table(stdout: &str) {
    assert!(
        stdout.lines().any(|l| cells(l)
            == [
                "mode",
                "metric",
                "qd batch API",
                "qd SQS API",
                "SQS ÷ batch API"
            ]),
        "no sqs table:\n{stdout}"
    );
    for metric in [
        "enqueue only (jobs/s)",
        "drain (jobs/s)",
        "end to end (jobs/s)",
    ] {
        let row = row_of(stdout, "sqs", metric);
        assert!(
            figure(&row[2]) > 0.0 && figure(&row[3]) > 0.0 && row[4].ends_with('×'),
            "{row:?}\n{stdout}"
        );
    }
    assert!(
        !stdout.contains("Sqs failed") && !stdout.contains("note: sqs qd"),
        "the sqs mode saw errors:\n{stdout}"
    );
    assert!(
        stdout.contains("≥ 0.5× the native batch API (issue 26): "),
        "{stdout}"
    );
}

/// Writes a skip past the harness's output capture, so it shows in a passing run.
fn visible_skip(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {what}");
}

#[test]
fn smoke_run_completes_jobs_and_prints_the_side_by_side_tables() {
    let beanstalkd = beanstalkd_installed();
    if !beanstalkd {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "beanstalkd is not installed; .ci/run installs it (apt-get install beanstalkd)"
        );
        visible_skip(
            "the beanstalkd columns: beanstalkd is not installed (apt-get install beanstalkd)",
        );
    }
    let postgresql = postgres::binaries().is_some();
    if !postgresql {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PostgreSQL is not installed; .ci/run installs it ({})",
            postgres::INSTALL_HINT
        );
        visible_skip(&format!(
            "the cluster mode's checks: PostgreSQL is not installed ({})",
            postgres::INSTALL_HINT
        ));
    }
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_qd-bench"))
        .args(["--smoke", "--qd", env!("CARGO_BIN_EXE_qd")])
        .output()
        .expect("run qd-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "qd-bench failed:\n{stdout}\n{stderr}");
    eprintln!("qd-bench --smoke took {:?}:\n{stdout}", start.elapsed());

    let header = stdout
        .lines()
        .find(|l| l.starts_with("mode"))
        .expect("a table header");
    assert_eq!(
        cells(header),
        [
            "mode",
            "metric",
            "qd",
            "beanstalkd -f 0",
            "beanstalkd default",
            "qd ÷ -f 0",
            "qd ÷ default"
        ]
    );
    let mode_row = |mode: &str, metric: &str| row_of(&stdout, mode, metric);
    let row = |metric: &str| mode_row("single", metric);
    let batch = mode_row("batch", "end to end (jobs/s)");
    assert!(
        figure(&batch[2]) > 0.0,
        "the batch endpoints completed no job: {batch:?}"
    );
    assert!(!stdout.contains("Batch failed"), "{stdout}");
    let end_to_end = row("end to end (jobs/s)");
    assert!(
        figure(&end_to_end[2]) > 0.0,
        "qd completed no job: {end_to_end:?}"
    );
    let cpu = row("server CPU (µs/job)");
    assert!(figure(&cpu[2]) > 0.0, "qd used no CPU: {cpu:?}");
    if beanstalkd {
        assert!(
            figure(&end_to_end[3]) > 0.0 && figure(&end_to_end[4]) > 0.0,
            "{end_to_end:?}"
        );
        assert!(
            end_to_end[5].ends_with('×') && end_to_end[6].ends_with('×'),
            "ratios: {end_to_end:?}"
        );
        // A small run may cost beanstalkd less than one clock tick (10 ms): 0 is fine.
        assert!(figure(&cpu[3]) >= 0.0 && figure(&cpu[4]) >= 0.0, "{cpu:?}");
    }
    assert!(
        stdout.contains("\nsoak:\n") && stdout.contains("executor: xargs -P"),
        "every mode reported:\n{stdout}"
    );
    check_sqs_table(&stdout);
    if postgresql {
        check_cluster_tables(&stdout);
    } else {
        assert!(
            stdout.contains("Cluster failed: PostgreSQL is not installed"),
            "{stdout}"
        );
    }
}
