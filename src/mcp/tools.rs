//! A `tools/list` result read as the server capability's tool entries: pure, no I/O. Bounded
//! like A2A skills (`src/a2a/card.rs`) so a server's tools fit one gossip profile item
//! (`MAX_ITEM`, `src/gossip/node/mod.rs`) beside its other capabilities.

use serde_json::Value;

use crate::config::ToolFacts;

/// Tools imported from one server.
pub(crate) const MAX_TOOLS: usize = 32;
/// Longest tool name kept, in bytes; a longer one is skipped, not cut (a cut name routes
/// nowhere).
pub(crate) const MAX_NAME: usize = 64;
/// Longest title kept, in bytes; a longer one is dropped (the tool stays).
pub(crate) const MAX_TITLE: usize = 48;
/// The bytes all tools may take in the profile item (name, title, schema hash, flags).
pub(crate) const BUDGET: usize = 720;

/// What a list gave: tools, and those that could not be kept (and why).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Imported {
    pub(crate) tools: Vec<ToolFacts>,
    pub(crate) skipped: Vec<(String, String)>,
}

/// The `tools` of a `tools/list` result as tool entries, in the server's order.
pub(crate) fn import(tools: &[Value]) -> Imported {
    let mut imported = Imported::default();
    let mut spent = 0;
    for tool in tools {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        let skip = |why: &str| (name.to_owned(), why.to_owned());
        if !valid_name(name) {
            imported.skipped.push(skip("not a valid tool name"));
            continue;
        }
        if imported.tools.iter().any(|t| t.name == name) {
            imported.skipped.push(skip("repeated"));
            continue;
        }
        let facts = facts(name, tool);
        let cost = facts.name.len() + facts.title.len() + 8 + 3;
        if imported.tools.len() == MAX_TOOLS || spent + cost > BUDGET {
            imported
                .skipped
                .push(skip("over the gossip profile's room for tools"));
            continue;
        }
        spent += cost;
        imported.tools.push(facts);
    }
    imported
}

