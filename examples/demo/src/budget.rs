//! The model-budget act: three agents serve `code-review`, each calling its own mock model
//! provider for every task through its own sidecar; coder-2's account is much the smallest. As
//! it drains, the rate-limit headers of its provider's answers lower its model headroom, the
//! caller cuts its share, and it is out of rotation before its provider answers a single 429
//! (docs/model-budgets.md). Then the same fleet again with `model_budgets: { steer: false }` in
//! every sidecar's policy: the headroom is still learned and published, but the caller does not
//! score by it, so coder-2 keeps its share until its model calls come back 429. Each run has its
//! own small fleet (static peers, no gossip), so the spent budget does not follow the main fleet
//! into later acts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::drive::{self, Calls};
use super::{round, DemoError, AGENTS, CAPABILITY};
use agent_reach::config::{
    Bootstrap, ConfigPaths, ConfigStore, ExternalTarget, HumanDuration, Name, Policy,
    TargetEndpoint,
};
use agent_reach::Sidecar;
use testkit::{Latency, MockAgent, MockConfig, ModelCall, ProviderBudget};

/// The agent whose model account drains.
const DRAINING: usize = 1;
/// Its provider's requests per window, and everyone else's (never reached in the act).
const SMALL: u64 = 240;
const LARGE: u64 = 100_000;
/// Longer than the act: no reset brings the budget back midway.
const WINDOW: Duration = Duration::from_secs(30);
/// One sample's stretch of traffic, at most this many per run, and how many more once the
/// drained agent is out (or, unaware, once its model calls are refused).
const SLICE: Duration = Duration::from_millis(300);
const MAX_SLICES: usize = 40;
const AFTER: usize = 3;
/// Under this share of a slice's calls the agent counts as out of rotation.
const OUT: f64 = 0.05;
/// The capability the agents' sidecars name their model provider by.
const MODEL: &str = "openai";
/// How the comparison run turns budget awareness off.
const UNAWARE_BY: &str =
    "model_budgets.steer: false: headroom learned and published, not scored by";

#[derive(Clone, Debug, Serialize)]
pub struct BudgetSummary {
    pub agent: String,
    /// Its provider's requests per window; the others have `others_budget`.
    pub budget: u64,
    pub others_budget: u64,
    pub window_s: f64,
    /// The caller steers by the model headroom (`model_budgets.steer: true`, the default).
    pub aware: BudgetRun,
    pub unaware_by: &'static str,
    pub unaware: BudgetRun,
}

/// One run of the act.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetRun {
    /// One per slice of traffic.
    pub samples: Vec<BudgetSample>,
    /// From the start to the end of the first slice in which the agent got under 5 % of the
    /// calls, and what was left of its budget then.
    pub out_after_s: Option<f64>,
    pub left_when_out: Option<u64>,
    pub calls: u64,
    pub caller_failed: u64,
    /// The caller's calls that came back 429.
    pub caller_429: u64,
    /// The agents' model calls their providers answered 429.
    pub agent_429: u64,
    /// Tasks the drained agent failed, as its own sidecar counted them.
    pub agent_failed_tasks: u64,
}

/// The drained agent at the end of one slice.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetSample {
    pub at_s: f64,
    /// Its model headroom as its own sidecar sees it (none: it has learned nothing).
    pub headroom: Option<f64>,
    /// Its share of the calls that reached agents in the slice.
    pub share: f64,
    /// Requests left in its provider's window.
    pub left: u64,
}

pub(super) async fn run(concurrency: usize) -> Result<BudgetSummary, DemoError> {
    let aware = Act::start(true).await?.drive(concurrency).await;
    // The same fleet, the same traffic; only the policy's switch differs.
    let unaware = Act::start(false).await?.drive(concurrency).await;
    Ok(BudgetSummary {
        agent: AGENTS[DRAINING].to_owned(),
        budget: SMALL,
        others_budget: LARGE,
        window_s: WINDOW.as_secs_f64(),
        aware,
        unaware_by: UNAWARE_BY,
        unaware,
    })
}

/// One run's fleet: a provider per agent, the agents behind their sidecars, and a caller.
struct Act {
    providers: Vec<MockAgent>,
    agents: Vec<(MockAgent, Sidecar)>,
    caller: Sidecar,
}

