//! Schedules through the real `qd` and `qctl`: a per-second schedule runs once per
//! tick and its job knows its tick; after `kill -9` and several missed ticks,
//! `catch_up = "latest"` gives one run for them; no tick's key is ever used twice;
//! pause, resume and trigger through qctl (a pause survives a restart); a reload
//! adds and removes a schedule.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Qd, fails, json_of, metric, ok, wait_for};
use serde_json::{Value, json};

const EXT: &str = r#"[queues.ext]
executor = { kind = "external" }
"#;

fn every_second(name: &str) -> String {
    format!(
        r#"
[schedules.{name}]
queue = "ext"
every = "1s"
payload = "tick"
"#
    )
}

/// The idempotency keys of every job of queue `ext` (read through the API, as
/// the listing leaves keys out).
fn keys(qd: &Qd) -> Vec<String> {
    let jobs = json_of(qd, &["jobs", "list", "--queue", "ext", "--limit", "10000"]);
    let list = jobs["jobs"].as_array().cloned().unwrap_or_default();
    list.iter()
        .map(|j| {
            let job = qd.job(j["id"].as_str().expect("id"));
            job["idempotency_key"].as_str().expect("a key").to_owned()
        })
        .collect()
}

/// The ticks (Unix ms) of the jobs of schedule `name`, sorted; panics on a
/// repeated tick (the store's unique key would refuse one, so a repeat here
/// means two keys spell the same tick).
fn ticks(qd: &Qd, name: &str) -> Vec<i64> {
    let prefix = format!("schedule:{name}:");
    let mut seen = BTreeSet::new();
    for key in keys(qd).iter().filter(|k| k.starts_with(&prefix)) {
        let tick = chrono_ms(&key[prefix.len()..]);
        assert!(seen.insert(tick), "tick {key} ran twice");
    }
    seen.into_iter().collect()
}

fn chrono_ms(text: &str) -> i64 {
    let at = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let since = at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch");
    i64::try_from(since.as_millis()).expect("fits")
}

fn fires(qd: &Qd, name: &str, result: &str) -> f64 {
    metric(
        &qd.scrape(),
        "qd_schedule_fires_total",
        &[("schedule", name), ("result", result)],
    )
}

#[test]
fn every_second_runs_once_per_tick_and_the_job_knows_its_tick() {
    let body = format!(
        "{EXT}\n[queues.cmd]\nexecutor = {{ kind = \"command\", program = \"/bin/sh\", args = [\"-c\", \"echo \\\"$QD_SCHEDULE $QD_SCHEDULE_TICK\\\" >> \\\"$OUT\\\"\"], env = {{ OUT = \"OUT_PATH\" }} }}\n{}\n[schedules.cmd-tick]\nqueue = \"cmd\"\nevery = \"1s\"\n",
        every_second("tick")
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("ticks.txt");
    let body = body.replace("OUT_PATH", &out.display().to_string());
    let qd = Qd::start(&body);

    let ticks = wait_for("four ticks", Duration::from_secs(30), || {
        let t = ticks(&qd, "tick");
        (t.len() >= 4).then_some(t)
    });
    for t in &ticks {
        assert_eq!(t % 1000, 0, "ticks are whole seconds: {ticks:?}");
    }
    assert!(fires(&qd, "tick", "fired") >= 3.0);

    // An external lease carries the schedule and its tick.
    let (status, body) = qd.post(
        "/v1/queues/ext/leases",
        &json!({"worker_id": "w", "max_jobs": 1, "wait": "5s"}),
    );
    assert_eq!(status, 200, "{body}");
    let leased = &body["jobs"][0];
    assert_eq!(leased["schedule"]["name"], json!("tick"), "{leased}");
    let key = leased["idempotency_key"].as_str().expect("key");
    assert_eq!(
        format!(
            "schedule:tick:{}",
            leased["schedule"]["tick"].as_str().expect("tick")
        ),
        key
    );
    let id = leased["id"].as_str().expect("id");
    let shown = qd.job(id);
    assert_eq!(shown["schedule"], leased["schedule"], "{shown}");

    // A command job gets QD_SCHEDULE and QD_SCHEDULE_TICK.
    let line = wait_for("a command run", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&out).ok()?;
        text.lines().next().map(str::to_owned)
    });
    let (name, tick) = line.split_once(' ').expect("two words");
    assert_eq!(name, "cmd-tick");
    assert!(tick.ends_with('Z') && chrono_ms(tick) % 1000 == 0, "{line}");

    // A producer may not use the schedules' key prefix.
    let (status, body) = qd.post(
        "/v1/queues/ext/jobs",
        &json!({"payload": "x", "idempotency_key": "schedule:tick:2020-01-01T00:00:00Z"}),
    );
    assert_eq!(status, 400, "{body}");
}

