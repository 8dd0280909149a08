//! The operator's workflow through the real `qd` and `qctl` binaries: whole payloads
//! and the DLQ export, paging, typos in filters, `--json` errors, the audit log and
//! the HTTP and CLI messages an operator meets first.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::{Qd, fails, json_of, kill_all, ok, text};
use serde_json::{Value, json};

/// An external-worker queue: jobs stay ready until leased over HTTP, so counts are exact.
const EXTERNAL: &str = "[queues.ext]\nexecutor = { kind = \"external\" }\nmax_attempts = 3\n";

/// 64 KiB in which every byte value occurs, invalid UTF-8 included.
fn binary_payload() -> Vec<u8> {
    (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

fn enqueue_bytes(qd: &Qd, bytes: &[u8]) -> String {
    qd.enqueue_json("ext", json!({ "payload_b64": BASE64.encode(bytes) }))
}

#[test]
fn a_binary_payload_is_exported_byte_identical_to_a_file_and_to_stdout() {
    let qd = Qd::start(EXTERNAL);
    let payload = binary_payload();
    assert!(std::str::from_utf8(&payload).is_err(), "not text");
    let id = enqueue_bytes(&qd, &payload);

    let file = qd.dir.path().join("payload.bin");
    let file_arg = file.to_str().expect("utf-8 path");
    ok(&qd, &["jobs", "payload", &id, "--output", file_arg]);
    assert_eq!(std::fs::read(&file).expect("written"), payload);

    let out = qd.qctl(&["jobs", "payload", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(out.stdout == payload, "stdout differs from the payload");

    let answer = json_of(&qd, &["jobs", "payload", &id]);
    assert_eq!(answer["payload_bytes"], 64 * 1024);
    let b64 = answer["payload_b64"].as_str().expect("base64");
    assert_eq!(BASE64.decode(b64).expect("valid base64"), payload);

    let missing = "01a22e09-ad34-70bd-9098-5b0b4d8f1052";
    let err = fails(&qd, &["jobs", "payload", missing], 1);
    assert!(err.contains("not_found"), "{err}");
}

#[test]
fn dlq_export_writes_one_line_per_dead_job_with_payload_error_and_history() {
    let qd = Qd::start(EXTERNAL);
    let binary = binary_payload();
    let mut ids = vec![enqueue_bytes(&qd, &binary)];
    for n in 0..2 {
        ids.push(qd.enqueue("ext", &format!("text-{n}")));
    }
    kill_all(&qd, "bad data");
    let alive = qd.enqueue("ext", "still ready");

    let file = qd.dir.path().join("dead.jsonl");
    let out = qd.qctl(&[
        "dlq",
        "export",
        "--queue",
        "ext",
        "--output",
        file.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exported 3 dead jobs"),
        "{}",
        text(&out)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .expect("written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 3);
    let mut exported: Vec<&str> = lines
        .iter()
        .map(|l| l["id"].as_str().expect("id"))
        .collect();
    exported.sort_unstable();
    let mut expected: Vec<&str> = ids.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(exported, expected, "every dead job once, not {alive}");
    for line in &lines {
        let bytes = BASE64
            .decode(line["payload_b64"].as_str().expect("payload_b64"))
            .expect("base64");
        assert_eq!(line["payload_bytes"], bytes.len());
        assert!(
            line["last_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("bad data")),
            "{line}"
        );
        assert_eq!(common::history(line), ["permanent"], "{line}");
        if line["id"] == ids[0].as_str() {
            assert!(bytes == binary, "the binary payload is exported whole");
        }
    }

    let out = ok(&qd, &["dlq", "export", "--error", "text-1"]);
    let only: Vec<&str> = out.lines().collect();
    assert_eq!(only.len(), 1, "{out}");
    assert!(only[0].contains(&ids[2]), "{out}");
}

/// Follows `--after` cursors from `args` to the end; returns the ids in order and
/// the number of pages.
fn all_pages(qd: &Qd, args: &[&str]) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut full = args.to_vec();
        if let Some(cursor) = &after {
            full.extend(["--after", cursor.as_str()]);
        }
        let page = json_of(qd, &full);
        assert!(page.get("next_after").is_some(), "{page}");
        pages += 1;
        for job in page["jobs"].as_array().expect("jobs") {
            ids.push(job["id"].as_str().expect("id").to_owned());
        }
        match page["next_after"].as_str() {
            Some(cursor) => after = Some(cursor.to_owned()),
            None => return (ids, pages),
        }
        assert!(pages < 10, "paging does not end");
    }
}

#[test]
fn jobs_list_and_dlq_list_page_with_after_and_print_the_next_cursor() {
    let qd = Qd::start(EXTERNAL);
    let enqueued: Vec<String> = (0..5)
        .map(|n| qd.enqueue("ext", &format!("p{n}")))
        .collect();

    let (ids, pages) = all_pages(&qd, &["jobs", "list", "--limit", "2"]);
    let newest_first: Vec<String> = enqueued.iter().rev().cloned().collect();
    assert_eq!(ids, newest_first);
    assert_eq!(pages, 3);

    let first = ok(&qd, &["jobs", "list", "--limit", "2"]);
    let cursor_line = first.lines().last().expect("a last line");
    assert_eq!(cursor_line, format!("next page: --after {}", enqueued[3]));
    let last = ok(
        &qd,
        &["jobs", "list", "--limit", "2", "--after", &enqueued[1]],
    );
    assert!(
        last.contains(&enqueued[0]) && !last.contains("next page"),
        "{last}"
    );

    kill_all(&qd, "boom");
    let (dead, pages) = all_pages(&qd, &["dlq", "list", "--limit", "2"]);
    let mut sorted = dead.clone();
    sorted.sort_unstable();
    let mut expected = enqueued.clone();
    expected.sort_unstable();
    assert_eq!(sorted, expected, "every dead job exactly once: {dead:?}");
    assert_eq!(pages, 3);
}

#[test]
fn an_unknown_queue_in_any_filter_exits_1_naming_the_known_queues() {
    let queues = ["demo", "echo", "hooks"]
        .map(|q| format!("[queues.{q}]\nexecutor = {{ kind = \"external\" }}\n"))
        .concat();
    let qd = Qd::start(&queues);
    let expected = r#"unknown queue "dmeo" (known: demo, echo, hooks)"#;
    for args in [
        &["jobs", "list", "--queue", "dmeo"][..],
        &["dlq", "list", "--queue", "dmeo"],
        &["dlq", "export", "--queue", "dmeo"],
        &["dlq", "redrive", "--queue", "dmeo"],
        &["dlq", "purge", "--queue", "dmeo", "--yes"],
        &["enqueue", "dmeo", "--payload", "x"],
        &["workers", "set", "dmeo", "--min", "1", "--max", "2"],
        &["queue", "pause", "dmeo"],
        &["queue", "resume", "dmeo"],
        &["limits", "reset", "--queue", "dmeo"],
    ] {
        let out = fails(&qd, args, 1);
        assert!(out.contains(expected), "qctl {args:?}: {out}");
    }
    ok(&qd, &["dlq", "list", "--queue", "demo"]);
}

fn json_error(out: &std::process::Output) -> (String, String) {
    let body: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: stdout is not JSON: {}", text(out)));
    let keys: Vec<&String> = body["error"]
        .as_object()
        .expect("error object")
        .keys()
        .collect();
    assert_eq!(keys, ["code", "message"], "{body}");
    (
        body["error"]["code"].as_str().expect("code").to_owned(),
        body["error"]["message"]
            .as_str()
            .expect("message")
            .to_owned(),
    )
}

#[test]
fn json_errors_are_an_error_object_on_stdout_with_the_usual_exit_code() {
    let qd = Qd::start(EXTERNAL);
    let missing = "01a22e09-ad34-70bd-9098-5b0b4d8f1052";
    for (args, code, exit) in [
        (&["--json", "jobs", "show", missing][..], "not_found", 1),
        (
            &["--json", "dlq", "list", "--queue", "nope"],
            "not_found",
            1,
        ),
        (
            &["--json", "jobs", "cancel", "not-a-uuid"],
            "bad_request",
            1,
        ),
        (
            &["jobs", "list", "--state", "sleeping", "--json"],
            "usage",
            2,
        ),
        (&["--json", "dlq", "redrive"], "usage", 2),
    ] {
        let out = qd.qctl(args);
        assert_eq!(out.status.code(), Some(exit), "{args:?}: {}", text(&out));
        let (got, message) = json_error(&out);
        assert_eq!(got, code, "{args:?}: {message}");
        assert!(!message.is_empty());
        assert!(out.stderr.is_empty(), "{args:?}: {}", text(&out));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(common::qctl_bin())
        .arg("--socket")
        .arg(dir.path().join("none.sock"))
        .args(["--json", "status"])
        .output()
        .expect("run qctl");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(json_error(&out).0, "unreachable");
}

fn my_uid() -> String {
    let out = Command::new("id").arg("-u").output().expect("id -u");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

#[test]
fn every_admin_change_leaves_an_audit_line_with_uid_and_before_and_after() {
    let config = format!(
        "{EXTERNAL}[queues.pool]\nexecutor = {{ kind = \"command\", program = \"/bin/true\" }}\nworkers = {{ min = 1, max = 2 }}\nrate_limiter = \"smtp\"\n\n[rate_limiters.smtp]\nper_second = 50\nburst = 10\n"
    );
    let qd = Qd::start(&config);
    let cancelled = qd.enqueue("ext", "to cancel");
    let dead = qd.enqueue("ext", "to redrive");
    ok(&qd, &["jobs", "cancel", &cancelled]);
    kill_all(&qd, "boom");
    ok(&qd, &["dlq", "redrive", &dead]);
    kill_all(&qd, "boom again");
    ok(&qd, &["dlq", "purge", "--all", "--yes"]);
    for args in [
        &["queue", "pause", "ext"][..],
        &["queue", "resume", "ext"],
        &["limits", "set", "--tenant", "acme", "--weight", "3"],
        &["limits", "reset", "--tenant", "acme"],
        &["limits", "set-limiter", "smtp", "--per-second", "20"],
        &["limits", "reset", "--limiter", "smtp"],
        &["workers", "set", "pool", "--min", "0", "--max", "1"],
        &["limits", "reset", "--queue", "pool"],
        &["enqueue", "ext", "--payload", "audited"],
    ] {
        ok(&qd, args);
    }
    let uid = format!("uid={}", my_uid());
    let logs = qd.logs();
    let audit: Vec<&str> = logs.lines().filter(|l| l.contains("qd::audit")).collect();
    let line = |op: &str, parts: &[&str]| {
        let op = format!("op=\"{op}\"");
        audit
            .iter()
            .find(|l| l.contains(&op) && parts.iter().all(|p| l.contains(p)))
            .unwrap_or_else(|| {
                panic!(
                    "no audit line for {op} with {parts:?} in:\n{}",
                    audit.join("\n")
                )
            });
        assert!(
            audit
                .iter()
                .filter(|l| l.contains(&op))
                .all(|l| l.contains(" INFO ") && l.contains(&uid))
        );
    };
    line(
        "jobs_cancel",
        &[&cancelled, r#"before="ready""#, r#"after="cancelled""#],
    );
    line(
        "dlq_redrive",
        &[&dead, r#"before="dead""#, r#"after="ready""#],
    );
    line("dlq_purge", &[&dead, r#"after="deleted""#]);
    line("queue_pause", &["queue ext", "paused=no", "paused=yes"]);
    line(
        "queue_resume",
        &["queue ext", r#"after="workers=0..0 paused=no""#],
    );
    line(
        "limits_set",
        &["tenant acme", r#"before="weight=1"#, r#"after="weight=3"#],
    );
    line(
        "limits_reset",
        &["tenant acme", r#"before="weight=3"#, r#"after="weight=1"#],
    );
    line(
        "limiter_set",
        &["limiter smtp", "per_second=50", "per_second=20"],
    );
    line(
        "limits_reset",
        &["limiter smtp", r#"after="per_second=50 burst=10""#],
    );
    line(
        "workers_set",
        &["queue pool", "workers=1..2", "workers=0..1"],
    );
    line(
        "limits_reset",
        &["queue pool", r#"after="workers=1..2 paused=no""#],
    );
    line("enqueue", &["queue ext", r#"after="ready""#]);
    ok(&qd, &["queues"]);
    ok(&qd, &["limits", "show"]);
    let reads = qd
        .logs()
        .lines()
        .filter(|l| l.contains("qd::audit"))
        .count();
    assert_eq!(reads, audit.len(), "reads leave no audit line");
}

#[test]
fn http_unknown_routes_and_wrong_methods_answer_the_json_error_body() {
    let qd = Qd::start(EXTERNAL);
    let (status, body) = qd.get("/v1/nothing/here");
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("/v1/nothing/here"))
    );

    let (status, body) = qd.get("/v1/queues/ext/jobs");
    assert_eq!(status, 405, "{body}");
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("GET"))
    );

    let (status, body) = qd.post_raw("/v1/queues/ext/jobs", b"[1,2]");
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("must be a JSON object") && message.contains("not an array"),
        "{message}"
    );
}

fn enqueue_stdin(qd: &Qd, extra: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = Command::new(common::qctl_bin())
        .arg("--socket")
        .arg(&qd.socket)
        .args(["enqueue", "ext"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qctl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    child.wait_with_output().expect("qctl output")
}

#[test]
fn cli_messages_empty_stdin_pause_and_redrive_usage_say_what_happened() {
    let qd = Qd::start(EXTERNAL);
    let out = enqueue_stdin(&qd, &[], b"");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--allow-empty"),
        "{}",
        text(&out)
    );
    assert_eq!(
        json_of(&qd, &["queues"])["queues"][0]["ready"],
        0,
        "nothing enqueued"
    );

    let out = enqueue_stdin(&qd, &["--allow-empty"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(
        json_of(&qd, &["jobs", "show", id.trim()])["payload_bytes"],
        0
    );

    let paused = ok(&qd, &["queue", "pause", "ext"]);
    assert_eq!(paused.lines().count(), 1, "{paused}");
    assert!(paused.starts_with("paused queue ext"), "{paused}");
    assert_eq!(ok(&qd, &["queue", "resume", "ext"]), "resumed queue ext\n");
    assert_eq!(json_of(&qd, &["queue", "pause", "ext"])["kind"], "limits");

    let usage = fails(&qd, &["dlq", "redrive"], 2);
    assert!(
        usage.contains("--all") && !usage.contains("set all"),
        "{usage}"
    );
}

#[test]
fn any_payload_up_to_max_payload_goes_through_qctl_and_a_larger_one_is_refused_naming_both() {
    let qd = Qd::start(EXTERNAL);
    let dead = qd.enqueue("ext", "broken");
    kill_all(&qd, "bad data");
    assert_eq!(qd.job(&dead)["state"], "dead");
    let max = 1 << 20; // the default max_payload

    // As much as HTTP takes, however it is encoded in the frame: text, bytes that
    // are not UTF-8 (base64), text that JSON escapes six-fold (also base64).
    for payload in [vec![b'a'; max], vec![0xfe; max], vec![0x01; max]] {
        let out = enqueue_stdin(&qd, &[], &payload);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let id = String::from_utf8(out.stdout).expect("utf-8");
        let shown = json_of(&qd, &["jobs", "show", id.trim()]);
        assert_eq!(shown["payload_bytes"], max, "{}", shown["payload_preview"]);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("fix.bin");
    let file_arg = file.to_str().expect("utf-8 path");

    // Over max_payload: the daemon's refusal, naming both sizes.
    for size in [max + 1, 2_000_000] {
        let out = enqueue_stdin(&qd, &[], &vec![b'a'; size]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let expected = format!("payload is {size} bytes; max_payload is {max} bytes");
        assert!(text(&out).contains(&expected), "{}", text(&out));
        std::fs::write(&file, vec![b'a'; size]).expect("write");
        let err = fails(
            &qd,
            &["dlq", "redrive", &dead, "--payload-file", file_arg],
            1,
        );
        assert!(err.contains(&expected), "{err}");
    }
    // Over the frame: qctl's refusal before sending, naming the way out.
    let out = enqueue_stdin(&qd, &[], &vec![0xfe; 3_000_000]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    for part in [
        "a payload of 3000000 bytes",
        &format!("at most {} per frame", qd_proto::MAX_FRAME),
        "use the HTTP API",
    ] {
        assert!(err.contains(part), "{part:?} in {err}");
    }
    assert_eq!(qd.job(&dead)["state"], "dead", "no refusal changed it");

    std::fs::write(&file, vec![0xfe; max]).expect("write");
    let out = ok(&qd, &["dlq", "redrive", &dead, "--payload-file", file_arg]);
    assert!(out.contains("moved 1 of 1"), "{out}");
    assert_eq!(json_of(&qd, &["jobs", "show", &dead])["payload_bytes"], max);
}

#[test]
fn a_refused_dlq_export_leaves_the_output_file_as_it_was() {
    let qd = Qd::start(EXTERNAL);
    qd.enqueue("ext", "x");
    kill_all(&qd, "bad data");
    let file = qd.dir.path().join("dead.jsonl");
    std::fs::write(&file, "yesterday's export\n").expect("write");
    let path = file.to_str().expect("utf-8 path");
    let err = fails(
        &qd,
        &["dlq", "export", "--queue", "dmeo", "--output", path],
        1,
    );
    assert!(err.contains("unknown queue"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "yesterday's export\n",
        "a refused export changes nothing"
    );
    let leftovers: Vec<_> = std::fs::read_dir(qd.dir.path())
        .expect("list")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A complete export replaces it.
    ok(&qd, &["dlq", "export", "--queue", "ext", "--output", path]);
    let lines = std::fs::read_to_string(&file).expect("read");
    assert_eq!(lines.lines().count(), 1, "{lines}");
    assert!(lines.contains("bad data"), "{lines}");
}

#[test]
fn a_daemon_that_stops_mid_command_is_named_with_its_socket() {
    let mut qd = Qd::start(EXTERNAL);
    for n in 0..4 {
        qd.enqueue("ext", &format!("job-{n}"));
    }
    kill_all(&qd, "bad data");
    // One job a second: the daemon stops while qctl is still redriving.
    let redrive = Command::new(common::qctl_bin())
        .arg("--socket")
        .arg(&qd.socket)
        .args([
            "dlq", "redrive", "--queue", "ext", "--rate", "1/s", "--batch", "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run qctl");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    qd.terminate(std::time::Duration::from_secs(30));
    let out = redrive.wait_with_output().expect("qctl ends");
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let socket = qd.socket.display().to_string();
    assert!(
        said.contains(&socket) && said.contains("did qd stop or restart?"),
        "names the socket and the likely cause: {said}"
    );
}

/// Files `qctl` creates for `dlq export --output` and `jobs payload --output` hold
/// payloads: they are created 0600 whatever the umask allows.
#[test]
fn exports_and_payloads_written_to_new_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let qd = Qd::start(EXTERNAL);
    let id = qd.enqueue("ext", "secret");
    let dir = qd.dir.path();
    let payload = dir.join("payload.bin");
    ok(
        &qd,
        &[
            "jobs",
            "payload",
            &id,
            "--output",
            payload.to_str().expect("utf-8"),
        ],
    );
    kill_all(&qd, "bad data");
    let export = dir.join("export.jsonl");
    ok(
        &qd,
        &["dlq", "export", "--output", export.to_str().expect("utf-8")],
    );
    for file in [&payload, &export] {
        let mode = std::fs::metadata(file).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is {mode:o}", file.display());
    }
    assert_eq!(std::fs::read(&payload).expect("read"), b"secret");
}

/// `--output` names what to write, not a directory entry to replace: an existing
/// file keeps its mode (an export holds every payload; an operator who made the
/// file 0600 must not find it 0644), a symlink stays a symlink and its target gets
/// the export, and a FIFO (a pipe to `gzip`, `/dev/stdout`) gets the lines.
#[test]
fn dlq_export_over_an_existing_file_keeps_its_mode_its_symlink_and_its_fifo() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let qd = Qd::start(EXTERNAL);
    qd.enqueue("ext", "x");
    kill_all(&qd, "bad data");
    let dir = qd.dir.path();
    let export = |file: &std::path::Path| {
        ok(
            &qd,
            &[
                "dlq",
                "export",
                "--queue",
                "ext",
                "--output",
                file.to_str().expect("utf-8"),
            ],
        );
    };

    let private = dir.join("private.jsonl");
    std::fs::write(&private, "yesterday's export\n").expect("write");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    export(&private);
    let meta = std::fs::metadata(&private).expect("stat");
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "the file's mode changed"
    );
    assert!(
        std::fs::read_to_string(&private)
            .expect("read")
            .contains("bad data")
    );

    let target = dir.join("target.jsonl");
    std::fs::write(&target, "").expect("write");
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    export(&link);
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("lstat")
            .file_type()
            .is_symlink(),
        "the symlink was replaced by a file"
    );
    assert!(
        std::fs::read_to_string(&target)
            .expect("read")
            .contains("bad data")
    );

    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).expect("read the fifo"))
    };
    export(&fifo);
    assert!(
        std::fs::symlink_metadata(&fifo)
            .expect("lstat")
            .file_type()
            .is_fifo(),
        "the FIFO was replaced by a file"
    );
    assert!(reader.join().expect("reader").contains("bad data"));
}
