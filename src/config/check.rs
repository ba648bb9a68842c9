//! `agent-reach check`'s view of one config file: its kind, parsed as the sidecar would parse
//! it, with the settings that point outside the file (an escalation webhook, a key file, a task
//! store) checked too. What needs another module — the TLS files (`transport`), the golden
//! tasks' baselines (`quality`), the injector's file — the command adds (`src/bin/agent-reach/
//! commands/check.rs`), as those modules read config and config reads none of them.

use std::path::Path;

use super::{
    detect_kind, parse_bootstrap, parse_policy, read_file, Bootstrap, FileKind, FinalFallback,
    Policy, StoreLocation,
};

/// One file checked: a line for the person running `check`, and what it parsed to.
#[derive(Debug)]
pub struct Checked {
    pub summary: String,
    pub parsed: Parsed,
}

/// What a file parsed to; a bootstrap and a policy are kept for the checks that need both
/// ([`super::warnings::warnings`]).
#[derive(Debug)]
pub enum Parsed {
    Bootstrap(Box<Bootstrap>),
    Policy(Box<Policy>),
    /// The injector's file, for the injector to parse: its text.
    Injector(String),
}

/// Reads, recognizes and parses one file; the error names file:line:col where it can.
pub fn file(path: &Path) -> Result<Checked, String> {
    let text = read_file(path).map_err(|e| e.to_string())?;
    let kind = detect_kind(path, &text).map_err(|e| e.to_string())?;
    let mut summary = kind.as_str().to_owned();
    let parsed = match kind {
        FileKind::Bootstrap => {
            let bootstrap = parse_bootstrap(path, &text).map_err(|e| e.to_string())?;
            if let Some(tasks) = &bootstrap.tasks {
                let location = tasks
                    .resolved(path.parent())
                    .location()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                summary = match location {
                    StoreLocation::File(file) => {
                        format!("{summary}; tasks in {}", file.display())
                    }
                    StoreLocation::Redis(_) => format!("{summary}; tasks in Redis"),
                };
            }
            Parsed::Bootstrap(Box::new(bootstrap))
        }
        FileKind::Policy => {
            let policy = parse_policy(path, &text).map_err(|e| e.to_string())?;
            if let Some(note) = escalation(path, &policy)? {
                summary = format!("{summary}; {note}");
            }
            Parsed::Policy(Box::new(policy))
        }
        FileKind::Injector => Parsed::Injector(text),
    };
    Ok(Checked { summary, parsed })
}

/// The escalation settings as the runner will use them: a webhook URL it can POST to, a key
/// file it can read.
fn escalation(path: &Path, policy: &Policy) -> Result<Option<String>, String> {
    let escalation = &policy.escalation;
    if let Some(url) = &escalation.webhook {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("{}: escalation.webhook `{url}`: {e}", path.display()))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(format!(
                "{}: escalation.webhook `{url}` is not an http:// or https:// URL",
                path.display()
            ));
        }
    }
    if let Some(key) = escalation.key_path(path.parent()) {
        std::fs::metadata(&key).map_err(|e| {
            format!(
                "{}: escalation.key_file {}: {e}",
                path.display(),
                key.display()
            )
        })?;
    }
    let escalates = policy.retry.fallback.final_fallback == FinalFallback::Escalate;
    Ok(match (escalates, &escalation.webhook) {
        (true, None) => Some(
            "final_fallback: escalate without escalation.webhook: escalated tasks wait for `agent-reach tasks`"
                .to_owned(),
        ),
        (true, Some(_)) => Some("escalations go to the webhook".to_owned()),
        _ => None,
    })
}
