//! One gossip node: a task that owns the SWIM state machine (foca), seals and opens every
//! datagram, publishes this agent's items and hands what it learns to the sidecar.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foca::{AccumulatingRuntime, Codec, Foca, OwnedNotification, PostcardCodec};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::address_warnings::{AddressRule, AddressWarnings};
use super::envelope::{ClusterKey, Kind, Rejected, ReplayGuard};
use super::model;
use super::stats::Stats;
use super::status::GossipStatus;
use super::table::{same_addr, Handler, Member, Origin, SwimView, Table};
use super::transport::{Inbox, Transport, MAX_DATAGRAM};
use super::wire::{self, Body, Decoded, Live, NodeId};

mod options;
mod publish;
mod repair;
mod returns;
mod timers;

pub use options::{max_transmissions, NodeOptions};
pub use publish::longest_refresh;
use publish::Published;
use timers::Timers;

/// Largest item published: it must fit in a datagram after foca's header (and the envelope's).
pub(crate) const MAX_ITEM: usize = 1100;
/// How often the node does its housekeeping (pending publishes, status, pruning).
const TICK: Duration = Duration::from_millis(100);
/// New members are handed to the sink at most this often (losses go at once).
const ADDITIONS_EVERY: Duration = Duration::from_millis(500);
/// Where the node hands what it learns: the sidecar's registry and peer views, or a benchmark.
pub trait Membership: Send + Sync + 'static {
    /// The members that can be routed to (alive, profile known), after any change.
    fn members(&self, members: &[Member]);
    /// A routable member published a new live view.
    fn live(&self, member: &Member, live: &model::Live);
}

enum Command {
    Profile(model::Profile),
    Live(model::Live),
    Pins(Vec<model::Pin>),
    Seeds(Vec<SocketAddr>),
    Key(ClusterKey),
    Leave(oneshot::Sender<()>),
}

/// The sidecar's handle on its gossip node.
#[derive(Debug)]
pub struct GossipHandle {
    commands: mpsc::UnboundedSender<Command>,
    table: Arc<Mutex<Table>>,
    stats: Arc<Stats>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl GossipHandle {
    /// Publishes a new profile (at start, and when the bootstrap's profile changes).
    pub fn publish_profile(&self, profile: model::Profile) {
        let _ = self.commands.send(Command::Profile(profile));
    }

    /// Offers the current live view; the node publishes it when it moved meaningfully, at once
    /// when its state changed, and at least every refresh interval.
    pub fn publish_live(&self, live: model::Live) {
        let _ = self.commands.send(Command::Live(live));
    }

    /// Offers this sidecar's MCP tool pins; the node publishes them when they changed (as many
    /// as fit in an item: `publish::fitting_pins`).
    pub fn publish_pins(&self, pins: Vec<model::Pin>) {
        let _ = self.commands.send(Command::Pins(pins));
    }

    /// Asks to join through these addresses (seeds), skipping known members.
    pub fn announce(&self, seeds: Vec<SocketAddr>) {
        let _ = self.commands.send(Command::Seeds(seeds));
    }

    /// Seals and opens with these keys from now on (the key file changed).
    pub(crate) fn set_key(&self, key: ClusterKey) {
        let _ = self.commands.send(Command::Key(key));
    }

    /// Tells the cluster this node is leaving, then stops the node.
    pub async fn leave(&self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Leave(tx)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), rx).await;
        }
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            task.abort();
        }
    }

    /// Stops the node without a word to the cluster (a crash, as others see it).
    pub fn abort(&self) {
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            task.abort();
        }
    }

    /// Membership as `/status` lists it, built now from the node's table.
    pub fn status(&self) -> Arc<GossipStatus> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        Arc::new(GossipStatus::of(&table, Instant::now()))
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// How many members SWIM lists (as of the node's last look), without building `status`.
    pub(crate) fn swim_members(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .swim
            .members
    }
}

