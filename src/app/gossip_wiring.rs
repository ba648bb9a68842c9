//! Starting the sidecar's gossip node: the key, the socket, the advertised address, the task
//! that publishes this agent's profile and live view and this sidecar's MCP tool pins, the one
//! that resolves seeds, and the one that takes a changed key file.

use crate::transport::mtls::MeshTls;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::StartError;
use crate::config::{ConfigStore, GossipConfig, HostPort, Snapshot};
use crate::gossip::{self, ClusterKey, GossipHandle, NodeOptions};
use crate::local::LocalAgent;
use crate::outbound::McpPins;
use crate::peers::{self, GossipFeed};

/// How often the agent's view is offered to gossip (which sends only meaningful moves).
const OFFER_EVERY: Duration = Duration::from_millis(200);
/// Seeds are retried this often while no member is known yet.
const JOIN_RETRY: Duration = Duration::from_secs(1);
/// How often the key file is read for a change (a rotated Kubernetes Secret lands in place).
const KEY_CHECK_EVERY: Duration = Duration::from_secs(1);

pub(super) async fn start(
    config: &GossipConfig,
    store: &Arc<ConfigStore>,
    inbound: SocketAddr,
    feed: GossipFeed,
    (local, pins): (Arc<LocalAgent>, Arc<McpPins>),
    tls: Option<Arc<MeshTls>>,
    stop: CancellationToken,
) -> Result<(Arc<GossipHandle>, SocketAddr), StartError> {
    let key_path = crate::runtime::gossip_key_path(store, config);
    let key_text = std::fs::read(&key_path).map_err(|source| gossip::KeyError::Read {
        path: key_path.display().to_string(),
        source,
    })?;
    let key = ClusterKey::parse(&key_path, &key_text)?;
    let ip = advertise_ip(config).await;
    // An unspecified listen address (`0.0.0.0` or `[::]`) takes the advertised address's
    // family: a UDP socket of the other family could not reach the peers.
    let listen = match config.listen.ip() {
        any if any.is_unspecified() && ip.is_ipv6() != any.is_ipv6() => {
            let any: IpAddr = if ip.is_ipv6() {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            };
            SocketAddr::new(any, config.listen.port())
        }
        _ => config.listen,
    };
    let (transport, inbox, bound) =
        gossip::transport::udp(listen, stop.clone())
            .await
            .map_err(|source| StartError::Bind {
                listener: "gossip",
                addr: listen,
                source,
            })?;
    let addr = SocketAddr::new(ip, bound.port());
    let published_inbound = SocketAddr::new(ip, inbound.port()).to_string();

    let name = store.snapshot().bootstrap.agent.name.to_string();
    let mut options = NodeOptions::new(name.clone(), addr, key);
    options.probe_interval = config.probe_interval.get();
    options.probe_timeout = config.probe_timeout.get();
    options.suspect_timeout = config.suspect_timeout.get();
    options.refresh_interval = config.refresh_interval.get();
    options.max_transmissions =
        gossip::max_transmissions(u32::try_from(config.expected_members.get()).unwrap_or(u32::MAX));
    let feed = Arc::new(feed);
    let handle = Arc::new(gossip::spawn(options, transport, inbox, feed, stop.clone()));
    tracing::info!(agent = %name, gossip = %addr, inbound = %published_inbound, seeds = config.seeds.len(), "gossip started");

    tokio::spawn(watch_key(handle.clone(), key_path, key_text, stop.clone()));
    tokio::spawn(offer_views(
        handle.clone(),
        (local, pins),
        published_inbound,
        (store.clone(), tls),
        stop.clone(),
    ));
    if !config.seeds.is_empty() {
        tokio::spawn(resolve_seeds(
            handle.clone(),
            config.seeds.clone(),
            config.resolve_interval.get(),
            stop,
        ));
    }
    Ok((handle, addr))
}

/// How long a draining sidecar keeps answering (with 503 `draining`) before it stops accepting:
/// long enough for the news to reach the fleet.
pub(super) fn drain_announce(snapshot: &Snapshot) -> Duration {
    snapshot
        .bootstrap
        .gossip
        .as_ref()
        .map_or(Duration::from_secs(1), |g| {
            g.probe_interval.get().max(Duration::from_secs(1))
        })
}