impl Act {
    /// Each agent calls its model through its own sidecar; `steer` is every sidecar's
    /// `model_budgets.steer`.
    async fn start(steer: bool) -> Result<Self, DemoError> {
        let listen = SocketAddr::from(([127, 0, 0, 1], 0));
        let (mut providers, mut agents) = (Vec::new(), Vec::new());
        let mut caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .map_err(DemoError::Config)?;
        for (i, name) in AGENTS.iter().enumerate() {
            let mut config = MockConfig::new(&format!("{name}-provider"));
            config.provider = ProviderBudget {
                requests: Some(if i == DRAINING { SMALL } else { LARGE }),
                window: WINDOW,
                ..ProviderBudget::default()
            };
            let provider = MockAgent::start(listen, config).await?;
            // The same fixed latency for all: the share watched is the budget's, not a
            // preference for the fastest.
            let mut config = MockConfig::new(name);
            config.latency = Latency::fixed(Duration::from_millis(20));
            let agent = MockAgent::start(listen, config).await?;
            let mut policy = act_policy(steer);
            policy.targets.push(model_target(provider.addr)?);
            let bootstrap =
                Bootstrap::local(name, agent.addr, &[CAPABILITY]).map_err(DemoError::Config)?;
            let sidecar = start(bootstrap, policy).await?;
            agent.set_model(ModelCall {
                outbound: sidecar.addrs.outbound,
                capability: MODEL.to_owned(),
            });
            caller = caller
                .with_peer(name, sidecar.addrs.inbound, &[CAPABILITY])
                .map_err(DemoError::Config)?;
            providers.push(provider);
            agents.push((agent, sidecar));
        }
        let mut policy = act_policy(steer);
        // The caller reads the agents' self-views, headroom included, every 20 ms.
        policy.peer_views.poll_interval = HumanDuration::from_millis(20);
        let caller = start(caller, policy).await?;
        Ok(Self {
            providers,
            agents,
            caller,
        })
    }

    /// Slices of steady traffic, a sample after each, until the drained agent has been out (or
    /// refused by its provider) for `AFTER` slices; then the fleet is stopped.
    async fn drive(self, concurrency: usize) -> BudgetRun {
        let started = Instant::now();
        let calls = Calls::default();
        let mut samples = Vec::new();
        let (mut out, mut after) = (None, 0);
        let mut from = self.reached();
        for _ in 0..MAX_SLICES {
            let outbound = self.caller.addrs.outbound;
            drive::traffic(outbound, SLICE, concurrency, calls.clone()).await;
            let to = self.reached();
            let sample = self.sample(started, &from, &to);
            from = to;
            if out.is_none() && sample.share < OUT {
                out = Some((sample.at_s, sample.left));
            }
            samples.push(sample);
            if out.is_some() || self.refused() > 0 {
                after += 1;
                if after > AFTER {
                    break;
                }
            }
        }
        let calls = calls.take();
        let own = self.agents[DRAINING].1.status().inbound;
        let run = BudgetRun {
            samples,
            out_after_s: out.map(|(at, _)| at),
            left_when_out: out.map(|(_, left)| left),
            calls: calls.len() as u64,
            caller_failed: calls.iter().filter(|c| !c.ok).count() as u64,
            caller_429: calls.iter().filter(|c| c.status == 429).count() as u64,
            agent_429: self
                .providers
                .iter()
                .map(|p| p.provider_stats().refused)
                .sum(),
            agent_failed_tasks: own.requests.saturating_sub(own.successes),
        };
        self.shutdown().await;
        run
    }

    /// Business calls that reached each agent so far.
    fn reached(&self) -> Vec<u64> {
        self.agents
            .iter()
            .map(|(a, _)| a.stats().business)
            .collect()
    }

    fn sample(&self, started: Instant, from: &[u64], to: &[u64]) -> BudgetSample {
        let total: u64 = to.iter().zip(from).map(|(t, f)| t.saturating_sub(*f)).sum();
        let mine = to[DRAINING].saturating_sub(from[DRAINING]);
        let served = self.providers[DRAINING].provider_stats().served;
        let headroom = self.agents[DRAINING]
            .1
            .status()
            .model_budget
            .map(|b| round3(b.headroom));
        BudgetSample {
            at_s: round(started.elapsed().as_secs_f64()),
            headroom,
            share: round3(mine as f64 / total.max(1) as f64),
            left: SMALL.saturating_sub(served),
        }
    }

    /// Model calls the drained agent's provider has refused.
    fn refused(&self) -> u64 {
        self.providers[DRAINING].provider_stats().refused
    }

    async fn shutdown(self) {
        self.caller.kill().await;
        for (agent, sidecar) in self.agents {
            sidecar.kill().await;
            agent.stop().await;
        }
        for provider in self.providers {
            provider.stop().await;
        }
    }
}

/// To a thousandth: a share or a headroom.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Parole served at once: the share watched is the budget's, not a newcomer's ramp.
fn act_policy(steer: bool) -> Policy {
    let mut policy = Policy::default();
    policy.states.parole.duration = HumanDuration::from_millis(0);
    policy.model_budgets.steer = steer;
    policy
}

/// The agent's model provider as an external target of its sidecar.
fn model_target(provider: SocketAddr) -> Result<ExternalTarget, DemoError> {
    Ok(ExternalTarget {
        name: Name::parse(MODEL).map_err(DemoError::Config)?,
        capability: Name::parse(MODEL).map_err(DemoError::Config)?,
        endpoints: vec![TargetEndpoint::parse(&provider.to_string()).map_err(DemoError::Config)?],
        timeout: None,
        max_concurrency: None,
        rate_limit: None,
        budget_group: None,
        model_provider: true,
        ca_file: None,
    })
}

async fn start(bootstrap: Bootstrap, policy: Policy) -> Result<Sidecar, DemoError> {
    let store = ConfigStore::new(bootstrap, policy, ConfigPaths::default());
    Ok(Sidecar::start(Arc::new(store)).await?)
}
