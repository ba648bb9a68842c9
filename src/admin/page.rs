//! The status page at the admin port's `/`: one server-rendered HTML document, problems first.
//! No external script, font or stylesheet (an admin port may have no way out, and a page must
//! not phone home); the only script refreshes the page in place. Everything that came from
//! config, peers or gossip is escaped.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::history::{Sample, SAMPLE_EVERY};
use super::{severity, Status};
use crate::peers::PeerStatus;
use crate::reach::State;

/// The page, from one `/status` document and the sparklines' history.
pub(super) fn render(status: &Status, history: &BTreeMap<String, Vec<Sample>>) -> String {
    let mut peers: Vec<&PeerStatus> = status.peer_views.iter().collect();
    peers.sort_by(|a, b| {
        severity(a.effective_state)
            .cmp(&severity(b.effective_state))
            .then_with(|| a.name.cmp(&b.name))
    });
    let name = esc(status.agent.name.as_str());
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{name} · agent-reach</title><style>{CSS}</style></head><body>\
         <header><h1><span class=\"brand\">agent-reach</span> {name}</h1>\
         <span class=\"meta\">v{version} · config generation {generation} · {ready}</span>\
         <label class=\"refresh\"><input type=\"checkbox\" id=\"auto\" checked> refresh every 5 s\
         </label><span id=\"stale\" class=\"meta\"></span></header><main>",
        version = esc(status.version),
        generation = status.config_generation,
        ready = if status.ready {
            "ready"
        } else {
            "<b class=\"bad\">not ready</b>"
        },
    );
    problems(&mut out, status, &peers);
    this_agent(&mut out, status);
    peer_table(&mut out, &peers, history);
    transitions(&mut out, status);
    outcomes(&mut out, &peers);
    observe(&mut out, status);
    tools(&mut out, &status.tools);
    chains(&mut out, status);
    gossip(&mut out, status);
    config(&mut out, status);
    out.push_str(
        "</main><footer>JSON: <a href=\"/status\">/status</a> · \
         <a href=\"/metrics\">/metrics</a> · <a href=\"/?format=text\">index</a></footer>",
    );
    let _ = writeln!(out, "<script>{SCRIPT}</script></body></html>");
    out
}

/// Everything wrong, in one list at the top.
fn problems(out: &mut String, status: &Status, peers: &[&PeerStatus]) {
    let mut items = Vec::new();
    let own = status.self_view.state;
    if severity(own) < severity(State::Parole) {
        let mut line = format!("This agent is {}", pill(own));
        if let Some(reason) = status.last_probe.as_ref().and_then(|p| p.reason.as_deref()) {
            let _ = write!(line, ": last probe failed: {}", esc(reason));
        }
        items.push(line);
    }
    for p in peers {
        if severity(p.effective_state) >= severity(State::Parole) {
            break;
        }
        let why = why(p);
        let mut line = format!("<b>{}</b> is {}", esc(&p.name), pill(p.effective_state));
        if !why.is_empty() {
            let _ = write!(line, ": {}", why.join("; "));
        }
        items.push(line);
    }
    if let Some(e) = &status.reload_error {
        items.push(format!(
            "The {} file was not reloaded (the running config stays): {}",
            esc(e.file),
            esc(&e.message)
        ));
    }
    if !status.pending_restart.is_empty() {
        items.push(format!(
            "Changed keys that need a restart (they keep their running values): {}",
            pending_keys(status)
        ));
    }
    if !status.ready {
        items.push("This sidecar is not ready (starting or draining).".to_owned());
    }
    if items.is_empty() {
        let healthy = peers
            .iter()
            .filter(|p| p.effective_state == State::Healthy)
            .count();
        let _ = write!(
            out,
            "<section class=\"ok-banner\" id=\"problems\">All clear: this agent is {} and \
             {healthy} of {} peers are healthy.</section>",
            pill(own),
            peers.len()
        );
        return;
    }
    let _ = write!(
        out,
        "<section class=\"problems\" id=\"problems\"><h2>Problems ({})</h2><ul>",
        items.len()
    );
    for item in items {
        let _ = write!(out, "<li>{item}</li>");
    }
    out.push_str("</ul></section>");
}

