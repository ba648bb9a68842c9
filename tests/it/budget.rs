//! Model budgets (docs/model-budgets.md): agents call a mock model provider through their own
//! sidecars; the rate-limit headers of its answers steer a caller's work away from an agent whose
//! budget runs dry before the provider ever answers 429, a group's members share what one learns,
//! and hostile values are bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::config::{ExternalTarget, HumanDuration, Name, Policy, TargetEndpoint};
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::{Latency, MockAgent, MockConfig, ModelCall, ProviderBudget, ProviderHeaders};

/// The capability an agent's sidecar names its model provider by.
const LLM: &str = "llm";

fn provider_config(requests: u64, window: Duration, headers: ProviderHeaders) -> MockConfig {
    let mut config = MockConfig::new("provider");
    config.provider = ProviderBudget {
        requests: Some(requests),
        window,
        headers,
        ..ProviderBudget::default()
    };
    config
}

fn llm_target(provider: SocketAddr, group: Option<&str>) -> ExternalTarget {
    ExternalTarget {
        name: Name::parse(LLM).unwrap(),
        capability: Name::parse(LLM).unwrap(),
        endpoints: vec![TargetEndpoint::parse(&provider.to_string()).unwrap()],
        ca_file: None,
        timeout: None,
        max_concurrency: None,
        rate_limit: None,
        budget_group: group.map(|g| Name::parse(g).unwrap()),
        model_provider: true,
    }
}

/// An agent serving `CAP` behind its sidecar; with `provider`, the sidecar has the model target,
/// and with `calls_model` each task first calls the model through that sidecar.
async fn agent(
    name: &str,
    provider: Option<(SocketAddr, Option<&str>)>,
    calls_model: bool,
) -> (MockAgent, Sidecar) {
    agent_with(name, provider, calls_model, |b| b).await
}

/// [`agent`], its bootstrap adjusted by `tune` (gossip, for one).
async fn agent_with(
    name: &str,
    provider: Option<(SocketAddr, Option<&str>)>,
    calls_model: bool,
    tune: impl FnOnce(Bootstrap) -> Bootstrap,
) -> (MockAgent, Sidecar) {
    // Each agent answers in 20 ms, a model call on the way or not: the share watched is the
    // budget's, not a latency preference (a clearly faster peer wins every tie).
    let mut config = MockConfig::new(name);
    config.latency = Latency::fixed(Duration::from_millis(20));
    let agent = mock(config).await;
    let mut policy = quick_parole();
    if let Some((addr, group)) = provider {
        policy.targets.push(llm_target(addr, group));
    }
    let bootstrap = tune(Bootstrap::local(name, agent.addr, &[CAP]).unwrap());
    let side = sidecar_with(bootstrap, policy, Default::default()).await;
    if calls_model {
        agent.set_model(ModelCall {
            outbound: side.addrs.outbound,
            capability: LLM.to_owned(),
        });
    }
    (agent, side)
}

/// Parole served at once, and its prior (availability 0.7) forgiven as fast: the share this
/// test watches is the budget's, not a new agent's, nor that of one the first picks passed over.
fn quick_parole() -> Policy {
    let mut policy = Policy::default();
    policy.states.parole.duration = HumanDuration::from_millis(0);
    policy.estimates.availability_recovery = HumanDuration::from_millis(300);
    policy
}

/// A caller that knows the agents as static peers and reads their self-views every 20 ms.
async fn caller(agents: &[(&str, &Sidecar)]) -> Sidecar {
    caller_steering(agents, true).await
}

/// [`caller`], with the policy's `model_budgets.steer` as given.
async fn caller_steering(agents: &[(&str, &Sidecar)], steer: bool) -> Sidecar {
    let mut bootstrap =
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    for (name, side) in agents {
        bootstrap = bootstrap
            .with_peer(name, side.addrs.inbound, &[CAP])
            .unwrap();
    }
    let mut policy = quick_parole();
    policy.peer_views.poll_interval = HumanDuration::from_millis(20);
    policy.model_budgets.steer = steer;
    sidecar_with(bootstrap, policy, Default::default()).await
}

