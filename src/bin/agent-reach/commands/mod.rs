//! One file per subcommand: its arguments (clap) and its body. What several share — the runtime,
//! the shutdown signal, log setup — is here.

pub(crate) mod baseline;
pub(crate) mod check;
pub(crate) mod dev_certs;
pub(crate) mod hook;
pub(crate) mod init_net;
pub(crate) mod inject;
pub(crate) mod run;
pub(crate) mod status;
pub(crate) mod tasks;

use std::process::ExitCode;

use agent_reach::config::{self, HumanDuration};

/// `--duration 15s`-style arguments.
pub(crate) fn parse_duration(text: &str) -> Result<HumanDuration, String> {
    config::parse_duration(text).map(HumanDuration)
}

pub(crate) fn runtime(worker_threads: Option<usize>) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n.max(1));
    }
    builder.enable_all().build().map_err(|err| {
        eprintln!("cannot start the runtime: {err}");
        ExitCode::FAILURE
    })
}

#[cfg(unix)]
pub(crate) async fn shutdown_signal() -> &'static str {
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
pub(crate) async fn shutdown_signal() -> &'static str {
    let _ = tokio::signal::ctrl_c().await;
    "ctrl-c"
}

/// The log options of the long-running commands (`run`, `inject`).
#[derive(clap::Args, Debug)]
pub(crate) struct Logging {
    /// Log filter, e.g. `info` or `agent_reach=debug`.
    #[arg(long, env = "AGENT_REACH_LOG", default_value = "info")]
    log: String,
    /// Log format: `text`, or `json` (one JSON object per line, for a log collector).
    #[arg(long, env = "AGENT_REACH_LOG_FORMAT", value_enum, default_value_t)]
    log_format: LogFormat,
    /// Same as `--log-format json` (kept for existing manifests).
    #[arg(long)]
    log_json: bool,
}

impl Logging {
    pub(crate) fn init(&self) {
        let format = if self.log_json {
            LogFormat::Json
        } else {
            self.log_format
        };
        init_tracing(&self.log, format);
    }
}

/// How log lines are written (`--log-format`, `AGENT_REACH_LOG_FORMAT`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum LogFormat {
    #[default]
    Text,
    Json,
}

pub(crate) fn init_tracing(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal; a pipe or a log collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if format == LogFormat::Json {
        // One object per line, the event's fields at the top level beside level, target and
        // timestamp, so a collector indexes `capability` or `chosen` without unpacking anything.
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
}
