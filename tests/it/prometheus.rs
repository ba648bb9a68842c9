//! The dashboard against a real Prometheus: Debian's `prometheus` scrapes a fleet every second
//! while a fault ejects agents and a retry budget runs out, then every query of
//! `docs/grafana/agent-reach.json` is evaluated through the HTTP API. Each returns data, none is
//! `NaN`, and the ejection panels count the ejections the sidecars counted. Skipped only when
//! no `prometheus` binary is found (`.ci/run` installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach::config::{
    CapabilityPolicy, ExternalTarget, HumanDuration, Name, Policy, TargetEndpoint,
};
use agent_reach::reach::State;
use agent_reach::{Bootstrap, Sidecar};
use demo::demo_policy;
use serde_json::Value;
use support::*;
use testkit::{MockAgent, MockConfig, Mode, ProviderBudget, ProviderHeaders};

/// A second capability, observe-only: the caller routes it round robin and counts what the
/// model would have avoided (the dashboard's observe panels).
const OBSERVED: &str = "summarize";
const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana/agent-reach.json");

// === Prometheus, as a subprocess ===

/// A `prometheus` server scraping `targets` every second, its files in a directory of its own;
/// killed and cleaned up on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    started: Instant,
}

impl Prometheus {
    /// The binary on `PATH` (or where Debian puts it).
    fn binary() -> Option<PathBuf> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
            .map(|dir| dir.join("prometheus"))
            .find(|p| p.is_file())
    }

    fn start(binary: &Path, targets: &[SocketAddr]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "agent-reach-prometheus-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let targets: Vec<String> = targets.iter().map(|a| format!("\"{a}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: agent-reach\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        // A free port: bound, read and let go (Prometheus cannot report one it picked).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", binary.display()));
        Self {
            child,
            addr,
            dir,
            started: Instant::now(),
        }
    }

    /// The end of Prometheus' log, for a failure message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// A GET on the HTTP API; `None` while it does not answer (starting up).
    async fn api(&self, path: &str) -> Option<Value> {
        let url = format!("http://{}{path}", self.addr);
        let request = http::Request::builder()
            .uri(&url)
            // The test client leaves Host to the caller; Go's server refuses a request without.
            .header("host", self.addr.to_string())
            .body(agent_reach::http::body::full(String::new()))
            .unwrap();
        let response = client().request(request).await.ok()?;
        use http_body_util::BodyExt;
        let bytes = response.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice(&bytes).ok()
    }

    /// Waits until every target has been scraped and is up.
    async fn wait_for_targets(&mut self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", self.log_tail());
            }
            let targets = self.api("/api/v1/targets").await;
            let active = targets
                .as_ref()
                .and_then(|t| t["data"]["activeTargets"].as_array().cloned())
                .unwrap_or_default();
            if active.len() == n && active.iter().all(|t| t["health"] == "up") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus' targets are not up after 20 s: {targets:?}\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An instant query at now: each series' labels and value, or Prometheus' error.
    async fn query(&self, expr: &str) -> Result<Vec<(String, f64)>, String> {
        let answer = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await
            .ok_or("no answer")?;
        if answer["status"] != "success" {
            return Err(format!("{}: {}", answer["errorType"], answer["error"]));
        }
        let data = &answer["data"];
        let value = |v: &Value| -> f64 {
            // Prometheus writes sample values as strings: "NaN", "+Inf", "0.5".
            v[1].as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(f64::NAN)
        };
        Ok(match data["resultType"].as_str() {
            Some("scalar") => vec![(String::new(), value(&data["result"]))],
            _ => data["result"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|s| (labels(&s["metric"]), value(&s["value"])))
                .collect(),
        })
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A query string's value, percent-encoded.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            write!(out, "%{b:02X}").unwrap();
        }
    }
    out
}

/// `{a="x", b="y"}` of a result's labels.
fn labels(metric: &Value) -> String {
    let pairs: Vec<String> = metric
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    format!("{{{}}}", pairs.join(", "))
}

// === The dashboard's queries ===

/// One panel's query, its Grafana variables replaced.
struct Panel {
    title: String,
    expr: String,
}

