//! What agent-reach's demo, tests and benches share.
//!
//! The crate root is a mock AI agent with the seeds' fault modes ([`MockAgent`]; the
//! `mock-agent` binary runs one). Business calls (any path but the ones below) behave by mode;
//! `/healthz` answers 200 in every mode, which is exactly what makes an agent "fake online".
//! `PUT /admin/mode` switches the mode at run time so a scenario can break and heal an agent
//! (`wrong-shape`: a 200 whose JSON lacks the `ok` field every other answer has, for output
//! validation; `drift`: the right shape, a changed `language` and a `summary` about something
//! else, for golden tasks). [`MockAgent::start_with`] adds a [`Workload`]: a worker pool whose
//! excess calls wait in the agent's own queue, a fixed seed for the agent's random draws, and the
//! share and length of `long-tasks` calls. [`MockAgent::start_logged`] also appends one JSON line
//! per business call it executed to an execution log (time, agent, pid, `idempotency-key`, path,
//! status), written as the answer is handed back, so a fault run can tell whether an agent ran
//! the same key twice.
//!
//! Beside it: an A2A agent ([`a2a`]) and MCP servers ([`mcp`]), the in-memory gossip fleet
//! ([`gossip_fleet`]), the chaos fleet of real processes ([`chaos`]), a throwaway `redis-server`
//! ([`redis`]), where the binaries those run are ([`bins`]) and the benchmarks' helpers
//! ([`bench`]).

pub mod a2a;
pub mod bench;
pub mod bins;
pub mod chaos;
mod config;
pub mod gossip_fleet;
pub mod mcp;
mod provider;
pub mod redis;

pub use config::{Latency, MockConfig, MockStats, Mode, Workload};
pub use provider::{ModelCall, ProviderBudget, ProviderHeaders, ProviderStats};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Channel};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use agent_reach::config::format_duration;
use agent_reach::http::{body, ReachBody};

#[derive(Debug)]
struct State {
    config: MockConfig,
    workload: Workload,
    /// The worker slots, when the agent has a pool.
    pool: Option<Semaphore>,
    /// The seeded RNG, when the workload has a seed.
    rng: Mutex<Option<StdRng>>,
    queued: AtomicU64,
    mode: Mutex<Mode>,
    lock: tokio::sync::Mutex<()>,
    business: AtomicU64,
    probes: AtomicU64,
    health: AtomicU64,
    in_flight: AtomicU64,
    /// Business calls served since the current crash-after mode was set.
    since_mode: AtomicU64,
    crashed: CancellationToken,
    /// The execution log, when there is one (appended, one line per business call).
    log: Option<Mutex<std::fs::File>>,
    /// Its mock model provider's budget and window.
    provider: provider::Provider,
    /// Where each task's model call goes, when it makes one (settable once its sidecar runs).
    model: Mutex<Option<ModelCall>>,
}

/// A running mock agent.
#[derive(Debug)]
pub struct MockAgent {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl MockAgent {
    /// Binds `listen` (port 0 for any) and serves until stopped or crashed.
    pub async fn start(listen: SocketAddr, config: MockConfig) -> std::io::Result<Self> {
        Self::start_with(listen, config, Workload::default()).await
    }

    /// Like [`MockAgent::start`], with a worker pool, a seed or long tasks.
    pub async fn start_with(
        listen: SocketAddr,
        config: MockConfig,
        workload: Workload,
    ) -> std::io::Result<Self> {
        Self::start_inner(listen, config, workload, None).await
    }

    /// Like [`MockAgent::start_with`], appending one JSON line per business call it executed
    /// (probes excluded) to `log`: `{"t_ms", "agent", "pid", "key", "method", "path",
    /// "status"}`, where `key` is the request's `idempotency-key` (null without one). The line
    /// is written when the answer is ready, before it is sent: a call cut off by a crash before
    /// that is not logged.
    pub async fn start_logged(
        listen: SocketAddr,
        config: MockConfig,
        workload: Workload,
        log: &std::path::Path,
    ) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        Self::start_inner(listen, config, workload, Some(file)).await
    }

