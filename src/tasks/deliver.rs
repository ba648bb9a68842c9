//! POSTs that must arrive: a task's escalation to the webhook a person's tooling listens on, and
//! its final result to the caller's callback. A POST is accepted by a 2xx; anything else is
//! tried again later with backoff (the runner requeues the task), so a receiver sees each
//! delivery at least once and should deduplicate by `reach-task-id` + `reach-delivery`.
//! Callbacks go through their own client, whose connector screens every address it dials
//! (`callback::Guarded`); the operator's webhook does not need that.
//!
//! When a key is set, each POST is signed: `reach-signature: t=<unix seconds>,sha256=<hex>`, the
//! HMAC-SHA256 of `<t>.<body>` (the timestamp inside the MAC, so a captured POST cannot be
//! replayed later under a fresh time).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::callback::{self, Guarded, Refused};
use crate::config::Listen;

/// The task a POST is about.
pub(crate) const TASK_ID: http::HeaderName = http::HeaderName::from_static("reach-task-id");
/// How many times this POST has been tried, the first being 1.
pub(crate) const DELIVERY: http::HeaderName = http::HeaderName::from_static("reach-delivery");
pub const SIGNATURE: http::HeaderName = http::HeaderName::from_static("reach-signature");

/// One POST may take this long.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The first retry waits this long, doubling to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// An HTTP(S) client for webhooks and callbacks (public CAs: Mozilla's roots, built in, so the
/// image needs no CA bundle).
#[derive(Clone, Debug)]
pub(crate) struct Poster {
    webhook: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    callback: Client<HttpsConnector<Guarded>, Full<Bytes>>,
}

/// Why a callback POST did not land.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PostError {
    /// The destination is one a callback may never reach: given up at once.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// Anything else: tried again later.
    #[error("{0}")]
    Failed(String),
}

impl Poster {
    /// `listen`: this sidecar's listeners, which a callback may not reach.
    pub(crate) fn new(listen: &Listen) -> Result<Self, String> {
        let builder = || {
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_webpki_roots(provider)
                .map_err(|e| e.to_string())
                .map(|b| b.https_or_http().enable_http1())
        };
        let webhook = Client::builder(TokioExecutor::new()).build(builder()?.build());
        let guarded = builder()?.wrap_connector(Guarded::new(listen.clone()));
        let callback = Client::builder(TokioExecutor::new()).build(guarded);
        Ok(Self { webhook, callback })
    }

    /// POSTs `body` as JSON to the escalation webhook; `Ok` when the receiver accepted it (2xx).
    pub(crate) async fn post(
        &self,
        url: &str,
        task_id: &str,
        delivery: u32,
        body: Vec<u8>,
        key: Option<&[u8]>,
    ) -> Result<(), String> {
        send(&self.webhook, url, task_id, delivery, body, key)
            .await
            .map_err(|e| e.to_string())
    }

    /// POSTs `body` as JSON to a task's callback, through the screening connector.
    pub(crate) async fn post_callback(
        &self,
        url: &str,
        task_id: &str,
        delivery: u32,
        body: Vec<u8>,
    ) -> Result<(), PostError> {
        send(&self.callback, url, task_id, delivery, body, None).await
    }
}

async fn send<C>(
    client: &Client<C, Full<Bytes>>,
    url: &str,
    task_id: &str,
    delivery: u32,
    body: Vec<u8>,
    key: Option<&[u8]>,
) -> Result<(), PostError>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::USER_AGENT, "agent-reach")
        .header(TASK_ID, task_id)
        .header(DELIVERY, delivery.to_string());
    if let Some(key) = key {
        request = request.header(SIGNATURE, sign(key, now_secs(), &body));
    }
    // The URL is not echoed: it may hold a password.
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| PostError::Failed(format!("bad URL: {e}")))?;
    let sent = tokio::time::timeout(TIMEOUT, client.request(request)).await;
    let response = match sent {
        Err(_) => {
            return Err(PostError::Failed(format!(
                "no answer within {}s",
                TIMEOUT.as_secs()
            )))
        }
        Ok(Err(err)) => {
            if let Some(refused) = callback::refusal(&err) {
                return Err(PostError::Refused(refused));
            }
            let chain = crate::http::client::chain(&err);
            return Err(PostError::Failed(format!("{err}: {chain}")));
        }
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    // Read (a little of) the answer so the connection can be reused.
    let _ = tokio::time::timeout(TIMEOUT, response.into_body().collect()).await;
    if status.is_success() {
        Ok(())
    } else {
        Err(PostError::Failed(format!("answered {}", status.as_u16())))
    }
}

/// The pause before try `tries + 1`: doubling from a second to five minutes, with jitter.
pub(crate) fn backoff(tries: u32) -> Duration {
    let base = FIRST_BACKOFF
        .saturating_mul(1 << tries.min(16))
        .min(MAX_BACKOFF);
    base.mul_f64(0.5 + rand::random::<f64>() / 2.0)
}

/// `t=<t>,sha256=<hex of HMAC-SHA256(key, "<t>.<body>")>`.
pub(crate) fn sign(key: &[u8], t: u64, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(t.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},sha256={hex}")
}

/// Whether `header` is a valid signature of `body` under `key` (for receivers and tests).
pub fn verify(key: &[u8], header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut mac = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = v.parse::<u64>().ok(),
            Some(("sha256", v)) => mac = Some(v.to_owned()),
            _ => {}
        }
    }
    match (t, mac) {
        (Some(t), Some(mac)) => {
            let expected = sign(key, t, body);
            let given = format!("t={t},sha256={mac}");
            // Compared in constant time: a receiver must not leak how much of a guess matched.
            expected.len() == given.len()
                && expected
                    .bytes()
                    .zip(given.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        }
        _ => false,
    }
}

fn now_secs() -> u64 {
    super::model::now_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_with_its_key_and_body() {
        let header = sign(b"k", 1_700_000_000, b"{\"a\":1}");
        assert!(header.starts_with("t=1700000000,sha256="));
        assert!(verify(b"k", &header, b"{\"a\":1}"));
        assert!(!verify(b"other", &header, b"{\"a\":1}"));
        assert!(!verify(b"k", &header, b"{\"a\":2}"));
        let moved = header.replace("t=1700000000", "t=1700000001");
        assert!(!verify(b"k", &moved, b"{\"a\":1}"), "the time is signed");
    }

    #[test]
    fn backoff_doubles_to_a_ceiling() {
        assert!(backoff(0) <= Duration::from_secs(1));
        assert!(backoff(3) >= Duration::from_secs(4));
        assert!(backoff(30) <= MAX_BACKOFF);
    }
}
