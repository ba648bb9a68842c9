//! The edge layers every listener wraps its service in: a panic becomes a 500, each request gets
//! an `x-request-id` and a span, and credentials never reach a log ([`edge`]). The admin, the
//! outbound port's local API and the injector also get a timeout and a body limit
//! ([`guarded`]), and the admin's `/metrics` and `/status` are gzip-compressed on request
//! ([`compressed`]). The streaming data path gets only [`edge`]: nothing there buffers a body.
//!
//! Each function builds its stack in request order, one layer per line with why it is there, and
//! returns a concrete, statically typed service: no box per request.
//!
//! The request span is at INFO, so the default log filter puts every warning and error raised
//! while serving a request in its context (listener, method, path, request id and what routing
//! recorded). A filter of `agent_reach::http::layers=warn` turns the spans off, and their cost
//! with them.

mod panic;
mod refusal;
mod request_id;
mod span;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body::Body;
use tower::{Service, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::predicate::{DefaultPredicate, Predicate};
use tower_http::compression::CompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use super::body::{BoxError, ReachBody};
use crate::metrics::Metrics;
use crate::redact::SENSITIVE;
pub(crate) use panic::{panic_message, Panicked};
pub(crate) use span::{
    current as current_span, field, record as record_in_span, RequestSpan, Spanned,
};

/// The request id header: kept when the client sent one, generated when not.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Headers whose values are marked sensitive: never logged, never indexed by HPACK. They are
/// the secrets `src/redact.rs` masks wherever headers are shown, as names: the array's length is
/// that list's, so one added there and not here does not compile.
static SENSITIVE_HEADERS: [HeaderName; SENSITIVE.len()] =
    crate::http::headers::static_names(SENSITIVE);

/// Marks the values of [`SENSITIVE_HEADERS`] sensitive, in one pass over the names: most
/// messages carry none, and comparing names costs little, where looking each of them up
/// hashes (as tower-http's `SetSensitiveHeaders` layers did, `docs/perf-levers.md`).
///
/// A name is compared with the list only when its length is one of theirs: most are not
/// (`host`, `content-type`, `date`), and seven comparisons per header of every message, both
/// ways, cost more than the lookups they replace (`docs/perf-levers.md`).
fn mark_sensitive(headers: &mut http::HeaderMap) {
    for (name, value) in headers.iter_mut() {
        let len = name.as_str().len();
        if len < 64 && SENSITIVE_LENGTHS & (1 << len) != 0 && SENSITIVE_HEADERS.contains(name) {
            value.set_sensitive(true);
        }
    }
}

/// The lengths of the [`SENSITIVE_HEADERS`] names, as bits.
const SENSITIVE_LENGTHS: u64 = {
    let mut lengths = 0u64;
    let mut i = 0;
    while i < SENSITIVE.len() {
        assert!(
            SENSITIVE[i].len() < 64,
            "a sensitive header name of 64 bytes or more"
        );
        lengths |= 1 << SENSITIVE[i].len();
        i += 1;
    }
    lengths
};

/// Put in a response's extensions to have [`compressed`] gzip it for a client that accepts it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Compressible;

/// Wraps a listener's service in the layers every listener has.
pub fn edge<S, ReqB, B>(
    listener: &'static str,
    metrics: &Metrics,
    service: S,
) -> impl Service<
    Request<ReqB>,
    Response = Response<impl Body<Data = Bytes, Error = BoxError> + Send + 'static>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static
where
    S: Service<Request<ReqB>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Body + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let spans = RequestSpan::new(listener);
    ServiceBuilder::new()
        // First, before anything could log the request's headers.
        .map_request(|mut req: Request<ReqB>| {
            mark_sensitive(req.headers_mut());
            req
        })
        // Before the span, so the span carries the id; the handlers copy request headers
        // upstream, so the same id reaches the peer's sidecar and the agent. Every response
        // names its request, a panic's 500 included.
        .layer(request_id::RequestIdLayer)
        // One span per request: everything below runs in it, and routing fills its fields.
        .layer_fn(move |inner| Spanned::new(spans, inner))
        // Inside the span, so `set-cookie` is marked before a response event could log it.
        .map_response(|mut res: Response<_>| {
            mark_sensitive(res.headers_mut());
            res
        })
        // Innermost: the panic is logged in the request's span, and its 500 passes every layer
        // above like any response. The connection task's own panics are the accept loop's.
        .layer(CatchPanicLayer::custom(Panicked::new(listener, metrics)))
        .service(boxed(service))
}

/// A listener's future, boxed.
type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

/// The listener's own future, boxed where it starts: it holds the whole request path (18 KiB on
/// the outbound side), and every layer above would otherwise move it by value as it wraps it.
/// It is built straight into its box, never on the stack: `Box::pin(future)` copies all of it
/// (unused states included) from the stack to the heap on every call
/// (`docs/perf-levers.md`).
fn boxed<S, R>(
    service: S,
) -> impl Service<R, Response = S::Response, Error = Infallible, Future = Boxed<S::Response>>
       + Clone
       + Send
       + 'static
where
    S: Service<R, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    tower::service_fn(move |req: R| {
        crate::http::step::boxed(service.clone(), req) as Boxed<S::Response>
    })
}

/// Bounds a request's time and body, for listeners that never stream: the admin, the local API
/// and the injector. Their refusals answer in the sidecar's error format.
pub(crate) fn guarded<S, ReqB, B>(
    timeout: Duration,
    body_limit: usize,
    service: S,
) -> impl Service<
    Request<ReqB>,
    Response = Response<ReachBody>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static
