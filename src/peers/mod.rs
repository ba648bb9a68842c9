//! A caller's view of each peer: the same state machine and estimates as an agent keeps of itself,
//! fed by what this caller sees (connect errors, timeouts, 429s the peer may never have counted),
//! joined with the peer's own view of itself. A candidate's cap is the smaller of the two.
//!
//! Gossip members' self-views arrive by gossip (`feed`); static peers' are polled from their
//! `GET /reach/v1/self` on the inbound port (`poll`).

mod demand;
mod feed;
mod latency;
mod poll;
mod score;

pub use demand::CapabilityDemand;
pub(crate) use feed::{live, profile, self_view_lifetime, FleetPins, GossipFeed};
#[cfg(test)]
pub(crate) use latency::judge;
pub(crate) use poll::spawn_poller;

use crate::fast_hash::FastMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::budget::shared::GroupTable;
use crate::budget::PublishedBudget;
use crate::config::{ConfigStore, RouteMode, Snapshot};
use crate::local::{LocalAgent, SelfView};
use crate::metrics::Metrics;
use crate::reach::{
    self, Factors, ReachView, Signal, State, TransitionLog, TransitionRecord, ViewSnapshot,
};
use crate::registry::Peer;

/// A self-view older than this many refresh intervals is ignored.
const SELF_VIEW_LIFETIME_POLLS: u32 = 5;

#[derive(Debug)]
pub struct PeerViews {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    inner: Mutex<FastMap<String, Entry>>,
    /// The last transitions of this caller's views of its peers, with their reasons.
    transitions: TransitionLog,
    /// This sidecar's own agent, whose load and slots count in the fleet's demand.
    own_agent: Option<Arc<LocalAgent>>,
    /// The fleet's demand per capability as of the last `publish`, for `/status`.
    fleet_demand: Mutex<Vec<CapabilityDemand>>,
    /// The freshest model budget heard of each `budget_group` (docs/model-budgets.md). Locked
    /// after `inner` when both are.
    budget_groups: Mutex<GroupTable>,
}

#[derive(Debug)]
struct Entry {
    address: String,
    /// Found by gossip: its self-view lives as long as the member does (a polled one goes stale).
    from_gossip: bool,
    /// Which incarnation of a gossip member this entry is about (its gossip epoch: a restarted
    /// sidecar has a new one, even at the same address); `None` for a static peer, or until
    /// gossip says. Evidence about one incarnation is never held against the next.
    incarnation: Option<u64>,
    /// Unique to this entry: an attempt begun on an entry since started afresh (the peer
    /// restarted, or was forgotten) says nothing about the new one.
    generation: u64,
    view: ReachView,
    remote: Option<(SelfView, Instant)>,
    last_score: Option<f64>,
    /// The factors of the last score: what `/status` shows it was made of.
    last_factors: Option<reach::Factors>,
    /// This caller's attempts on the peer now in flight (to response headers).
    pending: usize,
    /// …and when the peer's self-view was read: its in-flight count included those.
    pending_at_poll: usize,
    /// Since when polls of the peer's self-view have failed to connect.
    unreachable_since: Option<Instant>,
    /// This caller's view's last transition.
    last_transition: Option<TransitionRecord>,
    /// What this caller's attempts on the peer came to, since the entry was made.
    outcomes: Outcomes,
}

/// This caller's attempts on one peer by what they came to, counted since the peer was first
/// seen at its address (a restarted peer starts over).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Outcomes {
    pub success: u64,
    /// Errors and 5xx.
    pub failure: u64,
    pub(crate) timeout: u64,
    /// The agent refused the task (429, or 503 with `retry-after`).
    pub refused: u64,
    /// The peer's sidecar turned the call away before its agent saw it.
    pub shed: u64,
    /// Nothing listened at the peer's address.
    pub(crate) unreachable: u64,
}

impl Outcomes {
    fn count(&mut self, signal: Signal) {
        let n = match signal {
            Signal::Success(_) => &mut self.success,
            Signal::Failure(_) => &mut self.failure,
            Signal::Timeout(_) => &mut self.timeout,
            Signal::Refused { .. } => &mut self.refused,
            Signal::Shed { .. } => &mut self.shed,
            Signal::Unreachable(_) => &mut self.unreachable,
        };
        *n += 1;
    }

