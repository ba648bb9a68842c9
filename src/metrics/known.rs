//! Zero series for the label sets known before their first event. Prometheus' instrumentation
//! guidance: a counter that may be incremented is exported at 0 from the start, else
//! `increase()` and `rate()` miss the first event of every label set (a dashboard read 0
//! ejections after two). Known at start: every state transition of the reach model, for both
//! views; per capability this sidecar serves, its request outcomes; per capability it may call
//! (its static peers', its policy's, and each gossip brings), its outcomes, every retry reason,
//! its retry budget and its calls no peer could take (and those of an unknown capability);
//! per capability routed observe-only at the time it became known, its agreement and avoidable
//! failures; deadlines exceeded in both directions.

use std::collections::HashSet;
use std::time::Instant;

use metrics::counter;

use super::{
    Direction, Metrics, DEADLINES_EXCEEDED_TOTAL, HEDGES_TOTAL, LOOPS_REFUSED_TOTAL,
    NO_CANDIDATE_TOTAL, OBSERVE_AVOIDABLE_FAILURES_TOTAL, OBSERVE_CALLS_TOTAL, OUTCOMES,
    RETRIES_TOTAL, RETRY_BUDGET_EXHAUSTED_TOTAL, STATE_TRANSITIONS_TOTAL, UNKNOWN_CAPABILITY,
};
use crate::reach::TRANSITIONS;

/// The `reason` labels of `reach_retries_total`: the refusals (`classify::Refusal::as_str`),
/// the failures `outbound::attempts::retry` names, and the policy's own two.
pub(super) const RETRY_REASONS: [&str; 13] = [
    "rate_limited",
    "saturated",
    "refused",
    "agent_unreachable",
    "unknown_capability",
    "connect_failed",
    "invalid_output",
    "timeout_keyed",
    "timeout",
    "server_error",
    "chain_next",
    "target_limited",
    "first_event_timeout",
];

/// Capabilities registered at most: gossip names are validated, but a fleet's are not bounded.
const MAX_KNOWN: usize = 1024;
/// The label of a capability without series of its own (`metrics.max_capabilities`).
pub(super) const OTHER: &str = "other";

