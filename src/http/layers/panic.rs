//! What a panic in a request handler turns into: a 500 `internal` in the sidecar's error
//! format, a count in `reach_panics_total{listener}` and an error logged in the request's span.
//! The connection stays up and the listener keeps serving.

use std::any::Any;

use http::Response;
use tower_http::catch_panic::ResponseForPanic;

use crate::error::ReachError;
use crate::http::ReachBody;
use crate::metrics::Metrics;

/// `CatchPanic`'s answer to a panic, for one listener.
#[derive(Clone, Debug)]
pub(crate) struct Panicked {
    listener: &'static str,
    panics: metrics::Counter,
}

impl Panicked {
    pub(crate) fn new(listener: &'static str, metrics: &Metrics) -> Self {
        Self {
            listener,
            panics: metrics.panics(listener),
        }
    }
}

impl ResponseForPanic for Panicked {
    type ResponseBody = ReachBody;

    fn response_for_panic(&mut self, err: Box<dyn Any + Send + 'static>) -> Response<ReachBody> {
        self.panics.increment(1);
        tracing::error!(
            listener = self.listener,
            panic = panic_message(err.as_ref()),
            "a request handler panicked; answered 500 internal"
        );
        ReachError::Internal.into_response()
    }
}

/// The message a panic was raised with, when it has one.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_of_a_str_or_string_panic_is_read() {
        let literal: Box<dyn Any + Send> = Box::new("boom");
        let formatted: Box<dyn Any + Send> = Box::new(format!("boom {}", 2));
        let other: Box<dyn Any + Send> = Box::new(7_u8);
        assert_eq!(panic_message(literal.as_ref()), "boom");
        assert_eq!(panic_message(formatted.as_ref()), "boom 2");
        assert_eq!(panic_message(other.as_ref()), "(a panic without a message)");
    }

    #[test]
    fn a_panic_answers_500_internal_and_is_counted() {
        let metrics = Metrics::new("test");
        let mut handler = Panicked::new("admin", &metrics);
        let response = handler.response_for_panic(Box::new("boom"));
        assert_eq!(response.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()[crate::http::headers::REASON], "internal");
        assert!(metrics
            .render()
            .contains(r#"reach_panics_total{listener="admin"} 1"#));
    }
}
