//! The reach score of one candidate for one request (docs/reach-model.md, "Score"):
//! `w_avail·availability + w_match·capability_match − w_cost·cost − w_sat·saturation`,
//! with `cost = relative latency + declared cost + zone distance`; the relative latency term
//! needs every candidate at once and is added by `peers::latency`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One weight set (`sync` or `async` in the policy).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    pub availability: f64,
    pub capability_match: f64,
    pub cost: f64,
    pub saturation: f64,
}

impl Weights {
    /// The user is waiting: latency and saturation weigh heavily.
    pub const SYNC: Weights = Weights {
        availability: 1.0,
        capability_match: 0.3,
        cost: 0.6,
        saturation: 0.8,
    };
    /// Quality over speed: capability match weighs heavily.
    pub const ASYNC: Weights = Weights {
        availability: 1.0,
        capability_match: 1.0,
        cost: 0.2,
        saturation: 0.4,
    };
}

/// Every factor of a score, kept for `/status` and the decision log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Factors {
    pub availability: f64,
    pub capability_match: f64,
    pub cost: f64,
    pub saturation: f64,
    pub score: f64,
}

/// Mean proficiency over the requested tags; `None` when the candidate lacks one (it is then not
/// a candidate at all). No requested tags match everyone equally.
pub fn capability_match(tags: &BTreeMap<String, f64>, wanted: &[String]) -> Option<f64> {
    if wanted.is_empty() {
        return Some(1.0);
    }
    let mut sum = 0.0;
    for tag in wanted {
        sum += tags.get(tag)?;
    }
    Some(sum / wanted.len() as f64)
}

/// The cost terms that belong to one candidate alone: its declared cost and zone distance.
pub fn cost(declared: f64, zone_distance: f64) -> f64 {
    declared.max(0.0) + zone_distance.max(0.0)
}

pub fn score(
    availability: f64,
    capability_match: f64,
    cost: f64,
    saturation: f64,
    w: &Weights,
) -> Factors {
    let score = w.availability * availability + w.capability_match * capability_match
        - w.cost * cost
        - w.saturation * saturation;
    Factors {
        availability,
        capability_match,
        cost,
        saturation,
        score,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_missing_tag_excludes_and_proficiency_averages() {
        let t = tags(&[("python", 0.9), ("go", 0.5)]);
        assert_eq!(capability_match(&t, &["rust".into()]), None);
        assert_eq!(
            capability_match(&t, &["python".into(), "go".into()]),
            Some(0.7)
        );
        assert_eq!(capability_match(&t, &[]), Some(1.0));
    }

    #[test]
    fn cost_adds_declared_cost_and_zone_distance_and_ignores_negatives() {
        assert_eq!(cost(0.1, 0.2), 0.1 + 0.2);
        assert_eq!(cost(-1.0, 0.0), 0.0);
    }

    #[test]
    fn saturation_lowers_the_score_as_availability_raises_it() {
        let w = Weights::SYNC;
        let idle = score(1.0, 1.0, 0.1, 0.0, &w).score;
        let full = score(1.0, 1.0, 0.1, 1.0, &w).score;
        let flaky = score(0.5, 1.0, 0.1, 0.0, &w).score;
        assert!(idle > full && idle > flaky);
        assert!((idle - full - 0.8).abs() < 1e-9);
    }

    #[test]
    fn async_weights_prefer_the_better_match_over_the_faster_agent() {
        let expert_slow = |w: &Weights| score(1.0, 0.95, 0.6, 0.0, w).score;
        let novice_fast = |w: &Weights| score(1.0, 0.4, 0.05, 0.0, w).score;
        assert!(expert_slow(&Weights::ASYNC) > novice_fast(&Weights::ASYNC));
        assert!(expert_slow(&Weights::SYNC) < novice_fast(&Weights::SYNC));
    }
}
