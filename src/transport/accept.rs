//! The server side of the transport seam: what readies an accepted TCP connection for HTTP. The
//! accept loop (`http::server::serve`) takes an acceptor as a parameter: [`PlainTcp`] for the
//! sidecar's listeners, [`Tls`] for the injector (and, with client certificates, for sidecars
//! talking to each other).

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::mtls::{self, MeshTls};
use super::PeerTls;
use crate::config::MtlsMode;
use crate::identity::SpiffeId;

/// Readies an accepted connection for HTTP, within a time bound of its own: a client that
/// connects and then says nothing must not hold a connection slot.
pub trait Accept: Clone + Send + Sync + 'static {
    /// The stream HTTP is served on.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// An error ends the connection before any request was read.
    fn accept(&self, stream: TcpStream) -> impl Future<Output = io::Result<Self::Io>> + Send;

    /// The verified identity of the client on `io`: the SPIFFE ID of its certificate, when it
    /// presented one that chains to the trust bundle.
    fn identity(_io: &Self::Io) -> Option<SpiffeId> {
        None
    }

    /// The address the client of `io` dialled, when `init-net`'s rules redirected it here.
    fn intercepted(_io: &Self::Io) -> Option<std::net::SocketAddr> {
        None
    }

    /// Set when `io` is TLS (see [`PeerTls`]).
    fn tls(_io: &Self::Io) -> Option<PeerTls> {
        None
    }
}

/// Plain TCP. hyper's header-read timeout starts only once it knows the protocol, so the first
/// byte is awaited here, bounded.
#[derive(Clone, Copy, Debug)]
pub struct PlainTcp {
    first_byte_timeout: Duration,
}

/// TLS (rustls): the handshake, from the first byte on, must finish within the timeout.
#[derive(Clone)]
pub(crate) struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    handshake_timeout: Duration,
}

/// The mTLS mode for one connection: `None` for a direct one, `Some(port)` for one intercepted
/// from the agent's `port` (the policy's `mtls.ports` may say otherwise for it).
pub(crate) type ModeFor = Arc<dyn Fn(Option<u16>) -> MtlsMode + Send + Sync>;

