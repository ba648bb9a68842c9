//! The glue between gossip and routing: members become peers in the registry, their live views
//! feed this caller's peer views, their MCP tool pins this caller's (`FleetPins`); and this
//! agent's own profile and view become gossip items.

use crate::identity::SpiffeId;
use std::sync::Arc;

use crate::budget::{Figure, PublishedBudget};
use crate::config::Snapshot;
use crate::gossip::{milli, unmilli, Capability as WireCapability, LiveBudget};
use crate::gossip::{Live, Member, Membership, Profile};
use crate::local::{PublishedCapability, SelfView};
use crate::reach::{EstimateSnapshot, QualityMark, ViewSnapshot};
use crate::registry::{Peer, Registry};

use super::PeerViews;

/// Where the members' MCP tool pins go: the caller's pins (`src/outbound/mcp/pins.rs`), which
/// routing owns and this module cannot name (routing imports it).
pub(crate) trait FleetPins: Send + Sync + std::fmt::Debug {
    /// Every routable member with the pins it publishes, after any change.
    fn set_fleet(&self, members: &[Member]);
}

/// Hands what gossip learns to the registry, the peer views and the MCP tool pins.
#[derive(Debug)]
pub(crate) struct GossipFeed {
    pub(crate) registry: Arc<Registry>,
    pub(crate) views: Arc<PeerViews>,
    pub(crate) store: Arc<crate::config::ConfigStore>,
    pub(crate) pins: Arc<dyn FleetPins>,
}

impl Membership for GossipFeed {
    fn members(&self, members: &[Member]) {
        // Before the servers become routable: a tool first settled with them settles by the
        // fleet's pin, not by how many of them announce another definition.
        self.pins.set_fleet(members);
        let peers: Vec<Peer> = members.iter().map(Peer::from_member).collect();
        // What gossip says may be called is counted from 0 before its first call.
        let snapshot = self.store.snapshot();
        let metrics = self.views.metrics();
        // Bounded: past `metrics.max_capabilities` claimed names count under `other`, and a
        // claim gone for `metrics.idle_timeout` is forgotten with its series.
        let limits = &snapshot.policy.metrics;
        metrics.claims(
            peers
                .iter()
                .flat_map(|p| &p.capabilities)
                .map(String::as_str),
            |c| snapshot.observe_only(c),
            (limits.max_capabilities, limits.idle_timeout.get()),
        );
        // A member restarted in place (same name, same address, a new gossip epoch) is a new
        // process: this caller's view of the old one (ejected while it was down, draining) is
        // dropped before the new one becomes a candidate.
        for (peer, member) in peers.iter().zip(members) {
            self.views.bind_incarnation(peer, member.node.epoch);
        }
        self.registry.set_gossip(peers);
        for claim in self.registry.newly_refused(&snapshot) {
            metrics.claim_refused("serve", &claim.capability);
            tracing::warn!(
                capability = claim.capability.as_str(),
                peer = claim.peer.as_str(),
                identity = claim.identity.as_deref().unwrap_or("none proven"),
                "a member claims a capability the policy's served_by does not let it serve: not routed to it"
            );
        }
        // Forget the views of peers that left: a dead member's history must not linger.
        let names = self.registry.names(&snapshot);
        self.views.retain(&names);
    }

    fn live(&self, member: &Member, live: &Live) {
        let peer = self
            .registry
            .gossip_peer(&member.name)
            .filter(|p| p.address == member.profile.inbound)
            .unwrap_or_else(|| Arc::new(Peer::from_member(member)));
        self.views
            .set_member_view(&peer, member.node.epoch, self_view(member, live));
    }
}

/// A member's profile and live view in the shape the caller's model reads.
pub(crate) fn self_view(member: &Member, live: &Live) -> SelfView {
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
                tools: c.tools.clone(),
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
        budget: live.budget.iter().map(published_budget).collect(),
    }
}

/// This agent's profile as gossip carries it; `inbound` is where peers reach its sidecar.
pub(crate) fn profile(view: &SelfView, inbound: String, identity: Option<SpiffeId>) -> Profile {
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
                tools: c.tools.clone(),
            })
            .collect(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// This agent's live view as gossip carries it.
pub(crate) fn live(view: &SelfView) -> Live {
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
        budget: view.budget.iter().map(live_budget).collect(),
    }
}

