//! The web console behind nginx with `path_prefix = "/qd"`: every link on every
//! page resolves through the proxy, and the event stream keeps flowing (two
//! `overview` events arrive through it). nginx runs in the foreground from the
//! test's temp dir; without nginx the test fails under `CI=true` and skips visibly.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Qd, have, tool_missing, wait_for};

const TOKEN: &str = "proxy-secret-0123456789";

struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn send(addr: &str, method: &str, path: &str, cookie: &str, body: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    if !cookie.is_empty() {
        req.push_str(&format!("cookie: {cookie}\r\n"));
    }
    if method == "POST" {
        req.push_str(
            "sec-fetch-site: same-origin\r\ncontent-type: application/x-www-form-urlencoded\r\n",
        );
    }
    req.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).expect("write");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, head.to_string(), body.to_string())
}

fn links(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["href=\"", "src=\"", "data-stream=\"", "data-poll=\""] {
        for part in html.split(attr).skip(1) {
            out.push(part.split('"').next().unwrap_or("").replace("&amp;", "&"));
        }
    }
    out
}

#[test]
fn behind_nginx_every_link_resolves_and_the_event_stream_flows() {
    let nginx_bin = ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists() || have(p));
    let Some(nginx_bin) = nginx_bin else {
        tool_missing("nginx", "apt-get install nginx");
        return;
    };
    let [console_port, proxy_port] = common::free_ports();
    let mut qd = Qd::configure_with_tokens(
        &format!(
            "[[tokens]]\nname = \"ops\"\ntoken = \"{TOKEN}\"\nroles = [\"read\", \"admin\"]\nqueues = [\"*\"]\n"
        ),
        &format!(
            "[console]\nlisten = \"127.0.0.1:{console_port}\"\npath_prefix = \"/qd\"\nallowed_hosts = [\"127.0.0.1:{proxy_port}\"]\n\n\
             [queues.ext]\nexecutor = {{ kind = \"external\" }}\n"
        ),
    );
    qd.spawn(&[]);
    let console = qd.console_addr().expect("console listen");
    let ngx = qd.dir.path().join("nginx");
    std::fs::create_dir_all(ngx.join("logs")).expect("nginx dir");
    let conf = ngx.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/logs/error.log;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
               fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n\
               server {{\n    listen 127.0.0.1:{proxy_port};\n\
                 location /qd/ {{\n      proxy_pass http://{console};\n      proxy_set_header Host $http_host;\n\
                   proxy_http_version 1.1;\n      proxy_buffering off;\n      proxy_read_timeout 1h;\n    }}\n  }}\n}}\n",
            p = ngx.display()
        ),
    )
    .expect("nginx.conf");
    let child = Command::new(nginx_bin)
        .arg("-p")
        .arg(&ngx)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    let _nginx = Nginx(child);
    let proxy = format!("127.0.0.1:{proxy_port}");
    wait_for("nginx", Duration::from_secs(30), || {
        TcpStream::connect(&proxy).ok()
    });

    let (status, head, _) = send(&proxy, "POST", "/qd/login", "", &format!("token={TOKEN}"));
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .expect("cookie")
        .to_string();
    common::ok(&qd, &["enqueue", "ext", "--payload", "through the proxy"]);
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec!["/qd/".to_string()];
    while let Some(path) = todo.pop() {
        if !seen.insert(path.clone()) || path.ends_with("/live/events") || seen.len() > 200 {
            continue;
        }
        let (status, head, body) = send(&proxy, "GET", &path, &cookie, "");
        assert_eq!(status, 200, "{path} through nginx: {head}");
        if head.contains("text/html") {
            for link in links(&body) {
                assert!(link.starts_with("/qd/"), "{path}: {link:?}");
                todo.push(link);
            }
        }
    }
    assert!(
        seen.iter().any(|p| p.starts_with("/qd/jobs/")),
        "crawled a job page: {seen:?}"
    );

    let mut stream = TcpStream::connect(&proxy).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET /qd/live/events HTTP/1.1\r\nhost: {proxy}\r\ncookie: {cookie}\r\n\r\n"
    )
    .expect("write");
    let mut got = String::new();
    let mut buf = [0u8; 8192];
    while got.matches("event: overview").count() < 2 {
        let n = stream
            .read(&mut buf)
            .expect("the stream flows through nginx");
        assert!(n > 0, "stream closed: {got}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}
