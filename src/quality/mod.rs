//! Quality drift: golden tasks sent to the local agent now and then, their answers compared with
//! recorded baselines, and an agent whose answers drifted marked `degraded`
//! (`docs/reach-model.md`, "Quality and `degraded`").
//!
//! Why: probes and traffic prove that an agent answers, not that it still answers well. An agent
//! whose model or prompt changed under it passes every ping while its answers drift; a fixed set
//! of sample tasks compared with what it used to say is what shows it. The tasks run on the
//! probe thread (`crate::probe`), at its low priority, and never on the agent's last free slot.

pub(crate) mod compare;
mod run;

pub use run::{check_baseline, record};
pub(crate) use run::{run, RunReport};

use serde::Serialize;

use crate::reach::QualityMark;

/// A capability's last run, as `/status` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QualityStatus {
    #[serde(flatten)]
    pub report: RunReport,
    /// Seconds since the run.
    pub(crate) age_s: f64,
}

/// The agent's mark from its capabilities' last runs with a verdict: the lowest similarity, and
/// degraded when any capability is. `None` when no run has a verdict yet.
pub(crate) fn mark<'a>(reports: impl IntoIterator<Item = &'a RunReport>) -> Option<QualityMark> {
    reports
        .into_iter()
        .filter_map(|r| r.similarity.map(|s| (s, r.degraded)))
        .fold(None, |acc: Option<QualityMark>, (similarity, degraded)| {
            Some(match acc {
                None => QualityMark {
                    similarity,
                    degraded,
                },
                Some(m) => QualityMark {
                    similarity: m.similarity.min(similarity),
                    degraded: m.degraded || degraded,
                },
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(similarity: Option<f64>, threshold: f64) -> RunReport {
        RunReport {
            capability: "summarize".into(),
            similarity,
            threshold,
            degraded: similarity.is_some_and(|s| s < threshold),
            tasks: Vec::new(),
        }
    }

    #[test]
    fn the_mark_is_the_lowest_similarity_and_any_degraded_capability() {
        assert_eq!(mark([&report(None, 0.8)]), None);
        let m = mark([
            &report(Some(0.9), 0.8),
            &report(Some(0.6), 0.5),
            &report(None, 0.8),
        ]);
        assert_eq!(
            m,
            Some(QualityMark {
                similarity: 0.6,
                degraded: false
            })
        );
        let m = mark([&report(Some(0.7), 0.8), &report(Some(0.95), 0.8)]);
        assert_eq!(m.map(|m| (m.similarity, m.degraded)), Some((0.7, true)));
    }
}
