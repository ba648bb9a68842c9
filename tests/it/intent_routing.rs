//! Intent routing end to end: a caller's sidecar picks the capability of an `any.reach` call (or
//! one with `reach-intent`) by the fleet policy's keyword rules, says so in
//! `reach-resolved-capability`, lets an explicit `reach-capability` win, refuses an unresolved or
//! ambiguous intent with 400 naming the candidates, and follows a policy reload live.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach::config::{self, ConfigPaths};
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::{MockAgent, MockConfig};

const RULES: &str = "\
intent_threshold: 0.6
intents:
  - { capability: data-fetch, keywords: [fetch, crawl, download] }
  - { capability: review, keywords: [review, pull request] }
";

/// Two agents behind their sidecars (`fetcher-1` serves data-fetch, `reviewer-1` review), and a
/// caller whose policy, read from a file it watches, holds the intent rules.
struct Fleet {
    _agents: Vec<MockAgent>,
    _callees: Vec<Sidecar>,
    caller: Sidecar,
    policy: PathBuf,
}

impl Fleet {
    async fn start(tag: &str, policy_text: &str) -> Self {
        let mut agents = Vec::new();
        let mut callees = Vec::new();
        let mut caller =
            Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
        for (name, capability) in [("fetcher-1", "data-fetch"), ("reviewer-1", "review")] {
            let agent = mock(MockConfig::new(name)).await;
            let callee = sidecar(Bootstrap::local(name, agent.addr, &[capability]).unwrap()).await;
            caller = caller
                .with_peer(name, callee.addrs.inbound, &[capability])
                .unwrap();
            agents.push(agent);
            callees.push(callee);
        }
        caller.watch_interval = config::HumanDuration::from_millis(50);
        let policy = std::env::temp_dir().join(format!(
            "agent-reach-intent-{tag}-{}.yaml",
            std::process::id()
        ));
        std::fs::write(&policy, policy_text).unwrap();
        let paths = ConfigPaths {
            bootstrap: None,
            policy: Some(policy.clone()),
        };
        let caller = sidecar_with(caller, config::load_policy(&policy).unwrap(), paths).await;
        Self {
            _agents: agents,
            _callees: callees,
            caller,
            policy,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/task", self.caller.addrs.outbound)
    }

    /// A call to `any.reach` with these extra headers and body.
    async fn any(&self, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut all = vec![("host", "any.reach")];
        all.extend_from_slice(headers);
        send(&client(), "POST", &self.url(), &all, body).await
    }

    /// Replaces the policy file whole (written aside, then renamed over it).
    fn publish(&self, text: &str) {
        let tmp = self.policy.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.policy).unwrap();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.policy);
    }
}

