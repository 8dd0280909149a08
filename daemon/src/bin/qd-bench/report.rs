//! Results: measurements as records (the `--json` output) and the side-by-side
//! text table (one row per mode and metric, one column per server, qd's ratio to
//! each beanstalkd), then the tables of the modes that compare two setups of qd
//! ([`PAIRS`]: SQLite against PostgreSQL, 1 node against 2).

use std::fmt::Write as _;

use serde::Serialize;

use crate::targets::{self, Check};

/// The servers a measurement can belong to, in column order.
pub const SERVERS: [&str; 3] = ["qd", "beanstalkd -f 0", "beanstalkd default"];

/// Modes that compare two setups of qd instead of qd and beanstalkd, in one table
/// of their own: which modes, their two servers in column order, and the heading of
/// the second ÷ first ratio.
pub struct Pair {
    /// The modes of the table.
    pub modes: &'static [&'static str],
    /// The two servers, in column order.
    pub servers: [&'static str; 2],
    /// The heading of the ratio column (second ÷ first).
    pub ratio: &'static str,
}

/// The comparisons of `qd-bench --mode cluster`: SQLite against PostgreSQL, then
/// 1 node against 2 on one PostgreSQL; and of `--mode sqs`: qd's SQS API against
/// its native batch API.
pub const PAIRS: [Pair; 3] = [
    Pair {
        modes: &["cluster single", "cluster batch"],
        servers: STORES,
        ratio: "PostgreSQL ÷ SQLite",
    },
    Pair {
        modes: &["cluster nodes"],
        servers: NODES,
        ratio: "2 nodes ÷ 1",
    },
    Pair {
        modes: &["sqs"],
        servers: SQS_APIS,
        ratio: "SQS ÷ batch API",
    },
];

/// The servers of the SQS comparison (`sqs`): one qd through its native batch
/// API and through its SQS API.
pub const SQS_APIS: [&str; 2] = ["qd batch API", "qd SQS API"];

/// The servers of the store comparison (`cluster single`, `cluster batch`).
pub const STORES: [&str; 2] = ["qd SQLite", "qd PostgreSQL"];
/// The servers of the node comparison (`cluster nodes`): 1 and 2 qd nodes on one
/// PostgreSQL.
pub const NODES: [&str; 2] = ["1 node", "2 nodes"];

/// One figure.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    /// The mode that produced it (`single`, `batch`, `paced`, `executor`, `soak`,
    /// or one of [`PAIRS`]).
    pub mode: &'static str,
    /// What was measured, e.g. `end to end`.
    pub metric: &'static str,
    /// Its unit, e.g. `jobs/s`, `µs/job`, `ms`.
    pub unit: &'static str,
    /// Which server (one of [`SERVERS`], `xargs -P N` for the executor mode, or
    /// one of its mode's pair in [`PAIRS`]).
    pub server: String,
    /// The value.
    pub value: f64,
}

/// One sample of the soak mode.
#[derive(Clone, Debug, Serialize)]
pub struct SoakSample {
    /// Seconds since the soak started.
    pub at_secs: f64,
    /// Jobs acknowledged so far.
    pub done: u64,
    /// Size of `qd.db`, bytes.
    pub store_bytes: u64,
    /// Size of `qd.db-wal`, bytes.
    pub wal_bytes: u64,
    /// qd's resident memory, bytes.
    pub rss_bytes: u64,
}

/// Everything one run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The command line, to rerun it.
    pub command: String,
    /// Figures, in the order measured.
    pub measurements: Vec<Measurement>,
    /// Soak samples, oldest first (empty unless the soak mode ran).
    pub soak: Vec<SoakSample>,
    /// Remarks: skipped modes, errors seen, what a column means.
    pub notes: Vec<String>,
    /// The hot path's targets, checked against the figures (filled last).
    pub targets: Vec<Check>,
}

impl Report {
    /// Records one figure.
    pub fn add(
        &mut self,
        mode: &'static str,
        server: &str,
        metric: &'static str,
        unit: &'static str,
        value: f64,
    ) {
        self.measurements.push(Measurement {
            mode,
            metric,
            unit,
            server: server.to_string(),
            value,
        });
    }