/// Why a peer is where it is: its own view when that is what limits it (gossip carries the
/// state, not the reason: the peer's own page has that), this caller's last transition when
/// this caller's view is what limits it, and what this caller's calls on it came to.
fn why(p: &PeerStatus) -> Vec<String> {
    let mut why = Vec::new();
    let own = p.self_view.as_ref();
    if let Some(own) = own {
        if own.view.state != p.view.state && p.effective_state == own.view.state {
            why.push(format!(
                "its own view: {} for {}",
                own.view.state.as_str(),
                duration(own.view.state_age_s)
            ));
        }
        if let Some(probe) = own.last_probe.as_ref().filter(|probe| !probe.ok) {
            why.push(format!(
                "its last probe failed: {}",
                esc(probe.reason.as_deref().unwrap_or("unknown"))
            ));
        }
    }
    let limited_here = own.is_none_or(|own| own.view.cap >= p.view.cap);
    if let Some(t) = p.last_transition.as_ref().filter(|_| limited_here) {
        why.push(format!(
            "this caller: {} → {} {}: {}",
            t.from.as_str(),
            t.to.as_str(),
            age(t.age_s),
            esc(t.reason)
        ));
    }
    let o = &p.outcomes;
    let bad: Vec<String> = [
        (o.refused, "refused (429)"),
        (o.failure, "failed"),
        (o.timeout, "timed out"),
        (o.unreachable, "unreachable"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if !bad.is_empty() && p.effective_state != State::Healthy {
        why.push(format!("this caller's calls: {}", bad.join(", ")));
    }
    why
}

fn this_agent(out: &mut String, status: &Status) {
    let v = &status.self_view;
    let e = &v.estimates;
    let probe = match &status.last_probe {
        None => "none yet".to_owned(),
        Some(p) if p.ok => format!(
            "<span class=\"good\">passed</span> ({}, {}, {})",
            esc(&p.capability),
            ms(Some(p.latency_ms)),
            age(p.age_s)
        ),
        Some(p) => format!(
            "<span class=\"bad\">failed: {}</span> ({}, {})",
            esc(p.reason.as_deref().unwrap_or("unknown")),
            esc(&p.capability),
            age(p.age_s)
        ),
    };
    let i = &status.inbound;
    let _ = write!(
        out,
        "<section id=\"self\"><h2>This agent</h2><div class=\"cards\">\
         <div class=\"card\"><div class=\"k\">state</div><div class=\"v\">{state}</div>\
         <div class=\"s\">for {since}</div></div>\
         <div class=\"card\"><div class=\"k\">cap</div><div class=\"v\">{cap}</div>{capbar}</div>\
         <div class=\"card\"><div class=\"k\">saturation</div><div class=\"v\">{sat}</div>{satbar}\
         <div class=\"s\">predicted {sat_predicted}</div></div>\
         <div class=\"card\"><div class=\"k\">in flight / limit</div>\
         <div class=\"v\">{in_flight} / {limit}</div><div class=\"s\">{queued} queued</div></div>\
         <div class=\"card\"><div class=\"k\">availability</div><div class=\"v\">{avail}</div></div>\
         <div class=\"card\"><div class=\"k\">served (inbound)</div><div class=\"v\">{served} / {requests}</div>\
         <div class=\"s\">p50 {p50} · p95 {p95} · {failures} failed · {timeouts} timed out · {rejected} turned away</div></div>\
         <div class=\"card wide\"><div class=\"k\">last probe</div><div class=\"v small\">{probe}</div></div>\
         {quality}</div></section>",
        state = shown_pill(status),
        quality = quality_card(status),
        since = duration(v.state_age_s),
        cap = pct(v.cap),
        capbar = bar(v.cap, false),
        sat = pct(e.saturation),
        satbar = bar(e.saturation, true),
        sat_predicted = pct(e.saturation_predicted),
        in_flight = status.load.in_flight,
        limit = status.load.limit,
        queued = status.load.queued,
        avail = pct(e.availability),
        served = i.successes,
        requests = i.requests,
        p50 = ms(Some(i.p50_ms)),
        p95 = ms(Some(i.p95_ms)),
        failures = i.failures,
        timeouts = i.timeouts,
        rejected = i.rejected,
    );
}

fn peer_table(out: &mut String, peers: &[&PeerStatus], history: &BTreeMap<String, Vec<Sample>>) {
    let _ = write!(
        out,
        "<section id=\"peers\"><h2>Peers as this caller sees them ({})</h2>",
        peers.len()
    );
    if peers.is_empty() {
        out.push_str("<p class=\"empty\">No peer scored yet.</p></section>");
        return;
    }
    let window = SAMPLE_EVERY.as_secs();
    let _ = write!(
        out,
        "<table class=\"peers\"><thead><tr><th>peer</th><th>state</th><th>cap</th>\
         <th>score</th><th>p50 / p95</th><th>success</th>\
         <th title=\"one point per {window} s, 15 minutes\">success, 15 min</th>\
         <th title=\"one point per {window} s, 15 minutes\">p95, 15 min</th><th>why / last transition</th>\
         </tr></thead><tbody>"
    );
    for p in peers {
        let e = &p.view.estimates;
        let samples = history.get(&p.name).map_or(&[][..], Vec::as_slice);
        let judged = p.outcomes.judged();
        let success = if judged == 0 {
            "<span class=\"muted\">no calls</span>".to_owned()
        } else {
            format!(
                "{} <span class=\"muted\">{}/{}</span>",
                pct(p.outcomes.success as f64 / judged as f64),
                p.outcomes.success,
                judged
            )
        };
        let views = match &p.self_view {
            Some(own) => format!(
                "caller {} · own {}",
                p.view.state.as_str(),
                own.view.state.as_str()
            ),
            None => format!("caller {} · own unknown", p.view.state.as_str()),
        };
        let factors = format!(
            "availability {} · saturation {}{}{}",
            pct(e.availability),
            // What the last score used (the peer's prediction included), else what is known now.
            pct(p.last_factors.map(|f| f.saturation).unwrap_or_else(|| p
                .self_view
                .as_ref()
                .map_or(e.saturation, |s| s
                    .view
                    .estimates
                    .saturation
                    .max(e.saturation)))),
            if e.cooling_down {
                " · cooling down"
            } else {
                ""
            },
            if e.stale { " · stale" } else { "" },
        );
        let why = why(p);
        let why = if why.is_empty() {
            "<span class=\"muted\">—</span>".to_owned()
        } else {
            why.join("<br>")
        };
        let _ = write!(
            out,
            "<tr class=\"row-{state}\" data-peer=\"{name}\" data-state=\"{state}\">\
             <td><b>{name}</b><div class=\"muted\">{address}</div></td>\
             <td>{pill}<div class=\"muted\">{views} · {since}</div></td>\
             <td>{cap}{capbar}</td>\
             <td>{score}<div class=\"muted\">{factors}</div></td>\
             <td>{p50} / {p95}</td><td>{success}</td>\
             <td>{spark_sr}</td><td>{spark_p95}</td><td class=\"why\">{why}</td></tr>",
            state = p.effective_state.as_str(),
            name = esc(&p.name),
            address = esc(&p.address),
            pill = peer_pill(p),
            since = duration(p.view.state_age_s),
            cap = pct(p.effective_cap),
            capbar = bar(p.effective_cap, false),
            score = p
                .last_score
                .map_or_else(|| "—".to_owned(), |s| format!("{s:.2}")),
            p50 = ms(e.p50_ms),
            p95 = ms(e.p95_ms),
            spark_sr = sparkline(samples, |s| s.success_rate, Some(1.0), "success rate"),
            spark_p95 = sparkline(samples, |s| s.p95_ms, None, "p95 ms"),
        );
    }
    out.push_str("</tbody></table></section>");
}

fn transitions(out: &mut String, status: &Status) {
    let _ = write!(
        out,
        "<section id=\"transitions\"><h2>Last state transitions ({})</h2>",
        status.transitions.len()
    );
    if status.transitions.is_empty() {
        out.push_str("<p class=\"empty\">None since start.</p></section>");
        return;
    }
    out.push_str(
        "<table><thead><tr><th>when</th><th>view</th><th>agent</th><th>from → to</th>\
         <th>reason</th></tr></thead><tbody>",
    );
    for t in &status.transitions {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} → {}</td><td>{}</td></tr>",
            age(t.age_s),
            if t.view == "self" {
                "own"
            } else {
                "this caller's"
            },
            esc(&t.agent),
            pill(t.from),
            pill(t.to),
            esc(t.reason)
        );
    }
    out.push_str("</tbody></table></section>");
}