    async fn start_inner(
        listen: SocketAddr,
        config: MockConfig,
        workload: Workload,
        log: Option<std::fs::File>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            mode: Mutex::new(config.mode),
            pool: workload.pool.map(|n| Semaphore::new(n.max(1))),
            rng: Mutex::new(workload.seed.map(StdRng::seed_from_u64)),
            workload,
            queued: AtomicU64::new(0),
            lock: tokio::sync::Mutex::new(()),
            business: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            health: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            since_mode: AtomicU64::new(0),
            crashed: CancellationToken::new(),
            log: log.map(Mutex::new),
            provider: provider::Provider::new(config.provider),
            model: Mutex::new(config.model.clone()),
            config,
        });
        let task = tokio::spawn(serve(listener, state.clone()));
        Ok(Self { addr, state, task })
    }

    pub fn name(&self) -> &str {
        &self.state.config.name
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.set_mode(mode);
    }

    pub fn mode(&self) -> Mode {
        self.state.mode()
    }

    /// From now on each task first calls a model through `call` (the agent's own sidecar).
    #[allow(dead_code)] // The budget tests (tests/it/budget.rs) set it once the sidecar runs.
    pub fn set_model(&self, call: ModelCall) {
        *self.state.model.lock().unwrap_or_else(|p| p.into_inner()) = Some(call);
    }

    /// What its mock model provider has answered (also at `GET /admin/provider`).
    #[allow(dead_code)] // The budget tests (tests/it/budget.rs) read it.
    pub fn provider_stats(&self) -> ProviderStats {
        self.state.provider.stats()
    }

    pub fn stats(&self) -> MockStats {
        self.state.stats()
    }

    /// Resolves when the agent has crashed (or was stopped).
    pub async fn crashed(&self) {
        self.state.crashed.cancelled().await;
    }

    /// Kills the agent: the port closes and open connections drop, as when a process dies.
    pub fn kill(&self) {
        self.state.crashed.cancel();
    }

    /// Kills the agent and waits until its port is closed.
    pub async fn stop(self) {
        self.kill();
        let _ = self.task.await;
    }
}

impl State {
    fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
        self.since_mode.store(0, Ordering::SeqCst);
    }

    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stats(&self) -> MockStats {
        MockStats {
            business: self.business.load(Ordering::Relaxed),
            probes: self.probes.load(Ordering::Relaxed),
            health: self.health.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
        }
    }

    /// Appends one line to the execution log (when there is one). A failed write is reported
    /// on stderr, never fatal: the agent keeps serving.
    fn log_execution(&self, key: Option<String>, method: &str, path: &str, status: StatusCode) {
        use std::io::Write;
        let Some(log) = &self.log else { return };
        let t_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut line = serde_json::json!({
            "t_ms": t_ms, "agent": self.config.name, "pid": std::process::id(),
            "key": key, "method": method, "path": path, "status": status.as_u16(),
        })
        .to_string();
        line.push('\n');
        let mut file = log.lock().unwrap_or_else(|p| p.into_inner());
        // One write of the whole line: with O_APPEND it lands in one piece.
        if let Err(err) = file.write_all(line.as_bytes()) {
            eprintln!("mock agent: cannot write the execution log: {err}");
        }
    }

    /// A draw in 0..1: from the seeded RNG if there is one.
    fn draw(&self) -> f64 {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        match rng.as_mut() {
            Some(rng) => rng.random::<f64>(),
            None => rand::random::<f64>(),
        }
    }

    /// Waits for a worker slot, if the agent has a pool; the slot is held until dropped.
    async fn worker_slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let pool = self.pool.as_ref()?;
        if let Ok(permit) = pool.try_acquire() {
            return Some(permit);
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        let permit = pool.acquire().await.ok();
        self.queued.fetch_sub(1, Ordering::Relaxed);
        permit
    }
}

async fn serve(listener: TcpListener, state: Arc<State>) {
    let stop = state.crashed.clone();
    serve_until(listener, stop, move |req| handle(state.clone(), req)).await;
}

