//! Secret headers are never shown: wherever the sidecar shows or logs a header it was given
//! (a probe's `authorization`, in `/status` on an admin port that listens on every address),
//! the value is replaced. One list, plus whatever the policy adds (`redact_headers`).

use std::collections::BTreeMap;

use crate::config::AgentProfile;

/// Headers whose values are secrets in every deployment: the model providers' keys among them
/// (`x-api-key` Anthropic's, `api-key` Azure OpenAI's, `x-goog-api-key` Gemini's).
pub const SENSITIVE: [&str; 7] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
];

/// What a redacted value shows.
pub const MASK: &str = "[redacted]";

/// Whether `name` is a secret header: one of [`SENSITIVE`] or of `extra`, case-insensitively.
pub fn is_sensitive(name: &str, extra: &[String]) -> bool {
    SENSITIVE
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .any(|s| s.eq_ignore_ascii_case(name))
}

/// Masks the secret values of a header map.
pub fn headers(map: &mut BTreeMap<String, String>, extra: &[String]) {
    for (name, value) in map.iter_mut() {
        if is_sensitive(name, extra) {
            *value = MASK.to_owned();
        }
    }
}

/// A profile fit to show: every probe's secret headers masked.
pub fn profile(agent: &AgentProfile, extra: &[String]) -> AgentProfile {
    let mut shown = agent.clone();
    for probe in shown
        .capabilities
        .iter_mut()
        .filter_map(|c| c.probe.as_mut())
    {
        headers(&mut probe.headers, extra);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_and_configured_names_are_masked_whatever_their_case() {
        let mut map = BTreeMap::from([
            ("Authorization".to_owned(), "Bearer s3cret".to_owned()),
            ("x-tenant-token".to_owned(), "t0ken".to_owned()),
            ("accept".to_owned(), "application/json".to_owned()),
        ]);
        headers(&mut map, &["X-Tenant-Token".to_owned()]);
        assert_eq!(map["Authorization"], MASK);
        assert_eq!(map["x-tenant-token"], MASK);
        assert_eq!(map["accept"], "application/json");
    }

    #[test]
    fn the_model_providers_keys_are_masked() {
        let mut map: BTreeMap<String, String> = [
            "Authorization",
            "x-api-key",
            "api-key",
            "X-Goog-Api-Key",
            "anthropic-version",
        ]
        .iter()
        .map(|n| ((*n).to_owned(), "sk-secret".to_owned()))
        .collect();
        headers(&mut map, &[]);
        let shown: Vec<&str> = map.values().map(String::as_str).collect();
        assert_eq!(shown.iter().filter(|v| **v == MASK).count(), 4, "{map:?}");
        assert_eq!(map["anthropic-version"], "sk-secret");
    }
}
