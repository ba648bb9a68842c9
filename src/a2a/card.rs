//! An A2A agent card read as capabilities, and its interface URLs rewritten: pure, no I/O.
//!
//! The card is read leniently, as JSON: A2A versions name and nest fields differently
//! (`url`, `additionalInterfaces`, `supportedInterfaces`), and a field this sidecar does not know
//! must not stop it from importing the skills it can read.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::{A2aConfig, Capability, Name, Proficiency, SkillFacts};

/// Skills imported from one card: more would not fit a gossip profile item (`MAX_ITEM`).
pub(crate) const MAX_SKILLS: usize = 16;
/// Tags kept per skill.
pub(crate) const MAX_TAGS: usize = 8;
/// Media types kept per direction per skill.
pub(crate) const MAX_MODES: usize = 4;
/// Longest tag or media type kept, in bytes; longer ones are dropped, not cut.
pub(crate) const MAX_TEXT: usize = 48;

/// What a card gave: capabilities, and the skills that could not become one (and why).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Imported {
    pub(crate) capabilities: Vec<Capability>,
    pub(crate) skipped: Vec<(String, String)>,
}

/// The card's skills as capabilities: skill id → name (ids that are not valid names are skipped),
/// tags at the configured proficiency, the card's streaming flag and the skill's media types.
pub(crate) fn import(card: &Value, config: &A2aConfig) -> Imported {
    let mut imported = Imported::default();
    let streaming = card
        .pointer("/capabilities/streaming")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let default_in = modes(card.get("defaultInputModes"));
    let default_out = modes(card.get("defaultOutputModes"));
    let skills = card.get("skills").and_then(Value::as_array);
    for skill in skills.into_iter().flatten() {
        let id = skill.get("id").and_then(Value::as_str).unwrap_or_default();
        let name = match Name::parse(id) {
            Ok(name) => name,
            Err(why) => {
                imported.skipped.push((id.to_owned(), why));
                continue;
            }
        };
        if name.as_str() == crate::config::ANY
            || imported.capabilities.iter().any(|c| c.name == name)
        {
            imported
                .skipped
                .push((id.to_owned(), "reserved or repeated".to_owned()));
            continue;
        }
        if imported.capabilities.len() == MAX_SKILLS {
            imported
                .skipped
                .push((id.to_owned(), format!("more than {MAX_SKILLS} skills")));
            continue;
        }
        let own_in = modes(skill.get("inputModes"));
        let own_out = modes(skill.get("outputModes"));
        let facts = SkillFacts {
            streaming,
            input_modes: if own_in.is_empty() {
                default_in.clone()
            } else {
                own_in
            },
            output_modes: if own_out.is_empty() {
                default_out.clone()
            } else {
                own_out
            },
        };
        imported
            .capabilities
            .push(capability(name, tags(skill, config), facts));
    }
    imported
}

fn capability(name: Name, tags: BTreeMap<String, Proficiency>, facts: SkillFacts) -> Capability {
    Capability {
        tags,
        card: Some(facts),
        ..Capability::named(name)
    }
}

fn tags(skill: &Value, config: &A2aConfig) -> BTreeMap<String, Proficiency> {
    texts(skill.get("tags"))
        .take(MAX_TAGS)
        .map(|tag| {
            let level = config.tags.get(&tag).copied().unwrap_or(config.proficiency);
            (tag, level)
        })
        .collect()
}

fn modes(value: Option<&Value>) -> Vec<String> {
    texts(value).take(MAX_MODES).collect()
}

/// The short, non-empty strings of a JSON array.
fn texts(value: Option<&Value>) -> impl Iterator<Item = String> + '_ {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= MAX_TEXT)
        .map(str::to_owned)
}