    /// Calls that reached a verdict on the agent: everything but a shed call (load on the peer's
    /// sidecar, retried elsewhere). A refusal counts as not served.
    pub(crate) fn judged(&self) -> u64 {
        self.success + self.failure + self.timeout + self.refused + self.unreachable
    }
}

/// What one routing decision needs to know about the request.
#[derive(Clone, Debug, Default)]
pub struct RouteRequest {
    pub capability: String,
    pub tags: Vec<String>,
    pub mode: Option<RouteMode>,
}

/// One candidate as scored for one request.
#[derive(Clone, Debug, Serialize)]
pub struct Scored {
    pub(crate) peer: Arc<Peer>,
    pub(crate) state: State,
    /// The caller's view's state and the peer's own (when known).
    pub(crate) self_state: Option<State>,
    pub(crate) cap: f64,
    pub(crate) factors: Factors,
    /// Why the candidate was passed over, when it was.
    pub(crate) excluded: Option<String>,
    /// Cooling down after a 429: used only when nobody else can take the call.
    pub(crate) cooling_down: bool,
    /// The peer's own timeout for this capability (the policy's default when unknown).
    #[serde(skip)]
    pub(crate) timeout: Duration,
    /// The peer declares the capability idempotent (it deduplicates work itself).
    #[serde(skip)]
    pub(crate) idempotent: bool,
    /// This caller's latency estimate for the peer (unknown until it has one), and its calls
    /// in flight there when scored.
    #[serde(skip)]
    pub(crate) latency_ms: Option<f64>,
    /// What its calls took lately (ms), and how old that figure is (s).
    #[serde(skip)]
    pub(crate) recent: Option<(f64, f64)>,
    /// Its latency as the pick compares it: the recent figure, decayed toward the candidates'
    /// typical one while no sample refreshes it (set by `latency::judge`).
    #[serde(skip)]
    pub(crate) expected_ms: Option<f64>,
    /// The weight of cost in its score, so the relative latency term can be added afterwards.
    #[serde(skip)]
    pub(crate) cost_weight: f64,
    #[serde(skip)]
    pub(crate) pending: usize,
    /// Calls waiting in the peer's own queue, by its self-view (a held lock, a full pool).
    #[serde(skip)]
    pub(crate) queued: usize,
}

impl Scored {
    /// Expected wait for one more call: latency × (calls ahead of it + 1), Finagle's peak-EWMA
    /// load, with the peer's own queue counted (a one-at-a-time agent's queue is its wait).
    pub(crate) fn load_ms(&self) -> Option<f64> {
        let ahead = (self.pending + self.queued) as f64;
        self.expected_ms
            .or(self.latency_ms)
            .map(|ms| ms * (ahead + 1.0))
    }
}

/// A peer as `/status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PeerStatus {
    pub name: String,
    pub address: String,
    /// The state of whichever view allows less traffic: this caller's or the peer's own.
    pub effective_state: State,
    pub effective_cap: f64,
    /// This caller's view.
    pub view: ViewSnapshot,
    pub last_score: Option<f64>,
    pub last_factors: Option<reach::Factors>,
    pub self_view: Option<SelfView>,
    pub(crate) self_view_age_s: Option<f64>,
    /// This caller's view's last transition, and why.
    pub(crate) last_transition: Option<TransitionRecord>,
    /// This caller's attempts on the peer by outcome.
    pub outcomes: Outcomes,
}

