//! Gossip at fleet scale, over the in-memory network with the shipped timings (probe every 1 s,
//! suspect for 3 s, live view refreshed every 2 s). Per fleet size N it prints: time for the
//! fleet to converge from one seed, time for a state change to reach every node (p50/max),
//! time for a dead node to leave every table (p50/max), and bytes and datagrams per node per
//! second in steady state. Never asserts on time. The fleet is the one the gossip tests run
//! (`examples/testkit/src/gossip_fleet.rs`), here with the shipped timings.
//!
//! Two modes run the same node code:
//! - real time (default): a multi-thread runtime, no network faults. On a small machine a large
//!   fleet competes for CPU, probes are answered late and members falsely suspected.
//! - `--virtual`: one thread on tokio's paused clock, which moves only when every node is idle,
//!   so CPU contention cannot cause suspicion; the network is seeded with latency and loss
//!   (`--latency-ms 1-5`, `--loss 1` percent, `--seed 1`; `--suspect-ms 5000` tries another
//!   suspect timeout). It adds the time to heal a partition
//!   that outlasted the suspect timeout, the members falsely declared dead, and the wall
//!   seconds each size took. Its bytes are measured once the join storm has drained (from 10 s
//!   after convergence), over the longest refresh interval at that size (*window*); *after
//!   join* is the first 10 s, right after convergence.
//!
//! Run: `cargo bench --bench gossip` (N = 50, 100, 200), `-- --nodes 50,400`,
//! `-- --virtual --nodes 100,1000,2000`, or `-- --smoke` / `-- --virtual --smoke` (`cargo test`
//! runs both smokes: a few seconds).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_reach::gossip::{self, Clock, ClusterKey, Faults, Live, MemNetwork, NodeOptions};
use agent_reach::reach::State;
use tokio::time::Instant;

use testkit::gossip_fleet::{addr, wait_until, Fleet, Node};

/// The live view the benchmark's agents publish, busy or not.
fn live(busy: bool) -> Live {
    Live {
        busy,
        saturation: if busy { 1000 } else { 200 },
        ..testkit::gossip_fleet::live(State::Healthy, 2)
    }
}

/// How a fleet is run: real or simulated time, network faults, a partition to heal.
#[derive(Clone, Copy)]
struct Setup {
    virtual_time: bool,
    faults: Option<Faults>,
    seed: u64,
    /// The halves are split this long, then healed (virtual mode).
    partition: Option<Duration>,
    /// Bytes measured after the join storm has drained, over a whole refresh interval
    /// (virtual mode).
    settle: bool,
    /// `--suspect-ms`: SWIM's suspect timeout instead of the shipped 3 s (virtual mode).
    suspect: Option<Duration>,
}

