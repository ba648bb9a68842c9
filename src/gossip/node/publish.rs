//! What this node publishes of its own agent: the profile, sent to each member directly; the
//! live view, offered by the sidecar and gossiped when it moved enough or the refresh is due;
//! and the sidecar's MCP tool pins, gossiped when they changed.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::RngExt;
use tokio::time::Instant;

use super::{Node, MAX_ITEM};
use crate::gossip::envelope::{Kind, OVERHEAD};
use crate::gossip::model;
use crate::gossip::transport::MAX_DATAGRAM;
use crate::gossip::wire::{self, Body, Item, Live, NodeId, Pins, WireError};

/// Even a state change waits this long after the previous publish (a flapping agent must not
/// flood the fleet); it goes out on the next tick.
const MIN_URGENT_GAP: Duration = Duration::from_millis(50);

/// Item transmissions per second each node may spend on periodic refreshes. Every refresh is
/// passed on `max_transmissions` times by every node, so a fleet of N refreshing every T seconds
/// on average costs each node N × max_tx / T of them: past this budget the refresh slows down
/// instead of the backlog growing (changes are still sent at once).
const REFRESH_BUDGET: f64 = 250.0;
/// Each refresh comes after a random fraction of the refresh interval, from this to 1 (mean
/// 0.75). A fleet that started together would otherwise refresh together: at N = 1,000 (a 40 s
/// refresh) each node sent 16, 0.4, 16 and 24 KB/s in four 10 s windows in turn, and a change
/// sent in the wave's crest waited behind it (`docs/gossip.md`, "Measured").
const REFRESH_DRAW_MIN: f64 = 0.5;

/// An item this node published, and when.
pub(super) struct Published {
    pub(super) item: Item,
    pub(super) at: Instant,
}

impl Node {
    pub(super) fn last_live(&self) -> Option<Live> {
        self.latest_live.clone().or_else(|| {
            self.live.as_ref().and_then(|p| match &p.item.body {
                Body::Live(l) => Some(l.clone()),
                Body::Profile(_) | Body::Pins(_) => None,
            })
        })
    }

    /// Takes the agent's current view; publishes it when it moved meaningfully from the last
    /// published one (at once for a state change), else keeps it for the next refresh.
    pub(super) fn offer_live(&mut self, mut live: Live) {
        live.profile_seq = self.profile.as_ref().map_or(0, |p| p.item.seq);
        self.latest_live = Some(live.clone());
        if self.live_due(Instant::now(), false) {
            self.publish_live_now(live);
        }
    }

    /// Whether the latest view should go out now: it moved enough since the last publish
    /// (respecting the publish intervals), or the refresh is due.
    pub(super) fn live_due(&self, now: Instant, refresh_due: bool) -> bool {
        let Some(latest) = &self.latest_live else {
            return false;
        };
        let Some((prev, at)) = self.live.as_ref().and_then(|p| match &p.item.body {
            Body::Live(l) => Some((l, p.at)),
            Body::Profile(_) | Body::Pins(_) => None,
        }) else {
            return true;
        };
        let since = now.saturating_duration_since(at);
        refresh_due
            || (urgent(prev, latest) && since >= MIN_URGENT_GAP)
            || (moved(prev, latest) && since >= self.options.min_publish_interval)
    }

    pub(super) fn publish_live_now(&mut self, mut live: Live) {
        live.profile_seq = self.profile.as_ref().map_or(0, |p| p.item.seq);
        self.latest_live = Some(live.clone());
        self.publish(Body::Live(live));
        self.refresh_draw = self.rng.random_range(REFRESH_DRAW_MIN..=1.0);
    }

    /// Whether the periodic refresh of the live view is due.
    pub(super) fn refresh_due(&self, now: Instant) -> bool {
        let after = self.refresh_interval().mul_f64(self.refresh_draw);
        self.live
            .as_ref()
            .is_some_and(|p| now.saturating_duration_since(p.at) >= after)
    }