/// Points every interface URL of the card at `base` (`http://<capability>.reach`, or the
/// path-prefix form `http://127.0.0.1:4140/.reach/<capability>`), each keeping its own path:
/// `http://10.0.0.5:8080/a2a/jsonrpc` becomes `<base>/a2a/jsonrpc`. The top-level `url`, and
/// each entry's `url` in `additionalInterfaces` and `supportedInterfaces`. Returns how many.
pub(crate) fn rewrite_urls(card: &mut Value, base: &str) -> usize {
    let base = base.trim_end_matches('/');
    let moved = |u: &str| {
        // What follows the authority: `scheme://authority/path?query`.
        let path = u
            .split_once("://")
            .map_or(u, |(_, rest)| rest.find('/').map_or("", |at| &rest[at..]));
        let path = if path.is_empty() { "/" } else { path };
        format!("{base}{path}")
    };
    let mut rewritten = 0;
    if let Some(u) = card.get_mut("url").filter(|u| u.is_string()) {
        *u = Value::from(moved(u.as_str().unwrap_or_default()));
        rewritten += 1;
    }
    for list in ["additionalInterfaces", "supportedInterfaces"] {
        let entries = card.get_mut(list).and_then(Value::as_array_mut);
        for entry in entries.into_iter().flatten() {
            if let Some(u) = entry.get_mut("url").filter(|u| u.is_string()) {
                *u = Value::from(moved(u.as_str().unwrap_or_default()));
                rewritten += 1;
            }
        }
    }
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn card() -> Value {
        json!({
            "name": "sql agent", "url": "http://10.0.0.5:8080/",
            "capabilities": { "streaming": true },
            "defaultInputModes": ["text/plain"], "defaultOutputModes": ["application/json"],
            "additionalInterfaces": [{ "url": "http://10.0.0.5:8080/", "transport": "JSONRPC" }],
            "supportedInterfaces": [{ "url": "grpc://10.0.0.5:9090", "protocolBinding": "GRPC" }],
            "skills": [
                { "id": "sql-gen", "name": "SQL", "tags": ["sql", "postgres"], "outputModes": ["text/x-sql"] },
                { "id": "Bad Id", "name": "bad" },
                { "id": "sql-gen", "name": "again" },
                { "id": "explain", "tags": [] }
            ]
        })
    }

    #[test]
    fn skills_become_capabilities_with_tags_modes_and_streaming() {
        let mut config = A2aConfig::default();
        config
            .tags
            .insert("postgres".into(), Proficiency::clamped(0.95));
        let imported = import(&card(), &config);
        let names: Vec<&str> = imported
            .capabilities
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["sql-gen", "explain"]);
        assert_eq!(imported.skipped.len(), 2, "{:?}", imported.skipped);
        let sql = &imported.capabilities[0];
        assert_eq!(sql.tags.get("sql").map(|p| p.get()), Some(0.8));
        assert_eq!(sql.tags.get("postgres").map(|p| p.get()), Some(0.95));
        let facts = sql.card.clone().unwrap_or_default();
        assert!(facts.streaming);
        assert_eq!(facts.input_modes, ["text/plain"], "the card's default");
        assert_eq!(facts.output_modes, ["text/x-sql"], "the skill's own");
    }

    #[test]
    fn a_card_with_too_many_skills_is_capped() {
        let skills: Vec<Value> = (0..40).map(|i| json!({ "id": format!("s{i}") })).collect();
        let imported = import(&json!({ "skills": skills }), &A2aConfig::default());
        assert_eq!(imported.capabilities.len(), MAX_SKILLS);
    }

    #[test]
    fn every_interface_url_is_rewritten_keeping_its_path() {
        let mut card = card();
        card["additionalInterfaces"][0]["url"] = json!("http://10.0.0.5:8080/a2a/jsonrpc");
        assert_eq!(rewrite_urls(&mut card, "http://sql-gen.reach"), 3);
        assert_eq!(card["url"], "http://sql-gen.reach/");
        assert_eq!(
            card["additionalInterfaces"][0]["url"],
            "http://sql-gen.reach/a2a/jsonrpc"
        );
        assert_eq!(
            card["supportedInterfaces"][0]["url"],
            "http://sql-gen.reach/"
        );
        assert_eq!(card["name"], "sql agent");
        let mut other = super::tests::card();
        other["url"] = json!("http://10.0.0.5:8080/a2a/jsonrpc?v=1");
        rewrite_urls(&mut other, "http://127.0.0.1:4140/.reach/sql-gen/");
        assert_eq!(
            other["url"],
            "http://127.0.0.1:4140/.reach/sql-gen/a2a/jsonrpc?v=1"
        );
    }
}
