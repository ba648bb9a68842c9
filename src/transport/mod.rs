//! The transport seam: everything below HTTP. How a listener readies an accepted connection
//! (plain TCP or TLS, [`accept`]), how a client opens one to an upstream (plain TCP now,
//! [`connect`]), and the certificates TLS serves ([`certs`]). Routing code never sees which:
//! mutual TLS between sidecars adds an acceptor and a connector here and a peer identity beside
//! the client's address in [`Accepted`], and nothing above changes.

pub mod accept;
pub mod certs;
pub mod connect;
pub mod mtls;
pub(crate) mod target_tls;

use std::net::SocketAddr;

pub use accept::PlainTcp;
pub(crate) use accept::{Accept, Mesh, Tls};
pub(crate) use connect::{negotiated_h2, Connect, ConnectMesh, ConnectTcp, TcpSettings};
pub(crate) use target_tls::TargetTls;

/// Who a peer must prove to be in its TLS handshake: the identity it announced, or, for a peer
/// that announced none (a static peer without `identity`, under `strict`), any workload of this
/// sidecar's trust domain.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Expected {
    Exactly(crate::identity::SpiffeId),
    TrustDomain,
    /// An external target's `https://` endpoint: a server certificate for its host, by a chain
    /// to the Mozilla roots or the target's `ca_file` (no SPIFFE ID).
    Server(std::sync::Arc<TargetTls>),
    /// An external target's `http://` endpoint: plaintext, nothing to prove, and HTTP/1.1 even
    /// under `peer_protocol: http2` (a plain service is no sidecar: prior knowledge is not
    /// assumed of it).
    Plain,
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expected::Exactly(id) => f.write_str(id.as_str()),
            Expected::TrustDomain => f.write_str("any identity of the trust domain"),
            Expected::Server(tls) => std::fmt::Display::fmt(tls, f),
            Expected::Plain => f.write_str("a plain HTTP service"),
        }
    }
}

/// What the accept loop learnt of a connection's client, given to the listener's service once
/// for the connection (`http::server::serve`), not put in each of its requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Where it connected from.
    pub client: ClientAddr,
    /// The SPIFFE ID of the certificate it presented in the TLS handshake, verified.
    pub identity: Option<crate::identity::SpiffeId>,
    /// Set for every TLS connection, with or without a client certificate.
    pub tls: Option<PeerTls>,
    /// The address it dialled, when `init-net`'s rules redirected it here (the agent's port).
    pub intercepted: Option<SocketAddr>,
}

/// A connection over TLS: set with or without a client certificate, so a TLS caller is never
/// named by its address. `xfcc` is the `x-forwarded-client-cert` value made from the verified
/// certificate, when one was presented.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTls {
    pub(crate) xfcc: Option<http::HeaderValue>,
}

/// The address of a connection's client, and its IP as `x-forwarded-for` carries it (written
/// once per connection, not per request).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub SocketAddr, pub http::HeaderValue);
