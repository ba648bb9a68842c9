//! Mutual TLS between sidecars: this workload's certificate, key and trust bundle, read from the
//! bootstrap's `tls` files and re-read when they change, as the rustls configs the inbound
//! acceptor and the peer connector hand out for each new handshake (`docs/mtls.md`).
//!
//! TLS 1.3 only, ring provider, both sides authenticated against the trust bundle. Peers are
//! named by SPIFFE ID, not DNS name: a certificate's chain is verified, its host name is not, and
//! its URI SAN is the identity the caller checks (`connect::ConnectMesh`) and the callee hands to
//! authorization (`accept::Mesh`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore,
    ServerConfig, SignatureScheme,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::certs::{self, CertError, Reloaded};
use crate::config::TlsFiles;
use crate::identity::SpiffeId;

/// This sidecar's mutual TLS material, swapped whole when its files change. Handshakes already
/// done keep the configs they started with: a rotation never cuts a connection.
#[derive(Debug)]
pub struct MeshTls {
    files: TlsFiles,
    current: ArcSwap<Loaded>,
    /// A hash of the three files' bytes last loaded.
    loaded: AtomicU64,
}

/// One consistent load of the three files.
#[derive(Debug)]
pub struct Loaded {
    /// The URI SAN of this sidecar's certificate.
    pub(crate) identity: SpiffeId,
    /// The certificate's validity, in Unix seconds: not before, not after.
    pub(crate) valid: (i64, i64),
    /// Requires a client certificate (`strict`).
    pub strict: Arc<ServerConfig>,
    /// Verifies a client certificate when one is sent (`permissive`).
    pub(crate) permissive: Arc<ServerConfig>,
    /// Presents this sidecar's certificate and verifies the peer's chain (ALPN `http/1.1`).
    pub client: Arc<ClientConfig>,
    /// The same, offering `h2` first (`pool.peer_protocol: http2`).
    pub(crate) client_h2: Arc<ClientConfig>,
}

impl MeshTls {
    /// Loads the files once; a sidecar configured for TLS cannot start without them.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, CertError> {
        let (loaded, hash) = load(&files)?;
        Ok(Arc::new(Self {
            files,
            current: ArcSwap::from_pointee(loaded),
            loaded: hash.into(),
        }))
    }

    pub fn current(&self) -> Arc<Loaded> {
        self.current.load_full()
    }

    /// This sidecar's identity now.
    pub(crate) fn identity(&self) -> SpiffeId {
        self.current.load().identity.clone()
    }

    /// Reads the files again every `interval` until `stop`; a changed, consistent set is used
    /// for every handshake from then on, anything else (a half-written pair) is refused and the
    /// old set stays.
    pub(crate) fn spawn_watch(
        self: Arc<Self>,
        interval: Duration,
        on_reload: impl Fn(&Reloaded) + Send + 'static,
        stop: CancellationToken,
    ) -> JoinHandle<()> {
        let label = self.files.cert.display().to_string();
        certs::watch(label, interval, move || self.reload(), on_reload, stop)
    }

    /// Reads the files; `true` when they changed and the new set is now used.
    fn reload(&self) -> Result<bool, CertError> {
        let (loaded, hash) = load(&self.files)?;
        if self.loaded.swap(hash, Ordering::AcqRel) == hash {
            return Ok(false);
        }
        self.current.store(Arc::new(loaded));
        Ok(true)
    }
}

/// The SPIFFE ID a certificate carries: its `spiffe://` URI SAN.
pub fn identity_of(cert: &CertificateDer<'_>) -> Option<SpiffeId> {
    leaf(cert).map(|(identity, _)| identity)
}

/// Why a certificate that chains to the bundle is still not a workload identity here; each is a
/// `reach_tls_handshake_failures_total{reason}` label.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotAnSvid {
    #[error("the certificate carries no spiffe:// URI SAN")]
    NoSpiffeId,
    #[error("the certificate carries {0} URI SANs; a SPIFFE SVID carries exactly one")]
    SeveralUris(usize),
    #[error("the certificate's identity `{0}` is outside trust domain `{1}`")]
    ForeignTrustDomain(String, String),
}

impl NotAnSvid {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            NotAnSvid::NoSpiffeId => "no_spiffe_id",
            NotAnSvid::SeveralUris(_) => "several_uri_sans",
            NotAnSvid::ForeignTrustDomain(..) => "foreign_trust_domain",
        }
    }
}

