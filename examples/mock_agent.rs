//! A mock AI agent with fault modes. Run: `cargo run --example mock_agent -- --listen 127.0.0.1:8080 --mode rate-limited`
//!
//! Switch the mode while it runs: `curl -X PUT localhost:8080/admin/mode -d slow`.

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::config::parse_duration;
use agent_reach::mock_agent::{describe_latency, Latency, MockAgent, MockConfig, Mode};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "A mock AI agent that can fail the ways real ones do")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[arg(long, default_value = "mock-agent")]
    name: String,
    /// Business-call latency: fixed (`50ms`) or uniform over a range (`20ms..80ms`).
    #[arg(long, default_value = "20ms")]
    latency: Latency,
    /// Share of business calls that fail with 500 in normal mode, 0..1.
    #[arg(long, default_value_t = 0.0)]
    failure_rate: f64,
    /// normal, rate-limited, slow, locked, hang, long-tasks, wrong-shape (a 200 with JSON of the
    /// wrong shape) or crash-after=N.
    #[arg(long, default_value = "normal")]
    mode: Mode,
    /// Latency of every business call in `slow` mode.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    slow_latency: Duration,
    /// Events sent by `GET /sse`, one per `--sse-interval`.
    #[arg(long, default_value_t = 5)]
    sse_events: u32,
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    sse_interval: Duration,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let config = MockConfig {
        name: args.name,
        latency: args.latency,
        failure_rate: args.failure_rate,
        mode: args.mode,
        slow_latency: args.slow_latency,
        sse_events: args.sse_events,
        sse_interval: args.sse_interval,
    };
    let agent = MockAgent::start(args.listen, config.clone()).await?;
    println!(
        "mock agent `{}` on http://{} (mode {}, latency {})",
        config.name,
        agent.addr,
        agent.mode(),
        describe_latency(&config.latency)
    );
    tokio::select! {
        _ = agent.crashed() => println!("mock agent crashed"),
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
