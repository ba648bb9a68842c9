//! An agent's profile, live view and MCP tool pins as the sidecar hands them to gossip and gets
//! them back, in
//! the routing model's terms (`reach::State`, `config::RouteMode`), and their conversion to and
//! from gossip's own wire types. This is the one place gossip meets the model: the wire never
//! names its types, so the model can change without changing a byte, and the bytes can grow
//! (a field appended, `docs/gossip.md`) without the model knowing.

use std::collections::BTreeMap;

use super::wire;
use crate::config::{RouteMode, SchemaDigest, SkillFacts, ToolFacts};
use crate::identity::SpiffeId;
use crate::reach::State;

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
    /// The SPIFFE ID its sidecar presents: a caller refuses a peer whose certificate says
    /// otherwise. `None` without mutual TLS (or from an older sidecar).
    pub identity: Option<SpiffeId>,
}

/// One capability as gossip publishes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Capability {
    pub name: String,
    /// Tag → proficiency in thousandths.
    pub tags: BTreeMap<String, u16>,
    pub timeout_ms: u64,
    pub mode: RouteMode,
    /// Declared cost in thousandths.
    pub cost_milli: u32,
    pub idempotent: bool,
    /// The digest of its output schema, when it declares one.
    pub output_schema: Option<SchemaDigest>,
    /// Streaming and media types, when it came from the agent's A2A card.
    pub a2a: Option<SkillFacts>,
    /// The MCP server's tools, when the capability is an MCP server's.
    pub tools: Vec<ToolFacts>,
}

/// How the agent is doing now, as its own sidecar sees it: small, sent often.
#[derive(Clone, Debug, PartialEq)]
pub struct Live {
    /// The `seq` of the profile this view goes with (gossip sets it when publishing).
    pub profile_seq: u64,
    pub state: State,
    pub state_age_s: u32,
    /// Fractions in thousandths.
    pub cap: u16,
    pub availability: u16,
    pub saturation: u16,
    pub latency_ms: Option<u32>,
    pub p50_ms: Option<u32>,
    pub p95_ms: Option<u32>,
    pub busy: bool,
    pub cooling_down: bool,
    pub in_flight: u32,
    pub queued: u32,
    /// The saturation expected a horizon ahead, in thousandths.
    pub saturation_predicted: u16,
    /// The last golden-task similarity in thousandths, when the agent has golden tasks.
    pub quality_milli: Option<u16>,
    /// Its answers drifted: shown as `degraded` in place of `healthy`, capped lower.
    pub degraded: bool,
    /// Its model budgets: its own targets' and its groups' (docs/model-budgets.md).
    pub budget: Vec<wire::LiveBudget>,
}

/// One MCP tool definition a sidecar pinned (`src/outbound/mcp/pins.rs`): the digest as
/// `ToolFacts::schema` has it (16 lower-hex digits).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pin {
    pub capability: String,
    pub tool: String,
    pub digest: String,
}

