//! How datagrams move: UDP in production, an in-memory network for tests and the scale
//! benchmark. The node never knows which.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Largest datagram sent or accepted (under a 1500-byte MTU with IP and UDP headers).
pub const MAX_DATAGRAM: usize = 1400;

/// Datagrams received, with the address they came from.
pub type Inbox = mpsc::Receiver<(SocketAddr, Vec<u8>)>;
type Outlet = mpsc::Sender<(SocketAddr, Vec<u8>)>;

/// Queue between the socket and the node; a full queue drops datagrams, as a busy kernel would.
const INBOX_DEPTH: usize = 4096;
/// Large enough that an oversized datagram is seen whole (and rejected as oversized).
const RECV_BUFFER: usize = 64 * 1024;

/// Sends one datagram, best effort: gossip tolerates loss.
pub trait Transport: Send + Sync + std::fmt::Debug + 'static {
    fn send(&self, to: SocketAddr, packet: Vec<u8>);
}

/// A UDP socket bound to `listen`, and its inbox. The receive task ends with `stop`.
pub async fn udp(
    listen: SocketAddr,
    stop: CancellationToken,
) -> std::io::Result<(Arc<dyn Transport>, Inbox, SocketAddr)> {
    let socket = Arc::new(UdpSocket::bind(listen).await?);
    let local = socket.local_addr()?;
    let (tx, rx) = mpsc::channel(INBOX_DEPTH);
    let recv = socket.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; RECV_BUFFER];
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => return,
                r = recv.recv_from(&mut buf) => r,
            };
            match received {
                Ok((len, from)) => {
                    // An oversized datagram is kept only far enough to be rejected as such: a
                    // flood of 64 KiB datagrams must not pin 64 KiB per queue slot.
                    let kept = len.min(MAX_DATAGRAM + 1);
                    if tx.try_send((from, buf[..kept].to_vec())).is_err() && tx.is_closed() {
                        return;
                    }
                }
                // ICMP port-unreachable from an earlier send surfaces here on some systems:
                // not fatal, the socket still works.
                Err(err) => tracing::debug!(%err, "gossip receive error"),
            }
        }
    });
    Ok((Arc::new(Udp { socket }), rx, local))
}

#[derive(Debug)]
struct Udp {
    socket: Arc<UdpSocket>,
}

impl Transport for Udp {
    fn send(&self, to: SocketAddr, packet: Vec<u8>) {
        // A full socket buffer drops the datagram: SWIM and the periodic refresh make up for it.
        let _ = self.socket.try_send_to(&packet, to);
    }
}

/// An in-memory network: every joined address gets an inbox; `cut` makes a node vanish as a
/// crashed host would (its datagrams stop, datagrams to it are lost).
#[derive(Debug, Default)]
pub struct MemNetwork {
    nodes: Mutex<HashMap<SocketAddr, Outlet>>,
}

impl MemNetwork {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn join(self: &Arc<Self>, addr: SocketAddr) -> (Arc<dyn Transport>, Inbox) {
        let (tx, rx) = mpsc::channel(INBOX_DEPTH);
        self.lock().insert(addr, tx);
        (
            Arc::new(MemTransport {
                network: self.clone(),
                from: addr,
            }),
            rx,
        )
    }

    pub fn cut(&self, addr: SocketAddr) {
        self.lock().remove(&addr);
    }

    /// Delivers a datagram as if it came from `from` (a forger needs no socket of its own).
    pub fn inject(&self, from: SocketAddr, to: SocketAddr, packet: Vec<u8>) {
        let tx = self.lock().get(&to).cloned();
        if let Some(tx) = tx {
            let _ = tx.try_send((from, packet));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Outlet>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug)]
struct MemTransport {
    network: Arc<MemNetwork>,
    from: SocketAddr,
}

impl Transport for MemTransport {
    fn send(&self, to: SocketAddr, packet: Vec<u8>) {
        // A cut node's own datagrams go nowhere either.
        if !self.network.lock().contains_key(&self.from) {
            return;
        }
        self.network.inject(self.from, to, packet);
    }
}