#[tokio::test]
async fn an_intent_header_reaches_the_agent_serving_its_capability() {
    let fleet = Fleet::start("header", RULES).await;
    let reply = fleet
        .any(&[("reach-intent", "Please CRAWL this site")], "{}")
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-agent"), "fetcher-1", "{reply:?}");
    assert_eq!(
        reply.header("reach-resolved-capability"),
        "data-fetch; by=intent; keyword=\"crawl\"; confidence=1.00"
    );

    // The header alone asks for intent routing too, on the plain loopback authority.
    let reply = send(
        &client(),
        "POST",
        &fleet.url(),
        &[("reach-intent", "review my pull request")],
        "",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-agent"), "reviewer-1", "{reply:?}");
    assert_eq!(
        reply.header("reach-resolved-capability"),
        "review; by=intent; keyword=\"pull request\"; confidence=1.00"
    );

    // A call that names its capability is routed as ever, with no resolution header.
    let reply = send(
        &client(),
        "POST",
        &fleet.url(),
        &[("reach-capability", "data-fetch")],
        "",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-resolved-capability"), "");
}

#[tokio::test]
async fn without_a_header_the_body_says_what_the_call_is_for() {
    let fleet = Fleet::start("body", RULES).await;
    let json = r#"{"prompt": "Download the quarterly report", "max_tokens": 100}"#;
    let reply = fleet
        .any(&[("content-type", "application/json")], json)
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-agent"), "fetcher-1", "{reply:?}");
    assert!(
        reply
            .header("reach-resolved-capability")
            .starts_with("data-fetch; by=intent; keyword=\"download\""),
        "{reply:?}"
    );

    let reply = fleet.any(&[], "please review this diff").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-agent"), "reviewer-1", "{reply:?}");
}

#[tokio::test]
async fn an_explicit_capability_overrides_the_intent_and_says_so() {
    let fleet = Fleet::start("override", RULES).await;
    let reply = fleet
        .any(
            &[
                ("reach-intent", "crawl this site"),
                ("reach-capability", "review"),
            ],
            "",
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-agent"), "reviewer-1", "{reply:?}");
    assert_eq!(
        reply.header("reach-resolved-capability"),
        "review; by=override"
    );

    // The note rides on the sidecar's own errors too: nobody serves `search`.
    let reply = fleet
        .any(&[("reach-capability", "search")], "crawl this site")
        .await;
    assert_eq!(reply.status, 404, "{}", reply.body);
    assert_eq!(
        reply.header("reach-resolved-capability"),
        "search; by=override"
    );
}

#[tokio::test]
async fn an_unresolved_or_ambiguous_intent_is_a_400_naming_the_candidates() {
    let fleet = Fleet::start("refused", RULES).await;
    let reply = fleet.any(&[("reach-intent", "hello there")], "").await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "intent_unresolved");
    let body = reply.json();
    assert_eq!(body["error"], "intent_unresolved");
    assert_eq!(body["candidates"][0]["capability"], "data-fetch");
    assert_eq!(body["candidates"][1]["keywords"][1], "pull request");
    assert!(
        body["message"].as_str().unwrap_or("").contains("`review`"),
        "{body}"
    );

    // "review" (6) against "crawl" (5): confidence 6 / 11, under 0.6.
    let reply = fleet
        .any(&[("reach-intent", "crawl then review")], "")
        .await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "intent_ambiguous");
    let body = reply.json();
    let candidates = body["candidates"].as_array().cloned().unwrap_or_default();
    let named: Vec<(&str, &str)> = candidates
        .iter()
        .map(|c| {
            (
                c["capability"].as_str().unwrap_or(""),
                c["keyword"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(named, [("review", "review"), ("data-fetch", "crawl")]);

    // An empty body and no header: nothing to resolve.
    let reply = fleet.any(&[], "").await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "intent_unresolved");
}

#[tokio::test]
async fn a_policy_reload_changes_the_rules_live() {
    let fleet = Fleet::start("reload", RULES).await;
    let reply = fleet.any(&[("reach-intent", "scrape it")], "").await;
    assert_eq!(reply.status, 400, "{}", reply.body);

    fleet.publish(
        "intents:\n  - { capability: data-fetch, keywords: [scrape] }\n  - { capability: review, keywords: [crawl] }\n",
    );
    eventually(Duration::from_secs(10), "the new rules apply", || async {
        let reply = fleet.any(&[("reach-intent", "scrape it")], "").await;
        reply.status == 200 && reply.header("reach-agent") == "fetcher-1"
    })
    .await;
    let reply = fleet.any(&[("reach-intent", "crawl it")], "").await;
    assert_eq!(reply.header("reach-agent"), "reviewer-1", "{reply:?}");

    // A bad version (a keyword shared by two rules) is rejected: the running rules stay.
    fleet.publish(
        "intents:\n  - { capability: data-fetch, keywords: [crawl] }\n  - { capability: review, keywords: [crawl] }\n",
    );
    eventually(
        Duration::from_secs(10),
        "the bad version is rejected",
        || async {
            fleet
                .caller
                .store()
                .reload_error()
                .is_some_and(|e| e.message.contains("is also a keyword of"))
        },
    )
    .await;
    let reply = fleet.any(&[("reach-intent", "crawl it")], "").await;
    assert_eq!(reply.header("reach-agent"), "reviewer-1", "{reply:?}");
}
