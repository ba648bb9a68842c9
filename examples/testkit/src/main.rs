//! `mock-agent`: one mock agent (`testkit::MockAgent`) with the seeds' fault modes on `--listen`
//! until killed — for trying the sidecar by hand (`cargo run -p agent-reach-testkit --bin
//! mock-agent`), and for the tests that run agents as processes (the chaos fleet, interception
//! in network namespaces). Switch the mode while it runs:
//! `curl -X PUT localhost:8080/admin/mode -d slow`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use agent_reach::config::{parse_duration, HumanDuration};
use clap::Parser;

use testkit::{
    describe_latency, Latency, MockAgent, MockConfig, Mode, ModelCall, ProviderBudget,
    ProviderHeaders, Workload,
};

/// A mock agent with fault modes, until killed.
#[derive(Parser, Debug)]
#[command(name = "mock-agent", version)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[arg(long, default_value = "mock-agent")]
    name: String,
    /// Business-call latency: fixed (`50ms`) or uniform over a range (`20ms..80ms`).
    #[arg(long, default_value = "5ms")]
    latency: Latency,
    /// Share of business calls that fail with 500 in normal mode, 0..1.
    #[arg(long, default_value_t = 0.0)]
    failure_rate: f64,
    /// normal, rate-limited, slow, locked, hang, long-tasks, wrong-shape (a 200 with JSON of the
    /// wrong shape) or crash-after=N.
    #[arg(long, default_value = "normal")]
    mode: Mode,
    /// Latency of every business call in `slow` mode.
    #[arg(long, default_value = "3s", value_parser = duration)]
    slow_latency: HumanDuration,
    /// Events sent by `GET /sse`, one per `--sse-interval`.
    #[arg(long, default_value_t = 5)]
    sse_events: u32,
    #[arg(long, default_value = "100ms", value_parser = duration)]
    sse_interval: HumanDuration,
    /// Append one JSON line per business call executed (its `idempotency-key`) to this file.
    #[arg(long)]
    log: Option<PathBuf>,
    /// The budget of the mock model provider at `POST /v1/chat/completions`: requests per
    /// `--provider-window` (unlimited, with no rate-limit headers, when absent).
    #[arg(long)]
    provider_requests: Option<u64>,
    #[arg(long, default_value = "60s", value_parser = duration)]
    provider_window: HumanDuration,
    /// What its rate-limit headers say: `honest`, `hostile` (spent for a decade) or `garbage`.
    #[arg(long, default_value = "honest")]
    provider_headers: ProviderHeaders,
    /// Each task first calls a model through this sidecar outbound address (its own sidecar),
    /// naming `--model-capability`.
    #[arg(long)]
    model_via: Option<SocketAddr>,
    #[arg(long, default_value = "llm")]
    model_capability: String,
}

/// `--latency 15s`-style arguments.
fn duration(text: &str) -> Result<HumanDuration, String> {
    parse_duration(text).map(HumanDuration)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = MockConfig {
        name: args.name,
        latency: args.latency,
        failure_rate: args.failure_rate,
        mode: args.mode,
        slow_latency: args.slow_latency.get(),
        sse_events: args.sse_events,
        sse_interval: args.sse_interval.get(),
        provider: ProviderBudget {
            requests: args.provider_requests,
            window: args.provider_window.get(),
            headers: args.provider_headers,
            ..ProviderBudget::default()
        },
        model: args.model_via.map(|outbound| ModelCall {
            outbound,
            capability: args.model_capability,
        }),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let listen = args.listen;
    let (name, latency) = (config.name.clone(), describe_latency(&config.latency));
    runtime.block_on(async {
        let started = match &args.log {
            Some(log) => MockAgent::start_logged(listen, config, Workload::default(), log).await,
            None => MockAgent::start(listen, config).await,
        };
        match started {
            Ok(agent) => {
                println!(
                    "mock agent `{name}` on http://{} (mode {}, latency {latency})",
                    agent.addr,
                    agent.mode()
                );
                tokio::select! {
                    _ = agent.crashed() => ExitCode::FAILURE,
                    _ = tokio::signal::ctrl_c() => ExitCode::SUCCESS,
                }
            }
            Err(err) => {
                eprintln!("mock agent: {listen}: {err}");
                ExitCode::FAILURE
            }
        }
    })
}
