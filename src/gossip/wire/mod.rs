//! What travels inside the envelope besides SWIM: each node's identity, profile, live view and
//! MCP tool pins, in gossip's own types. No routing type crosses into this module: `super::model` converts at
//! the boundary, so the bytes change only when this file does.
//!
//! Every item is framed and versioned on its own (`docs/gossip.md`, "Compatibility"):
//!
//! ```text
//! kind (1) | version (1) | length (varint) | name | node | seq | the kind's fields, oldest first
//! ```
//!
//! Fields are postcard-encoded (compact, no field names); fractions are quantized to 1/1000. A
//! reader takes the fields it knows and skips what a newer version appended; an item of an older
//! version gets defaults for the fields it lacks; an item of a kind it does not know is skipped
//! whole, and the items after it are read all the same.

mod fields;
pub(crate) mod future;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub(crate) use fields::{Fields, Writer};

/// A member as SWIM knows it: its gossip address, and an epoch that grows with every start (and
/// every rejoin after being declared down), so a restarted sidecar replaces its old self.
///
/// foca encodes it in every SWIM message: it never changes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeId {
    pub addr: SocketAddr,
    pub epoch: u64,
}

impl foca::Identity for NodeId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            addr: self.addr,
            epoch: self.epoch.wrapping_add(1),
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.epoch > adversary.epoch
    }
}

/// One published fact about one agent. `seq` grows with every item a node publishes, so the
/// newest of each kind wins and an old one played back changes nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub name: String,
    pub node: NodeId,
    pub seq: u64,
    pub body: Body,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    Profile(Profile),
    Live(Live),
    Pins(Pins),
}

impl Item {
    pub(crate) fn kind(&self) -> ItemKind {
        match self.body {
            Body::Profile(_) => ItemKind::Profile,
            Body::Live(_) => ItemKind::Live,
            Body::Pins(_) => ItemKind::Pins,
        }
    }
}

/// The kinds of item this sidecar knows, and the version of each it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ItemKind {
    Profile,
    Live,
    Pins,
}

impl ItemKind {
    /// The kind's byte on the wire. A new kind takes a new byte; a byte is never reused.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Profile => 1,
            Self::Live => 2,
            Self::Pins => 3,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Profile),
            2 => Some(Self::Live),
            3 => Some(Self::Pins),
            _ => None,
        }
    }

    /// The newest version of the kind this sidecar writes and reads. Appending a field bumps it.
    pub(crate) fn version(self) -> u8 {
        match self {
            // 2: `identity` appended. 3: each capability's `output_schema` digest appended.
            // 4: each capability's A2A `skill` facts appended. 5: each capability's MCP `tools`.
            Self::Profile => 5,
            // 2: `saturation_predicted` appended. 3: `quality_milli` and `degraded` appended.
            // 4: `budget` appended. 5: each budget's `credential` appended.
            Self::Live => 5,
            Self::Pins => 1,
        }
    }
}

/// What an agent is: changes rarely (a config reload), sent on change and on request.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The sidecar's inbound address, where peers send work.
    pub inbound: String,
    pub zone: String,
    pub region: String,
    pub max_concurrency: u32,
    pub capabilities: Vec<Capability>,
    /// The sidecar's version.
    pub version: String,
    /// The SPIFFE ID its certificate presents to callers; empty without mutual TLS (v2).
    pub identity: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Capability {
    pub name: String,
    /// Tag → proficiency in thousandths.
    pub tags: BTreeMap<String, u16>,
    pub timeout_ms: u64,
    pub mode: Mode,
    /// Declared cost in thousandths.
    pub cost_milli: u32,
    pub idempotent: bool,
    /// The SHA-256 of the capability's output schema, when it declares one (v3). Only the
    /// digest travels: a schema's text would not fit an item (`MAX_ITEM`).
    pub output_schema: Option<[u8; 32]>,
    /// What the agent's A2A card says of the skill, when the capability came from one (v4).
    pub skill: Option<Skill>,
    /// The MCP server's tools, when the capability is an MCP server's (v5).
    pub tools: Vec<Tool>,
}

/// An MCP tool's entry: its name routes, the rest serves the federated `tools/list` and the
/// retry decision. The importer bounds the list to keep a profile within `MAX_ITEM`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub(crate) name: String,
    pub(crate) title: String,
    /// The first 8 bytes of the SHA-256 of its canonical input schema.
    pub(crate) schema: [u8; 8],
    /// Bit 0: `readOnlyHint`; bit 1: `idempotentHint`. Further hints take further bits: an
    /// older reader ignores them.
    pub(crate) hints: u8,
}

