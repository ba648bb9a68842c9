//! `agent-reach demo`: a local fleet of mock agents with their sidecars, driven through faults;
//! the summary says what routing did (docs/demo.md).

use std::process::ExitCode;

use agent_reach::config::HumanDuration;

use super::{init_tracing, parse_duration, runtime, LogFormat};
use crate::demo;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// How long to drive traffic.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    duration: HumanDuration,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> ExitCode {
    init_tracing("warn", LogFormat::Text);
    let runtime = match runtime(None) {
        Ok(rt) => rt,
        Err(code) => return code,
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