    /// The figure of (`mode`, `metric`) for `server`, if measured.
    pub fn value(&self, mode: &str, metric: &str, server: &str) -> Option<f64> {
        self.measurements
            .iter()
            .find(|m| m.mode == mode && m.metric == metric && m.server == server)
            .map(|m| m.value)
    }

    /// The text form: the side-by-side table, the other comparisons, the soak
    /// samples, then the notes.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "command: {}\n", self.command);
        let mut rows = vec![vec![
            "mode".to_string(),
            "metric".to_string(),
            SERVERS[0].to_string(),
            SERVERS[1].to_string(),
            SERVERS[2].to_string(),
            "qd ÷ -f 0".to_string(),
            "qd ÷ default".to_string(),
        ]];
        let paired = |m: &Measurement| PAIRS.iter().any(|p| p.modes.contains(&m.mode));
        // A figure of another tool (xargs) is compared with qd's on a line of its own.
        let others: Vec<&Measurement> = self
            .measurements
            .iter()
            .filter(|m| !SERVERS.contains(&m.server.as_str()) && !paired(m))
            .collect();
        let mut seen: Vec<(&str, &str)> = others.iter().map(|m| (m.mode, m.metric)).collect();
        for m in self.measurements.iter().filter(|m| !paired(m)) {
            if seen.contains(&(m.mode, m.metric)) {
                continue;
            }
            seen.push((m.mode, m.metric));
            let qd = self.value(m.mode, m.metric, SERVERS[0]);
            let mut row = vec![m.mode.to_string(), format!("{} ({})", m.metric, m.unit)];
            row.extend(
                SERVERS
                    .iter()
                    .map(|s| self.value(m.mode, m.metric, s).map_or("-".into(), figure)),
            );
            for bs in &SERVERS[1..] {
                row.push(match (qd, self.value(m.mode, m.metric, bs)) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
                    _ => "-".into(),
                });
            }
            rows.push(row);
        }
        if rows.len() > 1 {
            out += &align(&rows);
        }
        out += &self.pair_tables();
        for m in others {
            let qd = self.value(m.mode, m.metric, SERVERS[0]);
            let _ = writeln!(
                out,
                "\n{}: {} {} {}{}",
                m.mode,
                m.server,
                figure(m.value),
                m.unit,
                qd.filter(|_| m.value > 0.0)
                    .map_or(String::new(), |q| format!(
                        " (qd {} {}, {:.2}×)",
                        figure(q),
                        m.unit,
                        q / m.value
                    )),
            );
        }
        if !self.soak.is_empty() {
            out += "\nsoak:\n";
            let mut rows = vec![
                ["t (s)", "done", "qd.db", "qd.db-wal", "qd RSS"]
                    .map(str::to_string)
                    .to_vec(),
            ];
            for s in &self.soak {
                rows.push(vec![
                    format!("{:.1}", s.at_secs),
                    s.done.to_string(),
                    mib(s.store_bytes),
                    mib(s.wal_bytes),
                    mib(s.rss_bytes),
                ]);
            }
            out += &align(&rows);
        }
        if !self.targets.is_empty() {
            out += &targets::text(&self.targets);
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        out
    }
}

impl Report {
    /// The tables of the [`PAIRS`] modes that measured something: one row per
    /// mode and metric, the two servers, the second ÷ the first.
    fn pair_tables(&self) -> String {
        let mut out = String::new();
        for pair in &PAIRS {
            let mut rows = vec![
                [
                    "mode",
                    "metric",
                    pair.servers[0],
                    pair.servers[1],
                    pair.ratio,
                ]
                .map(str::to_string)
                .to_vec(),
            ];
            let mut seen: Vec<(&str, &str)> = Vec::new();
            for m in self
                .measurements
                .iter()
                .filter(|m| pair.modes.contains(&m.mode))
            {
                if seen.contains(&(m.mode, m.metric)) {
                    continue;
                }
                seen.push((m.mode, m.metric));
                let [a, b] = pair.servers.map(|s| self.value(m.mode, m.metric, s));
                rows.push(vec![
                    m.mode.to_string(),
                    format!("{} ({})", m.metric, m.unit),
                    a.map_or("-".into(), figure),
                    b.map_or("-".into(), figure),
                    match (a, b) {
                        (Some(a), Some(b)) if a > 0.0 => format!("{:.2}×", b / a),
                        _ => "-".into(),
                    },
                ]);
            }
            if rows.len() > 1 {
                out.push('\n');
                out += &align(&rows);
            }
        }
        out
    }
}

