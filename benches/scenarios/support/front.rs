//! The router under test: agent-reach's sidecars, the baseline, HAProxy or Envoy, started in
//! front of the agents, told of a pod that died or started, and read for the measures.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::config::{yaml, ConfigPaths, ConfigStore, Policy};
use agent_reach::{Bootstrap, Sidecar};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::baseline::baseline;
use super::proxies::{envoy_config, haproxy_command, write_eds};
use crate::half_open::{Relay, RELAY_IP};
use crate::scenario::Scenario;
use crate::scenario::REACH_NO_PREDICTION;
use crate::{Options, CAP, QUEUE};
use testkit::bench::{self, free_port, write, Tools};

/// The router under test, in front of the agents, with the relay of a half-open run.
pub(crate) struct Front {
    pub(crate) kind: Kind,
    pub(crate) relay: Option<Relay>,
    /// The address the router was given for each agent slot.
    pub(crate) endpoints: Vec<SocketAddr>,
}

pub(crate) enum Kind {
    Reach(Box<Reach>),
    Baseline {
        port: u16,
        task: tokio::task::JoinHandle<()>,
    },
    Haproxy {
        port: u16,
        child: Child,
        /// The runtime API.
        socket: PathBuf,
    },
    Envoy {
        port: u16,
        child: Child,
        /// The EDS file, when the endpoints come from one (crash-restart).
        eds: Option<PathBuf>,
    },
}

/// agent-reach: the caller's sidecar (the gossip seed), ramp-shared's other caller sidecars,
/// and one sidecar per agent slot.
pub(crate) struct Reach {
    pub(crate) caller: Sidecar,
    pub(crate) other_callers: Vec<Sidecar>,
    pub(crate) sidecars: Vec<Option<Sidecar>>,
    pub(crate) key: PathBuf,
    pub(crate) policy: Policy,
    pub(crate) scenario: Scenario,
    /// Whether the sidecars declare a business probe.
    pub(crate) probe: bool,
}

impl Reach {
    /// Every caller sidecar, the seed first.
    pub(crate) fn callers(&self) -> impl Iterator<Item = &Sidecar> {
        std::iter::once(&self.caller).chain(&self.other_callers)
    }

    /// A sidecar for the agent in `slot`, joining the fleet through the caller's sidecar.
    pub(crate) async fn sidecar(
        &self,
        slot: usize,
        agent: SocketAddr,
        ip: [u8; 4],
    ) -> Result<Sidecar, String> {
        let name = format!("agent-{}", slot + 1);
        let seed: Vec<SocketAddr> = self.caller.addrs.gossip.into_iter().collect();
        let mut b = Bootstrap::local(&name, agent, &[CAP])?.with_gossip(&seed, self.key.clone());
        b.agent.max_concurrency =
            yaml::from_str(&self.scenario.max_concurrency_of(slot).to_string())
                .map_err(|e| e.to_string())?;
        b.agent.queue.capacity = QUEUE;
        if let Some(g) = b.gossip.as_mut() {
            g.listen = SocketAddr::from((ip, 0));
        }
        if self.probe {
            for c in &mut b.agent.capabilities {
                c.probe = Some(testkit::probe_spec());
            }
        }
        start_sidecar(b, self.policy.clone()).await
    }
}

pub(crate) async fn start_sidecar(b: Bootstrap, policy: Policy) -> Result<Sidecar, String> {
    let store = Arc::new(ConfigStore::new(b, policy, ConfigPaths::default()));
    Sidecar::start(store).await.map_err(|e| e.to_string())
}

/// A fresh gossip cluster key in `dir`.
pub(crate) fn key_file(dir: &Path) -> Result<PathBuf, String> {
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    write(
        dir,
        &format!("gossip-{:x}.key", rand::random::<u64>()),
        &hex,
    )
}