/// Every query target of the dashboard, with `$capability` as Grafana's "All" (its `allValue`)
/// and the interval variables as `window`, long enough to cover the whole test.
fn dashboard_queries(window: &str) -> Vec<Panel> {
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut variables: Vec<(String, String)> = ["__rate_interval", "__range", "__interval"]
        .iter()
        .map(|v| ((*v).to_owned(), window.to_owned()))
        .collect();
    for var in dash["templating"]["list"].as_array().unwrap() {
        if var["type"] == "query" {
            let all = var["allValue"].as_str().unwrap_or(".*");
            variables.push((var["name"].as_str().unwrap().to_owned(), all.to_owned()));
        }
    }
    // Longest first: `$__range` is not a prefix of a longer name once that one is replaced.
    variables.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut panels = Vec::new();
    let mut stack: Vec<Value> = dash["panels"].as_array().unwrap().clone();
    stack.reverse();
    while let Some(panel) = stack.pop() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let mut expr = expr.to_owned();
            for (name, value) in &variables {
                expr = expr
                    .replace(&format!("${{{name}}}"), value)
                    .replace(&format!("${name}"), value);
            }
            assert!(!expr.contains('$'), "a variable left in: {expr}");
            panels.push(Panel {
                title: panel["title"].as_str().unwrap_or("?").to_owned(),
                expr,
            });
        }
        // Rows nest their panels.
        for inner in panel["panels"].as_array().into_iter().flatten().rev() {
            stack.push(inner.clone());
        }
    }
    panels
}

// === The fleet ===

struct Fleet {
    agents: Vec<(MockAgent, Sidecar)>,
    caller: Sidecar,
    /// The model provider the agents' sidecars know as the external target [`LLM`].
    _provider: MockAgent,
}

/// The capability the agents' own model calls name (the dashboard's model-budget panels).
const LLM: &str = "llm";

impl Fleet {
    /// Three agents serving both capabilities behind their sidecars, a caller that knows them,
    /// and a model provider every sidecar has as a target.
    async fn start(mut policy: Policy) -> Self {
        let mut config = MockConfig::new("provider");
        config.provider = ProviderBudget {
            requests: Some(1_000_000),
            window: Duration::from_secs(60),
            headers: ProviderHeaders::Honest,
            ..ProviderBudget::default()
        };
        let provider = mock(config).await;
        policy.targets.push(ExternalTarget {
            name: Name::parse(LLM).unwrap(),
            capability: Name::parse(LLM).unwrap(),
            endpoints: vec![TargetEndpoint::parse(&provider.addr.to_string()).unwrap()],
            ca_file: None,
            timeout: None,
            max_concurrency: None,
            rate_limit: None,
            budget_group: None,
            model_provider: true,
        });
        let mut caller =
            Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
        let mut agents = Vec::new();
        for name in ["coder-1", "coder-2", "coder-3"] {
            let agent = mock(MockConfig::new(name)).await;
            let callee = sidecar_with(
                Bootstrap::local(name, agent.addr, &[CAP, OBSERVED]).unwrap(),
                policy.clone(),
                Default::default(),
            )
            .await;
            caller = caller
                .with_peer(name, callee.addrs.inbound, &[CAP, OBSERVED])
                .unwrap();
            agents.push((agent, callee));
        }
        let caller = sidecar_with(caller, policy, Default::default()).await;
        Self {
            agents,
            caller,
            _provider: provider,
        }
    }

    fn sidecars(&self) -> impl Iterator<Item = &Sidecar> {
        std::iter::once(&self.caller).chain(self.agents.iter().map(|(_, s)| s))
    }

    fn peer_state(&self, name: &str) -> Option<State> {
        self.caller
            .status()
            .peer_views
            .into_iter()
            .find(|p| p.name == name)
            .map(|p| p.effective_state)
    }

    /// The sum over every sidecar's own `/metrics` of the series starting with `series` and
    /// containing `with`.
    async fn counted(&self, series: &str, with: &str) -> f64 {
        let mut total = 0.0;
        for sidecar in self.sidecars() {
            let text = get(
                &client(),
                &format!("http://{}/metrics", sidecar.addrs.admin),
            )
            .await
            .body;
            total += support::sum(&text, series, with);
        }
        total
    }
}

