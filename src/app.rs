//! Wires one sidecar: binds the listeners, starts the background tasks, and drains on shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{Admin, Status};
use crate::config::MtlsMode;
use crate::config::{spawn_watcher, ConfigStore, Listen, ReloadResult, Snapshot};
use crate::gossip::GossipHandle;
use crate::http::pool::{Pool, PoolConfig};
use crate::http::server::{self, ServerSettings};
use crate::http::{layers, ReachBody};
use crate::inbound::Inbound;
use crate::local::LocalAgent;
use crate::metrics::Metrics;
use crate::outbound::Outbound;
use crate::peers;
use crate::probe;
use crate::runtime::Shared;
use crate::trace::{self, Tracer};
use crate::transport::mtls::MeshTls;
use crate::transport::{Accepted, ConnectMesh, ConnectTcp, Mesh, PlainTcp};

mod gossip_wiring;

/// The admin listener never streams: a request that takes longer than this is stuck.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// The capabilities known at start, their series exported from 0 (`metrics/known.rs`): the
/// agent's own (inbound), and those its static peers serve or its policy names (outbound).
fn register_known_capabilities(metrics: &Metrics, snapshot: &crate::config::Snapshot) {
    use crate::metrics::Direction;
    for capability in &snapshot.bootstrap.agent.capabilities {
        metrics.register_capability(Direction::Inbound, capability.name.as_str());
    }
    let peers = snapshot
        .bootstrap
        .peers
        .iter()
        .flat_map(|p| &p.capabilities);
    let policy = snapshot.policy.capabilities.keys();
    for capability in peers.map(|c| c.as_str()).chain(policy.map(String::as_str)) {
        metrics.register_called(capability, snapshot.observe_only(capability));
    }
}

/// The longest a task runner waits after start for gossip to join and hand over members.
const SETTLE_GOSSIP: Duration = Duration::from_secs(10);
/// Admin endpoints answer GET; a body is never read.
const ADMIN_BODY_LIMIT: usize = 16 * 1024;

