//! **half-open**: a TCP relay on the path to one agent stops forwarding bytes both ways, on
//! pooled connections and new ones alike, without closing anything: routers see timeouts, not
//! errors. The relay sits where the network does: between the caller's sidecar and the broken
//! agent's sidecar (which advertises the relay's address by gossip), and between the router and
//! the agent for the others, so their health checks cross it too.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// The address a half-open agent's sidecar advertises (the relay listens there).
pub(crate) const RELAY_IP: [u8; 4] = [127, 0, 0, 2];

/// A TCP relay standing for the network path to one agent. Until it is broken it forwards both
/// ways and passes a close on; once broken it forwards nothing, on open connections and new ones
/// (accepted, then read and discarded), and closes nothing: a black hole, so the sender waits
/// for a timeout. It counts the HTTP/1.1 POSTs sent into it, delivered or not.
pub(crate) struct Relay {
    pub(crate) addr: SocketAddr,
    pub(crate) broken: Arc<AtomicBool>,
    pub(crate) requests: Arc<AtomicU64>,
    pub(crate) stop: CancellationToken,
}

impl Relay {
    pub(crate) async fn start(listen: SocketAddr, upstream: SocketAddr) -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("relay on {listen}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let relay = Self {
            addr,
            broken: Arc::default(),
            requests: Arc::default(),
            stop: CancellationToken::new(),
        };
        let (broken, requests, stop) = (
            relay.broken.clone(),
            relay.requests.clone(),
            relay.stop.clone(),
        );
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(_) => continue,
                    },
                };
                let (broken, requests, stop) = (broken.clone(), requests.clone(), stop.clone());
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    let upstream = if broken.load(Ordering::SeqCst) {
                        None
                    } else {
                        tokio::net::TcpStream::connect(upstream).await.ok()
                    };
                    let (client_read, client_write) = client.into_split();
                    match upstream {
                        Some(upstream) => {
                            let _ = upstream.set_nodelay(true);
                            let (up_read, up_write) = upstream.into_split();
                            tokio::join!(
                                pump(client_read, up_write, &broken, Some(&requests), &stop),
                                pump(up_read, client_write, &broken, None, &stop),
                            );
                        }
                        None if broken.load(Ordering::SeqCst) => {
                            // Accept, then swallow: hold the write half so nothing closes.
                            let _held = client_write;
                            pump_into_nothing(client_read, &requests, &stop).await;
                        }
                        // The agent is not there (before the break): refuse like it would.
                        None => {}
                    }
                });
            }
        });
        Ok(relay)
    }
}

/// Forwards `from` to `to` until the break, then reads and discards; a close before the break
/// is passed on, after it is kept quiet until the relay stops.
pub(crate) async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    broken: &AtomicBool,
    requests: Option<&AtomicU64>,
    stop: &CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            _ = stop.cancelled() => return,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
        };
        if let Some(r) = requests {
            if buf[..n].starts_with(b"POST ") {
                r.fetch_add(1, Ordering::Relaxed);
            }
        }
        if broken.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if broken.load(Ordering::SeqCst) {
        let _held = (from, to);
        stop.cancelled().await;
    } else {
        let _ = to.shutdown().await;
    }
}

pub(crate) async fn pump_into_nothing(
    mut from: tokio::net::tcp::OwnedReadHalf,
    requests: &AtomicU64,
    stop: &CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if buf[..n].starts_with(b"POST ") {
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                }
            },
        }
    }
    let _held = from;
    stop.cancelled().await;
}
