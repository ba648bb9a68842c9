//! The demo's async-task act (`docs/tasks.md`). First, output validation: one agent starts
//! answering plausible fakes (200, JSON of the wrong shape); its sidecar checks each answer
//! against the capability's `output_schema` and turns them into `502 invalid_output`, so the
//! caller's tasks pass over it to agents whose output validates. Then the caller hands off a long job with
//! `prefer: respond-async`, naming no capability — only its intent, resolved by the policy's
//! keyword rules. It is stored and answered `202` at once. Every agent is refusing work, so the
//! fallback chain fails, runs again from the queue, fails again, and the task is escalated to a
//! person's webhook with every attempt's reason, signed. The person fixes the agents and sends
//! the task back (`POST /reach/v1/tasks/<id>/retry`); it runs and is done. Last, the caller
//! is killed with tasks queued and started again (`task_restart.rs`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde::Serialize;
use tokio::net::TcpListener;

use super::task_api::{read_json, task};
use super::{DemoError, Fleet, CAPABILITY};
use agent_reach::config::{FinalFallback, HumanDuration, IntentRule, Intents, Name, QueueRounds};
use agent_reach::http::{body, client};
use testkit::Mode;

/// The key the webhook's POSTs are signed with.
const KEY: &[u8] = b"demo-escalation-key";

#[derive(Clone, Debug, Serialize)]
pub struct TasksSummary {
    /// The agent that gave plausible fakes, the tasks submitted meanwhile, how many were done
    /// with a validated answer, the fakes turned away (`invalid_output` attempts) and the tasks
    /// whose final answer came from the faker (must be 0).
    pub faker: String,
    pub checked_tasks: u64,
    pub checked_done: u64,
    pub fakes_passed_over: u64,
    pub answered_by_faker: u64,
    /// What `reach-resolved-capability` said of the intent.
    pub resolved: String,
    /// How long the `202` took (stored and committed first).
    pub accepted_ms: f64,
    /// Rounds of the chain before the escalation, and the attempts they made.
    pub rounds: u64,
    pub attempts: u64,
    /// From the submission to the webhook's accepting the escalation.
    pub escalated_after_ms: Option<f64>,
    /// POSTs the webhook got, the attempt reasons in the one accepted, and whether its
    /// signature verified with the key.
    pub webhook_posts: usize,
    pub reasons_sent: usize,
    pub signature_ok: bool,
    /// From the person's retry to `done`, and the agent's status in the stored answer.
    pub done_after_retry_ms: Option<f64>,
    pub final_state: String,
    pub answer_status: Option<u64>,
    /// The caller killed with tasks queued and started again (`task_restart.rs`).
    pub restart: super::task_restart::RestartSummary,
}

/// Tasks submitted while one agent gives plausible fakes.
const CHECKED_TASKS: u64 = 12;