/// The sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot bind the {listener} listener on {addr}: {source}")]
    Bind {
        listener: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    GossipKey(#[from] crate::gossip::KeyError),
    #[error("mutual TLS: {0}")]
    Tls(#[from] crate::transport::certs::CertError),
    #[error(transparent)]
    Tracing(#[from] crate::trace::SettingsError),
    #[error("tasks: {0}")]
    Tasks(String),
}

/// The addresses the listeners actually bound (useful with port 0).
#[derive(Clone, Copy, Debug)]
pub struct BoundAddrs {
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    /// The gossip address peers reach this sidecar at, when gossip is on.
    pub gossip: Option<SocketAddr>,
}

/// A running sidecar.
#[derive(Debug)]
pub struct Sidecar {
    pub addrs: BoundAddrs,
    store: Arc<ConfigStore>,
    admin: Arc<Admin>,
    outbound: Arc<Outbound>,
    local: Arc<LocalAgent>,
    probes: Option<std::thread::JoinHandle<()>>,
    ready: Arc<AtomicBool>,
    gossip: Option<Arc<GossipHandle>>,
    /// Stops the traffic listeners (outbound, inbound).
    stop_traffic: CancellationToken,
    /// Stops the admin listener and background tasks, after the drain.
    stop_rest: CancellationToken,
    traffic: Vec<JoinHandle<()>>,
    rest: Vec<JoinHandle<()>>,
    /// The span exporter, when tracing is on: told to flush and stop after the drain.
    traces: Option<(Tracer, CancellationToken, JoinHandle<()>)>,
}

impl Sidecar {
    /// Binds every listener and starts serving. Must run inside a tokio runtime.
    pub async fn start(store: Arc<ConfigStore>) -> Result<Self, StartError> {
        let snapshot = store.snapshot();
        let (listeners, mut addrs) = Listeners::bind(&snapshot.bootstrap.listen).await?;
        let metrics = Arc::new(Metrics::new(snapshot.bootstrap.agent.name.as_str()));
        let tls = mesh_tls(&store, &snapshot)?;
        let (agent_pool, peer_pool) = pools(&store, &snapshot, tls.as_ref());
        let shared = Shared::new(store.clone(), metrics.clone());
        let local = shared.local.clone();
        let inbound = Arc::new(Inbound::new(&shared, agent_pool));
        let tasks = open_tasks(&store, &snapshot, &metrics).await?;
        let mut outbound = Outbound::new(&shared, peer_pool.clone());
        if let Some(queue) = &tasks {
            outbound = outbound.with_tasks(queue.clone());
        }
        let outbound = Arc::new(outbound);
        let stop_traffic = CancellationToken::new();
        let stop_rest = CancellationToken::new();
        let traces = start_traces(&snapshot)?;
        let tracer = traces.as_ref().map_or_else(Tracer::off, |t| t.0.clone());
        let gossip = start_gossip(
            &snapshot,
            (&shared, outbound.mcp_pins()),
            &mut addrs,
            tls.clone(),
            &stop_rest,
        )
        .await?;
        register_known_capabilities(&metrics, &snapshot);
        let ready = Arc::new(AtomicBool::new(false));
        let admin = admin(&shared, &inbound, &outbound, &gossip, &ready);
        let traffic = spawn_traffic(
            (listeners.outbound, listeners.inbound),
            (&outbound, &inbound),
            &snapshot,
            &shared,
            tls.clone(),
            &tracer,
            &stop_traffic,
        );
        let mut rest = spawn_rest(
            listeners.admin,
            &admin,
            &snapshot,
            &shared,
            peer_pool,
            &stop_rest,
        );
        if let Some(queue) = tasks {
            rest.push(spawn_runner(queue, &gossip, &shared, &outbound, &stop_rest));
        }
        if let Some(tls) = tls {
            rest.push(spawn_tls_watch(tls, &snapshot, &metrics, &stop_rest));
        }
        let probes = spawn_probes(&shared, &stop_rest);
        ready.store(true, Ordering::Release);
        tracing::info!(
            agent = %snapshot.bootstrap.agent.name,
            outbound = %addrs.outbound, inbound = %addrs.inbound, admin = %addrs.admin,
            gossip = %addrs.gossip.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            "agent-reach sidecar started"
        );
        Ok(Self {
            addrs,
            store,
            admin,
            outbound,
            local,
            probes,
            ready,
            gossip,
            stop_traffic,
            stop_rest,
            traffic,
            rest,
            traces,
        })
    }

    pub fn store(&self) -> &Arc<ConfigStore> {
        &self.store
    }

    /// What observe-only mode found so far, per capability.
    pub fn observed(&self) -> Vec<(String, crate::outbound::ObserveCounts)> {
        self.outbound.observed()
    }

    /// What `/status` would answer now.
    pub fn status(&self) -> Status {
        self.admin.status()
    }

    /// Stops at once: no draining, no goodbye to the gossip cluster. What a crash looks like to
    /// peers (tests and the demo use it).
    pub async fn kill(self) {
        self.stop_rest.cancel();
        self.stop_traffic.cancel();
        for task in self.traffic.into_iter().chain(self.rest) {
            task.abort();
            let _ = task.await;
        }
        if let Some(g) = &self.gossip {
            g.abort();
        }
        if let Some((_, _, exporter)) = self.traces {
            exporter.abort();
        }
    }

    /// What the span exporter did so far (all zero when tracing is off).
    pub fn trace_counts(&self) -> crate::trace::Counts {
        self.traces
            .as_ref()
            .map(|t| t.0.counts())
            .unwrap_or_default()
    }

    /// Graceful shutdown: report not-ready, stop accepting, let in-flight requests finish (bounded
    /// by the drain timeout), then stop the admin listener and background tasks.
    pub async fn shutdown(self) {
        tracing::info!("draining");
        // Announce first: while the news spreads (one gossip round-trip through the fleet, or one
        // self-view poll) the listeners stay open, answering new work with 503 `draining` so
        // callers retry elsewhere; then stop accepting and let in-flight work finish.
        self.local.drain();
        self.ready.store(false, Ordering::Release);
        let snapshot = self.store.snapshot();
        let announce = match &self.gossip {
            Some(g) => {
                g.publish_live(peers::live(&self.local.self_view()));
                gossip_wiring::drain_announce(&snapshot)
            }
            None => snapshot.policy.peer_views.poll_interval.get(),
        };
        tokio::time::sleep(announce.min(Duration::from_secs(5))).await;
        self.stop_traffic.cancel();
        for task in self.traffic {
            let _ = task.await;
        }
        // Every request has ended: its spans are queued. Send them before leaving.
        if let Some((_, stop, exporter)) = self.traces {
            stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), exporter).await;
        }
        // Then leave: members drop this node at once instead of waiting to detect it dead.
        if let Some(g) = &self.gossip {
            g.leave().await;
        }
        self.stop_rest.cancel();
        for task in self.rest {
            let _ = task.await;
        }
        if let Some(probes) = self.probes {
            let _ = tokio::task::spawn_blocking(move || probes.join()).await;
        }
        tracing::info!("drained; stopped");
    }
}

/// Starts the span exporter when the bootstrap or the `OTEL_*` variables name an endpoint.
fn start_traces(
    snapshot: &crate::config::Snapshot,
) -> Result<Option<(Tracer, CancellationToken, JoinHandle<()>)>, StartError> {
    let bootstrap = &snapshot.bootstrap;
    let resolved = trace::Settings::resolve(bootstrap.tracing.as_ref(), |k| std::env::var(k).ok())?;
    Ok(resolved.map(|settings| {
        let endpoint = crate::redact::url(&settings.endpoint.to_string());
        tracing::info!(%endpoint, "exporting traces");
        let stop = CancellationToken::new();
        let name = bootstrap.agent.name.as_str();
        let (tracer, task) = Tracer::start(settings, name, &snapshot.policy, stop.clone());
        (tracer, stop, task)
    }))
}

/// The admin listener's service: bounded, and `/metrics` and `/status` gzipped on request.
fn admin_service(
    admin: Arc<Admin>,
    local: bool,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<ReachBody>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    let admin = tower::service_fn(move |req| {
        let admin = admin.clone();
        async move { Ok::<_, Infallible>(admin.handle(req, local).await) }
    });
    layers::guarded(ADMIN_TIMEOUT, ADMIN_BODY_LIMIT, layers::compressed(admin))
}

/// A listener's service that is the same for every connection (it reads nothing of its client).
fn each_connection<S: Clone>(service: S) -> impl FnOnce(Arc<Accepted>) -> S + Clone {
    move |_| service
}

/// The traffic listeners: each stack behind the edge layers, inside the trace wrapper. The
/// trace wrapper goes outside each edge: the listener's future is boxed inside it, so wrapping
/// there moves a few words per request, not the whole request path.
fn spawn_traffic(
    (outbound_listener, inbound_listener): (TcpListener, TcpListener),
    (outbound, inbound): (&Arc<Outbound>, &Arc<Inbound>),
    snapshot: &Snapshot,
    shared: &Shared,
    tls: Option<Arc<MeshTls>>,
    tracer: &Tracer,
    stop_traffic: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let (limits, store, metrics) = (&snapshot.bootstrap.limits, &shared.store, &shared.metrics);
    let traffic_settings = ServerSettings::from_limits(limits, limits.drain_timeout.get());
    let accept = PlainTcp::new(limits.header_read_timeout.get());
    vec![
        tokio::spawn(server::serve(
            "outbound",
            outbound_listener,
            accept,
            each_connection(tracer.server(
                "outbound",
                layers::edge("outbound", metrics, outbound.stack()),
            )),
            // Streams per h2 connection are advertised and bounded: a process in the pod cannot
            // open them without end.
            ServerSettings {
                h2_max_streams: Some(OUTBOUND_H2_STREAMS),
                ..traffic_settings.clone()
            },
            metrics.clone(),
            stop_traffic.clone(),
        )),
        tokio::spawn(server::serve(
            "inbound",
            inbound_listener,
            mesh_accept(store, tls, limits, metrics),
            {
                let (inbound, tracer, metrics) = (inbound.clone(), tracer.clone(), metrics.clone());
                // The inbound steps read who the caller is: made for each connection.
                move |accepted| {
                    let stack = inbound.stack(accepted);
                    tracer.server("inbound", layers::edge("inbound", &metrics, stack))
                }
            },
            inbound_settings(&traffic_settings, &store.snapshot()),
            metrics.clone(),
            stop_traffic.clone(),
        )),
    ]
}

/// The admin listener's view of the sidecar.
fn admin(
    shared: &Shared,
    inbound: &Arc<Inbound>,
    outbound: &Arc<Outbound>,
    gossip: &Option<Arc<GossipHandle>>,
    ready: &Arc<AtomicBool>,
) -> Arc<Admin> {
    Arc::new(Admin {
        store: shared.store.clone(),
        metrics: shared.metrics.clone(),
        inbound: inbound.clone(),
        outbound: outbound.clone(),
        local: shared.local.clone(),
        peers: shared.peers.clone(),
        registry: shared.registry.clone(),
        gossip: gossip.clone(),
        ready: ready.clone(),
        history: Default::default(),
        app_probes: Arc::new(shared.store.snapshot().bootstrap.app_probes.clone()),
        drain_token: shared
            .store
            .snapshot()
            .bootstrap
            .drain_token
            .as_deref()
            .map(Arc::from),
    })
}

/// Probes run on their own low-priority thread; failing to start it is logged, not fatal.
fn spawn_probes(shared: &Shared, stop: &CancellationToken) -> Option<std::thread::JoinHandle<()>> {
    let local = &shared.local;
    probe::spawn(
        shared.store.clone(),
        local.clone(),
        shared.metrics.clone(),
        stop.clone(),
    )
    .map_err(|err| {
        tracing::error!(%err, "cannot start the probe thread; business probes are off");
        local.prober_unavailable();
    })
    .ok()
}

/// The admin listener and the background tasks that stop after the drain.
fn spawn_rest(
    admin_listener: TcpListener,
    admin: &Arc<Admin>,
    snapshot: &Snapshot,
    shared: &Shared,
    peer_pool: Pool,
    stop_rest: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let (limits, store, metrics) = (&snapshot.bootstrap.limits, &shared.store, &shared.metrics);
    let accept = PlainTcp::new(limits.header_read_timeout.get());
    vec![
        tokio::spawn(server::serve(
            "admin",
            admin_listener,
            accept,
            {
                let (admin, metrics) = (admin.clone(), metrics.clone());
                // Some answers are for the pod's own loopback only: made for each connection.
                move |accepted: Arc<Accepted>| {
                    let local = accepted.client.0.ip().is_loopback();
                    layers::edge("admin", &metrics, admin_service(admin.clone(), local))
                }
            },
            ServerSettings {
                h2_max_streams: Some(ADMIN_H2_STREAMS),
                ..ServerSettings::from_limits(limits, Duration::from_secs(1))
            },
            metrics.clone(),
            stop_rest.clone(),
        )),
        spawn_watcher(store.clone(), reloads(metrics), stop_rest.clone()),
        spawn_upkeep(metrics.clone(), shared.local.clone(), stop_rest.clone()),
        crate::a2a::spawn(
            store.clone(),
            shared.local.clone(),
            reloads(metrics),
            stop_rest.clone(),
        ),
        crate::mcp::spawn(store.clone(), reloads(metrics), stop_rest.clone()),
        peers::spawn_poller(
            store.clone(),
            shared.registry.clone(),
            shared.peers.clone(),
            peer_pool,
            stop_rest.clone(),
        ),
        admin.spawn_history(stop_rest.clone()),
    ]
}

/// The three listeners, bound.
struct Listeners {
    outbound: TcpListener,
    inbound: TcpListener,
    admin: TcpListener,
}

impl Listeners {
    async fn bind(listen: &Listen) -> Result<(Self, BoundAddrs), StartError> {
        let listeners = Listeners {
            outbound: bind("outbound", listen.outbound).await?,
            inbound: bind("inbound", listen.inbound).await?,
            admin: bind("admin", listen.admin).await?,
        };
        let addrs = BoundAddrs {
            outbound: local_addr(&listeners.outbound, listen.outbound),
            inbound: local_addr(&listeners.inbound, listen.inbound),
            admin: local_addr(&listeners.admin, listen.admin),
            gossip: None,
        };
        Ok((listeners, addrs))
    }
}

/// The data path's pools drive each connection in the request's own task; one to the local agent
/// (plaintext, loopback), one to peers (mutual TLS where the mode says so). Connectors read the
/// live policy per new connection; the pools' own settings are restart-only
/// (src/config/restart_only.rs).
fn pools(
    store: &Arc<ConfigStore>,
    snapshot: &Snapshot,
    tls: Option<&Arc<MeshTls>>,
) -> (Pool, Pool) {
    let limits = &snapshot.bootstrap.limits;
    if snapshot.policy.pool.idle_timeout.get() >= limits.header_read_timeout.get() {
        tracing::warn!(
            "policy pool.idle_timeout is not below limits.header_read_timeout: peers close idle \
             connections before callers stop reusing them, and a call can fail on one"
        );
    }
    let agent_pool = Pool::new(
        PoolConfig::from_policy(&snapshot.policy),
        ConnectTcp::following(store.clone()),
    );
    let tcp = ConnectTcp::following(store.clone());
    let peer_pool = Pool::with_mesh(
        PoolConfig::for_peers(&snapshot.policy),
        tcp.clone(),
        tls.cloned().map(|tls| ConnectMesh::new(tcp, tls)),
    );
    (agent_pool, peer_pool)
}

/// The task queue, when the bootstrap has `tasks`.
async fn open_tasks(
    store: &ConfigStore,
    snapshot: &Snapshot,
    metrics: &Arc<Metrics>,
) -> Result<Option<Arc<crate::tasks::Queue>>, StartError> {
    let Some(config) = &snapshot.bootstrap.tasks else {
        return Ok(None);
    };
    let base = store.paths.bootstrap.as_deref().and_then(|p| p.parent());
    let agent = snapshot.bootstrap.agent.name.as_str();
    let queue = crate::tasks::Queue::open(config, base, agent, agent, metrics.clone())
        .await
        .map_err(StartError::Tasks)?;
    Ok(Some(queue))
}

/// The gossip node, when the bootstrap has `gossip`; its address goes into `addrs`.
async fn start_gossip(
    snapshot: &Snapshot,
    (shared, pins): (&Shared, Arc<crate::outbound::McpPins>),
    addrs: &mut BoundAddrs,
    tls: Option<Arc<MeshTls>>,
    stop: &CancellationToken,
) -> Result<Option<Arc<GossipHandle>>, StartError> {
    let Some(config) = &snapshot.bootstrap.gossip else {
        return Ok(None);
    };
    let feed = peers::GossipFeed {
        registry: shared.registry.clone(),
        views: shared.peers.clone(),
        store: shared.store.clone(),
        pins: pins.clone(),
    };
    let (handle, addr) = gossip_wiring::start(
        config,
        &shared.store,
        addrs.inbound,
        feed,
        (shared.local.clone(), pins),
        tls,
        stop.clone(),
    )
    .await?;
    addrs.gossip = Some(addr);
    Ok(Some(handle))
}

/// The task runner: it waits for gossip to settle, when there is gossip, before routing.
fn spawn_runner(
    queue: Arc<crate::tasks::Queue>,
    gossip: &Option<Arc<GossipHandle>>,
    shared: &Shared,
    outbound: &Arc<Outbound>,
    stop: &CancellationToken,
) -> JoinHandle<()> {
    let settle = match gossip {
        Some(g) => {
            let (g, registry) = (g.clone(), shared.registry.clone());
            crate::tasks::runner::Settle {
                settled: Box::new(move || g.swim_members() > 0 && registry.gossip_members() > 0),
                at_least: Duration::ZERO,
                at_most: SETTLE_GOSSIP,
            }
        }
        None => crate::tasks::runner::Settle::static_fleet(),
    };
    crate::tasks::runner::spawn(
        queue,
        Arc::new(crate::outbound::TaskChain(outbound.clone())),
        shared.store.clone(),
        settle,
        stop.clone(),
    )
}

/// Re-reads the TLS files when they change.
fn spawn_tls_watch(
    tls: Arc<MeshTls>,
    snapshot: &Snapshot,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> JoinHandle<()> {
    let reloads = reloads(metrics);
    tls.spawn_watch(
        snapshot.bootstrap.watch_interval.get(),
        move |r| {
            let result = match r {
                crate::transport::certs::Reloaded::Renewed => ReloadResult::Ok,
                _ => ReloadResult::Error,
            };
            reloads("tls", result)
        },
        stop.clone(),
    )
}

/// Binds `addr`. `[::]` is dual-stack (IPv4 and IPv6, what the injector writes): on a node
/// whose kernel has IPv6 turned off it falls back to `0.0.0.0` on the same port, said once.
async fn bind(listener: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    let bound = TcpListener::bind(addr).await;
    let bound = match bound {
        Err(err) if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED => {
            let v4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
            tracing::info!(listener, %err, "no IPv6 here: listening on {v4}");
            TcpListener::bind(v4).await
        }
        other => other,
    };
    bound.map_err(|source| StartError::Bind {
        listener,
        addr,
        source,
    })
}

fn local_addr(listener: &TcpListener, fallback: SocketAddr) -> SocketAddr {
    listener.local_addr().unwrap_or(fallback)
}

/// Once a second: time-driven state transitions of the agent's own view happen even without
/// traffic, and histogram samples fold into buckets so memory stays flat between scrapes.
fn spawn_upkeep(
    metrics: Arc<Metrics>,
    local: Arc<LocalAgent>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    local.publish();
                    let budget = local.budgets().headroom(tokio::time::Instant::now());
                    metrics.model_headroom(budget.map_or(1.0, |b| b.headroom));
                    metrics.run_upkeep();
                }
            }
        }
    })
}

