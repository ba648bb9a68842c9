//! A bounded record of recent state transitions, for the status page: who moved, from what to
//! what, why and when. Metrics count transitions; only this keeps their reasons.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use tokio::time::Instant;

use super::state::{State, Transition};

/// How many transitions one log keeps: the status page shows the last 50 of all views.
pub(crate) const TRANSITIONS_KEPT: usize = 50;

/// One transition as recorded.
#[derive(Clone, Debug, Serialize)]
pub struct TransitionRecord {
    /// Whose view moved: `self` (an agent's own) or `peer` (this caller's view of a peer).
    pub view: &'static str,
    pub(crate) agent: String,
    pub from: State,
    pub to: State,
    pub reason: &'static str,
    #[serde(skip)]
    pub(crate) at: Option<Instant>,
    /// Seconds since the transition, filled in when shown.
    pub(crate) age_s: f64,
    /// Wall-clock time of the transition, milliseconds since the Unix epoch.
    pub(crate) unix_ms: u64,
}

impl TransitionRecord {
    pub(crate) fn new(view: &'static str, agent: &str, t: Transition) -> Self {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            view,
            agent: agent.to_owned(),
            from: t.from,
            to: t.to,
            reason: t.reason,
            at: Some(Instant::now()),
            age_s: 0.0,
            unix_ms,
        }
    }

    /// The record with its age as of now.
    pub(crate) fn aged(mut self) -> Self {
        self.age_s = self.at.map_or(0.0, |at| at.elapsed().as_secs_f64());
        self
    }
}

/// The last [`TRANSITIONS_KEPT`] transitions, oldest first.
#[derive(Debug, Default)]
pub(crate) struct TransitionLog {
    inner: Mutex<VecDeque<TransitionRecord>>,
}

impl TransitionLog {
    pub(crate) fn push(&self, record: TransitionRecord) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.len() == TRANSITIONS_KEPT {
            inner.pop_front();
        }
        inner.push_back(record);
    }

    /// The kept transitions, newest first, with their ages.
    pub(crate) fn recent(&self) -> Vec<TransitionRecord> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .iter()
            .rev()
            .cloned()
            .map(TransitionRecord::aged)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn keeps_only_the_newest() {
        let log = TransitionLog::default();
        for i in 0..(TRANSITIONS_KEPT + 5) {
            log.push(TransitionRecord::new(
                "peer",
                &format!("a{i}"),
                Transition {
                    from: State::Healthy,
                    to: State::Probation,
                    reason: "test",
                },
            ));
        }
        let recent = log.recent();
        assert_eq!(recent.len(), TRANSITIONS_KEPT);
        assert_eq!(recent[0].agent, format!("a{}", TRANSITIONS_KEPT + 4));
        assert_eq!(recent[TRANSITIONS_KEPT - 1].agent, "a5");
    }
}
