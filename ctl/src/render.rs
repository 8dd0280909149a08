//! Human output: aligned, borderless tables (comfy-table) that read the same in a
//! terminal and in a pipe (no colours, no wrapping). `now_ms` is passed in so ages
//! are testable.

use std::fmt::Write as _;

use comfy_table::{ContentArrangement, Table, presets};
use qd_proto::{
    BackupInfo, EdgeInfo, JobDetail, JobSummary, JobTree, LimitsView, PurgeResult, QueueInfo,
    RedriveResult, Refusal, ReloadInfo, Request, StatusInfo, TreeNode, Valued,
};

use crate::format::{age, bytes, one_line, secs_since, time};

/// Widest last-error text shown in list tables.
const ERROR_WIDTH: usize = 60;

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .force_no_tty()
        .set_header(header.to_vec());
    if let Some(first) = t.column_mut(0) {
        first.set_padding((0, 1));
    }
    t
}

fn finish(t: &Table) -> String {
    let mut out = t.trim_fmt();
    out.push('\n');
    out
}

/// `qctl status`.
pub fn status(s: &StatusInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "version  {}", s.version);
    let _ = writeln!(out, "uptime   {}", age(s.uptime_secs));
    // On PostgreSQL (the only store with a `cluster` actor) qd has no file to
    // measure and answers 0 bytes: print no size rather than a misleading "0 B".
    if s.actors.iter().any(|a| a.name == "cluster") {
        let _ = writeln!(out, "store    {}\n", s.store_path);
    } else {
        let _ = writeln!(
            out,
            "store    {} ({})\n",
            s.store_path,
            bytes(s.store_bytes)
        );
    }
    let mut t = table(&["ACTOR", "RESTARTS"]);
    for a in &s.actors {
        t.add_row(vec![a.name.clone(), a.restarts.to_string()]);
    }
    let mut out = out + &finish(&t);
    if !s.nodes.is_empty() {
        let mut t = table(&["NODE", "LAST HEARTBEAT", "STATE", "LEADER"]);
        for n in &s.nodes {
            let name = if n.this {
                format!("{} (this node)", n.name)
            } else {
                n.name.clone()
            };
            let state = if n.alive { "alive" } else { "dead" };
            let leader = n
                .epoch
                .map_or("-".to_owned(), |e| format!("yes (epoch {e})"));
            t.add_row(vec![
                name,
                format!("{} ago", age(n.heartbeat_age_ms as f64 / 1000.0)),
                state.to_owned(),
                leader,
            ]);
        }
        out = out + "\n" + &finish(&t);
    }
    out
}

/// `qctl queues`.
pub fn queues(qs: &[QueueInfo]) -> String {
    let mut t = table(&[
        "QUEUE",
        "READY",
        "DELAYED",
        "WAITING",
        "BLOCKED",
        "LEASED",
        "DEAD",
        "OLDEST READY",
        "WORKERS",
        "MIN/MAX",
        "PAUSED",
    ]);
    for q in qs {
        t.add_row(vec![
            q.name.clone(),
            q.ready.to_string(),
            q.delayed.to_string(),
            q.waiting.to_string(),
            q.blocked.to_string(),
            q.leased.to_string(),
            q.dead.to_string(),
            q.oldest_ready_age_secs.map_or("-".into(), age),
            format!("{}/{}", q.workers_busy, q.workers_total),
            format!("{}/{}", q.workers_min, q.workers_max),
            yes_no(q.paused).into(),
        ]);
    }
    finish(&t)
}

