//! A CA bundle (a target's `ca_file`): PEM certificates read when the policy is, so `check` and a
//! reload refuse an unreadable one with its file and line; the transport trusts them
//! (`src/transport/target_tls.rs`).

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

/// Why a CA bundle is unusable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CaBundleError {
    #[error("cannot read the CA bundle `{path}`: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the CA bundle `{path}` {message}")]
    Bundle { path: String, message: String },
}

/// The CA certificates of a PEM bundle: at least one, each a trust anchor.
pub(crate) fn read_ca_bundle(path: &Path) -> Result<RootCertStore, CaBundleError> {
    let shown = || path.display().to_string();
    let pem = std::fs::read(path).map_err(|source| CaBundleError::Read {
        path: shown(),
        source,
    })?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| CaBundleError::Bundle {
            path: shown(),
            message: format!("is not PEM certificates: {e:?}"),
        })?;
    if certs.is_empty() {
        return Err(CaBundleError::Bundle {
            path: shown(),
            message: "holds no certificate".to_owned(),
        });
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| CaBundleError::Bundle {
            path: shown(),
            message: format!("holds a certificate that is not a CA: {e}"),
        })?;
    }
    Ok(roots)
}
