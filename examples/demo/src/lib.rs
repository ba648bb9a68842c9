//! The demo (`cargo run -p demo`): a local fleet of mock agents, each behind its own
//! sidecar, finding each other by gossip from one seed, and a caller driving capability calls through its sidecar's
//! outbound port. Partway through, one agent goes fake-online the seeds' way (`/healthz` 200,
//! business calls 429) and later heals; the summary shows it leave rotation and ramp back in
//! while the caller's calls keep succeeding. Then a retry storm, then a stranger's hostile input,
//! then one agent ten times slower, then one whose answers drift from its golden tasks' baselines
//! (degraded, not ejected), then a crash and a newcomer whose sidecar is set up by the
//! injector from its pod's annotations, as in Kubernetes. Every sidecar hop is mutual TLS; last,
//! the policy turns strict with per-capability authorization and an intruder is refused. Last,
//! callers come and go in steps while every sidecar reports the fleet's demand ratio. Between
//! them, three MCP servers join and one's `search` tool breaks: its calls move, its other tool
//! keeps serving. Then a slow tail, without and with hedging, in a fleet of its own. After them
//! all, coder-2's model account drains: its share falls before its provider's first 429, and
//! the same again with budget awareness off for comparison.

mod authorized;
mod budget;
mod conversations;
mod drive;
mod hedge;
mod hostile;
mod injected;
mod loops;
mod mcp_tools;
mod membership;
mod observed;
mod predict;
mod quality;
mod report;
mod scale;
mod slow;
mod storm;
mod task_api;
mod task_restart;
mod tasks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use authorized::AuthorizationSummary;
pub use budget::BudgetSummary;
pub use conversations::ConversationsSummary;
pub use hedge::{HedgeRun, HedgeSummary};
pub use hostile::HostileSummary;
pub use injected::Injection;
pub use loops::LoopSummary;
pub use mcp_tools::McpSummary;
pub use membership::MembershipSummary;
pub use observed::ObserveSummary;
pub use predict::PredictSummary;
pub use quality::QualitySummary;
pub use report::render_table;
pub use scale::ScaleSummary;
pub use slow::SlowSummary;
pub use storm::StormSummary;
pub use tasks::TasksSummary;

use agent_reach::config::{Bootstrap, ConfigPaths, ConfigStore, HumanDuration, Policy};
use agent_reach::reach::State;
use agent_reach::Sidecar;
use testkit::{Latency, MockAgent, MockConfig, Mode};

const CAPABILITY: &str = "code-review";
/// The fleet's SPIFFE trust domain: agent `x` is `spiffe://demo.local/ns/agents/sa/x`.
const TRUST_DOMAIN: &str = "spiffe://demo.local";
const AGENTS: [&str; 3] = ["coder-1", "coder-2", "coder-3"];
/// The agent that goes fake-online.
const BROKEN: usize = 1;

#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub duration: Duration,
    /// Calls in flight at once from the caller.
    pub concurrency: usize,
}

