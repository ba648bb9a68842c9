//! The demo's predicted-saturation act: demand ramps onto one agent of lower capacity (ten times
//! slower, the only one with the tag the calls ask for), a caller at a time. Its sidecar
//! publishes the saturation its load's trend expects a horizon ahead (docs/reach-model.md,
//! "Predicted saturation"); the summary says how much earlier that crossed 0.8 than the
//! saturation itself did, and what was refused.

use std::time::{Duration, Instant};

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde::Serialize;

use super::{round, DemoError, Fleet, CAPABILITY};
use agent_reach::config::{HumanDuration, Policy, Proficiency};
use agent_reach::http::{body, client, headers};
use testkit::Mode;

/// The agent the demand ramps onto (coder-1: no other act leaves it changed).
const WEAK: usize = 0;
/// The tag only it declares during the act, so every call lands on it.
const TAG: &str = "legacy-cobol";
/// One more caller joins every `JOIN_EVERY`, for `ACT`.
const JOIN_EVERY: Duration = Duration::from_millis(250);
const ACT: Duration = Duration::from_millis(4500);
/// The act's horizon: a short act needs a short look ahead (the policy's default is 10 s).
const HORIZON: Duration = Duration::from_secs(2);
/// The saturation both crossings are measured at.
const THRESHOLD: f64 = 0.8;

/// When the predicted and the actual saturation of the weak agent crossed 0.8.
#[derive(Clone, Debug, Serialize)]
pub struct PredictSummary {
    pub agent: String,
    pub horizon_s: f64,
    /// Callers at the end of the ramp (each one call at a time).
    pub callers: usize,
    /// From the ramp's start; `None`: not within the act.
    pub predicted_crossed_s: Option<f64>,
    pub actual_crossed_s: Option<f64>,
    /// How much earlier the prediction crossed.
    pub lead_s: Option<f64>,
    /// Calls its sidecar turned away as saturated during the act.
    pub refused: u64,
    pub calls: u64,
    pub failed: u64,
}

pub(super) async fn run(fleet: &mut Fleet) -> Result<PredictSummary, DemoError> {
    let horizon_before = fleet.policy.estimates.horizon;
    fleet.update_policy(|p| p.estimates.horizon = HumanDuration(HORIZON));
    let (agent, sidecar) = fleet
        .agents
        .get(WEAK)
        .ok_or_else(|| DemoError::Config("no agent for the prediction act".to_owned()))?;
    let name = agent.name().to_owned();
    let tagged = tag(sidecar, true);
    let outbound = fleet.caller.addrs.outbound;
    // Routable once the caller has the profile with the tag (gossip carries it).
    let known = super::poll(Duration::from_secs(5), || {
        fleet
            .caller
            .status()
            .peer_views
            .iter()
            .filter(|p| p.name == name)
            .filter_map(|p| p.self_view.as_ref())
            .flat_map(|v| &v.capabilities)
            .any(|c| c.tags.contains_key(TAG))
    })
    .await;
    if !tagged || known.is_none() {
        return Err(DemoError::Config(
            "the caller never learnt the prediction act's tag".to_owned(),
        ));
    }
    agent.set_mode(Mode::Slow);
    let rejected_before = sidecar.status().inbound.rejected;

    let started = Instant::now();
    let client = client::build(&Policy::default());
    let callers: Vec<_> = (0..)
        .map(|k| JOIN_EVERY * k)
        .take_while(|at| *at < ACT)
        .map(|join| {
            let client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until((started + join).into()).await;
                let (mut calls, mut failed) = (0u64, 0u64);
                while started.elapsed() < ACT {
                    calls += 1;
                    if !tagged_call(&client, outbound).await {
                        failed += 1;
                    }
                }
                (calls, failed)
            })
        })
        .collect();
    let callers_at_end = callers.len();
    // Its own view every 50 ms: each look also feeds the trend (time-aware, any interval).
    let (mut predicted_at, mut actual_at) = (None, None);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    while started.elapsed() < ACT {
        tick.tick().await;
        let e = sidecar.status().self_view.estimates;
        let at = started.elapsed().as_secs_f64();
        if e.saturation_predicted >= THRESHOLD {
            predicted_at.get_or_insert(at);
        }
        if e.saturation >= THRESHOLD {
            actual_at.get_or_insert(at);
        }
    }
    let (mut calls, mut failed) = (0, 0);
    for caller in callers {
        if let Ok((c, f)) = caller.await {
            calls += c;
            failed += f;
        }
    }
    let refused = sidecar
        .status()
        .inbound
        .rejected
        .saturating_sub(rejected_before);
    agent.set_mode(Mode::Normal);
    tag(sidecar, false);
    fleet.update_policy(|p| p.estimates.horizon = horizon_before);
    Ok(PredictSummary {
        agent: name,
        horizon_s: HORIZON.as_secs_f64(),
        callers: callers_at_end,
        predicted_crossed_s: predicted_at.map(round),
        actual_crossed_s: actual_at.map(round),
        lead_s: predicted_at.zip(actual_at).map(|(p, a)| round(a - p)),
        refused,
        calls,
        failed,
    })
}

/// Gives the agent's capability the act's tag, or takes it away; whether the reload took.
fn tag(sidecar: &agent_reach::Sidecar, on: bool) -> bool {
    let snapshot = sidecar.store().snapshot();
    let mut bootstrap = snapshot.bootstrap.clone();
    for c in &mut bootstrap.agent.capabilities {
        if on {
            c.tags.insert(TAG.to_owned(), Proficiency::clamped(1.0));
        } else {
            c.tags.remove(TAG);
        }
    }
    sidecar.store().replace(bootstrap, snapshot.policy.clone())
}

/// One call through the caller that only the tagged agent can take.
async fn tagged_call(client: &client::UpstreamClient, outbound: std::net::SocketAddr) -> bool {
    let request = Request::post(format!("http://{outbound}/review"))
        .header(headers::CAPABILITY, CAPABILITY)
        .header(headers::TAGS, TAG)
        .body(body::full("def f(): pass"));
    let Ok(request) = request else {
        return false;
    };
    match client.request(request).await {
        Ok(response) => {
            let status = response.status();
            response.into_body().collect().await.is_ok() && status == StatusCode::OK
        }
        Err(_) => false,
    }
}