impl PeerViews {
    /// The metrics this caller's views count into.
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn new(store: Arc<ConfigStore>, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            metrics,
            inner: Mutex::new(FastMap::default()),
            transitions: TransitionLog::default(),
            own_agent: None,
            fleet_demand: Mutex::default(),
            budget_groups: Mutex::default(),
        }
    }

    /// Counts `local`'s agent in the fleet's demand beside its peers.
    pub(crate) fn with_own_agent(mut self, local: Arc<LocalAgent>) -> Self {
        self.own_agent = Some(local);
        self
    }

    /// An attempt on `peer` starts; the guard ends it, even if the caller goes away mid-call.
    ///
    /// `latency_ms` is the peer's latency as scored for this call: an attempt left unanswered
    /// for five times that (at least a second) and then given up (the caller's deadline, the
    /// caller leaving) counts against the peer. The bar is set when the attempt starts, so the
    /// attempt's own silence cannot raise it. A silent path — a half-open connection, a
    /// black-holed peer — shows up only this way; a short deadline on a healthy peer does not.
    pub(crate) fn begin<'v>(
        &'v self,
        peer: &'v Peer,
        latency_ms: Option<f64>,
        now: Instant,
    ) -> Pending<'v> {
        let generation = {
            let mut inner = self.lock();
            let e = entry(&mut inner, peer, now);
            e.pending += 1;
            e.generation
        };
        let usual = latency_ms.map_or(Duration::ZERO, |ms| Duration::from_secs_f64(ms / 1000.0));
        Pending {
            views: self,
            peer,
            generation,
            started: now,
            overdue_after: (usual * 5).max(OVERDUE_FLOOR),
            ended: Ended::Not,
        }
    }

    /// An attempt begun on the entry of `generation` ended. An entry started afresh since (the
    /// peer restarted in place, or was forgotten) did not count it.
    fn end(&self, peer: &Peer, generation: u64) {
        let mut inner = self.lock();
        if let Some(e) = same_entry(&mut inner, peer, generation) {
            e.pending = e.pending.saturating_sub(1);
        }
    }

    /// A poll of the peer's self-view could not connect.
    pub(crate) fn unreachable(&self, peer: &Peer) {
        let now = Instant::now();
        let mut inner = self.lock();
        let e = entry(&mut inner, peer, now);
        e.unreachable_since.get_or_insert(now);
    }

    /// Evidence about `peer` from outside an attempt (its sidecar did not answer a poll): the
    /// tests' way in.
    #[cfg(test)]
    pub(crate) fn observe(&self, peer: &Peer, signal: Signal) {
        self.record(
            peer,
            signal,
            &self.store.snapshot(),
            Source::Outside,
            Instant::now(),
        );
    }

    /// Evidence about `peer` seen at `now`, judged under the caller's config snapshot. Evidence
    /// from an attempt is dropped if the entry it was begun on has since been started afresh: it
    /// is about an incarnation that is gone. The attempt stops counting as in flight under the
    /// same lock.
    fn record(
        &self,
        peer: &Peer,
        signal: Signal,
        snapshot: &Snapshot,
        source: Source,
        now: Instant,
    ) {
        let mut inner = self.lock();
        let e = match source {
            #[cfg(test)]
            Source::Outside => entry(&mut inner, peer, now),
            Source::Ending(generation) => match same_entry(&mut inner, peer, generation) {
                Some(e) => {
                    e.pending = e.pending.saturating_sub(1);
                    e
                }
                None => return,
            },
        };
        e.outcomes.count(signal);
        let t = e.view.observe(
            signal,
            now,
            &snapshot.estimate_params,
            &snapshot.state_params,
        );
        drop(inner);
        if let Some(t) = t {
            self.transitioned(&peer.name, t);
        }
    }

    pub(crate) fn set_remote(&self, peer: &Peer, remote: SelfView) {
        self.set_remote_of(peer, None, remote);
    }

    /// A gossip member's own view, from its incarnation `incarnation`.
    pub(crate) fn set_member_view(&self, peer: &Peer, incarnation: u64, remote: SelfView) {
        self.set_remote_of(peer, Some(incarnation), remote);
    }

    fn set_remote_of(&self, peer: &Peer, incarnation: Option<u64>, mut remote: SelfView) {
        sanitize(&mut remote);
        let now = Instant::now();
        if remote.budget.iter().any(|b| b.group.is_some()) {
            self.hear_group_figures(peer, &remote.budget, now);
        }
        let mut inner = self.lock();
        let entry = match incarnation {
            None => entry(&mut inner, peer, now),
            Some(incarnation) => match bound(&mut inner, peer, incarnation, now) {
                Some(e) => e,
                // An earlier incarnation's view, late: the newer one's stands.
                None => return,
            },
        };
        entry
            .view
            .estimates_mut()
            .seed_availability(remote.view.estimates.availability);
        entry.pending_at_poll = entry.pending;
        entry.unreachable_since = None;
        if entry.view.state() == State::Draining && remote.view.state != State::Draining {
            // Back after draining at the same address: a restarted agent, a new history.
            let incarnation = entry.incarnation;
            *entry = fresh_entry(peer, now);
            entry.incarnation = incarnation;
        }
        let t = match remote.view.state {
            State::Draining => entry.view.drain(now),
            // Parole is for agents new to the fleet, which their own view shows; one that proved
            // itself there is not made to prove itself again to every caller.
            State::Healthy => entry.view.vouch(now),
            // The peer was out by its own view too and is coming back (restarted, or its cool-off
            // and probe passed): what ejected it here was most likely that same outage, and a
            // caller has no probe of its own to see the return. Its own ramp bounds its share.
            State::Recovering => entry.view.follow_recovery(now),
            _ => None,
        };
        entry.remote = Some((remote, now));
        drop(inner);
        if let Some(t) = t {
            self.transitioned(&peer.name, t);
        }
    }

    /// The freshest headroom heard of a `budget_group` on `credential` from the members that
    /// may speak for it, and the time to its reset, when a fresh one is known.
    pub(crate) fn group_headroom(
        &self,
        group: &str,
        credential: u64,
        now: Instant,
    ) -> Option<(f64, Duration)> {
        let groups = self.budget_groups.lock().unwrap_or_else(|p| p.into_inner());
        Some((
            groups.headroom(group, credential, now)?,
            groups.reset_in(group, credential, now)?,
        ))
    }

    /// A member's figures for its groups speak for the other members only when the policy's
    /// `model_budgets.groups.<group>.published_by` lists the identity this caller has seen it
    /// prove: an answered call over mutual TLS to the identity it announces. Otherwise the
    /// member speaks only for itself (its own view carries the figure).
    fn hear_group_figures(&self, peer: &Peer, budgets: &[PublishedBudget], now: Instant) {
        let snapshot = self.store.snapshot();
        let policy = &snapshot.policy.model_budgets;
        let proven = peer
            .verified_identity(snapshot.mtls_mode())
            .filter(|_| self.answered(peer));
        self.budget_groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .heard(budgets, now, |group| policy.may_publish(group, proven));
    }

    /// Whether this caller has had an answer from `peer` (its entry now): the handshake of that
    /// call proved the identity `peer` announces.
    fn answered(&self, peer: &Peer) -> bool {
        self.lock()
            .get(&peer.name)
            .is_some_and(|e| e.address == peer.address && e.outcomes.success > 0)
    }

    /// Gossip routes to this incarnation of `peer` now: an entry about an earlier one (the same
    /// agent before it restarted, at the same address or not) starts afresh, so nothing the
    /// caller saw of the old process — an ejection, a drain, failures while it was down —
    /// holds the new one back.
    pub(crate) fn bind_incarnation(&self, peer: &Peer, incarnation: u64) {
        let _ = bound(&mut self.lock(), peer, incarnation, Instant::now());
    }

    /// Forgets peers no longer known (a dead gossip member, a static peer removed by a reload).
    pub(crate) fn retain(&self, names: &std::collections::HashSet<String>) {
        self.lock().retain(|name, _| names.contains(name));
    }

    /// Sets the peer gauges from the current views.
    pub(crate) fn publish(&self, snapshot: &Snapshot) {
        let status = self.status(snapshot);
        let views = status.iter().map(|p| {
            let gauges = crate::metrics::PeerGauges {
                state: p.effective_state,
                cap: p.effective_cap,
                score: p.last_score.unwrap_or(0.0),
            };
            (p.name.as_str(), gauges)
        });
        let limits = crate::metrics::PeerSeriesLimits {
            max_peers: snapshot.policy.metrics.max_peer_series,
            idle_timeout: snapshot.policy.metrics.idle_timeout.get(),
        };
        self.metrics.peers(limits, views);
        let fleet = self.compute_fleet_demand(snapshot);
        self.metrics.capability_demand(fleet.iter().map(|c| {
            let gauges = crate::metrics::CapabilityGauges {
                demand_ratio: c.ratio,
                capacity: c.capacity,
            };
            (c.name.as_str(), gauges)
        }));
        *self.fleet_demand.lock().unwrap_or_else(|p| p.into_inner()) = fleet;
    }

    /// The fleet's demand per capability as of the last refresh: what `/metrics` shows.
    pub(crate) fn fleet_demand(&self) -> Vec<CapabilityDemand> {
        self.fleet_demand
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every agent's self-view this sidecar trusts now (its peers' by gossip or poll, with the
    /// same freshness rule as scoring, and its own agent's), folded per capability.
    fn compute_fleet_demand(&self, snapshot: &Snapshot) -> Vec<CapabilityDemand> {
        let now = Instant::now();
        let lifetime = self_view_lifetime(snapshot);
        let own = self.own_agent.as_ref().map(|local| local.self_view());
        let inner = self.lock();
        let peers = inner.values().filter_map(|e| {
            let (view, at) = e.remote.as_ref()?;
            let fresh = e.from_gossip || now.saturating_duration_since(*at) <= lifetime;
            // Never counted twice should the own agent appear among the peers.
            let own_twice = own.as_ref().is_some_and(|o| o.name == view.name);
            (fresh && !own_twice).then_some(view)
        });
        demand::fleet_demand(peers.chain(own.as_ref()))
    }

    pub(crate) fn status(&self, snapshot: &Snapshot) -> Vec<PeerStatus> {
        let now = Instant::now();
        let (ep, sp) = (&snapshot.estimate_params, &snapshot.state_params);
        let mut ticked = Vec::new();
        let mut inner = self.lock();
        let mut out: Vec<PeerStatus> = inner
            .iter_mut()
            .map(|(name, e)| {
                if let Some(t) = e.view.tick(now, sp) {
                    ticked.push((name.clone(), t));
                }
                let view = e.view.snapshot(now, ep, sp);
                let remote = e.remote.as_ref().map(|(r, _)| r.view);
                let (effective_state, effective_cap) = match remote {
                    Some(r) if r.cap < view.cap => (r.state, r.cap),
                    _ => (view.state, view.cap),
                };
                PeerStatus {
                    name: name.clone(),
                    address: e.address.clone(),
                    effective_state,
                    effective_cap,
                    view,
                    last_score: e.last_score,
                    last_factors: e.last_factors,
                    self_view: e.remote.as_ref().map(|(r, _)| r.clone()),
                    self_view_age_s: e
                        .remote
                        .as_ref()
                        .map(|(_, at)| now.saturating_duration_since(*at).as_secs_f64()),
                    last_transition: e.last_transition.clone().map(TransitionRecord::aged),
                    outcomes: e.outcomes,
                }
            })
            .collect();
        drop(inner);
        // A time-driven move (a cool-off ending) seen first here is a transition like any other.
        for (name, t) in ticked {
            self.transitioned(&name, t);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The last transitions of this caller's views of its peers, newest first.
    pub(crate) fn transitions(&self) -> Vec<TransitionRecord> {
        self.transitions.recent()
    }

    fn transitioned(&self, peer: &str, t: reach::Transition) {
        tracing::info!(
            view = "peer",
            peer,
            from = t.from.as_str(),
            to = t.to.as_str(),
            reason = t.reason,
            "state transition"
        );
        self.metrics.transition("peer", peer, t);
        let record = TransitionRecord::new("peer", peer, t);
        if let Some(e) = self.lock().get_mut(peer) {
            e.last_transition = Some(record.clone());
        }
        self.transitions.push(record);
    }

    fn lock(&self) -> MutexGuard<'_, FastMap<String, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The most slots (and calls in flight, and queued) a peer's self-view may claim.
const MAX_PEER_SLOTS: usize = 100_000;

/// A self-view comes from another process: keep its figures in range before they enter a score,
/// so a confused or hostile peer cannot give itself an outsized share.
fn sanitize(remote: &mut SelfView) {
    let unit = |x: f64| {
        if x.is_finite() {
            x.clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    let v = &mut remote.view;
    v.cap = unit(v.cap);
    v.estimates.availability = unit(v.estimates.availability);
    v.estimates.saturation = unit(v.estimates.saturation);
    v.estimates.saturation_predicted = unit(v.estimates.saturation_predicted);
    // The bounds a sidecar's own bootstrap accepts (`agent.max_concurrency`): a member claiming
    // more slots, or more calls, than any sidecar can have would skew the fleet's demand ratio
    // (`demand.rs`) that autoscalers read.
    remote.max_concurrency = remote.max_concurrency.clamp(1, MAX_PEER_SLOTS);
    remote.in_flight = remote.in_flight.min(MAX_PEER_SLOTS);
    remote.queued = remote.queued.min(MAX_PEER_SLOTS);
    for c in &mut remote.capabilities {
        for p in c.tags.values_mut() {
            *p = unit(*p);
        }
        c.cost = if c.cost.is_finite() {
            c.cost.max(0.0)
        } else {
            0.0
        };
    }
}

/// One attempt in flight on a peer. Dropped without `finish` (the caller gave up, or the handler
/// was cancelled), it ends the attempt without evidence either way.
#[derive(Debug)]
pub(crate) struct Pending<'v> {
    views: &'v PeerViews,
    peer: &'v Peer,
    /// The entry the attempt counts in (`Entry::generation`).
    generation: u64,
    started: Instant,
    overdue_after: Duration,
    ended: Ended,
}

/// How an attempt in flight ended, as far as dropping it is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// Not: given up (dropped), it may still count as a timeout.
    Not,
    /// With no evidence: it only stops counting as in flight.
    Discarded,
    /// With its evidence recorded, which took it out of the in-flight count.
    Recorded,
}

/// Where evidence about a peer comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// Outside an attempt (its sidecar did not answer a poll).
    #[cfg(test)]
    Outside,
    /// An attempt begun on the entry of this generation, ending with it.
    Ending(u64),
}

impl Pending<'_> {
    /// Ends the attempt at `now` with what this caller saw, under the call's config snapshot.
    pub(crate) fn finish(mut self, signal: Signal, snapshot: &Snapshot, now: Instant) {
        self.ended = Ended::Recorded;
        let source = Source::Ending(self.generation);
        self.views.record(self.peer, signal, snapshot, source, now);
    }

    /// Ends the attempt with no evidence either way (nothing ran).
    pub(crate) fn discard(mut self) {
        self.ended = Ended::Discarded;
    }
}

impl Drop for Pending<'_> {
    /// An attempt given up without an answer (the caller's deadline, the caller gone) says
    /// nothing about the peer — unless it waited far longer than the peer usually takes.
    fn drop(&mut self) {
        let now = match self.ended {
            Ended::Recorded => return,
            Ended::Discarded => return self.views.end(self.peer, self.generation),
            Ended::Not => Instant::now(),
        };
        let waited = now.saturating_duration_since(self.started);
        if waited < self.overdue_after {
            return self.views.end(self.peer, self.generation);
        }
        let snapshot = self.views.store.snapshot();
        let signal = Signal::Timeout(waited);
        let source = Source::Ending(self.generation);
        self.views.record(self.peer, signal, &snapshot, source, now);
    }
}

