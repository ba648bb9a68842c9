//! Self-views of static peers (configured by address, not found by gossip): each caller polls
//! their `GET /reach/v1/self`.

use std::sync::Arc;
use std::time::Duration;

use http::Request;
use http_body_util::{BodyExt, Limited};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::PeerViews;
use crate::config::ConfigStore;
use crate::config::MtlsMode;
use crate::http::body;
use crate::http::pool::{forward, Named, Pool};
use crate::local::{SelfView, SELF_PATH};
use crate::registry::{Peer, Registry};

/// Polls every known peer's self-view; a peer whose sidecar cannot be reached counts a failure.
pub(crate) fn spawn_poller(
    store: Arc<ConfigStore>,
    registry: Arc<Registry>,
    views: Arc<PeerViews>,
    client: Pool,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let snapshot = store.snapshot();
            // Never a busy loop, whatever the policy says.
            let interval = snapshot
                .policy
                .peer_views
                .poll_interval
                .get()
                .max(Duration::from_millis(20));
            // A static peer or target removed by a reload leaves the views with it (gossip
            // members are forgotten as they leave).
            views.retain(&registry.names(&snapshot));
            // Plain services (external targets) have no self-view to read; gossip members
            // publish theirs.
            let peers: Vec<_> = registry
                .peers(&snapshot)
                .into_iter()
                .filter(|p| p.source == "static")
                .collect();
            let mut polls = tokio::task::JoinSet::new();
            for peer in peers {
                let (client, views) = (client.clone(), views.clone());
                let mode = snapshot.mtls_mode();
                polls.spawn(async move {
                    match fetch(
                        &client,
                        &peer,
                        mode,
                        interval.max(Duration::from_millis(200)),
                    )
                    .await
                    {
                        Ok(remote) => views.set_remote(&peer, remote),
                        Err(Fetch::Unreachable) => views.unreachable(&peer),
                        Err(Fetch::Unreadable) => {}
                    }
                });
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = async { while polls.join_next().await.is_some() {} } => {}
            }
            // Gauges once per poll, not per request: the hot path stays free of metric updates.
            views.publish(&snapshot);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    })
}

/// The largest self-view body read from a peer.
const MAX_SELF_VIEW_BYTES: usize = 256 * 1024;

enum Fetch {
    /// The peer's sidecar could not be reached: evidence against it.
    Unreachable,
    /// It answered but not with a self-view (an older sidecar, a plain service): no evidence.
    Unreadable,
}

async fn fetch(
    client: &Pool,
    peer: &Peer,
    mode: MtlsMode,
    timeout: Duration,
) -> Result<SelfView, Fetch> {
    let identity = peer.dial_identity(mode);
    let request = Request::get(SELF_PATH)
        .body(body::empty())
        .map_err(|_| Fetch::Unreadable)?;
    let target = Named(|f: &mut std::fmt::Formatter<'_>| write!(f, "peer {}", peer.address));
    let response = forward(
        client,
        request,
        &peer.address,
        identity.as_ref(),
        &target,
        timeout,
    )
    .await
    .map_err(|_| Fetch::Unreachable)?;
    if !response.status().is_success() {
        return Err(Fetch::Unreadable);
    }
    // A self-view is a few KiB; a peer (or whatever answers at its address) cannot make us
    // buffer more.
    let body = Limited::new(response.into_body(), MAX_SELF_VIEW_BYTES);
    let bytes = tokio::time::timeout(timeout, body.collect())
        .await
        .map_err(|_| Fetch::Unreadable)?
        .map_err(|_| Fetch::Unreadable)?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|_| Fetch::Unreadable)
}