/// `qctl schedules list`: one row per schedule.
pub fn schedules(list: &[qd_proto::ScheduleInfo]) -> String {
    let mut t = table(&[
        "SCHEDULE",
        "QUEUE",
        "SPEC",
        "TIME ZONE",
        "NEXT FIRE",
        "LAST FIRE",
        "LAST JOB",
        "STATE",
        "PAUSED",
    ]);
    for s in list {
        t.add_row(vec![
            s.name.clone(),
            s.queue.clone(),
            s.spec.clone(),
            s.timezone.clone().unwrap_or_else(|| "-".into()),
            s.next_fire_at.map_or("-".into(), crate::format::time),
            s.last_fire_at.map_or("-".into(), crate::format::time),
            s.last_job.clone().unwrap_or_else(|| "-".into()),
            s.last_job_state.clone().unwrap_or_else(|| "-".into()),
            yes_no(s.paused).into(),
        ]);
    }
    finish(&t)
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn last_error(j: &JobSummary) -> String {
    j.last_error
        .as_deref()
        .map_or("-".into(), |e| one_line(e, ERROR_WIDTH))
}

/// `qctl jobs list`.
pub fn jobs(js: &[JobSummary], now_ms: i64) -> String {
    let mut t = table(&[
        "ID",
        "QUEUE",
        "TENANT",
        "STATE",
        "ATTEMPTS",
        "AGE",
        "UPDATED",
        "LAST ERROR",
    ]);
    for j in js {
        t.add_row(vec![
            j.id.clone(),
            j.queue.clone(),
            j.tenant.clone(),
            state(j, now_ms),
            attempts(j),
            age(secs_since(j.created_at, now_ms)),
            time(j.updated_at),
            last_error(j),
        ]);
    }
    finish(&t)
}

/// The state, and for a delayed job when it becomes ready: `delayed (ready in 29s)`.
fn state(j: &JobSummary, now_ms: i64) -> String {
    match j.ready_at {
        Some(at) => format!("{} (ready in {})", j.state, age(secs_since(now_ms, at))),
        None => j.state.clone(),
    }
}

/// Attempts as budget spent of budget, e.g. `2/3`, or `1/3 (4 total)` after a redrive.
fn attempts(j: &JobSummary) -> String {
    if j.attempts == j.budget_used {
        format!("{}/{}", j.budget_used, j.max_attempts)
    } else {
        format!(
            "{}/{} ({} total)",
            j.budget_used, j.max_attempts, j.attempts
        )
    }
}

/// `qctl dlq list`: one dead job per line.
pub fn dead_jobs(js: &[JobSummary], now_ms: i64) -> String {
    let mut t = table(&[
        "ID",
        "QUEUE",
        "TENANT",
        "ATTEMPTS",
        "BLOCKS",
        "DIED AT",
        "AGE",
        "LAST ERROR",
    ]);
    for j in js {
        t.add_row(vec![
            j.id.clone(),
            j.queue.clone(),
            j.tenant.clone(),
            j.attempts.to_string(),
            j.blocks.map_or("-".into(), |n| n.to_string()),
            time(j.updated_at),
            age(secs_since(j.updated_at, now_ms)),
            last_error(j),
        ]);
    }
    finish(&t)
}

/// `qctl jobs show` and `qctl dlq show`: fields, payload, then every kept attempt
/// with its stored error, and a line where the history cap elided entries.
pub fn job(d: &JobDetail, now_ms: i64) -> String {
    let j = &d.summary;
    let mut out = String::new();
    let fields = [
        ("id", j.id.clone()),
        ("queue", j.queue.clone()),
        ("tenant", j.tenant.clone()),
        ("state", state(j, now_ms)),
        ("attempts", attempts(j)),
        (
            "key",
            d.idempotency_key.clone().unwrap_or_else(|| "-".into()),
        ),
        ("priority", priority(d.priority_ms)),
        ("created", time(j.created_at)),
        ("updated", time(j.updated_at)),
        ("payload", bytes(d.payload_bytes)),
        ("result", d.result_bytes.map_or_else(|| "-".into(), bytes)),
    ];
    for (name, value) in fields {
        let _ = writeln!(out, "{name:<9}{value}");
    }
    if let (Some(direct), Some(all)) = (j.blocks, d.blocks_transitive) {
        let _ = writeln!(
            out,
            "{:<9}{direct} job(s) directly, {all} in all (transitively)",
            "blocks"
        );
    }
    edges(&mut out, "parents", &d.parents, d.parents.len() as u64);
    edges(&mut out, "dependents", &d.dependents, d.dependents_total);
    let shown = d.payload_preview.len() as u64;
    let more = if d.payload_bytes > shown {
        " (truncated)"
    } else {
        ""
    };
    let _ = writeln!(out, "\npayload preview{more}:\n{}\n", d.payload_preview);
    let mut t = table(&["#", "OUTCOME", "WORKER", "STARTED", "ENDED", "ERROR"]);
    for (n, h) in d.history.iter().enumerate() {
        if d.history_elided > 0 && n as u64 == d.history_elided_at {
            t.add_row(elided_row(d.history_elided));
        }
        t.add_row(vec![
            h.attempt.to_string(),
            h.outcome.clone(),
            h.worker.clone().unwrap_or_else(|| "-".into()),
            h.started_at.map_or("-".into(), time),
            time(h.ended_at),
            h.error.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    if d.history_elided > 0 && d.history_elided_at >= d.history.len() as u64 {
        t.add_row(elided_row(d.history_elided));
    }
    out + &finish(&t)
}

/// A job's parents or dependents: one table row per edge, and how many more the
/// daemon did not list.
fn edges(out: &mut String, title: &str, list: &[EdgeInfo], total: u64) {
    if total == 0 {
        return;
    }
    let _ = writeln!(out, "\n{title} ({total}):");
    let mut t = table(&["ID", "EDGE", "STATE", "QUEUE"]);
    for e in list {
        t.add_row(vec![
            e.id.clone(),
            e.edge.clone(),
            e.state.clone().unwrap_or_else(|| "(purged)".into()),
            e.queue.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    out.push_str(&finish(&t));
    if total > list.len() as u64 {
        let _ = writeln!(out, "... {} more", total - list.len() as u64);
    }
}

/// `qctl jobs tree`: one line per job, indented by level, with the edge to the
/// job above, then what was shown and whether a bound cut it.
pub fn tree(t: &JobTree) -> String {
    let mut out = String::new();
    node_line(&mut out, &t.root, "", "");
    let cut = if t.truncated {
        format!(
            "; truncated (at most {} levels, {} jobs: raise --depth or --limit)",
            t.max_depth, t.max_nodes
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{} job(s) of {}, {} level(s){cut}",
        t.nodes, t.direction, t.depth
    );
    out
}

fn node_line(out: &mut String, n: &TreeNode, lead: &str, child_lead: &str) {
    let state = n.state.as_deref().unwrap_or("(purged)");
    let queue = n.queue.as_deref().unwrap_or("-");
    let edge = n.edge.as_ref().map_or(String::new(), |e| format!("[{e}] "));
    let mut tail = String::new();
    if n.repeated {
        tail.push_str(" (shown above)");
    }
    if n.more > 0 {
        let _ = write!(tail, " (+{} not shown)", n.more);
    }
    let _ = writeln!(out, "{lead}{edge}{} {queue} {state}{tail}", n.id);
    let last = n.children.len().saturating_sub(1);
    for (i, c) in n.children.iter().enumerate() {
        let (branch, next) = if i == last {
            ("└── ", "    ")
        } else {
            ("├── ", "│   ")
        };
        node_line(
            out,
            c,
            &format!("{child_lead}{branch}"),
            &format!("{child_lead}{next}"),
        );
    }
}

/// A job's priority as `enqueue --priority` takes it: `0s`, `10m`, `-5m`.
fn priority(ms: i64) -> String {
    let magnitude = humantime::format_duration(std::time::Duration::from_millis(ms.unsigned_abs()));
    match ms {
        0 => "0s".into(),
        ms if ms < 0 => format!("-{magnitude}"),
        _ => magnitude.to_string(),
    }
}

/// The history table's line standing for `n` entries the daemon did not keep.
fn elided_row(n: u64) -> Vec<String> {
    let entries = if n == 1 { "entry" } else { "entries" };
    let mut row = vec!["...".to_string(); 5];
    row.push(format!("{n} {entries} elided (history cap)"));
    row
}

/// The cursor line after a page that has a successor: `next page: --after ID`.
pub fn next_page(next_after: Option<&str>) -> String {
    next_after.map_or(String::new(), |id| format!("next page: --after {id}\n"))
}

/// The one line a change prints instead of the view it answers with, if it has one
/// (`queue pause` / `queue resume`).
pub fn confirmation(req: &Request) -> Option<String> {
    match req {
        Request::QueuePause { queue } => Some(format!(
            "paused queue {queue}: nothing is leased from it until `qctl queue resume {queue}`; enqueues are still accepted\n"
        )),
        Request::QueueResume { queue } => Some(format!("resumed queue {queue}\n")),
        Request::SchedulesPause { name } => Some(format!(
            "paused schedule {name}: no tick fires until `qctl schedules resume {name}`\n"
        )),
        Request::SchedulesResume { name } => Some(format!(
            "resumed schedule {name}: it fires from its next tick\n"
        )),
        _ => None,
    }
}

fn refusals(out: &mut String, refused: &[Refusal]) {
    for r in refused {
        let _ = writeln!(out, "refused {}: {}", r.id, r.reason);
    }
}

/// `qctl dlq redrive`: ids on a dry run, then exactly how many moved.
pub fn redrive(r: &RedriveResult) -> String {
    batch(
        r.dry_run,
        &r.ids,
        &r.refused,
        r.moved,
        r.matched,
        ("move", "moved"),
    )
}

/// `qctl dlq purge`: ids on a dry run, the dependents `--cascade` cancelled or
/// `--release` released, then exactly how many were purged.
pub fn purge(r: &PurgeResult) -> String {
    let (cancel, release) = if r.dry_run {
        ("would cancel", "would release")
    } else {
        ("cancelled", "released")
    };
    let mut out = String::new();
    for id in &r.cancelled {
        let _ = writeln!(out, "{cancel} {id} (a dependent)");
    }
    for id in &r.released {
        let _ = writeln!(out, "{release} {id} (a dependent)");
    }
    out + &batch(
        r.dry_run,
        &r.ids,
        &r.refused,
        r.purged,
        r.matched,
        ("purge", "purged"),
    )
}

/// The report of a bulk DLQ operation: on a dry run the ids that would go, then
/// refusals, then "would VERB n of m" or "DONE n of m".
fn batch(
    dry_run: bool,
    ids: &[String],
    refused: &[Refusal],
    done: u64,
    matched: u64,
    (verb, past): (&str, &str),
) -> String {
    let mut out = String::new();
    if dry_run {
        for id in ids {
            let _ = writeln!(out, "{id}");
        }
    }
    refusals(&mut out, refused);
    if dry_run {
        let _ = writeln!(out, "dry run: would {verb} {} of {matched}", ids.len());
    } else {
        let _ = writeln!(out, "{past} {done} of {matched}");
    }
    out
}

fn valued<T>(v: &Valued<T>, show: impl Fn(&T) -> String) -> String {
    format!("{} ({})", show(&v.value), v.source.as_str())
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or("unlimited".into(), T::to_string)
}

/// `qctl limits show` (and the answer to every limits change).
pub fn limits(l: &LimitsView) -> String {
    let mut t = table(&["TENANT", "WEIGHT", "MAX CONCURRENCY", "MAX DEPTH"]);
    for x in &l.tenants {
        t.add_row(vec![
            x.tenant.clone(),
            valued(&x.weight, u32::to_string),
            valued(&x.max_concurrency, opt),
            valued(&x.max_depth, |d| {
                d.map_or("queue default".into(), |d| d.to_string())
            }),
        ]);
    }
    let mut q = table(&[
        "QUEUE",
        "WORKERS MIN",
        "WORKERS MAX",
        "RATE LIMITER",
        "PAUSED",
    ]);
    for x in &l.queues {
        q.add_row(vec![
            x.queue.clone(),
            valued(&x.workers_min, u32::to_string),
            valued(&x.workers_max, u32::to_string),
            x.rate_limiter.clone().unwrap_or_else(|| "-".into()),
            valued(&x.paused, |p| yes_no(*p).into()),
        ]);
    }
    finish(&t) + "\n" + &finish(&q)
}

/// `qctl backup`: where, how big, and the jobs it holds per state.
pub fn backup(b: &BackupInfo) -> String {
    let total: u64 = b.jobs.iter().map(|s| s.count).sum();
    let states: Vec<String> = b
        .jobs
        .iter()
        .map(|s| format!("{} {}", s.state, s.count))
        .collect();
    format!(
        "backup written: {} ({})\njobs: {total} ({})\n",
        b.path,
        bytes(b.size_bytes),
        states.join(", ")
    )
}

/// `qctl reload`: one line per change.
pub fn reloaded(r: &ReloadInfo) -> String {
    if r.changes.is_empty() {
        return format!("config reloaded from {}: nothing changed\n", r.path);
    }
    let mut out = format!("config reloaded from {}:\n", r.path);
    for change in &r.changes {
        let _ = writeln!(out, "  {change}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use qd_proto::{ActorInfo, Source, TenantLimits};

    fn summary(id: &str, err: Option<&str>) -> JobSummary {
        JobSummary {
            id: id.into(),
            queue: "email".into(),
            tenant: "acme".into(),
            state: "dead".into(),
            attempts: 3,
            budget_used: 3,
            max_attempts: 3,
            created_at: 0,
            updated_at: 1_000,
            ready_at: None,
            last_error: err.map(Into::into),
            blocks: None,
        }
    }

    #[test]
    fn status_on_postgresql_prints_no_store_size() {
        let mut s = StatusInfo {
            version: "0.1.0".into(),
            uptime_secs: 3.0,
            store_path: "PostgreSQL database \"qd\" on /tmp:5432 as \"qd\"".into(),
            store_bytes: 0,
            actors: vec![ActorInfo {
                name: "cluster".into(),
                restarts: 0,
            }],
            nodes: Vec::new(),
        };
        let text = status(&s);
        assert!(text.contains("as \"qd\"\n"), "{text}");
        assert!(!text.contains("0 B"), "{text}");
        s.actors[0].name = "broker".into();
        s.store_path = "/var/lib/qd/qd.db".into();
        assert!(
            status(&s).contains("/var/lib/qd/qd.db (0 B)"),
            "{}",
            status(&s)
        );
    }

    #[test]
    fn a_delayed_job_says_when_it_becomes_ready() {
        let delayed = JobSummary {
            state: "delayed".into(),
            ready_at: Some(61_000),
            ..summary("d", None)
        };
        let list = jobs(std::slice::from_ref(&delayed), 31_500);
        assert!(list.contains("delayed (ready in 29s)"), "{list}");
        let ready = jobs(&[summary("r", None)], 31_500);
        assert!(!ready.contains("ready in"), "{ready}");
    }

    #[test]
    fn dlq_lines_are_aligned_with_age_and_flattened_error() {
        let out = dead_jobs(
            &[
                summary("a", Some("exit 75\nstderr tail")),
                summary("bbbb", None),
            ],
            193_000,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].starts_with("ID "), "{out}");
        assert!(lines[1].contains("1970-01-01T00:00:01Z") && lines[1].contains("3m12s"));
        assert!(lines[1].ends_with("exit 75 stderr tail"), "{out}");
        let col = |l: &str| l.find("email").expect("queue column");
        assert_eq!(col(lines[1]), col(lines[2]), "columns align:\n{out}");
    }

    #[test]
    fn a_capped_history_shows_where_and_how_many_entries_were_elided() {
        let item = |attempt: u32| qd_proto::HistoryItem {
            attempt,
            outcome: "failed".into(),
            worker: Some("email/0".into()),
            started_at: Some(0),
            ended_at: 1_000,
            error: Some(format!("attempt {attempt}")),
        };
        let detail = JobDetail {
            summary: summary("a", Some("boom")),
            idempotency_key: None,
            payload_preview: "p".into(),
            payload_bytes: 1,
            history: [1, 2, 999, 1000].into_iter().map(item).collect(),
            history_elided: 996,
            history_elided_at: 2,
            priority_ms: -300_000,
            result_bytes: Some(2048),
            parents: vec![],
            dependents: vec![],
            dependents_total: 0,
            blocks_transitive: None,
        };
        let out = job(&detail, 1_000);
        assert!(out.contains("priority -5m\n"), "{out}");
        assert!(out.contains("result   2.0 KiB\n"), "{out}");
        let rows: Vec<&str> = out.lines().skip_while(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 6, "{out}");
        assert!(rows[2].starts_with("2 "), "{out}");
        assert!(
            rows[3].ends_with("996 entries elided (history cap)"),
            "{out}"
        );
        assert!(rows[4].starts_with("999 "), "{out}");
    }

    #[test]
    fn redrive_prints_exactly_how_many_moved_and_each_refusal() {
        let r = RedriveResult {
            matched: 3,
            moved: 2,
            ids: vec!["a".into(), "b".into()],
            refused: vec![Refusal {
                id: "c".into(),
                reason: "job is ready, not dead".into(),
            }],
            dry_run: false,
        };
        assert_eq!(
            redrive(&r),
            "refused c: job is ready, not dead\nmoved 2 of 3\n"
        );
    }

    #[test]
    fn limits_show_each_value_with_its_source() {
        let view = LimitsView {
            tenants: vec![TenantLimits {
                tenant: "acme".into(),
                weight: Valued {
                    value: 3,
                    source: Source::Override,
                },
                max_concurrency: Valued {
                    value: None,
                    source: Source::Config,
                },
                max_depth: Valued {
                    value: Some(10),
                    source: Source::Config,
                },
            }],
            queues: vec![],
        };
        let out = limits(&view);
        assert!(
            out.contains("3 (override)") && out.contains("unlimited (config)"),
            "{out}"
        );
    }
}
