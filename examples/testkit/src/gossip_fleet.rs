//! An in-memory fleet of gossip nodes: one `MemNetwork`, one cluster key, node `i` named
//! `agent-{i}` at [`addr`]`(i)`, publishing [`profile`]`(i)` and a live view, each with a [`Seen`]
//! that records what it routes to. Time is the runtime's: the tests pause it, the benchmark's
//! simulated mode too.
//!
//! One harness for the gossip layer's fleet tests (`tests/it/gossip_fleet.rs`,
//! `tests/it/gossip_mem.rs`) and its scale benchmark (`benches/gossip.rs`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_reach::config::RouteMode;
use agent_reach::gossip::transport::Inbox;
use agent_reach::gossip::{
    self, Capability, ClusterKey, GossipHandle, Live, MemNetwork, Member, Membership, NodeOptions,
    Profile, Transport,
};
use agent_reach::reach::State;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Options for node `i`, applied after its name, address and key are set.
type Tune = Box<dyn Fn(usize, &mut NodeOptions)>;

/// The nodes share a network and a key; each starts with the fleet's options.
pub struct Fleet {
    pub net: Arc<MemNetwork>,
    pub key: ClusterKey,
    tune: Tune,
}

/// One running node. Dropping it stops its tasks (a crash: no word to the others).
pub struct Node {
    pub name: String,
    pub addr: SocketAddr,
    pub handle: GossipHandle,
    pub seen: Arc<Seen>,
    stop: CancellationToken,
}

/// What one node routes to, as its `Membership` is told.
#[derive(Default)]
pub struct Seen(Mutex<Routed>);

#[derive(Default)]
struct Routed {
    members: HashMap<String, Member>,
    lives: HashMap<String, Live>,
    /// Times each member left the routing table (a dead one, or a false death).
    dropped: HashMap<String, u64>,
    /// When each member first left it (the trace of a false death).
    first_dropped: HashMap<String, Instant>,
}

pub fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 4190))
}

pub fn name(i: usize) -> String {
    format!("agent-{i}")
}

/// Node `i`'s profile: one capability of five, in one zone of three. Every field of the
/// capability is set, so a round trip that lost one would show.
pub fn profile(i: usize) -> Profile {
    Profile {
        // On the node's own IP, as a sidecar publishes it (others refuse any other).
        inbound: format!("{}:4143", addr(i).ip()),
        zone: format!("zone-{}", i % 3),
        region: "region-1".into(),
        max_concurrency: 8,
        capabilities: vec![Capability {
            name: format!("capability-{}", i % 5),
            tags: [("python".to_owned(), 900u16), ("go".to_owned(), 600u16)]
                .into_iter()
                .collect(),
            timeout_ms: 30_000,
            mode: if i % 2 == 1 {
                RouteMode::Async
            } else {
                RouteMode::Sync
            },
            cost_milli: 20 * (i % 5) as u32,
            idempotent: i % 2 == 1,
            output_schema: None,
            a2a: None,
            tools: Vec::new(),
        }],
        version: env!("CARGO_PKG_VERSION").into(),
        identity: None,
    }
}

/// A live view in `state` with `in_flight` calls, otherwise an agent doing well.
pub fn live(state: State, in_flight: u32) -> Live {
    Live {
        profile_seq: 0,
        state,
        state_age_s: 0,
        cap: 1000,
        availability: 990,
        saturation: 200,
        latency_ms: Some(40),
        p50_ms: Some(38),
        p95_ms: Some(90),
        busy: false,
        cooling_down: false,
        in_flight,
        queued: 0,
        saturation_predicted: 0,
        quality_milli: None,
        degraded: false,
        budget: Vec::new(),
    }
}

/// Timings for a test: probes every 200 ms, a suspect down after 600 ms.
pub fn quick_timings(o: &mut NodeOptions) {
    o.probe_interval = Duration::from_millis(200);
    o.probe_timeout = Duration::from_millis(60);
    o.suspect_timeout = Duration::from_millis(600);
    o.refresh_interval = Duration::from_millis(500);
    o.min_publish_interval = Duration::from_millis(50);
}

