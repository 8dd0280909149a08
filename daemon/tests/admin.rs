//! qctl over the admin socket, tested through the real `qd` and `qctl` binaries:
//! the DLQ round trip (die, fix, redrive, succeed), filtered and repeated redrives,
//! purge confirmation, cancel rules, live limits that survive a restart, peer
//! credentials, broken frames from a raw client, and the `--json` field sets.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::{Qd, fails, json_of, kill_all, metric, ok, script, text, wait_for};
use serde_json::{Value, json};

/// The audit text of an operator action by the user running the tests (root or not).
fn by_me(verb: &str) -> String {
    format!("{verb} by uid {}", nix::unistd::getuid())
}

const LONG: Duration = Duration::from_secs(30);

/// An external-worker queue: jobs stay ready until leased over HTTP, so counts are exact.
const EXTERNAL: &str = "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_attempts = 3\n";

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

fn assert_keys(v: &Value, expected: &[&str]) {
    assert_eq!(
        keys(v),
        expected.iter().copied().collect::<BTreeSet<_>>(),
        "{v}"
    );
}

const SUMMARY: [&str; 11] = [
    "id",
    "queue",
    "tenant",
    "state",
    "attempts",
    "budget_used",
    "max_attempts",
    "created_at",
    "updated_at",
    "ready_at",
    "last_error",
];

fn ids(v: &Value, list: &str) -> Vec<String> {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in {v}"))
        .iter()
        .map(|j| match j {
            Value::String(s) => s.clone(),
            j => j["id"].as_str().expect("id").to_owned(),
        })
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn enqueue_as(qd: &Qd, tenant: &str, payload: &str) -> String {
    ok(
        qd,
        &["enqueue", "ext", "--tenant", tenant, "--payload", payload],
    )
    .trim()
    .to_owned()
}

fn queue_row(qd: &Qd, name: &str) -> Value {
    json_of(qd, &["queues"])["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no queue {name}"))
}

