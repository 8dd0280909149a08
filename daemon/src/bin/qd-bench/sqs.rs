//! qd's SQS API as a [`Target`], and the `sqs` mode that sets it beside qd's
//! native batch API on the same qd.
//!
//! A connection speaks the AWS JSON 1.0 protocol (`POST /`, `X-Amz-Target:
//! AmazonSQS.<Action>`) as current SDKs do: SendMessageBatch of up to 10
//! messages, ReceiveMessage with `MaxNumberOfMessages` up to 10 (`WaitTimeSeconds`
//! as the long poll), DeleteMessageBatch of what it received. Every request is
//! signed with AWS Signature Version 4 by the access key of the token file the
//! mode gives qd, so the server verifies each signature as it would an SDK's.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::latency;
use crate::load::{Conn, Plan, Taken, Target};
use crate::modes::{BATCH, Settings, phases};
use crate::qd_http::{Api, QdTarget, keep_alive_client};
use crate::report::{Report, SQS_APIS};
use crate::scratch::Scratch;
use crate::servers::{self, EXTERNAL_QUEUE, QdSetup};

/// SQS's largest batch (SendMessageBatch, ReceiveMessage, DeleteMessageBatch).
pub const SQS_BATCH: usize = 10;

/// The region the requests are signed for (qd takes any).
const REGION: &str = "us-east-1";
/// qd's default `[sqs] account_id`: the queue URL's account.
const ACCOUNT: &str = "000000000000";

/// The credentials of the mode's token file.
const BEARER: &str = "qd-bench-bearer-token-0123456789";
const ACCESS_KEY: &str = "AKIDQDBENCH0000001";
const SECRET_KEY: &str = "qd-bench-secret-access-key-0123456789";

/// The token file of the qd under test: one token for every queue and role,
/// with AWS credentials.
fn tokens_file() -> String {
    format!(
        "[[tokens]]\nname = \"bench\"\ntoken = \"{BEARER}\"\nroles = [\"produce\", \"work\", \"read\"]\n\
         queues = [\"*\"]\naccess_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET_KEY}\"\n"
    )
}

/// An external queue of a running qd, through its SQS API.
pub struct SqsTarget {
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The queue's name.
    pub queue: String,
    /// The access key and secret the requests are signed with.
    pub key: (String, String),
}

/// One keep-alive connection to qd's SQS API.
pub struct SqsConn {
    client: Client<HttpConnector, Full<Bytes>>,
    host: String,
    uri: String,
    queue_url: String,
    key: (String, String),
}

impl Target for SqsTarget {
    type Conn = SqsConn;

