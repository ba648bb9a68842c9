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

/// The injector's environment for this pod, taken into the running bootstrap in one replace.
fn pod_wiring(store: &ConfigStore) -> Result<(), String> {
    use agent_reach::config::{AppProbes, APP_PROBES_ENV, DRAIN_TOKEN_ENV};
    let token = std::env::var(DRAIN_TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty());
    let probes = match std::env::var(APP_PROBES_ENV) {
        Ok(text) => Some(
            serde_json::from_str::<AppProbes>(&text)
                .map_err(|e| format!("${APP_PROBES_ENV}: {e}"))?,
        ),
        Err(_) => None,
    };
    if token.is_none() && probes.is_none() {
        return Ok(());
    }
    let snapshot = store.snapshot();
    let mut bootstrap = snapshot.bootstrap.clone();
    if token.is_some() {
        bootstrap.drain_token = token;
    }
    bootstrap.app_probes.extend(probes.unwrap_or_default());
    store.replace(bootstrap, snapshot.policy.clone());
    Ok(())
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
    // What the injector hands over beside the bootstrap (read once at start): the agent
    // container's drain hook's token (`GET /drain` on the admin port) and the probes it moved
    // to the admin port.
    if let Err(err) = pod_wiring(&store) {
        eprintln!("{err}");
        return ExitCode::FAILURE;
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
