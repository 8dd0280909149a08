//! Slow and hostile HTTP clients, over real sockets against the real `qd`:
//! trickled headers and bodies are cut at `daemon.http`'s timeouts, idle keep-alive
//! connections are closed, connections over the cap are refused with a JSON 503
//! while the ones being served go on, deeply nested JSON is refused, and every 4xx,
//! including those hyper raises below qd's handlers, has the JSON error body.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Qd;
use serde_json::Value;

const QUEUE: &str = "[queues.ext]\nexecutor = { kind = \"external\" }\n";

/// A qd with `http` limits. The raw requests here name the host `x`, which the
/// listener is told is its name (`api_allowed_hosts`), so the limits under test
/// answer, not the `Host` check.
fn start(http: &str) -> Qd {
    Qd::start(&format!(
        "api_allowed_hosts = [\"x\"]\nhttp = {{ {http} }}\n\n{QUEUE}"
    ))
}

fn connect(qd: &Qd) -> TcpStream {
    let addr = qd.api.trim_start_matches("http://");
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    stream
}

/// Reads until the server closes the connection (or the 30 s read timeout).
fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0_u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one answer of a kept-alive connection: its head and `content-length`
/// bytes of body.
fn read_one(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return text;
            }
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return text,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Status code and JSON body of one raw answer; panics if the body is not JSON.
fn status_and_json(answer: &str) -> (u16, Value) {
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let json = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("body of a {status} is not JSON ({e}): {answer:?}"));
    (status, json)
}

/// Sends `request` whole and returns the answer read to the connection's close.
fn exchange(qd: &Qd, request: &[u8]) -> (u16, Value) {
    let mut stream = connect(qd);
    stream.write_all(request).expect("send");
    status_and_json(&read_to_close(&mut stream))
}

#[test]
fn trickled_headers_are_cut_at_the_header_timeout() {
    let qd = start("header_timeout = \"1s\"");
    let mut stream = connect(&qd);
    let start = Instant::now();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for byte in request {
        if stream.write_all(&[*byte]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    let _ = read_to_close(&mut stream);
    let held = start.elapsed();
    assert!(
        held >= Duration::from_millis(900) && held < Duration::from_secs(10),
        "the connection was held {held:?}"
    );
}

#[test]
fn a_trickled_body_is_answered_408_at_the_body_timeout() {
    let qd = start("body_timeout = \"1s\"");
    let mut stream = connect(&qd);
    let start = Instant::now();
    stream
        .write_all(
            b"POST /v1/queues/ext/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"payload\":\"",
        )
        .expect("send head");
    let mut stream2 = stream.try_clone().expect("clone");
    let trickle = std::thread::spawn(move || {
        for _ in 0..200 {
            if stream2.write_all(b"a").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let answer = read_to_close(&mut stream);
    let held = start.elapsed();
    let (status, body) = status_and_json(&answer);
    assert_eq!(status, 408, "{answer}");
    assert_eq!(body["error"]["code"], "request_timeout");
    assert!(held < Duration::from_secs(10), "held {held:?}");
    let _ = trickle.join();
}

#[test]
fn a_chunk_that_never_ends_does_not_hold_the_connection() {
    let qd = start("body_timeout = \"1s\"");
    let mut stream = connect(&qd);
    let start = Instant::now();
    stream
        .write_all(
            b"POST /v1/queues/ext/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n{\"pay",
        )
        .expect("send");
    let answer = read_to_close(&mut stream);
    assert!(start.elapsed() < Duration::from_secs(10), "held");
    let (status, body) = status_and_json(&answer);
    assert!((400..500).contains(&status), "{answer}");
    assert!(body["error"]["code"].is_string(), "{answer}");
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let qd = start("idle_timeout = \"1s\"");
    let mut stream = connect(&qd);
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    let mut first = [0_u8; 256];
    let n = stream.read(&mut first).expect("answer");
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let start = Instant::now();
    let _ = read_to_close(&mut stream);
    let idle = start.elapsed();
    assert!(
        idle >= Duration::from_millis(900) && idle < Duration::from_secs(10),
        "closed after {idle:?}"
    );
}

#[test]
fn connections_over_the_cap_get_a_json_503_and_served_ones_go_on() {
    let qd = start("max_connections = 3, header_timeout = \"30s\", idle_timeout = \"30s\"");
    // Each held connection is answered once, so the server has accepted (and
    // counted) all three before the next one comes; then they stay open.
    let held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = connect(&qd);
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .expect("send");
            let answer = read_one(&mut s);
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            s
        })
        .collect();
    let mut extra = connect(&qd);
    let (status, body) = status_and_json(&read_to_close(&mut extra));
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "too_many_connections");
    let mut served = held.into_iter().next().expect("one held");
    served
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let answer = read_to_close(&mut served);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Its slot is free again once it closed.
    common::wait_for("a slot to free", Duration::from_secs(10), || {
        let mut s = connect(&qd);
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        read_to_close(&mut s)
            .starts_with("HTTP/1.1 200")
            .then_some(())
    });
}

#[test]
fn deeply_nested_json_is_refused_with_400() {
    let qd = start("");
    let depth = 100_000;
    let payload = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let (status, body) = qd.post_raw(
        "/v1/queues/ext/jobs",
        format!("{{\"payload\": {payload}}}").as_bytes(),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("deeper than 128")),
        "{body}"
    );
    let fine = format!("{{\"payload\": {}{}}}", "[".repeat(100), "]".repeat(100));
    let (status, body) = qd.post_raw("/v1/queues/ext/jobs", fine.as_bytes());
    assert_eq!(status, 202, "{body}");
}

#[test]
fn errors_raised_below_the_handlers_have_json_bodies() {
    let qd = start("");
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    let (status, body) = exchange(&qd, long_uri.as_bytes());
    assert_eq!(status, 414, "{body}");
    assert_eq!(body["error"]["code"], "uri_too_long");

    let many_headers: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n");
    let (status, body) = exchange(&qd, request.as_bytes());
    assert_eq!(status, 431, "{body}");
    assert_eq!(body["error"]["code"], "headers_too_large");

    let (status, body) = exchange(
        &qd,
        b"POST /v1/queues/ext/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}",
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "bad_request");

    let (status, body) = exchange(&qd, b"GARBAGE\r\n\r\n");
    assert_eq!(status, 400, "{body}");

    let (status, body) = exchange(
        &qd,
        b"POST /v1/queues/ext/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["code"].is_string(), "{body}");
}

#[test]
fn check_config_refuses_unusable_http_limits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().display();
    let (code, stderr) = common::check_config(
        dir.path(),
        &format!(
            "[daemon]\ndata_dir = \"{data}\"\nhttp = {{ header_timeout = \"0s\", max_connections = 0, idle = \"1s\" }}\n\n{QUEUE}"
        ),
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("idle"),
        "the unknown key is named: {stderr}"
    );
    let (code, stderr) = common::check_config(
        dir.path(),
        &format!(
            "[daemon]\ndata_dir = \"{data}\"\nhttp = {{ header_timeout = \"0s\", max_connections = 0 }}\n\n{QUEUE}"
        ),
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("daemon.http.header_timeout"), "{stderr}");
    assert!(stderr.contains("daemon.http.max_connections"), "{stderr}");
}
