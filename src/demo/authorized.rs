//! The demo's last act: identity and authorization. Every sidecar of the fleet has had a
//! certificate from the start (the fleet speaks mutual TLS in `permissive` mode, so the hostile
//! act's stranger could still talk plaintext). Now the fleet policy turns `strict` and allows
//! `code-review` only to the agents' namespace, live. An intruder with a valid certificate of
//! another namespace joins the fleet and calls `code-review`: every call is refused 403
//! `forbidden` by the agents' sidecars and none reaches an agent; a plaintext stranger is refused
//! at the handshake; the caller's own traffic goes on.

use std::time::Duration;

use serde::Serialize;

use super::drive::{self, Calls};
use super::{DemoError, Fleet, CAPABILITY};
use crate::config::{Bootstrap, CapabilityAuthorization, MtlsMode, Policy};
use crate::http::{body, client, headers};
use crate::identity::IdentityPattern;

/// Calls the intruder makes.
const INTRUDER_CALLS: u64 = 20;

#[derive(Clone, Debug, Serialize)]
pub struct AuthorizationSummary {
    /// The caller's SPIFFE ID, as the agents' sidecars saw it.
    pub caller_identity: String,
    /// What `code-review` was opened to.
    pub allowed: String,
    pub intruder_identity: String,
    pub intruder_calls: u64,
    /// Answered 403 with `reach-reason: forbidden`.
    pub intruder_forbidden: u64,
    /// Business calls the agents saw from anyone during the intruder's calls, beyond the
    /// caller's: must be 0.
    pub reached_agents: u64,
    /// `reach_authz_denied_total` summed over the agents' sidecars.
    pub denied_counted: u64,
    /// A plaintext request straight at an agent's inbound port in strict mode: its status.
    pub plaintext_status: u16,
    /// `reach_tls_handshake_failures_total{reason="plaintext"}` at that agent.
    pub plaintext_refusals_counted: u64,
    /// The caller's traffic meanwhile, over mutual TLS.
    pub calls: u64,
    pub failed: u64,
}

pub(super) async fn run(
    fleet: &mut Fleet,
    duration: Duration,
    concurrency: usize,
) -> Result<AuthorizationSummary, DemoError> {
    let allowed = format!("{}/ns/agents/sa/*", super::TRUST_DOMAIN);
    let pattern = IdentityPattern::parse(&allowed).map_err(DemoError::Config)?;
    fleet.update_policy(|p| strict(p, &pattern));

    // The intruder: a certificate from the fleet's CA, but of another namespace.
    let intruder_identity = format!("{}/ns/guests/sa/intruder", super::TRUST_DOMAIN);
    let bootstrap = Bootstrap::local("intruder", ([127, 0, 0, 1], 9).into(), &[])
        .map_err(DemoError::Config)?
        .with_gossip(&fleet.seed, fleet.key_dir.join("gossip.key"));
    let bootstrap = fleet.with_tls(bootstrap, &intruder_identity)?;
    let intruder = super::start_sidecar(bootstrap, fleet.policy.clone()).await?;
    let knows_all = super::poll(Duration::from_secs(10), || {
        intruder.status().peers.len() >= fleet.agents.len()
    })
    .await
    .is_some();
    // Its calls alone, so what reaches an agent meanwhile is exactly what it got through.
    if !knows_all {
        return Err(DemoError::Config(
            "the intruder did not find the fleet within 10 s".to_owned(),
        ));
    }
    let denied_before = fleet.metric_sum("reach_authz_denied_total{").await;
    let agents_before: u64 = fleet.agents.iter().map(|(a, _)| a.stats().business).sum();
    let mut forbidden = 0;
    let http = client::build(&Policy::default());
    for _ in 0..INTRUDER_CALLS {
        let request = http::Request::post(format!("http://{}/review", intruder.addrs.outbound))
            .header(headers::CAPABILITY, CAPABILITY)
            .body(body::full("steal the code"))
            .map_err(|e| DemoError::Config(e.to_string()))?;
        if let Ok(response) = http.request(request).await {
            let reason = response.headers().get(headers::REASON).cloned();
            if response.status() == 403 && reason.is_some_and(|r| r == "forbidden") {
                forbidden += 1;
            }
        }
    }
    let agents_after: u64 = fleet.agents.iter().map(|(a, _)| a.stats().business).sum();
    let reached = agents_after.saturating_sub(agents_before);
    let denied_counted = fleet
        .metric_sum("reach_authz_denied_total{")
        .await
        .saturating_sub(denied_before);

    // A plaintext stranger at an agent's inbound port.
    let (_, target) = &fleet.agents[0];
    let plain = http::Request::post(format!("http://{}/review", target.addrs.inbound))
        .header(headers::CAPABILITY, CAPABILITY)
        .body(body::full("x"))
        .map_err(|e| DemoError::Config(e.to_string()))?;
    let plaintext_status = http.request(plain).await.map_or(0, |r| r.status().as_u16());
    let plaintext_refusals_counted = super::metric(
        target,
        "reach_tls_handshake_failures_total{reason=\"plaintext\"}",
    )
    .await;
    intruder.shutdown().await;

    // The caller's own calls go on over strict mutual TLS.
    let calls = Calls::default();
    drive::traffic(
        fleet.caller.addrs.outbound,
        CAPABILITY,
        duration,
        concurrency,
        calls.clone(),
    )
    .await;
    let calls = calls.take();
    Ok(AuthorizationSummary {
        caller_identity: format!("{}/ns/agents/sa/caller", super::TRUST_DOMAIN),
        allowed,
        intruder_identity,
        intruder_calls: INTRUDER_CALLS,
        intruder_forbidden: forbidden,
        reached_agents: reached,
        denied_counted,
        plaintext_status,
        plaintext_refusals_counted,
        calls: calls.len() as u64,
        failed: calls.iter().filter(|c| !c.ok).count() as u64,
    })
}

/// `strict` mutual TLS, and `code-review` opened to `allowed` only.
fn strict(policy: &mut Policy, allowed: &IdentityPattern) {
    policy.mtls.mode = Some(MtlsMode::Strict);
    policy.authorization.capabilities.insert(
        CAPABILITY.to_owned(),
        CapabilityAuthorization {
            allow: vec![allowed.clone()],
        },
    );
}