/// Starts a node on `transport`; it runs until `leave` or `stop`.
pub fn spawn(
    options: NodeOptions,
    transport: Arc<dyn Transport>,
    inbox: Inbox,
    sink: Arc<dyn Membership>,
    stop: CancellationToken,
) -> GossipHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let stats = Arc::new(Stats::default());
    let identity = NodeId {
        addr: options.addr,
        epoch: options.clock.unix_us(),
    };
    let handler = Handler {
        table: Arc::new(Mutex::new(Table::new(
            options.name.clone(),
            identity.clone(),
            stats.clone(),
            options.replay_window,
            options.clock,
        ))),
    };
    let foca = Foca::with_custom_broadcast(
        identity,
        options.foca_config(),
        seeded(options.seed),
        PostcardCodec,
        handler.clone(),
    );
    let table = handler.table.clone();
    let node = Node {
        foca,
        runtime: AccumulatingRuntime::new(),
        handler,
        transport,
        sink,
        stats: stats.clone(),
        timers: Timers::default(),
        replay: ReplayGuard::default(),
        last_sent_at: 0,
        seq: 0,
        profile: None,
        live: None,
        pins: None,
        latest_live: None,
        // The node's own draws (refresh jitter), apart from SWIM's and seeded alike.
        rng: seeded(options.seed.map(|seed| seed ^ 0x5eed_0f4e_f4e5)),
        refresh_draw: 1.0,
        started_us: options.clock.unix_us().saturating_sub(1_000_000),
        leaving: false,
        conflicts_seen: 0,
        wanted: HashMap::new(),
        met: HashMap::new(),
        members_sent: HashMap::new(),
        members_dirty: false,
        members_lost: false,
        introductions_checked_at: None,
        members_delivered_at: None,
        deferred_seeds: Vec::new(),
        unserved: Vec::new(),
        housekeeping_at: None,
        swim_view_stale: false,
        address_warnings: AddressWarnings::default(),
        seed_watch: HashMap::new(),
        answered_old: HashMap::new(),
        options,
    };
    let task = tokio::spawn(node.run(inbox, rx, stop));
    GossipHandle {
        commands: tx,
        table,
        stats,
        task: Mutex::new(Some(task)),
    }
}

struct Node {
    options: NodeOptions,
    foca: Foca<NodeId, PostcardCodec, StdRng, Handler>,
    runtime: AccumulatingRuntime<NodeId>,
    handler: Handler,
    transport: Arc<dyn Transport>,
    sink: Arc<dyn Membership>,
    stats: Arc<Stats>,
    timers: Timers,
    replay: ReplayGuard,
    /// Envelope send times are strictly increasing, so no two honest packets are byte-identical.
    last_sent_at: u64,
    seq: u64,
    profile: Option<Published>,
    live: Option<Published>,
    pins: Option<Published>,
    /// The agent's latest view as offered (what a refresh sends), published or not.
    latest_live: Option<Live>,
    /// The node's own random choices (SWIM has its own).
    rng: StdRng,
    /// The fraction of the refresh interval after which the next refresh is due.
    refresh_draw: f64,
    /// Envelopes sent before this start are refused.
    started_us: u64,
    leaving: bool,
    /// Name conflicts already reported.
    conflicts_seen: u64,
    wanted: HashMap<NodeId, Instant>,
    /// Strangers announced to, and when.
    met: HashMap<NodeId, Instant>,
    members_sent: HashMap<String, Member>,
    members_dirty: bool,
    /// A member stopped being routable since the last delivery.
    members_lost: bool,
    members_delivered_at: Option<Instant>,
    introductions_checked_at: Option<Instant>,
    deferred_seeds: Vec<SocketAddr>,
    unserved: Vec<SocketAddr>,
    housekeeping_at: Option<Instant>,
    /// Membership changed since SWIM's view was last copied for `/status`.
    swim_view_stale: bool,
    /// Peers whose datagrams break the address rule, warned about once a minute each.
    address_warnings: AddressWarnings,
    /// The seeds named last, watched so that one restarted in place is found at once.
    seed_watch: HashMap<SocketAddr, returns::SeedWatch>,
    /// Senders of messages meant for this address's previous incarnation, and when each was
    /// last announced to.
    answered_old: HashMap<SocketAddr, Instant>,
}

