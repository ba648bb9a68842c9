//! The webhook's HTTPS server: `/inject`, `/inject-namespace`, `/healthz` and `/metrics`, served
//! by the shared accept loop over TLS with a certificate re-read from its files while it runs
//! (`transport::certs`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::InjectorConfig;
use super::pod::OptIn;
use super::review::{answer, Verdict};
use crate::error::ReachError;
use crate::http::server::{self, text, ServerSettings};
use crate::http::{layers, ReachBody};
use crate::metrics::Metrics;
use crate::transport::certs::{self, CertError, Reloaded, ReloadingCert};
use crate::transport::Tls;

/// A pod's AdmissionReview is a few KiB; etcd caps an object at 1.5 MiB.
const MAX_BODY: usize = 3 << 20;
/// Reviews parsed at once: each may hold a pod's tree in memory. More wait their turn.
const REVIEWS_IN_FLIGHT: usize = 4;
/// Bytes of request bodies held at once while they arrive. Bodies are read before a review
/// takes its turn (a slow client must not hold a turn), so this, not the turns, bounds them.
const BODY_BUDGET: usize = 64 << 20;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// A request's headers, and a whole review from its first byte to its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 1024;
const H2_STREAMS: u32 = 8;
/// Longer than the API server's client keeps an idle connection (Go's 90 s): the server never
/// closes one the client is about to reuse.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("{path}: {message}")]
    BadTls { path: String, message: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Counters behind `/metrics`.
#[derive(Debug, Default)]
struct Stats {
    injected: AtomicU64,
    skipped: AtomicU64,
    denied: AtomicU64,
    malformed: AtomicU64,
    cert_reloads_ok: AtomicU64,
    cert_reloads_error: AtomicU64,
}

impl Stats {
    fn cert_reloaded(&self, reloaded: &Reloaded) {
        let counter = match reloaded {
            Reloaded::Renewed => &self.cert_reloads_ok,
            Reloaded::Failed => &self.cert_reloads_error,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "# HELP reach_inject_reviews_total Admission reviews answered, by result.\n\
             # TYPE reach_inject_reviews_total counter\n\
             reach_inject_reviews_total{{result=\"injected\"}} {}\n\
             reach_inject_reviews_total{{result=\"skipped\"}} {}\n\
             reach_inject_reviews_total{{result=\"denied\"}} {}\n\
             reach_inject_reviews_total{{result=\"malformed\"}} {}\n\
             # HELP reach_inject_cert_reloads_total Certificate files read again after a change, by result.\n\
             # TYPE reach_inject_cert_reloads_total counter\n\
             reach_inject_cert_reloads_total{{result=\"ok\"}} {}\n\
             reach_inject_cert_reloads_total{{result=\"error\"}} {}\n",
            get(&self.injected),
            get(&self.skipped),
            get(&self.denied),
            get(&self.malformed),
            get(&self.cert_reloads_ok),
            get(&self.cert_reloads_error),
        )
    }
}

/// A running webhook server.
#[derive(Debug)]
pub struct Injector {
    /// Where it listens (port 0 in the config binds any): the tests connect to it.
    #[allow(dead_code)]
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// What a review's handler shares with the others.
#[derive(Debug)]
struct Webhook {
    config: InjectorConfig,
    stats: Stats,
    turns: Turns,
    metrics: Arc<Metrics>,
}

impl Injector {
    /// Loads the certificate, binds, and serves until [`Injector::shutdown`].
    pub async fn start(config: InjectorConfig) -> Result<Self, InjectError> {
        let cert = ReloadingCert::load(&config.tls.cert_file, &config.tls.key_file)?;
        let tls = certs::server_config(cert.clone()).map_err(|e| InjectError::BadTls {
            path: config.tls.cert_file.display().to_string(),
            message: e.to_string(),
        })?;
        // `[::]` (the chart's) is dual-stack; where the node has no IPv6, IPv4 alone.
        let mut bound = TcpListener::bind(config.listen).await;
        if bound.is_err() && config.listen.ip() == std::net::Ipv6Addr::UNSPECIFIED {
            bound =
                TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, config.listen.port())).await;
        }
        let listener = bound.map_err(|source| InjectError::Bind {
            addr: config.listen,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| InjectError::Bind {
            addr: config.listen,
            source,
        })?;
        let stop = CancellationToken::new();
        let metrics = Arc::new(Metrics::new("injector"));
        let hook = Arc::new(Webhook {
            stats: Stats::default(),
            turns: Turns {
                parse: tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT),
                body_bytes: tokio::sync::Semaphore::new(BODY_BUDGET),
            },
            metrics: metrics.clone(),
            config,
        });
        let counted = hook.clone();
        cert.spawn_watch(
            hook.config.tls.reload_interval.get(),
            move |reloaded| counted.stats.cert_reloaded(reloaded),
            stop.clone(),
        );
        let task = tokio::spawn(server::serve(
            "injector",
            listener,
            Tls::new(Arc::new(tls), HANDSHAKE_TIMEOUT),
            {
                let service = service(hook);
                move |_| service
            },
            settings(),
            metrics,
            stop.clone(),
        ));
        tracing::info!(%addr, "injector listening (HTTPS)");
        Ok(Self { addr, stop, task })
    }

    /// Stops accepting and lets reviews in flight finish (at most a few seconds).
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// The webhook's request path: the edge layers, then a bound on each review's time and body.
fn service(
    hook: Arc<Webhook>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<impl Body<Data = Bytes, Error = crate::http::BoxError> + Send + 'static>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    let metrics = hook.metrics.clone();
    let route = tower::service_fn(move |req: Request<tower_http::body::Limited<Incoming>>| {
        let hook = hook.clone();
        async move { Ok::<_, Infallible>(route(req, &hook).await) }
    });
    layers::edge(
        "injector",
        &metrics,
        layers::guarded(REQUEST_TIMEOUT, MAX_BODY, route),
    )
}

/// Few streams per connection and short keepalives: the API server is the only client.
fn settings() -> ServerSettings {
    ServerSettings {
        max_connections: MAX_CONNECTIONS,
        max_header_bytes: 64 * 1024,
        header_read_timeout: REQUEST_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        // `shutdown` waits 5 s for the whole listener.
        drain: Duration::from_secs(4),
        h2_max_streams: Some(H2_STREAMS),
        h2_keep_alive_interval: Duration::from_secs(30),
        h2_keep_alive_timeout: Duration::from_secs(10),
    }
}

/// What bounds the reviews in memory: turns to parse one, and the bytes of bodies arriving.
#[derive(Debug)]
struct Turns {
    parse: tokio::sync::Semaphore,
    body_bytes: tokio::sync::Semaphore,
}

/// Reads a body of at most [`MAX_BODY`] bytes, holding each chunk against the shared byte
/// budget; the permits are returned with the bytes and must live as long as they do. (The edge
/// refuses a longer body first; the limit here keeps the budget's guarantee local.)
async fn read_body<B>(
    body: B,
    budget: &tokio::sync::Semaphore,
) -> Result<(Bytes, Vec<tokio::sync::SemaphorePermit<'_>>), String>
where
    B: Body<Data = Bytes>,
    B::Error: Into<crate::http::BoxError>,
{
    let mut body = std::pin::pin!(Limited::new(body, MAX_BODY));
    let mut bytes = BytesMut::new();
    let mut held = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        // `Limited` refuses a frame past MAX_BODY, so a chunk always fits in the budget.
        let size = u32::try_from(data.len()).map_err(|e| e.to_string())?;
        let permit = budget.acquire_many(size).await.map_err(|e| e.to_string())?;
        held.push(permit);
        bytes.extend_from_slice(&data);
    }
    Ok((bytes.freeze(), held))
}

async fn route<B>(req: Request<B>, hook: &Webhook) -> Response<ReachBody>
where
    B: Body<Data = Bytes>,
    B::Error: Into<crate::http::BoxError>,
{
    let Webhook {
        config,
        stats,
        turns,
        metrics,
    } = hook;
    let opt_in = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => return text(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/metrics") => {
            let rendered = stats.render() + &metrics.render();
            return text(StatusCode::OK, "text/plain; version=0.0.4", rendered);
        }
        (&Method::POST, "/inject") => OptIn::Annotation,
        (&Method::POST, "/inject-namespace") => OptIn::Namespace,
        (_, path) => return ReachError::NotFound(path.to_owned()).into_response(),
    };
    // The body first, under the review's timeout: a client trickling its body must not hold
    // one of the few parse turns while every other review (and the API server) waits.
    let (body, _held) = match read_body(req.into_body(), &turns.body_bytes).await {
        Ok(read) => read,
        Err(err) => {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            return ReachError::BadRequest(format!(
                "cannot read the body (at most {MAX_BODY} bytes): {err}"
            ))
            .into_response();
        }
    };
    // The semaphore is never closed; an error could only mean shutting down.
    let Ok(_turn) = turns.parse.acquire().await else {
        return ReachError::Draining.into_response();
    };
    match answer(config, &body, opt_in) {
        Ok((review, verdict, pod)) => {
            let counter = match &verdict {
                Verdict::Injected => &stats.injected,
                Verdict::Skipped(_) => &stats.skipped,
                Verdict::Denied(_) => &stats.denied,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            match &verdict {
                Verdict::Denied(message) => tracing::info!(pod, %message, "denied"),
                Verdict::Skipped(reason) => tracing::debug!(pod, reason, "skipped"),
                Verdict::Injected => tracing::info!(pod, "injected"),
            }
            let bytes = serde_json::to_vec(&review).unwrap_or_default();
            text(StatusCode::OK, "application/json", bytes)
        }
        Err(err) => {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            ReachError::BadRequest(err.to_string()).into_response()
        }
    }
}
