//! The original destination of a redirected connection (`SO_ORIGINAL_DST`, read through `nix`'s
//! safe wrapper: the crate forbids unsafe code).

use std::net::SocketAddr;

use nix::sys::socket::{
    getsockopt, sockopt::Ip6tOriginalDst, sockopt::OriginalDst, SockaddrIn, SockaddrIn6,
};
use tokio::net::TcpStream;

/// The address `stream`'s client dialled, when it differs from the one it reached: the
/// connection was redirected (by `iptables` or `ip6tables`). `None` for a direct connection,
/// and where conntrack knows nothing of it (no NAT in this namespace: ENOENT). An IPv4 client
/// of a dual-stack listener is asked in IPv4 terms (its local address is `::ffff:a.b.c.d`).
pub(crate) fn intercepted(stream: &TcpStream) -> Option<SocketAddr> {
    let local = stream.local_addr().ok()?;
    let v4_local = match local {
        SocketAddr::V4(v4) => Some(v4),
        SocketAddr::V6(v6) => v6
            .ip()
            .to_ipv4_mapped()
            .map(|ip| std::net::SocketAddrV4::new(ip, v6.port())),
    };
    let original = match v4_local {
        Some(_) => SocketAddr::from(SockaddrIn::from(getsockopt(stream, OriginalDst).ok()?)),
        None => SocketAddr::from(SockaddrIn6::from(getsockopt(stream, Ip6tOriginalDst).ok()?)),
    };
    let reached = v4_local.map_or(local, SocketAddr::V4);
    (original != reached).then_some(original)
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
