//! Scoring the candidates for one request: this caller's view of each peer joined with the
//! peer's own view, into an effective cap and the factors of docs/reach-model.md ("Score").

use std::time::Duration;

use tokio::time::Instant;

use super::{entry, PeerViews, RouteRequest, Scored};
use crate::budget::shared::{candidate_headroom, GroupTable};
use crate::config::{RouteMode, Snapshot};
use crate::local::SelfView;
use crate::reach::{self, State};
use crate::registry::Peer;
use std::sync::{Arc, Mutex};

/// How much longer than a peer's published timeout a caller waits for its answer.
const PUBLISHED_TIMEOUT_GRACE: Duration = Duration::from_millis(50);

impl PeerViews {
    /// Scores every candidate for a request; excluded ones carry the reason.
    pub fn score(
        &self,
        snapshot: &Snapshot,
        candidates: &[Arc<Peer>],
        request: &RouteRequest,
    ) -> Vec<Scored> {
        let now = Instant::now();
        let (ep, sp) = (&snapshot.estimate_params, &snapshot.state_params);
        let lifetime = super::self_view_lifetime(snapshot);
        let me = &snapshot.bootstrap.agent;
        let mut inner = self.lock();
        let mut transitions = Vec::new();
        let mut scored = candidates
            .iter()
            .map(|peer| {
                let entry = entry(&mut inner, peer, now);
                if let Some(t) = entry.view.tick(now, sp) {
                    transitions.push((peer.name.clone(), t));
                }
                let mine = entry.view.scoring_snapshot(now, ep, sp);
                // A gossip member's view is pushed on every meaningful change and lives as long
                // as the member does; a polled one goes stale.
                let remote = entry
                    .remote
                    .as_ref()
                    .filter(|(_, at)| {
                        peer.source == "gossip" || now.saturating_duration_since(*at) <= lifetime
                    })
                    .map(|(r, _)| r);
                let published = remote
                    .and_then(|r| r.capabilities.iter().find(|c| c.name == request.capability));
                let self_state = remote.map(|r| r.view.state);
                // A sidecar that answered before and has stopped answering is down or cut off:
                // out of rotation until it answers again (gossip's failure detector, for now).
                let silent = entry.unreachable_since.filter(|since| {
                    entry.remote.is_some() && now.saturating_duration_since(*since) >= lifetime
                });
                // A draining model budget shrinks the share (none at 0, whole at the reset); not
                // with `steer: false` (docs/model-budgets.md).
                let steer = snapshot.policy.model_budgets.steer;
                let headroom = model_headroom(
                    entry.remote.as_ref().filter(|_| steer && remote.is_some()),
                    &self.budget_groups,
                    now,
                );
                let cap = if silent.is_some() {
                    0.0
                } else {
                    mine.cap
                        .min(remote.map_or(1.0, |r| r.view.cap))
                        .min(headroom)
                };
                // Until this caller has seen the peer itself, the peer's own view speaks for it:
                // a prior of our own would starve peers we have not called yet.
                let seen_by_us = mine.estimates.age_s.is_some();
                let availability = match remote {
                    Some(r) if !seen_by_us => r.view.estimates.availability,
                    Some(r) => mine
                        .estimates
                        .availability
                        .min(r.view.estimates.availability),
                    None => mine.estimates.availability,
                };
                // The peer's own prediction counts as much as its load now: a fleet moves work off
                // an agent whose queue is climbing before it refuses (docs/reach-model.md,
                // "Predicted saturation").
                let saturation = mine
                    .estimates
                    .saturation
                    .max(remote.map_or(0.0, |r| {
                        remote_saturation(r, entry.pending_at_poll, entry.pending)
                            .max(r.view.estimates.saturation_predicted)
                    }))
                    .max(1.0 - headroom);
                let matched = match published {
                    Some(c) => reach::capability_match(&c.tags, &request.tags),
                    // Tags unknown until the peer's profile arrives: neither excluded nor preferred.
                    None => Some(if request.tags.is_empty() { 1.0 } else { 0.5 }),
                };
                // A peer whose answers drifted from its golden tasks' baselines is a worse match
                // by as much (docs/reach-model.md, "Quality and `degraded`").
                let quality = remote.and_then(|r| r.view.quality);
                let matched = matched.map(|m| m * reach::QualityMark::match_factor(quality));
                let timeout = peer.timeout.unwrap_or_else(|| {
                    published.map_or(snapshot.policy.timeouts.request.get(), |c| {
                        // The callee enforces its own timeout and answers 504 naming its agent;
                        // waiting a moment longer lets that answer, not a bare timeout of our
                        // own, be what comes back.
                        Duration::from_millis(c.timeout_ms) + PUBLISHED_TIMEOUT_GRACE
                    })
                });
                let at_limit = peer.max_concurrency.is_some_and(|max| entry.pending >= max);
                let zone = snapshot
                    .policy
                    .zones
                    .distance((&me.zone, &me.region), (&peer.zone, &peer.region));
                let cost = reach::cost(published.map_or(0.0, |c| c.cost), zone);
                let mode = request
                    .mode
                    .or(published.map(|c| c.mode))
                    .unwrap_or_default();
                let weights = match mode {
                    RouteMode::Sync => &snapshot.policy.weights.sync,
                    RouteMode::Async => &snapshot.policy.weights.async_,
                };
                let factors = reach::score(
                    availability,
                    matched.unwrap_or(0.0),
                    cost,
                    saturation,
                    weights,
                );
                let excluded = if matched.is_none() {
                    let missing: Vec<&str> = request
                        .tags
                        .iter()
                        .filter(|t| published.is_some_and(|c| !c.tags.contains_key(*t)))
                        .map(String::as_str)
                        .collect();
                    Some(format!("lacks tag {}", missing.join(", ")))
                } else if at_limit {
                    Some("at its max concurrency".to_owned())
                } else if let Some(since) = silent {
                    Some(format!(
                        "sidecar unreachable for {:.1}s",
                        now.saturating_duration_since(since).as_secs_f64()
                    ))
                } else if headroom <= 0.0 {
                    Some("budget-limited (model budget spent until its reset)".to_owned())
                } else if cap <= 0.0 {
                    let state = if self_state.is_some_and(|s| s != State::Healthy && mine.cap > 0.0)
                    {
                        self_state
                    } else {
                        Some(mine.state)
                    };
                    Some(format!(
                        "{} (no traffic allowed)",
                        state.map_or("unknown", State::as_str)
                    ))
                } else {
                    None
                };
                entry.last_score = Some(factors.score);
                entry.last_factors = Some(factors);
                if factors.score < snapshot.policy.states.healthy.min_score {
                    if let Some(t) = entry.view.event(reach::Event::LowScore, now, sp) {
                        transitions.push((peer.name.clone(), t));
                    }
                }
                Scored {
                    peer: peer.clone(),
                    state: mine.state,
                    self_state,
                    cap,
                    factors,
                    excluded,
                    cooling_down: mine.estimates.cooling_down,
                    timeout,
                    idempotent: published.is_some_and(|c| c.idempotent),
                    latency_ms: mine.estimates.latency_ms,
                    recent: entry.view.recent_latency(now),
                    expected_ms: None,
                    cost_weight: weights.cost,
                    pending: entry.pending,
                    queued: remote.map_or(0, |r| r.queued),
                }
            })
            .collect::<Vec<_>>();
        drop(inner);
        super::latency::judge(&mut scored);
        for (peer, t) in transitions {
            self.transitioned(&peer, t);
        }
        scored
    }
}