/// The certificate's SPIFFE ID if it is an SVID of `trust_domain`: exactly one URI SAN, a
/// `spiffe://` ID in that domain. A certificate with only DNS SANs, or none, names nobody.
pub(crate) fn svid_of(
    cert: &CertificateDer<'_>,
    trust_domain: &str,
) -> Result<SpiffeId, NotAnSvid> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|_| NotAnSvid::NoSpiffeId)?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|_| NotAnSvid::NoSpiffeId)?
        .ok_or(NotAnSvid::NoSpiffeId)?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect();
    let uri = match uris.as_slice() {
        [] => return Err(NotAnSvid::NoSpiffeId),
        [one] => *one,
        many => return Err(NotAnSvid::SeveralUris(many.len())),
    };
    let id = SpiffeId::parse(uri).map_err(|_| NotAnSvid::NoSpiffeId)?;
    if id.trust_domain() != trust_domain {
        return Err(NotAnSvid::ForeignTrustDomain(
            id.to_string(),
            trust_domain.to_owned(),
        ));
    }
    Ok(id)
}

/// The `x-forwarded-client-cert` value for a verified client certificate, as Envoy writes it:
/// who it was forwarded by (this sidecar), the certificate's SHA-256 and its URI SAN.
pub(crate) fn xfcc(
    by: &SpiffeId,
    cert: &CertificateDer<'_>,
    uri: &SpiffeId,
) -> Option<http::HeaderValue> {
    use std::fmt::Write;
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
    let mut hash = String::with_capacity(64);
    for byte in digest.as_ref() {
        let _ = write!(hash, "{byte:02x}");
    }
    http::HeaderValue::try_from(format!("By={by};Hash={hash};URI={uri}")).ok()
}

/// A leaf certificate's SPIFFE ID and validity (Unix seconds), from one parse.
fn leaf(cert: &CertificateDer<'_>) -> Option<(SpiffeId, (i64, i64))> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let san = parsed.subject_alternative_name().ok()??;
    let identity = san.value.general_names.iter().find_map(|name| match name {
        GeneralName::URI(uri) if uri.starts_with("spiffe://") => SpiffeId::parse(uri).ok(),
        _ => None,
    })?;
    let validity = parsed.validity();
    let valid = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    Some((identity, valid))
}

/// What `agent-reach check` reports of a set of files: the identity and when it expires.
#[derive(Debug)]
pub struct Checked {
    pub identity: SpiffeId,
    /// Seconds until the leaf certificate expires (negative: expired).
    pub expires_in: i64,
    /// Seconds until it becomes valid (positive: not yet).
    pub valid_in: i64,
}

/// Loads the files as the sidecar would and reports on the leaf certificate's validity.
pub fn check(files: &TlsFiles) -> Result<Checked, CertError> {
    let (loaded, _) = load(files)?;
    let now = UnixTime::now().as_secs() as i64;
    let (not_before, not_after) = loaded.valid;
    Ok(Checked {
        identity: loaded.identity,
        expires_in: not_after - now,
        valid_in: not_before - now,
    })
}

/// Reads and checks the three files together, and builds the configs from them.
fn load(files: &TlsFiles) -> Result<(Loaded, u64), CertError> {
    use std::hash::{Hash, Hasher};
    let cert_pem = certs::read(&files.cert)?;
    let key_pem = certs::read(&files.key)?;
    let ca_pem = certs::read(&files.ca)?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&cert_pem, &key_pem, &ca_pem).hash(&mut hasher);
    let (key, certified) = certs::parse_pair(&files.cert, &cert_pem, &files.key, &key_pem)?;
    let chain = certified.cert.clone();
    let (identity, valid) = leaf(&chain[0]).ok_or_else(|| {
        bad(
            &files.cert,
            "has no spiffe:// URI SAN: a sidecar's certificate names its workload identity \
             (spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>)"
                .to_owned(),
        )
    })?;
    let mut roots = RootCertStore::empty();
    for ca in certs::parse_chain(&files.ca, &ca_pem)? {
        roots
            .add(ca)
            .map_err(|e| bad(&files.ca, format!("not a usable CA certificate: {e}")))?;
    }
    let (strict, permissive, client, client_h2) =
        configs(Arc::new(roots), chain, key, identity.trust_domain())
            .map_err(|e| bad(&files.cert, e))?;
    let loaded = Loaded {
        identity,
        valid,
        strict,
        permissive,
        client,
        client_h2,
    };
    Ok((loaded, hasher.finish()))
}

fn bad(path: &Path, message: String) -> CertError {
    CertError::BadTls {
        path: path.display().to_string(),
        message,
    }
}

type Configs = (
    Arc<ServerConfig>,
    Arc<ServerConfig>,
    Arc<ClientConfig>,
    Arc<ClientConfig>,
);

