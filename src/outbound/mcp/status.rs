//! The per-tool view as `/status` shows it (`docs/mcp.md`): per MCP capability, each tool with
//! the servers that announce it and how each server's tool stands in this caller's view.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::view::ToolView;
use super::Outbound;
use crate::config::{Snapshot, ToolFacts};
use crate::registry::Peer;

/// One tool of an MCP capability, and every server that announces it.
#[derive(Clone, Debug, Serialize)]
pub struct ToolStatus {
    pub capability: String,
    pub tool: String,
    pub servers: Vec<ToolServer>,
}

/// One server's tool, as this caller has seen it answer.
#[derive(Clone, Debug, Serialize)]
pub struct ToolServer {
    pub server: String,
    /// `healthy`; `paused` (passed over); `trial` (the pause is over: the next call decides).
    pub state: &'static str,
    /// Failures in a row.
    pub failures: u32,
    /// Seconds left of the pause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) paused_for_s: Option<f64>,
    /// The digest of the server's definition of the tool (`mcp.accept` takes it).
    pub definition: String,
    /// Its definition is not the one this caller lists and routes by: held back until the
    /// policy accepts it (`docs/mcp.md`).
    pub held: bool,
    /// Members of the fleet that publish this definition as their pin (`docs/mcp.md`).
    pub pinned_by: u32,
}

/// Every MCP capability's tools, by capability then tool, servers by name.
pub(crate) fn tools(out: &Outbound, snapshot: &Snapshot) -> Vec<ToolStatus> {
    let now = Instant::now();
    let mut listed = Vec::new();
    for capability in out.registry.mcp_capabilities() {
        let peers = out.registry.candidates(snapshot, &capability);
        // Each tool's announcing servers first: the definition it is routed by is settled once
        // per tool, not once per server.
        let mut announcing: BTreeMap<&str, Vec<(&Peer, &ToolFacts)>> = BTreeMap::new();
        for peer in &peers {
            for tool in peer.tools.get(&capability).into_iter().flatten() {
                announcing
                    .entry(tool.name.as_str())
                    .or_default()
                    .push((peer, tool));
            }
        }
        let mut by_tool: BTreeMap<&str, Vec<ToolServer>> = BTreeMap::new();
        for (name, servers) in &announcing {
            // Shown, not settled: a pin is settled by a list or a call (`pins.rs`).
            let chosen =
                out.pins
                    .shown(snapshot, &capability, name, servers.iter().map(|(p, _)| *p));
            for (peer, tool) in servers {
                let mut shown = server(&peer.name, out.tools.view(&peer.name, name), now);
                shown.definition = tool.schema.clone();
                shown.held = chosen.as_deref() != Some(tool.schema.as_str());
                shown.pinned_by = out.pins.pinned_by(&capability, name, &tool.schema);
                by_tool.entry(name).or_default().push(shown);
            }
        }
        for (tool, mut servers) in by_tool {
            servers.sort_by(|a, b| a.server.cmp(&b.server));
            listed.push(ToolStatus {
                capability: capability.clone(),
                tool: tool.to_owned(),
                servers,
            });
        }
    }
    listed
}

fn server(name: &str, view: ToolView, now: Instant) -> ToolServer {
    let (state, failures, paused_for_s) = match view {
        ToolView::Serving { failures } => ("healthy", failures, None),
        ToolView::Broken {
            until, failures, ..
        } if now < until => ("paused", failures, Some((until - now).as_secs_f64())),
        ToolView::Broken { failures, .. } => ("trial", failures, None),
    };
    ToolServer {
        server: name.to_owned(),
        state,
        failures,
        paused_for_s,
        definition: String::new(),
        held: false,
        pinned_by: 0,
    }
}

/// How many servers' tools this caller holds back for their definition, across capabilities.
pub(crate) fn held(out: &Outbound, snapshot: &Snapshot) -> usize {
    tools(out, snapshot)
        .iter()
        .flat_map(|t| &t.servers)
        .filter(|s| s.held)
        .count()
}
