//! The web console through the real `qd` binary, over raw HTTP/1.1 so every header
//! is the test's: login and sessions, the role check on every action (a `read`
//! session forging each POST gets 403 and nothing changes), the cross-site and
//! `Host` refusals, the security headers, the path prefix in every link, payloads
//! shown escaped, the audit line naming `console:<token>`, the event stream.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Qd, free_port, json_of, lease_one, ok, wait_for};
use serde_json::json;

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
    let port = free_port();
    let mut qd = Qd::configure_with_tokens(
        &format!(
            "[[tokens]]\nname = \"ops\"\ntoken = \"{ADMIN}\"\nroles = [\"admin\", \"read\", \"produce\"]\nqueues = [\"*\"]\n\n\
             [[tokens]]\nname = \"viewer\"\ntoken = \"{READER}\"\nroles = [\"read\"]\nqueues = [\"*\"]\n\n\
             [[tokens]]\nname = \"narrow\"\ntoken = \"narrow-secret-0123456789\"\nroles = [\"admin\"]\nqueues = [\"ext\"]\n"
        ),
        &format!(
            "[console]\nlisten = \"127.0.0.1:{port}\"\npath_prefix = \"{PREFIX}\"\nmax_streams = 2\n\n\
             [queues.ext]\nexecutor = {{ kind = \"external\" }}\nmax_attempts = 1\n\n\
             [queues.pool]\nexecutor = {{ kind = \"command\", program = \"/bin/true\" }}\nworkers = {{ min = 0, max = 2 }}\n"
        ),
    );
    qd.spawn(&[]);
    let console = Console {
        addr: qd.console_addr().expect("console listen"),
    };
    wait_for("the console", Duration::from_secs(30), || {
        TcpStream::connect(&console.addr).ok()
    });
    (qd, console)
}

/// qd with an open console at `/qd` (loopback, no token file: nobody logs in, so
/// the tests' requests carry no cookie), queue `ext` (external workers, one
/// attempt) and `extra` config.
fn start_open(extra: &str) -> (Qd, Console) {
    let port = free_port();
    let qd = Qd::start(&format!(
        "[console]\nlisten = \"127.0.0.1:{port}\"\npath_prefix = \"{PREFIX}\"\n\n\
         [queues.ext]\nexecutor = {{ kind = \"external\" }}\nmax_attempts = 1\n{extra}"
    ));
    let console = Console {
        addr: qd.console_addr().expect("console listen"),
    };
    wait_for("the console", Duration::from_secs(30), || {
        TcpStream::connect(&console.addr).ok()
    });
    (qd, console)
}

/// Enqueues on `ext` for `tenant`; returns the id.
fn enqueue_for(qd: &Qd, tenant: &str, payload: &str) -> String {
    ok(
        qd,
        &["enqueue", "ext", "--tenant", tenant, "--payload", payload],
    )
    .trim()
    .to_string()
}

/// Leases the one ready job of `ext` (which must be `id`) and fails it for good
/// with `error`, so it is dead with that last error.
fn kill_with(qd: &Qd, id: &str, error: &str) {
    let job = lease_one(qd, "ext", "w", "5s").expect("a ready job");
    assert_eq!(job["id"], json!(id), "the only ready job");
    nack_dead(qd, &job, error);
}

fn nack_dead(qd: &Qd, job: &serde_json::Value, error: &str) {
    let id = job["id"].as_str().expect("id");
    let (status, body) = qd.post(
        &format!("/v1/jobs/{id}/nack"),
        &json!({"token": job["token"], "error": error, "kind": "permanent"}),
    );
    assert_eq!(status, 200, "nack: {body}");
}

/// The job ids a page links to, in page order.
fn job_ids(html: &str) -> Vec<String> {
    html.split("href=\"/qd/jobs/")
        .skip(1)
        .filter_map(|part| part.split('"').next())
        .filter(|id| !id.contains('/'))
        .map(str::to_string)
        .collect()
}

/// The target of the page's `rel="next"` link, unescaped, if there is one.
fn next_link(html: &str) -> Option<String> {
    let (before, _) = html.split_once("\" rel=\"next\"")?;
    let href = before.rsplit("href=\"").next()?;
    Some(href.replace("&amp;", "&"))
}

/// `text` as a query value.
fn enc(text: &str) -> String {
    serde_urlencoded::to_string([("", text)])
        .expect("encode")
        .trim_start_matches('=')
        .to_string()
}

fn wall_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch");
    i64::try_from(since.as_millis()).expect("fits")
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
    let (code, text) = common::check_config(
        dir.path(),
        "[console]\nlisten = \"0.0.0.0:7071\"\n\n[queues.ext]\nexecutor = { kind = \"external\" }\n",
    );
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("console.listen") && text.contains("api_tokens_file"),
        "{text}"
    );
}