/// Serves HTTP/1 and h2 on `listener` with `handle` until `stop`; stopping also drops every
/// open connection mid-flight, like a dying process. Shared by the mock agents.
pub async fn serve_until<H, F>(listener: TcpListener, stop: CancellationToken, handle: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<ReachBody>> + Send + 'static,
{
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let (builder, stop, handle) = (builder.clone(), stop.clone(), handle.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let handled = handle(req);
                async move { Ok::<_, Infallible>(handled.await) }
            });
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<ReachBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => {
            state.health.fetch_add(1, Ordering::Relaxed);
            json(
                StatusCode::OK,
                serde_json::json!({ "status": "ok", "agent": state.config.name }),
            )
        }
        (&Method::GET, "/admin/mode") => json(
            StatusCode::OK,
            serde_json::json!({ "mode": state.mode().to_string() }),
        ),
        (&Method::PUT, "/admin/mode") => {
            let text = match req.into_body().collect().await {
                Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                Err(_) => String::new(),
            };
            // Accept `rate-limited` or `{"mode": "rate-limited"}`.
            let wanted = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("mode").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or(text);
            match wanted.parse::<Mode>() {
                Ok(mode) => {
                    state.set_mode(mode);
                    json(
                        StatusCode::OK,
                        serde_json::json!({ "mode": mode.to_string() }),
                    )
                }
                Err(message) => json(
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({ "error": message }),
                ),
            }
        }
        (&Method::GET, "/admin/stats") => json(StatusCode::OK, serde_json::json!(state.stats())),
        (&Method::GET, "/admin/provider") => {
            json(StatusCode::OK, serde_json::json!(state.provider.stats()))
        }
        (&Method::GET, "/sse") => sse(&state),
        (&Method::POST, "/v1/chat/completions" | "/v1/messages") => {
            state.provider.complete(&state.config.name, req).await
        }
        _ => business(state, req).await,
    }
}

async fn business(state: Arc<State>, req: Request<Incoming>) -> Response<ReachBody> {
    let probe = req.headers().contains_key("reach-probe");
    let counter = if probe {
        &state.probes
    } else {
        &state.business
    };
    counter.fetch_add(1, Ordering::Relaxed);
    state.in_flight.fetch_add(1, Ordering::Relaxed);
    // What the execution log needs, taken before the request is consumed.
    let logged = (!probe && state.log.is_some()).then(|| {
        let key = req
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (key, req.method().to_string(), req.uri().path().to_owned())
    });
    let response = match model_refusal(&state, probe).await {
        Some(refused) => refused,
        None => business_inner(&state, req).await,
    };
    if let Some((key, method, path)) = logged {
        state.log_execution(key, &method, &path, response.status());
    }
    state.in_flight.fetch_sub(1, Ordering::Relaxed);
    response
}