#[test]
fn dlq_round_trip_a_fixed_command_succeeds_after_redrive_with_its_whole_history() {
    let work = tempfile::tempdir().expect("tempdir");
    let marker = work.path().join("fixed");
    let prog = script(
        work.path(),
        "flaky.sh",
        &format!(
            "if [ -f {} ]; then exit 0; fi\necho \"smtp 451: mailbox busy\" >&2\nexit 75",
            marker.display()
        ),
    );
    let qd = Qd::start(&format!(
        "[queues.mail]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nmax_attempts = 2\nbackoff = {{ base = \"50ms\", max = \"100ms\" }}\n",
        prog.display()
    ));
    let id = ok(
        &qd,
        &["enqueue", "mail", "--key", "order-17", "--payload", "hi"],
    )
    .trim()
    .to_owned();
    wait_for("the job to die", LONG, || {
        (qd.job(&id)["state"] == "dead").then_some(())
    });

    let listed = ok(&qd, &["dlq", "list"]);
    let line = listed
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{id} not in dlq list:\n{listed}"));
    assert!(line.contains("smtp 451: mailbox busy"), "{line}");
    assert!(line.contains("mail"), "{line}");
    let shown = ok(&qd, &["dlq", "show", &id]);
    assert_eq!(shown.matches("smtp 451").count(), 2, "{shown}");

    std::fs::write(&marker, "").expect("marker");
    let out = ok(&qd, &["dlq", "redrive", &id]);
    assert!(out.contains("moved 1 of 1"), "{out}");
    let job = qd.wait_final(&id, LONG);
    assert_eq!(job["state"], "succeeded", "{job}");

    let detail = json_of(&qd, &["jobs", "show", &id]);
    assert_eq!(detail["idempotency_key"], "order-17", "{detail}");
    assert_eq!(detail["attempts"], 3);
    assert_eq!(detail["budget_used"], 1, "fresh budget after redrive");
    let history = detail["history"].as_array().expect("history");
    let outcomes: Vec<&str> = history
        .iter()
        .map(|h| h["outcome"].as_str().expect("outcome"))
        .collect();
    assert_eq!(outcomes, ["failed", "failed", "redriven", "succeeded"]);
    assert_eq!(history[2]["error"], by_me("redriven"));
    assert!(history[2]["ended_at"].as_i64().expect("redrive time") > 0);
    for h in history {
        assert_keys(
            h,
            &[
                "attempt",
                "outcome",
                "worker",
                "started_at",
                "ended_at",
                "error",
            ],
        );
    }
    let human = ok(&qd, &["jobs", "show", &id]);
    assert!(human.contains(&by_me("redriven")), "{human}");
    assert!(human.contains("1/2 (3 total)"), "{human}");

    // Finished now: neither redrive, cancel nor dlq show apply, and each says why.
    let again = qd.qctl(&["--json", "dlq", "redrive", &id]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    let again: Value = serde_json::from_slice(&again.stdout).expect("json");
    assert_eq!(again["moved"], 0);
    assert!(
        again["refused"][0]["reason"]
            .as_str()
            .expect("reason")
            .contains("succeeded"),
        "{again}"
    );
    assert!(fails(&qd, &["jobs", "cancel", &id], 1).contains("is succeeded"));
    assert!(fails(&qd, &["dlq", "show", &id], 1).contains("not dead"));
}

#[test]
fn filtered_redrive_moves_exactly_the_matching_jobs_once_and_purge_needs_yes() {
    let qd = Qd::start(EXTERNAL);
    let acme: Vec<String> = (0..3)
        .map(|i| enqueue_as(&qd, "acme", &format!("a{i}")))
        .collect();
    let globex: Vec<String> = (0..2)
        .map(|i| enqueue_as(&qd, "globex", &format!("g{i}")))
        .collect();
    kill_all(&qd, "card declined");

    let dead = json_of(&qd, &["dlq", "list"]);
    assert_eq!(dead["jobs"].as_array().expect("jobs").len(), 5, "{dead}");
    let row = queue_row(&qd, "ext");
    assert_eq!(
        (row["ready"].clone(), row["dead"].clone()),
        (json!(0), json!(5))
    );

    // dlq list: most recently dead first, the limit applied.
    let updated: Vec<i64> = dead["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["updated_at"].as_i64().expect("updated_at"))
        .collect();
    assert!(updated.windows(2).all(|w| w[0] >= w[1]), "{updated:?}");
    let two = json_of(&qd, &["dlq", "list", "--limit", "2"]);
    assert_eq!(ids(&two, "jobs"), ids(&dead, "jobs")[..2].to_vec());

    let plan = json_of(
        &qd,
        &[
            "dlq",
            "redrive",
            "--tenant",
            "acme",
            "--error",
            "DECLINED",
            "--dry-run",
        ],
    );
    assert_eq!(sorted(ids(&plan, "ids")), sorted(acme.clone()), "{plan}");
    assert_eq!(
        (plan["matched"].clone(), plan["moved"].clone()),
        (json!(3), json!(0))
    );
    assert_eq!(queue_row(&qd, "ext")["dead"], 5, "a dry run moves nothing");
    let human = ok(&qd, &["dlq", "redrive", "--tenant", "acme", "--dry-run"]);
    for id in &acme {
        assert!(human.contains(id.as_str()), "{human}");
    }
    for id in &globex {
        assert!(!human.contains(id.as_str()), "{human}");
    }

    let out = ok(
        &qd,
        &["dlq", "redrive", "--tenant", "acme", "--rate", "50/s"],
    );
    assert!(out.contains("moved 3 of 3"), "{out}");
    let row = queue_row(&qd, "ext");
    assert_eq!(
        (row["ready"].clone(), row["dead"].clone()),
        (json!(3), json!(2))
    );
    let out = ok(&qd, &["dlq", "redrive", "--tenant", "acme"]);
    assert!(
        out.contains("moved 0 of 0"),
        "a second run moves nothing: {out}"
    );
    assert_eq!(queue_row(&qd, "ext")["ready"], 3, "no copies");

    // jobs list: newest first, the limit applied at the store.
    let newest = json_of(&qd, &["jobs", "list", "--limit", "2"]);
    assert_eq!(
        ids(&newest, "jobs"),
        vec![globex[1].clone(), globex[0].clone()]
    );
    let ready = json_of(&qd, &["jobs", "list", "--state", "ready"]);
    assert_eq!(
        ids(&ready, "jobs"),
        acme.iter().rev().cloned().collect::<Vec<_>>()
    );

    assert!(fails(&qd, &["dlq", "purge", "--all"], 2).contains("--yes"));
    assert_eq!(queue_row(&qd, "ext")["dead"], 2);
    let purged = json_of(&qd, &["dlq", "purge", "--all", "--yes"]);
    assert_eq!(purged["purged"], 2, "{purged}");
    assert_eq!(sorted(ids(&purged, "ids")), sorted(globex.clone()));
    assert_eq!(queue_row(&qd, "ext")["dead"], 0);
    let err = fails(&qd, &["jobs", "show", &globex[0]], 1);
    assert!(err.contains("not_found"), "{err}");
}

#[test]
fn cancel_takes_every_unfinished_job_and_names_the_state_of_a_finished_one() {
    let qd = Qd::start(EXTERNAL);
    let ready = enqueue_as(&qd, "acme", "r");
    let delayed = ok(&qd, &["enqueue", "ext", "--delay", "1h", "--payload", "d"])
        .trim()
        .to_owned();
    let out = ok(&qd, &["jobs", "cancel", &delayed]);
    assert!(out.contains("was delayed"), "{out}");
    let leased = qd.post(
        "/v1/queues/ext/leases",
        &json!({"worker_id": "t", "max_jobs": 1}),
    );
    assert_eq!(leased.1["jobs"][0]["id"], ready.as_str(), "{leased:?}");
    assert!(fails(&qd, &["dlq", "redrive", &ready], 1).contains("leased"));
    let out = ok(&qd, &["jobs", "cancel", &ready]);
    assert!(out.contains("was leased"), "{out}");
    assert!(fails(&qd, &["jobs", "cancel", &ready], 1).contains("is cancelled"));
    assert!(fails(&qd, &["jobs", "cancel", &delayed], 1).contains("is cancelled"));

    let dead = enqueue_as(&qd, "acme", "x");
    kill_all(&qd, "bad");
    let cancelled = json_of(&qd, &["jobs", "cancel", &dead]);
    assert_eq!(cancelled["previous_state"], "dead", "{cancelled}");
    let history = json_of(&qd, &["jobs", "show", &dead]);
    let last = history["history"]
        .as_array()
        .expect("history")
        .last()
        .cloned();
    assert_eq!(last.expect("entry")["error"], by_me("cancelled"));
    let err = fails(&qd, &["jobs", "cancel", "not-an-id"], 1);
    assert!(err.contains("not a job id"), "{err}");
}

/// Stops qd gracefully and starts it again on the same data directory.
fn restart(qd: &mut Qd) {
    let status = qd.terminate(LONG);
    assert!(status.success(), "{status}\n{}", qd.logs());
    qd.spawn(&[]);
}

#[test]
fn runtime_limits_take_effect_at_once_and_survive_restarts_until_reset() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "ok.sh", "exit 0");
    let mut qd = Qd::start(&format!(
        "[queues.run]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = 1, max = 4 }}\nrate_limiter = \"smtp\"\n\n[rate_limiters.smtp]\nper_second = 50\nburst = 10\n\n[tenants.acme]\nweight = 3\n",
        prog.display()
    ));
    let limits = json_of(
        &qd,
        &[
            "limits",
            "set",
            "--tenant",
            "acme",
            "--weight",
            "5",
            "--max-concurrency",
            "2",
        ],
    );
    let acme = |l: &Value| {
        l["tenants"]
            .as_array()
            .expect("tenants")
            .iter()
            .find(|t| t["tenant"] == "acme")
            .cloned()
            .expect("acme")
    };
    assert_eq!(
        acme(&limits)["weight"],
        json!({"value": 5, "source": "override"})
    );
    ok(&qd, &["workers", "set", "run", "--min", "0", "--max", "2"]);
    ok(&qd, &["queue", "pause", "run"]);

    // Paused at once: a new job stays ready.
    let id = qd.enqueue("run", "p");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(qd.job(&id)["state"], "ready");
    let row = queue_row(&qd, "run");
    assert_eq!(
        (
            row["ready"].clone(),
            row["paused"].clone(),
            row["workers_max"].clone()
        ),
        (json!(1), json!(true), json!(2))
    );

    restart(&mut qd);
    let limits = json_of(&qd, &["limits", "show"]);
    assert_eq!(
        acme(&limits)["weight"],
        json!({"value": 5, "source": "override"})
    );
    assert_eq!(
        acme(&limits)["max_concurrency"],
        json!({"value": 2, "source": "override"})
    );
    let run = &limits["queues"][0];
    assert_eq!(run["rate_limiter"], "smtp: 50/s burst 10");
    assert_eq!(run["paused"], json!({"value": true, "source": "override"}));
    assert_eq!(
        run["workers_max"],
        json!({"value": 2, "source": "override"})
    );
    assert_eq!(
        qd.job(&id)["state"],
        "ready",
        "still paused after the restart"
    );
    let human = ok(&qd, &["limits", "show"]);
    assert!(human.contains("5 (override)"), "{human}");

    ok(&qd, &["queue", "resume", "run"]);
    assert_eq!(qd.wait_final(&id, LONG)["state"], "succeeded");
    ok(&qd, &["limits", "reset", "--tenant", "acme"]);
    ok(&qd, &["limits", "reset", "--queue", "run"]);
    restart(&mut qd);
    let limits = json_of(&qd, &["limits", "show"]);
    assert_eq!(
        acme(&limits)["weight"],
        json!({"value": 3, "source": "config"})
    );
    assert_eq!(
        limits["queues"][0]["workers_max"],
        json!({"value": 4, "source": "config"})
    );
    // qctl refuses min > max itself (exit 2); the daemon refuses the frame as well.
    assert!(
        fails(
            &qd,
            &["workers", "set", "run", "--min", "3", "--max", "2"],
            2
        )
        .contains("--min 3 is more than --max 2")
    );
    let answer = raw_admin(
        &qd,
        &json!({"op": "workers_set", "queue": "run", "min": 3, "max": 2}),
    );
    assert!(
        answer.contains("bad_request") && answer.contains("min"),
        "{answer}"
    );
    assert!(fails(&qd, &["queue", "pause", "nope"], 1).contains("nope"));
}

