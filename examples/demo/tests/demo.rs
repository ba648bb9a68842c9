//! The demo binary (`demo --json`) runs the fleet and reports per-agent and total counters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn demo_json_reports_every_agent_the_total_and_the_fault() {
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--duration", "6s", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let agents = summary["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 3);
    let mut reached = 0;
    for agent in agents {
        for key in [
            "name",
            "requests",
            "successes",
            "failures",
            "p50_ms",
            "p95_ms",
        ] {
            assert!(!agent[key].is_null(), "missing {key}: {agent}");
        }
        assert!(
            agent["requests"].as_u64().unwrap() > 0,
            "every agent got traffic: {agent}"
        );
        reached += agent["requests"].as_u64().unwrap();
    }
    let total = &summary["total"];
    let requests = total["requests"].as_u64().unwrap();
    assert!(requests > 0);
    // Calls refused by the broken agent were retried elsewhere: agents saw at least every call.
    assert!(reached >= requests, "{reached} < {requests}");
    assert!(
        total["failures"].as_u64().unwrap() * 100 <= requests,
        "over 1% failed: {total}"
    );

    let fault = &summary["fault"];
    assert_eq!(fault["agent"], "coder-2");
    let states: Vec<&str> = fault["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["state"].as_str())
        .collect();
    assert!(
        states.contains(&"ejected"),
        "the broken agent left rotation: {states:?}"
    );
    assert!(
        fault["left_rotation_after_ms"].as_f64().is_some(),
        "{fault}"
    );

    let storm = &summary["storm"];
    assert_eq!(storm["fallback"], "coder-3");
    assert!(storm["calls"].as_u64().unwrap() > 0, "{storm}");
    assert!(
        storm["failed"].as_u64().unwrap() * 100 <= storm["calls"].as_u64().unwrap(),
        "{storm}"
    );
    // The fallback takes the calls, not a burst of everyone's retries.
    assert!(storm["peak_ratio"].as_f64().unwrap() < 2.0, "{storm}");

    // Hostile input at coder-1's inbound: every answerable request refused, nothing counted
    // against the agent, no call of the caller failed.
    // Observe-only first: the plain proxy's failures, and the model would have avoided most.
    let o = &summary["observe"];
    let failed = o["failed"].as_u64().unwrap();
    let avoidable = o["avoidable_failures"].as_u64().unwrap();
    assert!(o["calls"].as_u64().unwrap() > 0, "{o}");
    assert!(
        failed > 0,
        "round robin sent calls to the broken agent: {o}"
    );
    assert!(avoidable * 2 >= failed && avoidable <= failed, "{o}");
    assert!(o["healthy_again_after_ms"].as_f64().is_some(), "{o}");

    // Strict mTLS with authorization: the intruder refused every time, nothing reached an agent,
    // plaintext refused at the handshake, the caller's own calls unharmed.
    let a = &summary["authorization"];
    assert_eq!(a["intruder_forbidden"], a["intruder_calls"], "{a}");
    assert_eq!(a["denied_counted"], a["intruder_calls"], "{a}");
    assert_eq!(a["reached_agents"], 0, "{a}");
    assert_eq!(a["plaintext_status"], 403, "{a}");
    // Around its sidecar (no header, path tricks, forged XFCC, plaintext, a forwarded port):
    // every way refused, none reached an agent.
    assert_eq!(a["ways_tried"], 5, "{a}");
    assert_eq!(a["ways_refused"], a["ways_tried"], "{a}");
    assert_eq!(a["ways_reached"], 0, "{a}");
    assert!(a["calls"].as_u64().unwrap() > 0, "{a}");
    assert!(
        a["failed"].as_u64().unwrap() * 100 <= a["calls"].as_u64().unwrap(),
        "{a}"
    );

    let h = &summary["hostile"];
    assert_eq!(h["refused_as_expected"], h["answerable"], "{h}");
    assert_eq!(h["agent_failures_added"], 0, "{h}");
    assert_eq!(h["state_after"], h["state_before"], "{h}");
    assert_eq!(h["failed"], 0, "{h}");

    // One agent ten times slower: it loses nearly all its share, and no call fails.
    let slow = &summary["slow"];
    assert!(slow["share_before"].as_f64().unwrap() > 0.15, "{slow}");
    assert!(slow["share_after"].as_f64().unwrap() < 0.10, "{slow}");
    assert_eq!(slow["failed"], 0, "{slow}");

    // Quality drift: degraded within about a run, its share down, no call failed, back after.
    let q = &summary["quality"];
    assert_eq!(q["similarity_before"], 1.0, "{q}");
    assert!(
        q["similarity_drifted"].as_f64().unwrap() < q["threshold"].as_f64().unwrap(),
        "{q}"
    );
    assert!(q["degraded_after_ms"].as_f64().is_some(), "{q}");
    assert!(q["caller_saw_after_ms"].as_f64().is_some(), "{q}");
    assert!(q["share_before"].as_f64().unwrap() > 0.15, "{q}");
    assert!(
        q["share_degraded"].as_f64().unwrap() < q["share_before"].as_f64().unwrap() / 2.0,
        "{q}"
    );
    assert_eq!(q["failed"], 0, "{q}");
    assert!(q["recovered_after_ms"].as_f64().is_some(), "{q}");
    assert_eq!(q["similarity_recovered"], 1.0, "{q}");

    // Membership by gossip: a crash leaves every table, a newcomer joins on parole and ramps up.
    let m = &summary["membership"];
    assert!(
        m["fleet_found_after_ms"].as_f64().unwrap() < 10_000.0,
        "{m}"
    );
    assert!(
        m["left_every_table_after_ms"].as_f64().unwrap() < 10_000.0,
        "{m}"
    );
    assert!(m["joined_after_ms"].as_f64().is_some(), "{m}");
    let states: Vec<&str> = m["newcomer_states"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["state"].as_str())
        .collect();
    assert!(states.contains(&"healthy"), "the newcomer ramped up: {m}");
    assert!(m["full_share_after_ms"].as_f64().is_some(), "{m}");

    // Output validation: the faker's plausible fakes never became a task's answer.
    let k = &summary["tasks"];
    assert_eq!(k["answered_by_faker"], 0, "{k}");
    assert_eq!(k["checked_done"], k["checked_tasks"], "{k}");
    // The async task: 202, escalated with every attempt's reason, signed; sent back and done.
    assert_eq!(k["final_state"], "done", "{k}");
    assert_eq!(k["answer_status"], 200, "{k}");
    assert_eq!(k["signature_ok"], true, "{k}");
    assert!(k["attempts"].as_u64().unwrap() > 0, "{k}");
    assert_eq!(k["reasons_sent"], k["attempts"], "every reason, once: {k}");
    assert!(
        k["resolved"]
            .as_str()
            .unwrap()
            .starts_with("code-review; by=intent"),
        "{k}"
    );
    // The caller killed with tasks queued and restarted: every accepted task done, none run
    // twice by an agent.
    let r = &k["restart"];
    assert!(r["accepted"].as_u64().unwrap() > 0, "{r}");
    assert!(r["unfinished_at_kill"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["done"], r["accepted"], "{r}");
    assert_eq!(r["lost"], 0, "{r}");
    assert_eq!(r["run_twice"], 0, "{r}");
    // A2A: skills from the cards, routable fleet-wide; every follow-up reached its holder.
    let c = &summary["conversations"];
    assert!(c["skill_routable_after_ms"].as_f64().is_some(), "{c}");
    assert_eq!(c["card_url"], "http://translate.reach/", "{c}");
    assert!(c["follow_ups"].as_u64().unwrap() > 0, "{c}");
    assert_eq!(c["reached_holder"], c["follow_ups"], "{c}");
    // MCP: tools from the servers, listed once each; the broken search moves, nothing fails.
    let m = &summary["mcp"];
    assert!(m["tools_routable_after_ms"].as_f64().is_some(), "{m}");
    for tool in ["search", "fetch", "summarize"] {
        assert_eq!(m["listed"][tool], 1, "{m}");
    }
    let broken = m["broken"].as_str().unwrap();
    assert!(m["search_after"][broken].as_u64().unwrap() <= 3, "{m}");
    let moved: u64 = ["mcp-1", "mcp-2", "mcp-3"]
        .iter()
        .filter(|s| **s != broken)
        .map(|s| m["search_after"][*s].as_u64().unwrap())
        .sum();
    assert!(moved >= 37, "the others took search: {m}");
    assert_eq!(m["fetch_after"]["mcp-3"], 0, "mcp-3 has no fetch: {m}");
    assert_eq!(m["failed_after"], 0, "{m}");
    // The caller's per-tool view: every failure of the broken search counted, and passed over
    // (or waiting for its trial call) once there were three.
    assert_eq!(
        m["broken_search_failures"], m["search_after"][broken],
        "{m}"
    );
    if m["search_after"][broken].as_u64() >= Some(3) {
        let state = m["broken_search_state"].as_str().unwrap();
        assert!(state == "paused" || state == "trial", "{m}");
    }
    // Its fetch still works and is not held against it: healthy in the caller's per-tool view.
    // (Its share of the fetch calls is the latency tie-break's, which a loaded machine decides.)
    if broken != "mcp-3" {
        assert_eq!(m["broken_fetch_state"], "healthy", "{m}");
        assert!(m["broken_fetch_share_after_pct"].as_f64().is_some(), "{m}");
    }
    // A delegation loop among three agents: stopped at its first turn, the chain named.
    let l = &summary["loops"];
    assert_eq!(l["status"], 508, "{l}");
    assert_eq!(l["reason"], "loop_detected", "{l}");
    assert_eq!(
        l["chain"], "user > planner/plan > coder/review > tester/test",
        "{l}"
    );
    assert_eq!(l["refused_by"], "tester", "{l}");
    assert_eq!(l["agent_calls"], 3, "{l}");
    // Hedging: only what holds on a busy 2-core machine. A hedged slow call ends near
    // after + one normal call (~200 ms), far under the slow agent's 400 ms.
    let h = &summary["hedge"];
    for run in ["unhedged", "hedged"] {
        assert!(h[run]["calls"].as_u64().unwrap() > 0, "{run}: {h}");
        assert_eq!(h[run]["failed"], 0, "{run}: {h}");
    }
    let hedged = &h["hedged"];
    assert!(hedged["attempts_per_call"].as_f64().unwrap() <= 1.3, "{h}");
    assert!(
        hedged["p99_ms"].as_f64().unwrap() < h["slow_ms"].as_f64().unwrap(),
        "hedging cut the tail: {h}"
    );
    // Predicted saturation: demand ramping onto the weak agent is seen coming before it is full.
    let p = &summary["predict"];
    assert!(p["callers"].as_u64().unwrap() > 1, "{p}");
    assert!(p["actual_crossed_s"].as_f64().is_some(), "{p}");
    assert!(p["lead_s"].as_f64().is_some_and(|lead| lead > 0.0), "{p}");
    assert!(p["refused"].as_u64().is_some(), "{p}");

    // The scale signal: the fleet's demand ratio rises with the callers and falls after them.
    let sc = &summary["scale"];
    assert!(sc["capacity"].as_u64().unwrap() > 0, "{sc}");
    let ratios: Vec<f64> = sc["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ratio"].as_f64().unwrap())
        .collect();
    assert_eq!(ratios.len(), 4, "{sc}");
    assert!(
        ratios[0] < ratios[1] && ratios[1] < ratios[2],
        "rises: {sc}"
    );
    assert!(ratios[3] < ratios[2], "falls: {sc}");
    assert!(sc["ratio_after"].as_f64().unwrap() < ratios[1], "{sc}");
    assert!(
        sc["failed"].as_u64().unwrap() * 100 <= sc["calls"].as_u64().unwrap(),
        "{sc}"
    );

    // coder-2's model account drains. Budget-aware: its headroom falls, its share drops under
    // 5 % with budget left, and no call hits a 429, the caller's or an agent's model call.
    let b = &summary["budget"];
    assert_eq!(b["agent"], "coder-2", "{b}");
    let aware = &b["aware"];
    let samples = aware["samples"].as_array().unwrap();
    assert!(samples.len() >= 2, "{b}");
    assert!(samples[0]["share"].as_f64().unwrap() > 0.1, "{b}");
    assert!(
        samples
            .iter()
            .any(|s| s["headroom"].as_f64().is_some_and(|h| h < 1.0)),
        "its headroom fell: {b}"
    );
    assert!(aware["out_after_s"].as_f64().is_some(), "{b}");
    assert!(aware["left_when_out"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(aware["caller_429"], 0, "{b}");
    assert_eq!(aware["agent_429"], 0, "{b}");
    assert!(
        aware["caller_failed"].as_u64().unwrap() * 100 <= aware["calls"].as_u64().unwrap(),
        "{b}"
    );
    // The same fleet with `model_budgets.steer: false`: its headroom is learned and falls as
    // before, but it keeps its share with its budget nearly gone, and its model calls hit 429s.
    let unaware = &b["unaware"];
    assert!(
        b["unaware_by"].as_str().unwrap().contains("steer: false"),
        "{b}"
    );
    assert!(
        unaware["samples"][0]["share"].as_f64().unwrap() > 0.1,
        "{b}"
    );
    assert!(
        unaware["samples"].as_array().unwrap().iter().any(|s| {
            s["headroom"].as_f64().is_some_and(|h| h < 0.5) && s["share"].as_f64().unwrap() > 0.1
        }),
        "ignored, not unknown: {b}"
    );
    assert!(unaware["agent_429"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(
        unaware["left_when_out"].as_u64().unwrap_or(0),
        0,
        "not out while budget was left: {b}"
    );
}

#[test]
fn demo_prints_a_table() {
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--duration", "500ms"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "agent",
        "requests",
        "p95 ms",
        "coder-1",
        "coder-2",
        "coder-3",
        "caller saw",
        "hostile input",
        "slow agent",
        "quality drift",
        "membership by gossip",
        "predicted saturation",
        "MCP:",
        "scale signal",
        "model budget",
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
}
