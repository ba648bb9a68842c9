//! The local agent as its own sidecar sees it: inbound outcomes, business probes and the agent's
//! busy reports feed one reach view — the view that catches a fake-online agent — which peers read
//! at `GET /reach/v1/self` on the inbound port.

mod admission;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

pub(crate) use admission::{Admission, AdmissionLimits, Load, Slot};

use crate::budget::{ModelBudgets, PublishedBudget};
use crate::config::{ConfigStore, RouteMode, SchemaDigest, SkillFacts, Snapshot, ToolFacts};
use crate::metrics::Metrics;
use crate::quality::{QualityStatus, RunReport};
use crate::reach::{
    self, QualityMark, ReachView, Signal, Transition, TransitionLog, TransitionRecord, ViewSnapshot,
};

/// Path of the self-view ([`SelfView`]) on every sidecar's inbound port.
pub(crate) const SELF_PATH: &str = "/reach/v1/self";

/// When production traffic last succeeded, and last failed or was refused.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Traffic {
    pub(crate) last_success: Option<Instant>,
    pub(crate) last_trouble: Option<Instant>,
}

impl Traffic {
    /// Traffic vouches for the agent over the last `window`: it succeeded, and nothing went wrong.
    pub(crate) fn vouches(&self, now: Instant, window: std::time::Duration) -> bool {
        let within =
            |at: Option<Instant>| at.is_some_and(|at| now.saturating_duration_since(at) < window);
        within(self.last_success) && !within(self.last_trouble)
    }
}

/// What the last business probe found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub(crate) capability: String,
    pub(crate) ok: bool,
    /// Why it failed: `status 429`, `body mismatch`, `timeout`, `connect error: …`.
    pub reason: Option<String>,
    pub(crate) latency_ms: f64,
    #[serde(skip)]
    pub(crate) at: Option<Instant>,
    /// Seconds since the probe ran, filled in when shown.
    pub(crate) age_s: f64,
}

/// One capability as published to peers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PublishedCapability {
    pub name: String,
    pub tags: BTreeMap<String, f64>,
    pub(crate) timeout_ms: u64,
    pub(crate) mode: RouteMode,
    pub(crate) cost: f64,
    #[serde(default)]
    pub(crate) idempotent: bool,
    /// The digest of the output schema its answers are checked against (`sha256:<hex>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<SchemaDigest>,
    /// Streaming and media types, for a capability imported from the agent's A2A card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) a2a: Option<SkillFacts>,
    /// The MCP server's tools, for the capability its tools are entries of (`agent.mcp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tools: Vec<ToolFacts>,
}

/// The document at `GET /reach/v1/self`: this agent's profile and its own live view.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SelfView {
    pub(crate) name: String,
    pub(crate) zone: String,
    pub(crate) region: String,
    pub(crate) max_concurrency: usize,
    pub capabilities: Vec<PublishedCapability>,
    pub view: ViewSnapshot,
    pub(crate) in_flight: usize,
    pub(crate) queued: usize,
    pub(crate) last_probe: Option<ProbeRecord>,
    /// Its model budgets as its providers' answers state them (docs/model-budgets.md); absent
    /// from an older sidecar's view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budget: Vec<PublishedBudget>,
}

#[derive(Debug)]
pub(crate) struct LocalAgent {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    admission: Arc<Admission>,
    inner: Mutex<Inner>,
    /// Set when production traffic shows trouble: the prober confirms it now, not an interval later.
    probe_now: AtomicBool,
    /// Whether a prober runs at all: without one, ejection cannot wait for a passing probe.
    prober_running: AtomicBool,
    /// The own view's last transitions, with their reasons.
    transitions: TransitionLog,
    /// The agent's A2A card as last read (`agent.a2a`), served to peers on the inbound port.
    card: arc_swap::ArcSwapOption<bytes::Bytes>,
    /// What the agent's providers said of its model budget, learned by the outbound endpoint.
    budgets: Arc<ModelBudgets>,
}

#[derive(Debug)]
struct Inner {
    view: ReachView,
    last_probe: Option<ProbeRecord>,
    /// When production traffic last succeeded: fresh evidence that makes a probe unnecessary…
    last_success: Option<Instant>,
    /// …unless it failed or was refused since.
    last_trouble: Option<Instant>,
    reported_in_flight: Option<(usize, Instant)>,
    /// Capability → its last golden-task run and when it ran.
    quality: BTreeMap<String, (RunReport, Instant)>,
}