/// Polls `f` every 10 ms until it holds (how long that took) or `deadline` passes (`None`).
pub async fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if f() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// [`wait_until`], failing the test when `deadline` passes.
pub async fn eventually(what: &str, deadline: Duration, f: impl FnMut() -> bool) {
    if wait_until(deadline, f).await.is_none() {
        panic!("timed out waiting for {what}");
    }
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// === impl Fleet ===

impl Fleet {
    /// A fleet on a faultless network with a fresh key and [`quick_timings`].
    pub fn quick() -> Self {
        Self::new(MemNetwork::new(), ClusterKey::random(), |_, o| {
            quick_timings(o)
        })
    }

    /// A fleet on `net` whose node `i` starts with the shipped options as `tune(i, …)` leaves
    /// them.
    pub fn new(
        net: Arc<MemNetwork>,
        key: ClusterKey,
        tune: impl Fn(usize, &mut NodeOptions) + 'static,
    ) -> Self {
        Self {
            net,
            key,
            tune: Box::new(tune),
        }
    }

    /// Node `i`, joining through node 0 (unless it is node 0).
    pub fn start(&self, i: usize) -> Node {
        let seeds = if i == 0 { vec![] } else { vec![addr(0)] };
        self.start_as(&name(i), i, seeds)
    }

    /// `name` at node `i`'s address, joining through `seeds` (none: it waits to be found).
    pub fn start_as(&self, name: &str, i: usize, seeds: Vec<SocketAddr>) -> Node {
        let (transport, inbox) = self.net.join(addr(i));
        self.spawn(name, i, (transport, inbox), seeds)
    }

    /// `name` as node `i`, over a transport and inbox of the caller's.
    pub fn spawn(
        &self,
        name: &str,
        i: usize,
        (transport, inbox): (Arc<dyn Transport>, Inbox),
        seeds: Vec<SocketAddr>,
    ) -> Node {
        let mut options = NodeOptions::new(name, addr(i), self.key.clone());
        (self.tune)(i, &mut options);
        let seen = Arc::new(Seen::default());
        let stop = CancellationToken::new();
        let handle = gossip::spawn(options, transport, inbox, seen.clone(), stop.clone());
        handle.publish_profile(profile(i));
        // Each its own count, under its `max_concurrency`.
        handle.publish_live(live(State::Healthy, (i % 8) as u32));
        if !seeds.is_empty() {
            handle.announce(seeds);
        }
        Node {
            name: name.to_owned(),
            addr: addr(i),
            handle,
            seen,
            stop,
        }
    }
}

// === impl Node ===

impl Node {
    /// Stops its tasks now (they stop when it is dropped, too).
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

// === impl Seen ===

impl Membership for Seen {
    fn members(&self, members: &[Member]) {
        let now: HashMap<String, Member> = members
            .iter()
            .map(|m| (m.name.clone(), m.clone()))
            .collect();
        let mut routed = lock(&self.0);
        let gone: Vec<String> = routed
            .members
            .keys()
            .filter(|name| !now.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            *routed.dropped.entry(name.clone()).or_default() += 1;
            routed
                .first_dropped
                .entry(name)
                .or_insert_with(Instant::now);
        }
        routed.members = now;
    }

    fn live(&self, member: &Member, live: &Live) {
        lock(&self.0)
            .lives
            .insert(member.name.clone(), live.clone());
    }
}

impl Seen {
    /// The names of the members it routes to, in no order.
    pub fn names(&self) -> Vec<String> {
        lock(&self.0).members.keys().cloned().collect()
    }

    pub fn count(&self) -> usize {
        lock(&self.0).members.len()
    }

    pub fn routes_to(&self, name: &str) -> bool {
        lock(&self.0).members.contains_key(name)
    }

    pub fn member(&self, name: &str) -> Option<Member> {
        lock(&self.0).members.get(name).cloned()
    }

    /// The last live view of `name` it was told, even after `name` left.
    pub fn live_of(&self, name: &str) -> Option<Live> {
        lock(&self.0).lives.get(name).cloned()
    }

    /// Times each member left its routing table.
    pub fn dropped(&self) -> HashMap<String, u64> {
        lock(&self.0).dropped.clone()
    }

    /// When `name` first left its routing table.
    pub fn first_dropped(&self, name: &str) -> Option<Instant> {
        lock(&self.0).first_dropped.get(name).copied()
    }
}