#[test]
fn after_kill9_and_missed_ticks_latest_runs_once_for_them_and_no_tick_runs_twice() {
    let mut qd = Qd::start(&format!("{EXT}{}", every_second("s")));
    wait_for("two ticks", Duration::from_secs(30), || {
        (ticks(&qd, "s").len() >= 2).then_some(())
    });
    let before = ticks(&qd, "s");
    qd.kill9();
    // Down for several ticks.
    std::thread::sleep(Duration::from_secs(5));
    qd.spawn(&[]);
    let after = wait_for("runs after the restart", Duration::from_secs(30), || {
        let t = ticks(&qd, "s");
        (t.len() >= before.len() + 3).then_some(t)
    });
    let gaps: Vec<i64> = after.windows(2).map(|w| w[1] - w[0]).collect();
    let long: Vec<&i64> = gaps.iter().filter(|g| **g > 1000).collect();
    assert!(
        !long.is_empty(),
        "the downtime left a gap in the ticks: {after:?}"
    );
    let caught_up = fires(&qd, "s", "caught_up");
    let missed = fires(&qd, "s", "missed");
    assert!(caught_up >= 1.0, "one run for the missed ticks");
    // Every tick in the gaps was counted missed (one run stood in for them).
    let skipped: i64 = long.iter().map(|g| **g / 1000 - 1).sum();
    assert!(
        missed >= skipped as f64 - 1.0 && missed >= 3.0,
        "missed {missed}, gaps {gaps:?}"
    );
}

#[test]
fn pause_resume_and_trigger_through_qctl_and_a_pause_survives_restart() {
    let mut qd = Qd::start(&format!(
        "{EXT}{}\n[schedules.yearly]\nqueue = \"ext\"\ncron = \"0 0 1 1 *\"\ntimezone = \"Europe/Berlin\"\n",
        every_second("s")
    ));
    wait_for("a tick", Duration::from_secs(30), || {
        (!ticks(&qd, "s").is_empty()).then_some(())
    });
    let out = ok(&qd, &["schedules", "pause", "s"]);
    assert!(out.contains("paused schedule s"), "{out}");
    let list = json_of(&qd, &["schedules", "list"]);
    let s = find(&list, "s");
    assert_eq!(s["paused"], json!(true), "{list}");
    assert_eq!(s["next_fire_at"], Value::Null);
    let table = ok(&qd, &["schedules", "list"]);
    assert!(
        table.contains("SCHEDULE") && table.contains("yearly") && table.contains("Europe/Berlin"),
        "{table}"
    );
    let yearly = find(&list, "yearly");
    assert_eq!(yearly["timezone"], json!("Europe/Berlin"));
    assert_eq!(yearly["spec"], json!("cron 0 0 1 1 *"));
    assert!(yearly["next_fire_at"].as_i64().is_some(), "{list}");

    // Paused: no tick fires, also across a restart.
    std::thread::sleep(Duration::from_millis(1500));
    let held = ticks(&qd, "s").len();
    qd.kill9();
    qd.spawn(&[]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ticks(&qd, "s").len(), held, "a paused schedule fired");
    assert_eq!(
        find(&json_of(&qd, &["schedules", "list"]), "s")["paused"],
        json!(true)
    );

    // A trigger runs once now, paused or not, and shows as the last run.
    let id = ok(&qd, &["schedules", "trigger", "s"]).trim().to_owned();
    let job = qd.job(&id);
    assert!(
        job["idempotency_key"]
            .as_str()
            .expect("key")
            .starts_with("schedule:s:"),
        "{job}"
    );
    let list = json_of(&qd, &["schedules", "list"]);
    let s = find(&list, "s");
    assert_eq!(s["last_job"], json!(id));
    assert_eq!(s["last_job_state"], json!("ready"));

    ok(&qd, &["schedules", "resume", "s"]);
    wait_for("ticks after the resume", Duration::from_secs(30), || {
        (ticks(&qd, "s").len() >= held + 3).then_some(())
    });

    let err = fails(&qd, &["schedules", "pause", "nope"], 1);
    assert!(
        err.contains("unknown schedule \"nope\" (known: s, yearly)"),
        "{err}"
    );
    let err = fails(&qd, &["schedules", "trigger", "nope"], 1);
    assert!(err.contains("known: s, yearly"), "{err}");
}