/// An A2A skill's facts: one byte when absent; media types as written on the card, which the
/// importer caps in number and length to keep a profile within `MAX_ITEM`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Skill {
    pub(crate) streaming: bool,
    pub(crate) input_modes: Vec<String>,
    pub(crate) output_modes: Vec<String>,
}

/// How a capability is routed, as the wire says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Sync,
    Async,
}

/// How the agent is doing now, as its own sidecar sees it: small, sent often.
#[derive(Clone, Debug, PartialEq)]
pub struct Live {
    /// The `seq` of the profile this view goes with: a receiver without it asks for it.
    pub(crate) profile_seq: u64,
    pub(crate) state: AgentState,
    pub(crate) state_age_s: u32,
    /// Fractions in thousandths.
    pub(crate) cap: u16,
    pub(crate) availability: u16,
    pub(crate) saturation: u16,
    pub(crate) latency_ms: Option<u32>,
    pub(crate) p50_ms: Option<u32>,
    pub(crate) p95_ms: Option<u32>,
    pub(crate) busy: bool,
    pub(crate) cooling_down: bool,
    pub(crate) in_flight: u32,
    pub(crate) queued: u32,
    /// The saturation expected a horizon ahead, in thousandths (v2); an older item reads as its
    /// `saturation`: no prediction.
    pub(crate) saturation_predicted: u16,
    /// The last golden-task similarity in thousandths, for an agent that has golden tasks (v3).
    pub(crate) quality_milli: Option<u16>,
    /// Its answers drifted below the threshold (v3). `state` stays `healthy` for such an agent:
    /// an older sidecar would refuse a new state value, and reads it as healthy with its cap.
    pub(crate) degraded: bool,
    /// Its model budgets (v4): its own targets' folded into one (no group) and one per
    /// `budget_group` (docs/model-budgets.md). An older item reads as none known.
    pub(crate) budget: Vec<LiveBudget>,
}

/// One model budget in a live view. Each is a record of its own: a newer version may append.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveBudget {
    /// The provider account it belongs to; `None` for the agent's own targets.
    pub(crate) group: Option<String>,
    /// Its headroom in thousandths; `None` when the agent has learned nothing of it yet (it
    /// only says it belongs to the group).
    pub(crate) headroom_milli: Option<u16>,
    /// Until it resets, and how old the answer it was learned from is.
    pub(crate) reset_ms: u32,
    pub(crate) age_ms: u32,
    /// The fingerprint of the credential it was learned with (v5; `docs/model-budgets.md`).
    pub(crate) credential: Option<u64>,
}

/// Budgets one live view may carry: an agent has few providers.
pub(crate) const MAX_LIVE_BUDGETS: usize = 8;

/// The MCP tool definitions a sidecar pinned (`src/outbound/mcp/pins.rs`): a caller that settles
/// a tool later adopts the one most members pin (`docs/mcp.md`). Small, sent on change; relayed
/// like a live view. Older sidecars skip the kind whole.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pins {
    pub(crate) pins: Vec<Pin>,
}

/// One pinned tool. Each is a record of its own: a newer version may append.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pin {
    pub(crate) capability: String,
    pub(crate) tool: String,
    /// The digest of the pinned definition: as `Tool::schema` carries it (the first 8 bytes of
    /// the SHA-256 of the canonical definition, `src/mcp/tools.rs`).
    pub(crate) digest: [u8; 8],
}

/// An agent's state in the reach model, as the wire says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentState {
    Parole,
    Healthy,
    Probation,
    Ejected,
    Recovering,
    Draining,
}

#[cfg(test)]
impl AgentState {
    pub(crate) const ALL: [AgentState; 6] = [
        Self::Parole,
        Self::Healthy,
        Self::Probation,
        Self::Ejected,
        Self::Recovering,
        Self::Draining,
    ];
}

/// A closed set of values written as one byte each. A byte is never reused; a new value is one
/// older sidecars refuse (the item does not decode), so it needs a new field instead.
trait Code: Sized + Copy + PartialEq + 'static {
    const CODES: &'static [(Self, u8)];

    fn code(self) -> u8 {
        Self::CODES
            .iter()
            .find(|(v, _)| *v == self)
            .map_or(u8::MAX, |(_, c)| *c)
    }

    fn from_code(code: u8) -> Result<Self, WireError> {
        Self::CODES
            .iter()
            .find(|(_, c)| *c == code)
            .map(|(v, _)| *v)
            .ok_or(WireError::Invalid("a value this sidecar does not know"))
    }
}

