//! The web console through the real `qd` binary, over raw HTTP/1.1 so every header
//! is the test's: login and sessions, the role check on every action (a `read`
//! session forging each POST gets 403 and nothing changes), the cross-site and
//! `Host` refusals, the security headers, the path prefix in every link, payloads
//! shown escaped, the audit line naming `console:<token>`, the event stream.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{Qd, free_port, json_of, ok, wait_for};

const ADMIN: &str = "admin-secret-0123456789";
const READER: &str = "reader-secret-0123456789";
const PREFIX: &str = "/qd";

struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

struct Console {
    addr: String,
}

impl Console {
    fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut stream = TcpStream::connect(&self.addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut req = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req.push_str(&format!("host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if method == "POST" {
            req.push_str("content-type: application/x-www-form-urlencoded\r\n");
        }
        req.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
        stream.write_all(req.as_bytes()).expect("write");
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status");
        Answer {
            status,
            head: head.to_string(),
            body: body.to_string(),
        }
    }

    /// Logs in with `token` as a same-origin browser form would; returns the cookie.
    fn login(&self, token: &str) -> String {
        let a = self.send(
            "POST",
            &format!("{PREFIX}/login"),
            &[("sec-fetch-site", "same-origin")],
            &format!("token={token}"),
        );
        assert_eq!(a.status, 303, "{}{}", a.head, a.body);
        let cookie = a.header("set-cookie").expect("cookie");
        for part in ["HttpOnly", "SameSite=Strict", "Path=/qd"] {
            assert!(cookie.contains(part), "{cookie}");
        }
        assert!(!cookie.contains("Secure"), "plain http: no Secure");
        cookie.split(';').next().expect("pair").to_string()
    }

    fn get(&self, path: &str, cookie: &str) -> Answer {
        self.send("GET", &format!("{PREFIX}{path}"), &[("cookie", cookie)], "")
    }

    fn post(&self, path: &str, cookie: &str, body: &str) -> Answer {
        self.send(
            "POST",
            &format!("{PREFIX}{path}"),
            &[("cookie", cookie), ("sec-fetch-site", "same-origin")],
            body,
        )
    }
}

/// qd with a token file (an admin and a reader token) and the console at `/qd`.
fn start() -> (Qd, Console) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\nname = \"ops\"\ntoken = \"{ADMIN}\"\nroles = [\"admin\", \"read\", \"produce\"]\nqueues = [\"*\"]\n\n\
             [[tokens]]\nname = \"viewer\"\ntoken = \"{READER}\"\nroles = [\"read\"]\nqueues = [\"*\"]\n\n\
             [[tokens]]\nname = \"narrow\"\ntoken = \"narrow-secret-0123456789\"\nroles = [\"admin\"]\nqueues = [\"ext\"]\n"
        ),
    )
    .expect("tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("mode");
    let port = free_port();
    let mut qd = Qd::configure(
        dir,
        &format!(
            "[console]\nlisten = \"127.0.0.1:{port}\"\npath_prefix = \"{PREFIX}\"\nmax_streams = 2\n\n\
             [queues.ext]\nexecutor = {{ kind = \"external\" }}\nmax_attempts = 1\n\n\
             [queues.pool]\nexecutor = {{ kind = \"command\", program = \"/bin/true\" }}\nworkers = {{ min = 0, max = 2 }}\n"
        ),
        "5s",
    );
    let text = std::fs::read_to_string(&qd.config).expect("config");
    let text = text.replacen(
        "[daemon]\n",
        &format!("[daemon]\napi_tokens_file = \"{}\"\n", tokens.display()),
        1,
    );
    std::fs::write(&qd.config, text).expect("config");
    qd.spawn(&[]);
    let console = Console {
        addr: qd.console_addr().expect("console listen"),
    };
    wait_for("the console", Duration::from_secs(30), || {
        TcpStream::connect(&console.addr).ok()
    });
    (qd, console)
}

fn enqueue(qd: &Qd, payload: &str) -> String {
    ok(qd, &["enqueue", "ext", "--payload", payload])
        .trim()
        .to_string()
}

fn paused(qd: &Qd, queue: &str) -> bool {
    let out = json_of(qd, &["queues"]);
    out["queues"]
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["name"] == queue))
        .and_then(|q| q["paused"].as_bool())
        .expect("queue listed")
}

/// Every `href`, `src` and `action` value in `html`.
fn links(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in [
        "href=\"",
        "src=\"",
        "action=\"",
        "data-stream=\"",
        "data-poll=\"",
    ] {
        for part in html.split(attr).skip(1) {
            out.push(part.split('"').next().unwrap_or("").to_string());
        }
    }
    out
}

