//! A caller's side of shared budgets: the freshest figure heard for each `budget_group` and
//! credential, from the members the policy lets speak for the group, and a candidate's headroom
//! from its own figure and its group's on the same credential. Every figure ages out within
//! [`MAX_BLOCK`], so a group gone silent cannot pin agents out.

use std::time::Duration;

use tokio::time::Instant;

use super::headers::MAX_BLOCK;
use super::{Figure, PublishedBudget};
use crate::fast_hash::FastMap;

/// Groups remembered, at most; past it the stalest is dropped.
const MAX_GROUPS: usize = 256;

/// The freshest figure of each group and credential this caller has heard of.
#[derive(Debug, Default)]
pub(crate) struct GroupTable {
    groups: FastMap<(String, u64), Heard>,
}

#[derive(Clone, Copy, Debug)]
struct Heard {
    figure: Figure,
    /// When this caller heard it, and when its member learned it (on this caller's clock).
    heard_at: Instant,
    learned_at: Instant,
}

impl GroupTable {
    /// A member's published budgets, heard now, each kept when `speaks_for` lets the member
    /// speak for that group: a group's figure replaces one of the same credential learned
    /// earlier. A figure with no credential is the member's alone.
    pub(crate) fn heard(
        &mut self,
        budgets: &[PublishedBudget],
        now: Instant,
        speaks_for: impl Fn(&str) -> bool,
    ) {
        for (group, credential, figure) in budgets
            .iter()
            .filter_map(|b| Some((b.group.as_deref()?, b.credential?, b.figure?)))
            .filter(|(group, _, _)| speaks_for(group))
        {
            let age = Duration::from_secs_f64(super::seconds(figure.age_s));
            let learned_at = now.checked_sub(age).unwrap_or(now);
            let heard = Heard {
                figure,
                heard_at: now,
                learned_at,
            };
            let key = (group.to_owned(), credential);
            match self.groups.get_mut(&key) {
                Some(h) if h.learned_at > learned_at => {}
                Some(h) => *h = heard,
                None => {
                    if self.groups.len() >= MAX_GROUPS {
                        self.forget_stalest();
                    }
                    self.groups.insert(key, heard);
                }
            }
        }
    }

    fn forget_stalest(&mut self) {
        let stalest = self
            .groups
            .iter()
            .min_by_key(|(_, h)| h.learned_at)
            .map(|(g, _)| g.clone());
        if let Some(g) = stalest {
            self.groups.remove(&g);
        }
    }

    fn fresh(&self, group: &str, credential: u64, now: Instant) -> Option<&Heard> {
        let h = self.groups.get(&(group.to_owned(), credential))?;
        (now.saturating_duration_since(h.learned_at) <= MAX_BLOCK).then_some(h)
    }

    /// The group's headroom on `credential` now, when a fresh enough figure is known.
    pub(crate) fn headroom(&self, group: &str, credential: u64, now: Instant) -> Option<f64> {
        let h = self.fresh(group, credential, now)?;
        Some(
            h.figure
                .headroom_after(now.saturating_duration_since(h.heard_at)),
        )
    }

    /// How long until the group's figure on `credential` resets, when a fresh one is known.
    pub(crate) fn reset_in(&self, group: &str, credential: u64, now: Instant) -> Option<Duration> {
        let h = self.fresh(group, credential, now)?;
        let elapsed = now.saturating_duration_since(h.heard_at).as_secs_f64();
        let left = super::seconds(h.figure.reset_in_s) - elapsed;
        Some(Duration::from_secs_f64(left.max(0.0)))
    }
}