impl Code for Mode {
    const CODES: &'static [(Self, u8)] = &[(Self::Sync, 0), (Self::Async, 1)];
}

impl Code for AgentState {
    const CODES: &'static [(Self, u8)] = &[
        (Self::Parole, 0),
        (Self::Healthy, 1),
        (Self::Probation, 2),
        (Self::Ejected, 3),
        (Self::Recovering, 4),
        (Self::Draining, 5),
    ];
}

// Each kind's fields, in wire order. A new version appends its fields at the end of `write`, and
// reads them in `read` with `f.since(version)`, defaulting when the item is older. Nothing is
// ever removed, reordered or retyped (`docs/gossip.md`, "Compatibility").

impl Profile {
    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        w.put(&self.inbound)?;
        w.put(&self.zone)?;
        w.put(&self.region)?;
        w.put(&self.max_concurrency)?;
        w.put(&len_u32(self.capabilities.len())?)?;
        for c in &self.capabilities {
            w.record(|w| c.write(w))?;
        }
        w.put(&self.version)?;
        w.put(&self.identity)
    }

    pub(crate) fn read(f: &mut Fields<'_>) -> Result<Self, WireError> {
        let inbound = f.take()?;
        let zone = f.take()?;
        let region = f.take()?;
        let max_concurrency = f.take()?;
        let count: u32 = f.take()?;
        let mut capabilities = Vec::new();
        for _ in 0..count {
            // Each capability is a record of its own: a newer version may append to it.
            let mut c = f.record()?;
            capabilities.push(Capability::read(&mut c)?);
            c.finish()?;
        }
        let version = f.take()?;
        let identity = f.since(2)?.unwrap_or_default();
        Ok(Self {
            inbound,
            zone,
            region,
            max_concurrency,
            capabilities,
            version,
            identity,
        })
    }
}

impl Capability {
    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        w.put(&self.name)?;
        w.put(&self.tags)?;
        w.put(&self.timeout_ms)?;
        w.put(&self.mode.code())?;
        w.put(&self.cost_milli)?;
        w.put(&self.idempotent)?;
        w.put(&self.output_schema)?;
        w.put(&self.skill)?;
        w.put(&self.tools)
    }

    pub(crate) fn read(f: &mut Fields<'_>) -> Result<Self, WireError> {
        let name = f.take()?;
        let tags = f.take()?;
        let timeout_ms = f.take()?;
        let mode = Mode::from_code(f.take()?)?;
        let cost_milli = f.take()?;
        let idempotent = f.take()?;
        let output_schema = f.since(3)?.flatten();
        let skill = f.since(4)?.flatten();
        let tools = f.since(5)?.unwrap_or_default();
        Ok(Self {
            name,
            tags,
            timeout_ms,
            mode,
            cost_milli,
            idempotent,
            output_schema,
            skill,
            tools,
        })
    }
}

impl Live {
    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        w.put(&self.profile_seq)?;
        w.put(&self.state.code())?;
        w.put(&self.state_age_s)?;
        w.put(&self.cap)?;
        w.put(&self.availability)?;
        w.put(&self.saturation)?;
        w.put(&self.latency_ms)?;
        w.put(&self.p50_ms)?;
        w.put(&self.p95_ms)?;
        w.put(&self.busy)?;
        w.put(&self.cooling_down)?;
        w.put(&self.in_flight)?;
        w.put(&self.queued)?;
        w.put(&self.saturation_predicted)?;
        w.put(&self.quality_milli)?;
        w.put(&self.degraded)?;
        let budget = &self.budget[..self.budget.len().min(MAX_LIVE_BUDGETS)];
        w.put(&len_u32(budget.len())?)?;
        for b in budget {
            w.record(|w| {
                w.put(&b.group)?;
                w.put(&b.headroom_milli)?;
                w.put(&b.reset_ms)?;
                w.put(&b.age_ms)?;
                w.put(&b.credential)
            })?;
        }
        Ok(())
    }

    pub(crate) fn read(f: &mut Fields<'_>) -> Result<Self, WireError> {
        let profile_seq = f.take()?;
        let state = AgentState::from_code(f.take()?)?;
        let state_age_s = f.take()?;
        let cap = f.take()?;
        let availability = f.take()?;
        let saturation = f.take()?;
        let latency_ms = f.take()?;
        let p50_ms = f.take()?;
        let p95_ms = f.take()?;
        let busy = f.take()?;
        let cooling_down = f.take()?;
        let in_flight = f.take()?;
        let queued = f.take()?;
        let saturation_predicted = f.since(2)?.unwrap_or(saturation);
        let quality_milli = f.since(3)?.flatten();
        let degraded = f.since(3)?.unwrap_or(false);
        let budget = read_budgets(f)?;
        Ok(Self {
            profile_seq,
            state,
            state_age_s,
            cap,
            availability,
            saturation,
            latency_ms,
            p50_ms,
            p95_ms,
            busy,
            cooling_down,
            in_flight,
            queued,
            saturation_predicted,
            quality_milli,
            degraded,
            budget,
        })
    }
}