fn find<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["schedules"]
        .as_array()
        .expect("schedules")
        .iter()
        .find(|s| s["name"] == json!(name))
        .unwrap_or_else(|| panic!("no schedule {name}: {list}"))
}

#[test]
fn a_reload_adds_and_removes_a_schedule() {
    let qd = Qd::start(EXT);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(keys(&qd).is_empty());
    let text = std::fs::read_to_string(&qd.config).expect("config");
    std::fs::write(&qd.config, format!("{text}{}", every_second("added"))).expect("write");
    let out = ok(&qd, &["reload"]);
    assert!(out.contains("schedules.added: added"), "{out}");
    wait_for("the added schedule's runs", Duration::from_secs(30), || {
        (ticks(&qd, "added").len() >= 2).then_some(())
    });
    std::fs::write(&qd.config, &text).expect("write");
    let out = ok(&qd, &["reload"]);
    assert!(out.contains("schedules.added: removed"), "{out}");
    // A fire in flight at the reload may still land; then nothing more.
    std::thread::sleep(Duration::from_millis(1500));
    let held = ticks(&qd, "added").len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ticks(&qd, "added").len(), held, "a removed schedule fired");
    assert!(
        json_of(&qd, &["schedules", "list"])["schedules"]
            .as_array()
            .expect("list")
            .is_empty()
    );
}

#[test]
fn overlap_skip_runs_nothing_new_while_the_previous_run_is_unfinished() {
    let qd = Qd::start(&format!(
        "{EXT}\n[schedules.s]\nqueue = \"ext\"\nevery = \"1s\"\noverlap = \"skip\"\n"
    ));
    wait_for(
        "ticks skipped behind the first run",
        Duration::from_secs(30),
        || (fires(&qd, "s", "skipped_overlap") >= 2.0).then_some(()),
    );
    assert_eq!(ticks(&qd, "s").len(), 1, "one run while it is unfinished");
    // Once the run is acked, the next tick runs.
    let (status, body) = qd.post(
        "/v1/queues/ext/leases",
        &json!({"worker_id": "w", "max_jobs": 1, "wait": "5s"}),
    );
    assert_eq!(status, 200, "{body}");
    let job = &body["jobs"][0];
    let id = job["id"].as_str().expect("id");
    let (status, answer) = qd.post(
        &format!("/v1/jobs/{id}/ack"),
        &json!({"token": job["token"]}),
    );
    assert_eq!(status, 200, "{answer}");
    wait_for("a run after the ack", Duration::from_secs(30), || {
        (ticks(&qd, "s").len() >= 2).then_some(())
    });
}

#[test]
fn check_config_names_every_bad_schedule_key_with_its_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("qd.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\ndata_dir = \"{}\"\n\n{EXT}\n\
             [schedules.a]\nqueue = \"ext\"\ncron = \"0 25 * * *\"\n\n\
             [schedules.b]\nqueue = \"ext\"\ncron = \"0 3 * * *\"\ntimezone = \"Europe/Berln\"\n\n\
             [schedules.c]\nqueue = \"exx\"\nevery = \"1m\"\n\n\
             [schedules.d]\nqueue = \"ext\"\nevery = \"1m\"\ncatchup = \"all\"\n",
            dir.path().display()
        ),
    )
    .expect("write");
    let out = std::process::Command::new(common::qd_bin())
        .arg("check-config")
        .arg(&path)
        .output()
        .expect("check-config");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let file = path.display().to_string();
    for (place, what) in [
        (
            ":9:8: schedules.a.cron",
            "invalid cron expression \"0 25 * * *\"",
        ),
        (
            ":14:12: schedules.b.timezone",
            "unknown time zone \"Europe/Berln\"",
        ),
        (
            ":17:9: schedules.c.queue",
            "unknown queue \"exx\" (known: ext)",
        ),
        (":23:1: schedules.d.catchup", "unknown field"),
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("{file}{place}")) && l.contains(what)),
            "{place} {what} in:\n{stderr}"
        );
    }
}
