//! Turning the demo's raw calls and samples into the summary and the table.

use std::time::Duration;

use super::drive::{Call, Sample};
use super::{round, DemoSummary, FaultSummary, TimedState, Totals};
use agent_reach::reach::percentile;
use agent_reach::reach::State;

/// A share below this fraction of the agent's former share counts as out of rotation.
const OUT_OF_ROTATION: f64 = 0.05;
/// Samples per window when measuring shares (100 ms each).
const WINDOW: usize = 5;

pub(super) fn totals(calls: &[Call], elapsed: Duration) -> Totals {
    let mut ms: Vec<f64> = calls.iter().map(|c| c.ms).collect();
    ms.sort_by(f64::total_cmp);
    let successes = calls.iter().filter(|c| c.ok).count() as u64;
    Totals {
        requests: calls.len() as u64,
        successes,
        failures: calls.len() as u64 - successes,
        p50_ms: round(percentile(&ms, 0.50)),
        p95_ms: round(percentile(&ms, 0.95)),
        requests_per_s: round(calls.len() as f64 / elapsed.as_secs_f64().max(1e-9)),
    }
}

fn share(from: &Sample, to: &Sample) -> Option<f64> {
    let calls = to.calls.checked_sub(from.calls)?;
    (calls > 0).then(|| to.reached.saturating_sub(from.reached) as f64 / calls as f64)
}