/// A task's model call through the agent's own sidecar, when it makes one; a failed call fails
/// the task as a real agent's would: 429, the model backend's quota.
async fn model_refusal(state: &State, probe: bool) -> Option<Response<ReachBody>> {
    let call = state
        .model
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .filter(|_| !probe)?;
    let status = provider::call_model(&call, &state.config.name).await;
    if status.is_success() {
        return None;
    }
    let mut r = json(
        StatusCode::TOO_MANY_REQUESTS,
        serde_json::json!({ "error": "rate_limited", "agent": state.config.name,
            "message": format!("the model backend answered {}", status.as_u16()) }),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    Some(r)
}

async fn business_inner(state: &State, req: Request<Incoming>) -> Response<ReachBody> {
    let path = req.uri().path().to_owned();
    let received = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().len())
        .unwrap_or(0);
    let name = &state.config.name;
    // Every mode's work runs in a worker slot (a rate-limited agent's refusal too: it is fast).
    let _slot = state.worker_slot().await;
    match state.mode() {
        Mode::RateLimited => {
            let mut r = json(
                StatusCode::TOO_MANY_REQUESTS,
                serde_json::json!({ "error": "rate_limited", "message": "model backend quota exhausted", "agent": name }),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return r;
        }
        Mode::Hang => {
            state.crashed.cancelled().await;
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({ "error": "stopped" }),
            );
        }
        Mode::CrashAfter(n) => {
            if state.since_mode.fetch_add(1, Ordering::SeqCst) >= n {
                state.crashed.cancel();
                return json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({ "error": "crashed" }),
                );
            }
        }
        Mode::Slow => {
            tokio::time::sleep(state.config.slow_latency).await;
            return ok(name, &path, received);
        }
        Mode::Locked => {
            let _held = state.lock.lock().await;
            pause(state.config.latency.at(state.draw())).await;
            return ok(name, &path, received);
        }
        Mode::LongTasks => {
            if state.draw() < state.workload.long_share {
                pause(state.workload.long_latency).await;
                return ok(name, &path, received);
            }
        }
        Mode::WrongShape => {
            pause(state.config.latency.at(state.draw())).await;
            return json(
                StatusCode::OK,
                serde_json::json!({ "agent": name, "path": path, "answer": "SELECT * FROM users -- looks right, is not" }),
            );
        }
        Mode::Drift => {
            pause(state.config.latency.at(state.draw())).await;
            return json(
                StatusCode::OK,
                serde_json::json!({ "ok": true, "agent": name, "path": path, "received_bytes": received,
                    "language": "und", "summary": "Sorry, I am unable to assist with that today." }),
            );
        }
        Mode::Normal => {}
    }
    pause(state.config.latency.at(state.draw())).await;
    if state.config.failure_rate > 0.0 && state.draw() < state.config.failure_rate {
        return json(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({ "error": "injected failure", "agent": name }),
        );
    }
    ok(name, &path, received)
}

/// Sleeps, except for zero: tokio's timer would round that up to a millisecond.
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// A good answer: the same for the same request, so a golden task's baseline holds.
fn ok(name: &str, path: &str, received: usize) -> Response<ReachBody> {
    let summary = format!("Read {received} bytes for {path} and answered them in full.");
    json(
        StatusCode::OK,
        serde_json::json!({ "ok": true, "agent": name, "path": path, "received_bytes": received,
            "language": "en", "summary": summary }),
    )
}

