//! The spans the sidecar records: one server span per request on the outbound and inbound
//! listeners ([`Active`], found in the request's extensions), and one client span per attempt
//! to a peer ([`AttemptSpan`]). A finished span is handed to the exporter's queue.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, Request};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span, status, Span, Status};

use super::context::{self, SpanContext, TRACEPARENT, TRACESTATE};
use super::Tracer;
use crate::classify::Outcome;

/// A span's attribute keys: the request span's field names (`crate::http::layers::field`) under
/// the sidecar's prefix, so a query can use the same words as the logs.
pub mod key {
    pub(crate) const LISTENER: &str = "reach.listener";
    pub const CAPABILITY: &str = "reach.capability";
    pub const PEER: &str = "reach.peer";
    pub const ATTEMPT: &str = "reach.attempt";
    pub(crate) const ATTEMPTS: &str = "reach.attempts";
    pub const OUTCOME: &str = "reach.outcome";
    pub const RETRY_REASON: &str = "reach.retry_reason";
    pub const SCORE: &str = "reach.score";
    /// The call's delegation chain, when it has one (`docs/chains.md`).
    pub(crate) const CHAIN: &str = "reach.chain";
    pub(crate) const METHOD: &str = "http.request.method";
    pub(crate) const STATUS: &str = "http.response.status_code";
    /// An attempt on an external target: OpenTelemetry's GenAI names (`docs/traces.md`).
    pub const GEN_AI_PROVIDER: &str = "gen_ai.provider.name";
    pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
    pub(crate) const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
    pub const GEN_AI_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const GEN_AI_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// A streamed answer's first event, in seconds from when the request was sent.
    pub const TIME_TO_FIRST_TOKEN: &str = "reach.time_to_first_token";
}

/// A finished span, as the exporter encodes it.
#[derive(Debug)]
pub(super) struct Finished(pub(super) Span);

/// The server span of the request in flight: put in the request's extensions by the listener's
/// trace layer, so the steps below can name it as the parent of their attempts.
#[derive(Clone, Debug)]
pub(crate) struct Active(Arc<ServerSpan>);

#[derive(Debug)]
pub(super) struct ServerSpan {
    tracer: Tracer,
    context: SpanContext,
    parent: Option<[u8; 8]>,
    trace_state: String,
    name: &'static str,
    listener: &'static str,
    method: String,
    start: u64,
    /// What routing learns as it goes: the capability and the last attempt.
    routed: Mutex<Routed>,
}

#[derive(Debug, Default)]
struct Routed {
    capability: Option<String>,
    peer: Option<String>,
    attempts: usize,
}