struct Figures {
    n: usize,
    converged: bool,
    dead_detected: bool,
    converge: Duration,
    change: Vec<Duration>,
    dead: Vec<Duration>,
    /// Sent per node in the settled window, and in the first window after convergence (still
    /// passing on the join storm's membership updates).
    bytes_per_node_s: f64,
    packets_per_node_s: f64,
    bytes_after_join: f64,
    /// How long the settled window was (the longest refresh interval at this size).
    window: Duration,
    /// Time from the heal until every node routes to every other again, if it did.
    heal: Option<Duration>,
    /// Times a node dropped a member that was never killed (partition excluded).
    false_deaths: u64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Polls until every node in `nodes` satisfies `f`, recording when each first did.
async fn each_until(
    nodes: &[&Node],
    deadline: Duration,
    f: impl Fn(&Node) -> bool,
) -> Vec<Duration> {
    each_until_or_late(nodes, deadline, f, deadline, |_| {}).await
}

/// `each_until`, calling `late` once with the nodes still waiting at `late_after`.
async fn each_until_or_late(
    nodes: &[&Node],
    deadline: Duration,
    f: impl Fn(&Node) -> bool,
    late_after: Duration,
    late: impl FnOnce(&[&Node]),
) -> Vec<Duration> {
    let start = Instant::now();
    let mut when: Vec<Option<Duration>> = vec![None; nodes.len()];
    let mut late = Some(late);
    while start.elapsed() < deadline && when.iter().any(Option::is_none) {
        for (i, n) in nodes.iter().enumerate() {
            if when[i].is_none() && f(n) {
                when[i] = Some(start.elapsed());
            }
        }
        if start.elapsed() >= late_after {
            if let Some(late) = late.take() {
                let waiting: Vec<&Node> = (0..nodes.len())
                    .filter(|i| when[*i].is_none())
                    .map(|i| nodes[i])
                    .collect();
                if !waiting.is_empty() {
                    late(&waiting);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut out: Vec<Duration> = when.into_iter().map(|w| w.unwrap_or(deadline)).collect();
    out.sort();
    out
}

/// Whether `GOSSIP_BENCH_TRACE` asks for each phase's trace.
fn tracing() -> bool {
    std::env::var_os("GOSSIP_BENCH_TRACE").is_some()
}

/// What `x` holds of the member `name`, as its `/status` lists it.
fn held_by(x: &Node, name: &str) -> Option<gossip::MemberStatus> {
    x.handle
        .status()
        .members
        .iter()
        .find(|m| m.name == name)
        .cloned()
}

/// Nodes a change (`name` went busy) has not reached within 3 s, and what each holds of `name`
/// against what a node it reached holds (`GOSSIP_BENCH_TRACE=1`).
fn trace_missed_change(waiting: &[&Node], name: &str, all: &[&Node]) {
    if !tracing() {
        return;
    }
    let held =
        |x: &Node| held_by(x, name).map(|m| (m.epoch, m.liveness, m.live_seq, m.last_seen_s));
    let reached = all
        .iter()
        .find(|x| x.seen.live_of(name).is_some_and(|l| l.busy))
        .map(|x| held(x));
    for x in waiting {
        eprintln!(
            "change of {name} missed by {}: routes to it {}, holds {:?}; a node it reached holds {:?}",
            x.name,
            x.seen.routes_to(name),
            held(x),
            reached,
        );
    }
}

/// Nodes that still route to a dead member after 10 s, and what each holds of it (`GOSSIP_BENCH_TRACE=1`).
fn trace_not_dropped(nodes: &[&Node], name: &str) {
    if !tracing() {
        return;
    }
    for x in nodes {
        let status = x.handle.status();
        eprintln!(
            "dead {name} still routed by {}: holds {:?}; its SWIM: {} alive, {} suspect, {} down",
            x.name,
            held_by(x, name).map(|m| (m.epoch, m.liveness, m.last_seen_s)),
            status.alive,
            status.suspect,
            status.down,
        );
    }
}

/// Why nodes that do not route to everyone miss whom (`GOSSIP_BENCH_TRACE=1`): per missing
/// member, what the node's table says of it (`absent`: never heard of).
fn diagnose(nodes: &[&Node], expected: usize) {
    if !tracing() {
        return;
    }
    let mut why: HashMap<String, usize> = HashMap::new();
    let mut behind = 0;
    for x in nodes {
        if x.seen.count() >= expected {
            continue;
        }
        behind += 1;
        let status = x.handle.status();
        let listed: HashMap<&str, &gossip::MemberStatus> = status
            .members
            .iter()
            .map(|m| (m.name.as_str(), m))
            .collect();
        for other in nodes
            .iter()
            .filter(|o| o.name != x.name && !x.seen.routes_to(&o.name))
        {
            let reason = match listed.get(other.name.as_str()) {
                None => "absent".to_owned(),
                Some(m) => format!("{} profile {}", m.liveness, m.profile_seq.is_some()),
            };
            *why.entry(reason).or_default() += 1;
        }
    }
    eprintln!("{behind} nodes behind; missing members by what the node knows: {why:?}");
}

/// Shows where a run's wall time goes (`GOSSIP_BENCH_TRACE=1`).
fn trace(phase: &str, wall: std::time::Instant, start: Instant) {
    if tracing() {
        eprintln!(
            "{phase}: wall {:.1}s, simulated {:.1}s",
            wall.elapsed().as_secs_f64(),
            start.elapsed().as_secs_f64()
        );
    }
}

async fn run_fleet(n: usize, steady: Duration, changes: usize, setup: Setup) -> Figures {
    let wall = std::time::Instant::now();
    let net = match setup.faults {
        Some(faults) => MemNetwork::with_faults(faults),
        None => MemNetwork::new(),
    };
    // A simulation repeats: a fixed key and start time, SWIM seeded per node.
    let (key, clock) = if setup.virtual_time {
        let key = ClusterKey::from_secrets(&[b"gossip-bench-virtual-key-0123456789".to_vec()]);
        (key, Clock::runtime_from(1_700_000_000_000_000))
    } else {
        (ClusterKey::random(), Clock::Wall)
    };
    let fleet = Fleet::new(net, key, move |i, options| {
        options.clock = clock;
        if let Some(suspect) = setup.suspect {
            options.suspect_timeout = suspect;
        }
        if setup.virtual_time {
            options.seed = Some(setup.seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
        }
    });
    let start = Instant::now();
    let nodes: Vec<Node> = (0..n).map(|i| fleet.start(i)).collect();
    // As the sidecar does: seeds are retried each second until a member answers.
    let (converged, converge) = loop {
        if nodes.iter().all(|node| node.seen.count() == n - 1) {
            break (true, start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(120) {
            break (false, start.elapsed());
        }
        if tracing() {
            let routable: Vec<usize> = nodes.iter().map(|x| x.seen.count()).collect();
            eprintln!(
                "t={:.1}s routable min {} max {}",
                start.elapsed().as_secs_f64(),
                routable.iter().min().unwrap_or(&0),
                routable.iter().max().unwrap_or(&0)
            );
        }
        for node in nodes.iter().skip(1) {
            if node.seen.count() == 0 {
                node.handle.announce(vec![addr(0)]);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    diagnose(&nodes.iter().collect::<Vec<_>>(), n - 1);
    trace("converged", wall, start);
    // Steady state: nothing changes but the periodic refresh and SWIM's own traffic. The first
    // window after convergence still carries the join storm (every node passes each of the N
    // joins on `max_transmissions` times, so its datagrams leave full). Then, with the join
    // storm drained, one window over the longest refresh interval at this size, so that every
    // node's refresh falls in it (a shorter one would catch more or fewer of them).
    let (bytes_after_join, packets_after_join) = window(&nodes, steady).await;
    let (mut bytes_per_node_s, mut packets_per_node_s) = (bytes_after_join, packets_after_join);
    let mut measured = steady;
    if setup.settle {
        // The nodes run the shipped timings.
        let shipped = NodeOptions::new("", addr(0), fleet.key.clone());
        let refresh =
            gossip::longest_refresh(n - 1, shipped.refresh_interval, shipped.max_transmissions);
        measured = refresh.max(steady);
        (bytes_per_node_s, packets_per_node_s) = window(&nodes, measured).await;
    }

    trace("steady state measured", wall, start);
    // A state change (the agent goes busy) reaching everyone.
    let mut change = Vec::new();
    for c in 0..changes {
        let who = 1 + c * (n - 1) / changes.max(1);
        let name = nodes[who].name.clone();
        nodes[who].handle.publish_live(live(true));
        let others: Vec<&Node> = nodes.iter().filter(|x| x.name != name).collect();
        let arrivals = each_until_or_late(
            &others,
            Duration::from_secs(30),
            |x| x.seen.live_of(&name).is_some_and(|l| l.busy),
            Duration::from_secs(3),
            |waiting| trace_missed_change(waiting, &name, &others),
        )
        .await;
        change.extend(arrivals);
        nodes[who].handle.publish_live(live(false));
        let _ = wait_until(Duration::from_secs(10), || {
            nodes
                .iter()
                .filter(|x| x.name != name)
                .all(|x| x.seen.live_of(&name).is_some_and(|l| !l.busy))
        })
        .await;
    }

    trace("changes spread", wall, start);
    // A node dies without a word.
    let victim = n / 2;
    let name = nodes[victim].name.clone();
    fleet.net.cut(nodes[victim].addr);
    nodes[victim].handle.abort();
    let others: Vec<&Node> = nodes.iter().filter(|x| x.name != name).collect();
    let dead_deadline = Duration::from_secs(60);
    let mut dead = each_until_or_late(
        &others,
        dead_deadline,
        |x| !x.seen.routes_to(&name),
        Duration::from_secs(10),
        |waiting| trace_not_dropped(waiting, &name),
    )
    .await;
    let dead_detected = dead.iter().all(|d| *d < dead_deadline);
    trace("dead node out", wall, start);
    let false_deaths = nodes
        .iter()
        .map(|x| {
            x.seen
                .dropped()
                .iter()
                .filter(|(member, _)| **member != name)
                .map(|(_, times)| times)
                .sum::<u64>()
        })
        .sum();
    if false_deaths > 0 && tracing() {
        // Who was dropped, by how many, and whether that node rejoined under a new identity
        // (its epoch moved: it was declared down and came back).
        let mut by: HashMap<String, u64> = HashMap::new();
        for x in &nodes {
            for (member, times) in &x.seen.dropped() {
                if *member != name {
                    *by.entry(member.clone()).or_default() += times;
                }
            }
        }
        for (member, times) in &by {
            let node = nodes.iter().find(|x| x.name == *member);
            let identity = node.and_then(|x| x.handle.status().node.clone());
            let first = nodes
                .iter()
                .filter_map(|x| x.seen.first_dropped(member))
                .min()
                .map(|at| at.saturating_duration_since(start).as_secs_f64());
            eprintln!(
                "false death: {member} dropped {times} times, first at {first:?} s; its identity now {identity:?}"
            );
        }
    }
    let heal = match setup.partition {
        Some(split_for) => partition_and_heal(&fleet.net, &nodes, victim, split_for).await,
        None => None,
    };
    trace("partition healed", wall, start);
    dead.sort();
    change.sort();
    drop(nodes);
    Figures {
        n,
        converged,
        dead_detected,
        converge,
        change,
        dead,
        bytes_per_node_s,
        packets_per_node_s,
        bytes_after_join,
        window: measured,
        heal,
        false_deaths,
    }
}

/// Bytes and datagrams sent per node per second over the next `steady`.
async fn window(nodes: &[Node], steady: Duration) -> (f64, f64) {
    let sent = || {
        nodes.iter().fold((0u64, 0u64), |(b, p), node| {
            let s = node.handle.stats();
            (
                b + s.bytes_sent.load(Ordering::Relaxed),
                p + s.packets_sent.load(Ordering::Relaxed),
            )
        })
    };
    let (b0, p0) = sent();
    let t0 = Instant::now();
    tokio::time::sleep(steady).await;
    let (b1, p1) = sent();
    let secs = t0.elapsed().as_secs_f64() * nodes.len() as f64;
    ((b1 - b0) as f64 / secs, (p1 - p0) as f64 / secs)
}

/// Splits the fleet (all but the dead node) in two halves for `split_for`, heals it, and
/// returns how long until every node routes to every other again.
async fn partition_and_heal(
    net: &MemNetwork,
    nodes: &[Node],
    victim: usize,
    split_for: Duration,
) -> Option<Duration> {
    let living: Vec<&Node> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, x)| x)
        .collect();
    let (a, b) = living.split_at(living.len() / 2);
    let addrs = |half: &[&Node]| half.iter().map(|x| x.addr).collect::<Vec<_>>();
    net.partition(&addrs(a), &addrs(b));
    tokio::time::sleep(split_for).await;
    net.heal();
    let others = living.len() - 1;
    let deadline = Duration::from_secs(120);
    let healing = async { each_until(&living, deadline, |x| x.seen.count() == others).await };
    let healed = if tracing() {
        let start = Instant::now();
        let watch = async {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let routable: Vec<usize> = living.iter().map(|x| x.seen.count()).collect();
                let behind = routable.iter().filter(|r| **r < others).count();
                eprintln!(
                    "heal t={:.0}s routable min {} max {}, {behind} nodes behind",
                    start.elapsed().as_secs_f64(),
                    routable.iter().min().unwrap_or(&0),
                    routable.iter().max().unwrap_or(&0),
                );
            }
        };
        let healed = tokio::select! { healed = healing => healed, () = watch => Vec::new() };
        diagnose(&living, others);
        healed
    } else {
        healing.await
    };
    healed.last().copied().filter(|d| *d < deadline)
}

/// The value after `flag`, if given.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

/// `--latency-ms 1-5` (1 ms plus up to 4 of jitter) or `--latency-ms 3`.
fn latency(spec: &str) -> Option<(Duration, Duration)> {
    let (lo, hi) = spec.split_once('-').unwrap_or((spec, spec));
    let (lo, hi): (f64, f64) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
    let lo = Duration::from_secs_f64(lo.max(0.0) / 1000.0);
    let hi = Duration::from_secs_f64(hi.max(0.0) / 1000.0);
    Some((lo, hi.saturating_sub(lo)))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; `cargo test` runs both smokes so neither can rot.
    let under_test = !args.iter().any(|a| a == "--bench");
    let smoke = args.iter().any(|a| a == "--smoke") || under_test;
    let virtual_time = args.iter().any(|a| a == "--virtual");
    let sizes = flag(&args, "--nodes").map(|list| {
        list.split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect::<Vec<usize>>()
    });
    if under_test {
        real_time(&[10], true);
        simulated(&args, &[20], true);
    } else if virtual_time {
        let default = if smoke {
            vec![20]
        } else {
            vec![100, 1000, 2000]
        };
        simulated(&args, &sizes.unwrap_or(default), smoke);
    } else {
        let default = if smoke { vec![10] } else { vec![50, 100, 200] };
        real_time(&sizes.unwrap_or(default), smoke);
    }
}

fn steady_and_changes(smoke: bool) -> (Duration, usize) {
    if smoke {
        (Duration::from_secs(2), 2)
    } else {
        (Duration::from_secs(10), 5)
    }
}

/// The smoke run (CI) checks that it works, never how fast.
fn smoke_check(f: &Figures, partitioned: bool) {
    if !(f.converged && f.dead_detected) {
        eprintln!("smoke: the fleet did not converge, or a dead node was not detected");
        std::process::exit(1);
    }
    if partitioned && f.heal.is_none() {
        eprintln!("smoke: the fleet did not heal after a partition");
        std::process::exit(1);
    }
}

fn real_time(sizes: &[usize], smoke: bool) {
    let (steady, changes) = steady_and_changes(smoke);
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
    let setup = Setup {
        virtual_time: false,
        faults: None,
        seed: 0,
        partition: None,
        settle: false,
        suspect: None,
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
    for &n in sizes {
        let f = runtime.block_on(run_fleet(n.max(3), steady, changes, setup));
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
        if smoke {
            smoke_check(&f, false);
        }
    }
    println!(
        "reproduce: cargo bench --bench gossip{}",
        if smoke { " -- --smoke" } else { "" }
    );
}

fn simulated(args: &[String], sizes: &[usize], smoke: bool) {
    let (steady, changes) = steady_and_changes(smoke);
    let latency_spec = flag(args, "--latency-ms").unwrap_or("1-5");
    let Some((latency, jitter)) = latency(latency_spec) else {
        eprintln!("--latency-ms takes milliseconds, as 3 or 1-5");
        std::process::exit(2);
    };
    let loss_pct: f64 = match flag(args, "--loss").map(str::parse) {
        None => 1.0,
        Some(Ok(pct)) => pct,
        Some(Err(_)) => {
            eprintln!("--loss takes a percentage, as 1 or 0.5");
            std::process::exit(2);
        }
    };
    let seed: u64 = match flag(args, "--seed").map(str::parse) {
        None => 1,
        Some(Ok(seed)) => seed,
        Some(Err(_)) => {
            eprintln!("--seed takes a whole number");
            std::process::exit(2);
        }
    };
    let suspect = match flag(args, "--suspect-ms").map(str::parse::<u64>) {
        None => None,
        Some(Ok(ms)) => Some(Duration::from_millis(ms)),
        Some(Err(_)) => {
            eprintln!("--suspect-ms takes milliseconds, as 5000");
            std::process::exit(2);
        }
    };
    // Longer than the suspect timeout (3 s) plus detection: each half declares the other dead,
    // so healing needs SWIM's announce to down members and the rejoin under a new identity.
    let split_for = Duration::from_secs(10);
    let setup = Setup {
        virtual_time: true,
        faults: Some(Faults {
            latency,
            jitter,
            loss: loss_pct / 100.0,
            seed,
        }),
        seed,
        partition: Some(split_for),
        settle: !smoke,
        suspect,
    };
    println!(
        "gossip at fleet scale, simulated time: in-memory network with {latency_spec} ms latency, \
         {loss_pct}% loss (seed {seed}), shipped timings; halves split for {}s",
        split_for.as_secs()
    );
    println!(
        "{:>5}  {:>9}  {:>10}  {:>10}  {:>10}  {:>8}  {:>8}  {:>8}  {:>6}  {:>12}  {:>14}  {:>10}  {:>8}  {:>7}",
        "N",
        "converge",
        "change p50",
        "change p99",
        "change max",
        "dead p50",
        "dead max",
        "heal",
        "false",
        "bytes/node/s",
        "packets/node/s",
        "after join",
        "window",
        "wall"
    );
    for &n in sizes {
        let wall = std::time::Instant::now();
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
        {
            Ok(rt) => rt,
            Err(err) => {
                eprintln!("cannot start a runtime: {err}");
                return;
            }
        };
        let f = runtime.block_on(run_fleet(n.max(3), steady, changes, setup));
        // The nodes' tasks go with the runtime: the next size starts from nothing.
        drop(runtime);
        let heal = f.heal.map_or_else(
            || "never".to_owned(),
            |d| format!("{:.2}s", d.as_secs_f64()),
        );
        println!(
            "{:>5}  {:>8.2}s  {:>8.0}ms  {:>8.0}ms  {:>8.0}ms  {:>7.2}s  {:>7.2}s  {:>8}  {:>6}  {:>12.0}  {:>14.1}  {:>10.0}  {:>7.0}s  {:>6.0}s",
            f.n,
            f.converge.as_secs_f64(),
            percentile(&f.change, 0.5).as_secs_f64() * 1000.0,
            percentile(&f.change, 0.99).as_secs_f64() * 1000.0,
            percentile(&f.change, 1.0).as_secs_f64() * 1000.0,
            percentile(&f.dead, 0.5).as_secs_f64(),
            percentile(&f.dead, 1.0).as_secs_f64(),
            heal,
            f.false_deaths,
            f.bytes_per_node_s,
            f.packets_per_node_s,
            f.bytes_after_join,
            f.window.as_secs_f64(),
            wall.elapsed().as_secs_f64(),
        );
        if smoke {
            smoke_check(&f, true);
        }
    }
    let flags: Vec<&str> = args
        .iter()
        .skip(1)
        .map(String::as_str)
        .filter(|a| *a != "--bench")
        .collect();
    println!(
        "reproduce: cargo bench --bench gossip -- {}",
        if flags.is_empty() {
            "--virtual --smoke".to_owned()
        } else {
            flags.join(" ")
        }
    );
}
