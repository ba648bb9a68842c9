//! The original destination of a redirected connection (`SO_ORIGINAL_DST`, read through `nix`'s
//! safe wrapper: the crate forbids unsafe code).

use std::net::SocketAddr;

use nix::sys::socket::{getsockopt, sockopt::OriginalDst, SockaddrIn};
use tokio::net::TcpStream;

/// A connection `init-net`'s rules redirected to the inbound listener: the address its client
/// dialled (the agent's port). The accept loop puts it in the request's extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intercepted(pub SocketAddr);

impl Intercepted {
    pub fn of<B>(req: &http::Request<B>) -> Option<SocketAddr> {
        req.extensions().get::<Intercepted>().map(|i| i.0)
    }
}

/// The address `stream`'s client dialled, when it differs from the one it reached: the
/// connection was redirected. `None` for a direct connection, for IPv6 (not redirected), and
/// where conntrack knows nothing of it (no NAT in this namespace: ENOENT).
pub fn intercepted(stream: &TcpStream) -> Option<SocketAddr> {
    let local = stream.local_addr().ok()?;
    if !local.is_ipv4() {
        return None;
    }
    let original = getsockopt(stream, OriginalDst).ok()?;
    let original = SocketAddr::from(SockaddrIn::from(original));
    (original != local).then_some(original)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test]
    async fn a_direct_connection_is_not_intercepted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        assert_eq!(intercepted(&accepted.unwrap().0), None);
    }
}