impl LocalAgent {
    pub(crate) fn new(
        store: Arc<ConfigStore>,
        metrics: Arc<Metrics>,
        admission: Arc<Admission>,
    ) -> Self {
        let probe_gated = store.snapshot().has_probes();
        Self {
            store,
            metrics,
            admission,
            inner: Mutex::new(Inner {
                view: ReachView::new(Instant::now(), probe_gated),
                last_probe: None,
                last_success: None,
                last_trouble: None,
                reported_in_flight: None,
                quality: BTreeMap::new(),
            }),
            probe_now: AtomicBool::new(false),
            prober_running: AtomicBool::new(true),
            transitions: TransitionLog::default(),
            card: arc_swap::ArcSwapOption::empty(),
            budgets: Arc::default(),
        }
    }

    /// The agent's model budgets, which the outbound endpoint teaches.
    pub(crate) fn budgets(&self) -> &Arc<ModelBudgets> {
        &self.budgets
    }

    /// The agent's A2A card as last read, if it publishes one.
    pub(crate) fn card(&self) -> Option<Arc<bytes::Bytes>> {
        self.card.load_full()
    }

    /// Keeps a new read of the agent's card (`None`: the card is no longer imported).
    pub(crate) fn set_card(&self, card: Option<bytes::Bytes>) {
        self.card.store(card.map(Arc::new));
    }

    /// A production request's outcome, as the inbound side measured it under the call's config
    /// snapshot, at `now` (when the call ended).
    pub(crate) fn observe(&self, signal: Signal, snapshot: &Snapshot, now: Instant) {
        let mut inner = self.lock();
        if matches!(signal, Signal::Success(_)) {
            inner.last_success = Some(now);
        } else {
            inner.last_trouble = Some(now);
            self.probe_now.store(true, Ordering::Release);
        }
        let t = inner.view.observe(
            signal,
            now,
            &snapshot.estimate_params,
            &snapshot.state_params,
        );
        drop(inner);
        self.transitioned(t);
    }

    /// A business probe's result.
    pub(crate) fn probed(&self, record: ProbeRecord, signal: Signal) {
        let snapshot = self.store.snapshot();
        let now = Instant::now();
        let mut inner = self.lock();
        let t = inner.view.probed(
            signal,
            record.ok,
            now,
            &snapshot.estimate_params,
            &snapshot.state_params,
        );
        inner.last_probe = Some(record);
        drop(inner);
        self.transitioned(t);
    }

    /// A golden-task run's report. A run that judged no task leaves the last verdict standing
    /// (with this run's task errors shown).
    pub(crate) fn quality_ran(&self, mut report: RunReport) {
        let snapshot = self.store.snapshot();
        if let Some(similarity) = report.similarity {
            self.metrics.quality(&report.capability, similarity);
        }
        let mut inner = self.lock();
        if report.similarity.is_none() {
            if let Some((last, _)) = inner.quality.get(&report.capability) {
                report.similarity = last.similarity;
                report.degraded = last.degraded;
            }
        }
        inner
            .quality
            .insert(report.capability.clone(), (report, Instant::now()));
        let changed = settle_quality(&mut inner, &snapshot);
        drop(inner);
        self.quality_changed(changed);
    }

    fn quality_changed(&self, changed: Option<Option<QualityMark>>) {
        let Some(mark) = changed else {
            return;
        };
        tracing::info!(
            view = "self",
            agent = %self.store.snapshot().bootstrap.agent.name,
            similarity = mark.map_or(1.0, |m| m.similarity),
            degraded = mark.is_some_and(|m| m.degraded),
            "quality verdict changed"
        );
    }

    /// The last golden-task run of each capability that has golden tasks.
    pub(crate) fn quality(&self) -> Vec<QualityStatus> {
        self.lock()
            .quality
            .values()
            .map(|(report, at)| QualityStatus {
                report: report.clone(),
                age_s: at.elapsed().as_secs_f64(),
            })
            .collect()
    }

    /// Out because the agent refuses connections: the prober checks it every `fast_interval`.
    pub(crate) fn is_unreachable(&self) -> bool {
        self.lock().view.is_unreachable()
    }

    /// The agent accepts connections again: back in, ramping, at once.
    pub(crate) fn reachable(&self) {
        let snapshot = self.store.snapshot();
        let t = self.lock().view.event(
            crate::reach::Event::Reachable,
            Instant::now(),
            &snapshot.state_params,
        );
        self.transitioned(t);
    }

