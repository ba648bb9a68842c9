//! The cost of a big fleet in one sidecar: `cargo bench --bench fleet [-- --peers 1000,5000]`.
//!
//! Runs the real binary (`agent-reach run`, gossip on, `expected_members` = N) as its own process,
//! so its RSS and CPU are its own, and has N gossip members join it: real gossip nodes in this
//! process (the node code the sidecar runs: SWIM, envelopes, items), each on its own UDP socket on
//! loopback, publishing a profile with one capability out of twenty and a live view. They reach
//! the sidecar's real registry, peer views, metrics and `/status` as a fleet's members would.
//! Members talk only to the sidecar (their datagrams to one another are dropped here, and they
//! never probe): N full members would need N² of this machine's memory and CPU, and what is
//! measured is the one sidecar. Its own SWIM work — a probe each second, gossip every 200 ms,
//! push-pull — runs as in any fleet; the fleet's relayed live views, bounded per node by design
//! (`docs/gossip.md`), are not replayed here.
//!
//! Prints per N: time until the sidecar routes to all N, its RSS (before the fleet, with it,
//! peak), its CPU over a steady stretch, and the size and time of one `/status` and one
//! `/metrics`. The pick among 5,000 candidates is `cargo bench --bench pick`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::config::RouteMode;
use agent_reach::gossip::{
    self, ClusterKey, GossipHandle, Live, Member, Membership, NodeOptions, Profile, Transport,
};
use agent_reach::reach::State;
use tokio_util::sync::CancellationToken;

use bench::{free_port, kib, terminate, write};
use testkit::bench;
use testkit::chaos::net;

/// A key every member and the sidecar share (64 hex characters).
const KEY: &str = "4d2f0c9a7b1e3a5c6d8e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e";
/// Members started per batch, and the pause between batches: a rolling start, not one burst.
const BATCH: usize = 250;
const BATCH_GAP: Duration = Duration::from_millis(250);
/// Linux's USER_HZ: the unit of utime and stime in `/proc/<pid>/stat`.
const TICKS_PER_S: f64 = 100.0;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench");
    let sizes: Vec<usize> = args
        .iter()
        .position(|a| a == "--peers")
        .and_then(|i| args.get(i + 1))
        .map(|list| {
            list.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| if smoke { vec![50] } else { vec![1000, 5000] });
    let steady = if smoke {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(10)
    };
    let dir = std::env::temp_dir().join(format!("agent-reach-fleet-{}", std::process::id()));
    if let Err(err) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {err}", dir.display());
        std::process::exit(1);
    }
    // Members get one core; the sidecar the other.
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    else {
        eprintln!("cannot start a runtime");
        std::process::exit(1);
    };
    let binary = std::env::var_os("BENCH_BINARY")
        .map_or(PathBuf::from(env!("CARGO_BIN_EXE_agent-reach")), Into::into);
    println!("one sidecar (its own process) that a fleet of N gossip members joins over loopback");
    println!(
        "{:>5}  {:>9}  {:>10}  {:>10}  {:>10}  {:>12}  {:>10}  {:>9}  {:>11}  {:>10}",
        "N",
        "routable",
        "RSS before",
        "RSS fleet",
        "RSS peak",
        "CPU (1 core)",
        "/status",
        "in",
        "/metrics",
        "in"
    );
    let mut failed = false;
    for n in sizes {
        match runtime.block_on(run(&binary, &dir, n.max(1), steady)) {
            Ok(row) => println!(
                "{:>5}  {:>8.1}s  {:>6.1} MiB  {:>6.1} MiB  {:>6.1} MiB  {:>11.1}%  {:>6.0} KiB  {:>6.1} ms  {:>7.0} KiB  {:>7.1} ms",
                row.n,
                row.routable.as_secs_f64(),
                row.rss_before / 1024.0,
                row.rss_fleet / 1024.0,
                row.rss_peak / 1024.0,
                row.cpu * 100.0,
                row.status_bytes as f64 / 1024.0,
                row.status_ms,
                row.metrics_bytes as f64 / 1024.0,
                row.metrics_ms,
            ),
            Err(err) => {
                eprintln!("N = {n}: {err}");
                failed = true;
            }
        }
    }
    println!(
        "reproduce: cargo bench --bench fleet{}",
        if smoke { " -- --smoke" } else { "" }
    );
    let _ = std::fs::remove_dir_all(&dir);
    // The smoke run (`cargo test`) checks that it works, never how fast or how big.
    if failed {
        std::process::exit(1);
    }
}

struct Row {
    n: usize,
    routable: Duration,
    rss_before: f64,
    rss_fleet: f64,
    rss_peak: f64,
    /// Share of one core over the steady stretch.
    cpu: f64,
    status_bytes: usize,
    status_ms: f64,
    metrics_bytes: usize,
    metrics_ms: f64,
}