/// The fleet could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot start a mock agent: {0}")]
    Agent(#[from] std::io::Error),
    #[error("cannot start a sidecar: {0}")]
    Sidecar(#[from] agent_reach::StartError),
    #[error("bad demo config: {0}")]
    Config(String),
}

/// What the demo prints, as a table or as JSON.
#[derive(Clone, Debug, Serialize)]
pub struct DemoSummary {
    pub duration_s: f64,
    pub capability: &'static str,
    pub concurrency: usize,
    /// The fault once first with the fleet in observe-only mode: what the model would have saved.
    pub observe: ObserveSummary,
    /// Per agent, as its own sidecar measured it.
    pub agents: Vec<AgentSummary>,
    /// What the caller saw.
    pub total: Totals,
    pub fault: FaultSummary,
    /// The correlated failure that follows.
    pub storm: StormSummary,
    /// A stranger's hostile input at one agent's inbound port, under traffic.
    pub hostile: HostileSummary,
    /// One agent ten times slower: its share before and after.
    pub slow: SlowSummary,
    /// One agent's answers drift from its golden tasks' baselines: degraded, share down, back.
    pub quality: QualitySummary,
    /// A crash and a newcomer, found and forgotten by gossip.
    pub membership: MembershipSummary,
    /// Strict mutual TLS and per-capability authorization: an intruder refused.
    pub authorization: AuthorizationSummary,
    /// An async task named by its intent: escalated when every agent fails it, then sent back
    /// by a person and done.
    pub tasks: TasksSummary,
    /// A2A agents whose skills come from their cards, and conversations whose follow-ups
    /// reach the agent holding the task.
    pub conversations: ConversationsSummary,
    /// MCP servers whose tools come from `tools/list`: the fleet's tool list, and one broken
    /// tool's calls moving while the server's other tool keeps serving.
    pub mcp: McpSummary,
    /// A delegation loop among three agents, stopped at its first turn by its chain.
    pub loops: LoopSummary,
    /// Its own fleet with one agent slow on 5 % of calls: the tail without and with hedging.
    pub hedge: HedgeSummary,
    /// Demand ramping onto an agent of lower capacity: its predicted saturation ahead of the
    /// actual one.
    pub predict: PredictSummary,
    /// Callers added in steps and removed: the fleet's demand ratio, the signal to scale on.
    pub scale: ScaleSummary,
    /// coder-2's model account drains: its share falls before any 429, then the same with
    /// budget awareness off.
    pub budget: BudgetSummary,
}

#[derive(Clone, Debug, Serialize)]
pub struct AgentSummary {
    pub name: String,
    /// Calls that reached this agent through its sidecar.
    pub requests: u64,
    pub successes: u64,
    pub failures: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub in_flight: usize,
    /// The caller's view of this agent at the end.
    pub state: State,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    pub requests: u64,
    pub successes: u64,
    pub failures: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub requests_per_s: f64,
}

/// The fake-online episode.
#[derive(Clone, Debug, Serialize)]
pub struct FaultSummary {
    pub agent: String,
    pub mode: String,
    pub fault_at_s: f64,
    pub healed_at_s: f64,
    /// From the fault to the end of the first 500 ms window in which the agent got less than 5%
    /// of its former share of calls.
    pub left_rotation_after_ms: Option<f64>,
    /// Its share of calls before the fault, and from `left_rotation` to the heal.
    pub share_before: f64,
    pub share_while_out: f64,
    /// Calls the caller saw fail between the fault and the heal.
    pub failed_during_fault: u64,
    pub calls_during_fault: u64,
    /// The caller's view of the agent, state by state.
    pub transitions: Vec<TimedState>,
    /// Back to healthy after the heal, as the caller sees it.
    pub recovered_after_heal_ms: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TimedState {
    pub at_s: f64,
    pub state: State,
}

/// A running local fleet: agents with their sidecars, and the caller's sidecar, all finding
/// each other by gossip through the first agent's sidecar.
#[derive(Debug)]
pub struct Fleet {
    pub agents: Vec<(MockAgent, Sidecar)>,
    pub caller: Sidecar,
    /// How long the caller took to know every agent.
    pub found_after: Duration,
    policy: Policy,
    seed: Vec<SocketAddr>,
    key_dir: PathBuf,
    /// Issues every sidecar's workload certificate (`tls` in its bootstrap).
    ca: agent_reach::pki::DevCa,
}

impl Fleet {
    /// The fleet's caller's load for `duration` (see [`drive::traffic`]).
    fn traffic(
        &self,
        duration: Duration,
        concurrency: usize,
        calls: drive::Calls,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        drive::traffic(self.caller.addrs.outbound, duration, concurrency, calls)
    }

    /// Starts the fleet with `policy` shared by every sidecar; no sidecar is told of any other
    /// but the seed.
    pub async fn start(policy: Policy) -> Result<Self, DemoError> {
        let started = Instant::now();
        let key_dir = write_cluster_key()?;
        let ca = agent_reach::pki::DevCa::new("agent-reach demo CA")
            .map_err(|e| DemoError::Config(e.to_string()))?;
        let caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .map_err(DemoError::Config)?
            .with_gossip(&[], key_dir.join("gossip.key"));
        let mut caller = tls_files(&ca, &key_dir, caller, &agent_identity("caller"))?;
        caller.tasks = Some(agent_reach::config::TasksConfig::file(
            key_dir.join("tasks.db"),
        ));
        let mut fleet = Self {
            agents: Vec::new(),
            caller: start_sidecar(caller, policy.clone()).await?,
            found_after: Duration::ZERO,
            policy,
            seed: Vec::new(),
            key_dir,
            ca,
        };
        fleet.seed = fleet.caller.addrs.gossip.into_iter().collect();
        for name in AGENTS {
            fleet.add_agent(name).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while fleet.caller.status().peers.len() < AGENTS.len() {
            if Instant::now() > deadline {
                return Err(DemoError::Config(
                    "the fleet did not find itself by gossip within 10 s".to_owned(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fleet.found_after = started.elapsed();
        Ok(fleet)
    }

    /// Starts one more agent behind its sidecar, joining through the seed.
    pub async fn add_agent(&mut self, name: &str) -> Result<(), DemoError> {
        let agent = start_agent(name, &self.execution_log(name)).await?;
        let mut bootstrap = Bootstrap::local(name, agent.addr, &[CAPABILITY])
            .map_err(DemoError::Config)?
            .with_gossip(&self.seed, self.key_dir.join("gossip.key"));
        let schema = agent_reach::config::OutputSchema::inline(serde_json::json!({
            "type": "object",
            "required": ["ok"],
            "properties": { "ok": { "type": "boolean" } },
        }))
        .map_err(DemoError::Config)?;
        for capability in &mut bootstrap.agent.capabilities {
            capability.probe = Some(testkit::probe_spec());
            // What a review answer looks like: a 200 of another shape is a plausible fake.
            capability.output_schema = Some(schema.clone());
            // Peers may call /review; the mock agent's /admin endpoints are not theirs.
            capability.paths = vec!["/review".to_owned()];
        }
        // Short, so the hostile act's stalled uploads are refused within the act.
        bootstrap.limits.body_read_timeout = HumanDuration::from_millis(300);
        let bootstrap = self.with_tls(bootstrap, &agent_identity(name))?;
        let sidecar = start_sidecar(bootstrap, self.policy.clone()).await?;
        self.agents.push((agent, sidecar));
        Ok(())
    }

    /// Starts one more agent whose sidecar config comes from the injector, as in Kubernetes.
    pub async fn add_injected_agent(&mut self, name: &str) -> Result<Injection, DemoError> {
        let agent = start_agent(name, &self.execution_log(name)).await?;
        let (bootstrap, injection) = injected::injected_bootstrap(
            name,
            agent.addr,
            CAPABILITY,
            &self.seed,
            self.key_dir.join("gossip.key"),
        )?;
        let bootstrap = self.with_tls(bootstrap, &agent_identity(name))?;
        let sidecar = start_sidecar(bootstrap, self.policy.clone()).await?;
        self.agents.push((agent, sidecar));
        Ok(injection)
    }

    /// Turns observe-only mode on or off in every sidecar's policy, live.
    fn set_observe_only(&mut self, on: bool) {
        self.update_policy(|p| p.observe_only = on);
    }

    /// Edits the fleet's policy and every sidecar's running one the same way, live.
    fn update_policy(&mut self, edit: impl Fn(&mut Policy)) {
        edit(&mut self.policy);
        for sidecar in self.sidecars() {
            let snapshot = sidecar.store().snapshot();
            let mut policy = snapshot.policy.clone();
            edit(&mut policy);
            sidecar.store().replace(snapshot.bootstrap.clone(), policy);
        }
    }

    /// Waits, up to `within`, until the caller sees every agent healthy and past its cooldown:
    /// an act that measures shares starts from an even fleet, whatever the act before it left
    /// ramping. How long it took, or `None`.
    async fn settled(&self, within: Duration) -> Option<Duration> {
        let names: Vec<String> = self
            .agents
            .iter()
            .map(|(a, _)| a.name().to_owned())
            .collect();
        poll(within, || {
            let status = self.caller.status();
            names.iter().all(|n| {
                status.peer_views.iter().any(|p| {
                    &p.name == n
                        && p.effective_state == State::Healthy
                        && !p.view.estimates.cooling_down
                })
            })
        })
        .await
    }

    /// Where agent `name` logs each business call it executed.
    fn execution_log(&self, name: &str) -> PathBuf {
        self.key_dir.join(format!("executions-{name}.jsonl"))
    }

    /// `bootstrap` with a certificate for `identity` from the fleet's CA.
    fn with_tls(&self, bootstrap: Bootstrap, identity: &str) -> Result<Bootstrap, DemoError> {
        tls_files(&self.ca, &self.key_dir, bootstrap, identity)
    }

    /// Every sidecar of the fleet: the agents' and the caller's.
    fn sidecars(&self) -> impl Iterator<Item = &Sidecar> {
        self.agents
            .iter()
            .map(|(_, s)| s)
            .chain(std::iter::once(&self.caller))
    }

    /// A counter summed over the agents' sidecars: every series starting with `prefix`.
    async fn metric_sum(&self, prefix: &str) -> u64 {
        let mut sum = 0;
        for (_, sidecar) in &self.agents {
            sum += metric(sidecar, prefix).await;
        }
        sum
    }

    /// Every sidecar drains at once (each waits out its in-flight calls), then the files go.
    pub async fn shutdown(self) {
        let mut stopping = tokio::task::JoinSet::new();
        for (agent, sidecar) in self.agents {
            stopping.spawn(async move {
                sidecar.shutdown().await;
                agent.stop().await;
            });
        }
        stopping.spawn(self.caller.shutdown());
        while stopping.join_next().await.is_some() {}
        let _ = std::fs::remove_dir_all(&self.key_dir);
    }
}

/// An agent's SPIFFE ID: its service account is its name.
fn agent_identity(name: &str) -> String {
    format!("{TRUST_DOMAIN}/ns/agents/sa/{name}")
}

/// Issues a certificate for `identity` into `dir/tls/<name>` and names the files in `bootstrap`.
fn tls_files(
    ca: &agent_reach::pki::DevCa,
    dir: &std::path::Path,
    mut bootstrap: Bootstrap,
    identity: &str,
) -> Result<Bootstrap, DemoError> {
    let at = dir.join("tls").join(bootstrap.agent.name.as_str());
    let files = ca
        .write_files(&at, identity)
        .map_err(|e| DemoError::Config(e.to_string()))?;
    bootstrap.tls = Some(files);
    Ok(bootstrap)
}

/// A counter on `sidecar`'s `/metrics`: the sum of the series starting with `prefix`.
async fn metric(sidecar: &Sidecar, prefix: &str) -> u64 {
    use http_body_util::BodyExt;
    let client = agent_reach::http::client::build(&Policy::default());
    let Ok(request) = http::Request::get(format!("http://{}/metrics", sidecar.addrs.admin))
        .body(agent_reach::http::body::empty())
    else {
        return 0;
    };
    let Ok(response) = client.request(request).await else {
        return 0;
    };
    let Ok(body) = response.into_body().collect().await else {
        return 0;
    };
    String::from_utf8_lossy(&body.to_bytes())
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Polls `done` every 20 ms; how long it took, or `None` past `within`.
async fn poll(within: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if done() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// What a call takes once an agent's dependency slows down: ten times the usual 20–60 ms.
const SLOW_LATENCY: Duration = Duration::from_millis(400);

async fn start_agent(name: &str, log: &std::path::Path) -> Result<MockAgent, DemoError> {
    let mut config = MockConfig::new(name);
    config.latency = Latency {
        min: Duration::from_millis(20),
        max: Duration::from_millis(60),
    };
    config.slow_latency = SLOW_LATENCY;
    let listen = SocketAddr::from(([127, 0, 0, 1], 0));
    Ok(MockAgent::start_logged(listen, config, Default::default(), log).await?)
}

/// A fresh cluster key for this run, in a private temporary directory.
fn write_cluster_key() -> Result<PathBuf, DemoError> {
    let nonce: u64 = rand::random();
    let dir =
        std::env::temp_dir().join(format!("agent-reach-demo-{}-{nonce:x}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(dir.join("gossip.key"), hex)?;
    Ok(dir)
}

/// The demo's policy: the shipped defaults with timings shortened so a whole
/// fault → ejection → recovery cycle fits in a few seconds.
pub fn demo_policy() -> Policy {
    let mut p = Policy::default();
    p.states.parole.successes = 5;
    p.states.parole.duration = HumanDuration::from_secs(2);
    p.states.probation.window = HumanDuration::from_secs(3);
    p.states.ejected.cool_off = HumanDuration::from_secs(2);
    p.states.recovering.ramp = HumanDuration::from_secs(3);
    p.probes.interval = HumanDuration::from_secs(5);
    p.probes.fast_interval = HumanDuration::from_millis(500);
    p.peer_views.poll_interval = HumanDuration::from_millis(250);
    p
}

/// Gossip timings shortened like the policy's: a crash is detected in about two seconds.
fn demo_gossip(mut bootstrap: Bootstrap) -> Bootstrap {
    if let Some(g) = bootstrap.gossip.as_mut() {
        g.probe_interval = HumanDuration::from_millis(500);
        g.probe_timeout = HumanDuration::from_millis(200);
        g.suspect_timeout = HumanDuration::from_millis(1500);
        g.refresh_interval = HumanDuration::from_secs(1);
    }
    bootstrap
}

async fn start_sidecar(bootstrap: Bootstrap, policy: Policy) -> Result<Sidecar, DemoError> {
    let bootstrap = demo_gossip(bootstrap);
    let store = Arc::new(ConfigStore::new(bootstrap, policy, ConfigPaths::default()));
    Ok(Sidecar::start(store).await?)
}

/// The delegation-loop act alone (its test runs it without the rest of the demo).
#[allow(dead_code, reason = "run alone only by tests/it/chains.rs")]
pub async fn loop_act() -> Result<LoopSummary, DemoError> {
    loops::run().await
}

/// Runs the demo and returns its summary. Three lanes run at once, each in fleets of its own:
/// the routing acts on one fleet (they break, slow and heal its agents in turn), the service
/// acts on another (tasks, A2A conversations, MCP tools, prediction, scaling), and the acts that
/// bring their own fleet (a delegation loop, hedging, model budgets).
pub async fn run(options: DemoOptions) -> Result<DemoSummary, DemoError> {
    let (routing, services, own) = tokio::join!(
        routing_acts(&options),
        service_acts(options.concurrency),
        own_fleet_acts(options.concurrency)
    );
    let (routing, services, (loops, hedge, budget)) = (routing?, services?, own?);
    Ok(DemoSummary {
        duration_s: routing.duration_s,
        capability: CAPABILITY,
        concurrency: options.concurrency,
        observe: routing.observe,
        agents: routing.agents,
        total: routing.total,
        fault: routing.fault,
        storm: routing.storm,
        hostile: services.hostile,
        slow: routing.slow,
        quality: routing.quality,
        membership: routing.membership,
        authorization: services.authorization,
        tasks: services.tasks,
        conversations: services.conversations,
        mcp: services.mcp,
        loops,
        hedge,
        predict: services.predict,
        scale: services.scale,
        budget,
    })
}

/// What the routing lane found.
struct RoutingActs {
    duration_s: f64,
    observe: ObserveSummary,
    agents: Vec<AgentSummary>,
    total: Totals,
    fault: FaultSummary,
    storm: StormSummary,
    slow: SlowSummary,
    quality: QualitySummary,
    membership: MembershipSummary,
}

/// The fake-online episode under traffic (first with the fleet observing only), then a storm, a
/// slow agent, a drifting one, a crash and a newcomer.
async fn routing_acts(options: &DemoOptions) -> Result<RoutingActs, DemoError> {
    let mut fleet = Fleet::start(demo_policy()).await?;
    let observe = observed::run(
        &mut fleet,
        options.duration.mul_f64(0.5),
        options.concurrency,
    )
    .await?;
    let started = Instant::now();
    let fault_at = options.duration.mul_f64(0.2);
    let heal_at = options.duration.mul_f64(0.45);
    let broken = &fleet.agents[BROKEN];

    let calls = drive::Calls::default();
    let traffic = fleet.traffic(options.duration, options.concurrency, calls.clone());
    let watch = drive::watch(
        &fleet.caller,
        &broken.0,
        AGENTS[BROKEN],
        started,
        options.duration,
        &calls,
    );
    let faults = async {
        tokio::time::sleep_until((started + fault_at).into()).await;
        broken.0.set_mode(Mode::RateLimited);
        tokio::time::sleep_until((started + heal_at).into()).await;
        broken.0.set_mode(Mode::Normal);
    };
    let ((), samples, ()) = tokio::join!(traffic, watch, faults);
    let elapsed = started.elapsed();
    let agents = agent_summaries(&fleet);
    let storm = storm::run(&fleet, options.duration.mul_f64(0.4), options.concurrency).await;
    let slow = slow::run(&fleet, options.concurrency).await;
    let quality = quality::run(&fleet, options.concurrency).await?;
    let membership = membership::run(
        &mut fleet,
        membership::act_length(options.duration),
        options.concurrency,
    )
    .await?;
    fleet.shutdown().await;
    let fault = report::fault_summary(AGENTS[BROKEN], &samples, &calls.take(), fault_at, heal_at);
    Ok(RoutingActs {
        duration_s: round(elapsed.as_secs_f64()),
        observe,
        agents,
        total: report::totals(&calls.take(), elapsed),
        fault,
        storm,
        slow,
        quality,
        membership,
    })
}

/// Per agent, as its own sidecar measured it, and the caller's view of it.
fn agent_summaries(fleet: &Fleet) -> Vec<AgentSummary> {
    let caller_status = fleet.caller.status();
    fleet
        .agents
        .iter()
        .map(|(agent, sidecar)| {
            let status = sidecar.status();
            let state = caller_status
                .peer_views
                .iter()
                .find(|p| p.name == agent.name())
                .map_or(State::Parole, |p| p.effective_state);
            AgentSummary {
                name: agent.name().to_owned(),
                requests: status.inbound.requests,
                successes: status.inbound.successes,
                failures: status.inbound.requests - status.inbound.successes,
                p50_ms: round(status.inbound.p50_ms),
                p95_ms: round(status.inbound.p95_ms),
                in_flight: status.load.in_flight,
                state,
            }
        })
        .collect()
}

/// What the service lane found.
struct ServiceActs {
    hostile: HostileSummary,
    authorization: AuthorizationSummary,
    tasks: TasksSummary,
    conversations: ConversationsSummary,
    mcp: McpSummary,
    predict: PredictSummary,
    scale: ScaleSummary,
}

/// Hostile input, then strict mTLS with per-capability authorization, and under it the
/// services: async tasks, A2A conversations, MCP tools, predicted saturation, the scaling signal.
async fn service_acts(concurrency: usize) -> Result<ServiceActs, DemoError> {
    let mut fleet = Fleet::start(demo_policy()).await?;
    // Out of parole first: the hostile act shows its target staying healthy.
    fleet.settled(Duration::from_secs(10)).await;
    let hostile = hostile::run(&fleet, Duration::from_secs(2), concurrency).await;
    let authorization = authorized::run(&mut fleet, Duration::from_secs(2), concurrency).await?;
    let tasks = tasks::run(&mut fleet).await?;
    let conversations = conversations::run(&mut fleet).await?;
    let mcp = mcp_tools::run(&mut fleet).await?;
    let predict = predict::run(&mut fleet).await?;
    let scale = scale::run(&fleet).await;
    fleet.shutdown().await;
    Ok(ServiceActs {
        hostile,
        authorization,
        tasks,
        conversations,
        mcp,
        predict,
        scale,
    })
}

/// The acts that start their own fleets, one after another.
async fn own_fleet_acts(
    concurrency: usize,
) -> Result<(LoopSummary, HedgeSummary, BudgetSummary), DemoError> {
    let loops = loops::run().await?;
    let hedge = hedge::run().await?;
    let budget = budget::run(concurrency).await?;
    Ok((loops, hedge, budget))
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