    /// `PUT /reach/v1/busy` or a `reach-busy` response header.
    pub(crate) fn report_busy(&self, busy: bool, in_flight: Option<usize>, snapshot: &Snapshot) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner
            .view
            .estimates_mut()
            .report_busy(busy, now, &snapshot.estimate_params);
        inner.reported_in_flight = in_flight.map(|n| (n, now));
    }

    /// A `reach-load` response header.
    pub(crate) fn report_load(&self, load: f64) {
        self.lock()
            .view
            .estimates_mut()
            .report_load(load, Instant::now());
    }

    /// The sidecar is shutting down: tell peers to stop sending new work.
    pub(crate) fn drain(&self) {
        let t = self.lock().view.drain(Instant::now());
        self.transitioned(t);
    }

    /// The probe thread could not start: leave ejection on the cool-off alone.
    pub(crate) fn prober_unavailable(&self) {
        self.prober_running.store(false, Ordering::Release);
    }

    /// Whether traffic asked for a probe since the last call (and clears the request).
    pub(crate) fn take_probe_request(&self) -> bool {
        self.probe_now.swap(false, Ordering::AcqRel)
    }

    /// Applies time-driven transitions and refreshes the load; returns the view now and what
    /// production traffic last said.
    pub(crate) fn refresh(&self) -> (ViewSnapshot, Traffic) {
        let snapshot = self.store.snapshot();
        let (ep, sp) = (&snapshot.estimate_params, &snapshot.state_params);
        let now = Instant::now();
        let load = self.admission.load();
        let mut inner = self.lock();
        // A reload may add or remove probes: an agent without them leaves ejection on the
        // cool-off alone, or it would never leave.
        let gated =
            self.store.snapshot().has_probes() && self.prober_running.load(Ordering::Acquire);
        inner.view.set_probe_gated(gated);
        let reported = inner
            .reported_in_flight
            .filter(|(_, at)| now.saturating_duration_since(*at) <= ep.busy_ttl)
            .map_or(0, |(n, _)| n);
        let agent = &snapshot.bootstrap.agent;
        inner.view.estimates_mut().set_load_quietly(
            reach::Load {
                in_flight: load.in_flight.max(reported),
                max_concurrency: agent.max_concurrency.get(),
                queued: load.queued,
                queue_capacity: agent.queue.capacity,
            },
            now,
            ep,
        );
        let t = inner.view.tick(now, sp);
        // Golden tasks removed by a reload take their verdict with them.
        let quality = settle_quality(&mut inner, &snapshot);
        let view = inner.view.snapshot(now, ep, sp);
        let traffic = Traffic {
            last_success: inner.last_success,
            last_trouble: inner.last_trouble,
        };
        drop(inner);
        self.transitioned(t);
        self.quality_changed(quality);
        (view, traffic)
    }

    /// The state that bars new work (ejected or draining) at `now`, if the agent is in one.
    /// Checked on every inbound request, so it only ticks the state machine.
    pub(crate) fn barred(&self, snapshot: &Snapshot, now: Instant) -> Option<crate::reach::State> {
        use crate::reach::State;
        let mut inner = self.lock();
        let t = inner.view.tick(now, &snapshot.state_params);
        let state = inner.view.state();
        drop(inner);
        self.transitioned(t);
        matches!(state, State::Ejected | State::Draining).then_some(state)
    }

    /// Refreshes the view and sets the self-view gauges; run once a second.
    pub(crate) fn publish(&self) {
        let (view, _) = self.refresh();
        self.metrics.self_view(&view);
    }

    pub(crate) fn load(&self) -> Load {
        self.admission.load()
    }

    pub(crate) fn last_probe(&self) -> Option<ProbeRecord> {
        let mut record = self.lock().last_probe.clone()?;
        record.age_s = record.at.map_or(0.0, |at| at.elapsed().as_secs_f64());
        Some(record)
    }

    /// The document peers read.
    pub(crate) fn self_view(&self) -> SelfView {
        let (view, _) = self.refresh();
        let snapshot = self.store.snapshot();
        let agent = &snapshot.bootstrap.agent;
        let load = self.admission.load();
        SelfView {
            name: agent.name.to_string(),
            zone: agent.zone.clone(),
            region: agent.region.clone(),
            max_concurrency: agent.max_concurrency.get(),
            capabilities: agent
                .capabilities
                .iter()
                .map(|c| PublishedCapability {
                    name: c.name.to_string(),
                    tags: c.tags.iter().map(|(k, v)| (k.clone(), v.get())).collect(),
                    timeout_ms: millis(c.timeout_or(snapshot.policy.timeouts.request.get())),
                    mode: c.mode,
                    cost: c.cost.0,
                    idempotent: c.idempotent,
                    output_schema: c
                        .output_schema
                        .as_ref()
                        .and_then(|s| s.compiled())
                        .map(|s| s.digest()),
                    a2a: c.card.clone(),
                    tools: c.mcp.as_ref().map(|m| m.tools.clone()).unwrap_or_default(),
                })
                .collect(),
            view,
            in_flight: load.in_flight,
            queued: load.queued,
            last_probe: self.last_probe(),
            budget: self.budgets.published(
                snapshot
                    .policy
                    .targets
                    .iter()
                    .filter_map(|t| t.budget_group.as_ref().map(|g| g.as_str())),
                Instant::now(),
            ),
        }
    }

    fn transitioned(&self, t: Option<Transition>) {
        if let Some(t) = t {
            let agent = self.store.snapshot().bootstrap.agent.name.to_string();
            tracing::info!(view = "self", agent = %agent, from = t.from.as_str(), to = t.to.as_str(), reason = t.reason, "state transition");
            self.metrics.transition("self", &agent, t);
            self.transitions
                .push(TransitionRecord::new("self", &agent, t));
        }
    }

    /// The own view's last transitions, newest first.
    pub(crate) fn transitions(&self) -> Vec<TransitionRecord> {
        self.transitions.recent()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Forgets the runs of capabilities that lost their golden tasks in a reload, and marks the view
/// with what the remaining runs say. Returns the new mark when `degraded` changed.
fn settle_quality(inner: &mut Inner, snapshot: &Snapshot) -> Option<Option<QualityMark>> {
    let agent = &snapshot.bootstrap.agent;
    inner
        .quality
        .retain(|name, _| agent.capability(name).is_some_and(|c| c.quality.is_some()));
    let mark = crate::quality::mark(inner.quality.values().map(|(r, _)| r));
    inner.view.set_quality(mark).then_some(mark)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Bootstrap, ConfigPaths, Policy, QualitySpec};
    use crate::quality::RunReport;
    use crate::reach::{EstimateParams, StateParams};

    #[tokio::test]
    async fn a_drifted_run_marks_the_view_and_a_reload_without_golden_tasks_clears_it() {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 9));
        let plain = Bootstrap::local("a", addr, &["summarize"]).unwrap_or_else(|e| panic!("{e}"));
        let mut golden = plain.clone();
        golden.agent.capabilities[0].quality = Some(QualitySpec {
            interval: crate::config::HumanDuration::from_secs(60),
            threshold: 0.8,
            tasks: Vec::new(),
        });
        let store = Arc::new(ConfigStore::new(
            golden,
            Policy::default(),
            ConfigPaths::default(),
        ));
        let local = LocalAgent::new(
            store.clone(),
            Arc::new(Metrics::new("a")),
            Admission::new(1),
        );
        let run = |similarity: Option<f64>| RunReport {
            capability: "summarize".into(),
            similarity,
            threshold: 0.8,
            degraded: similarity.is_some_and(|s| s < 0.8),
            tasks: Vec::new(),
        };
        local.quality_ran(run(Some(0.3)));
        let mark = local.refresh().0.quality;
        assert_eq!(mark.map(|m| (m.similarity, m.degraded)), Some((0.3, true)));
        // A run that judged nothing keeps the verdict.
        local.quality_ran(run(None));
        assert_eq!(local.quality()[0].report.similarity, Some(0.3));
        assert!(local.refresh().0.quality.is_some_and(|m| m.degraded));
        store.replace(plain, Policy::default());
        assert_eq!(local.refresh().0.quality, None);
        assert!(local.quality().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_self_view_round_trips_through_json() {
        let now = Instant::now();
        let view = ReachView::new(now, false).snapshot(
            now,
            &EstimateParams::default(),
            &StateParams::default(),
        );
        let doc = SelfView {
            name: "coder-1".into(),
            zone: "a".into(),
            region: "r".into(),
            max_concurrency: 4,
            capabilities: vec![PublishedCapability {
                name: "code-review".into(),
                tags: [("python".to_owned(), 0.9)].into_iter().collect(),
                timeout_ms: 30_000,
                mode: RouteMode::Sync,
                cost: 0.0,
                idempotent: false,
                output_schema: None,
                a2a: None,
                tools: Vec::new(),
            }],
            view,
            in_flight: 1,
            queued: 0,
            last_probe: Some(ProbeRecord {
                capability: "code-review".into(),
                ok: false,
                reason: Some("status 429".into()),
                latency_ms: 3.0,
                at: None,
                age_s: 1.0,
            }),
            budget: vec![PublishedBudget {
                group: Some("acme".into()),
                figure: None,
                credential: Some(7),
            }],
        };
        let text = serde_json::to_string(&doc).unwrap_or_default();
        let back: Result<SelfView, _> = serde_json::from_str(&text);
        assert!(back.is_ok(), "{back:?}\n{text}");
    }
}
