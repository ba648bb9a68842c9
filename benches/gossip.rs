//! Gossip at fleet scale, over the in-memory network with the shipped timings (probe every 1 s,
//! suspect for 3 s, live view refreshed every 2 s). Per fleet size N it prints: time for the
//! fleet to converge from one seed, time for a state change to reach every node (p50/max),
//! time for a dead node to leave every table (p50/max), and bytes and datagrams per node per
//! second in steady state. Never asserts on time.
//!
//! Run: `cargo bench --bench gossip` (N = 50, 100, 200), `-- --nodes 50,400`, or `-- --smoke`
//! (`cargo test` runs the smoke size: ten nodes, a few seconds).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::gossip::{
    self, ClusterKey, GossipHandle, Live, MemNetwork, Member, Membership, NodeOptions, Profile,
};
use agent_reach::reach::State;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Seen {
    members: Mutex<Vec<String>>,
    lives: Mutex<HashMap<String, Live>>,
}

impl Membership for Seen {
    fn members(&self, members: &[Member]) {
        *lock(&self.members) = members.iter().map(|m| m.name.clone()).collect();
    }
    fn live(&self, member: &Member, live: &Live) {
        lock(&self.lives).insert(member.name.clone(), *live);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Node {
    name: String,
    addr: SocketAddr,
    handle: GossipHandle,
    seen: Arc<Seen>,
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 1, (i / 250) as u8, (i % 250) as u8 + 1], 4190))
}

fn live(busy: bool) -> Live {
    Live {
        profile_seq: 0,
        state: State::Healthy,
        state_age_s: 0,
        cap: 1000,
        availability: 990,
        saturation: if busy { 1000 } else { 200 },
        latency_ms: Some(40),
        p50_ms: Some(38),
        p95_ms: Some(90),
        busy,
        cooling_down: false,
        in_flight: 2,
        queued: 0,
        saturation_predicted: 0,
    }
}

fn profile(i: usize) -> Profile {
    Profile {
        inbound: format!("{}:4143", addr(i).ip()),
        zone: format!("zone-{}", i % 3),
        region: "region-1".into(),
        max_concurrency: 8,
        capabilities: vec![gossip::Capability {
            name: format!("capability-{}", i % 5),
            tags: [("python".to_owned(), 900u16), ("go".to_owned(), 600u16)]
                .into_iter()
                .collect(),
            timeout_ms: 30_000,
            mode: agent_reach::config::RouteMode::Sync,
            cost_milli: 0,
            idempotent: false,
            output_schema: None,
            a2a: None,
        }],
        version: env!("CARGO_PKG_VERSION").into(),
        identity: None,
    }
}

