//! The capabilities other members claim (profiles, A2A cards, MCP tool lists) that have series
//! of their own: at most `metrics.max_capabilities` at a time, the rest under `other`; a claim no
//! member has made for `metrics.idle_timeout` is forgotten, its series no longer rendered and
//! its label free for another. So churning claims leave `/metrics` as it was once they stop.
//!
//! A forgotten name's series stay in the exporter's registry, unrendered: the exporter cannot
//! delete one series (its idle timeout forgets whole kinds, see `peers.rs`). So that registry
//! stays bounded too, at most [`LIFETIME`] times the cap of names are ever labelled from claims
//! in a process's life; a forgotten name claimed again gets its own series back.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::fast_hash::FastMap;

/// Names ever labelled from claims, as a multiple of `metrics.max_capabilities`.
pub(super) const LIFETIME: usize = 4;

#[derive(Debug, Default)]
pub(super) struct Claimed {
    /// The claims members make now, each with whether it is routed observe-only.
    claims: FastMap<String, bool>,
    /// `metrics.max_capabilities` and `metrics.idle_timeout` as of the last claims.
    limits: Option<(usize, Duration)>,
    /// Each labelled claim, and since when no member has made it (`None`: claimed now).
    labelled: FastMap<String, Option<Instant>>,
    /// Forgotten claims: never rendered while they stay forgotten.
    hidden: HashSet<String>,
    /// Names labelled from claims so far.
    ever: usize,
}

/// What one round did to the labels.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Round {
    /// Claims that got a label: observe-only, and forgotten before (their series exist).
    pub(crate) labelled: Vec<(String, bool, bool)>,
    /// Claims forgotten.
    pub(crate) forgotten: Vec<String>,
}

impl Claimed {
    /// The claims every member makes now, and the policy's limits.
    pub(super) fn set(&mut self, claims: FastMap<String, bool>, limits: (usize, Duration)) {
        self.claims = claims;
        self.limits = Some(limits);
    }

    /// Labels the claims (`configured` ones excepted: their series are the sidecar's own)
    /// while fewer than the cap are; forgets a labelled claim absent for the idle time.
    pub(super) fn round(&mut self, configured: &HashSet<String>, now: Instant) -> Round {
        let max = self.max();
        for (name, gone) in &mut self.labelled {
            match (self.claims.contains_key(name), &gone) {
                (true, _) => *gone = None,
                (false, None) => *gone = Some(now),
                (false, Some(_)) => {}
            }
        }
        let mut round = Round {
            forgotten: self.expire(now),
            ..Round::default()
        };
        let mut fresh: Vec<(&String, &bool)> = self
            .claims
            .iter()
            .filter(|(c, _)| !configured.contains(*c) && !self.labelled.contains_key(*c))
            .collect();
        // The same names get the free labels whatever order gossip brought them in.
        fresh.sort_unstable();
        for (name, observe_only) in fresh {
            if self.labelled.len() >= max {
                break;
            }
            let known = self.hidden.remove(name);
            if !known {
                if self.ever >= LIFETIME * max {
                    continue;
                }
                self.ever += 1;
            }
            self.labelled.insert(name.clone(), None);
            round.labelled.push((name.clone(), *observe_only, known));
        }
        round
    }

    /// Whether some claim made now has no label (it counts under `other`).
    pub(super) fn unlabelled(&self, configured: &HashSet<String>) -> bool {
        self.claims
            .keys()
            .any(|c| !configured.contains(c) && !self.labelled.contains_key(c))
    }

    fn max(&self) -> usize {
        self.limits.map_or(128, |(max, _)| max)
    }

    /// Forgets what has been gone for the idle time (also between rounds: gossip may be quiet).
    fn expire(&mut self, now: Instant) -> Vec<String> {
        let idle = self
            .limits
            .map_or(Duration::from_secs(600), |(_, idle)| idle);
        let mut forgotten = Vec::new();
        self.labelled.retain(|name, gone| {
            let keep = gone.is_none_or(|since| now.saturating_duration_since(since) < idle);
            if !keep {
                forgotten.push(name.clone());
            }
            keep
        });
        self.hidden.extend(forgotten.iter().cloned());
        forgotten
    }

    #[cfg(test)]
    pub(super) fn is_labelled(&self, name: &str) -> bool {
        self.labelled.contains_key(name)
    }

    pub(super) fn is_hidden(&self, name: &str) -> bool {
        self.hidden.contains(name)
    }

    pub(super) fn any_hidden(&self) -> bool {
        !self.hidden.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(round: &Round) -> Vec<&str> {
        round.labelled.iter().map(|(n, ..)| n.as_str()).collect()
    }

    fn claims(names: &[&str]) -> FastMap<String, bool> {
        names.iter().map(|n| ((*n).to_owned(), false)).collect()
    }

    #[test]
    fn a_claim_gone_for_the_idle_time_frees_its_label_and_comes_back_as_it_was() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let limits = (2, Duration::from_secs(10));
        let own: HashSet<String> = ["own".to_owned()].into();
        let mut c = Claimed::default();
        c.set(claims(&["b", "a", "c", "own"]), limits);
        assert_eq!(names(&c.round(&own, t0)), ["a", "b"]);
        assert!(!c.is_labelled("c") && !c.is_labelled("own"));
        assert!(c.unlabelled(&own));
        // `a` stops being claimed: it keeps its label for the idle time, then loses it to `c`.
        c.set(claims(&["b", "c"]), limits);
        assert_eq!(c.round(&own, at(1)), Round::default());
        assert!(c.is_labelled("a"));
        assert_eq!(c.round(&own, at(5)), Round::default());
        let r = c.round(&own, at(11));
        assert_eq!(r.forgotten, ["a"]);
        assert_eq!(r.labelled, [("c".to_owned(), false, false)]);
        assert!(c.is_hidden("a") && !c.unlabelled(&own));
        // Claimed again later, with room: its old series are shown again.
        c.set(claims(&["a", "b", "c"]), (3, Duration::from_secs(10)));
        let r = c.round(&own, at(12));
        assert_eq!(r.labelled, [("a".to_owned(), false, true)]);
        assert!(c.is_labelled("a") && !c.is_hidden("a"));
    }

    #[test]
    fn names_ever_labelled_are_bounded() {
        let t0 = Instant::now();
        let mut c = Claimed::default();
        let mut labelled = 0;
        for round in 0..100u64 {
            let names: Vec<String> = (0..4).map(|i| format!("n{round}-{i}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            c.set(claims(&names), (2, Duration::from_secs(1)));
            labelled += c
                .round(&HashSet::new(), t0 + Duration::from_secs(round * 10))
                .labelled
                .len();
        }
        assert_eq!(labelled, LIFETIME * 2);
    }
}