impl Pins {
    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), WireError> {
        w.put(&len_u32(self.pins.len())?)?;
        for p in &self.pins {
            w.record(|w| {
                w.put(&p.capability)?;
                w.put(&p.tool)?;
                w.put(&p.digest)
            })?;
        }
        Ok(())
    }

    pub(crate) fn read(f: &mut Fields<'_>) -> Result<Self, WireError> {
        let count: u32 = f.take()?;
        // Not allocated by the count a sender claims: the item's length bounds what is read.
        let mut pins = Vec::new();
        for _ in 0..count {
            let mut p = f.record()?;
            pins.push(Pin {
                capability: p.take()?,
                tool: p.take()?,
                digest: p.take()?,
            });
            p.finish()?;
        }
        Ok(Self { pins })
    }
}

/// The live view's budgets (v4), none from an older sidecar.
fn read_budgets(f: &mut Fields<'_>) -> Result<Vec<LiveBudget>, WireError> {
    let count: u32 = f.since(4)?.unwrap_or(0);
    if count as usize > MAX_LIVE_BUDGETS {
        return Err(WireError::Invalid("too many budgets"));
    }
    let mut budget = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let mut b = f.record()?;
        budget.push(LiveBudget {
            group: b.take()?,
            headroom_milli: b.take()?,
            reset_ms: b.take()?,
            age_ms: b.take()?,
            credential: b.since(5)?.flatten(),
        });
        b.finish()?;
    }
    Ok(budget)
}

fn len_u32(n: usize) -> Result<u32, WireError> {
    u32::try_from(n).map_err(|_| WireError::Invalid("too many"))
}

/// 0..1 → thousandths, clamped (NaN is 0).
pub(crate) fn milli(x: f64) -> u16 {
    if x.is_finite() {
        (x.clamp(0.0, 1.0) * 1000.0).round() as u16
    } else {
        0
    }
}

/// Thousandths → 0..1, clamped (a hostile 65535 is 1).
pub(crate) fn unmilli(x: u16) -> f64 {
    f64::from(x.min(1000)) / 1000.0
}

/// Bytes that are not a well-formed item (or a value that cannot be encoded).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("gossip wire format: {0}")]
    Postcard(#[from] postcard::Error),
    #[error("gossip wire format: {0}")]
    Invalid(&'static str),
}

/// One item as read off the wire.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Decoded {
    Known(Item),
    /// An item of a kind this sidecar does not know (a newer one sent it): skipped. Every kind
    /// starts with the same head, so it can still be told whose it is.
    Unknown {
        kind: u8,
        version: u8,
        name: String,
        node: NodeId,
        seq: u64,
    },
}

/// One item's bytes: its frame, head and fields.
pub(crate) fn encode_item(item: &Item) -> Result<Vec<u8>, WireError> {
    let mut w = Writer::default();
    write_item(&mut w, item)?;
    Ok(w.into_bytes())
}

/// Items one after another, as an `items` datagram carries them.
pub fn encode_items<'a>(items: impl IntoIterator<Item = &'a Item>) -> Result<Vec<u8>, WireError> {
    let mut w = Writer::default();
    for item in items {
        write_item(&mut w, item)?;
    }
    Ok(w.into_bytes())
}

fn write_item(w: &mut Writer, item: &Item) -> Result<(), WireError> {
    let kind = item.kind();
    write_frame(w, kind.code(), kind.version(), item, |w| match &item.body {
        Body::Profile(p) => p.write(w),
        Body::Live(l) => l.write(w),
        Body::Pins(p) => p.write(w),
    })
}