/// The least an unanswered attempt must have waited to count against its peer.
const OVERDUE_FLOOR: Duration = Duration::from_secs(1);

/// The entry for `peer`; a peer seen at a new address starts over (a restarted agent is a new
/// agent: its old address must not keep its history).
fn entry<'m>(map: &'m mut FastMap<String, Entry>, peer: &Peer, now: Instant) -> &'m mut Entry {
    // Looked up by `&str` first: the common case allocates nothing.
    if !map.contains_key(peer.name.as_str()) {
        map.insert(peer.name.clone(), fresh_entry(peer, now));
    }
    let Some(e) = map.get_mut(peer.name.as_str()) else {
        unreachable!("inserted above")
    };
    if e.address != peer.address {
        *e = fresh_entry(peer, now);
    }
    e
}

/// The entry for `peer` if it is still the one of `generation` (not started afresh since).
fn same_entry<'m>(
    map: &'m mut FastMap<String, Entry>,
    peer: &Peer,
    generation: u64,
) -> Option<&'m mut Entry> {
    map.get_mut(peer.name.as_str())
        .filter(|e| e.generation == generation && e.address == peer.address)
}

/// The entry for `peer`, bound to gossip's `incarnation` of it: one about an earlier
/// incarnation starts afresh; `None` if `incarnation` is older than the one bound (late news).
fn bound<'m>(
    map: &'m mut FastMap<String, Entry>,
    peer: &Peer,
    incarnation: u64,
    now: Instant,
) -> Option<&'m mut Entry> {
    let e = entry(map, peer, now);
    match e.incarnation {
        Some(known) if incarnation < known => return None,
        Some(known) if incarnation > known => {
            tracing::info!(
                peer = %peer.name,
                address = %peer.address,
                "peer restarted (a new incarnation): this caller's view of it starts afresh"
            );
            *e = fresh_entry(peer, now);
        }
        _ => {}
    }
    e.incarnation = Some(incarnation);
    Some(e)
}

/// Entries' generations, unique in the process.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

fn fresh_entry(peer: &Peer, now: Instant) -> Entry {
    Entry {
        address: peer.address.clone(),
        from_gossip: peer.source == "gossip",
        incarnation: None,
        generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
        view: ReachView::new(now, false),
        remote: None,
        last_score: None,
        last_factors: None,
        pending: 0,
        pending_at_poll: 0,
        unreachable_since: None,
        last_transition: None,
        outcomes: Outcomes::default(),
    }
}
