//! Certificates served from PEM files and re-read while they are served: cert-manager and the
//! chart rotate them in place, and a listener must pick up the renewed pair without a restart.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A certificate or key file that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    BadTls { path: String, message: String },
}

/// What one look at the files found.
#[derive(Debug)]
pub(crate) enum Reloaded {
    /// The files changed and the new pair is being served.
    Renewed,
    /// The files cannot be served (mid-rotation the two can disagree for a moment); the old pair
    /// stays. Reported once per run of failures.
    Failed,
}

/// The certificate being served, swapped whole when its files change.
#[derive(Debug)]
pub(crate) struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: ArcSwap<CertifiedKey>,
    /// A hash of the files' bytes last loaded: a look that finds them unchanged swaps nothing.
    loaded: std::sync::atomic::AtomicU64,
}

// === impl ReloadingCert ===

impl ReloadingCert {
    /// Loads the pair once; a listener cannot start without it.
    pub(crate) fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, CertError> {
        let (certified, hash) = load_certified_key(cert_file, key_file)?;
        Ok(Arc::new(Self {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            current: ArcSwap::from_pointee(certified),
            loaded: hash.into(),
        }))
    }

    /// Reads the files again every `interval` (at least 10 ms) until `stop`, serving a changed
    /// pair at once; `on_reload` hears of each renewal and each run of failures.
    pub(crate) fn spawn_watch(
        self: Arc<Self>,
        interval: Duration,
        on_reload: impl Fn(&Reloaded) + Send + 'static,
        stop: CancellationToken,
    ) -> JoinHandle<()> {
        let label = self.cert_file.display().to_string();
        watch(label, interval, move || self.reload(), on_reload, stop)
    }

    /// Reads the files; `true` when they changed and the new pair is now served.
    fn reload(&self) -> Result<bool, CertError> {
        use std::sync::atomic::Ordering;
        let (certified, hash) = load_certified_key(&self.cert_file, &self.key_file)?;
        if self.loaded.swap(hash, Ordering::AcqRel) == hash {
            return Ok(false);
        }
        self.current.store(Arc::new(certified));
        Ok(true)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Calls `reload` every `interval` (at least 10 ms, on the blocking pool: it reads files) until
/// `stop`. `reload` answers whether the files changed and are now served; `on_reload` hears of
/// each renewal and of the first failure of each run of failures.
pub(super) fn watch(
    label: String,
    interval: Duration,
    reload: impl Fn() -> Result<bool, CertError> + Send + Sync + 'static,
    on_reload: impl Fn(&Reloaded) + Send + 'static,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let interval = interval.max(Duration::from_millis(10));
    let reload = Arc::new(reload);
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let me = reload.clone();
            let Ok(reloaded) = tokio::task::spawn_blocking(move || me()).await else {
                continue;
            };
            match reloaded {
                Ok(false) => failing = false,
                Ok(true) => {
                    failing = false;
                    tracing::info!(cert = %label, "serving the renewed certificate");
                    on_reload(&Reloaded::Renewed);
                }
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(%err, "certificate not reloaded; keeping the one being served");
                    on_reload(&Reloaded::Failed);
                }
                Err(_) => {}
            }
        }
    })
}

/// A TLS server config that serves `cert` to every client, h2 or HTTP/1.1 by ALPN, and asks for
/// no client certificate.
pub(crate) fn server_config(
    cert: Arc<ReloadingCert>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Reads a PEM certificate chain and its private key, and checks that they belong together.
/// Returns a hash of the files' bytes too, to tell a later read whether they changed.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<(CertifiedKey, u64), CertError> {
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let mut hasher = DefaultHasher::new();
    (&cert_pem, &key_pem).hash(&mut hasher);
    let (_, certified) = parse_pair(cert, &cert_pem, key, &key_pem)?;
    Ok((certified, hasher.finish()))
}

/// A PEM chain (leaf first) and a PEM private key, parsed and checked to belong together: a
/// pair caught mid-rotation (one file rewritten, not the other) is refused here.
pub(super) fn parse_pair(
    cert: &Path,
    cert_pem: &[u8],
    key: &Path,
    key_pem: &[u8],
) -> Result<(PrivateKeyDer<'static>, CertifiedKey), CertError> {
    let chain = parse_chain(cert, cert_pem)?;
    let private = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| bad(key, format!("not a PEM private key: {e:?}")))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&private)
        .map_err(|e| bad(key, format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signer);
    certified
        .keys_match()
        .map_err(|e| bad(key, format!("does not match the certificate: {e}")))?;
    Ok((private, certified))
}

/// PEM certificates, at least one.
pub(super) fn parse_chain(
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(path, format!("not a PEM certificate chain: {e:?}")))?;
    if chain.is_empty() {
        return Err(bad(path, "holds no certificate".to_owned()));
    }
    Ok(chain)
}

pub(super) fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn bad(path: &Path, message: String) -> CertError {
    CertError::BadTls {
        path: path.display().to_string(),
        message,
    }
}