/// A frame: kind, version, then the head and the kind's fields as one record.
pub(crate) fn write_frame(
    w: &mut Writer,
    kind: u8,
    version: u8,
    head: &Item,
    body: impl FnOnce(&mut Writer) -> Result<(), WireError>,
) -> Result<(), WireError> {
    w.raw(&[kind, version]);
    w.record(|w| {
        w.put(&head.name)?;
        w.put(&head.node)?;
        w.put(&head.seq)?;
        body(w)
    })
}

/// Exactly one item (a SWIM piggyback carries one per broadcast).
pub(crate) fn decode_item(bytes: &[u8]) -> Result<Decoded, WireError> {
    let (frame, rest) = split_frame(bytes)?;
    if !rest.is_empty() {
        return Err(WireError::Invalid("bytes after the item"));
    }
    frame.read()
}

/// The items of an `items` datagram, one by one: an item that does not decode is an `Err` and
/// the next is read all the same, unless the frames themselves are broken (then that `Err` is
/// the last).
pub(crate) fn decode_items(bytes: &[u8]) -> Items<'_> {
    Items { rest: bytes }
}

#[derive(Debug)]
pub(crate) struct Items<'a> {
    rest: &'a [u8],
}

impl Iterator for Items<'_> {
    type Item = Result<Decoded, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        match split_frame(self.rest) {
            Ok((frame, rest)) => {
                self.rest = rest;
                Some(frame.read())
            }
            Err(err) => {
                self.rest = &[];
                Some(Err(err))
            }
        }
    }
}

/// One item's frame, split off but not yet read.
pub(crate) struct Frame<'a> {
    pub(crate) kind: u8,
    pub(crate) version: u8,
    pub(crate) record: &'a [u8],
}

/// Splits the first frame off `bytes`.
pub(crate) fn split_frame(bytes: &[u8]) -> Result<(Frame<'_>, &[u8]), WireError> {
    let [kind, version, rest @ ..] = bytes else {
        return Err(WireError::Invalid("a truncated item"));
    };
    if *version == 0 {
        return Err(WireError::Invalid("item version 0"));
    }
    let (len, rest) = postcard::take_from_bytes::<u32>(rest)?;
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > rest.len() {
        return Err(WireError::Invalid("an item longer than its datagram"));
    }
    let (record, rest) = rest.split_at(len);
    let frame = Frame {
        kind: *kind,
        version: *version,
        record,
    };
    Ok((frame, rest))
}

impl Frame<'_> {
    /// The item, read as far as this sidecar knows its kind.
    pub(crate) fn read(&self) -> Result<Decoded, WireError> {
        self.read_knowing(ItemKind::from_code)
    }

    /// The item, as a reader that knows the kinds `known` names reads it (a test plays an
    /// older sidecar with it).
    pub(crate) fn read_knowing(
        &self,
        known: impl Fn(u8) -> Option<ItemKind>,
    ) -> Result<Decoded, WireError> {
        let Some(kind) = known(self.kind) else {
            // The head is all every kind shares; the rest is another version's business.
            let mut f = Fields::new(self.version, 0, self.record);
            return Ok(Decoded::Unknown {
                kind: self.kind,
                version: self.version,
                name: f.take()?,
                node: f.take()?,
                seq: f.take()?,
            });
        };
        let mut f = Fields::new(self.version, kind.version(), self.record);
        let name = f.take()?;
        let node = f.take()?;
        let seq = f.take()?;
        let body = match kind {
            ItemKind::Profile => Body::Profile(Profile::read(&mut f)?),
            ItemKind::Live => Body::Live(Live::read(&mut f)?),
            ItemKind::Pins => Body::Pins(Pins::read(&mut f)?),
        };
        f.finish()?;
        Ok(Decoded::Known(Item {
            name,
            node,
            seq,
            body,
        }))
    }
}

/// A `want`'s body: the asker. A newer version may append to it; this one reads the asker and
/// ignores the rest.
pub fn encode_want(asker: &NodeId) -> Result<Vec<u8>, WireError> {
    Ok(postcard::to_allocvec(asker)?)
}

pub(crate) fn decode_want(bytes: &[u8]) -> Result<NodeId, WireError> {
    Ok(postcard::take_from_bytes(bytes)?.0)
}