impl From<&wire::Pin> for Pin {
    fn from(p: &wire::Pin) -> Self {
        Self {
            capability: p.capability.clone(),
            tool: p.tool.clone(),
            digest: p.digest.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}

/// A pin as the wire carries it; `None` for a digest that is not 16 hex digits (none that a
/// server announces: `src/mcp/tools.rs` writes them).
pub(crate) fn wire_pin(p: &Pin) -> Option<wire::Pin> {
    let valid = p.digest.len() == 16 && p.digest.bytes().all(|b| b.is_ascii_hexdigit());
    let digest = u64::from_str_radix(&p.digest, 16).ok().filter(|_| valid)?;
    Some(wire::Pin {
        capability: p.capability.clone(),
        tool: p.tool.clone(),
        digest: digest.to_be_bytes(),
    })
}

// Every match below is exhaustive: a new state or mode in the model does not compile until it
// is given a wire value (a new field, by the compatibility rule: older sidecars would refuse a
// new value in an existing one).

impl From<State> for wire::AgentState {
    fn from(state: State) -> Self {
        match state {
            State::Parole => Self::Parole,
            State::Healthy => Self::Healthy,
            State::Probation => Self::Probation,
            State::Ejected => Self::Ejected,
            State::Recovering => Self::Recovering,
            State::Draining => Self::Draining,
        }
    }
}

impl From<wire::AgentState> for State {
    fn from(state: wire::AgentState) -> Self {
        match state {
            wire::AgentState::Parole => Self::Parole,
            wire::AgentState::Healthy => Self::Healthy,
            wire::AgentState::Probation => Self::Probation,
            wire::AgentState::Ejected => Self::Ejected,
            wire::AgentState::Recovering => Self::Recovering,
            wire::AgentState::Draining => Self::Draining,
        }
    }
}

impl From<RouteMode> for wire::Mode {
    fn from(mode: RouteMode) -> Self {
        match mode {
            RouteMode::Sync => Self::Sync,
            RouteMode::Async => Self::Async,
        }
    }
}

impl From<wire::Mode> for RouteMode {
    fn from(mode: wire::Mode) -> Self {
        match mode {
            wire::Mode::Sync => Self::Sync,
            wire::Mode::Async => Self::Async,
        }
    }
}

impl From<&Capability> for wire::Capability {
    fn from(c: &Capability) -> Self {
        Self {
            name: c.name.clone(),
            tags: c.tags.clone(),
            timeout_ms: c.timeout_ms,
            mode: c.mode.into(),
            cost_milli: c.cost_milli,
            idempotent: c.idempotent,
            output_schema: c.output_schema.map(|d| d.0),
            skill: c.a2a.as_ref().map(|f| wire::Skill {
                streaming: f.streaming,
                input_modes: f.input_modes.clone(),
                output_modes: f.output_modes.clone(),
            }),
            tools: c.tools.iter().map(wire_tool).collect(),
        }
    }
}

impl From<&wire::Capability> for Capability {
    fn from(c: &wire::Capability) -> Self {
        Self {
            name: c.name.clone(),
            tags: c.tags.clone(),
            timeout_ms: c.timeout_ms,
            mode: c.mode.into(),
            cost_milli: c.cost_milli,
            idempotent: c.idempotent,
            output_schema: c.output_schema.map(SchemaDigest),
            a2a: c.skill.as_ref().map(|s| SkillFacts {
                streaming: s.streaming,
                input_modes: s.input_modes.clone(),
                output_modes: s.output_modes.clone(),
            }),
            tools: c.tools.iter().map(model_tool).collect(),
        }
    }
}

/// A tool entry on the wire: its schema hash as 8 bytes (an unreadable hash is zero: it then
/// matches no server's, which only costs a federated list a duplicate).
fn wire_tool(t: &ToolFacts) -> wire::Tool {
    wire::Tool {
        name: t.name.clone(),
        title: t.title.clone(),
        schema: u64::from_str_radix(&t.schema, 16)
            .unwrap_or(0)
            .to_be_bytes(),
        hints: u8::from(t.read_only) | (u8::from(t.idempotent) << 1),
    }
}

fn model_tool(t: &wire::Tool) -> ToolFacts {
    ToolFacts {
        name: t.name.clone(),
        title: t.title.clone(),
        schema: t.schema.iter().map(|b| format!("{b:02x}")).collect(),
        read_only: t.hints & 1 != 0,
        idempotent: t.hints & 2 != 0,
    }
}

impl From<&Profile> for wire::Profile {
    fn from(p: &Profile) -> Self {
        Self {
            inbound: p.inbound.clone(),
            zone: p.zone.clone(),
            region: p.region.clone(),
            max_concurrency: p.max_concurrency,
            capabilities: p.capabilities.iter().map(Into::into).collect(),
            version: p.version.clone(),
            identity: p
                .identity
                .as_ref()
                .map_or_else(String::new, |i| i.to_string()),
        }
    }
}

impl From<&wire::Profile> for Profile {
    fn from(p: &wire::Profile) -> Self {
        Self {
            inbound: p.inbound.clone(),
            zone: p.zone.clone(),
            region: p.region.clone(),
            max_concurrency: p.max_concurrency,
            capabilities: p.capabilities.iter().map(Into::into).collect(),
            version: p.version.clone(),
            // A malformed ID is no identity: a caller in strict mode will not call it.
            identity: SpiffeId::parse(&p.identity).ok(),
        }
    }
}

impl From<Live> for wire::Live {
    fn from(l: Live) -> Self {
        Self {
            profile_seq: l.profile_seq,
            state: l.state.into(),
            state_age_s: l.state_age_s,
            cap: l.cap,
            availability: l.availability,
            saturation: l.saturation,
            latency_ms: l.latency_ms,
            p50_ms: l.p50_ms,
            p95_ms: l.p95_ms,
            busy: l.busy,
            cooling_down: l.cooling_down,
            in_flight: l.in_flight,
            queued: l.queued,
            saturation_predicted: l.saturation_predicted,
            quality_milli: l.quality_milli,
            degraded: l.degraded,
            budget: l.budget,
        }
    }
}

impl From<wire::Live> for Live {
    fn from(l: wire::Live) -> Self {
        Self {
            profile_seq: l.profile_seq,
            state: l.state.into(),
            state_age_s: l.state_age_s,
            cap: l.cap,
            availability: l.availability,
            saturation: l.saturation,
            latency_ms: l.latency_ms,
            p50_ms: l.p50_ms,
            p95_ms: l.p95_ms,
            busy: l.busy,
            cooling_down: l.cooling_down,
            in_flight: l.in_flight,
            queued: l.queued,
            saturation_predicted: l.saturation_predicted,
            quality_milli: l.quality_milli,
            degraded: l.degraded,
            budget: l.budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_and_mode_crosses_the_boundary_and_back() {
        for state in State::ALL {
            assert_eq!(State::from(wire::AgentState::from(state)), state);
        }
        for state in wire::AgentState::ALL {
            assert_eq!(wire::AgentState::from(State::from(state)), state);
        }
        for mode in [RouteMode::Sync, RouteMode::Async] {
            assert_eq!(RouteMode::from(wire::Mode::from(mode)), mode);
        }
    }

    #[test]
    fn a_profile_and_a_live_view_cross_the_boundary_unchanged() {
        let profile = Profile {
            inbound: "10.0.0.1:4143".into(),
            zone: "z".into(),
            region: "r".into(),
            max_concurrency: 3,
            capabilities: vec![Capability {
                name: "code".into(),
                tags: [("rust".to_owned(), 800)].into_iter().collect(),
                timeout_ms: 1000,
                mode: RouteMode::Async,
                cost_milli: 250,
                idempotent: true,
                output_schema: Some(SchemaDigest([7; 32])),
                a2a: Some(SkillFacts {
                    streaming: true,
                    input_modes: vec!["text/plain".into()],
                    output_modes: vec!["application/json".into()],
                }),
                tools: vec![ToolFacts {
                    name: "search".into(),
                    title: "Search".into(),
                    schema: "00112233445566ff".into(),
                    read_only: true,
                    idempotent: false,
                }],
            }],
            version: "v".into(),
            identity: SpiffeId::parse("spiffe://td/ns/a/sa/b").ok(),
        };
        assert_eq!(Profile::from(&wire::Profile::from(&profile)), profile);
        let live = Live {
            profile_seq: 4,
            state: State::Probation,
            state_age_s: 9,
            cap: 500,
            availability: 900,
            saturation: 100,
            latency_ms: Some(5),
            p50_ms: None,
            p95_ms: Some(50),
            busy: true,
            cooling_down: false,
            in_flight: 2,
            queued: 1,
            saturation_predicted: 400,
            quality_milli: Some(250),
            degraded: true,
            budget: vec![wire::LiveBudget {
                group: Some("acme".into()),
                headroom_milli: Some(120),
                reset_ms: 30_000,
                age_ms: 200,
                credential: Some(9),
            }],
        };
        assert_eq!(Live::from(wire::Live::from(live.clone())), live);
    }

    #[test]
    fn a_pin_crosses_the_boundary_unchanged_and_a_malformed_digest_does_not() {
        let pin = Pin {
            capability: "mcp".into(),
            tool: "search".into(),
            digest: "00112233445566ff".into(),
        };
        let wire = wire_pin(&pin);
        assert_eq!(
            wire.as_ref().map(|w| w.digest),
            Some([0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0xff])
        );
        assert_eq!(wire.as_ref().map(Pin::from), Some(pin.clone()));
        for bad in [
            "0011",
            "+0112233445566ff",
            "00112233445566fg",
            "00112233445566ff00",
        ] {
            let pin = Pin {
                digest: bad.into(),
                ..pin.clone()
            };
            assert_eq!(wire_pin(&pin), None, "{bad}");
        }
    }
}