fn configs(
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    trust_domain: &str,
) -> Result<Configs, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls13 = &[&rustls::version::TLS13];
    let server = |allow_anonymous: bool| -> Result<Arc<ServerConfig>, String> {
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
        let verifier = if allow_anonymous {
            verifier.allow_unauthenticated()
        } else {
            verifier
        };
        let verifier = Arc::new(SvidOnly {
            chain: verifier.build().map_err(|e| e.to_string())?,
            trust_domain: trust_domain.to_owned(),
        });
        let mut config = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(tls13)
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    };
    let verifier = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let mut client = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(tls13)
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ChainOnly(verifier)))
        .with_client_auth_cert(chain.clone(), key.clone_key())
        .map_err(|e| e.to_string())?;
    // An HTTP/1.1 peer pool offers nothing else; an HTTP/2 one offers `h2` first and speaks
    // HTTP/1.1 on a connection whose server did not pick it.
    let mut client_h2 = client.clone();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    client_h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((
        server(false)?,
        server(true)?,
        Arc::new(client),
        Arc::new(client_h2),
    ))
}

/// Verifies a client's chain against the trust bundle, then that its certificate is an SVID of
/// this sidecar's trust domain: a certificate from the bundle's CA that names no workload (no
/// SAN, a DNS SAN, two URI SANs) fails the handshake instead of being served as nobody.
#[derive(Debug)]
struct SvidOnly {
    chain: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
}

impl ClientCertVerifier for SvidOnly {
    fn offer_client_auth(&self) -> bool {
        self.chain.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.chain.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .chain
            .verify_client_cert(end_entity, intermediates, now)?;
        svid_of(end_entity, &self.trust_domain).map_err(not_an_svid)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// A certificate that is not an SVID, as the handshake error rustls sends an alert for.
fn not_an_svid(why: NotAnSvid) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(why))))
}

/// Verifies a peer's chain against the trust bundle and nothing about its host name: a peer is
/// named by the SPIFFE ID in its URI SAN, which the connector checks once the handshake is done.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain (issuer, validity, usage) before the name: a name error means
        // the chain passed.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Why a handshake failed, as `reach_tls_handshake_failures_total{reason}` labels it.
pub(crate) fn failure_reason(err: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    if let Some(tls) = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        return match tls {
            rustls::Error::NoCertificatesPresented => "no_client_certificate",
            rustls::Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => "unknown_ca",
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => "expired",
                CertificateError::Other(other) => other
                    .0
                    .downcast_ref::<NotAnSvid>()
                    .map_or("bad_certificate", NotAnSvid::reason),
                _ => "bad_certificate",
            },
            rustls::Error::AlertReceived(_) => "alert_received",
            _ => "protocol",
        };
    }
    match err.kind() {
        ErrorKind::TimedOut => "timeout",
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => "closed",
        _ => "protocol",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::pki::DevCa;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "agent-reach-mtls-unit-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_half_written_pair_is_refused_and_the_old_one_stays() {
        let ca = DevCa::new("unit").unwrap();
        let files = ca
            .write_files(&scratch("half"), "spiffe://t/ns/a/sa/one")
            .unwrap();
        let tls = MeshTls::load(files.clone()).unwrap();
        assert_eq!(tls.identity().as_str(), "spiffe://t/ns/a/sa/one");
        assert!(!tls.reload().unwrap(), "unchanged files swap nothing");

        let next = ca
            .issue("spiffe://t/ns/a/sa/two", Duration::from_secs(60))
            .unwrap();
        std::fs::write(&files.key, &next.key_pem).unwrap();
        let err = tls
            .reload()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("does not match the certificate"), "{err}");
        assert_eq!(tls.identity().as_str(), "spiffe://t/ns/a/sa/one");

        std::fs::write(&files.cert, &next.cert_pem).unwrap();
        assert!(tls.reload().unwrap());
        assert_eq!(tls.identity().as_str(), "spiffe://t/ns/a/sa/two");
    }

    #[test]
    fn a_certificate_without_a_spiffe_id_or_a_trust_bundle_is_refused_with_the_reason() {
        let dir = scratch("plain");
        let ca = DevCa::new("unit").unwrap();
        let files = ca.write_files(&dir, "spiffe://t/ns/a/sa/one").unwrap();
        let plain = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        std::fs::write(&files.cert, plain.cert.pem()).unwrap();
        std::fs::write(&files.key, plain.key_pair.serialize_pem()).unwrap();
        let err = MeshTls::load(files.clone()).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("has no spiffe:// URI SAN")),
            "{err:?}"
        );

        let files = ca.write_files(&dir, "spiffe://t/ns/a/sa/one").unwrap();
        std::fs::write(&files.ca, "not a certificate").unwrap();
        let err = MeshTls::load(files).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("ca.crt")),
            "{err:?}"
        );
    }

    #[test]
    fn check_reports_the_identity_and_the_time_left() {
        let ca = DevCa::new("unit").unwrap();
        let files = ca
            .write_files(&scratch("check"), "spiffe://t/ns/a/sa/one")
            .unwrap();
        let checked = check(&files).unwrap();
        assert_eq!(checked.identity.as_str(), "spiffe://t/ns/a/sa/one");
        assert!(checked.expires_in > 29 * 24 * 3600, "{checked:?}");
        assert!(checked.valid_in <= 0, "{checked:?}");
    }
}
