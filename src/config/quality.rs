//! `quality:` on a capability: golden tasks the sidecar sends to its agent now and then, each
//! compared with a recorded baseline answer (`docs/reach-model.md`, "Quality and `degraded`").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{de, Deserialize, Deserializer, Serialize};

use super::duration::HumanDuration;
use super::scalar;

/// `agent.capabilities[].quality`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QualitySpec {
    /// How often the golden tasks run (on the probe thread, at the lowest priority).
    #[serde(default = "default_interval")]
    pub interval: HumanDuration,
    /// A run whose mean similarity is below this marks the agent degraded.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    #[serde(deserialize_with = "some_tasks")]
    pub tasks: Vec<GoldenTask>,
}

/// One sample request and the answer it should keep getting.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GoldenTask {
    #[serde(default = "default_method", deserialize_with = "scalar::http_method")]
    pub method: String,
    /// Origin-form: starts with `/`.
    #[serde(deserialize_with = "scalar::http_path")]
    pub path: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default, deserialize_with = "scalar::http_headers")]
    pub headers: BTreeMap<String, String>,
    /// The recorded answer body (`agent-reach baseline record`); relative to the bootstrap.
    pub baseline: PathBuf,
    #[serde(default)]
    pub compare: Compare,
}

/// What of the answer is compared with the baseline. Neither key: the whole body, as text.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Compare {
    /// JSON pointers whose values must equal the baseline's exactly (`/title`, `/language`).
    #[serde(default, deserialize_with = "pointers")]
    pub json_fields: Vec<String>,
    /// A JSON pointer to free text, compared by token-set similarity (`/summary`).
    #[serde(default, deserialize_with = "pointer")]
    pub text_field: Option<String>,
}

fn default_interval() -> HumanDuration {
    HumanDuration::from_secs(3600)
}

fn default_threshold() -> f64 {
    0.8
}

fn default_method() -> String {
    "POST".to_owned()
}

fn some_tasks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<GoldenTask>, D::Error> {
    let tasks = Vec::<GoldenTask>::deserialize(d)?;
    if tasks.is_empty() {
        return Err(de::Error::custom("quality needs at least one task"));
    }
    Ok(tasks)
}

fn is_pointer(p: &str) -> bool {
    p.starts_with('/')
}

fn pointers<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let all = Vec::<String>::deserialize(d)?;
    match all.iter().find(|p| !is_pointer(p)) {
        Some(bad) => Err(de::Error::custom(format!(
            "`{bad}` is not a JSON pointer (it starts with `/`)"
        ))),
        None => Ok(all),
    }
}

fn pointer<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let p = Option::<String>::deserialize(d)?;
    match p {
        Some(p) if !is_pointer(&p) => Err(de::Error::custom(format!(
            "`{p}` is not a JSON pointer (it starts with `/`)"
        ))),
        other => Ok(other),
    }
}

impl QualitySpec {
    /// A relative baseline path is taken from `base` (the bootstrap's directory), like a schema
    /// file's: a baseline lives beside the bootstrap that names it.
    pub(super) fn resolve(&mut self, base: Option<&Path>) {
        let Some(base) = base else {
            return;
        };
        for task in &mut self.tasks {
            if task.baseline.is_relative() {
                task.baseline = base.join(&task.baseline);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::parse_bootstrap;

    fn bootstrap(quality: &str) -> String {
        format!(
            "agent:\n  name: a\n  address: 127.0.0.1:8080\n  max_concurrency: 4\n  capabilities:\n    - name: summarize\n      quality: {quality}\n"
        )
    }

    #[test]
    fn baselines_live_beside_the_bootstrap_and_keys_are_checked() {
        let text = bootstrap(
            "{ interval: 10m, tasks: [{ path: /summarize, body: '{}', baseline: baselines/s-1.json, compare: { json_fields: [/title], text_field: /summary } }] }",
        );
        let parsed = parse_bootstrap(Path::new("/etc/reach/agent.yaml"), &text);
        let Ok(b) = parsed else { panic!("{parsed:?}") };
        let Some(q) = &b.agent.capabilities[0].quality else {
            panic!("no quality block")
        };
        assert_eq!(q.threshold, 0.8, "the default threshold");
        assert_eq!(q.tasks[0].method, "POST");
        assert_eq!(
            q.tasks[0].baseline,
            Path::new("/etc/reach/baselines/s-1.json")
        );
        for bad in [
            "{ tasks: [] }",
            "{ threshold: 1.5, tasks: [{ path: /s, baseline: b.json }] }",
            "{ tasks: [{ path: /s, baseline: b.json, compare: { json_fields: [title] } }] }",
            "{ tasks: [{ path: /s, baseline: b.json, compare: { text: /summary } }] }",
        ] {
            let parsed = parse_bootstrap(Path::new("agent.yaml"), &bootstrap(bad));
            assert!(parsed.is_err(), "{bad} was accepted");
        }
    }
}
