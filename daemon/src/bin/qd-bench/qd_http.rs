//! qd as a [`Target`]: its HTTP API over hyper's keep-alive HTTP/1.1 client, one
//! client (one connection) per producer or consumer.
//!
//! Single mode: `POST /v1/queues/{q}/jobs` per job, `POST /v1/queues/{q}/leases`
//! with `max_jobs`, `POST /v1/jobs/{id}/ack` per job. Batch mode:
//! `POST /v1/queues/{q}/jobs/batch` `{"jobs": [...]}` → `202 {"jobs": [{"id",
//! "duplicate"}]}`, and `POST /v1/acks` `{"acks": [{"id", "token"}]}` → `200
//! {"results": [{"id", "ok"}]}` (shapes in `daemon/docs/http-api.md`).

use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::json;

use crate::latency;
use crate::load::{Conn, Taken, Target};

/// How a qd connection enqueues and acks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// One job per enqueue request, one ack request per job.
    Single,
    /// The batch endpoints: one request per batch of enqueues, one per leased batch of acks.
    Batch,
}

/// An `external` queue of a running qd.
pub struct QdTarget {
    /// Base URL, `http://127.0.0.1:PORT`.
    pub base: String,
    /// The queue's name.
    pub queue: String,
    /// Which endpoints to use.
    pub api: Api,
    /// The bearer token, when qd has an `api_tokens_file`.
    pub bearer: Option<String>,
}

/// One keep-alive connection to qd.
pub struct QdConn {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    enqueue_uri: String,
    lease_uri: String,
    worker: String,
    api: Api,
    /// `Bearer TOKEN`, when qd wants one.
    authorization: Option<String>,
}

impl Target for QdTarget {
    type Conn = QdConn;

    async fn connect(&self) -> Result<QdConn> {
        let client = keep_alive_client();
        let jobs_path = match self.api {
            Api::Single => "jobs",
            Api::Batch => "jobs/batch",
        };
        Ok(QdConn {
            client,
            enqueue_uri: format!("{}/v1/queues/{}/{jobs_path}", self.base, self.queue),
            lease_uri: format!("{}/v1/queues/{}/leases", self.base, self.queue),
            base: self.base.clone(),
            worker: format!("qd-bench-{}", uuid::Uuid::now_v7()),
            api: self.api,
            authorization: self.bearer.as_ref().map(|t| format!("Bearer {t}")),
        })
    }
}

#[derive(Deserialize)]
struct Lease {
    jobs: Vec<LeasedJob>,
}

#[derive(Deserialize)]
struct LeasedJob {
    id: String,
    token: u64,
    payload: Option<String>,
}

#[derive(Deserialize)]
struct BatchAnswer {
    jobs: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct AcksAnswer {
    results: Vec<AckResult>,
}

#[derive(Deserialize)]
struct AckResult {
    ok: bool,
}

impl QdConn {
    /// POSTs `body` to `uri`; the status and the answer's bytes.
    async fn post(&self, uri: &str, body: Vec<u8>) -> Result<(StatusCode, Bytes)> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("content-type", "application/json");
        if let Some(auth) = &self.authorization {
            req = req.header("authorization", auth);
        }
        let req = req.body(Full::new(Bytes::from(body)))?;
        let resp = self
            .client
            .request(req)
            .await
            .with_context(|| format!("POST {uri}"))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok((status, bytes))
    }

    /// POSTs and insists on `want`; the answer's bytes.
    async fn expect(&self, uri: &str, body: Vec<u8>, want: StatusCode) -> Result<Bytes> {
        let (status, bytes) = self.post(uri, body).await?;
        if status != want {
            bail!(
                "POST {uri} answered {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            );
        }
        Ok(bytes)
    }
}

/// The enqueue body of one job. The payload is ASCII without quotes or
/// backslashes ([`latency::stamped_payload`]), so it is written as is.
/// One HTTP/1.1 keep-alive connection per client (`TCP_NODELAY`, 5 s connect
/// timeout): what every load target of qd's HTTP APIs connects with.
pub fn keep_alive_client() -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build(connector)
}

fn job_json(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(b"{\"payload\":\"");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\"}");
}

impl Conn for QdConn {
    async fn put(&mut self, payloads: Vec<Vec<u8>>) -> Result<u64> {
        match self.api {
            Api::Single => {
                for p in &payloads {
                    let mut body = Vec::with_capacity(p.len() + 16);
                    job_json(&mut body, p);
                    self.expect(&self.enqueue_uri, body, StatusCode::ACCEPTED)
                        .await?;
                }
                Ok(payloads.len() as u64)
            }
            Api::Batch => {
                let size = payloads.iter().map(|p| p.len() + 16).sum::<usize>();
                let mut body = Vec::with_capacity(size + 16);
                body.extend_from_slice(b"{\"jobs\":[");
                for (i, p) in payloads.iter().enumerate() {
                    if i > 0 {
                        body.push(b',');
                    }
                    job_json(&mut body, p);
                }
                body.extend_from_slice(b"]}");
                let bytes = self
                    .expect(&self.enqueue_uri, body, StatusCode::ACCEPTED)
                    .await?;
                let answer: BatchAnswer =
                    serde_json::from_slice(&bytes).context("batch enqueue answer")?;
                if answer.jobs.len() != payloads.len() {
                    bail!(
                        "batch of {} answered {} ids",
                        payloads.len(),
                        answer.jobs.len()
                    );
                }
                Ok(payloads.len() as u64)
            }
        }
    }

    async fn take(&mut self, max: usize, wait: Duration) -> Result<Vec<Taken>> {
        let body = json!({
            "worker_id": self.worker,
            "max_jobs": max,
            "wait": wait.as_secs_f64(),
        });
        let bytes = self
            .expect(&self.lease_uri, serde_json::to_vec(&body)?, StatusCode::OK)
            .await?;
        let lease: Lease = serde_json::from_slice(&bytes).context("lease answer")?;
        Ok(lease
            .jobs
            .into_iter()
            .map(|j| Taken {
                stamp_us: j
                    .payload
                    .as_deref()
                    .and_then(|p| latency::read_stamp(p.as_bytes())),
                id: j.id,
                token: j.token,
            })
            .collect())
    }

    async fn finish(&mut self, jobs: &[Taken]) -> Result<u64> {
        match self.api {
            Api::Single => {
                for j in jobs {
                    let uri = format!("{}/v1/jobs/{}/ack", self.base, j.id);
                    let body = format!("{{\"token\":{}}}", j.token).into_bytes();
                    self.expect(&uri, body, StatusCode::OK).await?;
                }
                Ok(jobs.len() as u64)
            }
            Api::Batch => {
                let acks: Vec<_> = jobs
                    .iter()
                    .map(|j| json!({"id": j.id, "token": j.token}))
                    .collect();
                let uri = format!("{}/v1/acks", self.base);
                let body = serde_json::to_vec(&json!({ "acks": acks }))?;
                let bytes = self.expect(&uri, body, StatusCode::OK).await?;
                let answer: AcksAnswer = serde_json::from_slice(&bytes).context("acks answer")?;
                Ok(answer.results.iter().filter(|r| r.ok).count() as u64)
            }
        }
    }
}