    async fn connect(&self) -> Result<SqsConn> {
        let client = keep_alive_client();
        Ok(SqsConn {
            client,
            uri: format!("http://{}/", self.host),
            queue_url: format!("http://{}/{ACCOUNT}/{}", self.host, self.queue),
            host: self.host.clone(),
            key: self.key.clone(),
        })
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .expect("invariant: HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The `Authorization` header of a SigV4-signed `POST /` to the SQS service, with
/// the signed headers `content-type`, `host`, `x-amz-date` and `x-amz-target`.
pub fn authorization(
    (key, secret): (&str, &str),
    host: &str,
    target: &str,
    amz_date: &str,
    body: &[u8],
) -> String {
    let date = &amz_date[..8.min(amz_date.len())];
    let signed = "content-type;host;x-amz-date;x-amz-target";
    let canonical = format!(
        "POST\n/\n\ncontent-type:application/x-amz-json-1.0\nhost:{host}\nx-amz-date:{amz_date}\nx-amz-target:{target}\n\n{signed}\n{}",
        hex::encode(Sha256::digest(body))
    );
    let scope = format!("{date}/{REGION}/sqs/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut signing = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    for part in [REGION, "sqs", "aws4_request"] {
        signing = hmac(&signing, part.as_bytes());
    }
    let signature = hex::encode(hmac(&signing, to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BatchAnswer {
    #[serde(default)]
    successful: Vec<serde_json::Value>,
    #[serde(default)]
    failed: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ReceiveAnswer {
    #[serde(default)]
    messages: Vec<Message>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Message {
    receipt_handle: String,
    body: String,
}

impl SqsConn {
    /// One signed action; its answer's bytes, or the SQS error it got.
    async fn call(&self, action: &str, body: serde_json::Value) -> Result<Bytes> {
        let body = serde_json::to_vec(&body)?;
        let target = format!("AmazonSQS.{action}");
        let amz_date = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        let auth = authorization(
            (&self.key.0, &self.key.1),
            &self.host,
            &target,
            &amz_date,
            &body,
        );
        let req = Request::builder()
            .method(Method::POST)
            .uri(&self.uri)
            .header("host", &self.host)
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-date", &amz_date)
            .header("x-amz-target", &target)
            .header("authorization", auth)
            .body(Full::new(Bytes::from(body)))?;
        let resp = self
            .client
            .request(req)
            .await
            .with_context(|| format!("SQS {action}"))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        if status != StatusCode::OK {
            bail!(
                "SQS {action} answered {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            );
        }
        Ok(bytes)
    }

    /// A batch action's successes; its first failure is an error.
    async fn batch(&self, action: &str, entries: Vec<serde_json::Value>) -> Result<u64> {
        let n = entries.len();
        let bytes = self
            .call(
                action,
                json!({ "QueueUrl": self.queue_url, "Entries": entries }),
            )
            .await?;
        let answer: BatchAnswer =
            serde_json::from_slice(&bytes).with_context(|| format!("{action} answer"))?;
        if let Some(failed) = answer.failed.first() {
            bail!(
                "{action}: {} of {n} entries failed: {failed}",
                answer.failed.len()
            );
        }
        Ok(answer.successful.len() as u64)
    }
}

impl Conn for SqsConn {
    async fn put(&mut self, payloads: Vec<Vec<u8>>) -> Result<u64> {
        let mut sent = 0;
        for chunk in payloads.chunks(SQS_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, p)| json!({ "Id": i.to_string(), "MessageBody": String::from_utf8_lossy(p) }))
                .collect();
            sent += self.batch("SendMessageBatch", entries).await?;
        }
        Ok(sent)
    }

    async fn take(&mut self, max: usize, wait: Duration) -> Result<Vec<Taken>> {
        let body = json!({
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": max.clamp(1, SQS_BATCH),
            "WaitTimeSeconds": wait.as_secs().min(20),
        });
        let bytes = self.call("ReceiveMessage", body).await?;
        let answer: ReceiveAnswer =
            serde_json::from_slice(&bytes).context("ReceiveMessage answer")?;
        Ok(answer
            .messages
            .into_iter()
            .map(|m| Taken {
                stamp_us: latency::read_stamp(m.body.as_bytes()),
                id: m.receipt_handle,
                token: 0,
            })
            .collect())
    }

    async fn finish(&mut self, jobs: &[Taken]) -> Result<u64> {
        let mut deleted = 0;
        for chunk in jobs.chunks(SQS_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, j)| json!({ "Id": i.to_string(), "ReceiptHandle": j.id }))
                .collect();
            deleted += self.batch("DeleteMessageBatch", entries).await?;
        }
        Ok(deleted)
    }
}

/// The `sqs` mode: one qd with a token file and the SQS API on; first its native
/// batch API (enqueues and leases of [`BATCH`], one ack request per lease, with
/// the bearer token), then its SQS API (batches of [`SQS_BATCH`], signed), each
/// through the same phases, for the "SQS ≥ 0.5× native batch" target.
pub async fn sqs(s: &Settings, report: &mut Report) -> Result<()> {
    let scripts = Scratch::new("scripts")?;
    let script = scripts.script("noop.sh", "cat >/dev/null")?;
    let tokens = tokens_file();
    let qd = servers::start_qd(&QdSetup {
        binary: &s.qd,
        workers: s.workers,
        script: &script,
        retention: "1m",
        node: None,
        sqs_tokens: Some(&tokens),
    })
    .await?;
    let native = Arc::new(QdTarget {
        base: format!("http://{}", qd.addr),
        queue: EXTERNAL_QUEUE.to_string(),
        api: Api::Batch,
        bearer: Some(BEARER.to_string()),
    });
    let plan = |batch| Plan {
        batch,
        rate: 0.0,
        ..s.plan.clone()
    };
    let outcome = async {
        phases(
            "sqs",
            SQS_APIS[0],
            native,
            &|| qd.cpu_secs(),
            &plan(BATCH),
            report,
        )
        .await
        .context("the native batch API")?;
        let target = Arc::new(SqsTarget {
            host: qd.addr.to_string(),
            queue: EXTERNAL_QUEUE.to_string(),
            key: (ACCESS_KEY.to_string(), SECRET_KEY.to_string()),
        });
        phases(
            "sqs",
            SQS_APIS[1],
            target,
            &|| qd.cpu_secs(),
            &plan(SQS_BATCH),
            report,
        )
        .await
        .context("the SQS API (SendMessageBatch, ReceiveMessage, DeleteMessageBatch)")
    }
    .await;
    qd.stop().await;
    outcome?;
    report.notes.push(format!(
        "sqs: one qd with a token file; its batch API (batches of {BATCH}, bearer token) then its \
         SQS API (SendMessageBatch of {SQS_BATCH}, ReceiveMessage of {SQS_BATCH}, DeleteMessageBatch, \
         AWS JSON 1.0 signed with SigV4)"
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signing key of AWS's SigV4 documentation example, derived as
    /// `authorization` derives it (there for the `iam` service).
    #[test]
    fn the_signing_key_matches_the_aws_documentation_example() {
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        let mut key = hmac(format!("AWS4{secret}").as_bytes(), b"20150830");
        for part in ["us-east-1", "iam", "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        assert_eq!(
            hex::encode(&key),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
    }

    #[test]
    fn the_authorization_names_its_scope_and_changes_with_the_body() {
        let key = ("AKIDEXAMPLE00000", "secret-secret-secret");
        let a = authorization(
            key,
            "127.0.0.1:1",
            "AmazonSQS.SendMessage",
            "20261203T101010Z",
            b"{}",
        );
        let b = authorization(
            key,
            "127.0.0.1:1",
            "AmazonSQS.SendMessage",
            "20261203T101010Z",
            b"{ }",
        );
        assert!(
            a.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE00000/20261203/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature="),
            "{a}"
        );
        assert_ne!(a, b);
    }
}
