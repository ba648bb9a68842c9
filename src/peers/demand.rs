//! The fleet's demand against its capacity, per capability: the signal an autoscaler reads
//! (`reach_capability_demand_ratio`, `docs/kubernetes.md` "Scaling on demand").
//!
//! Why from the gossip view and not from each pod's own load: a pod's saturation says whether
//! *it* is full, not whether the fleet needs another replica (routing evens the load out, so one
//! full pod with idle neighbours is a routing matter, and all of them at 90% is a capacity one).
//! Every sidecar holds every member's profile and live figures, so every sidecar computes the
//! same fleet-wide figure and any one pod's scrape is enough.
//!
//! What counts:
//! - demand: calls in flight and queued at every agent serving the capability, whatever its
//!   state. The work is there and its callers wait for it; dropping an ejected or draining
//!   agent's calls would make the ratio fall exactly when capacity is lost.
//! - capacity: `max_concurrency` of the serving agents in rotation (every state but ejected and
//!   draining). A new replica counts from its first gossip, in parole: otherwise an autoscaler
//!   would keep adding replicas while the last ones prove themselves.
//! - an agent serving several capabilities counts its whole load and all its slots towards each:
//!   its slots are shared and gossip carries no per-capability split.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::local::SelfView;
use crate::reach::State;

/// One capability's figures across the fleet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CapabilityDemand {
    pub name: String,
    /// Calls in flight and queued at the agents serving it.
    pub(crate) demand: u64,
    /// Concurrency slots of the agents serving it that are in rotation.
    pub capacity: u64,
    /// `demand / capacity`: above 1 calls queue; with no capacity at all, `demand` (as if one
    /// slot were left) so the ratio stays finite and still asks for more.
    pub ratio: f64,
    /// Agents publishing the capability, in rotation or not.
    pub members: usize,
}

/// Folds the agents' self-views (this sidecar's own agent among them) into one entry per
/// capability any of them publishes, in name order.
pub(super) fn fleet_demand<'a>(
    agents: impl IntoIterator<Item = &'a SelfView>,
) -> Vec<CapabilityDemand> {
    let mut by_name: BTreeMap<&str, (u64, u64, usize)> = BTreeMap::new();
    for agent in agents {
        let load = (agent.in_flight as u64).saturating_add(agent.queued as u64);
        let slots = if in_rotation(agent.view.state) {
            agent.max_concurrency as u64
        } else {
            0
        };
        for capability in &agent.capabilities {
            let (demand, capacity, members) = by_name.entry(&capability.name).or_default();
            *demand = demand.saturating_add(load);
            *capacity = capacity.saturating_add(slots);
            *members += 1;
        }
    }
    by_name
        .into_iter()
        .map(|(name, (demand, capacity, members))| CapabilityDemand {
            name: name.to_owned(),
            demand,
            capacity,
            ratio: demand as f64 / capacity.max(1) as f64,
            members,
        })
        .collect()
}

/// Whether an agent in `state` takes new work: its slots are capacity.
fn in_rotation(state: State) -> bool {
    !matches!(state, State::Ejected | State::Draining)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteMode;
    use crate::local::PublishedCapability;
    use crate::reach::{EstimateSnapshot, ViewSnapshot};

    fn agent(
        state: State,
        capabilities: &[&str],
        max_concurrency: usize,
        in_flight: usize,
    ) -> SelfView {
        SelfView {
            name: "a".to_owned(),
            zone: String::new(),
            region: String::new(),
            max_concurrency,
            capabilities: capabilities
                .iter()
                .map(|name| PublishedCapability {
                    name: (*name).to_owned(),
                    tags: BTreeMap::new(),
                    timeout_ms: 1000,
                    mode: RouteMode::Sync,
                    cost: 0.0,
                    idempotent: false,
                    output_schema: None,
                    a2a: None,
                    tools: Vec::new(),
                })
                .collect(),
            view: ViewSnapshot {
                state,
                cap: 1.0,
                state_age_s: 0.0,
                estimates: EstimateSnapshot {
                    availability: 1.0,
                    latency_ms: None,
                    p50_ms: None,
                    p95_ms: None,
                    saturation: 0.0,
                    saturation_predicted: 0.0,
                    busy: false,
                    cooling_down: false,
                    age_s: None,
                    stale: false,
                },
                quality: None,
            },
            in_flight,
            queued: 0,
            last_probe: None,
            budget: Vec::new(),
        }
    }

    #[test]
    fn a_member_claiming_more_than_any_sidecar_can_is_brought_into_range() {
        let mut huge = agent(State::Healthy, &["review"], usize::MAX, usize::MAX);
        huge.queued = usize::MAX;
        crate::peers::sanitize(&mut huge);
        let honest = agent(State::Healthy, &["review"], 8, 4);
        let d = &fleet_demand([&huge, &honest])[0];
        assert_eq!((d.capacity, d.demand), (100_008, 200_004));
    }

    #[test]
    fn demand_and_capacity_sum_over_the_agents_serving_each_capability() {
        let mut queued = agent(State::Healthy, &["review"], 4, 4);
        queued.queued = 2;
        let agents = [
            queued,
            agent(State::Parole, &["review", "summarize"], 8, 1),
            agent(State::Healthy, &[], 16, 9),
        ];
        let fleet = fleet_demand(&agents);
        assert_eq!(
            fleet,
            [
                CapabilityDemand {
                    name: "review".to_owned(),
                    demand: 7,
                    capacity: 12,
                    ratio: 7.0 / 12.0,
                    members: 2,
                },
                CapabilityDemand {
                    name: "summarize".to_owned(),
                    demand: 1,
                    capacity: 8,
                    ratio: 1.0 / 8.0,
                    members: 1,
                },
            ]
        );
    }

    #[test]
    fn an_agent_out_of_rotation_keeps_its_demand_but_not_its_capacity() {
        let agents = [
            agent(State::Healthy, &["review"], 4, 2),
            agent(State::Ejected, &["review"], 4, 1),
            agent(State::Draining, &["review"], 4, 3),
        ];
        let fleet = fleet_demand(&agents);
        assert_eq!((fleet[0].demand, fleet[0].capacity), (6, 4));
        assert_eq!(fleet[0].ratio, 1.5);
        assert_eq!(fleet[0].members, 3);
    }

    #[test]
    fn no_capacity_left_gives_a_finite_ratio_that_still_asks_for_more() {
        let agents = [agent(State::Ejected, &["review"], 4, 3)];
        let fleet = fleet_demand(&agents);
        assert_eq!((fleet[0].capacity, fleet[0].ratio), (0, 3.0));
        let idle = [agent(State::Draining, &["review"], 4, 0)];
        assert_eq!(fleet_demand(&idle)[0].ratio, 0.0);
    }
}
