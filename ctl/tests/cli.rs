//! Runs the built `qctl` against a tiny fake qd on a temp Unix socket, checking
//! what an operator sees: tables, `--json`, exit codes and unreachable-daemon errors.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use qd_proto::{
    ErrorBody, ErrorCode, Payload, QueueInfo, RedriveResult, Request, Response, ResponseFrame,
};

type Log = Arc<Mutex<Vec<Request>>>;

/// A fake daemon answering canned responses; records every request it decodes.
struct Fake {
    _dir: tempfile::TempDir,
    path: PathBuf,
    log: Log,
}

fn answer(req: &Request) -> Result<Response, ErrorBody> {
    match req {
        Request::Queues {} => Ok(Response::Queues {
            queues: vec![queue("email", Some(192.0)), queue("thumbnails-large", None)],
        }),
        Request::DlqRedrive {
            selection,
            dry_run: true,
            ..
        } if selection.ids.is_empty() => Ok(Response::Redrive(RedriveResult {
            matched: 3,
            ids: vec!["a".into(), "b".into(), "c".into()],
            dry_run: true,
            ..RedriveResult::default()
        })),
        Request::DlqRedrive {
            selection,
            dry_run: false,
            ..
        } => Ok(Response::Redrive(RedriveResult {
            matched: selection.ids.len() as u64,
            moved: selection.ids.len() as u64,
            ids: selection.ids.clone(),
            ..RedriveResult::default()
        })),
        Request::Enqueue { .. } => Ok(Response::Enqueued(qd_proto::Enqueued {
            id: "0190aaaa-0000-7000-8000-000000000001".into(),
            duplicate: false,
        })),
        other => Err(ErrorBody::new(
            ErrorCode::NotFound,
            format!("fake has no {}", other.op()),
        )),
    }
}

fn queue(name: &str, oldest: Option<f64>) -> QueueInfo {
    QueueInfo {
        name: name.into(),
        ready: 12,
        delayed: 3,
        leased: 2,
        dead: 1,
        oldest_ready_age_secs: oldest,
        workers_busy: 2,
        workers_total: 4,
        workers_min: 1,
        workers_max: 16,
        paused: false,
        waiting: 7,
        blocked: 5,
    }
}

impl Fake {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("qctl.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let log = Log::default();
        let seen = Arc::clone(&log);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = Arc::clone(&seen);
                std::thread::spawn(move || serve(stream, &seen));
            }
        });
        Fake {
            _dir: dir,
            path,
            log,
        }
    }

    fn requests(&self) -> Vec<Request> {
        self.log.lock().expect("log").clone()
    }
}

fn serve(stream: std::os::unix::net::UnixStream, seen: &Mutex<Vec<Request>>) {
    let mut writer = stream.try_clone().expect("clone");
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let frame = match qd_proto::decode_request(line.as_bytes()) {
            Ok(f) => f,
            Err(bad) => {
                let _ = writer.write_all(&qd_proto::encode_response(&bad.into_response()));
                continue;
            }
        };
        seen.lock().expect("log").push(frame.req.clone());
        let reply = match answer(&frame.req) {
            Ok(r) => ResponseFrame::ok(frame.id, r),
            Err(e) => ResponseFrame::err(Some(frame.id), e),
        };
        let _ = writer.write_all(&qd_proto::encode_response(&reply));
    }
}

