//! A gossip node's membership as `/status` lists it.

use std::net::SocketAddr;

use serde::Serialize;
use tokio::time::Instant;

use super::table::Table;
use super::wire::NodeId;
use crate::reach::State;

/// Gossip as `/status` shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GossipStatus {
    pub node: Option<NodeId>,
    /// Members SWIM counts alive, profile known or not.
    pub(crate) swim_members: usize,
    pub alive: usize,
    pub suspect: usize,
    pub down: usize,
    pub members: Vec<MemberStatus>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    pub name: String,
    pub gossip: SocketAddr,
    pub epoch: u64,
    /// `alive`, `suspect`, `down`, or `unknown` (heard of, not yet seen by SWIM).
    pub liveness: &'static str,
    /// Seconds since this node last heard something new from the member.
    pub last_seen_s: f64,
    pub(crate) version: Option<String>,
    pub(crate) inbound: Option<String>,
    pub(crate) state: Option<State>,
    pub profile_seq: Option<u64>,
    pub live_seq: Option<u64>,
    /// The `seq` of its MCP tool pins, when it published any (`docs/mcp.md`).
    pub pins_seq: Option<u64>,
}

impl GossipStatus {
    /// Built when asked (`/status`, `/metrics`), never on a timer: a list of thousands of
    /// members every half second was most of a large fleet's gossip work.
    pub(super) fn of(table: &Table, now: Instant) -> Self {
        let mut members: Vec<MemberStatus> = table
            .entries()
            .map(|(name, e)| {
                // An alive member and one SWIM has not listed read alike: it is alive if bound
                // to an active identity.
                let liveness = match table.swim.not_alive.get(&e.node) {
                    Some(foca::State::Suspect) => "suspect",
                    Some(foca::State::Down) => "down",
                    _ if e.down_since.is_some() => "down",
                    _ if table.is_active(&e.node) => "alive",
                    _ => "unknown",
                };
                MemberStatus {
                    name: name.clone(),
                    gossip: e.node.addr,
                    epoch: e.node.epoch,
                    liveness,
                    last_seen_s: now.saturating_duration_since(e.last_heard).as_secs_f64(),
                    version: e.profile.as_ref().map(|(_, p)| p.version.clone()),
                    inbound: e.profile.as_ref().map(|(_, p)| p.inbound.clone()),
                    state: e.live.as_ref().map(|(_, l)| l.state.into()),
                    profile_seq: e.profile.as_ref().map(|(s, _)| *s),
                    live_seq: e.live.as_ref().map(|(s, _)| *s),
                    pins_seq: e.pins.as_ref().map(|(s, _)| *s),
                }
            })
            .collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        let count = |l: &str| members.iter().filter(|m| m.liveness == l).count();
        Self {
            node: Some(table.my_node().clone()),
            swim_members: table.swim.members,
            alive: count("alive"),
            suspect: count("suspect"),
            down: count("down"),
            members,
        }
    }
}
