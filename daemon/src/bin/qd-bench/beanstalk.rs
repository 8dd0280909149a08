//! beanstalkd as a [`Target`]: its text protocol on keep-alive TCP connections,
//! request/reply (one command in flight per connection), the same client shape as
//! qd's single mode.
//!
//! `put <pri> <delay> <ttr> <bytes>` → `INSERTED <id>`; `reserve-with-timeout <s>`
//! → `RESERVED <id> <bytes>` + body, or `TIMED_OUT`; `delete <id>` → `DELETED`.
//! Everything uses the `default` tube of a server started for this run.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::latency;
use crate::load::{Conn, Taken, Target};

/// Time-to-run given with every put: far longer than any phase, so no job is
/// handed out twice.
const TTR_SECS: u32 = 600;

/// A running beanstalkd.
pub struct BeanstalkTarget {
    /// Its loopback address.
    pub addr: SocketAddr,
}

/// One connection.
pub struct BeanstalkConn {
    stream: BufReader<TcpStream>,
    line: String,
}

impl Target for BeanstalkTarget {
    type Conn = BeanstalkConn;

    async fn connect(&self) -> Result<BeanstalkConn> {
        let stream = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connect to beanstalkd at {}", self.addr))?;
        stream.set_nodelay(true)?;
        Ok(BeanstalkConn {
            stream: BufReader::new(stream),
            line: String::new(),
        })
    }
}

impl BeanstalkConn {
    /// Sends `command` and reads the reply's first line (without CRLF).
    async fn call(&mut self, command: &[u8]) -> Result<&str> {
        self.stream.get_mut().write_all(command).await?;
        self.line.clear();
        if self.stream.read_line(&mut self.line).await? == 0 {
            bail!("beanstalkd closed the connection");
        }
        Ok(self.line.trim_end())
    }
}

impl Conn for BeanstalkConn {
    async fn put(&mut self, payloads: Vec<Vec<u8>>) -> Result<u64> {
        for p in &payloads {
            let mut command = format!("put 0 0 {TTR_SECS} {}\r\n", p.len()).into_bytes();
            command.extend_from_slice(p);
            command.extend_from_slice(b"\r\n");
            let reply = self.call(&command).await?;
            if !reply.starts_with("INSERTED ") {
                bail!("put answered {reply:?}");
            }
        }
        Ok(payloads.len() as u64)
    }

    async fn take(&mut self, _max: usize, wait: Duration) -> Result<Vec<Taken>> {
        let command = format!("reserve-with-timeout {}\r\n", wait.as_secs());
        let reply = self.call(command.as_bytes()).await?;
        if reply == "TIMED_OUT" || reply == "DEADLINE_SOON" {
            return Ok(Vec::new());
        }
        let mut words = reply.split(' ');
        let (Some("RESERVED"), Some(id), Some(len)) = (words.next(), words.next(), words.next())
        else {
            bail!("reserve answered {reply:?}");
        };
        let id = id.to_string();
        let len: usize = len.parse().with_context(|| format!("reserve: {reply:?}"))?;
        let mut body = vec![0; len + 2];
        self.stream.read_exact(&mut body).await?;
        Ok(vec![Taken {
            id,
            token: 0,
            stamp_us: latency::read_stamp(&body),
        }])
    }

    async fn finish(&mut self, jobs: &[Taken]) -> Result<u64> {
        for j in jobs {
            let reply = self.call(format!("delete {}\r\n", j.id).as_bytes()).await?;
            if reply != "DELETED" {
                bail!("delete {} answered {reply:?}", j.id);
            }
        }
        Ok(jobs.len() as u64)
    }
}
