//! The client side of the transport seam: a connector is a tower service from an upstream's URI
//! to an open connection, and says which scheme its connections speak.
//!
//! Why a seam and not hyper's `HttpConnector` used directly: mutual TLS between sidecars wraps
//! [`ConnectTcp`] in a TLS connector (which answers `https`), and the clients, `forward` and the
//! routing above them stay as they are: they build URIs with [`Connect::scheme`] and never name
//! the transport.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::Scheme;
use http::Uri;
use hyper_util::client::legacy::connect::{self as legacy, HttpConnector};
use tower::Service;

use crate::config::{ConfigStore, Policy};
use crate::transport::Expected;

/// A transport the upstream clients dial through: a service from an upstream's URI to an open
/// connection (the data path's pool calls it; hyper-util's pooled client takes it as its
/// connector).
pub trait Connect:
    legacy::Connect
    + Service<
        Uri,
        Response: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
        Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
    /// The scheme of the URIs this transport serves: `http` for plain TCP.
    fn scheme(&self) -> &Scheme;
}

/// How a TCP connection to an upstream is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcpSettings {
    /// Give up on a connection not established within this.
    pub(crate) connect_timeout: Duration,
    /// Idle time before TCP keepalive probes start: a peer that vanished without a FIN is
    /// noticed, so a half-open pooled connection fails fast instead of hanging.
    pub(crate) keepalive: Duration,
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_retries: u32,
}

impl TcpSettings {
    pub(crate) fn from_policy(policy: &Policy) -> Self {
        Self {
            connect_timeout: policy.timeouts.connect.get(),
            keepalive: policy.pool.tcp_keepalive.get(),
            keepalive_interval: Duration::from_secs(5),
            keepalive_retries: 3,
        }
    }
}

/// Where a connector's settings come from at each new connection.
type SettingsSource = Arc<dyn Fn() -> TcpSettings + Send + Sync>;

/// Plain TCP: nodelay (requests are small and latency-bound), a connect timeout and keepalive.
#[derive(Clone)]
pub struct ConnectTcp {
    connector: HttpConnector,
    settings: TcpSettings,
    /// Read before each new connection, so a reload of `timeouts.connect` or
    /// `pool.tcp_keepalive` applies from the next connection (pooled ones keep theirs).
    live: Option<SettingsSource>,
}

impl fmt::Debug for ConnectTcp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectTcp")
            .field("settings", &self.settings)
            .field("live", &self.live.is_some())
            .finish()
    }
}

// === impl ConnectTcp ===

impl ConnectTcp {
    /// A connector with fixed settings.
    pub(crate) fn new(settings: TcpSettings) -> Self {
        Self {
            connector: http_connector(settings),
            settings,
            live: None,
        }
    }

    /// A connector that follows the live policy's connect settings.
    pub(crate) fn following(store: Arc<ConfigStore>) -> Self {
        let source: SettingsSource =
            Arc::new(move || TcpSettings::from_policy(&store.snapshot().policy));
        let settings = source();
        Self {
            connector: http_connector(settings),
            settings,
            live: Some(source),
        }
    }
}

fn http_connector(settings: TcpSettings) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(settings.connect_timeout));
    connector.set_keepalive(Some(settings.keepalive));
    connector.set_keepalive_interval(Some(settings.keepalive_interval));
    connector.set_keepalive_retries(Some(settings.keepalive_retries));
    connector
}

impl Service<Uri> for ConnectTcp {
    type Response = <HttpConnector as Service<Uri>>::Response;
    type Error = <HttpConnector as Service<Uri>>::Error;
    type Future = <HttpConnector as Service<Uri>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.connector.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        if let Some(live) = &self.live {
            let now = live();
            if now != self.settings {
                // Cheap next to the connection it opens (an `Arc` and a resolver handle).
                self.connector = http_connector(now);
                self.settings = now;
            }
        }
        self.connector.call(dst)
    }
}

impl Connect for ConnectTcp {
    fn scheme(&self) -> &Scheme {
        &Scheme::HTTP
    }
}

/// Mutual TLS to a peer sidecar over [`ConnectTcp`]: this sidecar's certificate presented, the
/// peer's chain verified against the trust bundle, and then its identity compared with the one
/// the caller routed to. A peer that presents another identity is dropped before a byte of the
/// request is written: a member announcing someone else's address (or identity) gets nothing.
#[derive(Clone, Debug)]
pub(crate) struct ConnectMesh {
    tcp: ConnectTcp,
    tls: std::sync::Arc<super::mtls::MeshTls>,
    /// Offers ALPN `h2` before `http/1.1`.
    h2: bool,
}