async fn run(binary: &Path, dir: &Path, n: usize, steady: Duration) -> Result<Row, String> {
    let key_path = write(dir, "gossip.key", KEY)?;
    let key = ClusterKey::parse(&key_path, KEY.as_bytes()).map_err(|e| e.to_string())?;
    let mut sidecar = None;
    for _ in 0..3 {
        // A port found free can be taken before the sidecar binds it: try a few.
        if let Some(s) = start_sidecar(binary, dir, n)? {
            sidecar = Some(s);
            break;
        }
    }
    let Some(mut sidecar) = sidecar else {
        let log = std::fs::read_to_string(dir.join("sidecar.log")).unwrap_or_default();
        return Err(format!("the sidecar did not start: {log}"));
    };
    let result = measure(&mut sidecar, &key, n, steady).await;
    stop(&mut sidecar.child);
    result
}

async fn measure(
    sidecar: &mut Sidecar,
    key: &ClusterKey,
    n: usize,
    steady: Duration,
) -> Result<Row, String> {
    let pid = sidecar.child.id();
    let rss_before = kib(pid, "VmRSS:");
    let stop = CancellationToken::new();
    let _stop_members = stop.clone().drop_guard();
    let started = Instant::now();
    let mut members = Vec::with_capacity(n);
    for i in 0..n {
        members.push(member(i, key, sidecar.gossip, n, stop.clone()).await?);
        if (i + 1) % BATCH == 0 {
            tokio::time::sleep(BATCH_GAP).await;
        }
    }
    // As the sidecar's seeds are: a member that has not been answered asks again each second.
    let deadline = Duration::from_secs(60) + Duration::from_millis(40 * n as u64);
    // `/metrics` while waiting (a large `/status` rendered each second would be measured too),
    // then `/status` once to see that all N are routable.
    let mut confirmed = false;
    let routable = loop {
        let alive = if confirmed {
            n
        } else {
            alive_members(&get_async(sidecar.admin, "/metrics").await?.0)
        };
        if alive >= n {
            confirmed = true;
            let status = get_async(sidecar.admin, "/status").await?.0;
            let known = serde_json::from_str::<serde_json::Value>(&status)
                .ok()
                .and_then(|v| v["peers"].as_array().map(Vec::len))
                .unwrap_or(0);
            if known >= n {
                break started.elapsed();
            }
        }
        if started.elapsed() > deadline {
            return Err(format!(
                "the sidecar counts {alive} of {n} members alive after {:.0} s",
                deadline.as_secs_f64()
            ));
        }
        if let Some(log) = sidecar.exited() {
            return Err(format!("the sidecar exited: {log}"));
        }
        for m in &members {
            if m.status().alive == 0 {
                m.announce(vec![sidecar.gossip]);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let cpu_before = cpu_ticks(pid);
    let t0 = Instant::now();
    tokio::time::sleep(steady).await;
    let cpu = (cpu_ticks(pid) - cpu_before) / TICKS_PER_S / t0.elapsed().as_secs_f64();
    // Before `/status` is rendered: the allocator may keep what rendering a large one took.
    let rss_fleet = kib(pid, "VmRSS:");
    let (status, status_ms) = get_async(sidecar.admin, "/status").await?;
    let (metrics, metrics_ms) = get_async(sidecar.admin, "/metrics").await?;
    Ok(Row {
        n,
        routable,
        rss_before,
        rss_fleet,
        rss_peak: kib(pid, "VmHWM:"),
        cpu,
        status_bytes: status.len(),
        status_ms,
        metrics_bytes: metrics.len(),
        metrics_ms,
    })
}

/// One member: a gossip node on its own socket, publishing, joining through the sidecar.
async fn member(
    i: usize,
    key: &ClusterKey,
    hub: SocketAddr,
    n: usize,
    stop: CancellationToken,
) -> Result<GossipHandle, String> {
    let listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let (transport, inbox, addr) = gossip::transport::udp(listen, stop.clone())
        .await
        .map_err(|e| format!("member {i}: cannot bind a UDP socket: {e}"))?;
    let mut options = NodeOptions::new(format!("member-{i}"), addr, key.clone());
    // Members never probe: failure detection is the sidecar's, as everyone's in a real fleet.
    options.probe_interval = Duration::from_secs(3600);
    options.max_transmissions = gossip::max_transmissions(u32::try_from(n).unwrap_or(u32::MAX));
    let star: Arc<dyn Transport> = Arc::new(OnlyTo {
        inner: transport,
        hub,
    });
    let handle = gossip::spawn(options, star, inbox, Arc::new(Deaf), stop);
    handle.publish_profile(profile(i, addr));
    handle.publish_live(live(i));
    handle.announce(vec![hub]);
    Ok(handle)
}

/// Sends only to the sidecar: the members' datagrams to one another are dropped.
#[derive(Debug)]
struct OnlyTo {
    inner: Arc<dyn Transport>,
    hub: SocketAddr,
}

impl Transport for OnlyTo {
    fn send(&self, to: SocketAddr, packet: Vec<u8>) {
        if to == self.hub {
            self.inner.send(to, packet);
        }
    }
}

/// A member keeps nothing of what it learns.
struct Deaf;

impl Membership for Deaf {
    fn members(&self, _: &[Member]) {}
    fn live(&self, _: &Member, _: &Live) {}
}

fn profile(i: usize, addr: SocketAddr) -> Profile {
    Profile {
        inbound: SocketAddr::new(addr.ip(), 4143).to_string(),
        zone: format!("zone-{}", i % 3),
        region: "region-1".into(),
        max_concurrency: 8,
        capabilities: vec![gossip::Capability {
            name: format!("capability-{}", i % 20),
            tags: [("python".to_owned(), 900u16), ("go".to_owned(), 600u16)]
                .into_iter()
                .collect(),
            timeout_ms: 30_000,
            mode: RouteMode::Sync,
            cost_milli: 0,
            idempotent: false,
            output_schema: None,
            a2a: None,
            tools: Vec::new(),
        }],
        version: env!("CARGO_PKG_VERSION").into(),
        identity: None,
    }
}

fn live(i: usize) -> Live {
    Live {
        profile_seq: 0,
        state: State::Healthy,
        state_age_s: 60,
        cap: 1000,
        availability: 990,
        saturation: (i % 10) as u16 * 100,
        latency_ms: Some(40),
        p50_ms: Some(38),
        p95_ms: Some(90),
        busy: false,
        cooling_down: false,
        in_flight: (i % 8) as u32,
        queued: 0,
        saturation_predicted: (i % 10) as u16 * 100,
        quality_milli: None,
        degraded: false,
        budget: Vec::new(),
    }
}

struct Sidecar {
    child: Child,
    admin: SocketAddr,
    gossip: SocketAddr,
    log: PathBuf,
}

impl Sidecar {
    fn exited(&mut self) -> Option<String> {
        matches!(self.child.try_wait(), Ok(Some(_)))
            .then(|| std::fs::read_to_string(&self.log).unwrap_or_default())
    }
}

fn start_sidecar(binary: &Path, dir: &Path, n: usize) -> Result<Option<Sidecar>, String> {
    let upstream = free_port()?;
    let (inbound, outbound, admin, gossip) =
        (free_port()?, free_port()?, free_port()?, free_port()?);
    let cfg = write(
        dir,
        "fleet.yaml",
        &format!(
            "listen: {{ outbound: 127.0.0.1:{outbound}, inbound: 127.0.0.1:{inbound}, admin: 127.0.0.1:{admin} }}\n\
             agent: {{ name: hub, address: 127.0.0.1:{upstream}, max_concurrency: 8, capabilities: [ {{ name: capability-0 }} ] }}\n\
             gossip: {{ listen: 127.0.0.1:{gossip}, key_file: gossip.key, expected_members: {n} }}\n"
        ),
    )?;
    let log = dir.join("sidecar.log");
    let child = Command::new(binary)
        .args(["run", "--log", "error", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let mut sidecar = Sidecar {
        child,
        admin: SocketAddr::from(([127, 0, 0, 1], admin)),
        gossip: SocketAddr::from(([127, 0, 0, 1], gossip)),
        log,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if sidecar.exited().is_some() {
            return Ok(None);
        }
        if std::net::TcpStream::connect(sidecar.admin).is_ok() {
            return Ok(Some(sidecar));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop(&mut sidecar.child);
    Ok(None)
}

/// One admin GET: the body and how long it took, in ms.
async fn get_async(admin: SocketAddr, path: &'static str) -> Result<(String, f64), String> {
    let started = Instant::now();
    let answer = net::call(admin, "GET", path, &[], Vec::new(), Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    if answer.status != 200 {
        return Err(format!("http://{admin}{path} answered {}", answer.status));
    }
    let body = String::from_utf8_lossy(&answer.body).into_owned();
    Ok((body, started.elapsed().as_secs_f64() * 1000.0))
}

/// `reach_gossip_members{status="alive"}` from a `/metrics` page.
fn alive_members(metrics: &str) -> usize {
    metrics
        .lines()
        .find(|l| l.starts_with("reach_gossip_members{status=\"alive\"}"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as usize)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name may hold spaces: count fields after its closing parenthesis.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after the name.
    field(11) + field(12)
}

/// The sidecar drains before it exits; 20 s is plenty with no traffic.
fn stop(child: &mut Child) {
    terminate(child, Duration::from_secs(20));
}
