//! The demo: a local fleet of mock agents with their sidecars, driven through faults; the
//! summary says what routing did (docs/demo.md). `cargo run -p demo`.

use std::process::ExitCode;

use agent_reach::config::{parse_duration, HumanDuration};
use clap::Parser;

/// Run a local fleet of mock agents with their sidecars and show routing at work.
#[derive(Parser, Debug)]
#[command(name = "demo", version)]
struct Args {
    /// How long to drive traffic.
    #[arg(long, default_value = "12s", value_parser = duration)]
    duration: HumanDuration,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// `--duration 15s`-style arguments.
fn duration(text: &str) -> Result<HumanDuration, String> {
    parse_duration(text).map(HumanDuration)
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Only the sidecars' warnings: the summary is the output.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let options = demo::DemoOptions {
        duration: args.duration.get(),
        concurrency: args.concurrency,
    };
    match runtime.block_on(demo::run(options)) {
        Ok(summary) if args.json => match serde_json::to_string_pretty(&summary) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("cannot encode the summary: {err}");
                ExitCode::FAILURE
            }
        },
        Ok(summary) => {
            print!("{}", demo::render_table(&summary));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("demo failed: {err}");
            ExitCode::FAILURE
        }
    }
}
