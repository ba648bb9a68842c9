//! The glue between gossip and routing: members become peers in the registry, their live views
//! feed this caller's peer views; and this agent's own profile and view become gossip items.

use crate::identity::SpiffeId;
use std::sync::Arc;

use crate::config::Snapshot;
use crate::gossip::{milli, unmilli, Capability as WireCapability};
use crate::gossip::{Live, Member, Membership, Profile};
use crate::local::{PublishedCapability, SelfView};
use crate::reach::{EstimateSnapshot, QualityMark, ViewSnapshot};
use crate::registry::{Peer, Registry};

use super::PeerViews;

/// Hands what gossip learns to the registry and the peer views.
#[derive(Debug)]
pub struct GossipFeed {
    pub registry: Arc<Registry>,
    pub views: Arc<PeerViews>,
    pub store: Arc<crate::config::ConfigStore>,
}

impl Membership for GossipFeed {
    fn members(&self, members: &[Member]) {
        self.registry
            .set_gossip(members.iter().map(Peer::from_member).collect());
        // Forget the views of peers that left: a dead member's history must not linger.
        let names = self.registry.names(&self.store.snapshot());
        self.views.retain(&names);
    }

    fn live(&self, member: &Member, live: &Live) {
        let peer = self
            .registry
            .gossip_peer(&member.name)
            .unwrap_or_else(|| Arc::new(Peer::from_member(member)));
        self.views.set_remote(&peer, self_view(member, live));
    }
}

/// A member's profile and live view in the shape the caller's model reads.
pub fn self_view(member: &Member, live: &Live) -> SelfView {
    let p = &member.profile;
    SelfView {
        name: member.name.clone(),
        zone: p.zone.clone(),
        region: p.region.clone(),
        max_concurrency: (p.max_concurrency as usize).max(1),
        capabilities: p
            .capabilities
            .iter()
            .map(|c| PublishedCapability {
                name: c.name.clone(),
                tags: c
                    .tags
                    .iter()
                    .map(|(k, v)| (k.clone(), unmilli(*v)))
                    .collect(),
                timeout_ms: c.timeout_ms,
                mode: c.mode,
                cost: f64::from(c.cost_milli) / 1000.0,
                idempotent: c.idempotent,
                output_schema: c.output_schema,
                a2a: c.a2a.clone(),
            })
            .collect(),
        view: ViewSnapshot {
            state: live.state,
            cap: unmilli(live.cap),
            state_age_s: f64::from(live.state_age_s),
            estimates: EstimateSnapshot {
                availability: unmilli(live.availability),
                latency_ms: live.latency_ms.map(f64::from),
                p50_ms: live.p50_ms.map(f64::from),
                p95_ms: live.p95_ms.map(f64::from),
                saturation: unmilli(live.saturation),
                saturation_predicted: unmilli(live.saturation_predicted),
                busy: live.busy,
                cooling_down: live.cooling_down,
                age_s: None,
                stale: false,
            },
            quality: live.quality_milli.map(|q| QualityMark {
                similarity: unmilli(q),
                degraded: live.degraded,
            }),
        },
        in_flight: live.in_flight as usize,
        queued: live.queued as usize,
        last_probe: None,
    }
}

/// This agent's profile as gossip carries it; `inbound` is where peers reach its sidecar.
pub fn profile(view: &SelfView, inbound: String, identity: Option<SpiffeId>) -> Profile {
    Profile {
        identity,
        inbound,
        zone: view.zone.clone(),
        region: view.region.clone(),
        max_concurrency: u32::try_from(view.max_concurrency).unwrap_or(u32::MAX),
        capabilities: view
            .capabilities
            .iter()
            .map(|c| WireCapability {
                name: c.name.clone(),
                tags: c.tags.iter().map(|(k, v)| (k.clone(), milli(*v))).collect(),
                timeout_ms: c.timeout_ms,
                mode: c.mode,
                cost_milli: (c.cost.max(0.0) * 1000.0).min(f64::from(u32::MAX)) as u32,
                idempotent: c.idempotent,
                output_schema: c.output_schema,
                a2a: c.a2a.clone(),
            })
            .collect(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// This agent's live view as gossip carries it.
pub fn live(view: &SelfView) -> Live {
    let e = &view.view.estimates;
    let ms = |x: Option<f64>| x.map(|v| v.clamp(0.0, f64::from(u32::MAX)) as u32);
    Live {
        profile_seq: 0,
        state: view.view.state,
        state_age_s: view.view.state_age_s.clamp(0.0, f64::from(u32::MAX)) as u32,
        cap: milli(view.view.cap),
        availability: milli(e.availability),
        saturation: milli(e.saturation),
        saturation_predicted: milli(e.saturation_predicted),
        quality_milli: view.view.quality.map(|q| milli(q.similarity)),
        degraded: view.view.quality.is_some_and(|q| q.degraded),
        latency_ms: ms(e.latency_ms),
        p50_ms: ms(e.p50_ms),
        p95_ms: ms(e.p95_ms),
        busy: e.busy,
        cooling_down: e.cooling_down,
        in_flight: u32::try_from(view.in_flight).unwrap_or(u32::MAX),
        queued: u32::try_from(view.queued).unwrap_or(u32::MAX),
    }
}

/// How long a polled self-view stays trusted (gossip members' views live as long as they do).
pub fn self_view_lifetime(snapshot: &Snapshot) -> std::time::Duration {
    snapshot.policy.peer_views.poll_interval.get() * super::SELF_VIEW_LIFETIME_POLLS
}
