//! The HTTP API refuses what a web page could make a browser send: a cross-site
//! `POST` (by `Sec-Fetch-Site`, else `Origin` against `Host`) gets `403 cross_origin`,
//! a `Host` that does not name the listener (DNS rebinding) `421
//! misdirected_request`; requests without those headers (curl, SDKs, workers) pass.
//! Requests are written byte for byte, so the test controls every header.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Qd;
use serde_json::Value;

const BODY: &str = r#"{"payload":"from a page"}"#;

/// Sends one HTTP/1.1 request with exactly `headers`; returns (status, JSON body).
fn raw(api: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    let addr = api.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(req.as_bytes()).expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

fn jobs_in(qd: &Qd) -> usize {
    let out = common::json_of(qd, &["jobs", "list", "--queue", "hooks"]);
    out["jobs"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_cross_site_post_is_refused_and_nothing_is_enqueued_while_curl_still_works() {
    let qd = Qd::start("[queues.hooks]\nexecutor = { kind = \"external\" }\n");
    let host = qd.api.trim_start_matches("http://").to_string();
    let path = "/v1/queues/hooks/jobs";
    let h = |extra: &[(&'static str, &'static str)]| {
        let mut v: Vec<(&str, &str)> = vec![("host", host.as_str())];
        v.extend_from_slice(extra);
        v
    };
    // What Chromium sends for fetch(..., {mode: "no-cors"}) from another origin.
    let (status, body) = raw(
        &qd.api,
        "POST",
        path,
        &h(&[
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "no-cors"),
            ("origin", "http://attacker.example"),
            ("content-type", "text/plain;charset=UTF-8"),
        ]),
        BODY,
    );
    assert_eq!((status, code(&body)), (403, "cross_origin"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("Sec-Fetch-Site")
    );
    let (status, body) = raw(
        &qd.api,
        "POST",
        path,
        &h(&[("sec-fetch-site", "same-site")]),
        BODY,
    );
    assert_eq!((status, code(&body)), (403, "cross_origin"), "{body}");
    // An older browser: no Sec-Fetch-Site, an Origin that is not this host.
    let (status, body) = raw(
        &qd.api,
        "POST",
        path,
        &h(&[("origin", "http://attacker.example")]),
        BODY,
    );
    assert_eq!((status, code(&body)), (403, "cross_origin"), "{body}");
    assert_eq!(jobs_in(&qd), 0, "a refused request enqueued nothing");

    // curl, SDKs and workers send neither header; a same-origin page or the address
    // bar ("none") passes; so does an Origin that matches Host.
    let origin = format!("http://{host}");
    for extra in [
        vec![],
        vec![("sec-fetch-site", "same-origin")],
        vec![("sec-fetch-site", "none")],
        vec![("origin", origin.as_str())],
    ] {
        let mut headers = vec![("host", host.as_str())];
        headers.extend(extra);
        let (status, body) = raw(&qd.api, "POST", path, &headers, BODY);
        assert_eq!(status, 202, "{headers:?}: {body}");
    }
    assert_eq!(jobs_in(&qd), 4);
    // Reading is a safe method: not refused (a page cannot read the answer anyway).
    let (status, _) = raw(
        &qd.api,
        "GET",
        "/healthz",
        &h(&[("sec-fetch-site", "cross-site")]),
        "",
    );
    assert_eq!(status, 200);
}

#[test]
fn a_host_not_naming_the_listener_gets_421_and_configured_names_pass() {
    let qd = Qd::start("[queues.hooks]\nexecutor = { kind = \"external\" }\n");
    let port = qd.api.rsplit(':').next().expect("port").to_string();
    let path = "/v1/queues/hooks/jobs";
    // DNS rebinding: the page's own name, resolved to 127.0.0.1.
    for bad in [
        format!("attacker.example:{port}"),
        "attacker.example".into(),
        format!("localhost:{}", 1),
    ] {
        let (status, body) = raw(&qd.api, "POST", path, &[("host", &bad)], BODY);
        assert_eq!(
            (status, code(&body)),
            (421, "misdirected_request"),
            "{bad}: {body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("api_allowed_hosts")
        );
        let (status, _) = raw(&qd.api, "GET", "/v1/jobs/x", &[("host", &bad)], "");
        assert_eq!(
            status, 421,
            "reads too: a rebinding page could read the answer"
        );
    }
    assert_eq!(jobs_in(&qd), 0);
    for good in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (status, body) = raw(&qd.api, "POST", path, &[("host", &good)], BODY);
        assert_eq!(status, 202, "{good}: {body}");
    }
}

#[test]
fn api_allowed_hosts_adds_names() {
    let mut qd = Qd::configure(
        tempfile::tempdir().expect("tempdir"),
        "[queues.hooks]\nexecutor = { kind = \"external\" }\n",
        "5s",
    );
    let text = std::fs::read_to_string(&qd.config).expect("config");
    let text = text.replacen(
        "[daemon]\n",
        "[daemon]\napi_allowed_hosts = [\"qd.internal\"]\n",
        1,
    );
    std::fs::write(&qd.config, text).expect("write");
    qd.spawn(&[]);
    let (status, body) = raw(
        &qd.api,
        "POST",
        "/v1/queues/hooks/jobs",
        &[("host", "qd.internal:8080")],
        BODY,
    );
    assert_eq!(status, 202, "{body}");
    let (status, _) = raw(
        &qd.api,
        "POST",
        "/v1/queues/hooks/jobs",
        &[("host", "qd.other")],
        BODY,
    );
    assert_eq!(status, 421);
}
