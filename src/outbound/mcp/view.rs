//! This caller's view of each server's tools: a tool that keeps failing on one server stops
//! getting calls there for a while, without the server's other tools (or the server, in the
//! peer view `src/peers/mod.rs`) losing theirs. Pure state (the clock is an argument), kept in
//! one bounded table of the tools that failed lately.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures in a row before a server's tool stops getting calls.
pub(crate) const THRESHOLD: u32 = 3;
/// How long a broken tool is passed over first; doubled each time a trial call fails.
pub(crate) const COOLDOWN: Duration = Duration::from_secs(5);
pub(crate) const MAX_COOLDOWN: Duration = Duration::from_secs(60);
/// Tools remembered at most (only failing ones are kept: a success forgets the tool).
const MAX_ENTRIES: usize = 4096;

/// One server's one tool, as this caller has seen it answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ToolView {
    /// Serving, with this many failures in a row (below the threshold).
    Serving { failures: u32 },
    /// Passed over until `until`; then one trial call decides. `failures`: in a row, trial
    /// calls included.
    Broken {
        until: Instant,
        cooldown: Duration,
        failures: u32,
    },
}

impl Default for ToolView {
    fn default() -> Self {
        Self::Serving { failures: 0 }
    }
}

impl ToolView {
    /// Whether a call may go to this server's tool now (a broken one past its cooldown takes a
    /// trial call).
    pub(crate) fn serving(&self, now: Instant) -> bool {
        match *self {
            Self::Serving { .. } => true,
            Self::Broken { until, .. } => now >= until,
        }
    }

    /// The view after an answer: a success forgets every failure; a failure counts, and past
    /// the threshold (or on a trial call) breaks the tool for a cooldown.
    pub(crate) fn after(self, ok: bool, now: Instant) -> Self {
        match (self, ok) {
            (_, true) => Self::default(),
            (Self::Serving { failures }, false) if failures + 1 >= THRESHOLD => Self::Broken {
                until: now + COOLDOWN,
                cooldown: COOLDOWN,
                failures: failures + 1,
            },
            (Self::Serving { failures }, false) => Self::Serving {
                failures: failures + 1,
            },
            (
                Self::Broken {
                    cooldown, failures, ..
                },
                false,
            ) => {
                let cooldown = (cooldown * 2).min(MAX_COOLDOWN);
                Self::Broken {
                    until: now + cooldown,
                    cooldown,
                    failures: failures.saturating_add(1),
                }
            }
        }
    }
}

/// Peer → tool → view, for the tools that failed lately.
#[derive(Debug, Default)]
pub(crate) struct ToolViews {
    views: Mutex<HashMap<(String, String), ToolView>>,
}

impl ToolViews {
    /// Whether `peer`'s `tool` may take a call now.
    pub(crate) fn serving(&self, peer: &str, tool: &str, now: Instant) -> bool {
        let views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        views
            .get(&(peer.to_owned(), tool.to_owned()))
            .is_none_or(|v| v.serving(now))
    }

    /// Tells the view how `peer`'s `tool` answered.
    pub(crate) fn record(&self, peer: &str, tool: &str, ok: bool, now: Instant) {
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        let key = (peer.to_owned(), tool.to_owned());
        let next = views.get(&key).copied().unwrap_or_default().after(ok, now);
        if next == ToolView::default() {
            views.remove(&key);
        } else if views.len() < MAX_ENTRIES || views.contains_key(&key) {
            views.insert(key, next);
        }
    }

    /// How `peer`'s `tool` stands (serving with no failure when it never failed lately).
    pub(crate) fn view(&self, peer: &str, tool: &str) -> ToolView {
        let views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        views
            .get(&(peer.to_owned(), tool.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// How many (peer, tool) pairs are passed over now.
    pub(crate) fn paused(&self, now: Instant) -> usize {
        let views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        views.values().filter(|v| !v.serving(now)).count()
    }

    /// The (peer, tool) pairs passed over now.
    #[cfg(test)]
    pub(crate) fn broken(&self, now: Instant) -> Vec<(String, String)> {
        let views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(String, String)> = views
            .iter()
            .filter(|(_, v)| !v.serving(now))
            .map(|(k, _)| k.clone())
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_breaks_past_the_threshold_and_a_trial_decides() {
        let t0 = Instant::now();
        let mut v = ToolView::default();
        for _ in 1..THRESHOLD {
            v = v.after(false, t0);
            assert!(v.serving(t0), "below the threshold: {v:?}");
        }
        v = v.after(false, t0);
        assert!(!v.serving(t0));
        assert!(!v.serving(t0 + COOLDOWN / 2));
        assert!(v.serving(t0 + COOLDOWN), "a trial call after the cooldown");
        // The trial fails: broken again, for twice as long.
        let t1 = t0 + COOLDOWN;
        v = v.after(false, t1);
        assert!(!v.serving(t1 + COOLDOWN));
        assert!(v.serving(t1 + COOLDOWN * 2));
        // A success forgets it all.
        assert_eq!(v.after(true, t1), ToolView::default());
    }

    #[test]
    fn a_success_between_failures_resets_the_count() {
        let t0 = Instant::now();
        let mut v = ToolView::default();
        for _ in 0..THRESHOLD * 3 {
            v = v.after(false, t0).after(true, t0);
        }
        assert_eq!(v, ToolView::default());
    }

    #[test]
    fn one_broken_tool_leaves_the_servers_other_tools_and_other_servers_serving() {
        let views = ToolViews::default();
        let now = Instant::now();
        for _ in 0..THRESHOLD {
            views.record("a", "search", false, now);
        }
        assert!(!views.serving("a", "search", now));
        assert!(views.serving("a", "fetch", now));
        assert!(views.serving("b", "search", now));
        assert_eq!(views.broken(now), [("a".to_owned(), "search".to_owned())]);
        assert_eq!(views.paused(now), 1);
        assert!(matches!(
            views.view("a", "search"),
            ToolView::Broken {
                failures: THRESHOLD,
                ..
            }
        ));
        assert_eq!(views.view("a", "fetch"), ToolView::default());
        views.record("a", "search", true, now + COOLDOWN);
        assert!(views.serving("a", "search", now));
        assert!(views.broken(now).is_empty(), "a success forgets the tool");
    }

    #[test]
    fn the_cooldown_is_capped() {
        let t0 = Instant::now();
        let mut v = ToolView::default();
        for _ in 0..40 {
            v = v.after(false, t0);
        }
        assert_eq!(
            v,
            ToolView::Broken {
                until: t0 + MAX_COOLDOWN,
                cooldown: MAX_COOLDOWN,
                failures: 40,
            }
        );
    }
}
