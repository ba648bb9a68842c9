//! The webhook's HTTPS server: rustls with a certificate re-read from its files while it runs
//! (cert-manager and the chart rotate them in place), `/inject`, `/inject-namespace`, `/healthz`
//! and `/metrics`.

use std::collections::hash_map::DefaultHasher;
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::InjectorConfig;
use super::pod::OptIn;
use super::review::{answer, Verdict};
use crate::error::ReachError;
use crate::http::server::text;
use crate::http::ReachBody;

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

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    BadTls { path: String, message: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The certificate being served, swapped whole when the files change.
#[derive(Debug)]
struct ReloadingCert {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Reads a PEM certificate chain and its private key, and checks that they belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<(CertifiedKey, u64), InjectError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| InjectError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    let bad = |path: &Path, message: String| InjectError::BadTls {
        path: path.display().to_string(),
        message,
    };
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let mut hasher = DefaultHasher::new();
    (&cert_pem, &key_pem).hash(&mut hasher);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(cert, format!("not a PEM certificate chain: {e:?}")))?;
    if chain.is_empty() {
        return Err(bad(cert, "holds no certificate".to_owned()));
    }
    let private = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| bad(key, format!("not a PEM private key: {e:?}")))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&private)
        .map_err(|e| bad(key, format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signer);
    certified
        .keys_match()
        .map_err(|e| bad(key, format!("does not match the certificate: {e}")))?;
    Ok((certified, hasher.finish()))
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
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Injector {
    /// Loads the certificate, binds, and serves until [`Injector::shutdown`].
    pub async fn start(config: InjectorConfig) -> Result<Self, InjectError> {
        let (certified, hash) = load_certified_key(&config.tls.cert_file, &config.tls.key_file)?;
        let resolver = Arc::new(ReloadingCert {
            current: ArcSwap::from_pointee(certified),
        });
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| InjectError::BadTls {
                path: config.tls.cert_file.display().to_string(),
                message: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| InjectError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| InjectError::Bind {
            addr: config.listen,
            source,
        })?;
        let stop = CancellationToken::new();
        let stats = Arc::new(Stats::default());
        let config = Arc::new(config);
        tokio::spawn(reload_certs(
            config.clone(),
            resolver,
            hash,
            stats.clone(),
            stop.clone(),
        ));
        let task = tokio::spawn(serve(listener, acceptor, config, stats, stop.clone()));
        tracing::info!(%addr, "injector listening (HTTPS)");
        Ok(Self { addr, stop, task })
    }

    /// Stops accepting and lets reviews in flight finish (at most a few seconds).
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

async fn reload_certs(
    config: Arc<InjectorConfig>,
    resolver: Arc<ReloadingCert>,
    mut hash: u64,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let interval = config
        .tls
        .reload_interval
        .get()
        .max(Duration::from_millis(10));
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let (cert, key) = (config.tls.cert_file.clone(), config.tls.key_file.clone());
        let loaded = tokio::task::spawn_blocking(move || load_certified_key(&cert, &key)).await;
        match loaded {
            Ok(Ok((certified, new_hash))) => {
                failing = false;
                if new_hash != hash {
                    resolver.current.store(Arc::new(certified));
                    hash = new_hash;
                    stats.cert_reloads_ok.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("serving the renewed certificate");
                }
            }
            Ok(Err(err)) => {
                // Mid-rotation the two files can disagree for a moment: keep the old pair and
                // say so once per failure run.
                if !failing {
                    stats.cert_reloads_error.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%err, "certificate not reloaded; keeping the one being served");
                }
                failing = true;
            }
            Err(_) => {}
        }
    }
}

async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    config: Arc<InjectorConfig>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let turns = Arc::new(Turns {
        parse: tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT),
        body_bytes: tokio::sync::Semaphore::new(BODY_BUDGET),
    });
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(err) => {
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue; // over the cap: drop the connection; the API server retries
        };
        let (acceptor, config, stats, turns) = (
            acceptor.clone(),
            config.clone(),
            stats.clone(),
            turns.clone(),
        );
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, %err, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let service = hyper::service::service_fn(move |req| {
                let (config, stats, turns) = (config.clone(), stats.clone(), turns.clone());
                async move {
                    let answered =
                        tokio::time::timeout(REQUEST_TIMEOUT, route(req, &config, &stats, &turns))
                            .await;
                    Ok::<_, Infallible>(answered.unwrap_or_else(|_| {
                        let mut response = ReachError::Timeout {
                            target: "the review".to_owned(),
                            after: REQUEST_TIMEOUT,
                        }
                        .into_response();
                        *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
                        response
                    }))
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // Without a timer hyper turns its header-read timeout off: a client that opens a
            // connection and sends nothing would hold a slot for ever.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_TIMEOUT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(H2_STREAMS)
                .keep_alive_interval(Some(Duration::from_secs(30)))
                .keep_alive_timeout(Duration::from_secs(10));
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            let _ = watcher.watch(conn.into_owned()).await;
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}

/// What bounds the reviews in memory: turns to parse one, and the bytes of bodies arriving.
#[derive(Debug)]
struct Turns {
    parse: tokio::sync::Semaphore,
    body_bytes: tokio::sync::Semaphore,
}

/// Reads a body of at most [`MAX_BODY`] bytes, holding each chunk against the shared byte
/// budget; the permits are returned with the bytes and must live as long as they do.
async fn read_body(
    body: Incoming,
    budget: &tokio::sync::Semaphore,
) -> Result<(Bytes, Vec<tokio::sync::SemaphorePermit<'_>>), String> {
    let mut body = Limited::new(body, MAX_BODY);
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

async fn route(
    req: Request<Incoming>,
    config: &InjectorConfig,
    stats: &Stats,
    turns: &Turns,
) -> Response<ReachBody> {
    let opt_in = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => return text(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/metrics") => {
            return text(StatusCode::OK, "text/plain; version=0.0.4", stats.render())
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
