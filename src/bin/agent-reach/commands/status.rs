//! `agent-reach status`: a sidecar's `/status` in the terminal, a header line for the agent and
//! one line per peer as its caller sees it (like `linkerd viz stat`); `--watch` redraws, `--json`
//! prints the document as it came. A plain blocking HTTP/1.0 GET: no runtime, no TLS (the admin
//! port speaks plaintext on the pod's own network).

use std::fmt::Write as _;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use crate::blocking::{exchange, FetchError};
use agent_reach::reach::State;

/// The admin port's default address, as the bootstrap's default listener binds it.
const DEFAULT_ADMIN: &str = "http://127.0.0.1:4191";
/// How often `--watch` redraws.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// `agent-reach status`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The sidecar's admin address.
    #[arg(long, default_value = DEFAULT_ADMIN)]
    admin: String,
    /// Redraw every 2 s.
    #[arg(long)]
    watch: bool,
    /// Print the `/status` document as it is.
    #[arg(long)]
    json: bool,
}

/// Runs `agent-reach status`.
pub(crate) fn run(args: Args) -> ExitCode {
    let Args { admin, watch, json } = args;
    let admin = admin.as_str();
    let mut shown = false;
    loop {
        match fetch(admin) {
            Ok((text, doc)) => {
                let frame = if json { text } else { render(&doc) };
                // Clear the screen and home the cursor, then redraw.
                let clear = if watch { "\x1b[2J\x1b[H" } else { "" };
                let mut out = std::io::stdout().lock();
                let written =
                    writeln!(out, "{clear}{}", frame.trim_end()).and_then(|()| out.flush());
                // A reader that stopped reading (`status | head`) ends the command, quietly.
                if written.is_err() {
                    return ExitCode::SUCCESS;
                }
                shown = true;
            }
            // Said once and out: nothing answered, so there is nothing to watch.
            Err(err) if !shown => {
                eprintln!("agent-reach status: {err}");
                return ExitCode::FAILURE;
            }
            // While watching, a sidecar restarting is news, not the end.
            Err(err) => eprintln!("agent-reach status: {err}; retrying"),
        }
        if !watch {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

/// `GET <admin>/status`: the body as sent, and parsed.
fn fetch(admin: &str) -> Result<(String, Value), FetchError> {
    let (status, text, url) = exchange(admin, "GET", "/status", b"")?;
    if status != 200 {
        return Err(FetchError::Status { url, status });
    }
    let doc = serde_json::from_str(&text).map_err(|source| FetchError::Json {
        url: url.clone(),
        source,
    })?;
    Ok((text, doc))
}

/// The header line and the peer table.
fn render(doc: &Value) -> String {
    let mut out = String::new();
    let own = &doc["self"];
    let probe = match doc.get("last_probe").filter(|p| !p.is_null()) {
        None => "no probe yet".to_owned(),
        Some(p) if p["ok"].as_bool() == Some(true) => {
            format!("probe passed {} ago", secs(p["age_s"].as_f64()))
        }
        Some(p) => format!(
            "probe FAILED {} ago: {}",
            secs(p["age_s"].as_f64()),
            p["reason"].as_str().unwrap_or("unknown")
        ),
    };
    let _ = writeln!(
        out,
        "agent {} · {} · cap {} · saturation {} (predicted {}) · in flight {}/{} · queued {} · {} · config gen {} · v{}",
        text(&doc["agent"]["name"]),
        // An older sidecar's document has no `self_state`: its own `state` then.
        text(doc.get("self_state").unwrap_or(&own["state"])),
        pct(own["cap"].as_f64()),
        pct(own["saturation"].as_f64()),
        pct(own["saturation_predicted"].as_f64()),
        text(&doc["load"]["in_flight"]),
        text(&doc["load"]["limit"]),
        text(&doc["load"]["queued"]),
        probe,
        text(&doc["config_generation"]),
        text(&doc["version"]),
    );
    if let Some(b) = doc.get("model_budget") {
        let _ = writeln!(
            out,
            "model budget · headroom {} · {}",
            pct(b["headroom"].as_f64()),
            b["reason"].as_str().unwrap_or("unknown"),
        );
    }
    for q in doc["quality"].as_array().into_iter().flatten() {
        let differing: Vec<&str> = q["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|t| {
                let differs = t["differing"].as_array().into_iter().flatten();
                differs.chain(t.get("error")).filter_map(Value::as_str)
            })
            .collect();
        let _ = writeln!(
            out,
            "golden tasks {} · similarity {} (threshold {}){} · {} ago{}",
            text(&q["capability"]),
            pct(q["similarity"].as_f64()),
            pct(q["threshold"].as_f64()),
            if q["degraded"].as_bool() == Some(true) {
                " DEGRADED"
            } else {
                ""
            },
            secs(q["age_s"].as_f64()),
            if differing.is_empty() {
                String::new()
            } else {
                format!(" · differs: {}", differing.join(", "))
            },
        );
    }
    if let Some(e) = doc.get("reload_error").filter(|e| !e.is_null()) {
        let _ = writeln!(
            out,
            "config reload rejected ({}): {}",
            text(&e["file"]),
            text(&e["message"])
        );
    }
    let pending: Vec<String> = doc["pending_restart"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| format!("{}: {}", text(&p["file"]), text(&p["key"])))
                .collect()
        })
        .unwrap_or_default();
    if !pending.is_empty() {
        let _ = writeln!(
            out,
            "config changes waiting for a restart: {}",
            pending.join(", ")
        );
    }
    let mut peers: Vec<&Value> = doc["peer_views"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    peers.sort_by(|a, b| {
        let rank = |p: &Value| {
            serde_json::from_value::<State>(p["effective_state"].clone())
                .map_or(u8::MAX, agent_reach::admin::severity)
        };
        rank(a)
            .cmp(&rank(b))
            .then_with(|| text(&a["name"]).cmp(&text(&b["name"])))
    });
    let mut rows = vec![[
        "PEER",
        "STATE",
        "CAP",
        "SCORE",
        "SUCCESS",
        "P50",
        "P95",
        "LAST TRANSITION",
    ]
    .map(str::to_owned)];
    for p in &peers {
        rows.push(peer_row(p));
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if peers.is_empty() {
        let _ = writeln!(out, "(no peer scored yet)");
    }
    tools(doc, &mut out);
    out
}

/// One line per MCP tool: each server that has it, and how its tool stands in this caller's
/// view (`docs/mcp.md`).
fn tools(doc: &Value, out: &mut String) {
    for t in doc["tools"].as_array().into_iter().flatten() {
        let servers: Vec<String> = t["servers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                let failures = s["failures"].as_u64().unwrap_or(0);
                let state = match s["state"].as_str() {
                    Some("paused") => format!("PAUSED {}", secs(s["paused_for_s"].as_f64())),
                    other => other.unwrap_or("-").to_owned(),
                };
                match failures {
                    0 => format!("{} {state}", text(&s["server"])),
                    n => format!("{} {state} ({n} failures)", text(&s["server"])),
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "tool {}/{} · {}",
            text(&t["capability"]),
            text(&t["tool"]),
            servers.join(" · ")
        );
    }
}

fn peer_row(p: &Value) -> [String; 8] {
    let o = &p["outcomes"];
    let count = |k: &str| o[k].as_u64().unwrap_or(0);
    let judged = ["success", "failure", "timeout", "refused", "unreachable"]
        .iter()
        .map(|k| count(k))
        .sum::<u64>();
    let success = if judged == 0 {
        "-".to_owned()
    } else {
        format!(
            "{:.1}% ({}/{judged})",
            count("success") as f64 * 100.0 / judged as f64,
            count("success")
        )
    };
    let mut why = Vec::new();
    let own = &p["self_view"];
    if !own.is_null() {
        let own_state = text(&own["view"]["state"]);
        if own_state == text(&p["effective_state"]) && own_state != text(&p["view"]["state"]) {
            why.push(format!("own view {own_state}"));
        }
        let probe = &own["last_probe"];
        if probe["ok"].as_bool() == Some(false) {
            why.push(format!(
                "its probe failed: {}",
                probe["reason"].as_str().unwrap_or("unknown")
            ));
        }
        let quality = &own["view"]["quality"];
        if quality["degraded"].as_bool() == Some(true) {
            why.push(format!(
                "its answers drift: similarity {:.2}",
                quality["similarity"].as_f64().unwrap_or(0.0)
            ));
        }
    }
    if let Some(t) = p.get("last_transition").filter(|t| !t.is_null()) {
        why.push(format!(
            "{}→{} {} ago ({})",
            text(&t["from"]),
            text(&t["to"]),
            secs(t["age_s"].as_f64()),
            text(&t["reason"])
        ));
    }
    let last = if why.is_empty() {
        "-".to_owned()
    } else {
        why.join("; ")
    };
    let state = text(&p["effective_state"]);
    let degraded = own["view"]["quality"]["degraded"].as_bool() == Some(true);
    [
        text(&p["name"]),
        if degraded && state == "healthy" {
            "degraded".to_owned()
        } else {
            state
        },
        pct(p["effective_cap"].as_f64()),
        p["last_score"]
            .as_f64()
            .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
        success,
        ms(p["view"]["p50_ms"].as_f64()),
        ms(p["view"]["p95_ms"].as_f64()),
        last,
    ]
}

/// A JSON scalar as text; `-` when absent.
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn pct(x: Option<f64>) -> String {
    x.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{:.0}%", x * 100.0))
}

fn ms(x: Option<f64>) -> String {
    match x.filter(|x| x.is_finite()) {
        Some(x) if x >= 1000.0 => format!("{:.2}s", x / 1000.0),
        Some(x) => format!("{x:.1}ms"),
        None => "-".to_owned(),
    }
}

fn secs(x: Option<f64>) -> String {
    match x.filter(|x| x.is_finite()) {
        Some(x) if x >= 3600.0 => format!("{:.1}h", x / 3600.0),
        Some(x) if x >= 60.0 => format!("{:.0}m", x / 60.0),
        Some(x) => format!("{x:.0}s"),
        None => "?".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mcp_tool_names_its_servers_and_their_state() {
        let doc = serde_json::json!({
            "tools": [{ "capability": "mcp", "tool": "search", "servers": [
                { "server": "a", "state": "paused", "failures": 3, "paused_for_s": 4.2 },
                { "server": "b", "state": "healthy", "failures": 0 },
            ] }]
        });
        let out = render(&doc);
        assert!(
            out.contains("tool mcp/search · a PAUSED 4s (3 failures) · b healthy"),
            "{out}"
        );
    }

    #[test]
    fn changes_waiting_for_a_restart_are_named() {
        let doc = serde_json::json!({
            "agent": { "name": "caller" },
            "self": { "state": "healthy", "cap": 1.0, "saturation": 0.0 },
            "load": { "in_flight": 0, "queued": 0, "limit": 4 },
            "pending_restart": [
                { "key": "pool.max_idle_per_host", "file": "policy", "since_unix_ms": 1 },
                { "key": "gossip.probe_interval", "file": "bootstrap", "since_unix_ms": 2 }
            ]
        });
        let out = render(&doc);
        assert!(
            out.contains("config changes waiting for a restart: policy: pool.max_idle_per_host, bootstrap: gossip.probe_interval"),
            "{out}"
        );
        let none =
            render(&serde_json::json!({ "agent": { "name": "caller" }, "pending_restart": [] }));
        assert!(!none.contains("waiting for a restart"), "{none}");
    }

    #[test]
    fn problems_come_first_in_the_table() {
        let doc = serde_json::json!({
            "agent": { "name": "caller" },
            "self": { "state": "healthy", "cap": 1.0, "saturation": 0.0 },
            "load": { "in_flight": 0, "queued": 0, "limit": 4 },
            "config_generation": 1,
            "version": "0.1.0",
            "peer_views": [
                { "name": "a", "effective_state": "healthy", "effective_cap": 1.0,
                  "view": { "state": "healthy", "p50_ms": 2.0, "p95_ms": 4.0 },
                  "outcomes": { "success": 9, "failure": 1 } },
                { "name": "b", "effective_state": "ejected", "effective_cap": 0.0,
                  "view": { "state": "healthy" },
                  "self_view": { "view": { "state": "ejected" },
                                 "last_probe": { "ok": false, "reason": "status 429" } } }
            ]
        });
        let out = render(&doc);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("agent caller · healthy"), "{out}");
        assert!(lines[1].starts_with("PEER"), "{out}");
        assert!(lines[2].starts_with("b "), "{out}");
        assert!(
            lines[2].contains("own view ejected; its probe failed: status 429"),
            "{out}"
        );
        assert!(lines[3].contains("90.0% (9/10)"), "{out}");
    }

    #[test]
    fn a_drifting_agent_shows_degraded_with_what_differs() {
        let doc = serde_json::json!({
            "agent": { "name": "drifter" },
            "self": { "state": "healthy", "cap": 0.5, "quality": { "similarity": 0.25, "degraded": true } },
            "self_state": "degraded",
            "quality": [{ "capability": "summarize", "similarity": 0.25, "threshold": 0.8,
                          "degraded": true, "age_s": 3.0,
                          "tasks": [{ "differing": ["/language", "/summary"] }] }],
            "load": { "in_flight": 0, "queued": 0, "limit": 4 },
            "peer_views": [
                { "name": "a", "effective_state": "healthy", "effective_cap": 0.5,
                  "view": { "state": "healthy" },
                  "self_view": { "view": { "state": "healthy",
                                           "quality": { "similarity": 0.25, "degraded": true } } } }
            ]
        });
        let out = render(&doc);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("agent drifter · degraded · cap 50%"),
            "{out}"
        );
        assert_eq!(
            lines[1],
            "golden tasks summarize · similarity 25% (threshold 80%) DEGRADED · 3s ago · differs: /language, /summary"
        );
        assert!(
            lines[3].starts_with("a  ") && lines[3].contains("degraded"),
            "{out}"
        );
        assert!(
            lines[3].contains("its answers drift: similarity 0.25"),
            "{out}"
        );
    }

    #[test]
    fn an_agent_short_of_model_budget_shows_budget_limited_with_the_reason() {
        let doc = serde_json::json!({
            "agent": { "name": "coder-2" },
            "self": { "state": "healthy", "cap": 1.0 },
            "self_state": "budget-limited",
            "model_budget": { "headroom": 0.25, "reset_in_s": 41.0,
                              "reason": "openai: requests 2/10 left, resets in 41s" },
            "load": { "in_flight": 0, "queued": 0, "limit": 4 },
            "peer_views": []
        });
        let out = render(&doc);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("agent coder-2 · budget-limited"),
            "{out}"
        );
        assert_eq!(
            lines[1],
            "model budget · headroom 25% · openai: requests 2/10 left, resets in 41s"
        );
    }
}