/// This sidecar's mutual TLS material, when the bootstrap names its files. A configured mode
/// without them is warned about: `strict` then refuses every peer, `permissive` is plaintext.
fn mesh_tls(
    store: &ConfigStore,
    snapshot: &crate::config::Snapshot,
) -> Result<Option<Arc<MeshTls>>, StartError> {
    let Some(files) = &snapshot.bootstrap.tls else {
        if snapshot.mtls_mode() != MtlsMode::Disabled {
            tracing::warn!(
                mode = snapshot.mtls_mode().as_str(),
                "the policy asks for mutual TLS but the bootstrap names no tls files"
            );
        }
        return Ok(None);
    };
    let base = store
        .paths
        .bootstrap
        .as_deref()
        .and_then(std::path::Path::parent);
    let tls = MeshTls::load(files.resolved(base))?;
    tracing::info!(identity = %tls.identity(), mode = snapshot.mtls_mode().as_str(), "mutual TLS");
    Ok(Some(tls))
}

/// The inbound listener's server settings: one h2 connection carries no more streams than the
/// agent can run or queue (`max_concurrency` + `queue.capacity` at start), so a client cannot
/// park thousands of streams on one connection.
/// Streams one h2 connection to the outbound listener may carry at once (its
/// `SETTINGS_MAX_CONCURRENT_STREAMS`); a client past it waits for a stream, as h2 says.
const OUTBOUND_H2_STREAMS: u32 = 256;
/// The same for the admin listener: scrapes and status reads.
const ADMIN_H2_STREAMS: u32 = 16;