/// What this caller's calls came to, per peer: the routing outcome counters.
fn outcomes(out: &mut String, peers: &[&PeerStatus]) {
    if peers.is_empty() {
        return;
    }
    out.push_str(
        "<section id=\"outcomes\"><h2>This caller's attempts by outcome</h2><table><thead><tr>\
         <th>peer</th><th class=\"num\">served</th><th class=\"num\">failed</th>\
         <th class=\"num\">timed out</th><th class=\"num\">refused</th>\
         <th class=\"num\">shed</th><th class=\"num\">unreachable</th></tr></thead><tbody>",
    );
    for p in peers {
        let o = &p.outcomes;
        let cell = |n: u64, bad: bool| {
            if n > 0 && bad {
                format!("<td class=\"num bad\">{n}</td>")
            } else {
                format!("<td class=\"num\">{n}</td>")
            }
        };
        let _ = write!(
            out,
            "<tr><td>{}</td>{}{}{}{}{}{}</tr>",
            esc(&p.name),
            cell(o.success, false),
            cell(o.failure, true),
            cell(o.timeout, true),
            cell(o.refused, true),
            cell(o.shed, false),
            cell(o.unreachable, true),
        );
    }
    out.push_str("</tbody></table></section>");
}

/// Observe-only comparisons: rendered from `/status`'s `observe` field when the sidecar has one
/// (observe-only mode, `docs/reach-model.md`), as a table per capability or as JSON.
fn observe(out: &mut String, status: &Status) {
    let Some(observe) = &status.observe else {
        return;
    };
    let doc = serde_json::to_value(observe).unwrap_or_default();
    out.push_str("<section id=\"observe\"><h2>Observe-only: what the model would have done</h2>");
    json_table(out, &doc);
    out.push_str("</section>");
}