impl Node {
    async fn run(
        mut self,
        mut inbox: Inbox,
        mut commands: mpsc::UnboundedReceiver<Command>,
        stop: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next_timer = self.timers.next_at();
            tokio::select! {
                _ = stop.cancelled() => return,
                Some((from, packet)) = inbox.recv() => self.on_packet(from, &packet),
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Leave(done)) => {
                        self.leaving = true;
                        let _ = self.foca.leave_cluster(&mut self.runtime);
                        self.flush();
                        let _ = done.send(());
                        return;
                    }
                    Some(c) => self.on_command(c),
                },
                _ = sleep_until_opt(next_timer) => self.fire_timers(),
                _ = tick.tick() => self.on_tick(),
            }
            self.flush();
        }
    }

    fn on_packet(&mut self, from: SocketAddr, packet: &[u8]) {
        self.stats.packets_received.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_received
            .fetch_add(packet.len() as u64, Ordering::Relaxed);
        let opened = match self.options.key.open(packet, MAX_DATAGRAM) {
            Ok(o) => o,
            Err(reason) => return self.rejected(from, reason),
        };
        let window = self.options.replay_window.as_micros() as u64;
        if let Err(reason) = self
            .replay
            .admit(&opened, self.options.clock.unix_us(), window)
        {
            return self.rejected(from, reason);
        }
        // Sent before this node started: a capture played back to a restarted node, whose replay
        // guard is new.
        if opened.sent_at_us < self.started_us {
            return self.rejected(from, Rejected::Expired);
        }
        match opened.kind {
            Kind::Swim => match self.handle_swim(from, opened.body) {
                Ok(()) => {}
                Err(
                    foca::Error::Decode(_)
                    | foca::Error::MalformedPacket
                    | foca::Error::CustomBroadcast(_)
                    | foca::Error::DataTooBig,
                ) => self.rejected(from, Rejected::Undecodable),
                Err(err) => tracing::debug!(%from, ?err, "gossip message ignored"),
            },
            Kind::Items => self.take_items(from, opened.body),
            // Answer only at the address the asker names as its own: a `want` replayed with a
            // forged source must not turn this node into a reflector toward someone else.
            Kind::Want => match wire::decode_want(opened.body) {
                Ok(asker) if asker.addr == from => self.send_items(from),
                Ok(asker) => self
                    .address_warnings
                    .warn(from, asker.addr, AddressRule::WantSource),
                Err(_) => self.rejected(from, Rejected::Undecodable),
            },
        }
    }

    /// A SWIM message; the items riding on it are first-hand when it comes from their node.
    fn handle_swim(&mut self, from: SocketAddr, body: &[u8]) -> Result<(), foca::Error> {
        // foca takes the sender's address from the message, not the datagram: a sender behind
        // NAT (or advertising another address) stays a member, but none of its items count as
        // first-hand. Only a header is decoded; foca decodes the message itself below.
        if let Ok(header) =
            <PostcardCodec as Codec<NodeId>>::decode_header(&mut PostcardCodec, body)
        {
            if !same_addr(header.src.addr, from) {
                self.address_warnings
                    .warn(from, header.src.addr, AddressRule::SwimSource);
            } else {
                self.answer_for_previous_incarnation(from, &header);
            }
        }
        self.handler.lock().from = Some(from);
        let result = self.foca.handle_data(body, &mut self.runtime);
        self.handler.lock().from = None;
        result
    }

    /// Items sent directly: each must be about the node that sent it (a node only ever sends
    /// its own this way). Each is read on its own: one this sidecar cannot read (a kind it does
    /// not know, a damaged one) is counted and the others still count.
    fn take_items(&mut self, from: SocketAddr, body: &[u8]) {
        if body.is_empty() {
            return self.rejected(from, Rejected::Undecodable);
        }
        let now = Instant::now();
        for decoded in wire::decode_items(body) {
            match decoded {
                Ok(Decoded::Known(item)) if same_addr(item.node.addr, from) => {
                    self.handler.lock().apply(&item, Origin::FirstHand, now);
                }
                Ok(Decoded::Known(item)) => {
                    self.rejected(from, Rejected::NotSender);
                    self.address_warnings
                        .warn(from, item.node.addr, AddressRule::NotSender);
                }
                Ok(Decoded::Unknown { .. }) => self.rejected(from, Rejected::UnknownKind),
                Err(_) => self.rejected(from, Rejected::Undecodable),
            }
        }
    }

    fn rejected(&self, from: SocketAddr, reason: Rejected) {
        self.stats.reject(reason);
        tracing::debug!(%from, reason = reason.as_str(), "gossip packet rejected");
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Profile(profile) => {
                let profile = wire::Profile::from(&profile);
                let unchanged = self
                    .profile
                    .as_ref()
                    .is_some_and(|p| matches!(&p.item.body, Body::Profile(old) if *old == profile));
                let first = self.profile.is_none();
                if !unchanged {
                    self.publish(Body::Profile(profile));
                    // The live view names the profile it goes with.
                    if let Some(live) = self.last_live() {
                        self.publish_live_now(live);
                    }
                    self.send_items_to_members();
                }
                if first {
                    for to in std::mem::take(&mut self.unserved) {
                        self.send_items(to);
                    }
                    let seeds = std::mem::take(&mut self.deferred_seeds);
                    if !seeds.is_empty() {
                        self.on_command(Command::Seeds(seeds));
                    }
                }
            }
            Command::Live(live) => self.offer_live(live.into()),
            Command::Pins(pins) => self.offer_pins(&pins),
            // Joining before there is a profile to show would leave the members that answer
            // without it until the next round: wait for the first profile.
            Command::Seeds(addrs) if self.profile.is_none() => {
                self.watch_seeds(&addrs);
                self.deferred_seeds = addrs;
            }
            Command::Seeds(addrs) => {
                self.watch_seeds(&addrs);
                let known = self.handler.lock().active_addrs();
                for addr in addrs {
                    if addr != self.options.addr && !known.contains(&addr) {
                        // Epoch 0: any incarnation at that address may answer an announce.
                        let seed = NodeId { addr, epoch: 0 };
                        let _ = self.foca.announce(seed, &mut self.runtime);
                    }
                }
            }
            Command::Key(key) => self.options.key = key,
            Command::Leave(_) => {}
        }
    }

    fn send(&mut self, to: SocketAddr, kind: Kind, body: &[u8]) {
        // Strictly increasing, but a wall clock stepped back by more than a second resets it:
        // otherwise every envelope would be stamped in the future and expire at the receivers.
        let now = self.options.clock.unix_us();
        let sent_at = if self.last_sent_at > now.saturating_add(1_000_000) {
            now
        } else {
            now.max(self.last_sent_at.saturating_add(1))
        };
        self.last_sent_at = sent_at;
        let packet = self.options.key.seal(kind, sent_at, body);
        self.stats.packets_sent.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_sent
            .fetch_add(packet.len() as u64, Ordering::Relaxed);
        self.transport.send(to, packet);
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let refresh_due = self.refresh_due(now);
        if self.live_due(now, refresh_due) {
            if let Some(live) = self.last_live() {
                self.publish_live_now(live);
            }
        }
        let housekeeping = self
            .housekeeping_at
            .is_none_or(|at| now.saturating_duration_since(at) >= Duration::from_millis(500));
        if housekeeping {
            self.housekeeping_at = Some(now);
            let conflicts = self.handler.lock().name_conflicts;
            if conflicts > self.conflicts_seen {
                self.conflicts_seen = conflicts;
                tracing::warn!(
                    agent = %self.options.name,
                    "gossip: another sidecar publishes under this agent's name; names must be unique \
                     (only the newest of the two is routable)"
                );
            }
            self.replay.prune(self.options.clock.unix_us());
            self.address_warnings.prune(now);
            self.handler.lock().prune(now);
            self.repair_housekeeping(now);
        }
        self.ask_returning_seeds(now);
        self.deliver_members(now);
        // Membership changes show in `/status` within a tick; suspicion within half a second.
        if housekeeping || std::mem::take(&mut self.swim_view_stale) {
            self.refresh_swim_view();
        }
    }

    /// Sends what foca asked for, schedules its timers, and passes changes on to the sink.
    fn flush(&mut self) {
        self.meet_strangers();
        while let Some((to, data)) = self.runtime.to_send() {
            self.send(to.addr, Kind::Swim, &data);
        }
        let now = Instant::now();
        self.schedule_timers(now);
        let mut rejoined = false;
        while let Some(notification) = self.runtime.to_notify() {
            let mut table = self.handler.lock();
            match notification {
                OwnedNotification::MemberUp(id) => {
                    table.member_up(&id);
                    drop(table);
                    self.seed_back(id.addr);
                }
                OwnedNotification::MemberDown(id) => {
                    table.member_down(&id, now);
                    drop(table);
                    self.seed_away(id.addr, now);
                }
                OwnedNotification::Rename(old, new) => table.renamed(&old, &new, now),
                OwnedNotification::Rejoin(id) => {
                    table.set_my_node(id);
                    rejoined = true;
                }
                OwnedNotification::Defunct if !self.leaving => {
                    tracing::warn!("gossip: this node was declared down and cannot rejoin");
                }
                _ => {}
            }
        }
        if rejoined {
            // A new identity: every item must carry it, or others would keep the old one.
            tracing::info!("gossip: rejoined the cluster under a new identity");
            if let Some(Body::Profile(p)) = self.profile.as_ref().map(|p| p.item.body.clone()) {
                self.publish(Body::Profile(p));
            }
            if let Some(live) = self.last_live() {
                self.publish_live_now(live);
            }
            if let Some(Body::Pins(p)) = self.pins.as_ref().map(|p| p.item.body.clone()) {
                self.publish(Body::Pins(p));
            }
            self.send_items_to_members();
        }
        let (newcomers, wants, live_updates) = {
            let mut table = self.handler.lock();
            if std::mem::take(&mut table.dirty) {
                self.members_dirty = true;
            }
            if std::mem::take(&mut table.lost) {
                self.members_lost = true;
            }
            (
                std::mem::take(&mut table.newcomers),
                std::mem::take(&mut table.wants),
                std::mem::take(&mut table.live_updates),
            )
        };
        for node in newcomers {
            self.send_items(node.addr);
        }
        self.ask_for_items(wants, now);
        self.deliver_lives(live_updates);
    }

    /// Hands the routable set to the sink if it changed. Runs once a tick, not per packet: a
    /// join storm changes membership hundreds of times a second, and each delivery is O(N).
    /// A loss goes out on the next tick (no call may go to a dead member); additions alone wait
    /// up to `ADDITIONS_EVERY`, so a storm of joins costs a few deliveries, not one a tick.
    fn deliver_members(&mut self, now: Instant) {
        if !self.members_dirty {
            return;
        }
        let batching = !self.members_lost
            && self
                .members_delivered_at
                .is_some_and(|at| now.saturating_duration_since(at) < ADDITIONS_EVERY);
        if batching {
            return;
        }
        self.members_dirty = false;
        self.members_lost = false;
        self.members_delivered_at = Some(now);
        self.swim_view_stale = true;
        let members = self.handler.lock().routable();
        // Newly routable (or changed) members' views go with them.
        let fresh: Vec<String> = members
            .iter()
            .filter(|m| self.members_sent.get(&m.name) != Some(*m))
            .map(|m| m.name.clone())
            .collect();
        if fresh.is_empty() && members.len() == self.members_sent.len() {
            return;
        }
        self.sink.members(&members);
        self.members_sent = members.into_iter().map(|m| (m.name.clone(), m)).collect();
        self.deliver_lives(fresh);
    }

    fn deliver_lives(&self, names: Vec<String>) {
        if names.is_empty() {
            return;
        }
        let table = self.handler.lock();
        for name in names {
            let Some(member) = self.members_sent.get(&name) else {
                continue;
            };
            if let Some((_, live)) = table.get(&name).and_then(|e| e.live.as_ref()) {
                self.sink.live(member, &model::Live::from(live.clone()));
            }
        }
    }

    /// Copies what SWIM says of its members that are not alive (few, usually) for `/status`.
    fn refresh_swim_view(&mut self) {
        let not_alive = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() != foca::State::Alive)
            .map(|m| (m.id().clone(), m.state()))
            .collect();
        self.handler.lock().swim = SwimView {
            members: self.foca.num_members(),
            not_alive,
        };
    }
}

/// A generator from `seed` (a repeatable simulation), else from the system.
fn seeded(seed: Option<u64>) -> StdRng {
    seed.map_or_else(rand::make_rng, StdRng::seed_from_u64)
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