impl Front {
    pub(crate) async fn start(
        router: &str,
        scenario: Scenario,
        agents: &[SocketAddr],
        tools: &Tools,
        dir: &Path,
        options: &Options,
    ) -> Result<Self, String> {
        let mut endpoints = agents.to_vec();
        let mut relay = None;
        if scenario == Scenario::HalfOpen && router != "agent-reach" {
            let r = Relay::start(SocketAddr::from(([127, 0, 0, 1], 0)), agents[1]).await?;
            endpoints[1] = r.addr;
            relay = Some(r);
        }
        // A cold start's fifth agent is not running yet: agent-reach learns of it when it joins.
        let live = scenario.agents().min(agents.len());
        let kind = match router {
            "agent-reach" | REACH_NO_PREDICTION => {
                let key = key_file(dir)?;
                let mut policy = Policy {
                    decision_log: options.decision_log,
                    ..Policy::default()
                };
                if router == REACH_NO_PREDICTION {
                    policy.estimates.horizon = agent_reach::config::HumanDuration(Duration::ZERO);
                }
                let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
                let caller = start_sidecar(
                    Bootstrap::local("caller", nowhere, &[])?.with_gossip(&[], key.clone()),
                    policy.clone(),
                )
                .await?;
                let seed: Vec<SocketAddr> = caller.addrs.gossip.into_iter().collect();
                let mut other_callers = Vec::new();
                for i in 2..=scenario.caller_sidecars() {
                    let b = Bootstrap::local(&format!("caller-{i}"), nowhere, &[])?
                        .with_gossip(&seed, key.clone());
                    other_callers.push(start_sidecar(b, policy.clone()).await?);
                }
                let mut reach = Reach {
                    caller,
                    other_callers,
                    sidecars: (0..agents.len()).map(|_| None).collect(),
                    key,
                    policy,
                    scenario,
                    probe: scenario.probe(),
                };
                for (i, addr) in agents.iter().enumerate().take(live) {
                    let half_open = scenario == Scenario::HalfOpen && i == 1;
                    let ip = if half_open { RELAY_IP } else { [127, 0, 0, 1] };
                    let sidecar = reach.sidecar(i, *addr, ip).await?;
                    if half_open {
                        // The network path: peers reach this sidecar at the advertised
                        // 127.0.0.2:<inbound port>, where the relay listens.
                        let inbound = sidecar.addrs.inbound;
                        let r = Relay::start(SocketAddr::from((RELAY_IP, inbound.port())), inbound)
                            .await?;
                        endpoints[1] = r.addr;
                        relay = Some(r);
                    }
                    reach.sidecars[i] = Some(sidecar);
                }
                // Ready when every caller knows every agent by gossip (other callers offer no
                // capability: they do not count).
                let deadline = Instant::now() + Duration::from_secs(20);
                let agents_known = |s: &Sidecar| {
                    s.status()
                        .peers
                        .iter()
                        .filter(|p| p.capabilities.iter().any(|c| c == CAP))
                        .count()
                };
                while let Some(short) = reach
                    .callers()
                    .map(agents_known)
                    .filter(|n| *n < live)
                    .min()
                {
                    if Instant::now() > deadline {
                        return Err(format!(
                            "a caller found {short} of {live} agents by gossip within 20 s"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Kind::Reach(Box::new(reach))
            }
            "baseline" => {
                let (port, task) = baseline(endpoints.clone()).await?;
                Kind::Baseline { port, task }
            }
            "haproxy" => {
                let binary = tools.haproxy.clone().ok_or("haproxy not found")?;
                let port = free_port()?;
                let socket = dir.join(format!("haproxy-{port}.sock"));
                let servers: String = endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, a)| format!("  server a{i} {a} check\n"))
                    .collect();
                let cfg = write(dir, "haproxy.cfg", &format!(
                    "global\n  nbthread 1\n  maxconn 4096\n  stats socket {} mode 600 level admin\n\
                     defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\n\
                     \x20 retries 1\n  option redispatch 1\n  retry-on conn-failure empty-response response-timeout 500 502 503 504\n\
                     frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
                     backend b\n  balance roundrobin\n  option httpchk GET /healthz\n  http-check expect status 200\n\
                     \x20 default-server inter 10s fall 3 rise 2 observe layer7 error-limit 10 on-error mark-down\n{servers}",
                    socket.display()))?;
                let child = bench::spawn_quiet(bench::haproxy(&binary, &cfg))?;
                Kind::Haproxy {
                    port,
                    child,
                    socket,
                }
            }
            "envoy" => {
                let binary = tools.envoy.clone().ok_or("envoy not found")?;
                let port = free_port()?;
                // crash-restart: endpoints from a watched file, as a control plane would push them.
                let eds = if scenario == Scenario::CrashRestart {
                    let eds_dir = dir.join(format!("eds-{port}"));
                    std::fs::create_dir_all(&eds_dir).map_err(|e| e.to_string())?;
                    let path = eds_dir.join("eds.yaml");
                    write_eds(&path, &endpoints)?;
                    Some(path)
                } else {
                    None
                };
                let cfg = write(
                    dir,
                    "envoy.yaml",
                    &envoy_config(port, &endpoints, eds.as_deref()),
                )?;
                let child = bench::spawn_quiet(bench::envoy(&binary, &cfg, port))?;
                Kind::Envoy { port, child, eds }
            }
            other => return Err(format!("unknown router {other}")),
        };
        let front = Front {
            kind,
            relay,
            endpoints,
        };
        // Ready when a call goes through every front door.
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let deadline = Instant::now() + Duration::from_secs(20);
        for url in front.urls() {
            loop {
                let request = hyper::Request::post(&url)
                    .header("reach-capability", CAP)
                    .body(Full::new(Bytes::from_static(b"x")))
                    .map_err(|e| e.to_string())?;
                if let Ok(Ok(r)) =
                    tokio::time::timeout(Duration::from_secs(2), client.request(request)).await
                {
                    if r.status() == 200 {
                        break;
                    }
                }
                if Instant::now() > deadline {
                    front.stop().await;
                    return Err(format!("the router did not answer at {url} within 20 s"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(front)
    }

    /// Where callers send their calls: one URL, or one per caller sidecar.
    pub(crate) fn urls(&self) -> Vec<String> {
        let ports: Vec<u16> = match &self.kind {
            Kind::Reach(r) => r.callers().map(|c| c.addrs.outbound.port()).collect(),
            Kind::Baseline { port, .. } | Kind::Haproxy { port, .. } | Kind::Envoy { port, .. } => {
                vec![*port]
            }
        };
        ports
            .into_iter()
            .map(|port| format!("http://127.0.0.1:{port}/review"))
            .collect()
    }

    pub(crate) fn break_path(&self) {
        if let Some(r) = &self.relay {
            r.broken.store(true, Ordering::SeqCst);
        }
    }

    /// Calls sent into the relayed path so far, in a half-open run.
    pub(crate) fn sent_into_path(&self) -> Option<u64> {
        self.relay
            .as_ref()
            .map(|r| r.requests.load(Ordering::Relaxed))
    }

    /// The pod in `slot` died: for agent-reach its sidecar goes too, without a goodbye.
    pub(crate) async fn pod_gone(&mut self, slot: usize) {
        if let Kind::Reach(r) = &mut self.kind {
            if let Some(s) = r.sidecars.get_mut(slot).and_then(Option::take) {
                s.kill().await;
            }
        }
    }

    /// The agent in `slot` listens at `addr`: agent-reach starts its sidecar, which joins by
    /// gossip; HAProxy and Envoy are told a changed address; the baseline cannot be.
    pub(crate) async fn pod_started(
        &mut self,
        slot: usize,
        addr: SocketAddr,
    ) -> Result<(), String> {
        let moved = self.endpoints.get(slot) != Some(&addr);
        match &mut self.kind {
            Kind::Reach(r) => {
                let sidecar = r.sidecar(slot, addr, [127, 0, 0, 1]).await?;
                r.sidecars[slot] = Some(sidecar);
                return Ok(());
            }
            Kind::Baseline { .. } => return Ok(()),
            Kind::Haproxy { socket, .. } if moved => {
                haproxy_command(
                    socket,
                    &format!(
                        "set server b/a{slot} addr {} port {}",
                        addr.ip(),
                        addr.port()
                    ),
                )?;
            }
            Kind::Envoy {
                eds: Some(path), ..
            } if moved => {
                let mut endpoints = self.endpoints.clone();
                endpoints[slot] = addr;
                write_eds(path, &endpoints)?;
            }
            Kind::Haproxy { .. } | Kind::Envoy { .. } => {}
        }
        if moved {
            self.endpoints[slot] = addr;
        }
        Ok(())
    }

    /// agent-reach: the caller's view of each peer, one JSON line.
    pub(crate) fn diag_line(&self, at: Duration) -> Option<String> {
        let Kind::Reach(r) = &self.kind else {
            return None;
        };
        let views: Vec<serde_json::Value> = r
            .caller
            .status()
            .peer_views
            .iter()
            .map(|p| {
                let view = serde_json::to_value(p.view).unwrap_or_default();
                serde_json::json!({
                    "peer": p.name,
                    "address": p.address,
                    "effective": p.effective_state,
                    "cap": p.effective_cap,
                    "score": p.last_score,
                    "view": view,
                    "self": p.self_view.as_ref().map(|v| serde_json::to_value(v).unwrap_or_default()),
                })
            })
            .collect();
        Some(serde_json::json!({ "t": at.as_secs_f64(), "peers": views }).to_string())
    }

    /// agent-reach: the peers the caller sees in probation or ejected (by its own view, the
    /// peer's, or the effective state), each with the worse of the two states.
    pub(crate) fn peers_out(&self) -> Option<Vec<(String, &'static str)>> {
        let Kind::Reach(r) = &self.kind else {
            return None;
        };
        let status = serde_json::to_value(r.caller.status()).ok()?;
        let views = status.get("peer_views")?.as_array()?;
        Some(
            views
                .iter()
                .filter_map(|p| {
                    let states: Vec<&str> = [
                        p.get("effective_state"),
                        p.pointer("/view/state"),
                        p.pointer("/self_view/view/state"),
                    ]
                    .into_iter()
                    .flatten()
                    .filter_map(serde_json::Value::as_str)
                    .collect();
                    let worst = if states.contains(&"ejected") {
                        "ejected"
                    } else if states.contains(&"probation") {
                        "probation"
                    } else {
                        return None;
                    };
                    Some((p.get("name")?.as_str()?.to_owned(), worst))
                })
                .collect(),
        )
    }

    /// agent-reach: attempts refused as saturated (429, or 503 `saturated`) as the callers'
    /// sidecars counted them over every peer, all together, and as the sidecar of the agent in
    /// `slot` did.
    pub(crate) fn refusals(&self, slot: usize) -> Option<(u64, u64)> {
        let Kind::Reach(r) = &self.kind else {
            return None;
        };
        let at_callers = r
            .callers()
            .flat_map(|c| c.status().peer_views)
            .map(|p| p.outcomes.refused + p.outcomes.shed)
            .sum();
        let at_agent = r.sidecars.get(slot)?.as_ref()?.status().inbound.rejected;
        Some((at_callers, at_agent))
    }

    pub(crate) fn final_status(&self) -> Option<String> {
        let Kind::Reach(r) = &self.kind else {
            return None;
        };
        serde_json::to_string_pretty(&r.caller.status()).ok()
    }

    pub(crate) async fn stop(self) {
        let Front { kind, relay, .. } = self;
        if let Some(r) = relay {
            r.stop.cancel();
        }
        match kind {
            Kind::Reach(r) => {
                let Reach {
                    caller,
                    other_callers,
                    sidecars,
                    ..
                } = *r;
                caller.kill().await;
                for c in other_callers {
                    c.kill().await;
                }
                for s in sidecars.into_iter().flatten() {
                    s.kill().await;
                }
            }
            Kind::Baseline { task, .. } => task.abort(),
            Kind::Haproxy { mut child, .. } | Kind::Envoy { mut child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