/// MCP tools (`docs/mcp.md`): each tool's servers and how each one's tool stands in this
/// caller's view; shown once some member announces tools.
fn tools(out: &mut String, tools: &[crate::outbound::ToolStatus]) {
    if tools.is_empty() {
        return;
    }
    out.push_str(
        "<section id=\"tools\"><h2>MCP tools</h2><table><thead><tr><th>capability</th>\
         <th>tool</th><th>servers</th></tr></thead><tbody>",
    );
    for t in tools {
        let servers: Vec<String> = t
            .servers
            .iter()
            .map(|s| {
                let name = esc(&s.server);
                match (s.state, s.failures) {
                    ("paused", n) => format!(
                        "<span class=\"bad\">{name} paused {}</span> ({n} failures)",
                        duration(s.paused_for_s.unwrap_or(0.0))
                    ),
                    ("trial", n) => {
                        format!("<span class=\"warn\">{name} on trial</span> ({n} failures)")
                    }
                    (_, 0) => format!("<span class=\"good\">{name}</span>"),
                    (_, n) => format!("<span class=\"warn\">{name}</span> ({n} failures)"),
                }
            })
            .collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&t.capability),
            esc(&t.tool),
            servers.join(" · ")
        );
    }
    out.push_str("</tbody></table></section>");
}

/// Delegation chains and hedging (`docs/chains.md`): shown once anything happened.
fn chains(out: &mut String, status: &Status) {
    let c = &status.chains;
    if *c == crate::metrics::ChainCounts::default() {
        return;
    }
    let _ = write!(
        out,
        "<section id=\"chains\"><h2>Delegation chains and hedges</h2><p>refused as a loop: {} · \
         past chains.max_hops: {} · hedges won: {} · lost: {} · not sent (retry budget spent): {}</p></section>",
        c.loops_refused, c.max_hops_refused, c.hedges_won, c.hedges_lost, c.hedges_no_budget
    );
}