fn setpriv_available() -> Result<(), String> {
    let which = std::process::Command::new("setpriv")
        .arg("--version")
        .output();
    if !which.is_ok_and(|o| o.status.success()) {
        return Err("setpriv is not installed".into());
    }
    let id = std::process::Command::new("id")
        .args(["-u", "nobody"])
        .output();
    if !id.is_ok_and(|o| o.status.success()) {
        return Err("there is no user nobody".into());
    }
    if !is_root() {
        return Err("the test does not run as root, so it cannot switch users".into());
    }
    Ok(())
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

#[test]
fn a_uid_that_is_not_allowed_is_refused_and_logged() {
    if let Err(why) = setpriv_available() {
        common::tool_missing("setpriv as root", &why);
        return;
    }
    let qd = Qd::start(&format!("admin_socket_mode = \"0666\"\n{EXTERNAL}"));
    // Let `nobody` reach the socket and a copy of qctl: the refusal must come from
    // the daemon's peer-credential check, not from file permissions.
    let dir = qd.dir.path();
    set_mode(dir, 0o755);
    let qctl = dir.join("qctl");
    std::fs::copy(common::qctl_bin(), &qctl).expect("copy qctl");
    set_mode(&qctl, 0o755);
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(&qctl)
        .arg("--socket")
        .arg(&qd.socket)
        .arg("status")
        .output()
        .expect("run setpriv");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains("65534"), "{err}");
    wait_for("the refusal in the log", LONG, || {
        let logs = qd.logs();
        (logs.contains("permission denied") && logs.contains("65534")).then_some(())
    });
    ok(&qd, &["status"]);
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// One request line and its answer on an open connection.
fn exchange(conn: &mut BufReader<UnixStream>, line: &[u8]) -> Value {
    conn.get_mut().write_all(line).expect("write");
    read_frame(conn)
}

fn read_frame(conn: &mut BufReader<UnixStream>) -> Value {
    let mut answer = String::new();
    conn.read_line(&mut answer).expect("read");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

#[test]
fn malformed_oversized_and_wrong_version_frames_get_errors_and_the_daemon_keeps_serving() {
    let qd = Qd::start(EXTERNAL);
    let connect = || {
        let s = UnixStream::connect(&qd.socket).expect("connect");
        s.set_read_timeout(Some(LONG)).expect("timeout");
        BufReader::new(s)
    };
    let mut conn = connect();
    let a = exchange(&mut conn, b"this is not json\n");
    assert_eq!(a["err"]["code"], "bad_frame", "{a}");
    let a = exchange(
        &mut conn,
        b"{\"v\":2,\"id\":4,\"req\":{\"op\":\"status\"}}\n",
    );
    assert_eq!(a["err"]["code"], "unsupported_version", "{a}");
    assert_eq!(a["id"], 4);
    let a = exchange(&mut conn, b"{\"v\":1,\"id\":5,\"req\":{\"op\":\"fly\"}}\n");
    assert_eq!(a["err"]["code"], "unknown_op", "{a}");
    let a = exchange(
        &mut conn,
        b"{\"v\":1,\"id\":6,\"req\":{\"op\":\"jobs_list\",\"colour\":1}}\n",
    );
    assert_eq!(a["err"]["code"], "bad_request", "{a}");
    let a = exchange(
        &mut conn,
        b"{\"v\":1,\"id\":7,\"req\":{\"op\":\"status\"}}\n",
    );
    assert_eq!(
        a["ok"]["kind"], "status",
        "the connection still serves: {a}"
    );

    // Over the frame limit: an error, then the daemon closes this connection only.
    let mut big = connect();
    let mut writer = big.get_ref().try_clone().expect("clone");
    let sender = std::thread::spawn(move || {
        let mut line = vec![b'x'; qd_proto::MAX_FRAME + 4096];
        line.push(b'\n');
        let _ = writer.write_all(&line); // the daemon may hang up before reading it all
    });
    let a = read_frame(&mut big);
    assert_eq!(a["err"]["code"], "frame_too_large", "{a}");
    assert_eq!(a["id"], Value::Null);
    sender.join().expect("sender");

    let mut fresh = connect();
    let a = exchange(
        &mut fresh,
        b"{\"v\":1,\"id\":8,\"req\":{\"op\":\"queues\"}}\n",
    );
    assert_eq!(a["ok"]["kind"], "queues", "{a}");
    let (status, body) = qd.get("/healthz");
    assert_eq!(status, 200, "the HTTP API still works: {body}");
    enqueue_as(&qd, "acme", "after");
}

#[test]
fn every_json_output_parses_with_stable_field_sets() {
    let qd = Qd::start(EXTERNAL);
    let status = json_of(&qd, &["status"]);
    assert_keys(
        &status,
        &[
            "kind",
            "version",
            "uptime_secs",
            "store_path",
            "store_bytes",
            "actors",
            "nodes",
        ],
    );
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    let nodes = status["nodes"].as_array().expect("nodes");
    match &qd.database {
        // PostgreSQL: this node, the only one of its cluster.
        Some(_) => {
            assert_eq!(nodes.len(), 1, "{status}");
            assert_keys(
                &nodes[0],
                &[
                    "name",
                    "heartbeat_age_ms",
                    "alive",
                    "leader",
                    "epoch",
                    "this",
                ],
            );
            assert_eq!(nodes[0]["this"], true, "{status}");
        }
        None => assert!(nodes.is_empty(), "{status}"),
    }
    let store = status["store_path"].as_str().expect("store path");
    let bytes = status["store_bytes"].as_u64().expect("bytes");
    match &qd.database {
        // PostgreSQL: the database is named; its size is not reported yet (0).
        Some(database) => assert!(store.contains(&database.name), "{store}"),
        None => {
            assert!(
                store.starts_with(&*qd.dir.path().to_string_lossy()),
                "{store}"
            );
            assert!(bytes > 0);
        }
    }
    assert!(status["uptime_secs"].as_f64().expect("uptime") >= 0.0);
    let actors = status["actors"].as_array().expect("actors");
    assert!(
        actors
            .iter()
            .any(|a| a["name"] == "broker" && a["restarts"] == 0)
    );
    for a in actors {
        assert_keys(a, &["name", "restarts"]);
    }
    let human = ok(&qd, &["status"]);
    for word in ["version", "uptime", store, "broker", "RESTARTS"] {
        assert!(human.contains(word), "{word} missing from:\n{human}");
    }

    let enq = json_of(&qd, &["enqueue", "ext", "--key", "k", "--payload", "p"]);
    assert_keys(&enq, &["kind", "id", "duplicate"]);
    let dup = json_of(&qd, &["enqueue", "ext", "--key", "k", "--payload", "p"]);
    assert_eq!(
        (dup["id"].clone(), dup["duplicate"].clone()),
        (enq["id"].clone(), json!(true))
    );
    let id = enq["id"].as_str().expect("id");

    let queues = json_of(&qd, &["queues"]);
    assert_keys(&queues, &["kind", "queues"]);
    assert_keys(
        &queues["queues"][0],
        &[
            "name",
            "ready",
            "delayed",
            "leased",
            "dead",
            "oldest_ready_age_secs",
            "workers_busy",
            "workers_total",
            "workers_min",
            "workers_max",
            "paused",
            "waiting",
            "blocked",
        ],
    );
    let jobs = json_of(&qd, &["jobs", "list"]);
    assert_keys(&jobs, &["kind", "jobs", "next_after"]);
    assert_keys(&jobs["jobs"][0], &SUMMARY);
    let detail = json_of(&qd, &["jobs", "show", id]);
    let mut job_keys = SUMMARY.to_vec();
    job_keys.extend([
        "kind",
        "idempotency_key",
        "payload_preview",
        "payload_bytes",
        "history",
        "history_elided",
        "history_elided_at",
        "priority_ms",
        "result_bytes",
        "dependents_total",
    ]);
    assert_keys(&detail, &job_keys);

    kill_all(&qd, "boom");
    // A dead job says how many unfinished jobs it blocks (`after`).
    let mut dead_summary = SUMMARY.to_vec();
    dead_summary.push("blocks");
    assert_keys(&json_of(&qd, &["dlq", "list"])["jobs"][0], &dead_summary);
    job_keys.extend(["blocks", "blocks_transitive"]);
    assert_keys(&json_of(&qd, &["dlq", "show", id]), &job_keys);
    let redrive = json_of(&qd, &["dlq", "redrive", "--all", "--dry-run"]);
    assert_keys(
        &redrive,
        &["kind", "matched", "moved", "ids", "refused", "dry_run"],
    );
    let purge = json_of(&qd, &["dlq", "purge", "--all", "--dry-run"]);
    assert_keys(
        &purge,
        &["kind", "matched", "purged", "ids", "refused", "dry_run"],
    );
    let refused = qd.qctl(&[
        "--json",
        "dlq",
        "redrive",
        id,
        "01a22e09-ad34-70bd-9098-5b0b4d8f1052",
    ]);
    let refused: Value = serde_json::from_slice(&refused.stdout).expect("json");
    assert_keys(&refused["refused"][0], &["id", "reason"]);
    let cancelled = json_of(&qd, &["jobs", "cancel", id]);
    assert_keys(&cancelled, &["kind", "id", "previous_state"]);

    let limits = json_of(&qd, &["limits", "show"]);
    assert_keys(&limits, &["kind", "tenants", "queues"]);
    assert_keys(
        &limits["tenants"][0],
        &["tenant", "weight", "max_concurrency", "max_depth"],
    );
    assert_keys(&limits["tenants"][0]["weight"], &["value", "source"]);
    assert_keys(
        &limits["queues"][0],
        &[
            "queue",
            "workers_min",
            "workers_max",
            "rate_limiter",
            "paused",
        ],
    );
    for args in [
        &["limits", "set", "--tenant", "default", "--weight", "2"][..],
        &["limits", "reset", "--tenant", "default"],
        &["queue", "pause", "ext"],
        &["queue", "resume", "ext"],
    ] {
        assert_keys(&json_of(&qd, args), &["kind", "tenants", "queues"]);
    }
}

#[test]
fn an_unreachable_daemon_is_reported_with_the_socket_path_and_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.sock");
    let out = std::process::Command::new(common::qctl_bin())
        .arg("--socket")
        .arg(&missing)
        .arg("status")
        .output()
        .expect("run qctl");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&*missing.to_string_lossy()), "{err}");
    assert!(err.contains("no such file"), "{err}");
}

