//! Per-pod overrides of the sidecar container the chart defines: its CPU and memory requests and
//! limits, and its log level — for the one agent that needs a bigger or chattier sidecar. Checked
//! at admission (a pod Kubernetes would refuse, or whose sidecar would ignore the value, is denied
//! with the reason), then written over the chart's container.

use serde_json::{json, Value};

use super::quantity::Quantity;

pub(super) const PROXY_CPU_REQUEST: &str = "agent-reach.io/proxy-cpu-request";
pub(super) const PROXY_CPU_LIMIT: &str = "agent-reach.io/proxy-cpu-limit";
pub(super) const PROXY_MEMORY_REQUEST: &str = "agent-reach.io/proxy-memory-request";
pub(super) const PROXY_MEMORY_LIMIT: &str = "agent-reach.io/proxy-memory-limit";
/// The sidecar's log filter: a level, or `target=level` directives.
pub(super) const LOG_LEVEL: &str = "agent-reach.io/log-level";

/// The environment variable the sidecar reads its log filter from (`--log`, src/bin/agent-reach/commands/mod.rs).
const LOG_ENV: &str = "AGENT_REACH_LOG";
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
const MAX_LOG_FILTER: usize = 512;

/// One annotated field of the container's `resources`.
struct Field {
    key: &'static str,
    bound: &'static str,
    resource: &'static str,
}

const FIELDS: [Field; 4] = [
    Field {
        key: PROXY_CPU_REQUEST,
        bound: "requests",
        resource: "cpu",
    },
    Field {
        key: PROXY_CPU_LIMIT,
        bound: "limits",
        resource: "cpu",
    },
    Field {
        key: PROXY_MEMORY_REQUEST,
        bound: "requests",
        resource: "memory",
    },
    Field {
        key: PROXY_MEMORY_LIMIT,
        bound: "limits",
        resource: "memory",
    },
];

/// What a pod's annotations change in its sidecar container.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct SidecarOverrides {
    /// `resources.<bound>.<resource>` = the annotated quantity, as written.
    resources: Vec<(&'static str, &'static str, String)>,
    log_level: Option<String>,
}

/// An annotation whose value cannot be used (the webhook's denial names it).
#[derive(Debug, PartialEq)]
pub(super) struct Invalid {
    pub(super) key: &'static str,
    pub(super) value: String,
    pub(super) problem: String,
}

impl SidecarOverrides {
    /// Reads and checks the annotations (`get`) against the chart's container (`sidecar`), whose
    /// resources fill in what the pod does not set when a request is compared with its limit.
    pub(super) fn from_annotations<'a>(
        get: impl Fn(&'static str) -> Option<&'a str>,
        sidecar: &Value,
    ) -> Result<Self, Invalid> {
        let invalid = |key, value: &str, problem: String| Invalid {
            key,
            value: value.to_owned(),
            problem,
        };
        let mut overrides = Self::default();
        for field in &FIELDS {
            if let Some(value) = get(field.key) {
                Quantity::parse(value).map_err(|e| invalid(field.key, value, e.to_string()))?;
                overrides
                    .resources
                    .push((field.bound, field.resource, value.to_owned()));
            }
        }
        for pair in FIELDS.chunks(2) {
            let [request, limit] = pair else { continue };
            let effective = |field: &Field| match get(field.key) {
                Some(v) => Some((v.to_owned(), field.key)),
                None => chart_value(sidecar, field).map(|v| (v, "the chart's sidecar.resources")),
            };
            let (Some((req, req_from)), Some((lim, lim_from))) =
                (effective(request), effective(limit))
            else {
                continue;
            };
            let (Ok(r), Ok(l)) = (Quantity::parse(&req), Quantity::parse(&lim)) else {
                continue;
            };
            if r > l {
                let resource = request.resource;
                return Err(if get(request.key).is_some() {
                    invalid(
                        request.key,
                        &req,
                        format!("is above the sidecar's {resource} limit `{lim}` ({lim_from})"),
                    )
                } else {
                    invalid(
                        limit.key,
                        &lim,
                        format!("is below the sidecar's {resource} request `{req}` ({req_from})"),
                    )
                });
            }
        }
        if let Some(filter) = get(LOG_LEVEL) {
            if !is_log_filter(filter) {
                return Err(invalid(
                    LOG_LEVEL,
                    filter,
                    "is not a log level (trace, debug, info, warn, error, off) or a list of `target=level` directives such as `info,agent_reach::gossip=debug`".to_owned(),
                ));
            }
            overrides.log_level = Some(filter.to_owned());
        }
        Ok(overrides)
    }

    /// Writes the overrides over the chart's container.
    pub(super) fn apply(&self, container: &mut Value) {
        for (bound, resource, value) in &self.resources {
            if !container["resources"].is_object() {
                container["resources"] = json!({});
            }
            if !container["resources"][bound].is_object() {
                container["resources"][bound] = json!({});
            }
            container["resources"][bound][resource] = json!(value);
        }
        if let Some(filter) = &self.log_level {
            let entry = json!({ "name": LOG_ENV, "value": filter });
            match container.get_mut("env").and_then(Value::as_array_mut) {
                // Every entry of that name (the chart's, and one in its extraEnv), valueFrom gone.
                Some(env) if env.iter().any(|e| e["name"] == LOG_ENV) => {
                    for e in env.iter_mut().filter(|e| e["name"] == LOG_ENV) {
                        *e = entry.clone();
                    }
                }
                Some(env) => env.push(entry),
                None => container["env"] = json!([entry]),
            }
        }
    }
}

/// The chart's value of a resource field, as text (`cpu: 1` is a number in the JSON).
fn chart_value(sidecar: &Value, field: &Field) -> Option<String> {
    match &sidecar["resources"][field.bound][field.resource] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `info`, or `warn,agent_reach::gossip=debug`: levels and `target=level` directives, the part
/// of the sidecar's env-filter syntax a pod needs. Span and field filters are refused, so a typo
/// is denied rather than read as a target name that silences everything.
fn is_log_filter(filter: &str) -> bool {
    let is_target = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':' || b == b'-')
    };
    !filter.is_empty()
        && filter.len() <= MAX_LOG_FILTER
        && filter
            .split(',')
            .all(|directive| match directive.split_once('=') {
                Some((target, level)) => is_target(target) && LEVELS.contains(&level),
                None => LEVELS.contains(&directive),
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filters_are_levels_or_target_directives() {
        for good in [
            "info",
            "debug",
            "off",
            "warn,agent_reach::gossip=debug",
            "hyper=warn",
        ] {
            assert!(is_log_filter(good), "{good}");
        }
        for bad in [
            "",
            "verbose",
            "INFO",
            "info,",
            "info debug",
            "=debug",
            "a=loud",
            "$(X)",
        ] {
            assert!(!is_log_filter(bad), "{bad}");
        }
        assert!(!is_log_filter("[span{x=1}]=debug"));
    }
}
