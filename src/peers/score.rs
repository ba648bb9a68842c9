//! Scoring the candidates for one request: this caller's view of each peer joined with the
//! peer's own view, into an effective cap and the factors of docs/reach-model.md ("Score").

use std::time::Duration;

use tokio::time::Instant;

use super::{entry, PeerViews, RouteRequest, Scored};
use crate::budget::shared::{candidate_headroom, GroupTable};
use crate::config::{RouteMode, Snapshot};
use crate::local::{PublishedCapability, SelfView};
use crate::reach;
use crate::registry::Peer;
use std::sync::{Arc, Mutex};

/// How much longer than a peer's published timeout a caller waits for its answer.
const PUBLISHED_TIMEOUT_GRACE: Duration = Duration::from_millis(50);

impl PeerViews {
    /// Scores every candidate for a request; excluded ones carry the reason. What each score
    /// reads is gathered here, under the lock; the score itself is `reach::score_one`.
    pub(crate) fn score(
        &self,
        snapshot: &Snapshot,
        candidates: &[Arc<Peer>],
        request: &RouteRequest,
    ) -> Vec<Scored> {
        let now = Instant::now();
        let sp = &snapshot.state_params;
        let mut inner = self.lock();
        let mut transitions = Vec::new();
        let mut scored = candidates
            .iter()
            .map(|peer| {
                let entry = entry(&mut inner, peer, now);
                if let Some(t) = entry.view.tick(now, sp) {
                    transitions.push((peer.name.clone(), t));
                }
                let gathered = self.gather(snapshot, entry, peer, request, now);
                let (published, mine, remote) =
                    (gathered.published, gathered.mine, gathered.remote);
                let weights = match request
                    .mode
                    .or(published.map(|c| c.mode))
                    .unwrap_or_default()
                {
                    RouteMode::Sync => &snapshot.policy.weights.sync,
                    RouteMode::Async => &snapshot.policy.weights.async_,
                };
                let scoring = reach::score_one(&gathered.inputs, &request.tags, weights);
                let timeout = timeout(snapshot, peer, published);
                let idempotent = published.is_some_and(|c| c.idempotent);
                let (self_state, queued) =
                    (remote.map(|r| r.view.state), remote.map_or(0, |r| r.queued));
                entry.last_score = Some(scoring.factors.score);
                entry.last_factors = Some(scoring.factors);
                if scoring.factors.score < snapshot.policy.states.healthy.min_score {
                    if let Some(t) = entry.view.event(reach::Event::LowScore, now, sp) {
                        transitions.push((peer.name.clone(), t));
                    }
                }
                Scored {
                    peer: peer.clone(),
                    state: mine.state,
                    self_state,
                    cap: scoring.cap,
                    factors: scoring.factors,
                    excluded: scoring.excluded,
                    cooling_down: mine.estimates.cooling_down,
                    timeout,
                    idempotent,
                    latency_ms: mine.estimates.latency_ms,
                    recent: entry.view.recent_latency(now),
                    expected_ms: None,
                    cost_weight: weights.cost,
                    pending: entry.pending,
                    queued,
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

    /// What scoring `peer` reads: this caller's view of it, its own view (while fresh), what it
    /// publishes of the capability, its model headroom, and whether its sidecar went silent.
    fn gather<'e>(
        &self,
        snapshot: &Snapshot,
        entry: &'e super::Entry,
        peer: &Peer,
        request: &RouteRequest,
        now: Instant,
    ) -> Gathered<'e> {
        let (ep, sp) = (&snapshot.estimate_params, &snapshot.state_params);
        let lifetime = super::self_view_lifetime(snapshot);
        let mine = entry.view.scoring_snapshot(now, ep, sp);
        // A gossip member's view is pushed on every meaningful change and lives as long as the
        // member does; a polled one goes stale.
        let remote = entry
            .remote
            .as_ref()
            .filter(|(_, at)| {
                peer.source == "gossip" || now.saturating_duration_since(*at) <= lifetime
            })
            .map(|(r, _)| r);
        let published =
            remote.and_then(|r| r.capabilities.iter().find(|c| c.name == request.capability));
        // A sidecar that answered before and has stopped answering is down or cut off: out of
        // rotation until it answers again (gossip's failure detector, for now).
        let silent_for = entry
            .unreachable_since
            .map(|since| now.saturating_duration_since(since))
            .filter(|silent| entry.remote.is_some() && *silent >= lifetime)
            .map(|silent| silent.as_secs_f64());
        // A draining model budget shrinks the share (none at 0, whole at the reset); not with
        // `steer: false` (docs/model-budgets.md).
        let steer = snapshot.policy.model_budgets.steer;
        let headroom = model_headroom(
            entry.remote.as_ref().filter(|_| steer && remote.is_some()),
            &self.budget_groups,
            now,
        );
        let me = &snapshot.bootstrap.agent;
        let theirs = remote.map(|r| reach::Theirs {
            state: r.view.state,
            cap: r.view.cap,
            availability: r.view.estimates.availability,
            saturation: remote_saturation(r, entry.pending_at_poll, entry.pending),
            predicted: r.view.estimates.saturation_predicted,
            quality: r.view.quality,
        });
        let inputs = reach::Inputs {
            mine: reach::Own {
                state: mine.state,
                cap: mine.cap,
                availability: mine.estimates.availability,
                saturation: mine.estimates.saturation,
                seen: mine.estimates.age_s.is_some(),
            },
            theirs,
            published: published.map(|c| reach::Published {
                tags: &c.tags,
                cost: c.cost,
            }),
            headroom,
            silent_for,
            at_limit: peer.max_concurrency.is_some_and(|max| entry.pending >= max),
            zone_distance: snapshot
                .policy
                .zones
                .distance((&me.zone, &me.region), (&peer.zone, &peer.region)),
        };
        Gathered {
            inputs,
            mine,
            remote,
            published,
        }
    }
}

/// What `gather` found for one candidate.
struct Gathered<'e> {
    inputs: reach::Inputs<'e>,
    mine: reach::ViewSnapshot,
    remote: Option<&'e SelfView>,
    published: Option<&'e PublishedCapability>,
}

/// How long the caller waits for `peer`: its own setting, else its published timeout and a
/// grace (the callee enforces its own timeout and answers 504 naming its agent; waiting a moment
/// longer lets that answer, not a bare timeout of our own, be what comes back), else the policy's.
fn timeout(snapshot: &Snapshot, peer: &Peer, published: Option<&PublishedCapability>) -> Duration {
    peer.timeout.unwrap_or_else(|| {
        published.map_or(snapshot.policy.timeouts.request.get(), |c| {
            Duration::from_millis(c.timeout_ms) + PUBLISHED_TIMEOUT_GRACE
        })
    })
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
