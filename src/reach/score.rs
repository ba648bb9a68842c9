//! The reach score of one candidate for one request (docs/reach-model.md, "Score"):
//! `w_avail·availability + w_match·capability_match − w_cost·cost − w_sat·saturation`,
//! with `cost = relative latency + declared cost + zone distance`; the relative latency term
//! needs every candidate at once and is added by `peers::latency`. [`score_one`] is the whole of
//! one candidate's score from what the caller gathered about it (`peers/score.rs` gathers it
//! under the peer views' lock): a pure function, tested by the table below.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{QualityMark, State};

/// One weight set (`sync` or `async` in the policy).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    pub(crate) availability: f64,
    pub(crate) capability_match: f64,
    pub(crate) cost: f64,
    pub(crate) saturation: f64,
}

impl Weights {
    /// The user is waiting: latency and saturation weigh heavily.
    pub(crate) const SYNC: Weights = Weights {
        availability: 1.0,
        capability_match: 0.3,
        cost: 0.6,
        saturation: 0.8,
    };
    /// Quality over speed: capability match weighs heavily.
    pub(crate) const ASYNC: Weights = Weights {
        availability: 1.0,
        capability_match: 1.0,
        cost: 0.2,
        saturation: 0.4,
    };
}

/// Every factor of a score, kept for `/status` and the decision log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Factors {
    pub(crate) availability: f64,
    pub(crate) capability_match: f64,
    pub(crate) cost: f64,
    pub saturation: f64,
    pub score: f64,
}

/// Mean proficiency over the requested tags; `None` when the candidate lacks one (it is then not
/// a candidate at all). No requested tags match everyone equally.
pub(crate) fn capability_match(tags: &BTreeMap<String, f64>, wanted: &[String]) -> Option<f64> {
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
pub(crate) fn cost(declared: f64, zone_distance: f64) -> f64 {
    declared.max(0.0) + zone_distance.max(0.0)
}

pub(crate) fn score(
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

/// What scoring one candidate reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inputs<'a> {
    /// This caller's view of the peer.
    pub(crate) mine: Own,
    /// The peer's own view, when fresh.
    pub(crate) theirs: Option<Theirs>,
    /// The capability as the peer publishes it; `None` until its profile arrives.
    pub(crate) published: Option<Published<'a>>,
    /// The peer's model headroom, 0..1 (1 when it publishes no budget).
    pub(crate) headroom: f64,
    /// Seconds since its sidecar, which had answered, stopped answering (out of rotation).
    pub(crate) silent_for: Option<f64>,
    /// The caller's calls to it are at its `max_concurrency`.
    pub(crate) at_limit: bool,
    /// How far its zone is from the caller's (`zones` policy).
    pub(crate) zone_distance: f64,
}

/// This caller's view of a peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Own {
    pub(crate) state: State,
    pub(crate) cap: f64,
    pub(crate) availability: f64,
    pub(crate) saturation: f64,
    /// Whether this caller has called the peer itself (else its own view speaks for it).
    pub(crate) seen: bool,
}

/// A peer's own view of itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Theirs {
    pub(crate) state: State,
    pub(crate) cap: f64,
    pub(crate) availability: f64,
    /// Its load now (its in-flight count brought up to date by the caller) and as predicted.
    pub(crate) saturation: f64,
    pub(crate) predicted: f64,
    pub(crate) quality: Option<QualityMark>,
}

/// The requested capability as a peer publishes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Published<'a> {
    pub(crate) tags: &'a BTreeMap<String, f64>,
    pub(crate) cost: f64,
}

/// One candidate scored: its effective cap, its factors, and why it is not a candidate.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Scoring {
    pub(crate) cap: f64,
    pub(crate) factors: Factors,
    pub(crate) excluded: Option<String>,
}