struct Figures {
    n: usize,
    converged: bool,
    dead_detected: bool,
    converge: Duration,
    change: Vec<Duration>,
    dead: Vec<Duration>,
    bytes_per_node_s: f64,
    packets_per_node_s: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if f() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Polls until every node in `nodes` satisfies `f`, recording when each first did.
async fn each_until(
    nodes: &[&Node],
    deadline: Duration,
    f: impl Fn(&Node) -> bool,
) -> Vec<Duration> {
    let start = Instant::now();
    let mut when: Vec<Option<Duration>> = vec![None; nodes.len()];
    while start.elapsed() < deadline && when.iter().any(Option::is_none) {
        for (i, n) in nodes.iter().enumerate() {
            if when[i].is_none() && f(n) {
                when[i] = Some(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut out: Vec<Duration> = when.into_iter().map(|w| w.unwrap_or(deadline)).collect();
    out.sort();
    out
}

async fn run_fleet(n: usize, steady: Duration, changes: usize) -> Figures {
    let net = MemNetwork::new();
    let key = ClusterKey::random();
    let stop = CancellationToken::new();
    let mut nodes = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let (transport, inbox) = net.join(addr(i));
        let seen = Arc::new(Seen::default());
        let options = NodeOptions::new(format!("agent-{i}"), addr(i), key.clone());
        let handle = gossip::spawn(options, transport, inbox, seen.clone(), stop.clone());
        handle.publish_profile(profile(i));
        handle.publish_live(live(false));
        if i > 0 {
            handle.announce(vec![addr(0)]);
        }
        nodes.push(Node {
            name: format!("agent-{i}"),
            addr: addr(i),
            handle,
            seen,
        });
    }
    // As the sidecar does: seeds are retried each second until a member answers.
    let (converged, converge) = loop {
        if nodes
            .iter()
            .all(|node| lock(&node.seen.members).len() == n - 1)
        {
            break (true, start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(120) {
            break (false, start.elapsed());
        }
        if std::env::var_os("GOSSIP_BENCH_TRACE").is_some() {
            let alive: Vec<usize> = nodes.iter().map(|x| x.handle.status().alive).collect();
            let routable: Vec<usize> = nodes.iter().map(|x| lock(&x.seen.members).len()).collect();
            eprintln!(
                "t={:.1}s alive min {} routable min {} max {}",
                start.elapsed().as_secs_f64(),
                alive.iter().min().unwrap_or(&0),
                routable.iter().min().unwrap_or(&0),
                routable.iter().max().unwrap_or(&0)
            );
        }
        for node in nodes.iter().skip(1) {
            if node.handle.status().alive == 0 {
                node.handle.announce(vec![addr(0)]);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Steady state: nothing changes but the periodic refresh and SWIM's own traffic.
    let sum = |nodes: &[Node]| {
        nodes.iter().fold((0u64, 0u64), |(b, p), node| {
            let s = node.handle.stats();
            (
                b + s.bytes_sent.load(Ordering::Relaxed),
                p + s.packets_sent.load(Ordering::Relaxed),
            )
        })
    };
    let (b0, p0) = sum(&nodes);
    let t0 = Instant::now();
    tokio::time::sleep(steady).await;
    let (b1, p1) = sum(&nodes);
    let secs = t0.elapsed().as_secs_f64() * n as f64;
    let bytes_per_node_s = (b1 - b0) as f64 / secs;
    let packets_per_node_s = (p1 - p0) as f64 / secs;

    // A state change (the agent goes busy) reaching everyone.
    let mut change = Vec::new();
    for c in 0..changes {
        let who = 1 + c * (n - 1) / changes.max(1);
        let name = nodes[who].name.clone();
        nodes[who].handle.publish_live(live(true));
        let others: Vec<&Node> = nodes.iter().filter(|x| x.name != name).collect();
        change.extend(
            each_until(&others, Duration::from_secs(30), |x| {
                lock(&x.seen.lives).get(&name).is_some_and(|l| l.busy)
            })
            .await,
        );
        nodes[who].handle.publish_live(live(false));
        let _ = wait_until(Duration::from_secs(10), || {
            nodes
                .iter()
                .filter(|x| x.name != name)
                .all(|x| lock(&x.seen.lives).get(&name).is_some_and(|l| !l.busy))
        })
        .await;
    }

    // A node dies without a word.
    let victim = n / 2;
    let name = nodes[victim].name.clone();
    net.cut(nodes[victim].addr);
    nodes[victim].handle.abort();
    let others: Vec<&Node> = nodes.iter().filter(|x| x.name != name).collect();
    let dead_deadline = Duration::from_secs(60);
    let mut dead = each_until(&others, dead_deadline, |x| {
        !lock(&x.seen.members).contains(&name)
    })
    .await;
    let dead_detected = dead.iter().all(|d| *d < dead_deadline);
    dead.sort();
    change.sort();
    stop.cancel();
    Figures {
        n,
        converged,
        dead_detected,
        converge,
        change,
        dead,
        bytes_per_node_s,
        packets_per_node_s,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; `cargo test` runs this as a smoke test so it cannot rot.
    let smoke = args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench");
    let mut sizes: Vec<usize> = if smoke { vec![10] } else { vec![50, 100, 200] };
    if let Some(i) = args.iter().position(|a| a == "--nodes") {
        if let Some(list) = args.get(i + 1) {
            sizes = list
                .split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect();
        }
    }
    let (steady, changes) = if smoke {
        (Duration::from_secs(2), 2)
    } else {
        (Duration::from_secs(10), 5)
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("cannot start a runtime: {err}");
            return;
        }
    };
    println!("gossip at fleet scale: in-memory network, shipped timings (probe 1 s, suspect 3 s, refresh 2 s)");
    println!(
        "{:>5}  {:>10}  {:>12}  {:>12}  {:>10}  {:>10}  {:>14}  {:>14}",
        "N",
        "converge",
        "change p50",
        "change max",
        "dead p50",
        "dead max",
        "bytes/node/s",
        "packets/node/s"
    );
    for n in sizes {
        let f = runtime.block_on(run_fleet(n.max(3), steady, changes));
        println!(
            "{:>5}  {:>9.2}s  {:>11.0}ms  {:>11.0}ms  {:>9.2}s  {:>9.2}s  {:>14.0}  {:>14.1}",
            f.n,
            f.converge.as_secs_f64(),
            percentile(&f.change, 0.5).as_secs_f64() * 1000.0,
            percentile(&f.change, 1.0).as_secs_f64() * 1000.0,
            percentile(&f.dead, 0.5).as_secs_f64(),
            percentile(&f.dead, 1.0).as_secs_f64(),
            f.bytes_per_node_s,
            f.packets_per_node_s,
        );
        // The smoke run (CI) checks that it works, never how fast.
        if smoke && !(f.converged && f.dead_detected) {
            eprintln!("smoke: the fleet did not converge, or a dead node was not detected");
            std::process::exit(1);
        }
    }
    println!(
        "reproduce: cargo bench --bench gossip{}",
        if smoke { " -- --smoke" } else { "" }
    );
}