/// The capabilities already registered, per series family (a direction's, or `observed`).
pub(super) type Known = std::sync::Mutex<HashSet<(&'static str, String)>>;

impl Metrics {
    /// Every transition of the reach model, for the agent's own view and the peers'; deadlines
    /// exceeded either way; the outcomes of calls to an unknown capability.
    pub(super) fn register_fixed(&self) {
        self.with(|| {
            for view in ["self", "peer"] {
                for (from, to, reason) in TRANSITIONS {
                    counter!(STATE_TRANSITIONS_TOTAL, "view" => view, "from" => from.as_str(), "to" => to.as_str(), "reason" => super::reason_label(reason))
                        .increment(0);
                }
            }
            for direction in [Direction::Inbound, Direction::Outbound] {
                counter!(DEADLINES_EXCEEDED_TOTAL, "direction" => direction.as_str()).increment(0);
            }
            counter!(NO_CANDIDATE_TOTAL, "capability" => UNKNOWN_CAPABILITY).increment(0);
            // A dashboard reads it from a sidecar's first scrape, before any capability is known.
            counter!(RETRY_BUDGET_EXHAUSTED_TOTAL, "capability" => UNKNOWN_CAPABILITY).increment(0);
            for why in ["loop", "max_hops", "forged", "replayed"] {
                counter!(LOOPS_REFUSED_TOTAL, "why" => why).increment(0);
            }
            for result in ["won", "lost", "no_budget"] {
                counter!(HEDGES_TOTAL, "result" => result).increment(0);
            }
        });
        for outcome in OUTCOMES {
            let (counter, _) =
                self.register_request(Direction::Outbound, UNKNOWN_CAPABILITY, outcome);
            counter.increment(0);
        }
    }

    /// Whether `capability`'s series of `family` are still to be registered (once each).
    fn first_time(&self, family: &'static str, capability: &str) -> bool {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let first = known.len() < MAX_KNOWN && known.insert((family, capability.to_owned()));
        drop(known);
        if first {
            self.labelled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(capability.to_owned());
        }
        first
    }

    /// The capabilities members claim now (profiles, cards, tool lists): series of their own
    /// from zero for up to `max` of them, the rest under `other`; one no member has claimed for
    /// `idle` is forgotten (`claimed.rs`). What members claim cannot grow this sidecar's series
    /// without end, nor keep them once the claims stop.
    pub(crate) fn claims<'a>(
        &self,
        claims: impl IntoIterator<Item = &'a str>,
        observe_only: impl Fn(&str) -> bool,
        limits: (usize, std::time::Duration),
    ) {
        let claims = claims
            .into_iter()
            .map(|c| (c.to_owned(), observe_only(c)))
            .collect();
        self.claimed().set(claims, limits);
        self.settle_claims();
    }

    /// Labels the claims made now as room allows and forgets the ones gone for the idle time;
    /// also between gossip rounds (`run_upkeep`), so a label freed by time is taken.
    pub(super) fn settle_claims(&self) {
        let (round, unlabelled) = {
            let configured = self.configured.lock().unwrap_or_else(|p| p.into_inner());
            let mut claimed = self.claimed();
            let round = claimed.round(&configured, Instant::now());
            (round, claimed.unlabelled(&configured))
        };
        self.forget(&round.forgotten);
        for (name, observe_only, known) in &round.labelled {
            if *known {
                self.labelled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.clone());
            }
            self.register_outbound(name, *observe_only);
        }
        if unlabelled {
            self.register_outbound(OTHER, false);
        }
    }

    pub(super) fn claimed(&self) -> std::sync::MutexGuard<'_, super::claimed::Claimed> {
        self.claimed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgotten claims lose their label (new events count under `other`) and their cached
    /// handles; their series are no longer rendered.
    pub(super) fn forget(&self, forgotten: &[String]) {
        if forgotten.is_empty() {
            return;
        }
        let mut labelled = self.labelled.lock().unwrap_or_else(|p| p.into_inner());
        let mut requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        for name in forgotten {
            labelled.remove(name);
            requests.remove(name);
        }
    }

    /// Drops the samples of forgotten claims from the exposition.
    pub(super) fn hide_forgotten(&self, text: &mut String) {
        let claimed = self.claimed();
        if !claimed.any_hidden() {
            return;
        }
        let mut kept = String::with_capacity(text.len());
        for line in text.lines() {
            let capability = line
                .split_once("capability=\"")
                .and_then(|(_, rest)| rest.split('"').next());
            if !capability.is_some_and(|c| claimed.is_hidden(c)) {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        *text = kept;
    }

    /// The label `capability`'s series carry: its name when it has series of its own (this
    /// sidecar's, its config's, or a claimed one within `metrics.max_capabilities`), else
    /// `other`.
    pub(crate) fn label<'c>(&self, capability: &'c str) -> &'c str {
        let labelled = self.labelled.lock().unwrap_or_else(|p| p.into_inner());
        if labelled.contains(capability) {
            capability
        } else {
            OTHER
        }
    }

    /// A capability this sidecar's config may call (its static peers', its policy's): its
    /// outbound series from zero, and the observe-only ones while it is routed observe-only.
    pub(crate) fn register_called(&self, capability: &str, observe_only: bool) {
        self.configured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(capability.to_owned());
        self.register_outbound(capability, observe_only);
    }

    fn register_outbound(&self, capability: &str, observe_only: bool) {
        self.register_capability(Direction::Outbound, capability);
        if observe_only {
            self.register_observed(capability);
        }
    }

    /// An observe-only capability's series from zero: its agreement with the model both ways
    /// and its avoidable failures. Once per capability.
    fn register_observed(&self, capability: &str) {
        if !self.first_time("observed", capability) {
            return;
        }
        let capability = capability.to_owned();
        self.with(|| {
            for agreement in ["same", "different"] {
                counter!(OBSERVE_CALLS_TOTAL, "capability" => capability.clone(), "agreement" => agreement)
                    .increment(0);
            }
            counter!(OBSERVE_AVOIDABLE_FAILURES_TOTAL, "capability" => capability).increment(0);
        });
    }

    /// `capability`'s series from zero: its request outcomes and, for a capability this
    /// sidecar calls, its retry reasons and budget. Once per capability and direction.
    pub(crate) fn register_capability(&self, direction: Direction, capability: &str) {
        if direction == Direction::Inbound {
            self.configured
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(capability.to_owned());
        }
        if !self.first_time(direction.as_str(), capability) {
            return;
        }
        for outcome in OUTCOMES {
            let (counter, _) = self.register_request(direction, capability, outcome);
            counter.increment(0);
        }
        if direction == Direction::Outbound {
            let capability = capability.to_owned();
            self.with(|| {
                for reason in RETRY_REASONS {
                    counter!(RETRIES_TOTAL, "capability" => capability.clone(), "reason" => reason)
                        .increment(0);
                }
                counter!(RETRY_BUDGET_EXHAUSTED_TOTAL, "capability" => capability.clone())
                    .increment(0);
                counter!(NO_CANDIDATE_TOTAL, "capability" => capability).increment(0);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(text: &str, prefix: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }

    /// The ejection and retry series exist at 0 before their first event,
    /// with their `# TYPE` (before: absent until the first increment, already at 1).
    #[test]
    fn known_label_sets_are_exported_at_zero_from_the_start() {
        let m = Metrics::new("a");
        m.register_capability(Direction::Outbound, "review");
        m.register_capability(Direction::Inbound, "translate");
        let text = m.render();
        assert!(
            text.contains("# TYPE reach_state_transitions_total counter"),
            "{text}"
        );
        assert!(text.contains("# TYPE reach_retry_budget_exhausted_total counter"));
        let ejections = series(&text, "reach_state_transitions_total{");
        assert!(ejections.iter().any(|l| l.contains("view=\"peer\"")
            && l.contains("to=\"ejected\"")
            && l.contains("reason=\"failed_on_parole\"")
            && l.ends_with(" 0")));
        assert_eq!(ejections.len(), 2 * TRANSITIONS.len());
        let retries = series(&text, "reach_retries_total{");
        assert_eq!(retries.len(), RETRY_REASONS.len(), "{retries:?}");
        assert!(retries.iter().all(|l| l.ends_with(" 0")));
        let mut budgets = series(&text, "reach_retry_budget_exhausted_total{");
        budgets.sort();
        assert_eq!(
            budgets,
            [
                "reach_retry_budget_exhausted_total{capability=\"review\"} 0",
                "reach_retry_budget_exhausted_total{capability=\"unknown\"} 0"
            ]
        );
        let inbound = series(&text, "reach_requests_total{");
        assert!(inbound
            .iter()
            .any(|l| l.contains("capability=\"translate\"") && l.contains("outcome=\"timeout\"")));
        // Once per capability: a second registration changes nothing, an event counts from 0.
        m.register_capability(Direction::Outbound, "review");
        m.retry("review", "rate_limited");
        let text = m.render();
        assert!(
            text.contains("reach_retries_total{capability=\"review\",reason=\"rate_limited\"} 1"),
            "{text}"
        );
    }

    /// A member claiming ever new capabilities grows no series past the cap: they count under
    /// `other`, and a name seen before keeps its label.
    #[test]
    fn claimed_capabilities_past_the_cap_count_under_other() {
        let m = Metrics::new("a");
        m.register_called("configured", false);
        let names: Vec<String> = (0..50).map(|i| format!("claimed-{i}")).collect();
        let limits = (4, std::time::Duration::from_secs(600));
        m.claims(names.iter().map(String::as_str), |_| false, limits);
        let text = m.render();
        let budgets = series(&text, "reach_retry_budget_exhausted_total{");
        // Configured, four claimed, `other`, and the one a fresh sidecar exports (`unknown`).
        assert_eq!(budgets.len(), 1 + 4 + 1 + 1, "{budgets:?}");
        assert!(budgets.iter().any(|l| l.contains("capability=\"other\"")));
        // The first names in order get the labels, whatever order gossip brought them in.
        assert_eq!(m.label("claimed-11"), "claimed-11");
        assert_eq!(m.label("claimed-40"), "other");
        assert_eq!(m.label("configured"), "configured");
        m.retry("claimed-40", "saturated");
        assert!(m
            .render()
            .contains("reach_retries_total{capability=\"other\",reason=\"saturated\"} 1"));
    }
}
