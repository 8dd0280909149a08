//! Results: measurements as records (the `--json` output) and the side-by-side
//! text table (one row per mode and metric, one column per server, qd's ratio to
//! each beanstalkd).

use std::fmt::Write as _;

use serde::Serialize;

use crate::targets::{self, Check};

/// The servers a measurement can belong to, in column order.
pub const SERVERS: [&str; 3] = ["qd", "beanstalkd -f 0", "beanstalkd default"];

/// One figure.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    /// The mode that produced it (`single`, `batch`, `paced`, `executor`, `soak`).
    pub mode: &'static str,
    /// What was measured, e.g. `end to end`.
    pub metric: &'static str,
    /// Its unit, e.g. `jobs/s`, `µs/job`, `ms`.
    pub unit: &'static str,
    /// Which server (one of [`SERVERS`], or `xargs -P N` for the executor mode).
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
        // A figure of another tool (xargs) is compared with qd's on a line of its own.
        let others: Vec<&Measurement> = self
            .measurements
            .iter()
            .filter(|m| !SERVERS.contains(&m.server.as_str()))
            .collect();
        let mut seen: Vec<(&str, &str)> = others.iter().map(|m| (m.mode, m.metric)).collect();
        for m in &self.measurements {
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
        out += &align(&rows);
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
    }
}