#[test]
fn login_sessions_and_logout_and_pages_carry_the_prefix_and_security_headers() {
    let (qd, c) = start();
    // Not logged in: a page sends the browser to the login form.
    let a = c.get("/", "");
    assert_eq!(a.status, 303, "{}", a.head);
    assert_eq!(a.header("location").as_deref(), Some("/qd/login"));
    // Wrong tokens, and tokens that may not use the console, are refused and logged.
    for (token, why) in [
        ("not-a-token-at-all-000", "unknown token"),
        ("narrow-secret-0123456789", "limited to some queues"),
    ] {
        let a = c.send(
            "POST",
            "/qd/login",
            &[("sec-fetch-site", "same-origin")],
            &format!("token={token}"),
        );
        assert_eq!(a.status, 401);
        assert!(a.body.contains(why), "{}", a.body);
    }
    assert!(qd.logs().contains("Console login failed"), "{}", qd.logs());
    assert!(
        qd.logs().contains("peer=127.0.0.1:"),
        "failed logins name the peer"
    );

    let cookie = c.login(ADMIN);
    let id = enqueue(&qd, "<script>document.title='pwned'</script>");
    for path in [
        "/",
        "/jobs",
        &format!("/jobs/{id}"),
        "/dlq",
        "/limits",
        "/queues/ext",
        "/login",
    ] {
        let a = c.get(path, &cookie);
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        let csp = a.header("content-security-policy").unwrap_or_default();
        for part in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(part), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline"));
        assert_eq!(
            a.header("x-content-type-options").as_deref(),
            Some("nosniff")
        );
        assert_eq!(
            a.header("cache-control").as_deref(),
            Some("no-store"),
            "{path}"
        );
        assert!(!a.body.contains("style=\""), "{path}: no inline style");
        assert!(!a.body.contains("<script>"), "{path}: no inline script");
        let found = links(&a.body);
        assert!(!found.is_empty(), "{path}");
        for link in found {
            assert!(
                link.starts_with("/qd/"),
                "{path}: link {link:?} lacks the prefix"
            );
            // Every link resolves (GET targets) to something other than 404.
            if !link.contains("/pause") && !link.contains("/logout") && !link.ends_with("/events") {
                let target = c.get(link.trim_start_matches("/qd"), &cookie);
                assert_ne!(target.status, 404, "{path}: {link}");
            }
        }
    }
    // The payload is shown as text, escaped; the raw download is an attachment.
    let page = c.get(&format!("/jobs/{id}"), &cookie);
    assert!(
        page.body.contains("&lt;script&gt;document.title="),
        "{}",
        page.body
    );
    let raw = c.get(&format!("/jobs/{id}/payload"), &cookie);
    assert!(
        raw.header("content-disposition")
            .unwrap_or_default()
            .starts_with("attachment")
    );
    assert_eq!(
        raw.header("content-type").as_deref(),
        Some("application/octet-stream")
    );

    // Logout ends the session on the server: the old cookie no longer works.
    assert_eq!(c.post("/logout", &cookie, "").status, 303);
    assert_eq!(c.get("/", &cookie).status, 303);
}

#[test]
fn a_read_session_gets_403_for_every_action_and_nothing_changes() {
    let (qd, c) = start();
    let id = enqueue(&qd, "keep me");
    let reader = c.login(READER);
    let page = c.get("/queues/ext", &reader);
    assert_eq!(page.status, 200);
    assert!(
        !page.body.contains("/pause\""),
        "no action buttons for a reader"
    );
    let forged: Vec<(String, &str)> = vec![
        ("/queues/ext/pause".into(), ""),
        ("/queues/ext/resume".into(), ""),
        ("/queues/pool/workers".into(), "min=0&max=1"),
        (format!("/jobs/{id}/cancel"), ""),
        (format!("/jobs/{id}/redrive"), "payload=x"),
        ("/dlq/redrive".into(), "step=confirm&all=1"),
        ("/dlq/purge".into(), "step=confirm&all=1&confirm=purge"),
        ("/limits/tenant".into(), "tenant=acme&weight=9"),
        ("/limits/reset".into(), "tenant=acme"),
    ];
    for (path, body) in &forged {
        let a = c.post(path, &reader, body);
        assert_eq!(a.status, 403, "{path}: {}", a.body);
        assert!(a.body.contains("admin role"), "{path}: {}", a.body);
    }
    assert!(!paused(&qd, "ext"));
    let job = json_of(&qd, &["jobs", "show", &id]);
    assert_eq!(job["state"], "ready");
    let limits = json_of(&qd, &["limits", "show"]);
    assert!(
        !limits
            .to_string()
            .contains("\"weight\":{\"source\":\"override\""),
        "{limits}"
    );
    assert!(
        !qd.logs().contains("by=\"console:viewer\""),
        "no change was audited"
    );
    // Without a session at all: 401.
    assert_eq!(c.post("/queues/ext/pause", "", "").status, 401);
    assert!(!paused(&qd, "ext"));
}

