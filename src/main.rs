//! The `agent-reach` command: run the sidecar, check config files, run the demo.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use agent_reach::config::{self, ConfigPaths, ConfigStore, HumanDuration};
use agent_reach::{demo, Sidecar};

#[derive(Parser, Debug)]
#[command(
    name = "agent-reach",
    version,
    about = "A sidecar that routes each agent's capability calls to the peer able to take them now"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the sidecar.
    Run {
        /// The bootstrap file (listeners, the local agent's profile, peers).
        #[arg(long, env = "AGENT_REACH_CONFIG")]
        config: PathBuf,
        /// The fleet policy file; all defaults when omitted.
        #[arg(long, env = "AGENT_REACH_POLICY")]
        policy: Option<PathBuf>,
        /// Log filter, e.g. `info` or `agent_reach=debug`.
        #[arg(long, env = "AGENT_REACH_LOG", default_value = "info")]
        log: String,
        /// Log as JSON lines instead of text.
        #[arg(long)]
        log_json: bool,
        /// Threads serving traffic (default: one per CPU). Match the pod's CPU limit.
        #[arg(long, env = "AGENT_REACH_WORKER_THREADS")]
        worker_threads: Option<usize>,
    },
    /// Validate bootstrap and policy files; exit 1 naming file:line:col of the first error in each.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Run a local fleet of mock agents with their sidecars and show routing at work.
    Demo {
        /// How long to drive traffic.
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        duration: HumanDuration,
        /// Calls in flight at once.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_duration(text: &str) -> Result<HumanDuration, String> {
    config::parse_duration(text).map(HumanDuration)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { files } => check(&files),
        Command::Run {
            config,
            policy,
            log,
            log_json,
            worker_threads,
        } => {
            init_tracing(&log, log_json);
            run(
                ConfigPaths {
                    bootstrap: Some(config),
                    policy,
                },
                worker_threads,
            )
        }
        Command::Demo {
            duration,
            concurrency,
            json,
        } => {
            init_tracing("warn", false);
            demo_command(duration, concurrency, json)
        }
    }
}

fn check(files: &[PathBuf]) -> ExitCode {
    let mut failed = false;
    for file in files {
        match config::check_file(file) {
            Ok(kind) => println!("{}: ok ({})", file.display(), kind.as_str()),
            Err(err) => {
                eprintln!("{err}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn run(paths: ConfigPaths, worker_threads: Option<usize>) -> ExitCode {
    let store = match ConfigStore::load(paths) {
        Ok(store) => Arc::new(store),
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match runtime(worker_threads) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let code = runtime.block_on(async move {
        let sidecar = match Sidecar::start(store).await {
            Ok(s) => s,
            Err(err) => {
                eprintln!("{err}");
                return ExitCode::FAILURE;
            }
        };
        let signal = shutdown_signal().await;
        tracing::info!(signal, "shutting down");
        // A second signal during the drain exits at once.
        tokio::select! {
            _ = sidecar.shutdown() => ExitCode::SUCCESS,
            second = shutdown_signal() => {
                tracing::warn!(signal = second, "second signal: exiting without finishing the drain");
                ExitCode::FAILURE
            }
        }
    });
    // Everything that matters has drained; a blocking task stuck in a system call (a DNS
    // lookup, say) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

#[cfg(unix)]
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => {
            let _ = tokio::signal::ctrl_c().await;
            "ctrl-c"
        }
    }
}

#[cfg(not(unix))]
async fn shutdown_signal() -> &'static str {
    let _ = tokio::signal::ctrl_c().await;
    "ctrl-c"
}

fn demo_command(duration: HumanDuration, concurrency: usize, json: bool) -> ExitCode {
    let runtime = match runtime(None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let options = demo::DemoOptions {
        duration: duration.get(),
        concurrency,
    };
    match runtime.block_on(demo::run(options)) {
        Ok(summary) => {
            if json {
                match serde_json::to_string_pretty(&summary) {
                    Ok(text) => println!("{text}"),
                    Err(err) => {
                        eprintln!("cannot encode the summary: {err}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", demo::render_table(&summary));
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("demo failed: {err}");
            ExitCode::FAILURE
        }
    }
}

fn runtime(worker_threads: Option<usize>) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n.max(1));
    }
    builder.enable_all().build().map_err(|err| {
        eprintln!("cannot start the runtime: {err}");
        ExitCode::FAILURE
    })
}

fn init_tracing(filter: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal; a pipe or a log collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
