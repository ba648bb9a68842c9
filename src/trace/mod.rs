//! Distributed traces: an OpenTelemetry server span for each request on the outbound and inbound
//! listeners, a client span for each attempt to a peer, W3C `traceparent` propagated to peers
//! and to the agent (`tracestate` passes through unchanged), exported by OTLP over
//! HTTP/protobuf. See `docs/traces.md`.
//!
//! Why by hand and not with the OpenTelemetry SDK: the sidecar records two kinds of span at
//! three places it already owns, and its hot path must cost nothing when tracing is off. The
//! SDK would bring its own context propagation, batch processor and HTTP client for that; here a
//! [`Tracer`] is an `Option` (off: one branch per request, no allocation, no clock read), the
//! wire types are `opentelemetry-proto`'s, and the export uses the sidecar's own hyper client.

mod context;
mod export;
mod span;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, Uri};
use pin_project_lite::pin_project;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::Service;

pub use context::{parse as parse_traceparent, SpanContext};
pub use span::key;
pub(crate) use span::{Active, AttemptSpan, DeferredSpan, ModelAnswer};

use crate::classify::Class;
use crate::config::{Policy, TracingConfig};
use span::Finished;

/// Finished spans waiting for the exporter; past this they are dropped, and counted.
const QUEUE: usize = 4 * export::MAX_BATCH;

/// Records spans when tracing is on; a no-op handle when it is off.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tracer(Option<Arc<Shared>>);

#[derive(Debug)]
struct Shared {
    queue: mpsc::Sender<Finished>,
    /// The share of new traces recorded; a trace that comes with a parent follows its decision.
    ratio: f64,
    dropped: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
}

/// Where traces go, from the bootstrap's `tracing:` or the standard OpenTelemetry variables.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Settings {
    /// The full URL spans are POSTed to (`…/v1/traces`).
    pub(crate) endpoint: Uri,
    pub(crate) service_name: String,
    pub(crate) sample_ratio: f64,
}

/// Why tracing cannot start as configured.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("tracing endpoint {0:?}: not an http:// URL (the exporter speaks plain HTTP; send to a local collector)")]
    Endpoint(String),
}

/// What the exporter did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub exported: u64,
    pub(crate) dropped: u64,
    pub(crate) failed: u64,
}

impl Settings {
    /// The bootstrap's section first, then `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is),
    /// then `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` appended); `None` when none is set.
    /// `env` reads a variable: tests pass a map, not the process environment.
    pub(crate) fn resolve(
        config: Option<&TracingConfig>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, SettingsError> {
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let endpoint = match config.and_then(|c| c.otlp_endpoint.clone()) {
            Some(base) => Some(signal_url(&base)),
            None => env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| signal_url(&base))),
        };
        let Some(endpoint) = endpoint else {
            return Ok(None);
        };
        let uri: Uri = endpoint
            .trim()
            .parse()
            .map_err(|_| SettingsError::Endpoint(endpoint.clone()))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(SettingsError::Endpoint(endpoint));
        }
        let service_name = config
            .and_then(|c| c.service_name.clone())
            .or_else(|| env("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "agent-reach".to_owned());
        let sample_ratio = config.map_or(1.0, |c| c.sample_ratio);
        Ok(Some(Settings {
            endpoint: uri,
            service_name,
            sample_ratio,
        }))
    }
}

/// `<base>/v1/traces`, the OTLP/HTTP path for traces.
fn signal_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim().trim_end_matches('/'))
}

impl Tracer {
    /// Tracing off: every hook is a no-op.
    pub(crate) fn off() -> Self {
        Tracer(None)
    }

