//! TLS to an external target's `https://` endpoint: the server's chain checked against the
//! Mozilla roots built in (`webpki-roots`), or the target's `ca_file` bundle instead, for the
//! host the endpoint names (sent as SNI). ALPN offers `h2` then `http/1.1`: the pool speaks
//! HTTP/2 when the server picks it ([`negotiated_h2`]), HTTP/1.1 otherwise. Built once per
//! config generation per target (`Peer::from_target`) and shared by its endpoints, so a target
//! has one session cache (resumption). A peer sidecar never comes here: nothing per call for it.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};

/// Why a target's TLS could not be set up or its handshake failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TargetTlsError {
    #[error(transparent)]
    Bundle(#[from] crate::config::CaBundleError),
    #[error("`{0}` is not a TLS server name")]
    BadName(String),
    #[error("TLS setup failed: {0}")]
    Setup(rustls::Error),
    #[error("TLS to `{host}` is not set up: {why}")]
    Unusable { host: String, why: String },
    #[error("TLS handshake with `{host}` failed: {source}")]
    Handshake {
        host: String,
        source: std::io::Error,
    },
}

/// How one target's `https://` endpoints are dialled: the server name to check (and send as
/// SNI), the `Host` header, and the client config (its roots).
pub(crate) struct TargetTls {
    host: Box<str>,
    ca_file: Option<PathBuf>,
    host_header: http::HeaderValue,
    /// The server name and client config, or why there are none: then every handshake fails
    /// with that reason (never plaintext instead).
    dial: Result<(ServerName<'static>, Arc<ClientConfig>), Arc<str>>,
}

impl TargetTls {
    /// [`TargetTls::new`], or when it cannot be set up (a bundle removed since the config was
    /// checked) one whose every handshake fails with the reason.
    pub(crate) fn or_failing(host: &str, port: u16, ca_file: Option<&Path>) -> Self {
        let dial = client(host, ca_file).map_err(|err| Arc::from(err.to_string()));
        Self::with(host, port, ca_file, dial)
    }

    fn with(
        host: &str,
        port: u16,
        ca_file: Option<&Path>,
        dial: Result<(ServerName<'static>, Arc<ClientConfig>), Arc<str>>,
    ) -> Self {
        let bracketed = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let shown = if port == 443 {
            bracketed
        } else {
            format!("{bracketed}:{port}")
        };
        Self {
            host: host.into(),
            ca_file: ca_file.map(Path::to_path_buf),
            // A host that parsed as an authority is a valid header value.
            host_header: http::HeaderValue::try_from(shown)
                .unwrap_or_else(|_| http::HeaderValue::from_static("invalid")),
            dial,
        }
    }

    /// The `Host` header of a request to it: the endpoint's host, and its port unless 443.
    pub(crate) fn host_header(&self) -> &http::HeaderValue {
        &self.host_header
    }

    /// The TLS handshake over an open connection `io`, checking the server is `host`.
    pub(crate) async fn connect<IO>(
        &self,
        io: IO,
    ) -> Result<tokio_rustls::client::TlsStream<IO>, TargetTlsError>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let (name, config) = self.dial.as_ref().map_err(|why| TargetTlsError::Unusable {
            host: self.host.to_string(),
            why: why.to_string(),
        })?;
        tokio_rustls::TlsConnector::from(config.clone())
            .connect(name.clone(), io)
            .await
            .map_err(|source| TargetTlsError::Handshake {
                host: self.host.to_string(),
                source,
            })
    }
}

/// Whether the server of a target's TLS connection picked ALPN `h2`.
pub(crate) fn negotiated_h2<IO>(stream: &tokio_rustls::client::TlsStream<IO>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2")
}

/// The server name and client config for `host`: `h2` or `http/1.1` by ALPN, TLS 1.2 and 1.3.
fn client(
    host: &str,
    ca_file: Option<&Path>,
) -> Result<(ServerName<'static>, Arc<ClientConfig>), TargetTlsError> {
    let roots = match ca_file {
        Some(path) => crate::config::read_ca_bundle(path)?,
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| TargetTlsError::BadName(host.to_owned()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TargetTlsError::Setup)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((name, Arc::new(config)))
}

// Equal when they dial the same host with the same trust: pooled connections are shared.
impl PartialEq for TargetTls {
    fn eq(&self, other: &Self) -> bool {
        self.host == other.host
            && self.ca_file == other.ca_file
            && self.host_header == other.host_header
    }
}

impl Eq for TargetTls {}

impl Hash for TargetTls {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.host.hash(state);
        self.ca_file.hash(state);
    }
}

impl fmt::Debug for TargetTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetTls")
            .field("host", &self.host)
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for TargetTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the TLS server `{}`", self.host)
    }
}
