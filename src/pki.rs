//! A throwaway certificate authority for SPIFFE workload certificates: what the demo, the tests
//! and the benchmarks give their sidecars (and `agent-reach dev-certs` writes for a local
//! fleet). In a cluster cert-manager issues them (`docs/kubernetes.md`).

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::config::TlsFiles;

/// Why a certificate could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("`{0}` is not a usable URI SAN")]
    BadUri(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// A CA that signs workload certificates.
pub struct DevCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A workload's certificate and key, PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").finish_non_exhaustive()
    }
}

impl DevCa {
    /// A new CA (ECDSA P-256), named `name`, valid for a year.
    pub fn new(name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::minutes(5);
        params.not_after = now + time::Duration::days(365);
        let cert = params.self_signed(&key)?;
        Ok(Self { cert, key })
    }

    /// The CA certificate: the trust bundle.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A workload certificate whose URI SAN is `spiffe_id`, valid from a minute ago for
    /// `valid_for`, usable as TLS server and client.
    pub fn issue(&self, spiffe_id: &str, valid_for: Duration) -> Result<Issued, PkiError> {
        let name = spiffe_id.rsplit('/').next().unwrap_or(spiffe_id);
        self.issue_with(name, &[spiffe_id], &[], valid_for)
    }

    /// A certificate named `common_name` with these URI and DNS SANs (any number of each, none
    /// included), otherwise as [`DevCa::issue`]: for testing what a sidecar makes of a
    /// certificate that is not a workload identity.
    pub fn issue_with(
        &self,
        common_name: &str,
        uris: &[&str],
        dns: &[&str],
        valid_for: Duration,
    ) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let mut sans = Vec::new();
        for uri in uris {
            let ia5 = (*uri)
                .to_owned()
                .try_into()
                .map_err(|_| PkiError::BadUri((*uri).to_owned()))?;
            sans.push(SanType::URI(ia5));
        }
        for name in dns {
            let ia5 = (*name)
                .to_owned()
                .try_into()
                .map_err(|_| PkiError::BadUri((*name).to_owned()))?;
            sans.push(SanType::DnsName(ia5));
        }
        params.subject_alt_names = sans;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::minutes(1);
        params.not_after = now + time::Duration::seconds(valid_for.as_secs() as i64);
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Issues a certificate for `spiffe_id` (valid 30 days) and writes `tls.crt`, `tls.key` and
    /// `ca.crt` into `dir`, as cert-manager would mount them.
    pub fn write_files(&self, dir: &Path, spiffe_id: &str) -> Result<TlsFiles, PkiError> {
        let issued = self.issue(spiffe_id, Duration::from_secs(30 * 24 * 3600))?;
        let files = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
        };
        let write = |path: &Path, text: &str| {
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(path, text))
                .map_err(|source| PkiError::Write {
                    path: path.display().to_string(),
                    source,
                })
        };
        write(&files.ca, &self.pem())?;
        write(&files.cert, &issued.cert_pem)?;
        write(&files.key, &issued.key_pem)?;
        Ok(files)
    }
}
