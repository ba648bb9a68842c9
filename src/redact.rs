//! Secret headers are never shown: wherever the sidecar shows or logs a header it was given
//! (a probe's `authorization`, in `/status` on an admin port that listens on every address),
//! the value is replaced. One list, plus whatever the policy adds (`redact_headers`).

use std::collections::BTreeMap;

use crate::config::AgentProfile;

/// Headers whose values are secrets in every deployment: the model providers' keys among them
/// (`x-api-key` Anthropic's, `api-key` Azure OpenAI's, `x-goog-api-key` Gemini's).
pub(crate) const SENSITIVE: [&str; 7] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
];

/// What a redacted value shows.
pub(crate) const MASK: &str = "[redacted]";

/// Whether `name` is a secret header: one of [`SENSITIVE`] or of `extra`, case-insensitively.
pub(crate) fn is_sensitive(name: &str, extra: &[String]) -> bool {
    SENSITIVE
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .any(|s| s.eq_ignore_ascii_case(name))
}

/// A URL as it may be shown or logged: its userinfo (`user:password@`) and every query value
/// (`?token=…`) masked, the rest kept so the reader still knows where it points.
pub(crate) fn url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://{MASK}@{host}{path}"),
                None => base.to_owned(),
            }
        }
        None => base.to_owned(),
    };
    if let Some(query) = query {
        let masked: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}={MASK}"),
                None => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&masked.join("&"));
    }
    out
}

/// Masks the secret values of a header map.
pub(crate) fn headers(map: &mut BTreeMap<String, String>, extra: &[String]) {
    for (name, value) in map.iter_mut() {
        if is_sensitive(name, extra) {
            *value = MASK.to_owned();
        }
    }
}

/// A profile fit to show: every probe's secret headers masked.
pub(crate) fn profile(agent: &AgentProfile, extra: &[String]) -> AgentProfile {
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

    #[test]
    fn a_urls_userinfo_and_query_values_are_masked() {
        assert_eq!(
            url("https://ops:hunter2@hooks.example/escalate?token=s3cret&team=a"),
            "https://[redacted]@hooks.example/escalate?token=[redacted]&team=[redacted]"
        );
        assert_eq!(
            url("http://collector:4318/v1/traces"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(url("not a url?x"), "not a url?x");
    }
}