fn facts(name: &str, tool: &Value) -> ToolFacts {
    let hint = |key: &str| {
        tool.pointer(&format!("/annotations/{key}"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let title = tool
        .get("title")
        .or_else(|| tool.pointer("/annotations/title"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|t| t.len() <= MAX_TITLE)
        .unwrap_or_default();
    ToolFacts {
        name: name.to_owned(),
        title: title.to_owned(),
        schema: definition_hash(tool),
        read_only: hint("readOnlyHint"),
        idempotent: hint("idempotentHint"),
    }
}

/// MCP's tool names: 1 to 64 of ASCII letters, digits, `_`, `-` and `.` (the spec allows 128;
/// the profile item does not).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The digest of a tool's definition: what a client reads to decide how to call it — its
/// description, input and output schemas and annotations — keys sorted, so two servers that
/// write one definition in another key order agree. A changed description (an injected
/// instruction) is a changed definition (`docs/mcp.md`).
pub(crate) fn definition_hash(tool: &Value) -> String {
    let part = |key: &str| tool.get(key).cloned().unwrap_or(Value::Null);
    schema_hash(&serde_json::json!({
        "description": part("description"),
        "inputSchema": part("inputSchema"),
        "outputSchema": part("outputSchema"),
        "annotations": part("annotations"),
    }))
}

/// The first 8 bytes of the SHA-256 of the schema with its keys sorted, in hex: two servers
/// with the same schema written in another key order agree.
pub(crate) fn schema_hash(schema: &Value) -> String {
    let mut text = String::new();
    canonical(schema, &mut text);
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tools_become_entries_with_title_hash_and_hints() {
        let list = json!([
            { "name": "search", "title": "Search", "inputSchema": { "type": "object", "properties": { "q": { "type": "string" } } },
              "annotations": { "readOnlyHint": true } },
            { "name": "write", "annotations": { "title": "Write", "idempotentHint": true } },
            { "name": "bad name" },
            { "name": "search" },
            { "title": "no name" }
        ]);
        let imported = import(list.as_array().map_or(&[][..], Vec::as_slice));
        let names: Vec<&str> = imported.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["search", "write"]);
        assert_eq!(imported.skipped.len(), 3, "{:?}", imported.skipped);
        let search = &imported.tools[0];
        assert_eq!(search.title, "Search");
        assert!(search.read_only && !search.idempotent && search.retry_safe());
        assert_eq!(search.schema.len(), 16);
        assert_eq!(imported.tools[1].title, "Write");
        assert!(imported.tools[1].idempotent);
    }

    #[test]
    fn the_schema_hash_ignores_key_order() {
        let a = json!({ "type": "object", "properties": { "a": {}, "b": {} } });
        let b = json!({ "properties": { "b": {}, "a": {} }, "type": "object" });
        assert_eq!(schema_hash(&a), schema_hash(&b));
        assert_ne!(schema_hash(&a), schema_hash(&json!({ "type": "string" })));
    }

    #[test]
    fn a_long_list_is_bounded_to_fit_the_profile() {
        let tools: Vec<Value> = (0..100)
            .map(|i| json!({ "name": format!("tool-with-a-longish-name-{i}"), "title": "x".repeat(60) }))
            .collect();
        let imported = import(&tools);
        assert!(imported.tools.len() < MAX_TOOLS);
        let spent: usize = imported
            .tools
            .iter()
            .map(|t| t.name.len() + t.title.len() + 11)
            .sum();
        assert!(spent <= BUDGET);
        assert!(
            imported.tools.iter().all(|t| t.title.is_empty()),
            "60-byte titles dropped"
        );
        assert_eq!(imported.tools.len() + imported.skipped.len(), 100);
    }

    /// The most tools the importer lets through, with the longest titles, still fit one gossip
    /// profile item beside another capability.
    #[test]
    fn the_most_tools_kept_fit_a_profile_item() {
        use crate::gossip::wire::{
            encode_item, Body, Capability, Item, Mode, NodeId, Profile, Tool,
        };
        let title = "x".repeat(MAX_TITLE);
        let name = "t".repeat(20);
        let n = BUDGET / (name.len() + 2 + title.len() + 11);
        let tools: Vec<Value> = (0..n)
            .map(|i| json!({ "name": format!("{name}{i:02}"), "title": title }))
            .collect();
        let imported = import(&tools);
        assert_eq!(imported.tools.len(), n);
        let capability = |name: &str, tools: Vec<Tool>| Capability {
            name: name.to_owned(),
            tags: [("search".to_owned(), 800)].into_iter().collect(),
            timeout_ms: 30_000,
            mode: Mode::Sync,
            cost_milli: 0,
            idempotent: false,
            output_schema: Some([0xab; 32]),
            skill: None,
            tools,
        };
        let wire_tools = imported
            .tools
            .iter()
            .map(|t| Tool {
                name: t.name.clone(),
                title: t.title.clone(),
                schema: [0xff; 8],
                hints: 3,
            })
            .collect();
        let item = Item {
            name: "a-fairly-long-agent-name-0".into(),
            node: NodeId {
                addr: std::net::SocketAddr::from(([10, 0, 0, 1], 4190)),
                epoch: u64::MAX,
            },
            seq: u64::MAX,
            body: Body::Profile(Profile {
                inbound: "10.100.200.250:4143".into(),
                zone: "europe-west4-a".into(),
                region: "europe-west4".into(),
                max_concurrency: 64,
                capabilities: vec![
                    capability("mcp", wire_tools),
                    capability("review", Vec::new()),
                ],
                version: "0.1.0".into(),
                identity: "spiffe://prod.example/ns/agents/sa/search".into(),
            }),
        };
        let bytes = encode_item(&item).unwrap_or_default();
        assert!(
            bytes.len() <= crate::gossip::MAX_ITEM,
            "{} bytes",
            bytes.len()
        );
    }
}