pub(super) async fn run(fleet: &mut Fleet) -> Result<TasksSummary, DemoError> {
    let http = client::build(&fleet.policy);
    let outbound = fleet.caller.addrs.outbound;
    fleet.update_policy(|p| p.retry.fallback.interval = HumanDuration::from_millis(100));
    let faker = fleet.agents[0].0.name().to_owned();
    fleet.agents[0].0.set_mode(Mode::WrongShape);
    let mut ids = Vec::new();
    for n in 0..CHECKED_TASKS {
        let request = Request::post(format!("http://{outbound}/review"))
            .header("reach-capability", CAPABILITY)
            .header("prefer", "respond-async")
            .body(body::full(format!(r#"{{"code":"x = {n}"}}"#)))
            .map_err(|e| DemoError::Config(e.to_string()))?;
        if let Ok(response) = http.request(request).await {
            if let Some(id) = read_json(response).await["id"].as_str() {
                ids.push(id.to_owned());
            }
        }
    }
    let (mut checked_done, mut fakes_passed_over, mut answered_by_faker) = (0, 0, 0);
    for id in &ids {
        let _ = wait_for(&http, outbound, id, Duration::from_secs(20), |t| {
            t["state"] != "queued" && t["state"] != "running" && t["state"] != "retrying"
        })
        .await;
        let t = task(&http, outbound, id).await;
        let attempts = t["attempts"].as_array().cloned().unwrap_or_default();
        fakes_passed_over += attempts
            .iter()
            .filter(|a| {
                a["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("invalid_output"))
            })
            .count() as u64;
        if t["state"] == "done" {
            checked_done += 1;
            if attempts
                .last()
                .is_some_and(|a| a["agent"] == faker.as_str())
            {
                answered_by_faker += 1;
            }
        }
    }
    fleet.agents[0].0.set_mode(Mode::Normal);

    let (webhook, posts) = webhook().await?;
    let key_file = fleet.key_dir.join("escalation.key");
    std::fs::write(&key_file, KEY)?;
    let rule = IntentRule {
        capability: Name::parse(CAPABILITY).map_err(DemoError::Config)?,
        keywords: vec!["review".to_owned(), "diff".to_owned()],
    };
    let intents = Intents::compile(vec![rule]).map_err(DemoError::Config)?;
    fleet.update_policy(|p| {
        p.retry.fallback.interval = HumanDuration::from_millis(200);
        p.retry.fallback.final_fallback = FinalFallback::Escalate;
        p.retry.fallback.queue = Some(QueueRounds {
            delay: HumanDuration::from_millis(500),
            max_delay: HumanDuration::from_secs(1),
            max_rounds: 1,
        });
        p.escalation.webhook = Some(webhook.clone());
        p.escalation.key_file = Some(key_file.clone());
        p.intents = intents.clone();
    });
    for (agent, _) in &fleet.agents {
        agent.set_mode(Mode::RateLimited);
    }
    let started = Instant::now();
    let request = Request::post(format!("http://{outbound}/review"))
        .header(http::header::HOST, "any.reach")
        .header("reach-intent", "please review this diff before the release")
        .header("prefer", "respond-async")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body::full(r#"{"code":"fn main() {}"}"#))
        .map_err(|e| DemoError::Config(e.to_string()))?;
    let response = http
        .request(request)
        .await
        .map_err(|e| DemoError::Config(format!("submitting the task: {e}")))?;
    let accepted_ms = started.elapsed().as_secs_f64() * 1000.0;
    let resolved = response
        .headers()
        .get("reach-resolved-capability")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    if response.status() != StatusCode::ACCEPTED {
        return Err(DemoError::Config(format!(
            "the task was not accepted: {}",
            response.status()
        )));
    }
    let accepted: serde_json::Value = read_json(response).await;
    let id = accepted["id"].as_str().unwrap_or_default().to_owned();

    let escalated_after = wait_for(&http, outbound, &id, Duration::from_secs(30), |t| {
        t["state"] == "escalated" && t["escalation"]["delivered"] == true
    })
    .await
    .map(|_| started.elapsed());
    let escalated = task(&http, outbound, &id).await;
    let posts = posts.lock().map(|p| p.clone()).unwrap_or_default();
    let (reasons_sent, signature_ok) = posts.last().map_or((0, false), |(signature, body)| {
        let sent: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let reasons = sent["attempts"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|x| x["reason"].is_string()).count());
        (
            reasons,
            agent_reach::tasks::deliver::verify(KEY, signature, body),
        )
    });

    // The person: the agents are fixed, the caller sees them healthy again, the task goes back.
    for (agent, _) in &fleet.agents {
        agent.set_mode(Mode::Normal);
    }
    fleet.settled(Duration::from_secs(20)).await;
    let retried = Instant::now();
    let retry = Request::post(format!("http://{outbound}/reach/v1/tasks/{id}/retry"))
        .body(body::empty())
        .map_err(|e| DemoError::Config(e.to_string()))?;
    let _ = http.request(retry).await;
    let done_after = wait_for(&http, outbound, &id, Duration::from_secs(30), |t| {
        t["state"] == "done"
    })
    .await
    .map(|_| retried.elapsed());
    let last = task(&http, outbound, &id).await;
    let restart = super::task_restart::run(fleet).await?;
    Ok(TasksSummary {
        faker,
        checked_tasks: ids.len() as u64,
        checked_done,
        fakes_passed_over,
        answered_by_faker,
        resolved,
        accepted_ms: super::round(accepted_ms),
        rounds: escalated["rounds"].as_u64().unwrap_or(0),
        attempts: escalated["attempts"]
            .as_array()
            .map_or(0, |a| a.len() as u64),
        escalated_after_ms: escalated_after.map(|d| super::round(d.as_secs_f64() * 1000.0)),
        webhook_posts: posts.len(),
        reasons_sent,
        signature_ok,
        done_after_retry_ms: done_after.map(|d| super::round(d.as_secs_f64() * 1000.0)),
        final_state: last["state"].as_str().unwrap_or("-").to_owned(),
        answer_status: last["response"]["status"].as_u64(),
        restart,
    })
}

type Client = client::UpstreamClient;

/// Polls the task every 50 ms until `done(task)`.
async fn wait_for(
    http: &Client,
    outbound: std::net::SocketAddr,
    id: &str,
    within: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Option<()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done(&task(http, outbound, id).await) {
            return Some(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

type Posts = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A person's webhook: keeps each POST's signature and body, accepts it.
async fn webhook() -> Result<(String, Posts), DemoError> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let posts: Posts = Arc::default();
    let kept = posts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let kept = kept.clone();
                        async move {
                            let signature = req
                                .headers()
                                .get(agent_reach::tasks::deliver::SIGNATURE)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_owned();
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes().to_vec())
                                .unwrap_or_default();
                            if let Ok(mut posts) = kept.lock() {
                                posts.push((signature, body));
                            }
                            Ok::<_, std::convert::Infallible>(Response::new(body::empty()))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((format!("http://{addr}/hooks/agent-reach"), posts))
}