where
    S: Service<
            Request<tower_http::body::Limited<ReqB>>,
            Response = Response<B>,
            Error = Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    ReqB: Body + Send + 'static,
    B: Body<Data = Bytes> + Default + Send + 'static,
    B::Error: Into<BoxError>,
{
    ServiceBuilder::new()
        // The two layers below answer in plain text; the sidecar's refusals are JSON.
        .map_response(move |response| refusal::in_wire_format(response, timeout, body_limit))
        // A stuck handler or a client trickling its body gives up its request in time.
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        // A declared oversize body is refused unread; an undeclared one stops at the limit.
        .layer(RequestBodyLimitLayer::new(body_limit))
        .service(service)
}

/// Gzips the responses marked [`Compressible`] for clients that accept gzip, when they are worth
/// it (tower-http's default predicate: not tiny, not an image, not an event stream).
pub(crate) fn compressed<S, ReqB, B>(
    service: S,
) -> impl Service<
    Request<ReqB>,
    Response = Response<impl Body<Data = Bytes, Error = BoxError> + Default + Send + 'static>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static
where
    S: Service<Request<ReqB>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    B: Body<Data = Bytes> + Default + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let marked = |_: StatusCode, _: http::Version, _: &http::HeaderMap, e: &http::Extensions| {
        e.get::<Compressible>().is_some()
    };
    ServiceBuilder::new()
        .layer(CompressionLayer::new().compress_when(DefaultPredicate::new().and(marked)))
        .service(service)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use http_body_util::{BodyExt, Full};
    use tower::ServiceExt;

    use super::*;
    use crate::http::{body, headers};
    use http::header::{AUTHORIZATION, COOKIE};

    type Limited = tower_http::body::Limited<Full<Bytes>>;

    #[test]
    fn credentials_are_marked_sensitive_and_nothing_else() {
        let mut headers = http::HeaderMap::new();
        headers.insert(AUTHORIZATION, "Bearer t".parse().unwrap());
        headers.append(COOKIE, "a=1".parse().unwrap());
        headers.append(COOKIE, "b=2".parse().unwrap());
        headers.insert(X_REQUEST_ID, "r".parse().unwrap());
        for key in ["x-api-key", "api-key", "x-goog-api-key"] {
            headers.insert(key, "sk".parse().unwrap());
        }
        mark_sensitive(&mut headers);
        assert!(headers.get(AUTHORIZATION).unwrap().is_sensitive());
        for key in ["x-api-key", "api-key", "x-goog-api-key"] {
            assert!(headers.get(key).unwrap().is_sensitive(), "{key}");
        }
        assert!(headers.get_all(COOKIE).iter().all(|v| v.is_sensitive()));
        assert!(!headers.get(X_REQUEST_ID).unwrap().is_sensitive());
    }

    fn reason(response: &Response<ReachBody>) -> &str {
        response.headers()[headers::REASON].to_str().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_guarded_handler_that_hangs_answers_408_timeout() {
        let hang = tower::service_fn(|_: Request<Limited>| {
            std::future::pending::<Result<Response<ReachBody>, Infallible>>()
        });
        let answered = guarded(Duration::from_secs(10), 1024, hang)
            .oneshot(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        assert_eq!(answered.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(reason(&answered), "timeout");
    }

    #[tokio::test]
    async fn a_declared_oversize_body_is_refused_unread() {
        let called = Arc::new(AtomicBool::new(false));
        let seen = called.clone();
        let handler = tower::service_fn(move |_: Request<Limited>| {
            seen.store(true, Ordering::Relaxed);
            async { Ok::<_, Infallible>(Response::new(body::empty())) }
        });
        let request = Request::builder()
            .header(http::header::CONTENT_LENGTH, "2048")
            .body(Full::new(Bytes::from(vec![0u8; 2048])))
            .unwrap();
        let answered = guarded(Duration::from_secs(10), 1024, handler)
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(answered.status(), StatusCode::BAD_REQUEST);
        assert_eq!(reason(&answered), "bad_request");
        assert!(!called.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn edge_marks_credentials_sensitive_and_names_the_request() {
        let echo = tower::service_fn(|req: Request<Full<Bytes>>| async move {
            let sensitive = req.headers()[http::header::AUTHORIZATION].is_sensitive();
            let mut response = Response::new(body::full(sensitive.to_string()));
            response.headers_mut().insert(
                http::header::SET_COOKIE,
                http::HeaderValue::from_static("s=1"),
            );
            Ok::<_, Infallible>(response)
        });
        let request = Request::builder()
            .header(http::header::AUTHORIZATION, "Bearer secret")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let metrics = Metrics::new("test");
        let response = edge("test", &metrics, echo).oneshot(request).await.unwrap();
        assert!(response.headers()[http::header::SET_COOKIE].is_sensitive());
        assert!(response.headers().contains_key(X_REQUEST_ID));
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &text[..],
            b"true",
            "the handler saw a sensitive authorization"
        );
    }

    #[test]
    fn every_redacted_name_is_marked_and_no_other() {
        let mut headers = http::HeaderMap::new();
        for name in SENSITIVE {
            headers.insert(
                HeaderName::from_static(name),
                http::HeaderValue::from_static("x"),
            );
        }
        // Same lengths as `cookie`, `set-cookie` and `x-goog-api-key`.
        for name in ["server", "connection", "content-length", "host"] {
            headers.insert(
                HeaderName::from_static(name),
                http::HeaderValue::from_static("x"),
            );
        }
        mark_sensitive(&mut headers);
        for (name, value) in &headers {
            let redacted = SENSITIVE.contains(&name.as_str());
            assert_eq!(value.is_sensitive(), redacted, "{name}");
        }
    }
}