#[test]
fn qctl_says_when_a_delayed_job_becomes_ready() {
    let qd = Qd::start(EXTERNAL);
    let (status, answer) = qd.post(
        "/v1/queues/ext/jobs",
        &json!({ "payload": "later", "delay": "30s" }),
    );
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("id");
    let ready = qd.enqueue("ext", "now");
    let in_secs = |text: &str| -> u64 {
        let at = text.find("ready in ").expect("a ready-in note") + "ready in ".len();
        let digits: String = text[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().expect("seconds")
    };
    let list = ok(&qd, &["jobs", "list"]);
    let line = list
        .lines()
        .find(|l| l.starts_with(id))
        .expect("delayed job listed");
    assert!(line.contains("delayed (ready in "), "{list}");
    assert!((15..=30).contains(&in_secs(line)), "{line}");
    let other = list
        .lines()
        .find(|l| l.starts_with(&ready))
        .expect("ready job listed");
    assert!(!other.contains("ready in"), "{other}");
    let show = ok(&qd, &["jobs", "show", id]);
    assert!((15..=30).contains(&in_secs(&show)), "{show}");
    let detail = json_of(&qd, &["jobs", "show", id]);
    assert_eq!(detail["ready_at"], qd.job(id)["ready_at"], "{detail}");
    assert_eq!(
        json_of(&qd, &["jobs", "show", &ready])["ready_at"],
        Value::Null
    );
}

/// A delayed job whose time has come shows as ready everywhere, though the store
/// keeps it `delayed` until its next write: `jobs list --state` filters by the
/// state it shows, so `--state ready` finds it and `--state delayed` does not.
#[test]
fn a_delayed_job_whose_time_has_come_is_listed_by_state_as_ready() {
    let qd = Qd::start(EXTERNAL);
    let (status, answer) = qd.post(
        "/v1/queues/ext/jobs",
        &json!({ "payload": "soon", "delay": "1s" }),
    );
    assert_eq!(status, 202, "{answer}");
    let soon = answer["id"].as_str().expect("id").to_owned();
    let later = ok(
        &qd,
        &["enqueue", "ext", "--delay", "1h", "--payload", "later"],
    )
    .trim()
    .to_owned();
    let listed = |state: &str| ids(&json_of(&qd, &["jobs", "list", "--state", state]), "jobs");
    assert_eq!(listed("delayed"), vec![later.clone(), soon.clone()]);
    assert!(listed("ready").is_empty());
    wait_for("the 1 s delay to pass", LONG, || {
        (qd.job(&soon)["state"] == "ready").then_some(())
    });
    assert_eq!(
        listed("ready"),
        vec![soon.clone()],
        "the due job by its shown state"
    );
    assert_eq!(listed("delayed"), vec![later], "only the job still waiting");
}

/// Sends one raw admin frame and reads one answer line (empty when the daemon closed
/// the connection without one).
fn raw_admin(qd: &Qd, req: &Value) -> String {
    let mut conn = UnixStream::connect(&qd.socket).expect("connect the admin socket");
    conn.set_read_timeout(Some(LONG)).expect("timeout");
    let frame = json!({"v": 1, "id": 1, "req": req}).to_string() + "\n";
    conn.write_all(frame.as_bytes()).expect("write frame");
    let mut line = String::new();
    let _ = BufReader::new(conn).read_line(&mut line);
    line
}

fn dead_in(qd: &Qd, queue: &str) -> usize {
    let list = json_of(qd, &["dlq", "list", "--queue", queue]);
    list["jobs"].as_array().map_or(0, Vec::len)
}

/// Three dead jobs in `ext`.
fn three_dead(qd: &Qd) {
    for payload in ["a", "b", "c"] {
        qd.enqueue("ext", payload);
    }
    kill_all(qd, "boom");
    wait_for("3 dead jobs", LONG, || {
        (dead_in(qd, "ext") == 3).then_some(())
    });
}

/// A redrive's pace out of bounds (a rate so small its wait cannot be represented,
/// a negative one, a batch of 0) or an empty error filter (it matches every dead
/// job, as `--error "$UNSET"` would) is a bad request, from the daemon and from qctl
/// alike: nothing moves, nothing panics.
#[test]
fn a_redrive_or_purge_with_an_absurd_pace_or_an_empty_error_filter_is_refused_whole() {
    let qd = Qd::start(EXTERNAL);
    three_dead(&qd);
    for (field, value) in [
        ("rate_per_sec", json!(1e-300)),
        ("rate_per_sec", json!(-5.0)),
        ("batch_size", json!(0)),
        ("batch_size", json!(20_000)),
    ] {
        let mut req = json!({"op": "dlq_redrive", "selection": {"queue": "ext"}, "batch_size": 1});
        req[field] = value.clone();
        let answer = raw_admin(&qd, &req);
        assert!(
            answer.contains("bad_request") && answer.contains(field),
            "{field} = {value}: {answer:?}"
        );
    }
    for op in ["dlq_redrive", "dlq_purge"] {
        let answer = raw_admin(&qd, &json!({"op": op, "selection": {"error_contains": ""}}));
        assert!(answer.contains("bad_request"), "{op}: {answer:?}");
    }
    let out = qd.qctl(&[
        "dlq", "redrive", "--queue", "ext", "--rate", "1e-300/s", "--batch", "1",
    ]);
    assert_eq!(out.status.code(), Some(2), "a usage error: {}", text(&out));
    let out = qd.qctl(&["dlq", "purge", "--error", "", "--yes"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--error is empty"), "{}", text(&out));
    assert_eq!(dead_in(&qd, "ext"), 3, "nothing moved or was purged");
    assert!(!qd.logs().contains("panicked"), "{}", qd.logs());
}

/// A page of 0 jobs, or a tenant filter no tenant can have, would read as "no
/// jobs": the daemon refuses them, and qctl `--limit 0`.
#[test]
fn a_listing_page_of_zero_jobs_or_of_an_impossible_tenant_is_refused() {
    let qd = Qd::start(EXTERNAL);
    qd.enqueue("ext", "x");
    for op in [
        json!({"op": "jobs_list", "limit": 0}),
        json!({"op": "dlq_list", "selection": {}, "limit": 0}),
    ] {
        let answer = raw_admin(&qd, &op);
        assert!(
            answer.contains("bad_request") && answer.contains("limit"),
            "{op}: {answer}"
        );
    }
    let out = qd.qctl(&["jobs", "list", "--limit", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    // Likewise a tenant filter no tenant can have: refused, not an empty answer.
    for args in [
        &["jobs", "list", "--tenant", "bad name!"][..],
        &["dlq", "list", "--tenant", ""],
        &["dlq", "redrive", "--tenant", "bad name!"],
    ] {
        let out = qd.qctl(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("must be 1 to 64 characters"),
            "{args:?}: {}",
            text(&out)
        );
    }
}

/// An `enqueue_batch` takes its jobs as objects or as JSON texts, not both; a text
/// keeps a JSON payload as written.
#[test]
fn enqueue_batch_takes_jobs_or_job_texts_not_both() {
    let qd = Qd::start(EXTERNAL);
    let both = json!({"op": "enqueue_batch", "queue": "ext",
        "jobs": [{"payload": "a"}], "job_texts": ["{\"payload\": \"b\"}"]});
    let answer = raw_admin(&qd, &both);
    assert!(
        answer.contains("bad_request") && answer.contains("not both"),
        "{answer}"
    );
    assert_eq!(queue_row(&qd, "ext")["ready"], 0, "nothing enqueued");
    let texts = json!({"op": "enqueue_batch", "queue": "ext",
        "job_texts": ["{\"payload\": {\"n\": 18446744073709551617, \"b\": 1, \"a\": 2}}"]});
    let answer = raw_admin(&qd, &texts);
    assert!(answer.contains("enqueued_batch"), "{answer}");
    let job = common::lease_one(&qd, "ext", "w", "5s").expect("a lease");
    assert_eq!(job["payload"], r#"{"n":18446744073709551617,"b":1,"a":2}"#);
}

#[test]
fn qctl_status_counts_worker_restarts_as_the_metric_does() {
    let work = tempfile::tempdir().expect("tempdir");
    let prog = script(work.path(), "ok.sh", "cat > /dev/null");
    let config = format!(
        "[queues.q]\nexecutor = {{ kind = \"command\", program = \"{}\" }}\nworkers = {{ min = 1, max = 1 }}\n",
        prog.display()
    );
    let qd = Qd::start_with(&config, &[("QD_TEST_HOOKS", "1")]);
    let restarts = |text: &str| metric(text, "qd_actor_restarts_total", &[("actor", "worker")]);
    let at_start = qd.scrape();
    assert!(
        at_start.contains("qd_actor_restarts_total{actor=\"worker\"} 0"),
        "created at 0 before the first crash, for increase() to see it:\n{at_start}"
    );
    assert_eq!(restarts(&at_start), 0.0);
    let ids: Vec<String> = (0..3)
        .map(|_| qd.enqueue("q", "qd-test:panic-on-attempt:1"))
        .collect();
    for id in &ids {
        assert_eq!(qd.wait_final(id, LONG)["state"], "succeeded");
    }
    let status = json_of(&qd, &["status"]);
    let worker = status["actors"]
        .as_array()
        .expect("actors")
        .iter()
        .find(|a| a["name"] == "worker")
        .expect("a worker row");
    assert_eq!(worker["restarts"], 3, "{status}");
    let metric = qd
        .scrape()
        .lines()
        .find(|l| l.starts_with("qd_actor_restarts_total{") && l.contains("actor=\"worker\""))
        .map(str::to_string)
        .expect("the worker restart counter");
    assert!(metric.ends_with(" 3"), "{metric}");
    let human = ok(&qd, &["status"]);
    assert!(
        human
            .lines()
            .any(|l| l.split_whitespace().eq(["worker", "3"])),
        "{human}"
    );
}

/// Bad flag values are usage errors (exit 2), refused by qctl before it asks the
/// daemon: a `--max-attempts` outside 1..=1000 and `workers set` with `--min` over
/// `--max` used to reach qd and come back as its `bad_request`, exit 1.
#[test]
fn out_of_range_enqueue_and_workers_flags_are_usage_errors() {
    let qd = Qd::start(EXTERNAL);
    for args in [
        &["enqueue", "ext", "--payload", "x", "--max-attempts", "0"][..],
        &["enqueue", "ext", "--payload", "x", "--max-attempts", "1001"],
        &["workers", "set", "ext", "--min", "4", "--max", "3"],
        &["workers", "set", "ext", "--min", "0", "--max", "0"],
    ] {
        let out = qd.qctl(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
    }
    let out = qd.qctl(&["workers", "set", "ext", "--min", "4", "--max", "3"]);
    assert!(
        text(&out).contains("--min 4 is more than --max 3"),
        "{}",
        text(&out)
    );
    assert_eq!(
        qd.qctl(&["queues", "--json"]).status.code(),
        Some(0),
        "the daemon still serves"
    );
}
