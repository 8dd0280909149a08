//! Operational safety, through the real `qd` and `qctl` binaries:
//! - one daemon per data directory: a second `qd` on the same `data_dir` (or the
//!   same admin socket) exits 1 at once with one line, and the first daemon's running
//!   job runs exactly once;
//! - SIGHUP and `qctl reload`: a bad file (syntax, unknown key, invalid value,
//!   unreadable) changes nothing and qd keeps serving; a good one adds a queue,
//!   changes weights (limits show, dispatch shares), the executor and max_depth live,
//!   and runtime overrides keep precedence; restart-only changes are refused;
//! - `qctl backup`: a snapshot taken under load, restored into a fresh `data_dir`,
//!   holds every job accepted before it; the daemon's own files (store, WAL, lock,
//!   admin socket) are never a backup's destination, even with `--force`;
//! - a new store and its WAL are 0600 whatever the umask;
//! - `qd check-config` lists every kind of problem in one run.

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
    let ports: [u16; 2] = common::free_ports();
    let text = format!(
        "[daemon]\ndata_dir = \"{}\"\nadmin_socket = \"{}\"\napi_listen = \"127.0.0.1:{}\"\nmetrics_listen = \"127.0.0.1:{}\"\n\n{body}",
        data_dir.display(),
        socket.display(),
        ports[0],
        ports[1],
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
    wait_for("the second qd to exit", LONG, || {
        (!alive(pid)).then_some(())
    });
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
    // A long lease: only a second daemon (which counts every stored lease as an
    // earlier run's) could take the job, never an expiry on a slow machine.
    let body = format!(
        "[queues.slow]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = 1, max = 1 }}\nlease = \"30s\"\nheartbeat = \"1s\"\n",
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
    let count = std::fs::read_to_string(&runs)
        .expect("runs")
        .lines()
        .count();
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
    assert!(
        stderr.contains("another qd is serving the admin socket"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        qd.qctl(&["status"]).status.success(),
        "the first one serves on"
    );
}

/// `qctl limits show --json`.
fn limits(qd: &Qd) -> serde_json::Value {
    let out = qd.qctl(&["--json", "limits", "show"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).expect("limits JSON")
}

fn tenant_weight(limits: &serde_json::Value, tenant: &str) -> (u64, String) {
    let t = limits["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .find(|t| t["tenant"] == tenant)
        .unwrap_or_else(|| panic!("tenant {tenant} in {limits}"));
    (
        t["weight"]["value"].as_u64().expect("weight"),
        t["weight"]["source"].as_str().expect("source").to_string(),
    )
}

fn queue_names(limits: &serde_json::Value) -> Vec<String> {
    limits["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .map(|q| q["queue"].as_str().expect("queue").to_string())
        .collect()
}

/// The value of `qd_config_reloads_total{result}` in a scrape.
fn reloads(qd: &Qd, result: &str) -> u64 {
    let needle = format!("qd_config_reloads_total{{result=\"{result}\"}} ");
    qd.scrape()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&needle)
                .map(|v| v.trim().parse::<f64>().expect("value"))
        })
        .unwrap_or_else(|| panic!("{needle} not exported")) as u64
}

#[test]
fn a_bad_config_on_reload_changes_nothing_and_qd_keeps_serving() {
    let body = "[queues.a]\nexecutor = { kind = \"external\" }\n\n[tenants.acme]\nweight = 2\n";
    let qd = Qd::start(body);
    let good = std::fs::read_to_string(&qd.config).expect("config");
    let cases: [(&str, String, &str); 3] = [
        ("syntax error", format!("{good}\n[queues.b\n"), ":"),
        (
            "unknown key",
            good.replace("weight = 2", "weight = 2\nwieght = 3"),
            "wieght",
        ),
        (
            "invalid value",
            good.replace("weight = 2", "weight = 0"),
            "tenants.acme.weight",
        ),
    ];
    let mut failures = 0;
    for (what, broken, expected) in &cases {
        std::fs::write(&qd.config, broken).expect("write broken config");
        let out = qd.qctl(&["reload"]);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&qd.config.display().to_string()) && err.contains(expected),
            "{what}: names the file and the problem: {err}"
        );
        common::signal(qd.pid(), "HUP");
        failures += 2;
        wait_for("the failed reloads to be counted", LONG, || {
            (reloads(&qd, "failure") == failures).then_some(())
        });
        assert!(alive(qd.pid()), "{what}: SIGHUP must not kill qd");
        assert_eq!(
            tenant_weight(&limits(&qd), "acme").0,
            2,
            "{what}: old config kept"
        );
        qd.enqueue("a", "still serving");
    }
    // An unreadable file (a directory in its place: unreadable even for root).
    std::fs::remove_file(&qd.config).expect("remove config");
    std::fs::create_dir(&qd.config).expect("dir in its place");
    let out = qd.qctl(&["reload"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("cannot read config file"),
        "{}",
        text(&out)
    );
    common::signal(qd.pid(), "HUP");
    wait_for("the failed reload to be counted", LONG, || {
        (reloads(&qd, "failure") == failures + 2).then_some(())
    });
    assert!(alive(qd.pid()));
    qd.enqueue("a", "still serving");
    assert!(
        qd.logs().contains(&format!("{}:", qd.config.display())),
        "every problem is logged with file:line:col"
    );
    std::fs::remove_dir(&qd.config).expect("remove dir");
    std::fs::write(&qd.config, &good).expect("restore config");
    let out = qd.qctl(&["reload"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("nothing changed"), "{}", text(&out));
    assert_eq!(reloads(&qd, "success"), 1);
}

#[test]
fn a_reload_adds_a_queue_and_changes_weights_live_and_overrides_keep_precedence() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let done = tmp.path().join("done");
    let job = script(
        tmp.path(),
        "job.sh",
        &format!("echo \"$QD_QUEUE\" >> {}", done.display()),
    );
    let queue = |name: &str| {
        format!(
            "[queues.{name}]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = 1, max = 2 }}\n",
            job.display()
        )
    };
    let body = format!(
        "{}\n[tenants.acme]\nweight = 1\n\n[tenants.beta]\nweight = 1\n",
        queue("a")
    );
    let qd = Qd::start(&body);
    let out = qd.qctl(&["limits", "set", "--tenant", "acme", "--weight", "5"]);
    assert!(out.status.success(), "{}", text(&out));
    let id = qd.enqueue("a", "before");
    qd.wait_final(&id, LONG);

    let config = std::fs::read_to_string(&qd.config).expect("config");
    let changed = config.replace("weight = 1", "weight = 3") + "\n" + &queue("b");
    std::fs::write(&qd.config, changed).expect("write new config");
    common::signal(qd.pid(), "HUP");
    wait_for("the new queue to show in qctl limits show", LONG, || {
        queue_names(&limits(&qd))
            .contains(&"b".to_string())
            .then_some(())
    });
    let l = limits(&qd);
    assert_eq!(tenant_weight(&l, "beta"), (3, "config".into()), "{l}");
    assert_eq!(
        tenant_weight(&l, "acme"),
        (5, "override".into()),
        "a runtime override keeps precedence over a reload: {l}"
    );
    let id = qd.enqueue("b", "on the new queue");
    let finished = qd.wait_final(&id, LONG);
    assert_eq!(finished["state"], "succeeded", "{finished}");
    let ran = std::fs::read_to_string(&done).expect("done");
    assert!(
        ran.lines().any(|l| l == "b"),
        "the new queue's pool ran it: {ran}"
    );
    assert!(
        qd.scrape().contains("qd_job_attempts_total{queue=\"b\""),
        "the new queue has metrics"
    );

    // Removing a queue that holds a job is refused; changing api_listen needs a restart.
    let delayed = qd.enqueue_json(
        "b",
        serde_json::json!({ "payload": "later", "delay": "1h" }),
    );
    let current = std::fs::read_to_string(&qd.config).expect("config");
    let without_b = current.replace(&queue("b"), "");
    std::fs::write(&qd.config, &without_b).expect("write");
    let out = qd.qctl(&["reload"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("still holds 1 jobs"), "{}", text(&out));
    assert_eq!(qd.job(&delayed)["state"], "delayed", "its job is kept");
    let port = qd.api.rsplit(':').next().expect("port");
    std::fs::write(
        &qd.config,
        current.replace(port, &common::free_port().to_string()),
    )
    .expect("write");
    let out = qd.qctl(&["reload"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("needs a restart"), "{}", text(&out));
    // Both at once: the answer names both reasons.
    std::fs::write(
        &qd.config,
        without_b.replace(port, &common::free_port().to_string()),
    )
    .expect("write");
    let out = qd.qctl(&["reload"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("needs a restart"), "{}", text(&out));
    assert!(text(&out).contains("still holds 1 jobs"), "{}", text(&out));
    assert!(queue_names(&limits(&qd)).contains(&"b".to_string()));
}

#[test]
fn a_backup_taken_under_load_restores_every_job_accepted_before_it() {
    let body = "[queues.q]\nexecutor = { kind = \"external\" }\n";
    let qd = Qd::start(body);
    let backup = qd.dir.path().join("snap.db");
    let accepted = std::sync::Mutex::new(Vec::<String>::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let before: Vec<String> = std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = qd.enqueue("q", &format!("job {n}"));
                accepted.lock().expect("lock").push(id);
                n += 1;
            }
        });
        wait_for("some load", LONG, || {
            (accepted.lock().expect("lock").len() >= 50).then_some(())
        });
        let before = accepted.lock().expect("lock").clone();
        let out = qd.qctl(&["backup", backup.to_str().expect("utf-8")]);
        assert!(out.status.success(), "{}", text(&out));
        let printed = text(&out);
        assert!(
            printed.contains("backup written") && printed.contains("ready"),
            "{printed}"
        );
        wait_for("more load after the backup", LONG, || {
            (accepted.lock().expect("lock").len() >= before.len() + 20).then_some(())
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        load.join().expect("load thread");
        before
    });
    let out = qd.qctl(&["backup", backup.to_str().expect("utf-8")]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an existing file is refused: {}",
        text(&out)
    );
    assert!(text(&out).contains("--force"), "{}", text(&out));

    // Restore into a fresh data_dir: stop, copy into data_dir as qd.db, start.
    let mut restored = Qd::configure(tempfile::tempdir().expect("tempdir"), body, "5s");
    let data = restored.dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::copy(&backup, data.join("qd.db")).expect("copy the backup in");
    restored.spawn(&[]);
    for id in &before {
        let (status, job) = restored.get(&format!("/v1/jobs/{id}"));
        assert_eq!(
            status, 200,
            "job {id} accepted before the backup is restored: {job}"
        );
    }
    let out = qd.qctl(&["backup", "--force", backup.to_str().expect("utf-8")]);
    assert!(out.status.success(), "--force replaces it: {}", text(&out));
}

#[test]
fn check_config_lists_every_kind_of_problem_in_one_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, "[[tokens]]\nname = \"x\"\n").expect("write tokens");
    let config = dir.path().join("conf").join("qd.toml");
    std::fs::create_dir_all(config.parent().expect("parent")).expect("mkdir");
    std::fs::write(
        &config,
        format!(
            "[daemon]\ndata_dir = \"../var\"\napi_tokens_file = \"{}\"\nadmin_group = \"no-such-group-qd-test\"\nbogus = 1\n\n\
             [queues.a]\nexecutor = {{ kind = \"http\", url = \"http://127.0.0.1:1/\", headers = {{ \"bad header\" = \"v\" }} }}\nlease = \"soon\"\n\n\
             [tenants.t]\nweight = 0\n",
            tokens.display()
        ),
    )
    .expect("write config");
    let out = Command::new(qd_bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("run check-config");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for key in [
        "daemon.api_tokens_file",
        "daemon.admin_group",
        "daemon.bogus",
        "queues.a.executor",
        "queues.a.lease",
        "tenants.t.weight",
    ] {
        assert!(
            stderr.contains(&format!("{}:", config.display())) && stderr.contains(key),
            "{key} with file:line:col in one run:\n{stderr}"
        );
    }
}

#[test]
fn a_weight_changed_by_reload_changes_the_share_of_dispatched_jobs() {
    let qd = Qd::start(
        "[queues.ext]\nexecutor = { kind = \"external\" }\nlease = \"10m\"\n\n\
         [tenants.heavy]\nweight = 1\n\n[tenants.light]\nweight = 1\n",
    );
    std::thread::scope(|s| {
        for tenant in ["heavy", "light"] {
            let qd = &qd;
            s.spawn(move || {
                for i in 0..300 {
                    qd.enqueue_json(
                        "ext",
                        serde_json::json!({ "tenant": tenant, "payload": format!("{i}") }),
                    );
                }
            });
        }
    });
    let config = std::fs::read_to_string(&qd.config).expect("config");
    let heavier = config.replacen("weight = 1", "weight = 3", 1);
    assert_ne!(heavier, config);
    std::fs::write(&qd.config, heavier).expect("write");
    let out = qd.qctl(&["reload"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("tenants.heavy.weight: 1 -> 3"),
        "{}",
        text(&out)
    );
    // 200 dispatches at 3:1 take 150 heavy and 50 light: both stay backlogged.
    let mut tenants = Vec::new();
    while tenants.len() < 200 {
        let (status, body) = qd.post(
            "/v1/queues/ext/leases",
            &serde_json::json!({ "worker_id": "test", "max_jobs": (200 - tenants.len()).min(100) }),
        );
        assert_eq!(status, 200, "lease: {body}");
        let jobs = body["jobs"].as_array().expect("jobs");
        assert!(!jobs.is_empty(), "ran dry after {}", tenants.len());
        tenants.extend(jobs.iter().map(|j| j["tenant"] == "heavy"));
    }
    let heavy = tenants.iter().filter(|h| **h).count() as f64 / tenants.len() as f64;
    assert!(
        (heavy - 0.75).abs() <= 0.05,
        "heavy share {heavy:.3} after the reload"
    );
}

#[test]
fn a_reload_changes_the_executor_and_the_depth_limit_for_what_comes_next() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let one = script(
        tmp.path(),
        "one.sh",
        &format!("echo one >> {}", out.display()),
    );
    let two = script(
        tmp.path(),
        "two.sh",
        &format!("echo two >> {}", out.display()),
    );
    let qd = Qd::start(&format!(
        "[queues.q]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nmax_depth = 1000\n",
        one.display()
    ));
    let id = qd.enqueue("q", "first");
    qd.wait_final(&id, LONG);
    let config = std::fs::read_to_string(&qd.config).expect("config");
    let changed = config
        .replace(&one.display().to_string(), &two.display().to_string())
        .replace("max_depth = 1000", "max_depth = 1");
    std::fs::write(&qd.config, changed).expect("write");
    let reloaded = qd.qctl(&["reload"]);
    assert!(reloaded.status.success(), "{}", text(&reloaded));
    assert!(
        text(&reloaded).contains("queues.q.max_depth: 1000 -> 1"),
        "{}",
        text(&reloaded)
    );
    let id = qd.enqueue("q", "second");
    assert_eq!(qd.wait_final(&id, LONG)["state"], "succeeded");
    let ran = std::fs::read_to_string(&out).expect("out");
    assert_eq!(
        ran.lines().collect::<Vec<_>>(),
        ["one", "two"],
        "the next attempt runs the new program"
    );
    let paused = qd.qctl(&["queue", "pause", "q"]);
    assert!(paused.status.success(), "{}", text(&paused));
    qd.enqueue("q", "fills the queue");
    let (status, body) = qd.post(
        "/v1/queues/q/jobs",
        &serde_json::json!({ "payload": "over" }),
    );
    assert_eq!(status, 429, "the reloaded max_depth applies: {body}");
}

#[test]
fn a_backup_never_replaces_the_running_daemons_own_files_even_with_force() {
    let mut qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    let before = qd.enqueue("ext", "before");
    let data = qd.dir.path().join("data");
    let socket = qd.socket.clone();
    let targets = [
        data.join("qd.db"),
        data.join("qd.db-wal"),
        data.join("qd.db-shm"),
        data.join("qd.lock"),
        data.join(".").join("qd.db"),
        socket,
    ];
    for target in &targets {
        let target = target.to_str().expect("utf-8");
        let out = qd.qctl(&["backup", "--force", target]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "backup to {target}: {said}");
        assert!(
            said.contains("is a file of the running qd"),
            "backup to {target}: {said}"
        );
    }
    // The store is still the daemon's: a job accepted now survives a restart.
    let after = qd.enqueue("ext", "after");
    qd.terminate(LONG);
    qd.spawn(&[]);
    for id in [&before, &after] {
        assert_eq!(qd.job(id)["state"], "ready", "job {id} kept");
    }
}

/// `qctl backup --force` naming the live store itself (`data_dir/qd.db`, a path an
/// operator may well type) or one of its companions (`-wal`, `-shm`, `-journal`,
/// the lock) must be refused and change nothing: a snapshot renamed over the live
/// database leaves qd writing to an unlinked file beside a WAL of the old one, and
/// after the next checkpoint and restart the store is malformed, every job
/// accepted before and after the backup unreadable.
#[test]
fn a_backup_over_the_live_store_is_refused_and_every_job_survives_a_restart() {
    let body = "[queues.q]\nexecutor = { kind = \"external\" }\n";
    let mut qd = Qd::start(body);
    let data = qd.dir.path().join("data");
    let mut accepted: Vec<String> = (0..20)
        .map(|n| qd.enqueue("q", &format!("job {n}")))
        .collect();
    for name in [
        "qd.db",
        "qd.db-wal",
        "qd.db-shm",
        "qd.db-journal",
        "qd.lock",
    ] {
        let dest = data.join(name);
        let out = qd.qctl(&["backup", "--force", dest.to_str().expect("utf-8")]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "backup to {name}: {}",
            text(&out)
        );
        assert!(
            text(&out).contains("a file of the running qd"),
            "backup to {name}: {}",
            text(&out)
        );
    }
    // The same file through another spelling of its directory.
    let dest = data.join(".").join("qd.db");
    let out = qd.qctl(&["backup", "--force", dest.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // Enough bytes after it for SQLite to checkpoint the WAL (~4 MiB).
    let big = "x".repeat(100_000);
    accepted.extend((0..60).map(|_| qd.enqueue("q", &big)));
    qd.kill9();
    qd.spawn(&[]);
    for id in &accepted {
        let (status, job) = qd.get(&format!("/v1/jobs/{id}"));
        assert_eq!(status, 200, "job {id} after the restart: {job}");
    }
}

#[test]
fn a_new_store_and_its_wal_are_readable_by_qds_user_only_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    if common::on_postgres() {
        return;
    }
    let qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    qd.enqueue("ext", "a secret payload");
    let data = qd.dir.path().join("data");
    for name in ["qd.db", "qd.db-wal", "qd.db-shm"] {
        let mode = std::fs::metadata(data.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{name} is {mode:o}: payloads for anyone");
    }
}

/// Unmounts a bind mount when dropped (a failed assertion included).
struct BindMount(std::path::PathBuf);

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The data directory seen through another path that no symlink leads to (a bind
/// mount: a container volume mounted twice, systemd's `BindPaths=`) is still the
/// data directory: a backup naming `qd.db` there must be refused like one naming it
/// directly, or the snapshot is renamed over the live store. Needs permission to
/// bind-mount (root with CAP_SYS_ADMIN); says so and passes where there is none,
/// but fails under `CI=true`, where CI runs as root.
#[test]
fn a_backup_over_the_live_store_through_a_bind_mount_is_refused() {
    let mut qd = Qd::start("[queues.ext]\nexecutor = { kind = \"external\" }\n");
    let before = qd.enqueue("ext", "before");
    let data = qd.dir.path().join("data");
    let alias = qd.dir.path().join("alias");
    std::fs::create_dir(&alias).expect("mkdir");
    let mounted = std::process::Command::new("mount")
        .arg("--bind")
        .arg(&data)
        .arg(&alias)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "cannot bind-mount under CI=true (CI runs as root)"
        );
        // Past the harness's capture, so the skip shows in a passing run.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED: no permission to bind-mount here (needs root)\n",
        );
        return;
    }
    let _unmount = BindMount(alias.clone());
    let target = alias.join("qd.db");
    let out = qd.qctl(&["backup", "--force", target.to_str().expect("utf-8")]);
    let said = text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "backup to {}: {said}",
        target.display()
    );
    assert!(said.contains("is a file of the running qd"), "{said}");
    let after = qd.enqueue("ext", "after");
    qd.terminate(LONG);
    qd.spawn(&[]);
    for id in [&before, &after] {
        assert_eq!(qd.job(id)["state"], "ready", "job {id} kept");
    }
}