/// One candidate's score for a request wanting `wanted` tags, by weights `w`.
pub(crate) fn score_one(i: &Inputs<'_>, wanted: &[String], w: &Weights) -> Scoring {
    let theirs = i.theirs.as_ref();
    let cap = match i.silent_for {
        Some(_) => 0.0,
        None => i
            .mine
            .cap
            .min(theirs.map_or(1.0, |t| t.cap))
            .min(i.headroom),
    };
    // Until this caller has seen the peer itself, the peer's own view speaks for it: a prior of
    // our own would starve peers we have not called yet.
    let availability = match theirs {
        Some(t) if !i.mine.seen => t.availability,
        Some(t) => i.mine.availability.min(t.availability),
        None => i.mine.availability,
    };
    // The peer's own prediction counts as much as its load now: a fleet moves work off an agent
    // whose queue is climbing before it refuses ("Predicted saturation"); a draining model
    // budget as much as its load.
    let saturation = i
        .mine
        .saturation
        .max(theirs.map_or(0.0, |t| t.saturation.max(t.predicted)))
        .max(1.0 - i.headroom);
    let matched = match i.published {
        Some(p) => capability_match(p.tags, wanted),
        // Tags unknown until the peer's profile arrives: neither excluded nor preferred.
        None => Some(if wanted.is_empty() { 1.0 } else { 0.5 }),
    };
    // Answers drifted from the golden tasks' baselines are a worse match by as much.
    let matched = matched.map(|m| m * QualityMark::match_factor(theirs.and_then(|t| t.quality)));
    let declared = i.published.map_or(0.0, |p| p.cost);
    let factors = score(
        availability,
        matched.unwrap_or(0.0),
        cost(declared, i.zone_distance),
        saturation,
        w,
    );
    let excluded = match () {
        () if matched.is_none() => {
            let missing: Vec<&str> = wanted
                .iter()
                .filter(|t| i.published.is_some_and(|p| !p.tags.contains_key(*t)))
                .map(String::as_str)
                .collect();
            Some(format!("lacks tag {}", missing.join(", ")))
        }
        () if i.at_limit => Some("at its max concurrency".to_owned()),
        () if i.silent_for.is_some() => Some(format!(
            "sidecar unreachable for {:.1}s",
            i.silent_for.unwrap_or_default()
        )),
        () if i.headroom <= 0.0 => {
            Some("budget-limited (model budget spent until its reset)".to_owned())
        }
        () if cap <= 0.0 => {
            // The peer's own word when it keeps itself out; else this caller's view.
            let state = match theirs {
                Some(t) if t.state != State::Healthy && i.mine.cap > 0.0 => t.state,
                _ => i.mine.state,
            };
            Some(format!("{} (no traffic allowed)", state.as_str()))
        }
        () => None,
    };
    Scoring {
        cap,
        factors,
        excluded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(cap: f64, availability: f64, saturation: f64, seen: bool) -> Own {
        Own {
            state: State::Healthy,
            cap,
            availability,
            saturation,
            seen,
        }
    }

    fn theirs(state: State, cap: f64, availability: f64, saturation: f64) -> Theirs {
        Theirs {
            state,
            cap,
            availability,
            saturation,
            predicted: 0.0,
            quality: None,
        }
    }

    /// One row: the inputs, the tags wanted, and the cap, availability, saturation and
    /// exclusion the candidate gets.
    #[test]
    fn each_input_moves_the_score_as_the_model_says() {
        let python = tags(&[("python", 0.8)]);
        let published = Some(Published {
            tags: &python,
            cost: 0.1,
        });
        let base = Inputs {
            mine: own(1.0, 0.9, 0.1, true),
            theirs: Some(theirs(State::Healthy, 1.0, 0.95, 0.2)),
            published,
            headroom: 1.0,
            silent_for: None,
            at_limit: false,
            zone_distance: 0.0,
        };
        let py = vec!["python".to_owned()];
        let go = vec!["go".to_owned()];
        type Row<'a> = (
            &'a str,
            Inputs<'a>,
            &'a [String],
            f64,
            f64,
            f64,
            Option<&'a str>,
        );
        let rows: Vec<Row<'_>> = vec![
            ("healthy, both views", base, &py, 1.0, 0.9, 0.2, None),
            (
                "unseen: their availability",
                Inputs {
                    mine: own(1.0, 0.7, 0.0, false),
                    ..base
                },
                &py,
                1.0,
                0.95,
                0.2,
                None,
            ),
            (
                "their parole caps the share",
                Inputs {
                    theirs: Some(theirs(State::Parole, 0.05, 0.95, 0.2)),
                    ..base
                },
                &py,
                0.05,
                0.9,
                0.2,
                None,
            ),
            (
                "predicted saturation counts",
                Inputs {
                    theirs: Some(Theirs {
                        predicted: 0.7,
                        ..theirs(State::Healthy, 1.0, 0.95, 0.2)
                    }),
                    ..base
                },
                &py,
                1.0,
                0.9,
                0.7,
                None,
            ),
            (
                "half the model budget left",
                Inputs {
                    headroom: 0.5,
                    ..base
                },
                &py,
                0.5,
                0.9,
                0.5,
                None,
            ),
            (
                "model budget spent",
                Inputs {
                    headroom: 0.0,
                    ..base
                },
                &py,
                0.0,
                0.9,
                1.0,
                Some("budget-limited (model budget spent until its reset)"),
            ),
            (
                "silent sidecar",
                Inputs {
                    silent_for: Some(3.0),
                    ..base
                },
                &py,
                0.0,
                0.9,
                0.2,
                Some("sidecar unreachable for 3.0s"),
            ),
            (
                "at its max concurrency",
                Inputs {
                    at_limit: true,
                    ..base
                },
                &py,
                1.0,
                0.9,
                0.2,
                Some("at its max concurrency"),
            ),
            (
                "lacks a tag",
                base,
                &go,
                1.0,
                0.9,
                0.2,
                Some("lacks tag go"),
            ),
            (
                "ejected by its own view",
                Inputs {
                    theirs: Some(theirs(State::Ejected, 0.0, 0.95, 0.2)),
                    ..base
                },
                &py,
                0.0,
                0.9,
                0.2,
                Some("ejected (no traffic allowed)"),
            ),
            (
                "ejected by ours",
                Inputs {
                    mine: Own {
                        state: State::Ejected,
                        ..own(0.0, 0.9, 0.1, true)
                    },
                    ..base
                },
                &py,
                0.0,
                0.9,
                0.2,
                Some("ejected (no traffic allowed)"),
            ),
        ];
        for (what, inputs, wanted, cap, availability, saturation, excluded) in rows {
            let s = score_one(&inputs, wanted, &Weights::SYNC);
            assert!((s.cap - cap).abs() < 1e-9, "{what}: cap {}", s.cap);
            assert!(
                (s.factors.availability - availability).abs() < 1e-9,
                "{what}: {s:?}"
            );
            assert!(
                (s.factors.saturation - saturation).abs() < 1e-9,
                "{what}: {s:?}"
            );
            assert_eq!(s.excluded.as_deref(), excluded, "{what}");
        }
        // Profile not yet known: tags neither exclude nor prefer; a degraded agent matches less.
        let unknown = score_one(
            &Inputs {
                published: None,
                ..base
            },
            &py,
            &Weights::SYNC,
        );
        assert_eq!(unknown.factors.capability_match, 0.5);
        let mark = QualityMark {
            similarity: 0.5,
            degraded: true,
        };
        let degraded = Inputs {
            theirs: Some(Theirs {
                quality: Some(mark),
                ..theirs(State::Healthy, 1.0, 0.95, 0.2)
            }),
            ..base
        };
        assert!(
            (score_one(&degraded, &py, &Weights::SYNC)
                .factors
                .capability_match
                - 0.4)
                .abs()
                < 1e-9
        );
    }

    pub(super) fn tags(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
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
