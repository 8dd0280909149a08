use super::*;
use proptest::prelude::*;
use serde_json::json;

fn sample_requests() -> Vec<Request> {
    let sel = DlqSelection {
        queue: Some("email".into()),
        since_secs: Some(3600),
        ..DlqSelection::default()
    };
    vec![
        Request::Status {},
        Request::Queues {},
        Request::JobsList {
            queue: Some("email".into()),
            tenant: None,
            state: Some("ready".into()),
            error_contains: Some("timeout".into()),
            since_secs: Some(3600),
            limit: Some(5),
            after: None,
        },
        Request::JobsShow { id: "j1".into() },
        Request::JobsCancel {
            id: "j1".into(),
            keep_dependents: false,
        },
        Request::JobsRelease { id: "j1".into() },
        Request::JobsTree {
            id: "j1".into(),
            parents: true,
            max_depth: Some(3),
            max_nodes: None,
        },
        Request::Enqueue {
            queue: "email".into(),
            tenant: Some("acme".into()),
            key: Some("k".into()),
            delay_ms: Some(10_000),
            max_attempts: Some(3),
            priority: Some("-5m".into()),
            payload: Payload::Text("hi".into()),
            after: vec!["0190f1c2-0000-7000-8000-000000000000".into()],
            after_policy: Some("finished".into()),
        },
        Request::EnqueueBatch {
            queue: "email".into(),
            jobs: vec![json!({"payload": "hi", "idempotency_key": "k"})],
            job_texts: Vec::new(),
        },
        Request::DlqList {
            selection: sel.clone(),
            limit: Some(10),
            after: Some("j0".into()),
        },
        Request::DlqShow { id: "j1".into() },
        Request::DlqRedrive {
            selection: sel.clone(),
            dry_run: true,
            batch_size: Some(100),
            rate_per_sec: Some(20.0),
            payload: Some(Payload::Text("fixed".into())),
        },
        Request::DlqPurge {
            selection: sel,
            dry_run: false,
            cascade: true,
            release: false,
        },
        Request::LimitsShow {},
        Request::LimitsSet {
            tenant: "acme".into(),
            weight: Some(3),
            max_concurrency: None,
            max_depth: Some(10),
        },
        Request::LimitsReset {
            tenant: None,
            queue: Some("email".into()),
            limiter: None,
        },
        Request::WorkersSet {
            queue: "email".into(),
            min: 1,
            max: 4,
        },
        Request::QueuePause {
            queue: "email".into(),
        },
        Request::QueueResume {
            queue: "email".into(),
        },
        Request::LimiterSet {
            limiter: "smtp".into(),
            per_second: Some(20),
            burst: None,
        },
        Request::JobsPayload { id: "j1".into() },
        Request::JobsResult { id: "j1".into() },
        Request::DlqExport {
            selection: DlqSelection::default(),
            limit: Some(50),
            after: Some("j0".into()),
        },
        Request::Top {
            tenants_of: Some("email".into()),
        },
        Request::Backup {
            path: "/var/backups/qd.db".into(),
            force: false,
        },
        Request::Reload {},
        Request::SchedulesList {},
        Request::SchedulesPause {
            name: "nightly".into(),
        },
        Request::SchedulesResume {
            name: "nightly".into(),
        },
        Request::SchedulesTrigger {
            name: "nightly".into(),
        },
    ]
}

fn decode_json(value: serde_json::Value) -> Result<RequestFrame, ErrorFrame> {
    decode_request(value.to_string().as_bytes())
}

fn code_of(r: Result<RequestFrame, ErrorFrame>) -> ErrorCode {
    r.expect_err("decoding should fail").err.code
}

#[test]
fn every_request_round_trips_and_its_op_is_listed() {
    let samples = sample_requests();
    assert_eq!(samples.len(), Request::OPS.len(), "one sample per op");
    for (i, req) in samples.into_iter().enumerate() {
        assert_eq!(req.op(), Request::OPS[i]);
        let frame = RequestFrame {
            v: VERSION,
            id: i as u64,
            req,
        };
        let line = encode_request(&frame);
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(decode_request(&line), Ok(frame));
    }
}