/// The inbound listener between sidecars: TLS or plaintext, told apart by the first byte, and
/// accepted as the mTLS mode in force allows. The mode is read at every accept, so a policy
/// reload takes effect on the next connection; the certificates are the latest loaded.
///
/// A connection counts as intercepted only when the bootstrap says this sidecar intercepts
/// (`listen.intercept.ports`, written beside `init-net`) and its original destination is one of
/// those ports: any other NAT rule in the pod (a hostPort, a NodePort) makes a direct connection,
/// held to the mode like any other.
#[derive(Clone)]
pub(crate) struct Mesh {
    tls: Option<Arc<MeshTls>>,
    mode: ModeFor,
    /// The agent ports `init-net` redirects here; empty: this sidecar does not intercept.
    intercept: Arc<[u16]>,
    first_byte_timeout: Duration,
    handshake_timeout: Duration,
    /// Hears of each connection refused, with the reason (the failure counter).
    refused: Arc<dyn Fn(&'static str) + Send + Sync>,
}

/// A connection accepted by [`Mesh`].
#[derive(Debug)]
pub(crate) enum MeshIo {
    Plain(TcpStream),
    /// Plaintext redirected by `init-net` from the agent's port (its original destination): an
    /// ordinary client's call to the agent, not mesh traffic.
    Intercepted(TcpStream, std::net::SocketAddr),
    Tls(Box<MeshTlsIo>),
}

/// A TLS connection and what its handshake proved.
#[derive(Debug)]
pub(crate) struct MeshTlsIo {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    identity: Option<SpiffeId>,
    xfcc: Option<http::HeaderValue>,
}

/// The first byte of a TLS record carrying a handshake (the ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

/// What a plaintext client gets in `strict` mode before the connection closes: a clear answer
/// instead of an empty reply; its request is read only to be dropped.
const PLAINTEXT_REFUSED: &[u8] = b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n\
reach-reason: mtls_required\r\nconnection: close\r\ncontent-length: 93\r\n\r\n\
{\"error\":\"mtls_required\",\"message\":\"this listener takes mutual TLS only (mtls mode strict)\"}\n";

/// At most this much of a refused plaintext client's request is read (and dropped) before the
/// connection closes.
const PLAINTEXT_DRAIN: u64 = 64 * 1024;

// === impl PlainTcp ===

impl PlainTcp {
    pub fn new(first_byte_timeout: Duration) -> Self {
        Self { first_byte_timeout }
    }
}

impl Accept for PlainTcp {
    type Io = TcpStream;

    async fn accept(&self, stream: TcpStream) -> io::Result<TcpStream> {
        self.first_byte(&stream).await?;
        Ok(stream)
    }
}

impl PlainTcp {
    /// The connection's first byte, peeked (left for HTTP or TLS to read), within the bound.
    async fn first_byte(&self, stream: &TcpStream) -> io::Result<u8> {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(self.first_byte_timeout, stream.peek(&mut byte)).await {
            Ok(Ok(n)) if n > 0 => Ok(byte[0]),
            Ok(Ok(_)) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }
}

// === impl Tls ===

impl Tls {
    pub(crate) fn new(config: Arc<rustls::ServerConfig>, handshake_timeout: Duration) -> Self {
        Self {
            acceptor: tokio_rustls::TlsAcceptor::from(config),
            handshake_timeout,
        }
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl Accept for Tls {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;

    async fn accept(&self, stream: TcpStream) -> io::Result<Self::Io> {
        match tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(stream)).await {
            Ok(handshake) => handshake,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }
}

// === impl Mesh ===

impl Mesh {
    pub(crate) fn new(
        tls: Option<Arc<MeshTls>>,
        mode: ModeFor,
        intercept: &[u16],
        first_byte_timeout: Duration,
        handshake_timeout: Duration,
        refused: Arc<dyn Fn(&'static str) + Send + Sync>,
    ) -> Self {
        Self {
            tls,
            mode,
            intercept: intercept.into(),
            first_byte_timeout,
            handshake_timeout,
            refused,
        }
    }

    fn refuse(&self, reason: &'static str) -> io::Error {
        (self.refused)(reason);
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refused: {reason}"),
        )
    }
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("tls", &self.tls.is_some())
            .field("mode", &(self.mode)(None))
            .field("intercept", &self.intercept)
            .finish_non_exhaustive()
    }
}

impl Accept for Mesh {
    type Io = MeshIo;

    async fn accept(&self, stream: TcpStream) -> io::Result<MeshIo> {
        let first = PlainTcp::new(self.first_byte_timeout)
            .first_byte(&stream)
            .await?;
        // Asked of the kernel only where this sidecar intercepts, and believed only for the
        // ports it intercepts.
        let original = if self.intercept.is_empty() {
            None
        } else {
            crate::intercept::intercepted(&stream).filter(|o| self.intercept.contains(&o.port()))
        };
        let mode = (self.mode)(original.map(|o| o.port()));
        if first != TLS_HANDSHAKE {
            if mode == MtlsMode::Strict {
                let reason = if original.is_some() {
                    "intercepted_plaintext"
                } else {
                    "plaintext"
                };
                let err = self.refuse(reason);
                let _ = tokio::time::timeout(self.handshake_timeout, async {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut stream = stream;
                    let _ = stream.write_all(PLAINTEXT_REFUSED).await;
                    let _ = stream.shutdown().await;
                    // Read what the client sent until it hangs up (bounded): closing with its
                    // request unread would reset the connection, and a reset that reaches the
                    // client before it has read the answer discards the answer.
                    let mut unread = (&mut stream).take(PLAINTEXT_DRAIN);
                    let _ = tokio::io::copy(&mut unread, &mut tokio::io::sink()).await;
                })
                .await;
                return Err(err);
            }
            return Ok(match original {
                Some(original) => MeshIo::Intercepted(stream, original),
                None => MeshIo::Plain(stream),
            });
        }
        let loaded = match (&self.tls, mode) {
            (_, MtlsMode::Disabled) => return Err(self.refuse("tls_disabled")),
            (None, _) => return Err(self.refuse("tls_not_configured")),
            (Some(tls), _) => tls.current(),
        };
        let config = match mode {
            MtlsMode::Strict => loaded.strict.clone(),
            _ => loaded.permissive.clone(),
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        match tokio::time::timeout(self.handshake_timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => {
                // The verifier let only an SVID of our trust domain through.
                let cert = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
                let identity = cert.and_then(mtls::identity_of);
                let xfcc = cert
                    .zip(identity.as_ref())
                    .and_then(|(cert, id)| mtls::xfcc(&loaded.identity, cert, id));
                Ok(MeshIo::Tls(Box::new(MeshTlsIo {
                    stream: tls,
                    identity,
                    xfcc,
                })))
            }
            Ok(Err(err)) => match mtls::failure_reason(&err) {
                // A client that hung up mid-handshake (a caller cancelling a dial, a port scan)
                // was not refused: not counted.
                "closed" => Err(err),
                reason => Err(self.refuse(reason)),
            },
            Err(_) => Err(self.refuse("timeout")),
        }
    }

    fn identity(io: &MeshIo) -> Option<SpiffeId> {
        match io {
            MeshIo::Plain(_) | MeshIo::Intercepted(..) => None,
            MeshIo::Tls(tls) => tls.identity.clone(),
        }
    }

    fn tls(io: &MeshIo) -> Option<PeerTls> {
        match io {
            MeshIo::Plain(_) | MeshIo::Intercepted(..) => None,
            MeshIo::Tls(tls) => Some(PeerTls {
                xfcc: tls.xfcc.clone(),
            }),
        }
    }

    fn intercepted(io: &MeshIo) -> Option<std::net::SocketAddr> {
        match io {
            MeshIo::Intercepted(_, original) => Some(*original),
            _ => None,
        }
    }
}

// === impl MeshIo ===

impl AsyncRead for MeshIo {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            MeshIo::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            MeshIo::Intercepted(s, _) => std::pin::Pin::new(s).poll_read(cx, buf),
            MeshIo::Tls(s) => std::pin::Pin::new(&mut s.stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for MeshIo {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            MeshIo::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            MeshIo::Intercepted(s, _) => std::pin::Pin::new(s).poll_write(cx, buf),
            MeshIo::Tls(s) => std::pin::Pin::new(&mut s.stream).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            MeshIo::Plain(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
            MeshIo::Intercepted(s, _) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
            MeshIo::Tls(s) => std::pin::Pin::new(&mut s.stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MeshIo::Plain(s) => s.is_write_vectored(),
            MeshIo::Intercepted(s, _) => s.is_write_vectored(),
            MeshIo::Tls(s) => s.stream.is_write_vectored(),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            MeshIo::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            MeshIo::Intercepted(s, _) => std::pin::Pin::new(s).poll_flush(cx),
            MeshIo::Tls(s) => std::pin::Pin::new(&mut s.stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            MeshIo::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            MeshIo::Intercepted(s, _) => std::pin::Pin::new(s).poll_shutdown(cx),
            MeshIo::Tls(s) => std::pin::Pin::new(&mut s.stream).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test(start_paused = true)]
    async fn plain_gives_up_on_a_client_that_sends_nothing() {
        let (_silent, server) = pair().await;
        let accepted = PlainTcp::new(Duration::from_secs(1)).accept(server).await;
        assert_eq!(
            accepted.err().map(|e| e.kind()),
            Some(io::ErrorKind::TimedOut)
        );
    }

    #[tokio::test]
    async fn plain_hands_on_a_stream_once_a_byte_arrived() {
        let (mut client, server) = pair().await;
        client.write_all(b"G").await.unwrap();
        let accepted = PlainTcp::new(Duration::from_secs(10)).accept(server).await;
        assert!(accepted.is_ok(), "{accepted:?}");
    }
}