/// An object of objects as a table (a row per key), anything else as escaped JSON.
fn json_table(out: &mut String, value: &serde_json::Value) {
    let rows = value
        .as_object()
        .filter(|o| !o.is_empty() && o.values().all(serde_json::Value::is_object));
    let Some(rows) = rows else {
        let text = serde_json::to_string_pretty(value).unwrap_or_default();
        let _ = write!(out, "<pre>{}</pre>", esc(&text));
        return;
    };
    let mut columns: Vec<&str> = Vec::new();
    for row in rows.values().filter_map(serde_json::Value::as_object) {
        for key in row.keys() {
            if !columns.contains(&key.as_str()) {
                columns.push(key);
            }
        }
    }
    out.push_str("<table><thead><tr><th></th>");
    for c in &columns {
        let _ = write!(out, "<th>{}</th>", esc(&c.replace('_', " ")));
    }
    out.push_str("</tr></thead><tbody>");
    for (key, row) in rows {
        let _ = write!(out, "<tr><td><b>{}</b></td>", esc(key));
        for c in &columns {
            let cell = match row.get(*c) {
                None | Some(serde_json::Value::Null) => "—".to_owned(),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Number(n)) => match n.as_f64() {
                    Some(x) if n.is_f64() => format!("{x:.3}"),
                    _ => n.to_string(),
                },
                Some(other) => other.to_string(),
            };
            let _ = write!(out, "<td>{}</td>", esc(&cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

fn gossip(out: &mut String, status: &Status) {
    let Some(g) = &status.gossip else {
        out.push_str(
            "<section id=\"gossip\"><h2>Gossip</h2><p class=\"empty\">Off: peers come from \
             the bootstrap.</p></section>",
        );
        return;
    };
    let _ = write!(
        out,
        "<section id=\"gossip\"><h2>Gossip members ({} alive · {} suspect · {} down)</h2>\
         <table><thead><tr><th>member</th><th>liveness</th><th>state</th><th>gossip</th>\
         <th>inbound</th><th>version</th><th>last heard</th></tr></thead><tbody>",
        g.alive, g.suspect, g.down
    );
    for m in &g.members {
        let liveness = match m.liveness {
            "alive" => "good",
            "suspect" => "warn",
            _ => "bad",
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"{liveness}\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            esc(&m.name),
            esc(m.liveness),
            m.state.map_or_else(|| "—".to_owned(), pill),
            esc(&m.gossip.to_string()),
            esc(m.inbound.as_deref().unwrap_or("—")),
            esc(m.version.as_deref().unwrap_or("—")),
            age(m.last_seen_s),
        );
    }
    out.push_str("</tbody></table></section>");
}

fn config(out: &mut String, status: &Status) {
    let pending = if status.pending_restart.is_empty() {
        "<span class=\"good\">none</span>".to_owned()
    } else {
        format!("<span class=\"bad\">{}</span>", pending_keys(status))
    };
    let reload = match &status.reload_error {
        None => "<span class=\"good\">none</span>".to_owned(),
        Some(e) => format!(
            "<span class=\"bad\">{}: {}</span>",
            esc(e.file),
            esc(&e.message)
        ),
    };
    let _ = write!(
        out,
        "<section id=\"config\"><h2>Config</h2><table class=\"kv\"><tbody>\
         <tr><th>generation</th><td>{}</td></tr>\
         <tr><th>last reload error</th><td>{reload}</td></tr>\
         <tr><th>pending restart</th><td>{pending}</td></tr>\
         <tr><th>decision log</th><td>{}</td></tr>\
         <tr><th>idempotency store</th><td>{} keys · {} bytes</td></tr>\
         </tbody></table></section>",
        status.config_generation,
        if status.policy.decision_log {
            "on"
        } else {
            "off"
        },
        status.idempotency.keys,
        status.idempotency.bytes,
    );
}

/// The pending restart-only keys as `file: key`, escaped.
fn pending_keys(status: &Status) -> String {
    let keys: Vec<String> = status
        .pending_restart
        .iter()
        .map(|p| format!("{}: {}", esc(p.file), esc(&p.key)))
        .collect();
    keys.join(", ")
}

/// An inline SVG line of `value` over the samples; gaps where a sample has none. `top` fixes the
/// scale's top (a rate's 1.0); otherwise it is the largest value shown.
fn sparkline(
    samples: &[Sample],
    value: impl Fn(&Sample) -> Option<f64>,
    top: Option<f64>,
    what: &str,
) -> String {
    const W: f64 = 120.0;
    const H: f64 = 28.0;
    let values: Vec<Option<f64>> = samples
        .iter()
        .map(|s| value(s).filter(|x| x.is_finite()))
        .collect();
    let known: Vec<f64> = values.iter().flatten().copied().collect();
    let Some(last) = values.iter().rev().flatten().next() else {
        return "<span class=\"muted\">no data yet</span>".to_owned();
    };
    let top = top
        .unwrap_or_else(|| known.iter().copied().fold(0.0, f64::max))
        .max(f64::EPSILON);
    // The points span the width (a sparkline shows a shape; its title gives the span).
    let step = (W - 4.0) / (values.len().saturating_sub(1).max(1)) as f64;
    let x0 = 2.0;
    let mut paths = String::new();
    let mut run = String::new();
    let mut dot = (0.0, 0.0);
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => {
                let x = x0 + step * i as f64;
                let y = H - 2.0 - (v / top).clamp(0.0, 1.0) * (H - 4.0);
                let _ = write!(run, "{x:.1},{y:.1} ");
                dot = (x, y);
            }
            None if !run.is_empty() => {
                let _ = write!(paths, "<polyline points=\"{}\"/>", run.trim_end());
                run.clear();
            }
            None => {}
        }
    }
    if !run.is_empty() {
        let _ = write!(paths, "<polyline points=\"{}\"/>", run.trim_end());
    }
    let label = if top == 1.0 && what == "success rate" {
        pct(*last)
    } else {
        ms(Some(*last))
    };
    format!(
        "<svg class=\"spark\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\">\
         <title>{what}: {label} now; {} points, one per {every} s</title>\
         <line x1=\"0\" y1=\"{base}\" x2=\"{W}\" y2=\"{base}\" class=\"base\"/>{paths}\
         <circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2.2\"/></svg>",
        known.len(),
        every = SAMPLE_EVERY.as_secs(),
        base = H - 2.0,
        x = dot.0,
        y = dot.1.clamp(2.2, H - 2.2),
    )
}

/// The own state's pill: `degraded` in place of `healthy` while golden tasks drift,
/// `budget-limited` while a model budget is cut, with its reason.
fn shown_pill(status: &Status) -> String {
    let s = status.self_state;
    let why = status
        .model_budget
        .as_ref()
        .filter(|_| s == "budget-limited")
        .map_or(String::new(), |b| {
            format!(" <span class=\"s\">{}</span>", esc(&b.reason))
        });
    format!("<span class=\"pill {s}\">{s}</span>{why}")
}

/// Each capability's last golden-task run: its similarity against the threshold, and what
/// differed from the baselines.
fn quality_card(status: &Status) -> String {
    if status.quality.is_empty() {
        return String::new();
    }
    let mut rows = String::new();
    for q in &status.quality {
        let r = &q.report;
        let similarity = r.similarity.map_or("—".to_owned(), pct);
        let class = if r.degraded { "bad" } else { "good" };
        let differing: Vec<String> = r
            .tasks
            .iter()
            .flat_map(|t| t.differing.iter().chain(t.error.iter()))
            .map(|d| esc(d))
            .collect();
        let _ = write!(
            rows,
            "<div><b>{name}</b> <span class=\"{class}\">{similarity}</span> (threshold {threshold}, {age}){differs}</div>",
            name = esc(&r.capability),
            threshold = pct(r.threshold),
            age = age(q.age_s),
            differs = if differing.is_empty() {
                String::new()
            } else {
                format!(" · differs: {}", differing.join(", "))
            },
        );
    }
    format!("<div class=\"card wide\"><div class=\"k\">golden tasks</div><div class=\"v small\">{rows}</div></div>")
}

/// A peer's pill: `degraded` in place of `healthy` when its own view says its answers drift.
fn peer_pill(p: &PeerStatus) -> String {
    let quality = p.self_view.as_ref().and_then(|s| s.view.quality);
    format!(
        "<span class=\"pill {s}\">{s}</span>",
        s = crate::reach::shown(p.effective_state, quality)
    )
}

fn pill(state: State) -> String {
    format!("<span class=\"pill {s}\">{s}</span>", s = state.as_str())
}

fn bar(x: f64, high_is_bad: bool) -> String {
    let x = if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let class = match (high_is_bad, x) {
        (true, x) if x >= 0.9 => "bad",
        (true, x) if x >= 0.6 => "warn",
        (false, x) if x <= 0.0 => "bad",
        (false, x) if x < 1.0 => "warn",
        _ => "good",
    };
    format!(
        "<div class=\"bar\"><i class=\"{class}\" style=\"width:{:.0}%\"></i></div>",
        x * 100.0
    )
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.0}%", x * 100.0)
    } else {
        "—".to_owned()
    }
}