#[test]
fn job_filters_error_and_since_narrow_the_list() {
    let (qd, c) = start_open("");
    let disk = enqueue_for(&qd, "acme", "one");
    kill_with(&qd, &disk, "disk full on /var");
    let refused = enqueue_for(&qd, "acme", "two");
    kill_with(&qd, &refused, "connection refused by smtp.example");
    let waiting = enqueue_for(&qd, "acme", "three");

    let all = c.get("/jobs", "");
    assert_eq!(all.status, 200, "{}", all.body);
    let mut ids = job_ids(&all.body);
    ids.sort();
    let mut expected = vec![disk.clone(), refused.clone(), waiting.clone()];
    expected.sort();
    assert_eq!(ids, expected);

    // `error`: a substring of the last error, ASCII case-insensitive as in `qctl
    // dlq list --error`, over jobs in any state; a job without an error never matches.
    let a = c.get("/jobs?error=disk+full", "");
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(job_ids(&a.body), vec![disk.clone()]);
    assert!(
        a.body.contains("name=\"error\" value=\"disk full\""),
        "the form keeps the filter: {}",
        a.body
    );
    let a = c.get("/jobs?error=REFUSED&tenant=acme&state=dead", "");
    assert_eq!(job_ids(&a.body), vec![refused.clone()]);
    let a = c.get("/jobs?error=no+such+text", "");
    assert_eq!(a.status, 200);
    assert!(job_ids(&a.body).is_empty(), "{}", a.body);

    // `since` as an RFC 3339 time between the jobs so far and one enqueued later:
    // it is kept to the second, so the cut is 1.5 s after the last job and the new
    // one comes a second after the cut.
    let last = qd.job(&waiting)["updated_at"].as_i64().expect("updated_at");
    let cut = last + 1500;
    wait_for("the clock to pass the cut", Duration::from_secs(30), || {
        (wall_ms() > cut + 1000).then_some(())
    });
    let late = enqueue_for(&qd, "acme", "four");
    let at = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(cut).expect("positive")),
    )
    .to_string();
    let a = c.get(&format!("/jobs?since={}", enc(&at)), "");
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(job_ids(&a.body), vec![late.clone()], "since {at}");
    // The same instant with an offset.
    let offset = chrono::DateTime::parse_from_rfc3339(&at)
        .expect("rfc3339")
        .with_timezone(&chrono::FixedOffset::east_opt(2 * 3600).expect("offset"))
        .to_rfc3339();
    let a = c.get(&format!("/jobs?since={}", enc(&offset)), "");
    assert_eq!(job_ids(&a.body), vec![late.clone()], "since {offset}");
    // A duration, as `qctl dlq list --since` takes it: everything changed this hour.
    let a = c.get("/jobs?since=1h", "");
    assert_eq!(job_ids(&a.body).len(), 4, "{}", a.body);
    // Both filters at once.
    let a = c.get(&format!("/jobs?since={}&error=disk", enc(&at)), "");
    assert!(job_ids(&a.body).is_empty(), "{}", a.body);
    let a = c.get("/jobs?since=1h&error=disk", "");
    assert_eq!(job_ids(&a.body), vec![disk.clone()]);
}

#[test]
fn bad_job_filters_answer_400_with_the_message_in_the_page() {
    let (qd, c) = start_open("");
    let id = enqueue_for(&qd, "acme", "keep me");
    for (query, status, says) in [
        (
            "since=yesterday",
            400,
            "&quot;yesterday&quot; is neither a duration",
        ),
        ("since=2999-01-01T00:00:00Z", 400, "is in the future"),
        (
            "since=%3Cb%3Esoon%3C%2Fb%3E",
            400,
            "&quot;&lt;b&gt;soon&lt;/b&gt;&quot; is neither",
        ),
        ("state=stuck", 400, "stuck"),
        ("after=not-a-cursor", 400, "not a job id"),
        ("queue=nope", 404, "nope"),
    ] {
        let a = c.get(&format!("/jobs?{query}"), "");
        assert_eq!(a.status, status, "{query}: {}", a.body);
        assert!(a.body.contains("class=\"error\""), "{query}: {}", a.body);
        assert!(a.body.contains(says), "{query}: {}", a.body);
        assert!(!a.body.contains("<b>soon"), "{query}: escaped");
        assert!(
            job_ids(&a.body).is_empty() && !a.body.contains("class=\"jobs\""),
            "{query}: no list under a refused filter: {}",
            a.body
        );
        assert!(
            a.body.contains("<form method=\"get\" action=\"/qd/jobs\""),
            "{query}: the form is there to fix it"
        );
    }
    // The job is untouched and the unfiltered list still shows it.
    assert_eq!(json_of(&qd, &["jobs", "show", &id])["state"], "ready");
    assert_eq!(job_ids(&c.get("/jobs", "").body), vec![id]);
    // `/dlq` reads `since` the same way.
    assert_eq!(c.get("/dlq?since=yesterday", "").status, 400);
    assert_eq!(c.get("/dlq?since=2000-01-01T00:00:00Z", "").status, 200);
}

