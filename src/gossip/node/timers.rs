//! foca's timers: kept in order and fired when due, with two changes to what foca asks for.
//! Periodic announces are staggered, and a suspicion's timer is dropped once its member has
//! refuted it (`docs/gossip.md`, "The heal" and "The false death").

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use foca::Timer;
use rand::RngExt;
use tokio::time::Instant;

use super::Node;
use crate::gossip::wire::NodeId;

/// The timers foca asked for, by due time (ties in the order asked).
#[derive(Default)]
pub(super) struct Timers {
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    events: HashMap<u64, Timer<NodeId>>,
    seq: u64,
}

impl Timers {
    fn push(&mut self, at: Instant, event: Timer<NodeId>) {
        self.seq += 1;
        self.due.push(Reverse((at, self.seq)));
        self.events.insert(self.seq, event);
    }

    /// The earliest timer due by `now`, taken out.
    fn pop_due(&mut self, now: Instant) -> Option<Timer<NodeId>> {
        while let Some(Reverse((at, id))) = self.due.peek().copied() {
            if at > now {
                return None;
            }
            self.due.pop();
            if let Some(event) = self.events.remove(&id) {
                return Some(event);
            }
        }
        None
    }

    /// When the next timer is due, if any.
    pub(super) fn next_at(&self) -> Option<Instant> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }
}

impl Node {
    /// Hands foca every timer that is due.
    pub(super) fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(event) = self.timers.pop_due(now) {
            if !self.refuted(&event) {
                let _ = self.foca.handle_timer(event, &mut self.runtime);
            }
        }
    }

    /// Takes the timers foca asked for since the last call.
    pub(super) fn schedule_timers(&mut self, now: Instant) {
        while let Some((after, event)) = self.runtime.to_schedule() {
            let after = self.staggered(after, &event);
            self.timers.push(now + after, event);
        }
    }

    /// foca repeats its announces at a fixed period from the moment a node joined, so nodes
    /// that joined together announce in step, and after a partition heals the first node to
    /// ask across it asks up to a whole period later. Each round comes after a random 0.5–1.5
    /// of the period instead: the same rate, out of step.
    fn staggered(&mut self, after: Duration, event: &Timer<NodeId>) -> Duration {
        match event {
            Timer::PeriodicAnnounce(_) | Timer::PeriodicAnnounceDown(_) => {
                after.mul_f64(self.rng.random_range(0.5..1.5))
            }
            _ => after,
        }
    }

    /// A suspicion's timer whose member has since refuted it (it is alive, or suspected under
    /// a newer incarnation). foca 2.0 still tells that member "you are down" when such a timer
    /// runs out (its incarnation check guards the state change, not the message), and the
    /// member rejoins under a new identity: a live member dropped by the whole fleet, once per
    /// refuted suspicion. The timer has nothing left to do.
    fn refuted(&self, timer: &Timer<NodeId>) -> bool {
        let Timer::ChangeSuspectToDown {
            member_id,
            incarnation,
            ..
        } = timer
        else {
            return false;
        };
        self.foca
            .iter_membership_state()
            .find(|m| m.id() == member_id)
            .is_some_and(|m| match m.state() {
                foca::State::Alive => true,
                foca::State::Suspect => m.incarnation() != *incarnation,
                foca::State::Down => false,
            })
    }
}