/// A candidate's model headroom (1 when nothing is known): the tightest over its budgets of
/// its own figure or, when fresher, its group's on the same credential, `elapsed` after its
/// view was heard.
pub(crate) fn candidate_headroom(
    published: &[PublishedBudget],
    elapsed: Duration,
    groups: &GroupTable,
    now: Instant,
) -> f64 {
    published
        .iter()
        .map(|b| {
            let own = b
                .figure
                .filter(|f| f.age_s + elapsed.as_secs_f64() <= MAX_BLOCK.as_secs_f64());
            let own_learned = own.map(|f| {
                let age = Duration::from_secs_f64(super::seconds(f.age_s)) + elapsed;
                now.checked_sub(age).unwrap_or(now)
            });
            let group = b
                .group
                .as_deref()
                .zip(b.credential)
                .and_then(|(g, c)| groups.fresh(g, c, now));
            match (own, group) {
                // The group's freshest figure speaks for the member unless its own is fresher.
                (_, Some(h)) if own_learned.is_none_or(|at| h.learned_at >= at) => h
                    .figure
                    .headroom_after(now.saturating_duration_since(h.heard_at)),
                (Some(f), _) => f.headroom_after(elapsed),
                (None, _) => 1.0,
            }
        })
        .fold(1.0, f64::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: u64 = 7;

    fn published(group: Option<&str>, headroom: f64, age_s: f64) -> PublishedBudget {
        PublishedBudget {
            group: group.map(str::to_owned),
            figure: Some(Figure {
                headroom,
                reset_in_s: 30.0,
                age_s,
            }),
            credential: group.map(|_| KEY),
        }
    }

    /// A member of `group` on credential [`KEY`] that has learned nothing yet.
    fn member_of(group: &str) -> PublishedBudget {
        PublishedBudget {
            group: Some(group.to_owned()),
            figure: None,
            credential: Some(KEY),
        }
    }

    fn anyone(_: &str) -> bool {
        true
    }

    #[tokio::test(start_paused = true)]
    async fn the_freshest_figure_of_a_group_scores_every_member() {
        let mut t = GroupTable::default();
        let now = Instant::now();
        t.heard(&[published(Some("acme"), 0.0, 1.0)], now, anyone);
        // An older figure heard later does not replace the fresher one.
        t.heard(&[published(Some("acme"), 1.0, 5.0)], now, anyone);
        let silent = [member_of("acme")];
        assert_eq!(candidate_headroom(&silent, Duration::ZERO, &t, now), 0.0);
        assert_eq!(
            candidate_headroom(&[member_of("other")], Duration::ZERO, &t, now),
            1.0
        );
        // Back at the reset without anything new heard.
        tokio::time::advance(Duration::from_secs(31)).await;
        let later = Instant::now();
        assert_eq!(
            candidate_headroom(&silent, Duration::from_secs(31), &t, later),
            1.0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_group_ages_out() {
        let mut t = GroupTable::default();
        let hostile = PublishedBudget {
            group: Some("acme".to_owned()),
            figure: Some(Figure {
                headroom: 0.0,
                reset_in_s: f64::INFINITY,
                age_s: f64::NAN,
            }),
            credential: Some(KEY),
        };
        t.heard(&[hostile], Instant::now(), anyone);
        assert_eq!(t.headroom("acme", KEY, Instant::now()), Some(0.0));
        tokio::time::advance(MAX_BLOCK + Duration::from_secs(1)).await;
        assert_eq!(t.headroom("acme", KEY, Instant::now()), None);
        let own = [published(None, 0.2, 0.0)];
        assert_eq!(
            candidate_headroom(&own, Duration::ZERO, &t, Instant::now()),
            0.2
        );
    }

    /// A figure of another credential, or from a member the policy does not let speak for the
    /// group, touches no other member.
    #[tokio::test(start_paused = true)]
    async fn only_a_publisher_on_the_same_credential_speaks_for_the_group() {
        let mut t = GroupTable::default();
        let now = Instant::now();
        let other_key = PublishedBudget {
            credential: Some(KEY + 1),
            ..published(Some("acme"), 0.0, 0.0)
        };
        t.heard(&[other_key], now, anyone);
        let member = [member_of("acme")];
        assert_eq!(candidate_headroom(&member, Duration::ZERO, &t, now), 1.0);
        t.heard(&[published(Some("acme"), 0.0, 0.0)], now, |_| false);
        assert_eq!(candidate_headroom(&member, Duration::ZERO, &t, now), 1.0);
        t.heard(&[published(Some("acme"), 0.0, 0.0)], now, anyone);
        assert_eq!(candidate_headroom(&member, Duration::ZERO, &t, now), 0.0);
        // A member's own fresher figure beats the group's older one.
        let fresh_own = [published(Some("acme"), 0.8, 0.0)];
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            candidate_headroom(&fresh_own, Duration::ZERO, &t, Instant::now()),
            0.8
        );
    }
}
