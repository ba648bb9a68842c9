//! A mock model provider: an OpenAI-compatible `POST /v1/chat/completions` (a JSON answer, or
//! server-sent events with `"stream": true`), `usage` on every answer (on the last event of a
//! stream; Anthropic's `POST /v1/messages` streams it first, in `message_start`), and the rate-limit headers counting a configurable budget down; past it, 429 with
//! `retry-after` until the window resets. What docs/model-budgets.md reads, to test it against.
//!
//! And the other side: a mock agent that calls its model through its own sidecar for each task
//! (`MockConfig::model`), so its budget drains the way a real agent's does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Channel, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use agent_reach::http::{body, ReachBody};

/// What the provider's headers say of its budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProviderHeaders {
    /// The true state of the budget, OpenAI's way.
    #[default]
    Honest,
    /// A budget at 0 resetting in years and a `retry-after` of a decade, on every answer
    /// (while serving): what a hostile or broken proxy might send.
    Hostile,
    /// Values that do not parse.
    Garbage,
    /// Gemini's way: no rate-limit headers; past the budget, a 429 whose JSON body (chunked, no
    /// `content-length`) carries `RetryInfo.retryDelay` and no `retry-after` header.
    Gemini,
}

impl std::str::FromStr for ProviderHeaders {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "honest" => Ok(Self::Honest),
            "hostile" => Ok(Self::Hostile),
            "garbage" => Ok(Self::Garbage),
            "gemini" => Ok(Self::Gemini),
            other => Err(format!(
                "unknown `{other}` (honest, hostile, garbage, gemini)"
            )),
        }
    }
}

/// The provider's budget: requests per window (None: unlimited, no rate-limit headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderBudget {
    pub requests: Option<u64>,
    pub tokens: u64,
    pub window: Duration,
    pub headers: ProviderHeaders,
}

impl Default for ProviderBudget {
    fn default() -> Self {
        Self {
            requests: None,
            tokens: 1_000_000,
            window: Duration::from_secs(60),
            headers: ProviderHeaders::Honest,
        }
    }
}

/// Where a mock agent sends its model call for each task: its own sidecar's outbound listener,
/// naming the target's capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelCall {
    pub outbound: SocketAddr,
    pub capability: String,
}

/// The provider's window and what it has served.
#[derive(Debug)]
pub(super) struct Provider {
    budget: ProviderBudget,
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Option<Instant>,
    requests: u64,
    tokens: u64,
    served: u64,
    refused: u64,
    reach_headers: u64,
    traced: u64,
}

/// What the provider has answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProviderStats {
    pub served: u64,
    /// Answered 429: its budget was spent.
    pub refused: u64,
    /// Requests that came with a sidecar-internal `reach-*` header (none should).
    pub reach_headers: u64,
    /// Requests that came with a W3C `traceparent`.
    pub traced: u64,
}

/// One chat completion's spend, and what is left after it.
struct Spend {
    allowed: bool,
    remaining_requests: u64,
    remaining_tokens: u64,
    reset: Duration,
}

impl Provider {
    pub(super) fn new(budget: ProviderBudget) -> Self {
        Self {
            budget,
            window: Mutex::new(Window {
                started: None,
                requests: 0,
                tokens: 0,
                served: 0,
                refused: 0,
                reach_headers: 0,
                traced: 0,
            }),
        }
    }

    pub(super) fn stats(&self) -> ProviderStats {
        let w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        ProviderStats {
            served: w.served,
            refused: w.refused,
            reach_headers: w.reach_headers,
            traced: w.traced,
        }
    }

    fn spend(&self, tokens: u64) -> Spend {
        let now = Instant::now();
        let b = &self.budget;
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let started = *w.started.get_or_insert(now);
        if now.saturating_duration_since(started) >= b.window {
            // A new window: the whole budget again.
            w.started = Some(now);
            (w.requests, w.tokens) = (0, 0);
        }
        let elapsed = w
            .started
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        let limit = b.requests.unwrap_or(u64::MAX);
        let allowed = w.requests < limit && w.tokens < b.tokens;
        if allowed {
            w.requests += 1;
            w.tokens = w.tokens.saturating_add(tokens);
            w.served += 1;
        } else {
            w.refused += 1;
        }
        Spend {
            allowed,
            remaining_requests: limit.saturating_sub(w.requests),
            remaining_tokens: b.tokens.saturating_sub(w.tokens),
            reset: b.window.saturating_sub(elapsed),
        }
    }