/// Calls to both capabilities, one after another, and each agent's own model calls (a JSON
/// answer and a stream) through its sidecar, until `stop`.
fn background_traffic(
    outbound: SocketAddr,
    agents: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (c, url) = (client(), format!("http://{outbound}/review"));
        let models = [r#"{"model":"m"}"#, r#"{"model":"m","stream":true}"#];
        while !stop.load(Ordering::Relaxed) {
            for capability in [CAP, OBSERVED] {
                send(&c, "POST", &url, &[("reach-capability", capability)], "x").await;
            }
            for agent in &agents {
                let url = format!("http://{agent}/v1/chat/completions");
                for body in models {
                    send(&c, "POST", &url, &[("reach-capability", LLM)], body).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

// === The test ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_has_data_and_the_ejection_panels_count_the_ejections() {
    let Some(binary) = Prometheus::binary() else {
        support::skip::skip(
            "tests/it/prometheus.rs",
            "no prometheus binary on PATH (Debian's prometheus package)",
            support::skip::InCi::Fails,
        );
        return;
    };
    let began = Instant::now();
    let mut policy = demo_policy();
    // One retry a second and nothing earned by calls: the first burst of refusals spends it,
    // and the budget refuses the retries after that.
    policy.retry.budget.ratio = 0.0;
    policy.retry.budget.min_per_second = 1;
    policy.retry.budget.ttl = HumanDuration::from_secs(1);
    policy.capabilities.insert(
        OBSERVED.to_owned(),
        CapabilityPolicy {
            observe_only: Some(true),
            ..CapabilityPolicy::default()
        },
    );
    let fleet = Fleet::start(policy).await;
    let admins: Vec<SocketAddr> = fleet.sidecars().map(|s| s.addrs.admin).collect();
    let mut prometheus = Prometheus::start(&binary, &admins);
    // Every series is scraped at its starting value before anything happens.
    prometheus.wait_for_targets(admins.len()).await;

    let stop = Arc::new(AtomicBool::new(false));
    let agents = fleet.agents.iter().map(|(_, s)| s.addrs.outbound).collect();
    let traffic = background_traffic(fleet.caller.addrs.outbound, agents, stop.clone());
    eventually(
        Duration::from_secs(15),
        "the caller sees every agent healthy",
        || async {
            ["coder-1", "coder-2", "coder-3"]
                .iter()
                .all(|n| fleet.peer_state(n) == Some(State::Healthy))
        },
    )
    .await;

    let c = client();
    let url = format!("http://{}/review", fleet.caller.addrs.outbound);
    // A capability nobody serves, and a deadline already past.
    let unknown = send(&c, "POST", &url, &[("reach-capability", "nope")], "x").await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let hurried = send(
        &c,
        "POST",
        &url,
        &[("reach-capability", CAP), ("reach-deadline", "1")],
        "x",
    )
    .await;
    assert_eq!(hurried.status, 504, "{}", hurried.body);
    assert_eq!(hurried.header("reach-reason"), "deadline_exceeded");
    // What the sidecars counted of them, each from 0: the "no peer" panels must see as much.
    let no_candidate = fleet.counted("reach_no_candidate_total{", "").await;
    let deadlines = fleet
        .counted("reach_deadlines_exceeded_total{", "direction=\"outbound\"")
        .await;
    assert!(
        no_candidate >= 1.0 && deadlines >= 1.0,
        "{no_candidate} {deadlines}"
    );

    // The fault: two of three agents refuse every call (fake online: /healthz stays 200).
    for (agent, _) in &fleet.agents[1..] {
        agent.set_mode(Mode::RateLimited);
    }
    let budget = format!("reach_retry_budget_exhausted_total{{capability=\"{CAP}\"}}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ejected = std::collections::BTreeSet::new();
    loop {
        // Bursts of concurrent calls: refusals want more retries than the budget holds.
        for call in spawn_posts(20, &url, &[("reach-capability", CAP)], "x") {
            call.await.unwrap();
        }
        for name in ["coder-2", "coder-3"] {
            if fleet.peer_state(name) == Some(State::Ejected) {
                ejected.insert(name);
            }
        }
        let exhausted = fleet.counted(&budget, "").await;
        if ejected.len() == 2 && exhausted > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 20 s: ejected {ejected:?}, budget exhausted {exhausted}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One agent comes back; the other stays out, so a peer is not healthy at the end.
    fleet.agents[2].0.set_mode(Mode::Normal);

    let ejected_series = "reach_state_transitions_total{";
    let ejections = fleet.counted(ejected_series, "to=\"ejected\"").await;
    let exhausted = fleet.counted(&budget, "").await;
    assert!(ejections >= 2.0, "{ejections} ejections counted");
    // Prometheus has scraped past the events.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut seen = Vec::new();
        for expr in [
            "sum(reach_state_transitions_total{to=\"ejected\"})",
            "sum(reach_retry_budget_exhausted_total)",
        ] {
            let total = prometheus.query(expr).await.ok();
            seen.push(total.and_then(|r| r.first().map(|s| s.1)).unwrap_or(0.0));
        }
        if seen[0] >= ejections && seen[1] >= exhausted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus has {seen:?} ejections and exhausted budgets, \
             the sidecars {ejections} and {exhausted}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every query, until each has data (a series born at its first event needs two scrapes
    // for `rate()`), the traffic still flowing.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (window, results) = loop {
        let secs = prometheus.started.elapsed().as_secs() + 5;
        let window = format!("{secs}s");
        let mut results = Vec::new();
        for panel in dashboard_queries(&window) {
            let result = prometheus.query(&panel.expr).await;
            results.push((panel, result));
        }
        let good = results
            .iter()
            .all(|(_, r)| r.as_ref().is_ok_and(|s| !s.is_empty()));
        if good || Instant::now() > deadline {
            break (secs as f64, results);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    stop.store(true, Ordering::Relaxed);
    traffic.await.unwrap();

    let mut table = format!(
        "{} dashboard queries, windows {window}s; sidecars counted {ejections} ejections, \
         {exhausted} exhausted retry budgets\n",
        results.len()
    );
    for (panel, result) in &results {
        writeln!(table, "{}", panel.title).unwrap();
        match result {
            Ok(samples) if samples.is_empty() => writeln!(table, "    (no data)").unwrap(),
            Ok(samples) => {
                for (labels, value) in samples {
                    writeln!(table, "    {labels} {value}").unwrap();
                }
            }
            Err(e) => writeln!(table, "    error: {e}").unwrap(),
        }
    }
    eprintln!("{table}");

    // Panels that count events the sidecars counted too.
    let counted_by_sidecars = [
        ("ejection", ejections),
        ("retry budget exhausted", exhausted),
    ];
    for (panel, result) in &results {
        let samples = result
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: {e}\n  {}", panel.title, panel.expr));
        assert!(
            !samples.is_empty(),
            "{}: no data\n  {}",
            panel.title,
            panel.expr
        );
        assert!(
            samples.iter().all(|(_, v)| !v.is_nan()),
            "{}: NaN\n  {}",
            panel.title,
            panel.expr
        );
        let by_series = [
            ("reach_no_candidate_total", no_candidate),
            ("reach_deadlines_exceeded_total", deadlines),
        ];
        let by_title = counted_by_sidecars
            .iter()
            .filter(|(what, _)| panel.title.to_lowercase().contains(what));
        let by_expr = by_series
            .iter()
            .filter(|(series, _)| panel.expr.contains(series));
        for &(what, happened) in by_title.chain(by_expr) {
            // A rate is per second over the window (which holds the series' first sample, at
            // 0), an increase the count itself: either way at least what the sidecars counted.
            let sum: f64 = samples.iter().map(|(_, v)| v).sum();
            let seen = if panel.expr.contains("increase(") {
                sum
            } else {
                sum * window
            };
            assert!(
                seen + 1e-6 >= happened,
                "{}: {seen} {what}, the sidecars counted {happened}\n  {}",
                panel.title,
                panel.expr
            );
        }
    }
    for (what, _) in counted_by_sidecars {
        let panels = results
            .iter()
            .filter(|(p, _)| p.title.to_lowercase().contains(what))
            .count();
        assert!(
            panels > 0,
            "no panel of the dashboard is titled with {what}"
        );
    }
    eprintln!("wall time {:.1} s", began.elapsed().as_secs_f64());
}