/// A candidate's model headroom from its self-view's budgets and its groups' freshest figures;
/// 1 when it publishes none (the common case costs one check, and takes no lock).
fn model_headroom(
    remote: Option<&(SelfView, Instant)>,
    groups: &Mutex<GroupTable>,
    now: Instant,
) -> f64 {
    match remote {
        Some((view, at)) if !view.budget.is_empty() => {
            let groups = groups.lock().unwrap_or_else(|p| p.into_inner());
            candidate_headroom(
                &view.budget,
                now.saturating_duration_since(*at),
                &groups,
                now,
            )
        }
        _ => 1.0,
    }
}

/// A peer's saturation from its self-view, with its in-flight count brought up to date: the count
/// read at the last poll included this caller's calls then; those are replaced by ours now, so a
/// poll that happened to catch one of our calls does not hold the peer back for a whole interval.
fn remote_saturation(remote: &SelfView, pending_at_poll: usize, pending_now: usize) -> f64 {
    let e = &remote.view.estimates;
    if e.busy || e.cooling_down {
        return 1.0;
    }
    let others = remote.in_flight.saturating_sub(pending_at_poll);
    let busy = others
        .saturating_add(pending_now)
        .saturating_add(remote.queued);
    let load = busy as f64 / remote.max_concurrency.max(1) as f64;
    load.min(1.0)
}
