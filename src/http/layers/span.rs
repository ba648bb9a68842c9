//! The span each request runs in. It names the listener, method, path and request id, and
//! declares empty the fields routing fills in as it learns them:
//! `tracing::Span::current().record(field::CAPABILITY, name)`. A field the span does not declare
//! is dropped without a word, so the names are constants here.

use http::Request;
use tower_http::trace::MakeSpan;
use tracing::field::Empty;
use tracing::{Level, Span};

use super::X_REQUEST_ID;

/// The names of the request span's fields.
pub mod field {
    pub const LISTENER: &str = "listener";
    pub const METHOD: &str = "method";
    pub const PATH: &str = "path";
    pub const REQUEST_ID: &str = "request_id";
    /// The capability called (outbound) or served (inbound).
    pub const CAPABILITY: &str = "capability";
    /// The peer the last attempt went to.
    pub const PEER: &str = "peer";
    /// The attempt number, from 1.
    pub const ATTEMPT: &str = "attempt";
    /// How the request ended (the metrics' `outcome` label).
    pub const OUTCOME: &str = "outcome";

    /// Every field, in the span's order.
    pub const ALL: [&str; 8] = [
        LISTENER, METHOD, PATH, REQUEST_ID, CAPABILITY, PEER, ATTEMPT, OUTCOME,
    ];
}

/// At INFO: the default filter shows a request's context on its warnings and errors.
const LEVEL: Level = Level::INFO;

/// Makes one listener's request spans.
#[derive(Clone, Copy, Debug)]
pub struct RequestSpan {
    listener: &'static str,
}

impl RequestSpan {
    pub fn new(listener: &'static str) -> Self {
        Self { listener }
    }
}

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, req: &Request<B>) -> Span {
        let id = req
            .headers()
            .get(X_REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        tracing::span!(
            LEVEL,
            "request",
            listener = self.listener,
            method = %req.method(),
            path = req.uri().path(),
            request_id = id,
            capability = Empty,
            peer = Empty,
            attempt = Empty,
            outcome = Empty,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_declares_every_field_constant() {
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let span = RequestSpan::new("outbound").make_span(&Request::new(()));
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