#[test]
fn admin_actions_go_through_the_admin_operations_and_are_audited_as_console() {
    let (qd, c) = start();
    let admin = c.login(ADMIN);
    let a = c.post("/queues/ext/pause", &admin, "");
    assert_eq!(a.status, 303, "{}", a.body);
    assert!(
        a.header("location")
            .unwrap_or_default()
            .starts_with("/qd/queues/ext?notice=")
    );
    assert!(paused(&qd, "ext"), "qctl queues agrees");
    assert_eq!(c.post("/queues/ext/resume", &admin, "").status, 303);
    assert!(!paused(&qd, "ext"));
    assert_eq!(
        c.post("/queues/pool/workers", &admin, "min=1&max=2").status,
        303
    );
    let bad = c.post("/queues/pool/workers", &admin, "min=3&max=2");
    assert_eq!(bad.status, 400, "the admin operation's check: {}", bad.body);
    assert_eq!(c.post("/queues/nope/pause", &admin, "").status, 404);

    let id = enqueue(&qd, "cancel me");
    assert_eq!(
        c.post(&format!("/jobs/{id}/cancel"), &admin, "").status,
        303
    );
    assert_eq!(json_of(&qd, &["jobs", "show", &id])["state"], "cancelled");

    // Purge needs the typed confirmation; a dry run counts first.
    let preview = c.post("/dlq/purge", &admin, "step=preview&all=1");
    assert_eq!(preview.status, 200);
    assert!(
        preview.body.contains("<b>0</b> dead jobs match"),
        "{}",
        preview.body
    );
    let unconfirmed = c.post("/dlq/purge", &admin, "step=confirm&all=1&confirm=yes");
    assert_eq!(unconfirmed.status, 400);
    let empty = c.post("/dlq/redrive", &admin, "step=confirm");
    assert_eq!(
        empty.status, 400,
        "an empty selection must say all: {}",
        empty.body
    );

    let logs = qd.logs();
    for op in ["queue_pause", "queue_resume", "workers_set", "jobs_cancel"] {
        assert!(
            logs.lines().any(|l| l.contains("qd::audit")
                && l.contains(&format!("op=\"{op}\""))
                && l.contains("by=\"console:ops\"")),
            "no console audit line for {op}:\n{logs}"
        );
    }
}

#[test]
fn cross_site_forms_and_foreign_hosts_are_refused_before_anything_happens() {
    let (qd, c) = start();
    let admin = c.login(ADMIN);
    // An attacker page auto-submitting a form: the browser says cross-site.
    for headers in [
        vec![("cookie", admin.as_str()), ("sec-fetch-site", "cross-site")],
        vec![("cookie", admin.as_str()), ("sec-fetch-site", "same-site")],
        vec![
            ("cookie", admin.as_str()),
            ("origin", "http://attacker.example"),
        ],
    ] {
        let a = c.send("POST", "/qd/queues/ext/pause", &headers, "");
        assert_eq!(a.status, 403, "{headers:?}");
        assert!(a.header("content-security-policy").is_some());
    }
    let login = c.send(
        "POST",
        "/qd/login",
        &[("sec-fetch-site", "cross-site")],
        &format!("token={ADMIN}"),
    );
    assert_eq!(login.status, 403, "login CSRF is refused too");
    assert!(!paused(&qd, "ext"));
    // DNS rebinding: the page's own name.
    let port = c.addr.rsplit(':').next().expect("port");
    let a = c.send(
        "GET",
        "/qd/",
        &[
            ("host", &format!("attacker.example:{port}")),
            ("cookie", &admin),
        ],
        "",
    );
    assert_eq!(a.status, 421);
    let a = c.send(
        "GET",
        "/qd/",
        &[("host", &format!("localhost:{port}")), ("cookie", &admin)],
        "",
    );
    assert_eq!(a.status, 200);
}

#[test]
fn the_event_stream_sends_the_overview_and_is_capped() {
    let (qd, c) = start();
    let admin = c.login(ADMIN);
    enqueue(&qd, "one");
    // Read the first events of a stream.
    let mut stream = TcpStream::connect(&c.addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET /qd/live/events HTTP/1.1\r\nhost: {}\r\ncookie: {admin}\r\n\r\n",
        c.addr
    )
    .expect("write");
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !(seen.contains("event: overview") && seen.contains("data-queue=\"ext\"")) {
        let n = stream.read(&mut buf).expect("read");
        assert!(n > 0, "stream ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("text/event-stream"), "{seen}");
    assert!(
        seen.to_ascii_lowercase().contains("x-accel-buffering: no"),
        "{seen}"
    );
    // max_streams = 2: a second stream is fine, a third is refused.
    let mut second = TcpStream::connect(&c.addr).expect("connect");
    write!(
        second,
        "GET /qd/live/events HTTP/1.1\r\nhost: {}\r\ncookie: {admin}\r\n\r\n",
        c.addr
    )
    .expect("write");
    second
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let n = second.read(&mut buf).expect("read");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let third = c.get("/live/events", &admin);
    assert_eq!(third.status, 503);
    // The polling fallback answers the same table.
    let poll = c.get("/live/overview", &admin);
    assert!(poll.body.contains("data-queue=\"ext\""), "{}", poll.body);
}

#[test]
fn a_public_console_without_a_token_file_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("qd.toml");
    std::fs::write(
        &config,
        "[console]\nlisten = \"0.0.0.0:7071\"\n\n[queues.ext]\nexecutor = { kind = \"external\" }\n",
    )
    .expect("write");
    let out = std::process::Command::new(common::qd_bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("qd");
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("console.listen") && text.contains("api_tokens_file"),
        "{text}"
    );
}