fn ms(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() && x >= 1000.0 => format!("{:.1} s", x / 1000.0),
        Some(x) if x.is_finite() && x >= 10.0 => format!("{x:.0} ms"),
        Some(x) if x.is_finite() => format!("{x:.1} ms"),
        _ => "—".to_owned(),
    }
}

fn duration(s: f64) -> String {
    match s {
        s if !s.is_finite() => "—".to_owned(),
        s if s < 60.0 => format!("{s:.0} s"),
        s if s < 3600.0 => format!("{:.0} min", s / 60.0),
        s if s < 86_400.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} d", s / 86_400.0),
    }
}

fn age(s: f64) -> String {
    format!("{} ago", duration(s))
}

/// HTML-escapes text for an element or a quoted attribute.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = r#"
:root{--bg:#f6f8fa;--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--card:#fff;
--good:#1a7f37;--good-bg:#dafbe1;--warn:#9a6700;--warn-bg:#fff8c5;--bad:#cf222e;--bad-bg:#ffebe9;
--info:#0969da;--info-bg:#ddf4ff;--orange:#bc4c00;--orange-bg:#fff1e5;--grey-bg:#eaeef2}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:16px;padding:14px 24px;background:#24292f;color:#fff}
header h1{margin:0;font-size:20px;font-weight:600}
header .brand{color:#8c959f;font-weight:400;margin-right:6px}
header .meta{color:#d0d7de}
header .refresh{margin-left:auto;color:#d0d7de;font-size:13px}
header .bad{color:#ff8182}
main{padding:16px 24px;max-width:1400px}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 16px;margin:0 0 16px}
h2{font-size:15px;margin:0 0 10px;font-weight:600}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid #eaeef2;vertical-align:top}
th{font-size:12px;color:var(--muted);font-weight:600;text-transform:uppercase;letter-spacing:.02em}
tr:last-child td{border-bottom:0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{width:180px;text-transform:none;font-size:13px}
.muted{color:var(--muted);font-size:12px}
.empty{color:var(--muted);margin:0}
.good{color:var(--good)}.warn{color:var(--warn)}.bad{color:var(--bad);font-weight:600}
.pill{display:inline-block;padding:1px 9px;border-radius:999px;font-size:12px;font-weight:600;border:1px solid transparent}
.pill.healthy{color:var(--good);background:var(--good-bg);border-color:#aceebb}
.pill.degraded,.pill.budget-limited{color:var(--warn);background:var(--warn-bg);border-color:#f5e0a0}
.pill.parole{color:var(--info);background:var(--info-bg);border-color:#b6e3ff}
.pill.recovering{color:var(--warn);background:var(--warn-bg);border-color:#f5e0a0}
.pill.probation{color:var(--orange);background:var(--orange-bg);border-color:#ffd8b5}
.pill.ejected{color:#fff;background:var(--bad);border-color:var(--bad)}
.pill.draining{color:var(--muted);background:var(--grey-bg);border-color:var(--line)}
.problems{border-color:#ff8182;background:var(--bad-bg)}
.problems h2{color:var(--bad)}
.problems ul{margin:0;padding-left:20px}
.problems li{margin:3px 0}
.ok-banner{border-color:#aceebb;background:var(--good-bg);color:var(--good);font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #eaeef2;border-radius:6px;padding:8px 12px;min-width:130px}
.card.wide{flex:1;min-width:260px}
.card .k{font-size:12px;color:var(--muted)}
.card .v{font-size:20px;font-weight:600;font-variant-numeric:tabular-nums}
.card .v.small{font-size:14px;font-weight:500}
.card .s{font-size:12px;color:var(--muted)}
.bar{height:5px;background:#eaeef2;border-radius:3px;margin-top:4px;width:90px;overflow:hidden}
.bar i{display:block;height:100%}
.bar i.good{background:var(--good)}.bar i.warn{background:#d4a72c}.bar i.bad{background:var(--bad)}
table.peers tr.row-ejected td{background:#fff5f5}
table.peers tr.row-probation td{background:#fffaf5}
td.why{font-size:12px;max-width:340px}
svg.spark{display:block}
svg.spark polyline{fill:none;stroke:var(--info);stroke-width:1.6;stroke-linejoin:round}
svg.spark .base{stroke:#eaeef2;stroke-width:1}
svg.spark circle{fill:var(--info)}
th.num{text-align:right}
pre{background:var(--bg);padding:8px;border-radius:6px;overflow:auto}
footer{padding:0 24px 24px;color:var(--muted);font-size:12px}
a{color:var(--info)}
"#;

/// Refreshes `<main>` in place every 5 s (keeps the scroll position), and says when the admin
/// port stops answering.
const SCRIPT: &str = r#"
(function(){
  var box=document.getElementById('auto'), stale=document.getElementById('stale');
  setInterval(function(){
    if(!box.checked) return;
    fetch(location.pathname+'?format=html',{cache:'no-store'}).then(function(r){
      if(!r.ok) throw new Error('HTTP '+r.status); return r.text();
    }).then(function(t){
      var next=new DOMParser().parseFromString(t,'text/html').querySelector('main');
      if(next){document.querySelector('main').replaceWith(next); stale.textContent='';}
    }).catch(function(e){stale.textContent='admin port not answering ('+e.message+')';});
  },5000);
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<b a=\"1\">'&'</b>"),
            "&lt;b a=&quot;1&quot;&gt;&#39;&amp;&#39;&lt;/b&gt;"
        );
    }

    #[test]
    fn a_sparkline_breaks_at_gaps_and_scales_to_its_top() {
        let s = |x: Option<f64>| Sample {
            success_rate: x,
            p95_ms: x.map(|x| x * 100.0),
        };
        let samples = [s(Some(1.0)), s(None), s(Some(0.5)), s(Some(0.0))];
        let svg = sparkline(&samples, |s| s.success_rate, Some(1.0), "success rate");
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.contains("0%"), "{svg}");
        let none = sparkline(&[s(None)], |s| s.p95_ms, None, "p95 ms");
        assert!(none.contains("no data"), "{none}");
    }

    #[test]
    fn problems_sort_first() {
        let mut states = State::ALL.to_vec();
        states.sort_by_key(|s| severity(*s));
        assert_eq!(states[0], State::Ejected);
        assert_eq!(states[1], State::Probation);
        assert_eq!(states[5], State::Healthy);
    }

    #[test]
    fn each_mcp_tool_is_a_row_with_its_servers() {
        use crate::outbound::{ToolServer, ToolStatus};
        let mut out = String::new();
        tools(&mut out, &[]);
        assert!(out.is_empty(), "no MCP, no section");
        let server = |name: &str, state, failures, paused_for_s| ToolServer {
            definition: String::new(),
            held: false,
            pinned_by: 0,
            server: name.to_owned(),
            state,
            failures,
            paused_for_s,
        };
        let search = ToolStatus {
            capability: "mcp".to_owned(),
            tool: "search".to_owned(),
            servers: vec![
                server("a", "paused", 3, Some(4.2)),
                server("<b>", "healthy", 0, None),
            ],
        };
        tools(&mut out, &[search]);
        assert!(out.contains("<td>search</td>"), "{out}");
        assert!(out.contains("a paused 4 s</span> (3 failures)"), "{out}");
        assert!(out.contains("&lt;b&gt;</span>"), "{out}");
    }

    #[test]
    fn an_observe_document_becomes_a_table() {
        let mut out = String::new();
        let doc = serde_json::json!({
            "code-review": { "calls": 10, "disagreements": 2, "note": "<x>" }
        });
        json_table(&mut out, &doc);
        assert!(out.contains("<th>disagreements</th>"), "{out}");
        assert!(out.contains("&lt;x&gt;"), "{out}");
    }
}
