//! Repairs what a lossy network and a large fleet's join storm leave out: a member whose items
//! never arrived is asked for them, and a node others relay for but SWIM never told this node of
//! is met directly (`docs/gossip.md`, "Timings").

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Node;
use crate::gossip::envelope::Kind;
use crate::gossip::wire::{self, NodeId};

/// How often members alive in SWIM but never introduced are asked for their items: a lost
/// introduction is otherwise repaired only by the member's next refresh, which a large fleet
/// slows to tens of seconds (`refresh_interval`).
const INTRODUCTIONS_CHECK: Duration = Duration::from_secs(5);

/// A member is asked for its profile at most this often.
const WANT_EVERY: Duration = Duration::from_secs(1);

/// A stranger (a node relayed for, unknown to SWIM here) is announced to at most this often:
/// once it answers it is a member; until then its items keep showing it.
const MEET_EVERY: Duration = Duration::from_secs(10);

impl Node {
    /// Asks these members (`want`) for their items, each at most once per `WANT_EVERY`.
    pub(super) fn ask_for_items(&mut self, wants: Vec<NodeId>, now: Instant) {
        for node in wants {
            if not_since(&mut self.wanted, &node, now, WANT_EVERY) {
                if let Ok(me) = wire::encode_want(self.foca.identity()) {
                    self.send(node.addr, Kind::Want, &me);
                }
            }
        }
    }

    /// Every half second: finds the members never introduced (every `INTRODUCTIONS_CHECK`) and
    /// forgets old asks and meetings.
    pub(super) fn repair_housekeeping(&mut self, now: Instant) {
        if self
            .introductions_checked_at
            .is_none_or(|at| now.saturating_duration_since(at) >= INTRODUCTIONS_CHECK)
        {
            self.introductions_checked_at = Some(now);
            self.handler.lock().want_unintroduced();
        }
        self.wanted
            .retain(|_, at| now.saturating_duration_since(*at) < WANT_EVERY * 10);
        self.met
            .retain(|_, at| now.saturating_duration_since(*at) < MEET_EVERY);
    }

    /// Announces this node to the nodes others relay for but SWIM does not count alive here.
    /// The answer makes each a member of the other: a membership update this node missed is
    /// repaired, and after a partition whichever side holds the other as down says so, so that
    /// side rejoins under a new identity.
    pub(super) fn meet_strangers(&mut self) {
        let strangers = std::mem::take(&mut self.handler.lock().strangers);
        let now = Instant::now();
        for node in strangers {
            if not_since(&mut self.met, &node, now, MEET_EVERY) {
                let _ = self.foca.announce(node, &mut self.runtime);
            }
        }
    }
}

/// Whether `node` was not acted on in the last `every` (by `last`); if so, notes it as now.
fn not_since(
    last: &mut HashMap<NodeId, Instant>,
    node: &NodeId,
    now: Instant,
    every: Duration,
) -> bool {
    let recently = last
        .get(node)
        .is_some_and(|at| now.saturating_duration_since(*at) < every);
    if !recently {
        last.insert(node.clone(), now);
    }
    !recently
}
