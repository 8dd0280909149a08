//! Helpers for `tests/http.rs`: a loopback webhook downstream that records what it
//! was sent and when, an HTTP client that sends bearer tokens and keeps response
//! headers, and a runner for a `qd` that is expected to refuse to start.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::{Qd, qd_bin, wait_for};

/// One request the downstream received.
#[derive(Clone)]
pub struct Hit {
    pub at: Instant,
    pub body: String,
    pub headers: Vec<(String, String)>,
}

impl Hit {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How the downstream answers a body on its `nth` (0-based) delivery; `None` hangs.
pub type Respond = fn(&str, usize) -> Option<String>;

pub struct Downstream {
    pub url: String,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Downstream {
    pub fn start(respond: Respond) -> Downstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind downstream");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let hits = Arc::new(Mutex::new(Vec::new()));
        let shared = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let hits = shared.clone();
                std::thread::spawn(move || serve(stream, &hits, respond));
            }
        });
        Downstream { url, hits }
    }

    /// Every delivery of `body`, in arrival order.
    pub fn hits_of(&self, body: &str) -> Vec<Hit> {
        let hits = self.hits.lock().expect("hits");
        hits.iter().filter(|h| h.body == body).cloned().collect()
    }
}

fn serve(stream: TcpStream, hits: &Mutex<Vec<Hit>>, respond: Respond) {
    let mut reader = BufReader::new(stream);
    let mut headers = Vec::new();
    let mut line = String::new();
    let _ = reader.read_line(&mut line); // request line
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((n, v)) = line.trim_end().split_once(':') {
            headers.push((n.trim().to_string(), v.trim().to_string()));
        }
    }
    let len = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    let _ = reader.read_exact(&mut body);
    let body = String::from_utf8_lossy(&body).into_owned();
    let nth = {
        let mut hits = hits.lock().expect("hits");
        let nth = hits.iter().filter(|h| h.body == body).count();
        hits.push(Hit {
            at: Instant::now(),
            body: body.clone(),
            headers,
        });
        nth
    };
    match respond(&body, nth) {
        Some(response) => {
            let _ = reader.get_mut().write_all(response.as_bytes());
        }
        None => std::thread::sleep(Duration::from_secs(60)),
    }
}

pub fn response(status: &str, extra: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
        body.len()
    )
}

/// An HTTP client that can send a bearer token and keeps the response headers.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    token: Option<String>,
}

pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub challenge: Option<String>,
}

impl Client {
    pub fn new(qd: &Qd, token: Option<&str>) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Client {
            base: qd.api.clone(),
            agent,
            token: token.map(str::to_string),
        }
    }

    pub fn post(&self, path: &str, body: Value) -> Resp {
        let mut req = self.agent.post(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        Self::read(req.send_json(body).expect("POST"))
    }

    pub fn get(&self, path: &str) -> Resp {
        let mut req = self.agent.get(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        Self::read(req.call().expect("GET"))
    }

    fn read(mut resp: ureq::http::Response<ureq::Body>) -> Resp {
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        Resp {
            status: resp.status().as_u16(),
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
            challenge,
        }
    }

    pub fn lease(&self, queue: &str, worker: &str, max_jobs: u32, wait: &str) -> Vec<Value> {
        let r = self.post(
            &format!("/v1/queues/{queue}/leases"),
            json!({"worker_id": worker, "max_jobs": max_jobs, "wait": wait}),
        );
        assert_eq!(r.status, 200, "lease: {}", r.body);
        r.body["jobs"].as_array().expect("jobs").clone()
    }

    pub fn report(&self, job: &Value, what: &str, body: Value) -> Resp {
        let id = job["id"].as_str().expect("id");
        self.post(&format!("/v1/jobs/{id}/{what}"), body)
    }
}

/// Runs `qd run --config <config>` expecting it to exit within 20 s.
pub fn run_to_exit(config: &Path) -> Output {
    let child: Child = Command::new(qd_bin())
        .args(["run", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qd");
    let child = Arc::new(Mutex::new(Some(child)));
    wait_for("qd to refuse to start", Duration::from_secs(20), || {
        let mut guard = child.lock().expect("child");
        let exited = guard.as_mut().and_then(|c| c.try_wait().ok().flatten());
        exited.map(|_| {
            guard
                .take()
                .expect("child")
                .wait_with_output()
                .expect("output")
        })
    })
}