impl Active {
    /// Starts the server span of `req`: a child of the span its `traceparent` names, or the
    /// root of a new trace. The request's `traceparent` is rewritten to name this span, so the
    /// hop after (the agent, or each attempt's own span) is its child.
    pub(super) fn start<B>(
        tracer: &Tracer,
        ratio: f64,
        listener: &'static str,
        req: &mut Request<B>,
    ) -> Self {
        let headers = req.headers_mut();
        let parent = context::parent(headers);
        let context = SpanContext::child_of(parent.as_ref(), ratio);
        let trace_state = trace_state(headers);
        // The inbound side knows the capability now: the caller's sidecar named it.
        let capability = headers
            .get(crate::http::headers::CAPABILITY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        headers.insert(TRACEPARENT, context.traceparent());
        let span = ServerSpan {
            tracer: tracer.clone(),
            context,
            parent: parent.map(|p| p.span_id),
            trace_state,
            name: listener,
            listener,
            method: req.method().as_str().to_owned(),
            start: now(),
            routed: Mutex::new(Routed {
                capability,
                ..Routed::default()
            }),
        };
        let active = Active(Arc::new(span));
        req.extensions_mut().insert(active.clone());
        active
    }

    /// Ends the span with the response's status and what it meant.
    pub(super) fn finish(&self, status: http::StatusCode, outcome: Outcome) {
        let span = &self.0;
        if !span.context.sampled {
            return;
        }
        let routed = span.routed.lock().unwrap_or_else(|p| p.into_inner());
        let mut attributes = vec![
            text(key::LISTENER, span.listener),
            text(key::METHOD, &span.method),
            int(key::STATUS, i64::from(status.as_u16())),
            text(key::OUTCOME, outcome.as_str()),
        ];
        if let Some(capability) = &routed.capability {
            attributes.push(text(key::CAPABILITY, capability));
        }
        if let Some(peer) = &routed.peer {
            attributes.push(text(key::PEER, peer));
        }
        if routed.attempts > 0 {
            attributes.push(int(key::ATTEMPTS, routed.attempts as i64));
        }
        let record = Record {
            context: &span.context,
            parent: span.parent,
            trace_state: &span.trace_state,
            name: span.name,
            kind: span::SpanKind::Server,
            start: span.start,
        };
        span.tracer.send(record.finish(attributes, outcome));
    }
}

/// One attempt to a peer: a client span, child of the call's server span. Boxed: it lives
/// across the attempt's await, and the routing future it sits in is moved whole; a pointer
/// keeps that future the size it is with tracing off.
#[derive(Debug)]
pub(crate) struct AttemptSpan(Box<Attempting>);

#[derive(Debug)]
struct Attempting {
    server: Active,
    context: SpanContext,
    start: u64,
    attributes: Vec<KeyValue>,
}

impl AttemptSpan {
    /// Starts the span of attempt `n` (from 1) on `peer`, when the call is traced, and names it
    /// in the attempt's `traceparent`. `retry` is why the previous attempt was not the last.
    pub(crate) fn start(
        server: Option<&Active>,
        headers: &mut HeaderMap,
        capability: &str,
        peer: &str,
        n: usize,
        score: f64,
        retry: Option<&'static str>,
    ) -> Option<Self> {
        let server = server?;
        let context = SpanContext::child_of(Some(&server.0.context), 1.0);
        headers.insert(TRACEPARENT, context.traceparent());
        {
            let mut routed = server.0.routed.lock().unwrap_or_else(|p| p.into_inner());
            if routed.capability.is_none() {
                routed.capability = Some(capability.to_owned());
            }
            routed.peer = Some(peer.to_owned());
            routed.attempts = n;
        }
        if !context.sampled {
            return None;
        }
        let mut attributes = vec![
            text(key::CAPABILITY, capability),
            text(key::PEER, peer),
            int(key::ATTEMPT, n as i64),
            double(key::SCORE, score),
        ];
        if let Some(reason) = retry.filter(|_| n > 1) {
            attributes.push(text(key::RETRY_REASON, reason));
        }
        if let Some(chain) = headers.get(crate::chain::HEADER) {
            attributes.push(text(key::CHAIN, chain.to_str().unwrap_or("")));
        }
        Some(AttemptSpan(Box::new(Attempting {
            server: server.clone(),
            context,
            start: now(),
            attributes,
        })))
    }

    /// Ends the attempt: `status` when a response came back.
    pub(crate) fn finish(self, status: Option<http::StatusCode>, outcome: Outcome) {
        self.finish_with(status, outcome, Vec::new());
    }

    /// [`AttemptSpan::finish`] with `extra` attributes.
    fn finish_with(self, status: Option<http::StatusCode>, outcome: Outcome, extra: Vec<KeyValue>) {
        let Attempting {
            server,
            context,
            start,
            mut attributes,
        } = *self.0;
        attributes.extend(extra);
        if let Some(status) = status {
            attributes.push(int(key::STATUS, i64::from(status.as_u16())));
        }
        attributes.push(text(key::OUTCOME, outcome.as_str()));
        let server = &server.0;
        let record = Record {
            context: &context,
            parent: Some(server.context.span_id),
            trace_state: &server.trace_state,
            name: "attempt",
            kind: span::SpanKind::Client,
            start,
        };
        server.tracer.send(record.finish(attributes, outcome));
    }
}

/// What an external target's answer told, for the span of the attempt that got it.
#[derive(Debug, Default)]
pub(crate) struct ModelAnswer<'a> {
    /// The model the answer names.
    pub(crate) model: Option<&'a str>,
    /// Input and output tokens, when the answer reported them.
    pub(crate) tokens: Option<(u64, u64)>,
    /// A stream's first event, from when the request was sent.
    pub(crate) first_token: Option<std::time::Duration>,
}