/// Takes the key file again whenever it changes, so keys rotate without a restart (the file's
/// lines: the first signs, every one verifies). A file that does not parse keeps the keys in use.
async fn watch_key(
    handle: Arc<GossipHandle>,
    path: PathBuf,
    mut last: Vec<u8>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(KEY_CHECK_EVERY) => {}
        }
        let Ok(text) = tokio::fs::read(&path).await else {
            continue;
        };
        if text == last {
            continue;
        }
        match ClusterKey::parse(&path, &text) {
            Ok(key) => {
                tracing::info!(path = %path.display(), "gossip: the key file changed; using its keys");
                handle.set_key(key);
            }
            Err(err) => {
                tracing::warn!(%err, "gossip: the key file changed but cannot be used; keeping the keys in use")
            }
        }
        last = text;
    }
}

async fn offer_views(
    handle: Arc<GossipHandle>,
    (local, pins): (Arc<LocalAgent>, Arc<McpPins>),
    inbound: String,
    (store, tls): (Arc<ConfigStore>, Option<Arc<MeshTls>>),
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(OFFER_EVERY);
    let mut not_served: std::collections::BTreeSet<String> = Default::default();
    let mut pins_offered = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let view = local.self_view();
        let snapshot = store.snapshot();
        // The node ignores a profile equal to the last one.
        // Read each time: a rotation may change the identity, a reload the mode. With mTLS
        // disabled this sidecar takes no TLS, so it announces none (callers speak plaintext).
        let identity = tls
            .as_ref()
            .filter(|_| snapshot.mtls_mode() != crate::config::MtlsMode::Disabled)
            .map(|t| t.identity());
        let mut profile = peers::profile(&view, inbound.clone(), identity);
        // A capability `served_by` does not let this sidecar serve is not announced: callers
        // would refuse the claim anyway (docs/security.md).
        let authz = &snapshot.policy.authorization;
        let refused: std::collections::BTreeSet<String> = profile
            .capabilities
            .iter()
            .filter(|c| !authz.may_serve(&c.name, profile.identity.as_ref()))
            .map(|c| c.name.clone())
            .collect();
        for name in refused.difference(&not_served) {
            tracing::warn!(
                capability = name.as_str(),
                identity = profile.identity.as_ref().map_or("none", |i| i.as_str()),
                "this sidecar's identity is not in the capability's served_by: not serving it"
            );
        }
        profile.capabilities.retain(|c| !refused.contains(&c.name));
        not_served = refused;
        handle.publish_profile(profile);
        handle.publish_live(peers::live(&view));
        // The fleet adopts this sidecar's pins (`docs/mcp.md`): offered when one was settled.
        let generation = pins.generation();
        if pins_offered != Some(generation) {
            pins_offered = Some(generation);
            handle.publish_pins(pins.published());
        }
    }
}

/// Resolves the seeds and asks to join through them: every `every`, and each second while this
/// node knows no member — also when it is left alone later (its only peer restarted), not only
/// at start. Between resolutions the node itself asks a seed that left or died whether it is
/// back (`gossip/node/returns.rs`).
async fn resolve_seeds(
    handle: Arc<GossipHandle>,
    seeds: Vec<HostPort>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut resolved_at: Option<tokio::time::Instant> = None;
    loop {
        let due = resolved_at.is_none_or(|at| at.elapsed() >= every) || handle.swim_members() == 0;
        if due {
            resolved_at = Some(tokio::time::Instant::now());
            let mut addrs = Vec::new();
            for seed in &seeds {
                match tokio::time::timeout(
                    Duration::from_secs(2),
                    tokio::net::lookup_host(seed.as_str()),
                )
                .await
                {
                    Ok(Ok(found)) => addrs.extend(found),
                    Ok(Err(err)) => {
                        tracing::warn!(seed = %seed, %err, "cannot resolve gossip seed")
                    }
                    Err(_) => tracing::warn!(seed = %seed, "resolving gossip seed timed out"),
                }
            }
            handle.announce(addrs);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(JOIN_RETRY) => {}
        }
    }
}

/// The IP peers reach this sidecar at: configured, else the listen IP if specific, else the IP
/// the host name resolves to (a pod's own IP in Kubernetes), else loopback.
async fn advertise_ip(config: &GossipConfig) -> IpAddr {
    if let Some(ip) = config.advertise {
        return ip;
    }
    if !config.listen.ip().is_unspecified() {
        return config.listen.ip();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    if !host.is_empty() {
        if let Ok(Ok(found)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::lookup_host((host.as_str(), 0)),
        )
        .await
        {
            let ips: Vec<IpAddr> = found.map(|a| a.ip()).collect();
            if let Some(ip) = ips.iter().find(|ip| !ip.is_loopback()).or(ips.first()) {
                return *ip;
            }
        }
    }
    tracing::warn!(
        "gossip: cannot tell this host's IP; advertising 127.0.0.1 (set gossip.advertise)"
    );
    IpAddr::from([127, 0, 0, 1])
}