/// The agent's own sidecar calls its model directly `n` times (the agent's own work).
async fn spend(side: &Sidecar, n: usize) {
    let url = format!("http://{}/v1/chat/completions", side.addrs.outbound);
    for _ in 0..n {
        let reply = send(&client(), "POST", &url, &[("reach-capability", LLM)], "{}").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
}

/// One task through the caller, paced so the caller reads the peers' views between calls.
async fn task(caller: &Sidecar, pace: &mut tokio::time::Interval) -> Reply {
    pace.tick().await;
    send(
        &client(),
        "POST",
        &format!("http://{}/review", caller.addrs.outbound),
        &[("reach-capability", CAP)],
        "diff",
    )
    .await
}

fn pace() -> tokio::time::Interval {
    tokio::time::interval(Duration::from_millis(25))
}

/// The agent's own tightest headroom and the seconds to its reset, as its `/status` says.
fn own_budget(side: &Sidecar) -> Option<(f64, f64)> {
    side.status()
        .model_budget
        .map(|b| (b.headroom, b.reset_in_s))
}

/// Whether the caller's last read of `name`'s self-view carries a spent budget.
fn caller_sees_spent(caller: &Sidecar, name: &str) -> bool {
    caller.status().peer_views.iter().any(|p| {
        p.name == name
            && p.self_view.as_ref().is_some_and(|v| {
                v.budget
                    .iter()
                    .any(|b| b.figure.is_some_and(|f| f.headroom <= 0.0))
            })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_budget_drains_is_avoided_before_any_429_and_returns_at_the_reset() {
    let provider = mock(provider_config(
        10,
        Duration::from_secs(5),
        ProviderHeaders::Honest,
    ))
    .await;
    let (a, a_side) = agent("coder-a", Some((provider.addr, None)), true).await;
    let (b, b_side) = agent("coder-b", None, false).await;
    let (c, c_side) = agent("coder-c", None, false).await;
    let caller = caller(&[
        ("coder-a", &a_side),
        ("coder-b", &b_side),
        ("coder-c", &c_side),
    ])
    .await;

    // Tasks keep coming while coder-a's own work drains its budget steadily (one model call
    // per task sent, through its sidecar, while its headroom lasts); every task routed to it
    // spends one more. Its share shrinks with the budget and is gone while calls are left.
    let mut pace = pace();
    let mut shrinking = Vec::new();
    let mut sent = 0;
    while own_budget(&a_side).is_none_or(|(h, _)| h > 0.0) {
        spend(&a_side, 1).await;
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        if let Some((h, _)) = own_budget(&a_side).filter(|(h, _)| *h > 0.0 && *h < 1.0) {
            assert_eq!(a_side.status().self_state, "budget-limited");
            shrinking.push(h);
        }
        sent += 1;
        assert!(sent < 20, "coder-a never ran dry");
    }
    assert!(!shrinking.is_empty(), "a shrinking share on the way down");
    let (_, reset_in) = own_budget(&a_side).unwrap();
    assert!(
        reset_in > 1.0,
        "drained well before the reset: {reset_in}s left"
    );
    eventually(
        Duration::from_secs(2),
        "the caller reads the spent budget",
        || async { caller_sees_spent(&caller, "coder-a") },
    )
    .await;
    // Until the reset, every task goes to the others, and succeeds.
    let before = a.stats().business;
    for _ in 0..20 {
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert_eq!(a.stats().business, before, "coder-a is avoided while spent");
    assert!(b.stats().business + c.stats().business >= 20);
    assert_eq!(
        provider.provider_stats().refused,
        0,
        "the provider never answered 429"
    );

    // At the reset coder-a comes back, with no probe and no call failing on the way.
    let before = a.stats().business;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.stats().business == before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "coder-a never came back: its own {:?}; the caller's peer views {}; its view {:?}",
            a_side.status().model_budget,
            // Scores, latencies and availabilities: what kept the pick off it.
            get(&client(), &format!("http://{}/status", caller.addrs.admin))
                .await
                .json()["peer_views"],
            caller
                .status()
                .peer_views
                .iter()
                .find(|p| p.name == "coder-a")
                .map(|p| (
                    p.effective_cap,
                    p.effective_state,
                    p.self_view.as_ref().map(|v| v.budget.clone())
                ))
        );
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert_eq!(
        provider.provider_stats().refused,
        0,
        "the provider never answered 429"
    );
}

/// `model_budgets: { steer: false }`: the agent's sidecar still learns and publishes its spent
/// budget and the caller hears it, but keeps sending the agent its share, so its provider answers
/// 429s; turned back on by a live reload, the caller passes it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_steering_off_the_drained_agent_keeps_its_share_until_its_provider_answers_429() {
    let provider = mock(provider_config(
        10,
        Duration::from_secs(30),
        ProviderHeaders::Honest,
    ))
    .await;
    let (a, a_side) = agent("coder-a", Some((provider.addr, None)), true).await;
    let (b, b_side) = agent("coder-b", None, false).await;
    let (c, c_side) = agent("coder-c", None, false).await;
    let agents = [
        ("coder-a", &a_side),
        ("coder-b", &b_side),
        ("coder-c", &c_side),
    ];
    let caller = caller_steering(&agents, false).await;
    // All three take tasks from the start, so the caller knows each equally well; then coder-a's
    // own work spends its budget down to the reserve.
    let mut pace = pace();
    for _ in 0..9 {
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let mut spent = 0;
    while own_budget(&a_side).is_none_or(|(h, _)| h > 0.0) {
        spend(&a_side, 1).await;
        spent += 1;
        assert!(spent < 10, "coder-a never ran dry");
    }
    assert_eq!(provider.provider_stats().refused, 0);
    assert_eq!(a_side.status().self_state, "budget-limited");
    eventually(
        Duration::from_secs(2),
        "the caller hears the spent budget",
        || async { caller_sees_spent(&caller, "coder-a") },
    )
    .await;
    // Heard and ignored: coder-a gets its share, spends the request left, then is refused.
    let before = a.stats().business;
    let mut sent = 0;
    while provider.provider_stats().refused == 0 {
        task(&caller, &mut pace).await;
        sent += 1;
        assert!(
            sent < 60,
            "coder-a was sent {} tasks of {sent}; the caller's view {:?}",
            a.stats().business - before,
            caller
                .status()
                .peer_views
                .iter()
                .find(|p| p.name == "coder-a")
                .map(|p| (p.effective_cap, p.last_factors))
        );
    }
    assert!(a.stats().business >= before + 2, "{}", a.stats().business);
    assert!(b.stats().business + c.stats().business > 0);

    // Steering back on, live: the spent budget (still heard) keeps coder-a out.
    let snapshot = caller.store().snapshot();
    let mut policy = snapshot.policy.clone();
    policy.model_budgets.steer = true;
    assert!(caller.store().replace(snapshot.bootstrap.clone(), policy));
    let before = (a.stats().business, provider.provider_stats().refused);
    for _ in 0..20 {
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert_eq!(
        (a.stats().business, provider.provider_stats().refused),
        before
    );
}

// A member of a group that has made no model call is not held to another member's spent
// account: a figure speaks for the others only from a publisher the policy names, on the same
// credential (`docs/model-budgets.md`), and these static peers prove no identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_member_that_made_no_model_call_is_not_held_to_another_members_spent_account() {
    let provider = mock(provider_config(
        10,
        Duration::from_secs(30),
        ProviderHeaders::Honest,
    ))
    .await;
    let account = Some((provider.addr, Some("acme-openai")));
    let (a, a_side) = agent("coder-a", account, true).await;
    let (b, b_side) = agent("coder-b", account, false).await;
    let caller = caller(&[("coder-a", &a_side), ("coder-b", &b_side)]).await;
    spend(&a_side, 9).await;
    assert_eq!(own_budget(&a_side).map(|(h, _)| h), Some(0.0));
    eventually(
        Duration::from_secs(2),
        "the caller reads coder-a's spent budget",
        || async { caller_sees_spent(&caller, "coder-a") },
    )
    .await;
    let mut pace = pace();
    for _ in 0..20 {
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert_eq!(a.stats().business, 0, "coder-a spent its account");
    assert_eq!(b.stats().business, 20, "coder-b speaks for itself");
    assert_ne!(b_side.status().self_state, "budget-limited");
}

// An ordinary target (not a model provider) answering 429 with a long wait cools that target;
// it does not make the agent budget-limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_targets_429_teaches_no_model_budget() {
    let inventory = mock(provider_config(
        0,
        Duration::from_secs(600),
        ProviderHeaders::Honest,
    ))
    .await;
    let (_a, a_side) = agent_with("coder-a", None, false, |b| b).await;
    let snapshot = a_side.store().snapshot();
    let mut policy = snapshot.policy.clone();
    let mut target = llm_target(inventory.addr, None);
    target.model_provider = false;
    policy.targets.push(target);
    assert!(a_side.store().replace(snapshot.bootstrap.clone(), policy));
    let url = format!("http://{}/v1/chat/completions", a_side.addrs.outbound);
    let reply = send(&client(), "POST", &url, &[("reach-capability", LLM)], "{}").await;
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert_eq!(
        own_budget(&a_side),
        None,
        "{:?}",
        a_side.status().model_budget
    );
    assert_ne!(a_side.status().self_state, "budget-limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_header_values_are_bounded_and_garbage_is_ignored_and_counted() {
    let hostile = mock(provider_config(
        1000,
        Duration::from_secs(60),
        ProviderHeaders::Hostile,
    ))
    .await;
    let garbage = mock(provider_config(
        1000,
        Duration::from_secs(60),
        ProviderHeaders::Garbage,
    ))
    .await;
    let (_h, h_side) = agent("coder-h", Some((hostile.addr, None)), false).await;
    let (g, g_side) = agent("coder-g", Some((garbage.addr, None)), false).await;
    spend(&h_side, 1).await;
    spend(&g_side, 1).await;
    // "Spent for ten years, retry in a decade": believed for at most the bound (10 min).
    let (headroom, reset_in) = own_budget(&h_side).expect("learned");
    assert_eq!(headroom, 0.0);
    assert!(reset_in <= 600.0, "bounded: {reset_in}s");
    let published = h_side.status();
    assert_eq!(published.self_state, "budget-limited");
    // Values that do not parse say nothing: the agent keeps its whole share, and they are counted.
    assert_eq!(
        own_budget(&g_side),
        None,
        "{:?}",
        g_side.status().model_budget
    );
    assert_ne!(g_side.status().self_state, "budget-limited");
    let metrics = get(&client(), &format!("http://{}/metrics", g_side.addrs.admin)).await;
    assert!(
        sum(
            &metrics.body,
            "reach_model_budget_malformed_total",
            "target=\"llm\""
        ) >= 5.0,
        "{}",
        metrics.body
    );
    let caller = caller(&[("coder-g", &g_side)]).await;
    let mut pace = pace();
    let reply = task(&caller, &mut pace).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(g.stats().business, 1);
}

/// A fresh gossip key file for one test.
fn key_file(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("agent-reach-budget-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gossip.key");
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, hex).unwrap();
    path
}

/// Gossip on loopback with timings fast enough for a test.
fn gossiping(seeds: &[SocketAddr], key: &std::path::Path, b: Bootstrap) -> Bootstrap {
    let mut b = b.with_gossip(seeds, key.to_path_buf());
    if let Some(g) = b.gossip.as_mut() {
        g.probe_interval = HumanDuration::from_millis(200);
        g.probe_timeout = HumanDuration::from_millis(100);
        g.refresh_interval = HumanDuration::from_millis(500);
    }
    b
}

/// One model call of `side`'s agent with `key`: its status.
async fn call_with_key(side: &Sidecar, key: &str) -> u16 {
    let url = format!("http://{}/v1/chat/completions", side.addrs.outbound);
    let auth = format!("Bearer {key}");
    let headers = [("reach-capability", LLM), ("authorization", auth.as_str())];
    send(&client(), "POST", &url, &headers, "{}")
        .await
        .status
        .as_u16()
}

// Over gossip and mutual TLS, with `model_budgets.groups.acme.published_by` naming coder-a:
// a member that is not a publisher (mallory, who serves nothing and points her own policy's
// `acme` at a provider she controls, with the group's key) publishes a spent `acme` figure and
// does not hold coder-b back; coder-a spending the account coder-b shares (the same key) holds
// both back. The group's figure travels in `Live` (v5). Another account's key: the unit test
// `budget::learn::tests::a_429_holds_one_credential_for_max_wait_and_a_success_heals_it`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_figure_speaks_only_from_its_publishers_on_the_same_credential() {
    let provider = mock(provider_config(
        10,
        Duration::from_secs(30),
        ProviderHeaders::Honest,
    ))
    .await;
    let exhausted = mock(provider_config(
        0,
        Duration::from_secs(600),
        ProviderHeaders::Honest,
    ))
    .await;
    let key = key_file("group");
    let dir = key.parent().unwrap().to_path_buf();
    let ca = agent_reach::pki::DevCa::new("budget test CA").unwrap();
    let id = |who: &str| format!("spiffe://test.example/ns/agents/sa/{who}");
    let meshed = |who: &str, b: Bootstrap| {
        let mut b = b;
        b.tls = Some(ca.write_files(&dir.join(who), &id(who)).unwrap());
        b
    };
    let group = Name::parse("acme").unwrap();
    let member_policy = |target: ExternalTarget| {
        let mut p = quick_parole();
        p.peer_views.poll_interval = HumanDuration::from_millis(20);
        p.targets.push(target);
        p
    };
    let start = |name: &'static str, target: Option<ExternalTarget>, seeds: Vec<SocketAddr>| {
        let (key, meshed, member_policy) = (&key, &meshed, &member_policy);
        async move {
            let mut config = MockConfig::new(name);
            config.latency = Latency::fixed(Duration::from_millis(20));
            let agent = mock(config).await;
            let b = meshed(
                name,
                gossiping(
                    &seeds,
                    key,
                    Bootstrap::local(name, agent.addr, &[CAP]).unwrap(),
                ),
            );
            let policy = target.map_or_else(quick_parole, member_policy);
            let side = sidecar_with(b, policy, Default::default()).await;
            (agent, side)
        }
    };
    let acme = |addr| ExternalTarget {
        budget_group: Some(group.clone()),
        ..llm_target(addr, None)
    };
    let (a, a_side) = start("coder-a", Some(acme(provider.addr)), vec![]).await;
    let seeds = vec![a_side.addrs.gossip.unwrap()];
    let (b, b_side) = start("coder-b", Some(acme(provider.addr)), seeds.clone()).await;
    let (c, _c_side) = start("coder-c", None, seeds.clone()).await;
    // Mallory serves nothing; her sidecar's `acme` is a provider that is always spent.
    let mallory_agent = mock(MockConfig::new("mallory")).await;
    let mallory = sidecar_with(
        meshed(
            "mallory",
            gossiping(
                &seeds,
                &key,
                Bootstrap::local("mallory", mallory_agent.addr, &[]).unwrap(),
            ),
        ),
        member_policy(acme(exhausted.addr)),
        Default::default(),
    )
    .await;
    let mut caller_policy = quick_parole();
    caller_policy.model_budgets.groups.insert(
        "acme".to_owned(),
        agent_reach::config::BudgetGroupPolicy {
            published_by: vec![
                agent_reach::identity::IdentityPattern::parse(&id("coder-a")).unwrap(),
            ],
        },
    );
    let caller = sidecar_with(
        meshed(
            "caller",
            gossiping(
                &seeds,
                &key,
                Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap(),
            ),
        ),
        caller_policy,
        Default::default(),
    )
    .await;
    eventually(
        Duration::from_secs(15),
        "the caller knows every member by gossip",
        || async {
            let views = caller.status().peer_views;
            ["coder-a", "coder-b", "coder-c"]
                .iter()
                .all(|n| views.iter().any(|p| p.name == *n && p.self_view.is_some()))
                && caller.status().peers.iter().any(|p| p.name == "mallory")
        },
    )
    .await;
    // coder-a and coder-b use the account's key K; mallory spends hers on K's fingerprint too.
    assert_eq!(call_with_key(&b_side, "K").await, 200);
    assert_eq!(call_with_key(&a_side, "K").await, 200);
    for _ in 0..3 {
        assert_eq!(call_with_key(&mallory, "K").await, 429);
    }
    let mut pace = pace();
    // Until the caller has had an answer from each (coder-a's identity is proven then).
    for _ in 0..200 {
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        if a.stats().business > 0 && b.stats().business > 0 && c.stats().business > 0 {
            break;
        }
    }
    assert!(a.stats().business > 0 && b.stats().business > 0);
    let before = b.stats().business;
    for _ in 0..30 {
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert!(
        b.stats().business > before,
        "mallory's figure held coder-b back"
    );
    assert_ne!(b_side.status().self_state, "budget-limited");

    // coder-a (a publisher) now spends the shared account with K: both are held back.
    while provider.provider_stats().served < 9 {
        assert_eq!(call_with_key(&a_side, "K").await, 200);
    }
    eventually(
        Duration::from_secs(5),
        "the spent budget travels by gossip",
        || async { caller_sees_spent(&caller, "coder-a") },
    )
    .await;
    let (a_before, b_before, c_before) =
        (a.stats().business, b.stats().business, c.stats().business);
    for _ in 0..20 {
        let reply = task(&caller, &mut pace).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert_eq!(a.stats().business, a_before, "coder-a spent the account");
    assert_eq!(
        b.stats().business,
        b_before,
        "coder-b shares the account and the key"
    );
    assert_eq!(c.stats().business, c_before + 20);
    assert_eq!(provider.provider_stats().refused, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Token accounting: the `usage` of a JSON answer and of a stream's last event, counted by type,
/// model and provider; the stream still reaches the agent whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_reported_by_json_and_streamed_answers_are_counted() {
    let provider = mock(provider_config(
        100,
        Duration::from_secs(60),
        ProviderHeaders::Honest,
    ))
    .await;
    let (_a, a_side) = agent("coder-a", Some((provider.addr, None)), false).await;
    let url = format!("http://{}/v1/chat/completions", a_side.addrs.outbound);
    let json = send(
        &client(),
        "POST",
        &url,
        &[("reach-capability", LLM)],
        r#"{"model":"gpt-test"}"#,
    )
    .await;
    assert_eq!(json.status, 200, "{}", json.body);
    let streamed = send(
        &client(),
        "POST",
        &url,
        &[("reach-capability", LLM)],
        r#"{"model":"gpt-test","stream":true}"#,
    )
    .await;
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert!(streamed.body.contains("\"usage\"") && streamed.body.ends_with("data: [DONE]\n\n"));
    let series = "gen_ai_client_token_usage{";
    let labels = "gen_ai_request_model=\"gpt-test\"";
    eventually(
        Duration::from_secs(2),
        "both answers' tokens are counted",
        || async {
            let metrics = get(&client(), &format!("http://{}/metrics", a_side.addrs.admin)).await;
            let output = sum(&metrics.body, series, "gen_ai_token_type=\"output\"");
            let input = sum(&metrics.body, series, "gen_ai_token_type=\"input\"");
            output == 12.0
                && input >= 2.0
                && metrics.body.lines().any(|l| {
                    l.starts_with(series)
                        && l.contains(labels)
                        && l.contains("gen_ai_provider_name=\"llm\"")
                })
        },
    )
    .await;
}

/// A sidecar whose model capability (`LLM`, the mock provider) has a first-event deadline.
async fn first_event_sidecar() -> (MockAgent, MockAgent, Sidecar) {
    let provider = mock(provider_config(
        100,
        Duration::from_secs(60),
        ProviderHeaders::Honest,
    ))
    .await;
    let agent = mock(MockConfig::new("coder-a")).await;
    let yaml = format!("capabilities: {{ {LLM}: {{ first_event_timeout: 2s }} }}");
    let mut policy =
        agent_reach::config::parse_policy(std::path::Path::new("p.yaml"), &yaml).expect("a policy");
    policy.targets.push(llm_target(provider.addr, None));
    let bootstrap = Bootstrap::local("coder-a", agent.addr, &[CAP]).unwrap();
    let side = sidecar_with(bootstrap, policy, Default::default()).await;
    (provider, agent, side)
}

/// The tokens of type `kind` the sidecar at `admin` has counted.
async fn tokens_counted(side: &Sidecar, kind: &str) -> f64 {
    let metrics = get(&client(), &format!("http://{}/metrics", side.addrs.admin)).await;
    let with = format!("gen_ai_token_type=\"{kind}\"");
    sum(&metrics.body, "gen_ai_client_token_usage{", &with)
}

/// A first-event deadline on the model's capability reads a stream's first event early, and the
/// event stays the body's: Anthropic's `message_start`, which alone carries the input tokens, is
/// counted, and the agent gets the stream whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_first_event_read_for_its_deadline_still_has_its_tokens_counted() {
    let (_provider, _agent, side) = first_event_sidecar().await;
    let body = r#"{"model":"claude-test","stream":true,"messages":[{"role":"user","content":"Review this change, please."}]}"#;
    let url = format!("http://{}/v1/messages", side.addrs.outbound);
    let streamed = send(&client(), "POST", &url, &[("reach-capability", LLM)], body).await;
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert!(
        streamed.body.starts_with("event: message_start\n")
            && streamed.body.ends_with("\"message_stop\"}\n\n"),
        "{}",
        streamed.body
    );
    let prompt = (body.len() / 4) as f64;
    eventually(
        Duration::from_secs(2),
        "the first event's input tokens are counted",
        || async {
            tokens_counted(&side, "input").await == prompt
                && tokens_counted(&side, "output").await == 6.0
        },
    )
    .await;
}

/// Anthropic's own SDK in its default configuration (the `.reach` form, the outbound port as the
/// pod's `HTTP_PROXY`) streams a message through the same sidecar: it reads the whole message,
/// and the sidecar counts the tokens the SDK was told of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropics_sdk_streams_through_the_reach_form_and_its_tokens_are_counted() {
    let Some(python) = support::sdk::venv_python().await else {
        return;
    };
    let (_provider, _agent, side) = first_event_sidecar().await;
    let logs = std::env::temp_dir().join(format!("anthropic-sdk-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    let port = side.addrs.outbound.port().to_string();
    let script = support::sdk::repo().join("tests/sdk/anthropic_stream.py");
    let args = [port.as_str(), LLM];
    let mut sdk = support::sdk::Sdk::spawn(&python, &script, &args, &logs, "anthropic");
    let read = sdk
        .next_json(Duration::from_secs(30), "the SDK's message")
        .await;
    assert_eq!(read["text"], "The answer is forty-two.", "{read}");
    let (input, output) = (
        read["input_tokens"].as_f64(),
        read["output_tokens"].as_f64(),
    );
    assert!(input.is_some_and(|n| n >= 1.0), "{read}");
    assert_eq!(output, Some(6.0), "{read}");
    eventually(
        Duration::from_secs(2),
        "the tokens the SDK was told of are counted",
        || async {
            Some(tokens_counted(&side, "input").await) == input
                && Some(tokens_counted(&side, "output").await) == output
        },
    )
    .await;
    let _ = std::fs::remove_dir_all(&logs);
}

/// Gemini states its wait only in a 429's JSON body (`RetryInfo.retryDelay`, chunked here): the
/// sidecar reads it as a `retry-after` — no headroom until then — and the agent gets the body
/// unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_429s_retry_delay_in_its_body_spends_the_budget_and_the_body_passes_unchanged() {
    let provider = mock(provider_config(
        2,
        Duration::from_secs(30),
        ProviderHeaders::Gemini,
    ))
    .await;
    let (_a, a_side) = agent("coder-a", Some((provider.addr, None)), false).await;
    spend(&a_side, 2).await;
    assert_eq!(
        own_budget(&a_side),
        None,
        "no rate-limit headers: nothing learned"
    );
    let url = format!("http://{}/v1/chat/completions", a_side.addrs.outbound);
    let refused = send(&client(), "POST", &url, &[("reach-capability", LLM)], "{}").await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(provider.provider_stats().refused, 1);
    assert!(refused.header("retry-after").is_empty(), "no header added");
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body.to_string(), refused.body, "passed on byte for byte");
    let delay = body["error"]["details"][1]["retryDelay"].as_str().unwrap();
    let delay: f64 = delay.trim_end_matches('s').parse().unwrap();
    assert!(delay >= 25.0, "{delay}");
    let (headroom, reset_in) = own_budget(&a_side).expect("learned from the body");
    assert_eq!(headroom, 0.0);
    assert!(
        (reset_in - delay).abs() <= 2.0,
        "{reset_in}s, the body said {delay}s"
    );
    assert_eq!(a_side.status().self_state, "budget-limited");
}

/// A provider outside the mesh gets none of the sidecars' `reach-*` headers (the deadline the
/// sidecar adds, nor those the agent sent), but the W3C trace context and the agent's own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_target_gets_no_reach_header_but_the_trace_context() {
    let provider = mock(provider_config(
        100,
        Duration::from_secs(60),
        ProviderHeaders::Honest,
    ))
    .await;
    let (_a, a_side) = agent("coder-a", Some((provider.addr, None)), false).await;
    let url = format!("http://{}/v1/chat/completions", a_side.addrs.outbound);
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let headers = [
        ("reach-capability", LLM),
        ("reach-tags", "fast"),
        ("reach-timeout", "5s"),
        ("traceparent", traceparent),
        ("x-goog-api-key", "sk-secret"),
    ];
    let reply = send(&client(), "POST", &url, &headers, "{}").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let seen = provider.provider_stats();
    assert_eq!((seen.served, seen.reach_headers, seen.traced), (1, 0, 1));
}
