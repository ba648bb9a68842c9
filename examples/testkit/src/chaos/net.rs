//! HTTP/1.1 calls on a fresh connection each, so a failure says exactly where it happened: the
//! connection refused (nothing accepted the call), or established and then broken before the
//! answer's head (the call was taken and lost), or no answer by the deadline.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

/// Milliseconds since the epoch: the one clock of the run (the agents' logs use it too).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Nothing listened: the call was never accepted.
    Refused,
    /// Another connect error (a SYN dropped, a timeout while connecting).
    Connect(String),
    /// Connected and sent, then the connection broke before the answer's head.
    Broken(String),
    /// The head came, then the body broke off.
    BodyBroken(String),
    /// No complete answer by the deadline.
    Timeout,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused => f.write_str("connection refused"),
            Failure::Connect(e) => write!(f, "connect: {e}"),
            Failure::Broken(e) => write!(f, "broken before the answer: {e}"),
            Failure::BodyBroken(e) => write!(f, "body broke off: {e}"),
            Failure::Timeout => f.write_str("no answer by the deadline"),
        }
    }
}

/// A whole answer.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The sidecar's `reach-reason`, else the JSON `error`, else empty.
    pub fn reason(&self) -> String {
        let reason = self.header("reach-reason");
        if !reason.is_empty() {
            return reason.to_owned();
        }
        self.json()["error"].as_str().unwrap_or("").to_owned()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a new connection and returns the answer's head with its body still
/// streaming. The connection task lives as long as the body is read.
pub async fn open(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Response<Incoming>, Failure> {
    let stream = match tokio::net::TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(Failure::Refused)
        }
        Err(e) => return Err(Failure::Connect(e.to_string())),
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| Failure::Broken(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let request = builder
        .body(Full::new(body))
        .map_err(|e| Failure::Connect(format!("bad request: {e}")))?;
    sender
        .send_request(request)
        .await
        .map_err(|e| Failure::Broken(error_chain(&e)))
}

/// One whole call within `deadline`.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
    deadline: Duration,
) -> Result<Answer, Failure> {
    let body = body.into();
    let whole = async {
        let response = open(addr, method, path, headers, body).await?;
        let (parts, incoming) = response.into_parts();
        let bytes = incoming
            .collect()
            .await
            .map_err(|e| Failure::BodyBroken(error_chain(&e)))?
            .to_bytes();
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: bytes,
        })
    };
    tokio::time::timeout(deadline, whole)
        .await
        .unwrap_or(Err(Failure::Timeout))
}

/// `GET path` on `addr`: the answer's status and JSON body.
pub async fn get_json(addr: SocketAddr, path: &str) -> Result<(u16, serde_json::Value), Failure> {
    let answer = call(
        addr,
        "GET",
        path,
        &[],
        Bytes::new(),
        Duration::from_secs(10),
    )
    .await?;
    Ok((answer.status, answer.json()))
}

/// An error with its sources, on one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