fn inbound_settings(
    traffic: &ServerSettings,
    snapshot: &crate::config::Snapshot,
) -> ServerSettings {
    let agent = &snapshot.bootstrap.agent;
    let streams = agent.max_concurrency.get() + agent.queue.capacity;
    ServerSettings {
        h2_max_streams: Some(u32::try_from(streams).unwrap_or(u32::MAX)),
        ..traffic.clone()
    }
}

/// The inbound listener's acceptor: TLS or plaintext as the live policy's mode allows.
fn mesh_accept(
    store: &Arc<ConfigStore>,
    tls: Option<Arc<MeshTls>>,
    limits: &crate::config::Limits,
    metrics: &Arc<Metrics>,
) -> Mesh {
    let intercept = store.snapshot().bootstrap.listen.intercept.ports.clone();
    let (store, metrics) = (store.clone(), metrics.clone());
    Mesh::new(
        tls,
        Arc::new(move |port| store.snapshot().mtls_mode_for(port)),
        &intercept,
        limits.header_read_timeout.get(),
        limits.header_read_timeout.get(),
        Arc::new(move |reason| metrics.tls_handshake_failed(reason)),
    )
}

/// Config reloads, counted.
fn reloads(metrics: &Arc<Metrics>) -> crate::config::OnReload {
    let metrics = metrics.clone();
    Arc::new(move |file, result| metrics.config_reload(file, result.as_str()))
}