/// A TLS connection to a peer whose identity was checked.
pub(crate) type MeshStream =
    hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// Whether the server of a mutual-TLS connection picked ALPN `h2`.
pub(crate) fn negotiated_h2(stream: &MeshStream) -> bool {
    stream.inner().get_ref().1.alpn_protocol() == Some(b"h2")
}

/// Why a mutual-TLS connection to a peer was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MeshConnectError {
    #[error(transparent)]
    Tcp(Box<dyn std::error::Error + Send + Sync>),
    #[error("TLS handshake failed: {0}")]
    Handshake(std::io::Error),
    #[error("the peer presented identity `{found}`, not `{expected}`: refused")]
    WrongIdentity { expected: String, found: String },
    #[error("the peer's address `{0}` is not a TLS server name")]
    BadName(String),
}

impl ConnectMesh {
    pub(crate) fn new(tcp: ConnectTcp, tls: std::sync::Arc<super::mtls::MeshTls>) -> Self {
        Self {
            tcp,
            tls,
            h2: false,
        }
    }

    /// Offers ALPN `h2` first (the HTTP/2 peer pool); [`negotiated_h2`] says what the server
    /// picked.
    pub(crate) fn offering_h2(mut self) -> Self {
        self.h2 = true;
        self
    }

    /// Opens a TLS connection to `uri`'s authority and checks the peer is `expected`: an SVID
    /// of this sidecar's trust domain in every case, and the identity it announced when it did.
    pub(crate) async fn connect(
        &self,
        uri: Uri,
        expected: &Expected,
    ) -> Result<MeshStream, MeshConnectError> {
        use tower::ServiceExt;
        let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
        // The name only keys the session cache (resumption per peer); the verifier ignores it.
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|_| MeshConnectError::BadName(host.to_owned()))?;
        let tcp = self
            .tcp
            .clone()
            .oneshot(uri)
            .await
            .map_err(|e| MeshConnectError::Tcp(e.into()))?
            .into_inner();
        let loaded = self.tls.current();
        let config = if self.h2 {
            &loaded.client_h2
        } else {
            &loaded.client
        };
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(MeshConnectError::Handshake)?;
        let cert = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
        let found = match cert {
            Some(cert) => super::mtls::svid_of(cert, loaded.identity.trust_domain()),
            None => Err(super::mtls::NotAnSvid::NoSpiffeId),
        };
        match (found, expected) {
            (Ok(_), Expected::TrustDomain) => Ok(hyper_util::rt::TokioIo::new(tls)),
            (Ok(found), Expected::Exactly(want)) if &found == want => {
                Ok(hyper_util::rt::TokioIo::new(tls))
            }
            (found, _) => Err(MeshConnectError::WrongIdentity {
                expected: expected.to_string(),
                found: found.map_or_else(|e| e.to_string(), |f| f.to_string()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tower::ServiceExt;

    fn settings() -> TcpSettings {
        TcpSettings {
            connect_timeout: Duration::from_secs(2),
            keepalive: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(5),
            keepalive_retries: 3,
        }
    }

    #[tokio::test]
    async fn connects_to_a_listener_with_nodelay_and_speaks_http() {
        let stub = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = stub.local_addr().unwrap();
        let connect = ConnectTcp::new(settings());
        assert_eq!(connect.scheme(), &Scheme::HTTP);
        let uri: Uri = format!("http://{addr}/x").parse().unwrap();
        let (conn, accepted) = tokio::join!(connect.oneshot(uri), stub.accept());
        let conn = conn.expect("connects");
        let (_, from) = accepted.expect("the stub accepts");
        assert_eq!(conn.inner().peer_addr().unwrap(), addr);
        assert_eq!(conn.inner().local_addr().unwrap(), from);
        assert!(conn.inner().nodelay().unwrap(), "nodelay is set");
    }

    #[tokio::test]
    async fn a_closed_port_is_a_refused_connect_error() {
        // Bind and drop: nothing listens there now.
        let addr = {
            let stub = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            stub.local_addr().unwrap()
        };
        let uri: Uri = format!("http://{addr}/").parse().unwrap();
        let err = ConnectTcp::new(settings()).oneshot(uri).await.err();
        let refused = err.as_ref().is_some_and(|e| {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
            std::iter::from_fn(|| {
                let s = source?;
                source = s.source();
                Some(s)
            })
            .any(|s| {
                s.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
            })
        });
        assert!(refused, "{err:?}");
    }

    #[tokio::test]
    async fn a_uri_of_another_scheme_is_not_dialled_in_plain_text() {
        let uri: Uri = "https://127.0.0.1:9/".parse().unwrap();
        assert!(ConnectTcp::new(settings()).oneshot(uri).await.is_err());
    }
}