/// An attempt's span on an external target, held open until its answer's body has passed, so
/// it can carry the tokens the body reports. Shared by the answer's token reader
/// (`src/budget/usage.rs`); when the answer is dropped unread (a 429 retried elsewhere) the span
/// ends then, without them.
#[derive(Debug)]
pub(crate) struct DeferredSpan(Mutex<Option<Held>>);

#[derive(Debug)]
struct Held {
    span: AttemptSpan,
    status: Option<http::StatusCode>,
    outcome: Outcome,
    provider: Arc<str>,
}

impl DeferredSpan {
    /// Holds `span`, ended as `status` and `outcome` said, for a call to target `provider`.
    pub(crate) fn new(
        span: AttemptSpan,
        status: Option<http::StatusCode>,
        outcome: Outcome,
        provider: Arc<str>,
    ) -> Arc<Self> {
        Arc::new(Self(Mutex::new(Some(Held {
            span,
            status,
            outcome,
            provider,
        }))))
    }

    /// Ends the span with what the answer told; `failed` when its body broke mid-way.
    pub(crate) fn finish(&self, answer: &ModelAnswer<'_>, failed: bool) {
        let held = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(held) = held else { return };
        let mut extra = vec![text(key::GEN_AI_PROVIDER, &held.provider)];
        if let Some(model) = answer.model {
            extra.push(text(key::GEN_AI_REQUEST_MODEL, model));
            extra.push(text(key::GEN_AI_RESPONSE_MODEL, model));
        }
        if let Some((input, output)) = answer.tokens {
            let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            extra.push(int(key::GEN_AI_INPUT_TOKENS, count(input)));
            extra.push(int(key::GEN_AI_OUTPUT_TOKENS, count(output)));
        }
        if let Some(first) = answer.first_token {
            extra.push(double(key::TIME_TO_FIRST_TOKEN, first.as_secs_f64()));
        }
        let outcome = if failed {
            Outcome::Failure
        } else {
            held.outcome
        };
        held.span.finish_with(held.status, outcome, extra);
    }
}

impl Drop for DeferredSpan {
    fn drop(&mut self) {
        self.finish(&ModelAnswer::default(), false);
    }
}

/// What every span has, whatever its kind.
struct Record<'a> {
    context: &'a SpanContext,
    parent: Option<[u8; 8]>,
    trace_state: &'a str,
    name: &'static str,
    kind: span::SpanKind,
    start: u64,
}

impl Record<'_> {
    fn finish(self, attributes: Vec<KeyValue>, outcome: Outcome) -> Finished {
        let status = match outcome {
            Outcome::Success => Status::default(),
            other => Status {
                message: other.as_str().to_owned(),
                code: status::StatusCode::Error as i32,
            },
        };
        Finished(Span {
            trace_id: self.context.trace_id.to_vec(),
            span_id: self.context.span_id.to_vec(),
            trace_state: self.trace_state.to_owned(),
            parent_span_id: self.parent.map(|p| p.to_vec()).unwrap_or_default(),
            // Bit 8 set: whether the parent is remote is known (bit 9).
            flags: u32::from(self.context.sampled)
                | 0x100
                | if self.kind == span::SpanKind::Server {
                    0x200
                } else {
                    0
                },
            name: self.name.to_owned(),
            kind: self.kind as i32,
            start_time_unix_nano: self.start,
            end_time_unix_nano: now().max(self.start),
            attributes,
            status: Some(status),
            ..Span::default()
        })
    }
}