/// A model budget as gossip carries it: thousandths and milliseconds.
fn live_budget(b: &PublishedBudget) -> LiveBudget {
    let ms = |s: f64| (crate::budget::seconds(s) * 1000.0) as u32;
    LiveBudget {
        group: b.group.clone(),
        headroom_milli: b.figure.map(|f| milli(f.headroom)),
        reset_ms: b.figure.map_or(0, |f| ms(f.reset_in_s)),
        age_ms: b.figure.map_or(0, |f| ms(f.age_s)),
        credential: b.credential,
    }
}

/// A model budget as gossip delivered it.
fn published_budget(b: &LiveBudget) -> PublishedBudget {
    PublishedBudget {
        group: b.group.clone(),
        figure: b.headroom_milli.map(|h| Figure {
            headroom: unmilli(h),
            reset_in_s: f64::from(b.reset_ms) / 1000.0,
            age_s: f64::from(b.age_ms) / 1000.0,
        }),
        credential: b.credential,
    }
}

/// How long a polled self-view stays trusted (gossip members' views live as long as they do).
pub(crate) fn self_view_lifetime(snapshot: &Snapshot) -> std::time::Duration {
    snapshot.policy.peer_views.poll_interval.get() * super::SELF_VIEW_LIFETIME_POLLS
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use super::*;
    use crate::config::{Bootstrap, ConfigPaths, ConfigStore, Policy, RouteMode};
    use crate::gossip::NodeId;
    use crate::metrics::Metrics;
    use crate::reach::{Signal, State};

    const NAME: &str = "agent-b";

    fn feed() -> GossipFeed {
        let b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap_or_else(|e| panic!("{e}"));
        let store = Arc::new(ConfigStore::new(
            b,
            Policy::default(),
            ConfigPaths::default(),
        ));
        let views = Arc::new(PeerViews::new(
            store.clone(),
            Arc::new(Metrics::new("test")),
        ));
        GossipFeed {
            registry: Arc::new(Registry::new()),
            views,
            store,
            pins: Arc::new(NoPins),
        }
    }

    #[derive(Debug)]
    struct NoPins;

    impl FleetPins for NoPins {
        fn set_fleet(&self, _: &[Member]) {}
    }

    /// agent-b as gossip has it, incarnation `epoch`, always at the same addresses.
    fn member(epoch: u64) -> Member {
        Member {
            name: NAME.into(),
            node: NodeId {
                addr: SocketAddr::from(([10, 0, 0, 2], 4190)),
                epoch,
            },
            profile: Arc::new(Profile {
                inbound: "10.0.0.2:4143".into(),
                zone: String::new(),
                region: String::new(),
                max_concurrency: 4,
                capabilities: vec![WireCapability {
                    name: "review".into(),
                    tags: Default::default(),
                    timeout_ms: 30_000,
                    mode: RouteMode::Sync,
                    cost_milli: 0,
                    idempotent: false,
                    output_schema: None,
                    a2a: None,
                    tools: Vec::new(),
                }],
                version: "test".into(),
                identity: None,
            }),
            pins: Arc::default(),
        }
    }

    fn own_view(state: State) -> Live {
        Live {
            profile_seq: 1,
            state,
            state_age_s: 0,
            cap: 1000,
            availability: 1000,
            saturation: 0,
            saturation_predicted: 0,
            quality_milli: None,
            degraded: false,
            budget: Vec::new(),
            latency_ms: Some(20),
            p50_ms: None,
            p95_ms: None,
            busy: false,
            cooling_down: false,
            in_flight: 0,
            queued: 0,
        }
    }

    /// This caller's view of agent-b: its state and the outcomes it counted.
    fn view_of(feed: &GossipFeed) -> Option<(State, u64)> {
        feed.views
            .status(&feed.store.snapshot())
            .into_iter()
            .find(|p| p.name == NAME)
            .map(|p| (p.view.state, p.outcomes.failure))
    }

    fn peer(feed: &GossipFeed) -> Arc<Peer> {
        feed.registry
            .gossip_peer(NAME)
            .unwrap_or_else(|| panic!("{NAME} is routable"))
    }

    /// A member's model headroom cuts its share and scores like saturation; at 0 it is passed
    /// over until the reset, and whole again at the reset with nothing new heard.
    #[tokio::test(start_paused = true)]
    async fn a_members_model_headroom_cuts_its_share_none_at_zero_whole_at_the_reset() {
        let feed = feed();
        feed.members(&[member(1)]);
        let with_budget = |milli: u16| Live {
            budget: vec![LiveBudget {
                group: None,
                headroom_milli: Some(milli),
                reset_ms: 30_000,
                age_ms: 0,
                credential: None,
            }],
            ..own_view(State::Healthy)
        };
        let request = crate::peers::RouteRequest {
            capability: "review".into(),
            ..Default::default()
        };
        let score = |feed: &GossipFeed| {
            let snapshot = feed.store.snapshot();
            let mut scored = feed.views.score(&snapshot, &[peer(feed)], &request);
            scored.pop().unwrap_or_else(|| panic!("one candidate"))
        };
        feed.live(&member(1), &own_view(State::Healthy));
        let whole = score(&feed);
        assert_eq!(whole.cap, 1.0);
        feed.live(&member(1), &with_budget(300));
        let cut = score(&feed);
        assert!((cut.cap - 0.3).abs() < 1e-9, "{}", cut.cap);
        assert!(cut.factors.score < whole.factors.score);
        assert_eq!(cut.excluded, None);
        feed.live(&member(1), &with_budget(0));
        let spent = score(&feed);
        assert!(
            spent
                .excluded
                .as_deref()
                .is_some_and(|e| e.starts_with("budget-limited")),
            "{:?}",
            spent.excluded
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        let back = score(&feed);
        assert_eq!((back.cap, back.excluded), (1.0, None));
    }

    /// A member killed and restarted in place (same name, same inbound and gossip
    /// addresses, a new epoch) is not held back by what this caller saw of the old process: the
    /// calls that failed while it was down ejected the old one, not the new one.
    #[tokio::test]
    async fn a_gossip_member_restarted_in_place_is_not_held_to_the_old_ones_ejection() {
        let feed = feed();
        feed.members(&[member(1)]);
        feed.live(&member(1), &own_view(State::Healthy));
        let old = peer(&feed);
        for _ in 0..10 {
            feed.views
                .observe(&old, Signal::Failure(Duration::from_millis(1)));
        }
        assert_eq!(view_of(&feed).map(|v| v.0), Some(State::Ejected));

        // A late view of the old incarnation changes nothing once the new one is bound.
        feed.members(&[member(2)]);
        assert_eq!(view_of(&feed), Some((State::Parole, 0)), "started afresh");
        feed.live(&member(1), &own_view(State::Draining));
        feed.live(&member(2), &own_view(State::Healthy));
        assert_eq!(view_of(&feed), Some((State::Healthy, 0)));
        // The same incarnation delivered again keeps what this caller saw of it.
        feed.views
            .observe(&peer(&feed), Signal::Failure(Duration::from_millis(1)));
        feed.members(&[member(2)]);
        assert_eq!(view_of(&feed), Some((State::Healthy, 1)));
    }

    /// The old incarnation drained (its own view `draining`, so this caller's too) and
    /// the new one's first live view comes with it still bound: the new one is routable.
    #[tokio::test]
    async fn a_gossip_member_restarted_after_draining_is_not_shadowed_by_the_drain() {
        let feed = feed();
        feed.members(&[member(1)]);
        feed.live(&member(1), &own_view(State::Draining));
        assert_eq!(view_of(&feed).map(|v| v.0), Some(State::Draining));
        // The new incarnation's view before its membership is handed over (the node hands both
        // in one go, but the view alone must not land in the old one's entry either).
        feed.live(&member(2), &own_view(State::Parole));
        assert_eq!(view_of(&feed), Some((State::Parole, 0)));
        feed.members(&[member(2)]);
        assert_eq!(view_of(&feed), Some((State::Parole, 0)));
    }

    /// An in-flight call: an attempt begun on the old incarnation that ends after
    /// the restart says nothing about the new one, and is not counted in its in-flight calls.
    #[tokio::test]
    async fn a_gossip_members_old_incarnation_calls_ending_late_do_not_count_against_the_new() {
        let feed = feed();
        feed.members(&[member(1)]);
        let old = peer(&feed);
        let snapshot = feed.store.snapshot();
        let in_flight: Vec<_> = (0..5)
            .map(|_| feed.views.begin(&old, None, tokio::time::Instant::now()))
            .collect();
        feed.members(&[member(2)]);
        for attempt in in_flight {
            attempt.finish(
                Signal::Failure(Duration::from_millis(1)),
                &snapshot,
                tokio::time::Instant::now(),
            );
        }
        assert_eq!(view_of(&feed), Some((State::Parole, 0)));
        let scored = feed.views.score(
            &snapshot,
            &[peer(&feed)],
            &crate::peers::RouteRequest {
                capability: "review".into(),
                ..Default::default()
            },
        );
        assert_eq!(scored.first().map(|s| s.pending), Some(0));
        assert!(
            scored.first().is_some_and(|s| s.excluded.is_none()),
            "{scored:?}"
        );
    }
}