    /// Answers one chat completion.
    pub(super) async fn complete(
        &self,
        name: &str,
        req: Request<hyper::body::Incoming>,
    ) -> Response<ReachBody> {
        // Anthropic's Messages API streams its usage first (`message_start`), then a total.
        let anthropic = req.uri().path() == "/v1/messages";
        {
            let headers = req.headers();
            let internal = headers.keys().any(|k| k.as_str().starts_with("reach-"));
            let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
            w.reach_headers += u64::from(internal);
            w.traced += u64::from(headers.contains_key("traceparent"));
        }
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let asked: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let model = asked["model"].as_str().unwrap_or("mock-gpt").to_owned();
        let stream = asked["stream"].as_bool() == Some(true);
        let prompt_tokens = (body.len() as u64 / 4).max(1);
        let words = ["The", " answer", " is", " forty", "-two", "."];
        let completion_tokens = words.len() as u64;
        let spend = self.spend(prompt_tokens + completion_tokens);
        let mut response = if !spend.allowed && self.budget.headers == ProviderHeaders::Gemini {
            gemini_refusal(spend.reset)
        } else if !spend.allowed {
            let mut r = json(
                StatusCode::TOO_MANY_REQUESTS,
                serde_json::json!({ "error": { "message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded" } }),
            );
            let secs = spend.reset.as_secs().max(1).to_string();
            if let Ok(v) = HeaderValue::from_str(&secs) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            r
        } else {
            let usage = serde_json::json!({ "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens });
            if stream && anthropic {
                messages_stream(&model, &words, prompt_tokens)
            } else if stream {
                stream_answer(&model, &words, usage)
            } else {
                json(
                    StatusCode::OK,
                    serde_json::json!({ "id": "chatcmpl-mock", "object": "chat.completion", "model": model,
                        "choices": [{ "index": 0, "finish_reason": "stop",
                            "message": { "role": "assistant", "content": words.concat() } }],
                        "usage": usage, "served_by": name }),
                )
            }
        };
        self.rate_limit_headers(response.headers_mut(), &spend);
        response
    }

    fn rate_limit_headers(&self, h: &mut http::HeaderMap, spend: &Spend) {
        let b = &self.budget;
        let Some(limit) = b.requests else {
            return;
        };
        let reset = format!("{}ms", spend.reset.as_millis());
        let values: [(&'static str, String); 6] = match b.headers {
            ProviderHeaders::Honest => [
                ("x-ratelimit-limit-requests", limit.to_string()),
                (
                    "x-ratelimit-remaining-requests",
                    spend.remaining_requests.to_string(),
                ),
                ("x-ratelimit-reset-requests", reset.clone()),
                ("x-ratelimit-limit-tokens", b.tokens.to_string()),
                (
                    "x-ratelimit-remaining-tokens",
                    spend.remaining_tokens.to_string(),
                ),
                ("x-ratelimit-reset-tokens", reset),
            ],
            ProviderHeaders::Hostile => [
                ("x-ratelimit-limit-requests", limit.to_string()),
                ("x-ratelimit-remaining-requests", "0".into()),
                ("x-ratelimit-reset-requests", "87600h".into()),
                ("anthropic-ratelimit-requests-remaining", "0".into()),
                (
                    "anthropic-ratelimit-requests-reset",
                    "9999-12-31T23:59:59Z".into(),
                ),
                ("retry-after", "315360000".into()),
            ],
            ProviderHeaders::Gemini => return,
            ProviderHeaders::Garbage => [
                ("x-ratelimit-limit-requests", "many".into()),
                ("x-ratelimit-remaining-requests", "-1".into()),
                ("x-ratelimit-reset-requests", "soon".into()),
                ("x-ratelimit-limit-tokens", "1e99".into()),
                ("ratelimit", "\"default\";r=lots;t=?".into()),
                ("retry-after-ms", "NaN".into()),
            ],
        };
        for (name, value) in values {
            if let Ok(v) = HeaderValue::from_str(&value) {
                h.insert(name, v);
            }
        }
    }
}

/// Gemini's 429: `RESOURCE_EXHAUSTED` with the wait in `RetryInfo`, sent in two chunks.
fn gemini_refusal(reset: Duration) -> Response<ReachBody> {
    let text = gemini_refusal_body(reset);
    let (head, tail) = text.split_at(text.len() / 2);
    let (mut tx, rx) = Channel::<Bytes, Infallible>::new(2);
    let chunks = [
        Bytes::copy_from_slice(head.as_bytes()),
        Bytes::copy_from_slice(tail.as_bytes()),
    ];
    tokio::spawn(async move {
        for chunk in chunks {
            if tx.send_data(chunk).await.is_err() {
                return;
            }
        }
    });
    let mut r = Response::new(body::boxed(rx));
    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    r
}

/// The body of [`gemini_refusal`]: what the agent must get back unchanged.
fn gemini_refusal_body(reset: Duration) -> String {
    serde_json::json!({ "error": { "code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "You exceeded your current quota.",
        "details": [
            { "@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [] },
            { "@type": "type.googleapis.com/google.rpc.RetryInfo",
              "retryDelay": format!("{}s", reset.as_secs().max(1)) } ] } })
    .to_string()
}

/// A streamed message as Anthropic's Messages API sends it (what its SDK reads):
/// `message_start` with the input tokens, one text block of a delta per word, then
/// `message_delta` with the output tokens.
fn messages_stream(model: &str, words: &[&str], input_tokens: u64) -> Response<ReachBody> {
    let event = |kind: &str, data: serde_json::Value| format!("event: {kind}\ndata: {data}\n\n");
    let mut events = vec![
        event(
            "message_start",
            serde_json::json!({ "type": "message_start", "message": { "id": "msg_mock",
                "type": "message", "role": "assistant", "content": [], "model": model,
                "stop_reason": null, "stop_sequence": null,
                "usage": { "input_tokens": input_tokens, "output_tokens": 1 } } }),
        ),
        event(
            "content_block_start",
            serde_json::json!({ "type": "content_block_start", "index": 0,
                "content_block": { "type": "text", "text": "" } }),
        ),
    ];
    events.extend(words.iter().map(|w| {
        event(
            "content_block_delta",
            serde_json::json!({ "type": "content_block_delta", "index": 0,
                "delta": { "type": "text_delta", "text": w } }),
        )
    }));
    events.push(event(
        "content_block_stop",
        serde_json::json!({ "type": "content_block_stop", "index": 0 }),
    ));
    events.push(event(
        "message_delta",
        serde_json::json!({ "type": "message_delta",
            "delta": { "stop_reason": "end_turn", "stop_sequence": null },
            "usage": { "output_tokens": words.len() } }),
    ));
    events.push(event(
        "message_stop",
        serde_json::json!({ "type": "message_stop" }),
    ));
    event_stream(events)
}

/// A streamed completion: one event per word, then one with `usage`, then `[DONE]`.
fn stream_answer(model: &str, words: &[&str], usage: serde_json::Value) -> Response<ReachBody> {
    let mut events: Vec<String> = words
        .iter()
        .map(|w| {
            serde_json::json!({ "object": "chat.completion.chunk", "model": model,
                "choices": [{ "index": 0, "delta": { "content": w } }] })
            .to_string()
        })
        .collect();
    events.push(
        serde_json::json!({ "object": "chat.completion.chunk", "model": model, "choices": [], "usage": usage })
            .to_string(),
    );
    events.push("[DONE]".to_owned());
    event_stream(events.iter().map(|e| format!("data: {e}\n\n")).collect())
}

/// `events` as a `text/event-stream`, one frame each, 2 ms apart.
fn event_stream(events: Vec<String>) -> Response<ReachBody> {
    let (mut tx, channel) = Channel::<Bytes, Infallible>::new(4);
    tokio::spawn(async move {
        for e in events {
            if tx.send_data(Bytes::from(e)).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let mut r = Response::new(body::boxed(channel));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

/// One model call for a task, through the agent's own sidecar: the status it answered.
pub(super) async fn call_model(call: &ModelCall, agent: &str) -> StatusCode {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = serde_json::json!({ "model": "mock-gpt", "user": agent,
        "messages": [{ "role": "user", "content": "Review this change." }] });
    let request = Request::post(format!("http://{}/v1/chat/completions", call.outbound))
        .header("reach-capability", call.capability.as_str())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())));
    let Ok(request) = request else {
        return StatusCode::INTERNAL_SERVER_ERROR;
    };
    match tokio::time::timeout(Duration::from_secs(10), client.request(request)).await {
        Ok(Ok(response)) => {
            let status = response.status();
            let _ = response.into_body().collect().await;
            status
        }
        _ => StatusCode::BAD_GATEWAY,
    }
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<ReachBody> {
    let mut r = Response::new(body::full(value.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