/// Server-sent events, one every `sse_interval`, so a test can see the first before the last.
fn sse(state: &State) -> Response<ReachBody> {
    let (count, interval, name) = (
        state.config.sse_events,
        state.config.sse_interval,
        state.config.name.clone(),
    );
    let (mut tx, channel) = Channel::<Bytes, Infallible>::new(4);
    tokio::spawn(async move {
        for n in 0..count {
            if n > 0 {
                tokio::time::sleep(interval).await;
            }
            let event = format!("id: {n}\ndata: {{\"n\":{n},\"agent\":\"{name}\"}}\n\n");
            if tx.send_data(Bytes::from(event)).await.is_err() {
                return;
            }
        }
    });
    let mut r = Response::new(body::boxed(channel));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    r
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<ReachBody> {
    let mut r = Response::new(body::full(value.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

/// The `Duration` shown for a latency in logs.
pub fn describe_latency(l: &Latency) -> String {
    if l.min == l.max {
        format_duration(l.min)
    } else {
        format!("{}..{}", format_duration(l.min), format_duration(l.max))
    }
}

/// A 1-token business call through the agent's whole chain (`docs/reach-model.md`, business probes).
pub fn probe_spec() -> agent_reach::config::ProbeSpec {
    agent_reach::config::ProbeSpec {
        method: "POST".to_owned(),
        path: "/review".to_owned(),
        body: Some(r#"{"code":"x = 1","max_tokens":1}"#.to_owned()),
        headers: Default::default(),
        expect_status: 200,
        expect_body: Some(r#""ok":true"#.to_owned()),
        expect_json: None,
        interval: None,
        timeout: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes_and_latencies() {
        assert_eq!("rate-limited".parse::<Mode>(), Ok(Mode::RateLimited));
        assert_eq!("crash-after=3".parse::<Mode>(), Ok(Mode::CrashAfter(3)));
        assert!("sleepy".parse::<Mode>().is_err());
        let l: Latency = "20ms..80ms"
            .parse()
            .unwrap_or(Latency::fixed(Duration::ZERO));
        assert_eq!(
            (l.min, l.max),
            (Duration::from_millis(20), Duration::from_millis(80))
        );
        let s = l.at(rand::random::<f64>());
        assert!(s >= l.min && s <= l.max);
        assert_eq!("long-tasks".parse::<Mode>(), Ok(Mode::LongTasks));
        assert_eq!(Mode::LongTasks.to_string(), "long-tasks");
        assert_eq!("wrong-shape".parse::<Mode>(), Ok(Mode::WrongShape));
        assert_eq!("plausible-fake".parse::<Mode>(), Ok(Mode::WrongShape));
        assert_eq!(Mode::WrongShape.to_string(), "wrong-shape");
        assert_eq!("drift".parse::<Mode>(), Ok(Mode::Drift));
        assert_eq!(Mode::Drift.to_string(), "drift");
        assert_eq!(l.at(0.0), l.min);
        assert_eq!(l.at(1.0), l.max);
    }

    /// Long tasks fill a one-slot pool: the second call waits in the agent's queue, `/healthz`
    /// does not; two agents with one seed draw the same latencies.
    #[tokio::test]
    async fn long_tasks_fill_the_pool_and_the_rest_wait() {
        use http_body_util::Full;
        use hyper_util::client::legacy::Client;
        let workload = Workload {
            pool: Some(1),
            seed: Some(7),
            long_share: 1.0,
            long_latency: Duration::from_millis(300),
        };
        let mut config = MockConfig::new("pooled");
        config.mode = Mode::LongTasks;
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let Ok(agent) = MockAgent::start_with(any, config, workload.clone()).await else {
            panic!("cannot start the mock agent");
        };
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let call = |path: &str| {
            let request = Request::post(format!("http://{}{path}", agent.addr))
                .body(Full::new(Bytes::new()))
                .unwrap_or_default();
            client.request(request)
        };
        let started = std::time::Instant::now();
        let (first, second) = (call("/a"), call("/b"));
        let both = tokio::spawn(async move {
            let (first, second) = tokio::join!(first, second);
            (first.is_ok(), second.is_ok())
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(agent.stats().queued, 1, "{:?}", agent.stats());
        let health = Request::get(format!("http://{}/healthz", agent.addr))
            .body(Full::new(Bytes::new()))
            .unwrap_or_default();
        assert!(client.request(health).await.is_ok());
        assert!(started.elapsed() < Duration::from_millis(250));
        assert_eq!(both.await.ok(), Some((true, true)));
        assert!(started.elapsed() >= Duration::from_millis(600));

        let draws = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..4).map(|_| rng.random::<f64>()).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
    }

    /// The execution log: one line per business call with its `idempotency-key`, none for a
    /// probe or `/healthz`.
    #[tokio::test]
    async fn the_execution_log_has_a_line_per_business_call_with_its_key() {
        use http_body_util::Full;
        use hyper_util::client::legacy::Client;
        let log = std::env::temp_dir().join(format!(
            "mock-agent-log-{}-{:?}.jsonl",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_file(&log);
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let Ok(agent) =
            MockAgent::start_logged(any, MockConfig::new("logged"), Workload::default(), &log)
                .await
        else {
            panic!("cannot start the mock agent");
        };
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        for (path, key, probe) in [
            ("/review", Some("t-1#1"), false),
            ("/review", None, false),
            ("/review", None, true),
            ("/healthz", None, false),
        ] {
            let mut request = Request::builder().uri(format!("http://{}{path}", agent.addr));
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            if probe {
                request = request.header("reach-probe", "1");
            }
            let request = request.body(Full::new(Bytes::new())).unwrap_or_default();
            assert!(client.request(request).await.is_ok());
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["key"], "t-1#1");
        assert_eq!(lines[0]["agent"], "logged");
        assert_eq!(lines[0]["status"], 200);
        assert!(lines[1]["key"].is_null(), "{text}");
        let _ = std::fs::remove_file(&log);
    }
}