#[test]
fn job_paging_keeps_every_filter() {
    let (qd, c) = start_open("");
    // 55 dead jobs of tenant bulk with one error, and jobs each filter leaves out:
    // another tenant with the same error, the same tenant with another error, the
    // same tenant and error not dead.
    let other_tenant = enqueue_for(&qd, "other", "x");
    kill_with(&qd, &other_tenant, "bulk failure 1");
    let other_error = enqueue_for(&qd, "bulk", "x");
    kill_with(&qd, &other_error, "something else");
    let lines: String = (0..55)
        .map(|i| format!("{{\"payload\":\"job {i}\",\"tenant\":\"bulk\"}}\n"))
        .collect();
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(file.path(), lines).expect("write");
    let path = file.path().display().to_string();
    let mut bulk: Vec<String> = ok(&qd, &["enqueue", "ext", "--ndjson", &path])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(bulk.len(), 55);
    let mut leased = 0;
    while leased < 55 {
        let (status, body) = qd.post(
            "/v1/queues/ext/leases",
            &json!({"worker_id": "w", "max_jobs": 100, "wait": "5s"}),
        );
        assert_eq!(status, 200, "{body}");
        for job in body["jobs"].as_array().expect("jobs") {
            nack_dead(&qd, job, &format!("bulk failure {leased}"));
            leased += 1;
        }
    }
    let waiting = enqueue_for(&qd, "bulk", "not dead");

    let query = "queue=ext&tenant=bulk&state=dead&error=BULK+failure&since=1h";
    let first = c.get(&format!("/jobs?{query}"), "");
    assert_eq!(first.status, 200, "{}", first.body);
    let page1 = job_ids(&first.body);
    assert_eq!(page1.len(), 50, "{}", first.body);
    let next = next_link(&first.body).expect("a next page");
    assert!(next.starts_with("/qd/jobs?"), "{next}");
    for part in [
        "queue=ext",
        "tenant=bulk",
        "state=dead",
        "error=BULK+failure",
        "since=1h",
        "after=",
    ] {
        assert!(next.contains(part), "{next} lacks {part}");
    }
    let second = c.get(next.trim_start_matches(PREFIX), "");
    assert_eq!(second.status, 200, "{}", second.body);
    let page2 = job_ids(&second.body);
    assert_eq!(page2.len(), 5, "{}", second.body);
    assert!(next_link(&second.body).is_none(), "the last page");
    let mut seen: Vec<String> = page1.into_iter().chain(page2).collect();
    seen.sort();
    bulk.sort();
    assert_eq!(seen, bulk, "the two pages are the 55 bulk jobs, each once");
    for left_out in [&other_tenant, &other_error, &waiting] {
        assert!(!seen.contains(left_out));
    }
}

#[test]
fn a_scheduled_job_shows_its_schedule_and_tick() {
    // A yearly schedule that does not fire during the test; a trigger runs it now.
    let (qd, c) = start_open(
        "\n[schedules.nightly]\nqueue = \"ext\"\ncron = \"0 3 1 1 *\"\npayload = \"report\"\n",
    );
    ok(&qd, &["schedules", "trigger", "nightly"]);
    let listed = json_of(&qd, &["jobs", "list", "--queue", "ext"]);
    let id = listed["jobs"][0]["id"]
        .as_str()
        .expect("the run")
        .to_string();
    let api = qd.job(&id);
    let tick = api["schedule"]["tick"]
        .as_str()
        .expect("a tick")
        .to_string();
    assert_eq!(api["schedule"]["name"], json!("nightly"), "{api}");

    let page = c.get(&format!("/jobs/{id}"), "");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains(&format!(
            "<th>Schedule</th><td class=\"schedule\">nightly, tick <time datetime=\"{tick}\">{tick}</time></td>"
        )),
        "{}",
        page.body
    );
    let plain = enqueue_for(&qd, "acme", "no schedule");
    let page = c.get(&format!("/jobs/{plain}"), "");
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("<th>Schedule</th>"), "{}", page.body);
}

#[test]
fn a_job_page_lists_its_parents_and_dependents_with_links() {
    let (qd, c) = start_open("");
    let a = enqueue(&qd, "a");
    let b = qd.enqueue_json("ext", json!({ "payload": "b", "after": [a] }));
    let page = c.get(&format!("/jobs/{b}"), "");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Runs after (1)"), "{}", page.body);
    let row = format!(
        "<td><a href=\"{PREFIX}/jobs/{a}\"><code>{a}</code></a></td><td class=\"edge\">open</td><td class=\"state\">ready</td>"
    );
    assert!(page.body.contains(&row), "{}", page.body);
    assert!(!page.body.contains("Runs before"), "{}", page.body);

    let page = c.get(&format!("/jobs/{a}"), "");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Runs before (1)"), "{}", page.body);
    let row = format!(
        "<td><a href=\"{PREFIX}/jobs/{b}\"><code>{b}</code></a></td><td class=\"edge\">open</td><td class=\"state\">waiting</td>"
    );
    assert!(page.body.contains(&row), "{}", page.body);
    assert!(!page.body.contains("Runs after"), "{}", page.body);
}
