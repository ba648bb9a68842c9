//! Observe-only mode (`observe_only` in the policy, per capability too): the call is routed the
//! way a plain proxy would — round robin over every candidate that serves the capability, one
//! retry on a connect failure, nothing excluded, no caps — while the model still scores the
//! candidates and learns from every answer. Each call records what the model would have chosen
//! and, when that was another agent, whether the one that took the call then failed or was slow:
//! the evidence an operator needs before letting the model decide (`docs/reach-model.md`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;
use tower::ServiceExt;

use super::super::call::{Routed, Try};
use super::super::candidates::{tiers, Plan};
use super::super::{pick, Outbound};
use super::request::{upstream_request, Bodies};
use super::retry::{self, Attempt};
use crate::classify::Outcome;
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::fast_hash::FastMap;
use crate::http::deadline;
use crate::http::step::{answer, Step};
use crate::peers::Scored;

/// Per capability: the round-robin position and what the comparison found so far.
#[derive(Debug, Default)]
pub(crate) struct ObserveLog {
    next: AtomicUsize,
    counts: Mutex<FastMap<String, ObserveCounts>>,
}

/// One capability's comparison of the model with the plain proxy, since start.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ObserveCounts {
    pub calls: u64,
    /// Calls the model would have sent to another agent.
    pub disagreements: u64,
    /// Calls that failed on an agent the model would have avoided.
    pub avoidable_failures: u64,
    /// Latency above the model's pick's expected latency, summed over calls that succeeded on
    /// an agent it would have avoided (ms).
    pub avoidable_latency_ms: f64,
}

impl ObserveLog {
    /// Every capability's counts, by name.
    pub(crate) fn snapshot(&self) -> Vec<(String, ObserveCounts)> {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = counts.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn record(&self, capability: &str, f: impl FnOnce(&mut ObserveCounts)) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        match counts.get_mut(capability) {
            Some(c) => f(c),
            None => f(counts.entry(capability.to_owned()).or_default()),
        }
    }
}

/// Routes one call as a plain proxy and compares with the model's choice.
pub(in crate::outbound) async fn route<B, S>(out: &Outbound, inner: S, plan: Plan) -> Routed<B>
where
    S: Step<Try, Response = Attempt<B>>,
{
    let Plan {
        call,
        route,
        scored,
        tiers,
        // Round robin here: a `fallback` holder is not preferred (a `strict` one is alone).
        prefer: _,
    } = plan;
    let snapshot = call.snapshot;
    let sessions = call.carried.and_then(|c| c.sessions);
    let capability = route.capability.as_str();
    let mut parts = call.parts;
    parts.headers.remove(deadline::TIMEOUT);
    // What the model would have done: the same pick as routing, first attempt.
    let floor = snapshot.policy.zones.tier_min_score;
    let skip = tiers::outside_nearest(&scored, &tiers, &[], floor);
    let model = pick(&scored, &skip, rand::random::<f64>);
    // The plain proxy's order: every candidate, by name, taken in turn.
    let mut order: Vec<usize> = (0..scored.len()).collect();
    order.sort_by(|a, b| scored[*a].peer.name.cmp(&scored[*b].peer.name));
    let start = out.observe.next.fetch_add(1, Ordering::Relaxed);
    let mut bodies = Bodies::of(call.upload, &snapshot);
    let mut last = None;
    for n in 1..=order.len().min(2) {
        let chosen = order[(start + n - 1) % order.len()];
        let Some(body) = bodies.next() else { break };
        let headers = parts.headers.clone();
        let request = upstream_request(&parts, headers, body, &snapshot, capability, n);
        let mut attempt = Try {
            request,
            candidate: scored[chosen].clone(),
            deadline: call.deadline,
            keyed_deadline: None,
            upload: bodies.watch.clone(),
            snapshot: snapshot.clone(),
            // A plain proxy's routing: no first-event deadline.
            first_event: None,
            sessions: sessions.clone(),
        };
        let sent = Instant::now();
        // The only retry here follows a connect failure.
        let span = retry::span(&mut attempt, &parts, capability, n, Some("connect_failed"));
        let mut attempt = answer(inner.clone().oneshot(attempt).await);
        retry::end(span, &mut attempt);
        let elapsed_ms = sent.elapsed().as_secs_f64() * 1000.0;
        let retry = matches!(
            &attempt,
            Attempt::Failed(ReachError::UpstreamConnect { .. })
        );
        compare(
            out, &snapshot, capability, &scored, chosen, model, &attempt, elapsed_ms,
        );
        last = Some((attempt, chosen, n));
        if !retry {
            break;
        }
    }
    let Some((attempt, chosen, n)) = last else {
        return Routed::refused(
            capability,
            ReachError::NoAvailableInstance {
                capability: capability.to_owned(),
                candidates: serde_json::Value::Null,
                attempts: 0,
            },
        );
    };
    let peer = &scored[chosen].peer.name;
    Routed::answered(attempt.into_answer(), capability, peer, n)
}

/// Records one attempt against what the model would have chosen.
#[allow(clippy::too_many_arguments)]
fn compare<B>(
    out: &Outbound,
    snapshot: &Snapshot,
    capability: &str,
    scored: &[Scored],
    chosen: usize,
    model: Option<usize>,
    attempt: &Attempt<B>,
    elapsed_ms: f64,
) {
    // What the classifier says it meant, as metrics and spans label it: anything but success.
    let failed = attempt.outcome().1 != Outcome::Success;
    let same = model == Some(chosen);
    let avoided = !same && model.is_some();
    let expected = model.and_then(|m| scored[m].expected_ms.or(scored[m].latency_ms));
    let extra_ms = match expected {
        Some(ms) if avoided && !failed => (elapsed_ms - ms).max(0.0),
        _ => 0.0,
    };
    out.observe.record(capability, |c| {
        c.calls += 1;
        c.disagreements += u64::from(!same);
        c.avoidable_failures += u64::from(avoided && failed);
        c.avoidable_latency_ms += extra_ms;
    });
    out.metrics.observed(capability, same, avoided && failed);
    if snapshot.policy.decision_log {
        tracing::info!(
            target: "agent_reach::decision",
            direction = "outbound",
            observe_only = true,
            capability,
            chosen = scored[chosen].peer.name.as_str(),
            model = model.map_or("-", |m| scored[m].peer.name.as_str()),
            agreement = if same { "same" } else { "different" },
            failed,
            elapsed_ms,
            "observed"
        );
    }
}