/// The `tracestate` to pass on: the values as they came, joined (the header may repeat).
fn trace_state(headers: &HeaderMap) -> String {
    let mut state = String::new();
    for value in headers.get_all(TRACESTATE) {
        if let Ok(value) = value.to_str() {
            if !state.is_empty() {
                state.push(',');
            }
            state.push_str(value);
        }
    }
    state
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

pub(super) fn text(key: &str, value: &str) -> KeyValue {
    attribute(key, any_value::Value::StringValue(value.to_owned()))
}

fn int(key: &str, value: i64) -> KeyValue {
    attribute(key, any_value::Value::IntValue(value))
}

fn double(key: &str, value: f64) -> KeyValue {
    attribute(key, any_value::Value::DoubleValue(value))
}

fn attribute(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tokio::sync::mpsc;

    fn tracer() -> (Tracer, mpsc::Receiver<Finished>) {
        let (queue, spans) = mpsc::channel(8);
        let shared = super::super::Shared {
            queue,
            ratio: 1.0,
            dropped: Default::default(),
            exported: Default::default(),
            failed: Default::default(),
        };
        (Tracer(Some(Arc::new(shared))), spans)
    }

    fn attempt(tracer: &Tracer) -> AttemptSpan {
        let mut req = Request::new(());
        let active = Active::start(tracer, 1.0, "outbound", &mut req);
        AttemptSpan::start(
            Some(&active),
            req.headers_mut(),
            "llm",
            "llm-1",
            1,
            0.5,
            None,
        )
        .expect("sampled")
    }

    fn value(span: &Span, key: &str) -> Option<any_value::Value> {
        let kv = span.attributes.iter().find(|kv| kv.key == key)?;
        kv.value.clone()?.value
    }

    #[test]
    fn a_deferred_span_ends_once_with_the_tokens_or_on_drop_without_them() {
        let (tracer, mut spans) = tracer();
        let ok = Some(http::StatusCode::OK);
        let deferred = DeferredSpan::new(attempt(&tracer), ok, Outcome::Success, "llm".into());
        assert!(spans.try_recv().is_err(), "held until the body has passed");
        let answer = ModelAnswer {
            model: Some("gpt-test"),
            tokens: Some((3, 4)),
            first_token: Some(std::time::Duration::from_millis(250)),
        };
        deferred.finish(&answer, false);
        drop(deferred);
        let Finished(span) = spans.try_recv().expect("ended");
        assert!(spans.try_recv().is_err(), "ended once");
        let int = |n| Some(any_value::Value::IntValue(n));
        assert_eq!(value(&span, key::GEN_AI_INPUT_TOKENS), int(3));
        assert_eq!(value(&span, key::GEN_AI_OUTPUT_TOKENS), int(4));
        let model = Some(any_value::Value::StringValue("gpt-test".into()));
        assert_eq!(value(&span, key::GEN_AI_REQUEST_MODEL), model);
        assert_eq!(
            value(&span, key::TIME_TO_FIRST_TOKEN),
            Some(any_value::Value::DoubleValue(0.25))
        );

        // Dropped unread (a 429 retried elsewhere): ended then, with the provider only.
        let refused = Some(http::StatusCode::TOO_MANY_REQUESTS);
        drop(DeferredSpan::new(
            attempt(&tracer),
            refused,
            Outcome::Rejected,
            "llm".into(),
        ));
        let Finished(span) = spans.try_recv().expect("ended on drop");
        let llm = Some(any_value::Value::StringValue("llm".into()));
        assert_eq!(value(&span, key::GEN_AI_PROVIDER), llm);
        assert_eq!(value(&span, key::STATUS), int(429));
        assert!(value(&span, key::GEN_AI_INPUT_TOKENS).is_none());
    }
}