    pub(super) fn publish(&mut self, body: Body) {
        self.seq += 1;
        let item = Item {
            name: self.options.name.clone(),
            node: self.foca.identity().clone(),
            seq: self.seq,
            body,
        };
        let Ok(bytes) = self.encode_item(&item) else {
            return;
        };
        if bytes.len() > MAX_ITEM {
            // Peers could never receive it: say so loudly instead of being silently unroutable.
            tracing::error!(
                agent = %self.options.name,
                bytes = bytes.len(),
                max = MAX_ITEM,
                "gossip: this agent's {} is too large to publish; fewer capabilities or tags",
                match item.body {
                    Body::Profile(_) => "profile",
                    Body::Live(_) => "live view",
                    Body::Pins(_) => "pins",
                }
            );
            self.stats.oversized_items.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // A profile and the pins go to each member directly (`send_items_to_members`): receivers
        // take them only from the agent itself, never relayed.
        let relayed = matches!(item.body, Body::Live(_));
        if let Err(err) = relayed.then(|| self.foca.add_broadcast(&bytes)).transpose() {
            tracing::error!(
                ?err,
                bytes = bytes.len(),
                "cannot publish a gossip item (too large?)"
            );
        }
        // The next version also publishes a kind this one does not know, beside its live view.
        if self.options.newer_wire && relayed {
            if let Ok(new_kind) = wire::future::new_kind_item(&item) {
                let _ = self.foca.add_broadcast(&new_kind);
            }
        }
        let published = Some(Published {
            item,
            at: Instant::now(),
        });
        match published.as_ref().map(|p| p.item.kind()) {
            Some(wire::ItemKind::Profile) => self.profile = published,
            Some(wire::ItemKind::Live) => self.live = published,
            Some(wire::ItemKind::Pins) => self.pins = published,
            None => {}
        }
    }

    /// Takes the sidecar's MCP tool pins; publishes them when those that fit an item changed.
    pub(super) fn offer_pins(&mut self, pins: &[model::Pin]) {
        let pins = self.fitting_pins(pins);
        let unchanged = match self.pins.as_ref().map(|p| &p.item.body) {
            Some(Body::Pins(old)) => *old == pins,
            // None published yet: an empty list needs no item.
            _ => pins.pins.is_empty(),
        };
        if !unchanged {
            self.publish(Body::Pins(pins));
            // First-hand only, as a profile: receivers refuse pins relayed in another's name.
            self.send_items_to_members();
        }
    }

    /// As many of `pins` as fit in one item (`MAX_ITEM`), ordered by capability then tool, one
    /// per tool. The pins after those are not published: the fleet counts this sidecar as
    /// pinning none of those tools.
    pub(super) fn fitting_pins(&self, pins: &[model::Pin]) -> Pins {
        let mut pins: Vec<wire::Pin> = pins.iter().filter_map(model::wire_pin).collect();
        pins.sort();
        pins.dedup_by(|a, b| a.capability == b.capability && a.tool == b.tool);
        // Sized with the largest head it may be sent under (a later `seq`, a new identity after
        // a rejoin), so republishing it never makes it too large.
        let fits = |n: usize| {
            let item = Item {
                name: self.options.name.clone(),
                node: NodeId {
                    addr: self.options.addr,
                    epoch: u64::MAX,
                },
                seq: u64::MAX,
                body: Body::Pins(Pins {
                    pins: pins[..n].to_vec(),
                }),
            };
            self.encode_item(&item)
                .is_ok_and(|bytes| bytes.len() <= MAX_ITEM)
        };
        // The longest prefix that fits (fitting only shrinks as pins are added).
        let (mut lo, mut hi) = (0, pins.len());
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        pins.truncate(lo);
        Pins { pins }
    }

    /// This node's current items, sent straight to one member: as few datagrams as hold them
    /// (each item is at most `MAX_ITEM`, so each fits one).
    pub(super) fn send_items(&mut self, to: SocketAddr) {
        let items: Vec<Item> = [
            self.profile.as_ref(),
            self.live.as_ref(),
            self.pins.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|p| p.item.clone())
        .collect();
        if items.is_empty() {
            // Nothing published yet: serve this member once there is.
            self.unserved.push(to);
            return;
        }
        let mut batch: Vec<&Item> = Vec::new();
        let mut bodies = Vec::new();
        for item in &items {
            batch.push(item);
            let fits = self
                .encode_items(batch.clone())
                .is_ok_and(|b| b.len() <= MAX_DATAGRAM - OVERHEAD);
            if !fits && batch.len() > 1 {
                batch.pop();
                bodies.extend(self.encode_items(std::mem::take(&mut batch)).ok());
                batch.push(item);
            }
        }
        bodies.extend(self.encode_items(batch).ok());
        for body in bodies {
            self.send(to, Kind::Items, &body);
        }
    }

    /// This node's item in the current wire format (or, in tests, the next version's).
    pub(super) fn encode_item(&self, item: &Item) -> Result<Vec<u8>, WireError> {
        if self.options.newer_wire {
            return wire::future::encode_item(item);
        }
        wire::encode_item(item)
    }

    pub(super) fn encode_items(&self, items: Vec<&Item>) -> Result<Vec<u8>, WireError> {
        #[cfg(test)]
        if self.options.newer_wire {
            return wire::future::encode_items(items);
        }
        wire::encode_items(items)
    }

    /// This node's current items, sent straight to every member SWIM counts alive (a new
    /// profile, a new identity).
    pub(super) fn send_items_to_members(&mut self) {
        let members = self.handler.lock().active_addrs();
        for to in members {
            self.send_items(to);
        }
    }

    /// The longest gap between refreshes now (`longest_refresh`).
    pub(super) fn refresh_interval(&self) -> Duration {
        longest_refresh(
            self.members_sent.len(),
            self.options.refresh_interval,
            self.options.max_transmissions,
        )
    }
}

/// The longest gap between a node's refreshes in a fleet of `members` others: the configured
/// one, slowed down as the fleet grows so that refreshes, a mean 0.75 of it apart, stay in
/// budget.
pub fn longest_refresh(members: usize, configured: Duration, max_transmissions: u8) -> Duration {
    let tx = f64::from(max_transmissions.max(1));
    let mean_draw = (REFRESH_DRAW_MIN + 1.0) / 2.0;
    configured.max(Duration::from_secs_f64(
        members as f64 * tx / (REFRESH_BUDGET * mean_draw),
    ))
}

/// A change callers must hear of at once: the state, degraded, busy, cooling down, a model
/// budget run dry or back.
fn urgent(a: &Live, b: &Live) -> bool {
    a.state != b.state
        || a.degraded != b.degraded
        || budget_moved(a, b, 1)
        || a.busy != b.busy
        || a.cooling_down != b.cooling_down
}

/// A change worth a message: the state, or a figure that moves a score.
fn moved(a: &Live, b: &Live) -> bool {
    let far = |x: Option<u32>, y: Option<u32>| match (x, y) {
        (Some(x), Some(y)) => {
            let (lo, hi) = (x.min(y).max(1), x.max(y));
            hi as f64 / lo as f64 >= 1.25
        }
        (None, None) => false,
        _ => true,
    };
    urgent(a, b)
        || a.cap.abs_diff(b.cap) >= 50
        || a.availability.abs_diff(b.availability) >= 50
        || a.saturation.abs_diff(b.saturation) >= 100
        // Callers score with the prediction too (docs/reach-model.md, "Predicted saturation"):
        // a climb it foresees must travel before the saturation itself moves.
        || a.saturation_predicted.abs_diff(b.saturation_predicted) >= 100
        || far(a.latency_ms, b.latency_ms)
        || a.profile_seq != b.profile_seq
        // Callers cut a share by the headroom: a step of 0.05 moves it.
        || budget_moved(a, b, 50)
}

/// Whether a model budget's headroom moved by `step` thousandths or more (a step of 1 at zero:
/// run dry or back), or a budget came or went.
fn budget_moved(a: &Live, b: &Live, step: u16) -> bool {
    if a.budget.len() != b.budget.len() {
        return true;
    }
    a.budget.iter().zip(&b.budget).any(|(x, y)| {
        let (hx, hy) = (x.headroom_milli, y.headroom_milli);
        x.group != y.group
            || match (hx, hy) {
                (Some(p), Some(q)) if step == 1 => (p == 0) != (q == 0),
                (Some(p), Some(q)) => p.abs_diff(q) >= step,
                (None, None) => false,
                _ => true,
            }
    })
}
