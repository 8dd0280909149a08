//! The hot path's targets (issue 10, "Targets"), the cluster's scaling target
//! (issue 13, item 9) and the SQS API's (issue 26, item 8), checked against a report: each
//! line says the target, what was measured and whether it is met. A target whose
//! figures this run did not measure (a mode not run, beanstalkd missing) is left
//! out of the text and is `null` in the JSON.

use serde::Serialize;

use crate::report::{NODES, Report, SERVERS, SQS_APIS};

/// One target: its text and, when measured, the measured figure and the verdict.
#[derive(Debug, Serialize)]
pub struct Check {
    /// What the target asks.
    pub target: &'static str,
    /// (what was measured, met?) or `None` when this run did not measure it.
    pub measured: Option<(String, bool)>,
}

/// The targets, checked against `report`; `rate` is the paced mode's rate (jobs/s).
pub fn check(report: &Report, rate: f64) -> Vec<Check> {
    let qd = |mode, metric| report.value(mode, metric, SERVERS[0]);
    let f0 = |mode, metric| report.value(mode, metric, SERVERS[1]);
    let default = |mode, metric| report.value(mode, metric, SERVERS[2]);
    let xargs = report
        .measurements
        .iter()
        .find(|m| m.mode == "executor" && m.server.starts_with("xargs"))
        .map(|m| m.value);
    let nodes = |i: usize| report.value("cluster nodes", "50 ms command jobs", NODES[i]);
    let end = "end to end";
    let sqs = |i: usize| report.value("sqs", end, SQS_APIS[i]);
    vec![
        Check {
            target: "request/reply end to end ≥ 2× beanstalkd -f 0",
            measured: qd("single", end)
                .zip(f0("single", end))
                .map(|(q, b)| (format!("{:.2}×", q / b), q >= 2.0 * b)),
        },
        Check {
            target: "request/reply server CPU ≤ 150 µs per job",
            measured: qd("single", "server CPU").map(|c| (format!("{c:.0} µs"), c <= 150.0)),
        },
        Check {
            target: "paced: keeps up, p99 enqueue→ack ≤ 25 ms",
            measured: qd("paced", "done")
                .zip(qd("paced", "enqueue→ack p99"))
                .map(|(d, p99)| {
                    (
                        format!("{d:.0} of {rate:.0} jobs/s, p99 {p99:.1} ms"),
                        d >= 0.95 * rate && p99 <= 25.0,
                    )
                }),
        },
        Check {
            target: "batch end to end ≥ beanstalkd default (aim ≥ 35,000 jobs/s)",
            measured: qd("batch", end)
                .zip(default("single", end))
                .map(|(q, b)| (format!("{q:.0} vs {b:.0} jobs/s"), q >= b)),
        },
        Check {
            target: "command executor at the spawn limit (≥ 0.9× xargs -P N)",
            measured: qd("executor", "command jobs")
                .zip(xargs)
                .map(|(q, x)| (format!("{q:.0} vs {x:.0} jobs/s"), q >= 0.9 * x)),
        },
        Check {
            target: "cluster: 50 ms command jobs on 2 nodes ≥ 1.8× 1 node (issue 13)",
            measured: nodes(0)
                .filter(|one| *one > 0.0)
                .zip(nodes(1))
                .map(|(one, two)| {
                    (
                        format!("{:.2}×, {one:.0} → {two:.0} jobs/s", two / one),
                        two >= 1.8 * one,
                    )
                }),
        },
        Check {
            target: "SQS API end to end (batches of 10) ≥ 0.5× the native batch API (issue 26)",
            measured: sqs(0)
                .filter(|native| *native > 0.0)
                .zip(sqs(1))
                .map(|(native, sqs)| {
                    (
                        format!("{:.2}×, {sqs:.0} vs {native:.0} jobs/s", sqs / native),
                        sqs >= 0.5 * native,
                    )
                }),
        },
    ]
}

/// The measured checks as text, one line each; empty when none was measured.
pub fn text(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let verdict = match &c.measured {
            Some((figure, true)) => format!("met ({figure})"),
            Some((figure, false)) => format!("MISSED ({figure})"),
            None => continue,
        };
        out += &format!("  {}: {verdict}\n", c.target);
    }
    if out.is_empty() {
        return out;
    }
    format!("\ntargets (issues 10, 13 and 26):\n{out}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_met_missed_or_unmeasured() {
        let mut r = Report::default();
        r.add("single", SERVERS[0], "end to end", "jobs/s", 6000.0);
        r.add("single", SERVERS[1], "end to end", "jobs/s", 2800.0);
        r.add("single", SERVERS[0], "server CPU", "µs/job", 200.0);
        let checks = check(&r, 2000.0);
        assert_eq!(checks[0].measured, Some(("2.14×".to_string(), true)));
        assert_eq!(checks[1].measured, Some(("200 µs".to_string(), false)));
        assert!(checks[2..].iter().all(|c| c.measured.is_none()));
        r.add_command_jobs(150.0, 285.0);
        let of = |checks: Vec<Check>, issue: &str| {
            checks
                .into_iter()
                .find(|c| c.target.contains(issue))
                .expect("the target")
        };
        let cluster = of(check(&r, 2000.0), "issue 13");
        assert_eq!(
            cluster.measured,
            Some(("1.90×, 150 → 285 jobs/s".to_string(), true))
        );
        r.add("sqs", SQS_APIS[0], "end to end", "jobs/s", 1000.0);
        assert!(of(check(&r, 2000.0), "issue 26").measured.is_none());
        r.add("sqs", SQS_APIS[1], "end to end", "jobs/s", 450.0);
        assert_eq!(
            of(check(&r, 2000.0), "issue 26").measured,
            Some(("0.45×, 450 vs 1000 jobs/s".to_string(), false))
        );
        let t = text(&checks);
        assert!(
            t.contains("met (2.14×)") && t.contains("MISSED (200 µs)"),
            "{t}"
        );
    }
}
