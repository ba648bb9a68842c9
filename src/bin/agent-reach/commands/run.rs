//! `agent-reach run`: the sidecar, until SIGTERM; then the drain.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use agent_reach::config::{ConfigPaths, ConfigStore};
use agent_reach::Sidecar;

use super::{runtime, shutdown_signal, Logging};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The bootstrap file (listeners, the local agent's profile, peers). Without it, the
    /// bootstrap's text is read from `AGENT_REACH_BOOTSTRAP` (what the injector sets).
    #[arg(long, env = "AGENT_REACH_CONFIG")]
    config: Option<PathBuf>,
    /// The fleet policy file; all defaults when omitted.
    #[arg(long, env = "AGENT_REACH_POLICY")]
    policy: Option<PathBuf>,
    #[command(flatten)]
    logging: Logging,
    /// Threads serving traffic (default: one per CPU). Match the pod's CPU limit.
    #[arg(long, env = "AGENT_REACH_WORKER_THREADS")]
    worker_threads: Option<usize>,
}

pub(crate) fn run(args: Args) -> ExitCode {
    args.logging.init();
    let paths = ConfigPaths {
        bootstrap: args.config,
        policy: args.policy,
    };
    let inline = std::env::var("AGENT_REACH_BOOTSTRAP").ok();
    let store = match ConfigStore::load(paths, inline.as_deref()) {
        Ok(store) => Arc::new(store),
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    // The agent container's drain hook's token (`GET /drain` on the admin port).
    if let Ok(token) = std::env::var(agent_reach::config::DRAIN_TOKEN_ENV) {
        let snapshot = store.snapshot();
        let mut bootstrap = snapshot.bootstrap.clone();
        bootstrap.drain_token = Some(token).filter(|t| !t.is_empty());
        store.replace(bootstrap, snapshot.policy.clone());
    }
    // The agent containers' probes the injector moved to the admin port (read once at start).
    if let Ok(text) = std::env::var(agent_reach::config::APP_PROBES_ENV) {
        match serde_json::from_str::<agent_reach::config::AppProbes>(&text) {
            Ok(probes) => {
                let snapshot = store.snapshot();
                let mut bootstrap = snapshot.bootstrap.clone();
                bootstrap.app_probes.extend(probes);
                store.replace(bootstrap, snapshot.policy.clone());
            }
            Err(err) => {
                eprintln!("${}: {err}", agent_reach::config::APP_PROBES_ENV);
                return ExitCode::FAILURE;
            }
        }
    }
    let runtime = match runtime(args.worker_threads) {
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
