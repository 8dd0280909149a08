//! A real loopback server (axum on 127.0.0.1:0): status classification, Retry-After,
//! headers, timeouts, refused connections and cancel.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap as AxumHeaders;
use axum::response::IntoResponse;
use axum::routing::post;

use super::*;
use crate::job::JobId;

/// Bound for anything that should happen "soon" (2 shared cores in CI).
const SOON: Duration = Duration::from_secs(30);

type Seen = Arc<Mutex<Option<(AxumHeaders, Bytes)>>>;

async fn serve(seen: Seen) -> SocketAddr {
    let app = Router::new()
        .route("/ok", post(|| async { "queued" }))
        .route(
            "/busy-retry",
            post(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "1")],
                    "later",
                )
            }),
        )
        .route("/busy", post(|| async { StatusCode::SERVICE_UNAVAILABLE }))
        .route(
            "/slow-down",
            post(|| async {
                let at = SystemTime::now() + Duration::from_secs(120);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", httpdate::fmt_http_date(at))],
                )
            }),
        )
        .route(
            "/too-many",
            post(|| async { StatusCode::TOO_MANY_REQUESTS }),
        )
        .route(
            "/bad",
            post(|| async { (StatusCode::BAD_REQUEST, "missing field 'to'") }),
        )
        .route(
            "/bad-big",
            post(|| async { (StatusCode::BAD_REQUEST, "e".repeat(1 << 20)) }),
        )
        .route(
            "/boom",
            post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, [("retry-after", "30")]) }),
        )
        .route("/timeout", post(|| async { StatusCode::REQUEST_TIMEOUT }))
        .route(
            "/moved",
            post(|| async {
                (
                    StatusCode::MOVED_PERMANENTLY,
                    [("location", "https://new.example/hook")],
                )
            }),
        )
        .route("/hang", post(std::future::pending::<&'static str>))
        .route(
            "/echo",
            post(move |headers: AxumHeaders, body: Bytes| async move {
                *seen.lock().expect("lock") = Some((headers, body));
                StatusCode::NO_CONTENT.into_response()
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn spec(url: String) -> HttpSpec {
    HttpSpec {
        url,
        headers: BTreeMap::new(),
        timeout: Duration::from_secs(20),
        store_result: false,
        send_parents: false,
    }
}

fn job() -> JobRun {
    JobRun {
        id: JobId::new(),
        queue: Arc::from("hooks"),
        tenant: Arc::from("acme"),
        attempt: 2,
        idempotency_key: "order-7".to_owned(),
        payload: b"{\"order\":7}".to_vec(),
        max_result: 64 * 1024,
        token: 41,
        lease: Duration::from_secs(30),
        parents: None,
    }
}

async fn run_spec(spec: HttpSpec) -> ExecResult {
    let exec = HttpExecutor::new(&spec).expect("valid spec");
    let (job, cancel) = (job(), CancellationToken::new());
    let attempt = exec.run(&job, &cancel);
    tokio::time::timeout(SOON, attempt)
        .await
        .expect("the attempt ends within the bound")
}

async fn run_path(path: &str) -> ExecResult {
    let addr = serve(Seen::default()).await;
    run_spec(spec(format!("http://{addr}{path}"))).await
}

fn failure(result: ExecResult) -> Failure {
    match result {
        ExecResult::Failure(f) => f,
        ExecResult::Success { detail, .. } => panic!("expected a failure, got success {detail:?}"),
    }
}

#[tokio::test]
async fn status_200_is_success_with_body_head() {
    assert_eq!(
        run_path("/ok").await,
        ExecResult::Success {
            detail: Some("HTTP 200 OK: queued".into()),
            result: None,
        }
    );
}

#[tokio::test]
async fn status_503_with_retry_after_is_throttled() {
    let f = failure(run_path("/busy-retry").await);
    assert_eq!(
        f,
        Failure::Throttled {
            retry_after: Duration::from_secs(1),
            error: "HTTP 503 Service Unavailable: later".into()
        }
    );
}

#[tokio::test]
async fn status_503_without_retry_after_is_transient() {
    let f = failure(run_path("/busy").await);
    assert_eq!(
        f,
        Failure::Transient {
            error: "HTTP 503 Service Unavailable".into(),
            retry_after: None
        }
    );
}

#[tokio::test]
async fn status_429_honours_an_http_date_retry_after() {
    let Failure::Throttled { retry_after, error } = failure(run_path("/slow-down").await) else {
        panic!("expected throttled");
    };
    assert!(
        (Duration::from_secs(60)..=Duration::from_secs(120)).contains(&retry_after),
        "{retry_after:?}"
    );
    assert_eq!(error, "HTTP 429 Too Many Requests");
}

#[tokio::test]
async fn status_429_without_retry_after_waits_a_second() {
    let f = failure(run_path("/too-many").await);
    assert!(
        matches!(f, Failure::Throttled { retry_after, .. } if retry_after == DEFAULT_THROTTLE),
        "{f:?}"
    );
}

#[tokio::test]
async fn status_400_is_permanent_with_body_head() {
    let f = failure(run_path("/bad").await);
    assert_eq!(
        f,
        Failure::Permanent {
            error: "HTTP 400 Bad Request: missing field 'to'".into()
        }
    );
}

#[tokio::test]
async fn a_huge_error_body_is_cut_to_the_limit() {
    let Failure::Permanent { error } = failure(run_path("/bad-big").await) else {
        panic!("expected permanent");
    };
    assert_eq!(error.len(), "HTTP 400 Bad Request: ".len() + OUTPUT_LIMIT);
}

#[tokio::test]
async fn status_500_and_408_are_transient_honouring_retry_after() {
    let f = failure(run_path("/boom").await);
    assert_eq!(
        f,
        Failure::Transient {
            error: "HTTP 500 Internal Server Error".into(),
            retry_after: Some(Duration::from_secs(30))
        }
    );
    let f = failure(run_path("/timeout").await);
    assert!(
        matches!(
            f,
            Failure::Transient {
                retry_after: None,
                ..
            }
        ),
        "{f:?}"
    );
}

#[tokio::test]
async fn redirects_are_permanent_and_not_followed() {
    let f = failure(run_path("/moved").await);
    assert!(
        matches!(&f, Failure::Permanent { error }
            if error.starts_with("HTTP 301 Moved Permanently to https://new.example/hook;")),
        "{f:?}"
    );
}

#[tokio::test]
async fn connection_refused_is_transient() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let f = failure(run_spec(spec(format!("http://127.0.0.1:{port}/hook"))).await);
    assert!(
        matches!(
            &f,
            Failure::Transient {
                retry_after: None,
                ..
            }
        ),
        "{f:?}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let addr = serve(Seen::default()).await;
    let mut s = spec(format!("http://{addr}/hang"));
    s.timeout = Duration::from_millis(500);
    let f = failure(run_spec(s).await);
    assert!(
        matches!(&f, Failure::TimedOut { error } if error.starts_with("timed out after 500ms")),
        "{f:?}"
    );
}

#[tokio::test]
async fn cancel_interrupts_a_pending_request() {
    let addr = serve(Seen::default()).await;
    let exec = HttpExecutor::new(&spec(format!("http://{addr}/hang"))).expect("valid spec");
    let cancel = CancellationToken::new();
    let job = job();
    let attempt = exec.run(&job, &cancel);
    let canceller = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    };
    let (result, ()) = tokio::time::timeout(SOON, async { tokio::join!(attempt, canceller) })
        .await
        .expect("the attempt ends within the bound");
    assert!(matches!(failure(result), Failure::Interrupted { .. }));
}

#[tokio::test]
async fn an_operators_revoke_aborts_a_pending_request() {
    let addr = serve(Seen::default()).await;
    let exec = HttpExecutor::new(&spec(format!("http://{addr}/hang"))).expect("valid spec");
    let exec = crate::executor::Executor::Http(exec);
    let (cancel, revoked) = (CancellationToken::new(), CancellationToken::new());
    let job = job();
    let attempt = exec.run(&job, &cancel, &revoked);
    let revoker = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        revoked.cancel();
    };
    let (result, ()) = tokio::time::timeout(SOON, async { tokio::join!(attempt, revoker) })
        .await
        .expect("the attempt ends within the bound");
    let f = failure(result);
    assert!(
        matches!(&f, Failure::Interrupted { reason } if reason.contains("request aborted")),
        "{f:?}"
    );
}

#[tokio::test]
async fn server_receives_payload_and_identity_headers() {
    let seen = Seen::default();
    let addr = serve(Arc::clone(&seen)).await;
    let mut s = spec(format!("http://{addr}/echo"));
    s.headers
        .insert("Authorization".into(), "Bearer t0k".into());
    s.headers.insert("Qd-Tenant".into(), "spoofed".into());
    let job = job();
    let exec = HttpExecutor::new(&s).expect("valid spec");
    let result = exec.run(&job, &CancellationToken::new()).await;

    assert_eq!(
        result,
        ExecResult::Success {
            detail: Some("HTTP 204 No Content".into()),
            result: None,
        }
    );
    let (headers, body) = seen.lock().expect("lock").take().expect("request seen");
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(body.as_ref(), job.payload.as_slice());
    assert_eq!(get("idempotency-key").as_deref(), Some("order-7"));
    assert_eq!(get("qd-job-id"), Some(job.id.to_string()));
    assert_eq!(get("qd-attempt").as_deref(), Some("2"));
    assert_eq!(get("qd-tenant").as_deref(), Some("acme"));
    assert_eq!(get("qd-lease-token").as_deref(), Some("41"));
    assert_eq!(get("qd-queue").as_deref(), Some("hooks"));
    assert_eq!(get("authorization").as_deref(), Some("Bearer t0k"));
    assert_eq!(
        get("content-type").as_deref(),
        Some("application/octet-stream")
    );
}

#[tokio::test]
async fn a_scheduled_job_sends_its_schedule_and_tick_headers() {
    let seen = Seen::default();
    let addr = serve(Arc::clone(&seen)).await;
    let exec = HttpExecutor::new(&spec(format!("http://{addr}/echo"))).expect("valid spec");
    let mut scheduled = job();
    scheduled.idempotency_key = "schedule:nightly-report:2026-03-29T01:00:00Z".to_owned();
    let result = exec.run(&scheduled, &CancellationToken::new()).await;
    assert!(matches!(result, ExecResult::Success { .. }), "{result:?}");
    let (headers, _) = seen.lock().expect("lock").take().expect("request seen");
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(get("qd-schedule").as_deref(), Some("nightly-report"));
    assert_eq!(
        get("qd-schedule-tick").as_deref(),
        Some("2026-03-29T01:00:00Z")
    );

    // Other jobs send neither.
    let exec = HttpExecutor::new(&spec(format!("http://{addr}/echo"))).expect("valid spec");
    let _ = exec.run(&job(), &CancellationToken::new()).await;
    let (headers, _) = seen.lock().expect("lock").take().expect("request seen");
    assert!(headers.get("qd-schedule").is_none());
}

#[test]
fn retry_after_parses_seconds_and_dates_and_clamps() {
    let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").expect("date");
    assert_eq!(
        parse_retry_after(" 120 ", now),
        Some(Duration::from_secs(120))
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
        Some(Duration::ZERO)
    );
    assert_eq!(parse_retry_after("-5", now), Some(Duration::ZERO));
    assert_eq!(parse_retry_after("999999999", now), Some(MAX_RETRY_AFTER));
    assert_eq!(
        parse_retry_after("99999999999999999999999", now),
        Some(MAX_RETRY_AFTER)
    );
    let in_ten_days = httpdate::fmt_http_date(now + 10 * MAX_RETRY_AFTER);
    assert_eq!(parse_retry_after(&in_ten_days, now), Some(MAX_RETRY_AFTER));
    assert_eq!(parse_retry_after("soon", now), None);
    assert_eq!(parse_retry_after("1.5", now), None);
}

#[test]
fn invalid_settings_are_named() {
    let err = HttpExecutor::new(&spec("ftp://example.com/".into())).expect_err("ftp");
    assert!(err.to_string().starts_with("executor.url:"), "{err}");
    let mut s = spec("http://example.com/".into());
    s.headers.insert("Bad Name".into(), "x".into());
    let err = HttpExecutor::new(&s).expect_err("bad header");
    assert!(
        err.to_string().starts_with("executor.headers.Bad Name:"),
        "{err}"
    );
}