#[test]
fn jobs_list_error_and_since_filters_are_optional_on_the_wire() {
    let req: Request =
        serde_json::from_str(r#"{"op":"jobs_list","queue":"email"}"#).expect("a request");
    let Request::JobsList {
        error_contains,
        since_secs,
        ..
    } = &req
    else {
        panic!("{req:?}");
    };
    assert_eq!((error_contains, since_secs), (&None, &None));
    // Absent filters are left out, so a request without them reads as before.
    let text = serde_json::to_string(&req).expect("json");
    assert!(
        !text.contains("error_contains") && !text.contains("since_secs"),
        "{text}"
    );
}

#[test]
fn job_texts_cross_the_wire_as_written() {
    let text = r#"{"payload": {"n": 18446744073709551617, "b": 1, "a": 2}}"#;
    let frame = RequestFrame {
        v: VERSION,
        id: 1,
        req: Request::EnqueueBatch {
            queue: "email".into(),
            jobs: Vec::new(),
            job_texts: vec![text.into()],
        },
    };
    let line = encode_request(&frame);
    assert!(
        !String::from_utf8_lossy(&line).contains("\"jobs\""),
        "empty jobs left out"
    );
    let Ok(RequestFrame {
        req: Request::EnqueueBatch { job_texts, .. },
        ..
    }) = decode_request(&line)
    else {
        panic!("decodes");
    };
    assert_eq!(job_texts, [text]);
}

#[test]
fn request_wire_shape_matches_the_spec() {
    let frame = decode_json(json!({"v":1,"id":7,"req":{"op":"dlq_redrive","selection":{"ids":["a","b"]},"dry_run":true}}))
        .expect("valid frame");
    assert_eq!(frame.id, 7);
    assert_eq!(
        frame.req,
        Request::DlqRedrive {
            selection: DlqSelection::of_ids(vec!["a".into(), "b".into()]),
            dry_run: true,
            batch_size: None,
            rate_per_sec: None,
            payload: None,
        }
    );
}

#[test]
fn malformed_frames_get_stable_error_codes() {
    assert_eq!(code_of(decode_request(b"{not json")), ErrorCode::BadFrame);
    assert_eq!(code_of(decode_request(b"[1,2]")), ErrorCode::BadFrame);
    assert_eq!(
        code_of(decode_json(json!({"id":1,"req":{"op":"status"}}))),
        ErrorCode::BadFrame
    );
    assert_eq!(
        code_of(decode_json(json!({"v":1,"req":{"op":"status"}}))),
        ErrorCode::BadFrame
    );
    assert_eq!(
        code_of(decode_json(json!({"v":1,"id":-1,"req":{"op":"status"}}))),
        ErrorCode::BadFrame
    );
    assert_eq!(
        code_of(decode_json(json!({"v":1,"id":1}))),
        ErrorCode::BadFrame
    );
    assert_eq!(
        code_of(decode_json(json!({"v":1,"id":1,"req":"status"}))),
        ErrorCode::BadFrame
    );
    assert_eq!(
        code_of(decode_json(json!({"v":2,"id":1,"req":{"op":"status"}}))),
        ErrorCode::UnsupportedVersion
    );
    assert_eq!(
        code_of(decode_json(json!({"v":1,"id":1,"req":{"op":"explode"}}))),
        ErrorCode::UnknownOp
    );
    assert_eq!(
        code_of(decode_json(json!({"v":1,"id":1,"req":{"op":"jobs_show"}}))),
        ErrorCode::BadRequest
    );
    assert_eq!(
        code_of(decode_json(
            json!({"v":1,"id":1,"req":{"op":"status","extra":1}})
        )),
        ErrorCode::BadRequest
    );
}

#[test]
fn errors_keep_the_request_id_when_it_is_readable() {
    let err = decode_json(json!({"v":1,"id":42,"req":{"op":"explode"}})).expect_err("unknown op");
    assert_eq!(err.id, Some(42));
    assert!(err.err.message.contains("explode"));
    let err = decode_request(b"garbage").expect_err("bad json");
    assert_eq!(err.id, None);
}

#[test]
fn oversized_frame_is_refused_before_parsing() {
    let mut line = vec![b' '; MAX_FRAME + 1];
    line.push(b'\n');
    let err = decode_request(&line).expect_err("too large");
    assert_eq!(err.err.code, ErrorCode::FrameTooLarge);
    let exact = vec![b' '; MAX_FRAME];
    assert_eq!(code_of(decode_request(&exact)), ErrorCode::BadFrame);
}

#[test]
fn a_request_with_a_payload_of_the_default_max_payload_fits_a_frame() {
    // The daemon's default `max_payload` (daemon/src/config/compile.rs).
    const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;
    let longest = |n: usize| "\u{1}".repeat(n); // 6 bytes per byte in JSON
    let payloads = [
        vec![0x01; DEFAULT_MAX_PAYLOAD],
        vec![0xff; DEFAULT_MAX_PAYLOAD],
        vec![b'"'; DEFAULT_MAX_PAYLOAD],
    ];
    for bytes in payloads {
        let enqueue = Request::Enqueue {
            queue: "q".repeat(64),
            tenant: Some("t".repeat(64)),
            key: Some(longest(255)),
            delay_ms: Some(u64::MAX),
            max_attempts: Some(u32::MAX),
            priority: Some("-86400s".into()),
            payload: Payload::from_bytes(bytes.clone()),
            after: Vec::new(),
            after_policy: None,
        };
        let redrive = Request::DlqRedrive {
            selection: DlqSelection::of_ids(vec![longest(64)]),
            dry_run: false,
            batch_size: Some(u32::MAX),
            rate_per_sec: Some(f64::MAX),
            payload: Some(Payload::from_bytes(bytes)),
        };
        for req in [enqueue, redrive] {
            let line = encode_request(&RequestFrame {
                v: VERSION,
                id: u64::MAX,
                req,
            });
            assert!(line.len() - 1 <= MAX_FRAME, "{} bytes", line.len() - 1);
            decode_request(&line).expect("the daemon reads it");
        }
    }
}

#[test]
fn response_frames_round_trip_with_the_spec_shape() {
    let detail = JobDetail {
        summary: JobSummary {
            id: "j1".into(),
            queue: "email".into(),
            tenant: "acme".into(),
            state: "dead".into(),
            attempts: 3,
            budget_used: 3,
            max_attempts: 3,
            created_at: 1,
            updated_at: 2,
            ready_at: None,
            last_error: Some("boom".into()),
            blocks: Some(2),
        },
        idempotency_key: None,
        payload_preview: "hi".into(),
        payload_bytes: 2,
        priority_ms: -300_000,
        result_bytes: Some(7),
        history: vec![],
        history_elided: 0,
        history_elided_at: 0,
        parents: vec![crate::EdgeInfo {
            id: "p1".into(),
            edge: "broken".into(),
            state: None,
            queue: None,
        }],
        dependents: vec![],
        dependents_total: 0,
        blocks_transitive: Some(5),
    };
    let frame = ResponseFrame::ok(9, Response::Job(Box::new(detail)));
    let line = encode_response(&frame);
    let value: serde_json::Value = serde_json::from_slice(&line).expect("json");
    assert_eq!(value["v"], 1);
    assert_eq!(value["id"], 9);
    assert_eq!(value["ok"]["kind"], "job");
    assert_eq!(value["ok"]["queue"], "email", "summary is flattened");
    assert_eq!(decode_response(&line).expect("decodes"), frame);

    let err = ErrorFrame::new(None, ErrorCode::FrameTooLarge, "too big").into_response();
    let value: serde_json::Value = serde_json::from_slice(&encode_response(&err)).expect("json");
    assert_eq!(
        value,
        json!({"v":1,"id":null,"err":{"code":"frame_too_large","message":"too big"}})
    );
}

#[test]
fn a_page_without_a_cursor_from_an_older_server_reads_as_the_last_page() {
    let line = br#"{"v":1,"id":1,"ok":{"kind":"jobs","jobs":[]}}"#;
    let frame = decode_response(line).expect("decodes");
    assert_eq!(
        frame.reply,
        Reply::Ok(Response::Jobs {
            jobs: vec![],
            next_after: None
        })
    );
}

#[test]
fn unknown_error_codes_from_a_newer_server_read_as_other() {
    let line = br#"{"v":1,"id":1,"err":{"code":"quota_exceeded","message":"x"}}"#;
    let frame = decode_response(line).expect("decodes");
    assert_eq!(
        frame.reply,
        Reply::Err(ErrorBody::new(ErrorCode::Other, "x"))
    );
}

#[test]
fn preview_is_the_first_kib_lossily_decoded() {
    let payload = vec![b'a'; 3000];
    assert_eq!(JobDetail::preview(&payload).len(), PREVIEW_BYTES);
    assert_eq!(JobDetail::preview(&[0x66, 0xff]), "f\u{fffd}");
}

proptest! {
    #[test]
    fn decode_request_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_request(&bytes);
    }

    #[test]
    fn decode_request_never_panics_on_json_like_text(text in r#"\{"v":[0-9-]{0,3},"id":[0-9a-z"-]{0,5},"req":\{"op":"[a-z_]{0,12}"[,"a-z:0-9\[\]\{\}]{0,40}\}\}"#) {
        let _ = decode_request(text.as_bytes());
    }
}
