//! A sidecar restarted in place (a container restarted in a pod that keeps its IP) comes back
//! at the same gossip address under a new identity, and is met at once from either side
//! (`docs/gossip.md`, "Restarted in place"):
//!
//! - **It answers what was meant for its previous incarnation.** A member that has not yet
//!   seen the old identity die keeps probing it; foca at the new incarnation drops those
//!   messages unread (they are not addressed to it). The node announces itself to their sender
//!   instead, which makes the new identity a member there (foca reports a rename) within one
//!   probe period, before failure detection has even run out.
//! - **A seed that left or died is asked whether it is back**, every 0.5 s or so (less often in
//!   a large fleet) for a minute. A restarted seed whose bootstrap names no other seed knows
//!   nobody: without this it was found only at the next seed resolution (30 s) or foca's
//!   announce to down members (10 s, and not at all by a node left alone).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use foca::{Header, Message};
use rand::RngExt;
use tokio::time::Instant;

use super::Node;
use crate::gossip::wire::NodeId;

/// A seed that went away (left, or was declared dead) is asked this long whether it is back (a
/// container restart, including the first of a crash loop's backoffs, fits in it); then only
/// the seed resolution asks it again.
const RETURN_WATCH: Duration = Duration::from_secs(60);
/// The shortest gap between two asks of one returning seed from one node…
const RETURN_ASK_EVERY: Duration = Duration::from_millis(500);
/// …stretched so that a fleet asks one seed at most about this often per second in all.
const RETURN_ASKS_PER_SECOND: f64 = 64.0;
/// The sender of messages meant for this address's previous incarnation is announced to at most
/// this often.
const ANSWER_OLD_EVERY: Duration = Duration::from_secs(1);

/// What the node knows of one seed address.
#[derive(Debug)]
pub(super) struct SeedWatch {
    /// The address as resolved (the watch is keyed by its canonical form).
    addr: SocketAddr,
    /// Since when the seed is away: SWIM counted an identity at that address alive, then down
    /// (it left, or was declared dead). `None` while it is a member, or never was one.
    away_since: Option<Instant>,
    /// When it is next asked, while it is away.
    next_ask: Option<Instant>,
}

impl Node {
    /// The seeds named last (resolved), kept to watch for their return.
    pub(super) fn watch_seeds(&mut self, seeds: &[SocketAddr]) {
        let me = canonical(self.options.addr);
        let seeds: Vec<SocketAddr> = seeds
            .iter()
            .copied()
            .filter(|s| canonical(*s) != me)
            .collect();
        let named: HashSet<SocketAddr> = seeds.iter().map(|s| canonical(*s)).collect();
        self.seed_watch.retain(|addr, _| named.contains(addr));
        for addr in seeds {
            self.seed_watch.entry(canonical(addr)).or_insert(SeedWatch {
                addr,
                away_since: None,
                next_ask: None,
            });
        }
    }

    /// SWIM counts a member at `addr` down: if it is a seed, it is asked whether it is back.
    pub(super) fn seed_away(&mut self, addr: SocketAddr, now: Instant) {
        if let Some(w) = self.seed_watch.get_mut(&canonical(addr)) {
            w.away_since = Some(now);
            w.next_ask = None;
        }
    }

    /// SWIM counts a member at `addr` alive: if it is a seed, it is no longer asked.
    pub(super) fn seed_back(&mut self, addr: SocketAddr) {
        if let Some(w) = self.seed_watch.get_mut(&canonical(addr)) {
            w.away_since = None;
            w.next_ask = None;
        }
    }

    /// Every tick: asks the seeds that went away less than `RETURN_WATCH` ago whether they are
    /// back (an announce, which any incarnation at that address answers).
    pub(super) fn ask_returning_seeds(&mut self, now: Instant) {
        // A node joins only once it has a profile to show.
        if self.profile.is_none() || self.leaving {
            return;
        }
        let due: Vec<SocketAddr> = self
            .seed_watch
            .iter()
            .filter(|(_, w)| {
                w.away_since
                    .is_some_and(|at| now.saturating_duration_since(at) < RETURN_WATCH)
                    && w.next_ask.is_none_or(|at| now >= at)
            })
            .map(|(key, _)| *key)
            .collect();
        if due.is_empty() {
            return;
        }
        let members = self.foca.num_members() as f64;
        let every = RETURN_ASK_EVERY.max(Duration::from_secs_f64(members / RETURN_ASKS_PER_SECOND));
        for key in due {
            // Out of step with the other nodes asking (the same draw as the periodic announces).
            let next = now + every.mul_f64(self.rng.random_range(0.5..1.5));
            let Some(w) = self.seed_watch.get_mut(&key) else {
                continue;
            };
            w.next_ask = Some(next);
            // Epoch 0: any incarnation at that address may answer an announce.
            let seed = NodeId {
                addr: w.addr,
                epoch: 0,
            };
            let _ = self.foca.announce(seed, &mut self.runtime);
        }
    }

    /// A SWIM message from `from` addressed to an earlier incarnation at this node's address
    /// (a member still probing the identity this sidecar had before it restarted): foca drops
    /// it unread, so the node announces itself to the sender, at most once a second each.
    pub(super) fn answer_for_previous_incarnation(
        &mut self,
        from: SocketAddr,
        header: &Header<NodeId>,
    ) {
        let me = self.foca.identity();
        let for_previous = header.message != Message::Announce
            && header.dst != *me
            && canonical(header.dst.addr) == canonical(me.addr)
            && header.dst.epoch < me.epoch;
        if !for_previous || self.profile.is_none() || self.handler.lock().is_active(&header.src) {
            return;
        }
        let now = Instant::now();
        if self
            .answered_old
            .get(&from)
            .is_some_and(|at| now.saturating_duration_since(*at) < ANSWER_OLD_EVERY)
        {
            return;
        }
        self.answered_old.insert(from, now);
        self.answered_old
            .retain(|_, at| now.saturating_duration_since(*at) < ANSWER_OLD_EVERY);
        tracing::debug!(%from, old = ?header.dst, "gossip: a member still talks to this address's previous incarnation; announcing to it");
        let _ = self.foca.announce(header.src.clone(), &mut self.runtime);
    }
}

/// An address as compared here (an IPv4 peer may show as `::ffff:a.b.c.d`).
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}