/// A figure with thousands separators and no more precision than it deserves.
fn figure(x: f64) -> String {
    if x.abs() < 10.0 && x.fract() != 0.0 {
        return format!("{x:.2}");
    }
    let digits = format!("{:.0}", x.abs());
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    if x < 0.0 {
        format!("-{grouped}")
    } else {
        grouped
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Left-aligned columns separated by two spaces.
fn align(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:<width$}  ");
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
impl Report {
    /// The cluster mode's 50 ms command jobs: jobs/s on 1 node, then on 2.
    pub(crate) fn add_command_jobs(&mut self, one: f64, two: f64) {
        for (column, value) in [(NODES[0], one), (NODES[1], two)] {
            self.add(
                "cluster nodes",
                column,
                "50 ms command jobs",
                "jobs/s",
                value,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_grouped_and_small_ones_keep_decimals() {
        assert_eq!(figure(1_234_567.4), "1,234,567");
        assert_eq!(figure(999.0), "999");
        assert_eq!(figure(0.64), "0.64");
        assert_eq!(figure(-4200.0), "-4,200");
    }

    #[test]
    fn the_table_puts_servers_side_by_side_with_ratios() {
        let mut r = Report::default();
        r.add("single", "qd", "end to end", "jobs/s", 4000.0);
        r.add("single", "beanstalkd -f 0", "end to end", "jobs/s", 2000.0);
        r.add("executor", "qd", "command jobs", "jobs/s", 900.0);
        r.add("executor", "xargs -P 8", "command jobs", "jobs/s", 850.0);
        let t = r.table();
        let row = t
            .lines()
            .find(|l| l.starts_with("single"))
            .expect("single row");
        assert!(row.contains("4,000") && row.contains("2,000") && row.contains("2.00×"));
        assert!(row.ends_with('-'), "no default-mode figure: {row}");
        assert!(
            t.contains("executor: xargs -P 8 850 jobs/s (qd 900 jobs/s, 1.06×)"),
            "{t}"
        );
        assert!(
            !t.contains("2 nodes"),
            "no cluster table without its figures: {t}"
        );
    }

    #[test]
    fn pair_modes_get_tables_of_their_own_with_the_second_over_the_first() {
        let mut r = Report::default();
        r.add("single", "qd", "end to end", "jobs/s", 4000.0);
        r.add("cluster single", STORES[0], "end to end", "jobs/s", 4000.0);
        r.add("cluster single", STORES[1], "end to end", "jobs/s", 1000.0);
        r.add_command_jobs(150.0, 285.0);
        let t = r.table();
        let lines: Vec<&str> = t.lines().collect();
        let header = |first: &str| {
            lines
                .iter()
                .position(|l| l.starts_with("mode") && l.contains(first))
                .unwrap_or_else(|| panic!("no table with {first}: {t}"))
        };
        let (main, stores, nodes) = (header("beanstalkd"), header("SQLite"), header("1 node"));
        assert!(main < stores && stores < nodes, "{t}");
        assert!(lines[stores].ends_with("PostgreSQL ÷ SQLite"), "{t}");
        let store_row = lines[stores + 1];
        assert!(
            store_row.starts_with("cluster single") && store_row.ends_with("0.25×"),
            "{t}"
        );
        let node_row = lines[nodes + 1];
        assert!(
            node_row.contains("150") && node_row.contains("285") && node_row.ends_with("1.90×"),
            "{t}"
        );
        assert_eq!(
            t.matches("cluster").count(),
            2,
            "paired figures stay out of the main table: {t}"
        );
    }
}