fn qctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("QD_SOCKET")
        .stdin(Stdio::null())
        .output()
        .expect("qctl runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn queues_prints_an_aligned_table() {
    let fake = Fake::start();
    let out = qctl(&fake.path, &["queues"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("QUEUE") && lines[0].contains("OLDEST READY"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("email") && lines[1].contains("3m12s") && lines[1].contains("2/4")
    );
    let ready = |l: &str| l.find("12").expect("ready count");
    assert_eq!(ready(lines[1]), ready(lines[2]), "columns align:\n{text}");
    // The jobs held by dependencies, under their own headers.
    for (header, count) in [("WAITING", "7"), ("BLOCKED", "5")] {
        let col = lines[0]
            .find(header)
            .unwrap_or_else(|| panic!("{header}:\n{text}"));
        for row in &lines[1..] {
            assert!(row[col..].starts_with(count), "{header} {count}:\n{text}");
        }
    }
}

#[test]
fn json_output_has_stable_field_names() {
    let fake = Fake::start();
    let out = qctl(&fake.path, &["queues", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["kind"], "queues");
    let q = &v["queues"][0];
    for field in [
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
    ] {
        assert!(q.get(field).is_some(), "missing {field} in {q}");
    }
    assert_eq!(
        v["queues"][1]["oldest_ready_age_secs"],
        serde_json::Value::Null
    );
}

#[test]
fn an_error_answer_exits_1_with_its_code() {
    let fake = Fake::start();
    let out = qctl(&fake.path, &["jobs", "show", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not_found"), "{}", stderr(&out));
}

#[test]
fn with_json_an_error_answer_is_the_error_object_on_stdout() {
    let fake = Fake::start();
    let out = qctl(&fake.path, &["jobs", "show", "nope", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    let body: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON on stdout");
    assert_eq!(
        body,
        serde_json::json!({"error": {"code": "not_found", "message": "fake has no jobs_show"}})
    );
}

#[test]
fn an_unreachable_daemon_is_reported_with_the_path_and_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.sock");
    let out = qctl(&missing, &["status"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("no such file"),
        "{err}"
    );

    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).expect("bind"));
    let out = qctl(&stale, &["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("connection refused"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn qd_socket_env_is_used_when_no_flag_is_given() {
    let fake = Fake::start();
    let out = Command::new(env!("CARGO_BIN_EXE_qctl"))
        .args(["queues"])
        .env("QD_SOCKET", &fake.path)
        .output()
        .expect("qctl runs");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn redrive_of_a_selection_resolves_ids_then_moves_them_in_batches() {
    let fake = Fake::start();
    let out = qctl(
        &fake.path,
        &["dlq", "redrive", "--queue", "email", "--batch", "2"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "moved 3 of 3\n");
    let sizes: Vec<(bool, usize)> = fake
        .requests()
        .into_iter()
        .filter_map(|r| match r {
            Request::DlqRedrive {
                selection, dry_run, ..
            } => Some((dry_run, selection.ids.len())),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, vec![(true, 0), (false, 2), (false, 1)]);
}

#[test]
fn redrive_dry_run_lists_and_moves_nothing() {
    let fake = Fake::start();
    let out = qctl(&fake.path, &["dlq", "redrive", "--all", "--dry-run"]);
    assert_eq!(stdout(&out), "a\nb\nc\ndry run: would move 3 of 3\n");
    assert_eq!(fake.requests().len(), 1);
}

#[test]
fn purge_without_yes_is_a_usage_error() {
    let fake = Fake::start();
    let out = qctl(&fake.path, &["dlq", "purge", "--all"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--yes"));
    assert!(fake.requests().is_empty());
}

#[test]
fn enqueue_sends_stdin_as_the_payload_and_prints_the_id() {
    let fake = Fake::start();
    let mut child = Command::new(env!("CARGO_BIN_EXE_qctl"))
        .arg("--socket")
        .arg(&fake.path)
        .args(["enqueue", "email", "--tenant", "acme", "--delay", "10s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"{\"to\":1}")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(stdout(&out), "0190aaaa-0000-7000-8000-000000000001\n");
    let reqs = fake.requests();
    let Some(Request::Enqueue {
        payload,
        delay_ms,
        tenant,
        ..
    }) = reqs.first()
    else {
        panic!("no enqueue: {reqs:?}");
    };
    assert_eq!(payload, &Payload::Text("{\"to\":1}".into()));
    assert_eq!(*delay_ms, Some(10_000));
    assert_eq!(tenant.as_deref(), Some("acme"));
}

#[test]
fn usage_errors_exit_2_and_completions_need_no_daemon() {
    let out = qctl(
        Path::new("/nonexistent"),
        &["jobs", "list", "--state", "sleeping"],
    );
    assert_eq!(out.status.code(), Some(2));
    let out = qctl(Path::new("/nonexistent"), &["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("qctl"));
}

#[test]
fn a_request_over_the_frame_limit_is_refused_before_it_is_sent_naming_its_size() {
    let fake = Fake::start();
    let limit = qd_proto::MAX_FRAME.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_qctl"))
        .arg("--socket")
        .arg(&fake.path)
        .args(["enqueue", "email"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let payload = vec![b'a'; qd_proto::MAX_FRAME];
    let writer = std::thread::spawn(move || stdin.write_all(&payload));
    let out = child.wait_with_output().expect("wait");
    writer.join().expect("writer").expect("stdin written");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for part in [
        format!("a payload of {} bytes", qd_proto::MAX_FRAME),
        format!("at most {limit} per frame"),
        "use the HTTP API".to_string(),
    ] {
        assert!(err.contains(&part), "{part:?} in {err}");
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("fix.bin");
    std::fs::write(&file, vec![0xff; qd_proto::MAX_FRAME]).expect("write");
    let id = "0190aaaa-0000-7000-8000-000000000001";
    let file_arg = file.to_str().expect("utf-8 path");
    let out = qctl(
        &fake.path,
        &["--json", "dlq", "redrive", id, "--payload-file", file_arg],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let body: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON error");
    assert_eq!(body["error"]["code"], "frame_too_large", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("a payload of {} bytes", qd_proto::MAX_FRAME))
            && message.contains(&limit),
        "{message}"
    );
    assert_eq!(fake.requests(), vec![], "nothing reached the daemon");
}