pub(super) fn fault_summary(
    agent: &str,
    samples: &[Sample],
    calls: &[Call],
    fault_at: Duration,
    heal_at: Duration,
) -> FaultSummary {
    let first = samples.first();
    let at_fault = samples.iter().position(|s| s.at >= fault_at);
    let at_heal = samples.iter().position(|s| s.at >= heal_at);
    let share_before = match (first, at_fault) {
        (Some(first), Some(i)) => share(first, &samples[i]).unwrap_or(0.0),
        _ => 0.0,
    };
    // The first window after the fault in which the agent got almost none of its former share.
    let left = at_fault.and_then(|start| {
        let end = at_heal.unwrap_or(samples.len());
        (start..end.saturating_sub(WINDOW)).find(|&i| {
            share(&samples[i], &samples[i + WINDOW])
                .is_some_and(|s| s < OUT_OF_ROTATION * share_before)
        })
    });
    let share_while_out = match (left, at_heal) {
        (Some(i), Some(h)) if h > i => share(&samples[i], &samples[h]).unwrap_or(0.0),
        _ => 0.0,
    };
    let during: Vec<&Call> = calls
        .iter()
        .filter(|c| c.at >= fault_at && c.at < heal_at)
        .collect();
    let mut transitions: Vec<TimedState> = Vec::new();
    for s in samples {
        if let Some(state) = s.state {
            if transitions.last().is_none_or(|t| t.state != state) {
                transitions.push(TimedState {
                    at_s: round(s.at.as_secs_f64()),
                    state,
                });
            }
        }
    }
    let recovered = samples
        .iter()
        .find(|s| s.at >= heal_at && s.state == Some(State::Healthy))
        .map(|s| ms(s.at - heal_at));
    FaultSummary {
        agent: agent.to_owned(),
        mode: "rate-limited (/healthz 200, business calls 429)".to_owned(),
        fault_at_s: round(fault_at.as_secs_f64()),
        healed_at_s: round(heal_at.as_secs_f64()),
        left_rotation_after_ms: left.map(|i| ms(samples[i + WINDOW].at.saturating_sub(fault_at))),
        share_before: round3(share_before),
        share_while_out: round3(share_while_out),
        failed_during_fault: during.iter().filter(|c| !c.ok).count() as u64,
        calls_during_fault: during.len() as u64,
        transitions,
        recovered_after_heal_ms: recovered,
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round()
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The human-readable report.
pub fn render_table(s: &DemoSummary) -> String {
    let mut out = format!(
        "agent-reach demo: {} agents behind sidecars, {:.1}s of `{}` calls from a caller ({} at once)\n\n",
        s.agents.len(),
        s.duration_s,
        s.capability,
        s.concurrency
    );
    let o = &s.observe;
    out.push_str(&format!(
        "observe-only first ({:.1}s, every sidecar routing round robin like a plain proxy): {} went rate-limited\n  {} of {} calls failed; the model disagreed on {} calls and would have avoided {} of those failures ({:.0}%) and {:.1} s of latency\n  observe-only off, live: {} healthy in every view again after {}\n\n",
        o.duration_s,
        o.agent,
        o.failed,
        o.calls,
        o.disagreements,
        o.avoidable_failures,
        pct(o.avoidable_failures, o.failed),
        o.avoidable_latency_s,
        o.agent,
        o.healthy_again_after_ms
            .map_or("never (within 20 s)".to_owned(), |ms| format!("{:.1} s", ms / 1000.0))
    ));
    out.push_str(&format!(
        "{:<10} {:>9} {:>9} {:>8} {:>8} {:>10}  {}\n",
        "agent", "requests", "success", "p50 ms", "p95 ms", "in-flight", "state (caller's view)"
    ));
    for a in &s.agents {
        out.push_str(&format!(
            "{:<10} {:>9} {:>8.1}% {:>8.1} {:>8.1} {:>10}  {}\n",
            a.name,
            a.requests,
            pct(a.successes, a.requests),
            a.p50_ms,
            a.p95_ms,
            a.in_flight,
            a.state.as_str()
        ));
    }
    let f = &s.fault;
    out.push_str(&format!(
        "\nfault: {} went {} at {:.1}s, healed at {:.1}s\n",
        f.agent, f.mode, f.fault_at_s, f.healed_at_s
    ));
    out.push_str(&format!(
        "  caller's view of {}: {}\n",
        f.agent,
        states(&f.transitions)
    ));
    match f.left_rotation_after_ms {
        Some(ms) => out.push_str(&format!(
            "  out of rotation within {:.0} ms of the fault (share of calls {:.1}% before, {:.2}% while out)\n",
            ms,
            100.0 * f.share_before,
            100.0 * f.share_while_out
        )),
        None => out.push_str("  did not leave rotation before the heal\n"),
    }
    out.push_str(&format!(
        "  calls failed during the fault: {} of {} ({:.2}%)\n",
        f.failed_during_fault,
        f.calls_during_fault,
        pct(f.failed_during_fault, f.calls_during_fault)
    ));
    if let Some(ms) = f.recovered_after_heal_ms {
        out.push_str(&format!(
            "  back to healthy {:.1} s after the heal (ramped in gradually)\n",
            ms / 1000.0
        ));
    }
    let st = &s.storm;
    out.push_str(&format!(
        "\nretry storm: {} refuse (429) together for {:.1}s; {} is the fallback\n",
        st.failing.join(" and "),
        st.duration_s,
        st.fallback
    ));
    out.push_str(&format!(
        "  offered {:.0} calls/s; {} peaked at {:.0} calls/s ({:.2}x its fair share); {:.2} attempts per call; {} of {} failed\n",
        st.offered_per_s, st.fallback, st.fallback_peak_per_s, st.peak_ratio, st.attempts_per_call, st.failed, st.calls
    ));
    let h = &s.hostile;
    let sent: Vec<String> = h.sent.iter().map(|(k, n)| format!("{n} {k}")).collect();
    out.push_str(&format!(
        "\nhostile input: a stranger sent {}'s inbound port {}\n",
        h.target,
        sent.join(", ")
    ));
    out.push_str(&format!(
        "  {} of {} answered with their refusal (408, 400, 400 capability_path_mismatch, 422); {} counted {} failures against itself and stayed {}; the caller's {} calls meanwhile: {} failed\n",
        h.refused_as_expected,
        h.answerable,
        h.target,
        h.agent_failures_added,
        h.state_after.as_str(),
        h.calls,
        h.failed
    ));
    let sl = &s.slow;
    out.push_str(&format!(
        "\nslow agent: {}'s dependency turned ten times slower ({:.0} ms a call, no errors)\n",
        sl.agent, sl.slow_ms
    ));
    out.push_str(&format!(
        "  its share of calls {:.1}% before → {:.1}% from a second later; the caller's p95 {:.1} ms → {:.1} ms; {} of {} calls failed\n",
        sl.share_before * 100.0,
        sl.share_after * 100.0,
        sl.p95_before_ms,
        sl.p95_after_ms,
        sl.failed,
        sl.calls
    ));
    let q = &s.quality;
    let opt = |x: Option<f64>, f: fn(f64) -> String| x.map_or_else(|| "—".to_owned(), f);
    let sim = |x: f64| format!("{x:.2}");
    let ms = |x: f64| format!("{x:.0} ms");
    out.push_str(&format!(
        "\nquality drift: {}'s answers drifted from its golden tasks' baselines (still 200, same shape; differs: {})\n",
        q.agent,
        if q.differing.is_empty() { "—".to_owned() } else { q.differing.join(", ") }
    ));
    out.push_str(&format!(
        "  similarity {} → {} (threshold {:.2}): degraded after {}, the caller saw it after {}; its share {:.1}% → {:.1}%; {} of {} calls failed\n",
        opt(q.similarity_before, sim),
        opt(q.similarity_drifted, sim),
        q.threshold,
        opt(q.degraded_after_ms, ms),
        opt(q.caller_saw_after_ms, ms),
        q.share_before * 100.0,
        q.share_degraded * 100.0,
        q.failed,
        q.calls
    ));
    out.push_str(&format!(
        "  answers back: healthy after {} (similarity {})\n",
        opt(q.recovered_after_ms, ms),
        opt(q.similarity_recovered, sim)
    ));
    let m = &s.membership;
    out.push_str(&format!(
        "\nmembership by gossip: the fleet found itself from one seed in {:.0} ms\n",
        m.fleet_found_after_ms
    ));
    match m.left_every_table_after_ms {
        Some(ms) => out.push_str(&format!(
            "  {}'s sidecar crashed: out of every routing table {:.1} s later\n",
            m.killed,
            ms / 1000.0
        )),
        None => out.push_str(&format!(
            "  {}'s sidecar crashed: still listed somewhere\n",
            m.killed
        )),
    }
    let path = states(&m.newcomer_states);
    out.push_str(&format!(
        "  {} started: known to the caller after {}, {}; full share after {}\n",
        m.joined,
        m.joined_after_ms
            .map_or("never".to_owned(), |ms| format!("{ms:.0} ms")),
        if path.is_empty() {
            "no state seen"
        } else {
            &path
        },
        m.full_share_after_ms
            .map_or("never".to_owned(), |ms| format!("{:.1} s", ms / 1000.0))
    ));
    let inj = &m.joined_by_injection;
    out.push_str(&format!(
        "  {}'s sidecar came from the injector: annotations {} → a {}-operation patch ({})\n",
        m.joined,
        inj.annotations.join(", "),
        inj.patch_ops,
        if inj.native_sidecar {
            "native sidecar"
        } else {
            "plain container"
        }
    ));
    out.push_str(&format!(
        "  {} of {} calls failed ({} in flight on the crashed agent)\n",
        m.failed, m.calls, m.failed_at_crash
    ));
    let a = &s.authorization;
    out.push_str(&format!(
        "\nidentity and authorization: the fleet ran mutual TLS 1.3 from the start (permissive; the caller is {}); now the policy turns strict and opens {} to {} only, live\n",
        a.caller_identity, super::CAPABILITY, a.allowed
    ));
    out.push_str(&format!(
        "  an intruder with a valid certificate ({}) made {} calls: {} refused 403 forbidden ({} counted by the agents' sidecars), {} reached an agent\n",
        a.intruder_identity, a.intruder_calls, a.intruder_forbidden, a.denied_counted, a.reached_agents
    ));
    out.push_str(&format!(
        "  a plaintext request at an agent's inbound port: refused at the handshake ({}, {} counted); the caller's {} calls after, TLS-only: {} failed\n",
        a.plaintext_status, a.plaintext_refusals_counted, a.calls, a.failed
    ));
    let ways: Vec<String> = a
        .ways
        .iter()
        .map(|w| {
            format!(
                "{} ({})",
                w.way,
                if w.status == 0 {
                    "refused at the connection".to_owned()
                } else {
                    w.status.to_string()
                }
            )
        })
        .collect();
    out.push_str(&format!(
        "  around its sidecar, {} ways tried: {}; {} refused, {} reached an agent\n",
        a.ways_tried,
        ways.join(", "),
        a.ways_refused,
        a.ways_reached
    ));
    out.push_str(&format!(
        "  a hijacker ({}) claims {} (served_by: {} only): {} of the caller's {} calls reached it; claims refused: {}\n",
        a.hijacker_identity, super::CAPABILITY, a.allowed, a.hijacked_calls, a.calls, a.claims_refused
    ));
    let k = &s.tasks;
    out.push_str(&format!(
        "\noutput validation: {} answered plausible fakes (200, JSON of the wrong shape); its sidecar checked them against code-review's output_schema\n  {} async tasks meanwhile: {} done with a validated answer, {} fakes turned away as 502 invalid_output and passed over, {} answered by the faker\n",
        k.faker, k.checked_tasks, k.checked_done, k.fakes_passed_over, k.answered_by_faker
    ));
    out.push_str(&format!(
        "\nasync task: `prefer: respond-async` to any.reach with intent \"review this diff\" resolved as `{}`; 202 after {:.1} ms (stored, fsynced)\n",
        k.resolved, k.accepted_ms
    ));
    out.push_str(&format!(
        "  every agent refusing: {} rounds, {} attempts, then escalated to the webhook after {} ({} POST, {} reasons, signature {})\n",
        k.rounds,
        k.attempts,
        k.escalated_after_ms
            .map_or("never (within 30 s)".to_owned(), |ms| format!("{:.1} s", ms / 1000.0)),
        k.webhook_posts,
        k.reasons_sent,
        if k.signature_ok { "verified" } else { "NOT verified" }
    ));
    out.push_str(&format!(
        "  a person fixed the agents and sent it back: {} after {} (the agent answered {})\n",
        k.final_state,
        k.done_after_retry_ms
            .map_or("never (within 30 s)".to_owned(), |ms| format!(
                "{:.1} s",
                ms / 1000.0
            )),
        k.answer_status.map_or("-".to_owned(), |s| s.to_string())
    ));
    let r = &k.restart;
    out.push_str(&format!(
        "  the caller (the task queue, the gossip seed) killed with {} of its tasks unfinished and started again on the same store: {} accepted, {} done after the restart, {} lost, {} run twice (first done after {}, all after {})\n",
        r.unfinished_at_kill,
        r.accepted,
        r.done,
        r.lost,
        r.run_twice,
        r.first_done_after_ms
            .map_or("-".to_owned(), |ms| format!("{:.1} s", ms / 1000.0)),
        r.all_done_after_ms
            .map_or("never (within 60 s)".to_owned(), |ms| format!("{:.1} s", ms / 1000.0)),
    ));
    let c = &s.conversations;
    out.push_str(&format!(
        "\nA2A: three agents joined with no capability written down; their sidecars read the skill `translate` from the agents' cards and the caller could route it after {}\n  the card through the caller's outbound port names {} ; {} conversations (started on {} agents): {} of {} follow-ups (tasks/get, a second turn in the context) reached the agent holding the task\n",
        c.skill_routable_after_ms
            .map_or("never (within 20 s)".to_owned(), |ms| format!("{:.1} s", ms / 1000.0)),
        c.card_url, c.conversations, c.agents_used, c.reached_holder, c.follow_ups
    ));
    out.push_str(&mcp_lines(&s.mcp));
    let l = &s.loops;
    out.push_str(&format!(
        "\ndelegation loop: {} delegate in a circle; the first turn came back {} {} after {:.1} ms, refused by {}'s sidecar\n  chain: {} ({} hops); the agents ran {} calls in all, one each\n",
        l.agents.join(" → "),
        l.status,
        l.reason,
        l.answered_after_ms,
        l.refused_by,
        l.chain,
        l.hops,
        l.agent_calls
    ));
    out.push_str(&hedge_lines(&s.hedge));
    let p = &s.predict;
    let secs = |x: Option<f64>| x.map_or("not within the act".to_owned(), |x| format!("{x:.1} s"));
    out.push_str(&format!(
        "\npredicted saturation: demand ramped onto {} (ten times slower, the only one asked for), up to {} callers; looking {:.0} s ahead\n  its predicted saturation crossed 0.8 at {}, the actual one at {}: {} earlier; {} calls turned away as saturated; {} of {} calls failed\n",
        p.agent,
        p.callers,
        p.horizon_s,
        secs(p.predicted_crossed_s),
        secs(p.actual_crossed_s),
        secs(p.lead_s),
        p.refused,
        p.failed,
        p.calls
    ));
    out.push_str(&scale_lines(&s.scale));
    out.push_str(&budget_lines(&s.budget));
    let t = &s.total;
    out.push_str(&format!(
        "\ncaller saw {} calls: {} ok ({:.2}%), {} failed; p50 {:.1} ms, p95 {:.1} ms; {:.0} calls/s\n",
        t.requests,
        t.successes,
        pct(t.successes, t.requests),
        t.failures,
        t.p50_ms,
        t.p95_ms,
        t.requests_per_s
    ));
    out
}

fn scale_lines(s: &super::ScaleSummary) -> String {
    let steps: Vec<String> = s
        .steps
        .iter()
        .map(|st| format!("{:.2} ({} callers)", st.ratio, st.callers))
        .collect();
    let spread = s.steps.iter().map(|st| st.spread).fold(0.0, f64::max);
    format!(
        "\nscale signal: {} agents serve {} with {} slots in rotation; callers added in steps, then removed\n  reach_capability_demand_ratio: {} → {:.2} after; every sidecar within {:.2} of the others; {} of {} calls failed\n",
        s.members,
        s.capability,
        s.capacity,
        steps.join(" → "),
        s.ratio_after,
        spread,
        s.failed,
        s.calls
    )
}

/// The model-budget act: the drained agent's headroom and share over time, steering on and off.
fn budget_lines(b: &super::BudgetSummary) -> String {
    let run = |r: &super::budget::BudgetRun| {
        let samples: Vec<String> = r
            .samples
            .iter()
            .map(|x| {
                let headroom = x.headroom.map_or("-".to_owned(), |h| format!("{h:.2}"));
                format!(
                    "{:.1}s {headroom}/{:.0}%/{}",
                    x.at_s,
                    100.0 * x.share,
                    x.left
                )
            })
            .collect();
        let out = match (r.out_after_s, r.left_when_out) {
            (Some(at), Some(left)) => format!("under 5 % at {at:.1} s with {left} left"),
            _ => "never under 5 %".to_owned(),
        };
        format!(
            "headroom/share/left: {}\n    {out}; {} calls hit a 429 for callers, {} for agents; {} of {} calls failed\n",
            samples.join(" "),
            r.caller_429,
            r.agent_429,
            r.caller_failed,
            r.calls
        )
    };
    format!(
        "\nmodel budget: {}'s model account drains ({} requests per {:.0} s; the others {})\n  steering on   {}  steering off ({}): {}  429s from the providers: {} with steering, {} without\n",
        b.agent,
        b.budget,
        b.window_s,
        b.others_budget,
        run(&b.aware),
        b.unaware_by,
        run(&b.unaware),
        b.aware.agent_429,
        b.unaware.agent_429
    )
}

fn hedge_lines(h: &super::HedgeSummary) -> String {
    let row = |name: &str, r: &super::HedgeRun| {
        format!(
            "  {name:<9} {:>6} {:>7.1} {:>7.1} {:>7.1} {:>5} {:>9.2} {:>7}\n",
            r.calls, r.p50_ms, r.p99_ms, r.max_ms, r.slow_calls, r.attempts_per_call, r.failed
        )
    };
    let mut out = format!(
        "\nhedging: {} ; {} takes {:.0} ms on {:.0} % of its calls; {} callers send reads (GET: safe to run twice; a keyed call is never hedged) for {:.0} s without hedging, then {:.0} s with hedge: {{after: {:.0}ms, max: 1}}\n",
        h.agents.join(", "),
        h.slow_agent,
        h.slow_ms,
        h.slow_share * 100.0,
        h.callers,
        h.run_s,
        h.run_s,
        h.after_ms,
    );
    out.push_str(&format!(
        "  {:<9} {:>6} {:>7} {:>7} {:>7} {:>5} {:>9} {:>7}\n",
        "run", "calls", "p50 ms", "p99 ms", "max ms", "slow", "att/call", "failed"
    ));
    out.push_str(&row("no hedge", &h.unhedged));
    out.push_str(&row("hedged", &h.hedged));
    out.push_str(&format!(
        "  slow: calls of {:.0} ms or more; att/call: calls that reached an agent ÷ calls made\n",
        h.slow_ms
    ));
    out
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// The MCP act: the fleet's tool list, and a broken tool's calls moving.
fn mcp_lines(m: &super::McpSummary) -> String {
    let shares = |counts: &std::collections::BTreeMap<String, usize>| {
        counts
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let listed = m
        .listed
        .iter()
        .map(|(name, n)| format!("{name}×{n}"))
        .collect::<Vec<_>>()
        .join(" ");
    let kept = match (
        m.broken_fetch_share_before_pct,
        m.broken_fetch_share_after_pct,
    ) {
        (Some(before), Some(after)) => {
            format!(
                "while its fetch stayed {} and kept {after:.0}% of the fetch calls ({before:.0}% before)",
                m.broken_fetch_state
            )
        }
        _ => "while its summarize kept serving".to_owned(),
    };
    format!(
        "\nMCP: three servers joined with no capability written down; their sidecars read the tools and the caller could route every tool after {}\n  the caller's tools/list through its sidecar: {listed}\n  {} calls of search and of fetch each: search {} ; fetch {}\n  then {}'s search broke (isError): search {} ; fetch {} ; {} of {} calls failed at the caller\n  the caller's per-tool view: {}'s search {} after {} failures in a row, {kept}\n",
        m.tools_routable_after_ms
            .map_or("never (within 20 s)".to_owned(), |ms| format!("{:.1} s", ms / 1000.0)),
        m.calls,
        shares(&m.search_before),
        shares(&m.fetch_before),
        m.broken,
        shares(&m.search_after),
        shares(&m.fetch_after),
        m.failed_after,
        2 * m.calls,
        m.broken,
        m.broken_search_state,
        m.broken_search_failures,
    ) + &format!(
        "  a client with a session (mcp-3 keeps sessions, as the SDKs' servers do): {} of {} calls answered on the caller's brokered session; mcp-3 held {} sessions after the client ended its own\n",
        m.session_calls_ok, m.session_calls, m.session_server_open_after,
    )
}

/// The states an agent went through, each with when: `suspect @3.2s → healthy @5.0s`.
fn states(path: &[TimedState]) -> String {
    let states: Vec<String> = path
        .iter()
        .map(|t| format!("{} @{:.1}s", t.state.as_str(), t.at_s))
        .collect();
    states.join(" → ")
}