    /// Starts the exporter task for `settings`; `instance` names this sidecar in the resource.
    /// The task sends what is left and ends when `stop` is cancelled.
    pub(crate) fn start(
        settings: Settings,
        instance: &str,
        policy: &Policy,
        stop: CancellationToken,
    ) -> (Self, JoinHandle<()>) {
        let (queue, receiver) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared {
            queue,
            ratio: settings.sample_ratio.clamp(0.0, 1.0),
            dropped: AtomicU64::new(0),
            exported: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let to = export::Destination {
            endpoint: settings.endpoint,
            service_name: settings.service_name,
            instance: instance.to_owned(),
        };
        let client = crate::http::client::build(policy);
        let task = tokio::spawn(export::run(receiver, to, client, shared.clone(), stop));
        (Tracer(Some(shared)), task)
    }

    /// What the exporter did so far.
    pub(crate) fn counts(&self) -> Counts {
        self.0.as_ref().map_or_else(Counts::default, |s| Counts {
            exported: s.exported.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
        })
    }

    /// Queues a finished span; a full queue drops it.
    fn send(&self, span: Finished) {
        if let Some(shared) = &self.0 {
            if shared.queue.try_send(span).is_err() {
                let dropped = shared.dropped.fetch_add(1, Ordering::Relaxed);
                if dropped.is_power_of_two() {
                    tracing::warn!(dropped = dropped + 1, "span queue full: spans dropped");
                }
            }
        }
    }

    /// Wraps a listener's service: each request runs in a server span when tracing is on.
    pub(crate) fn server<S>(&self, listener: &'static str, service: S) -> Traced<S> {
        Traced {
            tracer: self.clone(),
            listener,
            inner: service,
        }
    }
}

// === impl Traced ===

/// A listener's service whose requests are server spans (see [`Tracer::server`]).
#[derive(Clone, Debug)]
pub(crate) struct Traced<S> {
    tracer: Tracer,
    listener: &'static str,
    inner: S,
}

impl<S, ReqB, B> Service<Request<ReqB>> for Traced<S>
where
    S: Service<Request<ReqB>, Response = Response<B>, Error = Infallible>,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = TracedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        // Off: one branch, nothing else.
        let span = match &self.tracer.0 {
            None => None,
            Some(shared) => Some(Active::start(
                &self.tracer,
                shared.ratio,
                self.listener,
                &mut req,
            )),
        };
        TracedFuture {
            inner: self.inner.call(req),
            span,
        }
    }
}

pin_project! {
    /// Ends the request's server span when its response is ready.
    pub(crate) struct TracedFuture<F> {
        #[pin]
        inner: F,
        span: Option<Active>,
    }
}

impl<F, B> Future for TracedFuture<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.inner.poll(cx) {
            Poll::Ready(Ok(response)) => response,
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => return Poll::Pending,
        };
        if let Some(span) = this.span.take() {
            span.finish(response.status(), Class::of_response(&response).outcome());
        }
        Poll::Ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::context::TRACEPARENT;
    use super::*;

    fn config(endpoint: Option<&str>) -> TracingConfig {
        TracingConfig {
            otlp_endpoint: endpoint.map(str::to_owned),
            service_name: None,
            sample_ratio: 0.5,
        }
    }

    #[test]
    fn settings_come_from_the_bootstrap_then_the_standard_variables() {
        let none = |_: &str| None;
        assert_eq!(Settings::resolve(None, none).ok(), Some(None));
        let ours = config(Some("http://collector:4318/"));
        let resolved = Settings::resolve(Some(&ours), none).ok().flatten();
        let resolved = resolved.unwrap_or_else(|| panic!("no settings"));
        assert_eq!(resolved.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(resolved.service_name, "agent-reach");
        assert_eq!(resolved.sample_ratio, 0.5);

        let env = |k: &str| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://otel:4318".to_owned()),
            "OTEL_SERVICE_NAME" => Some("checkout-sidecar".to_owned()),
            _ => None,
        };
        let resolved = Settings::resolve(Some(&config(None)), env).ok().flatten();
        let resolved = resolved.unwrap_or_else(|| panic!("no settings"));
        assert_eq!(resolved.endpoint, "http://otel:4318/v1/traces");
        assert_eq!(resolved.service_name, "checkout-sidecar");

        let traces = |k: &str| {
            (k == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").then(|| "http://otel:9/custom".to_owned())
        };
        let resolved = Settings::resolve(None, traces).ok().flatten();
        assert_eq!(
            resolved.map(|s| s.endpoint.to_string()),
            Some("http://otel:9/custom".to_owned())
        );

        let tls = config(Some("https://collector:4318"));
        assert!(Settings::resolve(Some(&tls), none).is_err());
    }

    #[tokio::test]
    async fn off_the_request_is_untouched() {
        let echo = tower::service_fn(|req: Request<()>| async move {
            let traced = req.extensions().get::<Active>().is_some();
            let header = req.headers().contains_key(TRACEPARENT);
            Ok::<_, Infallible>(Response::new((traced, header)))
        });
        let mut service = Tracer::off().server("outbound", echo);
        let response = service.call(Request::new(())).await;
        let (traced, header) = response.map(Response::into_body).unwrap_or_default();
        assert!(!traced && !header);
    }
}
