//! The span each request runs in. It names the listener, method, path and request id, and
//! declares empty the fields routing fills in as it learns them:
//! `tracing::Span::current().record(field::CAPABILITY, name)`. A field the span does not declare
//! is dropped without a word, so the names are constants here.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::Service;
use tracing::field::Empty;
use tracing::{Level, Span};

use super::X_REQUEST_ID;

/// The names of the request span's fields.
pub(crate) mod field {
    #[cfg(test)]
    pub(crate) const LISTENER: &str = "listener";
    #[cfg(test)]
    pub(crate) const METHOD: &str = "method";
    #[cfg(test)]
    pub(crate) const PATH: &str = "path";
    #[cfg(test)]
    pub(crate) const REQUEST_ID: &str = "request_id";
    /// The capability called (outbound) or served (inbound).
    pub(crate) const CAPABILITY: &str = "capability";
    /// The peer the last attempt went to.
    pub(crate) const PEER: &str = "peer";
    /// The attempt number, from 1.
    pub(crate) const ATTEMPT: &str = "attempt";
    /// How the request ended (the metrics' `outcome` label).
    pub(crate) const OUTCOME: &str = "outcome";
    /// The call's delegation chain, when it has one (`src/chain/`).
    pub(crate) const CHAIN: &str = "chain";

    /// Every field, in the span's order.
    #[cfg(test)]
    pub(crate) const ALL: [&str; 9] = [
        LISTENER, METHOD, PATH, REQUEST_ID, CAPABILITY, PEER, ATTEMPT, OUTCOME, CHAIN,
    ];
}

/// At INFO: the default filter shows a request's context on its warnings and errors.
const LEVEL: Level = Level::INFO;

/// The current request span, unless its level is off (`--log warn` or quieter): asking for the
/// current span costs a lookup even when there is none, and a call records in its
/// span a few times.
pub(crate) fn current() -> Option<Span> {
    let on = LEVEL <= tracing::level_filters::STATIC_MAX_LEVEL
        && LEVEL <= tracing::level_filters::LevelFilter::current();
    on.then(Span::current)
}

/// Records `value` as the current request span's `field` (see [`current`]).
pub(crate) fn record<V: tracing::field::Value>(field: &str, value: V) {
    if let Some(span) = current() {
        span.record(field, value);
    }
}

/// Makes one listener's request spans.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestSpan {
    listener: &'static str,
}

impl RequestSpan {
    pub(crate) fn new(listener: &'static str) -> Self {
        Self { listener }
    }
}

impl RequestSpan {
    /// The request's span; a disabled one (nothing to enter) when the filter leaves it out.
    pub(crate) fn make<B>(&self, req: &Request<B>) -> Span {
        tracing::span!(
            LEVEL,
            "request",
            listener = self.listener,
            method = %req.method(),
            path = req.uri().path(),
            request_id = req
                .headers()
                .get(X_REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
            capability = Empty,
            peer = Empty,
            attempt = Empty,
            outcome = Empty,
            chain = Empty,
        )
    }
}

/// Runs each request, and polls its answer's body, in the request's span, with a DEBUG event
/// when it starts and when it is answered (a 5xx is routine on a proxy: DEBUG, not ERROR).
///
/// Ours rather than tower-http's `Trace`: with the span filtered out (`--log warn`,
/// `agent_reach::http::layers=warn`) a request pays one check and nothing else, where `Trace`
/// still read the clock and entered a disabled span on every poll of the answer and its body
/// (`docs/perf-levers.md`).
#[derive(Clone, Debug)]
pub(crate) struct Spanned<S> {
    inner: S,
    spans: RequestSpan,
}

impl<S> Spanned<S> {
    pub(crate) fn new(spans: RequestSpan, inner: S) -> Self {
        Self { inner, spans }
    }
}

impl<S, ReqB, B> Service<Request<ReqB>> for Spanned<S>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
{
    type Response = Response<SpannedBody<B>>;
    type Error = S::Error;
    type Future = SpannedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let span = self.spans.make(&req);
        if span.is_disabled() {
            return SpannedFuture {
                inner: self.inner.call(req),
                span: None,
            };
        }
        tracing::debug!(parent: &span, "started processing request");
        let inner = span.in_scope(|| self.inner.call(req));
        SpannedFuture {
            inner,
            span: Some((span, Instant::now())),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer, polled in its span.
    pub(crate) struct SpannedFuture<F> {
        #[pin]
        inner: F,
        span: Option<(Span, Instant)>,
    }
}

impl<F, B, E> Future for SpannedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<SpannedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some((span, started)) = this.span.take() else {
            let response = ready!(this.inner.poll(cx))?;
            return Poll::Ready(Ok(response.map(|inner| SpannedBody { inner, span: None })));
        };
        let polled = span.in_scope(|| this.inner.poll(cx));
        let Poll::Ready(answer) = polled else {
            *this.span = Some((span, started));
            return Poll::Pending;
        };
        let response = answer?;
        let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        tracing::debug!(parent: &span, status = response.status().as_u16(), latency_ms, "finished processing request");
        Poll::Ready(Ok(response.map(|inner| SpannedBody {
            inner,
            span: Some(span),
        })))
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, polled in its request's span (when there is one).
    pub(crate) struct SpannedBody<B> {
        #[pin]
        inner: B,
        span: Option<Span>,
    }
}

impl<B: Body> Body for SpannedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.span {
            None => this.inner.poll_frame(cx),
            Some(span) => span.in_scope(|| this.inner.poll_frame(cx)),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_declares_every_field_constant() {
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let span = RequestSpan::new("outbound").make(&Request::new(()));
            let fields = span.metadata().map(|m| m.fields());
            for name in field::ALL {
                assert!(
                    fields.is_some_and(|f| f.field(name).is_some()),
                    "the span has no `{name}`"
                );
            }
            assert_eq!(fields.map(|f| f.len()), Some(field::ALL.len()));
        });
    }
}
