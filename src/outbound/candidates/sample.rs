//! Which candidates a request scores. Scoring is the routing decision's cost (each candidate's
//! view is brought up to date and joined with the peer's own), so among many peers a request
//! scores a uniform sample and the pick chooses within it — the "power of d choices" the pick
//! already is, with d = [`SAMPLE`] instead of the whole fleet. Cost stays flat as the fleet grows;
//! a peer's share still follows its cap, since the pick draws by cap within the sample.

use std::sync::Arc;

use crate::config::Snapshot;
use crate::peers::{PeerViews, RouteRequest, Scored};
use crate::registry::Registry;

/// Candidates scored per request when there are more. Large enough that the nearest zone is
/// usually in the sample and a retry has somewhere else to go.
pub(crate) const SAMPLE: usize = 8;

/// The scored candidates for `request` (empty: no peer serves the capability). When nobody in
/// the sample can take the call, everyone is scored, so a sample never turns into a false
/// `no_available_instance`.
pub fn score_candidates(
    registry: &Registry,
    views: &PeerViews,
    snapshot: &Arc<Snapshot>,
    request: &RouteRequest,
    mut random: impl FnMut(usize) -> usize,
) -> Vec<Scored> {
    let (sample, total) =
        registry.sample_candidates(snapshot, &request.capability, SAMPLE, &mut random);
    let scored = views.score(snapshot, &sample, request);
    let usable = |s: &Scored| s.excluded.is_none() && s.cap > 0.0;
    if total > sample.len() && !scored.iter().any(usable) {
        let everyone = registry.candidates(snapshot, &request.capability);
        return views.score(snapshot, &everyone, request);
    }
    scored
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use super::*;
    use crate::config::{Bootstrap, ConfigPaths, ConfigStore, Policy};
    use crate::metrics::Metrics;
    use crate::outbound::pick;
    use crate::reach::Signal;

    fn fleet(n: usize) -> (Arc<ConfigStore>, PeerViews, Registry) {
        let mut b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..n {
            let addr = SocketAddr::from(([10, 0, 0, i as u8 + 1], 4143));
            b = b
                .with_peer(&format!("agent-{i}"), addr, &["review"])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let store = Arc::new(ConfigStore::new(
            b,
            Policy::default(),
            ConfigPaths::default(),
        ));
        let views = PeerViews::new(store.clone(), Arc::new(Metrics::new("test")));
        (store, views, Registry::new())
    }

    fn lcg(seed: u64) -> impl FnMut(usize) -> usize {
        let mut x = seed;
        move |n| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % n as u64) as usize
        }
    }

    fn request() -> RouteRequest {
        RouteRequest {
            capability: "review".to_owned(),
            ..RouteRequest::default()
        }
    }

    #[test]
    fn a_large_fleet_scores_a_sample_and_a_small_one_everyone() {
        let (store, views, registry) = fleet(40);
        let snapshot = store.snapshot();
        let scored = score_candidates(&registry, &views, &snapshot, &request(), lcg(1));
        assert_eq!(scored.len(), SAMPLE);
        let mut names: Vec<&str> = scored.iter().map(|s| s.peer.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SAMPLE, "drawn without replacement");
        let (store, views, registry) = fleet(SAMPLE);
        let scored = score_candidates(&registry, &views, &store.snapshot(), &request(), lcg(1));
        assert_eq!(scored.len(), SAMPLE);
    }

    #[test]
    fn the_one_peer_that_can_take_the_call_is_found_even_when_the_sample_misses_it() {
        let (store, views, registry) = fleet(40);
        let snapshot = store.snapshot();
        let everyone = registry.candidates(&snapshot, "review");
        for peer in everyone.iter().filter(|p| p.name != "agent-17") {
            for _ in 0..20 {
                views.observe(peer, Signal::Failure(Duration::from_millis(1)));
            }
        }
        let mut random = lcg(7);
        for _ in 0..50 {
            let scored = score_candidates(&registry, &views, &snapshot, &request(), &mut random);
            let chosen = pick(&scored, &[], || 0.5).map(|i| scored[i].peer.name.clone());
            assert_eq!(chosen.as_deref(), Some("agent-17"));
        }
    }
}
