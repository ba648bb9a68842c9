//! How datagrams move: UDP in production, an in-memory network for tests and the scale
//! benchmark. The node never knows which.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Largest datagram sent or accepted (under a 1500-byte MTU with IP and UDP headers).
pub(crate) const MAX_DATAGRAM: usize = 1400;

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

/// Seeded faults of an in-memory network: each datagram is delayed by `latency` plus up to
/// `jitter` and lost with probability `loss`, drawn from one generator seeded with `seed`.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    pub latency: Duration,
    pub jitter: Duration,
    pub loss: f64,
    pub seed: u64,
}

/// An in-memory network: every joined address gets an inbox; `cut` makes a node vanish as a
/// crashed host would (its datagrams stop, datagrams to it are lost). With `Faults` datagrams
/// are late and some lost; `partition` splits it until `heal`.
#[derive(Debug, Default)]
pub struct MemNetwork {
    nodes: Mutex<HashMap<SocketAddr, Outlet>>,
    /// Which side of a partition each address is on; datagrams do not cross sides.
    sides: Mutex<HashMap<SocketAddr, Side>>,
    faults: Option<FaultyLinks>,
    /// Datagrams delayed so far: equal delivery times keep their send order.
    sent: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    A,
    B,
}

#[derive(Debug)]
struct FaultyLinks {
    faults: Faults,
    rng: Mutex<StdRng>,
    /// To the delivery task, which holds each datagram until its time.
    delayed: mpsc::UnboundedSender<Delayed>,
}

/// A datagram in flight, ordered by delivery time then by send order (ties stay repeatable).
#[derive(Debug)]
struct Delayed {
    at: Instant,
    seq: u64,
    from: SocketAddr,
    to: SocketAddr,
    packet: Vec<u8>,
}

impl MemNetwork {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A network with seeded latency and loss. Spawns its delivery task, so it is called
    /// inside a tokio runtime; the task ends when the network is dropped. Under a paused
    /// runtime clock the latency is simulated time.
    pub fn with_faults(faults: Faults) -> Arc<Self> {
        let (delayed, queue) = mpsc::unbounded_channel();
        let network = Arc::new(Self {
            faults: Some(FaultyLinks {
                faults,
                rng: Mutex::new(StdRng::seed_from_u64(faults.seed)),
                delayed,
            }),
            ..Self::default()
        });
        tokio::spawn(deliver_when_due(Arc::downgrade(&network), queue));
        network
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

    /// Splits the network: from now on no datagram crosses between `a` and `b` (addresses in
    /// neither still reach both).
    pub fn partition(&self, a: &[SocketAddr], b: &[SocketAddr]) {
        let mut sides = lock(&self.sides);
        sides.clear();
        sides.extend(a.iter().map(|addr| (*addr, Side::A)));
        sides.extend(b.iter().map(|addr| (*addr, Side::B)));
    }

    /// Ends a partition.
    pub fn heal(&self) {
        lock(&self.sides).clear();
    }

    /// Sends a datagram through the faults (if any): dropped across a partition or by bad
    /// luck, else delivered now or after its delay.
    fn send(&self, from: SocketAddr, to: SocketAddr, packet: Vec<u8>) {
        {
            let sides = lock(&self.sides);
            if let (Some(a), Some(b)) = (sides.get(&from), sides.get(&to)) {
                if a != b {
                    return;
                }
            }
        }
        let Some(links) = &self.faults else {
            return self.inject(from, to, packet);
        };
        let delay = {
            let mut rng = lock(&links.rng);
            if links.faults.loss > 0.0 && rng.random_bool(links.faults.loss.min(1.0)) {
                return;
            }
            let jitter = links.faults.jitter.as_micros() as u64;
            let extra = if jitter > 0 {
                rng.random_range(0..=jitter)
            } else {
                0
            };
            links.faults.latency + Duration::from_micros(extra)
        };
        if delay.is_zero() {
            return self.inject(from, to, packet);
        }
        let seq = self.sent.fetch_add(1, Ordering::Relaxed);
        let _ = links.delayed.send(Delayed {
            at: Instant::now() + delay,
            seq,
            from,
            to,
            packet,
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Outlet>> {
        lock(&self.nodes)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The delivery task of a network with faults: holds each datagram until its time, then hands
/// it to its receiver (if still joined). Ends when the network is gone.
async fn deliver_when_due(network: Weak<MemNetwork>, mut queue: mpsc::UnboundedReceiver<Delayed>) {
    let mut due: BinaryHeap<Reverse<Delayed>> = BinaryHeap::new();
    loop {
        let next = due.peek().map(|Reverse(d)| d.at);
        tokio::select! {
            biased;
            received = queue.recv() => match received {
                Some(d) => due.push(Reverse(d)),
                None => return,
            },
            _ = sleep_until_opt(next) => {
                let Some(network) = network.upgrade() else { return };
                let now = Instant::now();
                while due.peek().is_some_and(|Reverse(d)| d.at <= now) {
                    if let Some(Reverse(d)) = due.pop() {
                        network.inject(d.from, d.to, d.packet);
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Delayed {}

impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Delayed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
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
        self.network.send(self.from, to, packet);
    }
}
