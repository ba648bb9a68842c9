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

/// Readies an accepted connection for HTTP, within a time bound of its own: a client that
/// connects and then says nothing must not hold a connection slot.
pub trait Accept: Clone + Send + Sync + 'static {
    /// The stream HTTP is served on.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// An error ends the connection before any request was read.
    fn accept(&self, stream: TcpStream) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

/// Plain TCP. hyper's header-read timeout starts only once it knows the protocol, so the first
/// byte is awaited here, bounded.
#[derive(Clone, Copy, Debug)]
pub struct PlainTcp {
    first_byte_timeout: Duration,
}

/// TLS (rustls): the handshake, from the first byte on, must finish within the timeout.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    handshake_timeout: Duration,
}

// === impl PlainTcp ===

impl PlainTcp {
    pub fn new(first_byte_timeout: Duration) -> Self {
        Self { first_byte_timeout }
    }
}

impl Accept for PlainTcp {
    type Io = TcpStream;

    async fn accept(&self, stream: TcpStream) -> io::Result<TcpStream> {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(self.first_byte_timeout, stream.peek(&mut byte)).await {
            Ok(Ok(n)) if n > 0 => Ok(stream),
            Ok(Ok(_)) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }
}

// === impl Tls ===

impl Tls {
    pub fn new(config: Arc<rustls::ServerConfig>, handshake_timeout: Duration) -> Self {
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
